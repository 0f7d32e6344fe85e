//! The NIC model: how a posted request or datagram uses the posting NIC, the links and
//! the target NIC, when it takes effect, and when its completion becomes visible.
//!
//! Every resource is a [`Timeline`]; a request books each one when it reaches it. Memory
//! effects happen when a request reaches its target (an `Arrive` event), in event order.
//! Not for: the event queue and worker bookkeeping (see `core.rs`).

use crate::constants::{CQ_DEPTH, DATAGRAM_MTU, INLINE_MAX, RECV_DEPTH, SQ_DEPTH};
use crate::exec::{check_target, execute, validate_post, Flat};
use crate::ids::{NodeId, Qp, WorkerId, WrId};
use crate::sim::core::{ps, Answer, Core, CqEntry, Event, Ps, RxEntry, Silence, Timed};
use crate::sim::profile::NicProfile;
use crate::sim::qp_cache::QpCache;
use crate::sim::timeline::Timeline;
use crate::verbs::{Completion, OpFlags, OpKind, PostError, Status, WorkRequest};

/// Bytes a target NIC applies to memory at one instant: a cache line. A READ or WRITE
/// longer than that takes effect one line at a time, in address order, at the link's rate
/// (as its bytes stream through the NIC), so a READ racing a WRITE of the same record can
/// return a torn mix, as on real NICs (docs/INVARIANTS.md M2); a later request of the
/// same connection takes effect only after the last line (R1).
pub(super) const LINE_BYTES: u64 = 64;

/// Bytes of a one-sided request that reach the target as one packet: InfiniBand's
/// smallest path MTU. A node that crashes while sending a WRITE has sent some of its
/// packets and not the rest (a dead NIC retransmits nothing), so the target applies a
/// prefix of whole packets; with the smallest MTU, every prefix any fabric's MTU can
/// leave is one the simulator can leave too (docs/INVARIANTS.md R7).
pub(super) const PACKET_BYTES: u64 = 256;

/// How much of a one-sided request its source's NIC put on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sent {
    /// All of it: the source is up, or crashed only after sending it.
    Whole,
    /// Its first `end` bytes, whole packets, before its source crashed.
    Prefix { end: u32 },
    /// Not a single packet before its source crashed.
    Nothing,
}

/// Lines of a transfer of `len` bytes at `offset`: (count, bytes of the first).
pub(super) fn lines(offset: u64, len: u64) -> (u64, u64) {
    let first = (LINE_BYTES - offset % LINE_BYTES).min(len);
    (1 + (len - first).div_ceil(LINE_BYTES), first)
}

/// A one-sided request in flight.
#[derive(Clone, Debug)]
pub(super) struct OneSided {
    pub(super) src: u32,
    pub(super) qp_slot: u32,
    pub(super) qp_seq: u64,
    pub(super) wr_id: WrId,
    pub(super) flat: Flat,
    /// Index of the payload in the inline pool, for WRITEs copied at post time.
    pub(super) inline: Option<u32>,
    pub(super) signaled: bool,
    /// The poster's incarnation: a request of a node's earlier life (posted before it
    /// crashed and restarted) tells its new workers nothing.
    pub(super) life: u32,
    /// When its last byte left the source's NIC (the first try's, or a retransmission's
    /// after a partition healed): what its source's crash may have cut short.
    pub(super) left: Ps,
}

/// A datagram in flight.
#[derive(Clone, Debug)]
pub(super) struct Datagram {
    pub(super) from: u32,
    pub(super) to: u32,
    pub(super) buf: u32,
    pub(super) len: u32,
    /// When it left the sender's NIC: a sender that crashed before sent nothing.
    pub(super) left: Ps,
}

/// A request queued behind `MORE`, waiting for its queue pair's doorbell.
pub(super) enum Queued {
    OneSided(OneSided),
    Datagram(Datagram),
}

/// Node liveness.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(super) enum NodeState {
    Up,
    Paused,
    Crashed,
}

/// One machine's NIC: its resources' timetables, context cache and liveness.
pub(super) struct Nic {
    pub(super) engine: Timeline,
    pub(super) atomic_unit: Timeline,
    pub(super) tx: Timeline,
    pub(super) rx: Timeline,
    /// The unit that fetches entries of managed work queues one at a time.
    pub(super) wq_fetch: Timeline,
    pub(super) qp_cache: QpCache,
    pub(super) state: NodeState,
}

