//! Recovery from a crashed node on the simulator (and, where the backend matters, on
//! threads): with 3-way replication the cluster goes on without it, loses no committed
//! transaction, and stays serializable, whichever node dies (the configuration manager
//! included) and whatever it was doing.

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::faults::{FaultConfig, NodeFault, NodeFaultKind};
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, NodeId};
use hytra_rt::RtConfig;
use hytra_txn::{
    AbortReason, CrashPoint, Design, ProtocolPoint, RecoveryParams, RecoveryStep, TxnConfig,
};
use hytra_workloads::bench::{run, BenchParams, BenchResult};
use hytra_workloads::smallbank::{SmallBank, SmallBankReport};
use hytra_workloads::ycsb::{KeyDist, Mix, Ycsb, YcsbParams};

fn crash_run(design: Design, node: u16, at_ns: u64, seed: u64) -> BenchResult<SmallBankReport> {
    crashes_run(design, 4, &[(node, at_ns)], seed)
}

fn crashes_run(
    design: Design,
    nodes: u16,
    crashes: &[(u16, u64)],
    seed: u64,
) -> BenchResult<SmallBankReport> {
    let faults = crashes.iter().map(|&(node, at_ns)| NodeFault {
        node: NodeId(node),
        at_ns,
        kind: NodeFaultKind::Crash,
    });
    faults_run(design, nodes, faults.collect(), 40_000_000, seed)
}

/// SmallBank on `nodes` x 2 workers of `design`, 3-way replicated, for `measure_ns`,
/// with `node_faults`, checked.
fn faults_run(
    design: Design,
    nodes: u16,
    node_faults: Vec<NodeFault>,
    measure_ns: u64,
    seed: u64,
) -> BenchResult<SmallBankReport> {
    let shape = ClusterShape { nodes, workers_per_node: 2, lanes_per_peer: 1 };
    let mut c = SimConfig::new(shape, seed);
    c.faults = FaultConfig { node_faults, ..FaultConfig::none() };
    let params = BenchParams {
        coroutines: 4,
        warmup_ns: 0,
        measure_ns,
        seed,
        check: true,
        rt: RtConfig { rpc_timeout_ns: 500_000, ..RtConfig::default() },
        drain_ns: 500_000_000,
        warm_cache: true,
        timeline_ns: 1_000_000,
    };
    let cfg = TxnConfig { replication: 3, ..TxnConfig::preset(design) };
    run(&mut SimCluster::new(c).unwrap(), &SmallBank { accounts_per_worker: 200 }, cfg, params)
        .unwrap()
}

fn assert_recovered(r: &BenchResult<SmallBankReport>, what: &str) {
    let c = r.checker.as_ref().expect("checked");
    assert!(
        c.serializable(),
        "{what}: not serializable: {:?}",
        &c.violations[..c.violations.len().min(3)]
    );
    assert!(r.invariant.ok, "{what}: {:?}", r.invariant.details);
    // The crash at 5 ms is detected a lease (5 ms) later; by the last quarter the
    // cluster, one node short, runs at more than half its rate before the crash (without
    // recovery every coroutine ends up waiting on the dead node).
    let t = &r.stats.timeline;
    assert!(t.len() >= 40, "{what}: {t:?}");
    let before = t[1..5].iter().sum::<u64>() / 4;
    let after = t[30..40].iter().sum::<u64>() / 10;
    assert!(
        after * 2 > before,
        "{what}: {after} commits/ms after recovery, {before} before: {t:?}"
    );
}

#[test]
fn a_crashed_backup_or_primary_is_recovered_from() {
    for design in [Design::DrtmH, Design::Farm, Design::Fasst, Design::DrtmR] {
        let r = crash_run(design, 3, 5_000_000, 7);
        assert_recovered(&r, &format!("{design:?}, n3 crashed"));
    }
}

/// On threads a request to a crashed node fails at once, so before recovery removes the
/// node (a lease later) a transaction that needs it would spend its 64 attempts within a
/// millisecond and give up. Its clients wait for the new configuration instead: none
/// gives up, and the run goes on serializable without the node.
#[test]
fn clients_wait_for_an_unreachable_node_to_be_removed() {
    let crash = NodeFault { node: NodeId(2), at_ns: 150_000_000, kind: NodeFaultKind::Crash };
    // Reads only, so that only the unreachable node can exhaust a transaction's
    // attempts; four records each, so that most meet the crashed node.
    let workload = Ycsb::new(YcsbParams {
        records_per_worker: 20_000,
        fields: 2,
        field_bytes: 32,
        ops_per_txn: 4,
        dist: KeyDist::Uniform,
        ..YcsbParams::core(Mix::C)
    });
    let r = run_waiting_out(vec![crash], None, &workload);
    let unreachable = r.stats.aborts[AbortReason::Unreachable.index_pub()];
    assert!(unreachable > 0, "no attempt met the crashed node");
}

