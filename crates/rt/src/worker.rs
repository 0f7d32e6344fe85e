//! The worker: one event loop per hytra worker, and [`Co`], the handle its coroutines use.
//!
//! A step polls the completion queue and wakes the coroutines whose requests finished,
//! receives datagrams (running RPC handlers inline and routing replies), expires RPC
//! timeouts, runs pollers, resumes ready coroutines once each (up to the step budget, if
//! the worker has one), and finally sends the RPC frames produced during the step behind
//! one doorbell. Not for: policy; what a coroutine does is the caller's business.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use hytra_fabric::cpu::CpuTerm;
use hytra_fabric::{
    BatchPost, BatchRefused, Caps, ClusterShape, Completion, Endpoint, NodeId, OpFlags, PostError,
    Program, Qp, Region, Rkey, Status, Step, WorkRequest, WorkerId,
};
use thiserror::Error;

use crate::config::RtConfig;
use crate::constants::{
    BATCH_MAX, CQ_POLL_BATCH, RECV_PER_STEP_MAX, RPC_PAYLOAD_MAX, RPC_TYPES_MAX,
};
use crate::executor::{Executor, Order, YieldNow};
use crate::ops::{OpStats, OpTable, OpTicket};
use crate::rpc::{
    check_type, frames, CallClass, CallTicket, Calls, Dedup, Frame, FrameKind, Header, Outbox,
    RemoteError, RpcError, RpcStats, RpcType,
};
use crate::timer::Timers;

/// Why a one-sided batch failed.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
pub enum OpError {
    /// The fabric refused the post (see [`PostError`]); nothing of the batch was issued
    /// unless it is `QueueFull` after a partial post, in which case the posted part
    /// completes unsignaled.
    #[error("post refused: {0}")]
    Post(PostError),
    /// A member completed with this status.
    #[error("completed with {0:?}")]
    Failed(Status),
}

/// State shared by a worker's event loop and its coroutines.
pub(crate) struct Inner<E> {
    pub(crate) ep: RefCell<E>,
    pub(crate) ops: RefCell<OpTable>,
    pub(crate) calls: RefCell<Calls>,
    pub(crate) outbox: RefCell<Outbox>,
    timers: RefCell<Timers>,
    pub(crate) cfg: RtConfig,
    /// Time at the start of the current step: RPC deadlines need no finer clock, and
    /// reading a real clock per call costs more than the call on some backends.
    step_now_ns: std::cell::Cell<u64>,
    /// Requests were posted behind `MORE` by [`Co::issue_deferred`] and await a doorbell.
    deferred: std::cell::Cell<bool>,
    me: WorkerId,
    shape: ClusterShape,
    caps: Caps,
}

/// What a handler gets: the endpoint, the caller, and the reply being built.
pub struct HandlerCtx<'a, E> {
    /// The worker's endpoint (its node's memory, posting, charging CPU).
    pub ep: &'a mut E,
    /// Who sent the request.
    pub src: WorkerId,
    /// Reply payload; the handler appends to it (at most `RPC_PAYLOAD_MAX` bytes). Ignored
    /// for one-way requests.
    pub reply: &'a mut Vec<u8>,
    /// Whether the handler chose not to answer (see [`HandlerCtx::ignore`]).
    ignored: bool,
}

impl<E> HandlerCtx<'_, E> {
    /// Sends no reply at all, as if the request had been lost: for a node that must not
    /// be heard by this request's sender (it is not the member the sender takes it for).
    pub fn ignore(&mut self) {
        self.ignored = true;
    }
}

/// An RPC handler: runs inline in the event loop, so it must not block.
pub type Handler<E> = Box<dyn FnMut(&mut HandlerCtx<'_, E>, &[u8])>;

/// A background poller (e.g. of a mailbox or log ring in registered memory): runs every
/// step with the worker's handle; returns whether it did work (the step then reports
/// itself busy so the poller runs again soon).
pub type Poller<E> = Box<dyn FnMut(&Co<E>) -> bool>;

/// Counters of one worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerStats {
    /// Event-loop iterations.
    pub steps: u64,
    /// Coroutine resumptions.
    pub resumes: u64,
    /// One-sided traffic.
    pub ops: OpStats,
    /// RPC traffic.
    pub rpc: RpcStats,
    /// RPC frames and datagrams sent.
    pub frames_sent: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
}

