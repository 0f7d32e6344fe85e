//! The simulator's state and event queue: NICs, links, workers' queues and clocks.
//!
//! Time is virtual, in picoseconds, so that sub-nanosecond engine costs (7.69 ns per
//! WRITE) add up exactly. Events are ordered by (time, sequence number); the sequence
//! number is the order of scheduling, which makes every run a pure function of its seed
//! and configuration. Not for: running programs (see `cluster.rs`) or the endpoint API
//! (see `endpoint.rs`); this file holds the mechanics both of them drive.

use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::BinaryHeap;

use crate::constants::{CQ_DEPTH, DATAGRAM_MTU, INLINE_MAX, RECV_DEPTH, SQ_DEPTH};
use crate::exec::{execute, validate_post, TargetOp};
use crate::ids::{ClusterShape, NodeId, Qp, Rkey, WorkerId, WrId};
use crate::memory::Region;
use crate::rng::Rng;
use crate::sim::faults::{FaultConfig, NodeFaultKind};
use crate::sim::profile::NicProfile;
use crate::sim::qp_cache::QpCache;
use crate::sim::timeline::Timeline;
use crate::sim::trace::TraceHash;
use crate::verbs::{Completion, OpFlags, OpKind, PostError, Status, WorkRequest, WriteSrc};

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
struct Timed<T> {
    at: Ps,
    seq: u64,
    item: T,
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

/// A one-sided request in flight.
#[derive(Clone, Debug)]
pub(crate) struct OneSided {
    src: u32,
    qp_slot: u32,
    qp_seq: u64,
    target: NodeId,
    kind: OpKind,
    wr_id: WrId,
    rkey: Rkey,
    offset: u64,
    local_rkey: Rkey,
    local_offset: u64,
    len: u32,
    compare: u64,
    operand: u64,
    /// Index of the payload in the inline pool, for WRITEs copied at post time.
    inline: Option<u32>,
    signaled: bool,
}

/// A datagram in flight.
#[derive(Clone, Debug)]
pub(crate) struct Datagram {
    from: u32,
    to: u32,
    buf: u32,
    len: u32,
}

/// What the event queue holds.
pub(crate) enum Event {
    /// A one-sided request reaches the target NIC.
    Arrive(OneSided),
    /// A datagram reaches the receiving NIC.
    Deliver(Datagram),
    /// A worker may run (stale if `token` no longer matches).
    Step { worker: u32, token: u32 },
    /// The `index`-th configured node fault strikes.
    NodeFault { index: usize },
    /// A paused node's CPUs run again.
    Resume { node: NodeId },
}

/// A completion waiting to become visible to its worker.
#[derive(Clone, Copy, Debug)]
struct CqEntry {
    cqe: Completion,
    signaled: bool,
    qp_slot: u32,
    qp_seq: u64,
}

/// A received datagram waiting to become visible.
#[derive(Clone, Copy, Debug)]
struct RxEntry {
    from: u32,
    buf: u32,
    len: u32,
}

/// Per-connection state of the posting side.
#[derive(Clone, Debug, Default)]
struct QpState {
    posted: u64,
    acked: u64,
    last_arrive: Ps,
    last_complete: Ps,
}

/// Entries ordered by (time, sequence), for queues whose pushes come almost in order (a
/// worker's completions and datagrams): a push scans from the back, so it is O(1) in
/// the common case, and a pop takes the front.
struct TimeQueue<T> {
    items: std::collections::VecDeque<Timed<T>>,
}

impl<T> TimeQueue<T> {
    fn new() -> Self {
        TimeQueue { items: std::collections::VecDeque::new() }
    }

    fn push(&mut self, item: Timed<T>) {
        let mut i = self.items.len();
        while i > 0 && self.items[i - 1] > item {
            i -= 1;
        }
        self.items.insert(i, item);
    }

    fn peek_at(&self) -> Option<Ps> {
        self.items.front().map(|t| t.at)
    }

