//! Recovery from a crashed node on the simulator: with 3-way replication the cluster goes
//! on without it, loses no committed transaction, and stays serializable, whichever node
//! dies (the configuration manager included) and whatever it was doing.

use hytra_fabric::sim::faults::{FaultConfig, NodeFault, NodeFaultKind};
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, NodeId};
use hytra_rt::RtConfig;
use hytra_txn::{Design, TxnConfig};
use hytra_workloads::bench::{run, BenchParams, BenchResult};
use hytra_workloads::smallbank::{SmallBank, SmallBankReport};

fn crash_run(design: Design, node: u16, at_ns: u64, seed: u64) -> BenchResult<SmallBankReport> {
    let shape = ClusterShape { nodes: 4, workers_per_node: 2, lanes_per_peer: 1 };
    let mut c = SimConfig::new(shape, seed);
    c.faults = FaultConfig {
        node_faults: vec![NodeFault { node: NodeId(node), at_ns, kind: NodeFaultKind::Crash }],
        ..FaultConfig::none()
    };
    let params = BenchParams {
        coroutines: 4,
        warmup_ns: 0,
        measure_ns: 40_000_000,
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

#[test]
fn a_crashed_configuration_manager_is_replaced() {
    let r = crash_run(Design::DrtmH, 0, 5_000_000, 11);
    assert_recovered(&r, "drtmh, n0 crashed");
}
