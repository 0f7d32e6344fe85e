//! `local`: every node as a group of workers in this process, in real time.
//!
//! Workers are spread over a few OS threads (by default one per core); each thread steps
//! its workers round robin, so a cluster of many workers runs on two cores without a
//! spinning thread waiting for a descheduled peer. One-sided requests are executed by the
//! posting thread on the target's memory (see `endpoint.rs`); real parallelism, real
//! races. NIC atomics are CPU atomics here, hence coherent with them. Verb programs run
//! on a NIC thread of their own while the workers run (see `nic.rs`).
//!
//! Node faults ([`LocalConfig::node_faults`]) follow the run's clock, and a worker may
//! crash its node from inside ([`crate::Endpoint::crash_here`]): a crashed node's
//! workers are no longer stepped, requests to it complete `Unreachable`, and nothing it
//! posts or sends takes effect any more (it counts as done); a paused node's workers
//! are not stepped while the pause lasts, but its memory stays reachable. Fencing a
//! node off ([`crate::Endpoint::fence`]) is real here: see `Shared::fence`.

mod endpoint;
mod nic;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

pub use self::endpoint::LocalEndpoint;
use self::endpoint::{Msg, SmallMsg};
use self::nic::LocalNic;
use crate::constants::{DATAGRAM_MTU, INLINE_MAX, RECV_DEPTH, SQ_DEPTH};
use crate::endpoint::{
    Backend, BackendError, Caps, Program, RegionSpec, RunLimits, RunStats, Step,
};
use crate::exec::check_region;
use crate::ids::{ClusterShape, NodeId, Rkey, WorkerId};
use crate::memory::Region;
use crate::node_fault::{NodeFault, NodeFaultKind};
use crate::stepper::Stepper;
use crate::validate_shape;
use crate::wq::{WqCounters, WqId, WqSpec};

/// Buffers for datagrams larger than 120 bytes each worker owns by default (4 KiB each).
/// A sender with every buffer in flight gets `QueueFull` until receivers hand some back;
/// smaller datagrams travel by value and need none.
pub const SEND_BUFFERS: usize = 256;

/// Configuration of a threaded cluster.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// Cluster size.
    pub shape: ClusterShape,
    /// OS threads to run the workers on; `None`: one per available core, at most one
    /// per worker.
    pub threads: Option<usize>,
    /// Datagram buffers per worker.
    pub send_buffers: usize,
    /// Nodes to crash or pause, at times of the run's clock.
    pub node_faults: Vec<NodeFault>,
}

impl LocalConfig {
    /// Defaults for `shape`.
    pub fn new(shape: ClusterShape) -> Self {
        LocalConfig { shape, threads: None, send_buffers: SEND_BUFFERS, node_faults: Vec::new() }
    }

    /// Threads this configuration will use.
    pub fn thread_count(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.threads.unwrap_or(cores).clamp(1, self.shape.workers_total())
    }
}

/// State every thread of a run shares.
pub(crate) struct Shared {
    pub(crate) shape: ClusterShape,
    pub(crate) caps: Caps,
    pub(crate) regions: Vec<Vec<Region>>,
    pub(crate) small_inboxes: Vec<ArrayQueue<SmallMsg>>,
    pub(crate) inboxes: Vec<ArrayQueue<Box<Msg>>>,
    pub(crate) pools: Vec<ArrayQueue<Box<Msg>>>,
    pub(crate) start: Instant,
    pub(crate) dropped: AtomicU64,
    pub(crate) nic: Arc<LocalNic>,
    /// Per node, when it crashes (`u64::MAX`: never): set from the faults before the run,
    /// or lowered to the moment a node crashes itself ([`Shared::crash_now`]).
    pub(crate) crash_at: Vec<AtomicU64>,
    /// Whether any node crashes in this run: set before it from the faults, or when a node
    /// first crashes itself. Until then nothing looks crashes up.
    pub(crate) crashes: AtomicBool,
    /// Per node, the windows `[from, until)` in which its workers are not stepped.
    pauses: Vec<Vec<(u64, u64)>>,
    /// `fenced[target * nodes + source]`: `target` refuses everything of `source`.
    fenced: Vec<AtomicBool>,
    /// Per worker, how many times its step began or ended: odd while it steps. A fence
    /// waits out the steps of the fenced node that were under way when it was raised.
    steps: Vec<StepMark>,
    done: AtomicUsize,
    abort: AtomicBool,
}

