//! RPC over datagrams: frame format, the outbox that coalesces frames per destination,
//! and the table of calls waiting for replies.
//!
//! A datagram carries one or more frames; a frame is a 16-byte header and a payload:
//!
//! ```text
//! kind u8 | reserved u8 | rpc type u16 | payload len u16 | reserved u16 | call id u64
//! ```
//!
//! (little endian). Requests carry the caller's call id; replies echo it; one-way frames
//! (passive ACK: no reply wanted) carry 0. Input from the network is never trusted: a
//! malformed datagram is counted and dropped. Not for: the coroutine API (`worker.rs`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::task::Waker;

use hytra_fabric::{Endpoint, OpFlags, PostError, WorkerId, LIVES_MAX};
use thiserror::Error;

use crate::constants::{credits_per_peer, CALLS_MAX, FRAME_HEADER, RPC_PAYLOAD_MAX, RPC_TYPES_MAX};

/// Identifies a kind of request; each worker registers one handler per type.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct RpcType(pub u16);

/// Frame kinds on the wire.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum FrameKind {
    /// A call: the callee replies with the same call id.
    Request = 1,
    /// The answer to a request.
    Reply = 2,
    /// A request that wants no reply (call id 0).
    OneWay = 3,
    /// The callee could not serve the request; the payload is one `RemoteError` byte.
    Error = 4,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<FrameKind> {
        match b {
            1 => Some(FrameKind::Request),
            2 => Some(FrameKind::Reply),
            3 => Some(FrameKind::OneWay),
            4 => Some(FrameKind::Error),
            _ => None,
        }
    }
}

/// Why the callee refused a request.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
pub enum RemoteError {
    /// No handler is registered for the type.
    #[error("no handler for the request type")]
    NoHandler,
    /// The handler's reply did not fit in a frame.
    #[error("reply too large")]
    ReplyTooLarge,
}

/// Why a call failed.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
pub enum RpcError {
    /// No reply within the timeout: the request or the reply was lost, or the callee is
    /// slow, paused or dead. The request may or may not have been served.
    #[error("timed out")]
    TimedOut,
    /// The callee refused the request.
    #[error("remote error: {0}")]
    Remote(RemoteError),
    /// The request could not be sent.
    #[error("cannot send: {0}")]
    Post(PostError),
    /// The payload exceeds `RPC_PAYLOAD_MAX`.
    #[error("payload of {0} bytes exceeds the RPC limit")]
    TooLarge(usize),
    /// Every call slot is taken, or every credit with the destination (see
    /// [`credits_per_peer`](crate::constants::credits_per_peer)): wait for a reply and
    /// call again.
    #[error("too many calls in flight")]
    Busy,
}

/// A decoded frame header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: FrameKind,
    pub(crate) ty: u16,
    pub(crate) len: u16,
    pub(crate) call_id: u64,
}

impl Header {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.push(0);
        out.extend_from_slice(&self.ty.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.call_id.to_le_bytes());
    }

    /// Decodes the frame at the start of `bytes`: header and payload, or `None` if the
    /// bytes are not a well-formed frame.
    pub(crate) fn decode(bytes: &[u8]) -> Option<(Header, &[u8])> {
        let head = bytes.get(..FRAME_HEADER)?;
        let kind = FrameKind::from_u8(head[0])?;
        let ty = u16::from_le_bytes([head[2], head[3]]);
        let len = u16::from_le_bytes([head[4], head[5]]);
        let call_id = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        if call_id == 0 && kind != FrameKind::OneWay {
            // Only one-way frames go without a call id; call ids are never 0, which the
            // duplicate filter relies on (`Dedup::duplicate`).
            return None;
        }
        let payload = bytes.get(FRAME_HEADER..FRAME_HEADER + usize::from(len))?;
        Some((Header { kind, ty, len, call_id }, payload))
    }
}

/// One frame of a datagram, as a worker dispatches it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Request, reply, one-way or error.
    pub kind: FrameKind,
    /// The request type (echoed by replies).
    pub ty: RpcType,
    /// The caller's call id; 0 only for one-way frames.
    pub call_id: u64,
    /// The payload (at most `RPC_PAYLOAD_MAX` bytes when a worker sent it).
    pub payload: &'a [u8],
}

