//! The simulator's state and event queue: NICs, links, workers' queues and clocks.
//!
//! Time is virtual, in picoseconds, so that sub-nanosecond engine costs (7.69 ns per
//! WRITE) add up exactly. Events are ordered by (time, sequence number); the sequence
//! number is the order of scheduling, which makes every run a pure function of its seed
//! and configuration. Not for: running programs (see `cluster.rs`) or the endpoint API
//! (see `endpoint.rs`); this file holds the mechanics both of them drive.

use std::cmp::Ordering as CmpOrdering;

use crate::cpu::CpuTerm;
use crate::ids::{ClusterShape, NodeId, Qp, Rkey, WorkerId};
use crate::memory::Region;
use crate::rng::Rng;
use crate::sim::calendar::EventQueue;
use crate::sim::faults::{CrashTiming, FaultConfig, NodeFault, NodeFaultKind, CRASH_WAIT_NS};
use crate::sim::measure::ProgramCpu;
use crate::sim::nic::{BufPool, Datagram, Model, Nic, NodeState, OneSided, Queued};
use crate::sim::profile::NicProfile;
use crate::sim::qp_cache::QpCache;
use crate::sim::timeline::Timeline;
use crate::sim::trace::TraceHash;
use crate::sim::wq::{OffloadModel, SimWq, Trigger, WqEffect};
use crate::verbs::Completion;

/// Virtual time in picoseconds.
pub(crate) type Ps = u64;

/// Converts nanoseconds (possibly fractional) to picoseconds.
pub(crate) fn ps(ns: f64) -> Ps {
    assert!(ns.is_finite() && ns >= 0.0, "bad duration {ns} ns");
    (ns * 1000.0).round() as Ps
}

/// Fault-generator stream of the seed (workers and workloads use other streams).
const FAULT_STREAM: u64 = 0xFA17;

/// Something scheduled at a time; ordered by (time, sequence) only. The event queue holds
/// `Timed<u32>` (an index into the event slab) so that heap moves stay small.
pub(super) struct Timed<T> {
    pub(super) at: Ps,
    pub(super) seq: u64,
    pub(super) item: T,
}

impl<T> PartialEq for Timed<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<T> Eq for Timed<T> {}
impl<T> PartialOrd for Timed<T> {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Timed<T> {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Whether a one-sided request's answer reaches its poster.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Answer {
    /// It does: the completion reports what the target did.
    Back,
    /// A one-way cut loses it past the transport's retries: the request took effect, and
    /// its completion fails (the connection breaks).
    Lost,
    /// Its poster crashed while sending it: its first `end` bytes take effect, and
    /// nothing goes back.
    Cut {
        /// Bytes from the start of the request that reached the target.
        end: u32,
    },
}

/// When a crashed node's NIC stopped sending, and when it came back (`None`: not yet).
#[derive(Clone, Copy, Debug)]
pub(super) struct Silence {
    pub(super) from: Ps,
    pub(super) until: Option<Ps>,
}

impl Silence {
    /// Whether what left the NIC at `left` was never sent: after it stopped, before the
    /// node's next life began.
    pub(super) fn unsent(&self, left: Ps) -> bool {
        left > self.from && self.until.is_none_or(|u| left < u)
    }
}

/// What the event queue holds.
pub(crate) enum Event {
    /// A one-sided request reaches the target NIC.
    Arrive(OneSided),
    /// The next 64-byte line of a READ or WRITE takes effect at its target, `from` bytes
    /// into the transfer; after the last, its completion (due at `cqe_at`) is handed over,
    /// a failed one if its answer is lost.
    Line { op: OneSided, from: u32, cqe_at: Ps, answer: Answer },
    /// A datagram reaches the receiving NIC.
    Deliver(Datagram),
    /// A worker may run (stale if `token` no longer matches).
    Step { worker: u32, token: u32 },
    /// The `index`-th configured node fault strikes.
    NodeFault { index: usize },
    /// A crash that waited for a WRITE to tear strikes if none did (`CrashTiming`).
    CrashDue { node: NodeId },
    /// A paused node's CPUs run again.
    Resume { node: NodeId },
    /// A work queue of a verb program runs its next entry.
    WqRun { node: NodeId, wq: u32 },
    /// A data verb of a verb program reaches its target.
    WqEffect(Box<WqEffect>),
    /// A signaled entry of a verb program completes.
    WqComplete { node: NodeId, wq: u32 },
    /// A client's message reaches a work queue's RECV.
    Trigger(Trigger),
}

/// A completion waiting to become visible to its worker.
#[derive(Clone, Copy, Debug)]
pub(super) struct CqEntry {
    pub(super) cqe: Completion,
    pub(super) signaled: bool,
    pub(super) qp_slot: u32,
    pub(super) qp_seq: u64,
}

/// A received datagram waiting to become visible.
#[derive(Clone, Copy, Debug)]
pub(super) struct RxEntry {
    pub(super) from: u32,
    pub(super) buf: u32,
    pub(super) len: u32,
}

/// Per-connection state of the posting side.
#[derive(Clone, Debug, Default)]
pub(super) struct QpState {
    pub(super) posted: u64,
    pub(super) acked: u64,
    pub(super) last_arrive: Ps,
    pub(super) last_complete: Ps,
    /// Until when the connection's requests are held back at their target: behind a
    /// request the transport retransmits across a partition, or one whose lines are
    /// still taking effect. Later requests must not overtake them (R1).
    pub(super) held_until: Ps,
    /// The transport gave up on a request of this connection (a partition outlasted its
    /// retries): as an RC queue pair in the error state, the connection carries nothing
    /// more, so no request behind the lost one takes effect after it (R1).
    pub(super) broken: bool,
}

/// Entries ordered by (time, sequence), for queues whose pushes come almost in order (a
/// worker's completions and datagrams): a push scans from the back, so it is O(1) in
/// the common case, and a pop takes the front.
pub(super) struct TimeQueue<T> {
    pub(super) items: std::collections::VecDeque<Timed<T>>,
}

impl<T> TimeQueue<T> {
    pub(super) fn new() -> Self {
        TimeQueue { items: std::collections::VecDeque::new() }
    }

