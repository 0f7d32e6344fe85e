//! SmallBank end to end: every design on every backend keeps the money, the replicas and
//! serializability; lossy networks too; planted faults are caught.

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::faults::FaultConfig;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{Backend, ClusterShape};
use hytra_rt::RtConfig;
use hytra_txn::{Design, PlantedFault, Primitive, TxnConfig};
use hytra_workloads::bench::{run, BenchError, BenchParams, BenchResult};
use hytra_workloads::smallbank::{SmallBank, SmallBankReport};

fn shape() -> ClusterShape {
    ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 }
}

fn sim_params(seed: u64) -> BenchParams {
    BenchParams {
        coroutines: 4,
        warmup_ns: 20_000,
        measure_ns: 200_000,
        seed,
        check: true,
        rt: RtConfig { rpc_timeout_ns: 500_000, ..RtConfig::default() },
        drain_ns: 200_000_000,
        warm_cache: true,
        timeline_ns: 0,
    }
}

fn bank() -> SmallBank {
    // Few accounts: contention, so aborts and retries happen.
    SmallBank { accounts_per_worker: 50 }
}

fn assert_correct(r: &BenchResult<SmallBankReport>, what: &str) {
    let c = r.checker.as_ref().expect("checked");
    assert!(
        c.serializable(),
        "{what}: not serializable: {:?}",
        &c.violations[..c.violations.len().min(3)]
    );
    assert!(r.invariant.ok, "{what}: {:?}", r.invariant.details);
    assert!(r.stats.commits > 50, "{what}: only {} commits", r.stats.commits);
    assert!(c.txns > 50, "{what}: history of {} transactions", c.txns);
}

fn sim_run(
    design: Design,
    seed: u64,
    faults: FaultConfig,
    planted: Option<PlantedFault>,
) -> BenchResult<SmallBankReport> {
    sim_run_cfg(TxnConfig::preset(design), seed, faults, planted)
}

fn sim_run_cfg(
    mut txn: TxnConfig,
    seed: u64,
    faults: FaultConfig,
    planted: Option<PlantedFault>,
) -> BenchResult<SmallBankReport> {
    // A lost datagram costs a whole RPC timeout: give lossy runs a longer window.
    let measure_ns = if faults.datagram_faults() { 3_000_000 } else { 200_000 };
    let mut cfg = SimConfig::new(shape(), seed);
    cfg.faults = faults;
    let mut b = SimCluster::new(cfg).unwrap();
    txn.planted = planted;
    run(&mut b, &bank(), txn, BenchParams { measure_ns, ..sim_params(seed) }).unwrap()
}

#[test]
fn every_design_is_correct_on_the_simulator() {
    for d in Design::ALL {
        let r = sim_run(d, 1, FaultConfig::none(), None);
        assert_correct(&r, d.name());
        println!(
            "{}: {} commits, abort rate {:.3}",
            d.name(),
            r.stats.commits,
            r.stats.abort_rate()
        );
    }
}

#[test]
fn every_design_is_correct_over_several_connections_per_peer() {
    // Coroutines spread over the lanes: one transaction's ordered requests must still
    // share a connection.
    for d in Design::ALL {
        let shape = ClusterShape { lanes_per_peer: 3, ..shape() };
        let mut b = SimCluster::new(SimConfig::new(shape, 4)).unwrap();
        let r = run(&mut b, &bank(), TxnConfig::preset(d), sim_params(4)).unwrap();
        assert_correct(&r, d.name());
    }
}

#[test]
fn every_design_is_correct_on_threads() {
    for d in Design::ALL {
        let mut b = LocalCluster::new(LocalConfig::new(shape())).unwrap();
        let params = BenchParams {
            warmup_ns: 5_000_000,
            measure_ns: 50_000_000,
            rt: RtConfig { rpc_timeout_ns: 2_000_000_000, ..RtConfig::default() },
            drain_ns: 30_000_000_000,
            ..sim_params(2)
        };
        let r = run(&mut b, &bank(), TxnConfig::preset(d), params).unwrap();
        assert_correct(&r, d.name());
    }
}