impl Frame<'_> {
    /// Appends the frame (header and payload) to `out`, as a worker sends it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        assert!(self.payload.len() <= RPC_PAYLOAD_MAX, "frame payload over the limit");
        let len = self.payload.len() as u16;
        Header { kind: self.kind, ty: self.ty.0, len, call_id: self.call_id }.encode(out);
        out.extend_from_slice(self.payload);
    }
}

/// A datagram holds something that is not a frame where one must start.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
#[error("malformed frame at byte {at} of the datagram")]
pub struct MalformedFrame {
    /// Where the frame should have started.
    pub at: usize,
}

/// The frames of a received datagram, in order, as a worker dispatches them: each is
/// handled before the next is decoded, and a malformed frame ends the datagram (its
/// frames before it were handled; the rest is dropped).
pub fn frames(datagram: &[u8]) -> Frames<'_> {
    Frames { datagram, at: 0 }
}

/// Iterator of [`frames`].
#[derive(Clone, Debug)]
pub struct Frames<'a> {
    datagram: &'a [u8],
    /// Start of the next frame; past the end after a malformed one.
    at: usize,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, MalformedFrame>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.datagram.get(self.at..).filter(|r| !r.is_empty())?;
        let Some((h, payload)) = Header::decode(rest) else {
            let at = self.at;
            self.at = self.datagram.len(); // nothing after a malformed frame is read
            return Some(Err(MalformedFrame { at }));
        };
        self.at += FRAME_HEADER + payload.len();
        Some(Ok(Frame { kind: h.kind, ty: RpcType(h.ty), call_id: h.call_id, payload }))
    }
}

/// Frames waiting to be sent. With doorbell batching, the datagrams of a step leave
/// together behind one doorbell at its end, and with coalescing the frames to one
/// destination share a datagram; without batching, each frame leaves at once.
pub(crate) struct Outbox {
    batch: bool,
    coalesce: bool,
    /// Per destination (dense worker index): its datagram's position in `open`, if one
    /// is open (only with coalescing).
    slot_of: Vec<Option<u32>>,
    open: Vec<(u32, Vec<u8>)>,
    spare: Vec<Vec<u8>>,
    single: Vec<u8>,
    /// Frames refused by the fabric (no send buffer), to retry at the next flush.
    pub(crate) deferred: bool,
    pub(crate) frames_sent: u64,
    pub(crate) datagrams_sent: u64,
}

/// Datagrams the outbox holds for a fabric that refused them before it refuses more
/// frames (one send queue's worth).
const BACKLOG_MAX: usize = hytra_fabric::constants::SQ_DEPTH as usize;

impl Outbox {
    pub(crate) fn new(workers: usize, batch: bool, coalesce: bool) -> Outbox {
        Outbox {
            batch,
            coalesce: batch && coalesce,
            slot_of: vec![None; workers],
            open: Vec::new(),
            spare: Vec::new(),
            single: Vec::new(),
            deferred: false,
            frames_sent: 0,
            datagrams_sent: 0,
        }
    }

    /// Queues one frame for `dest` (dense index `dest_idx`).
    pub(crate) fn push<E: Endpoint>(
        &mut self,
        ep: &mut E,
        dest: WorkerId,
        dest_idx: usize,
        header: Header,
        payload: &[u8],
    ) -> Result<(), PostError> {
        debug_assert_eq!(usize::from(header.len), payload.len());
        assert!(payload.len() <= RPC_PAYLOAD_MAX, "frame payload over the limit");
        if self.batch && self.deferred && self.open.len() >= BACKLOG_MAX {
            // The fabric refused the last flush and a queue's worth waits already:
            // back-pressure, so that a sender that outruns its NIC waits instead of
            // piling up frames.
            return Err(PostError::QueueFull);
        }
        self.frames_sent += 1;
        if !self.batch {
            self.single.clear();
            header.encode(&mut self.single);
            self.single.extend_from_slice(payload);
            self.datagrams_sent += 1;
            return ep.send(dest, &self.single, OpFlags::NONE);
        }
        let frame_len = FRAME_HEADER + payload.len();
        let mtu = ep.caps().mtu;
        let open = if self.coalesce { self.slot_of[dest_idx] } else { None };
        if let Some(slot) = open.filter(|&s| self.open[s as usize].1.len() + frame_len > mtu) {
            // Full: this datagram leaves now (its doorbell rings with the final flush).
            let buf = &self.open[slot as usize].1;
            ep.send(dest, buf, OpFlags::MORE)?;
            self.datagrams_sent += 1;
            self.open[slot as usize].1.clear();
        }
        let slot = match open {
            Some(slot) => slot,
            None => {
                let buf = self.spare.pop().unwrap_or_default();
                let slot = u32::try_from(self.open.len()).expect("open buffers fit u32");
                self.open.push((dest_idx as u32, buf));
                if self.coalesce {
                    self.slot_of[dest_idx] = Some(slot);
                }
                slot
            }
        };
        let buf = &mut self.open[slot as usize].1;
        header.encode(buf);
        buf.extend_from_slice(payload);
        Ok(())
    }