    pub(super) fn push(&mut self, item: Timed<T>) {
        let mut i = self.items.len();
        while i > 0 && self.items[i - 1] > item {
            i -= 1;
        }
        self.items.insert(i, item);
    }

    pub(super) fn peek_at(&self) -> Option<Ps> {
        self.items.front().map(|t| t.at)
    }

    /// The front item if it is due by `t`.
    pub(super) fn pop_due(&mut self, t: Ps) -> Option<T> {
        if self.items.front()?.at > t {
            return None;
        }
        self.items.pop_front().map(|x| x.item)
    }

    pub(super) fn len(&self) -> usize {
        self.items.len()
    }
}

/// Per-worker state the simulator keeps.
pub(super) struct WorkerState {
    /// Virtual time until which the worker's CPU is busy.
    pub(super) clock: Ps,
    /// Whether the worker is inside `Program::step` right now.
    pub(super) running: bool,
    /// Time of the pending Step event, if any.
    pub(super) step_at: Option<Ps>,
    pub(super) step_token: u32,
    pub(super) halted: bool,
    pub(super) cq: TimeQueue<CqEntry>,
    pub(super) rx: TimeQueue<RxEntry>,
    pub(super) signaled_in_flight: u32,
    pub(super) qps: Vec<QpState>,
    pub(super) batch: Vec<Queued>,
    /// When each datagram handed to the NIC leaves it (its send-queue slot frees then),
    /// oldest first.
    pub(super) ud_in_flight: std::collections::VecDeque<Ps>,
    /// Datagrams posted behind `MORE`, not yet handed to the NIC.
    pub(super) ud_queued: u32,
    /// The node's incarnation: 0, then one more per restart.
    pub(super) life: u32,
}

impl WorkerState {
    fn new(qps: usize) -> WorkerState {
        WorkerState {
            clock: 0,
            running: false,
            step_at: None,
            step_token: 0,
            halted: false,
            cq: TimeQueue::new(),
            rx: TimeQueue::new(),
            signaled_in_flight: 0,
            qps: vec![QpState::default(); qps],
            batch: Vec::new(),
            ud_in_flight: std::collections::VecDeque::new(),
            ud_queued: 0,
            life: 0,
        }
    }
}

/// How a node's NIC takes what one other node sends it.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(super) enum Link {
    /// Admitted: everything is served (one-sided requests once the other side admits
    /// back, if it restarted).
    Open,
    /// Fenced off (`Endpoint::fence`): nothing is.
    Fenced,
    /// One of the two restarted since this side admitted the other: datagrams pass,
    /// one-sided requests fail both ways (`Endpoint::admit`).
    Unconnected,
}

