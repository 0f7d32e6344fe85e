//! The data path of the `local` backend: a worker's endpoint.
//!
//! One-sided requests are carried out by the posting thread itself, directly on the
//! target's registered memory, when their doorbell rings: the target's CPU does nothing,
//! as with an RNIC. Datagrams travel as boxed buffers through bounded lock-free queues;
//! each buffer belongs to its sender's pool and goes back there once received, so the
//! data path allocates nothing. Not for: setup and threads (see `mod.rs`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::constants::{CQ_DEPTH, DATAGRAM_MTU, INLINE_MAX, RECV_DEPTH, SQ_DEPTH};
use crate::endpoint::{Caps, Endpoint};
use crate::exec::{execute, validate_post, Flat};
use crate::ids::{ClusterShape, NodeId, Qp, Rkey, WorkerId, WrId};
use crate::local::Shared;
use crate::memory::Region;
use crate::verbs::{Completion, OpFlags, PostError, Status, WorkRequest};
use crate::wq::{WqCounters, WqId};

/// A large datagram's buffer; it always returns to the pool of the worker that sent it.
pub(crate) struct Msg {
    pub(crate) from: u32,
    pub(crate) len: u32,
    pub(crate) data: [u8; DATAGRAM_MTU],
}

/// Largest datagram carried by value in the inbox queue instead of in a pooled buffer.
pub(crate) const SMALL_MAX: usize = 120;

/// A small datagram, carried by value (most RPC frames): one queue operation each way
/// instead of two, and no buffer to hand back.
#[derive(Clone, Copy)]
pub(crate) struct SmallMsg {
    pub(crate) from: u32,
    pub(crate) len: u32,
    pub(crate) data: [u8; SMALL_MAX],
}

/// A datagram queued behind `MORE`.
enum Outgoing {
    Small(u32, SmallMsg),
    Large(u32, Box<Msg>),
}

/// A one-sided request waiting for its queue pair's doorbell.
struct Queued {
    qp: Qp,
    wr_id: WrId,
    flat: Flat,
    /// Range of `inline_bytes` holding a payload copied at post time.
    inline: Option<(u32, u32)>,
    signaled: bool,
}

/// A worker's endpoint in the `local` backend.
pub struct LocalEndpoint {
    pub(crate) shared: Arc<Shared>,
    pub(crate) me: WorkerId,
    pub(crate) index: u32,
    pub(crate) regions: Vec<Region>,
    pub(crate) cq: VecDeque<Completion>,
    queued: Vec<Queued>,
    inline_bytes: Vec<u8>,
    datagrams: Vec<Outgoing>,
}

impl LocalEndpoint {
    pub(crate) fn new(shared: Arc<Shared>, me: WorkerId) -> LocalEndpoint {
        let index = shared.shape.worker_index(me) as u32;
        let regions = shared.regions[usize::from(me.node.0)].clone();
        LocalEndpoint {
            shared,
            me,
            index,
            regions,
            cq: VecDeque::with_capacity(CQ_DEPTH),
            queued: Vec::with_capacity(SQ_DEPTH as usize),
            inline_bytes: Vec::with_capacity(INLINE_MAX * 16),
            datagrams: Vec::with_capacity(64),
        }
    }

    fn ring(&mut self, qp: Qp) {
        // Requests of this queue pair run in post order; others stay queued.
        let mut queued = std::mem::take(&mut self.queued);
        for q in queued.iter().filter(|q| q.qp == qp) {
            self.execute(q);
        }
        queued.retain(|q| q.qp != qp);
        self.queued = queued;
        if self.queued.is_empty() {
            self.inline_bytes.clear();
        }
    }

