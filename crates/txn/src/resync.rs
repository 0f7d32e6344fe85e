//! Re-replication: a partition that lost a copy to a failure gets it back on a surviving
//! node, in the background (FaRM's data recovery, on hytra's record layout).
//!
//! 1. Placing. The configuration that removes a node also names, for every partition
//!    left with fewer copies than the replication factor, a new backup on the member
//!    holding the fewest replicas ([`add_backups`]). It joins as `Syncing`: it takes the
//!    partition's log from that epoch on, but cannot be promoted.
//! 2. Copying. Once the new backup is active in that epoch (every commit of an earlier
//!    epoch is at the primary by then: recovery's APPLY landed them before anyone was
//!    let go), one of its workers (`Copier`) asks the primary how many records each
//!    table of the partition has allocated ([`SYNC`]) and reads them with one-sided
//!    READs, a block of records at a time, at a paced rate. Each whole record is written
//!    only if newer than what the backup holds, as a log entry would be: a commit that
//!    raced with the copy reaches the backup by its log, with a newer version, in any
//!    order. A record read torn (a write-back in flight, or one its writer's crash cut
//!    short, until recovery mends it) is read again. If the primary moves on the way,
//!    the copy starts over from the new primary, which held everything.
//! 3. Marking. A backup that holds every record of a partition says so in its lease
//!    renewals; the manager commits a configuration in which it is `Ready`
//!    ([`ready_config`]), through the same rounds as any reconfiguration (F5).
//!
//! Not for: deciding who fails or what commits (see `recover.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use hytra_fabric::{Endpoint, LocalAddr, NodeId, Qp, RemoteAddr, WorkRequest, WorkerId};
use hytra_rt::{Co, HandlerCtx, RpcType};
use hytra_store::layout::{RecordHeader, ABSENT, RECORD_HEADER_WORDS};
use hytra_store::{BackupState, PartitionPlace, TableId};

use crate::engine::NodeEngine;
use crate::membership::Config;
use crate::recover::{RecoveryEvent, RecoveryStep};
use crate::wire::{In, Out};

/// A new backup asks a partition's primary how many records each table of the partition
/// has allocated: epoch, partition -> epoch, whether it is the primary, then per table
/// its count.
pub const SYNC: RpcType = RpcType(16);

/// Bytes one READ of a copy fetches at most: whole records, as many as fit.
pub const BLOCK_BYTES: u64 = 16 << 10;

/// READs of a copy in flight at once per worker when it keeps its pace.
pub const BLOCKS_AT_ONCE: u64 = 4;

/// READs of a copy in flight at once per worker when its pace has left it behind: the
/// copy gets a turn once per round of its worker's coroutines, and a round of long
/// attempts (TPC-C's Stock-Level costs a coroutine a hundred microseconds and more at
/// once) would otherwise hold it to four blocks per round, far below its pace. Its
/// buffer holds this many blocks.
pub const BLOCKS_BEHIND_MAX: u64 = 16;

/// Bytes of each worker's copy buffer (after the fence slots of the scratch region).
pub const COPY_BUFFER_BYTES: u64 = BLOCK_BYTES * BLOCKS_BEHIND_MAX;

/// RPC timeouts a [`SYNC`] waits at most, once the primary answered late.
const SYNC_WAIT_TIMEOUTS: u64 = 4;

/// Times in a row a record read torn is read again at the copy's pace: a write-back
/// tears a read for the few hundred nanoseconds it takes. Past that, the record waits
/// for recovery (a write-back its writer's crash cut short stays torn until recovery
/// mends it, `Replica::apply_recovered`): it is read again once per recovery poll, while
/// the copy of the other records keeps its pace.
const TORN_QUICK_TRIES: u32 = 16;

/// Leases a record may stay torn before the copy gives up on it: long enough for the
/// crash of its writer to be noticed and recovered from, several times over.
const TORN_LEASES_MAX: u64 = 16;

/// Whether and how fast a partition that lost a copy gets a new one.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Rereplication {
    /// Partitions run on with the copies they have left (a second failure of a
    /// partition's replicas may then lose it).
    Off,
    /// A surviving node becomes a new backup and copies the partition, reading at most
    /// `bytes_per_sec` from primaries into that node (all its copies together).
    Paced {
        /// The receiving node's copy rate.
        bytes_per_sec: u64,
    },
}