/// What a node fault did.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum Struck {
    /// Nothing the programs must learn of (a pause, or a fault that found nothing to do).
    Quietly,
    /// The node crashed: its workers never run again in this life.
    Crashed(NodeId),
    /// The node came back: its workers need new programs, of incarnation `life`.
    Restarted(NodeId, u32),
}

/// Counters of a simulation run.
#[derive(Clone, Debug, Default)]
pub struct SimStats {
    /// Events processed.
    pub events: u64,
    /// One-sided requests executed at their targets.
    pub one_sided: u64,
    /// Datagrams delivered into receive queues.
    pub datagrams_delivered: u64,
    /// Datagrams lost to faults, full receive queues, crashes or partitions.
    pub datagrams_dropped: u64,
    /// Datagrams duplicated by faults.
    pub datagrams_duplicated: u64,
    /// Queue-pair context lookups and misses, summed over NICs.
    pub qp_lookups: u64,
    /// Misses among them.
    pub qp_misses: u64,
    /// Requests that completed with `Status::Unreachable`.
    pub unreachable: u64,
    /// Requests the transport held back until a partition healed.
    pub held: u64,
    /// Requests and datagrams whose poster's NIC stopped before they were all sent (R7).
    /// Those of them that land nothing, and the requests behind a WRITE cut short on
    /// its connection, count as `unreachable` too.
    pub cut_short: u64,
    /// Requests refused by a protection check at the target.
    pub access_errors: u64,
    /// Work queues of verb programs stopped by a failed entry.
    pub wq_errors: u64,
}

/// The whole simulated cluster except the programs.
pub(super) struct Core {
    pub(super) now: Ps,
    pub(super) seq: u64,
    pub(super) queue: EventQueue,
    /// Events by slab index; `free` lists empty slots.
    pub(super) events: Vec<Option<Event>>,
    pub(super) free: Vec<u32>,
    /// The limit of the `pop` that took the event being processed: an event past it
    /// waits for a later loop, so nothing may run it in line now.
    pub(super) limit: Ps,
    /// Tests compare runs with every line queued against runs with lines run in line.
    #[cfg(test)]
    pub(super) queue_every_line: bool,
    pub(super) shape: ClusterShape,
    pub(super) model: Model,
    /// How the programs' own CPU work is charged (the NIC's host costs always are).
    pub(super) program_cpu: ProgramCpu,
    pub(super) nics: Vec<Nic>,
    pub(super) workers: Vec<WorkerState>,
    pub(super) regions: Vec<Vec<Region>>,
    pub(super) watchers: Vec<Vec<Option<u16>>>,
    pub(super) faults: FaultConfig,
    pub(super) fault_rng: Rng,
    pub(super) trace: TraceHash,
    pub(super) stats: SimStats,
    pub(super) inline_pool: BufPool,
    pub(super) msg_pool: BufPool,
    pub(super) spare_batch: Vec<Queued>,
    /// Work queues of verb programs, per node.
    pub(super) wqs: Vec<Vec<SimWq>>,
    /// Costs of verb programs, if the profile has them.
    pub(super) offload: Option<OffloadModel>,
    /// Where atomics of verb programs that discard the old value put it.
    pub(super) wq_scratch: Region,
    /// Per target node, how it takes what each source node sends it.
    pub(super) links: Vec<Vec<Link>>,
    /// Per node, the parts per million its clock gains on true time.
    pub(super) drift_ppm: Vec<i32>,
    /// Per node, when it last crashed.
    pub(super) crashed_at: Vec<Option<Ps>>,
    /// Per node crashed by a fault at a set time, or in the middle of a WRITE: when its
    /// NIC stopped sending, and when it restarted. What left it before lands; nothing
    /// of that life after does (R7). A node that crashes itself at a protocol point
    /// (`crash_here`) has sent what it rang a doorbell for.
    pub(super) cut_at: Vec<Option<Silence>>,
    /// Per node whose crash waits for a WRITE to tear (`CrashTiming::MidWrite`): when
    /// it strikes anyway.
    pub(super) dying: Vec<Option<Ps>>,
}

