//! The transaction API and the execution phase.
//!
//! A coroutine owns one [`TxnCtx`]; [`TxnCtx::begin`] starts an attempt, the body reads
//! and writes through the [`Txn`], and [`Txn::commit`] runs validation, logging and
//! commit (`validate.rs`, `commit.rs`). Reads go to the record's primary: by the local
//! CPU when it is this node, else by the configured execution strategy. With outstanding
//! requests on, the reads of one call of [`Txn::read_many`] run in parallel as small
//! state machines (one READ, an index traversal, an RPC, or a fallback between them).
//!
//! ```ignore
//! let mut t = ctx.begin(SEND_PAYMENT);
//! let body = async {
//!     let [a, b] = t.read_many([(CHECKING, x), (CHECKING, y)], true).await?;
//!     let (ba, bb) = (t.get(a)[0], t.get(b)[0]);
//!     t.update(a)[0] = ba - 10;
//!     t.update(b)[0] = bb + 10;
//!     Ok(())
//! };
//! let outcome = t.finish(body.await).await;
//! ```

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use hytra_fabric::{
    Endpoint, LocalAddr, NodeId, PostError, Qp, Region, RemoteAddr, Rkey, WorkRequest, WorkerId,
};
use hytra_rt::{CallTicket, Co, OpError, OpTicket, RpcError, RpcType};
use hytra_store::layout::{
    self, search_bucket, RecordHeader, ABSENT, BUCKET_BYTES, RECORD_HEADER_WORDS,
};
use hytra_store::{Owner, Replica, TableId};

use crate::config::{ExecStrategy, LockStrategy, PlantedFault};
use crate::cpu::Path;
use crate::engine::{NodeEngine, WorkerTxn, SCRATCH_ATTEMPT_BYTES, SCRATCH_CO_BYTES};
use crate::log::EntryBuilder;
use crate::membership::Config;
use crate::offload::{self, Slot};
use crate::outcome::{Abort, AbortReason, Outcome};
use crate::stats::PhaseNs;
use crate::wire::{self, RecordReply, RecordReq, Status, LOCK_IT, WANT_OFFSET};
use hytra_nicindex::hash::tag;
use hytra_nicindex::lookup::{fired, request, ENTRIES_BYTES, REQUEST_WORDS};

/// Times a read is retried after finding its record torn before the attempt aborts.
const TORN_RETRIES_MAX: u32 = 16;

/// Doublings of a wait for a newer configuration after an attempt that found a node
/// unreachable or a lock stuck ([`TxnCtx::await_reconfiguration`],
/// [`TxnCtx::await_stuck_lock`]): from a sixty-fourth of a lease to a quarter.
const BACKOFF_DOUBLINGS_MAX: u32 = 4;

/// Attempts of a transaction that the same holder's lock may abort with only a yield
/// before the next ([`TxnCtx::await_stuck_lock`]): a live holder that was still
/// committing across two of them is common under contention, across three rare.
pub const STUCK_LOCK_REPEATS: u32 = 2;

/// Holders a transaction counts its blocked attempts for ([`TxnCtx::await_stuck_lock`]):
/// a dead lock among a few hot records' live holders is still counted, and the count
/// needs no allocation after the first transactions.
const STUCK_HOLDERS_MAX: usize = 4;

/// Times one access's READ, LOCK or VALIDATE call is sent again after timing out before
/// the attempt aborts: these calls are idempotent for an attempt, so a lost datagram
/// need not cost the transaction (a big one, hundreds of calls, would otherwise hardly
/// ever commit on a lossy network), while a dead or paused peer still ends it (P6).
pub(crate) const RPC_RESENDS_MAX: u8 = 3;

/// An attempt whose configuration is no longer in force (a newer one was installed, or
/// this node stopped): it may post nothing more (see [`TxnCtx::hold`]).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) struct Frozen;

impl From<Frozen> for Abort {
    fn from(_: Frozen) -> Abort {
        Abort(AbortReason::Reconfigured)
    }
}

/// A record in the transaction's access set (an index into it).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Rec(pub(crate) u16);

/// How a record of the access set is locked, if it is.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum Locked {
    No,
    /// By this node's CPU (CAS on the lock word).
    Cpu,
    /// By a NIC CAS (remote, or local through loopback).
    Nic,
    /// By the primary's CPU, on our RPC.
    Rpc,
    /// An RPC that would have locked it got no reply: maybe locked.
    Unknown,
}

/// One record the transaction touched.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Access {
    pub(crate) table: TableId,
    pub(crate) key: u64,
    /// The key's partition, and its primary under the attempt's configuration.
    pub(crate) partition: u16,
    pub(crate) node: NodeId,
    /// Record offset at the primary, once known.
    pub(crate) off: Option<u64>,
    /// Version word read (`None`: not read, a blind write or insert).
    pub(crate) read_version: Option<u64>,
    /// Version word when locked.
    pub(crate) lock_version: u64,
    /// Payload words: `ctx.payload[at..at + len]`.
    pub(crate) at: u32,
    pub(crate) len: u16,
    pub(crate) write: bool,
    pub(crate) insert: bool,
    pub(crate) delete: bool,
    pub(crate) locked: Locked,
    /// Whether the record held a value when read (or after the write).
    pub(crate) present: bool,
    /// Digest of the contents read (0: none kept, or no value), for the checker.
    pub(crate) read_digest: u64,
    /// Calls about this access sent again after a timeout.
    pub(crate) resends: u8,
}

impl Access {
    /// Whether a write leaves the record without a value: a delete, or a record read as
    /// absent and written without an insert (read for update, then left alone). Such a
    /// write installs an absent version, so it can neither create a row nor bring a
    /// deleted one back (docs/INVARIANTS.md T7).
    pub(crate) fn absent_after(&self) -> bool {
        self.delete || !self.present
    }
}

/// A read in flight.
pub(crate) enum Pending {
    /// An RPC READ.
    Call(CallTicket),
    /// A one-sided READ of `bytes` into scratch at `buf`.
    Op { ticket: OpTicket, buf: u64, stage: Stage },
    /// A lookup that the primary's NIC answers into slot `k` of this coroutine's slots
    /// for `node`.
    Nic { node: NodeId, k: usize, seq: u64 },
}

/// This coroutine's lookup slot at one node (offload strategy).
#[derive(Copy, Clone, Debug)]
pub(crate) struct NicSlot {
    slot: Slot,
    /// Sequence number of the last request.
    seq: u64,
    state: NicState,
}

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum NicState {
    Idle,
    /// A request is out: the program answers one at a time into one slot.
    Busy,
    /// A request got no answer in time: the slot is unused until its answer arrives.
    Late,
}

/// What to request next for a read.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Next {
    /// Nothing: the record (or its absence) is known.
    Done,
    /// READ the record at a stage's offset.
    Record(Stage),
    /// READ an index bucket.
    Bucket(u64),
    /// An RPC READ.
    Call { lock_now: bool, want_offset: bool },
}

/// What a one-sided READ in flight is for.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Stage {
    /// The record, at an offset from the location cache.
    Cached(u64),
    /// An index bucket (its index).
    Bucket(u64),
    /// The record, at an offset found by traversal.
    Record(u64),
}

