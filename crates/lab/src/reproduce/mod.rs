//! `hytra reproduce`: the experiment matrix behind DrTM+H's figures 5-21 and RedN's
//! offloaded gets (`redn.rs`), run on the simulator, written as `index.html` (SVG charts, tables, and what the paper reports
//! next to what we measure) and `results.json` (every run's configuration and figures).
//!
//! Every point is an independent simulated cluster; points run in parallel on the
//! machine's cores. Every transactional run also checks its workload's invariants; a
//! run that breaks one fails the command after the report is written.

mod design_map;
mod recovery;
mod redn;
mod svg;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_rt::RtConfig;
use hytra_txn::{AbortReason, Design, ExecStrategy, LockStrategy, Primitive as Prim, TxnConfig};
use hytra_workloads::bench::{run, BenchParams, BenchResult, RecoveryTimes};
use hytra_workloads::micro::{run_point_settled, MicroParams, Primitive};
use hytra_workloads::smallbank::SmallBank;
use hytra_workloads::tpcc::{TpcC, TpccMix, TpccParams};
use hytra_workloads::tpce::{Tpce, TpceParams};
use serde_json::json;

use crate::run::{memory_needed, CacheMemory, Failures};
use crate::table::Table;
use crate::CpuProfile;

/// What `hytra reproduce` runs: the whole matrix or a part of it, at one scale.
#[derive(Debug, Clone)]
pub struct ReproduceSpec {
    /// A smaller matrix (4 nodes x 4 workers, small databases, three coroutine counts):
    /// a few minutes on two cores.
    pub quick: bool,
    /// Directory for index.html and results.json (created if needed).
    pub out: PathBuf,
    /// Only these figures (e.g. fig7,fig12; RedN's: redn-get, redn-list, redn-isolation).
    pub only: Option<Vec<String>>,
    /// Simulated clusters run at once [default: one per core].
    pub jobs: Option<usize>,
    /// Nodes of the transactional experiments [default: 8, 4 with `quick`].
    pub nodes: Option<u16>,
    /// Workers per node of the transactional experiments [default: 8, 4 with `quick`].
    pub workers: Option<u16>,
    /// Seed of every run.
    pub seed: u64,
    /// CPU profile of the transactional runs (a name or a file `hytra calibrate` wrote)
    /// [default: [`CPU_PROFILE_DEFAULT`](crate::CPU_PROFILE_DEFAULT)].
    pub cpu_profile: Option<String>,
}

/// Why `hytra reproduce` did not give its report: bad input, found before any run.
#[derive(Debug, thiserror::Error)]
pub enum ReproduceError {
    /// The transactional experiments replicate three ways.
    #[error(
        "{nodes} nodes x {workers} workers: the transactional runs need at least 3 nodes (3-way replication) and 1 worker"
    )]
    TooSmall {
        /// Nodes asked for.
        nodes: u16,
        /// Workers per node asked for.
        workers: u16,
    },
    /// A cluster the fabric cannot hold.
    #[error(transparent)]
    Shape(hytra_fabric::BackendError),
    /// Simulated clusters at once, out of range.
    #[error("{jobs} simulated clusters at once: expected 1..={max}")]
    Jobs {
        /// Asked for.
        jobs: usize,
        /// The most allowed.
        max: usize,
    },
    /// A figure asked for that the matrix does not have.
    #[error("no figure '{name}' (expected one of {})", known.join(", "))]
    UnknownFigure {
        /// Asked for.
        name: String,
        /// The figures there are.
        known: Vec<String>,
    },
    /// The CPU profile could not be loaded.
    #[error(transparent)]
    CpuProfile(#[from] crate::cpu_profile::ProfileError),
    /// The output directory could not be created.
    #[error("cannot create '{}': {source}", path.display())]
    Output {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What a matrix gave, its report written.
#[derive(Debug, Clone)]
pub struct Reproduced {
    /// The claims, each with the paper's value, hytra's and the verdict, as a table.
    pub claims: String,
    /// Wall time of the whole matrix, in seconds.
    pub wall_s: f64,
    /// The runs that failed, each described with its error (the report shows them too).
    pub failures: Vec<String>,
    /// Why the report could not be written, if it could not (the claims stand).
    pub report_error: Option<String>,
}

/// Why one run of the matrix failed: recorded with its result, not fatal to the others.
#[derive(Debug)]
struct JobError(String);

impl JobError {
    fn from_text(why: impl Into<String>) -> JobError {
        JobError(why.into())
    }
}

impl<E: std::error::Error> From<E> for JobError {
    fn from(e: E) -> JobError {
        JobError(e.to_string())
    }
}

/// A transactional workload of the matrix.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Wl {
    /// DrTM+H's TPC-C/no.
    TpccNo,
    /// SmallBank.
    SmallBank,
    /// TPC-E Customer-Position (with price moves).
    TpceCp,
}

impl Wl {
    fn name(self) -> &'static str {
        match self {
            Wl::TpccNo => "TPC-C/no",
            Wl::SmallBank => "SmallBank",
            Wl::TpceCp => "TPC-E CP",
        }
    }
}

#[derive(Clone, Debug)]
struct BenchJob {
    wl: Wl,
    profile: &'static str,
    shape: ClusterShape,
    coroutines: u16,
    cfg: TxnConfig,
    label: String,
    /// Multiplier of the CPU profile's costs (1: the profile as it is).
    cpu_scale: f64,
}

#[derive(Clone, Debug)]
struct MicroJob {
    profile: &'static str,
    shape: ClusterShape,
    primitive: Primitive,
    payload: u32,
    params: MicroParams,
    /// Operations per transaction (1: raw primitive rates).
    objects: u16,
    label: String,
}

#[derive(Clone, Debug)]
enum Job {
    Bench(BenchJob),
    Micro(MicroJob),
    Offload(redn::OffloadJob),
    Failure(recovery::FailureJob),
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
struct Res {
    /// Transactions (or operations) per second, whole cluster; per machine for micro.
    rate: f64,
    /// Transactions committed in the window (transactional runs).
    commits: u64,
    p50_us: f64,
    p99_us: f64,
    /// Mean latency, where a run reports it (offloaded gets).
    mean_us: f64,
    abort_rate: f64,
    phases_us: [f64; 4],
    invariant_ok: bool,
    error: Option<String>,
    wall_s: f64,
    /// A run with a crash: (ms from the crash, survivors' M txn/s) per interval.
    timeline: Vec<(f64, f64)>,
    /// A run with a crash: how long recovery took.
    recovery: Option<RecoveryTimes>,
}

/// Sizes of one matrix.
struct Scale {
    nodes: u16,
    workers: u16,
    coroutines: Vec<u16>,
    accounts: u64,
    customers: u64,
    items: u64,
    tpce_customers: u64,
    warmup_ns: u64,
    measure_ns: u64,
    payloads: Vec<u32>,
    micro_primitives: Vec<Primitive>,
    /// Virtual time of each offloaded-get scenario.
    offload_ns: u64,
    /// Value sizes of the offloaded-get latency figure.
    offload_sizes: Vec<u32>,
    /// Background writer counts of the isolation figure.
    offload_writers: Vec<u16>,
    /// What hytra's own code costs in the transactional runs.
    cpu: CpuProfile,
}

impl Scale {
    fn new(a: &ReproduceSpec) -> Result<Scale, ReproduceError> {
        let (nodes, workers) = if a.quick { (4, 4) } else { (8, 8) };
        let cpu = a.cpu_profile.as_deref().unwrap_or(crate::CPU_PROFILE_DEFAULT);
        let cpu = CpuProfile::load(cpu)?;
        Ok(Scale {
            cpu,
            nodes: a.nodes.unwrap_or(nodes),
            workers: a.workers.unwrap_or(workers),
            coroutines: if a.quick { vec![1, 4, 16] } else { vec![1, 2, 4, 8, 16] },
            accounts: if a.quick { 5_000 } else { 20_000 },
            // TPC-C/no's New-Order reads one customer row and never the initial orders,
            // order lines and history rows, which all scale with the customers: a few
            // leave its numbers alone (within seed noise at 8 x 8), where 1 000 made each
            // run of the full matrix gigabytes larger (and 300 made loading most of a
            // quick run's time).
            customers: 30,
            items: if a.quick { 10_000 } else { 20_000 },
            tpce_customers: if a.quick { 300 } else { 1_000 },
            warmup_ns: if a.quick { 100_000 } else { 200_000 },
            measure_ns: if a.quick { 500_000 } else { 2_000_000 },
            payloads: if a.quick {
                vec![8, 64, 512, 4096]
            } else {
                vec![8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
            },
            micro_primitives: if a.quick {
                vec![Primitive::Read, Primitive::Write, Primitive::Cas, Primitive::Rpc]
            } else {
                Primitive::FIG5.to_vec()
            },
            offload_ns: if a.quick { 300_000 } else { 1_000_000 },
            offload_sizes: if a.quick { vec![64, 4096] } else { vec![64, 1024, 16384, 65536] },
            offload_writers: if a.quick { vec![0, 4, 16] } else { vec![0, 1, 2, 4, 8, 16] },
        })
    }

    fn max_co(&self) -> u16 {
        *self.coroutines.last().expect("coroutine counts")
    }
}

/// How a chart reads its values.
#[derive(Copy, Clone, Debug)]
enum Metric {
    /// Millions per second.
    Mrate,
    P50,
    P99,
    Mean,
}

impl Metric {
    fn of(self, r: &Res) -> f64 {
        match self {
            Metric::Mrate => r.rate / 1e6,
            Metric::P50 => r.p50_us,
            Metric::P99 => r.p99_us,
            Metric::Mean => r.mean_us,
        }
    }
}

/// A chart of a figure, referring to jobs by index.
enum Chart {
    /// Throughput (x) against median latency (y), one curve per series (the paper's
    /// style: a point per coroutine count).
    Curves { title: String, series: Vec<(String, Vec<usize>)> },
    /// Given x values against a metric.
    Xy {
        title: String,
        x_label: String,
        y_label: String,
        /// Log for payload and value sizes.
        x_axis: svg::XAxis,
        metric: Metric,
        series: Vec<(String, Vec<(f64, usize)>)>,
        /// The paper's own values on these axes: (label, x, y).
        paper: Vec<(String, f64, f64)>,
    },
    /// Grouped bars of a metric.
    Bars {
        title: String,
        y_label: String,
        metric: Metric,
        groups: Vec<String>,
        series: Vec<(String, Vec<usize>)>,
    },
    /// Per-phase latency stacked, one bar per job.
    Phases { title: String, groups: Vec<String>, jobs: Vec<usize> },
    /// Each job's timeline ([`Res::timeline`]), one curve per job.
    Timeline { title: String, x_label: String, y_label: String, series: Vec<(String, usize)> },
    /// Which of several contenders wins in each cell of a grid (rows by columns); each
    /// cell holds one job per contender. `mark` outlines one cell.
    Winners {
        title: String,
        rows: Vec<String>,
        cols: Vec<String>,
        contenders: Vec<String>,
        cells: Vec<Vec<Vec<usize>>>,
        mark: Option<(usize, usize)>,
        /// Committed transactions the slowest contender of a cell must reach in its
        /// window for the cell to name a winner.
        commits_min: f64,
    },
}

/// Computes one number from every run's results.
type Measure = Box<dyn Fn(&[Res]) -> f64 + Send>;

/// A statement of the paper checked against our runs: `ours` computes our value of the
/// quantity the paper gives as `paper`.
struct Claim {
    figure: &'static str,
    what: String,
    paper: f64,
    ours: Measure,
    /// How `ours` is judged against `paper`.
    compare: Compare,
    /// Why ours differs, where that is known (shown unless the claim agrees).
    cause: Option<&'static str>,
}

/// Why DrTM+H does not lead on TPC-C/no here (docs/PERFORMANCE.md §26).
const CAUSE_TPCC_LOCKS: &str = "the lock phase: these NICs' atomics are not coherent with the CPU's, so a one-sided lock takes even the coordinator's own records by loopback CAS, and TPC-C/no's writes are nearly all local; DrTM+H with RPC locks is within 4% of FaRM (PERFORMANCE §26)";

/// How a claim's measured value is judged against the paper's.
#[derive(Copy, Clone, PartialEq, Debug)]
enum Compare {
    /// A ratio whose paper value only says "above 1" (1.05 stands for it): judged by
    /// direction.
    Direction,
    /// A ratio the paper gives as a number: judged by direction and by size (the effect,
    /// its distance from 1 in log terms, within a factor of two of the paper's).
    Magnitude,
    /// A ratio the paper says is within this fraction of 1 (RedN: "within 5%").
    Within(f64),
    /// A time the paper gives as a bound: ours must not exceed it.
    AtMost,
    /// A figure shown next to the paper's (a calibration input, not a finding).
    Shown,
}

/// What a claim's comparison found.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Verdict {
    /// Direction and size (or bound, or tolerance) as the paper's.
    Agrees,
    /// The paper's direction, but less than half of its effect.
    Weaker,
    /// The paper's direction, but more than twice its effect.
    Stronger,
    /// Within 2% of 1, where the paper found a difference.
    NoClearDifference,
    /// The other direction, past the bound, or outside the tolerance.
    Differs,
    /// Shown, not judged (or nothing measured).
    NotJudged,
}

impl Verdict {
    fn name(self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::Weaker => "same direction, weaker",
            Verdict::Stronger => "same direction, stronger",
            Verdict::NoClearDifference => "no clear difference",
            Verdict::Differs => "differs",
            Verdict::NotJudged => "-",
        }
    }