impl Rereplication {
    /// The copies a partition is brought back to: the replication factor, or none.
    pub fn target(self, replication: u16) -> u16 {
        match self {
            Rereplication::Off => 0,
            Rereplication::Paced { .. } => replication,
        }
    }
}

/// Adds a backup syncing since `epoch` to every partition of `parts` holding fewer than
/// `copies` replicas, on the member (of `members`, per node) that holds the fewest
/// replicas and none of that partition; ties go to the first node after the partition's
/// own number, as the initial placement does. Fewer members than `copies` leave
/// partitions short.
pub fn add_backups(parts: &mut [PartitionPlace], members: &[bool], copies: u16, epoch: u64) {
    let nodes = members.len();
    let mut load = vec![0usize; nodes];
    for part in parts.iter() {
        load[usize::from(part.primary.0)] += 1;
        for &(b, _) in &part.backups {
            load[usize::from(b.0)] += 1;
        }
    }
    for (p, part) in parts.iter_mut().enumerate() {
        // Bounded: each pass adds a backup or stops.
        while 1 + part.backups.len() < usize::from(copies) {
            let holds = |n: usize| {
                part.primary.0 as usize == n || part.backups.iter().any(|&(b, _)| b.0 as usize == n)
            };
            let pick = (0..nodes)
                .filter(|&n| members[n] && !holds(n))
                .min_by_key(|&n| (load[n], (n + nodes - p % nodes) % nodes));
            let Some(n) = pick else { break };
            part.backups.push((NodeId(n as u16), BackupState::Syncing { since: epoch }));
            load[n] += 1;
        }
    }
}

/// The revision after `old`, of the same epoch (no route moves), in which the backups of
/// `ready` (partition, node) that are still syncing in `old` are ready; `None` if none
/// of them is.
pub fn ready_config(old: &Config, ready: &[(u16, NodeId)]) -> Option<Config> {
    let mut parts = old.placement.parts().to_vec();
    let mut changed = false;
    for &(p, n) in ready {
        let Some(part) = parts.get_mut(usize::from(p)) else { continue };
        for b in part.backups.iter_mut().filter(|b| b.0 == n && b.1.syncing()) {
            b.1 = BackupState::Ready;
            changed = true;
        }
    }
    if !changed {
        return None;
    }
    let members = (0..old.nodes()).map(|n| old.is_member(NodeId(n))).collect();
    let placement = hytra_store::Placement::from_parts(parts);
    let next = Config::new(old.epoch, members, placement).expect("only backup states changed");
    Some(next.with_revision(old.revision + 1))
}

/// The backups of `cfg` still syncing, as (partition, node).
pub fn syncing(cfg: &Config) -> Vec<(u16, NodeId)> {
    let parts = cfg.placement.parts().iter().enumerate();
    parts
        .flat_map(|(p, part)| {
            part.backups.iter().filter(|&&(_, s)| s.syncing()).map(move |&(n, _)| (p as u16, n))
        })
        .collect()
}

/// Whether every partition of `cfg` has as many ready copies (its primary and ready
/// backups) as `replication` asks for, or as there are members if fewer.
pub fn fully_replicated(cfg: &Config, replication: u16) -> bool {
    let want = usize::from(replication).min(cfg.members().count());
    cfg.placement.parts().iter().all(|part| {
        1 + part.backups.iter().filter(|&&(_, s)| s == BackupState::Ready).count() >= want
    })
}

/// What a node knows of the copies into it and, as manager, of the copies into others.
#[derive(Default)]
pub(crate) struct SyncState {
    /// Partitions this node holds every record of since it was made their backup (whole
    /// copies, kept until the node is ready for them).
    copied: Mutex<BTreeSet<u16>>,
    /// Manager: the copies members reported whole, as (partition, node), with the epoch
    /// they reported them in.
    reported: Mutex<BTreeMap<(u16, NodeId), u64>>,
}