/// Seeds each design runs with under faults in the default test run; set
/// `HYTRA_SEEDS=n` for a longer sweep.
fn seeds() -> std::ops::Range<u64> {
    let n = std::env::var("HYTRA_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    100..100 + n
}

#[test]
fn every_design_is_correct_on_a_lossy_reordering_network() {
    let mut dropped = 0;
    let mut timeouts = 0;
    // The presets, and RPC commits with passive ACK (acknowledgements collected, and
    // lost commits resent, by the background task).
    let mut configs: Vec<TxnConfig> = Design::ALL.iter().map(|&d| TxnConfig::preset(d)).collect();
    configs.push(TxnConfig { passive_ack: true, ..TxnConfig::preset(Design::Farm) });
    // RPC locks released by one-sided write-backs (DrTM+H Fig. 9's setting).
    configs.push(TxnConfig { commit: Primitive::OneSided, ..TxnConfig::preset(Design::Farm) });
    for cfg in configs {
        for seed in seeds() {
            // 1% loss, duplication, reordering and long delays of datagrams.
            let r = sim_run_cfg(cfg, seed, FaultConfig::lossy(10_000), None);
            let what =
                format!("{} (passive ACK {}) seed {seed}", cfg.design.name(), cfg.passive_ack);
            assert_correct(&r, &what);
            dropped += r.run.datagrams_dropped;
            timeouts += r.rt.rpc.timeouts;
        }
    }
    assert!(
        dropped > 0 && timeouts > 0,
        "the faults must strike: {dropped} drops, {timeouts} timeouts"
    );
}

#[test]
fn the_checker_catches_planted_faults() {
    let skip_validation = Some(PlantedFault::SkipReadValidation);
    let skip_bump = Some(PlantedFault::SkipVersionBump);
    for planted in [skip_bump, skip_validation] {
        // The anomalies a skipped validation admits need particular interleavings: run
        // seeds until one shows up (a handful suffice; the bound keeps the test finite).
        let caught = (1..=20).find(|&seed| {
            let mut cfg = SimConfig::new(shape(), seed);
            cfg.faults = FaultConfig::none();
            let mut b = SimCluster::new(cfg).unwrap();
            let mut txn = TxnConfig::preset(Design::DrtmH);
            txn.planted = planted;
            let params = BenchParams { measure_ns: 2_000_000, coroutines: 8, ..sim_params(seed) };
            let r = run(&mut b, &bank(), txn, params).unwrap();
            !r.checker.unwrap().serializable()
        });
        assert!(caught.is_some(), "{planted:?} went unnoticed in 20 runs");
    }
    // And without the fault, the same runs pass (see the tests above).
}

#[test]
fn a_seed_replays_exactly() {
    let a = sim_run(Design::DrtmH, 7, FaultConfig::lossy(10_000), None);
    let b = sim_run(Design::DrtmH, 7, FaultConfig::lossy(10_000), None);
    assert_eq!(a.run.trace_hash, b.run.trace_hash);
    assert_eq!(a.stats.commits, b.stats.commits);
}

#[test]
fn bad_configurations_are_refused() {
    let mut b = SimCluster::new(SimConfig::new(shape(), 1)).unwrap();
    let mut cfg = TxnConfig::preset(Design::DrtmH);
    cfg.replication = 4;
    assert!(run(&mut b, &bank(), cfg, sim_params(1)).is_err(), "replication beyond the node count");
    let mut b = SimCluster::new(SimConfig::new(shape(), 1)).unwrap();
    let zero = SmallBank { accounts_per_worker: 0 };
    assert!(
        run(&mut b, &zero, TxnConfig::preset(Design::DrtmH), sim_params(1)).is_err(),
        "no accounts"
    );
    let _ = b.shape();
}

/// A network that loses (nearly) every datagram: the leases cannot be renewed, every
/// node stops itself, and nothing is left to decide the transactions in doubt. The run
/// must end with that error, never with a result whose money and replicas cannot be
/// judged (the write-backs of transactions in doubt are in the primaries, but their
/// outcome is in no tally, so the money would be off by them).
#[test]
fn a_network_that_loses_every_datagram_ends_the_run_with_an_error() {
    for (loss_ppm, seed) in [(1_000_000, 1), (950_000, 4)] {
        let shape = ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 };
        let mut c = SimConfig::new(shape, seed);
        c.faults = FaultConfig { loss_ppm, ..FaultConfig::none() };
        // Long enough for leases (5 ms) to lapse and cut-off nodes to stop.
        let params = BenchParams { measure_ns: 20_000_000, ..sim_params(seed) };
        let cfg = TxnConfig { replication: 3, ..TxnConfig::preset(Design::DrtmH) };
        let bank = SmallBank { accounts_per_worker: 1_000 };
        match run(&mut SimCluster::new(c).unwrap(), &bank, cfg, params) {
            // With every datagram lost nobody hears anyone; with a few getting through,
            // a manager may still start removing the others before it stops too.
            Err(BenchError::Recovery(why)) => assert!(
                loss_ppm < 1_000_000 || why.starts_with("no node is left"),
                "{loss_ppm} ppm: {why}"
            ),
            Err(e) => panic!("{loss_ppm} ppm: {e}"),
            Ok(r) => panic!("{loss_ppm} ppm: a result: {:?}", r.invariant.details),
        }
    }
}
