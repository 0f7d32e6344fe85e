//! Running a transactional workload on a backend and judging the result.
//!
//! [`run`] sets the engine up, loads the workload's data, starts its clients on every
//! worker, measures inside a window after a warm-up, then checks the recorded history
//! for serializability and the workload's own invariants. The same code runs on every
//! backend; only time (virtual or wall) differs.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use hytra_check::{History, Report};
use hytra_fabric::rng::Rng;
use hytra_fabric::{Backend, BackendError, ClusterShape, Endpoint, NodeId, RunLimits, RunStats};
use hytra_rt::constants::COROUTINES_MAX;
use hytra_rt::{run_workers_with, RtConfig, Worker, WorkerStats};
use hytra_store::{
    layout::version_number, take_word, BackupState, Catalog, CatalogError, ImageDecodeError,
    ReplicaImage, StoreError, TableSpec,
};
use hytra_txn::config_store::{ConfigStore, MemoryStore};
use hytra_txn::{
    Abort, AbortReason, Engine, EngineError, Outcome, RecoveryEvent, RecoveryStep, Txn, TxnConfig,
    TxnCtx, TxnStats, WorkerTxn,
};
use thiserror::Error;

use crate::tally::{TallyReader, TallyReport};

/// What a client coroutine needs to know.
#[derive(Copy, Clone, Debug)]
pub struct ClientPlan {
    /// Coroutines per worker.
    pub coroutines: u16,
    /// Clients stop starting transactions at this time.
    pub end_ns: u64,
    /// Seed of every client's choices.
    pub seed: u64,
    /// Attempts of one transaction before giving up.
    pub retries_max: u32,
}

impl ClientPlan {
    /// Whether a client starts another transaction: the run's time is not over, and its
    /// node is still in the cluster.
    pub fn running<E: Endpoint>(&self, ctx: &TxnCtx<E>) -> bool {
        ctx.co().now_ns() < self.end_ns && !ctx.halted()
    }
}

/// Whether the workload's invariants held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantReport {
    /// All held.
    pub ok: bool,
    /// What was checked, and what failed.
    pub details: Vec<String>,
}

/// A benchmark: tables, data, clients, and an oracle.
pub trait Workload: Sync {
    /// What each worker's clients keep (not shared across threads).
    type State: 'static;
    /// What each worker reports at the end.
    type Report: Send
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + TallyReport;

    /// Name.
    fn name(&self) -> &'static str;
    /// Names of the transaction types (index = type id).
    fn txn_types(&self) -> &'static [&'static str];
    /// Checks the workload's parameters against the cluster.
    fn validate(&self, shape: ClusterShape) -> Result<(), String>;
    /// The tables for a cluster of `shape`.
    fn tables(&self, shape: ClusterShape) -> Vec<TableSpec>;
    /// Bytes of store memory per node the loaded data touches (regions may be sized for
    /// more: untouched memory costs nothing). By default, the whole regions of the
    /// partitions a node holds: every node registers a region for every partition, but
    /// writes only those of its replicas.
    fn store_bytes(&self, catalog: &Catalog, shape: ClusterShape) -> u64 {
        let _ = shape;
        let copies = u64::from(catalog.replication());
        catalog.tables().map(|t| catalog.geometry(t.id).region_bytes()).sum::<u64>() * copies
    }
    /// Loads the initial data ([`Engine::load`]: into one copy of each partition; the
    /// caller then calls [`Engine::finish_loading`] to make the others).
    fn load(&self, engine: &Engine, shape: ClusterShape) -> Result<(), StoreError>;
    /// Starts the clients of one worker.
    fn spawn<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        wt: &Rc<WorkerTxn>,
        plan: ClientPlan,
    ) -> Self::State;
    /// The worker's report, once it has finished.
    fn report(&self, state: Self::State) -> Self::Report;
    /// Checks the invariants on the final state.
    fn check(&self, engine: &Engine, reports: &[Self::Report]) -> InvariantReport;
}

/// Whether every backup holds exactly its primary's records (same versions, same
/// payloads) and no lock is left held: what every workload checks once a run has
/// drained. Returns (ok, details).
pub fn check_replicas(engine: &Engine) -> (bool, Vec<String>) {
    let catalog = &engine.catalog;
    let config = engine.final_config();
    let mut details = Vec::new();
    let (mut differing, mut locked, mut stale, mut records) = (0u64, 0u64, 0u64, 0u64);
    // A lock taken in an epoch before the final one is free (L6): the attempt that took
    // it was frozen, or its coordinator removed, and recovery resolved it.
    let current = hytra_store::Owner::new(0, 0, config.epoch, 0);
    let mut p = Vec::new();
    let mut q = Vec::new();
    for spec in catalog.tables() {
        p.resize(usize::from(spec.payload_words), 0);
        q.resize(usize::from(spec.payload_words), 0);
        for primary in engine.primaries(spec.id) {
            for (off, key) in primary.records() {
                records += 1;
                let snap = primary.read(off, key, &mut p).expect("no writer after the run");
                if snap.lock != 0 && !hytra_store::Owner(snap.lock).holds_in(current) {
                    stale += 1;
                } else if snap.lock != 0 {
                    locked += 1;
                    if locked == 1 {
                        details.push(format!(
                            "{}/{key} is still locked by worker {}",
                            spec.name,
                            hytra_store::Owner(snap.lock).worker()
                        ));
                    }
                }
                for &(b, state) in &config.placement.part(primary.partition).backups {
                    let replica = engine.node(b).store.replica(spec.id, primary.partition);
                    let backup = replica.lookup(key).map(|o| {
                        if replica.same_words(o, primary, off) {
                            return (snap.version, true);
                        }
                        let s = replica.read(o, key, &mut q).expect("no writer after the run");
                        (s.version, q == p)
                    });
                    let same = match (backup, state) {
                        (Some((v, payload_same)), _) if v == snap.version => {
                            !hytra_store::layout::is_present(v) || payload_same
                        }
                        // A backup still being copied (re-replication) may lack records or
                        // hold older versions, never a version its primary does not have.
                        (Some((v, _)), BackupState::Syncing { .. }) => {
                            version_number(v) < version_number(snap.version)
                        }
                        (None, BackupState::Syncing { .. }) => true,
                        (Some(_), BackupState::Ready) => false,
                        // A record an aborted insert created at the primary and nobody
                        // ever wrote: the backup never heard of it.
                        (None, BackupState::Ready) => snap.version == hytra_store::layout::ABSENT,
                    };
                    if !same {
                        differing += 1;
                        if differing == 1 {
                            details.push(format!(
                                "backup {b} of {}/{key} differs from its primary (version {:#x}; backup: {:?})",
                                spec.name, snap.version, backup
                            ));
                        }
                    }
                }
            }
        }
    }
    let syncing = hytra_txn::resync::syncing(&config).len();
    details.push(format!(
        "replicas equal their primaries: {} ({records} records, {differing} differ, {locked} locked{}{})",
        differing == 0 && locked == 0,
        if stale > 0 { format!(", {stale} stale locks of earlier epochs") } else { String::new() },
        if syncing > 0 {
            format!(", {syncing} new backups still copying (checked to hold nothing newer)")
        } else {
            String::new()
        }
    ));
    (differing == 0 && locked == 0, details)
}

