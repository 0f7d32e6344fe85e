//! Calibration: measuring what hytra's own code costs on this machine and fitting the CPU
//! profile's terms to it.
//!
//! Every run of the plan executes the real engine, runtime and workloads in the simulator
//! with measured steps ([`CpuMode::Measured`]): each step's time is read from the clock,
//! less the simulator's own work, and filed under the mix of terms the step charged (one
//! event-loop iteration, two coroutine switches, one record locked one-sided, ...). The
//! plan varies workloads, designs (so that each phase runs on each primitive), cluster
//! sizes and coroutines, so that the terms appear in many different mixes. The fit then
//! finds non-negative costs per term that best predict the median time of each mix,
//! weighted by how many steps had it: a linear model, `step time = sum of count x cost`,
//! which is exactly how the simulator charges them.

use std::collections::BTreeMap;
use std::time::Instant;

use hytra_fabric::cpu::{CpuSamples, CpuTerm};
use hytra_fabric::sim::{CpuMode, SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_rt::RtConfig;
use hytra_txn::{Design, TxnConfig};
use hytra_workloads::bench::{run, BenchParams, Workload};
use hytra_workloads::tpcc::TpccMix;
use hytra_workloads::ycsb::{KeyDist, Mix as YcsbMix};
use thiserror::Error;

use crate::cpu_profile::{attempt_family, attempt_workloads, fixed_terms, CpuProfile, FitReport};
use crate::workload::{WorkloadSpec, WorkloadVisitor};

/// One run of the plan.
#[derive(Clone, Debug)]
pub struct CalRun {
    /// What runs.
    pub workload: WorkloadSpec,
    /// How.
    pub design: Design,
    /// Where.
    pub shape: ClusterShape,
    /// Coroutines per worker.
    pub coroutines: u16,
}

impl CalRun {
    /// One line naming the run.
    pub fn describe(&self) -> String {
        format!(
            "{} {} {}x{} co={}",
            self.workload.name(),
            self.design.name(),
            self.shape.nodes,
            self.shape.workers_per_node,
            self.coroutines
        )
    }
}

/// How much to measure.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Extent {
    /// Every workload on every design, two shapes, two coroutine counts, 5 ms each.
    Full,
    /// Four runs (for tests: the fit is rough).
    Tiny,
}

/// The workloads calibrated, small (calibration needs mixes of steps, not big tables).
fn workloads() -> Vec<WorkloadSpec> {
    let ycsb = |mix| WorkloadSpec::Ycsb {
        mix,
        records_per_worker: 2_000,
        fields: 10,
        field_bytes: 8,
        ops_per_txn: 4,
        dist: KeyDist::Uniform,
    };
    vec![
        WorkloadSpec::SmallBank { accounts_per_worker: 2_000 },
        WorkloadSpec::Tpcc {
            mix: TpccMix::Standard,
            warehouses_per_worker: 1,
            customers: 300,
            items: 10_000,
            remote_item_pct: 1,
        },
        WorkloadSpec::TpceCp { customers_per_worker: 1_000, market_feed_pct: 10 },
        WorkloadSpec::Tatp { subscribers_per_worker: 2_000, uniform: false },
        ycsb(YcsbMix::A),
        ycsb(YcsbMix::D),
        ycsb(YcsbMix::E),
        ycsb(YcsbMix::F),
    ]
}

/// The runs of a calibration.
pub fn plan(extent: Extent) -> Vec<CalRun> {
    let shape =
        |nodes, workers_per_node| ClusterShape { nodes, workers_per_node, lanes_per_peer: 1 };
    let mut runs = Vec::new();
    match extent {
        Extent::Full => {
            for w in workloads() {
                for design in Design::ALL {
                    for (s, co) in [(shape(2, 1), 2), (shape(3, 2), 8)] {
                        runs.push(CalRun { workload: w.clone(), design, shape: s, coroutines: co });
                    }
                }
            }
        }
        Extent::Tiny => {
            let w = workloads();
            for (i, design) in Design::ALL.into_iter().enumerate() {
                runs.push(CalRun {
                    // SmallBank and TATP: short transactions, so that even 1 ms on a
                    // busy machine commits some.
                    workload: w[[0, 3][i % 2]].clone(),
                    design,
                    shape: shape(3, 1),
                    coroutines: 4,
                });
            }
        }
    }
    runs
}

/// How long a call of a calibration run waits for its reply (virtual time).
const CALL_TIMEOUT_NS: u64 = 1_000_000_000;

