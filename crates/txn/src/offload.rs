//! The `offload` execution strategy (RedN's lookup in the engine): a location-cache miss
//! becomes one request that the primary's NIC answers with the record, without its CPU.
//!
//! Every node keeps a second index of its primary records, laid out for verb programs
//! (`hytra_nicindex::hash`): per table a two-choice bucket array whose entries name a
//! record (its offset and length in the table's region) under a 48-bit tag of its key.
//! Every node runs [`SLOTS_PER_NODE`] recycled lookup programs per coroutine of every
//! other node (built by the [`LookupPrograms`] the engine's caller hands it: the engine
//! knows the layout, not how verb programs are built), so that the parallel reads of one transaction at
//! one node each get one (SmallBank reads an account's savings and checking records
//! together). A program answers into its own slot of the coroutine:
//! the record if a bucket's tag matched, a copy of the two response entries (which one
//! fired, naming which record), and the request's sequence number last.
//!
//! The index is a hint, like the location cache: the client checks the record it gets
//! exactly as it checks a READ at a cached address. A key the NIC does not find (absent,
//! displaced by a full array, inserted a moment ago, or sharing its tag with a neighbour)
//! goes the hybrid way instead: an RPC that also returns the record's address. The index
//! is filed by the primary's CPU when a record is loaded or inserted; records never move,
//! so an entry stays right once written.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hytra_fabric::wq::{Sge, WqId};
use hytra_fabric::{Backend, LocalAddr, NodeId, Pages, Region, RegionSpec, Rkey, WorkerId};
use hytra_nicindex::hash::{self, Buckets};
use hytra_nicindex::lookup::{Answer, LookupPrograms, ENTRIES_BYTES};
use hytra_store::{Catalog, TableId};

use crate::config::ExecStrategy;
use crate::engine::{EngineError, OffloadError};

/// Lookups one coroutine may have in flight at one node; more go by RPC.
pub(crate) const SLOTS_PER_NODE: u16 = 2;

/// Offset in a slot of the completion word.
pub(crate) const DONE: u64 = 0;
/// Offset in a slot of the copy of the response entries.
pub(crate) const ENTRIES: u64 = 8;
/// Offset in a slot of the record sent back.
pub(crate) const ITEM: u64 = ENTRIES + ENTRIES_BYTES;

/// Buckets per record a partition may hold (numerator, denominator): a two-choice array
/// with one entry per bucket fills up near half full, where cuckoo insertion starts to
/// fail; at 40% it rarely does.
const BUCKETS_PER_RECORD: (u64, u64) = (5, 2);

/// Buckets of a table's array.
fn buckets(capacity: u64) -> u64 {
    (capacity * BUCKETS_PER_RECORD.0 / BUCKETS_PER_RECORD.1).max(1)
}

/// The lookup programs of a cluster and where they answer: the same on every node.
pub struct NicLookups {
    /// The region of every node's index.
    index_rkey: Rkey,
    /// Per table (by id), its bucket array in the index region.
    tables: Vec<Buckets>,
    /// Per worker index, the region its coroutines' slots live in (watched by it).
    answers: Vec<Rkey>,
    slot_bytes: u64,
    nodes: u16,
    workers: u16,
    /// Slots per worker and node: coroutines times [`SLOTS_PER_NODE`].
    lanes: u16,
    /// Queue that starts the program of (server, client worker's dense index, lane).
    triggers: Vec<Option<WqId>>,
    /// Per node, the queues its programs start from (rung once at the start).
    starters: Vec<Vec<WqId>>,
    /// Bytes of one program's code.
    code_bytes: u64,
}

/// One coroutine's slot for its lookups at one node.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Slot {
    /// The program's queue on the server that the request goes to.
    pub(crate) trigger: WqId,
    /// Offset of the slot in the worker's answer region.
    pub(crate) base: u64,
}

impl NicLookups {
    /// The lookups of execution strategy `exec`: set up for `offload` (which needs the
    /// programs its caller builds), none for the others.
    pub(crate) fn for_strategy<B: Backend>(
        backend: &mut B,
        catalog: &Catalog,
        exec: ExecStrategy,
        coroutines: u16,
        programs: Option<&dyn LookupPrograms>,
    ) -> Result<Option<Arc<NicLookups>>, EngineError> {
        match (exec, programs) {
            (ExecStrategy::Offload, Some(programs)) => Ok(Some(Arc::new(NicLookups::setup(
                backend,
                catalog,
                coroutines.max(1),
                programs,
            )?))),
            (ExecStrategy::Offload, None) => Err(OffloadError::NoPrograms.into()),
            _ => Ok(None),
        }
    }

