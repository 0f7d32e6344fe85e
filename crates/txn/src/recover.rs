//! Recovery from failed nodes (FaRM's protocol, adapted to hytra's logs): leases detect
//! failures, the configuration manager commits a new configuration to the configuration
//! store, and the members then agree on the fate of every transaction the failure left
//! in doubt before any transaction of the new epoch runs.
//!
//! The configuration manager (the lowest member) grants every member a lease and renews
//! it on request: one-way messages both ways, several per lease, so that losing a few in
//! a row costs nothing (a lease starts when its request was sent, by the member's own
//! clock, so a late grant never extends it past what the manager counts on). A member whose lease has run out posts no engine traffic and serves
//! none; one that stays cut off for long stops for good. The manager removes a member
//! whose renewals stop and runs a reconfiguration in rounds, each repeated until every
//! member of the new configuration has answered (a member that does not answer is
//! removed in turn, by the next reconfiguration). It keeps granting leases meanwhile, so
//! if it dies in a reconfiguration, the next member takes the reconfiguration over:
//!
//! 1. `CONFIG`: install the configuration (recovering), fence the removed nodes off the
//!    NIC, and quiesce: every worker freezes its attempts of the old epoch and lands what
//!    its connections carry (a signaled READ behind everything on each), so that nothing
//!    of the old epoch changes memory afterwards.
//! 2. `REPORT`: every backup reads its rings past their heads: the entries in doubt (with
//!    each transaction's written partitions) and how far each ring was applied.
//! 3. `DECIDE`: a transaction commits iff every surviving backup of every partition it
//!    wrote holds its whole log (in doubt, or applied); every other entry is void (what
//!    an earlier recovery decided stands, F4). The decisions go out in pages; once every
//!    member holds them all, the manager says go, and each backup applies what
//!    committed, voids the rest, and hands the committed records of
//!    partitions whose primary is elsewhere to that primary (`APPLY`), which applies them
//!    and releases their locks; a promoted primary already holds them. Locks of the old
//!    epoch are free once the new one is active (L6): nothing has to find them.
//! 4. `ACTIVATE`: transactions of the new epoch run.
//!
//! Not for: the transaction protocol itself (see `txn.rs`, `commit.rs`); deciding where
//! partitions go is `next_config`'s only policy.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use hytra_fabric::{Endpoint, NodeId, Qp, RemoteAddr, WorkRequest, WorkerId};
use hytra_rt::{Co, HandlerCtx, RpcType, Worker};
use hytra_store::{BackupState, PartitionPlace, Placement, TableId};

use crate::config::ProtocolPoint;
use crate::config_store::{Cas, ConfigStore, StoreFailure};
use crate::engine::{crash_point, NodeEngine, Refile, WorkerTxn};
use crate::log::{records, resolve, scan, InDoubt};
use crate::membership::{Config, EPOCH_FIRST};
use crate::resync::{
    add_backups, fully_replicated, ready_config, syncing, Copier, Rereplication, SyncState, Turn,
};
use crate::suspect::{Suspicions, SUSPICION_LEASES};
use crate::wire::{In, Out};

/// A member asks the manager to renew its lease (one-way): epoch, done, its clock, the
/// manager's clock at the newest grant it received, then what it copied and suspects.
pub const LEASE: RpcType = RpcType(8);
/// The manager hands a member a new configuration: config -> (epoch, quiesced).
pub const CONFIG: RpcType = RpcType(9);
/// The manager asks a member for its rings' entries in doubt (a page at a time).
pub const REPORT: RpcType = RpcType(10);
/// The manager tells a member which transactions in doubt committed (a page at a time).
pub const DECIDE: RpcType = RpcType(11);
/// The manager lets a member run transactions of the new epoch.
pub const ACTIVATE: RpcType = RpcType(12);
/// A backup hands a primary the records of committed transactions it holds logs of.
pub const APPLY: RpcType = RpcType(13);
/// The manager tells a member the run is over (one-way, repeated).
pub const FINISH: RpcType = RpcType(14);
/// The manager renews a member's lease (one-way): epoch, the member's clock when it
/// asked, the manager's clock now.
pub const GRANT: RpcType = RpcType(15);
/// A member that heard no grant for a takeover's silence asks the others how long they
/// have not heard one (see `others_agree`).
pub const HEARD: RpcType = RpcType(17);
/// A node that restarted asks the manager to take it in as a new member (one-way,
/// repeated): empty.
pub const JOIN: RpcType = RpcType(18);

/// Lease renewals per lease: losing all but one of them in a row still keeps it.
const RENEWALS_PER_LEASE: u64 = 8;

/// Bytes of one page of a report or decision list: well inside one RPC frame.
const PAGE_BYTES: usize = 3_000;

/// Steps recorded per node at most (a reconfiguration records about five on each).
const EVENTS_MAX: usize = 1_000;

/// A step recovery took on one node.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RecoveryStep {
    /// The manager set out to remove `dead` from configuration `from_epoch`.
    Removing {
        /// The nodes it removes.
        dead: Vec<NodeId>,
        /// The configuration they leave.
        from_epoch: u64,
    },
    /// The manager set out to take restarted `joined` in as members of the
    /// configuration after `from_epoch`.
    Joining {
        /// The nodes it takes in.
        joined: Vec<NodeId>,
        /// The configuration they join.
        from_epoch: u64,
    },
    /// The manager committed configuration `epoch` to the configuration store.
    Committed {
        /// The new configuration.
        epoch: u64,
    },
    /// This node installed configuration `epoch` (and stopped the attempts of older ones).
    Installed {
        /// The new configuration.
        epoch: u64,
    },
    /// The manager decided the transactions in doubt.
    Decided {
        /// Transactions some backup held a log entry of.
        in_doubt: usize,
        /// Of them, those that committed.
        committed: usize,
    },
    /// This node serves transactions again, in configuration `epoch`.
    Active {
        /// The new configuration.
        epoch: u64,
    },
    /// The manager learnt that every member is active in configuration `epoch`.
    ActiveEverywhere {
        /// The new configuration.
        epoch: u64,
    },
    /// This node holds every record of `partition`, whose backup it was made after a
    /// failure (re-replication), having read `bytes` of the primary's records.
    Copied {
        /// The partition.
        partition: u16,
        /// Bytes read from its primary.
        bytes: u64,
    },
    /// The manager committed revision `revision` of the epoch in force, in which the
    /// backups `ready` (partition, node), whose copies are whole, are promotable.
    Readied {
        /// The backups made ready.
        ready: Vec<(u16, NodeId)>,
        /// The revision.
        revision: u64,
    },
    /// Every partition has its full count of promotable copies again (or one per member,
    /// if fewer), from revision `revision` on.
    Replicated {
        /// The revision.
        revision: u64,
    },
}

/// A step of recovery and when it happened (virtual or wall ns, as the backend counts).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RecoveryEvent {
    /// When.
    pub at_ns: u64,
    /// What.
    pub step: RecoveryStep,
}

/// How recovery is tuned.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct RecoveryParams {
    /// Length of a lease. A member renews eight times per lease; the manager removes a
    /// member whose lease ran out, plus a sixteenth. On real backends it must outlast
    /// any pause a loaded host imposes on a thread (a false expiry removes a live node).
    pub lease_ns: u64,
    /// Time one operation on the configuration store takes (the simulator waits it out;
    /// real stores take what they take).
    pub store_latency_ns: u64,
    /// Whether a partition that lost a copy gets a new one, and how fast it is copied.
    pub rereplication: Rereplication,
}

impl RecoveryParams {
    /// The simulator's: a lease of 5 ms, the short end of FaRM's 5-10 ms on real
    /// machines (2 ms removed live nodes under the swarm's lost datagrams and 2 ms
    /// pauses), and a configuration store answering in 0.5 ms, about a coordination
    /// service's commit.
    /// Copies go at 250 MB/s into each node: a SmallBank partition of 16 MB is whole
    /// again in about 70 ms, and the survivors meanwhile run at about 95% of their rate
    /// (each record copied costs its receiver a record's CPU time; 1 GB/s cost them 22%,
    /// docs/PERFORMANCE.md).
    pub fn simulated() -> RecoveryParams {
        RecoveryParams {
            lease_ns: 5_000_000,
            store_latency_ns: 500_000,
            rereplication: Rereplication::Paced { bytes_per_sec: 250_000_000 },
        }
    }

    /// Threads and processes of a loaded 2-core host: a lease of 2 s, far beyond any
    /// scheduling pause there. Copies go at 128 MB/s into each node: on shared memory
    /// or TCP every byte read costs the primary's host CPU.
    pub fn real() -> RecoveryParams {
        RecoveryParams {
            lease_ns: 2_000_000_000,
            store_latency_ns: 0,
            rereplication: Rereplication::Paced { bytes_per_sec: 128_000_000 },
        }
    }
}

/// How far a member got with the decisions of a recovery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Pages of decisions arriving.
    #[default]
    Gathering,
    /// The manager sent its last page: this node holds every decision, applied none.
    Complete,
    /// Every member holds them all (the manager said go): applying here.
    Applying,
    /// This node applied them all.
    Applied,
}

impl Stage {
    fn code(self) -> u8 {
        self as u8
    }
}

/// The decisions of the recovery in progress, as a member holds them.
#[derive(Default)]
struct Decisions {
    epoch: u64,
    committed: BTreeSet<u64>,
    stage: Stage,
}

/// What a DECIDE request carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DecidePage {
    /// Some of the transactions that commit.
    More,
    /// The last of them.
    Last,
    /// No more decisions: every member holds them all, apply them.
    Go,
}

impl DecidePage {
    fn code(self) -> u8 {
        match self {
            DecidePage::More => 0,
            DecidePage::Last => 1,
            DecidePage::Go => 2,
        }
    }

    fn of(code: u8) -> Option<DecidePage> {
        match code {
            0 => Some(DecidePage::More),
            1 => Some(DecidePage::Last),
            2 => Some(DecidePage::Go),
            _ => None,
        }
    }
}

/// How far a node is with the end of the run, as its lease renewals tell the manager.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
enum EndState {
    /// Its clients still run.
    Running = 0,
    /// Its clients are done (and their logs flushed).
    Done = 1,
    /// It heard the manager end the run: the manager need not tell it again.
    Finished = 2,
}

impl EndState {
    fn decode(b: u8) -> Option<EndState> {
        match b {
            0 => Some(EndState::Running),
            1 => Some(EndState::Done),
            2 => Some(EndState::Finished),
            _ => None,
        }
    }
}

/// What the workers of a node share about recovery.
pub struct NodeRecovery {
    /// The configuration epoch whose recovery is in progress here (0: none).
    recovering: AtomicU64,
    /// Until when this node may serve and post engine traffic, by its clock (ns).
    lease_until: AtomicU64,
    /// Per worker index: the last epoch it quiesced for.
    quiesced: Vec<AtomicU64>,
    decisions: Mutex<Decisions>,
    /// The newest epoch whose decisions this node holds in full (perhaps not yet applied
    /// anywhere), and the transactions they commit (those of every recovery before it
    /// included): a manager that takes over a reconfiguration keeps to them (F4).
    decided: Mutex<(u64, BTreeSet<u64>)>,
    /// The same for decisions being applied: the newest epoch whose decisions every
    /// member held before any applied them, and what they committed. An attempt of an
    /// older epoch that is not in the set did not commit.
    verdicts: Mutex<(u64, BTreeSet<u64>)>,
    /// Records applied here by a recovery whose configuration was superseded before
    /// their primaries acknowledged them: (owner, partition, record as APPLY carries
    /// it). The next recovery hands them to the primaries it places.
    unforwarded: Mutex<Vec<(u64, u16, Vec<u8>)>>,
    /// Workers whose background task finished (final log flush done).
    flushed: AtomicU64,
    /// Manager: when each node last renewed its lease (or, if later, when this node
    /// installed the configuration in force), and whether its clients are done.
    renewed: Vec<AtomicU64>,
    /// Manager: per node, the member's clock of a renewal not yet granted (0: none).
    to_grant: Vec<AtomicU64>,
    /// Manager: per node, when (its clock) it last granted it a lease, and the epoch in
    /// which it stopped granting it, to remove it once that lease ran out (a suspect, or
    /// a member whose grants are lost; 0: never).
    granted_to: Vec<AtomicU64>,
    revoked: Vec<AtomicU64>,
    /// Manager: per node, the newest of its grants (by this node's clock) the member said
    /// it received, or, if later, the moment before this node committed the
    /// configuration in force.
    /// A member takes over only a takeover's silence after the newest grant it received,
    /// so the manager's own lease ends before then ([`takeover_ns`]).
    acked: Vec<AtomicU64>,
    /// Manager: per node, when (this node's clock) a renewal last said a new grant
    /// arrived, or, if later, when a silence restarted.
    round_trip: Vec<AtomicU64>,
    /// Member: its clock when the newest grant arrived (or, if later, when a silence
    /// restarted): the manager's silence is measured from here.
    grant_heard: AtomicU64,
    /// Member: the manager's clock at the newest grant received in the configuration in
    /// force (0: none yet), said back in each renewal.
    grant_echo: AtomicU64,
    /// The newest epoch another member asked [`HEARD`] from: one newer than this node's
    /// was committed without it hearing (its manager died before telling anyone), and
    /// the membership task reads the store for it at its next turn.
    asked_from: AtomicU64,
    /// Manager: how far each member is with the end of the run ([`EndState`]).
    end_states: Vec<AtomicU8>,
    /// The whole run is over.
    finished: AtomicBool,
    /// This node stopped itself (cut off longer than it may be).
    stopped: AtomicBool,
    /// Transaction coroutines of this node still running.
    clients: AtomicU64,
    /// What recovery could not survive.
    /// (Set once; read without a lock, as [`NodeRecovery::ended`] is on every turn of
    /// every client.)
    fatal: OnceLock<String>,
    /// Times of recovery's steps, for reports: (what, ns).
    events: Mutex<Vec<RecoveryEvent>>,
    /// The copies of re-replication into this node, and as manager into the others.
    sync: SyncState,
    /// Members this node's requests found unreachable, and as manager those reported.
    suspicions: Suspicions,
    /// Where configurations are committed.
    store: Arc<dyn ConfigStore>,
    params: RecoveryParams,
    /// This node restarted and is not a member yet (see [`NodeRecovery::joining`]).
    joining: AtomicBool,
    /// Manager: per node, when (this node's clock) it last asked to join (0: never).
    join_asked: Vec<AtomicU64>,
    /// Per node, the epoch of the first configuration this node installed that took it
    /// in after a restart (0: none): the connections to it carry nothing from before.
    joined_in: Vec<AtomicU64>,
    /// The newest epoch this node was activated in.
    activated: AtomicU64,
    /// This node runs the rounds of a reconfiguration (its membership task is busy).
    in_rounds: AtomicBool,
}

