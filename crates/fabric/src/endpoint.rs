//! The backend-neutral interface: what a worker can do ([`Endpoint`]), what a worker runs
//! ([`Program`]) and how a cluster is set up and run ([`Backend`]).
//!
//! Everything above `fabric` is written against these traits only, so the same engine
//! runs in the simulator, on threads, and over UCX.

use thiserror::Error;

use crate::constants::{LANES_MAX, NODES_MAX, WORKERS_PER_NODE_MAX};
use crate::cpu::CpuTerm;
use crate::ids::{ClusterShape, NodeId, Qp, Rkey, WorkerId, WrId};
use crate::memory::Region;
use crate::verbs::{BatchPost, BatchRefused, Completion, OpFlags, PostError, WorkRequest};
use crate::wq::{WqCounters, WqId, WqSpec};

/// Static properties of a fabric, fixed for the life of a cluster.
#[derive(Copy, Clone, Debug)]
pub struct Caps {
    /// Largest datagram payload.
    pub mtu: usize,
    /// Largest inline WRITE payload.
    pub inline_max: usize,
    /// Requests a connection may have outstanding.
    pub sq_depth: u32,
    /// Whether NIC atomics (CAS/FAA posted through the fabric) are atomic with respect to
    /// CPU atomics on the same word. Real RNICs: no (paper §5.2). When false, a word that
    /// the fabric's atomics touch must never be changed by a CPU atomic, and vice versa.
    pub atomics_coherent: bool,
    /// Whether one-sided operations complete without the target worker running (true for
    /// an RNIC, the simulator, threads and UCX shared memory; false for UCX over TCP).
    pub one_sided_bypasses_target: bool,
}