/// The profile converted to picoseconds.
pub(super) struct Model {
    pub(super) req: [Ps; 5],
    pub(super) resp: [Ps; 5],
    pub(super) atomic_unit: Ps,
    pub(super) ps_per_kib: u64,
    pub(super) rc_header: u64,
    pub(super) ud_header: u64,
    pub(super) wire: Ps,
    pub(super) doorbell_latency: Ps,
    pub(super) payload_fetch: Ps,
    pub(super) target_read: Ps,
    pub(super) target_write: Ps,
    pub(super) completion: Ps,
    pub(super) qp_miss: Ps,
    pub(super) qp_miss_latency: Ps,
    pub(super) rc_timeout: Ps,
    pub(super) doorbell_cpu: Ps,
    pub(super) wqe_cpu: Ps,
    pub(super) poll_cpu: Ps,
    pub(super) cqe_cpu: Ps,
    pub(super) recv_cpu: Ps,
    pub(super) copy_ps_per_kib: u64,
    /// The posting CPU's copy of a one-sided request's bytes, per KiB (0 on a NIC).
    pub(super) rma_copy_ps_per_kib: u64,
    /// How long an idle worker rests between two polls (0: it spins).
    pub(super) rest: Ps,
    /// From a datagram landing to its receiver able to take it.
    pub(super) recv_latency: Ps,
    /// Between two lines of a WRITE taking effect at the target (the link's rate).
    pub(super) line_write: Ps,
    /// Between two lines of a READ being read at the target (the host bus's rate).
    pub(super) line_read: Ps,
}

pub(super) fn kind_index(k: OpKind) -> usize {
    match k {
        OpKind::Read => 0,
        OpKind::Write => 1,
        OpKind::Cas => 2,
        OpKind::Faa => 3,
        OpKind::Send => 4,
    }
}

impl Model {
    pub(super) fn new(p: &NicProfile) -> Model {
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
            rma_copy_ps_per_kib: ps(p.host.rma_copy_ns_per_kib),
            rest: ps(p.host.rest_ns),
            recv_latency: ps(p.host.recv_latency_ns),
            line_write: ps(LINE_BYTES as f64 / p.link_bytes_per_ns),
            line_read: ps(LINE_BYTES as f64 / p.dma_bytes_per_ns),
        }
    }

    /// Between two lines of a request of `kind`. READ and WRITE go at different rates,
    /// so that one racing the other over the same lines can see some of them old and
    /// some new (at one rate they would move in lockstep and never tear).
    pub(super) fn line(&self, kind: OpKind) -> Ps {
        match kind {
            OpKind::Write => self.line_write,
            _ => self.line_read,
        }
    }

    /// When the last line of a one-sided request that starts taking effect at `at` does.
    pub(super) fn last_line(&self, flat: &Flat, at: Ps) -> Ps {
        match flat.kind {
            OpKind::Read | OpKind::Write => {
                let (n, _) = lines(flat.remote.offset, u64::from(flat.len));
                at + (n - 1) * self.line(flat.kind)
            }
            _ => at,
        }
    }

    pub(super) fn wire_time(&self, bytes: u64) -> Ps {
        bytes * self.ps_per_kib / 1024
    }

    pub(crate) fn copy_cpu(&self, bytes: usize) -> Ps {
        bytes as u64 * self.copy_ps_per_kib / 1024
    }

    /// What the posting CPU spends moving `bytes` of a one-sided request itself.
    pub(super) fn rma_copy_cpu(&self, bytes: u32) -> Ps {
        u64::from(bytes) * self.rma_copy_ps_per_kib / 1024
    }
}

/// Recycled byte buffers (inline payloads, datagrams): the pool grows to the peak number
/// in flight and then allocates no more.
#[derive(Default)]
pub(super) struct BufPool {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) free: Vec<u32>,
}