    /// The front item if it is due by `t`.
    fn pop_due(&mut self, t: Ps) -> Option<T> {
        if self.items.front()?.at > t {
            return None;
        }
        self.items.pop_front().map(|x| x.item)
    }

    fn len(&self) -> usize {
        self.items.len()
    }
}

/// A request queued behind `MORE`, waiting for its queue pair's doorbell.
enum Queued {
    OneSided(OneSided),
    Datagram(Datagram),
}

/// Per-worker state the simulator keeps.
pub(crate) struct WorkerState {
    /// Virtual time until which the worker's CPU is busy.
    pub(crate) clock: Ps,
    /// Whether the worker is inside `Program::step` right now.
    pub(crate) running: bool,
    /// Time of the pending Step event, if any.
    step_at: Option<Ps>,
    step_token: u32,
    halted: bool,
    cq: TimeQueue<CqEntry>,
    rx: TimeQueue<RxEntry>,
    signaled_in_flight: u32,
    qps: Vec<QpState>,
    batch: Vec<Queued>,
}

/// Node liveness.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum NodeState {
    Up,
    Paused,
    Crashed,
}

/// One machine's NIC: its resources' timetables, context cache and liveness.
struct Nic {
    engine: Timeline,
    atomic_unit: Timeline,
    tx: Timeline,
    rx: Timeline,
    qp_cache: QpCache,
    state: NodeState,
}

/// The profile converted to picoseconds.
pub(crate) struct Model {
    req: [Ps; 5],
    resp: [Ps; 5],
    atomic_unit: Ps,
    ps_per_kib: u64,
    rc_header: u64,
    ud_header: u64,
    wire: Ps,
    doorbell_latency: Ps,
    payload_fetch: Ps,
    target_read: Ps,
    target_write: Ps,
    completion: Ps,
    qp_miss: Ps,
    qp_miss_latency: Ps,
    rc_timeout: Ps,
    pub(crate) doorbell_cpu: Ps,
    pub(crate) wqe_cpu: Ps,
    pub(crate) poll_cpu: Ps,
    pub(crate) cqe_cpu: Ps,
    pub(crate) recv_cpu: Ps,
    copy_ps_per_kib: u64,
}

fn kind_index(k: OpKind) -> usize {
    match k {
        OpKind::Read => 0,
        OpKind::Write => 1,
        OpKind::Cas => 2,
        OpKind::Faa => 3,
        OpKind::Send => 4,
    }
}

impl Model {
    fn new(p: &NicProfile) -> Model {
        let req =
            [p.req.read_ns, p.req.write_ns, p.req.atomic_ns, p.req.atomic_ns, p.req.datagram_ns];
        let resp = [
            p.resp.read_ns,
            p.resp.write_ns,
            p.resp.atomic_ns,
            p.resp.atomic_ns,
            p.resp.datagram_ns,
        ];
        Model {
            req: req.map(ps),
            resp: resp.map(ps),
            atomic_unit: ps(p.atomic_unit_ns),
            ps_per_kib: ps(1024.0 / p.link_bytes_per_ns),
            rc_header: u64::from(p.rc_header_bytes),
            ud_header: u64::from(p.ud_header_bytes),
            wire: ps(p.wire_ns),
            doorbell_latency: ps(p.doorbell_latency_ns),
            payload_fetch: ps(p.payload_fetch_ns),
            target_read: ps(p.target_read_ns),
            target_write: ps(p.target_write_ns),
            completion: ps(p.completion_ns),
            qp_miss: ps(p.qp_miss_ns),
            qp_miss_latency: ps(p.qp_miss_latency_ns),
            rc_timeout: ps(p.rc_timeout_ns),
            doorbell_cpu: ps(p.host.doorbell_ns),
            wqe_cpu: ps(p.host.wqe_ns),
            poll_cpu: ps(p.host.poll_ns),
            cqe_cpu: ps(p.host.cqe_ns),
            recv_cpu: ps(p.host.recv_ns),
            copy_ps_per_kib: ps(p.host.copy_ns_per_kib),
        }
    }

