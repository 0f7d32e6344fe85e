//! Setting the engine up on a cluster, and the state its workers share.
//!
//! [`Engine::setup`] registers the store, log and scratch regions on a backend and builds
//! one [`NodeEngine`] per node. [`Engine::install`] turns a runtime worker into a
//! transaction worker: it registers the RPC handlers and starts the background task that
//! collects passive acknowledgements and flushes logs at the end. Coroutines then get a
//! [`TxnCtx`](crate::TxnCtx) from the returned [`WorkerTxn`].

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::task::Waker;

use hytra_check::TxnRecord;
use hytra_fabric::{
    Backend, BackendError, Endpoint, LocalAddr, NodeId, Pages, Qp, Region, RegionSpec, Rkey,
    WorkerId, LIVES_MAX,
};
use hytra_nicindex::hash::tag;
use hytra_nicindex::lookup::LookupPrograms;
use hytra_rt::{CallTicket, Co, OpTicket, RpcType, StepBudget, Waits, Worker};
use hytra_store::{Catalog, LocationCache, NodeStore, Replica, StoreError, TableId};
use thiserror::Error;

use crate::config::{ConfigError, ProtocolPoint, TxnConfig};
use crate::config_store::{Cas, ConfigStore, MemoryStore};
use crate::handlers;
use crate::log::{LogLayout, RingOut};
use crate::membership::{Config, Membership, View};
use crate::offload::{NicLookups, NodeIndex};
use crate::recover::{NodeRecovery, RecoveryParams};
use crate::stats::TxnStats;
use hytra_store::layout::KEY_WORD;

/// Scratch memory of one coroutine: destinations of READs and atomics, log entries and
/// commit payloads staged for one-sided WRITEs.
pub const SCRATCH_CO_BYTES: u64 = 64 << 10;

/// The part of a coroutine's scratch reset at every attempt; the rest holds commit
/// payloads until the coroutine's next commit (docs/INVARIANTS.md M5).
pub const SCRATCH_ATTEMPT_BYTES: u64 = 48 << 10;

/// The partitions a node's location cache is warmed with, each with the node whose
/// replica it is read from.
type Known = Vec<(u16, NodeId)>;

/// Why the engine could not be set up.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The configuration does not fit the cluster.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The backend refused a region.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The offload execution strategy cannot run here.
    #[error("offload execution strategy: {0}")]
    Offload(#[from] OffloadError),
}

/// Why the offload execution strategy cannot run.
#[derive(Debug, Error)]
pub enum OffloadError {
    /// The caller gave no lookup programs.
    #[error("it needs lookup programs from its caller (hytra_offload::lookup::Redn)")]
    NoPrograms,
    /// More coroutines than the lookup slots can number.
    #[error("{coroutines} coroutines need too many lookup slots")]
    TooManySlots {
        /// Coroutines per worker asked for.
        coroutines: u16,
    },
    /// The programs' code is not whole 64-byte entries.
    #[error("lookup programs of {bytes} bytes: expected whole 64-byte entries")]
    CodeSize {
        /// Bytes of one program's code.
        bytes: u64,
    },
    /// A program could not be built.
    #[error(transparent)]
    Build(#[from] hytra_nicindex::lookup::LookupError),
    /// The backend's NIC runs no verb programs.
    #[error(
        "the backend runs no verb programs on {server} ({refusal}); it needs the sim backend \
         with a profile that models them (cx5) or the local backend"
    )]
    NoVerbPrograms {
        /// The node whose NIC refused a work queue.
        server: NodeId,
        /// The backend's refusal (in the message, so not also a source).
        refusal: BackendError,
    },
}

/// Where each coroutine's scratch memory is.
#[derive(Copy, Clone, Debug)]
pub struct ScratchLayout {
    /// Region key (the same on every node).
    pub rkey: Rkey,
    /// Coroutines per worker the region was sized for.
    pub coroutines: u16,
}

/// Bytes per worker, after every coroutine's scratch, where its recovery task's fence
/// READs land (a cache line each, so that they disturb nothing else).
const FENCE_SLOT_BYTES: u64 = 64;

impl ScratchLayout {
    /// Where worker `index`'s fence READs land.
    pub fn fence(&self, index: u16, workers: u16) -> LocalAddr {
        let after = u64::from(workers) * u64::from(self.coroutines) * SCRATCH_CO_BYTES;
        LocalAddr { rkey: self.rkey, offset: after + u64::from(index) * FENCE_SLOT_BYTES }
    }

    /// Where worker `index`'s re-replication copies land ([`crate::resync::COPY_BUFFER_BYTES`]
    /// each, after every worker's fence slot).
    pub fn copy_buffer(&self, index: u16, workers: u16) -> LocalAddr {
        let after = u64::from(workers) * u64::from(self.coroutines) * SCRATCH_CO_BYTES
            + u64::from(workers) * FENCE_SLOT_BYTES;
        LocalAddr {
            rkey: self.rkey,
            offset: after + u64::from(index) * crate::resync::COPY_BUFFER_BYTES,
        }
    }