    /// The class of its cell in the report.
    fn class(self) -> &'static str {
        match self {
            Verdict::Agrees => "same",
            Verdict::Weaker | Verdict::Stronger => "partly",
            Verdict::NoClearDifference | Verdict::Differs => "differs",
            Verdict::NotJudged => "",
        }
    }
}

struct Figure {
    id: &'static str,
    title: String,
    paper: String,
    charts: Vec<Chart>,
}

/// The matrix: jobs, the figures that chart them, the claims that compare them.
#[derive(Default)]
struct Plan {
    jobs: Vec<Job>,
    figures: Vec<Figure>,
    claims: Vec<Claim>,
}

impl Plan {
    fn push(&mut self, j: Job) -> usize {
        self.jobs.push(j);
        self.jobs.len() - 1
    }

    fn bench(&mut self, s: &Scale, wl: Wl, cfg: TxnConfig, co: u16, label: &str) -> usize {
        let shape = ClusterShape { nodes: s.nodes, workers_per_node: s.workers, lanes_per_peer: 1 };
        self.push(Job::Bench(BenchJob {
            wl,
            profile: "cx4",
            shape,
            coroutines: co,
            cfg,
            label: label.into(),
            cpu_scale: 1.0,
        }))
    }

    /// One job per coroutine count.
    fn sweep(&mut self, s: &Scale, wl: Wl, cfg: TxnConfig, label: &str) -> Vec<usize> {
        s.coroutines.clone().into_iter().map(|co| self.bench(s, wl, cfg, co, label)).collect()
    }
}

fn drtmh() -> TxnConfig {
    TxnConfig::preset(Design::DrtmH)
}

/// Peak rate of a series.
fn peak(r: &[Res], jobs: &[usize]) -> f64 {
    jobs.iter().map(|&j| r[j].rate).fold(0.0, f64::max)
}

fn peak_ratio(a: Vec<usize>, b: Vec<usize>) -> Measure {
    Box::new(move |r| quotient(peak(r, &a), peak(r, &b)))
}