    fn wire_time(&self, bytes: u64) -> Ps {
        bytes * self.ps_per_kib / 1024
    }

    pub(crate) fn copy_cpu(&self, bytes: usize) -> Ps {
        bytes as u64 * self.copy_ps_per_kib / 1024
    }
}

/// Recycled byte buffers (inline payloads, datagrams): the pool grows to the peak number
/// in flight and then allocates no more.
#[derive(Default)]
struct BufPool {
    bufs: Vec<Vec<u8>>,
    free: Vec<u32>,
}

impl BufPool {
    fn put(&mut self, data: &[u8]) -> u32 {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.bufs.push(Vec::new());
                u32::try_from(self.bufs.len() - 1).expect("buffer pool fits u32")
            }
        };
        let b = &mut self.bufs[idx as usize];
        b.clear();
        b.extend_from_slice(data);
        idx
    }

    fn get(&self, idx: u32) -> &[u8] {
        &self.bufs[idx as usize]
    }

    fn release(&mut self, idx: u32) {
        debug_assert!(!self.free.contains(&idx), "buffer {idx} released twice");
        self.free.push(idx);
    }
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
    /// Requests refused by a protection check at the target.
    pub access_errors: u64,
}

/// The whole simulated cluster except the programs.
pub(crate) struct Core {
    pub(crate) now: Ps,
    seq: u64,
    queue: BinaryHeap<Reverse<Timed<u32>>>,
    /// Events by slab index; `free` lists empty slots.
    events: Vec<Option<Event>>,
    free: Vec<u32>,
    pub(crate) shape: ClusterShape,
    pub(crate) model: Model,
    /// Whether host costs are charged from the model (false: measured CPU time).
    pub(crate) charge_model: bool,
    nics: Vec<Nic>,
    pub(crate) workers: Vec<WorkerState>,
    pub(crate) regions: Vec<Vec<Region>>,
    watchers: Vec<Vec<Option<u16>>>,
    pub(crate) faults: FaultConfig,
    fault_rng: Rng,
    trace: TraceHash,
    pub(crate) stats: SimStats,
    inline_pool: BufPool,
    msg_pool: BufPool,
    spare_batch: Vec<Queued>,
}

impl Core {
    pub(crate) fn new(
        shape: ClusterShape,
        profile: &NicProfile,
        faults: FaultConfig,
        seed: u64,
        charge_model: bool,
    ) -> Core {
        let qps_per_worker = usize::from(shape.nodes) * usize::from(shape.lanes_per_peer);
        let workers = (0..shape.workers_total())
            .map(|_| WorkerState {
                clock: 0,
                running: false,
                step_at: None,
                step_token: 0,
                halted: false,
                cq: TimeQueue::new(),
                rx: TimeQueue::new(),
                signaled_in_flight: 0,
                qps: vec![QpState::default(); qps_per_worker],
                batch: Vec::new(),
            })
            .collect();
        let nics = (0..shape.nodes)
            .map(|_| Nic {
                engine: Timeline::default(),
                atomic_unit: Timeline::default(),
                tx: Timeline::default(),
                rx: Timeline::default(),
                qp_cache: QpCache::new(profile.qp_cache_entries, profile.qp_cache_ways),
                state: NodeState::Up,
            })
            .collect();
        Core {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            free: Vec::new(),
            shape,
            model: Model::new(profile),
            charge_model,
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
        }
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
        self.queue.push(Reverse(Timed { at, seq: self.seq, item: slot }));
    }

    /// Next event, if it is not later than `limit`.
    pub(crate) fn pop(&mut self, limit: Ps) -> Option<Event> {
        let next = self.queue.peek()?;
        if next.0.at > limit {
            return None;
        }
        let Reverse(t) = self.queue.pop().expect("peeked");
        self.now = t.at;
        self.stats.events += 1;
        self.trace.add(t.at);
        self.free.push(t.item);
        Some(self.events[t.item as usize].take().expect("scheduled event"))
    }

