//! Re-replication on the simulator: after each failure every partition that lost a copy
//! gets a new backup, copied in the background and then marked ready, so that 3-way
//! replication survives failures one after another, even of every node a partition
//! started on; a failure that comes before the copies are whole stops the run with its
//! reason instead of losing data; and a node cut off for longer than the transport
//! retries is removed by suspicion and re-replicated like a dead one.

use hytra_fabric::sim::faults::{FaultConfig, NodeFault, NodeFaultKind, Partition, Way};
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, NodeId};
use hytra_rt::RtConfig;
use hytra_txn::{Design, RecoveryParams, RecoveryStep, Rereplication, TxnConfig};
use hytra_workloads::bench::{run, BenchError, BenchParams, BenchResult};
use hytra_workloads::smallbank::{SmallBank, SmallBankReport};

const MS: u64 = 1_000_000;

/// Nodes 3, 4 and 5 of six, which held every copy of partition 3 at the start, crash
/// 20 ms apart.
const ONE_BY_ONE: [(u16, u64); 3] = [(3, 5 * MS), (4, 25 * MS), (5, 45 * MS)];

fn crashes_run(
    design: Design,
    crashes: &[(u16, u64)],
    rereplication: Rereplication,
) -> Result<BenchResult<SmallBankReport>, BenchError> {
    crashes_cut_run(design, crashes, rereplication, Vec::new())
}

/// [`crashes_run`] with network cuts too.
fn crashes_cut_run(
    design: Design,
    crashes: &[(u16, u64)],
    rereplication: Rereplication,
    partitions: Vec<Partition>,
) -> Result<BenchResult<SmallBankReport>, BenchError> {
    let shape = ClusterShape { nodes: 6, workers_per_node: 2, lanes_per_peer: 1 };
    let mut c = SimConfig::new(shape, 5);
    c.faults = FaultConfig {
        partitions,
        node_faults: crashes
            .iter()
            .map(|&(node, at_ns)| NodeFault {
                node: NodeId(node),
                at_ns,
                kind: NodeFaultKind::Crash,
            })
            .collect(),
        ..FaultConfig::none()
    };
    let params = BenchParams {
        coroutines: 4,
        warmup_ns: 0,
        measure_ns: 65 * MS,
        seed: 5,
        check: true,
        rt: RtConfig { rpc_timeout_ns: 500_000, ..RtConfig::default() },
        drain_ns: 500 * MS,
        warm_cache: true,
        timeline_ns: MS,
    };
    let recovery = RecoveryParams { rereplication, ..RecoveryParams::simulated() };
    let cfg = TxnConfig { replication: 3, recovery: Some(recovery), ..TxnConfig::preset(design) };
    run(&mut SimCluster::new(c)?, &SmallBank { accounts_per_worker: 500 }, cfg, params)
}

#[test]
fn failures_one_after_another_are_survived_through_new_copies() {
    for design in [Design::DrtmH, Design::Fasst] {
        let paced = Rereplication::Paced { bytes_per_sec: 250_000_000 };
        let r = crashes_run(design, &ONE_BY_ONE, paced).unwrap();
        let c = r.checker.as_ref().expect("checked");
        assert!(c.serializable(), "{design:?}: {:?}", &c.violations[..c.violations.len().min(3)]);
        assert!(r.invariant.ok, "{design:?}: {:?}", r.invariant.details);
        assert!(r.recovery.still_copying.is_empty(), "{design:?}: {:?}", r.recovery.still_copying);
        let events = &r.recovery.events;
        // Each failure: copies made, marked ready, every partition whole again before the
        // next one.
        for (k, &(node, at)) in ONE_BY_ONE.iter().enumerate() {
            let until = ONE_BY_ONE.get(k + 1).map_or(u64::MAX, |&(_, t)| t);
            let during = |pred: &dyn Fn(&RecoveryStep) -> bool| {
                events.iter().any(|(_, e)| e.at_ns > at && e.at_ns < until && pred(&e.step))
            };
            assert!(
                during(
                    &|s| matches!(s, RecoveryStep::Removing { dead, .. } if dead.contains(&NodeId(node)))
                ),
                "{design:?}: n{node} not removed: {events:?}"
            );
            assert!(
                during(&|s| matches!(s, RecoveryStep::Copied { .. })),
                "{design:?}: no copy after n{node}"
            );
            assert!(
                during(&|s| matches!(s, RecoveryStep::Replicated { .. })),
                "{design:?}: not replicated again after n{node}: {events:?}"
            );
        }
        // Every node partition 3 started on is dead: the money the invariant found in it
        // came through copies made after the failures. The cluster kept running on three
        // nodes: commits in the last 10 ms.
        let t = &r.stats.timeline;
        assert!(t[55..65].iter().sum::<u64>() > 0, "{design:?}: {t:?}");
    }
}