impl Shared {
    /// Whether `node` has crashed by now (read from the clock only if it ever will).
    pub(crate) fn crashed(&self, node: NodeId) -> bool {
        // Sequentially consistent against `crash_now`: a worker of the crashing node that
        // reads "not crashed" acts before the crash, one that reads "crashed" after it.
        let at = self.crash_at[usize::from(node.0)].load(Ordering::SeqCst);
        at != u64::MAX && self.now_ns() >= at
    }

    /// Whether any node crashes in this run (so far, for crashes from inside).
    pub(crate) fn crashes(&self) -> bool {
        self.crashes.load(Ordering::SeqCst)
    }

    /// Crashes `node` now, from inside (a crash point of the protocol): from this store on
    /// nothing its workers post or send takes effect, requests to it fail, and each of its
    /// workers is halted at its thread's next round.
    pub(crate) fn crash_now(&self, node: NodeId) {
        let now = self.now_ns();
        self.crash_at[usize::from(node.0)].fetch_min(now, Ordering::SeqCst);
        self.crashes.store(true, Ordering::SeqCst);
    }

    /// Nanoseconds since the run started: the clock of every endpoint and fault.
    pub(crate) fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// What `node` is at `now`: a crash is for good, a pause for its window.
    fn state(&self, node: NodeId, now: u64) -> NodeState {
        let n = usize::from(node.0);
        if now >= self.crash_at[n].load(Ordering::SeqCst) {
            NodeState::Crashed
        } else if self.pauses[n].iter().any(|&(from, until)| (from..until).contains(&now)) {
            NodeState::Paused
        } else {
            NodeState::Up
        }
    }

    fn has_faults(&self) -> bool {
        self.crashes() || self.pauses.iter().any(|p| !p.is_empty())
    }

    /// Whether `target` fenced `source` off. Sequentially consistent, against the store
    /// of [`Shared::fence`]: a step that misses the fence began before the fencer looked
    /// at it (see [`Shared::fence`]).
    pub(crate) fn is_fenced(&self, target: NodeId, source: NodeId) -> bool {
        let nodes = usize::from(self.shape.nodes);
        self.fenced[usize::from(target.0) * nodes + usize::from(source.0)].load(Ordering::SeqCst)
    }

    /// Fences `source` off `target`, and returns once nothing `source` does can reach
    /// `target` any more. The flag alone does not do that: a worker of `source` that
    /// checked it just before may be about to copy into `target`'s memory (preempted
    /// between the two, for as long as the OS likes). So the fence also waits for every
    /// step of `source`'s workers that was under way when the flag went up. A worker
    /// marks its step (sequentially consistent) before it checks the flag, and the fencer
    /// raises the flag before it reads the marks: either the worker sees the flag, or the
    /// fencer sees the step and waits for its end (the store-buffer argument of
    /// Dekker's algorithm). The caller's own step is never waited for: a node is never
    /// fenced off itself, and only steps of `source` are.
    pub(crate) fn fence(&self, target: NodeId, source: NodeId) {
        assert_ne!(target, source, "a node fences others off, never itself");
        let nodes = usize::from(self.shape.nodes);
        self.fenced[usize::from(target.0) * nodes + usize::from(source.0)]
            .store(true, Ordering::SeqCst);
        let workers = usize::from(self.shape.workers_per_node);
        for index in 0..workers {
            let w = self.shape.worker_index(WorkerId { node: source, index: index as u16 });
            let seen = self.steps[w].0.load(Ordering::SeqCst);
            if seen % 2 == 0 {
                continue;
            }
            let since = Instant::now();
            while self.steps[w].0.load(Ordering::Acquire) == seen {
                assert!(
                    since.elapsed() < FENCE_WAIT_LIMIT,
                    "worker {index} of node {} stayed in one step for {FENCE_WAIT_LIMIT:?} \
                     while node {} fenced it off",
                    source.0,
                    target.0
                );
                std::thread::yield_now();
            }
        }
    }
}

