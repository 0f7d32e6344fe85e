//! Whether a `hytra bench` window can report a rate, and the longer window a default one
//! on the simulator is measured again over when it cannot: the same judgement for the
//! command line and for a program that runs benchmarks through this library.
//!
//! A window that held no commit, or less than twice the p99 latency, cut its slowest
//! transactions off, and the rate with them (`hytra_rt::window`). A floor on the commits,
//! as `micro` keeps, would refuse the default TPC-C runs on slow NICs, whose rates are
//! noisy, not biased; so a bench window needs one commit and twice its p99.
//!
//! Not for: running (see `run.rs`) or what the report holds (see `bench.rs`).

use hytra_rt::window::{extend, span_p99};
use hytra_workloads::bench::BenchParams;
use thiserror::Error;

use crate::bench::BenchReport;
use crate::run::RunSpec;
use crate::span::Span;

/// The default window on the simulator.
pub const SIM_DEFAULT_WINDOW_NS: u64 = 10_000_000;

/// How many times [`SIM_DEFAULT_WINDOW_NS`] a default window is lengthened to at most (a
/// TPC-C run on cx3 needs 2 to 4); past that, the run is unstable, and refused.
pub const LENGTHENED_MAX: u64 = 16;

/// What a bench window held, judged for a rate.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Held {
    /// A commit, and at least twice the p99 latency.
    Rate,
    /// No commit, and this many attempts that ended, all aborted.
    AllAborted(u64),
    /// No attempt ended, or the window was shorter than twice the p99 latency.
    TooShort,
}

/// Why a window's rate is not reported. The arguments passed their checks; the run did
/// not measure (exit 1 on the command line, as `micro`, `io` and `offload` refuse theirs).
#[derive(Debug, Error, PartialEq)]
pub enum WindowError {
    /// Not the window's length: every attempt that ended, aborted.
    #[error(
        "no transaction committed in {window}: all {attempts} attempts that ended aborted ({reasons})"
    )]
    AllAborted {
        /// The window.
        window: Span,
        /// Attempts that ended.
        attempts: u64,
        /// Aborts per reason, as `reason count, ...`.
        reasons: String,
    },
    /// No commit, or less than twice the p99 latency.
    #[error(
        "the window is too short to measure a rate: {committed} transactions committed in {window} (at least one is needed, and a window of twice the p99 latency, {p99}); give a longer --duration"
    )]
    TooShort {
        /// Commits in the window.
        committed: u64,
        /// The window.
        window: Span,
        /// Their p99 latency, or `none`.
        p99: String,
    },
}

/// Why the memory a run needs is refused.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "the run needs about {} MiB of memory and {} MiB are available; use a smaller database, or fewer nodes or workers",
    need >> 20,
    available >> 20
)]
pub struct MemoryError {
    /// Bytes the run needs.
    pub need: u64,
    /// Bytes available.
    pub available: u64,
}

impl BenchReport {
    /// The report's p99 latency, ns.
    pub fn p99_ns(&self) -> u64 {
        (self.latency_us.p99 * 1e3).round() as u64
    }

    /// The report's window, ns.
    pub fn window_ns(&self) -> u64 {
        (self.seconds * 1e9).round() as u64
    }

    /// What the window held.
    pub fn held(&self) -> Held {
        let aborts: u64 = self.aborts.values().sum();
        match self.committed {
            0 if aborts > 0 => Held::AllAborted(aborts),
            0 => Held::TooShort,
            _ if span_p99(self.window_ns(), self.p99_ns()) => Held::Rate,
            _ => Held::TooShort,
        }
    }

    /// Whether the run passed its correctness checks: the checker (if it ran) and the
    /// workload's invariants. A failed one stands whatever the window.
    pub fn correct(&self) -> bool {
        (!self.checker.checked || self.checker.serializable == Some(true)) && self.invariant_ok
    }