impl SyncState {
    /// The partitions this node copied whole that `cfg` still has it syncing.
    pub(crate) fn copied_here(&self, cfg: &Config, me: NodeId) -> Vec<u16> {
        let copied = self.copied.lock().expect("no recorder panicked");
        copied
            .iter()
            .copied()
            .filter(|&p| {
                p < cfg.placement.partitions()
                    && cfg.placement.part(p).backups.iter().any(|&(n, s)| n == me && s.syncing())
            })
            .collect()
    }

    /// Manager: member `from` says in a renewal of `epoch` that it copied `parts` whole.
    pub(crate) fn report(&self, from: NodeId, epoch: u64, parts: impl Iterator<Item = u16>) {
        let mut r = self.reported.lock().expect("no recorder panicked");
        for p in parts {
            r.insert((p, from), epoch);
        }
    }

    /// Manager: the backups of `cfg` still syncing that reported (in `cfg`'s epoch) or,
    /// for this node, know they are whole.
    pub(crate) fn ready_in(&self, cfg: &Config, me: NodeId) -> Vec<(u16, NodeId)> {
        let mine = self.copied_here(cfg, me);
        let mut r = self.reported.lock().expect("no recorder panicked");
        // Reports of older epochs said nothing about this one: the node reports again.
        r.retain(|_, e| *e >= cfg.epoch);
        syncing(cfg)
            .into_iter()
            .filter(|&(p, n)| {
                if n == me {
                    mine.contains(&p)
                } else {
                    r.get(&(p, n)).is_some_and(|&e| e == cfg.epoch)
                }
            })
            .collect()
    }
}

/// Registers the copy's handler on a worker.
pub(crate) fn register<E: Endpoint + 'static>(
    w: &mut hytra_rt::Worker<E>,
    node: &std::sync::Arc<NodeEngine>,
) {
    let n = node.clone();
    w.handle(SYNC, Box::new(move |ctx, req| counts(&n, ctx, req)));
}

/// [`SYNC`] at a primary: how many records each table of the partition has allocated,
/// if this node is its primary in the configuration in force and no recovery runs here.
fn counts<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let mut i = In(req);
    let (Some(epoch), Some(p)) = (i.u64(), i.u16()) else { return };
    let cfg = node.membership.current();
    let serving = epoch == cfg.epoch
        && p < cfg.placement.partitions()
        && cfg.primary(p) == node.node
        && node.recovery.open(ctx.ep.now_ns());
    Out(ctx.reply).u64(cfg.epoch).u8(u8::from(serving));
    if serving {
        for spec in node.catalog.tables() {
            Out(ctx.reply).u64(node.store.replica(spec.id, p).len());
        }
    }
}

/// A record to read again: its table and slot, and since when it reads torn.
#[derive(Copy, Clone, Debug)]
struct Torn {
    table: usize,
    slot: u64,
    again: Again,
}

/// How a record read torn was read so far.
#[derive(Copy, Clone, Debug)]
struct Again {
    /// Reads that found it torn.
    tries: u32,
    /// When the first of them did.
    since_ns: u64,
    /// When it is read again: at once for the first [`TORN_QUICK_TRIES`], then a
    /// recovery poll after the last read.
    due_ns: u64,
}

/// One partition being copied into this node.
struct Job {
    partition: u16,
    /// The primary read from, and its generation: if either moves, the copy starts over.
    primary: NodeId,
    generation: u8,
    /// Records each table had allocated at the primary when the copy started (asked
    /// once the node is active in an epoch that places it as this partition's backup).
    counts: Option<Vec<u64>>,
    /// The next record to read: table, slot.
    table: usize,
    slot: u64,
    torn: Vec<Torn>,
    /// Bytes read so far (for the event at the end).
    bytes: u64,
    /// How long the next [`SYNC`] waits for its reply: the RPC timeout at first, doubled
    /// (up to four RPC timeouts and half a lease, never below the RPC timeout) each time
    /// one timed out while the primary answered late. The engine task that copies also
    /// quiesces its worker for a new epoch, so it must not wait long.
    counts_wait_ns: u64,
}

/// A block read: where it came from and which records it holds.
#[derive(Copy, Clone, Debug)]
struct Block {
    table: usize,
    slot: u64,
    records: u64,
    /// For a record read again, how it was read before.
    again: Option<Again>,
}

