//! The raw-primitive benchmark with tiny parameters on every backend: it runs, counts
//! only successful requests, and (on the simulator) replays bit for bit.

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_workloads::micro::{
    check_payload, effective_payload, run_point, run_point_settled, MicroError, MicroParams,
    Primitive, SETTLED_OPS_MIN,
};

fn shape(lanes: u16) -> ClusterShape {
    ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: lanes }
}

fn sim_params() -> MicroParams {
    MicroParams::fig5(2, 4, 5_000, 30_000, 3)
}

#[test]
fn every_primitive_runs_on_the_simulator() {
    for p in Primitive::ALL {
        for lanes in [1, 5] {
            let mut b = SimCluster::new(SimConfig::new(shape(lanes), 3)).unwrap();
            let (point, stats) = run_point(&mut b, p, 64, sim_params()).unwrap();
            assert!(point.ops > 0, "{p:?} x{lanes}: no requests completed");
            assert_eq!(point.failures, 0, "{p:?} x{lanes}");
            assert!(point.p50_ns > 500 && point.p50_ns <= point.p99_ns, "{p:?}: {point:?}");
            assert!(stats.all_done);
        }
    }
}

#[test]
fn every_primitive_runs_on_threads() {
    let params = MicroParams {
        warmup_ns: 5_000_000,
        measure_ns: 20_000_000,
        rpc_timeout_ns: 2_000_000_000,
        ..sim_params()
    };
    for p in Primitive::ALL {
        let mut b = LocalCluster::new(LocalConfig::new(shape(1))).unwrap();
        let (point, _) = run_point(&mut b, p, 64, params).unwrap();
        assert!(point.ops > 0, "{p:?}: no requests completed");
        assert_eq!(point.failures, 0, "{p:?}");
    }
}

#[test]
fn a_seed_replays_and_another_differs() {
    let run = |seed: u64| {
        let mut b = SimCluster::new(SimConfig::new(shape(1), seed)).unwrap();
        let params = MicroParams { seed, ..sim_params() };
        let (point, stats) = run_point(&mut b, Primitive::Rpc, 64, params).unwrap();
        (point.ops, stats.trace_hash)
    };
    assert_eq!(run(9), run(9));
    assert_ne!(run(9).1, run(10).1);
}

#[test]
fn bad_payloads_are_refused() {
    assert!(matches!(check_payload(Primitive::Read, 0, 4096), Err(MicroError::Payload { .. })));
    assert!(matches!(check_payload(Primitive::Read, 12, 4096), Err(MicroError::Payload { .. })));
    assert!(matches!(check_payload(Primitive::Read, 8192, 4096), Err(MicroError::Payload { .. })));
    assert!(matches!(
        check_payload(Primitive::WriteRpc, 2048, 4096),
        Err(MicroError::Payload { .. })
    ));
    assert_eq!(effective_payload(Primitive::Rpc, 4096), 4080);
    assert_eq!(effective_payload(Primitive::Cas, 512), 8);
    let mut b = SimCluster::new(SimConfig::new(ClusterShape { nodes: 1, ..shape(1) }, 1)).unwrap();
    assert!(matches!(
        run_point(&mut b, Primitive::Read, 64, sim_params()),
        Err(MicroError::Params(_))
    ));
}

#[test]
fn every_optimisation_switch_runs_and_each_helps_where_the_paper_says() {
    // Fig. 6 on a small cluster: each step of the ladder measured for one-sided WRITE
    // and two-sided writes; passive ACK must raise both (fewer completions to poll, no
    // replies), and every combination must complete requests.
    let mut rates = Vec::new();
    for p in [Primitive::Write, Primitive::RpcWrite] {
        for (doorbell, passive_ack) in [(false, false), (true, false), (false, true), (true, true)]
        {
            let params = MicroParams { batch: 8, doorbell, passive_ack, ..sim_params() };
            let mut b = SimCluster::new(SimConfig::new(shape(1), 3)).unwrap();
            let (point, _) = run_point(&mut b, p, 64, params).unwrap();
            assert!(
                point.ops > 0 && point.failures == 0,
                "{p:?} db={doorbell} pa={passive_ack}: {point:?}"
            );
            rates.push(((p, doorbell, passive_ack), point.ops_per_sec));
        }
    }
    let rate = |k| rates.iter().find(|(key, _)| *key == k).unwrap().1;
    for p in [Primitive::Write, Primitive::RpcWrite] {
        assert!(
            rate((p, true, true)) > rate((p, true, false)),
            "{p:?}: PA does not help: {rates:?}"
        );
    }
}

/// A window shorter than the requests' latency counts only the few that finish early: the
/// point is measured again over a longer window until it settles, or refused.
#[test]
fn a_window_shorter_than_the_latency_is_extended_or_refused() {
    let fresh = || SimCluster::new(SimConfig::new(shape(1), 3));
    // 2 µs: a few requests complete in it, far from enough.
    let tiny = MicroParams::fig5(2, 4, 5_000, 2_000, 3);
    let mut b = fresh().unwrap();
    let (raw, _) = run_point(&mut b, Primitive::Rpc, 64, tiny).unwrap();
    assert!(!raw.settled(), "{raw:?}");
    let (point, stats) = run_point_settled(fresh, Primitive::Rpc, 64, tiny, 1_000_000).unwrap();
    assert!(point.settled() && point.window_ns > tiny.measure_ns, "{point:?}");
    assert!(point.ops >= SETTLED_OPS_MIN && point.window_ns >= 2 * point.p99_ns, "{point:?}");
    // The extended point replays.
    let (again, replay) = run_point_settled(fresh, Primitive::Rpc, 64, tiny, 1_000_000).unwrap();
    assert_eq!((again.window_ns, replay.trace_hash), (point.window_ns, stats.trace_hash));
    // No room to extend: refused, not reported.
    assert!(matches!(
        run_point_settled(fresh, Primitive::Rpc, 64, tiny, tiny.measure_ns),
        Err(MicroError::Unsettled { .. })
    ));
    // A window that was long enough is kept as it is.
    let long = MicroParams::fig5(2, 4, 5_000, 400_000, 3);
    let (ok, _) = run_point_settled(fresh, Primitive::Rpc, 64, long, 1_000_000).unwrap();
    assert_eq!(ok.window_ns, long.measure_ns);
}
