//! Remote reads return exactly the file's bytes, on every engine and backend; bad
//! requests get errors and the server carries on; a requester that crashes with reads
//! in flight leaves nothing behind on the owner; exports expose nothing else.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hytra_fabric::local::LocalCluster;
use hytra_fabric::sim::SimCluster;
use hytra_fabric::testing::TestBackend;
use hytra_fabric::{ClusterShape, NodeId, Rkey, RunLimits, WorkerId};
use hytra_io::wire::{self, ReadReq};
use hytra_io::{
    serve, ClientConfig, DeviceModel, Engine, EngineCosts, EngineKind, Exports, FileId, IoClient,
    IoError, IoLayout, NodeIo, ReadStatus, ServiceConfig, ServiceStats, Timing,
};
use hytra_rt::{run_workers_with, Co, RtConfig};
use proptest::prelude::*;

const MAX_LEN: u32 = 20_000;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hytra-io-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A file of `len` bytes whose contents depend on the position.
fn data_file(dir: &std::path::Path, len: usize) -> (PathBuf, Vec<u8>) {
    let bytes: Vec<u8> = (0..len).map(|i| (i ^ (i >> 8) ^ (i >> 16)) as u8).collect();
    let path = dir.join("data.bin");
    std::fs::File::create(&path).unwrap().write_all(&bytes).unwrap();
    (path, bytes)
}

type Failures = Arc<Mutex<Vec<String>>>;

/// Runs node 1 as the owner and `body` as the one coroutine of node 0's worker.
fn with_service<B, F, Fut>(
    b: &mut B,
    exports: Arc<Exports>,
    kind: EngineKind,
    timing: Timing,
    body: F,
) -> ServiceStats
where
    B: TestBackend,
    F: Fn(IoClient<B::Ep>, Co<B::Ep>) -> Fut + Sync,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let layout = IoLayout { workers: 1, server_slots: 4, client_slots: 4, max_len: MAX_LEN };
    let rkey = layout.register(b).unwrap();
    let node_io = NodeIo::new(kind, timing).unwrap();
    let timeout_ns = if B::NAME == "sim" { 50_000_000 } else { 5_000_000_000 };
    let cfg = RtConfig { rpc_timeout_ns: timeout_ns, ..RtConfig::default() };
    let limits = RunLimits { time_limit_ns: B::test_time_limit_ns() };
    let served = Arc::new(Mutex::new(None));
    let (reports, stats) = run_workers_with(
        b,
        cfg,
        limits,
        |w| {
            let me = w.co().me();
            if me.node == NodeId(1) {
                Some(owner(w, &exports, &node_io, layout, rkey))
            } else {
                let client = IoClient::install(w, ClientConfig { layout, rkey, timeout_ns });
                let fut = body(client.clone(), w.co());
                w.spawn(move |_| async move {
                    fut.await;
                    client.bye(NodeId(1)).unwrap();
                });
                None
            }
        },
        |w, service| {
            if let Some(s) = service {
                *served.lock().unwrap() = Some(s.borrow().clone());
            }
            w.leaked()
        },
    )
    .unwrap();
    assert!(stats.all_done, "{}: the run did not finish", B::NAME);
    assert!(reports.iter().all(|&leaked| leaked == 0), "tickets or calls leaked");
    let s = served.lock().unwrap().take();
    s.expect("node 1 served")
}

/// Makes `w` the owner's serving worker: it stops after one requester's goodbye.
fn owner<E: hytra_fabric::Endpoint + 'static>(
    w: &mut hytra_rt::Worker<E>,
    exports: &Arc<Exports>,
    node_io: &NodeIo,
    layout: IoLayout,
    rkey: Rkey,
) -> std::rc::Rc<std::cell::RefCell<ServiceStats>> {
    let engine = Engine::install(w, node_io, MAX_LEN).unwrap();
    let cfg = ServiceConfig { layout, rkey, inline_max: 0, queue_max: 16, byes_expected: Some(1) };
    serve(w, exports.clone(), engine, cfg)
}

fn timings<B: TestBackend>() -> Timing {
    if B::NAME == "sim" {
        Timing::Modelled { device: DeviceModel::P3700, costs: EngineCosts::default() }
    } else {
        Timing::Real
    }
}

