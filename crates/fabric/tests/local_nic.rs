//! The `local` backend's NIC thread: it runs posted work queues while the workers run,
//! stops with them, and reports failures and refusals as the simulator's NIC does.

use std::time::{Duration, Instant};

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::testing::run_scripts;
use hytra_fabric::wq::{Sge, WqCounters, WqId, WqSpec, Wqe, WqeError, WQE_SIGNALED};
use hytra_fabric::{
    Backend, ClusterShape, Endpoint, LocalAddr, NodeId, PostError, RegionSpec, Rkey,
};

const SHAPE: ClusterShape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
const RING: u64 = 0;
const DBR: u64 = 4096;
const DATA: u64 = 8192;

/// A cluster with one unmanaged queue on node 0 whose peer is node 1, its entries
/// `entries` written and posted in the doorbell record (not yet rung).
fn rig(entries: &[[u64; 8]]) -> (LocalCluster, Rkey, WqId) {
    let mut b = LocalCluster::new(LocalConfig::new(SHAPE)).unwrap();
    let key = b.register_all(RegionSpec::new(16 * 1024)).unwrap();
    let spec = WqSpec {
        ring: LocalAddr { rkey: key, offset: RING },
        slots: 16,
        recv_ring: LocalAddr { rkey: key, offset: 0 },
        recv_slots: 0,
        doorbell_record: LocalAddr { rkey: key, offset: DBR },
        peer: NodeId(1),
        managed: false,
        notify: None,
    };
    let wq = b.create_wq(NodeId(0), spec).unwrap();
    let r = b.region(NodeId(0), key).unwrap();
    for (i, e) in entries.iter().enumerate() {
        for (k, w) in e.iter().enumerate() {
            r.store(RING + 64 * i as u64 + 8 * k as u64, *w);
        }
    }
    r.store(DBR, entries.len() as u64);
    (b, key, wq)
}

/// Rings the queue's doorbell from node 0 and waits (bounded) until `done` holds.
fn ring_and_wait(b: &mut LocalCluster, wq: WqId, done: fn(&WqCounters) -> bool) {
    run_scripts(b, |ep| {
        let active = ep.me().node == NodeId(0);
        let mut rung = false;
        let start = Instant::now();
        move |ep: &mut _| {
            let ep: &mut <LocalCluster as Backend>::Ep = ep;
            if !active {
                return true;
            }
            if !rung {
                ep.wq_doorbell(wq).unwrap();
                rung = true;
            }
            let c = ep.wq_counters(wq).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10), "the NIC thread ran nothing: {c:?}");
            done(&c)
        }
    });
}

#[test]
fn a_posted_write_runs_on_the_nic_thread_and_completes() {
    let write = Wqe::Write {
        local: Sge { addr: LocalAddr { rkey: Rkey(0), offset: DATA }, len: 16 },
        remote_key: Rkey(0),
        remote: DATA + 64,
    };
    let (mut b, key, wq) = rig(&[write.encode(WQE_SIGNALED, 1), Wqe::Noop.encode(0, 2)]);
    b.region(NodeId(0), key).unwrap().store(DATA, 0xAB);
    b.region(NodeId(0), key).unwrap().store(DATA + 8, 0xCD);
    ring_and_wait(&mut b, wq, |c| c.executed == 2);
    let c = b.wq_counters(NodeId(0), wq).unwrap();
    assert_eq!((c.executed, c.completions, c.error), (2, 1, None));
    let peer = b.region(NodeId(1), key).unwrap();
    assert_eq!(
        (peer.load(DATA + 64), peer.load(DATA + 72)),
        (0xAB, 0xCD),
        "WRITE landed on the peer"
    );
}

#[test]
fn a_bad_entry_stops_the_queue_with_its_error() {
    let mut junk = Wqe::Noop.encode(0, 0);
    junk[0] = 0xEE;
    let beyond = Wqe::Read {
        local: Sge { addr: LocalAddr { rkey: Rkey(0), offset: DATA }, len: 8 },
        remote_key: Rkey(0),
        remote: 1 << 40,
    };
    let (mut b, _, wq) = rig(&[junk, Wqe::Noop.encode(0, 0)]);
    ring_and_wait(&mut b, wq, |c| c.error.is_some());
    let c = b.wq_counters(NodeId(0), wq).unwrap();
    assert_eq!((c.executed, c.error), (0, Some(WqeError::BadOpcode(0xEE))));
    let (mut b, _, wq) = rig(&[beyond.encode(WQE_SIGNALED, 0), Wqe::Noop.encode(0, 0)]);
    ring_and_wait(&mut b, wq, |c| c.error.is_some());
    let c = b.wq_counters(NodeId(0), wq).unwrap();
    assert_eq!((c.completions, c.error), (0, Some(WqeError::Access)), "{c:?}");
}

#[test]
fn messages_are_checked_and_dropped_without_a_posted_recv() {
    let (mut b, _, wq) = rig(&[]);
    run_scripts(&mut b, |_| {
        move |ep: &mut <LocalCluster as Backend>::Ep| {
            if ep.me().node == NodeId(1) {
                assert_eq!(ep.trigger(NodeId(0), WqId(9), &[0; 8]), Err(PostError::NoSuchPeer));
                assert_eq!(ep.trigger(NodeId(0), wq, &[0; 12]), Err(PostError::BadLength(12)));
                assert_eq!(ep.trigger(NodeId(0), wq, &[]), Err(PostError::BadLength(0)));
                ep.trigger(NodeId(0), wq, &[1; 16]).unwrap();
            }
            true
        }
    });
    let c = b.wq_counters(NodeId(0), wq).unwrap();
    assert_eq!((c.rnr_drops, c.recv_completions), (1, 0));
}

#[test]
fn a_run_with_idle_queues_ends_with_its_workers() {
    let (mut b, _, _) = rig(&[Wqe::Noop.encode(0, 0)]);
    let start = Instant::now();
    for _ in 0..20 {
        run_scripts(&mut b, |_| |_: &mut <LocalCluster as Backend>::Ep| true);
    }
    assert!(start.elapsed() < Duration::from_secs(5), "runs waited for the NIC thread");
}
