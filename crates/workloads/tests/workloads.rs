//! YCSB, TATP and TPC-E Customer-Position end to end: every design keeps each workload's
//! oracle and serializability on the simulator (lossy too) and on threads.

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::faults::FaultConfig;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_rt::RtConfig;
use hytra_txn::{Design, PlantedFault, TxnConfig};
use std::rc::Rc;

use hytra_fabric::Endpoint;
use hytra_rt::Worker;
use hytra_store::StoreError;
use hytra_txn::WorkerTxn;
use hytra_workloads::bench::{
    run, run_partial_in, BenchParams, BenchResult, ClientPlan, InvariantReport, Processes, Stage,
    Workload,
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

/// What a run did, in order: the stages it told and the workload calls it made.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Stage(Stage),
    Load,
    Spawn,
    Check,
}

/// `W`, noting the calls that mark a run's stages.
struct Noted<'a, W> {
    inner: W,
    seen: &'a std::sync::Mutex<Vec<Seen>>,
}

impl<W> Noted<'_, W> {
    fn note(&self, s: Seen) {
        let mut seen = self.seen.lock().unwrap();
        // Every worker spawns: one note for them all (and only for them).
        if s != Seen::Spawn || seen.last() != Some(&s) {
            seen.push(s);
        }
    }
}

impl<W: Workload> Workload for Noted<'_, W> {
    type State = W::State;
    type Report = W::Report;
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn txn_types(&self) -> &'static [&'static str] {
        self.inner.txn_types()
    }
    fn validate(&self, shape: ClusterShape) -> Result<(), String> {
        self.inner.validate(shape)
    }
    fn tables(&self, shape: ClusterShape) -> Vec<hytra_store::TableSpec> {
        self.inner.tables(shape)
    }
    fn load(&self, e: &hytra_txn::Engine, shape: ClusterShape) -> Result<(), StoreError> {
        self.note(Seen::Load);
        self.inner.load(e, shape)
    }
    fn spawn<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        wt: &Rc<WorkerTxn>,
        plan: ClientPlan,
    ) -> W::State {
        self.note(Seen::Spawn);
        self.inner.spawn(w, wt, plan)
    }
    fn report(&self, state: W::State) -> W::Report {
        self.inner.report(state)
    }
    fn check(&self, e: &hytra_txn::Engine, reports: &[W::Report]) -> InvariantReport {
        self.note(Seen::Check);
        self.inner.check(e, reports)
    }
}

#[test]
fn a_run_tells_its_stages_in_order() {
    use Seen::{Check, Load, Spawn};
    let cases = [
        (Design::DrtmH, true, true),
        (Design::DrtmH, false, true),
        // No location cache to warm.
        (Design::Fasst, true, true),
        (Design::DrtmH, true, false),
    ];
    for (design, warm_cache, check) in cases {
        let seen = std::sync::Mutex::new(Vec::new());
        let w = Noted { inner: ycsb(Mix::A), seen: &seen };
        let mut b = SimCluster::new(SimConfig::new(shape(), 1)).unwrap();
        let p = BenchParams { warm_cache, check, ..params(1, 100_000) };
        let cfg = TxnConfig::preset(design);
        let r = run_partial_in(&mut b, &w, cfg, p, Processes::default(), &|s| {
            w.note(Seen::Stage(s));
        });
        let r = r.unwrap().unwrap();
        assert_eq!(r.checker.is_some(), check);
        assert!(r.invariant.ok, "{:?}", r.invariant.details);
        let mut want = vec![Seen::Stage(Stage::Loading), Load];
        if warm_cache && design != Design::Fasst {
            want.push(Seen::Stage(Stage::Warming));
        }
        want.extend([Seen::Stage(Stage::Running), Spawn]);
        want.extend([Seen::Stage(Stage::Checking { history: check }), Check]);
        let case = format!("{design:?}, warm_cache {warm_cache}, check {check}");
        assert_eq!(seen.into_inner().unwrap(), want, "{case}");
    }
}