impl Core {
    pub(crate) fn new(
        shape: ClusterShape,
        profile: &NicProfile,
        faults: FaultConfig,
        seed: u64,
        program_cpu: ProgramCpu,
    ) -> Core {
        let qps_per_worker = usize::from(shape.nodes) * usize::from(shape.lanes_per_peer);
        let mut drift_ppm = vec![0; usize::from(shape.nodes)];
        for d in &faults.clock_drift {
            drift_ppm[usize::from(d.node.0)] = d.ppm;
        }
        let workers =
            (0..shape.workers_total()).map(|_| WorkerState::new(qps_per_worker)).collect();
        let nics = (0..shape.nodes)
            .map(|_| Nic {
                engine: Timeline::default(),
                atomic_unit: Timeline::default(),
                tx: Timeline::default(),
                rx: Timeline::default(),
                wq_fetch: Timeline::default(),
                qp_cache: QpCache::new(profile.qp_cache_entries, profile.qp_cache_ways),
                state: NodeState::Up,
            })
            .collect();
        Core {
            now: 0,
            seq: 0,
            queue: EventQueue::new(),
            events: Vec::new(),
            free: Vec::new(),
            limit: 0,
            #[cfg(test)]
            queue_every_line: false,
            shape,
            model: Model::new(profile),
            program_cpu,
            nics,
            workers,
            regions: vec![Vec::new(); usize::from(shape.nodes)],
            watchers: vec![Vec::new(); usize::from(shape.nodes)],
            faults,
            fault_rng: Rng::derive(seed, FAULT_STREAM),
            trace: TraceHash::new(),
            stats: SimStats::default(),
            inline_pool: BufPool::default(),
            msg_pool: BufPool::default(),
            spare_batch: Vec::new(),
            wqs: (0..shape.nodes).map(|_| Vec::new()).collect(),
            offload: profile.offload.as_ref().map(OffloadModel::new),
            wq_scratch: Region::zeroed(8),
            links: vec![vec![Link::Open; usize::from(shape.nodes)]; usize::from(shape.nodes)],
            drift_ppm,
            crashed_at: vec![None; usize::from(shape.nodes)],
            cut_at: vec![None; usize::from(shape.nodes)],
            dying: vec![None; usize::from(shape.nodes)],
        }
    }

    /// What `node`'s clock reads, in nanoseconds, at true time `at` (picoseconds).
    pub(crate) fn local_ns(&self, node: NodeId, at: Ps) -> u64 {
        let ns = at / 1000;
        match self.drift_ppm[usize::from(node.0)] {
            0 => ns,
            ppm => {
                let scaled = u128::from(ns) * (1_000_000 + ppm) as u128 / 1_000_000;
                u64::try_from(scaled).unwrap_or(u64::MAX)
            }
        }
    }

    /// The first true time (picoseconds) at which `node`'s clock reads `local_ns` or
    /// more: when a timer it set for that reading fires.
    pub(crate) fn true_ps(&self, node: NodeId, local_ns: u64) -> Ps {
        let ns = match self.drift_ppm[usize::from(node.0)] {
            0 => local_ns,
            ppm => {
                let ns = (u128::from(local_ns) * 1_000_000).div_ceil((1_000_000 + ppm) as u128);
                u64::try_from(ns).unwrap_or(u64::MAX)
            }
        };
        ns.saturating_mul(1000)
    }

    /// `target`'s NIC refuses everything from `source` from now on (what comes over the
    /// connections it has with it: none, if one of the two restarted since).
    pub(crate) fn fence(&mut self, target: NodeId, source: NodeId) {
        let (t, s) = (usize::from(target.0), usize::from(source.0));
        // Fencing closes the connections with a node. If one of the two restarted since
        // they last connected there are none (the life the fence means is gone, or its
        // new life never admitted this node), and the new life's datagrams still pass, as
        // they did before: it has yet to be taken in. Admitting a node whose new life did
        // not admit back connects nothing, so a fence then only withdraws the admission.
        self.links[t][s] = match (self.links[t][s], self.links[s][t]) {
            (Link::Open, Link::Unconnected) => Link::Unconnected,
            (Link::Open, _) => Link::Fenced,
            (link, _) => link,
        };
        self.trace.add(0xFE << 56 | u64::from(target.0) << 16 | u64::from(source.0));
    }

    /// `target`'s NIC serves `source` again (over new connections: the ones of
    /// `target`'s workers to `source` are whole again).
    pub(crate) fn admit(&mut self, target: NodeId, source: NodeId) {
        self.links[usize::from(target.0)][usize::from(source.0)] = Link::Open;
        let lanes = u32::from(self.shape.lanes_per_peer);
        let first = u32::from(source.0) * lanes;
        for w in self.node_workers(target) {
            for q in &mut self.workers[w as usize].qps[first as usize..(first + lanes) as usize] {
                q.broken = false;
            }
        }
        self.trace.add(0xAD << 56 | u64::from(target.0) << 16 | u64::from(source.0));
    }