impl NodeRecovery {
    /// A node's recovery state for a cluster of `nodes` with `workers` per node.
    pub fn new(
        nodes: u16,
        workers: u16,
        store: Arc<dyn ConfigStore>,
        params: RecoveryParams,
    ) -> NodeRecovery {
        NodeRecovery {
            recovering: AtomicU64::new(0),
            lease_until: AtomicU64::new(params.lease_ns),
            // The first configuration needs no quiescing: nothing ran before it.
            quiesced: (0..workers).map(|_| AtomicU64::new(EPOCH_FIRST)).collect(),
            decisions: Mutex::new(Decisions::default()),
            decided: Mutex::new((0, BTreeSet::new())),
            verdicts: Mutex::new((0, BTreeSet::new())),
            unforwarded: Mutex::new(Vec::new()),
            flushed: AtomicU64::new(0),
            renewed: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            to_grant: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            granted_to: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            revoked: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            acked: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            round_trip: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            grant_heard: AtomicU64::new(0),
            grant_echo: AtomicU64::new(0),
            asked_from: AtomicU64::new(0),
            end_states: (0..nodes).map(|_| AtomicU8::new(EndState::Running as u8)).collect(),
            finished: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            clients: AtomicU64::new(0),
            fatal: OnceLock::new(),
            events: Mutex::new(Vec::new()),
            sync: SyncState::default(),
            suspicions: Suspicions::default(),
            store,
            params,
            joining: AtomicBool::new(false),
            join_asked: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            joined_in: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            activated: AtomicU64::new(EPOCH_FIRST),
            in_rounds: AtomicBool::new(false),
        }
    }

    /// The recovery state of a node that restarted: it holds no lease and serves nothing
    /// until a configuration takes it in as a member again, which it asks the manager
    /// for ([`JOIN`]).
    pub fn joining(
        nodes: u16,
        workers: u16,
        store: Arc<dyn ConfigStore>,
        params: RecoveryParams,
    ) -> NodeRecovery {
        let rec = NodeRecovery::new(nodes, workers, store, params);
        rec.lease_until.store(0, Ordering::Release);
        rec.activated.store(0, Ordering::Release);
        rec.joining.store(true, Ordering::Release);
        rec
    }

    /// Whether this node restarted and is not a member yet.
    pub fn is_joining(&self) -> bool {
        self.joining.load(Ordering::Acquire)
    }

    /// Workers per node.
    pub(crate) fn workers(&self) -> u16 {
        self.quiesced.len() as u16
    }

    /// The configuration store.
    pub(crate) fn store(&self) -> Arc<dyn ConfigStore> {
        self.store.clone()
    }

    /// Whether transactions may run here at `now_ns`: no recovery in progress, the lease
    /// valid, the node not stopped. The lease is read against the caller's clock, not a
    /// flag some task last set: a node that wakes from a pause past its lease may run
    /// any coroutine first, and none of them may take a lapsed lease for a valid one.
    pub(crate) fn open(&self, now_ns: u64) -> bool {
        self.recovering.load(Ordering::Acquire) == 0
            && now_ns <= self.lease_until.load(Ordering::Acquire)
            && !self.stopped.load(Ordering::Acquire)
    }

    /// How often waiting parts of the engine look again at recovery's state.
    pub(crate) fn poll_ns(&self) -> u64 {
        (self.params.lease_ns / 64).max(1_000)
    }

    /// Counts a worker whose background task finished.
    pub(crate) fn flushed(&self) {
        self.flushed.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether attempt `owner` of configuration `epoch` committed, once a recovery of a
    /// later epoch decided here.
    pub(crate) fn verdict(&self, owner: u64, epoch: u64) -> Option<bool> {
        let v = self.verdicts.lock().expect("no recorder panicked");
        (v.0 > epoch).then(|| v.1.contains(&owner))
    }

    /// Whether some recovery decided here that attempt `owner` committed.
    pub fn committed(&self, owner: u64) -> bool {
        self.verdicts.lock().expect("no recorder panicked").1.contains(&owner)
    }

    /// Whether this node stopped itself, or the run is over, or it cannot go on.
    pub(crate) fn ended(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
            || self.finished.load(Ordering::Acquire)
            || self.fatal.get().is_some()
    }

    /// Whether this node stopped itself: removed from the configuration, or cut off for
    /// longer than any reconfiguration takes. Its coroutines stopped where they were.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// What recovery could not survive, if anything.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.get().cloned()
    }

    pub(crate) fn fail(&self, why: String) {
        // The first reason stands.
        let _ = self.fatal.set(why);
    }

    /// The steps recovery took here, in the order they happened.
    pub fn events(&self) -> Vec<RecoveryEvent> {
        self.events.lock().expect("no recorder panicked").clone()
    }

    pub(crate) fn event(&self, step: RecoveryStep, at_ns: u64) {
        let mut events = self.events.lock().expect("no recorder panicked");
        // One per step of each reconfiguration: a run has at most a handful.
        if events.len() < EVENTS_MAX {
            events.push(RecoveryEvent { at_ns, step });
        }
    }

    /// Counts a transaction coroutine of this node starting, or ending.
    pub(crate) fn client_started(&self) {
        self.clients.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn client_ended(&self) {
        self.clients.fetch_sub(1, Ordering::AcqRel);
    }

    /// How far this node is with the end of the run.
    fn end_state_here(&self) -> EndState {
        match (self.finished.load(Ordering::Acquire), self.done_here()) {
            (true, _) => EndState::Finished,
            (false, true) => EndState::Done,
            (false, false) => EndState::Running,
        }
    }

    /// Manager: how far member `n` said it was.
    fn end_state_of(&self, n: NodeId) -> EndState {
        EndState::decode(self.end_states[usize::from(n.0)].load(Ordering::Acquire))
            .expect("only valid end states are stored")
    }

    /// How long a background task of this node sleeps between two turns: a
    /// [`RENEWALS_PER_LEASE`]th of the lease while clients run; once they are done, the
    /// poll interval, so that the end of the run is agreed and noticed within a few polls
    /// rather than a few leases (2 s each on threads and processes).
    fn turn_ns(&self) -> u64 {
        match self.done_here() {
            true => self.poll_ns(),
            false => self.params.lease_ns / RENEWALS_PER_LEASE,
        }
    }

    /// Whether this node's part of the run is done: its transaction coroutines ended and
    /// every worker flushed its logs.
    fn done_here(&self) -> bool {
        self.clients.load(Ordering::Acquire) == 0
            && self.flushed.load(Ordering::Acquire) == self.quiesced.len() as u64
    }

    /// How long a worker's step may resume coroutines: a renewal's interval, so a
    /// renewal is sent at most about one interval plus one coroutine's turn after it falls
    /// due, and a re-replication copy gets a turn as often (TPC-C's Stock-Level takes
    /// 0.1-0.17 ms per turn under the paper's CPU costs, and twenty such turns in one step
    /// outlast a 2 ms lease).
    pub fn step_budget_ns(&self) -> u64 {
        self.params.lease_ns / RENEWALS_PER_LEASE
    }

    /// The lease length.
    pub fn lease_ns(&self) -> u64 {
        self.params.lease_ns
    }

    /// How recovery is tuned.
    pub fn params(&self) -> RecoveryParams {
        self.params
    }

    pub(crate) fn sync(&self) -> &SyncState {
        &self.sync
    }
}

/// Registers the recovery handlers on a worker.
pub(crate) fn register<E: Endpoint + 'static>(w: &mut Worker<E>, node: &Arc<NodeEngine>) {
    let n = node.clone();
    w.handle(LEASE, Box::new(move |ctx, req| member_only(&n, ctx, req, lease)));
    let n = node.clone();
    w.handle(GRANT, Box::new(move |ctx, req| member_only(&n, ctx, req, grant)));
    let n = node.clone();
    w.handle(
        CONFIG,
        Box::new(move |ctx, req| {
            // A restarted node installs the configuration that takes it in.
            let takes_me_in = n.recovery.is_joining()
                && Config::decode(req).is_ok_and(|c| {
                    c.is_member(n.node) && !n.membership.current().is_member(n.node)
                });
            match takes_me_in {
                true => config(&n, ctx, req),
                false => member_only(&n, ctx, req, config),
            }
        }),
    );
    let n = node.clone();
    let mut buf = Vec::new();
    w.handle(
        REPORT,
        Box::new(move |ctx, req| {
            member_only(&n, ctx, req, |node, ctx, req| report(node, ctx, req, &mut buf))
        }),
    );
    let n = node.clone();
    w.handle(DECIDE, Box::new(move |ctx, req| member_only(&n, ctx, req, decide)));
    let n = node.clone();
    w.handle(ACTIVATE, Box::new(move |ctx, req| member_only(&n, ctx, req, activate)));
    let n = node.clone();
    w.handle(APPLY, Box::new(move |ctx, req| member_only(&n, ctx, req, apply)));
    let n = node.clone();
    w.handle(FINISH, Box::new(move |ctx, _| finish(&n, ctx)));
    let n = node.clone();
    w.handle(HEARD, Box::new(move |ctx, req| member_only(&n, ctx, req, heard)));
    let n = node.clone();
    w.handle(JOIN, Box::new(move |ctx, _| join(&n, ctx)));
}

/// Serves a recovery request with `serve`, unless this node restarted and has not joined
/// yet: the others may still take it for the member its earlier life was, and nothing it
/// says may count as that member's word (an empty report would void commits its earlier
/// life logged). It answers nothing, as a dead node would.
fn member_only<E: Endpoint>(
    node: &NodeEngine,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    mut serve: impl FnMut(&NodeEngine, &mut HandlerCtx<'_, E>, &[u8]),
) {
    if node.recovery.is_joining() {
        return ctx.ignore();
    }
    serve(node, ctx, req);
}

/// The manager hears a restarted node ask to join (a member, or a node that is joining
/// itself, takes no one in).
fn join<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>) {
    let rec = &node.recovery;
    let cfg = node.membership.current();
    let n = ctx.src.node;
    if rec.is_joining() || cfg.manager() != node.node || cfg.is_member(n) {
        return;
    }
    if let Some(asked) = rec.join_asked.get(usize::from(n.0)) {
        asked.fetch_max(ctx.ep.now_ns().max(1), Ordering::AcqRel);
    }
}

/// How long this node has heard no grant from its manager, and in which epoch; notes the
/// asker's epoch (`asked_from`).
fn heard<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let rec = &node.recovery;
    if let Some(epoch) = In(req).u64() {
        rec.asked_from.fetch_max(epoch, Ordering::AcqRel);
    }
    let silence = ctx.ep.now_ns().saturating_sub(rec.grant_heard.load(Ordering::Acquire));
    Out(ctx.reply).u64(node.membership.epoch()).u64(silence);
}

/// Worker 0 of `node`, where the membership messages go.
fn first(node: NodeId) -> WorkerId {
    WorkerId { node, index: 0 }
}

fn lease<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let mut i = In(req);
    let (Some(epoch), Some(state), Some(sent), Some(echo)) = (i.u64(), i.u8(), i.u64(), i.u64())
    else {
        return;
    };
    let Some(state) = EndState::decode(state) else { return };
    let rec = &node.recovery;
    let from = usize::from(ctx.src.node.0);
    if epoch == node.membership.epoch() && from < rec.renewed.len() && sent != 0 {
        let now = ctx.ep.now_ns();
        // The echo is this node's own clock: never ahead of it.
        debug_assert!(echo <= now, "an echoed grant from the future");
        rec.renewed[from].fetch_max(now, Ordering::AcqRel);
        // A renewal that says a grant newer than any before arrived closes a round trip:
        // a member whose grants are lost one way (its lease lapses, and it takes no one
        // over, see `others_agree`) renews on, and is removed once none closed for
        // `ROUND_TRIP_LEASES`. Not for a member granted nothing more (to be removed once
        // its last lease ran out, see `changes`): the grants sent before that may still
        // arrive, and must not take it off the way to its removal.
        let revoked = rec.revoked[from].load(Ordering::Acquire) == epoch;
        if rec.acked[from].fetch_max(echo, Ordering::AcqRel) < echo && !revoked {
            rec.round_trip[from].fetch_max(now, Ordering::AcqRel);
        }
        // What follows, if anything: the partitions the member copied whole (F5).
        if let Some(count) = i.u16() {
            let parts: Vec<u16> = (0..count).map_while(|_| i.u16()).collect();
            rec.sync.report(ctx.src.node, epoch, parts.into_iter());
        }
        // Then the members it suspects (see `suspect`), if any.
        if let Some(count) = i.u16() {
            let nodes: Vec<NodeId> = (0..count).map_while(|_| i.u16()).map(NodeId).collect();
            rec.suspicions.report(epoch, ctx.src.node, nodes.into_iter());
        }
        // Never back from Finished: a renewal sent before the member heard FINISH may
        // arrive after its acknowledgement.
        if rec.end_state_of(ctx.src.node) != EndState::Finished {
            rec.end_states[from].store(state as u8, Ordering::Release);
        }
        rec.to_grant[from].fetch_max(sent, Ordering::AcqRel);
    }
}