    /// Whether no frame waits to be sent.
    pub(crate) fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Sends every open datagram, all behind one doorbell. Datagrams the fabric refuses
    /// (no send buffer free) stay open for the next flush.
    pub(crate) fn flush<E: Endpoint>(&mut self, ep: &mut E) {
        self.deferred = false;
        let shape = ep.shape();
        let mut kept = 0;
        for i in 0..self.open.len() {
            let (dest_idx, ref buf) = self.open[i];
            let flags = if i + 1 < self.open.len() { OpFlags::MORE } else { OpFlags::NONE };
            let sent =
                buf.is_empty() || ep.send(shape.worker_at(dest_idx as usize), buf, flags).is_ok();
            if sent {
                self.datagrams_sent += u64::from(!buf.is_empty());
                self.slot_of[dest_idx as usize] = None;
                let (_, mut buf) = std::mem::take(&mut self.open[i]);
                buf.clear();
                self.spare.push(buf);
            } else {
                self.deferred = true;
                self.open.swap(kept, i);
                if self.coalesce {
                    self.slot_of[self.open[kept].0 as usize] = Some(kept as u32);
                }
                kept += 1;
            }
        }
        self.open.truncate(kept);
        if self.deferred {
            // The refused send may have left earlier ones queued behind MORE.
            ep.ring_doorbells();
        }
    }
}

/// State of a call slot.
#[derive(Debug)]
enum CallState {
    Free,
    Waiting,
    Replied,
    Failed(RpcError),
}

#[derive(Debug)]
struct CallSlot {
    gen: u32,
    state: CallState,
    /// The destination (dense worker index) whose credit the call holds while
    /// `Waiting`; `None` for a control call, which holds none.
    credit: Option<u32>,
    reply: Vec<u8>,
    waker: Option<Waker>,
    /// The generations of this slot's newest call answered in time and of its newest
    /// call that timed out (both the slot's first generation less one until then): a
    /// reply to a call after the one answered and at most the one timed out is late (the
    /// calls between were not answered in time either), where a duplicate of a reply
    /// already taken is not. The slot may have been taken again meanwhile, and more than
    /// once (a caller that retries often takes the slot it just freed).
    answered_gen: u32,
    timed_out_gen: u32,
}

/// Identifies a call; wait for its reply with [`Co::reply`](crate::Co::reply).
#[must_use = "a call must be waited for, or its slot is never freed"]
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct CallTicket {
    pub(crate) idx: u32,
    pub(crate) gen: u32,
}

impl CallTicket {
    pub(crate) fn call_id(&self) -> u64 {
        u64::from(self.gen) << 32 | u64::from(self.idx)
    }
}

/// Counters of RPC traffic.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RpcStats {
    /// Requests sent.
    pub calls: u64,
    /// Replies matched to a waiting call.
    pub replies: u64,
    /// Calls that timed out.
    pub timeouts: u64,
    /// Replies for calls that had already timed out (or duplicates).
    pub stale_replies: u64,
    /// Requests and one-way frames served by handlers.
    pub served: u64,
    /// Datagrams or frames dropped as malformed or of an unknown kind.
    pub malformed: u64,
    /// Duplicated requests dropped without being served again.
    pub duplicates: u64,
    /// Data calls refused for want of a credit with their destination (the caller
    /// waits and calls again).
    pub no_credit: u64,
}