    /// Start of the scratch of coroutine `co` of worker `index` on its node.
    pub fn base(&self, index: u16, co: u16) -> LocalAddr {
        assert!(
            co < self.coroutines,
            "coroutine {co} has no scratch (sized for {})",
            self.coroutines
        );
        let slot = u64::from(index) * u64::from(self.coroutines) + u64::from(co);
        LocalAddr { rkey: self.rkey, offset: slot * SCRATCH_CO_BYTES }
    }
}

/// What the workers of one node share.
pub struct NodeEngine {
    /// The node.
    pub node: NodeId,
    /// Which life of the node: 0, then one more per restart (simulator only). A later
    /// life starts with empty replicas and joins the cluster as a new member.
    pub life: u32,
    /// How transactions run.
    pub cfg: TxnConfig,
    /// Tables and placement.
    pub catalog: Arc<Catalog>,
    /// This node's replicas and location cache.
    pub store: Arc<NodeStore>,
    /// Log rings layout.
    pub log: LogLayout,
    /// This node's log region.
    pub log_region: Region,
    /// Scratch layout.
    pub scratch: ScratchLayout,
    /// The offload strategy's lookups, and this node's index of its primary records.
    pub(crate) offload: Option<(Arc<NicLookups>, NodeIndex)>,
    /// This node's view of the configuration in force.
    pub membership: Arc<Membership>,
    /// What this node's workers share about recovery.
    pub recovery: Arc<NodeRecovery>,
}

impl NodeEngine {
    /// The offset of `key`'s record in this node's replica of its partition of `table`
    /// (the caller knows this node is the partition's primary), inserting an absent
    /// record if there is none (and filing it in the NIC index).
    pub(crate) fn insert_primary(&self, table: TableId, key: u64) -> Result<u64, StoreError> {
        let p = self.catalog.partition(table, key);
        let off = self.store.replica(table, p).lookup_or_insert(key)?;
        self.file(table, p, key, off);
        Ok(off)
    }

    /// Files a primary record of partition `p` in the NIC index, if the offload strategy
    /// keeps one.
    fn file(&self, table: TableId, p: u16, key: u64, off: u64) {
        if let Some((lookups, index)) = &self.offload {
            let len = self.catalog.geometry(table).record_bytes;
            index.file(table, lookups.table(table), key, self.catalog.rkey(table, p), off, len);
        }
    }

    /// Files a record that recovery created or moved here, if this node is its
    /// partition's primary and the offload strategy keeps a NIC index.
    pub(crate) fn file_recovered(&self, table: TableId, p: u16, key: u64, off: u64) {
        if self.membership.current().primary(p) == self.node {
            self.file(table, p, key, off);
        }
    }

    /// Files the records of the partitions `cfg` makes this node the primary of in the
    /// NIC index (after a promotion: the old primary's index died with it), at most
    /// `budget` of them from `from` on: returns where the next call goes on, `None` once
    /// every one is filed. In parts, so that recovery's task yields between them: a
    /// record of a partition new here may fault a fresh page of the index in (8 us on
    /// a host whose first touches are slow), and 75 000 of them in one turn held a worker,
    /// and the renewals it sends, for 0.65 s against a lease of 0.2 s.
    pub(crate) fn refile_primaries(
        &self,
        cfg: &Config,
        from: Refile,
        budget: u64,
    ) -> Option<Refile> {
        assert!(budget > 0, "a refile that files nothing never ends");
        self.offload.as_ref()?;
        let parts: Vec<u16> = cfg.placement.primaries_of(self.node).collect();
        let (mut at, mut left) = (from, budget);
        while let Some(&p) = parts.get(at.part) {
            while let Some(spec) = self.catalog.tables().nth(at.table) {
                let replica = self.store.replica(spec.id, p);
                for (off, key) in replica.records_from(at.record) {
                    if left == 0 {
                        return Some(at);
                    }
                    self.file(spec.id, p, key, off);
                    (at.record, left) = (at.record + 1, left - 1);
                }
                (at.table, at.record) = (at.table + 1, 0);
            }
            (at.part, at.table) = (at.part + 1, 0);
        }
        None
    }

    /// Records the NIC index could not hold (they are found by RPC instead).
    pub fn nic_index_lost(&self) -> u64 {
        self.offload.as_ref().map_or(0, |(_, index)| index.lost())
    }
}

/// Where [`NodeEngine::refile_primaries`] goes on: the index of a partition among the
/// node's primaries, of a table, and of a record among the table's allocated ones.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Refile {
    part: usize,
    table: usize,
    record: u64,
}

/// The engine on a cluster: one [`NodeEngine`] per node.
pub struct Engine {
    /// Tables and placement.
    pub catalog: Arc<Catalog>,
    /// Per node, its first life (see [`Engine::node`] for the one in force).
    pub nodes: Vec<Arc<NodeEngine>>,
    /// Per node, its later lives, once it restarted (index: life - 1).
    later: Vec<Vec<OnceLock<Arc<NodeEngine>>>>,
    /// Configuration.
    pub cfg: TxnConfig,
    /// Which nodes live in this process (all, except for a cluster spread over
    /// processes); the others are shadows that setup and loading leave alone.
    hosted: Vec<bool>,
    /// The cluster configuration every node starts with (each keeps its own view).
    initial: Arc<Config>,
    /// Set once loading is over and every hosted replica holds its records
    /// ([`Engine::finish_loading`]); [`Engine::load`] fills one copy per partition until
    /// then.
    loaded: OnceLock<()>,
}