fn grant<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let mut i = In(req);
    let (Some(epoch), Some(sent), Some(at)) = (i.u64(), i.u64(), i.u64()) else { return };
    let rec = &node.recovery;
    // Only the manager of the configuration in force grants, and never into the future.
    let now = ctx.ep.now_ns();
    let cfg = node.membership.current();
    if epoch == cfg.epoch && ctx.src.node == cfg.manager() && sent <= now {
        rec.lease_until.fetch_max(sent + rec.params.lease_ns, Ordering::AcqRel);
        // Only a grant newer than any before shows the manager alive now: a duplicate
        // of an old one, arriving late, says nothing.
        if rec.grant_echo.fetch_max(at, Ordering::AcqRel) < at {
            rec.grant_heard.fetch_max(now, Ordering::AcqRel);
        }
    }
}

fn config<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let Ok(next) = Config::decode(req) else { return };
    if next.nodes() != node.membership.current().nodes() {
        return;
    }
    let epoch = next.epoch;
    install(node, ctx.ep, next, Origin::Learned);
    let current = node.membership.epoch();
    let quiesced = current == epoch
        && node.recovery.quiesced.iter().all(|q| q.load(Ordering::Acquire) >= epoch);
    Out(ctx.reply).u64(current).u8(u8::from(quiesced));
}

/// How this node came to hold a configuration it installs.
#[derive(Copy, Clone, Debug)]
enum Origin {
    /// It committed it to the store; no node could hold it before `before_ns` (this
    /// node's clock just before the compare-and-swap).
    Committed { before_ns: u64 },
    /// From the store or another node: others may have held it for a while already.
    Learned,
}

/// Installs a newer configuration: recovering from now on, removed nodes fenced off. A
/// later revision of the epoch in force (new backups marked ready) moves no route: it
/// is taken as it is, and nothing of the epoch stops.
fn install<E: Endpoint>(node: &NodeEngine, ep: &mut E, next: Config, origin: Origin) {
    let old = node.membership.current();
    if next.revision <= old.revision || next.epoch < old.epoch {
        return;
    }
    if next.epoch == old.epoch {
        debug_assert!(same_routes(&old, &next), "a revision of an epoch moves no route");
        node.membership.install(Arc::new(next));
        return;
    }
    let epoch = next.epoch;
    let rec = &node.recovery;
    let me = node.node;
    if rec.is_joining() && next.is_member(me) {
        if old.is_member(me) {
            // Of this node's earlier life (its removal is yet to come): not this one's.
            return;
        }
        // Taken in: connections to every member (nothing of theirs is in flight here),
        // and the lease a new configuration's members start with.
        for n in next.members().filter(|&n| n != me) {
            ep.admit(n);
        }
        rec.joined_in[usize::from(me.0)].store(epoch, Ordering::Release);
        // No lease yet: the first comes with the manager's first grant.
        rec.joining.store(false, Ordering::Release);
    } else if !rec.is_joining() {
        for n in next.members().filter(|&n| !old.is_member(n) && n != me) {
            // A node taken in again after a restart: new connections to it, and its
            // workers' rings here start their transaction numbers over (recovery
            // resolved everything its earlier life logged; their heads stay where it
            // left them, and its coordinators resume there, L8).
            ep.admit(n);
            rec.joined_in[usize::from(n.0)].store(epoch, Ordering::Release);
            // The earlier life's word on the end of the run is not the new one's.
            rec.end_states[usize::from(n.0)].store(EndState::Running as u8, Ordering::Release);
            let per = usize::from(rec.workers());
            for c in usize::from(n.0) * per..(usize::from(n.0) + 1) * per {
                node.log_region.store(node.log.tseq_offset(c), 0);
            }
        }
    }
    // A node the configuration removes stops on its own (and fencing itself would cut
    // off its own loopback requests): it fences off only the others removed.
    for n in old.members().filter(|&n| !next.is_member(n) && n != node.node) {
        ep.fence(n);
    }
    // A new configuration starts every silence afresh: its manager (perhaps new) has had
    // no time to grant, nor its members to renew with it. Measured from here, neither
    // side takes the other for dead while the reconfiguration runs. This only delays a
    // removal, never hastens one; what a member may post still ends with its lease.
    let now = ep.now_ns();
    restart_silences(rec, &next, now);
    // Grants of the new configuration come from its manager's clock (perhaps another).
    rec.grant_echo.store(0, Ordering::Release);
    // A member takes over only a takeover's silence after it installed the configuration,
    // which it did no earlier than its commit: a manager that committed it may count its
    // own lease from just before, as if every member had acknowledged a grant then. One
    // that learned it (read it from the store, lost the race to commit) cannot know how
    // long the members have held it, and holds a lease only once they acknowledge its
    // grants. (Only here: a silence restarted after a pause of this node says nothing of
    // the members'.)
    if let Origin::Committed { before_ns } = origin {
        for n in next.members() {
            rec.acked[usize::from(n.0)].fetch_max(before_ns, Ordering::AcqRel);
        }
        if next.manager() == node.node {
            rec.lease_until.fetch_max(before_ns + rec.params.lease_ns, Ordering::AcqRel);
        }
    }
    rec.recovering.store(epoch, Ordering::Release);
    node.membership.install(Arc::new(next));
    rec.event(RecoveryStep::Installed { epoch }, now);
}

/// Whether two configurations route alike: the same members, and every partition with
/// the same primary, generation and backups (states aside).
fn same_routes(a: &Config, b: &Config) -> bool {
    let nodes = (0..a.nodes()).map(NodeId);
    a.nodes() == b.nodes()
        && nodes.clone().all(|n| a.is_member(n) == b.is_member(n))
        && a.placement.parts().iter().zip(b.placement.parts()).all(|(x, y)| {
            x.primary == y.primary
                && x.generation == y.generation
                && x.backups.iter().map(|b| b.0).eq(y.backups.iter().map(|b| b.0))
        })
}

/// A report page: epoch, next cursor (ring, entry; `u32::MAX` ring when done), then per
/// ring reported: ring, applied sequence number, entry count, and per entry its owner,
/// the epoch it logged in, sequence number, part, parts, written partitions.
fn report<E: Endpoint>(
    node: &NodeEngine,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    buf: &mut Vec<u64>,
) {
    let mut i = In(req);
    let (Some(epoch), Some(ring0), Some(skip0)) = (i.u64(), i.u32(), i.u32()) else { return };
    if epoch != node.membership.epoch() || node.recovery.recovering.load(Ordering::Acquire) != epoch
    {
        Out(ctx.reply).u64(node.membership.epoch()).u32(u32::MAX).u32(0).u16(0);
        return;
    }
    let layout = &node.log;
    let mut body = Vec::new();
    let mut rings = 0u16;
    let mut next = (u32::MAX, 0u32);
    'rings: for c in ring0 as usize..layout.rings as usize {
        let found = scan(&node.log_region, layout, c, buf);
        let skip = if c == ring0 as usize { skip0 as usize } else { 0 };
        let applied = crate::log::applied_tseq(&node.log_region, layout, c);
        let mut entries = Vec::new();
        for (k, d) in found.iter().enumerate().skip(skip) {
            if body.len() + entries.len() + ENTRY_FIXED + 14 + 2 * d.written.len() > PAGE_BYTES {
                // The page is full: what was gathered of this ring goes, the rest later.
                if !entries.is_empty() || k > skip {
                    push_ring(&mut body, c, applied, &entries);
                    rings += 1;
                }
                next = (c as u32, k as u32);
                break 'rings;
            }
            encode_in_doubt(d, &mut entries);
        }
        if found.len() > skip {
            push_ring(&mut body, c, applied, &entries);
            rings += 1;
        } else if found.is_empty() && applied > 0 {
            // No entry in doubt, but how far the ring was applied matters.
            push_ring(&mut body, c, applied, &[]);
            rings += 1;
        }
        if body.len() > PAGE_BYTES {
            next = (c as u32 + 1, 0);
            break;
        }
    }
    Out(ctx.reply).u64(epoch).u32(next.0).u32(next.1).u16(rings);
    ctx.reply.extend_from_slice(&body);
}

fn push_ring(body: &mut Vec<u8>, c: usize, applied: u64, entries: &[u8]) {
    let count = entries_count(entries);
    Out(body).u32(c as u32).u64(applied).u16(count);
    body.extend_from_slice(entries);
}

/// Bytes of an entry in doubt as a report carries it, before its written partitions:
/// owner, epoch, sequence number, part, parts, marker, count of written partitions.
const ENTRY_FIXED: usize = 8 + 8 + 8 + 2 + 2 + 1 + 1;

/// Entries encoded by [`encode_in_doubt`] in `b` (each has a 0xE1 marker byte).
fn entries_count(b: &[u8]) -> u16 {
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        let w = usize::from(b[i + ENTRY_FIXED - 1]);
        i += ENTRY_FIXED + 2 * w;
        n += 1;
    }
    n
}

fn encode_in_doubt(d: &InDoubt, out: &mut Vec<u8>) {
    Out(out)
        .u64(d.owner)
        .u64(d.epoch)
        .u64(d.tseq)
        .u16(d.part)
        .u16(d.parts)
        .u8(0xE1)
        .u8(d.written.len() as u8);
    for &p in &d.written {
        Out(out).u16(p);
    }
}

fn decide<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let mut i = In(req);
    let (Some(epoch), Some(page), Some(count)) =
        (i.u64(), i.u8().and_then(DecidePage::of), i.u32())
    else {
        return;
    };
    let rec = &node.recovery;
    let mut d = rec.decisions.lock().expect("no recorder panicked");
    if epoch == node.membership.epoch() && rec.recovering.load(Ordering::Acquire) == epoch {
        if d.epoch != epoch {
            *d = Decisions { epoch, ..Decisions::default() };
        }
        match page {
            DecidePage::More | DecidePage::Last if d.stage == Stage::Gathering => {
                for _ in 0..count {
                    let Some(owner) = i.u64() else { break };
                    d.committed.insert(owner);
                }
                if page == DecidePage::Last {
                    d.stage = Stage::Complete;
                    // Replaced, not merged: each recovery's list repeats what the one
                    // before it committed, and an older list may hold a decision a
                    // newer one made otherwise (it never went ahead).
                    let mut v = rec.decided.lock().expect("no recorder panicked");
                    if epoch > v.0 {
                        *v = (epoch, d.committed.clone());
                    }
                }
            }
            DecidePage::Go if d.stage == Stage::Complete => {
                // Every member holds these decisions: from here on they are the
                // outcome, whoever manages the next recovery (F4).
                d.stage = Stage::Applying;
                let mut v = rec.verdicts.lock().expect("no recorder panicked");
                v.0 = v.0.max(epoch);
                v.1.extend(d.committed.iter().copied());
            }
            // A page sent again, or a go before the last page (never sent so): nothing new.
            _ => {}
        }
    }
    let stage = if d.epoch == epoch { d.stage } else { Stage::Gathering };
    Out(ctx.reply).u64(node.membership.epoch()).u8(stage.code());
}

fn activate<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let Some(epoch) = In(req).u64() else { return };
    let rec = &node.recovery;
    if epoch == node.membership.epoch() {
        let applied = {
            let d = rec.decisions.lock().expect("no recorder panicked");
            d.epoch == epoch && d.stage == Stage::Applied
        };
        if applied && rec.recovering.load(Ordering::Acquire) == epoch {
            // A new start for the silence that makes a member take over, as at install:
            // only ever a delay.
            let now = ctx.ep.now_ns();
            rec.grant_heard.fetch_max(now, Ordering::AcqRel);
            rec.recovering.store(0, Ordering::Release);
            rec.activated.fetch_max(epoch, Ordering::AcqRel);
            rec.event(RecoveryStep::Active { epoch }, now);
        }
    }
    Out(ctx.reply)
        .u64(node.membership.epoch())
        .u8(u8::from(rec.recovering.load(Ordering::Acquire) == 0));
}

/// Packs the records to forward, by (primary, owner), into APPLY requests of at most a
/// page each (a record is at most a sixth of one), each primary's in their own.
fn pack_apply(
    epoch: u64,
    forward: BTreeMap<(NodeId, u64), Vec<Vec<u8>>>,
) -> Vec<(WorkerId, Vec<u8>)> {
    /// Adds one to the u16 at `at` (a request's group count, or a group's record count).
    fn bump(req: &mut [u8], at: usize) {
        let n = u16::from_le_bytes([req[at], req[at + 1]]) + 1;
        req[at..at + 2].copy_from_slice(&n.to_le_bytes());
    }
    const GROUPS_AT: usize = 8; // after the epoch
    let mut reqs: Vec<(WorkerId, Vec<u8>)> = Vec::new();
    // The last request's primary, the owner of its last group, and where that group's
    // record count is.
    let mut open: Option<(NodeId, u64, usize)> = None;
    for ((primary, owner), records) in forward {
        for r in records {
            debug_assert!(r.len() + 20 <= PAGE_BYTES);
            let fits = matches!(open, Some((p, ..)) if p == primary)
                && reqs.last().is_some_and(|(_, q)| q.len() + 10 + r.len() <= PAGE_BYTES);
            if !fits {
                let mut req = Vec::with_capacity(PAGE_BYTES);
                Out(&mut req).u64(epoch).u16(0);
                reqs.push((first(primary), req));
                open = None;
            }
            let req = &mut reqs.last_mut().expect("a request is open").1;
            let count_at = match open {
                Some((_, o, at)) if o == owner => at,
                _ => {
                    bump(req, GROUPS_AT);
                    Out(req).u64(owner);
                    let at = req.len();
                    Out(req).u16(0);
                    at
                }
            };
            bump(req, count_at);
            req.extend_from_slice(&r);
            open = Some((primary, owner, count_at));
        }
    }
    reqs
}

