//! Runtime tests: coroutines, one-sided batches through tickets, RPC, and what faults do
//! to them. Generic tests run on every backend; fault scenarios need the simulator.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hytra_fabric::sim::faults::{FaultConfig, NodeFault, NodeFaultKind};
use hytra_fabric::sim::{replay_check, SimCluster, SimConfig};
use hytra_fabric::testing::TestBackend;
use hytra_fabric::{
    AccessError, Backend, ClusterShape, LocalAddr, NodeId, OpFlags, Qp, RegionSpec, RemoteAddr,
    Rkey, RunLimits, RunStats, Status, WorkRequest, WorkerId, WriteSrc,
};
use hytra_rt::constants::RPC_PAYLOAD_MAX;
use hytra_rt::{
    run_workers, OpError, RemoteError, RpcError, RpcType, RtConfig, Worker, WorkerReport,
};

const ECHO: RpcType = RpcType(1);
const COUNT: RpcType = RpcType(2);

fn shape(nodes: u16, workers: u16) -> ClusterShape {
    ClusterShape { nodes, workers_per_node: workers, lanes_per_peer: 1 }
}

fn run<B: TestBackend>(
    b: &mut B,
    cfg: RtConfig,
    setup: impl Fn(&mut Worker<B::Ep>) + Sync,
) -> (Vec<WorkerReport>, RunStats) {
    let limits = RunLimits { time_limit_ns: B::test_time_limit_ns() };
    let (reports, stats) = run_workers(b, cfg, limits, setup).expect("cluster runs");
    assert!(stats.all_done, "{}: coroutines did not finish in time", B::NAME);
    for r in &reports {
        assert_eq!(r.leaked, 0, "tickets or calls never collected");
    }
    (reports, stats)
}

fn local_timeout<B: TestBackend>() -> RtConfig {
    // Threads on a shared two-core machine can be descheduled for milliseconds.
    let timeout = if B::NAME == "sim" { 200_000 } else { 2_000_000_000 };
    RtConfig { rpc_timeout_ns: timeout, ..RtConfig::default() }
}

fn echo_handler<E>(w: &mut Worker<E>)
where
    E: hytra_fabric::Endpoint + 'static,
{
    w.handle(
        ECHO,
        Box::new(|ctx, req| {
            ctx.reply.extend_from_slice(req);
            ctx.reply.push(ctx.src.index as u8);
        }),
    );
}

/// Every worker calls every worker (itself included) concurrently, then gathers the
/// replies: requests and replies are matched, whatever the coalescing.
fn rpc_gather_from_every_worker<B: TestBackend>(doorbell_batching: bool) {
    let mut b = B::for_test(shape(3, 2), 11);
    let cfg = RtConfig { doorbell_batching, ..local_timeout::<B>() };
    let (reports, _) = run(&mut b, cfg, |w| {
        echo_handler(w);
        for k in 0..2u8 {
            w.spawn(move |co| async move {
                let me = co.me();
                let peers: Vec<WorkerId> = co.shape().workers().collect();
                for round in 0..20u8 {
                    let tickets: Vec<_> = peers
                        .iter()
                        .map(|&p| {
                            let payload = [round, k, p.node.0 as u8, p.index as u8];
                            co.call(p, ECHO, &payload).expect("call")
                        })
                        .collect();
                    for (t, p) in tickets.into_iter().zip(&peers) {
                        let reply = co.reply(t, |r| r.to_vec()).await.expect("reply");
                        assert_eq!(
                            reply,
                            vec![round, k, p.node.0 as u8, p.index as u8, me.index as u8]
                        );
                    }
                }
            });
        }
    });
    let frames: u64 = reports.iter().map(|r| r.stats.frames_sent).sum();
    let datagrams: u64 = reports.iter().map(|r| r.stats.datagrams_sent).sum();
    let replies: u64 = reports.iter().map(|r| r.stats.rpc.replies).sum();
    assert_eq!(replies, 6 * 2 * 20 * 6);
    if doorbell_batching {
        assert!(datagrams < frames, "coalescing put several frames in one datagram");
    } else {
        assert_eq!(datagrams, frames, "without batching every frame is its own datagram");
    }
}