/// A coroutine's transaction context: buffers reused by every transaction it runs.
pub struct TxnCtx<E: Endpoint> {
    pub(crate) co: Co<E>,
    pub(crate) wt: Rc<WorkerTxn>,
    pub(crate) node: Arc<NodeEngine>,
    pub(crate) co_index: u16,
    pub(crate) seq: u32,
    pub(crate) scratch: LocalAddr,
    pub(crate) scratch_region: Region,
    pub(crate) scratch_used: u64,
    pub(crate) acc: Vec<Access>,
    /// (table, key) to access index, kept once the access set is too large to search.
    acc_index: HashMap<(TableId, u64), u16>,
    /// Which accesses a multi-record read fetches (reused).
    fresh: Vec<usize>,
    pub(crate) payload: Vec<u64>,
    pub(crate) tmp: Vec<u64>,
    pub(crate) req: Vec<u8>,
    pub(crate) words: Vec<u64>,
    pub(crate) builders: Vec<EntryBuilder>,
    /// Tickets of the previous commit's staged (non-inline) write-backs: the staging
    /// area is reused only once they completed.
    pub(crate) staged: Vec<OpTicket>,
    /// Reused by every phase (the data path allocates nothing per transaction).
    pub(crate) pending: Vec<(usize, Pending)>,
    /// Follow-up reads waiting for scratch.
    stalled: Vec<(usize, Next)>,
    pub(crate) flights: Vec<(usize, crate::validate::Flight)>,
    pub(crate) log_flights: Vec<crate::commit::LogFlight>,
    /// The partitions the attempt writes (logging).
    pub(crate) written: Vec<u16>,
    /// The attempt's log entries: (backup, part, stream position, SKIP position).
    pub(crate) log_starts: Vec<(NodeId, u16, u64, Option<u64>)>,
    pub(crate) waits: Vec<OpTicket>,
    /// Connections the attempt's one-sided write-backs went on, and the mark of its last
    /// passive acknowledgement: what must land before its log entries resolve (L7).
    pub(crate) landing: Vec<Qp>,
    pub(crate) acks_mark: Option<u64>,
    pub(crate) owner: Owner,
    pub(crate) ty: u8,
    pub(crate) txn_start: u64,
    pub(crate) attempt_start: u64,
    pub(crate) attempts: u32,
    /// The holder of a lock that aborted the current attempt on contention, where the
    /// attempt saw it (reset every attempt; see [`TxnCtx::blocked`]).
    blocked_by: Option<Owner>,
    /// The holders that blocked this transaction's attempts, each with the number of
    /// attempts it blocked (at most [`STUCK_HOLDERS_MAX`]; cleared every transaction).
    stuck: Vec<(Owner, u32)>,
    pub(crate) phase_ns: PhaseNs,
    /// Per node, this coroutine's lookup slots (offload strategy; empty otherwise, and
    /// for its own node).
    nic: Vec<Vec<NicSlot>>,
    /// The region of this worker's lookup slots.
    nic_region: Option<Region>,
    /// The configuration the current attempt runs under (taken at its start).
    pub(crate) config: Arc<Config>,
}

impl<E: Endpoint> Drop for TxnCtx<E> {
    fn drop(&mut self) {
        // The last commit's staged write-backs (passive ACK) are collected by the
        // background task: a ticket is waited for exactly once (R5).
        self.wt.orphans.borrow_mut().append(&mut self.staged);
        self.wt.coroutine_done();
    }
}

impl<E: Endpoint> TxnCtx<E> {
    pub(crate) fn new(co: Co<E>, wt: Rc<WorkerTxn>, co_index: u16) -> TxnCtx<E> {
        let node = wt.node.clone();
        let config = wt.view.get().clone();
        let scratch = node.scratch.base(co.me().index, co_index);
        let scratch_region = co.region(scratch.rkey).expect("scratch region");
        let nodes = usize::from(co.shape().nodes);
        let me = co.me();
        let (nic, nic_region) = match &node.offload {
            Some((lookups, _)) => {
                let slots = |n: u16| {
                    let node = NodeId(n);
                    let slot = |k| NicSlot {
                        slot: lookups.slot(node, wt.me_idx, co_index, k),
                        seq: 0,
                        state: NicState::Idle,
                    };
                    match node == me.node {
                        true => Vec::new(),
                        false => (0..offload::SLOTS_PER_NODE).map(slot).collect(),
                    }
                };
                let region = co.region(lookups.answers(me.index)).expect("lookup slot region");
                ((0..nodes as u16).map(slots).collect(), Some(region))
            }
            None => (Vec::new(), None),
        };
        TxnCtx {
            co,
            wt,
            node,
            co_index,
            seq: 0,
            scratch,
            scratch_region,
            scratch_used: 0,
            acc: Vec::with_capacity(64),
            acc_index: HashMap::new(),
            fresh: Vec::with_capacity(32),
            payload: Vec::with_capacity(1024),
            tmp: Vec::with_capacity(128),
            req: Vec::with_capacity(256),
            words: Vec::with_capacity(512),
            builders: (0..nodes).map(|_| EntryBuilder::default()).collect(),
            staged: Vec::new(),
            pending: Vec::with_capacity(16),
            stalled: Vec::new(),
            flights: Vec::with_capacity(16),
            log_flights: Vec::with_capacity(8),
            written: Vec::with_capacity(16),
            log_starts: Vec::with_capacity(16),
            waits: Vec::with_capacity(16),
            landing: Vec::with_capacity(8),
            acks_mark: None,
            owner: Owner(0),
            ty: 0,
            txn_start: 0,
            attempt_start: 0,
            attempts: 0,
            blocked_by: None,
            stuck: Vec::with_capacity(STUCK_HOLDERS_MAX),
            phase_ns: PhaseNs::default(),
            nic,
            nic_region,
            config,
        }
    }

    /// The coroutine handle.
    pub fn co(&self) -> &Co<E> {
        &self.co
    }

    /// This client's coroutine among its worker's (0-based).
    pub fn index(&self) -> u16 {
        self.co_index
    }

    /// The worker's shared transaction state.
    pub fn worker(&self) -> &Rc<WorkerTxn> {
        &self.wt
    }

