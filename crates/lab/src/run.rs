//! One run of a transactional workload: a backend, a workload, the engine's
//! configuration and the run's parameters in, the measured and judged result out.
//! Not for: choosing what to run (the command line and the swarm do) or printing it.

use hytra_fabric::NodeFaultKind;
use hytra_fabric::{Backend, ClusterShape};
use hytra_offload::lookup::Redn;
use hytra_store::{Catalog, Fill, NodeStore};
use hytra_txn::{ExecStrategy, NicLookups, TxnConfig, SCRATCH_CO_BYTES};
use hytra_workloads::bench::{
    run_partial_in, BenchError, BenchParams, BenchResult, Stage, Workload,
};

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
    /// loaded, logs, scratch, location caches and NIC indexes, and what its crashes and
    /// restarts add. Refused parameters (the run would refuse them too) count as 0.
    pub fn memory_bytes(&self) -> u64 {
        struct Estimate<'a>(&'a RunSpec);
        impl WorkloadVisitor for Estimate<'_> {
            type Out = u64;
            fn visit<W: Workload>(self, w: &W) -> u64 {
                let spec = self.0;
                let shape = spec.backend.shape();
                let caches =
                    CacheMemory::of(&spec.txn, spec.params.warm_cache, spec.backend.spread());
                let faults = spec.backend.node_faults();
                let count = |kind: fn(&NodeFaultKind) -> bool| {
                    faults.iter().filter(|f| kind(&f.kind)).count() as u64
                };
                let failures = Failures {
                    crashes: count(|k| matches!(k, NodeFaultKind::Crash)),
                    restarts: count(|k| matches!(k, NodeFaultKind::Restart)),
                };
                let co = spec.params.coroutines;
                memory_needed(w, shape, &spec.txn, co, caches, failures)
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

/// How the location caches of a run's nodes take memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMemory {
    /// Each node fills a cache of its own: caches that start cold, or nodes in
    /// processes of their own.
    PerNode,
    /// One process hosts every node and warms their caches from one image they share
    /// (`Engine::warm_caches`). A node copies the sets it changes: on every node, the
    /// bands of tables that grow (`Fill::Sparse`, TPC-C's orders) count whole, since
    /// each node caches the records it inserts there; the image, the other bands,
    /// counts once, and what the nodes copy of it is not counted (about 0.08 GB over
    /// the sixteen nodes of a 16 x 24 SmallBank run, docs/PERFORMANCE.md §40). Counted
    /// so only while the cache has a set for every block of keys
    /// (`NodeStore::cache_holds_every_key`), since an image that evicts is not shared,
    /// and in runs without crashes, since the survivors of one copy most of the image
    /// once primaries move: else as [`CacheMemory::PerNode`].
    SharedImage,
}

/// Node failures a run meets, for the memory they add. Pauses add none: a node paused
/// past its lease is removed as a crashed one would be, but the bench command draws no
/// pauses, only the swarm does, and it checks no memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Failures {
    /// Crashes: the survivors take new backups of the crashed node's partitions (up to
    /// a node's store each), and the crashed node's memory stays in the process.
    pub crashes: u64,
    /// Restarts: the node takes backups again, with a cache of its own.
    pub restarts: u64,
}

impl CacheMemory {
    /// The caches of a run of `cfg`, warmed or not, in a process that hosts one node of
    /// a cluster spread over processes (`spread`) or every node.
    pub fn of(cfg: &TxnConfig, warm: bool, spread: bool) -> CacheMemory {
        match warm && cfg.exec.reads_cache() && !spread {
            true => CacheMemory::SharedImage,
            false => CacheMemory::PerNode,
        }
    }
}