/// What one worker can do: post one-sided work requests on its connections, poll its
/// completion queue, send and receive datagrams, and touch its own node's memory.
///
/// All calls are non-blocking. An endpoint belongs to one worker and is used from one
/// thread at a time.
pub trait Endpoint {
    /// The worker this endpoint belongs to.
    fn me(&self) -> WorkerId;
    /// Size of the cluster.
    fn shape(&self) -> ClusterShape;
    /// Properties of the fabric.
    fn caps(&self) -> Caps;
    /// Current time in nanoseconds: virtual in the simulator, monotonic wall time elsewhere.
    fn now_ns(&self) -> u64;
    /// Charges `ns` of CPU work to this worker. The simulator advances the worker's clock;
    /// real backends ignore it (the work really took its time).
    fn charge_cpu(&mut self, ns: u64);
    /// Charges `count` of a kind of CPU work the caller names ([`CpuTerm`]). The
    /// simulator costs it from its CPU profile, or counts it into the step's measured mix;
    /// real backends ignore it.
    fn charge(&mut self, term: CpuTerm, count: u32) {
        let _ = (term, count);
    }
    /// A registered region of this worker's own node, for direct CPU access.
    fn region(&self, rkey: Rkey) -> Option<&Region>;
    /// Posts a one-sided request on connection `qp`.
    fn post(
        &mut self,
        qp: Qp,
        wr_id: WrId,
        wr: &WorkRequest<'_>,
        flags: OpFlags,
    ) -> Result<(), PostError>;
    /// Posts `wrs` on `qp` in order, with the ids and flags `how` gives each: the same
    /// effects and the same refusal as calls of [`Endpoint::post`] one by one. A backend
    /// may check what the requests share (the connection, room in its send queue) once
    /// for the whole batch.
    fn post_batch(
        &mut self,
        qp: Qp,
        wrs: &[WorkRequest<'_>],
        how: BatchPost,
    ) -> Result<(), BatchRefused> {
        post_each(self, qp, wrs, how)
    }
    /// Hands every request still queued behind `MORE` to the NIC (one doorbell per queue
    /// pair). Needed only when a batch cannot be closed by a final post, e.g. because
    /// that post was refused.
    fn ring_doorbells(&mut self);
    /// Moves up to `out.len()` completions into `out`; returns how many.
    fn poll_cq(&mut self, out: &mut [Completion]) -> usize;
    /// Sends one datagram to worker `to` (`MORE` batches doorbells as for `post`).
    /// Datagrams may be lost, duplicated or reordered; delivery is not acknowledged.
    fn send(&mut self, to: WorkerId, payload: &[u8], flags: OpFlags) -> Result<(), PostError>;
    /// Copies the next received datagram into `buf` (at least `caps().mtu` long) and
    /// returns its sender and length, or `None` if nothing has arrived.
    fn recv(&mut self, buf: &mut [u8]) -> Option<(WorkerId, usize)>;

    /// Fences `node` off this node: from now on this node's NIC refuses every one-sided
    /// request of `node`'s workers (they complete `Unreachable`) and drops their
    /// datagrams, as closing every connection with a node does; a request of `node`
    /// already under way either lands before the call returns or not at all. Returns
    /// whether the fabric can: one that cannot (UCX, whose remote accesses are served by
    /// the target's software or, on shared memory, made by the other process itself)
    /// leaves it to the fenced node to stop itself when its lease runs out. Either way,
    /// requests of this node to `node` may from now on complete `Unreachable`, those in
    /// flight included: a fabric that never learns of a dead peer (UCX shared memory)
    /// fails them here, or they would never complete. `node` is never the caller's own
    /// node.
    fn fence(&mut self, node: NodeId) -> bool {
        let _ = node;
        false
    }

    /// Lets `node` in again after [`Endpoint::fence`], or after one of the two restarted
    /// (a restart leaves a node with no connections): once both sides admitted each
    /// other, one-sided requests go between them again, over new connections; until then
    /// they fail both ways, while datagrams pass. Returns whether the fabric can; only the
    /// simulator, the one backend that restarts nodes, does. `node` is never the caller's
    /// own node.
    fn admit(&mut self, node: NodeId) -> bool {
        let _ = node;
        false
    }

    /// Which life of its node this worker belongs to: 0 from the start of the run, one
    /// more after each restart of the node (`NodeFaultKind::Restart`, simulator only).
    fn incarnation(&self) -> u32 {
        0
    }

    /// Crashes this worker's node now, as a fault injector would at a chosen point of a
    /// protocol: its CPUs and NIC stop; nothing its workers post, send or ring from now on
    /// takes effect and they learn of nothing more (requests whose doorbell rang are in
    /// flight and may land); they are not stepped again. Ring what must be out first.
    /// Returns whether the backend can: the simulator (where the same seed then crashes at
    /// the same point) and threads (where the node's other workers may finish the step
    /// they are in, but nothing they post, send or ring after the crash takes effect).
    fn crash_here(&mut self) -> bool {
        false
    }

    /// Verb programs: rings the doorbell of work queue `wq` of this node after the host
    /// wrote entries and advanced the queue's doorbell record (see [`crate::wq`]).
    /// Backends without a NIC model refuse with [`PostError::Unsupported`].
    fn wq_doorbell(&mut self, wq: WqId) -> Result<(), PostError> {
        let _ = wq;
        Err(PostError::Unsupported)
    }

    /// Verb programs: the counters of work queue `wq` of this node, as the host sees them
    /// (completions reach host memory a little after the NIC counts them).
    fn wq_counters(&self, wq: WqId) -> Option<WqCounters> {
        let _ = wq;
        None
    }

    /// Verb programs: sends `payload` (a multiple of 8 bytes, at most the MTU) on a
    /// reliable connection to work queue `wq` of `node`, whose next posted RECV scatters
    /// it into memory. A message that finds no RECV is dropped and counted.
    fn trigger(&mut self, node: NodeId, wq: WqId, payload: &[u8]) -> Result<(), PostError> {
        let _ = (node, wq, payload);
        Err(PostError::Unsupported)
    }
}

/// [`Endpoint::post_batch`] one request at a time: what every backend does unless it has
/// something shared to check once.
pub(crate) fn post_each<E: Endpoint + ?Sized>(
    ep: &mut E,
    qp: Qp,
    wrs: &[WorkRequest<'_>],
    how: BatchPost,
) -> Result<(), BatchRefused> {
    for (i, wr) in wrs.iter().enumerate() {
        let (wr_id, flags) = how.of(i, wrs.len());
        ep.post(qp, wr_id, wr, flags).map_err(|error| BatchRefused { posted: i, error })?;
    }
    Ok(())
}

/// What a worker runs: the backend calls `step` whenever the worker may make progress.
pub trait Program {
    /// Does a bounded amount of work (poll, handle, resume) and says what comes next.
    fn step(&mut self) -> Step;
    /// Whether this worker has nothing more to initiate. A done worker keeps being
    /// stepped (it still serves its peers) until every worker in the cluster is done.
    fn is_done(&self) -> bool;
}

/// Result of one [`Program::step`].
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Step {
    /// More work is ready now; step again as soon as possible.
    Busy,
    /// Nothing to do until a completion or datagram arrives, or until `wake_at_ns`.
    Idle {
        /// A time at which the program wants to be stepped even if nothing arrives.
        wake_at_ns: Option<u64>,
        /// Whether this step did work before it ran out (took a completion or datagram,
        /// resumed a coroutine). Real-time backends give their core away only after a
        /// run of steps that did none: a worker whose requests complete within its own
        /// post calls (UCX shared memory) ends every step idle yet never waits.
        progressed: bool,
    },
}

/// A region to register on a node.
#[derive(Copy, Clone, Debug)]
pub struct RegionSpec {
    /// Size in bytes, a multiple of 8.
    pub len_bytes: u64,
    /// A worker of the node that polls this region for incoming WRITEs (a mailbox or log
    /// ring). The simulator steps that worker when a remote WRITE or atomic lands here;
    /// real backends ignore it, since their workers poll continuously.
    pub watcher: Option<u16>,
    /// How the region's memory is backed.
    pub pages: Pages,
}

impl RegionSpec {
    /// A region of `len_bytes` that nobody watches, on huge pages where they pay.
    pub const fn new(len_bytes: u64) -> Self {
        RegionSpec { len_bytes, watcher: None, pages: Pages::Huge }
    }

    /// The same region, backed by `pages`.
    pub const fn with_pages(self, pages: Pages) -> Self {
        RegionSpec { pages, ..self }
    }
}

/// Pages behind a region's memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Pages {
    /// Huge pages where the host has them and the region is large: for memory touched
    /// nearly everywhere and read at random (a TLB miss per access otherwise).
    Huge,
    /// Base pages only: for memory that stays sparse, where each touched spot would
    /// otherwise cost (and zero) a whole huge page.
    Base,
}

/// When a run stops.
#[derive(Copy, Clone, Debug)]
pub struct RunLimits {
    /// Stop once `now_ns` passes this (virtual in the simulator, wall time elsewhere),
    /// even if programs are not done.
    pub time_limit_ns: u64,
}

/// What a run reports besides the programs' own results.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// Time the run covered, in the backend's clock (virtual for the simulator).
    pub elapsed_ns: u64,
    /// Wall-clock duration of the run.
    pub wall_ns: u64,
    /// Whether every program reported done before the time limit.
    pub all_done: bool,
    /// Simulator only: events processed (request arrivals at targets, datagram arrivals,
    /// worker steps, faults).
    pub events: u64,
    /// Simulator only: one-sided requests executed plus datagrams sent.
    pub verbs: u64,
    /// Simulator only: hash of the event trace (equal for equal seeds and configs).
    pub trace_hash: u64,
    /// Datagrams dropped by the fabric (faults or full receive queues).
    pub datagrams_dropped: u64,
    /// Nodes that crashed during the run (their programs were stopped where they were).
    pub crashed: Vec<NodeId>,
    /// UCX with event waiting only: how often a thread slept on its workers' event fds,
    /// and how many of those sleeps an event ended (the others ran out their bound).
    pub event_sleeps: u64,
    /// See [`RunStats::event_sleeps`].
    pub event_wakeups: u64,
}

