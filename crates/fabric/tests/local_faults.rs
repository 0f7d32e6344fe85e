//! Node faults on the `local` backend: a crashed node stops for good (requests to it
//! fail, nothing it posts lands, the run does not wait for it), and a paused node is not
//! stepped while its memory stays reachable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::testing::run_scripts;
use hytra_fabric::{
    Backend, ClusterShape, Completion, Endpoint, LocalAddr, NodeFault, NodeFaultKind, NodeId,
    OpFlags, Qp, RegionSpec, RemoteAddr, Rkey, Status, WorkRequest, WriteSrc,
};

const MS: u64 = 1_000_000;
/// Where node 2 writes its clock into node 0's memory.
const CLOCK: u64 = 64;

/// Posts a signaled READ of 8 bytes from `node` and spins (bounded) for its completion.
fn read_from<E: Endpoint>(ep: &mut E, key: Rkey, node: NodeId) -> Status {
    let wr = WorkRequest::Read {
        remote: RemoteAddr { node, rkey: key, offset: 0 },
        local: LocalAddr { rkey: key, offset: 8 },
        len: 8,
    };
    ep.post(Qp::to(node), 7, &wr, OpFlags::SIGNALED).expect("room for one READ");
    let mut out = [Completion::EMPTY; 1];
    for _ in 0..1_000_000 {
        if ep.poll_cq(&mut out) == 1 {
            assert_eq!(out[0].wr_id, 7);
            return out[0].status;
        }
    }
    panic!("a READ from node {} never completed", node.0);
}

#[test]
fn a_crashed_node_stops_for_good_and_requests_to_it_fail() {
    let crash_at = 30 * MS;
    let shape = ClusterShape { nodes: 3, workers_per_node: 1, lanes_per_peer: 1 };
    let mut config = LocalConfig::new(shape);
    config.node_faults.push(NodeFault {
        node: NodeId(2),
        at_ns: crash_at,
        kind: NodeFaultKind::Crash,
    });
    let mut b = LocalCluster::new(config).unwrap();
    let key = b.register_all(RegionSpec::new(4096)).unwrap();
    // Node 0's reads: (posted at, target, status).
    let reads = Arc::new(Mutex::new(Vec::new()));
    let last_step = Arc::new(AtomicU64::new(0));
    let stats = run_scripts(&mut b, |ep| {
        let (reads, last_step) = (reads.clone(), last_step.clone());
        let me = ep.me().node;
        move |ep: &mut _| {
            let ep: &mut <LocalCluster as Backend>::Ep = ep;
            let now = ep.now_ns();
            match me.0 {
                0 => {
                    for target in [NodeId(1), NodeId(2)] {
                        let status = read_from(ep, key, target);
                        reads.lock().unwrap().push((now, target, status));
                    }
                    ep.now_ns() > 3 * crash_at
                }
                1 => ep.now_ns() > 3 * crash_at,
                _ => {
                    // Never done: the run ends without it only because it crashed.
                    last_step.fetch_max(now, Ordering::Relaxed);
                    let clock = now.to_le_bytes();
                    let wr = WorkRequest::Write {
                        remote: RemoteAddr { node: NodeId(0), rkey: key, offset: CLOCK },
                        src: WriteSrc::Bytes(&clock),
                    };
                    ep.post(Qp::to(NodeId(0)), 1, &wr, OpFlags::INLINE).unwrap();
                    false
                }
            }
        }
    });
    assert_eq!(stats.crashed, vec![NodeId(2)]);
    let reads = reads.lock().unwrap();
    let (mut before, mut after) = (0, 0);
    for &(at, target, status) in reads.iter() {
        match (target, at < crash_at, at >= crash_at) {
            (NodeId(1), ..) => assert_eq!(status, Status::Success, "node 1 at {at} ns"),
            (_, true, _) if status == Status::Success => before += 1,
            (_, _, true) => {
                assert_eq!(status, Status::Unreachable, "a READ of node 2 at {at} ns");
                after += 1;
            }
            // Posted before the crash, carried out after it.
            _ => assert_eq!(status, Status::Unreachable),
        }
    }
    assert!(before > 0 && after > 0, "reads before the crash {before}, after {after}");
    // Node 2's last WRITE that landed was posted before its crash; it kept running at
    // most until its thread's next round.
    let landed = b.region(NodeId(0), key).unwrap().load(CLOCK);
    assert!(landed > 0 && landed < crash_at, "node 2's clock landed as {landed} ns");
    let last = last_step.load(Ordering::Relaxed);
    assert!(last >= crash_at / 2 && last < 2 * crash_at, "node 2 last stepped at {last} ns");
}

