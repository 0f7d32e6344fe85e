//! Running one [`Worker`] per endpoint of a backend: the glue tests, benchmarks and the
//! engine use to start a cluster.

use hytra_fabric::{Backend, BackendError, Program, RunLimits, RunStats, Step};

use crate::config::RtConfig;
use crate::worker::{Worker, WorkerStats};

/// What [`run_workers`] returns for each worker.
#[derive(Clone, Debug)]
pub struct WorkerReport {
    /// The worker's counters.
    pub stats: WorkerStats,
    /// Tickets and calls its coroutines issued but never collected.
    pub leaked: usize,
}

/// Builds a worker on every endpoint of `backend`, lets `setup` spawn its coroutines and
/// register its handlers, and runs the cluster until every coroutine has finished or the
/// time limit passes.
pub fn run_workers<B, S>(
    backend: &mut B,
    cfg: RtConfig,
    limits: RunLimits,
    setup: S,
) -> Result<(Vec<WorkerReport>, RunStats), BackendError>
where
    B: Backend,
    S: Fn(&mut Worker<B::Ep>) + Sync,
{
    run_workers_with(backend, cfg, limits, setup, |w, ()| WorkerReport {
        stats: w.stats(),
        leaked: w.leaked(),
    })
}

/// As [`run_workers`], with per-worker state: `setup` returns a value that stays with the
/// worker (on its thread) and `finish` turns the finished worker and that value into the
/// worker's result.
pub fn run_workers_with<B, T, R, S, F>(
    backend: &mut B,
    cfg: RtConfig,
    limits: RunLimits,
    setup: S,
    finish: F,
) -> Result<(Vec<R>, RunStats), BackendError>
where
    B: Backend,
    R: Send,
    S: Fn(&mut Worker<B::Ep>) -> T + Sync,
    F: Fn(Worker<B::Ep>, T) -> R + Sync,
{
    backend.run(
        |ep: B::Ep| {
            let mut w = Worker::new(ep, cfg);
            let state = setup(&mut w);
            WithState { worker: w, state }
        },
        |p: WithState<B::Ep, T>| finish(p.worker, p.state),
        limits,
    )
}

/// A worker and the state its setup returned.
struct WithState<E: hytra_fabric::Endpoint, T> {
    worker: Worker<E>,
    state: T,
}

impl<E: hytra_fabric::Endpoint + 'static, T> Program for WithState<E, T> {
    fn step(&mut self) -> Step {
        self.worker.step()
    }

    fn is_done(&self) -> bool {
        self.worker.is_done()
    }
}

/// The endpoint type of a backend, for signatures of generic setup code.
pub type EpOf<B> = <B as Backend>::Ep;