/// Errors of setting up or running a cluster.
#[derive(Debug, Error)]
pub enum BackendError {
    /// The cluster shape is not allowed.
    #[error("invalid cluster: {0}")]
    InvalidShape(String),
    /// A region could not be registered.
    #[error("cannot register a region of {len_bytes} bytes on {node}: {reason}")]
    Register {
        /// Node.
        node: NodeId,
        /// Requested size.
        len_bytes: u64,
        /// Why.
        reason: String,
    },
    /// A worker thread panicked; the message is the panic's.
    #[error("worker {worker} panicked: {message}")]
    WorkerPanicked {
        /// Which worker.
        worker: WorkerId,
        /// Panic payload, if it was a string.
        message: String,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The processes of a cluster could not meet, or one of them vanished.
    #[error("cluster: {0}")]
    Cluster(String),
}

/// A whole cluster on one backend: register memory, then run one program per worker.
pub trait Backend {
    /// The endpoint type handed to programs.
    type Ep: Endpoint + 'static;

    /// Size of the cluster.
    fn shape(&self) -> ClusterShape;

    /// Registers a region on `node`. Keys are dense per node in registration order.
    fn register(&mut self, node: NodeId, spec: RegionSpec) -> Result<Rkey, BackendError>;

    /// Registers the same region on every node; returns the key (equal on all nodes).
    fn register_all(&mut self, spec: RegionSpec) -> Result<Rkey, BackendError> {
        let mut key = None;
        for n in 0..self.shape().nodes {
            let k = self.register(NodeId(n), spec)?;
            assert!(key.is_none_or(|prev| prev == k), "nodes disagree on region keys");
            key = Some(k);
        }
        key.ok_or_else(|| BackendError::InvalidShape("cluster has no nodes".into()))
    }