    fn execute(&mut self, q: &Queued) {
        let remote = q.flat.remote;
        // A crashed node's requests go nowhere; requests to one fail, as its connections
        // would once their retries ran out.
        if self.shared.crashed(self.me.node) {
            return;
        }
        // A fenced-off node's requests fail as if every connection to the target closed.
        if self.shared.crashed(remote.node) || self.shared.is_fenced(remote.node, self.me.node) {
            self.cq.push_back(Completion { wr_id: q.wr_id, status: Status::Unreachable, value: 0 });
            return;
        }
        let target = self.shared.regions[usize::from(remote.node.0)].get(remote.rkey.0 as usize);
        let inline = q.inline.map(|(from, to)| &self.inline_bytes[from as usize..to as usize]);
        let (status, value) = execute(target, q.flat.target_op(&self.regions, inline));
        if q.signaled || status != Status::Success {
            self.cq.push_back(Completion { wr_id: q.wr_id, status, value });
        }
    }

    /// The next datagram in this worker's inboxes, whoever sent it.
    fn take(&mut self, buf: &mut [u8]) -> Option<(WorkerId, usize)> {
        let shared = &self.shared;
        if let Some(msg) = shared.small_inboxes[self.index as usize].pop() {
            let len = msg.len as usize;
            buf[..len].copy_from_slice(&msg.data[..len]);
            return Some((shared.shape.worker_at(msg.from as usize), len));
        }
        let msg = shared.inboxes[self.index as usize].pop()?;
        let len = msg.len as usize;
        assert!(
            buf.len() >= len,
            "receive buffer of {} bytes for a {len}-byte datagram",
            buf.len()
        );
        buf[..len].copy_from_slice(&msg.data[..len]);
        let from = msg.from;
        shared.pools[from as usize].push(msg).ok().expect("a pool never holds more than it owns");
        Some((shared.shape.worker_at(from as usize), len))
    }