    /// Whether `target` fenced `source` off: it takes nothing from it.
    pub(crate) fn is_fenced(&self, target: NodeId, source: NodeId) -> bool {
        self.links[usize::from(target.0)][usize::from(source.0)] == Link::Fenced
    }

    /// Whether `target` refuses `source`'s one-sided requests: fenced off, or not
    /// connected since one of them restarted (a connection needs both sides to admit the
    /// other).
    pub(crate) fn refuses_one_sided(&self, target: NodeId, source: NodeId) -> bool {
        let (t, s) = (usize::from(target.0), usize::from(source.0));
        self.links[t][s] != Link::Open || self.links[s][t] == Link::Unconnected
    }

    pub(crate) fn add_region(
        &mut self,
        node: NodeId,
        region: Region,
        watcher: Option<u16>,
    ) -> Rkey {
        let list = &mut self.regions[usize::from(node.0)];
        list.push(region);
        self.watchers[usize::from(node.0)].push(watcher);
        Rkey(u32::try_from(list.len() - 1).expect("region count fits u32"))
    }

    pub(crate) fn schedule(&mut self, at: Ps, event: Event) {
        debug_assert!(at >= self.now, "event scheduled in the past");
        self.seq += 1;
        let slot = match self.free.pop() {
            Some(i) => {
                self.events[i as usize] = Some(event);
                i
            }
            None => {
                self.events.push(Some(event));
                u32::try_from(self.events.len() - 1).expect("events in flight fit u32")
            }
        };
        self.queue.push(Timed { at, seq: self.seq, item: slot });
    }

    /// Next event, if it is not later than `limit`.
    pub(crate) fn pop(&mut self, limit: Ps) -> Option<Event> {
        if self.queue.peek_at()? > limit {
            return None;
        }
        self.limit = limit;
        let t = self.queue.pop().expect("peeked");
        self.enter_event(t.at);
        self.free.push(t.item);
        Some(self.events[t.item as usize].take().expect("scheduled event"))
    }

    /// Time moves to an event's and the event counts, as in the trace.
    fn enter_event(&mut self, at: Ps) {
        debug_assert!(at >= self.now, "time runs forward");
        self.now = at;
        self.stats.events += 1;
        self.trace.add(at);
    }

    /// Runs in line an event due at `at` that would otherwise be scheduled now, if
    /// `pop` would hand it out next: no pending event is due by `at` (one due at the
    /// same time was scheduled earlier and comes first), and `at` is within the
    /// current loop's limit. Then nothing can run between this event and that one, so
    /// running it at once, with time, event count and trace moved as `pop` moves them,
    /// is the same run; it only skips the queue. Returns whether the caller runs it.
    pub(super) fn run_next_in_line(&mut self, at: Ps) -> bool {
        #[cfg(test)]
        if self.queue_every_line {
            return false;
        }
        if at > self.limit || self.queue.any_due_by(at) {
            return false;
        }
        self.enter_event(at);
        self.queue.passed(at);
        true
    }

    pub(crate) fn trace_hash(&self) -> u64 {
        self.trace.finish()
    }

    pub(super) fn qp_slot(&self, qp: Qp) -> u32 {
        u32::from(qp.node.0) * u32::from(self.shape.lanes_per_peer) + u32::from(qp.lane)
    }

    /// Cluster-wide identity of a connection, for the QP-context caches at both ends.
    pub(super) fn qp_id(&self, src: u32, qp_slot: u32) -> u64 {
        u64::from(src) * u64::from(self.shape.nodes) * u64::from(self.shape.lanes_per_peer)
            + u64::from(qp_slot)
    }

    /// Charges host work of the fabric (posting, polling, receiving) to worker `w`.
    pub(crate) fn charge(&mut self, w: u32, cost: Ps) {
        self.workers[w as usize].clock += cost;
    }

    /// Charges `count` of the program's `term` to worker `w`: from the table, or counted
    /// into the step's mix when steps are measured.
    pub(crate) fn charge_term(&mut self, w: u32, term: CpuTerm, count: u32) {
        match &mut self.program_cpu {
            ProgramCpu::Model(table) => {
                let cost = table.ps(term) * u64::from(count);
                self.workers[w as usize].clock += cost;
            }
            ProgramCpu::Measured(m) => m.count(term, count),
        }
    }