fn rpc_gather_with_batching<B: TestBackend>() {
    rpc_gather_from_every_worker::<B>(true)
}

fn rpc_gather_without_batching<B: TestBackend>() {
    rpc_gather_from_every_worker::<B>(false)
}

/// One-way requests get no reply and are served; refused requests fail with clear errors.
fn oneway_and_refused_requests<B: TestBackend>() {
    let mut b = B::for_test(shape(2, 1), 12);
    let counted = Arc::new(AtomicU64::new(0));
    run(&mut b, local_timeout::<B>(), |w| {
        let c = counted.clone();
        w.handle(
            COUNT,
            Box::new(move |_, req| {
                c.fetch_add(u64::from(req[0]), Ordering::Relaxed);
            }),
        );
        let counted = counted.clone();
        w.spawn(move |co| async move {
            let peer = WorkerId { node: NodeId(1 - co.me().node.0), index: 0 };
            for _ in 0..10 {
                co.send_oneway(peer, COUNT, &[3]).unwrap();
            }
            let t = co.call(peer, RpcType(9), b"x").unwrap();
            assert_eq!(co.reply(t, |_| ()).await, Err(RpcError::Remote(RemoteError::NoHandler)));
            let big = vec![0u8; RPC_PAYLOAD_MAX + 1];
            assert_eq!(
                co.call(peer, ECHO, &big).err(),
                Some(RpcError::TooLarge(RPC_PAYLOAD_MAX + 1))
            );
            // Keep serving until both sides' one-way frames have all arrived.
            while counted.load(Ordering::Relaxed) < 60 {
                co.yield_now().await;
            }
        });
    });
    assert_eq!(counted.load(Ordering::Relaxed), 60);
}

struct Regions {
    data: Rkey,
    scratch: Rkey,
}

fn regions<B: Backend>(b: &mut B) -> Regions {
    let data = b.register_all(RegionSpec::new(1 << 16)).unwrap();
    let workers = u64::from(b.shape().workers_per_node);
    let scratch = b.register_all(RegionSpec::new(workers * 4096)).unwrap();
    Regions { data, scratch }
}