/// How to run.
#[derive(Copy, Clone, Debug)]
pub struct BenchParams {
    /// Coroutines per worker.
    pub coroutines: u16,
    /// Warm-up before the measurement window.
    pub warmup_ns: u64,
    /// Measurement window.
    pub measure_ns: u64,
    /// Seed.
    pub seed: u64,
    /// Record the history and check it.
    pub check: bool,
    /// Runtime configuration (timeouts, doorbell batching).
    pub rt: RtConfig,
    /// How long the cluster may take to drain after the window before the run counts
    /// as hung.
    pub drain_ns: u64,
    /// Start with every node's location cache holding every remote record's address
    /// (the steady state of a long run), instead of empty.
    pub warm_cache: bool,
    /// Width of the intervals in which commits are counted over the whole run, for
    /// throughput over time ([`TxnStats::timeline`]); 0 counts none.
    pub timeline_ns: u64,
}

/// What a run measured and found.
#[derive(Clone, Debug)]
pub struct BenchResult<R> {
    /// Counters of every worker, merged.
    pub stats: TxnStats,
    /// Runtime counters, merged.
    pub rt: WorkerStats,
    /// Per-worker workload reports.
    pub reports: Vec<R>,
    /// The serializability check, if asked for.
    pub checker: Option<Report>,
    /// The workload's invariants.
    pub invariant: InvariantReport,
    /// The backend's run statistics (trace hash on the simulator).
    pub run: RunStats,
    /// Length of the measurement window.
    pub window_ns: u64,
    /// Transactions finished in the whole run (committed or given up; warm-up and drain
    /// included), for the speed of the simulation.
    pub attempts_total: u64,
    /// Location cache hits and misses, all nodes.
    pub cache_hits: u64,
    /// Misses.
    pub cache_misses: u64,
    /// What recovery did, if a node failed.
    pub recovery: RecoveryLog,
}

/// What recovery did during a run: the steps of every node of this process and the
/// survivors' commit timeline, from which [`RecoveryLog::times`] reads how long the
/// cluster took to recover.
#[derive(Clone, Debug, Default)]
pub struct RecoveryLog {
    /// Nodes that crashed.
    pub crashed: Vec<NodeId>,
    /// Recovery's steps on the nodes this process hosts, by time.
    pub events: Vec<(NodeId, RecoveryEvent)>,
    /// Commits of the workers of nodes that did not crash, by interval of
    /// [`BenchParams::timeline_ns`] over the whole run (as [`TxnStats::timeline`]); of a
    /// node that crashed and restarted, its new life's.
    pub survivors_timeline: Vec<u64>,
    /// The new backups (partition, node) still copying their partition when the run
    /// ended (re-replication not done).
    pub still_copying: Vec<(u16, NodeId)>,
}

/// Share of the survivors' commit rate before a crash that counts as recovered.
pub const RECOVERED_SHARE: f64 = 0.8;
/// Intervals in a row at that rate that count as recovered.
pub const RECOVERED_INTERVALS: usize = 5;

/// How long the cluster took to recover from a crash, each from the crash (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RecoveryTimes {
    /// The configuration manager set out to remove the crashed node.
    pub detected_ns: Option<u64>,
    /// The new configuration was committed to the store.
    pub configured_ns: Option<u64>,
    /// Every member was active in it (every partition served again).
    pub active_ns: Option<u64>,
    /// Every partition was back to its full count of promotable copies (re-replication
    /// done, and marked so in a configuration active everywhere).
    pub replicated_ns: Option<u64>,
    /// The start of the first timeline interval from which the survivors commit at
    /// [`RECOVERED_SHARE`] of their rate before the crash, [`RECOVERED_INTERVALS`]
    /// intervals in a row (or to the end of the run).
    pub recovered_ns: Option<u64>,
    /// The survivors' commits per second before the crash (measured intervals only).
    pub before_tps: f64,
    /// The survivors' commits per second from `recovered_ns` to the end of the window.
    pub after_tps: f64,
}