/// APPLY: epoch, group count, then per group an owner and its record count, then per
/// record table, key, version, payload length and payload. The primary writes each
/// record if newer and releases the owner's lock on it.
fn apply<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let mut i = In(req);
    let (Some(epoch), Some(groups)) = (i.u64(), i.u16()) else { return };
    if epoch != node.membership.epoch() {
        Out(ctx.reply).u64(node.membership.epoch());
        return;
    }
    let mut payload = Vec::new();
    for _ in 0..groups {
        let (Some(owner), Some(count)) = (i.u64(), i.u16()) else { break };
        apply_group(node, ctx, &mut i, owner, count, &mut payload);
    }
    Out(ctx.reply).u64(epoch);
}

/// The `count` records of one owner in an APPLY request.
fn apply_group<E: Endpoint>(
    node: &NodeEngine,
    ctx: &mut HandlerCtx<'_, E>,
    i: &mut In<'_>,
    owner: u64,
    count: u16,
    payload: &mut Vec<u64>,
) {
    let catalog = &node.catalog;
    for _ in 0..count {
        let (Some(table), Some(key), Some(version), Some(len)) =
            (i.u16(), i.u64(), i.u64(), i.u16())
        else {
            break;
        };
        payload.clear();
        for _ in 0..len {
            let Some(w) = i.u64() else { break };
            payload.push(w);
        }
        if usize::from(table) >= catalog.tables().count() || key > hytra_store::layout::KEY_MAX {
            continue;
        }
        let t = TableId(table);
        let p = catalog.partition(t, key);
        let replica = node.store.replica(t, p);
        ctx.ep.charge(crate::cpu::RECOVER, 1);
        let owner = hytra_store::Owner(owner);
        if let Ok(off) = replica.apply_recovered(key, version, payload, owner) {
            replica.unlock_if(off, owner);
            node.file_recovered(t, p, key, off);
        }
    }
}

fn finish<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>) {
    // Only from the manager in force: a deposed one's word is void.
    if ctx.src.node == node.membership.current().manager() {
        node.recovery.finished.store(true, Ordering::Release);
    }
}

/// The next configuration after removing `removed` from `old`: every partition keeps its
/// surviving replicas, a dead primary is replaced by its first ready surviving backup,
/// and a partition left with fewer than `copies` replicas gets new backups, syncing
/// ([`add_backups`]; 0: none). Fails if a partition lost every replica, or every ready
/// one.
pub fn next_config(old: &Config, removed: &[NodeId], copies: u16) -> Result<Config, String> {
    let nodes = old.nodes();
    let members: Vec<bool> =
        (0..nodes).map(|n| old.is_member(NodeId(n)) && !removed.contains(&NodeId(n))).collect();
    if !members.iter().any(|&m| m) {
        return Err("every node failed".into());
    }
    let alive = |n: NodeId| members[usize::from(n.0)];
    let mut parts: Vec<PartitionPlace> = Vec::with_capacity(usize::from(nodes));
    for (p, place) in old.placement.parts().iter().enumerate() {
        let mut backups: Vec<(NodeId, BackupState)> =
            place.backups.iter().copied().filter(|&(n, _)| alive(n)).collect();
        let (primary, generation) = if alive(place.primary) {
            (place.primary, place.generation)
        } else {
            let Some(k) = backups.iter().position(|&(_, s)| s == BackupState::Ready) else {
                let copying: Vec<String> = backups.iter().map(|(n, _)| n.to_string()).collect();
                let why = match copying.len() {
                    0 => String::new(),
                    1 => format!(
                        " (its new backup on {} was still copying it: a failure came before re-replication was done)",
                        copying[0]
                    ),
                    _ => format!(
                        " (its new backups on {} were still copying it: a failure came before re-replication was done)",
                        copying.join(", ")
                    ),
                };
                return Err(format!(
                    "partition {p} lost its primary and every up-to-date backup: its data is gone{why}"
                ));
            };
            (backups.remove(k).0, place.generation.wrapping_add(1))
        };
        parts.push(PartitionPlace { primary, backups, generation });
    }
    add_backups(&mut parts, &members, copies, old.epoch + 1);
    let next = Config::new(old.epoch + 1, members, Placement::from_parts(parts))?;
    Ok(next.with_revision(old.revision + 1))
}

/// The configuration that takes in those of `joined` that are not members of `old`
/// (none left: `None`), noted as a step of recovery at `now`.
fn joining_config(
    rec: &NodeRecovery,
    old: &Config,
    joined: &[NodeId],
    copies: u16,
    now: u64,
) -> Option<Result<Config, String>> {
    let joined: Vec<NodeId> = joined.iter().copied().filter(|&n| !old.is_member(n)).collect();
    if joined.is_empty() {
        return None;
    }
    rec.event(RecoveryStep::Joining { joined: joined.clone(), from_epoch: old.epoch }, now);
    Some(join_config(old, &joined, copies))
}

/// The next configuration after taking the restarted nodes `joined` into `old` as
/// members: every partition stays where it is, and one with fewer than `copies`
/// replicas gets new backups, syncing ([`add_backups`]), on the new members first (they
/// hold nothing).
pub fn join_config(old: &Config, joined: &[NodeId], copies: u16) -> Result<Config, String> {
    let nodes = old.nodes();
    if let Some(n) = joined.iter().find(|n| n.0 >= nodes || old.is_member(**n)) {
        return Err(format!("{n} cannot join configuration {}: not a node outside it", old.epoch));
    }
    let members: Vec<bool> =
        (0..nodes).map(|n| old.is_member(NodeId(n)) || joined.contains(&NodeId(n))).collect();
    let mut parts = old.placement.parts().to_vec();
    add_backups(&mut parts, &members, copies, old.epoch + 1);
    let next = Config::new(old.epoch + 1, members, Placement::from_parts(parts))?;
    Ok(next.with_revision(old.revision + 1))
}

/// What the manager gathered of one transaction in doubt.
struct Doubt {
    /// The epoch it logged in.
    epoch: u64,
    tseq: u64,
    written: Vec<u16>,
    /// Per backup: parts of its log seen, of how many.
    held: BTreeMap<NodeId, (u16, u16)>,
}

/// The manager's view of the reports: every transaction in doubt, and how far each
/// (backup, ring) was applied.
#[derive(Default)]
struct Reports {
    doubts: BTreeMap<u64, Doubt>,
    applied: BTreeMap<(NodeId, usize), u64>,
}

impl Reports {
    fn read_page(&mut self, from: NodeId, page: &[u8]) -> Option<(u32, u32)> {
        let mut i = In(page);
        let (_epoch, ring, skip, rings) = (i.u64()?, i.u32()?, i.u32()?, i.u16()?);
        for _ in 0..rings {
            let (c, applied, count) = (i.u32()? as usize, i.u64()?, i.u16()?);
            self.applied.insert((from, c), applied);
            for _ in 0..count {
                let (owner, epoch, tseq) = (i.u64()?, i.u64()?, i.u64()?);
                let (part, parts) = (i.u16()?, i.u16()?);
                let (_marker, w) = (i.u8()?, i.u8()?);
                let mut written = Vec::with_capacity(usize::from(w));
                for _ in 0..w {
                    written.push(i.u16()?);
                }
                let _ = part;
                let d = self.doubts.entry(owner).or_insert(Doubt {
                    epoch,
                    tseq,
                    written,
                    held: BTreeMap::new(),
                });
                let seen = d.held.entry(from).or_insert((0, parts));
                seen.0 += 1;
            }
        }
        Some((ring, skip))
    }

    /// The transactions that commit. One logged before the epoch of `prior` (this node's
    /// newest decisions held in full, and the transactions they commit) was decided
    /// then, perhaps applied since: it commits iff that recovery committed it.
    /// Any other commits iff every surviving backup (under `old`) of every partition it
    /// wrote holds its whole log, or applied it. Fails for a transaction that wrote a
    /// partition none of whose backups survived.
    fn decide(
        &self,
        old: &Config,
        new: &Config,
        prior: &(u64, BTreeSet<u64>),
    ) -> Result<BTreeSet<u64>, String> {
        let mut committed = BTreeSet::new();
        'txns: for (&owner, d) in &self.doubts {
            if d.epoch < prior.0 {
                if prior.1.contains(&owner) {
                    committed.insert(owner);
                }
                continue;
            }
            let coordinator = hytra_store::Owner(owner).worker();
            for &p in &d.written {
                if p >= old.placement.partitions() {
                    continue 'txns;
                }
                // The surviving backups that took the log of the epoch it logged in (one
                // added later, by a reconfiguration whose rounds never ran, has none).
                let survivors: Vec<NodeId> = old
                    .placement
                    .part(p)
                    .backups
                    .iter()
                    .filter(|&&(b, s)| new.is_member(b) && s.logs_from(d.epoch))
                    .map(|&(b, _)| b)
                    .collect();
                if survivors.is_empty() {
                    return Err(format!(
                        "transaction {owner:#x} wrote partition {p}, which lost every backup at once: its outcome cannot be recovered"
                    ));
                }
                for b in survivors {
                    let whole = d.held.get(&b).is_some_and(|&(seen, parts)| seen >= parts.max(1));
                    let applied = self.applied.get(&(b, coordinator)).is_some_and(|&t| t >= d.tseq);
                    if !whole && !applied {
                        continue 'txns;
                    }
                }
            }
            committed.insert(owner);
        }
        Ok(committed)
    }
}

/// RPC timeouts a member gets to answer a round of recovery (at least; a lease if longer).
const ANSWER_TIMEOUTS: u64 = 4;

/// How a round of recovery waits for its members' answers.
#[derive(Copy, Clone, Debug)]
struct Patience {
    /// How long a member may take to answer before it counts as silent.
    silent_ns: u64,
    /// How long to wait before asking again a member that answered "not yet" (or whose
    /// request or reply was lost).
    retry_ns: u64,
}

/// A round's patience. Silent: a lease, or enough RPC timeouts to resend a request lost
/// on the way several times if that is longer (with a lease of a few timeouts, one lost
/// datagram would otherwise pass for a dead node). Asked again: after a twentieth of an
/// RPC timeout, or as often as recovery polls its own state if that is sooner (on
/// threads, whose RPC timeout is a second, every round answered "not yet" once cost
/// 50 ms).
fn patience<E: Endpoint>(co: &Co<E>, rec: &NodeRecovery) -> Patience {
    let rpc_timeout_ns = co.config().rpc_timeout_ns;
    Patience {
        silent_ns: rec.params.lease_ns.max(ANSWER_TIMEOUTS * rpc_timeout_ns),
        retry_ns: (rpc_timeout_ns / 20).min(rec.poll_ns()),
    }
}

/// The manager's watch over the members of a configuration while its rounds wait: a
/// member that already answered may die before the others are done (and one still
/// applying may wait on it for ever), so a member whose lease renewals stopped ends the
/// round as silent, as it would end the manager's watch between rounds.
///
/// Only a member that holds the new configuration renews its lease with this manager
/// (one still in an older configuration renews with that one's manager, perhaps dead,
/// and renewals of an older epoch count for nothing here), and it may answer the first
/// round, which installs the configuration, only after a few lost requests: a member is
/// judged from its first answer on, by the later of its last renewal and its last
/// answer. Until then only the round's own silence judges it (two lost requests once
/// removed a live node here).
struct Watch<'a> {
    rec: &'a NodeRecovery,
    members: &'a [NodeId],
    me: NodeId,
    /// Per member that answered any request of these rounds, when it last did.
    answers: RefCell<BTreeMap<NodeId, u64>>,
}

impl Watch<'_> {
    /// Notes an answer of `n` at `now`.
    fn answered(&self, n: NodeId, now: u64) {
        let mut answers = self.answers.borrow_mut();
        let at = answers.entry(n).or_insert(now);
        *at = (*at).max(now);
    }

    /// Whether no member other than the manager answered anything yet.
    fn heard_none(&self) -> bool {
        self.answers.borrow().keys().all(|&n| n == self.me)
    }

    /// A member (other than the manager) that answered and then was not heard from for
    /// a lease and a sixteenth, neither renewing nor answering.
    fn lapsed(&self, now: u64) -> Option<NodeId> {
        let answers = self.answers.borrow();
        self.members.iter().copied().filter(|&n| n != self.me).find(|&n| {
            answers.get(&n).is_some_and(|&at| {
                let renewed = self.rec.renewed[usize::from(n.0)].load(Ordering::Acquire);
                lease_over(self.rec, renewed.max(at), now)
            })
        })
    }
}

/// Whether the manager has not heard `n` renew its lease for a lease and a sixteenth by
/// `now`: the one test of a member's death.
fn renewals_lapsed(rec: &NodeRecovery, n: NodeId, now: u64) -> bool {
    lease_over(rec, rec.renewed[usize::from(n.0)].load(Ordering::Acquire), now)
}

/// Whether a lease that started (by the manager's clock) at `since` is over at `now` by
/// any member's clock: a lease and a sixteenth, the slack for clocks that drift (F1a).
fn lease_over(rec: &NodeRecovery, since: u64, now: u64) -> bool {
    let lease = rec.params.lease_ns;
    now > since + lease + lease / 16
}