/// Tickets: a CAS+READ batch returns the READ's view after the CAS; an unsignaled
/// member's error fails its batch; passive-ACK writes never exhaust the send queue.
fn tickets_batches_and_passive_ack<B: TestBackend>() {
    let mut b = B::for_test(shape(2, 2), 13);
    let r = regions(&mut b);
    let (data, scratch) = (r.data, r.scratch);
    let (reports, _) = run(&mut b, local_timeout::<B>(), |w| {
        w.spawn(move |co| async move {
            let me = co.me();
            let peer = NodeId(1 - me.node.0);
            let qp = Qp::to(peer);
            let lbuf =
                |off: u64| LocalAddr { rkey: scratch, offset: u64::from(me.index) * 4096 + off };
            let word = RemoteAddr { node: peer, rkey: data, offset: 8 * u64::from(me.index) };
            // CAS 0 -> 1 then READ, one doorbell, CAS unsignaled.
            let t = co
                .issue(
                    qp,
                    &[
                        WorkRequest::Cas { remote: word, local: lbuf(0), compare: 0, swap: 1 },
                        WorkRequest::Read { remote: word, local: lbuf(8), len: 8 },
                    ],
                )
                .unwrap();
            co.wait(t).await.unwrap();
            let s = co.region(scratch).unwrap();
            assert_eq!((s.load(lbuf(0).offset), s.load(lbuf(8).offset)), (0, 1));
            // An unsignaled member with a bad key fails the batch with its status.
            let bad = RemoteAddr { rkey: Rkey(77), ..word };
            let t = co
                .issue(
                    qp,
                    &[
                        WorkRequest::Write {
                            remote: bad,
                            src: WriteSrc::Local { addr: lbuf(0), len: 8 },
                        },
                        WorkRequest::Read { remote: word, local: lbuf(8), len: 8 },
                    ],
                )
                .unwrap();
            assert_eq!(
                co.wait(t).await,
                Err(OpError::Failed(Status::RemoteAccess(AccessError::UnknownKey)))
            );
            // Far more passive-ACK writes than the send queue holds.
            for i in 0..2_000u64 {
                let bytes = i.to_le_bytes();
                let w = WorkRequest::Write { remote: word, src: WriteSrc::Bytes(&bytes) };
                loop {
                    match co.issue_unsignaled(qp, &[w], OpFlags::INLINE) {
                        Ok(()) => break,
                        Err(OpError::Post(hytra_fabric::PostError::QueueFull)) => {
                            co.yield_now().await
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            let t = co
                .issue(qp, &[WorkRequest::Read { remote: word, local: lbuf(16), len: 8 }])
                .unwrap();
            co.wait(t).await.unwrap();
            assert_eq!(co.region(scratch).unwrap().load(lbuf(16).offset), 1999);
        });
    });
    for r in &reports {
        assert!(r.stats.ops.internal_signals >= 2_000 / 64 - 1, "{:?}", r.stats.ops);
        assert_eq!(r.stats.ops.unsignaled_errors, 0);
    }
}

macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod sim {
            use hytra_fabric::sim::SimCluster;
            $( #[test] fn $test() { super::$test::<SimCluster>() } )*
        }
        mod local {
            use hytra_fabric::local::LocalCluster;
            $( #[test] fn $test() { super::$test::<LocalCluster>() } )*
        }
    };
}

/// Coroutines sleep for different spans; each wakes no earlier than its deadline, the
/// whole run finishes, and on the simulator nothing else is needed to wake a sleeper.
fn sleepers_wake_after_their_deadlines<B: TestBackend>() {
    let mut b = B::for_test(shape(1, 1), 5);
    let late = Arc::new(AtomicU64::new(0));
    let woken = Arc::new(AtomicU64::new(0));
    run(&mut b, RtConfig::default(), |w| {
        for i in 1..=4u64 {
            let (late, woken) = (late.clone(), woken.clone());
            w.spawn(move |co| async move {
                let span = i * 50_000;
                let start = co.now_ns();
                co.sleep_until(start + span).await;
                let slept = co.now_ns() - start;
                if slept < span {
                    late.fetch_add(1, Ordering::Relaxed);
                }
                woken.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    assert_eq!(woken.load(Ordering::Relaxed), 4);
    assert_eq!(late.load(Ordering::Relaxed), 0, "a sleeper woke before its deadline");
}

on_every_backend!(
    sleepers_wake_after_their_deadlines,
    rpc_gather_with_batching,
    rpc_gather_without_batching,
    oneway_and_refused_requests,
    tickets_batches_and_passive_ack,
);

// ---- simulator-only: faults ---------------------------------------------------------

fn sim(nodes: u16, workers: u16, seed: u64, faults: FaultConfig) -> SimCluster {
    let mut cfg = SimConfig::new(shape(nodes, workers), seed);
    cfg.faults = faults;
    SimCluster::new(cfg).unwrap()
}

const SIM_LIMITS: RunLimits = RunLimits { time_limit_ns: 200_000_000 };

/// A client loop that retries calls until each of `n` gets a reply; counts timeouts.
fn retrying_client(
    w: &mut Worker<hytra_fabric::sim::SimEndpoint>,
    n: u32,
    timeouts: Arc<AtomicU64>,
) {
    echo_handler(w);
    w.spawn(move |co| async move {
        let shape = co.shape();
        for i in 0..n {
            let dest = shape.worker_at((i as usize * 7 + 1) % shape.workers_total());
            loop {
                let t = co.call(dest, ECHO, &i.to_le_bytes()).unwrap();
                match co.reply(t, |r| r[..4].to_vec()).await {
                    Ok(r) => {
                        assert_eq!(r, i.to_le_bytes());
                        break;
                    }
                    Err(RpcError::TimedOut) => {
                        timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    });
}

#[test]
fn lost_datagrams_surface_as_timeouts_never_hangs() {
    // Everything lost: every call times out, and the coroutine carries on.
    let mut b = sim(2, 1, 21, FaultConfig { loss_ppm: 1_000_000, ..FaultConfig::none() });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cfg = RtConfig { rpc_timeout_ns: 50_000, ..RtConfig::default() };
    let (_, stats) = run_workers(&mut b, cfg, SIM_LIMITS, |w| {
        let seen = seen.clone();
        w.spawn(move |co| async move {
            let peer = WorkerId { node: NodeId(1 - co.me().node.0), index: 0 };
            for _ in 0..3 {
                let t = co.call(peer, ECHO, b"hi").unwrap();
                let outcome = co.reply(t, |_| ()).await;
                seen.lock().unwrap().push(outcome);
            }
        });
    })
    .unwrap();
    assert!(stats.all_done);
    assert_eq!(*seen.lock().unwrap(), vec![Err(RpcError::TimedOut); 6]);
    assert!(stats.datagrams_dropped >= 6);

    // A lossy, reordering, duplicating network: retries get every call through.
    let timeouts = Arc::new(AtomicU64::new(0));
    let mut b = sim(3, 2, 22, FaultConfig::lossy(50_000));
    let (reports, stats) =
        run_workers(&mut b, cfg, SIM_LIMITS, |w| retrying_client(w, 200, timeouts.clone()))
            .unwrap();
    assert!(stats.all_done, "retries must finish");
    assert!(timeouts.load(Ordering::Relaxed) > 0, "5% loss must cost some timeouts");
    let stale: u64 = reports.iter().map(|r| r.stats.rpc.stale_replies).sum();
    assert!(stale > 0, "delayed and duplicated replies arrive after their call settled");
}

#[test]
fn crashed_node_makes_requests_unreachable() {
    let faults = FaultConfig {
        node_faults: vec![NodeFault { node: NodeId(1), at_ns: 0, kind: NodeFaultKind::Crash }],
        ..FaultConfig::none()
    };
    let mut b = sim(2, 1, 23, faults);
    let r = regions(&mut b);
    let cfg = RtConfig { rpc_timeout_ns: 100_000, ..RtConfig::default() };
    let outcome = Arc::new(Mutex::new(None));
    let (_, stats) = run_workers(&mut b, cfg, SIM_LIMITS, |w| {
        if w.co().me().node != NodeId(0) {
            return;
        }
        let outcome = outcome.clone();
        let (data, scratch) = (r.data, r.scratch);
        w.spawn(move |co| async move {
            let word = RemoteAddr { node: NodeId(1), rkey: data, offset: 0 };
            let t = co
                .issue(
                    Qp::to(NodeId(1)),
                    &[WorkRequest::Read {
                        remote: word,
                        local: LocalAddr { rkey: scratch, offset: 0 },
                        len: 8,
                    }],
                )
                .unwrap();
            let read = co.wait(t).await;
            let t = co.call(WorkerId { node: NodeId(1), index: 0 }, ECHO, b"x").unwrap();
            let call = co.reply(t, |_| ()).await;
            *outcome.lock().unwrap() = Some((read, call));
        });
    })
    .unwrap();
    assert!(stats.all_done);
    assert_eq!(
        *outcome.lock().unwrap(),
        Some((Err(OpError::Failed(Status::Unreachable)), Err(RpcError::TimedOut)))
    );
}

#[test]
fn paused_node_nic_keeps_serving_one_sided_requests() {
    // Node 1's CPU stops for 5 ms: one-sided READs of its memory still complete at once,
    // while its RPC handler answers only after the pause.
    let faults = FaultConfig {
        node_faults: vec![NodeFault {
            node: NodeId(1),
            at_ns: 0,
            kind: NodeFaultKind::Pause { for_ns: 5_000_000 },
        }],
        ..FaultConfig::none()
    };
    let mut b = sim(2, 1, 24, faults);
    let r = regions(&mut b);
    b.region(NodeId(1), r.data).unwrap().store(0, 4242);
    let cfg = RtConfig { rpc_timeout_ns: 20_000_000, ..RtConfig::default() };
    let times = Arc::new(Mutex::new(Vec::new()));
    let (_, stats) = run_workers(&mut b, cfg, SIM_LIMITS, |w| {
        echo_handler(w);
        if w.co().me().node != NodeId(0) {
            return;
        }
        let times = times.clone();
        let (data, scratch) = (r.data, r.scratch);
        w.spawn(move |co| async move {
            let word = RemoteAddr { node: NodeId(1), rkey: data, offset: 0 };
            let local = LocalAddr { rkey: scratch, offset: 0 };
            let t = co
                .issue(Qp::to(NodeId(1)), &[WorkRequest::Read { remote: word, local, len: 8 }])
                .unwrap();
            co.wait(t).await.unwrap();
            assert_eq!(co.region(scratch).unwrap().load(0), 4242);
            times.lock().unwrap().push(co.now_ns());
            let t = co.call(WorkerId { node: NodeId(1), index: 0 }, ECHO, b"x").unwrap();
            co.reply(t, |_| ()).await.unwrap();
            times.lock().unwrap().push(co.now_ns());
        });
    })
    .unwrap();
    assert!(stats.all_done);
    let times = times.lock().unwrap();
    assert!(times[0] < 20_000, "READ served during the pause at {} ns", times[0]);
    assert!(times[1] >= 5_000_000, "RPC answered only after the pause, at {} ns", times[1]);
}

#[test]
fn same_seed_same_trace_under_faults() {
    let run_once = |seed: u64| {
        let timeouts = Arc::new(AtomicU64::new(0));
        let mut b = sim(3, 2, seed, FaultConfig::lossy(20_000));
        let cfg = RtConfig { rpc_timeout_ns: 50_000, ..RtConfig::default() };
        let (_, stats) =
            run_workers(&mut b, cfg, SIM_LIMITS, |w| retrying_client(w, 100, timeouts.clone()))
                .unwrap();
        assert!(stats.all_done);
        stats.trace_hash
    };
    let a = replay_check(|| run_once(5)).expect("deterministic");
    let b = replay_check(|| run_once(6)).expect("deterministic");
    assert_ne!(a, b, "different seeds give different traces");
}

#[test]
fn partition_cuts_both_primitives_and_breaks_the_connection_for_good() {
    use hytra_fabric::sim::faults::{Partition, Way};
    // Node 1 is cut off from node 0 for the first 2 ms, past the transport's retries:
    // the connection whose READ failed stays broken (an RC queue pair in the error
    // state), while datagrams pass again once the cut heals.
    let faults = FaultConfig {
        partitions: vec![Partition {
            side: vec![NodeId(1)],
            from_ns: 0,
            until_ns: 2_000_000,
            way: Way::Both,
        }],
        ..FaultConfig::none()
    };
    let mut b = sim(2, 1, 25, faults);
    let r = regions(&mut b);
    let cfg = RtConfig { rpc_timeout_ns: 100_000, ..RtConfig::default() };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (_, stats) = run_workers(&mut b, cfg, SIM_LIMITS, |w| {
        echo_handler(w);
        if w.co().me().node != NodeId(0) {
            return;
        }
        let seen = seen.clone();
        let (data, scratch) = (r.data, r.scratch);
        w.spawn(move |co| async move {
            let word = RemoteAddr { node: NodeId(1), rkey: data, offset: 0 };
            let read = WorkRequest::Read {
                remote: word,
                local: LocalAddr { rkey: scratch, offset: 0 },
                len: 8,
            };
            let peer = WorkerId { node: NodeId(1), index: 0 };
            for _ in 0..2 {
                let t = co.issue(Qp::to(NodeId(1)), &[read]).unwrap();
                let one_sided = co.wait(t).await;
                let t = co.call(peer, ECHO, b"x").unwrap();
                let two_sided = co.reply(t, |_| ()).await;
                seen.lock().unwrap().push((one_sided.is_ok(), two_sided.is_ok()));
                while co.now_ns() < 2_000_000 {
                    co.yield_now().await;
                }
            }
        });
    })
    .unwrap();
    assert!(stats.all_done);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(false, false), (false, true)],
        "cut, then healed but for the broken connection"
    );
}

#[test]
fn measured_cpu_mode_runs_the_same_programs() {
    use hytra_fabric::sim::CpuMode;
    let mut cfg = SimConfig::new(shape(2, 2), 26);
    cfg.cpu = CpuMode::Measured { scale: 1.0 };
    let mut b = SimCluster::new(cfg).unwrap();
    let timeouts = Arc::new(AtomicU64::new(0));
    let rt = RtConfig { rpc_timeout_ns: 50_000_000, ..RtConfig::default() };
    let (reports, stats) =
        run_workers(&mut b, rt, SIM_LIMITS, |w| retrying_client(w, 50, timeouts.clone())).unwrap();
    assert!(stats.all_done);
    assert_eq!(reports.iter().map(|r| r.stats.rpc.replies).sum::<u64>(), 4 * 50);
    // Real CPU time was charged: the run took virtual time even though no cost model ran.
    assert!(stats.elapsed_ns > 0);
    // Every step was filed under the terms it charged: each charges one event-loop step,
    // and those that resumed a coroutine a switch per resume.
    let samples = b.cpu_samples().expect("a measured cluster keeps its steps");
    assert!(samples.steps > 0);
    let step = hytra_rt::config::STEP.index() as u16;
    let switch = hytra_rt::config::SWITCH.index() as u16;
    assert!(
        samples.by_mix.keys().all(|mix| mix.first() == Some(&(step, 1))),
        "{:?}",
        samples.by_mix.keys()
    );
    assert!(samples.by_mix.keys().any(|mix| mix.iter().any(|&(t, n)| t == switch && n > 0)));
    let kept: u64 = samples.by_mix.values().map(|v| v.len() as u64).sum();
    assert_eq!(kept + samples.dropped, samples.steps);
}

#[test]
fn a_reply_after_its_call_timed_out_is_noted_as_late() {
    // Node 1's workers run a coroutine whose every turn takes 400 us: a request is
    // served at the start of a step and its reply leaves only at the end, well after
    // the call of node 0's worker 0 (100 us) timed out.
    let mut b = sim(2, 2, 24, FaultConfig::none());
    let cfg = RtConfig { rpc_timeout_ns: 100_000, ..RtConfig::default() };
    let seen = Arc::new(Mutex::new(None));
    let (_, stats) = run_workers(&mut b, cfg, SIM_LIMITS, |w| {
        echo_handler(w);
        let seen = seen.clone();
        w.spawn(move |co| async move {
            let me = co.me();
            if me.node == NodeId(1) {
                for _ in 0..10 {
                    co.charge(400_000);
                    co.yield_now().await;
                }
                return;
            }
            if me.index != 0 {
                return;
            }
            let peer = WorkerId { node: NodeId(1), index: 1 };
            let other = WorkerId { node: NodeId(1), index: 0 };
            // Let the peer's heavy coroutine start first.
            co.sleep_until(co.now_ns() + 10_000).await;
            assert_eq!(co.late_reply_at(peer), 0, "no reply came late yet");
            let sent = co.now_ns();
            let t = co.call(peer, ECHO, b"hi").unwrap();
            let outcome = co.reply(t, |_| ()).await;
            co.sleep_until(co.now_ns() + 2_000_000).await;
            let late = (co.late_reply_at(peer), co.late_reply_at(other));
            *seen.lock().unwrap() = Some((outcome, sent, late));
        });
    })
    .unwrap();
    assert!(stats.all_done);
    let (outcome, sent, (late, other)) = seen.lock().unwrap().take().expect("the caller finished");
    assert_eq!(outcome, Err(RpcError::TimedOut));
    assert!(late > sent + 100_000, "the reply came after the timeout: sent {sent}, late {late}");
    assert_eq!(other, 0, "noted for the worker that answered, not another of its node");
}
