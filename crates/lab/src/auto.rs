//! `--design auto` by trial: each candidate configuration runs the workload briefly on a
//! fresh cluster of the same backend, and the fastest is chosen; then, phase by phase,
//! the primitives the fastest did not use are tried in its place, and a change that runs
//! clearly faster is kept. Trials time the engine itself, so whatever the fabric
//! emulates is in them (a choice from bare primitive latencies picks wrongly over TCP:
//! docs/PERFORMANCE.md §26). Not for: which candidates there are (the caller's options
//! decide) or the run that follows.

use hytra_txn::{ExecStrategy, LockStrategy, Primitive, TxnConfig};
use hytra_workloads::bench::{BenchError, BenchParams};

use crate::bench::{AutoReport, TrialReport};
use crate::run::{run, RunSpec, Watch};

/// A trial's measured window on the simulator: thousands of transactions of the slowest
/// workload.
pub const AUTO_TRIAL_SIM_NS: u64 = 2_000_000;
/// A trial's measured window in real time: a few round trips of every coroutine over TCP.
pub const AUTO_TRIAL_REAL_NS: u64 = 500_000_000;

/// How much faster than the best so far a one-phase change must run in its trial to be
/// kept: on the simulator trials replay exactly, but a short trial ranks configurations
/// within a few percent of a longer run; real-time trials on a shared host vary by about
/// 10% from run to run (PERFORMANCE §27), and a change within that is noise.
pub fn refine_margin(sim: bool) -> f64 {
    if sim {
        1.02
    } else {
        1.10
    }
}

/// Passes over the phases at most: a pass that keeps no change ends the search.
const REFINE_PASSES_MAX: usize = 2;

/// Whether `--design auto` also tries each phase's other primitives.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Refine {
    /// Only the candidates given.
    Off,
    /// The candidates, then one phase at a time from the fastest.
    Phases,
}

/// A trial that did not finish.
#[derive(Debug, thiserror::Error)]
pub enum AutoError {
    /// The candidate's parameters were refused: the whole run would be too.
    #[error("{0}")]
    Params(String),
    /// The candidate's trial failed while running (the cause is the source, not part of
    /// the message, so that a printed chain names it once).
    #[error("--design auto: the trial of {label} failed")]
    Trial {
        /// The candidate.
        label: String,
        /// Why.
        #[source]
        source: BenchError,
    },
}