impl Engine {
    /// Whether `node` lives in this process.
    pub fn hosts(&self, node: NodeId) -> bool {
        self.hosted[usize::from(node.0)]
    }

    /// Registers every region the engine needs on `backend` and builds the node engines.
    /// `coroutines` bounds the coroutines per worker that will run transactions. Given
    /// no lookup programs, it refuses the `offload` execution strategy (see
    /// [`Engine::setup_with_store`]).
    pub fn setup<B: Backend>(
        backend: &mut B,
        catalog: Catalog,
        cfg: TxnConfig,
        coroutines: u16,
    ) -> Result<Engine, EngineError> {
        Engine::setup_with_store(
            backend,
            catalog,
            cfg,
            coroutines,
            Arc::new(MemoryStore::default()),
            None,
        )
    }

    /// As [`Engine::setup`], committing configurations to `config_store`, which the
    /// processes of a cluster share (each stores the first configuration, or finds the
    /// same one stored), and, for the `offload` execution strategy, installing the lookup
    /// programs `programs` builds (`hytra_offload::lookup::Redn`; the engine knows their
    /// layout, not how verb programs are built).
    pub fn setup_with_store<B: Backend>(
        backend: &mut B,
        catalog: Catalog,
        cfg: TxnConfig,
        coroutines: u16,
        config_store: Arc<dyn ConfigStore>,
        programs: Option<&dyn LookupPrograms>,
    ) -> Result<Engine, EngineError> {
        let shape = backend.shape();
        cfg.check(shape.nodes)?;
        if catalog.replication() != cfg.replication {
            return Err(ConfigError::Invalid(
                "catalog and configuration disagree on replication".into(),
            )
            .into());
        }
        let (catalog, stores) = NodeStore::register(backend, catalog, cfg.cache_bytes)?;
        let initial = Arc::new(Config::initial(shape.nodes, cfg.replication));
        let recovery = cfg.recovery.unwrap_or(match backend.virtual_time() {
            true => RecoveryParams::simulated(),
            false => RecoveryParams::real(),
        });
        let mut bytes = Vec::new();
        initial.encode(&mut bytes);
        let stored = config_store
            .cas(0, initial.epoch, &bytes)
            .map_err(|e| ConfigError::Invalid(format!("storing the first configuration: {e}")))?;
        if let Cas::Lost(epoch, other) = stored {
            // Another process of the cluster stored it first: it must be this one.
            if epoch != initial.epoch || other != bytes {
                return Err(ConfigError::Invalid(format!(
                    "the configuration store holds epoch {epoch}, not this cluster's first configuration"
                ))
                .into());
            }
        }
        let log_bytes = LogLayout {
            rkey: Rkey(0),
            ring_bytes: cfg.log_ring_bytes,
            rings: shape.workers_total() as u64,
        }
        .region_bytes();
        // A ring per coordinator, written from its start on and filled only by a long
        // run: base pages, or every ring would be resident in whole from its first entry.
        let log_rkey = backend.register_all(RegionSpec::new(log_bytes).with_pages(Pages::Base))?;
        let log = LogLayout {
            rkey: log_rkey,
            ring_bytes: cfg.log_ring_bytes,
            rings: shape.workers_total() as u64,
        };
        let scratch_bytes = u64::from(shape.workers_per_node)
            * (u64::from(coroutines.max(1)) * SCRATCH_CO_BYTES
                + FENCE_SLOT_BYTES
                + crate::resync::COPY_BUFFER_BYTES);
        let scratch = ScratchLayout {
            rkey: backend.register_all(RegionSpec::new(scratch_bytes))?,
            coroutines: coroutines.max(1),
        };
        let lookups = NicLookups::for_strategy(backend, &catalog, cfg.exec, coroutines, programs)?;
        let nodes = stores
            .into_iter()
            .map(|store| {
                let node = store.node;
                let log_region =
                    backend.region(node, log.rkey).expect("log region just registered");
                let offload = lookups.as_ref().map(|l| {
                    let region =
                        backend.region(node, l.index_rkey()).expect("index region just registered");
                    (l.clone(), NodeIndex::new(region, catalog.tables().count()))
                });
                Arc::new(NodeEngine {
                    node,
                    life: 0,
                    cfg,
                    catalog: catalog.clone(),
                    store,
                    log,
                    log_region,
                    scratch,
                    offload,
                    membership: Arc::new(Membership::new(Config::clone(&initial))),
                    recovery: Arc::new(NodeRecovery::new(
                        shape.nodes,
                        shape.workers_per_node,
                        config_store.clone(),
                        recovery,
                    )),
                })
            })
            .collect();
        let hosted = (0..shape.nodes).map(|n| backend.hosts(NodeId(n))).collect();
        let later =
            (0..shape.nodes).map(|_| (1..LIVES_MAX).map(|_| OnceLock::new()).collect()).collect();
        Ok(Engine { catalog, nodes, later, cfg, hosted, initial, loaded: OnceLock::new() })
    }