/// Leases a member may renew without saying a new grant arrived before the manager
/// removes it: a grant answers each renewal within a turn, so twice the lease is far
/// past a loaded worker's delays, yet within the time a member cut off one way stays
/// without a lease (its partitions unserved meanwhile).
const ROUND_TRIP_LEASES: u64 = 2;

/// Records recovery files in the NIC index per turn of its task (see
/// `NodeEngine::refile_primaries`): at most a few milliseconds of page faults.
const REFILE_PER_TURN: u64 = 512;

/// Attempts [`call_all`] makes, at least, before it takes a member for silent.
const ATTEMPTS_PER_SILENCE: u64 = 8;

/// Calls in flight at once in [`call_all`]: well under the worker's call slots.
const CALLS_AT_ONCE: usize = 32;

/// How many times `silent_ns` a member that keeps answering may take to become ready
/// in a round (quiesce, apply its decisions) before recovery gives up on the cluster.
const READY_PATIENCE: u64 = 64;

/// Why a round of [`call_all`] ended without every answer it waits for.
enum Unanswered {
    /// No reply at all from this destination for `silent_ns`: taken for dead.
    Silent(WorkerId),
    /// This destination kept answering "not yet" for `READY_PATIENCE` times `silent_ns`.
    NeverReady(WorkerId),
}

/// Sends every request of `reqs` and waits for all the replies, up to [`CALLS_AT_ONCE`]
/// in flight at a time, so that a round costs one round trip rather than one per member;
/// requests not yet answered as `accept` wants are sent again, all together, until they
/// are. A destination is silent once nothing came back from it for `silent_ns`: a reply
/// that is not accepted ("not ready yet") still shows it alive, and a slow member must
/// not hold up noticing a dead one. Returns the accepted values in the order of `reqs`.
async fn call_all<E: Endpoint, T>(
    co: &Co<E>,
    ty: RpcType,
    reqs: &[(WorkerId, Vec<u8>)],
    patience: Patience,
    watch: Option<&Watch<'_>>,
    mut accept: impl FnMut(&[u8]) -> Option<T>,
) -> Result<Vec<T>, Unanswered> {
    let Patience { silent_ns, retry_ns } = patience;
    // Each attempt waits for its reply an RPC timeout at most, and at most an eighth of
    // the silence that removes a member: a member is asked at least eight times before it
    // is taken for dead (three requests lost in a row, at 5% loss, once removed a live
    // node when each attempt waited a quarter of it), about four while another
    // destination of the round answers late (below).
    let attempt_ns = co.config().rpc_timeout_ns.min(silent_ns / ATTEMPTS_PER_SILENCE).max(1);
    let start = co.now_ns();
    let mut out: Vec<Option<T>> = reqs.iter().map(|_| None).collect();
    // Per destination, when it last answered anything, or else when it was first asked:
    // several requests may go to one destination, and a pass over many requests takes a
    // while to reach the last ones (which must not count as silent before they are sent).
    let mut heard: BTreeMap<WorkerId, u64> = BTreeMap::new();
    // Per destination, how long an attempt waits: doubled, up to a quarter of the
    // silence per batch of the round, each time one timed out while the destination
    // answered a call of this worker that had timed out. Its worker may take longer per
    // step than an attempt waits (a handful of heavy coroutine turns), and every attempt
    // would then time out, each reply arriving after its own call is over. A pass waits
    // for the longest attempt of each batch, so the others of the round are asked less
    // often meanwhile: the cap keeps that to about four times per silence.
    let mut wait: BTreeMap<WorkerId, u64> = BTreeMap::new();
    let dest = |k: usize| reqs[k].0;
    let mut pending: Vec<usize> = (0..reqs.len()).collect();
    let batches = (reqs.len().div_ceil(CALLS_AT_ONCE) as u64).max(1);
    // Bounded: every pass waits for its replies or sleeps, and the patience below ends it.
    loop {
        for batch in pending.chunks(CALLS_AT_ONCE) {
            let now = co.now_ns();
            for &k in batch {
                heard.entry(dest(k)).or_insert(now);
            }
            let tickets: Vec<_> = batch
                .iter()
                .map(|&k| {
                    let wait_ns = *wait.entry(dest(k)).or_insert(attempt_ns);
                    co.call_control(reqs[k].0, ty, &reqs[k].1, wait_ns).ok()
                })
                .collect();
            for (&k, t) in batch.iter().zip(tickets) {
                let Some(t) = t else { continue };
                // Any reply shows the destination alive, accepted or not, and so does a
                // late one (to an attempt that timed out).
                match co.reply(t, |r| accept(r)).await {
                    Ok(v) => {
                        heard.insert(dest(k), co.now_ns());
                        if let Some(w) = watch {
                            w.answered(dest(k).node, co.now_ns());
                        }
                        out[k] = v;
                    }
                    Err(_) => {
                        let late = co.late_reply_at(dest(k));
                        let last = heard.get_mut(&dest(k)).expect("noted before it was asked");
                        if late > *last {
                            *last = late;
                            if let Some(w) = watch {
                                w.answered(dest(k).node, late);
                            }
                            let d = wait.get_mut(&dest(k)).expect("noted before it was asked");
                            *d = (*d * 2).min((silent_ns / (4 * batches)).max(attempt_ns));
                        }
                    }
                }
            }
        }
        pending.retain(|&k| out[k].is_none());
        if pending.is_empty() {
            break;
        }
        let now = co.now_ns();
        if let Some(&k) = pending.iter().find(|&&k| now > heard[&dest(k)] + silent_ns) {
            return Err(Unanswered::Silent(reqs[k].0));
        }
        if let Some(n) = watch.and_then(|w| w.lapsed(now)) {
            return Err(Unanswered::Silent(first(n)));
        }
        if now > start + READY_PATIENCE * silent_ns {
            return Err(Unanswered::NeverReady(reqs[pending[0]].0));
        }
        // Not ready yet, or lost on the way: ask again a little later.
        co.sleep_until(now + retry_ns).await;
    }
    Ok(out.into_iter().map(|v| v.expect("every request was answered")).collect())
}

/// A member told that the run is over says so, so that the manager need not go on
/// telling (a lost acknowledgement only keeps it telling longer).
fn say_finished<E: Endpoint>(co: &Co<E>, rec: &NodeRecovery, cfg: &Config, me: NodeId) {
    if rec.end_state_here() == EndState::Finished && cfg.manager() != me {
        let mut req = Vec::new();
        Out(&mut req)
            .u64(cfg.epoch)
            .u8(EndState::Finished as u8)
            .u64(co.now_ns().max(1))
            .u64(rec.grant_echo.load(Ordering::Acquire));
        let _ = co.send_oneway(first(cfg.manager()), LEASE, &req);
    }
}

/// The membership task of a node (on its worker 0): renews the lease with the manager,
/// and as the manager watches the members, reconfigures when one fails, and ends the run
/// once every member's clients are done.
pub(crate) async fn membership<E: Endpoint>(co: Co<E>, wt: Rc<WorkerTxn>) {
    let node = wt.node.clone();
    let rec = &node.recovery;
    let me = co.me().node;
    let lease = rec.params.lease_ns;
    // Since when the manager has been telling members the run is over.
    let mut finishing: Option<u64> = None;
    // Since when the manager has known of a copy whole and not yet marked ready.
    let mut readying_since: Option<u64> = None;
    let mut last_turn = co.now_ns();
    if rec.is_joining() {
        if let Err(why) = join_cluster(&co, &node).await {
            return rec.fail(why);
        }
        last_turn = co.now_ns();
    }
    loop {
        if rec.ended() {
            return say_finished(&co, rec, &wt.view.get(), me);
        }
        let cfg = wt.view.get().clone();
        let now = co.now_ns();
        if now > last_turn + lease / 2 {
            // This node did not run for a while (a pause, a descheduled process): what
            // it did not hear in that time says nothing about the others, whose
            // renewals and grants may wait unread. Every silence starts afresh (as on
            // installing a configuration); this only delays a removal. If the others
            // removed this node meanwhile, it learns so from the store or stops once
            // cut off for long (below), and its lapsed lease kept it from posting.
            restart_silences(rec, &cfg, now);
        }
        last_turn = now;
        if rec.asked_from.swap(0, Ordering::AcqRel) > cfg.epoch {
            // A member asked from a newer epoch whether the manager is gone: that epoch
            // was committed, but its manager may have died before telling anyone, and
            // the asker can take over only once the others are in it too.
            match follow_newer(&co, &node).await {
                Ok(Followed::NewEpoch | Followed::NewRevision) => {
                    last_turn = co.now_ns();
                    continue;
                }
                Ok(Followed::Nothing) => {}
                Err(e) => return rec.fail(e.to_string()),
            }
        }
        if !cfg.is_member(me) {
            // Removed: this node stops for good (it is fenced off anyway).
            rec.stopped.store(true, Ordering::Release);
            return;
        }
        if cfg.manager() == me {
            if finishing.is_some()
                || rec.recovering.load(Ordering::Acquire) == 0
                    && cfg.members().all(|n| rec.end_state_of(n) != EndState::Running)
            {
                // Told one-way every turn until each member acknowledged it, for two
                // leases at most, while leases are still granted: a member that misses
                // every one of them ends on its own (see below). Members that ended stop
                // renewing: nobody is removed any more.
                let since = *finishing.get_or_insert(now);
                let others = || cfg.members().filter(|&n| n != me);
                tell_finish(&co, rec, &cfg, now);
                if others().all(|n| rec.end_state_of(n) == EndState::Finished)
                    || now > since + 2 * lease
                {
                    rec.finished.store(true, Ordering::Release);
                    return;
                }
            } else if let Some(change) = changes(rec, &cfg, me, now, &mut readying_since) {
                let removal = matches!(change, Change::Remove(_));
                reconfigure(&co, &wt, change).await;
                readying_since = None;
                if removal {
                    continue;
                }
            }
        } else {
            // A lost request is covered by the next one.
            let _ = co.send_oneway(first(cfg.manager()), LEASE, &renewal(rec, &cfg, me, now));
            let silent = now.saturating_sub(rec.grant_heard.load(Ordering::Acquire));
            // The manager is gone: the lowest member left takes over, the next ones a
            // lease later each if it does not.
            let rank =
                cfg.members().filter(|&n| n != cfg.manager()).position(|n| n == me).unwrap_or(0)
                    as u64;
            // A member whose part is done takes no one over: the manager may have ended
            // the run (its FINISH lost), and the members still running take over if not.
            // The manager grants while its rounds run too, so a member takes over a
            // reconfiguration only from a manager that died in it (F4).
            let done = rec.done_here();
            if silent > takeover_ns(lease) + lease * rank && !done {
                if others_agree(&co, &node, &cfg).await {
                    reconfigure(&co, &wt, Change::Remove(vec![cfg.manager()])).await;
                    continue;
                }
                // Not now. This node may have missed a newer configuration (one that
                // removed it while it slept fences it off from the others): the store
                // tells. Waiting on the others and the store was no pause of this node.
                if let Err(e) = follow_newer(&co, &node).await {
                    return rec.fail(e.to_string());
                }
                last_turn = co.now_ns();
            }
            if done && silent > lease * 8 {
                rec.finished.store(true, Ordering::Release);
                return;
            }
            if silent > lease * 8 {
                // Cut off for far longer than any reconfiguration takes: removed.
                rec.stopped.store(true, Ordering::Release);
                return;
            }
        }
        co.sleep_until(co.now_ns().max(now) + rec.turn_ns()).await;
    }
}

/// The manager tells every member that has not acknowledged it yet, and every node still
/// asking to join (it will not be taken in), that the run is over.
fn tell_finish<E: Endpoint>(co: &Co<E>, rec: &NodeRecovery, cfg: &Config, now: u64) {
    let me = co.me().node;
    let members = cfg.members().filter(|&n| n != me && rec.end_state_of(n) != EndState::Finished);
    for n in members.chain(joiners(rec, cfg, now)) {
        let _ = co.send_oneway(first(n), FINISH, &[]);
    }
}

/// Leases a restarted node asks to join for while the configuration in force does not
/// change, before it gives up: far longer than removing its earlier life and a
/// reconfiguration take, and than the copies a manager finishes before it takes a node
/// in (a revision marks them whole).
const JOIN_PATIENCE_LEASES: u64 = 64;

/// A restarted node's way back in: it learns the configuration in force from the store
/// until one no longer lists it (its earlier life was removed), then asks that
/// configuration's manager to take it in ([`JOIN`]) each turn, until a configuration
/// that does arrives (by [`CONFIG`], or from the store). Gives up, stopping this node,
/// if the configuration in force does not change for [`JOIN_PATIENCE_LEASES`] leases, or
/// the run ends first.
async fn join_cluster<E: Endpoint>(co: &Co<E>, node: &NodeEngine) -> Result<(), String> {
    let rec = &node.recovery;
    let me = node.node;
    let lease = rec.params.lease_ns;
    let mut since = co.now_ns();
    let mut revision = node.membership.revision();
    while rec.is_joining() {
        if rec.ended() {
            return Ok(());
        }
        let now = co.now_ns();
        if node.membership.revision() != revision {
            // The cluster moved on: patience starts over.
            revision = node.membership.revision();
            since = now;
        }
        if now > since + JOIN_PATIENCE_LEASES * lease {
            rec.stopped.store(true, Ordering::Release);
            return Ok(());
        }
        follow_newer(co, node).await.map_err(|e| e.to_string())?;
        let cfg = node.membership.current();
        if !rec.is_joining() {
            break;
        }
        if !cfg.is_member(me) {
            let _ = co.send_oneway(first(cfg.manager()), JOIN, &[]);
        }
        co.sleep_until(co.now_ns() + rec.turn_ns()).await;
    }
    Ok(())
}