    /// Registers the index, answer and code regions, builds and creates the lookup
    /// programs of every (server node, coroutine of another node). Fails with a clear error on
    /// a backend whose NIC runs no verb programs.
    pub(crate) fn setup<B: Backend>(
        backend: &mut B,
        catalog: &Catalog,
        coroutines: u16,
        programs: &dyn LookupPrograms,
    ) -> Result<NicLookups, EngineError> {
        let shape = backend.shape();
        let lanes = coroutines
            .checked_mul(SLOTS_PER_NODE)
            .ok_or(OffloadError::TooManySlots { coroutines })?;
        let mut at = 0;
        let mut tables = Vec::new();
        for spec in catalog.tables() {
            assert_eq!(usize::from(spec.id.0), tables.len(), "table ids are dense");
            let count = buckets(spec.capacity);
            let b = Buckets { rkey: Rkey(0), base: at, count };
            at += b.bytes();
            tables.push(b);
        }
        // Base pages: entries land at random across the arrays, which are sized for every
        // key a run may insert (most never are), so with huge pages each entry would make
        // 2 MiB resident and the load alone would touch all of it.
        let index_rkey =
            backend.register_all(RegionSpec::new(at.max(8)).with_pages(Pages::Base))?;
        for t in &mut tables {
            t.rkey = index_rkey;
        }
        let record_max =
            catalog.tables().map(|s| catalog.geometry(s.id).record_bytes).max().unwrap_or(8);
        let slot_bytes = ITEM + record_max;
        let answers = (0..shape.workers_per_node)
            .map(|i| {
                let len_bytes = u64::from(lanes) * u64::from(shape.nodes) * slot_bytes;
                backend.register_all(RegionSpec { watcher: Some(i), ..RegionSpec::new(len_bytes) })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut lookups = NicLookups {
            index_rkey,
            tables,
            answers,
            slot_bytes,
            nodes: shape.nodes,
            workers: shape.workers_per_node,
            lanes,
            triggers: vec![
                None;
                usize::from(shape.nodes) * shape.workers_total() * usize::from(lanes)
            ],
            starters: vec![Vec::new(); usize::from(shape.nodes)],
            code_bytes: 0,
        };
        lookups.code_bytes = code_bytes(programs)?;
        for s in 0..shape.nodes {
            let server = NodeId(s);
            let clients: Vec<WorkerId> = shape.workers().filter(|w| w.node != server).collect();
            let count = clients.len() as u64 * u64::from(lanes);
            let code_key =
                backend.register(server, RegionSpec::new((count * lookups.code_bytes).max(8)))?;
            let code = backend.hosts(server).then(|| backend.region(server, code_key));
            let mut next_wq = 0u32;
            let mut k = 0;
            for w in clients {
                for lane in 0..lanes {
                    let at = LocalAddr { rkey: code_key, offset: k * lookups.code_bytes };
                    k += 1;
                    let built = programs
                        .build(
                            server,
                            at,
                            lookups.code_bytes,
                            WqId(next_wq),
                            index_rkey,
                            w.node,
                            lookups.answer(server, w, lane),
                        )
                        .map_err(OffloadError::Build)?;
                    for spec in built.specs {
                        let id = backend
                            .create_wq(server, spec)
                            .map_err(|refusal| OffloadError::NoVerbPrograms { server, refusal })?;
                        assert_eq!(id, WqId(next_wq), "queue ids are dense");
                        next_wq += 1;
                    }
                    if let Some(Some(region)) = &code {
                        (built.write)(region);
                    }
                    let trigger = built.trigger;
                    lookups.starters[usize::from(s)].push(trigger);
                    let i = lookups.trigger_index(server, shape.worker_index(w), lane);
                    lookups.triggers[i] = Some(trigger);
                }
            }
        }
        Ok(lookups)
    }

    /// Where the program of `client`'s slot `lane` at `server` answers.
    fn answer(&self, server: NodeId, client: WorkerId, lane: u16) -> Answer {
        let base = self.slot_base(lane, server);
        Answer {
            rkey: self.answers[usize::from(client.index)],
            done: base + DONE,
            item: base + ITEM,
            entries: Some(base + ENTRIES),
        }
    }

    fn slot_base(&self, lane: u16, server: NodeId) -> u64 {
        (u64::from(lane) * u64::from(self.nodes) + u64::from(server.0)) * self.slot_bytes
    }

    fn trigger_index(&self, server: NodeId, client: usize, lane: u16) -> usize {
        let per_server = usize::from(self.nodes) * usize::from(self.workers);
        (usize::from(server.0) * per_server + client) * usize::from(self.lanes) + usize::from(lane)
    }

    /// Slot `k` (below [`SLOTS_PER_NODE`]) of coroutine `co` of the worker with dense
    /// index `me_idx`, for lookups at `server`.
    pub(crate) fn slot(&self, server: NodeId, me_idx: usize, co: u16, k: u16) -> Slot {
        assert!(k < SLOTS_PER_NODE, "slot {k} of {SLOTS_PER_NODE}");
        let lane = co * SLOTS_PER_NODE + k;
        assert!(lane < self.lanes, "coroutine {co} has no lookup slot");
        let trigger = self.triggers[self.trigger_index(server, me_idx, lane)]
            .expect("no lookup program serves a node's own records");
        Slot { trigger, base: self.slot_base(lane, server) }
    }

    /// The region of worker `index`'s slots.
    pub(crate) fn answers(&self, index: u16) -> Rkey {
        self.answers[usize::from(index)]
    }

    /// The region of every node's index.
    pub(crate) fn index_rkey(&self) -> Rkey {
        self.index_rkey
    }

    /// The bucket array of `table`.
    pub(crate) fn table(&self, table: TableId) -> Buckets {
        self.tables[usize::from(table.0)]
    }

    /// The queues node `node`'s programs start from.
    pub(crate) fn starters(&self, node: NodeId) -> &[WqId] {
        &self.starters[usize::from(node.0)]
    }

    /// Bytes of memory the lookups take on every node (index, answers, programs), for
    /// sizing a run before it is set up.
    pub fn bytes_per_node(
        catalog: &Catalog,
        workers: u16,
        coroutines: u16,
        programs: &dyn LookupPrograms,
    ) -> Result<u64, EngineError> {
        let index: u64 = catalog.tables().map(|s| buckets(s.capacity) * hash::BUCKET_BYTES).sum();
        let record_max =
            catalog.tables().map(|s| catalog.geometry(s.id).record_bytes).max().unwrap_or(8);
        let lanes = u64::from(coroutines) * u64::from(SLOTS_PER_NODE);
        let slots = u64::from(workers) * lanes * u64::from(catalog.nodes()) * (ITEM + record_max);
        // One program per slot of every other node's workers.
        let code = u64::from(catalog.nodes()) * u64::from(workers) * lanes * code_bytes(programs)?;
        Ok(index + 2 * slots + code)
    }
}

/// Bytes of one of `programs`' lookup programs (every one has the same shape), checked to
/// be whole 64-byte entries.
fn code_bytes(programs: &dyn LookupPrograms) -> Result<u64, EngineError> {
    match programs.code_bytes().map_err(OffloadError::Build)? {
        n if n > 0 && n % 64 == 0 => Ok(n),
        bytes => Err(OffloadError::CodeSize { bytes }.into()),
    }
}

/// A node's own index: its CPU files records in it.
pub(crate) struct NodeIndex {
    region: Region,
    /// One filer per table at a time (displacement moves entries between buckets).
    filers: Vec<Mutex<()>>,
    /// Entries displaced out of a full array (their keys fall back to RPC).
    lost: AtomicU64,
}

impl NodeIndex {
    pub(crate) fn new(region: Region, tables: usize) -> NodeIndex {
        NodeIndex {
            region,
            filers: (0..tables).map(|_| Mutex::new(())).collect(),
            lost: AtomicU64::new(0),
        }
    }

    /// Files `key`'s record (at `off`, `len` bytes, in region `rkey`) in `b`.
    pub(crate) fn file(
        &self,
        table: TableId,
        b: Buckets,
        key: u64,
        rkey: Rkey,
        off: u64,
        len: u64,
    ) {
        let entry = Sge { addr: LocalAddr { rkey, offset: off }, len: len as u32 };
        let _one = self.filers[usize::from(table.0)].lock().expect("no filer panicked");
        match hash::place(&self.region, b, hash::tag(key), entry, None) {
            Ok(()) => {}
            Err(hash::TableError::NoBucket(_)) => {
                self.lost.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => unreachable!("a tag is a valid key: {e}"),
        }
    }

    /// The entry filed under `key`'s tag in `b` (the CPU's lookup).
    pub(crate) fn find(&self, b: Buckets, key: u64) -> Option<Sge> {
        hash::find(&self.region, b, hash::tag(key))
    }

    /// (resident, mapped) bytes of the index's arrays (resident `None` where that
    /// cannot be told).
    pub(crate) fn memory(&self) -> (Option<u64>, u64) {
        (self.region.resident_bytes(), self.region.len_bytes())
    }

    /// Entries lost to a full array so far.
    pub(crate) fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}