/// `a / b` where both were measured (positive and finite), else NaN, which no verdict
/// judges: a failed run's numbers are zeros, and a ratio of them would read as a finding.
fn quotient(a: f64, b: f64) -> f64 {
    let measured = |x: f64| x.is_finite() && x > 0.0;
    if measured(a) && measured(b) {
        a / b
    } else {
        f64::NAN
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
fn phase_figures(plan: &mut Plan, s: &Scale) {
    // Fig. 7: the execution phase.
    let mut charts = Vec::new();
    for wl in [Wl::TpccNo, Wl::SmallBank] {
        let one =
            plan.sweep(s, wl, TxnConfig { exec: ExecStrategy::OneSided, ..drtmh() }, "one-sided");
        let cache = plan.sweep(
            s,
            wl,
            TxnConfig { exec: ExecStrategy::OneSidedCached, ..drtmh() },
            "one-sided/cache",
        );
        let two =
            plan.sweep(s, wl, TxnConfig { exec: ExecStrategy::TwoSided, ..drtmh() }, "two-sided");
        let (p_cache, p_two) = if wl == Wl::TpccNo { (1.45, 1.28) } else { (1.36, 2.01) };
        plan.claims.push(Claim {
            figure: "fig7",
            what: format!("{}: one-sided/cache over two-sided, peak throughput", wl.name()),
            paper: p_cache,
            ours: peak_ratio(cache.clone(), two.clone()),
            compare: Compare::Magnitude,
            cause: None,
        });
        plan.claims.push(Claim {
            figure: "fig7",
            what: format!("{}: two-sided over one-sided without cache, peak throughput", wl.name()),
            paper: p_two,
            ours: peak_ratio(two.clone(), one.clone()),
            compare: Compare::Magnitude,
            cause: None,
        });
        charts.push(Chart::Curves {
            title: wl.name().into(),
            series: vec![
                ("one-sided".into(), one),
                ("one-sided/cache".into(), cache),
                ("two-sided".into(), two),
            ],
        });
    }
    plan.figures.push(Figure {
        id: "fig7",
        title: "Fig. 7: execution phase".into(),
        paper: "One-sided with the location cache beats two-sided (TPC-C/no up to 1.45x, SmallBank 1.36x); without the cache, two-sided wins (1.28x, 2.01x).".into(),
        charts,
    });

    // Fig. 8: locking in the validation phase (the commit stays one-sided).
    let mut charts = Vec::new();
    for wl in [Wl::TpccNo, Wl::SmallBank] {
        let one = plan.sweep(s, wl, drtmh(), "one-sided (CAS)");
        let two =
            plan.sweep(s, wl, TxnConfig { lock: LockStrategy::TwoSided, ..drtmh() }, "two-sided");
        plan.claims.push(Claim {
            figure: "fig8",
            what: format!("{}: one-sided locking over two-sided, peak throughput", wl.name()),
            paper: 1.05,
            ours: peak_ratio(one.clone(), two.clone()),
            compare: Compare::Direction,
            cause: None,
        });
        charts.push(Chart::Curves {
            title: wl.name().into(),
            series: vec![("one-sided (CAS)".into(), one), ("two-sided".into(), two)],
        });
    }
    plan.figures.push(Figure {
        id: "fig8",
        title: "Fig. 8: locking (validation phase)".into(),
        paper: "One-sided CAS with a READ behind it is faster on both workloads, though ATOMIC has the lower peak rate (no ratio given: above 1 is the paper's direction).".into(),
        charts,
    });

    // Fig. 9: the commit phase, with two-sided locking and validation as the paper does.
    let mut charts = Vec::new();
    for wl in [Wl::TpccNo, Wl::SmallBank] {
        let base = TxnConfig { lock: LockStrategy::TwoSided, validate: Prim::TwoSided, ..drtmh() };
        let mut series = Vec::new();
        let mut ids = Vec::new();
        for (commit, pa, label) in [
            (Prim::OneSided, false, "one-sided"),
            (Prim::TwoSided, false, "two-sided"),
            (Prim::OneSided, true, "one-sided +PA"),
            (Prim::TwoSided, true, "two-sided +PA"),
        ] {
            let jobs = plan.sweep(s, wl, TxnConfig { commit, passive_ack: pa, ..base }, label);
            ids.push(jobs.clone());
            series.push((label.to_string(), jobs));
        }
        plan.claims.push(Claim {
            figure: "fig9",
            what: format!("{}: without PA, one-sided over two-sided commit", wl.name()),
            paper: 1.05,
            ours: peak_ratio(ids[0].clone(), ids[1].clone()),
            compare: Compare::Direction,
            cause: None,
        });
        plan.claims.push(Claim {
            figure: "fig9",
            what: format!("{}: with PA, two-sided over one-sided commit", wl.name()),
            paper: 1.05,
            ours: peak_ratio(ids[3].clone(), ids[2].clone()),
            compare: Compare::Direction,
            cause: None,
        });
        charts.push(Chart::Curves { title: wl.name().into(), series });
    }
    plan.figures.push(Figure {
        id: "fig9",
        title: "Fig. 9: commit phase".into(),
        paper: "Without passive ACK one-sided WRITEs are faster; with it, two-sided is faster (one doorbell for many records, no replies). No ratio given: above 1 is the paper's direction.".into(),
        charts,
    });

    // Fig. 10: logging.
    let mut charts = Vec::new();
    for wl in [Wl::TpccNo, Wl::SmallBank] {
        let one = plan.sweep(s, wl, drtmh(), "one-sided");
        let two = plan.sweep(s, wl, TxnConfig { log: Prim::TwoSided, ..drtmh() }, "two-sided");
        plan.claims.push(Claim {
            figure: "fig10",
            what: format!("{}: one-sided over two-sided logging, peak throughput", wl.name()),
            paper: if wl == Wl::TpccNo { 1.29 } else { 1.12 },
            ours: peak_ratio(one.clone(), two.clone()),
            compare: Compare::Magnitude,
            cause: None,
        });
        charts.push(Chart::Curves {
            title: wl.name().into(),
            series: vec![("one-sided".into(), one), ("two-sided".into(), two)],
        });
    }
    plan.figures.push(Figure {
        id: "fig10",
        title: "Fig. 10: logging".into(),
        paper: "One-sided logging always wins: up to 1.29x on TPC-C/no (logs of ~1 KB) and 1.12x on SmallBank (~150 B).".into(),
        charts,
    });

    // Fig. 11: read-only transactions (TPC-E Customer-Position).
    let mut series = Vec::new();
    for (label, exec, validate) in [
        ("two-sided", ExecStrategy::TwoSided, Prim::TwoSided),
        ("one-sided", ExecStrategy::OneSided, Prim::OneSided),
        ("one-sided/cache", ExecStrategy::OneSidedCached, Prim::OneSided),
        ("hybrid (DrTM+H)", ExecStrategy::Hybrid, Prim::OneSided),
    ] {
        let jobs = plan.sweep(s, Wl::TpceCp, TxnConfig { exec, validate, ..drtmh() }, label);
        series.push((label.to_string(), jobs));
    }
    plan.claims.push(Claim {
        figure: "fig11",
        what: "TPC-E CP: one-sided/cache read and validation over two-sided, peak throughput"
            .into(),
        paper: 1.05,
        ours: peak_ratio(series[2].1.clone(), series[0].1.clone()),
        compare: Compare::Direction,
        cause: None,
    });
    plan.figures.push(Figure {
        id: "fig11",
        title: "Fig. 11: read-only transactions (TPC-E Customer-Position)".into(),
        paper: "Reads through the location cache and one-sided validation are fastest (no ratio given: above 1 is the paper's direction).".into(),
        charts: vec![Chart::Curves { title: "TPC-E Customer-Position".into(), series }],
    });
}

#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
fn design_figures(plan: &mut Plan, s: &Scale) {
    // Fig. 14: the four designs against coroutines; Fig. 15 reuses its TPC-C/no points.
    let mut charts = Vec::new();
    let mut tpcc_jobs = Vec::new();
    for wl in [Wl::TpccNo, Wl::SmallBank] {
        let mut series = Vec::new();
        for d in [Design::DrtmH, Design::Fasst, Design::Farm, Design::DrtmR] {
            let jobs = plan.sweep(s, wl, TxnConfig::preset(d), d.name());
            if wl == Wl::TpccNo {
                tpcc_jobs.push((d, jobs.clone()));
            }
            series.push((d.name().to_string(), jobs));
        }
        let (h, f, fa, r) =
            (series[0].1.clone(), series[1].1.clone(), series[2].1.clone(), series[3].1.clone());
        if wl == Wl::TpccNo {
            for (other, jobs, paper) in
                [("FaSST", f, 2.96), ("DrTM+R", r, 1.89), ("FaRM", fa, 2.50)]
            {
                plan.claims.push(Claim {
                    figure: "fig14",
                    what: format!("TPC-C/no: DrTM+H over {other}, peak throughput"),
                    paper,
                    ours: peak_ratio(h.clone(), jobs),
                    compare: Compare::Magnitude,
                    cause: Some(CAUSE_TPCC_LOCKS),
                });
            }
        } else {
            plan.claims.push(Claim {
                figure: "fig14",
                what: "SmallBank: DrTM+H over the best other design, peak throughput".into(),
                paper: 1.05,
                ours: Box::new(move |res| {
                    let best = [&f, &fa, &r].iter().map(|j| peak(res, j)).fold(0.0, f64::max);
                    quotient(peak(res, &h), best)
                }),
                compare: Compare::Direction,
                cause: None,
            });
        }
        charts.push(Chart::Curves { title: wl.name().into(), series });
    }
    plan.figures.push(Figure {
        id: "fig14",
        title: "Fig. 14: the four designs".into(),
        paper: "DrTM+H has the best throughput and latency: on TPC-C/no up to 2.96x FaSST, 1.89x DrTM+R and 2.50x FaRM; FaSST and FaRM are close on SmallBank.".into(),
        charts,
    });
    let mut charts = Vec::new();
    for (pick, label) in [(0usize, "1 coroutine"), (s.coroutines.len() - 1, "most coroutines")] {
        let groups: Vec<String> = tpcc_jobs.iter().map(|(d, _)| d.name().to_string()).collect();
        let jobs: Vec<usize> = tpcc_jobs.iter().map(|(_, j)| j[pick]).collect();
        charts.push(Chart::Phases { title: format!("TPC-C/no, {label}"), groups, jobs });
    }
    // §6.4 on Fig. 15: passive ACK gives DrTM+H the shortest commit phase; one-sided
    // WRITEs shorten DrTM+R's and FaRM's logging against FaSST's two-sided logs.
    let at_most = || -> Vec<(Design, usize)> {
        tpcc_jobs.iter().map(|(d, j)| (*d, j[j.len() - 1])).collect()
    };
    let phase = |r: &[Res], j: usize, k: usize| r[j].phases_us[k];
    let commit = at_most();
    plan.claims.push(Claim {
        figure: "fig15",
        what: "TPC-C/no, most coroutines: shortest commit phase of the others over DrTM+H's".into(),
        paper: 1.05,
        ours: Box::new(move |r| {
            let h = commit[0].1;
            let others =
                commit[1..].iter().map(|&(_, j)| phase(r, j, 3)).fold(f64::INFINITY, f64::min);
            quotient(others, phase(r, h, 3))
        }),
        compare: Compare::Direction,
        cause: None,
    });
    // "reduced by about 69% and 75% respectively": FaSST's over theirs, 1/0.31 and 1/0.25.
    for (name, d, paper) in [("DrTM+R", Design::DrtmR, 3.23), ("FaRM", Design::Farm, 4.0)] {
        let jobs = at_most();
        let of = move |want: Design| jobs.iter().find(|(d, _)| *d == want).map(|x| x.1);
        let (fasst, other) = (of(Design::Fasst), of(d));
        plan.claims.push(Claim {
            figure: "fig15",
            what: format!(
                "TPC-C/no, most coroutines: FaSST's logging phase over {name}'s (one-sided logs)"
            ),
            paper,
            ours: Box::new(move |r| match (fasst, other) {
                (Some(f), Some(o)) => quotient(phase(r, f, 2), phase(r, o, 2)),
                _ => f64::NAN,
            }),
            compare: Compare::Magnitude,
            cause: None,
        });
    }
    plan.figures.push(Figure {
        id: "fig15",
        title: "Fig. 15: latency breakdown of TPC-C/no".into(),
        paper: "Per-phase latency of each design with 1 and 16 coroutines (mean per committed transaction).".into(),
        charts,
    });

    // Fig. 13: factor analysis on TPC-C/no, from all two-sided to DrTM+H.
    let two_sided = TxnConfig {
        exec: ExecStrategy::TwoSided,
        lock: LockStrategy::TwoSided,
        validate: Prim::TwoSided,
        log: Prim::TwoSided,
        commit: Prim::TwoSided,
        passive_ack: false,
        ..drtmh()
    };
    let steps = [
        ("two-sided", two_sided),
        ("+1S log", TxnConfig { log: Prim::OneSided, ..two_sided }),
        (
            "+1S lock/val/commit",
            TxnConfig {
                log: Prim::OneSided,
                lock: LockStrategy::OneSided,
                validate: Prim::OneSided,
                commit: Prim::OneSided,
                ..two_sided
            },
        ),
        ("+hybrid exec", TxnConfig { passive_ack: false, ..drtmh() }),
        ("+PA (DrTM+H)", drtmh()),
    ];
    let groups: Vec<String> = steps.iter().map(|s| s.0.to_string()).collect();
    let mut series = Vec::new();
    for co in [1, s.max_co()] {
        let jobs: Vec<usize> =
            steps.iter().map(|(l, c)| plan.bench(s, Wl::TpccNo, *c, co, l)).collect();
        series.push((format!("{co} coroutines"), jobs));
    }
    let (one, most) = (series[0].1.clone(), series[series.len() - 1].1.clone());
    let charts = vec![
        Chart::Bars {
            title: "Throughput".into(),
            y_label: "M txn/s".into(),
            metric: Metric::Mrate,
            groups: groups.clone(),
            series: series.clone(),
        },
        Chart::Bars {
            title: "Median latency".into(),
            y_label: "µs".into(),
            metric: Metric::P50,
            groups: groups.clone(),
            series: series.clone(),
        },
        Chart::Bars {
            title: "99th percentile latency".into(),
            y_label: "µs".into(),
            metric: Metric::P99,
            groups,
            series,
        },
    ];
    // §6.4 on Fig. 13: one-sided helps most when servers are underloaded; with many
    // coroutines the hybrid improves median and tail latency.
    let last = steps.len() - 1;
    plan.claims.push(Claim {
        figure: "fig13",
        what: "TPC-C/no, 1 coroutine: DrTM+H over all two-sided, throughput".into(),
        paper: 1.05,
        ours: Box::new(move |r| quotient(r[one[last]].rate, r[one[0]].rate)),
        compare: Compare::Direction,
        cause: None,
    });
    for (what, metric) in [("median", Metric::P50), ("99th percentile", Metric::P99)] {
        let most = most.clone();
        plan.claims.push(Claim {
            figure: "fig13",
            what: format!("TPC-C/no, most coroutines: all two-sided over DrTM+H, {what} latency"),
            paper: 1.05,
            ours: Box::new(move |r| quotient(metric.of(&r[most[0]]), metric.of(&r[most[last]]))),
            compare: Compare::Direction,
            cause: None,
        });
    }
    plan.figures.push(Figure {
        id: "fig13",
        title: "Fig. 13: factor analysis (TPC-C/no)".into(),
        paper: "One-sided primitives help most when servers are underloaded (1 coroutine); with many coroutines two-sided comes close in throughput, and the hybrid improves median and tail latency.".into(),
        charts,
    });

    // Fig. 12: scaling, and the 80-node connection setting.
    let mut charts = Vec::new();
    // Up to 16 nodes (the paper's cluster), or the matrix's size if smaller.
    let most = if s.coroutines.len() > 3 { 16 } else { s.nodes.max(8) };
    let nodes: Vec<u16> = [2u16, 4, 8, 16].into_iter().filter(|&n| n <= most).collect();
    for wl in [Wl::TpccNo, Wl::SmallBank] {
        let mut series: Vec<(String, Vec<(f64, usize)>)> = Vec::new();
        for (label, design, lanes) in [
            ("DrTM+H", Design::DrtmH, 1u16),
            ("DrTM+H-80", Design::DrtmH, 5),
            ("FaSST", Design::Fasst, 1),
        ] {
            let mut pts = Vec::new();
            for &n in &nodes {
                let cfg = TxnConfig { replication: 3.min(n), ..TxnConfig::preset(design) };
                let shape =
                    ClusterShape { nodes: n, workers_per_node: s.workers, lanes_per_peer: lanes };
                let j = plan.push(Job::Bench(BenchJob {
                    wl,
                    profile: "cx4",
                    shape,
                    coroutines: s.max_co(),
                    cfg,
                    label: label.into(),
                    cpu_scale: 1.0,
                }));
                pts.push((f64::from(n), j));
            }
            series.push((label.into(), pts));
        }
        let at_max = |v: &[(f64, usize)]| v.last().expect("points").1;
        let (h, h80, fasst) = (at_max(&series[0].1), at_max(&series[1].1), at_max(&series[2].1));
        plan.claims.push(Claim {
            figure: "fig12",
            what: format!(
                "{}: the 80-node connection setting over the real one, largest cluster",
                wl.name()
            ),
            paper: if wl == Wl::TpccNo { 0.95 } else { 0.91 },
            ours: Box::new(move |r| quotient(r[h80].rate, r[h].rate)),
            compare: Compare::Magnitude,
            cause: None,
        });
        if wl == Wl::SmallBank {
            plan.claims.push(Claim {
                figure: "fig12",
                what: "SmallBank: DrTM+H over FaSST (pure two-sided), largest cluster".into(),
                paper: 1.3,
                ours: Box::new(move |r| quotient(r[h].rate, r[fasst].rate)),
                compare: Compare::Magnitude,
                cause: None,
            });
        }
        charts.push(Chart::Xy {
            title: wl.name().into(),
            x_label: "nodes".into(),
            y_label: "M txn/s".into(),
            x_axis: svg::XAxis::Linear,
            metric: Metric::Mrate,
            series,
            paper: Vec::new(),
        });
    }
    plan.figures.push(Figure {
        id: "fig12",
        title: "Fig. 12: scaling with machines".into(),
        paper: "DrTM+H scales linearly; the 80-node connection setting costs 5% (TPC-C/no) and 9% (SmallBank), and SmallBank stays 1.3x a pure two-sided design.".into(),
        charts,
    });
}

fn other_nics(plan: &mut Plan, s: &Scale) {
    // Figs. 16-21: other NICs, on the testbeds of Table 5.
    for (fig_micro, fig_designs, profile, nodes) in [
        ("fig16", "fig17", "cx3", 5u16),
        ("fig18", "fig19", "roce", 2),
        ("fig20", "fig21", "cx5", 2),
    ] {
        multi_object(plan, fig_micro, profile, nodes, 256, s);
        let mut charts = Vec::new();
        let designs = [Design::DrtmH, Design::Fasst, Design::Farm, Design::DrtmR];
        let mut bars = Vec::new();
        for wl in [Wl::TpccNo, Wl::SmallBank] {
            let jobs: Vec<usize> = designs
                .iter()
                .map(|&d| {
                    let cfg = TxnConfig { replication: 3.min(nodes), ..TxnConfig::preset(d) };
                    let shape =
                        ClusterShape { nodes, workers_per_node: s.workers, lanes_per_peer: 1 };
                    plan.push(Job::Bench(BenchJob {
                        wl,
                        profile,
                        shape,
                        coroutines: 8,
                        cfg,
                        label: d.name().into(),
                        cpu_scale: 1.0,
                    }))
                })
                .collect();
            bars.push((wl.name().to_string(), jobs));
        }
        let groups: Vec<String> = designs.iter().map(|d| d.name().to_string()).collect();
        design_claims(plan, fig_designs, profile, &bars);
        // One chart per workload, designs as bars.
        for (wl, jobs) in bars {
            charts.push(Chart::Bars {
                title: format!("{wl} on {profile}"),
                y_label: "M txn/s".into(),
                metric: Metric::Mrate,
                groups: groups.clone(),
                series: vec![("throughput".into(), jobs)],
            });
        }
        let paper = match profile {
            "cx3" => "ConnectX-3 (5 nodes): FaSST is best among the earlier designs and DrTM+R slowest (bound by one-sided atomics); DrTM+H still chooses well.",
            "roce" => "RoCE (2 nodes, 2-way replication): results similar to CX4.",
            _ => "ConnectX-5 (2 nodes, 2-way replication): results similar to CX4.",
        };
        plan.figures.push(Figure {
            id: fig_designs,
            title: format!("{}: designs on {profile}", fig_title(fig_designs)),
            paper: paper.into(),
            charts,
        });
    }
}

/// §7's claims about the designs on another NIC (`bars`: per workload, the jobs of DrTM+H,
/// FaSST, FaRM and DrTM+R).
fn design_claims(
    plan: &mut Plan,
    fig_designs: &'static str,
    profile: &'static str,
    bars: &[(String, Vec<usize>)],
) {
    // §7: on CX3 FaSST beats the other earlier designs and DrTM+R is slowest; on RoCE
    // and CX5 the results are CX4's, DrTM+H fastest. (On CX3 the paper's DrTM+H picks
    // two-sided primitives for that NIC; the matrix runs its CX4 preset, so it makes no
    // claim for DrTM+H there.)
    for (wl, jobs) in bars {
        let best_of = |r: &[Res], js: &[usize]| {
            let rates: Vec<f64> = js.iter().map(|&j| r[j].rate).collect();
            if rates.iter().all(|&x| x > 0.0) {
                rates.into_iter().fold(0.0, f64::max)
            } else {
                f64::NAN
            }
        };
        let h = jobs[0];
        let others = jobs[1..].to_vec();
        if profile != "cx3" {
            plan.claims.push(Claim {
                figure: fig_designs,
                what: format!("{wl} on {profile}: DrTM+H over the best other design"),
                paper: 1.05,
                ours: Box::new(move |r| quotient(r[h].rate, best_of(r, &others))),
                compare: Compare::Direction,
                // The same non-coherent atomics as cx4's (the profiles share them).
                cause: (wl == Wl::TpccNo.name()).then_some(CAUSE_TPCC_LOCKS),
            });
        }
        if profile == "cx3" {
            let (f, fa, dr) = (jobs[1], jobs[2], jobs[3]);
            plan.claims.push(Claim {
                figure: fig_designs,
                what: format!("{wl} on cx3: FaSST over the better of FaRM and DrTM+R"),
                paper: 1.05,
                ours: Box::new(move |r| {
                    // Both measured, or no verdict (`quotient`).
                    let (a, b) = (r[fa].rate, r[dr].rate);
                    let better = if a > 0.0 && b > 0.0 { a.max(b) } else { f64::NAN };
                    quotient(r[f].rate, better)
                }),
                compare: Compare::Direction,
                cause: None,
            });
            let rest = jobs[..3].to_vec();
            plan.claims.push(Claim {
                figure: fig_designs,
                what: format!("{wl} on cx3: the slowest of the others over DrTM+R"),
                paper: 1.05,
                ours: Box::new(move |r| {
                    let slowest = rest.iter().map(|&j| r[j].rate).fold(f64::INFINITY, f64::min);
                    quotient(slowest, r[dr].rate)
                }),
                compare: Compare::Direction,
                cause: None,
            });
        }
    }
}

fn fig_title(id: &str) -> String {
    format!("Fig. {}", id.trim_start_matches("fig"))
}

/// The multi-object ladder (Fig. 6 and its other-NIC versions).
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
fn multi_object(
    plan: &mut Plan,
    id: &'static str,
    profile: &'static str,
    nodes: u16,
    payload: u32,
    s: &Scale,
) {
    let objects = 10u16;
    let shape =
        ClusterShape { nodes, workers_per_node: if nodes > 4 { 24 } else { 8 }, lanes_per_peer: 1 };
    let steps = ["baseline", "+CO", "+OR", "+DB", "+PA"];
    let base =
        MicroParams::fig5(8, 1, 20_000, if s.coroutines.len() > 3 { 100_000 } else { 60_000 }, 1);
    let mut series = Vec::new();
    let mut ids = Vec::new();
    for (name, p) in [
        ("read 1-sided", Primitive::Read),
        ("read 2-sided", Primitive::Rpc),
        ("write 1-sided", Primitive::Write),
        ("write 2-sided", Primitive::RpcWrite),
    ] {
        let jobs: Vec<usize> = (0..steps.len())
            .map(|step| {
                // Passive ACK does not apply to reads: their last step repeats +DB.
                let step = if step == 4 && name.starts_with("read") { 3 } else { step };
                let params = MicroParams {
                    coroutines: if step >= 1 { 8 } else { 1 },
                    batch: if step >= 2 { objects } else { 1 },
                    doorbell: step >= 3,
                    passive_ack: step >= 4,
                    rpc_coalescing: false,
                    ..base
                };
                plan.push(Job::Micro(MicroJob {
                    profile,
                    shape,
                    primitive: p,
                    payload,
                    params,
                    objects,
                    label: name.into(),
                }))
            })
            .collect();
        ids.push(jobs.clone());
        series.push((name.to_string(), jobs));
    }
    // §7 on Figs. 16, 18 and 20: one-sided against two-sided with every optimisation
    // (reads with doorbell batching, writes with passive ACK). "Below 1" is 0.95.
    let direction = |a: usize, b: usize, paper: f64, what: &str| Claim {
        figure: id,
        what: format!("{profile}: {what}"),
        paper,
        ours: Box::new(move |r: &[Res]| quotient(r[a].rate, r[b].rate)),
        compare: Compare::Direction,
        cause: None,
    };
    let (reads, writes) = ((ids[0][3], ids[1][3]), (ids[2][4], ids[3][4]));
    let one_over_two =
        ["one-sided over two-sided reads (+DB)", "one-sided over two-sided writes (+PA)"];
    let expected: &[(f64, f64)] = match id {
        "fig16" => &[(0.95, 0.95)],
        "fig18" => &[(1.05, 0.95)],
        "fig20" => &[(1.05, 1.05)],
        _ => &[],
    };
    for &(r_paper, w_paper) in expected {
        plan.claims.push(direction(reads.0, reads.1, r_paper, one_over_two[0]));
        plan.claims.push(direction(writes.0, writes.1, w_paper, one_over_two[1]));
    }
    if id == "fig6" {
        let ratio =
            |a: usize, b: usize| -> Measure { Box::new(move |r| quotient(r[a].rate, r[b].rate)) };
        plan.claims.push(Claim {
            figure: "fig6",
            what: "one-sided reads: +CO over the baseline".into(),
            paper: 7.0,
            ours: ratio(ids[0][1], ids[0][0]),
            compare: Compare::Magnitude,
            cause: None,
        });
        plan.claims.push(Claim {
            figure: "fig6",
            what: "two-sided reads: +CO over the baseline".into(),
            paper: 6.46,
            ours: ratio(ids[1][1], ids[1][0]),
            compare: Compare::Magnitude,
            cause: None,
        });
        plan.claims.push(Claim {
            figure: "fig6",
            what: "one-sided writes: +PA over +DB".into(),
            paper: 1.13,
            ours: ratio(ids[2][4], ids[2][3]),
            compare: Compare::Magnitude,
            cause: None,
        });
        plan.claims.push(Claim {
            figure: "fig6",
            what: "two-sided writes: +PA over +DB".into(),
            paper: 1.96,
            ours: ratio(ids[3][4], ids[3][3]),
            compare: Compare::Magnitude,
            cause: None,
        });
        let best = ids[0].clone();
        plan.claims.push(Claim {
            figure: "fig6",
            what: "peak multi-object READ transactions per machine (M/s)".into(),
            paper: 8.43,
            ours: Box::new(move |r| peak(r, &best) / 1e6),
            compare: Compare::Shown,
            cause: None,
        });
    }
    let title = format!(
        "{}: multi-object transactions on {profile} ({objects} x {payload} B)",
        fig_title(id)
    );
    let paper = match id {
        "fig6" => "Coroutines help one-sided 7x and two-sided 6.46x; outstanding requests add more; doorbell batching helps two-sided only; passive ACK adds 1.13x to one-sided and 1.96x to two-sided writes; multi-object READs peak near 8.43 M per machine.",
        "fig16" => "On ConnectX-3 one-sided cannot beat two-sided even with the same round trips.",
        "fig18" => "On RoCE one-sided still wins, except against two-sided with passive ACK.",
        _ => "On ConnectX-5 one-sided wins, even against two-sided with passive ACK.",
    };
    let groups: Vec<String> = steps.iter().map(|s| s.to_string()).collect();
    plan.figures.push(Figure {
        id,
        title,
        paper: paper.into(),
        charts: vec![Chart::Bars {
            title: "M txn/s per machine".into(),
            y_label: "M txn/s".into(),
            metric: Metric::Mrate,
            groups,
            series,
        }],
    });
}

/// DrTM+H's per-machine rates at 64 B (8 B for atomics) in the 16-node setting, M ops/s:
/// the calibration inputs of the cx4 profile (§3.1, §4.2, Fig. 5a).
const FIG5_PAPER: [(Primitive, f64); 4] = [
    (Primitive::Read, 86.9),
    (Primitive::Write, 130.0),
    (Primitive::Cas, 48.0),
    (Primitive::Rpc, 79.0),
];

fn fig5(plan: &mut Plan, s: &Scale) {
    let mut charts = Vec::new();
    let mut at = Vec::new();
    for lanes in [1u16, 5] {
        let shape = ClusterShape { nodes: 16, workers_per_node: 24, lanes_per_peer: lanes };
        let mut series = Vec::new();
        for &p in &s.micro_primitives {
            let payloads: Vec<u32> = if p.is_atomic() { vec![8] } else { s.payloads.clone() };
            let pts: Vec<(f64, usize)> = payloads
                .iter()
                .filter(|&&b| {
                    !(p == Primitive::WriteRpc && b > hytra_workloads::micro::WRPC_PAYLOAD_MAX)
                })
                .map(|&b| {
                    let scale = u64::from(b.div_ceil(256)).max(1);
                    let params = MicroParams::fig5(4, 8, 20_000 * scale, 60_000 * scale, 1);
                    let payload = hytra_workloads::micro::effective_payload(p, b);
                    let j = plan.push(Job::Micro(MicroJob {
                        profile: "cx4",
                        shape,
                        primitive: p,
                        payload,
                        params,
                        objects: 1,
                        label: p.name().into(),
                    }));
                    if b == 64 || (p.is_atomic() && b == 8) {
                        at.push((lanes, p, j));
                    }
                    (f64::from(payload), j)
                })
                .collect();
            series.push((p.name().to_string(), pts));
        }
        // The paper's rates belong to the 16-node setting, next to the primitives drawn.
        let paper = FIG5_PAPER
            .iter()
            .filter(|(p, _)| lanes == 1 && s.micro_primitives.contains(p))
            .map(|&(p, rate)| (p.name().to_string(), if p.is_atomic() { 8.0 } else { 64.0 }, rate))
            .collect();
        charts.push(Chart::Xy {
            title: if lanes == 1 { "16 nodes".into() } else { "80-node connection setting".into() },
            x_label: "payload (bytes)".into(),
            y_label: "M ops/s per machine".into(),
            x_axis: svg::XAxis::Log2,
            metric: Metric::Mrate,
            series,
            paper,
        });
    }
    for (p, paper) in FIG5_PAPER {
        if let Some(&(_, _, j)) = at.iter().find(|x| x.0 == 1 && x.1 == p) {
            plan.claims.push(Claim {
                figure: "fig5",
                what: format!(
                    "{} at 64 B (8 B for atomics), M ops/s per machine (calibration input)",
                    p.name()
                ),
                paper,
                ours: Box::new(move |r| r[j].rate / 1e6),
                compare: Compare::Shown,
                cause: None,
            });
        }
    }
    plan.figures.push(Figure {
        id: "fig5",
        title: "Fig. 5: raw primitives against payload".into(),
        paper: "Per machine at 64 B: WRITE 130 M/s, READ 86.9 M/s, ATOMIC 48 M/s, UD RPC 79 M/s (the profile's calibration inputs); the 80-node setting slows small one-sided requests.".into(),
        charts,
    });
}

/// The most simulated clusters run at once (each holds its own memory).
const JOBS_MAX: usize = 256;
/// How much longer than asked a multi-object point's window may grow before it is
/// refused (`hytra_rt::window::extend`).
const WINDOW_GROWTH_MAX: u64 = 64;

/// Builds the matrix (only the figures asked for).
fn plan(a: &ReproduceSpec) -> Result<Plan, ReproduceError> {
    let s = Scale::new(a)?;
    if s.nodes < 3 || s.workers == 0 {
        return Err(ReproduceError::TooSmall { nodes: s.nodes, workers: s.workers });
    }
    let shape = ClusterShape { nodes: s.nodes, workers_per_node: s.workers, lanes_per_peer: 1 };
    hytra_fabric::validate_shape(shape).map_err(ReproduceError::Shape)?;
    if let Some(jobs) = a.jobs.filter(|&j| j == 0 || j > JOBS_MAX) {
        return Err(ReproduceError::Jobs { jobs, max: JOBS_MAX });
    }
    let mut p = Plan::default();
    fig5(&mut p, &s);
    multi_object(&mut p, "fig6", "cx4", 16, 64, &s);
    phase_figures(&mut p, &s);
    design_figures(&mut p, &s);
    other_nics(&mut p, &s);
    redn::redn_figures(&mut p, &s);
    recovery::recovery_figure(&mut p, &s, a.quick);
    design_map::design_map_figure(&mut p, &s, a.quick);
    if let Some(only) = &a.only {
        let known: Vec<&str> = p.figures.iter().map(|f| f.id).collect();
        if let Some(bad) = only.iter().find(|o| !known.contains(&o.as_str())) {
            return Err(ReproduceError::UnknownFigure {
                name: bad.clone(),
                known: known.iter().map(ToString::to_string).collect(),
            });
        }
        // Keep the figures asked for; jobs no figure uses are skipped when running.
        p.figures.retain(|f| only.iter().any(|o| o == f.id));
        p.claims.retain(|c| only.iter().any(|o| o == c.figure));
    }
    figures_sorted(&mut p);
    Ok(p)
}

fn figures_sorted(p: &mut Plan) {
    // DrTM+H's figures by number, then the others (RedN's) in the order they were added.
    let num = |id: &str| id.strip_prefix("fig").and_then(|n| n.parse::<u32>().ok());
    let num = move |id: &str| num(id).unwrap_or(u32::MAX);
    p.figures.sort_by_key(|f| num(f.id));
}

/// Jobs some figure charts (the others were filtered out by --only).
fn used_jobs(p: &Plan) -> Vec<bool> {
    let mut used = vec![false; p.jobs.len()];
    for f in &p.figures {
        for c in &f.charts {
            let ids: Vec<usize> = match c {
                Chart::Curves { series, .. } => series.iter().flat_map(|s| s.1.clone()).collect(),
                Chart::Xy { series, .. } => {
                    series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).collect()
                }
                Chart::Bars { series, .. } => series.iter().flat_map(|s| s.1.clone()).collect(),
                Chart::Phases { jobs, .. } => jobs.clone(),
                Chart::Timeline { series, .. } => series.iter().map(|s| s.1).collect(),
                Chart::Winners { cells, .. } => cells.iter().flatten().flatten().copied().collect(),
            };
            for i in ids {
                used[i] = true;
            }
        }
    }
    used
}

fn run_bench_job(j: &BenchJob, s: &Scale, seed: u64) -> Result<Res, JobError> {
    let profile = NicProfile::by_name(j.profile).ok_or_else(|| JobError::from_text("profile"))?;
    let cpu = match j.cpu_scale {
        1.0 => s.cpu.clone(),
        x => s.cpu.scaled(&format!("{} x {x}", s.cpu.name), x, &s.cpu.source),
    };
    let cpu_profile = match j.wl {
        Wl::SmallBank => cpu.table("smallbank", &hytra_workloads::smallbank::TYPES),
        Wl::TpccNo => cpu.table("tpcc-no", &hytra_workloads::tpcc::TYPES),
        Wl::TpceCp => cpu.table("tpce-cp", &hytra_workloads::tpce::TYPES),
    };
    let mut b =
        SimCluster::new(SimConfig { profile, cpu_profile, ..SimConfig::new(j.shape, seed) })?;
    let measure_ns = measure_ns_of(j, s);
    let params = bench_params(s, j.coroutines, measure_ns, seed);
    let res = match workload_of(j, s, seed) {
        JobWorkload::SmallBank(w) => summarize(run(&mut b, &w, j.cfg, params)?, measure_ns),
        JobWorkload::TpccNo(w) => {
            let r = run(&mut b, &w, j.cfg, params)?;
            let full = r.stats.aborts[AbortReason::Full.index_pub()];
            if full > 0 {
                return Err(JobError::from_text(format!(
                    "{full} New-Orders found their district out of order ids (room for {})",
                    w.params.new_orders_max
                )));
            }
            summarize(r, measure_ns)
        }
        JobWorkload::TpceCp(w) => summarize(run(&mut b, &w, j.cfg, params)?, measure_ns),
    };
    Ok(res)
}

/// A transactional job's window: a dearer CPU commits fewer transactions in the same
/// time, so its window grows with it.
fn measure_ns_of(j: &BenchJob, s: &Scale) -> u64 {
    (s.measure_ns as f64 * j.cpu_scale.max(1.0)) as u64
}

/// The workload a transactional job runs, sized by the scale.
enum JobWorkload {
    SmallBank(SmallBank),
    TpccNo(TpcC),
    TpceCp(Tpce),
}

fn workload_of(j: &BenchJob, s: &Scale, seed: u64) -> JobWorkload {
    match j.wl {
        Wl::SmallBank => JobWorkload::SmallBank(SmallBank { accounts_per_worker: s.accounts }),
        Wl::TpccNo => {
            // Room for the orders one district can take. A terminal commits at most about
            // 80 000 New-Orders a second in any setting of the matrix (one coroutine, two
            // nodes), and a district has at most two terminals, which its row serialises.
            // Tables, their indexes and the location caches are sized for these order
            // ids; a district that runs out fails the run rather than skew it.
            let span = (s.warmup_ns + measure_ns_of(j, s)) as f64 / 1e9;
            JobWorkload::TpccNo(TpcC::new(TpccParams {
                mix: TpccMix::NewOrderOnly,
                customers: s.customers,
                items: s.items,
                new_orders_max: (span * 160_000.0) as u64 + 100,
                ..TpccParams::standard(seed)
            }))
        }
        Wl::TpceCp => JobWorkload::TpceCp(Tpce::new(TpceParams {
            customers_per_worker: s.tpce_customers,
            ..TpceParams::standard(seed)
        })),
    }
}

/// Bytes a transactional job touches (`run::memory_needed`, all nodes).
fn job_bytes(j: &BenchJob, s: &Scale) -> u64 {
    let (shape, cfg, co) = (j.shape, &j.cfg, j.coroutines);
    // The matrix's runs are simulated in this process, their caches warmed.
    let caches = CacheMemory::of(cfg, bench_params(s, co, 0, 1).warm_cache, false);
    let none = Failures::default();
    // Any seed: it draws the data, not the tables' sizes.
    match workload_of(j, s, 1) {
        JobWorkload::SmallBank(w) => memory_needed(&w, shape, cfg, co, caches, none),
        JobWorkload::TpccNo(w) => memory_needed(&w, shape, cfg, co, caches, none),
        JobWorkload::TpceCp(w) => memory_needed(&w, shape, cfg, co, caches, none),
    }
}

/// The parameters of a transactional run of the matrix: the scale's warm-up, a window
/// of `measure_ns`, no checker (the invariants still run), no timeline.
fn bench_params(s: &Scale, coroutines: u16, measure_ns: u64, seed: u64) -> BenchParams {
    BenchParams {
        coroutines,
        warmup_ns: s.warmup_ns,
        measure_ns,
        seed,
        check: false,
        rt: RtConfig { rpc_timeout_ns: 1_000_000, ..RtConfig::default() },
        drain_ns: 1_000_000_000,
        warm_cache: true,
        timeline_ns: 0,
    }
}

/// A transactional run's figures, its rate over a window of `measure_ns`.
fn summarize<R>(r: BenchResult<R>, measure_ns: u64) -> Res {
    let st = &r.stats;
    let n = st.commits.max(1) as f64;
    Res {
        rate: st.commits as f64 / (measure_ns as f64 / 1e9),
        commits: st.commits,
        p50_us: st.latency.quantile(0.5) as f64 / 1e3,
        p99_us: st.latency.quantile(0.99) as f64 / 1e3,
        abort_rate: st.abort_rate(),
        phases_us: st.phase_ns.map(|x| x as f64 / n / 1e3),
        invariant_ok: r.invariant.ok,
        error: (!r.invariant.ok).then(|| r.invariant.details.join("; ")),
        wall_s: r.run.wall_ns as f64 / 1e9,
        ..Res::default()
    }
}

fn run_micro_job(j: &MicroJob, seed: u64) -> Result<Res, JobError> {
    let profile = NicProfile::by_name(j.profile).ok_or_else(|| JobError::from_text("profile"))?;
    let cfg = SimConfig { profile, ..SimConfig::new(j.shape, seed) };
    let params = MicroParams { seed, ..j.params };
    let (point, stats) = run_point_settled(
        || SimCluster::new(cfg.clone()),
        j.primitive,
        j.payload,
        params,
        params.measure_ns.saturating_mul(WINDOW_GROWTH_MAX),
    )?;
    Ok(Res {
        rate: point.ops_per_sec / f64::from(j.objects),
        p50_us: point.p50_ns as f64 / 1e3,
        p99_us: point.p99_ns as f64 / 1e3,
        invariant_ok: true,
        wall_s: stats.wall_ns as f64 / 1e9,
        ..Res::default()
    })
}

/// How far a matrix is, told to the caller about twice a second while it runs.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Progress {
    /// Runs finished.
    pub done: usize,
    /// Runs in all.
    pub total: usize,
    /// Simulated clusters run at once.
    pub threads: usize,
    /// Wall time since the first run started, in seconds.
    pub elapsed_s: f64,
}

