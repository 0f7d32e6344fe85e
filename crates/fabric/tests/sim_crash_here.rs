//! A node crashed from inside one of its workers' steps (`Endpoint::crash_here`, the
//! swarm's crashes at points of the protocol): what it posted before lands, nothing it
//! posts or sends after does, requests to it fail, and the run ends without it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::testing::run_scripts;
use hytra_fabric::{
    Backend, ClusterShape, Completion, Endpoint, LocalAddr, NodeId, OpFlags, Qp, RegionSpec,
    RemoteAddr, Status, WorkRequest, WriteSrc,
};

fn write(ep: &mut impl Endpoint, rkey: hytra_fabric::Rkey, offset: u64, value: u64) {
    let remote = RemoteAddr { node: NodeId(0), rkey, offset };
    let wr = WorkRequest::Write { remote, src: WriteSrc::Bytes(&value.to_le_bytes()) };
    ep.post(Qp::to(NodeId(0)), value, &wr, OpFlags::SIGNALED | OpFlags::INLINE).unwrap();
}

#[test]
fn a_node_that_crashes_itself_does_nothing_more() {
    let shape = ClusterShape { nodes: 2, workers_per_node: 2, lanes_per_peer: 1 };
    let mut b = SimCluster::new(SimConfig::new(shape, 5)).unwrap();
    let data = b.register_all(RegionSpec::new(64)).unwrap();
    let seen = Mutex::new((0u64, 0u64, Status::Success));
    let datagrams = AtomicU64::new(0);
    let stats = run_scripts(&mut b, |ep| {
        let me = ep.me();
        let (seen, datagrams) = (&seen, &datagrams);
        let (mut step, mut read_posted) = (0u32, false);
        move |ep: &mut _| {
            let ep: &mut <SimCluster as Backend>::Ep = ep;
            let mut c = [Completion::EMPTY; 4];
            if me.node == NodeId(1) {
                if me.index == 1 {
                    // The node's other worker never finishes on its own: the crash
                    // must end it too.
                    return false;
                }
                step += 1;
                match step {
                    1 => write(ep, data, 0, 1),
                    _ if ep.poll_cq(&mut c) == 0 => return false,
                    _ => {
                        assert!(ep.crash_here(), "the simulator crashes a node from inside");
                        // Still in the step that crashed: all of this vanishes.
                        write(ep, data, 8, 2);
                        ep.send(
                            hytra_fabric::WorkerId { node: NodeId(0), index: 0 },
                            &[7; 8],
                            OpFlags::NONE,
                        )
                        .unwrap();
                        return false;
                    }
                }
                return false;
            }
            let mut buf = [0u8; 64];
            while ep.recv(&mut buf).is_some() {
                datagrams.fetch_add(1, Ordering::Relaxed);
            }
            if me.index == 1 || ep.now_ns() < 50_000 {
                return me.index == 1;
            }
            if !read_posted {
                let remote = RemoteAddr { node: NodeId(1), rkey: data, offset: 0 };
                let local = LocalAddr { rkey: data, offset: 16 };
                let wr = WorkRequest::Read { remote, local, len: 8 };
                ep.post(Qp::to(NodeId(1)), 9, &wr, OpFlags::SIGNALED).unwrap();
                read_posted = true;
            }
            if ep.poll_cq(&mut c) == 0 {
                return false;
            }
            let r = ep.region(data).unwrap();
            *seen.lock().unwrap() = (r.load(0), r.load(8), c[0].status);
            true
        }
    });
    let (before, after, read) = *seen.lock().unwrap();
    assert_eq!(before, 1, "the WRITE completed before the crash landed");
    assert_eq!(after, 0, "the WRITE posted after the crash did not");
    assert_eq!(datagrams.load(Ordering::Relaxed), 0, "the datagram sent after it did not");
    assert_eq!(read, Status::Unreachable, "a READ of the crashed node fails");
    assert_eq!(stats.crashed, vec![NodeId(1)]);
}