/// One hytra worker: an event loop with coroutines, RPC handlers and pollers. It is the
/// [`Program`] a backend runs.
pub struct Worker<E: Endpoint> {
    inner: Rc<Inner<E>>,
    executor: Executor,
    handlers: Vec<Option<Handler<E>>>,
    pollers: Vec<Poller<E>>,
    cqes: Vec<Completion>,
    rx: Vec<u8>,
    reply: Vec<u8>,
    dedup: Dedup,
    /// How long a step may resume coroutines before it leaves the rest to the next one.
    budget: StepBudget,
    steps: u64,
    resumes: u64,
}

/// How long one step of a worker may go on resuming its coroutines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepBudget {
    /// Every coroutine ready at the step's start is resumed in it.
    Unbounded,
    /// Once the step has run this long since it read its clock (by the worker's clock,
    /// after its completions and datagrams: its timers, pollers and first tasks count
    /// toward it), the coroutines still ready wait for the next step, which resumes them
    /// where this one stopped, after those spawned by [`Worker::spawn_first`]. The
    /// simulator's clock moves within a step only by charged work: in its `measured` CPU
    /// mode, which adds a step's real time once the step ends, no budget is ever reached.
    Ns(u64),
}

impl<E: Endpoint> Inner<E> {
    /// Hands the fabric every frame in the outbox and every request behind a doorbell;
    /// returns whether it refused some frames (they wait in the outbox for the next).
    fn flush(&self) -> bool {
        let mut ep = self.ep.borrow_mut();
        let mut outbox = self.outbox.borrow_mut();
        outbox.flush(&mut *ep);
        self.deferred.set(false);
        ep.ring_doorbells();
        outbox.deferred
    }
}