/// Calls waiting for replies, with their deadlines.
pub(crate) struct Calls {
    slots: Vec<CallSlot>,
    free: Vec<u32>,
    /// Per destination (dense worker index): data calls waiting for its reply.
    in_flight: Vec<u16>,
    /// Credits per destination ([`credits_per_peer`]).
    credits: u16,
    /// (deadline, order of the call, slot, generation), earliest first (and in call
    /// order for equal deadlines, so that expiry is deterministic): calls may have
    /// timeouts of their own. Entries of calls already settled are skipped when they
    /// reach the front.
    deadlines: BinaryHeap<Reverse<(u64, u64, u32, u32)>>,
    /// Calls started so far, to order equal deadlines.
    started: u64,
    pub(crate) stats: RpcStats,
    /// The generation a new slot's first call gets (see [`Calls::of_life`]).
    first_gen: u32,
    /// Per source (dense worker index): when the newest reply arrived to a call that had
    /// timed out; 0 if none did. A late reply shows its source alive though slower than
    /// the call's timeout (see [`Calls::late_reply_at`]).
    late_replies: Vec<u64>,
}

/// What a call is for, which decides whether it needs a credit with its destination.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum CallClass {
    /// Engine and workload traffic: limited to
    /// [`credits_per_peer`](crate::constants::credits_per_peer) per destination.
    Data,
    /// Membership and recovery: few, bounded by their protocol, and not held back by
    /// data calls' credits (a lease round that waits for credits may take a live member
    /// for dead).
    Control,
}

impl Calls {
    /// Calls of a worker in a cluster of `workers` workers on `nodes` nodes.
    pub(crate) fn new(workers: usize, nodes: u16) -> Calls {
        assert!(nodes > 0 && workers >= usize::from(nodes), "a cluster has workers");
        Calls {
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: vec![0; workers],
            credits: credits_per_peer(nodes),
            deadlines: BinaryHeap::new(),
            started: 0,
            stats: RpcStats::default(),
            first_gen: 1,
            late_replies: vec![0; workers],
        }
    }

    /// The calls of a worker of its node's life `life` (0 from the start of the run, one
    /// more after each restart): its slots' generations start past any of an earlier
    /// life's, so that the callees' duplicate filters, which remember the earlier life's
    /// calls, take the new ones for new (a slot would have to make 2^28 calls in one
    /// life to reach the next life's start).
    pub(crate) fn of_life(mut self, life: u32) -> Calls {
        // 2^31, half the generation space, holds LIVES_MAX lives of 2^28 generations.
        const _: () = assert!(LIVES_MAX <= 8);
        assert!(life < LIVES_MAX, "life {life}: a node has at most {LIVES_MAX} lives");
        self.first_gen = (life << 28).max(1);
        self
    }

    /// Takes a slot for a call to `dest` (dense worker index) of class `class`, or
    /// refuses with `Busy` when no slot or no credit with `dest` is free.
    pub(crate) fn start(
        &mut self,
        deadline_ns: u64,
        dest: usize,
        class: CallClass,
    ) -> Result<CallTicket, RpcError> {
        let credit = match class {
            CallClass::Data if self.in_flight[dest] >= self.credits => {
                self.stats.no_credit += 1;
                return Err(RpcError::Busy);
            }
            CallClass::Data => Some(u32::try_from(dest).expect("worker indices fit u32")),
            CallClass::Control => None,
        };
        let idx = match self.free.pop() {
            Some(i) => i,
            None if self.slots.len() < CALLS_MAX => {
                self.slots.push(CallSlot {
                    gen: self.first_gen.wrapping_sub(1),
                    state: CallState::Free,
                    credit: None,
                    reply: Vec::new(),
                    waker: None,
                    answered_gen: self.first_gen.wrapping_sub(1),
                    timed_out_gen: self.first_gen.wrapping_sub(1),
                });
                (self.slots.len() - 1) as u32
            }
            None => return Err(RpcError::Busy),
        };
        let s = &mut self.slots[idx as usize];
        // Generation 0 never names a call: with slot 0 it would make call id 0, which
        // only one-way frames carry, and the duplicate filter takes 0 as "never served".
        s.gen = s.gen.wrapping_add(1).max(1);
        s.state = CallState::Waiting;
        s.credit = credit;
        if let Some(d) = credit {
            self.in_flight[d as usize] += 1;
        }
        self.started += 1;
        self.deadlines.push(Reverse((deadline_ns, self.started, idx, s.gen)));
        self.stats.calls += 1;
        Ok(CallTicket { idx, gen: s.gen })
    }