/// The nodes not members of `cfg` that asked its manager to join within the last lease.
fn joiners(rec: &NodeRecovery, cfg: &Config, now: u64) -> Vec<NodeId> {
    let lease = rec.params.lease_ns;
    (0..cfg.nodes())
        .map(NodeId)
        .filter(|&n| !cfg.is_member(n))
        .filter(|&n| {
            let asked = rec.join_asked[usize::from(n.0)].load(Ordering::Acquire);
            asked != 0 && now <= asked + lease
        })
        .collect()
}

/// Whether the other members (the manager aside) agree that the manager of `cfg` is
/// gone: asked all at once how long they have heard no grant, at least one answers within
/// a quarter of a lease, and every answer in `cfg`'s epoch says half a lease or more (or
/// there is no other member to ask). A member that hears the manager tells a cut one way
/// (what the manager sends this node is lost) from a dead manager; no answer at all means
/// this node is the one cut off, and as manager it could only remove the others one by
/// one; an answer from a newer epoch means this node missed it. In each case taking over
/// would remove a live manager.
async fn others_agree<E: Endpoint>(co: &Co<E>, node: &NodeEngine, cfg: &Config) -> bool {
    let me = node.node;
    let others: Vec<NodeId> = cfg.members().filter(|&n| n != me && n != cfg.manager()).collect();
    if others.is_empty() {
        return true;
    }
    let lease = node.recovery.params.lease_ns;
    let wait_ns = co.config().rpc_timeout_ns.min(lease / 4).max(1);
    let mut req = Vec::new();
    Out(&mut req).u64(cfg.epoch);
    let tickets: Vec<_> =
        others.iter().map(|&n| co.call_control(first(n), HEARD, &req, wait_ns).ok()).collect();
    let (mut answered, mut agree) = (false, true);
    for t in tickets.into_iter().flatten() {
        let read = |r: &[u8]| {
            let mut i = In(r);
            Some((i.u64()?, i.u64()?))
        };
        let Ok(Some((epoch, silence))) = co.reply(t, read).await else { continue };
        answered = true;
        agree &= epoch == cfg.epoch && silence >= lease / 2;
    }
    // A configuration installed here while the others answered restarted the silence,
    // and the takeover is judged again in it: the manager this node would remove may be
    // gone already, and a removal judged in one epoch and made in another would run
    // rounds beside a live manager.
    answered && agree && node.membership.epoch() == cfg.epoch
}

/// What the manager of `cfg` changes at `now`, if anything: it removes the members
/// whose lease ran out by their own clock (a sixteenth of slack for clocks that drift);
/// else it marks ready the copies reported whole, together once every syncing backup
/// reported, or a lease after the first one did (`readying_since`).
fn changes(
    rec: &NodeRecovery,
    cfg: &Config,
    me: NodeId,
    now: u64,
    readying_since: &mut Option<u64>,
) -> Option<Change> {
    let lease = rec.params.lease_ns;
    // Members not heard from, and members heard from whose grants are lost.
    let no_round_trip = |n: NodeId| {
        now > rec.round_trip[usize::from(n.0)].load(Ordering::Acquire) + ROUND_TRIP_LEASES * lease
    };
    let mut dead: Vec<NodeId> = cfg
        .members()
        .filter(|&n| n != me && (renewals_lapsed(rec, n, now) || no_round_trip(n)))
        .collect();
    // Of two or more members, none heard from for half a lease: this manager is more
    // likely cut off than they all dead at once (a crash of all would not be survived
    // anyway). It waits for the others to be heard again or lapse too; once every one
    // lapsed it steps down rather than remove them all, and they take over from it.
    let others = cfg.members().filter(|&n| n != me).count();
    let heard =
        |n: NodeId| now <= rec.renewed[usize::from(n.0)].load(Ordering::Acquire) + lease / 2;
    if others > 1 && dead.len() == others {
        // Every other member lapsed, or renews on without its grants arriving (what this
        // manager sends is lost): it is the one cut off.
        rec.stopped.store(true, Ordering::Release);
        return None;
    }
    if !dead.is_empty() && others > 1 && !cfg.members().any(|n| n != me && heard(n)) {
        return None;
    }
    // A member whose grants are lost still renews, and the grants sent it meanwhile may
    // yet arrive (a one-way cut that heals) and give it a lease that outlasts its
    // removal: where it cannot be fenced off, only a lapsed lease stops it. So, as a
    // suspect below, it is granted nothing more and removed once the last lease granted
    // to it ran out by any clock. (A member whose renewals lapsed was granted nothing
    // past its last renewal's lease.)
    dead.retain(|&n| {
        if renewals_lapsed(rec, n, now) {
            return true;
        }
        let i = usize::from(n.0);
        rec.revoked[i].fetch_max(cfg.epoch, Ordering::AcqRel);
        lease_over(rec, rec.granted_to[i].load(Ordering::Acquire), now)
    });
    // Members whose connections broke while both kept their leases (see `suspect`).
    let own = rec.suspicions.standing(cfg.epoch, now, suspicion_age(rec));
    let suspects = rec.suspicions.to_remove(cfg, &own, now, lease);
    if suspects.contains(&me) {
        // This manager is the one most broken connections touch: it steps down, and the
        // members take over from it once its grants stop, as from a dead manager.
        rec.stopped.store(true, Ordering::Release);
        return None;
    }
    for n in suspects {
        // A suspect still holds a lease, and where it cannot be fenced off only a lapsed
        // lease stops it: it is granted nothing more, and removed once the last lease
        // granted to it ran out by any clock (a sixteenth of slack, as for renewals).
        let i = usize::from(n.0);
        rec.revoked[i].fetch_max(cfg.epoch, Ordering::AcqRel);
        let lapsed = lease_over(rec, rec.granted_to[i].load(Ordering::Acquire), now);
        if lapsed && !dead.contains(&n) {
            dead.push(n);
        }
    }
    dead.sort();
    if !dead.is_empty() {
        return Some(Change::Remove(dead));
    }
    if rec.recovering.load(Ordering::Acquire) != 0 {
        return None;
    }
    // Restarted nodes asking to join, once no copy is under way (those finish first:
    // a node taken in gets backups only where copies are still short).
    let joining = joiners(rec, cfg, now);
    if !joining.is_empty() && syncing(cfg).is_empty() {
        return Some(Change::Join(joining));
    }
    let ready = rec.sync.ready_in(cfg, me);
    if ready.is_empty() {
        return None;
    }
    let since = *readying_since.get_or_insert(now);
    (ready.len() == syncing(cfg).len() || now > since + lease).then_some(Change::Ready(ready))
}

/// A member's lease renewal: epoch, how far it is with the end of the run, its clock, the
/// manager's clock at the newest grant it received, and the copies whole here that `cfg`
/// still has syncing (nothing when there are none), which it reports until the manager
/// marks them ready.
fn renewal(rec: &NodeRecovery, cfg: &Config, me: NodeId, now: u64) -> Vec<u8> {
    let mut req = Vec::new();
    Out(&mut req)
        .u64(cfg.epoch)
        .u8(rec.end_state_here() as u8)
        .u64(now.max(1))
        .u64(rec.grant_echo.load(Ordering::Acquire));
    let copied = rec.sync.copied_here(cfg, me);
    let suspected = rec.suspicions.standing(cfg.epoch, now, suspicion_age(rec));
    if !copied.is_empty() || !suspected.is_empty() {
        Out(&mut req).u16(copied.len() as u16);
        for p in copied {
            Out(&mut req).u16(p);
        }
    }
    if !suspected.is_empty() {
        Out(&mut req).u16(suspected.len() as u16);
        for n in suspected {
            Out(&mut req).u16(n.0);
        }
    }
    req
}

/// How long a suspicion stands before it is acted on.
fn suspicion_age(rec: &NodeRecovery) -> u64 {
    SUSPICION_LEASES * rec.params.lease_ns
}

/// Starts every silence this node measures afresh at `now`: the manager's towards each
/// member of `cfg`, a member's towards the manager.
fn restart_silences(rec: &NodeRecovery, cfg: &Config, now: u64) {
    rec.grant_heard.fetch_max(now, Ordering::AcqRel);
    for n in cfg.members() {
        rec.renewed[usize::from(n.0)].fetch_max(now, Ordering::AcqRel);
        rec.round_trip[usize::from(n.0)].fetch_max(now, Ordering::AcqRel);
        // A lease granted before (perhaps by another manager) counts as granted now, so
        // that a suspect is removed only a whole lease after it.
        rec.granted_to[usize::from(n.0)].fetch_max(now, Ordering::AcqRel);
    }
}

/// The lease task of a node (on its worker 0): while this node manages the configuration
/// in force, grants the renewals its members asked for and keeps its own lease. A task of
/// its own, so that leases keep flowing while the manager's rounds of a reconfiguration
/// wait on members: a member then takes the manager for dead only once it is (and can
/// take over a reconfiguration the manager died in).
///
/// The manager's own lease runs at most a lease past its turn, and never past the point
/// where a member whose acknowledgements of grants stopped could take over: a member
/// takes over a takeover's silence after the newest grant it received (by its clock), so
/// a takeover's silence after the newest grant it acknowledged, less a sixteenth for
/// clocks that drift, the manager's lease is over (F1b). So a member may take over soon
/// after a lease, with no fencing needed to stop the manager it replaces: a manager that
/// paused, or whose grants stopped arriving, has stopped posting by then. Its grants go
/// on whatever its own lease: they keep the members' leases, and bring the
/// acknowledgements that give it its lease back.
pub(crate) async fn granter<E: Endpoint>(co: Co<E>, wt: Rc<WorkerTxn>) {
    let node = wt.node.clone();
    let rec = &node.recovery;
    let me = co.me().node;
    let lease = rec.params.lease_ns;
    let takeover = takeover_ns(lease);
    loop {
        if rec.ended() {
            return;
        }
        let cfg = node.membership.current();
        let now = co.now_ns();
        if rec.is_joining() {
            // Restarted: whatever its view says, it manages nothing until taken in.
            co.sleep_until(now + rec.turn_ns()).await;
            continue;
        }
        if !cfg.is_member(me) {
            return;
        }
        if cfg.manager() != me && rec.in_rounds.load(Ordering::Acquire) {
            // The rounds of a configuration that made another node manager (one it took
            // in after a restart, with a lower id) keep this node's membership task busy:
            // renew from here, or the new manager would take it for dead.
            let _ = co.send_oneway(first(cfg.manager()), LEASE, &renewal(rec, &cfg, me, now));
        }
        if cfg.manager() == me {
            rec.renewed[usize::from(me.0)].store(now, Ordering::Release);
            rec.end_states[usize::from(me.0)].store(rec.end_state_here() as u8, Ordering::Release);
            let acked = cfg
                .members()
                .filter(|&n| n != me)
                .map(|n| rec.acked[usize::from(n.0)].load(Ordering::Acquire))
                .min();
            let until = match acked {
                Some(a) => (now + lease).min(a + takeover - takeover / 16),
                None => now + lease,
            };
            rec.lease_until.store(until, Ordering::Release);
            for n in cfg.members().filter(|&n| n != me) {
                let i = usize::from(n.0);
                if rec.revoked[i].load(Ordering::Acquire) == cfg.epoch {
                    continue; // to be removed once its lease ran out (see `changes`)
                }
                let sent = rec.to_grant[i].swap(0, Ordering::AcqRel);
                if sent != 0 {
                    rec.granted_to[i].store(now, Ordering::Release);
                    let mut msg = Vec::new();
                    Out(&mut msg).u64(cfg.epoch).u64(sent).u64(now);
                    // A lost grant is covered by the next one.
                    let _ = co.send_oneway(first(n), GRANT, &msg);
                }
            }
        }
        co.sleep_until(co.now_ns().max(now) + rec.turn_ns()).await;
    }
}

/// How long a member hears no grant before it takes the manager for dead (the lowest
/// member; each next one waits a lease more): a lease and a quarter. The manager's own
/// lease ends before (see [`granter`]); the quarter past a lease leaves room for a
/// renewal and its grant, a turn apart each, on loaded workers, so that a live manager is
/// not taken for dead while its grants are merely late.
fn takeover_ns(lease_ns: u64) -> u64 {
    lease_ns + lease_ns / 4
}

/// What a reconfiguration changes.
enum Change {
    /// Removes these nodes (taken for dead), re-replicating what they held.
    Remove(Vec<NodeId>),
    /// Marks these backups (partition, node), whose copies are whole, ready.
    Ready(Vec<(u16, NodeId)>),
    /// Takes these restarted nodes in as members (empty: backups where copies are short).
    Join(Vec<NodeId>),
}

