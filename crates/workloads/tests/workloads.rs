//! YCSB, TATP and TPC-E Customer-Position end to end: every design keeps each workload's
//! oracle and serializability on the simulator (lossy too) and on threads.

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::faults::FaultConfig;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_rt::RtConfig;
use hytra_txn::{Design, PlantedFault, TxnConfig};
use hytra_workloads::bench::{
    run, run_partial_in, BenchParams, BenchResult, Processes, Stage, Workload,
};
use hytra_workloads::tatp::{Tatp, TatpParams};
use hytra_workloads::tpce::{Tpce, TpceParams};
use hytra_workloads::ycsb::{KeyDist, Mix, Ycsb, YcsbParams};

fn shape() -> ClusterShape {
    ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 }
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

fn sim<W: Workload>(
    w: &W,
    cfg: TxnConfig,
    seed: u64,
    faults: FaultConfig,
    ns: u64,
) -> BenchResult<W::Report> {
    let mut sc = SimConfig::new(shape(), seed);
    sc.faults = faults;
    let mut b = SimCluster::new(sc).unwrap();
    run(&mut b, w, cfg, params(seed, ns)).unwrap()
}

fn threads<W: Workload>(w: &W, d: Design) -> BenchResult<W::Report> {
    let mut b = LocalCluster::new(LocalConfig::new(shape())).unwrap();
    let p = BenchParams {
        warmup_ns: 5_000_000,
        measure_ns: 100_000_000,
        rt: RtConfig { rpc_timeout_ns: 1_000_000_000, ..RtConfig::default() },
        drain_ns: 30_000_000_000,
        ..params(4, 0)
    };
    run(&mut b, w, TxnConfig::preset(d), p).unwrap()
}

fn assert_correct<R>(r: &BenchResult<R>, what: &str, types: &[&str], min_commits: u64) {
    let c = r.checker.as_ref().expect("checked");
    assert!(
        c.serializable(),
        "{what}: not serializable: {:?}",
        &c.violations[..c.violations.len().min(3)]
    );
    assert!(r.invariant.ok, "{what}: {:#?}", r.invariant.details);
    assert!(
        r.stats.commits >= min_commits,
        "{what}: {} commits ({:?})",
        r.stats.commits,
        r.stats.aborts
    );
    let committed: Vec<_> = types.iter().zip(&r.stats.per_type).filter(|(_, t)| t.0 > 0).collect();
    assert!(!committed.is_empty(), "{what}: nothing committed");
}

fn ycsb(mix: Mix) -> Ycsb {
    Ycsb::new(YcsbParams {
        records_per_worker: 200,
        ops_per_txn: 3,
        scan_max: 10,
        inserts_max_per_worker: 5000,
        ..YcsbParams::core(mix)
    })
}

#[test]
fn ycsb_every_mix_and_design_on_the_simulator() {
    for mix in [Mix::A, Mix::B, Mix::C, Mix::D, Mix::E, Mix::F] {
        for d in Design::ALL {
            let w = ycsb(mix);
            let r = sim(&w, TxnConfig::preset(d), 1, FaultConfig::none(), 200_000);
            assert_correct(&r, &format!("ycsb {mix:?} {}", d.name()), w.txn_types(), 50);
        }
    }
}

#[test]
fn ycsb_uniform_and_lossy() {
    let w = Ycsb::new(YcsbParams { dist: KeyDist::Uniform, ..ycsb(Mix::F).params });
    for d in Design::ALL {
        let r = sim(&w, TxnConfig::preset(d), 3, FaultConfig::lossy(10_000), 3_000_000);
        assert_correct(&r, &format!("ycsb F uniform lossy {}", d.name()), w.txn_types(), 50);
    }
}

#[test]
fn ycsb_catches_a_planted_lost_update() {
    let w = ycsb(Mix::F);
    let mut cfg = TxnConfig::preset(Design::DrtmH);
    cfg.planted = Some(PlantedFault::SkipVersionBump);
    let r = sim(&w, cfg, 1, FaultConfig::none(), 300_000);
    assert!(!r.invariant.ok, "lost updates went unnoticed: {:#?}", r.invariant.details);
}