/// A node that crashes between the write-backs of a transaction leaves the records it
/// had not written back locked until recovery removes it (a lease later); a survivor
/// that meets such a lock aborts on contention, without any request to the dead node.
/// Its clients wait as they do for an unreachable node once the same attempt's lock has
/// blocked three of theirs: none gives up.
#[test]
fn clients_wait_out_the_locks_a_crashed_node_left() {
    let point = CrashPoint {
        node: NodeId(2),
        point: ProtocolPoint::WrittenBackPartly,
        from_ns: 150_000_000,
        until_ns: 400_000_000,
    };
    // Updates on few records, so that the dead locks are met often.
    let workload = Ycsb::new(YcsbParams {
        records_per_worker: 1_000,
        fields: 2,
        field_bytes: 32,
        ops_per_txn: 4,
        dist: KeyDist::Uniform,
        ..YcsbParams::core(Mix::A)
    });
    let r = run_waiting_out(Vec::new(), Some(point), &workload);
    assert!(r.recovery.crashed.contains(&NodeId(2)), "the crash point was never reached");
    assert!(r.stats.stuck_lock_waits > 0, "no attempt met a lock the crashed node left");
}

/// YCSB on 3 threaded nodes of `drtmh`, 3-way replicated with a lease of 200 ms, node 2
/// crashed by `faults` or `point`: requires the run serializable, its invariants whole,
/// no transaction given up, the node removed in time and commits at the end.
fn run_waiting_out(
    faults: Vec<NodeFault>,
    point: Option<CrashPoint>,
    workload: &Ycsb,
) -> BenchResult<hytra_workloads::ycsb::YcsbReport> {
    let shape = ClusterShape { nodes: 3, workers_per_node: 1, lanes_per_peer: 1 };
    let config = LocalConfig { threads: Some(2), node_faults: faults, ..LocalConfig::new(shape) };
    // Long enough that no live node's lease lapses on a loaded 2-core host.
    let lease_ns = 200_000_000;
    let params = BenchParams {
        coroutines: 4,
        warmup_ns: 0,
        measure_ns: 700_000_000,
        seed: 5,
        check: true,
        rt: RtConfig { rpc_timeout_ns: lease_ns / 2, ..RtConfig::default() },
        drain_ns: 20_000_000_000,
        warm_cache: true,
        timeline_ns: 10_000_000,
    };
    let recovery = RecoveryParams { lease_ns, ..RecoveryParams::real() };
    let cfg = TxnConfig {
        replication: 3,
        recovery: Some(recovery),
        crash_point: point,
        ..TxnConfig::preset(Design::DrtmH)
    };
    let r = run(&mut LocalCluster::new(config).unwrap(), workload, cfg, params).unwrap();
    let c = r.checker.as_ref().expect("checked");
    assert!(c.serializable(), "not serializable: {:?}", &c.violations[..c.violations.len().min(3)]);
    assert!(r.invariant.ok, "{:?}", r.invariant.details);
    assert_eq!(r.stats.gave_up, 0, "aborts {:?}", r.stats.aborts);
    let removed = r.recovery.events.iter().find_map(|(_, e)| match &e.step {
        RecoveryStep::Removing { dead, .. } if dead.contains(&NodeId(2)) => Some(e.at_ns),
        _ => None,
    });
    let removed = removed.expect("the crashed node was removed");
    // Commits go on after the removal, in the window's last tenth.
    let t = &r.recovery.survivors_timeline;
    let last = t.len() - t.len() / 10;
    assert!(removed < 650_000_000, "removed only at {removed} ns");
    assert!(t[last..].iter().sum::<u64>() > 0, "no commits at the end: {t:?}");
    r
}

#[test]
fn a_crashed_configuration_manager_is_replaced() {
    let r = crash_run(Design::DrtmH, 0, 5_000_000, 11);
    assert_recovered(&r, "drtmh, n0 crashed");
}

/// When node `on` recorded the first event `step` matches.
fn step_at(
    r: &BenchResult<SmallBankReport>,
    on: u16,
    step: impl Fn(&RecoveryStep) -> bool,
) -> Option<u64> {
    r.recovery.events.iter().find(|(n, e)| n.0 == on && step(&e.step)).map(|(_, e)| e.at_ns)
}