/// One worker's share of the copies into its node: partition `p` is copied by worker
/// `p % workers`, one partition at a time.
#[derive(Default)]
pub(crate) struct Copier {
    job: Option<Job>,
    /// When the next block may be read (the pace).
    next_at: u64,
}

/// What a turn of the copy asks of the task that runs it.
pub(crate) enum Turn {
    /// Nothing to copy here: come back at the usual poll.
    Idle,
    /// Copying: come back at this time (the next block's turn) or sooner.
    Until(u64),
}

impl Copier {
    /// One turn of copying on this worker: reads the blocks whose turn has come, writes
    /// their records, and marks a partition copied once every record is here.
    pub(crate) async fn turn<E: Endpoint>(&mut self, co: &Co<E>, node: &NodeEngine) -> Turn {
        let Rereplication::Paced { bytes_per_sec } = node.recovery.params().rereplication else {
            return Turn::Idle;
        };
        let me = co.me();
        let now = co.now_ns();
        if !node.recovery.open(now) {
            // Recovering, or without a lease: nothing is read now (a copy may begin only
            // once its epoch is active, and pausing costs nothing).
            return Turn::Idle;
        }
        let cfg = node.membership.current();
        let workers = co.shape().workers_per_node;
        let todo = self.todo(&cfg, node, me);
        let Some(&p) = todo.iter().find(|&&p| p % workers == me.index) else {
            self.job = None;
            return Turn::Idle;
        };
        let place = cfg.placement.part(p);
        let fresh = match &self.job {
            Some(j) => {
                j.partition != p || j.primary != place.primary || j.generation != place.generation
            }
            None => true,
        };
        if fresh {
            self.job = Some(Job {
                partition: p,
                primary: place.primary,
                generation: place.generation,
                counts: None,
                table: 0,
                slot: 0,
                torn: Vec::new(),
                bytes: 0,
                counts_wait_ns: co.config().rpc_timeout_ns,
            });
            self.next_at = now;
        }
        // The node's rate, shared by the workers copying into it.
        let copying = todo.iter().map(|&p| p % workers).collect::<BTreeSet<_>>().len() as u64;
        let rate = (bytes_per_sec / copying.max(1)).max(1);
        let job = self.job.as_mut().expect("a job was just set");
        if job.counts.is_none() {
            match ask_counts(co, node, cfg.epoch, job).await {
                Some(c) => job.counts = Some(c),
                None => return Turn::Until(now + node.recovery.poll_ns()),
            }
        }
        // A copy held up (by a recovery, a long step) does not catch up in one burst.
        self.next_at = self.next_at.max(now.saturating_sub(node.recovery.poll_ns()));
        if now < self.next_at {
            return Turn::Until(self.next_at);
        }
        let (table, slot, torn) = (job.table, job.slot, job.torn.len());
        let at_once = blocks_at_once(now - self.next_at, rate);
        let blocks = plan_blocks(job, node, at_once, co.now_ns());
        if blocks.is_empty() {
            if let Some(due) = job.torn.iter().map(|t| t.again.due_ns).min() {
                // Only records torn until a recovery mends them are left.
                return Turn::Until(due.max(self.next_at));
            }
        }
        let bytes: u64 = blocks.iter().map(|b| b.records * record_bytes(node, b.table)).sum();
        self.next_at += bytes.saturating_mul(1_000_000_000) / rate;
        if !read_blocks(co, node, job, &blocks).await {
            // The primary did not answer (a reconfiguration follows, or a cut that heals
            // in time): the next turn reads the same blocks again, so that none is
            // skipped and taken for copied.
            unplan_blocks(job, &blocks, (table, slot, torn));
            return Turn::Until(self.next_at.max(co.now_ns() + node.recovery.poll_ns()));
        }
        job.bytes += bytes;
        if let Err(why) = write_blocks(co, node, job, &blocks) {
            node.recovery.fail(why);
            return Turn::Idle;
        }
        if job.table >= node.catalog.tables().count() && job.torn.is_empty() {
            let (p, bytes) = (job.partition, job.bytes);
            node.recovery.sync().copied.lock().expect("no recorder panicked").insert(p);
            node.recovery.event(RecoveryStep::Copied { partition: p, bytes }, co.now_ns());
            self.job = None;
        }
        Turn::Until(self.next_at)
    }