impl<E: Endpoint + 'static> Worker<E> {
    /// A worker on endpoint `ep`.
    pub fn new(ep: E, cfg: RtConfig) -> Worker<E> {
        let (me, shape, caps, life) = (ep.me(), ep.shape(), ep.caps(), ep.incarnation());
        let connections = usize::from(shape.nodes) * usize::from(shape.lanes_per_peer);
        let inner = Rc::new(Inner {
            ep: RefCell::new(ep),
            ops: RefCell::new(OpTable::new(connections, caps.sq_depth)),
            calls: RefCell::new(Calls::new(shape.workers_total(), shape.nodes).of_life(life)),
            outbox: RefCell::new(Outbox::new(
                shape.workers_total(),
                cfg.doorbell_batching,
                cfg.rpc_coalescing,
            )),
            timers: RefCell::new(Timers::default()),
            cfg,
            step_now_ns: std::cell::Cell::new(0),
            deferred: std::cell::Cell::new(false),
            me,
            shape,
            caps,
        });
        Worker {
            inner,
            executor: Executor::new(),
            handlers: (0..RPC_TYPES_MAX).map(|_| None).collect(),
            pollers: Vec::new(),
            cqes: vec![Completion::EMPTY; CQ_POLL_BATCH],
            rx: vec![0; caps.mtu],
            reply: Vec::with_capacity(RPC_PAYLOAD_MAX),
            dedup: Dedup::new(shape.workers_total()),
            budget: StepBudget::Unbounded,
            steps: 0,
            resumes: 0,
        }
    }

    /// A handle for code outside coroutines (setup, inspection).
    pub fn co(&self) -> Co<E> {
        Co { inner: self.inner.clone() }
    }

    /// Starts a coroutine. The closure gets the coroutine's handle.
    pub fn spawn<F, Fut>(&mut self, f: F)
    where
        F: FnOnce(Co<E>) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let fut = f(self.co());
        self.executor.spawn(Box::pin(fut));
    }

    /// Starts a coroutine that every step resumes (if ready) before the others, and that
    /// no step budget puts off: for short tasks, some of which keep time (a lease's
    /// renewals). Spawned before any other, such tasks hold the lowest slots, so that
    /// while no step stops at a budget, every step resumes its tasks in plain slot order.
    /// A first task must yield often: no budget bounds its turn.
    pub fn spawn_first<F, Fut>(&mut self, f: F)
    where
        F: FnOnce(Co<E>) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let fut = f(self.co());
        self.executor.spawn_as(Box::pin(fut), Order::First);
    }

    /// Bounds how long a step resumes coroutines. Coroutines charge their work as they
    /// run, so one step of many heavy coroutines can outlast a timer of the worker's by
    /// far. With a budget, a task spawned by [`Worker::spawn_first`] whose timer falls
    /// due waits at most for the step in progress (the budget and one coroutine's turn),
    /// then the next step's completions, datagrams and pollers; the others still wait
    /// up to a round of all coroutines, now spread over several steps. On the real
    /// backends the check reads the clock once per coroutine resumed.
    pub fn set_step_budget(&mut self, budget: StepBudget) {
        if let StepBudget::Ns(ns) = budget {
            assert!(ns > 0, "a step budget of 0 would resume one coroutine per step");
        }
        self.budget = budget;
    }

    /// Registers the handler of requests of type `ty` (replacing any previous one).
    pub fn handle(&mut self, ty: RpcType, handler: Handler<E>) {
        check_type(ty);
        self.handlers[usize::from(ty.0)] = Some(handler);
    }

    /// Adds a background poller.
    pub fn poll_with(&mut self, poller: Poller<E>) {
        self.pollers.push(poller);
    }

    /// Counters so far.
    pub fn stats(&self) -> WorkerStats {
        let outbox = self.inner.outbox.borrow();
        WorkerStats {
            steps: self.steps,
            resumes: self.resumes,
            ops: self.inner.ops.borrow().stats.clone(),
            rpc: self.inner.calls.borrow().stats.clone(),
            frames_sent: outbox.frames_sent,
            datagrams_sent: outbox.datagrams_sent,
        }
    }

    /// Tickets and calls issued but never collected (should be 0 once coroutines end).
    pub fn leaked(&self) -> usize {
        self.inner.ops.borrow().live() + self.inner.calls.borrow().live()
    }

    /// Takes every completion; returns how many.
    fn reap_completions(&mut self) -> usize {
        let mut total = 0;
        loop {
            let n = self.inner.ep.borrow_mut().poll_cq(&mut self.cqes);
            total += n;
            let mut ops = self.inner.ops.borrow_mut();
            for c in &self.cqes[..n] {
                if let Some(w) = ops.complete(c) {
                    w.wake_by_ref();
                }
            }
            if n < self.cqes.len() {
                return total;
            }
        }
    }

    /// Receives datagrams; returns how many, and whether the per-step limit cut it short.
    fn receive(&mut self) -> (usize, bool) {
        for got in 0..RECV_PER_STEP_MAX {
            let next = self.inner.ep.borrow_mut().recv(&mut self.rx);
            let Some((src, len)) = next else { return (got, false) };
            self.dispatch(src, len);
        }
        (RECV_PER_STEP_MAX, true)
    }

    /// Handles every frame of the datagram in `self.rx[..len]`.
    fn dispatch(&mut self, src: WorkerId, len: usize) {
        let inner = self.inner.clone();
        for frame in frames(&self.rx[..len]) {
            let Ok(Frame { kind, ty, call_id, payload }) = frame else {
                inner.calls.borrow_mut().stats.malformed += 1;
                return;
            };
            let mut ep = inner.ep.borrow_mut();
            ep.charge(crate::config::DISPATCH, 1);
            match kind {
                FrameKind::Reply | FrameKind::Error => {
                    let outcome = match (kind, payload.first()) {
                        (FrameKind::Reply, _) => Ok(payload),
                        (_, Some(1)) => Err(RemoteError::NoHandler),
                        _ => Err(RemoteError::ReplyTooLarge),
                    };
                    let src_idx = inner.shape.worker_index(src);
                    // The clock is read only for a late reply: rare, and a real clock
                    // costs on the real-time backends.
                    let w =
                        inner.calls.borrow_mut().settle(call_id, src_idx, outcome, || ep.now_ns());
                    drop(ep);
                    if let Some(w) = w {
                        w.wake();
                    }
                }
                FrameKind::Request
                    if self.dedup.duplicate(inner.shape.worker_index(src), call_id) =>
                {
                    inner.calls.borrow_mut().stats.duplicates += 1;
                }
                FrameKind::Request | FrameKind::OneWay => {
                    let handler = self.handlers.get_mut(usize::from(ty.0)).and_then(Option::as_mut);
                    self.reply.clear();
                    let mut ignored = false;
                    let served = match handler {
                        Some(handler) => {
                            let reply = &mut self.reply;
                            let mut ctx = HandlerCtx { ep: &mut *ep, src, reply, ignored: false };
                            handler(&mut ctx, payload);
                            ignored = ctx.ignored;
                            true
                        }
                        None => false,
                    };
                    inner.calls.borrow_mut().stats.served += u64::from(served);
                    if kind == FrameKind::Request && !ignored {
                        let (kind, body): (FrameKind, &[u8]) =
                            match (served, self.reply.len() <= RPC_PAYLOAD_MAX) {
                                (false, _) => (FrameKind::Error, &[1]),
                                (true, false) => (FrameKind::Error, &[2]),
                                (true, true) => (FrameKind::Reply, &self.reply),
                            };
                        let header = Header { kind, ty: ty.0, len: body.len() as u16, call_id };
                        let dest_idx = inner.shape.worker_index(src);
                        // A refused reply is a lost reply: the caller times out and the
                        // protocol above copes, exactly as with a dropped datagram.
                        let _ =
                            inner.outbox.borrow_mut().push(&mut *ep, src, dest_idx, header, body);
                    }
                }
            }
        }
    }

    fn run_pollers(&mut self) -> bool {
        if self.pollers.is_empty() {
            return false;
        }
        let co = self.co();
        let mut worked = false;
        for p in &mut self.pollers {
            worked |= p(&co);
        }
        worked
    }
}