/// Runs each of `candidates` (labelled) for a short trial of `spec`'s workload on a fresh
/// cluster of its backend, without its crashes, history checks or timeline, and takes the
/// fastest (the first of them on a tie, so that a tie keeps the earlier candidate). With
/// [`Refine::Phases`] it then tries, one phase at a time, each primitive the fastest does
/// not use (execution, locking, validation, logging, commit; offloaded execution is left
/// to those who ask for it), and keeps a change that beats the best so far by
/// [`refine_margin`]. Returns the configuration chosen with every trial. `warmup` is the
/// fraction of the window warmed up before it; `told` hears of each trial as it ends,
/// with its window in ns. On the simulator the trials replay from the seed like the run
/// itself. `spec` must not be spread over processes (each would choose on its own).
pub fn pick_design(
    spec: &RunSpec,
    candidates: Vec<(String, TxnConfig)>,
    refine: Refine,
    warmup: f64,
    mut told: impl FnMut(&TrialReport, u64),
) -> Result<(TxnConfig, AutoReport), AutoError> {
    assert!(!candidates.is_empty(), "--design auto needs a candidate");
    assert!(!spec.backend.spread(), "--design auto runs its trials within one process");
    let sim = spec.backend.is_sim();
    let asked = if sim { AUTO_TRIAL_SIM_NS } else { AUTO_TRIAL_REAL_NS };
    let measure_ns = asked.min(spec.params.measure_ns);
    let params = BenchParams {
        measure_ns,
        warmup_ns: (measure_ns as f64 * warmup).round() as u64,
        check: false,
        timeline_ns: 0,
        ..spec.params
    };
    let backend = spec.backend.without_node_faults();
    let mut trials: Vec<TrialReport> = Vec::new();
    let mut trial = |label: String, txn: TxnConfig| -> Result<f64, AutoError> {
        let trial =
            RunSpec { backend: backend.clone(), workload: spec.workload.clone(), txn, params };
        let outcome = run(&trial, Watch::default()).map_err(|e| match e {
            BenchError::Params(m) => AutoError::Params(m),
            source => AutoError::Trial { label: label.clone(), source },
        })?;
        let Some(o) = outcome else {
            unreachable!("a run within one process reports");
        };
        let tps = o.result.stats.commits as f64 / (measure_ns as f64 / 1e9);
        let t = TrialReport { candidate: label, throughput_tps: tps };
        told(&t, measure_ns);
        trials.push(t);
        Ok(tps)
    };
    // The cache a cached execution gets where the best candidate keeps none: the
    // largest any candidate has (the caller's, or the default).
    let cache_bytes = candidates.iter().map(|c| c.1.cache_bytes).max().unwrap_or(0);
    let mut best: Option<(String, TxnConfig, f64)> = None;
    let mut tried = Vec::new();
    for (label, txn) in candidates {
        let tps = trial(label.clone(), txn)?;
        tried.push(txn);
        if best.as_ref().is_none_or(|b| tps > b.2) {
            best = Some((label, txn, tps));
        }
    }
    let (mut label, mut txn, mut tps) = best.expect("at least one candidate");
    if refine == Refine::Phases {
        let nodes = spec.backend.shape().nodes;
        for _ in 0..REFINE_PASSES_MAX {
            // Each pass tries the changes of one configuration, and keeps the fastest
            // of those that beat the best so far by the margin.
            let (base_label, base) = (label.clone(), txn);
            for (change, alt) in one_phase_changes(&base, cache_bytes) {
                if tried.contains(&alt) || alt.check(nodes).is_err() {
                    continue;
                }
                tried.push(alt);
                let alt_label = format!("{base_label}, {change}");
                let alt_tps = trial(alt_label.clone(), alt)?;
                if alt_tps > tps * refine_margin(sim) {
                    (label, txn, tps) = (alt_label, alt, alt_tps);
                }
            }
            if txn == base {
                break;
            }
        }
    }
    Ok((txn, AutoReport { chose: label, trials }))
}

/// Every configuration that differs from `c` in one phase's primitive, labelled with the
/// change (`lock two-sided`). A cached execution gets `cache_bytes` of cache where `c`
/// keeps none.
fn one_phase_changes(c: &TxnConfig, cache_bytes: u64) -> Vec<(String, TxnConfig)> {
    let mut out = Vec::new();
    for &exec in ExecStrategy::ALL.iter().filter(|&&e| e != ExecStrategy::Offload) {
        if exec != c.exec {
            let cache =
                if exec.needs_cache() && c.cache_bytes == 0 { cache_bytes } else { c.cache_bytes };
            out.push((
                format!("exec {}", exec.name()),
                TxnConfig { exec, cache_bytes: cache, ..*c },
            ));
        }
    }
    for &lock in LockStrategy::ALL.iter().filter(|&&l| l != c.lock) {
        out.push((format!("lock {}", lock.name()), TxnConfig { lock, ..*c }));
    }
    let other = |p: Primitive| match p {
        Primitive::OneSided => Primitive::TwoSided,
        Primitive::TwoSided => Primitive::OneSided,
    };
    let (validate, log, commit) = (other(c.validate), other(c.log), other(c.commit));
    out.push((format!("validate {}", validate.name()), TxnConfig { validate, ..*c }));
    out.push((format!("log {}", log.name()), TxnConfig { log, ..*c }));
    out.push((format!("commit {}", commit.name()), TxnConfig { commit, ..*c }));
    out
}

#[cfg(test)]
mod tests {
    use hytra_txn::{Design, TxnConfig};

    use super::*;

    /// SmallBank on a simulated 3 x 1 cluster over 300 µs.
    fn spec() -> RunSpec {
        crate::judge::tests::spec(300_000)
    }