/// Runs the matrix `a` asks for, telling `progress` how far it is (once before the first
/// run, then about twice a second), and writes its report (`index.html`,
/// `results.json`) into `a.out`. Bad input is refused before any run.
pub fn run_reproduce(
    a: ReproduceSpec,
    progress: &mut dyn FnMut(Progress),
) -> Result<Reproduced, ReproduceError> {
    let p = plan(&a)?;
    let s = Scale::new(&a)?;
    std::fs::create_dir_all(&a.out)
        .map_err(|source| ReproduceError::Output { path: a.out.clone(), source })?;
    let todo = start_order(&p, &s);
    let results: Vec<Mutex<Option<Res>>> = p.jobs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let gate = Gate::default();
    let threads =
        a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    hytra_fabric::heap::map_large_allocations();
    let started = Instant::now();
    let total = todo.len();
    progress(Progress { done: 0, total, threads, elapsed_s: 0.0 });
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = todo.get(k) else { break };
                // Clusters larger than the matrix's (Fig. 12's 16 nodes) hold several
                // gigabytes each: they run alone, the others `threads` at a time.
                let _turn = gate.enter(runs_alone(&p.jobs[i], &s));
                let r = match &p.jobs[i] {
                    Job::Bench(j) => run_bench_job(j, &s, a.seed),
                    Job::Micro(j) => run_micro_job(j, a.seed),
                    Job::Offload(j) => redn::run_offload_job(j, a.seed),
                    Job::Failure(j) => recovery::run_failure_job(j, &s, a.seed),
                };
                let r = r.unwrap_or_else(|e| Res { error: Some(e.0), ..Res::default() });
                hytra_fabric::heap::give_back();
                *results[i].lock().expect("no panic holding a result") = Some(r);
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
        // The caller hears how far the runs are while the workers run.
        while done.load(Ordering::Relaxed) < total {
            std::thread::sleep(Duration::from_millis(500));
            let d = done.load(Ordering::Relaxed);
            progress(Progress {
                done: d,
                total,
                threads,
                elapsed_s: started.elapsed().as_secs_f64(),
            });
        }
    });
    let res: Vec<Res> = results
        .into_iter()
        .map(|m| m.into_inner().expect("no panic").unwrap_or_default())
        .collect();
    let wall = started.elapsed().as_secs_f64();
    // The report lists the runs in the plan's order, whatever order they ran in.
    let mut todo = todo;
    todo.sort_unstable();
    let failures: Vec<String> = todo
        .iter()
        .filter_map(|&i| res[i].error.as_ref().map(|e| format!("{}: {e}", describe(&p.jobs[i]))))
        .collect();
    let report_error = write_json(&a, &s, &p, &res, &todo, wall)
        .and_then(|()| write_html(&a, &s, &p, &res, wall, &failures))
        .err();
    Ok(Reproduced { claims: claims_text(&p, &res), wall_s: wall, failures, report_error })
}