/// The manager's reconfiguration making `change` (and removing whoever fails to answer
/// on the way). Ends with every member active in the new epoch, or the cluster stopped
/// with the reason recovery cannot go on.
async fn reconfigure<E: Endpoint>(co: &Co<E>, wt: &Rc<WorkerTxn>, mut change: Change) {
    let node = wt.node.clone();
    let rec = &node.recovery;
    let patience = patience(co, rec);
    let copies = rec.params.rereplication.target(node.cfg.replication);
    loop {
        // A view with backups still syncing may miss that they were marked ready (the
        // manager before committed that revision, then died before telling this node):
        // only the store knows which are promotable.
        if matches!(change, Change::Remove(_)) && !syncing(&node.membership.current()).is_empty() {
            match follow_newer(co, &node).await {
                Ok(Followed::NewEpoch) => return,
                Ok(Followed::NewRevision | Followed::Nothing) => {}
                Err(e) => return rec.fail(e.to_string()),
            }
        }
        let old = node.membership.current();
        if let Change::Remove(dead) = &mut change {
            // Only members can be removed: one already gone (a newer configuration came
            // meanwhile) needs no configuration, and a new epoch for nothing would make
            // this node its manager beside the one in force.
            dead.retain(|&n| old.is_member(n));
            if dead.is_empty() {
                return;
            }
        }
        let next = match &change {
            Change::Remove(dead) => {
                assert!(!dead.contains(&node.node), "{} would remove itself", node.node);
                rec.event(
                    RecoveryStep::Removing { dead: dead.clone(), from_epoch: old.epoch },
                    co.now_ns(),
                );
                match next_config(&old, dead, copies) {
                    Ok(c) => c,
                    // A node that slept through its own removal suspects everyone when
                    // it wakes; only a suspicion of the configuration in force may stop
                    // the cluster.
                    Err(why) => match follow_newer(co, &node).await {
                        Ok(Followed::NewEpoch) => return,
                        // A revision this node missed may make a backup promotable.
                        Ok(Followed::NewRevision) => continue,
                        Ok(Followed::Nothing) => return rec.fail(why),
                        Err(e) => return rec.fail(e.to_string()),
                    },
                }
            }
            Change::Ready(ready) => {
                // Backups that are no longer syncing in the configuration in force (a
                // failure came first) are left out; none left, nothing to do.
                let Some(c) = ready_config(&old, ready) else { return };
                c
            }
            Change::Join(joined) => match joining_config(rec, &old, joined, copies, co.now_ns()) {
                Some(Ok(c)) => c,
                Some(Err(why)) => return rec.fail(why),
                None => return,
            },
        };
        // Commit it to the store: of two managers, one wins.
        let mut bytes = Vec::new();
        next.encode(&mut bytes);
        co.sleep_until(co.now_ns() + rec.params.store_latency_ns).await;
        let before_ns = co.now_ns();
        match rec.store.cas(old.revision, next.revision, &bytes) {
            Ok(Cas::Done) => {}
            Ok(Cas::Lost(_, other)) => {
                // Another manager moved first: follow its configuration.
                if let Ok(c) = Config::decode(&other) {
                    co.with_ep(|ep| install(&node, ep, c, Origin::Learned));
                }
                return;
            }
            Err(e) => return rec.fail(e.to_string()),
        }
        if next.epoch == old.epoch {
            return mark_ready(co, &node, &old, next, &bytes, before_ns);
        }
        rec.event(RecoveryStep::Committed { epoch: next.epoch }, co.now_ns());
        co.with_ep(|ep| install(&node, ep, next.clone(), Origin::Committed { before_ns }));
        crash_point(co, &node.cfg, ProtocolPoint::Reconfiguring).await;
        rec.in_rounds.store(true, Ordering::Release);
        let outcome = rounds(co, &node, &old, &next, &bytes, patience).await;
        rec.in_rounds.store(false, Ordering::Release);
        match outcome {
            Ok(()) => {
                let now = co.now_ns();
                rec.event(RecoveryStep::ActiveEverywhere { epoch: next.epoch }, now);
                let short = !fully_replicated(&old, node.cfg.replication);
                if short && fully_replicated(&next, node.cfg.replication) {
                    rec.event(RecoveryStep::Replicated { revision: next.revision }, now);
                }
                return;
            }
            Err(Round::Silent { node: n, alone }) => match after_silence(&node, &next, n, alone) {
                Some(c) => change = c,
                None => return,
            },
            Err(Round::Fatal(why)) => return rec.fail(why),
        }
    }
}

/// What the manager of `next` does once member `n` left its rounds silent (`alone`: no
/// member answered anything): removes it too, from `next`; or nothing more.
fn after_silence(node: &NodeEngine, next: &Config, n: NodeId, alone: bool) -> Option<Change> {
    // Of two or more others none answered anything: this manager is cut off (perhaps one
    // way), and would remove them one by one; it steps down, and they take over from it.
    // So it does if the silent one is its own worker 0 (its requests to itself lost for a
    // whole silence; late answers count as heard): it must not remove itself and go on
    // as the manager of a configuration without it.
    let others = next.members().filter(|&m| m != node.node).count();
    if (others > 1 && alone) || n == node.node {
        node.recovery.stopped.store(true, Ordering::Release);
        return None;
    }
    // A newer configuration came during the rounds: its manager judges its members (a
    // silence here says nothing of that epoch).
    if node.membership.epoch() != next.epoch {
        return None;
    }
    Some(Change::Remove(vec![n]))
}

/// A revision that only marks backups ready (`next`, committed): taken here at once and
/// told to the members, one-way (a member that misses it loses nothing: a manager reads
/// the store before it promotes anyone). Nothing of the epoch stops.
fn mark_ready<E: Endpoint>(
    co: &Co<E>,
    node: &NodeEngine,
    old: &Config,
    next: Config,
    bytes: &[u8],
    before_ns: u64,
) {
    let rec = &node.recovery;
    let now = co.now_ns();
    let ready: Vec<(u16, NodeId)> =
        syncing(old).into_iter().filter(|b| !syncing(&next).contains(b)).collect();
    rec.event(RecoveryStep::Readied { ready, revision: next.revision }, now);
    if !fully_replicated(old, node.cfg.replication) && fully_replicated(&next, node.cfg.replication)
    {
        rec.event(RecoveryStep::Replicated { revision: next.revision }, now);
    }
    for n in next.members().filter(|&n| n != node.node) {
        let _ = co.send_oneway(first(n), CONFIG, bytes);
    }
    co.with_ep(|ep| install(node, ep, next, Origin::Committed { before_ns }));
}

/// What [`follow_newer`] found in the store.
enum Followed {
    /// A configuration of a later epoch: another manager moved on; it is installed.
    NewEpoch,
    /// A later revision of the epoch in force (backups marked ready); it is installed.
    NewRevision,
    /// Nothing newer than this node's.
    Nothing,
}

/// Installs the configuration in the store if it is newer than this node's (another
/// manager moved on, perhaps without this node).
async fn follow_newer<E: Endpoint>(
    co: &Co<E>,
    node: &NodeEngine,
) -> Result<Followed, StoreFailure> {
    co.sleep_until(co.now_ns() + node.recovery.params.store_latency_ns).await;
    let mine = node.membership.current();
    let Some((revision, bytes)) = node.recovery.store.get()? else { return Ok(Followed::Nothing) };
    let Ok(c) = Config::decode(&bytes) else { return Ok(Followed::Nothing) };
    if revision <= mine.revision || c.revision != revision {
        return Ok(Followed::Nothing);
    }
    let followed = if c.epoch > mine.epoch { Followed::NewEpoch } else { Followed::NewRevision };
    co.with_ep(|ep| install(node, ep, c, Origin::Learned));
    Ok(followed)
}

/// Why the rounds of a reconfiguration ended early.
enum Round {
    /// This member did not answer.
    Silent {
        node: NodeId,
        /// Whether no other member answered anything in these rounds either.
        alone: bool,
    },
    Fatal(String),
}

impl Round {
    fn of(u: Unanswered, what: &str, watch: &Watch<'_>) -> Round {
        match u {
            Unanswered::Silent(w) => Round::Silent { node: w.node, alone: watch.heard_none() },
            Unanswered::NeverReady(w) => Round::Fatal(format!(
                "{} kept answering {what} but never became ready ({READY_PATIENCE} times the silence allowed)",
                w.node
            )),
        }
    }
}

/// Rounds 1-4 of a reconfiguration from `old` to `new`; a member that does not answer
/// one within `patience` is silent.
async fn rounds<E: Endpoint>(
    co: &Co<E>,
    node: &NodeEngine,
    old: &Config,
    new: &Config,
    bytes: &[u8],
    patience: Patience,
) -> Result<(), Round> {
    let epoch = new.epoch;
    let members: Vec<NodeId> = new.members().collect();
    // 1: install and quiesce, every member at once.
    let reqs: Vec<(WorkerId, Vec<u8>)> =
        members.iter().map(|&n| (first(n), bytes.to_vec())).collect();
    let watch = Watch {
        rec: &node.recovery,
        members: &members,
        me: node.node,
        answers: RefCell::new(BTreeMap::new()),
    };
    let answers = call_all(co, CONFIG, &reqs, patience, Some(&watch), |r| {
        let mut i = In(r);
        let (e, q) = (i.u64()?, i.u8()?);
        (e > epoch || (e == epoch && q == 1)).then_some(e)
    })
    .await
    .map_err(|u| Round::of(u, "CONFIG", &watch))?;
    if answers.iter().any(|&e| e != epoch) {
        return Ok(()); // a newer configuration took over
    }
    // 2: reports.
    let mut reports = Reports::default();
    for &n in &members {
        let mut cursor = (0u32, 0u32);
        while cursor.0 != u32::MAX {
            let mut req = Vec::new();
            Out(&mut req).u64(epoch).u32(cursor.0).u32(cursor.1);
            let one = [(first(n), req)];
            let page = call_all(co, REPORT, &one, patience, Some(&watch), |r| Some(r.to_vec()))
                .await
                .map_err(|u| Round::of(u, "REPORT", &watch))?;
            match reports.read_page(n, &page[0]) {
                Some(next) if next != cursor || next.0 == u32::MAX => cursor = next,
                _ => return Err(Round::Fatal(format!("{n} sent a report that does not read"))),
            }
        }
    }
    // 3: decisions. Decisions this node holds in full from a recovery that may not have
    // finished (its manager died as they were being applied) stand (F4).
    let prior = node.recovery.decided.lock().expect("no recorder panicked").clone();
    let mut committed = reports.decide(old, new, &prior).map_err(Round::Fatal)?;
    node.recovery.event(
        RecoveryStep::Decided { in_doubt: reports.doubts.len(), committed: committed.len() },
        co.now_ns(),
    );
    // What the recovery before committed goes out again, though no log holds it any
    // more: a coordinator whose go was lost learns its verdict from this one.
    committed.extend(prior.1.iter().copied());
    let list: Vec<u64> = committed.into_iter().collect();
    let pages: Vec<&[u64]> =
        if list.is_empty() { vec![&[][..]] } else { list.chunks(PAGE_BYTES / 8).collect() };
    // Page by page to every member at once, then the go, repeated until every member has
    // applied everything. No member applies a decision before every member holds them
    // all: whoever takes over then knows them.
    let mut sends: Vec<(DecidePage, &[u64])> = pages
        .iter()
        .enumerate()
        .map(|(k, &page)| {
            (if k + 1 == pages.len() { DecidePage::Last } else { DecidePage::More }, page)
        })
        .collect();
    sends.push((DecidePage::Go, &[]));
    for (page, list) in sends {
        let mut req = Vec::new();
        Out(&mut req).u64(epoch).u8(page.code()).u32(list.len() as u32).words(list);
        let reqs: Vec<(WorkerId, Vec<u8>)> =
            members.iter().map(|&n| (first(n), req.clone())).collect();
        let wanted = match page {
            DecidePage::More => Stage::Gathering,
            DecidePage::Last => Stage::Complete,
            DecidePage::Go => Stage::Applied,
        };
        let answers = call_all(co, DECIDE, &reqs, patience, Some(&watch), |r| {
            let mut i = In(r);
            let (e, stage) = (i.u64()?, i.u8()?);
            (e != epoch || stage >= wanted.code()).then_some(e)
        })
        .await
        .map_err(|u| Round::of(u, "DECIDE", &watch))?;
        if answers.iter().any(|&e| e != epoch) {
            return Ok(());
        }
    }
    // 4: activation.
    let mut req = Vec::new();
    Out(&mut req).u64(epoch);
    let reqs: Vec<(WorkerId, Vec<u8>)> = members.iter().map(|&n| (first(n), req.clone())).collect();
    call_all(co, ACTIVATE, &reqs, patience, Some(&watch), |r| {
        let mut i = In(r);
        let (e, active) = (i.u64()?, i.u8()?);
        (e != epoch || active == 1).then_some(e)
    })
    .await
    .map_err(|u| Round::of(u, "ACTIVATE", &watch))?;
    Ok(())
}

/// The recovery task of every worker: when a new configuration is installed, freezes
/// this worker's attempts (they see the epoch move) and lands everything its connections
/// carry; on worker 0 also applies the decisions. Ends with the run.
pub(crate) async fn quiescer<E: Endpoint>(co: Co<E>, wt: Rc<WorkerTxn>) {
    let node = wt.node.clone();
    let rec = &node.recovery;
    let me = co.me();
    let index = usize::from(me.index);
    let poll_ns = rec.poll_ns();
    let mut copier = Copier::default();
    loop {
        if rec.ended() {
            return;
        }
        let epoch = node.membership.epoch();
        if rec.quiesced[index].load(Ordering::Acquire) < epoch {
            let cfg = node.membership.current();
            // A node that restarted and is not a member yet posted nothing.
            if !rec.is_joining() {
                fence_connections(&co, &node, &cfg).await;
            }
            for r in wt.rings.borrow_mut().iter_mut() {
                r.mark_stale(epoch);
            }
            wt.drop_unresolved();
            rec.quiesced[index].fetch_max(epoch, Ordering::AcqRel);
        }
        if me.index == 0 {
            let ready = {
                let d = rec.decisions.lock().expect("no recorder panicked");
                d.epoch == epoch && d.stage == Stage::Applying
            };
            if ready {
                apply_decisions(&co, &node).await;
            }
        }
        for n in co.take_unreachable().into_iter().filter(|&n| n != me.node) {
            rec.suspicions.note(n, epoch, co.now_ns());
        }
        // Re-replication's copies into this node, paced, between recoveries (F5); none
        // into a node that restarted and is not a member yet (its view may name its
        // earlier life a backup).
        let turn = match rec.is_joining() {
            true => Turn::Idle,
            false => copier.turn(&co, &node).await,
        };
        let wake = match turn {
            Turn::Idle => co.now_ns() + poll_ns,
            Turn::Until(at) => at.min(co.now_ns() + poll_ns),
        };
        co.sleep_until(wake).await;
    }
}

