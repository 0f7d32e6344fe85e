//! Running one [`Worker`] per endpoint of a backend: the glue tests, benchmarks and the
//! engine use to start a cluster.

use hytra_fabric::{Backend, BackendError, RunLimits, RunStats};

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
    backend.run(
        |ep: B::Ep| {
            let mut w = Worker::new(ep, cfg);
            setup(&mut w);
            w
        },
        |w: Worker<B::Ep>| WorkerReport { stats: w.stats(), leaked: w.leaked() },
        limits,
    )
}

/// The endpoint type of a backend, for signatures of generic setup code.
pub type EpOf<B> = <B as Backend>::Ep;