#[test]
fn a_paused_node_is_not_stepped_but_its_memory_answers() {
    let (from, until) = (20 * MS, 50 * MS);
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let mut config = LocalConfig::new(shape);
    config.node_faults.push(NodeFault {
        node: NodeId(1),
        at_ns: from,
        kind: NodeFaultKind::Pause { for_ns: until - from },
    });
    let mut b = LocalCluster::new(config).unwrap();
    let key = b.register_all(RegionSpec::new(4096)).unwrap();
    let steps = Arc::new(Mutex::new(Vec::new()));
    let reads_in_pause = Arc::new(AtomicU64::new(0));
    let stats = run_scripts(&mut b, |ep| {
        let (steps, reads_in_pause) = (steps.clone(), reads_in_pause.clone());
        let me = ep.me().node;
        move |ep: &mut _| {
            let ep: &mut <LocalCluster as Backend>::Ep = ep;
            let now = ep.now_ns();
            if me == NodeId(1) {
                steps.lock().unwrap().push(now);
            } else {
                assert_eq!(read_from(ep, key, NodeId(1)), Status::Success);
                if (from..until).contains(&now) {
                    reads_in_pause.fetch_add(1, Ordering::Relaxed);
                }
            }
            ep.now_ns() > 2 * until
        }
    });
    assert!(stats.crashed.is_empty());
    let steps = steps.lock().unwrap();
    // A round that began just before the pause may step the node once more; a thread
    // descheduled in between may do so a little later (5 ms of slack).
    let during: Vec<u64> =
        steps.iter().copied().filter(|t| (from + 5 * MS..until).contains(t)).collect();
    assert!(during.is_empty(), "node 1 was stepped during its pause at {during:?}");
    assert!(steps.iter().any(|&t| t < from) && steps.iter().any(|&t| t >= until));
    assert!(
        reads_in_pause.load(Ordering::Relaxed) > 0,
        "node 1's memory did not answer in its pause"
    );
}

#[test]
fn a_node_that_crashes_itself_stops_there_with_both_its_workers() {
    // Worker 0 of node 1 writes its step count into node 0's memory and crashes its node
    // at its first step after 10 ms, right after that step's WRITE; worker 1 of node 1
    // (on another thread) writes its own count on every step. After the crash nothing
    // of node 1 lands, node 0's reads of it fail, and the run ends without node 1's
    // workers.
    let shape = ClusterShape { nodes: 2, workers_per_node: 2, lanes_per_peer: 1 };
    let mut config = LocalConfig::new(shape);
    config.threads = Some(2);
    let mut b = LocalCluster::new(config).unwrap();
    let key = b.register_all(RegionSpec::new(4096)).unwrap();
    // When node 1 crashed and at which step, and node 0's reads of it: (posted at,
    // status).
    let crashed_at = Arc::new(AtomicU64::new(u64::MAX));
    let crash_step = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(Mutex::new(Vec::new()));
    let stats = run_scripts(&mut b, |ep| {
        let (crashed_at, crash_step, reads) =
            (crashed_at.clone(), crash_step.clone(), reads.clone());
        let me = ep.me();
        let mut steps = 0u64;
        move |ep: &mut _| {
            let ep: &mut <LocalCluster as Backend>::Ep = ep;
            let now = ep.now_ns();
            if me.node == NodeId(0) {
                if me.index == 0 {
                    reads.lock().unwrap().push((now, read_from(ep, key, NodeId(1))));
                }
                return now > 40 * MS;
            }
            steps += 1;
            let bytes = steps.to_le_bytes();
            let remote = RemoteAddr { node: NodeId(0), rkey: key, offset: slot(me.node, me.index) };
            let wr = WorkRequest::Write { remote, src: WriteSrc::Bytes(&bytes) };
            let _ = ep.post(Qp::to(NodeId(0)), steps, &wr, OpFlags::INLINE);
            let mut out = [Completion::EMPTY; 16];
            let _ = ep.poll_cq(&mut out);
            if me.index == 0 && now >= 10 * MS {
                assert_eq!(crash_step.load(Ordering::SeqCst), 0, "stepped after its crash");
                assert!(ep.crash_here(), "the threads backend crashes a node from inside");
                crashed_at.store(ep.now_ns(), Ordering::SeqCst);
                crash_step.store(steps, Ordering::SeqCst);
            }
            // Never done: the run ends without node 1 only because it crashed.
            false
        }
    });
    assert_eq!(stats.crashed, vec![NodeId(1)]);
    let crashed_at = crashed_at.load(Ordering::SeqCst);
    assert!(crashed_at < 40 * MS, "node 1 crashed at {crashed_at} ns");
    let region = b.region(NodeId(0), key).unwrap();
    // The WRITE before the crash landed, and nothing after it.
    assert_eq!(region.load(slot(NodeId(1), 0)), crash_step.load(Ordering::SeqCst));
    let other = region.load(slot(NodeId(1), 1));
    assert!(other > 0, "node 1's other worker never wrote");
    let reads = reads.lock().unwrap();
    let after: Vec<_> = reads.iter().filter(|&&(at, _)| at > crashed_at).collect();
    assert!(!after.is_empty(), "node 0 read nothing of node 1 after its crash");
    assert!(
        after.iter().all(|&&(_, status)| status == Status::Unreachable),
        "a read of node 1 after its crash did not fail: {after:?}"
    );
    assert!(reads.iter().any(|&(at, s)| at < crashed_at && s == Status::Success));
}