    /// Charges `ns` of the program's CPU work to worker `w` (not when steps are measured:
    /// the work then takes its real time).
    pub(crate) fn charge_program_ns(&mut self, w: u32, ns: u64) {
        if let ProgramCpu::Model(_) = self.program_cpu {
            self.workers[w as usize].clock += ps(ns as f64);
        }
    }

    /// Wakes worker `w` at `at` (or when its CPU is free) unless it is running, halted,
    /// or already due to run earlier.
    pub(crate) fn wake(&mut self, w: u32, at: Ps) {
        let ws = &mut self.workers[w as usize];
        if ws.running || ws.halted {
            return;
        }
        let at = noticed(at, ws.clock, self.model.poll_cpu, self.model.rest);
        let at = at.max(ws.clock).max(self.now);
        if ws.step_at.is_some_and(|s| s <= at) {
            return;
        }
        ws.step_token = ws.step_token.wrapping_add(1);
        ws.step_at = Some(at);
        let token = ws.step_token;
        self.schedule(at, Event::Step { worker: w, token });
    }

    // ---- the worker's side ---------------------------------------------------------

    /// Moves completions visible at the worker's clock into `out`.
    pub(crate) fn poll_cq(&mut self, w: u32, out: &mut [Completion]) -> usize {
        let ws = &mut self.workers[w as usize];
        let mut n = 0;
        while n < out.len() {
            let Some(item) = ws.cq.pop_due(ws.clock) else { break };
            let q = &mut ws.qps[item.qp_slot as usize];
            // A completion implies every earlier request of its connection completed.
            q.acked = q.acked.max(item.qp_seq);
            if item.signaled {
                ws.signaled_in_flight -= 1;
            }
            out[n] = item.cqe;
            n += 1;
        }
        let cost = self.model.poll_cpu + n as u64 * self.model.cqe_cpu;
        self.charge(w, cost);
        n
    }

    /// Copies the next datagram visible at the worker's clock into `buf`.
    pub(crate) fn recv(&mut self, w: u32, buf: &mut [u8]) -> Option<(WorkerId, usize)> {
        let ws = &mut self.workers[w as usize];
        let Some(item) = ws.rx.pop_due(ws.clock) else {
            self.charge(w, self.model.poll_cpu);
            return None;
        };
        let len = item.len as usize;
        assert!(
            buf.len() >= len,
            "receive buffer of {} bytes for a {len}-byte datagram",
            buf.len()
        );
        buf[..len].copy_from_slice(self.msg_pool.get(item.buf));
        self.msg_pool.release(item.buf);
        let cost = self.model.recv_cpu + self.model.copy_cpu(len);
        self.charge(w, cost);
        Some((self.shape.worker_at(item.from as usize), len))
    }