/// The manager dies in its own reconfiguration, at points from just after it committed
/// the new configuration to just before every member is active (some members holding the
/// decisions, some applying them): the next member takes over, keeps to whatever was
/// decided, and nothing committed is lost (INVARIANTS F4).
#[test]
fn a_manager_that_dies_reconfiguring_is_replaced() {
    let seed = 5;
    // The same run with only the first crash, to learn when the manager's rounds run
    // (the simulator replays it exactly up to the second crash).
    let alone = crashes_run(Design::DrtmH, 6, &[(3, 5_000_000)], seed);
    let committed = step_at(&alone, 0, |s| matches!(s, RecoveryStep::Committed { epoch: 2 }))
        .expect("the manager committed epoch 2");
    let decided = step_at(&alone, 0, |s| matches!(s, RecoveryStep::Decided { .. }))
        .expect("the manager decided");
    let active = step_at(&alone, 0, |s| matches!(s, RecoveryStep::ActiveEverywhere { epoch: 2 }))
        .expect("every member active in epoch 2");
    assert!(committed < decided && decided < active, "{committed} {decided} {active}");
    for at in [committed + 1, decided, decided + (active - decided) / 2, active - 1] {
        let r = crashes_run(Design::DrtmH, 6, &[(3, 5_000_000), (0, at)], seed);
        let what = format!("manager n0 crashed at {at} ns (epoch 2 committed {committed}, decided {decided}, active {active})");
        assert_recovered(&r, &what);
        let took_over = r.recovery.events.iter().any(|(n, e)| {
            n.0 != 0 && matches!(&e.step, RecoveryStep::Removing { dead, .. } if dead.contains(&NodeId(0)))
        });
        assert!(took_over, "{what}: no member took over: {:?}", r.recovery.events);
    }
}

#[test]
fn a_run_ends_a_few_polls_after_its_clients() {
    // Once every member's clients are done, the manager tells them the run is over until
    // each acknowledged it. It used to tell them for two whole leases, which on threads
    // and processes (2 s leases) made every run 4 s longer than its window.
    let r = crashes_run(Design::DrtmH, 4, &[], 3);
    assert_recovered(&r, "no crash");
    let window_ns = 40_000_000;
    let lease_ns = hytra_txn::RecoveryParams::simulated().lease_ns;
    let tail_ns = r.run.elapsed_ns - window_ns;
    assert!(tail_ns < lease_ns / 2, "the run ended {tail_ns} ns after its window");
}

/// Node `node` of 3 crashes at 5 ms and restarts at `restart_ns`, wiped: it must join
/// again as a new member, take the backups the two survivors could not place, and
/// coordinate transactions again, with nothing lost and the replicas equal at the end.
fn restart_run(
    design: Design,
    node: u16,
    restart_ns: u64,
    seed: u64,
) -> BenchResult<SmallBankReport> {
    let faults = vec![
        NodeFault { node: NodeId(node), at_ns: 5_000_000, kind: NodeFaultKind::Crash },
        NodeFault { node: NodeId(node), at_ns: restart_ns, kind: NodeFaultKind::Restart },
    ];
    faults_run(design, 3, faults, 60_000_000, seed)
}

#[test]
fn a_restarted_node_joins_again_as_a_new_backup() {
    // Restarted before its earlier life is removed (a lease after the crash), and after.
    for (design, node, restart_ns) in [
        (Design::DrtmH, 2, 6_000_000),
        (Design::Fasst, 0, 20_000_000),
        (Design::Farm, 1, 6_000_000),
        (Design::DrtmR, 2, 20_000_000),
    ] {
        let what = format!("{design:?}, n{node} restarted at {} ms", restart_ns / 1_000_000);
        let r = restart_run(design, node, restart_ns, 11);
        let c = r.checker.as_ref().expect("checked");
        assert!(c.serializable(), "{what}: {:?}", &c.violations[..c.violations.len().min(3)]);
        assert!(r.invariant.ok, "{what}: {:?}", r.invariant.details);
        let events = &r.recovery.events;
        let joined = events.iter().find_map(|(_, e)| match &e.step {
            RecoveryStep::Joining { joined, .. } => Some((e.at_ns, joined.clone())),
            _ => None,
        });
        let (at, joined) = joined.unwrap_or_else(|| panic!("{what}: never joined: {events:?}"));
        assert_eq!(joined, vec![NodeId(node)], "{what}");
        assert!(at >= restart_ns, "{what}: joined at {at} ns");
        // Back to three copies of every partition, on the restarted node.
        assert!(
            events
                .iter()
                .any(|(_, e)| e.at_ns > at && matches!(e.step, RecoveryStep::Replicated { .. })),
            "{what}: not replicated again after the join: {events:?}"
        );
        assert!(r.recovery.still_copying.is_empty(), "{what}: {:?}", r.recovery.still_copying);
        // The restarted node coordinates again: in the last quarter the cluster commits
        // about as much as before the crash.
        let t = &r.stats.timeline;
        let before = t[1..5].iter().sum::<u64>() / 4;
        let after = t[45..60].iter().sum::<u64>() / 15;
        assert!(
            after * 5 > before * 4,
            "{what}: {after} commits/ms at the end, {before} before: {t:?}"
        );
    }
}