    /// `node`'s engine of its latest life.
    pub fn node(&self, node: NodeId) -> &Arc<NodeEngine> {
        let n = usize::from(node.0);
        self.later[n].iter().rev().find_map(OnceLock::get).unwrap_or(&self.nodes[n])
    }

    /// Every node's engine of every life it had, first lives first.
    pub fn lives(&self) -> impl Iterator<Item = &Arc<NodeEngine>> {
        self.nodes.iter().chain(self.later.iter().flat_map(|l| l.iter().filter_map(OnceLock::get)))
    }

    /// `node`'s engine of life `life`, made on first use: the node restarted with its
    /// memory wiped, so it holds nothing, and joins the cluster anew.
    fn life_of(&self, node: NodeId, life: u32) -> &Arc<NodeEngine> {
        let first = &self.nodes[usize::from(node.0)];
        if life == 0 {
            return first;
        }
        let slot = self.later[usize::from(node.0)].get(life as usize - 1).unwrap_or_else(|| {
            panic!("{node} restarted {life} times: a node has at most {LIVES_MAX} lives")
        });
        slot.get_or_init(|| {
            assert!(
                first.offload.is_none(),
                "{node} restarted, but the offload strategy's NIC programs cannot be rebuilt"
            );
            let params = first.recovery.params();
            let shape_nodes = first.catalog.nodes();
            let workers = first.recovery.workers();
            Arc::new(NodeEngine {
                node,
                life,
                cfg: first.cfg,
                catalog: first.catalog.clone(),
                store: Arc::new(first.store.reborn(first.cfg.cache_bytes)),
                log: first.log,
                log_region: first.log_region.clone(),
                scratch: first.scratch,
                offload: None,
                membership: Arc::new(Membership::new(Config::clone(&self.initial))),
                recovery: Arc::new(NodeRecovery::joining(
                    shape_nodes,
                    workers,
                    first.recovery.store(),
                    params,
                )),
            })
        })
    }

    /// Loads one record's initial value into its partition (before the run: loading is
    /// not a transaction and takes no locks). It lands in the first replica of the
    /// partition this process hosts, the primary if it is here; [`Engine::finish_loading`]
    /// makes the other hosted copies.
    pub fn load(&self, table: TableId, key: u64, payload: &[u64]) -> Result<(), StoreError> {
        assert!(self.loaded.get().is_none(), "a record loaded after loading finished");
        let p = self.catalog.partition(table, key);
        let Some(node) = self.hosted_copies(p).next() else { return Ok(()) };
        let here = &self.nodes[usize::from(node.0)];
        let off = here.store.replica(table, p).load(key, payload)?;
        if node == self.initial.placement.part(p).primary {
            here.file(table, p, key, off);
        }
        Ok(())
    }