impl RecoveryLog {
    /// The recovery times of a crash at `crash_ns`, the timeline's intervals being
    /// `width_ns` wide and the measured window `[from_ns, to_ns)` (rates only from
    /// whole intervals inside it). Steps are those of the first reconfiguration after
    /// the crash.
    pub fn times(&self, crash_ns: u64, width_ns: u64, from_ns: u64, to_ns: u64) -> RecoveryTimes {
        let after = |pred: &dyn Fn(&RecoveryStep) -> bool| {
            self.events
                .iter()
                .find(|(_, e)| e.at_ns >= crash_ns && pred(&e.step))
                .map(|(_, e)| e.at_ns - crash_ns)
        };
        let mut t = RecoveryTimes {
            detected_ns: after(&|s| matches!(s, RecoveryStep::Removing { .. })),
            configured_ns: after(&|s| matches!(s, RecoveryStep::Committed { .. })),
            active_ns: after(&|s| matches!(s, RecoveryStep::ActiveEverywhere { .. })),
            replicated_ns: after(&|s| matches!(s, RecoveryStep::Replicated { .. })),
            ..RecoveryTimes::default()
        };
        let line = &self.survivors_timeline;
        let rate = |a: usize, b: usize| {
            let n: u64 = (a..b).map(|i| line.get(i).copied().unwrap_or(0)).sum();
            n as f64 / ((b - a) as f64 * width_ns as f64 / 1e9)
        };
        if width_ns == 0 || crash_ns >= to_ns {
            return t; // no timeline, or a crash after the window: no rates to compare
        }
        // Whole intervals only: those before the crash, and those of the window after.
        let (first, crash_at) =
            (from_ns.div_ceil(width_ns) as usize, (crash_ns / width_ns) as usize);
        let end = (to_ns / width_ns) as usize;
        if first >= crash_at {
            return t;
        }
        t.before_tps = rate(first, crash_at);
        let floor = t.before_tps * RECOVERED_SHARE;
        let recovered = (crash_at + 1..end)
            .find(|&j| (j..(j + RECOVERED_INTERVALS).min(end)).all(|i| rate(i, i + 1) >= floor));
        if let Some(j) = recovered {
            t.recovered_ns = Some(j as u64 * width_ns - crash_ns);
            t.after_tps = rate(j, end);
        }
        t
    }
}

/// Why a run could not be made.
#[derive(Debug, Error)]
pub enum BenchError {
    /// Bad tables or replication.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// Bad engine configuration.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Loading failed.
    #[error("loading: {0}")]
    Load(#[from] StoreError),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The cluster did not finish after the window.
    #[error("the cluster did not drain within {0} ns after the measurement window")]
    Hung(u64),
    /// Bad parameters.
    #[error("{0}")]
    Params(String),
    /// A failure recovery could not survive (e.g. every replica of a partition lost).
    #[error("recovery could not go on: {0}")]
    Recovery(String),
}

/// Runs `workload` on `backend` with the transaction configuration `cfg`, on a backend
/// that hosts every node in this process (see [`run_partial`] otherwise).
pub fn run<B: Backend, W: Workload>(
    backend: &mut B,
    workload: &W,
    cfg: TxnConfig,
    params: BenchParams,
) -> Result<BenchResult<W::Report>, BenchError> {
    run_partial(backend, workload, cfg, params)?.ok_or_else(|| {
        BenchError::Params("this process is not the first of its cluster: use run_partial".into())
    })
}

/// What one process of a cluster brings to the result: its counters, history and
/// workload reports. The first process receives one from every other process, as
/// [`Part::encode`] writes it, with the replica images of the sender's nodes.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Part<R> {
    /// Transaction counters of the process's workers, merged.
    pub stats: TxnStats,
    /// Runtime counters of the process's workers, merged.
    pub rt: WorkerStats,
    /// Committed transactions, when histories are recorded.
    pub history: Vec<hytra_check::TxnRecord>,
    /// Workload reports by dense worker index.
    pub reports: Vec<(usize, R)>,
    /// Transactions finished in the whole run.
    pub attempts_total: u64,
    /// Tickets and calls never collected (R5).
    pub leaked: u64,
    /// Whether every worker of the process finished.
    pub all_done: bool,
    /// The process's elapsed time.
    pub elapsed_ns: u64,
    /// The process's wall time.
    pub wall_ns: u64,
    /// Datagrams the process's fabric dropped.
    pub datagrams_dropped: u64,
    /// Sleeps of the process's event-waiting threads, and those an event ended.
    pub event_sleeps: u64,
    /// See [`Part::event_sleeps`].
    pub event_wakeups: u64,
}

/// A replica's contents with where it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedImage {
    /// Node.
    pub node: u16,
    /// Table id.
    pub table: u16,
    /// Partition of the replica region.
    pub partition: u16,
    /// The contents.
    pub image: ReplicaImage,
}