    fn flush_datagrams(&mut self) {
        let shared = &self.shared;
        let me_crashed = shared.crashed(self.me.node);
        for out in self.datagrams.drain(..) {
            // Nothing leaves a crashed node, nothing reaches one (looked up only in runs
            // that crash some node).
            let gone = shared.crashes()
                && (me_crashed || {
                    let (Outgoing::Small(to, _) | Outgoing::Large(to, _)) = &out;
                    shared.crashed(shared.shape.worker_at(*to as usize).node)
                });
            // A full inbox means the receiver has no receive buffer left: the datagram
            // is lost, as on a UD queue pair (a large one's buffer comes back to us).
            let lost = match out {
                Outgoing::Small(..) if gone => true,
                Outgoing::Small(to, msg) => shared.small_inboxes[to as usize].push(msg).is_err(),
                Outgoing::Large(_, msg) if gone => {
                    shared.pools[self.index as usize]
                        .push(msg)
                        .ok()
                        .expect("pool has room for its own buffer");
                    true
                }
                Outgoing::Large(to, msg) => match shared.inboxes[to as usize].push(msg) {
                    Ok(()) => false,
                    Err(msg) => {
                        shared.pools[self.index as usize]
                            .push(msg)
                            .ok()
                            .expect("pool has room for its own buffer");
                        true
                    }
                },
            };
            if lost {
                shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Endpoint for LocalEndpoint {
    fn me(&self) -> WorkerId {
        self.me
    }

    fn shape(&self) -> ClusterShape {
        self.shared.shape
    }

    fn caps(&self) -> Caps {
        self.shared.caps
    }

    fn now_ns(&self) -> u64 {
        self.shared.now_ns()
    }

    fn charge_cpu(&mut self, _ns: u64) {}

    fn region(&self, rkey: Rkey) -> Option<&Region> {
        self.regions.get(rkey.0 as usize)
    }

    fn post(
        &mut self,
        qp: Qp,
        wr_id: WrId,
        wr: &WorkRequest<'_>,
        flags: OpFlags,
    ) -> Result<(), PostError> {
        validate_post(&self.shared.shape, &self.regions, qp, wr, flags)?;
        let signaled = flags.has(OpFlags::SIGNALED);
        // Requests execute at their doorbell, so only a batch can fill the send queue.
        if self.queued.len() >= SQ_DEPTH as usize || (signaled && self.cq.len() >= CQ_DEPTH) {
            return Err(PostError::QueueFull);
        }
        // Inline payloads wait in an arena until their doorbell rings.
        let start = self.inline_bytes.len();
        let mut tmp = [0u8; INLINE_MAX];
        let inline = Flat::inline_payload(wr, flags, &self.regions, &mut tmp).map(|bytes| {
            self.inline_bytes.extend_from_slice(bytes);
            (start as u32, self.inline_bytes.len() as u32)
        });
        let q = Queued { qp, wr_id, flat: Flat::of(wr), inline, signaled };
        if flags.has(OpFlags::MORE) {
            self.queued.push(q);
        } else if self.queued.is_empty() {
            // The common case: no batch open, execute right away.
            self.execute(&q);
            self.inline_bytes.truncate(start);
        } else {
            self.queued.push(q);
            self.ring(qp);
        }
        Ok(())
    }

    fn ring_doorbells(&mut self) {
        while let Some(qp) = self.queued.first().map(|q| q.qp) {
            self.ring(qp);
        }
        self.flush_datagrams();
    }

    fn poll_cq(&mut self, out: &mut [Completion]) -> usize {
        let n = out.len().min(self.cq.len());
        for (slot, c) in out.iter_mut().zip(self.cq.drain(..n)) {
            *slot = c;
        }
        n
    }

    fn send(&mut self, to: WorkerId, payload: &[u8], flags: OpFlags) -> Result<(), PostError> {
        let shape = &self.shared.shape;
        if !shape.contains(to) {
            return Err(PostError::NoSuchPeer);
        }
        if payload.len() > DATAGRAM_MTU {
            return Err(PostError::TooLarge(payload.len()));
        }
        let to = shape.worker_index(to) as u32;
        let len = payload.len() as u32;
        if payload.len() <= SMALL_MAX {
            let mut msg = SmallMsg { from: self.index, len, data: [0; SMALL_MAX] };
            msg.data[..payload.len()].copy_from_slice(payload);
            self.datagrams.push(Outgoing::Small(to, msg));
        } else {
            // Out of send buffers: every one is in flight or unread at a receiver.
            let Some(mut msg) = self.shared.pools[self.index as usize].pop() else {
                return Err(PostError::QueueFull);
            };
            msg.from = self.index;
            msg.len = len;
            msg.data[..payload.len()].copy_from_slice(payload);
            self.datagrams.push(Outgoing::Large(to, msg));
        }
        if !flags.has(OpFlags::MORE) {
            self.flush_datagrams();
        }
        Ok(())
    }

    fn wq_doorbell(&mut self, wq: WqId) -> Result<(), PostError> {
        self.shared.nic.doorbell(self.me.node, wq, &self.regions)
    }

    fn wq_counters(&self, wq: WqId) -> Option<WqCounters> {
        self.shared.nic.counters(self.me.node, wq)
    }

    fn trigger(&mut self, node: NodeId, wq: WqId, payload: &[u8]) -> Result<(), PostError> {
        let regions = self.shared.regions.get(usize::from(node.0)).ok_or(PostError::NoSuchPeer)?;
        if self.shared.crashed(self.me.node)
            || self.shared.crashed(node)
            || self.shared.is_fenced(node, self.me.node)
        {
            // Lost with the node, as a message to a dead NIC is.
            return Ok(());
        }
        self.shared.nic.deliver(node, wq, regions, payload)
    }

    fn recv(&mut self, buf: &mut [u8]) -> Option<(WorkerId, usize)> {
        // Datagrams of nodes fenced off are dropped, however long they waited in the
        // inbox; each inbox holds a bounded number.
        for _ in 0..=2 * RECV_DEPTH {
            let (from, len) = self.take(buf)?;
            if !self.shared.is_fenced(self.me.node, from.node) {
                return Some((from, len));
            }
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    fn crash_here(&mut self) -> bool {
        self.shared.crash_now(self.me.node);
        true
    }

    fn fence(&mut self, node: NodeId) -> bool {
        self.shared.fence(self.me.node, node);
        true
    }
}