    pub(crate) fn trace_hash(&self) -> u64 {
        self.trace.finish()
    }

    fn qp_slot(&self, qp: Qp) -> u32 {
        u32::from(qp.node.0) * u32::from(self.shape.lanes_per_peer) + u32::from(qp.lane)
    }

    /// Cluster-wide identity of a connection, for the QP-context caches at both ends.
    fn qp_id(&self, src: u32, qp_slot: u32) -> u64 {
        u64::from(src) * u64::from(self.shape.nodes) * u64::from(self.shape.lanes_per_peer)
            + u64::from(qp_slot)
    }

    pub(crate) fn charge(&mut self, w: u32, cost: Ps) {
        if self.charge_model {
            self.workers[w as usize].clock += cost;
        }
    }

    // ---- posting -------------------------------------------------------------------

    /// Validates and queues a one-sided request; rings the doorbell unless `MORE`.
    pub(crate) fn post(
        &mut self,
        w: u32,
        qp: Qp,
        wr_id: WrId,
        wr: &WorkRequest<'_>,
        flags: OpFlags,
    ) -> Result<(), PostError> {
        let me = self.shape.worker_at(w as usize);
        let own = usize::from(me.node.0);
        validate_post(&self.shape, &self.regions[own], qp, wr, flags)?;
        let signaled = flags.has(OpFlags::SIGNALED);
        let slot = self.qp_slot(qp);
        let ws = &self.workers[w as usize];
        let q = &ws.qps[slot as usize];
        if q.posted - q.acked >= u64::from(SQ_DEPTH)
            || (signaled && ws.signaled_in_flight as usize >= CQ_DEPTH)
        {
            return Err(PostError::QueueFull);
        }
        let remote = wr.remote();
        let (mut local_rkey, mut local_offset, mut inline, mut compare, mut operand) =
            (Rkey(0), 0, None, 0, 0);
        let mut copy_cost = 0;
        match *wr {
            WorkRequest::Read { local, .. } => {
                (local_rkey, local_offset) = (local.rkey, local.offset)
            }
            WorkRequest::Write { src: WriteSrc::Local { addr, len }, .. } => {
                if flags.has(OpFlags::INLINE) {
                    let mut tmp = [0u8; INLINE_MAX];
                    let bytes = &mut tmp[..len as usize];
                    self.regions[own][addr.rkey.0 as usize].read_bytes(addr.offset, bytes);
                    inline = Some(self.inline_pool.put(bytes));
                    copy_cost = self.model.copy_cpu(len as usize);
                }
                (local_rkey, local_offset) = (addr.rkey, addr.offset);
            }
            WorkRequest::Write { src: WriteSrc::Bytes(bytes), .. } => {
                inline = Some(self.inline_pool.put(bytes));
                copy_cost = self.model.copy_cpu(bytes.len());
            }
            WorkRequest::Cas { local, compare: c, swap, .. } => {
                (local_rkey, local_offset, compare, operand) = (local.rkey, local.offset, c, swap);
            }
            WorkRequest::Faa { local, add, .. } => {
                (local_rkey, local_offset, operand) = (local.rkey, local.offset, add);
            }
        }
        let ws = &mut self.workers[w as usize];
        let q = &mut ws.qps[slot as usize];
        q.posted += 1;
        let qp_seq = q.posted;
        if signaled {
            ws.signaled_in_flight += 1;
        }
        let op = OneSided {
            src: w,
            qp_slot: slot,
            qp_seq,
            target: remote.node,
            kind: wr.kind(),
            wr_id,
            rkey: remote.rkey,
            offset: remote.offset,
            local_rkey,
            local_offset,
            len: wr.payload_len(),
            compare,
            operand,
            inline,
            signaled,
        };
        self.charge(w, self.model.wqe_cpu + copy_cost);
        if flags.has(OpFlags::MORE) {
            self.workers[w as usize].batch.push(Queued::OneSided(op));
        } else if self.workers[w as usize].batch.is_empty() {
            // No batch open: this request rings its own doorbell.
            self.charge(w, self.model.doorbell_cpu);
            let t = self.workers[w as usize].clock;
            self.launch(op, t);
        } else {
            self.workers[w as usize].batch.push(Queued::OneSided(op));
            self.ring_doorbell(w, Some(slot));
        }
        Ok(())
    }