    /// The report's rate may be printed: its window held a commit and twice the p99.
    pub fn settled(&self) -> Result<(), WindowError> {
        let window = Span::from_ns(self.window_ns().max(1));
        match self.held() {
            Held::Rate => Ok(()),
            Held::AllAborted(attempts) => Err(WindowError::AllAborted {
                window,
                attempts,
                reasons: self
                    .aborts
                    .iter()
                    .map(|(why, n)| format!("{why} {n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
            Held::TooShort => Err(WindowError::TooShort {
                committed: self.committed,
                window,
                p99: match self.committed {
                    0 => "none".to_string(),
                    _ => Span::from_ns(self.p99_ns().max(1)).to_string(),
                },
            }),
        }
    }

    /// Why a window is measured again, for the line that says so.
    pub fn shortfall(&self) -> String {
        match self.committed {
            0 => "held no commit".to_string(),
            _ => format!(
                "held less than twice the p99 latency ({})",
                Span::from_ns(self.p99_ns().max(1))
            ),
        }
    }
}

impl RunSpec {
    /// Refuses a run that would take more than four fifths of the memory this machine
    /// has available (when it says).
    pub fn check_memory(&self) -> Result<(), MemoryError> {
        let need = self.memory_bytes();
        match available_memory() {
            Some(available) if need > available / 10 * 8 => Err(MemoryError { need, available }),
            _ => Ok(()),
        }
    }

    /// The same run over a longer window, after `reruns` runs of this one on the
    /// simulator whose window held no commit (and no abort) or less than twice the p99
    /// latency `r` reports, up to [`LENGTHENED_MAX`] times [`SIM_DEFAULT_WINDOW_NS`], and
    /// only while the longer run still validates and fits in memory (TPC-C's orders and
    /// YCSB's inserts grow with it). `None`: judge `r` as it is (always on a real
    /// backend, whose window is real time). A window a user gave and one with crashes
    /// timed in it are the caller's not to lengthen: `hytra bench` asks only for its
    /// default window.
    pub fn lengthened(&self, r: &BenchReport, reruns: u32) -> Option<RunSpec> {
        if !self.backend.is_sim() || !r.correct() || r.held() != Held::TooShort {
            return None;
        }
        let measure_ns = self.params.measure_ns;
        // A bench window needs one commit, not micro's thousand: ask for what p99 asks (or
        // grow as an empty window does).
        let ops = if r.committed == 0 { 0 } else { u64::MAX };
        let max_ns = SIM_DEFAULT_WINDOW_NS * LENGTHENED_MAX;
        let longer = extend(measure_ns, ops, r.p99_ns(), reruns, max_ns)?;
        let warmup_ns = hytra_rt::window::scaled(self.params.warmup_ns, measure_ns, longer);
        let mut next = self.clone();
        next.params = BenchParams { measure_ns: longer, warmup_ns, ..self.params };
        (next.validate().is_ok() && next.check_memory().is_ok()).then_some(next)
    }
}

/// Memory this machine has available (`MemAvailable`), in bytes, if it says.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use hytra_fabric::sim::SimConfig;
    use hytra_fabric::ClusterShape;
    use hytra_txn::{Design, TxnConfig};

    use super::*;
    use crate::backend::BackendSpec;
    use crate::bench::BenchSetup;
    use crate::workload::WorkloadSpec;

    /// SmallBank on a simulated 3 x 1 cluster, checked, measured over `measure_ns`.
    pub(crate) fn spec(measure_ns: u64) -> RunSpec {
        let shape = ClusterShape { nodes: 3, workers_per_node: 1, lanes_per_peer: 1 };
        RunSpec {
            backend: BackendSpec::Sim(Box::new(SimConfig::new(shape, 7))),
            workload: WorkloadSpec::SmallBank { accounts_per_worker: 1_000 },
            txn: TxnConfig::preset(Design::DrtmH),
            params: BenchParams {
                coroutines: 4,
                measure_ns,
                warmup_ns: measure_ns / 10,
                seed: 7,
                check: true,
                rt: hytra_rt::RtConfig::default(),
                drain_ns: 1_000_000_000,
                warm_cache: true,
                timeline_ns: 0,
            },
        }
    }

    /// The report of a run of `spec`.
    pub(crate) fn report(spec: &RunSpec) -> BenchReport {
        let o = crate::run(spec, crate::run::Watch::default()).unwrap().unwrap();
        let setup = BenchSetup {
            workload: o.workload,
            backend: "sim",
            shape: spec.backend.shape(),
            seed: spec.params.seed,
            seconds: spec.params.measure_ns as f64 / 1e9,
            cfg: &spec.txn,
            params: &spec.params,
            sim: Some(("cx4", "paper")),
            ucx: None,
            types: o.txn_types,
        };
        BenchReport::new(&setup, &o.result, Duration::ZERO)
    }

    /// A window far shorter than a transaction holds no commit: it is refused with the
    /// reason, and lengthened step by step (growing, bounded) to one that settles.
    #[test]
    fn a_short_window_is_refused_or_lengthened_until_it_settles() {
        let mut s = spec(2_000);
        let mut r = report(&s);
        assert_eq!(r.held(), Held::TooShort);
        let e = r.settled().unwrap_err();
        assert!(matches!(e, WindowError::TooShort { committed: 0, .. }), "{e}");
        assert!(e.to_string().contains("2µs"), "{e}");
        let mut reruns = 0;
        while let Some(next) = s.lengthened(&r, reruns) {
            assert!(next.params.measure_ns > s.params.measure_ns);
            assert!(next.params.measure_ns <= SIM_DEFAULT_WINDOW_NS * LENGTHENED_MAX);
            (s, r, reruns) = (next.clone(), report(&next), reruns + 1);
        }
        assert!(reruns > 0, "a window without a commit is lengthened");
        assert_eq!(r.held(), Held::Rate, "after {reruns} reruns: {}", r.shortfall());
        assert_eq!(r.settled(), Ok(()));
        assert!(r.correct());
    }

    /// A report that failed its checks is judged as it is, never measured again.
    #[test]
    fn a_failed_check_is_not_lengthened() {
        let s = spec(2_000);
        let mut r = report(&s);
        r.invariant_ok = false;
        assert!(!r.correct());
        assert!(s.lengthened(&r, 0).is_none());
    }

    #[test]
    fn every_abort_reason_is_named_when_nothing_committed() {
        let mut r = report(&spec(2_000));
        r.aborts = [("lock".to_string(), 3), ("validation".to_string(), 2)].into();
        assert_eq!(r.held(), Held::AllAborted(5));
        let e = r.settled().unwrap_err().to_string();
        assert!(e.contains("all 5 attempts") && e.contains("lock 3, validation 2"), "{e}");
    }
}