/// Bytes of memory a run of `w` touches on a cluster of `shape` (all nodes), its caches
/// counted as `caches` says, with what `failures` add.
pub fn memory_needed<W: Workload>(
    w: &W,
    shape: ClusterShape,
    cfg: &TxnConfig,
    coroutines: u16,
    caches: CacheMemory,
    failures: Failures,
) -> u64 {
    let Ok(catalog) = Catalog::new(w.tables(shape), shape.nodes, cfg.replication) else {
        return 0;
    };
    let store = w.store_bytes(&catalog, shape);
    let log = shape.workers_total() as u64 * cfg.log_ring_bytes;
    let scratch = u64::from(shape.workers_per_node) * u64::from(coroutines) * SCRATCH_CO_BYTES;
    let cache = NodeStore::cache_bytes(&catalog, cfg.cache_bytes);
    // An upper bound: the index's arrays are sparse (base pages), and the arrays of
    // tables sized for the rows a run may insert are mostly never touched.
    let nic = match cfg.exec {
        ExecStrategy::Offload => {
            NicLookups::bytes_per_node(&catalog, shape.workers_per_node, coroutines, &Redn)
                .expect("the lookup program builds")
        }
        _ => 0,
    };
    let nodes = u64::from(shape.nodes);
    // Bands are in proportion to the tables' keys (per partition; the same factor of
    // nodes on every table).
    let keys = |sparse: bool| -> u128 {
        let tables = catalog.tables().filter(|t| (t.fill == Fill::Sparse) == sparse);
        tables.map(|t| u128::from(t.capacity)).sum()
    };
    let all = keys(true) + keys(false);
    let whole = NodeStore::cache_holds_every_key(&catalog, cfg.cache_bytes);
    let failed = failures.crashes * store + failures.restarts * (store + cache);
    // A crash moves primaries: the survivors miss on every key of the moved partitions,
    // whose sets are spread over the whole cache, and copy them from the image.
    let caches = match (caches, whole, failures.crashes) {
        (CacheMemory::SharedImage, true, 0) => {
            let growing = match all {
                0 => 0,
                _ => (u128::from(cache) * keys(true) / all) as u64,
            };
            // The image holds the other bands.
            growing * nodes + (cache - growing)
        }
        _ => cache * nodes,
    };
    (store + log + scratch + nic) * nodes + caches + failed
}

/// What the caller of [`run`] hears while the run goes on.
#[derive(Default)]
pub struct Watch {
    /// Called with the virtual time every so often while a simulation runs.
    pub virtual_time: Option<Progress>,
    /// Told each stage as the run enters it.
    pub stage: Option<Box<dyn Fn(Stage)>>,
}

/// Runs `spec`: `Ok(None)` on a process of a cluster spread over processes that is not
/// the first (the first reports for everyone).
pub fn run(spec: &RunSpec, watch: Watch) -> Result<Option<Outcome>, BenchError> {
    struct OnBackend<'a> {
        spec: &'a RunSpec,
        stage: &'a dyn Fn(Stage),
    }
    impl BackendVisitor for OnBackend<'_> {
        type Out = Result<Option<Outcome>, BenchError>;
        fn visit<B: Backend>(self, b: &mut B) -> Self::Out {
            let s = self.spec;
            let on = OnWorkload { spec: s, backend: b, stage: self.stage };
            s.workload.with(s.span_s(), s.params.seed, on)
        }
    }
    struct OnWorkload<'a, B> {
        spec: &'a RunSpec,
        backend: &'a mut B,
        stage: &'a dyn Fn(Stage),
    }
    impl<B: Backend> WorkloadVisitor for OnWorkload<'_, B> {
        type Out = Result<Option<Outcome>, BenchError>;
        fn visit<W: Workload>(self, w: &W) -> Self::Out {
            let procs = self.spec.backend.processes();
            let (txn, params) = (self.spec.txn, self.spec.params);
            let r = run_partial_in(self.backend, w, txn, params, procs, self.stage)?;
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
    let quiet = |_| {};
    let stage: &dyn Fn(Stage) = watch.stage.as_deref().unwrap_or(&quiet);
    spec.backend.with(watch.virtual_time, OnBackend { spec, stage })?
}

#[cfg(test)]
mod tests {
    use hytra_txn::Design;
    use hytra_workloads::smallbank::SmallBank;
    use hytra_workloads::tpcc::{TpcC, TpccParams};

    use super::*;

    fn shape(nodes: u16) -> ClusterShape {
        ClusterShape { nodes, workers_per_node: 4, lanes_per_peer: 1 }
    }

    #[test]
    fn a_node_counts_the_regions_of_its_replicas_only() {
        let w = SmallBank { accounts_per_worker: 1_000 };
        let cfg = TxnConfig::preset(Design::DrtmH);
        for nodes in [3, 4, 16] {
            let catalog = Catalog::new(w.tables(shape(nodes)), nodes, cfg.replication).unwrap();
            let held: u64 = catalog.regions().filter(|&(_, p, _, _)| p < 3).map(|r| r.2).sum();
            assert_eq!(w.store_bytes(&catalog, shape(nodes)), held, "{nodes} nodes");
        }
    }