/// Why bytes did not decode as a [`Part`].
#[derive(Debug, Error)]
pub enum PartDecodeError {
    /// The length of the JSON, or of the image count or placement, is missing.
    #[error("the results end early: {0}")]
    Short(#[from] ImageDecodeError),
    /// The JSON is announced longer than what was sent.
    #[error("{announced} bytes of JSON announced, {left} sent")]
    JsonLength {
        /// Announced.
        announced: u64,
        /// Left.
        left: u64,
    },
    /// The JSON does not parse as a part.
    #[error("the results do not parse: {0}")]
    Json(#[from] serde_json::Error),
    /// Bytes follow the last image.
    #[error("{0} bytes after the last image")]
    Trailing(usize),
}

impl<R: serde::Serialize + serde::de::DeserializeOwned> Part<R> {
    /// The part as sent to the first process, followed by the images of every replica of
    /// the sender's nodes, in binary (taken one at a time, so that only their encoding
    /// is held whole): the length of the JSON, the JSON, the number of images, then each
    /// image's node, table and partition (one word) and the image.
    pub fn encode(&self, images: impl ExactSizeIterator<Item = PlacedImage>) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("results serialize");
        let mut out = Vec::with_capacity(json.len() + 16);
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        out.extend_from_slice(&(images.len() as u64).to_le_bytes());
        for PlacedImage { node, table, partition, image } in images {
            let place = u64::from(node) << 32 | u64::from(table) << 16 | u64::from(partition);
            out.extend_from_slice(&place.to_le_bytes());
            image.encode(&mut out);
        }
        out
    }

    /// Reads what [`Part::encode`] wrote. The bytes come from another process: every
    /// length is checked against what is left before anything is allocated, and the
    /// placements are not checked against a cluster here (see `restore_images`).
    pub fn decode(mut input: &[u8]) -> Result<(Part<R>, Vec<PlacedImage>), PartDecodeError> {
        let json_len = take_word(&mut input)?;
        if json_len > input.len() as u64 {
            return Err(PartDecodeError::JsonLength {
                announced: json_len,
                left: input.len() as u64,
            });
        }
        let (json, mut rest) = input.split_at(json_len as usize);
        let part: Part<R> = serde_json::from_slice(json)?;
        let count = take_word(&mut rest)?;
        let mut images = Vec::new();
        for _ in 0..count {
            let place = take_word(&mut rest)?;
            let image = ReplicaImage::decode(&mut rest)?;
            let (node, table, partition) =
                ((place >> 32) as u16, (place >> 16) as u16, place as u16);
            images.push(PlacedImage { node, table, partition, image });
        }
        if !rest.is_empty() {
            return Err(PartDecodeError::Trailing(rest.len()));
        }
        Ok((part, images))
    }
}

/// Restores the replica images a peer sent into this process's shadows of the peer's
/// nodes (images of nodes this process hosts are its own, and skipped). An image placed
/// on a node, table or partition that does not exist is refused: the bytes came from
/// another process.
fn restore_images(engine: &Engine, images: Vec<PlacedImage>) -> Result<(), BenchError> {
    for PlacedImage { node, table, partition, image } in images {
        let replica = engine
            .nodes
            .get(usize::from(node))
            .and_then(|n| n.store.replica_at(hytra_store::TableId(table), partition));
        let Some(replica) = replica else {
            return Err(BenchError::Params(format!(
                "a peer sent an image of node {node}, table {table}, partition {partition}, which this cluster does not have"
            )));
        };
        if !engine.hosts(NodeId(node)) {
            replica.restore(&image)?;
        }
    }
    Ok(())
}

/// Runs this process's part of a cluster: the same as [`run`] when the backend hosts
/// every node. Otherwise every process runs its nodes' workers, then sends its counters,
/// history, reports and replica contents to the first process, which rebuilds the whole
/// cluster's state in its shadows and checks it exactly as [`run`] does; it returns the
/// result, the others `None`.
pub fn run_partial<B: Backend, W: Workload>(
    backend: &mut B,
    workload: &W,
    cfg: TxnConfig,
    params: BenchParams,
) -> Result<Option<BenchResult<W::Report>>, BenchError> {
    run_partial_in(backend, workload, cfg, params, Processes::default(), &|_| {})
}

/// The stages of a run, in the order [`run_partial_in`] enters them; a run skips those
/// it has no work for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Registering the store's memory and loading the workload's records into it.
    Loading,
    /// Filling every node's location cache before the first transaction.
    Warming,
    /// The workers run: warm-up, window and drain.
    Running,
    /// Every process sends its part to the first (a cluster spread over processes).
    Gathering,
    /// Checking the database's invariants, and with `history` the history's
    /// serializability.
    Checking {
        /// Whether the history is checked too (`BenchParams::check`).
        history: bool,
    },
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Loading => "loading the tables",
            Stage::Warming => "warming the location caches",
            Stage::Running => "running",
            Stage::Gathering => "gathering the processes' results",
            Stage::Checking { history: true } => "checking the history and the database",
            Stage::Checking { history: false } => "checking the database",
        })
    }
}

/// What the processes of a cluster share beyond the fabric, so that the run survives
/// one of them dying.
#[derive(Clone)]
pub struct Processes {
    /// Where configurations are committed (every process of a cluster must name the
    /// same store).
    pub store: Arc<dyn ConfigStore>,
    /// A directory every process can read, where each worker journals its history and
    /// its clients' tally as they happen (with `check`), so that the part of a process
    /// killed during the run can be checked from its journal.
    pub journal: Option<PathBuf>,
}

impl Default for Processes {
    fn default() -> Processes {
        Processes { store: Arc::new(MemoryStore::default()), journal: None }
    }
}

/// The journal of worker `index` (dense, as [`ClusterShape::worker_index`]) in `dir`.
pub fn journal_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("worker-{index}.journal"))
}