    /// The nodes of this process that hold a copy of partition `p` at the start, the
    /// primary first.
    fn hosted_copies(&self, p: u16) -> impl Iterator<Item = NodeId> + '_ {
        let place = self.initial.placement.part(p);
        std::iter::once(place.primary)
            .chain(place.backups.iter().map(|&(n, _)| n))
            .filter(|&n| self.hosts(n))
    }

    /// Ends loading: every hosted replica of a partition gets the records [`Engine::load`]
    /// put into the first ([`Replica::copy_loaded_to`]). Until then nothing may change a
    /// replica but `Engine::load` (the copies would carry it). Runs once: a call while
    /// the copying runs waits for it (worker threads calling [`Engine::install`] at
    /// once), and a call after it returns at once.
    pub fn finish_loading(&self) {
        self.loaded.get_or_init(|| {
            for t in self.catalog.tables() {
                for p in 0..self.catalog.partitions() {
                    let mut copies = self
                        .hosted_copies(p)
                        .map(|n| self.nodes[usize::from(n.0)].store.replica(t.id, p));
                    if let Some(first) = copies.next() {
                        first.copy_loaded_to(&copies.collect::<Vec<_>>());
                    }
                }
            }
        });
    }

    /// The configuration in force at the end of a run: the newest one any node
    /// installed (as far as this process knows).
    pub fn final_config(&self) -> Arc<Config> {
        self.lives()
            .map(|n| n.membership.current())
            .max_by_key(|c| (c.epoch, c.revision))
            .unwrap_or_else(|| self.initial.clone())
    }

    /// Whether attempt `owner`, which was logging when its node stopped hearing of it,
    /// committed: as recovery decided it at any node of this process (a transaction no
    /// recovery decided never finished logging, and so never committed).
    pub fn verdict(&self, owner: u64) -> bool {
        self.lives().any(|n| n.recovery.committed(owner))
    }

    /// Every partition's primary replica of `table` under the configuration in force at
    /// the end of a run: what workloads check their invariants over (after a run spread
    /// over processes, the other processes' replicas are restored here first).
    pub fn primaries(&self, table: TableId) -> Vec<&Replica> {
        let config = self.final_config();
        (0..self.catalog.partitions())
            .map(|p| self.node(config.primary(p)).store.replica(table, p))
            .collect()
    }

    /// The primary replica of `key`'s record of `table` under the configuration in force
    /// at the end of a run.
    pub fn primary_of(&self, table: TableId, key: u64) -> &Replica {
        let p = self.catalog.partition(table, key);
        let n = self.final_config().primary(p);
        self.node(n).store.replica(table, p)
    }

    /// Starts every node's location cache with the address of every record of the other
    /// nodes' partitions that this process knows: the state a long run reaches (a 300 MB
    /// cache holds a SmallBank index, DrTM+H §5.1), which a short simulated window would
    /// spend its whole length approaching. Does nothing for designs without a cache.
    pub fn warm_caches(&self) {
        self.finish_loading();
        if !self.cfg.exec.reads_cache() {
            return;
        }
        let config = &self.initial;
        // Per node, the partitions it knows and where from; nodes that know the same ones
        // share one image (all of them, when one process hosts every node).
        // `None`: the image evicted entries, so it is no use (and is dropped at once).
        let mut images: Vec<(Known, Option<Arc<LocationCache>>)> = Vec::new();
        for here in self.nodes.iter().filter(|n| self.hosts(n.node)) {
            let cache = here.store.cache();
            if !cache.enabled() {
                continue;
            }
            let known: Known = (0..self.catalog.partitions())
                .filter_map(|p| {
                    // The primary's replica if this process hosts it, or else a backup
                    // replica here, which holds what its primary was loaded with at the
                    // same offsets (S5; in another process, the same keys loaded in the
                    // same order). An entry that is not would be caught like any stale
                    // one (S4). With fewer copies than nodes, only the partitions of
                    // other processes backed up here are known.
                    let primary = config.placement.part(p).primary;
                    if self.hosts(primary) {
                        Some((p, primary))
                    } else {
                        config.placement.holds(here.node, p).then_some((p, here.node))
                    }
                })
                .collect();
            let image = match images.iter().find(|(k, _)| *k == known) {
                Some((_, image)) => image.clone(),
                None => {
                    let image = cache.blank();
                    self.warm(&image, &known);
                    let image = (image.evicted() == 0).then(|| Arc::new(image));
                    images.push((known.clone(), image.clone()));
                    image
                }
            };
            // A node's own partitions are in the shared image, but not in the cache its
            // own warm start would fill: it never looks them up, and drops them from a
            // set when it first changes it. That is exact only if the image evicted
            // nothing (an own entry could have pushed out another's); else the node's
            // cache is warmed on its own, without them.
            let own: Vec<bool> = (0..self.catalog.partitions())
                .map(|p| config.placement.part(p).primary == here.node)
                .collect();
            if let Some(image) = image {
                let catalog = self.catalog.clone();
                let foreign = move |t, key| own[usize::from(catalog.partition(t, key))];
                cache.start_from(image, Box::new(foreign));
            } else {
                let mine: Known =
                    known.into_iter().filter(|&(p, _)| !own[usize::from(p)]).collect();
                self.warm(cache, &mine);
            }
        }
    }

    /// Puts into `cache` the address of every record of the `known` partitions, read
    /// from the given replicas.
    fn warm(&self, cache: &LocationCache, known: &Known) {
        for &(p, source) in known {
            let generation = self.initial.placement.part(p).generation;
            for spec in self.catalog.tables() {
                let replica = self.nodes[usize::from(source.0)].store.replica(spec.id, p);
                for (off, key) in replica.records() {
                    cache.put(spec.id, key, generation, off);
                }
            }
        }
    }

    /// With the offload strategy, checks that the NIC index of every node this process
    /// hosts finds each primary record: `Some(Ok(summary))` if so, `Some(Err(what))`
    /// naming a record it misses. A record is excused only if the array lost entries or
    /// another key shares its tag. `None` without the offload strategy.
    pub fn check_nic_index(&self) -> Option<Result<String, String>> {
        let (mut records, mut shared, mut lost) = (0u64, 0u64, 0u64);
        let (mut resident, mut mapped) = (Some(0u64), 0u64);
        for here in self.nodes.iter().filter(|n| self.hosts(n.node)) {
            let (lookups, index) = here.offload.as_ref()?;
            lost += index.lost();
            let (r, m) = index.memory();
            resident = resident.zip(r).map(|(a, b)| a + b);
            mapped += m;
            let config = here.membership.current();
            for (spec, p) in self
                .catalog
                .tables()
                .flat_map(|s| config.placement.primaries_of(here.node).map(move |p| (s, p)))
            {
                let replica = here.store.replica(spec.id, p);
                let b = lookups.table(spec.id);
                for (off, key) in replica.records() {
                    records += 1;
                    let entry = index.find(b, key);
                    if entry.is_some_and(|e| e.addr.offset == off) {
                        continue;
                    }
                    let other = entry.map(|e| replica.region().load(e.addr.offset + KEY_WORD * 8));
                    if other.is_some_and(|k| k != key && tag(k) == tag(key)) {
                        shared += 1;
                        continue;
                    }
                    if index.lost() == 0 {
                        return Some(Err(format!(
                            "nic index: table {} key {key} (record at {off}) is not in the NIC index of {} (it names {entry:?})",
                            spec.name, here.node
                        )));
                    }
                }
            }
        }
        let memory = match resident {
            Some(r) => format!("{r} of {mapped} bytes resident"),
            None => format!("{mapped} bytes mapped"),
        };
        Some(Ok(format!(
            "nic index: {records} primary records filed ({shared} share a tag with another key, {lost} entries lost to full arrays), {memory}"
        )))
    }

    /// Makes `w` a transaction worker: registers the engine's RPC handlers and starts its
    /// background task. `record_history` keeps every committed transaction for the checker.
    pub fn install<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        record_history: bool,
    ) -> Rc<WorkerTxn> {
        self.finish_loading();
        let co = w.co();
        let me = co.me();
        let life = co.with_ep(|ep| ep.incarnation());
        let node = self.life_of(me.node, life).clone();
        let step_budget_ns = node.recovery.step_budget_ns();
        let view = Rc::new(View::new(node.membership.clone()));
        handlers::register(w, &node, &view);
        crate::recover::register(w, &node);
        crate::resync::register(w, &node);
        let waits = node.offload.as_ref().map(|(lookups, _)| {
            if me.index == 0 {
                // Start this node's lookup programs (each waits for its first request).
                co.with_ep(|ep| {
                    for &q in lookups.starters(me.node) {
                        ep.wq_doorbell(q).expect("lookup queue of this node");
                    }
                });
            }
            let waits = Waits::default();
            w.poll_with(waits.poller());
            waits
        });
        let wt = Rc::new(WorkerTxn {
            node,
            me,
            me_idx: co.shape().worker_index(me),
            coherent: co.caps().atomics_coherent,
            rings: RefCell::new(vec![RingOut::default(); usize::from(co.shape().nodes)]),
            acks: RefCell::new(VecDeque::new()),
            acks_pushed: Cell::new(0),
            acks_done: Cell::new(0),
            unresolved: RefCell::new(VecDeque::new()),
            spare: RefCell::new(Vec::new()),
            doubt: RefCell::new(Vec::new()),
            orphans: RefCell::new(Vec::new()),
            acker: RefCell::new(None),
            stats: RefCell::new(TxnStats::default()),
            history: RefCell::new(record_history.then(Vec::new)),
            journal: RefCell::new(None),
            active: Cell::new(0),
            window: Cell::new((0, u64::MAX)),
            timeline_ns: Cell::new(0),
            commits_total: Cell::new(0),
            next_tseq: Cell::new(0),
            buffers: RefCell::new(Vec::new()),
            waits,
            view,
        });
        // The engine's own tasks go first in every step: they are short, and some keep
        // time (lease renewals on worker 0, re-replication's paced copies on every
        // worker). Steps stop resuming the clients at a budget, so heavy client turns
        // cannot hold a renewal back past a lease, nor a copy below its pace.
        w.set_step_budget(StepBudget::Ns(step_budget_ns));
        let bg = wt.clone();
        w.spawn_first(move |co| async move { crate::commit::background(co, bg).await });
        let q = wt.clone();
        w.spawn_first(move |co| async move { crate::recover::quiescer(co, q).await });
        if me.index == 0 {
            let m = wt.clone();
            w.spawn_first(move |co| async move { crate::recover::membership(co, m).await });
            let g = wt.clone();
            w.spawn_first(move |co| async move { crate::recover::granter(co, g).await });
        }
        wt
    }
}