/// The runs the report uses, in the order they start: those that need the machine to
/// themselves first (one among the others would hold the other threads idle from the
/// moment it waits until it ends, each time), then the rest in the plan's order.
fn start_order(p: &Plan, s: &Scale) -> Vec<usize> {
    let used = used_jobs(p);
    let mut todo: Vec<usize> = (0..p.jobs.len()).filter(|&i| used[i]).collect();
    todo.sort_by_cached_key(|&i| !runs_alone(&p.jobs[i], s));
    todo
}

/// Estimated bytes (`run::memory_needed`) above which a run larger than the matrix's
/// own cluster runs alone: two of them side by side would pass 2 GB.
const SHARED_BYTES_MAX: u64 = 1 << 30;

/// Whether a run needs the machine to itself: a transactional cluster larger than the
/// matrix's (Fig. 12's 16 nodes) that would touch more than [`SHARED_BYTES_MAX`]. At
/// 16 x 8, TPC-C/no holds 128 warehouses of 20 000 stock rows, each stored three times:
/// about 4.5 GB (most of it those stock copies) that the figure's claims need as they
/// are (with a fifth of the items, more conflicts on stock
/// made its 80-node ratio at 16 nodes noisier: 1.01-1.05 over three seeds against
/// 1.01-1.02, docs/PERFORMANCE.md §39). The quick matrix's larger clusters (8 x 4, 5 x 4)
/// hold a few hundred megabytes and share the machine.
fn runs_alone(j: &Job, s: &Scale) -> bool {
    let workers = |nodes: u16, per_node: u16| u32::from(nodes) * u32::from(per_node);
    match j {
        Job::Bench(b) => {
            workers(b.shape.nodes, b.shape.workers_per_node) > workers(s.nodes, s.workers)
                && job_bytes(b, s) > SHARED_BYTES_MAX
        }
        Job::Micro(_) | Job::Offload(_) | Job::Failure(_) => false,
    }
}