#[test]
fn a_failure_before_the_copies_are_whole_stops_the_run_with_its_reason() {
    // At 1 MB/s nothing is copied in time: the third crash takes partition 3's last
    // ready copy while its new ones are still copying.
    let slow = Rereplication::Paced { bytes_per_sec: 1_000_000 };
    let err = crashes_run(Design::DrtmH, &ONE_BY_ONE, slow).expect_err("the run stops");
    let why = err.to_string();
    assert!(why.contains("lost its primary and every up-to-date backup"), "{why}");
    assert!(why.contains("still copying"), "{why}");
}

#[test]
fn without_re_replication_partitions_run_short() {
    let r = crashes_run(Design::DrtmH, &ONE_BY_ONE[..1], Rereplication::Off).unwrap();
    assert!(r.invariant.ok, "{:?}", r.invariant.details);
    let copied = r.recovery.events.iter().any(|(_, e)| {
        matches!(e.step, RecoveryStep::Copied { .. } | RecoveryStep::Replicated { .. })
    });
    assert!(!copied, "nothing is copied with re-replication off");
}

#[test]
fn a_node_cut_off_past_the_transport_retries_is_removed_and_nothing_is_lost() {
    // A 1 ms cut breaks every connection of the cut node for good; both sides keep their
    // leases, so only suspicion removes it: node 4 by the manager, or, when the manager
    // itself is cut off, node 0 by node 1 once node 0 stepped down. Re-replication then
    // makes the copies whole again.
    let slow = Rereplication::Paced { bytes_per_sec: 20_000_000 };
    for (cut, removed, by) in [(4, NodeId(4), NodeId(0)), (0, NodeId(0), NodeId(1))] {
        let cut = Partition {
            side: vec![NodeId(cut)],
            from_ns: 11_500_000,
            until_ns: 12_500_000,
            way: Way::Both,
        };
        let r = crashes_cut_run(Design::DrtmH, &[], slow, vec![cut]).unwrap();
        let c = r.checker.as_ref().expect("checked");
        assert!(c.serializable(), "{:?}", &c.violations[..c.violations.len().min(3)]);
        assert!(r.invariant.ok, "{:?}", r.invariant.details);
        let events = &r.recovery.events;
        assert!(
            events.iter().any(|(n, e)| *n == by
                && matches!(&e.step, RecoveryStep::Removing { dead, .. } if dead == &[removed])),
            "{removed} not removed by {by}: {events:?}"
        );
        assert!(
            events.iter().any(|(_, e)| matches!(e.step, RecoveryStep::Replicated { .. })),
            "copies not whole again after {removed}'s removal: {events:?}"
        );
        assert!(r.recovery.still_copying.is_empty());
    }
}

#[test]
fn a_node_cut_off_one_way_is_removed_and_takes_no_one_over() {
    // 12 ms, over two leases, cut one way: what a node sends, or what it receives. A
    // member cut either way is removed by the manager (its renewals are lost, or its
    // grants, and its renewals stop acknowledging new grants), and
    // does not take the manager for dead, since no other member answers it. The manager
    // cut either way steps down (its members' renewals, or their acknowledgements, stop),
    // and node 1 takes over once the others agree none of them hears it. No other node is
    // removed, nothing is lost, and the copies are whole again.
    let all_but = |n: u16| (0..6).filter(|&m| m != n).map(NodeId).collect::<Vec<_>>();
    let cases = [
        (vec![NodeId(4)], NodeId(4), NodeId(0)),
        (all_but(4), NodeId(4), NodeId(0)),
        (vec![NodeId(0)], NodeId(0), NodeId(1)),
        (all_but(0), NodeId(0), NodeId(1)),
    ];
    let slow = Rereplication::Paced { bytes_per_sec: 20_000_000 };
    for (side, removed, by) in cases {
        let what = format!("cut from {side:?}");
        let cut = Partition { side, from_ns: 11_500_000, until_ns: 23_500_000, way: Way::FromSide };
        let r = crashes_cut_run(Design::DrtmH, &[], slow, vec![cut]).unwrap();
        let c = r.checker.as_ref().expect("checked");
        assert!(c.serializable(), "{what}: {:?}", &c.violations[..c.violations.len().min(3)]);
        assert!(r.invariant.ok, "{what}: {:?}", r.invariant.details);
        let events = &r.recovery.events;
        let removals: Vec<_> = events
            .iter()
            .filter_map(|(n, e)| match &e.step {
                RecoveryStep::Removing { dead, .. } => Some((*n, dead.clone())),
                _ => None,
            })
            .collect();
        assert!(removals.contains(&(by, vec![removed])), "{what}: {removals:?}");
        assert!(
            removals.iter().all(|(_, dead)| dead == &[removed]),
            "{what}: only {removed} is removed: {removals:?}"
        );
        assert!(
            events.iter().any(|(_, e)| matches!(e.step, RecoveryStep::Replicated { .. })),
            "{what}: copies not whole again: {events:?}"
        );
    }
}