/// An acknowledgement to collect off the critical path: a two-sided commit (passive
/// ACK) or a final log reclaim. The request is kept so it can be sent again.
pub(crate) struct PendingAck {
    pub(crate) dest: WorkerId,
    pub(crate) ty: RpcType,
    pub(crate) bytes: Vec<u8>,
    pub(crate) call: Option<CallTicket>,
    /// The epoch of the attempt that sent it: one of an epoch that is over is dropped
    /// (recovery wrote the record back from the logs).
    pub(crate) epoch: u64,
}

/// A passive-ACK commit whose log entries wait for its write-backs to land before their
/// backups may apply them (L7).
#[derive(Default)]
pub(crate) struct Unresolved {
    /// Its log entries: (backup, stream position).
    pub(crate) starts: Vec<(NodeId, u64)>,
    /// Per connection its write-backs used, the mark they lie before.
    pub(crate) marks: Vec<(Qp, u64)>,
    /// Acknowledgements to collect first (a count of those ever pushed; 0: none).
    pub(crate) acks: u64,
}

/// State a worker's coroutines, handlers and background task share.
pub struct WorkerTxn {
    /// The node's engine.
    pub node: Arc<NodeEngine>,
    /// This worker.
    pub me: WorkerId,
    /// Its dense index in the cluster (its log ring number).
    pub me_idx: usize,
    /// Whether the fabric's atomics are coherent with CPU atomics.
    pub coherent: bool,
    /// This worker's rings at every node (indexed by node).
    pub(crate) rings: RefCell<Vec<RingOut>>,
    pub(crate) acks: RefCell<VecDeque<PendingAck>>,
    /// Acknowledgements ever pushed, and ever collected (or dropped).
    acks_pushed: Cell<u64>,
    pub(crate) acks_done: Cell<u64>,
    /// Passive-ACK commits whose log entries are not resolved yet (bounded by the ring
    /// credit their entries hold), and spares to reuse.
    pub(crate) unresolved: RefCell<VecDeque<Unresolved>>,
    spare: RefCell<Vec<Unresolved>>,
    /// Records of attempts past the start of logging, whose fate a crash of this node
    /// would leave to recovery (checked runs only).
    doubt: RefCell<Vec<TxnRecord>>,
    /// Tickets of ended coroutines' last staged write-backs, for the background task.
    pub(crate) orphans: RefCell<Vec<OpTicket>>,
    pub(crate) acker: RefCell<Option<Waker>>,
    pub(crate) stats: RefCell<TxnStats>,
    pub(crate) history: RefCell<Option<Vec<TxnRecord>>>,
    /// Where the history goes as it is made, if anywhere (see [`WorkerTxn::set_journal`]),
    /// and the line being made: one buffer that every line reuses.
    journal: RefCell<Option<(hytra_fabric::append::AppendFile, Vec<u8>)>>,
    /// Coroutines currently running transactions (the background task ends after them).
    pub(crate) active: Cell<u32>,
    /// Transactions finishing in `[start, end)` are counted.
    pub(crate) window: Cell<(u64, u64)>,
    /// Width of the commit timeline's intervals (0: none kept).
    pub(crate) timeline_ns: Cell<u64>,
    /// Commits in the whole run, window or not.
    pub(crate) commits_total: Cell<u64>,
    /// The sequence number of this worker's last transaction that reserved log room.
    pub(crate) next_tseq: Cell<u64>,
    /// Request buffers that outlive a coroutine's step (queued for acknowledgement).
    buffers: RefCell<Vec<Vec<u8>>>,
    /// Coroutines waiting for the answers of offloaded lookups (offload strategy only).
    pub(crate) waits: Option<Waits>,
    /// This worker's copy of the configuration in force.
    pub(crate) view: Rc<View>,
}