    /// Gives a slot back after its request could not be sent.
    pub(crate) fn cancel(&mut self, t: CallTicket) {
        let s = &mut self.slots[t.idx as usize];
        debug_assert!(matches!(s.state, CallState::Waiting), "cancelled a call not waiting");
        Self::return_credit(&mut self.in_flight, s);
        s.state = CallState::Free;
        self.free.push(t.idx);
        self.stats.calls -= 1;
    }

    /// Gives back the credit of a call leaving `Waiting` (answered, timed out or
    /// cancelled): the destination no longer queues its request, or it was lost.
    fn return_credit(in_flight: &mut [u16], s: &mut CallSlot) {
        if let Some(d) = s.credit.take() {
            let n = &mut in_flight[d as usize];
            assert!(*n > 0, "a credit returned that was never taken");
            *n -= 1;
        }
    }

    /// A reply (or error) arrived from `src` (a dense worker index); returns the waker of
    /// the waiting coroutine. A reply whose call is over is stale: it is dropped, and if
    /// that call timed out, `now_ns()` is noted as the time `src` last answered late.
    pub(crate) fn settle(
        &mut self,
        call_id: u64,
        src: usize,
        outcome: Result<&[u8], RemoteError>,
        now_ns: impl FnOnce() -> u64,
    ) -> Option<Waker> {
        let (idx, gen) = ((call_id & 0xFFFF_FFFF) as usize, (call_id >> 32) as u32);
        let Some(s) = self
            .slots
            .get_mut(idx)
            .filter(|s| s.gen == gen && matches!(s.state, CallState::Waiting))
        else {
            self.stats.stale_replies += 1;
            // Late only if it answers a call that timed out: a duplicate of a reply
            // already taken says nothing of how long the source takes.
            let late = gen != 0
                && self
                    .slots
                    .get(idx)
                    .is_some_and(|s| newer(gen, s.answered_gen) && !newer(gen, s.timed_out_gen));
            if let Some(at) = self.late_replies.get_mut(src).filter(|_| late) {
                *at = (*at).max(now_ns());
            }
            return None;
        };
        Self::return_credit(&mut self.in_flight, s);
        s.answered_gen = gen;
        match outcome {
            Ok(bytes) => {
                s.reply.clear();
                s.reply.extend_from_slice(bytes);
                s.state = CallState::Replied;
            }
            Err(e) => s.state = CallState::Failed(RpcError::Remote(e)),
        }
        let w = s.waker.take();
        self.stats.replies += 1;
        w
    }

    /// When the newest late reply from `src` (a dense worker index) arrived: one to a
    /// call that had timed out by then; 0 if none did.
    pub(crate) fn late_reply_at(&self, src: usize) -> u64 {
        self.late_replies.get(src).copied().unwrap_or(0)
    }

    /// Fails every call whose deadline passed; returns how many coroutines to wake via
    /// `wake`.
    pub(crate) fn expire(&mut self, now_ns: u64, mut wake: impl FnMut(Waker)) {
        while let Some(&Reverse((deadline, _, idx, gen))) = self.deadlines.peek() {
            let s = &mut self.slots[idx as usize];
            let live = s.gen == gen && matches!(s.state, CallState::Waiting);
            if live && deadline > now_ns {
                break;
            }
            self.deadlines.pop();
            if live {
                Self::return_credit(&mut self.in_flight, s);
                s.state = CallState::Failed(RpcError::TimedOut);
                s.timed_out_gen = s.gen;
                self.stats.timeouts += 1;
                if let Some(w) = s.waker.take() {
                    wake(w);
                }
            }
        }
    }