    /// A region of a node, for setup-time initialisation and post-run inspection. For a
    /// node this process does not host, a shadow of the right size that the data path
    /// never touches.
    fn region(&self, node: NodeId, rkey: Rkey) -> Option<Region>;

    /// Creates a work queue for verb programs on `node` (before the run). Only backends
    /// that model a NIC support it.
    fn create_wq(&mut self, node: NodeId, spec: WqSpec) -> Result<WqId, BackendError> {
        let _ = (node, spec);
        Err(BackendError::Config(
            "verb programs need a backend that runs them (sim with the cx5 profile, or local)"
                .into(),
        ))
    }

    /// Counters of a work queue, for inspection after the run.
    fn wq_counters(&self, node: NodeId, wq: WqId) -> Option<WqCounters> {
        let _ = (node, wq);
        None
    }

    /// Whether the cluster's clocks are virtual (the simulator): no host pauses a worker
    /// there, so timeouts such as leases can be as short as the modelled hardware allows.
    fn virtual_time(&self) -> bool {
        false
    }

    /// Whether `node` lives in this process (always, except for a UCX cluster spread
    /// over processes). Setup and checks touch the memory of hosted nodes only.
    fn hosts(&self, node: NodeId) -> bool {
        let _ = node;
        true
    }

    /// Moves a blob from every process to the first one: it gets all of them in process
    /// order, the others get `None`. Within one process: `Some(vec![mine])`.
    fn gather(&mut self, mine: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, BackendError> {
        Ok(Some(vec![mine]))
    }

    /// Builds one program per worker with `make` (on the thread that will run it), runs
    /// them until all are done or the time limit passes, and returns `finish` of each
    /// program in worker-index order (of the hosted nodes' workers only). A node that
    /// restarts (simulator only) gets new programs from `make`, whose endpoints give
    /// their incarnation; the programs of its earlier lives are finished too, after all
    /// the others, in the order they were replaced.
    fn run<P, R, F, G>(
        &mut self,
        make: F,
        finish: G,
        limits: RunLimits,
    ) -> Result<(Vec<R>, RunStats), BackendError>
    where
        P: Program,
        R: Send,
        F: Fn(Self::Ep) -> P + Sync,
        G: Fn(P) -> R + Sync;
}

/// Checks the limits every backend shares (a command checks them before any work).
pub fn validate_shape(shape: ClusterShape) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::InvalidShape(m));
    if shape.nodes == 0 || shape.nodes > NODES_MAX {
        return bad(format!("{} nodes (1..={NODES_MAX})", shape.nodes));
    }
    if shape.workers_per_node == 0 || shape.workers_per_node > WORKERS_PER_NODE_MAX {
        return bad(format!(
            "{} workers per node (1..={WORKERS_PER_NODE_MAX})",
            shape.workers_per_node
        ));
    }
    if shape.lanes_per_peer == 0 || shape.lanes_per_peer > LANES_MAX {
        return bad(format!("{} connections per peer (1..={LANES_MAX})", shape.lanes_per_peer));
    }
    Ok(())
}