/// The longest a fence waits for a step of the fenced node to end. A step does a bounded
/// amount of work; only a thread the OS keeps off its core for this long, or a bug, would
/// reach it.
const FENCE_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// A worker's step count, alone on its cache line: every step writes it, and its
/// neighbours belong to workers on other threads.
#[repr(align(128))]
pub(crate) struct StepMark(AtomicU64);

/// A program whose steps are marked in [`Shared::steps`], for [`Shared::fence`].
struct Marked<'a, P> {
    program: P,
    mark: &'a AtomicU64,
    count: u64,
}

impl<P: Program> Program for Marked<'_, P> {
    fn step(&mut self) -> Step {
        // Sequentially consistent: the mark must be visible before any fence flag is read
        // in the step (the one store of a step that costs a barrier).
        self.count += 1;
        self.mark.store(self.count, Ordering::SeqCst);
        let step = self.program.step();
        self.count += 1;
        self.mark.store(self.count, Ordering::Release);
        step
    }

    fn is_done(&self) -> bool {
        self.program.is_done()
    }
}

/// What a node is doing at some time of a run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum NodeState {
    Up,
    Paused,
    Crashed,
}

/// A threaded cluster: register regions, then [`Backend::run`] programs on it.
pub struct LocalCluster {
    config: LocalConfig,
    regions: Vec<Vec<Region>>,
    nic: Arc<LocalNic>,
}

impl LocalCluster {
    /// A cluster with no regions yet.
    pub fn new(config: LocalConfig) -> Result<LocalCluster, BackendError> {
        validate_shape(config.shape)?;
        if config.send_buffers == 0 {
            return Err(BackendError::Config("send_buffers must be positive".into()));
        }
        for f in &config.node_faults {
            if f.node.0 >= config.shape.nodes {
                return Err(BackendError::Config(format!(
                    "a fault on node {} of a cluster of {} nodes",
                    f.node.0, config.shape.nodes
                )));
            }
            if f.kind == (NodeFaultKind::Pause { for_ns: 0 }) {
                return Err(BackendError::Config(format!("a pause of node {} for 0 ns", f.node.0)));
            }
            if f.kind == NodeFaultKind::Restart {
                return Err(BackendError::Config(format!(
                    "a restart of node {}: only the simulator restarts nodes (threads cannot wipe a node's memory under the others)",
                    f.node.0
                )));
            }
        }
        let regions = vec![Vec::new(); usize::from(config.shape.nodes)];
        let nic = Arc::new(LocalNic::new(config.shape.nodes));
        Ok(LocalCluster { config, regions, nic })
    }

    /// The configuration.
    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    fn shared(&self) -> Arc<Shared> {
        let workers = self.config.shape.workers_total();
        let nodes = usize::from(self.config.shape.nodes);
        let mut crash_at = vec![u64::MAX; nodes];
        let mut pauses = vec![Vec::new(); nodes];
        for f in &self.config.node_faults {
            let n = usize::from(f.node.0);
            match f.kind {
                NodeFaultKind::Crash => crash_at[n] = crash_at[n].min(f.at_ns),
                NodeFaultKind::Pause { for_ns } => {
                    pauses[n].push((f.at_ns, f.at_ns.saturating_add(for_ns)));
                }
                NodeFaultKind::Restart => unreachable!("refused by LocalCluster::new"),
            }
        }
        let pools = (0..workers)
            .map(|w| {
                let pool = ArrayQueue::new(self.config.send_buffers);
                for _ in 0..self.config.send_buffers {
                    let msg = Box::new(Msg { from: w as u32, len: 0, data: [0; DATAGRAM_MTU] });
                    pool.push(msg).ok().expect("pool sized for its buffers");
                }
                pool
            })
            .collect();
        Arc::new(Shared {
            shape: self.config.shape,
            caps: Caps {
                mtu: DATAGRAM_MTU,
                inline_max: INLINE_MAX,
                sq_depth: SQ_DEPTH,
                atomics_coherent: true,
                one_sided_bypasses_target: true,
            },
            regions: self.regions.clone(),
            small_inboxes: (0..workers).map(|_| ArrayQueue::new(RECV_DEPTH)).collect(),
            inboxes: (0..workers).map(|_| ArrayQueue::new(RECV_DEPTH)).collect(),
            pools,
            start: Instant::now(),
            dropped: AtomicU64::new(0),
            nic: self.nic.clone(),
            crashes: AtomicBool::new(crash_at.iter().any(|&t| t != u64::MAX)),
            crash_at: crash_at.into_iter().map(AtomicU64::new).collect(),
            pauses,
            fenced: (0..nodes * nodes).map(|_| AtomicBool::new(false)).collect(),
            steps: (0..workers).map(|_| StepMark(AtomicU64::new(0))).collect(),
            done: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
        })
    }
}

