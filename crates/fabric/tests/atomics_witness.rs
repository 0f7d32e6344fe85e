//! The M6 witness of registered memory catches what it must: on the simulator, whose NIC
//! atomics are not coherent with the CPU's, a CPU CAS after a NIC CAS on one word, a NIC
//! CAS after a CPU CAS, and a CPU store to a word NIC atomics use each panic, while NIC
//! atomics with NIC WRITEs, and CPU atomics on other words, do not. The engine's side
//! (every design never mixes the two) is `hytra-workloads`' `tests/witness.rs`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::testing::run_scripts;
use hytra_fabric::{
    witness_atomics, Backend, ClusterShape, Completion, Endpoint, LocalAddr, NodeId, OpFlags, Qp,
    RegionSpec, RemoteAddr, WorkRequest, WriteSrc,
};

/// What the CPU does to word 0 after the NIC's CAS on it (word 8 is the CPU's own).
#[derive(Copy, Clone)]
enum Then {
    CpuCas,
    CpuStore,
    NicWriteAndCpuCasElsewhere,
}

/// One worker CASes word 0 of its own node by loopback (as a NIC-locking design does),
/// then does `then`; or, with `cpu_first`, CASes it with the CPU before the NIC.
fn mix(then: Then, cpu_first: bool) -> Result<(), String> {
    witness_atomics(true);
    let shape = ClusterShape { nodes: 1, workers_per_node: 1, lanes_per_peer: 1 };
    let mut b = SimCluster::new(SimConfig::new(shape, 1)).unwrap();
    let r = b.register_all(RegionSpec::new(64)).unwrap();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        run_scripts(&mut b, |_| {
            let mut stage = 0;
            move |ep: &mut <SimCluster as Backend>::Ep| {
                let word = RemoteAddr { node: NodeId(0), rkey: r, offset: 0 };
                let qp = Qp::to(NodeId(0));
                match stage {
                    0 => {
                        if cpu_first {
                            ep.region(r).unwrap().cas(0, 0, 1);
                        }
                        let local = LocalAddr { rkey: r, offset: 16 };
                        let cas = WorkRequest::Cas { remote: word, local, compare: 0, swap: 2 };
                        ep.post(qp, 1, &cas, OpFlags::SIGNALED).unwrap();
                        stage = 1;
                        false
                    }
                    _ => {
                        let mut c = [Completion::EMPTY; 1];
                        if ep.poll_cq(&mut c) == 0 {
                            return false;
                        }
                        let region = ep.region(r).unwrap().clone();
                        match then {
                            Then::CpuCas => {
                                region.cas(0, 2, 3);
                            }
                            Then::CpuStore => region.store(0, 0),
                            Then::NicWriteAndCpuCasElsewhere => {
                                let zero = 0u64.to_le_bytes();
                                let w = WorkRequest::Write {
                                    remote: word,
                                    src: WriteSrc::Bytes(&zero),
                                };
                                ep.post(qp, 2, &w, OpFlags::INLINE).unwrap();
                                region.cas(8, 0, 1);
                            }
                        }
                        true
                    }
                }
            }
        });
    }));
    witness_atomics(false);
    outcome.map_err(|p| {
        p.downcast_ref::<String>().cloned().unwrap_or_else(|| {
            p.downcast_ref::<&str>().map_or("a panic".to_string(), |s| s.to_string())
        })
    })
}

#[test]
fn the_witness_catches_every_mix_and_nothing_else() {
    let e = mix(Then::CpuCas, false).expect_err("a CPU CAS after a NIC CAS");
    assert!(e.contains("M6 broken: a CPU atomic after fabric atomics"), "{e}");
    let e = mix(Then::NicWriteAndCpuCasElsewhere, true).expect_err("a NIC CAS after a CPU CAS");
    assert!(e.contains("M6 broken: a fabric atomic after CPU atomics"), "{e}");
    let e = mix(Then::CpuStore, false).expect_err("a CPU store to a NIC lock word");
    assert!(e.contains("T5 broken"), "{e}");
    mix(Then::NicWriteAndCpuCasElsewhere, false).expect("NIC WRITE and CPU atomics elsewhere");
}