    /// The partitions this node still has to copy: syncing here in `cfg`, not whole yet.
    fn todo(&self, cfg: &Config, node: &NodeEngine, me: WorkerId) -> Vec<u16> {
        let copied = node.recovery.sync().copied.lock().expect("no recorder panicked").clone();
        syncing(cfg)
            .into_iter()
            .filter(|&(p, n)| n == me.node && !copied.contains(&p))
            .map(|(p, _)| p)
            .collect()
    }
}

fn record_bytes(node: &NodeEngine, table: usize) -> u64 {
    node.catalog.geometry(TableId(table as u16)).record_bytes
}

/// Asks the primary of `job`'s partition for its tables' record counts; `None` if it
/// did not answer as the primary of `epoch`. A primary whose worker runs long steps (a
/// few heavy coroutine turns each) may answer only after the request timed out, every
/// time: an answer that arrives late makes the next request wait twice as long.
async fn ask_counts<E: Endpoint>(
    co: &Co<E>,
    node: &NodeEngine,
    epoch: u64,
    job: &mut Job,
) -> Option<Vec<u64>> {
    let mut req = Vec::new();
    Out(&mut req).u64(epoch).u16(job.partition);
    let dest = WorkerId { node: job.primary, index: co.me().index };
    let sent = co.now_ns();
    let ticket = co.call_within(dest, SYNC, &req, job.counts_wait_ns).ok()?;
    let tables = node.catalog.tables().count();
    let reply = co
        .reply(ticket, |r| {
            let mut i = In(r);
            let (e, serving) = (i.u64()?, i.u8()?);
            if e != epoch || serving != 1 {
                return None;
            }
            (0..tables).map(|_| i.u64()).collect::<Option<Vec<u64>>>()
        })
        .await;
    let counts = match reply {
        Ok(counts) => counts?,
        Err(_) => {
            if co.late_reply_at(dest) > sent {
                let timeout = co.config().rpc_timeout_ns;
                let cap = (SYNC_WAIT_TIMEOUTS * timeout).min(node.recovery.params().lease_ns / 2);
                job.counts_wait_ns = (job.counts_wait_ns * 2).min(cap.max(timeout));
            }
            return None;
        }
    };
    // A count beyond a table's capacity cannot be the primary's: read nothing of it.
    let sane = counts
        .iter()
        .enumerate()
        .all(|(t, &c)| c <= node.catalog.geometry(TableId(t as u16)).capacity);
    sane.then_some(counts)
}

/// Blocks a turn reads when it comes `late_ns` after it was due, at `rate` bytes per
/// second: the usual batch, and the blocks the pace allowed meanwhile, as many as the
/// copy buffer holds.
fn blocks_at_once(late_ns: u64, rate: u64) -> u64 {
    let behind = late_ns.saturating_mul(rate) / 1_000_000_000 / BLOCK_BYTES;
    BLOCKS_AT_ONCE.saturating_add(behind).min(BLOCKS_BEHIND_MAX)
}

/// The blocks of the next batch: first records to read again that are due by `now`,
/// then whole records from where the copy is, at most `at_once` (at most
/// [`BLOCKS_BEHIND_MAX`], which the copy buffer holds).
fn plan_blocks(job: &mut Job, node: &NodeEngine, at_once: u64, now: u64) -> Vec<Block> {
    assert!(
        (1..=BLOCKS_BEHIND_MAX).contains(&at_once),
        "{at_once} blocks at once: the copy buffer holds {BLOCKS_BEHIND_MAX}"
    );
    let counts = job.counts.as_ref().expect("counts before blocks");
    let tables = counts.len();
    let mut blocks = Vec::with_capacity(at_once as usize);
    while blocks.len() < at_once as usize {
        if let Some(i) = job.torn.iter().rposition(|t| t.again.due_ns <= now) {
            let t = job.torn.remove(i);
            blocks.push(Block { table: t.table, slot: t.slot, records: 1, again: Some(t.again) });
            continue;
        }
        // Past every table's end: the batch is what it is.
        while job.table < tables && job.slot >= counts[job.table] {
            job.table += 1;
            job.slot = 0;
        }
        if job.table >= tables {
            break;
        }
        let per_block = (BLOCK_BYTES / record_bytes(node, job.table)).max(1);
        let records = per_block.min(counts[job.table] - job.slot);
        blocks.push(Block { table: job.table, slot: job.slot, records, again: None });
        job.slot += records;
    }
    blocks
}