impl WorkerTxn {
    /// A context for coroutine `co_index` (one per coroutine; at most the number of
    /// coroutines the engine was set up for).
    pub fn ctx<E: Endpoint>(self: &Rc<Self>, co: Co<E>, co_index: u16) -> crate::TxnCtx<E> {
        self.active.set(self.active.get() + 1);
        self.node.recovery.client_started();
        crate::TxnCtx::new(co, self.clone(), co_index)
    }

    /// Counts only transactions that finish in `[start_ns, end_ns)` (warm-up excluded).
    pub fn set_window(&self, start_ns: u64, end_ns: u64) {
        self.window.set((start_ns, end_ns));
    }

    /// Keeps a timeline of commits over the whole run in intervals of `width_ns` (0:
    /// none), see [`TxnStats::timeline`].
    pub fn set_timeline(&self, width_ns: u64) {
        self.timeline_ns.set(width_ns);
    }

    /// Counts a transaction abandoned after too many attempts.
    pub fn gave_up(&self, _ty: u8) {
        self.stats.borrow_mut().gave_up += 1;
    }

    /// Transactions committed in the whole run (warm-up included).
    pub fn finished_total(&self) -> u64 {
        self.commits_total.get()
    }

    /// Counters so far.
    pub fn stats(&self) -> TxnStats {
        self.stats.borrow().clone()
    }

    /// Whether committed transactions are recorded for the checker.
    pub fn records_history(&self) -> bool {
        self.history.borrow().is_some()
    }