    /// Validates and queues a datagram; rings the doorbell unless `MORE`.
    pub(crate) fn send(
        &mut self,
        w: u32,
        to: WorkerId,
        payload: &[u8],
        flags: OpFlags,
    ) -> Result<(), PostError> {
        if !self.shape.contains(to) {
            return Err(PostError::NoSuchPeer);
        }
        if payload.len() > DATAGRAM_MTU {
            return Err(PostError::TooLarge(payload.len()));
        }
        let buf = self.msg_pool.put(payload);
        let to = self.shape.worker_index(to) as u32;
        let dg = Datagram { from: w, to, buf, len: payload.len() as u32 };
        self.charge(w, self.model.wqe_cpu + self.model.copy_cpu(payload.len()));
        self.workers[w as usize].batch.push(Queued::Datagram(dg));
        if !flags.has(OpFlags::MORE) {
            self.ring_doorbell(w, None);
        }
        Ok(())
    }

    /// Hands every queued request of one queue pair (`None`: the datagram endpoint) to
    /// the NIC, in post order, behind one doorbell.
    fn ring_doorbell(&mut self, w: u32, slot: Option<u32>) {
        self.charge(w, self.model.doorbell_cpu);
        let t = self.workers[w as usize].clock;
        let spare = std::mem::take(&mut self.spare_batch);
        let mut batch = std::mem::replace(&mut self.workers[w as usize].batch, spare);
        for q in batch.drain(..) {
            match q {
                Queued::OneSided(op) if Some(op.qp_slot) == slot => self.launch(op, t),
                Queued::Datagram(dg) if slot.is_none() => self.launch_datagram(dg, t),
                other => self.workers[w as usize].batch.push(other),
            }
        }
        // Keep the emptied vector's allocation for the next doorbell.
        self.spare_batch = batch;
    }

    /// Rings the doorbell of every queue pair with queued requests, in post order.
    pub(crate) fn ring_all(&mut self, w: u32) {
        while let Some(first) = self.workers[w as usize].batch.first() {
            let slot = match first {
                Queued::OneSided(op) => Some(op.qp_slot),
                Queued::Datagram(_) => None,
            };
            self.ring_doorbell(w, slot);
        }
    }

    /// Whether a worker has requests queued behind `MORE` without a doorbell.
    pub(crate) fn batch_open(&self, w: u32) -> bool {
        !self.workers[w as usize].batch.is_empty()
    }

    /// Engine occupancy on `node` for a request of `kind` on connection `qp_id` (with a
    /// context-cache lookup), returning the time the engine is done with it.
    fn engine(&mut self, node: NodeId, at: Ps, cost: Ps, qp_id: Option<u64>) -> Ps {
        let m = &self.model;
        let nic = &mut self.nics[usize::from(node.0)];
        let (mut occupancy, mut ready) = (cost, at);
        if let Some(id) = qp_id {
            self.stats.qp_lookups += 1;
            if !nic.qp_cache.touch(id) {
                self.stats.qp_misses += 1;
                occupancy += m.qp_miss;
                ready += m.qp_miss_latency;
            }
        }
        nic.engine.book(ready, occupancy, self.now)
    }

