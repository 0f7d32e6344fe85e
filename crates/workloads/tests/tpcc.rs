//! TPC-C end to end on a scaled-down database: every design keeps the consistency
//! conditions, the committed effects, the replicas and serializability, on the
//! simulator (lossy too) and on threads; a planted fault breaks them.

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::faults::FaultConfig;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_rt::RtConfig;
use hytra_txn::{Design, PlantedFault, TxnConfig};
use hytra_workloads::bench::{run, BenchParams, BenchResult, Workload};
use hytra_workloads::tpcc::{TpcC, TpccMix, TpccParams, TpccReport};

fn shape() -> ClusterShape {
    ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 }
}

/// Small enough to load in a blink, with the specification's structure.
fn tpcc(mix: TpccMix) -> TpcC {
    TpcC::new(small(mix))
}

fn small(mix: TpccMix) -> TpccParams {
    TpccParams {
        mix,
        remote_item_pct: 10,
        customers: 60,
        items: 500,
        new_orders_max: 3000,
        ..TpccParams::standard(5)
    }
}

fn params(seed: u64, measure_ns: u64) -> BenchParams {
    BenchParams {
        coroutines: 4,
        warmup_ns: 20_000,
        measure_ns,
        seed,
        check: true,
        rt: RtConfig { rpc_timeout_ns: 500_000, ..RtConfig::default() },
        drain_ns: 300_000_000,
        warm_cache: true,
        timeline_ns: 0,
    }
}

fn sim_run(
    workload: &TpcC,
    cfg: TxnConfig,
    seed: u64,
    faults: FaultConfig,
    measure_ns: u64,
) -> BenchResult<TpccReport> {
    let mut sc = SimConfig::new(shape(), seed);
    sc.faults = faults;
    let mut b = SimCluster::new(sc).unwrap();
    run(&mut b, workload, cfg, params(seed, measure_ns)).unwrap()
}

fn assert_correct(r: &BenchResult<TpccReport>, what: &str) {
    let c = r.checker.as_ref().expect("checked");
    assert!(
        c.serializable(),
        "{what}: not serializable: {:?}",
        &c.violations[..c.violations.len().min(3)]
    );
    assert!(r.invariant.ok, "{what}: {:#?}", r.invariant.details);
    assert!(r.stats.commits > 30, "{what}: only {} commits", r.stats.commits);
}

#[test]
fn every_design_keeps_tpcc_consistent_on_the_simulator() {
    let w = tpcc(TpccMix::Standard);
    for d in Design::ALL {
        let r = sim_run(&w, TxnConfig::preset(d), 1, FaultConfig::none(), 1_000_000);
        assert_correct(&r, d.name());
        // Every transaction type ran.
        for (i, name) in w.txn_types().iter().enumerate() {
            assert!(r.stats.per_type[i].0 > 0, "{}: no {name} committed", d.name());
        }
        println!("{}: {} commits, {:?}", d.name(), r.stats.commits, r.invariant.details);
    }
}

#[test]
fn new_order_only_is_distributed_and_consistent() {
    let w = tpcc(TpccMix::NewOrderOnly);
    for d in [Design::DrtmH, Design::Fasst] {
        let r = sim_run(&w, TxnConfig::preset(d), 2, FaultConfig::none(), 300_000);
        assert_correct(&r, d.name());
        assert_eq!(r.stats.per_type[1..5].iter().map(|t| t.0).sum::<u64>(), 0, "New-Order only");
        assert!(r.rt.rpc.calls > 0 || r.rt.ops.completions > 0, "remote work happened");
    }
}

#[test]
fn tpcc_survives_a_lossy_network() {
    let w = tpcc(TpccMix::Standard);
    for d in Design::ALL {
        let r = sim_run(&w, TxnConfig::preset(d), 3, FaultConfig::lossy(10_000), 3_000_000);
        assert_correct(&r, &format!("{} lossy", d.name()));
    }
}

#[test]
fn tpcc_runs_on_threads() {
    let w = tpcc(TpccMix::Standard);
    for d in [Design::DrtmH, Design::Fasst] {
        let mut b = LocalCluster::new(LocalConfig::new(shape())).unwrap();
        let p = BenchParams {
            warmup_ns: 5_000_000,
            measure_ns: 100_000_000,
            rt: RtConfig { rpc_timeout_ns: 1_000_000_000, ..RtConfig::default() },
            drain_ns: 30_000_000_000,
            ..params(4, 0)
        };
        let r = run(&mut b, &w, TxnConfig::preset(d), p).unwrap();
        assert_correct(&r, &format!("{} on threads", d.name()));
    }
}

#[test]
fn a_planted_lost_update_breaks_the_consistency_conditions() {
    // Without the version bump, two transactions can both update a district or
    // warehouse from the same version: updates are lost and the checks must see it.
    let w = tpcc(TpccMix::Standard);
    let mut cfg = TxnConfig::preset(Design::DrtmH);
    cfg.planted = Some(PlantedFault::SkipVersionBump);
    let r = sim_run(&w, cfg, 1, FaultConfig::none(), 400_000);
    let serializable = r.checker.as_ref().is_some_and(|c| c.serializable());
    assert!(!r.invariant.ok || !serializable, "the planted fault went unnoticed");
    assert!(!r.invariant.ok, "the TPC-C checks themselves must fail: {:#?}", r.invariant.details);
}

#[test]
fn every_transaction_type_commits_alone() {
    for ty in 0..5u8 {
        let w = tpcc(TpccMix::Only(ty));
        let r = sim_run(&w, TxnConfig::preset(Design::DrtmH), 6, FaultConfig::none(), 300_000);
        let c = r.checker.as_ref().expect("checked");
        assert!(c.serializable(), "type {ty} alone: not serializable");
        assert!(r.invariant.ok, "type {ty} alone: {:#?}", r.invariant.details);
        // A warehouse's Deliveries all want its ten districts: they run one at a time.
        assert!(r.stats.per_type[usize::from(ty)].0 >= 10, "type {ty}: {:?}", r.stats.per_type);
        let others: u64 =
            (0..5).filter(|&t| t != usize::from(ty)).map(|t| r.stats.per_type[t].0).sum();
        assert_eq!(others, 0, "only type {ty} ran");
    }
}

#[test]
fn bad_parameters_are_refused() {
    let s = shape();
    let cases = [
        TpccParams { warehouses_per_worker: 0, ..small(TpccMix::Standard) },
        TpccParams { remote_item_pct: 101, ..small(TpccMix::Standard) },
        TpccParams { customers: 0, ..small(TpccMix::Standard) },
        TpccParams { items: 0, ..small(TpccMix::Standard) },
    ];
    for p in cases {
        assert!(TpcC::new(p).validate(s).is_err(), "{p:?} accepted");
    }
    let one_node = ClusterShape { nodes: 1, ..s };
    assert!(tpcc(TpccMix::NewOrderOnly).validate(one_node).is_err());
}