#[test]
fn faults_on_nodes_outside_the_cluster_or_empty_pauses_are_refused() {
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    for (node, kind) in [(2, NodeFaultKind::Crash), (1, NodeFaultKind::Pause { for_ns: 0 })] {
        let mut config = LocalConfig::new(shape);
        config.node_faults.push(NodeFault { node: NodeId(node), at_ns: 0, kind });
        assert!(LocalCluster::new(config).is_err(), "{node} {kind:?} accepted");
    }
}

/// Where each worker of node `n` writes its step count into node 0's memory.
fn slot(node: NodeId, index: u16) -> u64 {
    256 + 8 * (2 * u64::from(node.0) + u64::from(index))
}

#[test]
fn a_fenced_node_reaches_nothing_once_the_fence_returns() {
    // Nodes 0 and 2 fence node 1 off at the same time, while both workers of node 1 (on
    // threads of their own) keep writing into node 0's and node 2's memory and sending
    // them datagrams: once a fence returns, nothing of node 1 lands at its fencer, and
    // node 1's requests there fail. Node 2's traffic to node 0 goes on.
    let fence_at = 20 * MS;
    let shape = ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 };
    let mut config = LocalConfig::new(shape);
    config.threads = Some(3);
    let mut b = LocalCluster::new(config).unwrap();
    let key = b.register_all(RegionSpec::new(4096)).unwrap();
    // Per fencing node: node 1's slots there when its fence returned, then node 2's
    // (worker 0) at node 0.
    let fenced = Arc::new(Mutex::new(Vec::<(NodeId, Vec<u64>)>::new()));
    let late_datagrams = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    run_scripts(&mut b, |ep| {
        let (fenced, late, refused) = (fenced.clone(), late_datagrams.clone(), refused.clone());
        let me = ep.me();
        let mut count = 0u64;
        let mut fence_done = false;
        move |ep: &mut _| {
            let ep: &mut <LocalCluster as Backend>::Ep = ep;
            let now = ep.now_ns();
            let mut buf = [0u8; 64];
            while let Some((from, _)) = ep.recv(&mut buf) {
                if fence_done && from.node == NodeId(1) {
                    late.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut out = [Completion::EMPTY; 16];
            let n = ep.poll_cq(&mut out);
            for c in &out[..n] {
                if c.status == Status::Unreachable {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            if me.node != NodeId(1) && me.index == 0 && !fence_done && now >= fence_at {
                assert!(ep.fence(NodeId(1)), "the threads backend fences");
                let region = ep.region(key).unwrap();
                let mut seen: Vec<u64> = (0..2).map(|i| region.load(slot(NodeId(1), i))).collect();
                seen.push(region.load(slot(NodeId(2), 0)));
                fenced.lock().unwrap().push((me.node, seen));
                fence_done = true;
            }
            if me.node != NodeId(0) {
                // Several writes a step, so that a fence often meets a step under way.
                for target in [NodeId(0), NodeId(2)].into_iter().filter(|&t| t != me.node) {
                    for _ in 0..8 {
                        count += 1;
                        let bytes = count.to_le_bytes();
                        let remote =
                            RemoteAddr { node: target, rkey: key, offset: slot(me.node, me.index) };
                        let wr = WorkRequest::Write { remote, src: WriteSrc::Bytes(&bytes) };
                        // A full completion queue refuses a post; the next step retries.
                        let _ = ep.post(Qp::to(target), count, &wr, OpFlags::INLINE);
                    }
                    let to = hytra_fabric::WorkerId { node: target, index: 0 };
                    let _ = ep.send(to, &count.to_le_bytes(), OpFlags::NONE);
                }
            }
            now > 3 * fence_at
        }
    });
    let fenced = fenced.lock().unwrap();
    assert_eq!(fenced.len(), 2, "both fences returned: {fenced:?}");
    for (fencer, seen) in fenced.iter() {
        let region = b.region(*fencer, key).unwrap();
        for (i, &at_fence) in seen[..2].iter().enumerate() {
            let end = region.load(slot(NodeId(1), i as u16));
            assert!(at_fence > 0, "worker {i} of node 1 wrote to node {} before", fencer.0);
            assert_eq!(end, at_fence, "worker {i} of node 1 wrote to node {} after", fencer.0);
        }
    }
    assert_eq!(late_datagrams.load(Ordering::Relaxed), 0, "datagrams of node 1 after a fence");
    assert!(refused.load(Ordering::Relaxed) > 0, "node 1's requests never failed");
    // Node 2 is fenced off by nobody: its writes into node 0 went on after the fence.
    let (_, at_node0) = fenced.iter().find(|(n, _)| *n == NodeId(0)).unwrap();
    let region = b.region(NodeId(0), key).unwrap();
    assert!(region.load(slot(NodeId(2), 0)) > at_node0[2], "node 2's writes stopped");
}
