//! Fencing in the simulator: with `Fencing::Nic` a node's NIC refuses what the nodes it
//! fenced off send; with `Fencing::Unavailable` a fence is refused and changes nothing.

use hytra_fabric::sim::{Fencing, SimCluster, SimConfig};
use hytra_fabric::testing::run_scripts;
use hytra_fabric::{
    Backend, ClusterShape, Completion, Endpoint, NodeId, OpFlags, Qp, RegionSpec, RemoteAddr,
    Status, WorkRequest, WriteSrc,
};

/// Node 0 fences node 1 off at 10 us; node 1 writes its clock into node 0 every step
/// until 30 us. Returns what `fence` said, the last clock that landed, and node 1's
/// failed WRITEs.
fn fence_then_write(fencing: Fencing) -> (bool, u64, u64) {
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let mut b = SimCluster::new(SimConfig { fencing, ..SimConfig::new(shape, 5) }).unwrap();
    let key = b.register_all(RegionSpec::new(64)).unwrap();
    let said = std::sync::Mutex::new(None);
    let failed = std::sync::atomic::AtomicU64::new(0);
    run_scripts(&mut b, |ep| {
        let me = ep.me().node;
        let (said, failed) = (&said, &failed);
        let mut in_flight = 0usize;
        move |ep: &mut _| {
            let ep: &mut <SimCluster as Backend>::Ep = ep;
            let now = ep.now_ns();
            if me == NodeId(0) {
                if now >= 10_000 && said.lock().unwrap().is_none() {
                    *said.lock().unwrap() = Some(ep.fence(NodeId(1)));
                }
            } else {
                let mut out = [Completion::EMPTY; 8];
                let n = ep.poll_cq(&mut out);
                in_flight -= n;
                let bad = out[..n].iter().filter(|c| c.status != Status::Success).count();
                failed.fetch_add(bad as u64, std::sync::atomic::Ordering::Relaxed);
                let clock = now.to_le_bytes();
                let remote = RemoteAddr { node: NodeId(0), rkey: key, offset: 0 };
                let wr = WorkRequest::Write { remote, src: WriteSrc::Bytes(&clock) };
                // One at a time: a WRITE to a NIC that refuses it fails only after the
                // transport's retries.
                if in_flight == 0 && now < 30_000 {
                    ep.post(Qp::to(NodeId(0)), 1, &wr, OpFlags::SIGNALED | OpFlags::INLINE)
                        .expect("room for one WRITE");
                    in_flight += 1;
                }
            }
            now >= 30_000 && (me == NodeId(0) || in_flight == 0)
        }
    });
    let landed = b.region(NodeId(0), key).unwrap().load(0);
    let said = said.into_inner().unwrap().expect("node 0 fenced");
    (said, landed, failed.into_inner())
}

#[test]
fn a_nic_refuses_a_fenced_node_and_without_fencing_nothing_changes() {
    let (said, landed, failed) = fence_then_write(Fencing::Nic);
    assert!(said);
    assert!((1..11_000).contains(&landed), "node 1's WRITE of {landed} ns landed after the fence");
    assert!(failed > 0, "node 1's WRITEs after the fence did not fail");
    let (said, landed, failed) = fence_then_write(Fencing::Unavailable);
    assert!(!said, "a fabric without fencing says so");
    assert!(landed >= 29_000, "node 1's WRITEs stopped landing at {landed} ns");
    assert_eq!(failed, 0);
}