/// A calibration run's lease (virtual time). A step that was descheduled is charged the
/// milliseconds it was off its core, past the simulator's 5 ms lease: a node was removed
/// for it, and the run measured recovery, not the engine, or (on a loaded machine, the
/// CI's) stalled without a commit. Half a second outlasts any such pause; longer would
/// not do, since the background tasks poll every 64th of a lease and a run must drain
/// within `DRAIN_NS`.
const LEASE_NS: u64 = 500_000_000;

/// How many times a run is tried before the calibration fails.
const RUN_ATTEMPTS: u32 = 3;

/// How long a calibration run may take to drain after its window (virtual time).
const DRAIN_NS: u64 = 1_000_000_000;

/// Virtual time each run measures.
fn measure_ns(extent: Extent) -> u64 {
    match extent {
        // Tiny runs as long: on a busy machine (tests beside it) a descheduled step
        // takes milliseconds of virtual time, and a shorter window may see no commit.
        Extent::Full | Extent::Tiny => 5_000_000,
    }
}

/// Why a calibration failed.
#[derive(Debug, Error)]
pub enum CalibrateError {
    /// A run of the plan failed.
    #[error("calibration run {run}: {message}")]
    Run {
        /// Which.
        run: String,
        /// Why.
        message: String,
    },
}

/// One term's fitted cost.
#[derive(Clone, Debug, PartialEq)]
pub struct TermFit {
    /// Name in profiles (`attempt.<workload>.<type>` for attempts).
    pub name: String,
    /// Fitted cost, ns (the assumed one when not measured).
    pub ns: f64,
    /// What the code assumed, ns.
    pub assumed_ns: f64,
    /// Steps that charged it.
    pub steps: u64,
}

/// A calibration's outcome.
#[derive(Clone, Debug)]
pub struct Calibration {
    /// The profile (named `host`).
    pub profile: CpuProfile,
    /// Every term, measured or not.
    pub terms: Vec<TermFit>,
    /// Runs made.
    pub runs: usize,
    /// Wall time of the runs, s.
    pub wall_s: f64,
}

/// A column of the fit: a fixed term, or the attempts of one workload's type.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Column {
    Term(usize),
    Attempt(&'static str, &'static str),
}

/// Runs the plan and fits the profile. `progress` is told of each run as it starts.
pub fn calibrate(
    extent: Extent,
    seed: u64,
    mut progress: impl FnMut(usize, usize, &CalRun),
) -> Result<Calibration, CalibrateError> {
    let runs = plan(extent);
    let started = Instant::now();
    // Rows by mix of columns: the steps' times.
    let mut rows: BTreeMap<Vec<(Column, u32)>, Vec<f64>> = BTreeMap::new();
    let mut steps_total = 0;
    for (i, r) in runs.iter().enumerate() {
        progress(i, runs.len(), r);
        // A run that a descheduling spoiled (a step charged the time it was off its core
        // can eat a short window whole) is run again, a bounded number of times.
        let mut attempt = 0;
        let (samples, family, types) = loop {
            attempt += 1;
            match measure(r, seed + i as u64, measure_ns(extent)) {
                Ok(m) => break m,
                Err(message) if attempt == RUN_ATTEMPTS => {
                    let message = format!("{message} (in each of {RUN_ATTEMPTS} attempts)");
                    return Err(CalibrateError::Run { run: r.describe(), message });
                }
                Err(_) => {}
            }
        };
        steps_total += samples.steps;
        for (mix, times) in samples.by_mix {
            let key = columns(&mix, family, types);
            rows.entry(key).or_default().extend(times);
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    let mut c = fit(rows, steps_total, runs.len(), wall_s);
    c.profile.source = format!(
        "hytra calibrate ({} runs, seed {seed}) on {}, {} cores",
        runs.len(),
        cpu_model(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    Ok(c)
}

/// The CPU's model name, as Linux reports it.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("model name"))?;
            let name = line.split_once(':')?.1.trim();
            let mhz = t
                .lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split_once(':').and_then(|(_, v)| v.trim().parse::<f64>().ok()));
            Some(match mhz {
                Some(m) => format!("{name} at {:.1} GHz", m / 1000.0),
                None => name.to_string(),
            })
        })
        .unwrap_or_else(|| "an unknown CPU".into())
}