    /// Serialises `bytes` on `node`'s transmit link from `at`; returns when the last byte
    /// has left.
    fn transmit(&mut self, node: NodeId, at: Ps, bytes: u64) -> Ps {
        let ser = self.model.wire_time(bytes);
        self.nics[usize::from(node.0)].tx.book(at, ser, self.now)
    }

    /// Accounts `bytes` arriving at `node` by `at` on its receive link (cut-through: the
    /// packet occupied the link for its serialisation time); returns when it is in.
    fn receive(&mut self, node: NodeId, at: Ps, bytes: u64) -> Ps {
        let ser = self.model.wire_time(bytes);
        let from = at.saturating_sub(ser).max(self.now);
        self.nics[usize::from(node.0)].rx.book(from, ser, self.now).max(at)
    }

    fn launch(&mut self, op: OneSided, t_post: Ps) {
        let src_node = self.shape.worker_at(op.src as usize).node;
        let k = kind_index(op.kind);
        let mut t = t_post + self.model.doorbell_latency;
        if op.kind == OpKind::Write && op.inline.is_none() {
            t += self.model.payload_fetch;
        }
        let qp_id = self.qp_id(op.src, op.qp_slot);
        let t = self.engine(src_node, t, self.model.req[k], Some(qp_id));
        let payload = match op.kind {
            OpKind::Write => u64::from(op.len),
            OpKind::Cas => 16,
            OpKind::Faa => 8,
            _ => 0,
        };
        let left = self.transmit(src_node, t, self.model.rc_header + payload);
        let q = &mut self.workers[op.src as usize].qps[op.qp_slot as usize];
        // Requests on one connection execute in post order (RC is FIFO).
        let arrive = (left + self.model.wire).max(q.last_arrive);
        q.last_arrive = arrive;
        self.schedule(arrive, Event::Arrive(op));
    }

    fn launch_datagram(&mut self, dg: Datagram, t_post: Ps) {
        let from = self.shape.worker_at(dg.from as usize).node;
        let mut t = t_post + self.model.doorbell_latency;
        if dg.len as usize > INLINE_MAX {
            t += self.model.payload_fetch;
        }
        let t = self.engine(from, t, self.model.req[kind_index(OpKind::Send)], None);
        let left = self.transmit(from, t, self.model.ud_header + u64::from(dg.len));
        let mut arrive = left + self.model.wire;
        if self.faults.datagram_faults() {
            let (f, r) = (&self.faults, &mut self.fault_rng);
            let lost = r.chance_ppm(f.loss_ppm);
            let reorder = r.chance_ppm(f.reorder_ppm).then(|| r.below(f.reorder_window_ns.max(1)));
            let delayed = r.chance_ppm(f.delay_ppm).then_some(f.delay_ns);
            let duplicate = r.chance_ppm(f.duplicate_ppm).then(|| r.below(2_000));
            if lost {
                self.stats.datagrams_dropped += 1;
                self.msg_pool.release(dg.buf);
                return;
            }
            arrive += ps(reorder.unwrap_or(0) as f64) + ps(delayed.unwrap_or(0) as f64);
            if let Some(extra_ns) = duplicate {
                let bytes = self.msg_pool.get(dg.buf).to_vec();
                let copy = Datagram { buf: self.msg_pool.put(&bytes), ..dg };
                self.stats.datagrams_duplicated += 1;
                self.schedule(arrive + ps(extra_ns as f64), Event::Deliver(copy));
            }
        }
        self.schedule(arrive, Event::Deliver(dg));
    }

    // ---- events at the target ------------------------------------------------------

    /// Wakes worker `w` at `at` (or when its CPU is free) unless it is running, halted,
    /// or already due to run earlier.
    pub(crate) fn wake(&mut self, w: u32, at: Ps) {
        let ws = &mut self.workers[w as usize];
        if ws.running || ws.halted {
            return;
        }
        let at = at.max(ws.clock).max(self.now);
        if ws.step_at.is_some_and(|s| s <= at) {
            return;
        }
        ws.step_token = ws.step_token.wrapping_add(1);
        ws.step_at = Some(at);
        let token = ws.step_token;
        self.schedule(at, Event::Step { worker: w, token });
    }