    /// Starts a transaction of workload type `ty` (for per-type counts); the first attempt.
    pub fn begin(&mut self, ty: u8) -> Txn<'_, E> {
        assert!(
            usize::from(ty) < crate::stats::TXN_TYPES_MAX,
            "transaction type {ty} out of range"
        );
        self.ty = ty;
        self.attempts = 0;
        self.stuck.clear();
        self.start_attempt()
    }

    /// Starts another attempt of the current transaction, after an abort.
    pub fn retry(&mut self) -> Txn<'_, E> {
        self.start_attempt()
    }

    fn start_attempt(&mut self) -> Txn<'_, E> {
        if self.config.epoch != self.wt.view.get().epoch {
            self.config = self.wt.view.get().clone();
        }
        self.seq = self.seq.wrapping_add(1);
        self.owner = Owner::new(self.wt.me_idx, self.co_index, self.config.epoch, self.seq);
        self.attempts += 1;
        self.blocked_by = None;
        self.acc.clear();
        self.acc_index.clear();
        self.payload.clear();
        self.scratch_used = 0;
        self.phase_ns = PhaseNs::default();
        self.attempt_start = self.co.now_ns();
        if self.attempts == 1 {
            self.txn_start = self.attempt_start;
        }
        self.co.charge_term(crate::cpu::ATTEMPT[usize::from(self.ty)], 1);
        Txn { ctx: self }
    }

    /// Attempts of the current transaction so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Scratch memory for one READ destination, reset every attempt.
    pub(crate) fn scratch(&mut self, bytes: u64) -> Result<LocalAddr, Abort> {
        if self.scratch_used + bytes > SCRATCH_ATTEMPT_BYTES {
            return Err(Abort(AbortReason::Full));
        }
        let addr =
            LocalAddr { rkey: self.scratch.rkey, offset: self.scratch.offset + self.scratch_used };
        self.scratch_used += bytes;
        Ok(addr)
    }

    /// Requests an attempt keeps in flight before it collects them: one without
    /// outstanding requests; with them, its share of half the worker's call slots. A slot
    /// is free again only once its caller collected the reply, so coroutines that each
    /// sent as many as they had records could together take every slot, and then each
    /// would wait for one more while none collected (YCSB-E's scans of a thousand records
    /// did). The other half is for the background task and for membership.
    pub(crate) fn in_flight_max(&self) -> usize {
        if !self.node.cfg.outstanding {
            return 1;
        }
        (hytra_rt::constants::CALLS_MAX / 2 / usize::from(self.node.scratch.coroutines)).max(1)
    }

    /// Whether a newer configuration was installed since the attempt began: it may post
    /// nothing more that changes another node's memory (the node is quiescing its
    /// connections for recovery).
    pub(crate) fn frozen(&self) -> bool {
        self.config.epoch != self.node.membership.epoch()
    }

    /// Waits until the attempt may post: its configuration in force, no recovery in
    /// progress and this node's lease valid. `Frozen` once a newer configuration is
    /// installed or the node stopped: then it posts nothing more, ever (recovery counts
    /// on it, see `recover.rs`). Every post and call of an attempt passes here in the
    /// step that makes it.
    pub(crate) async fn hold(&self) -> Result<(), Frozen> {
        let rec = &self.node.recovery;
        loop {
            if self.frozen() {
                return Err(Frozen);
            }
            // The step's time, free to read: set after any pause, before any coroutine
            // of the step runs, so it never hides a lapsed lease by more than a step.
            if rec.open(self.co.step_time_ns()) {
                return Ok(());
            }
            if rec.ended() {
                return Err(Frozen);
            }
            self.co.sleep_until(self.co.now_ns() + rec.poll_ns()).await;
        }
    }

    /// Whether this node left the cluster or the run cannot go on: clients stop.
    pub fn halted(&self) -> bool {
        self.node.recovery.ended()
    }

    /// Waits before the next attempt of a transaction whose last attempt found a node
    /// unreachable: until a configuration newer than that attempt's is in force (the
    /// node was removed), this node stops, or a backoff passes that doubles with the
    /// attempts from a sixty-fourth of a lease up to a quarter of one. Attempts against
    /// the same configuration fail the same way, and on a fabric that reports a dead
    /// peer at once they would spend all of a transaction's attempts within a
    /// millisecond, long before recovery (a lease or more) can remove it.
    pub async fn await_reconfiguration(&self) {
        let doublings = self.attempts.saturating_sub(1);
        self.await_epoch_or_backoff(doublings).await;
    }

    /// Waits before the next attempt of a transaction whose last attempt was aborted by
    /// a lock that the same attempt of another transaction also held in at least
    /// [`STUCK_LOCK_REPEATS`] earlier attempts of it (not necessarily in a row: other
    /// aborts between them do not count), as [`TxnCtx::await_reconfiguration`] does,
    /// the backoff doubling with the further blocks; returns whether it waited. A live
    /// transaction holds its locks for a commit, but one whose node died holds them
    /// until recovery removes the node (a new epoch makes them stale, L6): retries that
    /// only yield would spend all of a transaction's attempts long before that, without
    /// ever sending the dead node a request that could find it unreachable.
    pub async fn await_stuck_lock(&mut self) -> bool {
        let Some(holder) = self.blocked_by else {
            return false;
        };
        let blocks = match self.stuck.iter_mut().find(|(h, _)| *h == holder) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                if self.stuck.len() == STUCK_HOLDERS_MAX {
                    // The holder that blocked fewest attempts gives way.
                    let least = (0..self.stuck.len()).min_by_key(|&i| self.stuck[i].1);
                    self.stuck.swap_remove(least.expect("a full list"));
                }
                self.stuck.push((holder, 1));
                1
            }
        };
        assert!(self.stuck.len() <= STUCK_HOLDERS_MAX);
        if blocks <= STUCK_LOCK_REPEATS {
            return false;
        }
        self.wt.stats.borrow_mut().stuck_lock_waits += 1;
        self.await_epoch_or_backoff(blocks - 1 - STUCK_LOCK_REPEATS).await;
        true
    }

    /// Sleeps until a configuration newer than the attempt's is in force, this node
    /// stops, or a backoff passes of a sixty-fourth of a lease doubled `doublings` times
    /// (at most [`BACKOFF_DOUBLINGS_MAX`]: a quarter of a lease).
    async fn await_epoch_or_backoff(&self, doublings: u32) {
        let rec = &self.node.recovery;
        let polls = 1u64 << doublings.min(BACKOFF_DOUBLINGS_MAX);
        let until = self.co.now_ns().saturating_add(polls * rec.poll_ns());
        // Bounded by `until`: a poll interval is at least a microsecond.
        while !self.frozen() && !rec.ended() && self.co.now_ns() < until {
            self.co.sleep_until((self.co.now_ns() + rec.poll_ns()).min(until)).await;
        }
    }

    /// Aborts the attempt on contention with `reason`, blocked by the lock word `lock`
    /// (the holder its failed lock or check saw). Of the holders one attempt meets (its
    /// requests land together), the one that blocked the transaction most often is
    /// kept, so that a stuck lock among live ones is counted every time.
    pub(crate) fn blocked(&mut self, reason: AbortReason, lock: u64) -> Abort {
        debug_assert!(reason.class() == crate::AbortClass::Contention, "{reason:?}");
        // A lock read again after a failed takeover may have been released since, or be
        // a stale one of an earlier epoch (no lock, L6).
        let holder = Owner(lock);
        if lock != 0 && lock != self.owner.0 && holder.holds_in(self.owner) {
            let blocks = |o: Owner| self.stuck.iter().find(|(h, _)| *h == o).map_or(0, |s| s.1);
            if self.blocked_by.is_none_or(|b| blocks(holder) > blocks(b)) {
                self.blocked_by = Some(holder);
            }
        }
        Abort(reason)
    }

    /// Notes a torn read of a record whose lock word was `lock`: should the record stay
    /// torn and end the attempt, its writer (the holder) is what blocked it. A writer that
    /// died part way through a write-back holds the record until recovery mends it (L4),
    /// and its readers wait for that as for any lock a dead node left (T4).
    fn torn_under(&mut self, lock: u64) {
        let _ = self.blocked(AbortReason::Torn, lock);
    }

    /// Takes the CPU lock of the record at `off` of `replica` for this attempt, or
    /// aborts it on the holder.
    pub(crate) fn lock_cpu(&mut self, replica: &Replica, off: u64) -> Result<(), Abort> {
        replica
            .try_lock(off, self.owner)
            .map_err(|holder| self.blocked(AbortReason::Conflict, holder))
    }

    /// Appends one of the clients' tally events to the worker's journal, if it keeps one
    /// ([`WorkerTxn::journal_tally`]).
    pub fn journal_tally(&self, event: impl FnOnce(&mut Vec<u8>)) {
        self.wt.journal_tally(event);
    }

    /// The epoch of the attempt's configuration, as messages carry it.
    pub(crate) fn epoch(&self) -> u32 {
        self.config.epoch as u32
    }

    /// The region key of access `a`'s record at its primary (the same on every node).
    pub(crate) fn rkey(&self, a: &Access) -> Rkey {
        self.node.catalog.rkey(a.table, a.partition)
    }

    /// The generation of access `a`'s partition's placement, as the location cache
    /// keeps it.
    pub(crate) fn generation(&self, a: &Access) -> u8 {
        self.config.placement.part(a.partition).generation
    }

    /// This node's replica of access `a`'s partition (its primary's, for a local access).
    pub(crate) fn replica(&self, a: &Access) -> &Replica {
        self.node.store.replica(a.table, a.partition)
    }

    /// The staging area for write-backs that do not fit inline.
    pub(crate) fn staging(&self) -> (LocalAddr, u64) {
        let at = LocalAddr {
            rkey: self.scratch.rkey,
            offset: self.scratch.offset + SCRATCH_ATTEMPT_BYTES,
        };
        (at, SCRATCH_CO_BYTES - SCRATCH_ATTEMPT_BYTES)
    }
}