fn exact_reads<B: TestBackend>(kind: EngineKind, reads: &[(u64, u32)], direct: bool) {
    let dir = temp_dir(&format!("exact-{}-{}-{direct}", B::NAME, kind.name()));
    let (path, bytes) = data_file(&dir, 300_000);
    let mut ex = Exports::new();
    ex.add_file("data", &path, direct).unwrap();
    let exports = Arc::new(ex);
    let failures: Failures = Arc::default();
    let reads: Vec<(u64, u32)> = reads
        .iter()
        .map(|&(o, l)| {
            let o = o % bytes.len() as u64;
            (o, l.min((bytes.len() as u64 - o) as u32).max(1))
        })
        .collect();
    let mut b = B::for_test(ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 }, 3);
    let (f2, bytes2, reads2) = (failures.clone(), Arc::new(bytes), Arc::new(reads));
    with_service(&mut b, exports, kind, timings::<B>(), move |client, _co| {
        let (f, bytes, reads) = (f2.clone(), bytes2.clone(), reads2.clone());
        async move {
            let (id, size) = client.lookup(NodeId(1), "data").await.unwrap();
            assert_eq!(size, bytes.len() as u64);
            for &(o, l) in reads.iter() {
                match client.read(NodeId(1), id, o, l).await {
                    Ok(got) if got == bytes[o as usize..(o + u64::from(l)) as usize] => {}
                    Ok(_) => f.lock().unwrap().push(format!("wrong bytes at {o}+{l}")),
                    Err(e) => f.lock().unwrap().push(format!("{o}+{l}: {e}")),
                }
            }
        }
    });
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} {}: {:?}",
        B::NAME,
        kind.name(),
        &failures[..failures.len().min(5)]
    );
    std::fs::remove_dir_all(dir).unwrap();
}

const ENGINES: [EngineKind; 3] =
    [EngineKind::Pool { threads: 3 }, EngineKind::ThreadPerRequest, EngineKind::Uring { depth: 8 }];

fn reads_strategy() -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::vec((0u64..300_000, 1u32..=MAX_LEN), 1..24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn remote_reads_are_exact_on_sim(reads in reads_strategy(), direct in any::<bool>()) {
        for kind in ENGINES {
            exact_reads::<SimCluster>(kind, &reads, direct);
        }
    }

    #[test]
    fn remote_reads_are_exact_on_local(reads in reads_strategy(), direct in any::<bool>()) {
        for kind in ENGINES {
            exact_reads::<LocalCluster>(kind, &reads, direct);
        }
    }
}

#[cfg(feature = "ucx")]
#[test]
fn remote_reads_are_exact_on_ucx() {
    let reads: Vec<(u64, u32)> =
        (0..20u64).map(|i| (i * 13_577, 1 + (i as u32 * 997) % MAX_LEN)).collect();
    for kind in ENGINES {
        exact_reads::<hytra_fabric::ucx::UcxCluster>(kind, &reads, true);
    }
}