    /// The committed transactions recorded (empty unless recording was asked for).
    pub fn take_history(&self) -> Vec<TxnRecord> {
        self.history.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// A cleared request buffer from the pool (allocated only while the pool grows).
    pub(crate) fn take_buffer(&self) -> Vec<u8> {
        let mut b = self.buffers.borrow_mut().pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Returns a buffer to the pool.
    pub(crate) fn give_buffer(&self, b: Vec<u8>) {
        if b.capacity() > 0 {
            self.buffers.borrow_mut().push(b);
        }
    }

    /// Queues an acknowledgement for the background task; returns its mark (see
    /// [`Unresolved::acks`]).
    pub(crate) fn push_ack(&self, ack: PendingAck) -> u64 {
        self.acks.borrow_mut().push_back(ack);
        let mark = self.acks_pushed.get() + 1;
        self.acks_pushed.set(mark);
        if let Some(w) = self.acker.borrow_mut().take() {
            w.wake();
        }
        mark
    }

    /// Counts the front acknowledgement collected (or dropped), recycles its buffer.
    pub(crate) fn ack_done(&self, bytes: Vec<u8>) {
        self.acks_done.set(self.acks_done.get() + 1);
        self.give_buffer(bytes);
    }

    /// An empty [`Unresolved`], reusing a spare's vectors.
    pub(crate) fn spare_unresolved(&self) -> Unresolved {
        self.spare.borrow_mut().pop().unwrap_or_default()
    }

    pub(crate) fn give_unresolved(&self, mut u: Unresolved) {
        u.starts.clear();
        u.marks.clear();
        self.spare.borrow_mut().push(u);
    }

    /// Forgets every unresolved commit: a recovery resolved the rings they wait on.
    pub(crate) fn drop_unresolved(&self) {
        let mut all = std::mem::take(&mut *self.unresolved.borrow_mut());
        for u in all.drain(..) {
            self.give_unresolved(u);
        }
        *self.unresolved.borrow_mut() = all;
    }

    pub(crate) fn push_doubt(&self, record: TxnRecord) {
        self.journal(b'D', |line| serde_json::to_writer(line, &record).expect("records serialize"));
        self.doubt.borrow_mut().push(record);
    }

    /// Writes what this worker's history holds, and what its clients count, to `file` as
    /// it happens, one line per event, so that the part of a process killed during the
    /// run can still be checked (lines: `D` record in doubt, `C` id of a record in doubt
    /// that committed, `H` record committed without being in doubt, `T` an event of the
    /// clients' tally; the bench reads them back). Each line is in the page cache before
    /// the call that journals it returns, so before anything that follows it leaves the
    /// process; the file is appended through a mapping, with no system call per line.
    pub fn set_journal(&self, file: hytra_fabric::append::AppendFile) {
        *self.journal.borrow_mut() = Some((file, Vec::new()));
    }

    /// Whether a journal is kept.
    pub fn journals(&self) -> bool {
        self.journal.borrow().is_some()
    }

    /// Appends one line `tag body` to the journal, if one is kept; `body` appends the
    /// body to the line it is given (holding `tag` and a space), and must only append.
    pub(crate) fn journal(&self, tag: u8, body: impl FnOnce(&mut Vec<u8>)) {
        let mut j = self.journal.borrow_mut();
        let Some((file, line)) = j.as_mut() else { return };
        line.clear();
        line.extend_from_slice(&[tag, b' ']);
        body(line);
        debug_assert!(line.starts_with(&[tag, b' ']), "a line's body is appended to it");
        debug_assert!(!line[2..].contains(&b'\n') && !line.contains(&0), "one line, no NUL");
        line.push(b'\n');
        file.append(&[line]).expect("the journal of a run is writable");
    }

    /// Appends one of the clients' tally events (`T`) to the journal, if one is kept:
    /// the workload layer writes them and folds them back into what a killed process's
    /// clients counted. `event` appends the event to the line it is given, without a
    /// newline.
    pub fn journal_tally(&self, event: impl FnOnce(&mut Vec<u8>)) {
        self.journal(b'T', event);
    }

    /// Takes the record in doubt of attempt `owner`, if there is one.
    pub(crate) fn take_doubt(&self, owner: u64) -> Option<TxnRecord> {
        let mut doubt = self.doubt.borrow_mut();
        let k = doubt.iter().rposition(|r| r.id == owner)?;
        Some(doubt.swap_remove(k))
    }

    /// The records of attempts whose fate this worker never learned (its node crashed
    /// or left the cluster while they logged): the run's end asks recovery's decisions
    /// ([`Engine::verdict`]) which committed.
    pub fn take_doubts(&self) -> Vec<TxnRecord> {
        std::mem::take(&mut *self.doubt.borrow_mut())
    }

    /// Called when a transaction coroutine ends (its context is dropped).
    pub(crate) fn coroutine_done(&self) {
        self.active.set(self.active.get() - 1);
        self.node.recovery.client_ended();
        if let Some(w) = self.acker.borrow_mut().take() {
            w.wake();
        }
    }

    /// The worker of `node` that applies this worker's log ring there: the one with the
    /// same index, so every backup worker owns one ring per node of the cluster.
    pub(crate) fn ring_owner(&self, node: NodeId) -> WorkerId {
        WorkerId { node, index: self.me.index }
    }
}

/// Crashes this coroutine's node here if the configuration's crash point says so (the
/// swarm's fault injection); the coroutine then never resumes. Nothing when no crash
/// point is set.
pub(crate) async fn crash_point<E: Endpoint>(co: &Co<E>, cfg: &TxnConfig, point: ProtocolPoint) {
    if cfg.crash_point.is_none() || !cfg.crashes_at(co.me().node, point, co.now_ns()) {
        return;
    }
    // What the point says was done is out of the node: frames queued for the end of
    // the step and requests behind a doorbell would die with it.
    co.flush();
    let crashed = co.with_ep(|ep| ep.crash_here());
    assert!(
        crashed,
        "a crash point needs a backend that crashes a node from inside (sim or local)"
    );
    std::future::pending::<()>().await;
}