impl Backend for LocalCluster {
    type Ep = LocalEndpoint;

    fn shape(&self) -> ClusterShape {
        self.config.shape
    }

    fn register(&mut self, node: NodeId, spec: RegionSpec) -> Result<Rkey, BackendError> {
        check_region(&self.config.shape, node, spec)?;
        let list = &mut self.regions[usize::from(node.0)];
        list.push(Region::zeroed_on(spec.len_bytes, spec.pages));
        Ok(Rkey(u32::try_from(list.len() - 1).expect("region count fits u32")))
    }

    fn region(&self, node: NodeId, rkey: Rkey) -> Option<Region> {
        self.regions.get(usize::from(node.0))?.get(rkey.0 as usize).cloned()
    }

    fn create_wq(&mut self, node: NodeId, spec: WqSpec) -> Result<WqId, BackendError> {
        let regions = self.regions.get(usize::from(node.0)).map_or(&[][..], |r| &r[..]);
        self.nic
            .create_wq(self.config.shape, node, spec, regions)
            .map_err(|e| BackendError::Config(format!("work queue on node {}: {e}", node.0)))
    }

    fn wq_counters(&self, node: NodeId, wq: WqId) -> Option<WqCounters> {
        self.nic.counters(node, wq)
    }

    fn run<P, R, F, G>(
        &mut self,
        make: F,
        finish: G,
        limits: RunLimits,
    ) -> Result<(Vec<R>, RunStats), BackendError>
    where
        P: Program,
        R: Send,
        F: Fn(LocalEndpoint) -> P + Sync,
        G: Fn(P) -> R + Sync,
    {
        let shared = self.shared();
        let threads = self.config.thread_count();
        let total = self.config.shape.workers_total();
        let outputs: Vec<Result<Vec<(usize, R)>, BackendError>> = std::thread::scope(|s| {
            if shared.nic.has_queues() {
                shared.nic.arm();
                let shared = shared.clone();
                s.spawn(move || shared.nic.serve(&shared.regions));
            }
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (shared, make, finish) = (shared.clone(), &make, &finish);
                    s.spawn(move || {
                        let mine: Vec<usize> = (t..total).step_by(threads).collect();
                        let result = catch_unwind(AssertUnwindSafe(|| {
                            run_thread(&shared, &mine, make, finish, limits)
                        }));
                        result.map_err(|payload| {
                            shared.abort.store(true, Ordering::Relaxed);
                            BackendError::WorkerPanicked {
                                worker: shared.shape.worker_at(mine[0]),
                                message: panic_message(&payload),
                            }
                        })
                    })
                })
                .collect();
            let outputs =
                handles.into_iter().map(|h| h.join().expect("thread result is caught")).collect();
            shared.nic.stop();
            outputs
        });
        let mut results: Vec<Option<R>> = (0..total).map(|_| None).collect();
        for out in outputs {
            for (w, r) in out? {
                results[w] = Some(r);
            }
        }
        let elapsed_ns = shared.now_ns();
        let stats = RunStats {
            elapsed_ns,
            wall_ns: elapsed_ns,
            all_done: shared.done.load(Ordering::Relaxed) == total,
            events: 0,
            verbs: 0,
            trace_hash: 0,
            datagrams_dropped: shared.dropped.load(Ordering::Relaxed),
            crashed: (0..self.config.shape.nodes)
                .map(NodeId)
                .filter(|n| shared.crash_at[usize::from(n.0)].load(Ordering::SeqCst) <= elapsed_ns)
                .collect(),
            event_sleeps: 0,
            event_wakeups: 0,
        };
        Ok((results.into_iter().map(|r| r.expect("every worker ran")).collect(), stats))
    }
}