/// Undoes [`plan_blocks`] for a batch that was not read: the copy goes back to
/// `table`/`slot`, and the records to read again taken from `torn` (it had `torn_len`
/// of them; they lead the batch) are put back.
fn unplan_blocks(job: &mut Job, blocks: &[Block], (table, slot, torn_len): (usize, u64, usize)) {
    let taken = torn_len - job.torn.len();
    for b in blocks[..taken].iter().rev() {
        debug_assert_eq!(b.records, 1, "a record read again is a block of one");
        let again = b.again.expect("a record read again was read torn before");
        job.torn.push(Torn { table: b.table, slot: b.slot, again });
    }
    assert_eq!(job.torn.len(), torn_len, "every record to read again is back");
    (job.table, job.slot) = (table, slot);
}

/// Where block `k` of a batch lands in this worker's copy buffer.
fn buffer_at(node: &NodeEngine, index: u16, workers: u16, k: usize) -> LocalAddr {
    let base = node.scratch.copy_buffer(index, workers);
    LocalAddr { rkey: base.rkey, offset: base.offset + k as u64 * BLOCK_BYTES }
}

/// Reads `blocks` from the primary into this worker's copy buffer, all in flight at
/// once; whether every READ succeeded.
async fn read_blocks<E: Endpoint>(
    co: &Co<E>,
    node: &NodeEngine,
    job: &Job,
    blocks: &[Block],
) -> bool {
    let me = co.me();
    let workers = co.shape().workers_per_node;
    let qp = Qp { node: job.primary, lane: 0 };
    let mut tickets = Vec::with_capacity(blocks.len());
    for (k, b) in blocks.iter().enumerate() {
        let t = TableId(b.table as u16);
        let geom = node.catalog.geometry(t);
        let remote = RemoteAddr {
            node: job.primary,
            rkey: node.catalog.rkey(t, job.partition),
            offset: geom.record_offset(b.slot),
        };
        let len = b.records * geom.record_bytes;
        debug_assert!(len <= BLOCK_BYTES.max(geom.record_bytes));
        let len = u32::try_from(len).expect("a block is at most a few records");
        let wr = WorkRequest::Read { remote, local: buffer_at(node, me.index, workers, k), len };
        // Bounded: a full send queue drains as its requests complete.
        let ticket = loop {
            match co.issue(qp, &[wr]) {
                Ok(t) => break t,
                Err(_) => co.yield_now().await,
            }
        };
        tickets.push(ticket);
    }
    let mut ok = true;
    for t in tickets {
        ok &= co.wait(t).await.is_ok();
    }
    ok
}

/// Writes the whole records of `blocks` (read into this worker's copy buffer) into this
/// node's replicas where newer; records read torn go back on the job's list.
fn write_blocks<E: Endpoint>(
    co: &Co<E>,
    node: &NodeEngine,
    job: &mut Job,
    blocks: &[Block],
) -> Result<(), String> {
    let me = co.me();
    let workers = co.shape().workers_per_node;
    let region = co.region(node.scratch.rkey).expect("the scratch region is this node's");
    let now = co.now_ns();
    let torn_max_ns = TORN_LEASES_MAX.saturating_mul(node.recovery.params().lease_ns);
    let mut words = Vec::new();
    for (k, b) in blocks.iter().enumerate() {
        let t = TableId(b.table as u16);
        let geom = node.catalog.geometry(t);
        let per = (geom.record_bytes / 8) as usize;
        words.resize(per * b.records as usize, 0);
        region.read_words(buffer_at(node, me.index, workers, k).offset, &mut words);
        let replica = node.store.replica(t, job.partition);
        for (r, rec) in words.chunks_exact(per).enumerate() {
            let slot = b.slot + r as u64;
            let h = RecordHeader::parse(rec);
            if !h.intact {
                // A write-back in flight, or a record being created: read it again.
                let tries = b.again.map_or(1, |a| a.tries + 1);
                let since_ns = b.again.map_or(now, |a| a.since_ns);
                let due_ns = match tries < TORN_QUICK_TRIES {
                    true => now,
                    false => now + node.recovery.poll_ns(),
                };
                let again = Again { tries, since_ns, due_ns };
                if now - again.since_ns > torn_max_ns {
                    return Err(format!(
                        "{}: record {slot} of table {} of partition {} at {} read torn for {} ns ({} reads) while copying it",
                        me.node, t.0, job.partition, job.primary, now - again.since_ns, again.tries
                    ));
                }
                job.torn.push(Torn { table: b.table, slot, again });
                continue;
            }
            if h.version == ABSENT {
                continue; // created by an insert that never committed
            }
            if node.catalog.partition(t, h.key) != job.partition {
                return Err(format!(
                    "{}: record {slot} of table {} at {} holds key {} of another partition than {}",
                    me.node, t.0, job.primary, h.key, job.partition
                ));
            }
            co.charge_term(crate::cpu::RESYNC, 1);
            let payload = &rec[RECORD_HEADER_WORDS as usize..];
            replica
                .apply_logged(0, h.key, h.version, payload)
                .map_err(|e| format!("{}: copying partition {}: {e}", me.node, job.partition))?;
        }
    }
    Ok(())
}