fn columns(
    mix: &[(u16, u32)],
    family: &'static str,
    types: &'static [&'static str],
) -> Vec<(Column, u32)> {
    let attempt0 = hytra_txn::cpu::ATTEMPT[0].index();
    let mut out: Vec<(Column, u32)> = mix
        .iter()
        .map(|&(i, n)| {
            let i = usize::from(i);
            match i.checked_sub(attempt0).filter(|ty| *ty < hytra_txn::cpu::ATTEMPT.len()) {
                Some(ty) => (Column::Attempt(family, types[ty]), n),
                None => (Column::Term(i), n),
            }
        })
        .collect();
    out.sort();
    out
}

/// One run in measured mode: its samples, the attempt table it uses and its types.
fn measure(
    r: &CalRun,
    seed: u64,
    measure_ns: u64,
) -> Result<(CpuSamples, &'static str, &'static [&'static str]), String> {
    struct Go<'a> {
        r: &'a CalRun,
        seed: u64,
        measure_ns: u64,
    }
    impl WorkloadVisitor for Go<'_> {
        type Out = Result<(CpuSamples, &'static str, &'static [&'static str]), String>;
        fn visit<W: Workload>(self, w: &W) -> Self::Out {
            let sc = SimConfig {
                cpu: CpuMode::Measured { scale: 1.0 },
                ..SimConfig::new(self.r.shape, self.seed)
            };
            let mut b = SimCluster::new(sc).map_err(|e| e.to_string())?;
            // The first steps touch fresh memory and take far longer than the rest: only
            // the steps of the measured window are fitted.
            b.keep_cpu_samples_from(self.measure_ns);
            let mut cfg = TxnConfig::preset(self.r.design);
            cfg.replication = cfg.replication.min(self.r.shape.nodes);
            cfg.recovery = Some(hytra_txn::recover::RecoveryParams {
                lease_ns: LEASE_NS,
                ..hytra_txn::recover::RecoveryParams::simulated()
            });
            let params = BenchParams {
                coroutines: self.r.coroutines,
                warmup_ns: self.measure_ns,
                measure_ns: self.measure_ns,
                seed: self.seed,
                check: false,
                // A measured step that was descheduled takes milliseconds of virtual
                // time; calls must outlast it rather than time out and abort.
                rt: RtConfig { rpc_timeout_ns: CALL_TIMEOUT_NS, ..RtConfig::default() },
                drain_ns: DRAIN_NS,
                warm_cache: true,
                timeline_ns: 0,
            };
            let result = run(&mut b, w, cfg, params).map_err(|e| e.to_string())?;
            if result.stats.commits == 0 {
                let s = b.cpu_samples().expect("a measured cluster has samples");
                let worst = s.by_mix.values().flatten().fold(0.0f64, |a, &b| a.max(b));
                return Err(format!(
                    "committed nothing in {} virtual ns ({} steps, the longest {worst:.0} ns; aborts by reason {:?}, {} gave up)",
                    result.run.elapsed_ns, s.steps, result.stats.aborts, result.stats.gave_up
                ));
            }
            let family = attempt_workloads()
                .into_iter()
                .find(|(f, _)| *f == attempt_family(w.name()))
                .map(|(f, _)| f)
                .ok_or_else(|| format!("no attempt table for {}", w.name()))?;
            let samples = b.cpu_samples().expect("a measured cluster has samples");
            Ok((samples, family, w.txn_types()))
        }
    }
    let span_s = 2.0 * measure_ns as f64 / 1e9;
    r.workload.with(span_s, seed, Go { r, seed, measure_ns })
}

/// Sweeps of coordinate descent in the fit; it converges in far fewer for these sizes.
const FIT_SWEEPS_MAX: usize = 20_000;
/// Rounds of reweighting.
const ROBUST_ROUNDS: usize = 8;
/// Huber's constant: residuals beyond this many standard deviations weigh less.
const HUBER_K: f64 = 1.345;

/// The steps of one mix of columns, summarised.
struct Mix {
    /// Column and count.
    x: Vec<(usize, f64)>,
    /// Median time, ns.
    median: f64,
    /// Steps.
    steps: f64,
}

impl Mix {
    fn predict(&self, cost: &[f64]) -> f64 {
        self.x.iter().map(|&(j, c)| c * cost[j]).sum()
    }
}

/// Non-negative weighted least squares by coordinate descent on the normal equations;
/// `fixed` keeps its cost as given. Starts from `cost`.
fn solve(mixes: &[Mix], robust: &[f64], fixed: Option<usize>, cost: &mut [f64]) {
    let k = cost.len();
    let mut q = vec![vec![0.0; k]; k];
    let mut b = vec![0.0; k];
    for (m, r) in mixes.iter().zip(robust) {
        let w = m.steps * r;
        for &(i, xi) in &m.x {
            b[i] += w * xi * m.median;
            for &(j, xj) in &m.x {
                q[i][j] += w * xi * xj;
            }
        }
    }
    for _ in 0..FIT_SWEEPS_MAX {
        let mut moved: f64 = 0.0;
        for j in 0..k {
            if q[j][j] <= 0.0 || Some(j) == fixed {
                continue;
            }
            let grad: f64 = (0..k).map(|i| q[j][i] * cost[i]).sum::<f64>() - b[j];
            let next = (cost[j] - grad / q[j][j]).max(0.0);
            moved = moved.max((next - cost[j]).abs());
            cost[j] = next;
        }
        if moved < 1e-6 {
            break;
        }
    }
}

/// Fits `cost` (non-negative, `fixed` held) to the mixes, iteratively reweighted with
/// Huber's weights: a step that was descheduled (or a mix seen once, at a bad moment)
/// reads ten or a thousand times its cost, and squared errors would let a few such
/// readings set the costs. Returns the final robust weights.
fn robust_fit(mixes: &[Mix], fixed: Option<usize>, cost: &mut [f64]) -> Vec<f64> {
    let mut robust = vec![1.0; mixes.len()];
    if mixes.is_empty() {
        return robust;
    }
    for _ in 0..ROBUST_ROUNDS {
        solve(mixes, &robust, fixed, cost);
        let resid: Vec<f64> = mixes.iter().map(|m| m.median - m.predict(cost)).collect();
        let mut abs: Vec<f64> = resid.iter().map(|r| r.abs()).collect();
        abs.sort_by(f64::total_cmp);
        // The median absolute residual, as a standard deviation of normal errors.
        let sigma = (abs[abs.len() / 2] * 1.4826).max(1.0);
        for (w, r) in robust.iter_mut().zip(&resid) {
            *w = (HUBER_K * sigma / r.abs()).min(1.0);
        }
    }
    robust
}

/// How well `cost` fits: the variance explained counts each mix with its robust weight
/// (readings the fit set aside would swamp it); the median relative error and the
/// ratio of totals count every step. Returns (R^2, median relative error, ratio).
fn quality(mixes: &[Mix], robust: &[f64], cost: &[f64]) -> (f64, f64, f64) {
    let weight: f64 = mixes.iter().zip(robust).map(|(m, r)| m.steps * r).sum();
    let mean = mixes.iter().zip(robust).map(|(m, r)| m.median * m.steps * r).sum::<f64>()
        / weight.max(1e-9);
    let (mut ss_res, mut ss_tot, mut pred_total, mut meas_total) = (0.0, 0.0, 0.0, 0.0);
    let mut rel: Vec<(f64, f64)> = Vec::new();
    for (m, r) in mixes.iter().zip(robust) {
        let (p, y, w) = (m.predict(cost), m.median, m.steps);
        ss_res += w * r * (y - p) * (y - p);
        ss_tot += w * r * (y - mean) * (y - mean);
        pred_total += w * p;
        meas_total += w * y;
        if y > 0.0 {
            rel.push(((p - y).abs() / y, w));
        }
    }
    rel.sort_by(|a, b| a.0.total_cmp(&b.0));
    let half = rel.iter().map(|r| r.1).sum::<f64>() / 2.0;
    let mut acc = 0.0;
    let median_rel = rel
        .iter()
        .find(|r| {
            acc += r.1;
            acc >= half
        })
        .map_or(0.0, |r| r.0);
    let r2 = if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 0.0 };
    let ratio = if meas_total > 0.0 { pred_total / meas_total } else { 0.0 };
    (r2, median_rel, ratio)
}