    fn push_cqe(&mut self, op: &OneSided, at: Ps, status: Status, value: u64) {
        let ws = &mut self.workers[op.src as usize];
        let q = &mut ws.qps[op.qp_slot as usize];
        // Completions of one connection appear in post order.
        let at = at.max(q.last_complete);
        q.last_complete = at;
        let entry = CqEntry {
            cqe: Completion { wr_id: op.wr_id, status, value },
            signaled: op.signaled,
            qp_slot: op.qp_slot,
            qp_seq: op.qp_seq,
        };
        self.seq += 1;
        ws.cq.push(Timed { at, seq: self.seq, item: entry });
        self.wake(op.src, at);
    }

    /// A one-sided request reaches its target: check, apply, and schedule the answer.
    pub(crate) fn arrive(&mut self, op: OneSided) {
        let src_node = self.shape.worker_at(op.src as usize).node;
        let now = self.now;
        let target = op.target;
        if self.nics[usize::from(target.0)].state == NodeState::Crashed
            || self.faults.partitioned(src_node, target, now / 1000)
        {
            self.stats.unreachable += 1;
            self.trace_op(&op, 3, 0);
            if let Some(i) = op.inline {
                self.inline_pool.release(i);
            }
            let at = now + self.model.rc_timeout;
            self.push_cqe(&op, at, Status::Unreachable, 0);
            return;
        }
        let k = kind_index(op.kind);
        let in_bytes = self.model.rc_header
            + match op.kind {
                OpKind::Write => u64::from(op.len),
                _ => 8,
            };
        let t_in = self.receive(target, now, in_bytes);
        let qp_id = self.qp_id(op.src, op.qp_slot);
        let mut t = self.engine(target, t_in, self.model.resp[k], Some(qp_id));
        let atomic = matches!(op.kind, OpKind::Cas | OpKind::Faa);
        if atomic {
            let unit = self.model.atomic_unit;
            t = self.nics[usize::from(target.0)].atomic_unit.book(t, unit, now);
        }
        t += match op.kind {
            OpKind::Write => self.model.target_write,
            _ => self.model.target_read,
        };
        let (status, value) = self.apply(&op, src_node);
        self.stats.one_sided += 1;
        if status != Status::Success {
            self.stats.access_errors += 1;
        }
        self.trace_op(&op, status_code(status), value);
        if status == Status::Success && op.kind != OpKind::Read {
            if let Some(Some(watcher)) =
                self.watchers[usize::from(target.0)].get(op.rkey.0 as usize)
            {
                let w = self.shape.worker_index(WorkerId { node: target, index: *watcher }) as u32;
                self.wake(w, t);
            }
        }
        let back_bytes = self.model.rc_header
            + match (op.kind, status) {
                (OpKind::Read, Status::Success) => u64::from(op.len),
                (OpKind::Cas | OpKind::Faa, _) => 8,
                _ => 0,
            };
        let left = self.transmit(target, t, back_bytes);
        let back = self.receive(src_node, left + self.model.wire, back_bytes);
        if op.signaled || status != Status::Success {
            self.push_cqe(&op, back + self.model.completion, status, value);
        }
    }

    fn trace_op(&mut self, op: &OneSided, status: u64, value: u64) {
        self.trace.add(
            u64::from(op.src) << 32 | u64::from(op.target.0) << 8 | kind_index(op.kind) as u64,
        );
        self.trace.add(op.wr_id);
        self.trace.add(status << 56 ^ value);
    }