/// What a transaction will do with a record it reads.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Intent {
    /// Only read it.
    Read,
    /// Write it: it joins the write set (FaSST-style designs lock it as they read it).
    Update,
}

/// One attempt of a transaction.
pub struct Txn<'a, E: Endpoint> {
    pub(crate) ctx: &'a mut TxnCtx<E>,
}

impl<E: Endpoint> Txn<'_, E> {
    /// The attempt's identity, as the checker's history and [`crate::Engine::verdict`]
    /// name it.
    pub fn id(&self) -> u64 {
        self.ctx.owner.0
    }

    /// Appends one of the clients' tally events to the worker's journal, if it keeps one
    /// ([`WorkerTxn::journal_tally`]).
    pub fn journal_tally(&self, event: impl FnOnce(&mut Vec<u8>)) {
        self.ctx.wt.journal_tally(event);
    }

    /// Reads a record.
    pub async fn read(&mut self, table: TableId, key: u64) -> Result<Rec, Abort> {
        let [r] = self.read_many([(table, key)], false).await?;
        Ok(r)
    }

    /// Reads a record that the transaction will write (FaSST-style designs lock it now).
    pub async fn read_for_update(&mut self, table: TableId, key: u64) -> Result<Rec, Abort> {
        let [r] = self.read_many([(table, key)], true).await?;
        Ok(r)
    }

    /// Reads any number of records (their handles into `out`, in order), in parallel
    /// when outstanding requests are on.
    pub async fn read_all(
        &mut self,
        keys: &[(TableId, u64)],
        for_update: bool,
        out: &mut Vec<Rec>,
    ) -> Result<(), Abort> {
        let intent = if for_update { Intent::Update } else { Intent::Read };
        self.read_each(keys.iter().map(|&(t, k)| (t, k, intent)), out).await
    }

    /// Reads any number of records, each with its own [`Intent`], as one batch (their
    /// handles into `out`, in order): a transaction that reads some records and updates
    /// others fetches them all in one round of requests. A record named twice is fetched
    /// once, for update if either names it so.
    pub async fn read_batch(
        &mut self,
        keys: &[(TableId, u64, Intent)],
        out: &mut Vec<Rec>,
    ) -> Result<(), Abort> {
        self.read_each(keys.iter().copied(), out).await
    }

    async fn read_each(
        &mut self,
        keys: impl Iterator<Item = (TableId, u64, Intent)>,
        out: &mut Vec<Rec>,
    ) -> Result<(), Abort> {
        out.clear();
        let mut fresh = std::mem::take(&mut self.ctx.fresh);
        fresh.clear();
        let mut result = Ok(());
        for (table, key, intent) in keys {
            match self.ctx.access(table, key) {
                Ok((idx, new)) => {
                    if intent == Intent::Update {
                        self.ctx.acc[idx].write = true;
                    }
                    out.push(Rec(idx as u16));
                    if new {
                        fresh.push(idx);
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            result = self.ctx.fetch(&fresh).await;
        }
        self.ctx.fresh = fresh;
        result
    }

    /// Reads several records, in parallel when outstanding requests are on.
    pub async fn read_many<const N: usize>(
        &mut self,
        keys: [(TableId, u64); N],
        for_update: bool,
    ) -> Result<[Rec; N], Abort> {
        let mut recs = [Rec(0); N];
        // The accesses named here for the first time, in order: `fresh[..n]`.
        let (mut fresh, mut n) = ([0usize; N], 0);
        for (i, &(table, key)) in keys.iter().enumerate() {
            let (idx, new) = self.ctx.access(table, key)?;
            if for_update {
                self.ctx.acc[idx].write = true;
            }
            recs[i] = Rec(idx as u16);
            if new {
                fresh[n] = idx;
                n += 1;
            }
        }
        self.ctx.fetch(&fresh[..n]).await?;
        Ok(recs)
    }

    /// Whether a record held a value when read.
    pub fn exists(&self, r: Rec) -> bool {
        self.ctx.acc[usize::from(r.0)].present
    }

    /// A record's payload words, as read (or as written so far).
    pub fn get(&self, r: Rec) -> &[u64] {
        let a = &self.ctx.acc[usize::from(r.0)];
        &self.ctx.payload[a.at as usize..a.at as usize + usize::from(a.len)]
    }

    /// A record's payload words, to change; the record joins the write set.
    pub fn update(&mut self, r: Rec) -> &mut [u64] {
        let a = &mut self.ctx.acc[usize::from(r.0)];
        assert!(
            a.present || a.insert,
            "update of an absent record (insert it instead): {:?} key {}, read at {:?} (offset {:?})",
            a.table,
            a.key,
            a.read_version,
            a.off
        );
        a.write = true;
        let (at, len) = (a.at as usize, usize::from(a.len));
        &mut self.ctx.payload[at..at + len]
    }

    /// Writes a record without reading it first.
    pub async fn write(&mut self, table: TableId, key: u64, payload: &[u64]) -> Result<Rec, Abort> {
        // The write still needs the record's offset and version for one-sided locking, so
        // it is read for update; validation then also checks it did not change.
        let r = self.read_for_update(table, key).await?;
        self.update(r).copy_from_slice(payload);
        Ok(r)
    }

    /// Inserts a record that must not exist.
    pub fn insert(&mut self, table: TableId, key: u64, payload: &[u64]) -> Result<Rec, Abort> {
        let (idx, new) = self.ctx.access(table, key)?;
        assert!(new, "insert of a key the transaction already touched");
        let a = &mut self.ctx.acc[idx];
        assert_eq!(usize::from(a.len), payload.len(), "payload size of table {table:?}");
        (a.write, a.insert, a.present) = (true, true, true);
        let at = a.at as usize;
        self.ctx.payload[at..at + payload.len()].copy_from_slice(payload);
        Ok(Rec(idx as u16))
    }

    /// Inserts a record this transaction read and found absent: locking checks it is
    /// still absent, so a concurrent insert of the same key makes one of them abort.
    pub fn insert_over(&mut self, r: Rec, payload: &[u64]) -> Result<Rec, Abort> {
        let a = &mut self.ctx.acc[usize::from(r.0)];
        assert!(!a.present, "insert over a present record (update it instead)");
        assert_eq!(usize::from(a.len), payload.len(), "payload size of table {:?}", a.table);
        (a.write, a.insert, a.present) = (true, true, true);
        let at = a.at as usize;
        self.ctx.payload[at..at + payload.len()].copy_from_slice(payload);
        Ok(r)
    }

    /// Deletes a record read before.
    pub fn delete(&mut self, r: Rec) {
        let a = &mut self.ctx.acc[usize::from(r.0)];
        assert!(a.present, "delete of an absent record");
        (a.write, a.delete) = (true, true);
    }

    /// The node serving `key` of `table` in this attempt's configuration: where a
    /// workload sends requests of its own about the record's partition (such as a
    /// lookup in a secondary index that lives with the partition's replicas).
    pub fn primary_of(&self, table: TableId, key: u64) -> NodeId {
        self.ctx.config.primary(self.ctx.node.catalog.partition(table, key))
    }

    /// The context (for the workload's own bookkeeping).
    pub fn ctx(&self) -> &TxnCtx<E> {
        self.ctx
    }

    /// Ends the attempt: commits if the body succeeded, else aborts with its reason.
    pub async fn finish(self, body: Result<(), Abort>) -> Outcome {
        match body {
            Ok(()) => self.commit().await,
            Err(Abort(reason)) => self.abort(reason).await,
        }
    }
}

impl<E: Endpoint> TxnCtx<E> {
    /// The access of (table, key), added if new: (index, whether new).
    fn access(&mut self, table: TableId, key: u64) -> Result<(usize, bool), Abort> {
        // A scan is fastest for the few records most transactions touch; large sets
        // (Stock-Level reads hundreds) get a map.
        const SCAN_MAX: usize = 24;
        if self.acc.len() < SCAN_MAX {
            if let Some(i) = self.acc.iter().position(|a| a.table == table && a.key == key) {
                return Ok((i, false));
            }
        } else {
            if self.acc_index.is_empty() {
                let entries =
                    self.acc.iter().enumerate().map(|(i, a)| ((a.table, a.key), i as u16));
                self.acc_index.extend(entries);
            }
            if let Some(&i) = self.acc_index.get(&(table, key)) {
                return Ok((usize::from(i), false));
            }
            self.acc_index.insert((table, key), self.acc.len() as u16);
        }
        assert!(self.acc.len() < usize::from(u16::MAX), "access set too large");
        let c = self.node.catalog.as_ref();
        let len = c.spec(table).payload_words;
        let at = self.payload.len() as u32;
        self.payload.resize(self.payload.len() + usize::from(len), 0);
        let partition = c.partition(table, key);
        self.acc.push(Access {
            table,
            key,
            partition,
            node: self.config.primary(partition),
            off: None,
            read_version: None,
            lock_version: 0,
            at,
            len,
            write: false,
            insert: false,
            delete: false,
            locked: Locked::No,
            present: false,
            read_digest: 0,
            resends: 0,
        });
        Ok((self.acc.len() - 1, true))
    }

    /// Fetches the accesses listed in `idxs`, each for update when it is in the write
    /// set (it joined it when it was named, before any fetch).
    async fn fetch(&mut self, idxs: &[usize]) -> Result<(), Abort> {
        let mut pending = std::mem::take(&mut self.pending);
        // The reads of earlier calls all landed (and were copied out): their scratch is
        // free. Execution uses scratch for nothing else.
        self.scratch_used = 0;
        let mut result = Ok(());
        for &i in idxs {
            let started = match self.start_read(i).await {
                Err(Abort(AbortReason::Full)) if self.scratch_used > 0 => {
                    // No scratch left for another READ: land those in flight, whose
                    // scratch is then free (with one read out at a time they all landed
                    // already), and start this one again.
                    result = self.drain(&mut pending).await;
                    if result.is_err() {
                        break;
                    }
                    self.scratch_used = 0;
                    self.start_read(i).await
                }
                started => started,
            };
            match started {
                Ok(Some(p)) => pending.push((i, p)),
                Ok(None) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            if pending.len() >= self.in_flight_max() {
                result = self.drain(&mut pending).await;
                if result.is_err() {
                    break;
                }
            }
        }
        // Whatever happened, collect what is in flight (no ticket may leak).
        let drained = self.drain(&mut pending).await;
        self.pending = pending;
        result.and(drained)
    }

    /// Completes every pending read, issuing follow-up requests as they come. A follow-up
    /// that finds no scratch left waits until everything in flight landed (then all the
    /// scratch is free). After a failure it only collects what is in flight (no ticket
    /// may leak).
    async fn drain(&mut self, pending: &mut Vec<(usize, Pending)>) -> Result<(), Abort> {
        let mut result = Ok(());
        let mut follow_ups = 0;
        let bound = TORN_RETRIES_MAX as usize * (pending.len() + 1);
        let mut stalled = std::mem::take(&mut self.stalled);
        stalled.clear();
        loop {
            while let Some((i, p)) = pending.pop() {
                self.co.ring_doorbells();
                let next = match self.wait_read(i, p).await {
                    Ok(Next::Done) => continue,
                    Ok(next) => next,
                    Err(e) => {
                        result = result.and(Err(e));
                        continue;
                    }
                };
                follow_ups += 1;
                if follow_ups > bound {
                    // Records that stay torn (or caches that stay stale) end the attempt.
                    result = result.and(Err(Abort(AbortReason::Torn)));
                }
                if result.is_err() {
                    continue;
                }
                match self.follow(i, next).await {
                    Ok(p) => pending.push((i, p)),
                    Err(Abort(AbortReason::Full)) => stalled.push((i, next)),
                    Err(e) => result = Err(e),
                }
            }
            if stalled.is_empty() || result.is_err() {
                break;
            }
            // Everything in flight landed: the scratch is free for the stalled ones (at
            // least the first fits, so every round makes progress; a follow-up that does
            // not fit an empty scratch ends the attempt).
            self.scratch_used = 0;
            for (i, next) in std::mem::take(&mut stalled) {
                match self.follow(i, next).await {
                    Ok(p) => pending.push((i, p)),
                    Err(Abort(AbortReason::Full)) if !pending.is_empty() => stalled.push((i, next)),
                    Err(e) => result = Err(e),
                }
            }
        }
        stalled.clear();
        self.stalled = stalled;
        result
    }

    /// Issues the follow-up request of access `i`.
    async fn follow(&mut self, i: usize, next: Next) -> Result<Pending, Abort> {
        let for_update = self.acc[i].write;
        match next {
            Next::Done => unreachable!("nothing to follow"),
            Next::Record(stage) => self.read_record(i, stage).await,
            Next::Bucket(b) => self.read_bucket(i, b).await,
            Next::Call { lock_now, want_offset } => {
                self.call_read(i, lock_now && for_update, want_offset).await
            }
        }
    }

    /// Starts the read of access `i`: `None` if it completed at once (local record).
    async fn start_read(&mut self, i: usize) -> Result<Option<Pending>, Abort> {
        let a = self.acc[i];
        let for_update = a.write;
        if a.node == self.co.me().node {
            self.co.charge_term(crate::cpu::exec_term(Path::Local), 1);
            // Local memory is read without the fabric: the attempt still waits out a
            // recovery (its node's records are being resolved).
            self.hold().await?;
            self.read_local(i, for_update)?;
            return Ok(None);
        }
        let lock_now = for_update && self.node.cfg.lock == LockStrategy::AtExecution;
        let cached = if self.node.cfg.exec.reads_cache() {
            let hit = self.node.store.cache().get(a.table, a.key, self.generation(&a));
            let mut s = self.wt.stats.borrow_mut();
            if hit.is_some() {
                s.cache_hits += 1
            } else {
                s.cache_misses += 1
            }
            hit
        } else {
            None
        };
        let by_rpc = match (self.node.cfg.exec, cached) {
            (ExecStrategy::TwoSided, _) => true,
            (ExecStrategy::Hybrid, Some(_)) => lock_now,
            (ExecStrategy::Hybrid, None) => true,
            _ => false,
        };
        let path = if by_rpc { Path::Rpc } else { Path::OneSided };
        self.co.charge_term(crate::cpu::exec_term(path), 1);
        let home = self.node.catalog.geometry(a.table).home_bucket(a.key);
        let pending = match (self.node.cfg.exec, cached) {
            (ExecStrategy::TwoSided, _) => self.call_read(i, lock_now, false).await?,
            (ExecStrategy::Hybrid, Some(off)) if !lock_now => {
                self.read_record(i, Stage::Cached(off)).await?
            }
            (ExecStrategy::Hybrid, _) => self.call_read(i, lock_now, true).await?,
            (ExecStrategy::OneSidedCached, Some(off)) => {
                self.read_record(i, Stage::Cached(off)).await?
            }
            (ExecStrategy::OneSidedCached | ExecStrategy::OneSided, _) => {
                self.read_bucket(i, home).await?
            }
            (ExecStrategy::Offload, Some(off)) => self.read_record(i, Stage::Cached(off)).await?,
            (ExecStrategy::Offload, None) => match self.nic_lookup(i) {
                Some(p) => p,
                None => self.call_read(i, false, true).await?,
            },
        };
        Ok(Some(pending))
    }

    /// Sends the lookup of access `i` to its primary's NIC: `None` if this coroutine's
    /// slot there is taken (or still waiting for a late answer), or the request cannot be
    /// sent.
    fn nic_lookup(&mut self, i: usize) -> Option<Pending> {
        let a = self.acc[i];
        let n = usize::from(a.node.0);
        let region = self.nic_region.as_ref().expect("offload strategy");
        for s in self.nic[n].iter_mut().filter(|s| s.state == NicState::Late) {
            if region.load(s.slot.base + offload::DONE) == s.seq {
                s.state = NicState::Idle;
            }
        }
        let Some(k) = self.nic[n].iter().position(|s| s.state == NicState::Idle) else {
            self.wt.stats.borrow_mut().nic_busy += 1;
            return None;
        };
        let s = &mut self.nic[n][k];
        let (lookups, _) = self.node.offload.as_ref().expect("offload strategy");
        let req = request(lookups.table(a.table), tag(a.key), s.seq + 1);
        let mut bytes = [0u8; REQUEST_WORDS * 8];
        for (b, w) in bytes.chunks_exact_mut(8).zip(req) {
            b.copy_from_slice(&w.to_le_bytes());
        }
        let trigger = s.slot.trigger;
        if self.co.with_ep(|ep| ep.trigger(a.node, trigger, &bytes)).is_err() {
            self.wt.stats.borrow_mut().nic_busy += 1;
            return None;
        }
        s.seq += 1;
        s.state = NicState::Busy;
        self.wt.stats.borrow_mut().nic_lookups += 1;
        Some(Pending::Nic { node: a.node, k, seq: s.seq })
    }

    /// Handles the answer of a lookup: the record if the NIC found it, else the RPC.
    fn on_nic_answer(&mut self, i: usize, base: u64) -> Result<Next, Abort> {
        let a = self.acc[i];
        let region = self.nic_region.as_ref().expect("offload strategy");
        let mut entries = [0u64; (ENTRIES_BYTES / 8) as usize];
        region.read_words(base + offload::ENTRIES, &mut entries);
        let words = (RECORD_HEADER_WORDS + u64::from(a.len)) as usize;
        let rkey = self.rkey(&a);
        // Both responses write the item, the second last: the second's record is there
        // if both buckets matched the tag.
        let sent = match fired(&entries) {
            [_, Some(e)] | [Some(e), None] => Some(e),
            [None, None] => None,
        };
        self.words.resize(words, 0);
        region.read_words(base + offload::ITEM, &mut self.words);
        let h = RecordHeader::parse(&self.words);
        match sent {
            Some(e) if e.addr.rkey == rkey && e.len as usize == words * 8 && h.key == a.key => {
                self.wt.stats.borrow_mut().nic_found += 1;
                self.accept_record(i, Stage::Record(e.addr.offset))
            }
            // Absent, not filed yet, displaced, or a neighbour with the same tag.
            _ => {
                self.wt.stats.borrow_mut().nic_fallbacks += 1;
                Ok(Next::Call { lock_now: false, want_offset: true })
            }
        }
    }

    fn read_local(&mut self, i: usize, for_update: bool) -> Result<(), Abort> {
        let a = self.acc[i];
        let node = self.node.clone();
        let replica = node.store.replica(a.table, a.partition);
        let Some(off) = replica.lookup(a.key) else {
            self.took(i, ABSENT);
            return Ok(());
        };
        if for_update && self.node.cfg.lock == LockStrategy::AtExecution {
            self.lock_cpu(replica, off)?;
            self.acc[i].locked = Locked::Cpu;
        }
        let range = a.at as usize..a.at as usize + usize::from(a.len);
        let snap = replica
            .read(off, a.key, &mut self.payload[range])
            .map_err(|_| self.blocked(AbortReason::Torn, replica.header(off).lock))?;
        self.took(i, snap.version);
        let a = &mut self.acc[i];
        a.off = Some(off);
        if a.locked != Locked::No {
            a.lock_version = snap.version;
        }
        Ok(())
    }

    async fn call_read(
        &mut self,
        i: usize,
        lock_now: bool,
        want_offset: bool,
    ) -> Result<Pending, Abort> {
        let a = self.acc[i];
        let flags = if lock_now { LOCK_IT } else { 0 } | if want_offset { WANT_OFFSET } else { 0 };
        let owner = if lock_now { self.owner.0 } else { 0 };
        RecordReq { table: a.table.0, flags, epoch: self.epoch(), key: a.key, owner }
            .encode(&mut self.req);
        let t = self.send_call(self.peer(a.node), wire::READ, &self.req).await?;
        if lock_now {
            // Until the reply says otherwise, we may hold it.
            self.acc[i].locked = Locked::Unknown;
        }
        Ok(Pending::Call(t))
    }

    /// Sends a call, waiting a step at a time while every call slot or every credit with
    /// `dest` is taken, or the datagram queue is full: back-pressure, not a reason to
    /// abort. `Frozen`: the
    /// attempt may send nothing more (see [`TxnCtx::hold`]).
    pub(crate) async fn send_call(
        &self,
        dest: WorkerId,
        ty: RpcType,
        req: &[u8],
    ) -> Result<CallTicket, Frozen> {
        loop {
            self.hold().await?;
            match self.co.call(dest, ty, req) {
                Ok(t) => return Ok(t),
                Err(RpcError::Busy | RpcError::Post(PostError::QueueFull)) => {
                    self.co.ring_doorbells();
                    self.co.yield_now().await
                }
                Err(e) => panic!("the engine cannot call {dest}: {e}"),
            }
        }
    }

    /// Posts one-sided requests with `post`, waiting a step at a time while the
    /// connection's send queue is full (completions free it whether or not anyone waits
    /// for them yet). `Frozen`: the attempt may post nothing more (see
    /// [`TxnCtx::hold`]).
    pub(crate) async fn post<T>(
        &self,
        mut post: impl FnMut(&Co<E>) -> Result<T, OpError>,
    ) -> Result<T, Frozen> {
        loop {
            self.hold().await?;
            match post(&self.co) {
                Ok(t) => return Ok(t),
                Err(OpError::Post(PostError::QueueFull)) => {
                    self.co.ring_doorbells();
                    self.co.yield_now().await
                }
                Err(e) => panic!("engine post refused: {e}"),
            }
        }
    }

    async fn read_record(&mut self, i: usize, stage: Stage) -> Result<Pending, Abort> {
        let (Stage::Cached(off) | Stage::Record(off)) = stage else {
            unreachable!("a record stage")
        };
        let a = self.acc[i];
        let bytes = (RECORD_HEADER_WORDS + u64::from(a.len)) * 8;
        let rkey = self.rkey(&a);
        self.one_sided_read(a.node, RemoteAddr { node: a.node, rkey, offset: off }, bytes, stage)
            .await
    }

    async fn read_bucket(&mut self, i: usize, bucket: u64) -> Result<Pending, Abort> {
        let a = self.acc[i];
        let rkey = self.rkey(&a);
        let offset = self.node.catalog.geometry(a.table).bucket_offset(bucket);
        self.one_sided_read(
            a.node,
            RemoteAddr { node: a.node, rkey, offset },
            BUCKET_BYTES,
            Stage::Bucket(bucket),
        )
        .await
    }

    async fn one_sided_read(
        &mut self,
        node: NodeId,
        remote: RemoteAddr,
        bytes: u64,
        stage: Stage,
    ) -> Result<Pending, Abort> {
        let local = self.scratch(bytes)?;
        let wr = WorkRequest::Read { remote, local, len: bytes as u32 };
        let qp = self.qp(node);
        // Reads of several records to one node share a doorbell; `drain` rings it.
        let ticket = self.post(|co| co.issue_deferred(qp, &[wr])).await?;
        Ok(Pending::Op { ticket, buf: local.offset, stage })
    }

    /// Waits for one pending read and handles its result: what to request next for
    /// this access, if anything.
    async fn wait_read(&mut self, i: usize, p: Pending) -> Result<Next, Abort> {
        match p {
            Pending::Call(t) => {
                let mut tmp = std::mem::take(&mut self.tmp);
                let reply = self.co.reply(t, |r| RecordReply::decode(r, &mut tmp)).await;
                let out = self.on_read_reply(i, reply, &tmp);
                self.tmp = tmp;
                out
            }
            Pending::Op { ticket, buf, stage } => {
                self.co.wait(ticket).await.map_err(op_error_abort)?;
                self.on_read_op(i, buf, stage)
            }
            Pending::Nic { node, k, seq } => {
                let n = usize::from(node.0);
                let base = self.nic[n][k].slot.base;
                let region = self.nic_region.clone().expect("offload strategy");
                let waits = self.wt.waits.clone().expect("offload strategy");
                let deadline = self.co.now_ns() + self.co.config().rpc_timeout_ns;
                let answered =
                    waits.wait(&self.co, &region, base + offload::DONE, seq, deadline).await;
                let s = &mut self.nic[n][k];
                if !answered {
                    // Not an abort: the primary's CPU may still answer. The program
                    // answers in order, so its slot is usable again once this request's
                    // answer shows up (see `nic_lookup`).
                    s.state = NicState::Late;
                    self.wt.stats.borrow_mut().nic_timeouts += 1;
                    return Ok(Next::Call { lock_now: false, want_offset: true });
                }
                s.state = NicState::Idle;
                self.on_nic_answer(i, base)
            }
        }
    }

    fn on_read_reply(
        &mut self,
        i: usize,
        reply: Result<Option<RecordReply>, RpcError>,
        payload: &[u64],
    ) -> Result<Next, Abort> {
        let want_offset =
            matches!(self.node.cfg.exec, ExecStrategy::Hybrid | ExecStrategy::Offload);
        let reply = match reply {
            // A READ (with or without locking at execution) is idempotent for one
            // attempt: send it again rather than abort.
            Err(RpcError::TimedOut) if self.acc[i].resends < RPC_RESENDS_MAX => {
                self.acc[i].resends += 1;
                self.wt.stats.borrow_mut().rpc_resends += 1;
                let lock_now = self.acc[i].locked == Locked::Unknown;
                return Ok(Next::Call { lock_now, want_offset });
            }
            reply => reply.map_err(rpc_abort)?.expect("a well-formed READ reply"),
        };
        let a = &mut self.acc[i];
        let lock_now = a.locked == Locked::Unknown;
        match reply.status {
            Status::Ok => {
                let (at, len) = (a.at as usize, usize::from(a.len));
                assert_eq!(payload.len(), len, "READ reply of the wrong size");
                self.payload[at..at + len].copy_from_slice(payload);
                self.took(i, reply.version);
                let a = &mut self.acc[i];
                if lock_now {
                    (a.locked, a.lock_version) = (Locked::Rpc, reply.version);
                }
                if reply.offset != 0 {
                    a.off = Some(reply.offset);
                    let (table, key, generation) = (a.table, a.key, self.generation(&self.acc[i]));
                    self.node.store.cache().put(table, key, generation, reply.offset);
                }
                Ok(Next::Done)
            }
            Status::Absent => {
                if lock_now {
                    a.locked = Locked::No;
                }
                self.took(i, ABSENT);
                Ok(Next::Done)
            }
            Status::Locked => {
                a.locked = Locked::No;
                Err(self.blocked(AbortReason::Conflict, reply.lock))
            }
            Status::Torn => {
                if lock_now {
                    a.locked = Locked::No;
                }
                self.wt.stats.borrow_mut().torn_reads += 1;
                self.torn_under(reply.lock);
                Ok(Next::Call { lock_now, want_offset })
            }
            Status::Stale => {
                // This request was refused before it locked anything, but a send of it
                // that timed out earlier may have locked the record: the abort must
                // then release it.
                if lock_now && a.resends == 0 {
                    a.locked = Locked::No;
                }
                Err(Abort(AbortReason::Reconfigured))
            }
            Status::Refused | Status::Full => {
                panic!("READ refused for {:?}: a routing bug", self.acc[i])
            }
        }
    }

    fn on_read_op(&mut self, i: usize, buf: u64, stage: Stage) -> Result<Next, Abort> {
        let a = self.acc[i];
        match stage {
            Stage::Bucket(bucket) => {
                let mut words = [0u64; BUCKET_BYTES as usize / 8];
                self.scratch_region.read_words(buf, &mut words);
                match search_bucket(&words, a.key) {
                    Ok(Some(0)) => {
                        // The slot's tag arrived before its offset (S2): read it again.
                        self.wt.stats.borrow_mut().torn_reads += 1;
                        Ok(Next::Bucket(bucket))
                    }
                    Ok(Some(off)) => Ok(Next::Record(Stage::Record(off))),
                    Ok(None) => {
                        self.took(i, ABSENT);
                        Ok(Next::Done)
                    }
                    Err(next) => {
                        Ok(Next::Bucket(self.node.catalog.geometry(a.table).buckets + next))
                    }
                }
            }
            Stage::Cached(_) | Stage::Record(_) => {
                let n = (RECORD_HEADER_WORDS + u64::from(a.len)) as usize;
                self.words.resize(n, 0);
                self.scratch_region.read_words(buf, &mut self.words);
                self.accept_record(i, stage)
            }
        }
    }

    /// Takes the record in `self.words`, read at the offset of `stage`: into the access
    /// if it is intact and `a`'s, else what to do next.
    fn accept_record(&mut self, i: usize, stage: Stage) -> Result<Next, Abort> {
        let a = self.acc[i];
        match stage {
            Stage::Bucket(_) => unreachable!("a record stage"),
            Stage::Cached(off) | Stage::Record(off) => {
                let n = self.words.len();
                let h = RecordHeader::parse(&self.words);
                if h.key != a.key && h.intact {
                    // Another key's record: a stale cache entry, or an offset read from a
                    // slot whose words a NIC returned out of order (S2). Start over.
                    if matches!(stage, Stage::Cached(_)) {
                        self.wt.stats.borrow_mut().stale_cache += 1;
                        self.node.store.cache().forget(a.table, a.key);
                    } else {
                        self.wt.stats.borrow_mut().torn_reads += 1;
                    }
                    return Ok(self.refetch(i));
                }
                let torn_accepted = self.node.cfg.planted(PlantedFault::AcceptTornRead);
                if (!h.intact && !torn_accepted) || h.key != a.key {
                    // Torn by a concurrent write-back (or not yet written): read again.
                    self.wt.stats.borrow_mut().torn_reads += 1;
                    self.torn_under(h.lock);
                    return Ok(Next::Record(stage));
                }
                let h_len = RECORD_HEADER_WORDS as usize;
                let (at, len) = (a.at as usize, usize::from(a.len));
                self.payload[at..at + len].copy_from_slice(&self.words[h_len..n]);
                self.took(i, h.version);
                let a = &mut self.acc[i];
                a.off = Some(off);
                if matches!(stage, Stage::Record(_)) {
                    let (table, key, generation) = (a.table, a.key, self.generation(&self.acc[i]));
                    self.node.store.cache().put(table, key, generation, off);
                }
                Ok(Next::Done)
            }
        }
    }

    /// Records what access `i` read: the version word, and, when the history is kept, a
    /// digest of the payload now in its slot of `self.payload` (before any update).
    fn took(&mut self, i: usize, version: u64) {
        let a = &self.acc[i];
        let digest = if self.wt.records_history() && layout::is_present(version) {
            layout::checksum(version, a.key, &self.payload[a.at as usize..][..usize::from(a.len)])
        } else {
            0
        };
        let a = &mut self.acc[i];
        (a.read_version, a.present, a.read_digest) =
            (Some(version), layout::is_present(version), digest);
    }

    /// How to read an access again without the cache (after a stale entry).
    fn refetch(&self, i: usize) -> Next {
        let a = self.acc[i];
        match self.node.cfg.exec {
            ExecStrategy::Hybrid | ExecStrategy::TwoSided | ExecStrategy::Offload => {
                Next::Call { lock_now: false, want_offset: true }
            }
            ExecStrategy::OneSided | ExecStrategy::OneSidedCached => {
                Next::Bucket(self.node.catalog.geometry(a.table).home_bucket(a.key))
            }
        }
    }

    /// The worker serving a node's records for us: the same index as ours, so that the
    /// load spreads over the node's workers.
    pub(crate) fn peer(&self, node: NodeId) -> hytra_fabric::WorkerId {
        hytra_fabric::WorkerId { node, index: self.co.me().index }
    }

    /// This coroutine's connection to `node`: coroutines spread over the lanes, so that a
    /// cluster with several lanes per peer uses every connection (the emulation of a
    /// larger cluster's connection count). A transaction's requests that must stay in
    /// order (R1) are all of one coroutine, so they share a connection.
    pub(crate) fn qp(&self, node: NodeId) -> Qp {
        Qp { node, lane: self.co_index % self.co.shape().lanes_per_peer }
    }
}

/// An RPC that failed aborts the attempt.
pub(crate) fn rpc_abort(e: RpcError) -> Abort {
    match e {
        RpcError::TimedOut | RpcError::Busy | RpcError::Post(_) => Abort(AbortReason::Timeout),
        RpcError::Remote(_) | RpcError::TooLarge(_) => panic!("engine RPC refused: {e}"),
    }
}

/// A one-sided request that completed in error.
pub(crate) fn op_error_abort(e: OpError) -> Abort {
    match e {
        OpError::Failed(hytra_fabric::Status::Unreachable) => Abort(AbortReason::Unreachable),
        OpError::Failed(s) => panic!("engine request failed: {s:?}"),
        OpError::Post(p) => unreachable!("a completion is never a post error ({p})"),
    }
}
