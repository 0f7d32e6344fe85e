//! The simulator's links carry no more than their bandwidth, however deep the backlog.

use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::testing::run_scripts;
use hytra_fabric::{
    Backend, ClusterShape, Completion, Endpoint, LocalAddr, NodeId, OpFlags, Qp, RegionSpec,
    RemoteAddr, WorkRequest, WriteSrc,
};

const WRITE_BYTES: u64 = 16 * 1024;

/// Every worker of node 1 keeps `depth` signaled 16 KiB WRITEs to node 0 in flight until
/// it has sent `per_worker`; returns (bytes moved, ns from the first post to the last
/// completion, wire bytes per WRITE, link bytes per ns).
fn one_way_writes(workers: u16, depth: u32, per_worker: u32) -> (u64, u64, u64, f64) {
    let shape = ClusterShape { nodes: 2, workers_per_node: workers, lanes_per_peer: 1 };
    let mut cfg = SimConfig::new(shape, 7);
    cfg.profile = NicProfile::cx3();
    let profile = cfg.profile.clone();
    let mut b = SimCluster::new(cfg).unwrap();
    let src = b.register_all(RegionSpec::new(WRITE_BYTES)).unwrap();
    let dst = b.register_all(RegionSpec::new(WRITE_BYTES)).unwrap();
    let span = std::sync::Mutex::new((u64::MAX, 0u64));
    run_scripts(&mut b, |ep| {
        let active = ep.me().node == NodeId(1);
        let (mut posted, mut done) = (0u32, 0u32);
        let span = &span;
        move |ep: &mut _| {
            let ep: &mut <SimCluster as Backend>::Ep = ep;
            if !active {
                return true;
            }
            let mut out = [Completion::EMPTY; 16];
            let n = ep.poll_cq(&mut out);
            done += n as u32;
            while posted < per_worker && posted - done < depth {
                let wr = WorkRequest::Write {
                    remote: RemoteAddr { node: NodeId(0), rkey: dst, offset: 0 },
                    src: WriteSrc::Local {
                        addr: LocalAddr { rkey: src, offset: 0 },
                        len: WRITE_BYTES as u32,
                    },
                };
                if posted == 0 {
                    let mut s = span.lock().unwrap();
                    s.0 = s.0.min(ep.now_ns());
                }
                ep.post(Qp::to(NodeId(0)), u64::from(posted), &wr, OpFlags::SIGNALED).unwrap();
                posted += 1;
            }
            if done == per_worker {
                let mut s = span.lock().unwrap();
                s.1 = s.1.max(ep.now_ns());
                return true;
            }
            false
        }
    });
    let (first, last) = span.into_inner().unwrap();
    let wire = WRITE_BYTES + u64::from(profile.rc_header_bytes);
    let bytes = u64::from(workers) * u64::from(per_worker) * WRITE_BYTES;
    (bytes, last - first, wire, profile.link_bytes_per_ns)
}

#[test]
fn a_deep_backlog_of_large_writes_is_bound_by_the_link() {
    // 8 workers x 128 in flight x 16 KiB is 16 MiB queued on one transmit link: about
    // 1.7 ms of backlog on cx3, beyond the timelines' initial horizon.
    for (depth, per_worker) in [(16, 400), (128, 600)] {
        let (bytes, ns, wire, link) = one_way_writes(8, depth, per_worker);
        let rate = bytes as f64 / ns as f64;
        let bound = link * WRITE_BYTES as f64 / wire as f64;
        assert!(rate <= bound * 1.001, "depth {depth}: {rate:.3} B/ns above the link's {bound:.3}");
        assert!(
            rate >= bound * 0.9,
            "depth {depth}: {rate:.3} B/ns, far below the link's {bound:.3}"
        );
    }
}