    /// Applies the memory effect of a request that reached a live target.
    fn apply(&mut self, op: &OneSided, src_node: NodeId) -> (Status, u64) {
        let regions = &self.regions;
        let local = || &regions[usize::from(src_node.0)][op.local_rkey.0 as usize];
        let (offset, len) = (op.offset, u64::from(op.len));
        let target_op = match (op.kind, op.inline) {
            (OpKind::Read, _) => {
                TargetOp::Read { offset, len, dst: local(), dst_offset: op.local_offset }
            }
            (OpKind::Write, Some(i)) => {
                TargetOp::WriteBytes { offset, bytes: self.inline_pool.get(i) }
            }
            (OpKind::Write, None) => {
                TargetOp::WriteFrom { offset, len, src: local(), src_offset: op.local_offset }
            }
            (OpKind::Cas, _) => TargetOp::Cas {
                offset,
                compare: op.compare,
                swap: op.operand,
                dst: local(),
                dst_offset: op.local_offset,
            },
            (OpKind::Faa, _) => {
                TargetOp::Faa { offset, add: op.operand, dst: local(), dst_offset: op.local_offset }
            }
            (OpKind::Send, _) => unreachable!("datagrams are not one-sided"),
        };
        let target = regions[usize::from(op.target.0)].get(op.rkey.0 as usize);
        let result = execute(target, target_op);
        if let Some(i) = op.inline {
            self.inline_pool.release(i);
        }
        result
    }

    /// A datagram reaches its receiver's NIC.
    pub(crate) fn deliver(&mut self, dg: Datagram) {
        let to_node = self.shape.worker_at(dg.to as usize).node;
        let from_node = self.shape.worker_at(dg.from as usize).node;
        let now = self.now;
        self.trace.add(u64::from(dg.from) << 32 | u64::from(dg.to));
        self.trace.add(
            u64::from(dg.len)
                ^ self.msg_pool.get(dg.buf).first().copied().map_or(0, u64::from) << 32,
        );
        let ws_full = self.workers[dg.to as usize].rx.len() >= RECV_DEPTH;
        if self.nics[usize::from(to_node.0)].state == NodeState::Crashed
            || self.faults.partitioned(from_node, to_node, now / 1000)
            || ws_full
        {
            self.stats.datagrams_dropped += 1;
            self.msg_pool.release(dg.buf);
            return;
        }
        let bytes = self.model.ud_header + u64::from(dg.len);
        let t_in = self.receive(to_node, now, bytes);
        let t = self.engine(to_node, t_in, self.model.resp[kind_index(OpKind::Send)], None);
        let visible = t + self.model.target_write + self.model.completion;
        self.stats.datagrams_delivered += 1;
        self.seq += 1;
        let entry = RxEntry { from: dg.from, buf: dg.buf, len: dg.len };
        self.workers[dg.to as usize].rx.push(Timed { at: visible, seq: self.seq, item: entry });
        self.wake(dg.to, visible);
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
        assert!(
            !self.batch_open(w),
            "{} ended its step with an open doorbell batch",
            self.shape.worker_at(w as usize)
        );
        let ws = &mut self.workers[w as usize];
        ws.running = false;
        self.trace.add(u64::from(w) << 48 ^ ws.clock);
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

    pub(crate) fn node_fault(&mut self, index: usize) {
        let f = self.faults.node_faults[index];
        let nic = &mut self.nics[usize::from(f.node.0)];
        if nic.state == NodeState::Crashed {
            return;
        }
        self.trace.add(0xFA << 56 | u64::from(f.node.0));
        match f.kind {
            NodeFaultKind::Pause { for_ns } => {
                nic.state = NodeState::Paused;
                let until = self.now + ps(for_ns as f64);
                self.schedule(until, Event::Resume { node: f.node });
            }
            NodeFaultKind::Crash => nic.state = NodeState::Crashed,
        }
        for w in self.node_workers(f.node) {
            self.workers[w as usize].halted = true;
        }
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

fn status_code(s: Status) -> u64 {
    match s {
        Status::Success => 0,
        Status::RemoteAccess(_) => 1,
        Status::Unreachable => 3,
    }
}