/// What a killed process's workers journaled, as the part it never sent: their history
/// (attempts still in doubt kept iff recovery committed them, as `engine` knows) and
/// the tally their clients' events add up to. Only whole lines count: one cut short by
/// the kill is ignored ([`hytra_fabric::append::whole_lines`]).
fn journaled_part<R: TallyReport>(
    engine: &Engine,
    dir: &Path,
    workers: impl Iterator<Item = usize>,
) -> Result<Part<R>, BenchError> {
    let mut part = Part {
        stats: TxnStats::default(),
        rt: WorkerStats::default(),
        history: Vec::new(),
        reports: Vec::new(),
        attempts_total: 0,
        leaked: 0,
        all_done: true,
        elapsed_ns: 0,
        wall_ns: 0,
        datagrams_dropped: 0,
        event_sleeps: 0,
        event_wakeups: 0,
    };
    for index in workers {
        let path = journal_path(dir, index);
        let bad = |why: String| BenchError::Params(format!("journal {}: {why}", path.display()));
        let text = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let mut doubts: Vec<hytra_check::TxnRecord> = Vec::new();
        let mut tally = TallyReader::<R::Counts>::default();
        for (k, line) in hytra_fabric::append::whole_lines(&text).enumerate() {
            let Some(event) = parse_journal_line(line) else {
                return Err(bad(format!("line {} does not parse", k + 1)));
            };
            match event {
                JournalLine::Doubt(r) => doubts.push(r),
                JournalLine::Committed(r) => part.history.push(r),
                JournalLine::DoubtCommitted(id) => {
                    let Some(at) = doubts.iter().rposition(|d| d.id == id) else {
                        return Err(bad(format!("line {}: {id} was never in doubt", k + 1)));
                    };
                    part.history.push(doubts.swap_remove(at));
                }
                JournalLine::Tally(event) => {
                    tally.read(event).map_err(|why| bad(format!("line {}: {why}", k + 1)))?;
                }
            }
        }
        part.history.extend(doubts.into_iter().filter(|r| engine.verdict(r.id)));
        part.reports.push((index, R::from_tally(tally.tally())));
    }
    Ok(part)
}

/// One line of a worker's journal (see [`hytra_txn::WorkerTxn::set_journal`]). An
/// attempt that never commits keeps its `D` line: recovery decided it aborted, or it
/// never left its node.
enum JournalLine<'a> {
    /// `D`: an attempt past its commit point, outcome unknown.
    Doubt(hytra_check::TxnRecord),
    /// `H`: a committed transaction that was never in doubt.
    Committed(hytra_check::TxnRecord),
    /// `C`: the attempt of this id, whose `D` line came before, committed.
    DoubtCommitted(u64),
    /// `T`: an event of the clients' tally, for [`TallyReader`].
    Tally(&'a [u8]),
}

fn parse_journal_line(line: &[u8]) -> Option<JournalLine<'_>> {
    let (&tag, rest) = line.split_first()?;
    let body = rest.strip_prefix(b" ")?;
    Some(match tag {
        b'D' => JournalLine::Doubt(serde_json::from_slice(body).ok()?),
        b'H' => JournalLine::Committed(serde_json::from_slice(body).ok()?),
        b'C' => JournalLine::DoubtCommitted(std::str::from_utf8(body).ok()?.parse().ok()?),
        b'T' => JournalLine::Tally(body),
        _ => return None,
    })
}