fn fit(
    rows: BTreeMap<Vec<(Column, u32)>, Vec<f64>>,
    steps: u64,
    runs: usize,
    wall_s: f64,
) -> Calibration {
    let fixed: Vec<CpuTerm> = fixed_terms().collect();
    let mut cols: Vec<Column> = fixed.iter().map(|t| Column::Term(t.index())).collect();
    for (w, types) in attempt_workloads() {
        cols.extend(types.iter().map(|ty| Column::Attempt(w, ty)));
    }
    let at = |c: &Column| cols.iter().position(|x| x == c);
    let mut mixes: Vec<Mix> = Vec::new();
    let mut seen = vec![0u64; cols.len()];
    for (mix, mut times) in rows {
        times.sort_by(f64::total_cmp);
        let x: Vec<(usize, f64)> =
            mix.iter().filter_map(|(c, count)| at(c).map(|j| (j, f64::from(*count)))).collect();
        for &(j, _) in &x {
            seen[j] += times.len() as u64;
        }
        mixes.push(Mix { x, median: times[times.len() / 2], steps: times.len() as f64 });
    }
    // An event-loop iteration alone is the one mix that names a single term: its median
    // is the step's cost, held fixed so that the terms that always come with a step
    // cannot absorb it (every step charges one).
    let step = at(&Column::Term(hytra_rt::config::STEP.index())).expect("the step is a column");
    let pinned = mixes.iter().find(|m| m.x == [(step, 1.0)]).map(|m| m.median);
    let mut cost = vec![0.0; cols.len()];
    if let Some(ns) = pinned {
        cost[step] = ns;
    }
    let robust = robust_fit(&mixes, pinned.map(|_| step), &mut cost);
    let (r2, median_rel_error, total_ratio) = quality(&mixes, &robust, &cost);
    let assumed = CpuProfile::assumed();
    let mut terms = Vec::new();
    let mut profile = CpuProfile { name: "host".into(), ..assumed.clone() };
    let mut unmeasured = Vec::new();
    for (j, c) in cols.iter().enumerate() {
        let (name, was) = match c {
            Column::Term(i) => {
                let t = fixed.iter().find(|t| t.index() == *i).expect("a fixed term");
                (t.name().to_string(), assumed.terms[t.name()])
            }
            Column::Attempt(w, ty) => (format!("attempt.{w}.{ty}"), assumed.attempt[*w][*ty]),
        };
        let ns = if seen[j] == 0 {
            unmeasured.push(name.clone());
            was
        } else {
            // Tenths of a nanosecond are below what a step's reading resolves.
            (cost[j] * 10.0).round() / 10.0
        };
        match c {
            Column::Term(_) => {
                profile.terms.insert(name.clone(), ns);
            }
            Column::Attempt(w, ty) => {
                profile.attempt.get_mut(*w).expect("every workload").insert(ty.to_string(), ns);
            }
        }
        terms.push(TermFit { name, ns, assumed_ns: was, steps: seen[j] });
    }
    let mixes = mixes.len() as u64;
    profile.fit = Some(FitReport { steps, mixes, r2, median_rel_error, total_ratio, unmeasured });
    Calibration { profile, terms, runs, wall_s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_costs_that_generated_the_steps() {
        // Steps made from known costs, with some noise: the fit must find the costs.
        let truth = [("rt.step", 30.0), ("rt.switch", 55.0), ("txn.lock.one-sided", 80.0)];
        let idx = |name: &str| fixed_terms().find(|t| t.name() == name).unwrap().index();
        let mut rows: BTreeMap<Vec<(Column, u32)>, Vec<f64>> = BTreeMap::new();
        let mut rng = hytra_fabric::rng::Rng::new(7);
        for switches in 0..4u32 {
            for locks in 0..3u32 {
                let mut mix = vec![(Column::Term(idx("rt.step")), 1)];
                if switches > 0 {
                    mix.push((Column::Term(idx("rt.switch")), switches));
                }
                if locks > 0 {
                    mix.push((Column::Term(idx("txn.lock.one-sided")), locks));
                }
                mix.sort();
                let y =
                    truth[0].1 + f64::from(switches) * truth[1].1 + f64::from(locks) * truth[2].1;
                let times = (0..101).map(|_| y + (rng.below(21) as f64 - 10.0)).collect();
                rows.insert(mix, times);
            }
        }
        let c = fit(rows, 1212, 1, 0.0);
        for (name, ns) in truth {
            let got = c.profile.terms[name];
            assert!((got - ns).abs() < 2.0, "{name}: fitted {got}, true {ns}");
        }
        let f = c.profile.fit.as_ref().unwrap();
        assert!(f.r2 > 0.99, "{f:?}");
        assert!((f.total_ratio - 1.0).abs() < 0.01, "{f:?}");
        // Terms no step charged keep their assumed cost and are listed.
        assert!(f.unmeasured.contains(&"txn.resync".to_string()));
        assert_eq!(c.profile.terms["txn.resync"], 20.0);
        c.profile.validate().unwrap();
    }
}
