//! M6 and T5 hold in the engine (the witness of registered memory): on the simulator, whose NIC atomics are not coherent
//! with the CPU's, every design runs SmallBank and TPC-C (lossy too) with the witness of
//! registered memory on, which panics the moment a word changed by NIC atomics is
//! changed by a CPU atomic or a CPU write, or a word changed by CPU atomics by a NIC
//! atomic. Every region of this test binary carries the witness (one process, one flag),
//! so only non-coherent fabrics run here.

use hytra_fabric::sim::faults::FaultConfig;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{witness_atomics, ClusterShape};
use hytra_rt::RtConfig;
use hytra_txn::{Design, TxnConfig};
use hytra_workloads::bench::{run, BenchParams, Workload};
use hytra_workloads::smallbank::SmallBank;
use hytra_workloads::tpcc::{TpcC, TpccParams};

fn params(seed: u64) -> BenchParams {
    BenchParams {
        coroutines: 4,
        warmup_ns: 20_000,
        measure_ns: 300_000,
        seed,
        check: true,
        rt: RtConfig { rpc_timeout_ns: 500_000, ..RtConfig::default() },
        drain_ns: 300_000_000,
        warm_cache: true,
        timeline_ns: 0,
    }
}

fn every_design<W: Workload>(w: &W, name: &str) {
    witness_atomics(true);
    let shape = ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 };
    for d in Design::ALL {
        for (seed, faults) in [(1, FaultConfig::none()), (2, FaultConfig::lossy(20_000))] {
            let mut sc = SimConfig::new(shape, seed);
            assert!(!sc.profile.atomics_coherent, "the witness needs a non-coherent NIC");
            sc.faults = faults;
            let mut b = SimCluster::new(sc).unwrap();
            let r = run(&mut b, w, TxnConfig::preset(d), params(seed)).unwrap();
            let what = format!("{name}, {}, seed {seed}", d.name());
            assert!(r.checker.as_ref().unwrap().serializable(), "{what}: not serializable");
            assert!(r.invariant.ok, "{what}: {:#?}", r.invariant.details);
            assert!(r.stats.commits > 0, "{what}: nothing committed");
        }
    }
}

#[test]
fn no_design_mixes_cpu_and_nic_atomics_in_smallbank() {
    every_design(&SmallBank { accounts_per_worker: 50 }, "smallbank");
}

#[test]
fn no_design_mixes_cpu_and_nic_atomics_in_tpcc() {
    let small =
        TpccParams { customers: 30, items: 1000, new_orders_max: 2000, ..TpccParams::standard(5) };
    every_design(&TpcC::new(small), "tpcc");
}