impl<E: Endpoint + 'static> Program for Worker<E> {
    fn step(&mut self) -> Step {
        self.steps += 1;
        self.inner.ep.borrow_mut().charge(crate::config::STEP, 1);
        let reaped = self.reap_completions();
        let (received, more_rx) = self.receive();
        let now = self.inner.ep.borrow().now_ns();
        self.inner.step_now_ns.set(now);
        self.inner.calls.borrow_mut().expire(now, |w| w.wake());
        self.inner.timers.borrow_mut().expire(now);
        let polled = self.run_pollers();
        let inner = &self.inner;
        let charge_switch = || inner.ep.borrow_mut().charge(crate::config::SWITCH, 1);
        let resumed = match self.budget {
            StepBudget::Unbounded => self.executor.run_ready(charge_switch, || false),
            StepBudget::Ns(ns) => {
                let end = now.saturating_add(ns);
                self.executor.run_ready(charge_switch, || inner.ep.borrow().now_ns() >= end)
            }
        };
        self.resumes += resumed as u64;
        // Coroutines ring their deferred batches before they wait; this rings what is
        // left (and what an error path left open).
        let refused = self.inner.flush();
        if more_rx || polled || refused || self.executor.ready().any() {
            return Step::Busy;
        }
        let call = self.inner.calls.borrow_mut().next_deadline();
        let timer = self.inner.timers.borrow().next_deadline();
        let wake_at_ns = match (call, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Step::Idle { wake_at_ns, progressed: reaped + received + resumed > 0 }
    }

    fn is_done(&self) -> bool {
        // Frames the fabric refused wait in the outbox: a worker that would stop with
        // them there would lose its last replies and one-way messages.
        self.executor.live() == 0 && self.inner.outbox.borrow().is_empty()
    }
}

/// A coroutine's handle on its worker: issue one-sided batches, make RPCs, read local
/// memory. Cheap to clone; every method is non-blocking or an `async` wait.
pub struct Co<E> {
    inner: Rc<Inner<E>>,
}

impl<E> Clone for Co<E> {
    fn clone(&self) -> Self {
        Co { inner: self.inner.clone() }
    }
}

impl<E: Endpoint> Co<E> {
    /// This worker.
    pub fn me(&self) -> WorkerId {
        self.inner.me
    }

    /// Size of the cluster.
    pub fn shape(&self) -> ClusterShape {
        self.inner.shape
    }

