//! One run of a transactional workload: a backend, a workload, the engine's
//! configuration and the run's parameters in, the measured and judged result out.
//! Not for: choosing what to run (the command line and the swarm do) or printing it.

use hytra_fabric::{Backend, ClusterShape};
use hytra_offload::lookup::Redn;
use hytra_store::{Catalog, NodeStore};
use hytra_txn::{ExecStrategy, NicLookups, TxnConfig, SCRATCH_CO_BYTES};
use hytra_workloads::bench::{run_partial_in, BenchError, BenchParams, BenchResult, Workload};

use crate::backend::{BackendSpec, BackendVisitor, Progress};
use crate::workload::{WorkloadSpec, WorkloadVisitor};

/// Everything one run needs.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// The fabric.
    pub backend: BackendSpec,
    /// The workload.
    pub workload: WorkloadSpec,
    /// How transactions run.
    pub txn: TxnConfig,
    /// Window, seed, coroutines, checks.
    pub params: BenchParams,
}

/// What a run measured and found, whatever its workload.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Counters, checker and invariants (the workloads' own per-worker reports dropped).
    pub result: BenchResult<()>,
    /// The workload's transaction type names (index = type id).
    pub txn_types: &'static [&'static str],
    /// The workload's name.
    pub workload: &'static str,
}

impl RunSpec {
    /// Seconds the run spans (warm-up and window), in the backend's clock.
    pub fn span_s(&self) -> f64 {
        (self.params.warmup_ns + self.params.measure_ns) as f64 / 1e9
    }

    /// Bytes of memory the run touches, all nodes of this process together: the stores as
    /// loaded, logs, scratch, location caches and NIC indexes. Refused parameters (the
    /// run would refuse them too) count as 0.
    pub fn memory_bytes(&self) -> u64 {
        struct Estimate<'a>(&'a RunSpec);
        impl WorkloadVisitor for Estimate<'_> {
            type Out = u64;
            fn visit<W: Workload>(self, w: &W) -> u64 {
                let spec = self.0;
                let shape = spec.backend.shape();
                memory_needed(w, shape, &spec.txn, spec.params.coroutines)
            }
        }
        self.workload.with(self.span_s(), self.params.seed, Estimate(self))
    }

    /// Checks the cluster's shape, the engine's configuration and the workload's
    /// parameters against the cluster (before anything is built).
    pub fn validate(&self) -> Result<(), String> {
        struct Check(ClusterShape);
        impl WorkloadVisitor for Check {
            type Out = Result<(), String>;
            fn visit<W: Workload>(self, w: &W) -> Result<(), String> {
                w.validate(self.0)
            }
        }
        let shape = self.backend.shape();
        hytra_fabric::validate_shape(shape).map_err(|e| e.to_string())?;
        self.txn.check(shape.nodes).map_err(|e| e.to_string())?;
        self.workload.with(self.span_s(), self.params.seed, Check(shape))
    }
}

/// Bytes of memory a run of `w` touches on a cluster of `shape` (all nodes).
pub fn memory_needed<W: Workload>(
    w: &W,
    shape: ClusterShape,
    cfg: &TxnConfig,
    coroutines: u16,
) -> u64 {
    let Ok(catalog) = Catalog::new(w.tables(shape), shape.nodes, cfg.replication) else {
        return 0;
    };
    let store = w.store_bytes(&catalog, shape);
    let log = shape.workers_total() as u64 * cfg.log_ring_bytes;
    let scratch = u64::from(shape.workers_per_node) * u64::from(coroutines) * SCRATCH_CO_BYTES;
    let cache = NodeStore::cache_bytes(&catalog, cfg.cache_bytes);
    let nic = match cfg.exec {
        ExecStrategy::Offload => {
            NicLookups::bytes_per_node(&catalog, shape.workers_per_node, coroutines, &Redn)
                .expect("the lookup program builds")
        }
        _ => 0,
    };
    (store + log + scratch + cache + nic) * u64::from(shape.nodes)
}

/// Runs `spec`: `Ok(None)` on a process of a cluster spread over processes that is not
/// the first (the first reports for everyone). `progress` gets the virtual time while a
/// simulation runs.
pub fn run(spec: &RunSpec, progress: Option<Progress>) -> Result<Option<Outcome>, BenchError> {
    struct OnBackend<'a> {
        spec: &'a RunSpec,
    }
    impl BackendVisitor for OnBackend<'_> {
        type Out = Result<Option<Outcome>, BenchError>;
        fn visit<B: Backend>(self, b: &mut B) -> Self::Out {
            let s = self.spec;
            s.workload.with(s.span_s(), s.params.seed, OnWorkload { spec: s, backend: b })
        }
    }
    struct OnWorkload<'a, B> {
        spec: &'a RunSpec,
        backend: &'a mut B,
    }
    impl<B: Backend> WorkloadVisitor for OnWorkload<'_, B> {
        type Out = Result<Option<Outcome>, BenchError>;
        fn visit<W: Workload>(self, w: &W) -> Self::Out {
            let procs = self.spec.backend.processes();
            let r = run_partial_in(self.backend, w, self.spec.txn, self.spec.params, procs)?;
            Ok(r.map(|r| Outcome {
                result: BenchResult {
                    stats: r.stats,
                    rt: r.rt,
                    reports: vec![(); r.reports.len()],
                    checker: r.checker,
                    invariant: r.invariant,
                    run: r.run,
                    window_ns: r.window_ns,
                    attempts_total: r.attempts_total,
                    cache_hits: r.cache_hits,
                    cache_misses: r.cache_misses,
                    recovery: r.recovery,
                },
                txn_types: w.txn_types(),
                workload: w.name(),
            }))
        }
    }
    spec.backend.with(progress, OnBackend { spec })?
}