/// As [`run_partial`], for a process of a cluster that shares `procs`. `stage` hears of
/// each [`Stage`] as the run enters it (a command line shows what a long setup is doing).
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
pub fn run_partial_in<B: Backend, W: Workload>(
    backend: &mut B,
    workload: &W,
    cfg: TxnConfig,
    params: BenchParams,
    procs: Processes,
    stage: &dyn Fn(Stage),
) -> Result<Option<BenchResult<W::Report>>, BenchError> {
    let shape = backend.shape();
    if params.coroutines == 0 || params.measure_ns == 0 {
        return Err(BenchError::Params(
            "coroutines and the measurement window must be positive".into(),
        ));
    }
    if params.coroutines > COROUTINES_MAX {
        return Err(BenchError::Params(format!(
            "{} coroutines per worker: at most {COROUTINES_MAX} (the engine's own tasks share the worker)",
            params.coroutines
        )));
    }
    workload.validate(shape).map_err(BenchError::Params)?;
    stage(Stage::Loading);
    let catalog = Catalog::new(workload.tables(shape), shape.nodes, cfg.replication)?;
    let engine = Engine::setup_with_store(
        backend,
        catalog,
        cfg,
        params.coroutines,
        procs.store.clone(),
        Some(&hytra_offload::lookup::Redn),
    )?;
    workload.load(&engine, shape)?;
    engine.finish_loading();
    let journal = procs.journal.as_deref().filter(|_| params.check);
    if params.warm_cache && engine.cfg.has_cache() {
        stage(Stage::Warming);
        engine.warm_caches();
    }
    stage(Stage::Running);
    let end_ns = params.warmup_ns + params.measure_ns;
    let plan = ClientPlan {
        coroutines: params.coroutines,
        end_ns,
        seed: params.seed,
        retries_max: cfg.retries_max,
    };
    let limits = RunLimits { time_limit_ns: end_ns + params.drain_ns };
    let (outs, run) = run_workers_with(
        backend,
        params.rt,
        limits,
        |w| {
            let wt = engine.install(w, params.check);
            if let Some(dir) = journal {
                let path = journal_path(dir, shape.worker_index(w.co().me()));
                match hytra_fabric::append::AppendFile::create(&path) {
                    Ok(f) => wt.set_journal(f),
                    Err(e) => panic!("cannot create the journal {}: {e}", path.display()),
                }
            }
            wt.set_window(params.warmup_ns, end_ns);
            wt.set_timeline(params.timeline_ns);
            let state = workload.spawn(w, &wt, plan);
            (wt, state)
        },
        |w, (wt, state)| {
            (
                (shape.worker_index(w.co().me()), wt.node.life),
                wt.stats(),
                wt.take_history(),
                wt.take_doubts(),
                w.stats(),
                workload.report(state),
                wt.finished_total(),
                w.leaked() as u64,
            )
        },
    )?;
    let mut survivors = TxnStats::default();
    let mut part = Part {
        stats: TxnStats::default(),
        rt: WorkerStats::default(),
        history: Vec::new(),
        reports: Vec::with_capacity(outs.len()),
        attempts_total: 0,
        leaked: 0,
        all_done: run.all_done,
        elapsed_ns: run.elapsed_ns,
        wall_ns: run.wall_ns,
        datagrams_dropped: run.datagrams_dropped,
        event_sleeps: run.event_sleeps,
        event_wakeups: run.event_wakeups,
    };
    // A crashed node's coroutines stopped where they were, tickets in hand; so did those
    // of a node that was removed (paused or cut off past its lease) and stopped itself.
    // So did those of a node's earlier life, once it restarted.
    let gone = |node: NodeId| {
        run.crashed.contains(&node) || engine.hosts(node) && engine.node(node).recovery.stopped()
    };
    for ((index, life), s, h, doubts, w, r, finished, leaked) in outs {
        part.attempts_total += finished;
        let node = shape.worker_at(index).node;
        let earlier = engine.hosts(node) && life < engine.node(node).life;
        if !gone(node) && !earlier {
            part.leaked += leaked;
            survivors.merge(&s);
        }
        part.stats.merge(&s);
        merge_rt(&mut part.rt, &w);
        part.history.extend(h);
        // Transactions whose coordinator crashed or left while they logged: recovery
        // decided which committed.
        part.history.extend(doubts.into_iter().filter(|r| engine.verdict(r.id)));
        part.reports.push((index, r));
    }
    let everywhere = (0..shape.nodes).all(|n| engine.hosts(NodeId(n)));
    let mut dead: Vec<NodeId> = Vec::new();
    let parts = if everywhere {
        vec![part]
    } else {
        // Only what was written travels: the regions of partitions a node never held
        // are empty.
        let replicas: Vec<_> = engine
            .nodes
            .iter()
            .filter(|n| engine.hosts(n.node))
            .flat_map(|n| n.store.replicas().filter(|r| !r.is_empty()).map(move |r| (n.node.0, r)))
            .collect();
        let images = replicas.iter().map(|(node, r)| PlacedImage {
            node: *node,
            table: r.table.0,
            partition: r.partition,
            image: r.image(),
        });
        stage(Stage::Gathering);
        let Some(blobs) = backend.gather(part.encode(images))? else { return Ok(None) };
        let mut parts = Vec::with_capacity(blobs.len());
        for b in blobs {
            let (p, images) = Part::<W::Report>::decode(&b)
                .map_err(|e| BenchError::Params(format!("a peer's results do not decode: {e}")))?;
            drop(b);
            // Restored images are dropped at once: together they are the whole database.
            restore_images(&engine, images)?;
            parts.push(p);
        }
        // Workers no part reports belong to processes that died: their journals tell.
        let reported: std::collections::BTreeSet<usize> =
            parts.iter().flat_map(|p| p.reports.iter().map(|(i, _)| *i)).collect();
        let lost: Vec<usize> =
            (0..shape.workers_total()).filter(|i| !reported.contains(i)).collect();
        if !lost.is_empty() {
            let Some(dir) = journal else {
                return Err(BenchError::Params(format!(
                    "workers {lost:?} sent no results (their process died), and no journal was kept to check them by (run with --check)"
                )));
            };
            for &i in &lost {
                let node = shape.worker_at(i).node;
                if !dead.contains(&node) {
                    dead.push(node);
                }
            }
            parts.push(journaled_part(&engine, dir, lost.into_iter())?);
        }
        parts
    };
    if let Some(why) = engine.lives().find_map(|n| n.recovery.fatal()) {
        return Err(BenchError::Recovery(why));
    }
    // Nodes that stop themselves (cut off from the others past their leases) leave their
    // transactions in doubt to a reconfiguration by the rest. If none is left, nothing
    // decided them, and neither the history nor the database can be judged.
    if everywhere && (0..shape.nodes).map(NodeId).all(gone) {
        let crashed = run.crashed.len();
        let stopped = usize::from(shape.nodes) - crashed;
        let mut why = format!(
            "no node is left: {stopped} stopped themselves, cut off from the others for longer than a reconfiguration takes"
        );
        if crashed > 0 {
            why += &format!(", and {crashed} crashed");
        }
        if run.datagrams_dropped > 0 {
            why += &format!(" ({} datagrams were lost)", run.datagrams_dropped);
        }
        return Err(BenchError::Recovery(
            why + "; nothing decided the transactions they left in doubt",
        ));
    }
    if parts.iter().any(|p| !p.all_done) {
        return Err(BenchError::Hung(params.drain_ns));
    }
    let mut stats = TxnStats::default();
    let mut rt = WorkerStats::default();
    let mut history = History::new();
    let mut reports = Vec::new();
    let mut attempts_total = 0;
    let mut leaked = 0;
    let mut run = RunStats { all_done: true, ..run };
    for (i, p) in parts.into_iter().enumerate() {
        leaked += p.leaked;
        stats.merge(&p.stats);
        merge_rt(&mut rt, &p.rt);
        history.txns.extend(p.history);
        reports.extend(p.reports);
        attempts_total += p.attempts_total;
        if i > 0 {
            run.elapsed_ns = run.elapsed_ns.max(p.elapsed_ns);
            run.wall_ns = run.wall_ns.max(p.wall_ns);
            run.datagrams_dropped += p.datagrams_dropped;
            run.event_sleeps += p.event_sleeps;
            run.event_wakeups += p.event_wakeups;
        }
    }
    reports.sort_by_key(|(i, _)| *i);
    let reports: Vec<W::Report> = reports.into_iter().map(|(_, r)| r).collect();
    stage(Stage::Checking { history: params.check });
    let checker = params.check.then(|| hytra_check::check(&history));
    let mut invariant = workload.check(&engine, &reports);
    // Every ticket and call is collected exactly once (R5): a leak is a bug of the
    // engine, whatever the workload.
    invariant.ok &= leaked == 0;
    invariant.details.push(format!("tickets and calls never collected: {leaked}"));
    match engine.check_nic_index() {
        Some(Ok(summary)) => invariant.details.push(summary),
        Some(Err(what)) => {
            invariant.ok = false;
            invariant.details.push(what);
        }
        None => {}
    }
    let (cache_hits, cache_misses) = (stats.cache_hits, stats.cache_misses);
    let mut events: Vec<(NodeId, RecoveryEvent)> = engine
        .lives()
        .filter(|n| engine.hosts(n.node))
        .flat_map(|n| n.recovery.events().into_iter().map(move |e| (n.node, e)))
        .collect();
    events.sort_by_key(|(n, e)| (e.at_ns, *n));
    let mut crashed = run.crashed.clone();
    crashed.extend(dead);
    let recovery = RecoveryLog {
        crashed,
        events,
        // Spread over processes, nobody crashes (crashes are simulated), and only this
        // process's workers' counters were kept apart.
        survivors_timeline: if everywhere { survivors.timeline } else { stats.timeline.clone() },
        still_copying: hytra_txn::resync::syncing(&engine.final_config()),
    };
    Ok(Some(BenchResult {
        stats,
        rt,
        reports,
        checker,
        invariant,
        run,
        window_ns: params.measure_ns,
        attempts_total,
        cache_hits,
        cache_misses,
        recovery,
    }))
}