/// Whether a cluster of `nodes` with `replication` copies survives `crashes` (node, time,
/// sorted by time), re-replicating to `copies` ([`Rereplication::target`]): crashes less
/// than `apart_ns` after the one before fail together, and each group must leave every
/// partition two copies, one of them promotable (recovery decides the transactions in
/// doubt from a surviving backup's log). Later groups are judged as if the copies the
/// earlier ones started were whole by then; if they are not, the run stops with
/// recovery's reason. `Err` names the first partition that would be lost.
pub fn survivable(
    nodes: u16,
    replication: u16,
    copies: u16,
    crashes: &[(NodeId, u64)],
    apart_ns: u64,
) -> Result<(), String> {
    let mut cfg = Config::initial(nodes, replication);
    let mut k = 0;
    // Bounded: each pass takes at least one crash.
    while k < crashes.len() {
        let mut group = vec![crashes[k].0];
        while k + 1 < crashes.len() && crashes[k + 1].1 < crashes[k].1 + apart_ns {
            k += 1;
            group.push(crashes[k].0);
        }
        k += 1;
        let (p, left) = cfg.fewest_copies_without(&group);
        if left < 2 {
            return Err(format!(
                "partition {p} would keep {left} of its copies when {} fail together; recovery needs two",
                names(&group)
            ));
        }
        let next = crate::recover::next_config(&cfg, &group, copies)
            .map_err(|why| format!("when {} fail: {why}", names(&group)))?;
        let ready = syncing(&next);
        cfg = ready_config(&next, &ready).unwrap_or(next);
    }
    Ok(())
}

/// "n1", "n1 and n2", "n1, n2 and n3".
fn names(nodes: &[NodeId]) -> String {
    let all: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    match all.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => all.concat(),
    }
}