    #[test]
    fn the_fastest_trial_wins_and_every_trial_is_told() {
        let candidates: Vec<(String, TxnConfig)> = [Design::DrtmH, Design::Fasst]
            .iter()
            .map(|&d| (d.name().to_string(), TxnConfig::preset(d)))
            .collect();
        let mut heard = Vec::new();
        let (txn, report) = pick_design(&spec(), candidates.clone(), Refine::Off, 0.1, |t, ns| {
            heard.push((t.candidate.clone(), ns));
        })
        .unwrap();
        // The window is the run's own when shorter than a trial's.
        assert_eq!(heard, vec![("drtmh".to_string(), 300_000), ("fasst".to_string(), 300_000)]);
        assert_eq!(report.trials.len(), 2);
        let best = report
            .trials
            .iter()
            .max_by(|a, b| a.throughput_tps.total_cmp(&b.throughput_tps))
            .unwrap();
        assert!(best.throughput_tps > 0.0);
        assert_eq!(report.chose, best.candidate);
        let chosen = candidates.iter().find(|(l, _)| *l == report.chose).unwrap().1;
        assert_eq!(txn, chosen);
        // Trials on the simulator replay from the seed.
        let (_, again) = pick_design(&spec(), candidates, Refine::Off, 0.1, |_, _| {}).unwrap();
        assert_eq!(again, report);
    }

    #[test]
    fn a_tie_keeps_the_earlier_candidate() {
        let same = TxnConfig::preset(Design::Fasst);
        let candidates = vec![("first".to_string(), same), ("second".to_string(), same)];
        let (_, report) = pick_design(&spec(), candidates, Refine::Off, 0.1, |_, _| {}).unwrap();
        assert_eq!(report.trials[0].throughput_tps, report.trials[1].throughput_tps);
        assert_eq!(report.chose, "first");
    }

    /// TPC-C New-Order on cx4, whose NIC atomics are not coherent with the CPU's: a
    /// one-sided lock takes even a local record's lock through the NIC, and New-Order
    /// writes mostly its own warehouse (PERFORMANCE §26). From drtmh alone, the search
    /// keeps two-sided locks, and every trial differs from the best in one phase.
    #[test]
    fn the_phase_search_keeps_what_runs_clearly_faster() {
        let mut spec = spec();
        spec.workload = crate::WorkloadSpec::Tpcc {
            mix: hytra_workloads::tpcc::TpccMix::NewOrderOnly,
            warehouses_per_worker: 1,
            customers: 60,
            items: 2_000,
            remote_item_pct: 1,
        };
        spec.params.measure_ns = AUTO_TRIAL_SIM_NS;
        let drtmh = TxnConfig::preset(Design::DrtmH);
        let candidates = vec![("drtmh".to_string(), drtmh)];
        let mut heard = Vec::new();
        let (txn, report) =
            pick_design(&spec, candidates, Refine::Phases, 0.1, |t, _| heard.push(t.clone()))
                .unwrap();
        assert_eq!(txn, TxnConfig { lock: LockStrategy::TwoSided, ..drtmh }, "{report:?}");
        assert_eq!(report.chose, "drtmh, lock two-sided");
        assert_eq!(heard, report.trials);
        let rate = |label: &str| {
            report.trials.iter().find(|t| t.candidate == label).unwrap().throughput_tps
        };
        assert!(rate("drtmh, lock two-sided") > rate("drtmh") * refine_margin(true));
        // A second pass starts from the change kept, and keeps no other; no
        // configuration is tried twice (drtmh itself is not tried again).
        let kept = rate("drtmh, lock two-sided");
        let second: Vec<&TrialReport> = report
            .trials
            .iter()
            .filter(|t| t.candidate.starts_with("drtmh, lock two-sided, "))
            .collect();
        assert!(second.len() >= 4, "{report:?}");
        assert!(second.iter().all(|t| t.throughput_tps <= kept * refine_margin(true)));
        assert!(!report
            .trials
            .iter()
            .any(|t| t.candidate == "drtmh, lock two-sided, lock one-sided"));
        let mut labels: Vec<&str> = report.trials.iter().map(|t| t.candidate.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), report.trials.len(), "a label names one configuration");
        for (change, alt) in one_phase_changes(&drtmh, drtmh.cache_bytes) {
            let differs = [
                alt.exec != drtmh.exec,
                alt.lock != drtmh.lock,
                alt.validate != drtmh.validate,
                alt.log != drtmh.log,
                alt.commit != drtmh.commit,
            ];
            assert_eq!(differs.iter().filter(|&&d| d).count(), 1, "{change}");
        }
    }
}