/// Unknown file, read past the end, too large, unknown name: each gets its error, and a
/// good read afterwards still works.
fn bad_requests<B: TestBackend>() {
    let dir = temp_dir(&format!("bad-{}", B::NAME));
    let (path, bytes) = data_file(&dir, 10_000);
    let mut ex = Exports::new();
    ex.add_file("data", &path, false).unwrap();
    let failures: Failures = Arc::default();
    let mut b = B::for_test(ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 }, 4);
    let (f2, bytes) = (failures.clone(), Arc::new(bytes));
    let served = with_service(
        &mut b,
        Arc::new(ex),
        EngineKind::Pool { threads: 2 },
        timings::<B>(),
        move |client, co| {
            let (f, bytes) = (f2.clone(), bytes.clone());
            async move {
                let expect = |what: &str, got: Result<Vec<u8>, IoError>, want: IoError| {
                    if got.as_ref().err() != Some(&want) {
                        f.lock().unwrap().push(format!("{what}: {got:?}, wanted {want:?}"));
                    }
                };
                let n = NodeId(1);
                expect(
                    "unknown file",
                    client.read(n, FileId(7), 0, 8).await,
                    IoError::Refused(ReadStatus::UnknownFile),
                );
                expect(
                    "past end",
                    client.read(n, FileId(0), 9_990, 11).await,
                    IoError::Refused(ReadStatus::PastEnd),
                );
                expect(
                    "offset overflow",
                    client.read(n, FileId(0), u64::MAX - 2, 8).await,
                    IoError::Refused(ReadStatus::PastEnd),
                );
                expect(
                    "too large",
                    client.read(n, FileId(0), 0, MAX_LEN + 1).await,
                    IoError::TooLarge { len: MAX_LEN + 1, max: MAX_LEN },
                );
                for name in ["../data", "/etc/passwd", "nope", "data/.."] {
                    if client.lookup(n, name).await != Err(IoError::NoSuchFile(name.into())) {
                        f.lock().unwrap().push(format!("lookup of {name:?} did not fail"));
                    }
                }
                // A request naming a buffer that does not exist (as if its requester
                // had gone): the owner's WRITE fails, and it carries on.
                let mut raw = Vec::new();
                let req = ReadReq {
                    req_id: 1 << 60,
                    file: FileId(0),
                    offset: 0,
                    len: 64,
                    dst_rkey: Rkey(99),
                    dst_offset: 0,
                };
                req.encode(&mut raw);
                co.send_oneway(WorkerId { node: n, index: 0 }, wire::READ, &raw).unwrap();
                match client.read(n, FileId(0), 9_990, 10).await {
                    Ok(got) if got == bytes[9_990..] => {}
                    other => f.lock().unwrap().push(format!("good read after errors: {other:?}")),
                }
            }
        },
    );
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "{}: {:?}", B::NAME, *failures);
    assert_eq!(
        (served.refused, served.write_failures, served.served),
        (3, 1, 1),
        "{}: {served:?}",
        B::NAME
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_requests_get_errors_on_sim() {
    bad_requests::<SimCluster>();
}

#[test]
fn bad_requests_get_errors_on_local() {
    bad_requests::<LocalCluster>();
}

#[test]
fn directory_exports_refuse_escapes() {
    let dir = temp_dir("dir");
    let outside = temp_dir("outside");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("a"), b"a").unwrap();
    std::fs::write(dir.join("sub/b"), b"b").unwrap();
    std::fs::write(outside.join("secret"), b"s").unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), dir.join("escape")).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("escape-dir")).unwrap();
    std::os::unix::fs::symlink(dir.join("a"), dir.join("inside-link")).unwrap();
    let mut ex = Exports::new();
    ex.add_dir(&dir, false).unwrap();
    let names: Vec<&str> = ex.iter().map(|(_, f)| f.name.as_str()).collect();
    assert_eq!(names, ["a", "inside-link", "sub/b"]);
    assert!(ex.lookup("escape").is_none() && ex.lookup("escape-dir/secret").is_none());
    assert_eq!(ex.skipped.len(), 2, "{:?}", ex.skipped);
    assert!(ex.add_file("../x", &dir.join("a"), false).is_err());
    assert!(ex.add_file("a", &dir.join("a"), false).is_err(), "duplicate name accepted");
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(outside).unwrap();
}

