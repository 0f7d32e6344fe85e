//! Test support shared by the crates above: a backend builder for tests, and
//! [`Script`], a program that drives an endpoint with a plain closure until it says done.
//!
//! The conformance suite (`tests/conformance.rs`) is generic over [`TestBackend`], so one
//! suite runs against every backend.

use crate::endpoint::{Backend, Program, RunLimits, RunStats, Step};
use crate::ids::ClusterShape;
use crate::local::{LocalCluster, LocalConfig};
use crate::sim::{SimCluster, SimConfig};

/// A backend the shared test suites can build.
pub trait TestBackend: Backend + Sized {
    /// Name for messages.
    const NAME: &'static str;
    /// A fresh cluster of `shape` (the seed matters to the simulator only).
    fn for_test(shape: ClusterShape, seed: u64) -> Self;
    /// A time limit generous enough for small tests: virtual for the simulator, wall
    /// time for threads.
    fn test_time_limit_ns() -> u64;
}

impl TestBackend for SimCluster {
    const NAME: &'static str = "sim";
    fn for_test(shape: ClusterShape, seed: u64) -> Self {
        SimCluster::new(SimConfig::new(shape, seed)).expect("valid test cluster")
    }
    fn test_time_limit_ns() -> u64 {
        100_000_000
    }
}

impl TestBackend for LocalCluster {
    const NAME: &'static str = "local";
    fn for_test(shape: ClusterShape, _seed: u64) -> Self {
        LocalCluster::new(LocalConfig::new(shape)).expect("valid test cluster")
    }
    fn test_time_limit_ns() -> u64 {
        30_000_000_000
    }
}

#[cfg(feature = "ucx")]
impl TestBackend for crate::ucx::UcxCluster {
    const NAME: &'static str = "ucx";
    /// Every node in this process, over the transports in `HYTRA_UCX_TLS` (default
    /// `sm`: shared memory); `HYTRA_UCX_ORDER=flush` forces the strictest ordering on
    /// every connection (the path of endpoints with RMA and atomics on different lanes);
    /// `HYTRA_UCX_WAIT=event` makes idle threads sleep on UCX's event fds (after
    /// [`EVENT_SPIN`](crate::ucx::EVENT_SPIN) of idleness).
    fn for_test(shape: ClusterShape, _seed: u64) -> Self {
        let mut config = crate::ucx::UcxConfig::new(shape);
        config.transports =
            Some(std::env::var("HYTRA_UCX_TLS").unwrap_or_else(|_| "sm".to_string()));
        if std::env::var("HYTRA_UCX_ORDER").is_ok_and(|o| o == "flush") {
            config.ordering = crate::ucx::UcxOrdering::Flush;
        }
        if std::env::var("HYTRA_UCX_WAIT").is_ok_and(|w| w == "event") {
            config.waiting = crate::ucx::UcxWaiting::EVENT;
        }
        crate::ucx::UcxCluster::new(config).expect("UCX test cluster")
    }
    fn test_time_limit_ns() -> u64 {
        60_000_000_000
    }
}

/// A program that calls `f` on every step until it returns true.
pub struct Script<E, F> {
    ep: E,
    f: F,
    done: bool,
}

impl<E, F: FnMut(&mut E) -> bool> Script<E, F> {
    /// A script over `ep`.
    pub fn new(ep: E, f: F) -> Self {
        Script { ep, f, done: false }
    }
}

impl<E, F: FnMut(&mut E) -> bool> Program for Script<E, F> {
    fn step(&mut self) -> Step {
        if self.done {
            return Step::Idle { wake_at_ns: None, progressed: false };
        }
        self.done = (self.f)(&mut self.ep);
        if self.done {
            Step::Idle { wake_at_ns: None, progressed: true }
        } else {
            Step::Busy
        }
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

/// Runs one script per worker (built by `make` from the endpoint) and checks that all
/// finished within the backend's test time limit.
pub fn run_scripts<B, F, M>(backend: &mut B, make: M) -> RunStats
where
    B: TestBackend,
    F: FnMut(&mut B::Ep) -> bool,
    M: Fn(&B::Ep) -> F + Sync,
{
    let limits = RunLimits { time_limit_ns: B::test_time_limit_ns() };
    let (_, stats) = backend
        .run(
            |ep| {
                let f = make(&ep);
                Script::new(ep, f)
            },
            |_| (),
            limits,
        )
        .expect("test cluster runs");
    assert!(stats.all_done, "{}: scripts did not finish within the time limit", B::NAME);
    stats
}