    #[test]
    fn nodes_warmed_from_one_image_count_it_once_and_their_growing_bands_each() {
        // A cache with an entry for every key of both workloads' tables.
        let cfg = TxnConfig { cache_bytes: 1 << 40, ..TxnConfig::preset(Design::DrtmH) };
        let one_image = |w: &dyn Fn(CacheMemory) -> u64, catalog: &Catalog| {
            let cache = NodeStore::cache_bytes(catalog, cfg.cache_bytes);
            assert!(cache > 0);
            (w(CacheMemory::PerNode) - w(CacheMemory::SharedImage), cache)
        };
        // SmallBank grows no table: fifteen of sixteen caches are the shared image.
        let sb = SmallBank { accounts_per_worker: 1_000 };
        let catalog = Catalog::new(sb.tables(shape(16)), 16, cfg.replication).unwrap();
        let (saved, cache) = one_image(
            &|c| memory_needed(&sb, shape(16), &cfg, 8, c, Failures::default()),
            &catalog,
        );
        assert_eq!(saved, 15 * cache);
        // TPC-C inserts orders on every node: their bands count on each.
        let tpcc = TpcC::new(TpccParams::standard(1));
        let catalog = Catalog::new(tpcc.tables(shape(16)), 16, cfg.replication).unwrap();
        let (saved, cache) = one_image(
            &|c| memory_needed(&tpcc, shape(16), &cfg, 8, c, Failures::default()),
            &catalog,
        );
        assert!(saved > 0 && saved < 15 * cache / 2, "saved {saved} of 15 x {cache}");
    }

    #[test]
    fn a_cache_smaller_than_its_keys_is_counted_on_every_node() {
        // 16 x 4 x 100 000 accounts in two tables need 205 MB of entries: a 100 MiB cache
        // evicts while its image is built, and every node warms its own.
        let sb = SmallBank { accounts_per_worker: 100_000 };
        let cfg = TxnConfig { cache_bytes: 100 << 20, ..TxnConfig::preset(Design::DrtmH) };
        let need = |c| memory_needed(&sb, shape(16), &cfg, 8, c, Failures::default());
        assert_eq!(need(CacheMemory::SharedImage), need(CacheMemory::PerNode));
        let big = TxnConfig { cache_bytes: 300 << 20, ..cfg };
        let need = |c| memory_needed(&sb, shape(16), &big, 8, c, Failures::default());
        assert!(need(CacheMemory::SharedImage) < need(CacheMemory::PerNode), "an entry per key");
    }

    #[test]
    fn crashes_and_restarts_add_stores_and_caches() {
        let sb = SmallBank { accounts_per_worker: 1_000 };
        let cfg = TxnConfig::preset(Design::DrtmH);
        let catalog = Catalog::new(sb.tables(shape(6)), 6, cfg.replication).unwrap();
        let (store, cache) =
            (sb.store_bytes(&catalog, shape(6)), NodeStore::cache_bytes(&catalog, cfg.cache_bytes));
        let need = |crashes, restarts| {
            let f = Failures { crashes, restarts };
            memory_needed(&sb, shape(6), &cfg, 8, CacheMemory::SharedImage, f)
        };
        // With a crash, every survivor copies the image: a cache per node.
        assert_eq!(need(3, 0) - need(0, 0), 3 * store + 5 * cache);
        assert_eq!(need(1, 1) - need(1, 0), store + cache);
    }

    #[test]
    fn only_warmed_caches_in_one_process_share_an_image() {
        let hybrid = TxnConfig::preset(Design::DrtmH);
        let fasst = TxnConfig::preset(Design::Fasst);
        assert_eq!(CacheMemory::of(&hybrid, true, false), CacheMemory::SharedImage);
        assert_eq!(CacheMemory::of(&hybrid, false, false), CacheMemory::PerNode, "cold");
        assert_eq!(CacheMemory::of(&hybrid, true, true), CacheMemory::PerNode, "spread");
        assert_eq!(CacheMemory::of(&fasst, true, false), CacheMemory::PerNode, "never warmed");
    }
}