/// Lets runs in, several at a time or one alone; a run waiting to be alone goes first.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Runs in, sharing the machine.
    shared: usize,
    /// Whether a run is in alone.
    alone: bool,
    /// Runs waiting to be alone.
    waiting_alone: usize,
}

/// A run's turn: it ends when dropped.
struct Turn<'a> {
    gate: &'a Gate,
    alone: bool,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(
        &self,
        st: std::sync::MutexGuard<'a, GateState>,
    ) -> std::sync::MutexGuard<'a, GateState> {
        self.changed.wait(st).unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the run may start: alone once nothing else runs, or beside other
    /// shared runs once no run is alone or waiting to be.
    fn enter(&self, alone: bool) -> Turn<'_> {
        let mut st = self.lock();
        if alone {
            st.waiting_alone += 1;
            while st.shared > 0 || st.alone {
                st = self.wait(st);
            }
            st.waiting_alone -= 1;
            st.alone = true;
        } else {
            while st.alone || st.waiting_alone > 0 {
                st = self.wait(st);
            }
            st.shared += 1;
        }
        Turn { gate: self, alone }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        if self.alone {
            st.alone = false;
        } else {
            st.shared -= 1;
        }
        drop(st);
        self.gate.changed.notify_all();
    }
}

fn describe(j: &Job) -> String {
    match j {
        Job::Bench(b) => format!(
            "{} {} on {} {}x{} with {} coroutines",
            b.wl.name(),
            b.label,
            b.profile,
            b.shape.nodes,
            b.shape.workers_per_node,
            b.coroutines
        ),
        Job::Micro(m) => format!("micro {} {} B on {}", m.label, m.payload, m.profile),
        Job::Offload(o) => redn::describe(o),
        Job::Failure(f) => recovery::describe(f),
    }
}