fn merge_rt(into: &mut WorkerStats, w: &WorkerStats) {
    into.steps += w.steps;
    into.resumes += w.resumes;
    into.ops.completions += w.ops.completions;
    into.ops.internal_signals += w.ops.internal_signals;
    into.ops.unsignaled_errors += w.ops.unsignaled_errors;
    into.rpc.calls += w.rpc.calls;
    into.rpc.replies += w.rpc.replies;
    into.rpc.timeouts += w.rpc.timeouts;
    into.rpc.stale_replies += w.rpc.stale_replies;
    into.rpc.served += w.rpc.served;
    into.rpc.malformed += w.rpc.malformed;
    into.rpc.duplicates += w.rpc.duplicates;
    into.rpc.no_credit += w.rpc.no_credit;
    into.frames_sent += w.frames_sent;
    into.datagrams_sent += w.datagrams_sent;
}

/// Starts `plan.coroutines` client coroutines on `w`: `client` gets each one's
/// transaction context and a random stream of its own (derived from the seed, the worker
/// and the coroutine, so runs replay).
pub fn spawn_clients<E, F, Fut>(
    w: &mut Worker<E>,
    wt: &Rc<WorkerTxn>,
    plan: ClientPlan,
    mut client: F,
) where
    E: Endpoint + 'static,
    F: FnMut(TxnCtx<E>, Rng) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let me = w.co().shape().worker_index(w.co().me()) as u64;
    for k in 0..plan.coroutines {
        // Contexts are made before the first step, so the background task knows they
        // exist (it ends after the last one).
        let ctx = wt.ctx(w.co(), k);
        let rng = Rng::derive(plan.seed, me << 16 | u64::from(k));
        let fut = client(ctx, rng);
        w.spawn(move |_| fut);
    }
}