    /// Properties of the fabric.
    pub fn caps(&self) -> Caps {
        self.inner.caps
    }

    /// The runtime configuration.
    pub fn config(&self) -> &RtConfig {
        &self.inner.cfg
    }

    /// Current time (virtual in the simulator).
    pub fn now_ns(&self) -> u64 {
        self.inner.ep.borrow().now_ns()
    }

    /// The time at which the current step began: free to read, where [`Co::now_ns`]
    /// reads a real clock on the real-time backends (a cost that shows next to a
    /// shared-memory one-sided operation). Good enough for spans of several steps, such
    /// as a batch's latency measured from the step that issued it to the step that saw
    /// it complete.
    pub fn step_time_ns(&self) -> u64 {
        self.inner.step_now_ns.get()
    }

    /// Charges CPU work to this worker (simulator only).
    pub fn charge(&self, ns: u64) {
        self.inner.ep.borrow_mut().charge_cpu(ns);
    }

    /// Charges `count` of a kind of CPU work to this worker (simulator only; costed by
    /// the simulator's CPU profile).
    pub fn charge_term(&self, term: CpuTerm, count: u32) {
        self.inner.ep.borrow_mut().charge(term, count);
    }

    /// A region of this node (a cheap handle sharing the memory).
    pub fn region(&self, rkey: Rkey) -> Option<Region> {
        self.inner.ep.borrow().region(rkey).cloned()
    }

    /// Direct access to the endpoint, for what the runtime does not wrap. The closure
    /// must leave no doorbell batch open.
    pub fn with_ep<R>(&self, f: impl FnOnce(&mut E) -> R) -> R {
        f(&mut self.inner.ep.borrow_mut())
    }

    /// The nodes to which a request of this worker completed `Unreachable` since the last
    /// call (each once, by id): the connection failed, or the node is gone or fenced
    /// this one off. Requests whose completion nobody asked for are not counted.
    pub fn take_unreachable(&self) -> Vec<NodeId> {
        let lanes = u32::from(self.inner.shape.lanes_per_peer);
        let mut nodes: Vec<NodeId> = (self.inner.ops.borrow_mut().take_unreachable())
            .into_iter()
            .map(|qp| NodeId((qp / lanes) as u16))
            .collect();
        nodes.dedup();
        nodes
    }

    fn qp_index(&self, qp: Qp) -> u32 {
        u32::from(qp.node.0) * u32::from(self.inner.shape.lanes_per_peer) + u32::from(qp.lane)
    }