/// Whether `events` (one node's) hold a copy finished at or after `at_ns`.
pub fn copied_since(events: &[RecoveryEvent], at_ns: u64) -> bool {
    events.iter().any(|e| e.at_ns >= at_ns && matches!(e.step, RecoveryStep::Copied { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recover::next_config;

    #[test]
    fn a_lost_copy_goes_to_the_member_holding_the_fewest() {
        // 6 nodes, 3 copies: partition p on p, p+1, p+2. Node 3 holds 1, 2 and 3.
        let first = Config::initial(6, 3);
        let next = next_config(&first, &[NodeId(3)], 3).unwrap();
        for p in 0..6u16 {
            let part = next.placement.part(p);
            assert_eq!(1 + part.backups.len(), 3, "partition {p}: {part:?}");
            assert!(!next.placement.holds(NodeId(3), p));
        }
        // Every survivor held 3 replicas; the three new ones go to three different nodes.
        let news: Vec<(u16, NodeId)> = syncing(&next);
        assert_eq!(news.len(), 3, "{news:?}");
        let targets: BTreeSet<NodeId> = news.iter().map(|&(_, n)| n).collect();
        assert_eq!(targets.len(), 3, "{news:?}");
        for n in 0..6u16 {
            if n != 3 {
                assert!(next.placement.held_by(NodeId(n)).count() <= 4);
            }
        }
        assert!(!fully_replicated(&next, 3));
        let ready = ready_config(&next, &news).unwrap();
        assert_eq!(
            (ready.epoch, ready.revision),
            (next.epoch, next.revision + 1),
            "no route moves"
        );
        assert!(fully_replicated(&ready, 3));
        assert!(ready_config(&ready, &news).is_none(), "nothing left syncing");
    }

    #[test]
    fn a_late_turn_reads_what_its_pace_allowed_up_to_the_buffer() {
        // On time, or late by less than a block at the pace: the usual batch.
        assert_eq!(blocks_at_once(0, 250_000_000), BLOCKS_AT_ONCE);
        assert_eq!(blocks_at_once(60_000, 250_000_000), BLOCKS_AT_ONCE);
        // 16 KiB at 1 GB/s is 16.4 us: late by 50 us allows three more blocks.
        assert_eq!(blocks_at_once(50_000, 1_000_000_000), BLOCKS_AT_ONCE + 3);
        // Far behind (or a rate without bound): as many as the buffer holds.
        assert_eq!(blocks_at_once(680_000, 94_000_000_000), BLOCKS_BEHIND_MAX);
        assert_eq!(blocks_at_once(u64::MAX, u64::MAX), BLOCKS_BEHIND_MAX);
        assert_eq!(COPY_BUFFER_BYTES, BLOCK_BYTES * BLOCKS_BEHIND_MAX);
    }

    #[test]
    fn with_fewer_members_than_copies_partitions_stay_short() {
        let first = Config::initial(3, 3);
        let next = next_config(&first, &[NodeId(1)], 3).unwrap();
        assert!(syncing(&next).is_empty());
        assert!(fully_replicated(&next, 3), "two members hold two copies each");
        let off = next_config(&Config::initial(5, 3), &[NodeId(1)], 0).unwrap();
        assert!(syncing(&off).is_empty(), "re-replication off");
        assert!(!fully_replicated(&off, 3));
    }

    #[test]
    fn crashes_apart_survive_what_crashes_together_do_not() {
        let ms = 1_000_000;
        let n = |i| NodeId(i);
        // 6 nodes, 3 copies: nodes 3, 4 and 5 together hold every copy of partition 3.
        let together = [(n(3), 10 * ms), (n(4), 10 * ms), (n(5), 10 * ms)];
        assert!(survivable(6, 3, 3, &together, 20 * ms).is_err());
        // One by one, each after the copies of the one before: every partition is back
        // to three copies in time, down to three members.
        let apart = [(n(3), 10 * ms), (n(4), 40 * ms), (n(5), 70 * ms)];
        assert_eq!(survivable(6, 3, 3, &apart, 20 * ms), Ok(()));
        // Without re-replication the third crash loses partition 3's last copies.
        assert!(survivable(6, 3, 0, &apart, 20 * ms).is_err());
        // Too close together to count as apart.
        assert!(survivable(6, 3, 3, &apart, 40 * ms).is_err());
        // Two members left of three copies: a third crash leaves one copy.
        let down = [(n(0), ms), (n(1), 40 * ms), (n(2), 80 * ms), (n(3), 120 * ms)];
        assert!(survivable(5, 3, 3, &down[..3], 20 * ms).is_ok());
        assert!(survivable(5, 3, 3, &down, 20 * ms).is_err());
    }

    #[test]
    fn reports_count_only_for_the_epoch_they_were_made_in() {
        let next = next_config(&Config::initial(5, 3), &[NodeId(1)], 3).unwrap();
        let news = syncing(&next);
        assert!(!news.is_empty());
        let s = SyncState::default();
        let (p, n) = news[0];
        s.report(n, next.epoch - 1, std::iter::once(p));
        assert!(s.ready_in(&next, NodeId(0)).is_empty(), "a report of an older epoch");
        s.report(n, next.epoch, std::iter::once(p));
        let me = if n == NodeId(0) { NodeId(2) } else { NodeId(0) };
        assert_eq!(s.ready_in(&next, me), vec![(p, n)]);
    }
}