pub(crate) fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

/// The event loop of one OS thread: step each of its workers in turn until every worker
/// of the cluster is done, the time limit passes, or another thread panicked.
fn run_thread<P, R, F, G>(
    shared: &Arc<Shared>,
    mine: &[usize],
    make: &F,
    finish: &G,
    limits: RunLimits,
) -> Vec<(usize, R)>
where
    P: Program,
    F: Fn(LocalEndpoint) -> P,
    G: Fn(P) -> R,
{
    let total = shared.shape.workers_total();
    let mut programs: Vec<Marked<'_, P>> = mine
        .iter()
        .map(|&w| Marked {
            program: make(LocalEndpoint::new(shared.clone(), shared.shape.worker_at(w))),
            mark: &shared.steps[w].0,
            count: 0,
        })
        .collect();
    let mut stepper = Stepper::new(programs.len());
    let mut faults = shared.has_faults();
    loop {
        // A node that crashes itself turns the checks on for the rest of the run.
        faults = faults || shared.crashes();
        if faults {
            apply_faults(shared, mine, &mut stepper);
        }
        if stepper.round(&mut programs, &shared.done, |_| {}, |_| std::thread::yield_now()) {
            let elapsed = shared.now_ns();
            if shared.done.load(Ordering::Acquire) == total
                || elapsed > limits.time_limit_ns
                || shared.abort.load(Ordering::Relaxed)
            {
                break;
            }
        }
    }
    mine.iter().copied().zip(programs.into_iter().map(|m| finish(m.program))).collect()
}

/// Holds the workers of this thread whose node is paused now, and halts for good those
/// whose node crashed (they count as done from then on).
fn apply_faults(shared: &Shared, mine: &[usize], stepper: &mut Stepper) {
    let now = shared.now_ns();
    for (i, &w) in mine.iter().enumerate() {
        match shared.state(shared.shape.worker_at(w).node, now) {
            NodeState::Up => stepper.hold(i, false),
            NodeState::Paused => stepper.hold(i, true),
            NodeState::Crashed => stepper.halt(i, &shared.done),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_waits_for_the_step_under_way_on_the_fenced_node() {
        let shape = ClusterShape { nodes: 2, workers_per_node: 2, lanes_per_peer: 1 };
        let shared = LocalCluster::new(LocalConfig::new(shape)).unwrap().shared();
        let w = shape.worker_index(WorkerId { node: NodeId(1), index: 1 });
        // Worker 1 of node 1 is in a step (odd mark): it may have checked the flag just
        // before it went up, and the fence must not return before the step ends.
        shared.steps[w].0.store(1, Ordering::SeqCst);
        let returned = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                shared.fence(NodeId(0), NodeId(1));
                returned.store(true, Ordering::SeqCst);
            });
            let since = Instant::now();
            while !shared.is_fenced(NodeId(0), NodeId(1)) {
                assert!(since.elapsed() < Duration::from_secs(10), "the flag never went up");
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(20));
            assert!(!returned.load(Ordering::SeqCst), "the fence returned during the step");
            shared.steps[w].0.store(2, Ordering::Release);
        });
        assert!(returned.load(Ordering::SeqCst));
        // Only node 1 is fenced off, and only at node 0.
        assert!(!shared.is_fenced(NodeId(1), NodeId(0)));
    }
}