/// Runs one transaction whose body is `body` until it commits, aborts for good or
/// exhausts its attempts (as [`run_txn`]); returns the value the committed attempt's body
/// produced, `None` if it did not commit.
pub async fn run_body<E, T, F>(
    ctx: &mut TxnCtx<E>,
    rng: &mut Rng,
    ty: u8,
    retries_max: u32,
    mut body: F,
) -> Option<T>
where
    E: Endpoint,
    F: AsyncFnMut(&mut Txn<'_, E>) -> Result<T, Abort>,
{
    let mut value = None;
    let outcome = run_txn(ctx, rng, ty, retries_max, async |ctx: &mut TxnCtx<E>, first: bool| {
        let mut t = if first { ctx.begin(ty) } else { ctx.retry() };
        let (result, v) = match body(&mut t).await {
            Ok(v) => (Ok(()), Some(v)),
            Err(e) => (Err(e), None),
        };
        value = v;
        t.finish(result).await
    })
    .await;
    if outcome == Outcome::Committed {
        value
    } else {
        None
    }
}

/// Runs one transaction until it commits, aborts for good, or exhausts its attempts,
/// backing off between retries: a random number of yields growing with the attempts, or
/// after an unreachable node until the configuration changes
/// ([`TxnCtx::await_reconfiguration`]), or, once one attempt of another transaction has
/// blocked more than [`STUCK_LOCK_REPEATS`](hytra_txn::STUCK_LOCK_REPEATS) of this
/// transaction's attempts, a time that doubles with each further block by that holder
/// ([`TxnCtx::await_stuck_lock`]). A client whose node left the cluster while it waited
/// stops without another attempt.
/// `attempt` runs the body of one attempt on the context.
pub async fn run_txn<E, F>(
    ctx: &mut TxnCtx<E>,
    rng: &mut Rng,
    ty: u8,
    retries_max: u32,
    mut attempt: F,
) -> Outcome
where
    E: Endpoint,
    F: AsyncFnMut(&mut TxnCtx<E>, bool) -> Outcome,
{
    let mut first = true;
    let started_in = ctx.co().step_time_ns();
    let outcome = loop {
        let outcome = attempt(ctx, first).await;
        first = false;
        match outcome {
            // A node that left the cluster runs nothing more.
            Outcome::Aborted(_) if ctx.halted() => break outcome,
            // Nothing changes for an unreachable node until recovery removes it.
            Outcome::Aborted(AbortReason::Unreachable) if ctx.attempts() < retries_max => {
                ctx.await_reconfiguration().await;
            }
            // A lock that outlives its holder's node lasts until the node is removed.
            Outcome::Aborted(r) if r.retryable() && ctx.attempts() < retries_max => {
                if !ctx.await_stuck_lock().await {
                    let spins = rng.below(u64::from(ctx.attempts().min(16)) * 2 + 1);
                    for _ in 0..spins {
                        ctx.co().yield_now().await;
                    }
                }
            }
            Outcome::Aborted(r) if r.retryable() => {
                ctx.worker().gave_up(ty);
                break outcome;
            }
            _ => break outcome,
        }
        // The node may have left the cluster while this client waited.
        if ctx.halted() {
            break outcome;
        }
    };
    // A transaction that never waited (read-only on local records) ran inside one step
    // of its worker: without a yield, clients of such transactions would hold the worker
    // for the whole run, and its handlers, its lease and its peers' requests with it.
    if ctx.co().step_time_ns() == started_in {
        ctx.co().yield_now().await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_times_read_the_steps_and_the_survivors_timeline() {
        let at = |ms: u64, step| (NodeId(0), RecoveryEvent { at_ns: ms * 1_000_000, step });
        // 1 ms intervals: 100 commits each, nothing from the crash at 10 ms until 16 ms,
        // 50 at 16 ms, then 90 (above 80%) to the end at 30 ms.
        let mut line = vec![100u64; 10];
        line.extend([0; 6]);
        line.push(50);
        line.extend([90; 13]);
        let log = RecoveryLog {
            crashed: vec![NodeId(3)],
            events: vec![
                at(2, RecoveryStep::Active { epoch: 1 }),
                at(15, RecoveryStep::Removing { dead: vec![NodeId(3)], from_epoch: 1 }),
                at(15, RecoveryStep::Committed { epoch: 2 }),
                at(16, RecoveryStep::ActiveEverywhere { epoch: 2 }),
            ],
            survivors_timeline: line,
            still_copying: Vec::new(),
        };
        let t = log.times(10_000_000, 1_000_000, 2_000_000, 30_000_000);
        assert_eq!(t.detected_ns, Some(5_000_000));
        assert_eq!(t.configured_ns, Some(5_000_000));
        assert_eq!(t.active_ns, Some(6_000_000));
        assert_eq!(t.recovered_ns, Some(7_000_000), "the first of 5 intervals at 80%");
        assert!((t.before_tps - 100_000.0).abs() < 1e-6 && (t.after_tps - 90_000.0).abs() < 1e-6);
        // A crash outside the window, or a window that starts at it, has no rates.
        assert_eq!(log.times(40_000_000, 1_000_000, 2_000_000, 30_000_000).recovered_ns, None);
        assert_eq!(log.times(10_000_000, 1_000_000, 10_000_000, 30_000_000).before_tps, 0.0);
    }

    #[test]
    fn a_part_travels_with_its_images_and_a_cut_one_is_refused() {
        let part = Part::<u32> {
            stats: TxnStats::default(),
            rt: WorkerStats::default(),
            history: Vec::new(),
            reports: vec![(3, 17)],
            attempts_total: 41,
            leaked: 0,
            all_done: true,
            elapsed_ns: 5,
            wall_ns: 6,
            datagrams_dropped: 2,
            event_sleeps: 9,
            event_wakeups: 8,
        };
        let image = |n: u64| ReplicaImage {
            next_record: n,
            next_overflow: 1,
            pages: vec![(4096 * n, vec![n, 0, u64::MAX])],
        };
        let placed = |node, table, partition, image| PlacedImage { node, table, partition, image };
        let images = vec![placed(2, 7, 1, image(1)), placed(65535, 65535, 65535, image(2))];
        let bytes = part.encode(images.clone().into_iter());
        let (back, back_images) = Part::<u32>::decode(&bytes).unwrap();
        assert_eq!(back.reports, vec![(3, 17)]);
        assert_eq!((back.attempts_total, back.datagrams_dropped), (41, 2));
        assert_eq!((back.event_sleeps, back.event_wakeups), (9, 8));
        assert_eq!(back_images, images);
        for cut in [0, 7, 12, bytes.len() - 1] {
            assert!(Part::<u32>::decode(&bytes[..cut]).is_err(), "{cut} bytes decoded");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Part::<u32>::decode(&longer).is_err(), "a trailing byte was accepted");
    }

    /// A peer's image placed on a node, table or partition the cluster does not have is
    /// refused; it used to index the engine's nodes and the store's replicas directly.
    #[test]
    fn an_image_placed_outside_the_cluster_is_refused() {
        use hytra_fabric::sim::{SimCluster, SimConfig};
        use hytra_store::{Fill, IndexLayout, Partitioner, TableId};

        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let mut b = SimCluster::new(SimConfig::new(shape, 1)).unwrap();
        let table = TableSpec {
            id: TableId(0),
            name: "t".into(),
            payload_words: 2,
            capacity: 16,
            partitioner: Partitioner::Modulo,
            index: IndexLayout::Hashed,
            fill: Fill::Dense,
        };
        let cfg = TxnConfig { replication: 2, ..TxnConfig::preset(hytra_txn::Design::DrtmH) };
        let catalog = Catalog::new(vec![table], 2, 2).unwrap();
        let engine = Engine::setup(&mut b, catalog, cfg, 1).unwrap();
        let image = ReplicaImage { next_record: 0, next_overflow: 0, pages: Vec::new() };
        let placed =
            |node, table, partition| PlacedImage { node, table, partition, image: image.clone() };
        assert!(restore_images(&engine, vec![placed(1, 0, 1)]).is_ok(), "a real replica");
        for (node, table, partition) in [(2, 0, 0), (u16::MAX, 0, 0), (0, 1, 0), (0, 0, 2)] {
            let got = restore_images(&engine, vec![placed(node, table, partition)]);
            assert!(
                matches!(got, Err(BenchError::Params(_))),
                "node {node} table {table} partition {partition}"
            );
        }
    }
}
