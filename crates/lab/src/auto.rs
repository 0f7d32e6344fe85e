//! `--design auto` by trial: each candidate configuration runs the workload briefly on a
//! fresh cluster of the same backend, and the fastest is chosen. Not for: which
//! candidates there are (the caller's options decide) or the run that follows.

use hytra_txn::TxnConfig;
use hytra_workloads::bench::{BenchError, BenchParams};

use crate::bench::{AutoReport, TrialReport};
use crate::run::{run, RunSpec};

/// A trial's measured window on the simulator: thousands of transactions of the slowest
/// workload.
pub const AUTO_TRIAL_SIM_NS: u64 = 2_000_000;
/// A trial's measured window in real time: a few round trips of every coroutine over TCP.
pub const AUTO_TRIAL_REAL_NS: u64 = 500_000_000;

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
/// cluster of its backend, without its crashes, history checks or timeline, and returns
/// the fastest (the first of them on a tie, so that a tie keeps the earlier candidate)
/// with every trial. `warmup` is the fraction of the window warmed up before it; `told`
/// hears of each trial as it ends, with its window in ns. On the simulator the trials
/// replay from the seed like the run itself. `spec` must not be spread over processes
/// (each would choose on its own).
pub fn pick_design(
    spec: &RunSpec,
    candidates: Vec<(String, TxnConfig)>,
    warmup: f64,
    mut told: impl FnMut(&TrialReport, u64),
) -> Result<(TxnConfig, AutoReport), AutoError> {
    assert!(!candidates.is_empty(), "--design auto needs a candidate");
    assert!(!spec.backend.spread(), "--design auto runs its trials within one process");
    let asked = if spec.backend.is_sim() { AUTO_TRIAL_SIM_NS } else { AUTO_TRIAL_REAL_NS };
    let measure_ns = asked.min(spec.params.measure_ns);
    let params = BenchParams {
        measure_ns,
        warmup_ns: (measure_ns as f64 * warmup).round() as u64,
        check: false,
        timeline_ns: 0,
        ..spec.params
    };
    let backend = spec.backend.without_node_faults();
    let mut trials = Vec::with_capacity(candidates.len());
    for (label, txn) in candidates {
        let trial =
            RunSpec { backend: backend.clone(), workload: spec.workload.clone(), txn, params };
        let outcome = run(&trial, None).map_err(|e| match e {
            BenchError::Params(m) => AutoError::Params(m),
            source => AutoError::Trial { label: label.clone(), source },
        })?;
        let Some(o) = outcome else {
            unreachable!("a run within one process reports");
        };
        let tps = o.result.stats.commits as f64 / (measure_ns as f64 / 1e9);
        let t = TrialReport { candidate: label, throughput_tps: tps };
        told(&t, measure_ns);
        trials.push((t, txn));
    }
    let best = trials
        .iter()
        .enumerate()
        .max_by(|(i, x), (j, y)| x.0.throughput_tps.total_cmp(&y.0.throughput_tps).then(j.cmp(i)))
        .map(|(i, _)| i)
        .expect("at least one candidate");
    let txn = trials[best].1;
    let chose = trials[best].0.candidate.clone();
    Ok((txn, AutoReport { chose, trials: trials.into_iter().map(|t| t.0).collect() }))
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
        let (txn, report) = pick_design(&spec(), candidates.clone(), 0.1, |t, ns| {
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
        let (_, again) = pick_design(&spec(), candidates, 0.1, |_, _| {}).unwrap();
        assert_eq!(again, report);
    }

    #[test]
    fn a_tie_keeps_the_earlier_candidate() {
        let same = TxnConfig::preset(Design::Fasst);
        let candidates = vec![("first".to_string(), same), ("second".to_string(), same)];
        let (_, report) = pick_design(&spec(), candidates, 0.1, |_, _| {}).unwrap();
        assert_eq!(report.trials[0].throughput_tps, report.trials[1].throughput_tps);
        assert_eq!(report.chose, "first");
    }
}