#[test]
fn tatp_every_design_on_the_simulator_and_lossy() {
    let w = Tatp::new(TatpParams { subscribers_per_worker: 300, ..TatpParams::standard(2) });
    for d in Design::ALL {
        let r = sim(&w, TxnConfig::preset(d), 1, FaultConfig::none(), 200_000);
        assert_correct(&r, &format!("tatp {}", d.name()), w.txn_types(), 100);
        let r = sim(&w, TxnConfig::preset(d), 5, FaultConfig::lossy(10_000), 2_000_000);
        assert_correct(&r, &format!("tatp lossy {}", d.name()), w.txn_types(), 100);
    }
}

#[test]
fn tpce_customer_position_every_design_on_the_simulator_and_lossy() {
    let w = Tpce::new(TpceParams { customers_per_worker: 100, ..TpceParams::standard(3) });
    for d in Design::ALL {
        let r = sim(&w, TxnConfig::preset(d), 1, FaultConfig::none(), 300_000);
        assert_correct(&r, &format!("tpce {}", d.name()), w.txn_types(), 50);
        assert!(r.stats.per_type[0].0 > 0 && r.stats.per_type[1].0 > 0, "both types committed");
        let r = sim(&w, TxnConfig::preset(d), 6, FaultConfig::lossy(10_000), 2_000_000);
        assert_correct(&r, &format!("tpce lossy {}", d.name()), w.txn_types(), 50);
    }
}

#[test]
fn every_workload_runs_on_threads() {
    let y = ycsb(Mix::A);
    assert_correct(&threads(&y, Design::DrtmH), "ycsb on threads", y.txn_types(), 50);
    let t = Tatp::new(TatpParams { subscribers_per_worker: 300, ..TatpParams::standard(2) });
    assert_correct(&threads(&t, Design::Fasst), "tatp on threads", t.txn_types(), 50);
    let e = Tpce::new(TpceParams { customers_per_worker: 100, ..TpceParams::standard(3) });
    assert_correct(&threads(&e, Design::DrtmR), "tpce on threads", e.txn_types(), 50);
}

#[test]
fn bad_parameters_are_refused() {
    let s = shape();
    let bad_ycsb = [
        YcsbParams { records_per_worker: 0, ..YcsbParams::core(Mix::A) },
        YcsbParams { field_bytes: 12, ..YcsbParams::core(Mix::A) },
        YcsbParams { fields: 20, ..YcsbParams::core(Mix::A) },
        YcsbParams { dist: KeyDist::Zipfian(1.5), ..YcsbParams::core(Mix::A) },
    ];
    for p in bad_ycsb {
        assert!(Ycsb::new(p).validate(s).is_err(), "{p:?} accepted");
    }
    assert!(Tatp::new(TatpParams { subscribers_per_worker: 0, ..TatpParams::standard(1) })
        .validate(s)
        .is_err());
    assert!(Tpce::new(TpceParams { market_feed_pct: 101, ..TpceParams::standard(1) })
        .validate(s)
        .is_err());
}

#[test]
fn a_run_tells_its_stages_in_order() {
    let w = ycsb(Mix::A);
    for warm_cache in [true, false] {
        let seen = std::cell::RefCell::new(Vec::new());
        let mut b = SimCluster::new(SimConfig::new(shape(), 1)).unwrap();
        let p = BenchParams { warm_cache, ..params(1, 100_000) };
        let cfg = TxnConfig::preset(Design::DrtmH);
        let r = run_partial_in(&mut b, &w, cfg, p, Processes::default(), &|s| {
            seen.borrow_mut().push(s);
        });
        assert_correct(&r.unwrap().unwrap(), "ycsb", w.txn_types(), 1);
        let mut want = vec![Stage::Loading, Stage::Warming, Stage::Running, Stage::Checking];
        if !warm_cache {
            want.retain(|&s| s != Stage::Warming);
        }
        assert_eq!(seen.into_inner(), want, "warm_cache {warm_cache}");
    }
}