    /// Earliest deadline of a call still waiting.
    pub(crate) fn next_deadline(&mut self) -> Option<u64> {
        while let Some(&Reverse((deadline, _, idx, gen))) = self.deadlines.peek() {
            let s = &self.slots[idx as usize];
            if s.gen == gen && matches!(s.state, CallState::Waiting) {
                return Some(deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    /// The outcome of a call if settled (freeing its slot), else records `waker`.
    /// `read` sees the reply bytes.
    pub(crate) fn poll<R>(
        &mut self,
        t: CallTicket,
        waker: &Waker,
        read: impl FnOnce(&[u8]) -> R,
    ) -> Option<Result<R, RpcError>> {
        let s = &mut self.slots[t.idx as usize];
        assert!(s.gen == t.gen && !matches!(s.state, CallState::Free), "call waited for twice");
        let out = match s.state {
            CallState::Waiting => {
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    s.waker = Some(waker.clone());
                }
                return None;
            }
            CallState::Replied => Ok(read(&s.reply)),
            CallState::Failed(e) => Err(e),
            CallState::Free => unreachable!(),
        };
        s.state = CallState::Free;
        self.free.push(t.idx);
        Some(out)
    }

    /// Calls issued and not yet collected.
    pub(crate) fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// Served calls, so that a duplicated request is served only once: a duplicate arriving
/// after its original was answered (or after its caller gave up) could otherwise redo work
/// its caller no longer expects, such as taking a lock for a finished transaction. A call
/// id names the caller's call slot and the slot's generation, which grows with every
/// reuse; per source worker and slot the newest generation served is kept, and a request
/// of that generation or an older one is stale whatever its delay (its caller was done
/// with it before the slot was reused).
pub(crate) struct Dedup {
    served: Vec<Vec<u32>>,
}

impl Dedup {
    pub(crate) fn new(sources: usize) -> Dedup {
        Dedup { served: vec![Vec::new(); sources] }
    }

    /// Whether (source, call id) was served already, or is older than a call served from
    /// the same slot; remembers it if not. Call ids are never 0 (generations start at
    /// 1), so a slot never served remembers nothing; one naming a slot no caller has is
    /// refused as if served.
    pub(crate) fn duplicate(&mut self, src: usize, call_id: u64) -> bool {
        debug_assert_ne!(call_id, 0);
        let (idx, gen) = ((call_id & 0xFFFF_FFFF) as usize, (call_id >> 32) as u32);
        if idx >= CALLS_MAX {
            return true;
        }
        let served = &mut self.served[src];
        if served.len() <= idx {
            served.resize(idx + 1, 0);
        }
        let last = served[idx];
        // Generations wrap: `gen` is not newer if at most half the space behind `last`.
        if last != 0 && (last.wrapping_sub(gen) as i32) >= 0 {
            return true;
        }
        served[idx] = gen;
        false
    }
}

/// Whether call generation `a` is newer than `b`: generations wrap, so `a` is newer if
/// it is at most half the space ahead.
fn newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// Checks that a handler can be registered for `ty`.
pub(crate) fn check_type(ty: RpcType) {
    assert!(usize::from(ty.0) < RPC_TYPES_MAX, "RPC type {} outside 0..{RPC_TYPES_MAX}", ty.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = Header { kind: FrameKind::Request, ty: 7, len: 3, call_id: 0xDEAD_BEEF_0000_0042 };
        let mut buf = Vec::new();
        h.encode(&mut buf);
        buf.extend_from_slice(&[1, 2, 3, 9, 9]);
        assert_eq!(buf.len(), FRAME_HEADER + 5);
        let (got, payload) = Header::decode(&buf).unwrap();
        assert_eq!(got, h);
        assert_eq!(payload, &[1, 2, 3]);
        assert!(Header::decode(&buf[..10]).is_none(), "truncated header");
        let mut bad = buf.clone();
        bad[0] = 99;
        assert!(Header::decode(&bad).is_none(), "unknown kind");
        let mut long = buf.clone();
        long[4] = 200;
        assert!(Header::decode(&long).is_none(), "length past the datagram");
    }

    #[test]
    fn a_datagram_yields_its_frames_until_a_malformed_one() {
        let mut d = Vec::new();
        let a = Frame { kind: FrameKind::Request, ty: RpcType(3), call_id: 9, payload: &[1, 2] };
        let b = Frame { kind: FrameKind::OneWay, ty: RpcType(4), call_id: 0, payload: &[] };
        a.encode(&mut d);
        b.encode(&mut d);
        assert_eq!(frames(&d).collect::<Vec<_>>(), vec![Ok(a), Ok(b)]);
        let whole = d.len();
        d.extend_from_slice(&[7; 5]);
        a.encode(&mut d);
        let got: Vec<_> = frames(&d).collect();
        assert_eq!(got, vec![Ok(a), Ok(b), Err(MalformedFrame { at: whole })]);
    }

    /// A request (or reply, or error) with call id 0 came from no caller: the duplicate
    /// filter asserts that it never sees one, so the frame parser must refuse it.
    #[test]
    fn a_call_frame_without_a_call_id_is_malformed() {
        for kind in [FrameKind::Request, FrameKind::Reply, FrameKind::Error] {
            let mut d = Vec::new();
            Header { kind, ty: 1, len: 0, call_id: 0 }.encode(&mut d);
            assert_eq!(frames(&d).next(), Some(Err(MalformedFrame { at: 0 })), "{kind:?}");
        }
        let mut d = Vec::new();
        Header { kind: FrameKind::OneWay, ty: 1, len: 0, call_id: 0 }.encode(&mut d);
        assert!(frames(&d).next().unwrap().is_ok());
    }

    #[test]
    fn duplicates_are_recognised() {
        let id = |gen: u64, slot: u64| gen << 32 | slot;
        let mut d = Dedup::new(8);
        assert!(!d.duplicate(3, id(1, 77)));
        assert!(d.duplicate(3, id(1, 77)));
        assert!(!d.duplicate(4, id(1, 77)), "another source's call");
        for slot in 0..1000 {
            assert!(!d.duplicate(3, id(5, slot)));
        }
        assert!(d.duplicate(3, id(1, 77)), "remembered however many calls came since");
        assert!(!d.duplicate(3, id(6, 77)), "the slot's next call");
        assert!(d.duplicate(3, id(4, 77)), "an older call of the slot, delayed");
        assert!(d.duplicate(3, id(1, CALLS_MAX as u64)), "no caller has this slot");
        let mut d = Dedup::new(1);
        assert!(!d.duplicate(0, id(u64::from(u32::MAX), 2)));
        assert!(!d.duplicate(0, id(1, 2)), "generations wrap");
        assert!(d.duplicate(0, id(u64::from(u32::MAX), 2)));
    }

    #[test]
    fn a_later_life_s_calls_are_new_to_a_callee_that_served_the_earlier_one() {
        let mut d = Dedup::new(1);
        let mut first = Calls::new(1, 1);
        // The earlier life made many calls from its first slot.
        for _ in 0..1000 {
            let t = first.start(100, 0, CallClass::Control).unwrap();
            assert!(!d.duplicate(0, t.call_id()));
            first.cancel(t);
        }
        let mut again = Calls::new(1, 1);
        let stale = again.start(100, 0, CallClass::Control).unwrap();
        assert!(d.duplicate(0, stale.call_id()), "a first life starting over looks stale");
        let mut next = Calls::new(1, 1).of_life(1);
        let t = next.start(100, 0, CallClass::Control).unwrap();
        assert!(!d.duplicate(0, t.call_id()), "the next life's first call is served");
        assert!(d.duplicate(0, t.call_id()), "and only once");
    }

    #[test]
    fn calls_time_out_in_order_and_late_replies_are_stale() {
        let mut calls = Calls::new(1, 1);
        let a = calls.start(100, 0, CallClass::Data).unwrap();
        let b = calls.start(200, 0, CallClass::Data).unwrap();
        let waker = std::task::Waker::noop();
        assert!(calls.poll(a, waker, |_| ()).is_none());
        calls.expire(150, |_| {});
        assert_eq!(calls.poll(a, waker, |_| ()), Some(Err(RpcError::TimedOut)));
        assert_eq!(calls.late_reply_at(0), 0);
        // The caller asks again, in the slot it just freed; then the late reply comes.
        let c = calls.start(300, 0, CallClass::Data).unwrap();
        assert_eq!(c.idx, a.idx, "the freed slot is taken again");
        assert!(calls.settle(a.call_id(), 0, Ok(&[1]), || 170).is_none());
        assert_eq!(calls.stats.stale_replies, 1);
        assert_eq!(calls.late_reply_at(0), 170, "a late reply is noted");
        calls.settle(c.call_id(), 0, Ok(&[]), || unreachable!("a reply in time"));
        assert_eq!(calls.poll(c, waker, |_| ()), Some(Ok(())));
        calls.settle(b.call_id(), 0, Ok(&[5, 6]), || unreachable!("a reply in time"));
        calls.settle(b.call_id(), 0, Ok(&[5, 6]), || unreachable!("a duplicate is not late"));
        assert_eq!(calls.stats.stale_replies, 2);
        assert_eq!(calls.poll(b, waker, |r| r.to_vec()), Some(Ok(vec![5, 6])));
        // Two calls of a slot time out before the first one's reply comes: still late.
        let d = calls.start(400, 0, CallClass::Data).unwrap();
        calls.expire(400, |_| {});
        assert_eq!(calls.poll(d, waker, |_| ()), Some(Err(RpcError::TimedOut)));
        let e = calls.start(500, 0, CallClass::Data).unwrap();
        calls.expire(500, |_| {});
        assert_eq!(calls.poll(e, waker, |_| ()), Some(Err(RpcError::TimedOut)));
        assert_eq!(d.idx, e.idx);
        assert!(calls.settle(d.call_id(), 0, Ok(&[]), || 520).is_none());
        assert_eq!(calls.late_reply_at(0), 520, "a reply to the call before the newest");
        // A duplicate of the reply to `c`, answered in time, is not late.
        calls.settle(c.call_id(), 0, Ok(&[]), || unreachable!("a duplicate is not late"));
        assert_eq!(calls.stats.stale_replies, 4);
        assert_eq!(calls.next_deadline(), None);
        assert_eq!(calls.live(), 0);
        assert_eq!(calls.in_flight, [0]);
    }

    #[test]
    fn data_calls_to_one_destination_wait_for_credits_and_control_calls_do_not() {
        use crate::constants::CALLS_PER_PEER;
        let mut calls = Calls::new(2, 2);
        let waker = std::task::Waker::noop();
        let held: Vec<_> = (0..CALLS_PER_PEER)
            .map(|i| calls.start(100 + u64::from(i), 0, CallClass::Data).unwrap())
            .collect();
        assert_eq!(calls.start(500, 0, CallClass::Data), Err(RpcError::Busy));
        assert_eq!(calls.stats.no_credit, 1);
        // Another destination has credits of its own; control calls need none.
        let other = calls.start(500, 1, CallClass::Data).unwrap();
        let control = calls.start(500, 0, CallClass::Control).unwrap();
        assert_eq!(calls.in_flight, [CALLS_PER_PEER, 1]);
        // A reply returns a credit before its caller collects it, a timeout too.
        calls.settle(held[0].call_id(), 0, Ok(&[]), || 1);
        calls.expire(101, |_| {});
        assert_eq!(calls.in_flight[0], CALLS_PER_PEER - 2);
        assert_eq!(calls.poll(held[1], waker, |_| ()), Some(Err(RpcError::TimedOut)));
        let again = calls.start(500, 0, CallClass::Data).unwrap();
        calls.cancel(again);
        calls.settle(control.call_id(), 0, Ok(&[]), || 1);
        calls.settle(other.call_id(), 0, Ok(&[]), || 1);
        assert_eq!(calls.in_flight, [CALLS_PER_PEER - 2, 0]);
        // A late reply to a call that timed out returns nothing.
        calls.settle(held[1].call_id(), 0, Ok(&[]), || 1);
        assert_eq!(calls.in_flight, [CALLS_PER_PEER - 2, 0]);
    }

    #[test]
    fn larger_clusters_give_each_caller_fewer_credits() {
        use crate::constants::{credits_per_peer, CALLS_PER_PEER, CREDIT_NODES};
        use hytra_fabric::constants::RECV_DEPTH;
        assert_eq!(credits_per_peer(2), CALLS_PER_PEER);
        assert_eq!(credits_per_peer(CREDIT_NODES), CALLS_PER_PEER);
        assert_eq!(credits_per_peer(64), 16);
        assert_eq!(credits_per_peer(1024), 1);
        for nodes in [1u16, 3, 17, 100, 1000, 4096] {
            let queued = usize::from(credits_per_peer(nodes)) * usize::from(nodes);
            assert!(queued <= RECV_DEPTH / 4 || credits_per_peer(nodes) == 1, "{nodes} nodes");
        }
        let mut calls = Calls::new(64, 64);
        for _ in 0..16 {
            let _held = calls.start(100, 3, CallClass::Data).unwrap();
        }
        assert_eq!(calls.start(100, 3, CallClass::Data), Err(RpcError::Busy));
    }
}