/// What a worker of the crash test ends with: node, whether its coroutines all ended,
/// tickets or calls leaked, and the owner's counters.
type Ending = (NodeId, bool, usize, Option<ServiceStats>);

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
fn a_requester_that_crashes_mid_run_leaks_nothing_on_the_owner() {
    // Node 1 owns the file; nodes 0 and 2 read it with four reads in flight each. Node 2
    // crashes (CPUs and NIC) at 2 ms with reads outstanding; node 0 reads until 8 ms,
    // then says bye and the owner stops.
    use hytra_fabric::rng::Rng;
    use hytra_fabric::sim::faults::{FaultConfig, NodeFault, NodeFaultKind};
    use hytra_fabric::sim::SimConfig;
    use hytra_fabric::Program;
    const CRASH_NS: u64 = 2_000_000;
    const END_NS: u64 = 8_000_000;
    let dir = temp_dir("crash");
    let (path, bytes) = data_file(&dir, 300_000);
    let mut ex = Exports::new();
    ex.add_file("data", &path, false).unwrap();
    let (exports, bytes) = (Arc::new(ex), Arc::new(bytes));
    for kind in ENGINES {
        let shape = ClusterShape { nodes: 3, workers_per_node: 1, lanes_per_peer: 1 };
        let mut cfg = SimConfig::new(shape, 11);
        cfg.faults = FaultConfig {
            node_faults: vec![NodeFault {
                node: NodeId(2),
                at_ns: CRASH_NS,
                kind: NodeFaultKind::Crash,
            }],
            ..FaultConfig::none()
        };
        let mut b = SimCluster::new(cfg).unwrap();
        let layout = IoLayout { workers: 1, server_slots: 4, client_slots: 4, max_len: MAX_LEN };
        let rkey = layout.register(&mut b).unwrap();
        let node_io = NodeIo::new(kind, timings::<SimCluster>()).unwrap();
        // Above the transport timeout (0.5 ms on cx4): until the owner's WRITEs to the dead
        // node fail, its reads hold the owner's slots and node 0's reads wait behind them.
        let timeout_ns = 5_000_000;
        let rt = RtConfig { rpc_timeout_ns: timeout_ns, ..RtConfig::default() };
        let failures: Failures = Arc::default();
        // Reads node 0 completed after the crash.
        let after_crash = Arc::new(Mutex::new(0u64));
        let (endings, _) = run_workers_with(
            &mut b,
            rt,
            RunLimits { time_limit_ns: 1_000_000_000 },
            |w| {
                let me = w.co().me();
                if me.node == NodeId(1) {
                    return Some(owner(w, &exports, &node_io, layout, rkey));
                }
                let client = IoClient::install(w, ClientConfig { layout, rkey, timeout_ns });
                let finished = std::rc::Rc::new(std::cell::Cell::new(0u16));
                for c in 0..4u64 {
                    let (client, finished) = (client.clone(), finished.clone());
                    let (f, bytes, after) = (failures.clone(), bytes.clone(), after_crash.clone());
                    w.spawn(move |co| async move {
                        let mut rng = Rng::new(u64::from(me.node.0) << 8 | c);
                        while co.now_ns() < END_NS {
                            let o = rng.below(bytes.len() as u64 - u64::from(MAX_LEN));
                            let l = 1 + rng.below(u64::from(MAX_LEN)) as u32;
                            let got = client.read(NodeId(1), FileId(0), o, l).await;
                            match got {
                                Ok(v) if v == bytes[o as usize..(o + u64::from(l)) as usize] => {
                                    if co.now_ns() > CRASH_NS {
                                        *after.lock().unwrap() += 1;
                                    }
                                }
                                Ok(_) => f.lock().unwrap().push(format!("wrong bytes {o}+{l}")),
                                Err(e) => f.lock().unwrap().push(format!("{o}+{l}: {e}")),
                            }
                        }
                        finished.set(finished.get() + 1);
                        if finished.get() == 4 {
                            client.bye(NodeId(1)).unwrap();
                        }
                    });
                }
                None
            },
            |w, service| -> Ending {
                let stats = service.map(|s| s.borrow().clone());
                (w.co().me().node, w.is_done(), w.leaked(), stats)
            },
        )
        .unwrap();
        let what = kind.name();
        let failures = failures.lock().unwrap();
        assert!(failures.is_empty(), "{what}: {:?}", &failures[..failures.len().min(5)]);
        for (node, done, leaked, _) in &endings {
            match node.0 {
                2 => assert!(!done, "{what}: node 2 crashed with reads in flight"),
                _ => {
                    assert!(done, "{what}: {node} did not finish");
                    assert_eq!(*leaked, 0, "{what}: {node} leaked tickets or calls");
                }
            }
        }
        let served = endings.iter().find_map(|e| e.3.clone()).expect("the owner's counters");
        // The reads node 2 left behind: the owner's WRITEs (or DONEs) to it failed, and
        // freed their slots, since node 0 kept being served.
        assert!(served.write_failures + served.done_lost > 0, "{what}: {served:?}");
        assert!(*after_crash.lock().unwrap() > 20, "{what}: node 0 starved after the crash");
        assert_eq!(served.malformed + served.dropped + served.io_failures, 0, "{what}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A window too short for its reads is measured again over a longer one; where no
/// longer window is allowed it is refused, never reported as a rate.
#[test]
fn a_window_too_short_is_lengthened_or_refused() {
    use hytra_io::bench::{run_settled, BenchError, IoParams, Mode, Target};
    let dir = temp_dir("settled");
    let (path, _) = data_file(&dir, 1 << 20);
    let mut ex = Exports::new();
    ex.add_file("data", &path, false).unwrap();
    let target = Target { exports: Arc::new(ex), file: FileId(0) };
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let fresh = || SimCluster::new(hytra_fabric::sim::SimConfig::new(shape, 5));
    let p = IoParams {
        mode: Mode::Remote,
        engine: EngineKind::Pool { threads: 2 },
        size: 4096,
        connections: 1,
        depth: 8,
        duration_ns: 10_000,
        warmup_ns: 0,
        seed: 5,
        inline_max: 0,
        timeout_ns: 1_000_000_000,
    };
    let t = timings::<SimCluster>();
    let r = run_settled(fresh, &target, &p, t, 1_000_000_000).unwrap();
    assert_eq!(r.extended_from_s, Some(1e-5), "{r:?}");
    assert!(r.reads >= 1000 && r.seconds * 1e6 >= 2.0 * r.p99_us, "{r:?}");
    let refused = run_settled(fresh, &target, &p, t, 4 * p.duration_ns);
    assert!(matches!(refused, Err(BenchError::Unsettled { .. })), "{refused:?}");
    std::fs::remove_dir_all(dir).unwrap();
}