fn verdict(c: &Claim, ours: f64) -> Verdict {
    if !ours.is_finite() {
        return Verdict::NotJudged;
    }
    let direction = || {
        if (ours - 1.0).abs() < 0.02 {
            // Within 2%: no difference either way, which is not the paper's finding.
            Verdict::NoClearDifference
        } else if (ours > 1.0) == (c.paper > 1.0) {
            Verdict::Agrees
        } else {
            Verdict::Differs
        }
    };
    match c.compare {
        Compare::Shown => Verdict::NotJudged,
        Compare::Direction => direction(),
        Compare::Magnitude => match direction() {
            Verdict::Agrees => {
                // The size of an effect is its distance from 1 on a log scale: 2x and 0.5x
                // are the same size.
                let size = ours.ln() / c.paper.ln();
                if size < 0.5 {
                    Verdict::Weaker
                } else if size > 2.0 {
                    Verdict::Stronger
                } else {
                    Verdict::Agrees
                }
            }
            other => other,
        },
        Compare::Within(tolerance) if (ours - 1.0).abs() <= tolerance => Verdict::Agrees,
        Compare::Within(_) => Verdict::Differs,
        Compare::AtMost if ours <= c.paper => Verdict::Agrees,
        Compare::AtMost => Verdict::Differs,
    }
}

fn claims_text(p: &Plan, r: &[Res]) -> String {
    let mut t = Table::new(&["claim", "figure", "paper", "hytra (sim)", "verdict"]);
    for c in &p.claims {
        let ours = (c.ours)(r);
        t.row(vec![
            c.what.clone(),
            c.figure.into(),
            format!("{:.2}", c.paper),
            format!("{ours:.2}"),
            verdict(c, ours).name().into(),
        ]);
    }
    t.render()
}

#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
fn write_json(
    a: &ReproduceSpec,
    s: &Scale,
    p: &Plan,
    r: &[Res],
    todo: &[usize],
    wall: f64,
) -> Result<(), String> {
    let runs: Vec<_> = todo
        .iter()
        .map(|&i| {
            let x = &r[i];
            let mut v = json!({
                "rate_per_sec": x.rate,
                "p50_us": x.p50_us,
                "p99_us": x.p99_us,
                "error": x.error,
                "wall_s": x.wall_s,
            });
            match &p.jobs[i] {
                Job::Bench(b) => {
                    v["kind"] = json!("transactions");
                    v["workload"] = json!(b.wl.name());
                    v["label"] = json!(b.label);
                    v["profile"] = json!(b.profile);
                    v["cpu_scale"] = json!(b.cpu_scale);
                    v["nodes"] = json!(b.shape.nodes);
                    v["workers"] = json!(b.shape.workers_per_node);
                    v["lanes"] = json!(b.shape.lanes_per_peer);
                    v["coroutines"] = json!(b.coroutines);
                    v["tables"] = match b.wl {
                        Wl::SmallBank => json!({ "accounts_per_worker": s.accounts }),
                        Wl::TpccNo => json!({
                            "warehouses_per_worker": 1,
                            "customers_per_district": s.customers,
                            "items": s.items,
                        }),
                        Wl::TpceCp => json!({ "customers_per_worker": s.tpce_customers }),
                    };
                    v["config"] = json!({
                        "design": b.cfg.design.name(), "exec": b.cfg.exec.name(), "lock": b.cfg.lock.name(),
                        "validate": b.cfg.validate.name(), "log": b.cfg.log.name(), "commit": b.cfg.commit.name(),
                        "passive_ack": b.cfg.passive_ack, "replication": b.cfg.replication,
                    });
                    v["abort_rate"] = json!(x.abort_rate);
                    v["phases_us"] = json!({ "execution": x.phases_us[0], "validation": x.phases_us[1], "logging": x.phases_us[2], "commit": x.phases_us[3] });
                    v["invariant_ok"] = json!(x.invariant_ok);
                }
                Job::Micro(m) => {
                    v["kind"] = json!("micro");
                    v["label"] = json!(m.label);
                    v["primitive"] = json!(m.primitive.name());
                    v["payload"] = json!(m.payload);
                    v["profile"] = json!(m.profile);
                    v["nodes"] = json!(m.shape.nodes);
                    v["workers"] = json!(m.shape.workers_per_node);
                    v["lanes"] = json!(m.shape.lanes_per_peer);
                    v["objects"] = json!(m.objects);
                    v["coroutines"] = json!(m.params.coroutines);
                    v["outstanding"] = json!(m.params.batch);
                    v["doorbell_batching"] = json!(m.params.doorbell);
                    v["passive_ack"] = json!(m.params.passive_ack);
                }
                Job::Offload(o) => {
                    let sc = &o.scenario;
                    v["kind"] = json!("offload");
                    v["label"] = json!(o.label);
                    v["profile"] = json!("cx5");
                    v["value_bytes"] = json!(sc.value_bytes);
                    v["writers"] = json!(sc.writers);
                    v["list"] = json!(sc.list.map(|l| json!({ "len": l.len, "range": l.range })));
                    v["duration_ns"] = json!(sc.duration_ns);
                    v["mean_us"] = json!(x.mean_us);
                    v["invariant_ok"] = json!(x.invariant_ok);
                }
                Job::Failure(f) => {
                    let ms = |t: Option<u64>| t.map(|ns| ns as f64 / 1e6);
                    let t = x.recovery.unwrap_or_default();
                    v["kind"] = json!("recovery");
                    v["workload"] = json!("SmallBank");
                    v["label"] = json!(f.label);
                    v["profile"] = json!("cx4");
                    v["nodes"] = json!(f.shape.nodes);
                    v["workers"] = json!(f.shape.workers_per_node);
                    v["coroutines"] = json!(f.coroutines);
                    v["crash"] = json!({ "node": f.node, "at_ms": f.at_ns as f64 / 1e6, "end_ms": f.end_ns as f64 / 1e6 });
                    v["recovery_ms"] = json!({
                        "detected": ms(t.detected_ns), "configured": ms(t.configured_ns),
                        "active": ms(t.active_ns), "recovered": ms(t.recovered_ns),
                        "replicated": ms(t.replicated_ns),
                    });
                    v["survivors_timeline"] = json!(x.timeline.iter().map(|&(at, m)| json!({ "ms_from_crash": at, "m_txn_per_s": m })).collect::<Vec<_>>());
                    v["abort_rate"] = json!(x.abort_rate);
                    v["invariant_ok"] = json!(x.invariant_ok);
                }
            }
            v
        })
        .collect();
    let claims: Vec<_> = p
        .claims
        .iter()
        .map(|c| {
            let ours = (c.ours)(r);
            {
                let v = verdict(c, ours);
                let cause = c.cause.filter(|_| !matches!(v, Verdict::Agrees | Verdict::NotJudged));
                json!({ "figure": c.figure, "what": c.what, "paper": c.paper, "ours": ours, "verdict": v.name(), "cause": cause })
            }
        })
        .collect();
    let doc = json!({
        "command": "reproduce",
        "quick": a.quick,
        "mode": mode(a),
        "machine": machine(),
        "seed": a.seed,
        "cpu_profile": s.cpu.name,
        "wall_s": wall,
        "figures": p.figures.iter().map(|f| f.id).collect::<Vec<_>>(),
        "claims": claims,
        "runs": runs,
    });
    let path = a.out.join("results.json");
    let text = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
    std::fs::write(&path, text).map_err(|e| format!("cannot write '{}': {e}", path.display()))
}

fn chart_svg(c: &Chart, r: &[Res], jobs: &[Job]) -> String {
    match c {
        Chart::Curves { title, series } => {
            let s: Vec<(String, Vec<(f64, f64)>)> = series
                .iter()
                .map(|(l, js)| {
                    (l.clone(), js.iter().map(|&j| (r[j].rate / 1e6, r[j].p50_us)).collect())
                })
                .collect();
            // Each point is a coroutine count: say which, so a curve that turns back
            // (more coroutines, less throughput) reads as what it is.
            let labels: Vec<Vec<String>> = series
                .iter()
                .map(|(_, js)| {
                    js.iter()
                        .map(|&j| match &jobs[j] {
                            Job::Bench(b) => format!("{}", b.coroutines),
                            _ => String::new(),
                        })
                        .collect()
                })
                .collect();
            let marks = svg::Marks { point_labels: &labels, paper: &[] };
            svg::lines_marked(
                &format!("{title} (points: coroutines per worker)"),
                "throughput (M txn/s)",
                "median latency (µs)",
                &s,
                svg::XAxis::Linear,
                &marks,
            )
        }
        Chart::Xy { title, x_label, y_label, x_axis, metric, series, paper } => {
            let s: Vec<(String, Vec<(f64, f64)>)> = series
                .iter()
                .map(|(l, pts)| {
                    (l.clone(), pts.iter().map(|&(x, j)| (x, metric.of(&r[j]))).collect())
                })
                .collect();
            let marks = svg::Marks { point_labels: &[], paper };
            svg::lines_marked(title, x_label, y_label, &s, *x_axis, &marks)
        }
        Chart::Bars { title, y_label, metric, groups, series } => {
            let s: Vec<(String, Vec<f64>)> = series
                .iter()
                .map(|(l, jobs)| (l.clone(), jobs.iter().map(|&j| metric.of(&r[j])).collect()))
                .collect();
            svg::bars(title, y_label, groups, &s)
        }
        Chart::Phases { title, groups, jobs } => {
            let names = ["execution", "validation", "logging", "commit"];
            let parts: Vec<(String, Vec<f64>)> = (0..4)
                .map(|k| (names[k].to_string(), jobs.iter().map(|&j| r[j].phases_us[k]).collect()))
                .collect();
            svg::stacked(title, "us per committed transaction", groups, &parts)
        }
        Chart::Timeline { title, x_label, y_label, series } => {
            let s: Vec<(String, Vec<(f64, f64)>)> =
                series.iter().map(|(l, j)| (l.clone(), r[*j].timeline.clone())).collect();
            svg::timeline(title, x_label, y_label, &s, 0.0, "crash")
        }
        Chart::Winners { title, rows, cols, contenders, cells, mark, commits_min } => {
            // A cell where some design committed too few transactions to rank is left
            // blank (its rates say so): too few to tell one design from another.
            let rates: Vec<Vec<Vec<f64>>> = cells
                .iter()
                .map(|row| {
                    row.iter()
                        .map(|js| {
                            let ranked = js.iter().all(|&j| r[j].commits as f64 >= *commits_min);
                            if ranked {
                                js.iter().map(|&j| r[j].rate).collect()
                            } else {
                                Vec::new()
                            }
                        })
                        .collect()
                })
                .collect();
            svg::winners(title, rows, cols, contenders, &rates, *mark)
        }
    }
}