    /// Earliest time something already queued becomes visible to worker `w`.
    pub(crate) fn next_visible(&self, w: u32) -> Option<Ps> {
        let ws = &self.workers[w as usize];
        let cq = ws.cq.peek_at();
        let rx = ws.rx.peek_at();
        match (cq, rx) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Marks a Step event consumed; returns false if it is stale or the worker halted.
    pub(crate) fn begin_step(&mut self, w: u32, token: u32) -> bool {
        let now = self.now;
        let ws = &mut self.workers[w as usize];
        if ws.step_token != token || ws.step_at.is_none() {
            return false;
        }
        ws.step_at = None;
        if ws.halted {
            return false;
        }
        ws.clock = ws.clock.max(now);
        ws.running = true;
        true
    }

    pub(crate) fn end_step(&mut self, w: u32) {
        let node = self.shape.worker_at(w as usize).node;
        if self.node_crashed(node) {
            // Its node crashed in this step (a WRITE it sent tore, `Core::tear`): what
            // it queued without a doorbell never reached the NIC.
            self.drop_batch(w);
        }
        assert!(
            !self.batch_open(w),
            "{} ended its step with an open doorbell batch",
            self.shape.worker_at(w as usize)
        );
        let ws = &mut self.workers[w as usize];
        ws.running = false;
        self.trace.add(u64::from(w) << 48 ^ ws.clock);
    }

    /// Forgets the requests and datagrams `w` queued behind `MORE`, with their buffers.
    fn drop_batch(&mut self, w: u32) {
        let batch = std::mem::take(&mut self.workers[w as usize].batch);
        for q in batch {
            match q {
                Queued::OneSided(op) => {
                    if let Some(i) = op.inline {
                        self.inline_pool.release(i);
                    }
                }
                Queued::Datagram(dg) => {
                    self.workers[w as usize].ud_queued -= 1;
                    self.msg_pool.release(dg.buf);
                }
            }
        }
    }

    // ---- node faults ---------------------------------------------------------------

    pub(crate) fn schedule_faults(&mut self) {
        for index in 0..self.faults.node_faults.len() {
            let at = ps(self.faults.node_faults[index].at_ns as f64);
            self.schedule(at, Event::NodeFault { index });
        }
    }

    fn node_workers(&self, node: NodeId) -> std::ops::Range<u32> {
        let per = u32::from(self.shape.workers_per_node);
        u32::from(node.0) * per..(u32::from(node.0) + 1) * per
    }

    /// Strikes the `index`-th configured node fault.
    pub(crate) fn node_fault(&mut self, index: usize) -> Struck {
        let f = self.faults.node_faults[index];
        let n = usize::from(f.node.0);
        if f.kind == NodeFaultKind::Restart {
            return self.restart(index, f.node);
        }
        if self.nics[n].state == NodeState::Crashed {
            return Struck::Quietly;
        }
        if f.kind == NodeFaultKind::Crash && self.faults.crash_timing == CrashTiming::MidWrite {
            // It waits for a WRITE to tear (`Core::tear`), and strikes anyway when the
            // wait is over.
            if self.dying[n].is_none() {
                let until = self.now + ps(CRASH_WAIT_NS as f64);
                self.dying[n] = Some(until);
                self.schedule(until, Event::CrashDue { node: f.node });
            }
            return Struck::Quietly;
        }
        self.strike(f)
    }

    /// A crash that waited for a WRITE to tear strikes now, unless one did.
    pub(crate) fn crash_due(&mut self, node: NodeId) -> Struck {
        let waited = self.dying[usize::from(node.0)].take();
        if waited.is_none() || self.node_crashed(node) {
            return Struck::Quietly;
        }
        self.strike(NodeFault { node, at_ns: 0, kind: NodeFaultKind::Crash })
    }

    /// Strikes pause or crash `f` on its node, which is not crashed.
    fn strike(&mut self, f: NodeFault) -> Struck {
        let n = usize::from(f.node.0);
        let nic = &mut self.nics[n];
        debug_assert_ne!(nic.state, NodeState::Crashed, "a crashed node is struck no more");
        self.trace.add(0xFA << 56 | u64::from(f.node.0));
        match f.kind {
            NodeFaultKind::Pause { for_ns } => {
                nic.state = NodeState::Paused;
                let until = self.now + ps(for_ns as f64);
                self.schedule(until, Event::Resume { node: f.node });
            }
            NodeFaultKind::Crash => {
                nic.state = NodeState::Crashed;
                self.crashed_at[n] = Some(self.now);
                self.cut_at[n] = Some(Silence { from: self.now, until: None });
            }
            NodeFaultKind::Restart => unreachable!("handled above"),
        }
        for w in self.node_workers(f.node) {
            self.workers[w as usize].halted = true;
        }
        match f.kind {
            NodeFaultKind::Crash => Struck::Crashed(f.node),
            _ => Struck::Quietly,
        }
    }

    /// Brings crashed `node` back (the `index`-th fault), a transport timeout after its
    /// crash at the earliest: by then every request of its old life completed, and none
    /// of theirs can touch the new one. Its memory is wiped, its NIC refuses every other
    /// node until its workers admit them, and its workers start afresh, one life on.
    fn restart(&mut self, index: usize, node: NodeId) -> Struck {
        let n = usize::from(node.0);
        if let Some(until) = self.dying[n] {
            // Its crash has yet to strike: the restart follows it.
            self.schedule(until + self.model.rc_timeout, Event::NodeFault { index });
            return Struck::Quietly;
        }
        let Some(crashed_at) = self.crashed_at[n].filter(|_| self.node_crashed(node)) else {
            self.trace.add(0xF0 << 56 | u64::from(node.0));
            return Struck::Quietly;
        };
        let earliest = crashed_at + self.model.rc_timeout;
        if self.now < earliest {
            self.schedule(earliest, Event::NodeFault { index });
            return Struck::Quietly;
        }
        self.trace.add(0xF1 << 56 | u64::from(node.0));
        for r in &self.regions[n] {
            r.wipe();
        }
        // Connections die with a life, both ways: one-sided requests find no queue pair
        // until each side admits the other. Datagrams need none: they pass both ways,
        // from the old life's fence on too (the life it fenced off is gone).
        for other in (0..self.shape.nodes).map(usize::from).filter(|&o| o != n) {
            self.links[n][other] = Link::Unconnected;
            self.links[other][n] = Link::Unconnected;
        }
        self.nics[n].state = NodeState::Up;
        // The old life's requests and datagrams still on their way stay unsent.
        if let Some(s) = &mut self.cut_at[n] {
            s.until = Some(self.now);
        }
        let life = self.workers[self.node_workers(node).start as usize].life + 1;
        let qps = usize::from(self.shape.nodes) * usize::from(self.shape.lanes_per_peer);
        for w in self.node_workers(node) {
            let old = std::mem::replace(&mut self.workers[w as usize], WorkerState::new(qps));
            for rx in old.rx.items {
                self.msg_pool.release(rx.item.buf);
            }
            let ws = &mut self.workers[w as usize];
            ws.life = life;
            // Stale Step events of the old life carry older tokens.
            ws.step_token = old.step_token.wrapping_add(1);
            ws.clock = self.now;
        }
        Struck::Restarted(node, life)
    }

    /// Wakes the workers of `node`, which just got new programs.
    pub(crate) fn start_node(&mut self, node: NodeId) {
        for w in self.node_workers(node) {
            self.wake(w, self.now);
        }
    }

    /// Crashes `node` now, from inside one of its workers' steps (`Endpoint::crash_here`).
    /// Its workers are halted; the event loop counts them done once the step ends.
    pub(crate) fn crash_here(&mut self, node: NodeId) {
        let nic = &mut self.nics[usize::from(node.0)];
        if nic.state == NodeState::Crashed {
            return;
        }
        nic.state = NodeState::Crashed;
        self.crashed_at[usize::from(node.0)] = Some(self.now);
        self.trace.add(0xFB << 56 | u64::from(node.0));
        for w in self.node_workers(node) {
            self.workers[w as usize].halted = true;
        }
    }

    /// Whether `node` has crashed.
    pub(crate) fn node_crashed(&self, node: NodeId) -> bool {
        self.nics[usize::from(node.0)].state == NodeState::Crashed
    }

    /// The nodes that crashed so far.
    pub(crate) fn crashed(&self) -> Vec<NodeId> {
        (0..self.shape.nodes)
            .map(NodeId)
            .filter(|n| self.nics[usize::from(n.0)].state == NodeState::Crashed)
            .collect()
    }

    pub(crate) fn resume(&mut self, node: NodeId) {
        let nic = &mut self.nics[usize::from(node.0)];
        if nic.state != NodeState::Paused {
            return;
        }
        nic.state = NodeState::Up;
        for w in self.node_workers(node) {
            let ws = &mut self.workers[w as usize];
            ws.halted = false;
            ws.clock = ws.clock.max(self.now);
            self.wake(w, self.now);
        }
    }
}

/// When a worker whose last step ended at `clock` notices what arrives at `at`. A worker
/// polls once more right after a step, so what arrives by then is seen at once. After
/// that, one that rests (`rest` > 0) gives its core away for `rest` at a time and polls
/// between rests: an arrival waits for the end of the rest under way, half a rest on
/// average (the mean is taken: a rest's phase against an arrival is noise on a real
/// host, and a fixed phase would lock a ping-pong into its best or worst case). One that
/// spins (`rest` = 0) sees an arrival when it happens.
fn noticed(at: Ps, clock: Ps, poll: Ps, rest: Ps) -> Ps {
    if rest == 0 || at <= clock + poll {
        return at;
    }
    at.saturating_add(rest / 2)
}

#[cfg(test)]
mod tests {
    use super::noticed;

    #[test]
    fn a_spinning_worker_sees_arrivals_when_they_happen() {
        assert_eq!(noticed(5_000, 1_000, 8_000, 0), 5_000);
        assert_eq!(noticed(900_000, 1_000, 8_000, 0), 900_000);
    }

    #[test]
    fn a_resting_worker_sees_at_once_only_what_came_by_its_poll_after_the_step() {
        // Within the poll that follows the step: seen at once.
        assert_eq!(noticed(1_000, 1_000, 8_000, 800_000), 1_000);
        assert_eq!(noticed(9_000, 1_000, 8_000, 800_000), 9_000);
        // After it: half a rest later, however long the worker had been idle.
        assert_eq!(noticed(9_001, 1_000, 8_000, 800_000), 409_001);
        assert_eq!(noticed(50_000_000, 1_000, 8_000, 800_000), 50_400_000);
    }
}