    fn post_batch(
        &self,
        qp: Qp,
        wrs: &[WorkRequest<'_>],
        want_ticket: bool,
        extra: OpFlags,
    ) -> Result<Option<OpTicket>, OpError> {
        self.post_batch_deferred(qp, wrs, want_ticket, extra, false)
    }

    fn post_batch_deferred(
        &self,
        qp: Qp,
        wrs: &[WorkRequest<'_>],
        want_ticket: bool,
        extra: OpFlags,
        defer: bool,
    ) -> Result<Option<OpTicket>, OpError> {
        let n = wrs.len();
        assert!((1..=BATCH_MAX).contains(&n), "a batch holds 1..={BATCH_MAX} requests, not {n}");
        if !self.inner.shape.has_qp(qp) {
            return Err(OpError::Post(PostError::NoSuchPeer));
        }
        let q = self.qp_index(qp);
        let plan = self
            .inner
            .ops
            .borrow_mut()
            .plan(q, n as u32, want_ticket)
            .ok_or(OpError::Post(PostError::QueueFull))?;
        let db = self.inner.cfg.doorbell_batching;
        let more = if db { OpFlags::MORE } else { OpFlags::NONE };
        let signaled = if plan.signal_last() { OpFlags::SIGNALED } else { OpFlags::NONE };
        let how = BatchPost {
            wr_id: plan.wr_id,
            flags: extra | more,
            last_wr_id: plan.last_wr_id(),
            last_flags: extra | signaled | if defer { more } else { OpFlags::NONE },
        };
        let mut ep = self.inner.ep.borrow_mut();
        if let Err(BatchRefused { posted, error }) = ep.post_batch(qp, wrs, how) {
            ep.ring_doorbells();
            drop(ep);
            self.inner.ops.borrow_mut().abandon(q, &plan, n as u32, posted as u32);
            return Err(OpError::Post(error));
        }
        Ok(plan.ticket())
    }

    /// Posts `wrs` on `qp` as one batch (one doorbell when doorbell batching is on) with
    /// How many requests were posted on connection `qp` so far: a mark that
    /// [`Co::qp_landed`] later says whether everything up to it took effect.
    pub fn qp_mark(&self, qp: Qp) -> u64 {
        self.inner.ops.borrow().marks(self.qp_index(qp)).0
    }

    /// Whether every request posted on `qp` up to `mark` is known to have taken effect
    /// (a completion retired it: R3). Unsignaled requests become known with the next
    /// signaled completion of their connection.
    pub fn qp_landed(&self, qp: Qp, mark: u64) -> bool {
        self.inner.ops.borrow().marks(self.qp_index(qp)).1 >= mark
    }

    /// Posts a batch on one connection, with
    /// the last request signaled; returns its ticket. `QueueFull` means the connection's
    /// send queue is full right now: wait for earlier tickets, then retry.
    pub fn issue(&self, qp: Qp, wrs: &[WorkRequest<'_>]) -> Result<OpTicket, OpError> {
        self.post_batch(qp, wrs, true, OpFlags::NONE).map(|t| t.expect("ticket requested"))
    }

    /// As [`Co::issue`], but with doorbell batching on, the doorbell is left for
    /// [`Co::ring_doorbells`], so that the batches of several records to one connection
    /// share it (DrTM+H §3.2: DB applies to requests on one queue pair). The coroutine
    /// must ring before it waits for anything (the worker rings at the end of every step
    /// in any case).
    pub fn issue_deferred(&self, qp: Qp, wrs: &[WorkRequest<'_>]) -> Result<OpTicket, OpError> {
        self.issue_deferred_with(qp, wrs, OpFlags::NONE)
    }

    /// As [`Co::issue_deferred`] with extra flags (e.g. `INLINE`) on every request.
    pub fn issue_deferred_with(
        &self,
        qp: Qp,
        wrs: &[WorkRequest<'_>],
        flags: OpFlags,
    ) -> Result<OpTicket, OpError> {
        let t = self.post_batch_deferred(qp, wrs, true, flags, true)?;
        if self.inner.cfg.doorbell_batching {
            self.inner.deferred.set(true);
        }
        Ok(t.expect("ticket requested"))
    }

    /// As [`Co::issue_unsignaled`], leaving the doorbell for [`Co::ring_doorbells`] as
    /// [`Co::issue_deferred`] does.
    pub fn issue_unsignaled_deferred(
        &self,
        qp: Qp,
        wrs: &[WorkRequest<'_>],
        flags: OpFlags,
    ) -> Result<(), OpError> {
        self.post_batch_deferred(qp, wrs, false, flags, true)?;
        if self.inner.cfg.doorbell_batching {
            self.inner.deferred.set(true);
        }
        Ok(())
    }

    /// Rings the doorbells of requests [`Co::issue_deferred`] left waiting (nothing if
    /// there are none).
    pub fn ring_doorbells(&self) {
        if self.inner.deferred.replace(false) {
            self.inner.ep.borrow_mut().ring_doorbells();
        }
    }

    /// Hands everything this worker has queued to the fabric now: the RPC frames waiting
    /// in its outbox and the requests waiting for a doorbell (what the end of the step
    /// would do). For a point where what was issued must be out, such as a crash
    /// injected there.
    pub fn flush(&self) {
        self.inner.flush();
    }

    /// As [`Co::issue`] with extra flags (e.g. `INLINE`) on every request.
    pub fn issue_with(
        &self,
        qp: Qp,
        wrs: &[WorkRequest<'_>],
        flags: OpFlags,
    ) -> Result<OpTicket, OpError> {
        self.post_batch(qp, wrs, true, flags).map(|t| t.expect("ticket requested"))
    }

    /// Posts `wrs` unsignaled (passive ACK): no ticket, no waiting; errors are counted in
    /// the worker's statistics. The runtime signals one request every `SIGNAL_EVERY`
    /// to drain the send queue.
    pub fn issue_unsignaled(
        &self,
        qp: Qp,
        wrs: &[WorkRequest<'_>],
        flags: OpFlags,
    ) -> Result<(), OpError> {
        self.post_batch(qp, wrs, false, flags).map(|_| ())
    }

    /// Waits for a batch; returns the value of its last request (the old value for CAS
    /// and FAA).
    pub fn wait(&self, ticket: OpTicket) -> WaitOp<'_, E> {
        WaitOp { co: self, ticket }
    }

    /// Sends a request; wait for the reply with [`Co::reply`], which times out after the
    /// configured RPC timeout.
    pub fn call(
        &self,
        dest: WorkerId,
        ty: RpcType,
        payload: &[u8],
    ) -> Result<CallTicket, RpcError> {
        self.call_within(dest, ty, payload, self.inner.cfg.rpc_timeout_ns)
    }

    /// [`Co::call`], waiting a step at a time while no call slot or credit with `dest` is
    /// free or the send queue is full (back-pressure, as a NIC's full send queue is
    /// waited out); other errors are returned. Bounded: a slot, a credit and the send
    /// queue each free once an earlier call is answered or times out.
    pub async fn call_waiting(
        &self,
        dest: WorkerId,
        ty: RpcType,
        payload: &[u8],
    ) -> Result<CallTicket, RpcError> {
        loop {
            match self.call(dest, ty, payload) {
                Err(RpcError::Busy | RpcError::Post(PostError::QueueFull)) => {
                    self.ring_doorbells();
                    self.yield_now().await;
                }
                other => return other,
            }
        }
    }

    /// [`Co::call`] whose reply times out after `timeout_ns` instead: for callers that
    /// ask again sooner than the configured timeout.
    ///
    /// A worker holds at most [`credits_per_peer`](crate::constants::credits_per_peer)
    /// calls waiting on one destination; past that the call is refused with
    /// [`RpcError::Busy`] and the caller waits for a reply before it calls again.
    pub fn call_within(
        &self,
        dest: WorkerId,
        ty: RpcType,
        payload: &[u8],
        timeout_ns: u64,
    ) -> Result<CallTicket, RpcError> {
        self.start_call(dest, ty, payload, timeout_ns, CallClass::Data)
    }

    /// [`Co::call_within`] for membership and recovery: it needs no credit with its
    /// destination, so that a round of the protocol never waits behind data calls. Its
    /// callers bound how many they make.
    pub fn call_control(
        &self,
        dest: WorkerId,
        ty: RpcType,
        payload: &[u8],
        timeout_ns: u64,
    ) -> Result<CallTicket, RpcError> {
        self.start_call(dest, ty, payload, timeout_ns, CallClass::Control)
    }

    fn start_call(
        &self,
        dest: WorkerId,
        ty: RpcType,
        payload: &[u8],
        timeout_ns: u64,
        class: CallClass,
    ) -> Result<CallTicket, RpcError> {
        assert!(timeout_ns > 0, "a call's timeout is positive");
        if payload.len() > RPC_PAYLOAD_MAX {
            return Err(RpcError::TooLarge(payload.len()));
        }
        if !self.inner.shape.contains(dest) {
            return Err(RpcError::Post(PostError::NoSuchPeer));
        }
        let mut ep = self.inner.ep.borrow_mut();
        let deadline = self.inner.step_now_ns.get() + timeout_ns;
        let dest_idx = self.inner.shape.worker_index(dest);
        let ticket = self.inner.calls.borrow_mut().start(deadline, dest_idx, class)?;
        let header = Header {
            kind: FrameKind::Request,
            ty: ty.0,
            len: payload.len() as u16,
            call_id: ticket.call_id(),
        };
        if let Err(e) =
            self.inner.outbox.borrow_mut().push(&mut *ep, dest, dest_idx, header, payload)
        {
            self.inner.calls.borrow_mut().cancel(ticket);
            return Err(RpcError::Post(e));
        }
        Ok(ticket)
    }

    /// Sends a request that wants no reply (two-sided passive ACK).
    pub fn send_oneway(&self, dest: WorkerId, ty: RpcType, payload: &[u8]) -> Result<(), RpcError> {
        if payload.len() > RPC_PAYLOAD_MAX {
            return Err(RpcError::TooLarge(payload.len()));
        }
        if !self.inner.shape.contains(dest) {
            return Err(RpcError::Post(PostError::NoSuchPeer));
        }
        let header =
            Header { kind: FrameKind::OneWay, ty: ty.0, len: payload.len() as u16, call_id: 0 };
        let dest_idx = self.inner.shape.worker_index(dest);
        let mut ep = self.inner.ep.borrow_mut();
        self.inner
            .outbox
            .borrow_mut()
            .push(&mut *ep, dest, dest_idx, header, payload)
            .map_err(RpcError::Post)
    }

    /// When the newest reply from `dest` arrived that came after its call (any of this
    /// worker's coroutines') had timed out; 0 if none did. Shows `dest` alive, though
    /// slower than that call's timeout: a caller that retries may then wait longer.
    pub fn late_reply_at(&self, dest: WorkerId) -> u64 {
        if !self.inner.shape.contains(dest) {
            return 0;
        }
        self.inner.calls.borrow().late_reply_at(self.inner.shape.worker_index(dest))
    }

    /// Waits for the reply of a call and hands its bytes to `read`.
    pub fn reply<R, F: FnOnce(&[u8]) -> R>(
        &self,
        ticket: CallTicket,
        read: F,
    ) -> WaitReply<'_, E, F> {
        WaitReply { co: self, ticket, read: Some(read) }
    }

    /// Yields to the other coroutines of this worker until the next step.
    pub fn yield_now(&self) -> YieldNow {
        YieldNow::new()
    }

    /// Sleeps until this worker's clock (virtual in the simulator) reaches `deadline_ns`.
    /// The worker stays idle meanwhile unless other work arrives.
    pub fn sleep_until(&self, deadline_ns: u64) -> Sleep<'_, E> {
        Sleep { co: self, deadline_ns, armed: false }
    }

    /// Wakes `waker` once the clock reaches `deadline_ns`: the building block of timeouts
    /// in futures written outside the runtime (the wake may be spurious for them).
    pub fn wake_at(&self, deadline_ns: u64, waker: &std::task::Waker) {
        self.inner.timers.borrow_mut().add(deadline_ns, waker.clone());
    }
}

/// Future of [`Co::sleep_until`].
pub struct Sleep<'a, E> {
    co: &'a Co<E>,
    deadline_ns: u64,
    armed: bool,
}

impl<E: Endpoint> Future for Sleep<'_, E> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.co.now_ns() >= self.deadline_ns {
            return Poll::Ready(());
        }
        // One timer per sleep: the task's waker does not change while it awaits this.
        if !self.armed {
            self.armed = true;
            self.co.wake_at(self.deadline_ns, cx.waker());
        }
        Poll::Pending
    }
}

/// Future of [`Co::wait`].
pub struct WaitOp<'a, E> {
    co: &'a Co<E>,
    ticket: OpTicket,
}

impl<E: Endpoint> Future for WaitOp<'_, E> {
    type Output = Result<u64, OpError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.co.inner.ops.borrow_mut().poll(self.ticket, cx.waker()) {
            None => Poll::Pending,
            Some((Status::Success, value)) => Poll::Ready(Ok(value)),
            Some((status, _)) => Poll::Ready(Err(OpError::Failed(status))),
        }
    }
}

/// Future of [`Co::reply`].
pub struct WaitReply<'a, E, F> {
    co: &'a Co<E>,
    ticket: CallTicket,
    read: Option<F>,
}

impl<E: Endpoint, R, F: FnOnce(&[u8]) -> R + Unpin> Future for WaitReply<'_, E, F> {
    type Output = Result<R, RpcError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut calls = this.co.inner.calls.borrow_mut();
        let mut read = this.read.take();
        let out =
            calls.poll(this.ticket, cx.waker(), |bytes| (read.take().expect("read once"))(bytes));
        match out {
            None => {
                this.read = read;
                Poll::Pending
            }
            Some(r) => Poll::Ready(r),
        }
    }
}