/// The numbers behind a chart, as an HTML table.
fn chart_table(c: &Chart, r: &[Res], jobs: &[Job]) -> String {
    let mut rows = String::new();
    let mut add = |label: &str, j: usize| {
        let x = &r[j];
        let extra = match &jobs[j] {
            Job::Bench(b) => {
                format!("{} coroutines, abort rate {:.1}%", b.coroutines, x.abort_rate * 100.0)
            }
            Job::Micro(m) => format!(
                "{} B, {} coroutines, batch {}",
                m.payload, m.params.coroutines, m.params.batch
            ),
            Job::Offload(o) => format!("{}, mean {:.2} µs", redn::describe(o), x.mean_us),
            Job::Failure(f) => format!(
                "{} coroutines; {}",
                f.coroutines,
                recovery::times_text(x.recovery.as_ref())
            ),
        };
        let _ = write!(
            rows,
            "<tr><td>{label}</td><td>{extra}</td><td>{:.3}</td><td>{:.1}</td><td>{:.1}</td></tr>",
            x.rate / 1e6,
            x.p50_us,
            x.p99_us
        );
    };
    match c {
        Chart::Curves { series, .. } | Chart::Bars { series, .. } => {
            for (l, js) in series {
                for &j in js {
                    add(l, j);
                }
            }
        }
        Chart::Xy { series, .. } => {
            for (l, pts) in series {
                for &(_, j) in pts {
                    add(l, j);
                }
            }
        }
        Chart::Phases { groups, jobs: js, .. } => {
            for (g, &j) in groups.iter().zip(js) {
                add(g, j);
            }
        }
        Chart::Timeline { series, .. } => {
            for (l, j) in series {
                add(l, *j);
            }
        }
        Chart::Winners { rows, cols, contenders, cells, .. } => {
            for (row, cells) in rows.iter().zip(cells) {
                for (col, js) in cols.iter().zip(cells) {
                    for (who, &j) in contenders.iter().zip(js) {
                        add(&format!("{row}, {col}: {who}"), j);
                    }
                }
            }
        }
    }
    format!("<details><summary>numbers</summary><table><tr><th>series</th><th>setting</th><th>M/s</th><th>p50 µs</th><th>p99 µs</th></tr>{rows}</table></details>")
}

/// The matrix a report comes from, as its page and JSON say it.
fn mode(a: &ReproduceSpec) -> &'static str {
    if a.quick {
        "quick (--quick: smaller clusters, shorter windows, fewer points)"
    } else {
        "full"
    }
}

/// The machine that ran the simulation: its CPU model and the cores this process may use.
/// Simulated results do not depend on it; wall times and `measured` CPU profiles do.
fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "an unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    format!("{model}, {cores} cores, {}", std::env::consts::OS)
}

fn write_html(
    a: &ReproduceSpec,
    s: &Scale,
    p: &Plan,
    r: &[Res],
    wall: f64,
    failures: &[String],
) -> Result<(), String> {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>hytra: DrTM+H figures on the simulator</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}}
.charts{{display:flex;flex-wrap:wrap;gap:12px}} table{{border-collapse:collapse;font-size:13px}} td,th{{border:1px solid #ccc;padding:3px 6px}}
.paper{{background:#f4f7fb;border-left:4px solid #1b6ca8;padding:6px 10px}} .differs{{color:#b00}} .same{{color:#070}} .partly{{color:#a60}}</style></head><body>
<h1>DrTM+H's experiments, reproduced on the hytra simulator</h1>
<p><b>Mode: {}.</b> Simulated on {} (hytra {}).</p>
<p>Every figure below comes from simulated clusters (NIC profile cx4 unless stated) running hytra's real engine; throughput is in virtual time. Transactional runs: CPU profile {} ({}); {} nodes x {} workers, coroutines {:?}, {:.1} ms measured after {:.1} ms of warm-up, 3-way replication; the paper used 16 nodes x 24 workers, so absolute numbers differ and the comparison is in ratios and directions. Tables: SmallBank {} accounts per worker; TPC-C/no one warehouse per worker, {} items, {} customers per district (New-Order reads one customer and never the initial orders, so few customers only save memory); TPC-E {} customers per worker. Raw-primitive runs use the paper's 16 x 24. Seed {}; {:.0} s of wall time. Every run's numbers are in <a href="results.json">results.json</a>.</p>"#,
        mode(a),
        svg::esc(&machine()),
        env!("CARGO_PKG_VERSION"),
        svg::esc(&s.cpu.name),
        svg::esc(&s.cpu.source),
        s.nodes,
        s.workers,
        s.coroutines,
        s.measure_ns as f64 / 1e6,
        s.warmup_ns as f64 / 1e6,
        s.accounts,
        s.items,
        s.customers,
        s.tpce_customers,
        a.seed,
        wall
    );
    if !failures.is_empty() {
        let _ = write!(
            h,
            "<p class=\"differs\"><b>{} runs failed:</b> {}</p>",
            failures.len(),
            failures.join("<br>")
        );
    }
    h.push_str("<h2>What the paper reports, and what we measure</h2><table><tr><th>figure</th><th>claim</th><th>paper</th><th>hytra (sim)</th><th>verdict</th><th>cause, where known</th></tr>");
    for c in &p.claims {
        let ours = (c.ours)(r);
        let v = verdict(c, ours);
        let cause =
            c.cause.filter(|_| !matches!(v, Verdict::Agrees | Verdict::NotJudged)).unwrap_or("");
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{:.2}</td><td>{ours:.2}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            c.figure,
            c.what,
            c.paper,
            v.class(),
            v.name(),
            svg::esc(cause)
        );
    }
    h.push_str("</table><p>A ratio the paper gives as a number agrees when it points the same way and its effect (its distance from 1 on a log scale) is within a factor of two of the paper's, and is weaker or stronger otherwise; where the paper gives no number, 1.05 stands for \"above 1\" (0.95 for \"below 1\") and only the direction is judged; within 2% of 1 is no clear difference. Nothing in the simulator is tuned to these end-to-end results: its NIC profiles come from primitive-level figures only, its CPU profile (named at the top) from measurements of hytra's own code (<code>hytra calibrate</code>) unless it is <code>assumed</code>.</p>");
    for f in &p.figures {
        let _ = write!(
            h,
            "<h2 id=\"{}\">{}</h2><p class=\"paper\"><b>Paper:</b> {}</p><div class=\"charts\">",
            f.id, f.title, f.paper
        );
        for c in &f.charts {
            let _ =
                write!(h, "<div>{}{}</div>", chart_svg(c, r, &p.jobs), chart_table(c, r, &p.jobs));
        }
        h.push_str("</div>");
    }
    h.push_str("</body></html>\n");
    let path = a.out.join("index.html");
    std::fs::write(&path, h).map_err(|e| format!("cannot write '{}': {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(paper: f64, compare: Compare, ours: f64) -> Verdict {
        let c = Claim {
            figure: "t",
            what: String::new(),
            paper,
            ours: Box::new(|_| 0.0),
            compare,
            cause: None,
        };
        verdict(&c, ours)
    }

    #[test]
    fn a_verdict_judges_size_where_the_paper_gives_one() {
        use Compare::*;
        // The paper's direction, a thirtieth of its effect: not an agreement.
        assert_eq!(judge(35.0, Magnitude, 1.16), Verdict::Weaker);
        assert_eq!(judge(2.96, Magnitude, 2.5), Verdict::Agrees);
        assert_eq!(judge(1.3, Magnitude, 2.0), Verdict::Stronger);
        assert_eq!(judge(0.91, Magnitude, 0.89), Verdict::Agrees);
        assert_eq!(judge(2.5, Magnitude, 0.93), Verdict::Differs);
        assert_eq!(judge(2.5, Magnitude, 1.01), Verdict::NoClearDifference);
        // "Above 1" only.
        assert_eq!(judge(1.05, Direction, 1.9), Verdict::Agrees);
        assert_eq!(judge(1.05, Direction, 0.9), Verdict::Differs);
        // "Within 5%": 3.53 is not.
        assert_eq!(judge(1.05, Within(0.05), 3.53), Verdict::Differs);
        assert_eq!(judge(1.0, Within(0.05), 1.03), Verdict::Agrees);
        // "Under 50 ms".
        assert_eq!(judge(50.0, AtMost, 7.6), Verdict::Agrees);
        assert_eq!(judge(50.0, AtMost, 51.0), Verdict::Differs);
        // Shown, or nothing measured: not judged.
        assert_eq!(judge(8.43, Shown, 3.0), Verdict::NotJudged);
        assert_eq!(judge(2.0, Magnitude, f64::NAN), Verdict::NotJudged);
    }

    fn spec(quick: bool) -> ReproduceSpec {
        ReproduceSpec {
            quick,
            out: PathBuf::from("unused"),
            only: None,
            jobs: None,
            nodes: None,
            workers: None,
            seed: 1,
            cpu_profile: None,
        }
    }

    #[test]
    fn only_clusters_of_gigabytes_run_alone_and_they_start_first() {
        for quick in [true, false] {
            let a = spec(quick);
            let (p, s) = (plan(&a).expect("the default plan"), Scale::new(&a).expect("scale"));
            let order = start_order(&p, &s);
            let used = used_jobs(&p);
            assert_eq!(order.len(), used.iter().filter(|&&u| u).count(), "every used run once");
            let alone: Vec<bool> = order.iter().map(|&i| runs_alone(&p.jobs[i], &s)).collect();
            let first_shared = alone.iter().position(|&a| !a).expect("shared runs");
            assert!(alone[first_shared..].iter().all(|&a| !a), "alone runs start first");
            let names: Vec<String> =
                order[..first_shared].iter().map(|&i| describe(&p.jobs[i])).collect();
            if quick {
                // Its largest clusters (8 x 4 TPC-C/no) hold a few hundred megabytes.
                assert!(names.is_empty(), "quick runs alone: {names:?}");
            } else {
                // Fig. 12's 16 x 8 clusters (several gigabytes each), and only they.
                let big: Vec<String> = order
                    .iter()
                    .map(|&i| describe(&p.jobs[i]))
                    .filter(|n| n.contains(" 16x8 "))
                    .collect();
                assert!(!big.is_empty(), "the full matrix has 16 x 8 runs");
                assert_eq!(names, big, "exactly the 16 x 8 runs go alone");
            }
            // The shared runs keep the plan's order.
            assert!(order[first_shared..].windows(2).all(|w| w[0] < w[1]));
        }
    }
}