/// Posts a signaled READ on every connection to every member and waits for them all:
/// connections are FIFO (R1), so everything posted before has landed.
async fn fence_connections<E: Endpoint>(co: &Co<E>, node: &NodeEngine, cfg: &Config) {
    let lanes = co.shape().lanes_per_peer;
    let rec = &node.recovery;
    // Nodes taken in after a restart since this node was last activated: nothing is in
    // flight between them and this node, and they may not have admitted it yet. (Members
    // may record different epochs for one join, if a takeover committed the next before
    // the joined node heard of the first: each counts from its own.)
    let activated = rec.activated.load(Ordering::Acquire);
    let joined_since =
        |n: NodeId| rec.joined_in[usize::from(n.0)].load(Ordering::Acquire) > activated;
    if joined_since(node.node) {
        // This node itself joined: it posted nothing before.
        return;
    }
    let qps = cfg
        .members()
        .filter(|&n| !joined_since(n))
        .flat_map(|n| (0..lanes).map(move |lane| Qp { node: n, lane }));
    land_connections(co, node, qps.collect()).await;
}

/// Posts a signaled 8-byte READ (into this worker's fence slot) on each of `qps` and
/// waits for them all: each connection then retired everything posted on it before (R1,
/// R3). A dead target completes in error: it lands nothing either way.
pub(crate) async fn land_connections<E: Endpoint>(co: &Co<E>, node: &NodeEngine, qps: Vec<Qp>) {
    let local = node.scratch.fence(co.me().index, co.shape().workers_per_node);
    let mut tickets = Vec::with_capacity(qps.len());
    for qp in qps {
        let remote = RemoteAddr { node: qp.node, rkey: node.log.rkey, offset: 0 };
        let wr = WorkRequest::Read { remote, local, len: 8 };
        loop {
            match co.issue(qp, &[wr]) {
                Ok(t) => {
                    tickets.push(t);
                    break;
                }
                Err(_) => co.yield_now().await,
            }
        }
    }
    for t in tickets {
        let _ = co.wait(t).await;
    }
}

/// Applies the decisions of the recovery in progress on this node: resolves every ring,
/// hands committed records of other primaries' partitions to them, files the records of
/// partitions this node now leads in its NIC index.
async fn apply_decisions<E: Endpoint>(co: &Co<E>, node: &NodeEngine) {
    let rec = &node.recovery;
    let (epoch, committed) = {
        let d = rec.decisions.lock().expect("no recorder panicked");
        (d.epoch, d.committed.clone())
    };
    let cfg = node.membership.current();
    let me = co.me().node;
    // Records to hand to each primary, by owner; first those an earlier recovery applied
    // here but could not hand over before its configuration was superseded.
    let mut kept: Vec<(u64, u16, Vec<u8>)> =
        std::mem::take(&mut *rec.unforwarded.lock().expect("no recorder panicked"));
    let mut buf = Vec::new();
    for c in 0..node.log.rings as usize {
        let result = resolve(
            &node.store,
            &node.log_region,
            &node.log,
            c,
            epoch,
            |o| committed.contains(&o),
            |entry| {
                let owner = entry[1];
                for r in records(entry) {
                    let p = node.catalog.partition(r.table, r.key);
                    if cfg.primary(p) == me {
                        continue;
                    }
                    let mut out = Vec::with_capacity(20 + 8 * r.payload.len());
                    Out(&mut out)
                        .u16(r.table.0)
                        .u64(r.key)
                        .u64(r.version)
                        .u16(r.payload.len() as u16)
                        .words(&r.payload);
                    kept.push((owner, p, out));
                }
            },
            &mut buf,
        );
        if let Err(e) = result {
            return rec
                .fail(format!("{me}: the log ring of worker {c} is corrupt at recovery: {e:?}"));
        }
    }
    let mut forward: BTreeMap<(NodeId, u64), Vec<Vec<u8>>> = BTreeMap::new();
    for (owner, p, out) in &kept {
        let primary = cfg.primary(*p);
        if primary != me {
            forward.entry((primary, *owner)).or_default().push(out.clone());
        }
    }
    let reqs = pack_apply(epoch, forward);
    // The records are in this node's logs no more (applied here): every primary must
    // have them before this node counts as applied, however many requests are lost on
    // the way (APPLY is idempotent: a record older than the primary's is ignored). Only
    // a newer configuration ends the wait (a primary answering from one applied
    // nothing), and the records are kept for the recovery it brings: the primary may
    // live on, and only the manager died. Every member installed this epoch before any
    // decision was sent, so an answer from an older one is from before, not one to take.
    loop {
        let answered = call_all(co, APPLY, &reqs, patience(co, rec), None, |r| {
            In(r).u64().filter(|&e| e >= epoch)
        })
        .await;
        if answered.as_ref().is_ok_and(|epochs| epochs.iter().all(|&e| e == epoch)) {
            break;
        }
        if rec.ended() {
            break;
        }
        if node.membership.epoch() != epoch || answered.is_ok() {
            rec.unforwarded.lock().expect("no recorder panicked").extend(kept);
            break;
        }
    }
    // A newer configuration installed meanwhile files its own primaries when it applies.
    let mut refile = Some(Refile::default());
    while let Some(from) = refile.filter(|_| node.membership.epoch() == epoch) {
        refile = node.refile_primaries(&cfg, from, REFILE_PER_TURN);
        if refile.is_some() {
            co.yield_now().await;
        }
    }
    let mut d = rec.decisions.lock().expect("no recorder panicked");
    if d.epoch == epoch && d.stage == Stage::Applying {
        d.stage = Stage::Applied;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joined_node_takes_the_copies_the_survivors_lack_and_nothing_else_moves() {
        let first = Config::initial(3, 3);
        let without = next_config(&first, &[NodeId(1)], 3).unwrap();
        // Two survivors cannot hold a third copy of anything.
        assert!(syncing(&without).is_empty());
        let back = join_config(&without, &[NodeId(1)], 3).unwrap();
        assert_eq!((back.epoch, back.revision), (without.epoch + 1, without.revision + 1));
        assert!(back.is_member(NodeId(1)));
        for (p, place) in back.placement.parts().iter().enumerate() {
            let before = without.placement.part(p as u16);
            assert_eq!((place.primary, place.generation), (before.primary, before.generation));
            let since = BackupState::Syncing { since: back.epoch };
            assert_eq!(place.backups.last(), Some(&(NodeId(1), since)), "partition {p}");
            assert_eq!(place.backups.len(), before.backups.len() + 1);
        }
        // Without re-replication it joins holding nothing.
        let empty = join_config(&without, &[NodeId(1)], 0).unwrap();
        assert!(syncing(&empty).is_empty() && empty.is_member(NodeId(1)));
        assert!(join_config(&back, &[NodeId(1)], 3).is_err(), "a member cannot join");
        assert!(join_config(&without, &[NodeId(7)], 3).is_err(), "nor a node outside the cluster");
    }

    /// A member whose renewals arrive but whose grants are lost is removed only once the
    /// last lease granted to it ran out, and is granted nothing meanwhile: grants sent
    /// before the decision may still arrive (a one-way cut that heals) and, where it
    /// cannot be fenced off, only a lapsed lease stops it from posting in the epoch
    /// that removed it.
    #[test]
    fn a_member_whose_grants_are_lost_is_removed_only_after_its_last_lease() {
        let lease = 1_000_000;
        let params = RecoveryParams { lease_ns: lease, ..RecoveryParams::simulated() };
        let store = Arc::new(crate::config_store::MemoryStore::default());
        let rec = NodeRecovery::new(3, 1, store, params);
        let cfg = Config::initial(3, 3);
        let me = cfg.manager();
        let (cut, fine) = (NodeId(1), NodeId(2));
        assert_eq!(me, NodeId(0));
        // Both renew on; the last round trip with node 1 closed at 0, and the manager
        // granted its renewals until 2.4 leases.
        let now = 2 * lease + lease / 2;
        let granted = 2 * lease + 2 * lease / 5;
        for n in [cut, fine] {
            rec.renewed[usize::from(n.0)].store(now, Ordering::Release);
            rec.granted_to[usize::from(n.0)].store(granted, Ordering::Release);
        }
        rec.round_trip[usize::from(fine.0)].store(now, Ordering::Release);
        let mut readying = None;
        assert!(changes(&rec, &cfg, me, now, &mut readying).is_none(), "removed under a lease");
        assert_eq!(rec.revoked[usize::from(cut.0)].load(Ordering::Acquire), cfg.epoch);
        assert_eq!(rec.revoked[usize::from(fine.0)].load(Ordering::Acquire), 0);
        let over = granted + lease + lease / 16;
        // Both still renew.
        for n in [cut, fine] {
            rec.renewed[usize::from(n.0)].store(over, Ordering::Release);
        }
        rec.round_trip[usize::from(fine.0)].store(over, Ordering::Release);
        assert!(changes(&rec, &cfg, me, over, &mut readying).is_none(), "removed at its end");
        match changes(&rec, &cfg, me, over + 1, &mut readying) {
            Some(Change::Remove(dead)) => assert_eq!(dead, vec![cut]),
            _ => panic!("the member whose grants are lost is not removed after its lease"),
        }
    }

    /// A forwarded record of `words` payload words, its key and version both `key`.
    fn record(key: u64, words: usize) -> Vec<u8> {
        let mut out = Vec::new();
        Out(&mut out).u16(1).u64(key).u64(key).u16(words as u16).words(&vec![key; words]);
        out
    }

    /// A transaction in doubt, logged in `epoch`, that wrote partition 0, held whole by
    /// `holders`.
    fn doubt(epoch: u64, seq: u32, holders: impl Iterator<Item = NodeId>) -> (u64, Doubt) {
        let owner = hytra_store::Owner::new(1, 0, epoch, seq).0;
        let held = holders.map(|n| (n, (1, 1))).collect();
        (owner, Doubt { epoch, tseq: u64::from(seq), written: vec![0], held })
    }

    /// A recovery that takes over one whose manager died keeps to what that one decided
    /// for the transactions it decided (F4), and decides the later ones on their logs.
    #[test]
    fn decisions_held_in_full_stand_in_the_next_recovery() {
        let first = Config::initial(5, 3);
        let old = next_config(&first, &[NodeId(4)], 3).unwrap();
        let new = next_config(&old, &[NodeId(0)], 3).unwrap();
        let survivors = || old.placement.backups(0).filter(|&b| new.is_member(b));
        assert!(survivors().count() > 0);
        let every = || std::iter::once(old.placement.primary(0)).chain(old.placement.backups(0));
        // Decided by epoch 2 (logged in epoch 1): aborted although every survivor holds it
        // whole now, and committed although no survivor still holds it.
        let (aborted, a) = doubt(1, 1, survivors());
        let (kept, k) = doubt(1, 2, std::iter::empty());
        // Logged in epoch 2, decided afresh: whole everywhere, and missing on a survivor.
        let (whole, w) = doubt(2, 3, every());
        let (torn, t) = doubt(2, 4, survivors().skip(1));
        let reports = Reports {
            doubts: [(aborted, a), (kept, k), (whole, w), (torn, t)].into_iter().collect(),
            applied: BTreeMap::new(),
        };
        let prior = (old.epoch, [kept].into_iter().collect());
        let committed = reports.decide(&old, &new, &prior).unwrap();
        assert_eq!(committed, [kept, whole].into_iter().collect::<BTreeSet<_>>());
        // With nothing decided before, the logs alone decide.
        let fresh = reports.decide(&old, &new, &(0, BTreeSet::new())).unwrap();
        assert_eq!(fresh, [aborted, whole].into_iter().collect::<BTreeSet<_>>());
    }

    #[test]
    fn apply_requests_hold_every_record_once_within_a_page() {
        let mut forward: BTreeMap<(NodeId, u64), Vec<Vec<u8>>> = BTreeMap::new();
        let mut key = 0;
        for primary in [NodeId(1), NodeId(4)] {
            for owner in 0..40u64 {
                // Owners of one record, and owners of more than a page of them.
                let n = if owner % 7 == 0 { 12 } else { 1 };
                for _ in 0..n {
                    key += 1;
                    let words = usize::from(hytra_store::layout::PAYLOAD_WORDS_MAX)
                        / (1 + (key as usize % 4));
                    forward.entry((primary, owner)).or_default().push(record(key, words));
                }
            }
        }
        let want: Vec<(NodeId, u64, u64)> = forward
            .iter()
            .flat_map(|(&(p, o), rs)| {
                rs.iter().map(move |r| (p, o, u64::from_le_bytes(r[2..10].try_into().unwrap())))
            })
            .collect();
        let reqs = pack_apply(9, forward);
        let mut got = Vec::new();
        for (dest, req) in &reqs {
            assert!(req.len() <= PAGE_BYTES, "{} bytes", req.len());
            assert_eq!(dest.index, 0);
            let mut i = In(req);
            assert_eq!(i.u64(), Some(9));
            let groups = i.u16().unwrap();
            assert!(groups > 0);
            for _ in 0..groups {
                let (owner, count) = (i.u64().unwrap(), i.u16().unwrap());
                assert!(count > 0);
                for _ in 0..count {
                    let (_table, key, _version, len) =
                        (i.u16().unwrap(), i.u64().unwrap(), i.u64().unwrap(), i.u16().unwrap());
                    for _ in 0..len {
                        assert_eq!(i.u64(), Some(key));
                    }
                    got.push((dest.node, owner, key));
                }
            }
            assert_eq!(i.u8(), None, "nothing after the last group");
        }
        assert_eq!(got, want);
        assert!(reqs.len() > 4, "records spread over several pages: {}", reqs.len());
    }
}