impl BufPool {
    pub(super) fn put(&mut self, data: &[u8]) -> u32 {
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

    pub(super) fn get(&self, idx: u32) -> &[u8] {
        &self.bufs[idx as usize]
    }

    pub(super) fn release(&mut self, idx: u32) {
        debug_assert!(!self.free.contains(&idx), "buffer {idx} released twice");
        self.free.push(idx);
    }
}

impl Core {
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
        let mut tmp = [0u8; INLINE_MAX];
        let payload = Flat::inline_payload(wr, flags, &self.regions[own], &mut tmp);
        let copy_cost = match payload {
            Some(b) => self.model.copy_cpu(b.len()),
            None => self.model.rma_copy_cpu(wr.payload_len()),
        };
        let inline = payload.map(|b| self.inline_pool.put(b));
        let ws = &mut self.workers[w as usize];
        let life = ws.life;
        let q = &mut ws.qps[slot as usize];
        q.posted += 1;
        let qp_seq = q.posted;
        if signaled {
            ws.signaled_in_flight += 1;
        }
        let flat = Flat::of(wr);
        // `left` is known once the NIC sends it (`launch`).
        let op = OneSided {
            src: w,
            qp_slot: slot,
            qp_seq,
            wr_id,
            flat,
            inline,
            signaled,
            life,
            left: 0,
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
        // A datagram holds a send-queue slot until the NIC has sent it: a worker that
        // sends faster than its NIC fills the queue and is refused, as on real hardware.
        let ws = &mut self.workers[w as usize];
        while ws.ud_in_flight.front().is_some_and(|&left| left <= ws.clock) {
            ws.ud_in_flight.pop_front();
        }
        if ws.ud_in_flight.len() + ws.ud_queued as usize >= SQ_DEPTH as usize {
            return Err(PostError::QueueFull);
        }
        ws.ud_queued += 1;
        let buf = self.msg_pool.put(payload);
        let to = self.shape.worker_index(to) as u32;
        let dg = Datagram { from: w, to, buf, len: payload.len() as u32, left: 0 };
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
                Queued::Datagram(dg) if slot.is_none() => {
                    self.workers[w as usize].ud_queued -= 1;
                    self.launch_datagram(dg, t)
                }
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

    /// Engine occupancy without a connection-context lookup (verb programs).
    pub(super) fn engine_at(&mut self, node: NodeId, at: Ps, cost: Ps) -> Ps {
        self.engine(node, at, cost, None)
    }

    pub(super) fn transmit_at(&mut self, node: NodeId, at: Ps, bytes: u64) -> Ps {
        self.transmit(node, at, bytes)
    }

    pub(super) fn receive_at(&mut self, node: NodeId, at: Ps, bytes: u64) -> Ps {
        self.receive(node, at, bytes)
    }

    /// Steps the worker that watches region `rkey` of `node`, if any, at `at`.
    pub(super) fn wake_watcher(&mut self, node: NodeId, rkey: crate::ids::Rkey, at: Ps) {
        if let Some(Some(watcher)) = self.watchers[usize::from(node.0)].get(rkey.0 as usize) {
            let w = self.shape.worker_index(WorkerId { node, index: *watcher }) as u32;
            self.wake(w, at);
        }
    }

    fn launch(&mut self, mut op: OneSided, t_post: Ps) {
        let src_node = self.shape.worker_at(op.src as usize).node;
        let k = kind_index(op.flat.kind);
        let mut t = t_post + self.model.doorbell_latency;
        if op.flat.kind == OpKind::Write && op.inline.is_none() {
            t += self.model.payload_fetch;
        }
        let qp_id = self.qp_id(op.src, op.qp_slot);
        let t = self.engine(src_node, t, self.model.req[k], Some(qp_id));
        let payload = match op.flat.kind {
            OpKind::Write => u64::from(op.flat.len),
            OpKind::Cas => 16,
            OpKind::Faa => 8,
            _ => 0,
        };
        let left = self.transmit(src_node, t, self.model.rc_header + payload);
        op.left = left;
        if self.dying[usize::from(src_node.0)].is_some() {
            self.tear(&op, src_node);
        }
        let q = &mut self.workers[op.src as usize].qps[op.qp_slot as usize];
        // Requests on one connection execute in post order (RC is FIFO): the next one
        // takes effect after this one's last line (strictly after, when that line is a
        // later event than the next request's arrival).
        let arrive = (left + self.model.wire).max(q.last_arrive);
        let last = self.model.last_line(&op.flat, arrive);
        q.last_arrive = if last > arrive { last + 1 } else { arrive };
        self.schedule(arrive, Event::Arrive(op));
    }

    /// A crash that waits for a WRITE to tear (`CrashTiming::MidWrite`) strikes in the
    /// middle of `op`, just sent by its node, if it is a WRITE of several packets: its
    /// node stops here, and its NIC after a number of `op`'s packets drawn from the
    /// fault generator (R7).
    fn tear(&mut self, op: &OneSided, node: NodeId) {
        let len = u64::from(op.flat.len);
        if op.flat.kind != OpKind::Write || len <= PACKET_BYTES {
            return;
        }
        let packets = len.div_ceil(PACKET_BYTES);
        let whole = 1 + self.fault_rng.below(packets - 1);
        let bytes = self.model.rc_header + len;
        let on_link = self.model.wire_time(bytes).max(1);
        let start = op.left.saturating_sub(on_link);
        let sent = self.model.rc_header + whole * PACKET_BYTES;
        let into = (u128::from(on_link) * u128::from(sent)).div_ceil(u128::from(bytes));
        let cut = start + u64::try_from(into).expect("within the request's time on the link");
        self.dying[usize::from(node.0)] = None;
        self.crash_here(node);
        self.cut_at[usize::from(node.0)] = Some(Silence { from: cut, until: None });
        let end = (whole * PACKET_BYTES) as u32;
        assert_eq!(self.sent(op, node), Sent::Prefix { end }, "the WRITE is cut where drawn");
    }

    fn launch_datagram(&mut self, mut dg: Datagram, t_post: Ps) {
        let from = self.shape.worker_at(dg.from as usize).node;
        let mut t = t_post + self.model.doorbell_latency;
        if dg.len as usize > INLINE_MAX {
            t += self.model.payload_fetch;
        }
        let t = self.engine(from, t, self.model.req[kind_index(OpKind::Send)], None);
        let left = self.transmit(from, t, self.model.ud_header + u64::from(dg.len));
        dg.left = left;
        self.workers[dg.from as usize].ud_in_flight.push_back(left);
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

    fn push_cqe(&mut self, op: &OneSided, at: Ps, status: Status, value: u64) {
        if self.of_earlier_life(op) {
            return;
        }
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

    /// Whether `op` was posted by an earlier life of its worker's node: its completion
    /// and what it says of its connection concern connections that are gone.
    fn of_earlier_life(&self, op: &OneSided) -> bool {
        self.workers[op.src as usize].life != op.life
    }

    /// Records that `op`, unsignaled, would have completed at `at`: the connection's
    /// later completions appear no earlier.
    fn behind(&mut self, op: &OneSided, at: Ps) {
        if self.of_earlier_life(op) {
            return;
        }
        let q = &mut self.workers[op.src as usize].qps[op.qp_slot as usize];
        q.last_complete = q.last_complete.max(at);
    }

    /// A request that never reaches its target (crashed, fenced off, cut off past the
    /// transport's retries, or on a broken connection) fails after those retries, and
    /// its connection breaks for good (to a crashed or fenced-off target it is moot).
    fn unreachable(&mut self, op: OneSided, crashed: bool) {
        if !crashed && !self.of_earlier_life(&op) {
            self.workers[op.src as usize].qps[op.qp_slot as usize].broken = true;
        }
        self.stats.unreachable += 1;
        self.trace_op(&op, 3, 0);
        self.release_inline(&op);
        let at = self.now + self.model.rc_timeout;
        self.push_cqe(&op, at, Status::Unreachable, 0);
    }

    /// A one-sided request reaches its target: check, apply, and schedule the answer.
    pub(crate) fn arrive(&mut self, mut op: OneSided) {
        let src_node = self.shape.worker_at(op.src as usize).node;
        let now = self.now;
        let target = op.flat.remote.node;
        let held = self.workers[op.src as usize].qps[op.qp_slot as usize].held_until;
        if now < held {
            // An earlier request of the connection is being retransmitted, or still
            // taking effect line by line: stay behind it.
            self.schedule(held, Event::Arrive(op));
            return;
        }
        let crashed = self.nics[usize::from(target.0)].state == NodeState::Crashed
            || self.refuses_one_sided(target, src_node);
        let broken = self.workers[op.src as usize].qps[op.qp_slot as usize].broken;
        let now_ns = now / 1000;
        let request_cut = self.faults.cuts(src_node, target, now_ns);
        let mut answer = match self.faults.cuts(target, src_node, now_ns) {
            true => Answer::Lost,
            false => Answer::Back,
        };
        let sent = match crashed {
            true => Sent::Whole,
            false => self.sent(&op, src_node),
        };
        if sent != Sent::Whole {
            match self.cut_short(&op, sent, request_cut || broken) {
                Some(cut) => answer = cut,
                None => return self.unreachable(op, false),
            }
        } else if !crashed && !broken && (request_cut || answer == Answer::Lost) {
            match self.hold(op, src_node, request_cut) {
                Some(back) => op = back,
                None => return,
            }
        }
        if crashed || broken || request_cut {
            return self.unreachable(op, crashed);
        }
        let mut t = self.target_time(&op);
        let (mut status, mut value, rest) = self.apply(&op, src_node);
        // The answer leaves once the last line has taken effect, and the connection's
        // next request takes effect only after it (strictly: its lines are later events).
        let last = self.model.last_line(&op.flat, now);
        t = t.max(last);
        if last > now {
            let q = &mut self.workers[op.src as usize].qps[op.qp_slot as usize];
            q.held_until = q.held_until.max(last + 1);
        }
        self.stats.one_sided += 1;
        if status != Status::Success {
            self.stats.access_errors += 1;
        }
        self.trace_op(&op, status_code(status), value);
        if status == Status::Success && op.flat.kind != OpKind::Read {
            self.wake_watcher(target, op.flat.remote.rkey, t);
        }
        if let Answer::Cut { end } = answer {
            // Nothing goes back to a dead poster; the packets it sent still take effect.
            match rest {
                Some(from) if from < end => self.second_line(op, from, t, answer),
                Some(_) => self.release_inline(&op),
                None => {}
            }
            return;
        }
        let back_bytes = self.model.rc_header
            + match (op.flat.kind, status) {
                (OpKind::Read, Status::Success) => u64::from(op.flat.len),
                (OpKind::Cas | OpKind::Faa, _) => 8,
                _ => 0,
            };
        let left = self.transmit(target, t, back_bytes);
        let cqe_at = match answer {
            Answer::Back => self.receive(src_node, left + self.model.wire, back_bytes),
            // Its answer is lost one way, past the transport's retries: the request took
            // effect, the poster sees it fail, and the connection breaks (R2).
            Answer::Lost => left.max(now + self.model.rc_timeout),
            Answer::Cut { .. } => unreachable!("a request cut short is not answered"),
        } + self.model.completion;
        if answer == Answer::Lost {
            self.workers[op.src as usize].qps[op.qp_slot as usize].broken = true;
            self.stats.unreachable += 1;
            if rest.is_none() {
                (status, value) = (Status::Unreachable, 0);
            }
        }
        match rest {
            // The completion is handed over with the last line: a worker whose clock ran
            // ahead of the events must not see it (and read or reuse the buffer) before
            // every line took effect.
            Some(from) => self.second_line(op, from, cqe_at, answer),
            None if op.signaled || status != Status::Success => {
                self.push_cqe(&op, cqe_at, status, value)
            }
            // Unsignaled, it shows no completion, but the connection's later ones still
            // come after it (R1): a READ posted behind a CAS must not report before the
            // CAS has cleared the atomic unit, or the poster never feels that unit's
            // queue and keeps feeding it.
            None => self.behind(&op, cqe_at),
        }
    }

    /// When the target of `op`, arriving now, is done with it: its receive link, engine
    /// and (atomics) atomic unit booked, and memory reached.
    fn target_time(&mut self, op: &OneSided) -> Ps {
        let (now, target) = (self.now, op.flat.remote.node);
        let k = kind_index(op.flat.kind);
        let in_bytes = self.model.rc_header
            + match op.flat.kind {
                OpKind::Write => u64::from(op.flat.len),
                _ => 8,
            };
        let t_in = self.receive(target, now, in_bytes);
        let qp_id = self.qp_id(op.src, op.qp_slot);
        let mut t = self.engine(target, t_in, self.model.resp[k], Some(qp_id));
        let atomic = matches!(op.flat.kind, OpKind::Cas | OpKind::Faa);
        if atomic {
            let unit = self.model.atomic_unit;
            t = self.nics[usize::from(target.0)].atomic_unit.book(t, unit, now);
        }
        t += match op.flat.kind {
            OpKind::Write => self.model.target_write,
            _ => self.model.target_read,
        };
        t
    }

    /// What a request that its source's crash cut short does at its target: fails
    /// (`None`) if nothing of it left, or if its connection lost it anyway; else lands
    /// its first bytes, is not answered, and breaks its connection, whose later requests
    /// were never sent (R7).
    fn cut_short(&mut self, op: &OneSided, sent: Sent, lost: bool) -> Option<Answer> {
        self.stats.cut_short += 1;
        match sent {
            Sent::Prefix { end } if !lost => {
                self.workers[op.src as usize].qps[op.qp_slot as usize].broken = true;
                Some(Answer::Cut { end })
            }
            Sent::Prefix { .. } | Sent::Nothing => None,
            Sent::Whole => unreachable!("a request sent whole is not cut short"),
        }
    }

    /// RC retransmits until its retry budget is spent: a partition that heals within it,
    /// both ways, only delays `op` (and every later request of the connection), which
    /// arrives again then (`None`). A request that was lost lands as its
    /// retransmission, which a crash of its source meanwhile stops. Past the budget, `op`
    /// is handed back, to fail.
    fn hold(&mut self, mut op: OneSided, src_node: NodeId, request_cut: bool) -> Option<OneSided> {
        let (now, target) = (self.now, op.flat.remote.node);
        let heal = ps(self.faults.round_trip_at(src_node, target, now / 1000) as f64);
        if heal - now >= self.model.rc_timeout {
            return Some(op);
        }
        self.stats.held += 1;
        self.workers[op.src as usize].qps[op.qp_slot as usize].held_until = heal;
        if request_cut {
            op.left = op.left.max(heal.saturating_sub(self.model.wire));
        }
        self.schedule(heal, Event::Arrive(op));
        None
    }

    /// How much of `op` its source's NIC sent: all of it unless the NIC stopped with a
    /// crash (`cut_at`) before the last byte left. A WRITE cut short lands the whole
    /// packets that had left by then, as a share of its time on the link (R7).
    fn sent(&self, op: &OneSided, src_node: NodeId) -> Sent {
        let Some(silence) = self.cut_at[usize::from(src_node.0)] else {
            return Sent::Whole;
        };
        if !silence.unsent(op.left) {
            return Sent::Whole;
        }
        let cut = silence.from;
        if op.flat.kind != OpKind::Write {
            return Sent::Nothing;
        }
        let len = u64::from(op.flat.len);
        let bytes = self.model.rc_header + len;
        let on_link = self.model.wire_time(bytes).max(1);
        let start = op.left.saturating_sub(on_link);
        if cut <= start {
            return Sent::Nothing;
        }
        let out = u128::from(cut - start) * u128::from(bytes) / u128::from(on_link);
        let out = u64::try_from(out).expect("less than the request's bytes");
        let payload = out.saturating_sub(self.model.rc_header).min(len);
        let end = payload / PACKET_BYTES * PACKET_BYTES;
        match end {
            0 => Sent::Nothing,
            e if e >= len => Sent::Whole,
            e => Sent::Prefix { end: e as u32 },
        }
    }

    fn trace_op(&mut self, op: &OneSided, status: u64, value: u64) {
        self.trace.add(
            u64::from(op.src) << 32
                | u64::from(op.flat.remote.node.0) << 8
                | kind_index(op.flat.kind) as u64,
        );
        self.trace.add(op.wr_id);
        self.trace.add(status << 56 ^ value);
    }

    /// Applies the memory effect of a request that reached a live target: all of it, or
    /// its first line if it spans several; then also returns where the rest starts, for
    /// the caller to schedule as `Line` events.
    fn apply(&mut self, op: &OneSided, src_node: NodeId) -> (Status, u64, Option<u32>) {
        let regions = &self.regions;
        let inline = op.inline.map(|i| self.inline_pool.get(i));
        let target_op = op.flat.target_op(&regions[usize::from(src_node.0)], inline);
        let remote = op.flat.remote;
        let target = regions[usize::from(remote.node.0)].get(remote.rkey.0 as usize);
        let (offset, len) = target_op.span();
        let (n, first) = lines(offset, len);
        if n == 1 || matches!(op.flat.kind, OpKind::Cas | OpKind::Faa) {
            let (status, value) = execute(target, target_op);
            self.release_inline(op);
            return (status, value, None);
        }
        let status = check_target(target, &target_op);
        if status != Status::Success {
            self.release_inline(op);
            return (status, 0, None);
        }
        let (status, value) = execute(target, target_op.piece(0, first));
        debug_assert_eq!(status, Status::Success, "the whole range was checked");
        (status, value, Some(first as u32))
    }

    /// The next line of a READ or WRITE takes effect; after the last, the request's
    /// completion (due at `cqe_at`) is handed to its worker if it is signaled. A target
    /// that crashed meanwhile applies no more of it, and the request fails after the
    /// transport's retries, signaled or not (R2).
    pub(crate) fn line(&mut self, op: OneSided, mut from: u32, cqe_at: Ps, answer: Answer) {
        let src_node = self.shape.worker_at(op.src as usize).node;
        let remote = op.flat.remote;
        // Each pass is one line's event; the next line runs in line when no other event
        // comes between (`run_next_in_line`), so a transfer nobody else touches
        // meanwhile costs one queue entry, not one per line. A transfer has at most
        // `u32::MAX / LINE_BYTES` lines, which bounds the loop.
        loop {
            if self.nics[usize::from(remote.node.0)].state == NodeState::Crashed {
                self.release_inline(&op);
                if !matches!(answer, Answer::Cut { .. }) {
                    let late = cqe_at.max(self.now) + self.model.rc_timeout;
                    self.push_cqe(&op, late, Status::Unreachable, 0);
                }
                return;
            }
            let regions = &self.regions;
            let inline = op.inline.map(|i| self.inline_pool.get(i));
            let target_op = op.flat.target_op(&regions[usize::from(src_node.0)], inline);
            let target = regions[usize::from(remote.node.0)].get(remote.rkey.0 as usize);
            let end = match answer {
                Answer::Cut { end } => end,
                Answer::Back | Answer::Lost => op.flat.len,
            };
            let (offset, total) = (u64::from(from), u64::from(end));
            let len = LINE_BYTES.min(total - offset);
            let (status, _) = execute(target, target_op.piece(offset, len));
            assert_eq!(status, Status::Success, "a line of a checked transfer");
            self.trace.add(0x11E << 48 ^ op.wr_id ^ offset);
            if offset + len < total {
                let next = (offset + len) as u32;
                let due = self.now + self.model.line(op.flat.kind);
                if self.run_next_in_line(due) {
                    from = next;
                    continue;
                }
                self.schedule(due, Event::Line { op, from: next, cqe_at, answer });
                return;
            }
            self.release_inline(&op);
            match answer {
                Answer::Back if op.signaled => self.push_cqe(&op, cqe_at, Status::Success, 0),
                Answer::Back => self.behind(&op, cqe_at),
                // Failed, signaled or not (R2).
                Answer::Lost => self.push_cqe(&op, cqe_at, Status::Unreachable, 0),
                Answer::Cut { .. } => {}
            }
            return;
        }
    }

    /// The line after a transfer's first: run in line if nothing comes between, queued
    /// otherwise.
    fn second_line(&mut self, op: OneSided, from: u32, cqe_at: Ps, answer: Answer) {
        let due = self.now + self.model.line(op.flat.kind);
        if self.run_next_in_line(due) {
            self.line(op, from, cqe_at, answer);
        } else {
            self.schedule(due, Event::Line { op, from, cqe_at, answer });
        }
    }

    fn release_inline(&mut self, op: &OneSided) {
        if let Some(i) = op.inline {
            self.inline_pool.release(i);
        }
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
        // A sender that crashed before the datagram left sent nothing (R7).
        let unsent = self.cut_at[usize::from(from_node.0)].is_some_and(|s| s.unsent(dg.left));
        if unsent
            || self.nics[usize::from(to_node.0)].state == NodeState::Crashed
            || self.is_fenced(to_node, from_node)
            || self.faults.cuts(from_node, to_node, now / 1000)
            || ws_full
        {
            self.stats.datagrams_dropped += 1;
            self.stats.cut_short += u64::from(unsent);
            self.msg_pool.release(dg.buf);
            return;
        }
        let bytes = self.model.ud_header + u64::from(dg.len);
        let t_in = self.receive(to_node, now, bytes);
        let t = self.engine(to_node, t_in, self.model.resp[kind_index(OpKind::Send)], None);
        let visible = t + self.model.target_write + self.model.completion + self.model.recv_latency;
        self.stats.datagrams_delivered += 1;
        self.seq += 1;
        let entry = RxEntry { from: dg.from, buf: dg.buf, len: dg.len };
        self.workers[dg.to as usize].rx.push(Timed { at: visible, seq: self.seq, item: entry });
        self.wake(dg.to, visible);
    }
}

fn status_code(s: Status) -> u64 {
    match s {
        Status::Success => 0,
        Status::RemoteAccess(_) => 1,
        Status::Unreachable => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ClusterShape, LocalAddr, RemoteAddr};
    use crate::memory::Region;
    use crate::sim::faults::FaultConfig;
    use crate::sim::measure::ProgramCpu;
    use crate::verbs::WriteSrc;

    /// A cx4 cluster of `nodes` x `workers` with one region of `bytes` per node, whose
    /// word `w` on node `n` holds `word(n, w)`.
    fn filled_core(nodes: u16, workers: u16, bytes: u64, word: impl Fn(u16, u64) -> u64) -> Core {
        let shape = ClusterShape { nodes, workers_per_node: workers, lanes_per_peer: 1 };
        let mut core = Core::new(
            shape,
            &NicProfile::cx4(),
            FaultConfig::none(),
            1,
            ProgramCpu::Model(crate::cpu::CpuTable::assumed()),
        );
        for n in 0..nodes {
            let r = Region::zeroed(bytes);
            for w in 0..bytes / 8 {
                r.store(w * 8, word(n, w));
            }
            core.add_region(NodeId(n), r, None);
        }
        core
    }

    /// What a 1 KiB READ between two nodes looked like from outside.
    struct LineByLine {
        /// Lines handed out by the queue as events of their own.
        line_events: u64,
        /// Events counted, lines run in line included.
        counted: u64,
        /// Whether some event saw the destination partly written.
        seen_partly: bool,
        /// When the completion became visible.
        cqe_at: Ps,
    }

    /// Posts the READ and runs the events, with `ticks` other events every nanosecond
    /// (events that do nothing, as a busy cluster has) or none.
    fn read_line_by_line(ticks: bool) -> LineByLine {
        let bytes = 1024u64;
        let mut core = filled_core(2, 1, bytes, |n, _| 7 + u64::from(n));
        if ticks {
            // Stale steps of worker 1 (token 0 was never issued): the loop ignores them.
            for k in 1..20_000 {
                core.schedule(k * 1000, Event::Step { worker: 1, token: 0 });
            }
        }
        let wr = WorkRequest::Read {
            remote: RemoteAddr { node: NodeId(1), rkey: crate::ids::Rkey(0), offset: 0 },
            local: LocalAddr { rkey: crate::ids::Rkey(0), offset: 0 },
            len: bytes as u32,
        };
        core.post(0, Qp::to(NodeId(1)), 5, &wr, OpFlags::SIGNALED).unwrap();
        let (mut popped, mut line_events, mut seen_partly, mut cqe_at) = (0, 0, false, None);
        while let Some(e) = core.pop(u64::MAX) {
            popped += 1;
            match e {
                Event::Arrive(op) => core.arrive(op),
                Event::Line { op, from, cqe_at, answer } => {
                    line_events += 1;
                    core.line(op, from, cqe_at, answer)
                }
                _ => {}
            }
            let dst = &core.regions[0][0];
            let landed = (0..bytes / 8).filter(|w| dst.load(w * 8) == 8).count() as u64;
            seen_partly |= landed > 0 && landed < bytes / 8;
            if let Some(c) = core.workers[0].cq.items.front() {
                assert_eq!(landed, bytes / 8, "queued with {landed} words landed");
                cqe_at.get_or_insert(c.at);
            }
        }
        let lines_run_in_line = core.stats.events - popped;
        assert_eq!(
            line_events + lines_run_in_line,
            bytes / LINE_BYTES - 1,
            "every line after the first is an event, in the queue or in line"
        );
        LineByLine {
            line_events,
            counted: core.stats.events - if ticks { 19_999 } else { 0 },
            seen_partly,
            cqe_at: cqe_at.expect("the completion was queued"),
        }
    }

    /// Everything a run shows: its trace, time and counts, every completion queued and
    /// every word of memory.
    #[derive(PartialEq, Debug)]
    struct Seen {
        trace: u64,
        now: Ps,
        events: u64,
        one_sided: u64,
        cqs: Vec<Vec<(Ps, WrId, String)>>,
        memory: Vec<Vec<u64>>,
    }

    fn seen(core: &Core) -> Seen {
        Seen {
            trace: core.trace_hash(),
            now: core.now,
            events: core.stats.events,
            one_sided: core.stats.one_sided,
            cqs: core
                .workers
                .iter()
                .map(|w| {
                    let cqe =
                        |c: &Timed<CqEntry>| (c.at, c.item.cqe.wr_id, format!("{:?}", c.item));
                    w.cq.items.iter().map(cqe).collect()
                })
                .collect(),
            memory: core
                .regions
                .iter()
                .map(|r| (0..r[0].len_bytes() / 8).map(|w| r[0].load(w * 8)).collect())
                .collect(),
        }
    }

    /// What one run of random transfers showed.
    struct Transfers {
        /// At the first loop's limit, and at the end.
        at_limit: Seen,
        at_end: Seen,
        /// When each line handed out by the queue ran.
        line_times: Vec<Ps>,
        /// Lines that ran in line.
        in_line: u64,
    }

    /// Twenty-four READs and WRITEs of 8 bytes to 4 KiB among three nodes of two workers,
    /// posted at once, between filler events at random times and at `extra`; the events
    /// run in two loops, the first up to `limit`, as `SimCluster` runs a window.
    fn transfers(seed: u64, queue_every_line: bool, extra: &[Ps], limit: Ps) -> Transfers {
        const REGION: u64 = 16 << 10;
        let mut core = filled_core(3, 2, REGION, |n, w| u64::from(n) << 32 | w);
        core.queue_every_line = queue_every_line;
        let mut rng = crate::rng::Rng::derive(seed, 11);
        for _ in 0..200 {
            core.schedule(rng.below(30_000_000), Event::Step { worker: 5, token: 0 });
        }
        for &at in extra {
            core.schedule(at, Event::Step { worker: 5, token: 0 });
        }
        for id in 0..24 {
            let w = rng.below(6) as u32;
            let own = w / 2;
            let target = NodeId(((own + 1 + rng.below(2) as u32) % 3) as u16);
            let len = 8 * (1 + rng.below(512));
            let remote = RemoteAddr {
                node: target,
                rkey: crate::ids::Rkey(0),
                offset: 8 * rng.below((REGION - len) / 8 + 1),
            };
            let local = LocalAddr {
                rkey: crate::ids::Rkey(0),
                offset: 8 * rng.below((REGION - len) / 8 + 1),
            };
            let wr = match rng.below(2) {
                0 => WorkRequest::Read { remote, local, len: len as u32 },
                _ => WorkRequest::Write {
                    remote,
                    src: WriteSrc::Local { addr: local, len: len as u32 },
                },
            };
            let qp = Qp::to(target);
            core.post(w, qp, id, &wr, OpFlags::SIGNALED).expect("a valid request");
        }
        let mut line_times = Vec::new();
        let mut popped = 0;
        let mut run = |core: &mut Core, limit: Ps| {
            while let Some(e) = core.pop(limit) {
                popped += 1;
                match e {
                    Event::Arrive(op) => core.arrive(op),
                    Event::Line { op, from, cqe_at, answer } => {
                        line_times.push(core.now);
                        core.line(op, from, cqe_at, answer)
                    }
                    _ => {}
                }
            }
        };
        run(&mut core, limit);
        let at_limit = seen(&core);
        run(&mut core, u64::MAX);
        let at_end = seen(&core);
        let in_line = core.stats.events - popped;
        Transfers { at_limit, at_end, line_times, in_line }
    }

    /// Runs with lines run in line show exactly what runs with every line queued show,
    /// at a loop's limit that falls between two lines and at the end, also with events
    /// due at the very times of lines (which come first, as they were scheduled first).
    #[test]
    fn lines_run_in_line_change_nothing_a_run_shows() {
        let (mut queued_lines, mut in_line) = (0, 0);
        for seed in 0..8 {
            let reference = transfers(seed, true, &[], u64::MAX);
            assert!(reference.line_times.len() > 20, "the transfers span lines");
            // Ties at every third line's time, and limits at others' times.
            let ties: Vec<Ps> = reference.line_times.iter().step_by(3).copied().collect();
            let lines = reference.line_times.len();
            for limit in (1..8).map(|k| reference.line_times[lines * k / 8 + 1]) {
                let queued = transfers(seed, true, &ties, limit);
                let fast = transfers(seed, false, &ties, limit);
                assert_eq!(fast.at_limit, queued.at_limit, "seed {seed}: at the limit {limit}");
                assert_eq!(fast.at_end, queued.at_end, "seed {seed}: at the end");
                queued_lines += fast.line_times.len();
                in_line += fast.in_line;
            }
        }
        assert!(
            queued_lines > 0 && in_line > 0,
            "both paths ran: {queued_lines} queued, {in_line} in line"
        );
    }

    /// A worker's clock may run ahead of the events within a step; were a READ's
    /// completion queued before its last line took effect, such a worker could see it and
    /// read a destination half written. It is queued with the last line.
    #[test]
    fn a_completion_is_queued_only_once_every_line_took_effect() {
        let busy = read_line_by_line(true);
        assert_eq!(busy.line_events, 1024 / LINE_BYTES - 1, "each line its own event");
        assert!(busy.seen_partly, "events between lines see the transfer partly done");
    }

    /// Lines that nothing else could come between run in line: none waits in the queue,
    /// yet they count as events and the completion comes when it does between other
    /// events (`lines_run_in_line_change_nothing_a_run_shows` compares whole runs).
    #[test]
    fn lines_nothing_comes_between_run_in_line() {
        let (busy, alone) = (read_line_by_line(true), read_line_by_line(false));
        assert_eq!(alone.line_events, 0, "no line waited in the queue");
        assert!(!alone.seen_partly);
        assert_eq!(alone.counted, busy.counted);
        assert_eq!(alone.cqe_at, busy.cqe_at);
    }
}
