//! The I/O service of a node: serves reads of its exported files to remote workers.
//!
//! Each serving worker runs a fixed set of server coroutines, one per staging slot of
//! its registered buffer area. The `READ` handler only queues the request (handlers must
//! not block); a server coroutine takes it, checks it against the export table, has the
//! engine read the bytes into its staging slot, WRITEs them into the requester's buffer
//! and, once the WRITE completed (a datagram could overtake it otherwise), sends `DONE`.
//! Reads of at most `inline_max` bytes skip the WRITE and ride in `DONE`. A failed
//! WRITE (the requester vanished or named a bad buffer) frees the slot like any other
//! outcome: the server keeps no state per requester.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use hytra_fabric::{
    Backend, BackendError, Endpoint, LocalAddr, Qp, RegionSpec, RemoteAddr, Rkey, WorkRequest,
    WorkerId, WriteSrc,
};
use hytra_rt::{Co, OpError, Worker};

use crate::engine::Engine;
use crate::export::Exports;
use crate::wire::{self, encode_done, ReadReq, ReadStatus};

/// How a node's I/O buffer region is divided: per worker, `server_slots` staging slots
/// then `client_slots` requester slots, each `max_len` rounded up to 8 bytes.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct IoLayout {
    /// Workers per node.
    pub workers: u16,
    /// Reads a serving worker works on at once (its server coroutines).
    pub server_slots: u16,
    /// Reads a requesting worker may have outstanding.
    pub client_slots: u16,
    /// Largest read.
    pub max_len: u32,
}

impl IoLayout {
    /// Bytes of one slot.
    pub fn slot_len(&self) -> u64 {
        u64::from(self.max_len).div_ceil(8) * 8
    }

    fn per_worker(&self) -> u64 {
        (u64::from(self.server_slots) + u64::from(self.client_slots)) * self.slot_len()
    }

    /// Size of the region.
    pub fn region_len(&self) -> u64 {
        u64::from(self.workers) * self.per_worker()
    }

    /// Offset of staging slot `k` of worker `worker`.
    pub fn server_slot(&self, worker: u16, k: u16) -> u64 {
        assert!(worker < self.workers && k < self.server_slots, "no server slot {worker}/{k}");
        u64::from(worker) * self.per_worker() + u64::from(k) * self.slot_len()
    }

    /// Offset of requester slot `k` of worker `worker`.
    pub fn client_slot(&self, worker: u16, k: u16) -> u64 {
        assert!(worker < self.workers && k < self.client_slots, "no client slot {worker}/{k}");
        u64::from(worker) * self.per_worker()
            + (u64::from(self.server_slots) + u64::from(k)) * self.slot_len()
    }

    /// Registers the region on every node of `backend`.
    pub fn register<B: Backend>(&self, backend: &mut B) -> Result<Rkey, BackendError> {
        if self.max_len == 0 || self.region_len() == 0 {
            return Err(BackendError::Config(format!("empty I/O layout {self:?}")));
        }
        backend.register_all(RegionSpec::new(self.region_len()))
    }
}

/// How a serving worker behaves.
#[derive(Copy, Clone, Debug)]
pub struct ServiceConfig {
    /// The buffer layout.
    pub layout: IoLayout,
    /// Key of the buffer region (from [`IoLayout::register`]).
    pub rkey: Rkey,
    /// Reads up to this many bytes return in `DONE` instead of by WRITE (0: never).
    pub inline_max: u32,
    /// Requests queued beyond the busy server coroutines; more are refused with `Busy`.
    pub queue_max: usize,
    /// Stop serving after this many `BYE`s (so a benchmark run can end); `None`: serve
    /// until the run's time limit.
    pub byes_expected: Option<u32>,
}

/// Counters of one serving worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServiceStats {
    /// Reads whose data reached the requester.
    pub served: u64,
    /// Requests answered with an error status.
    pub refused: u64,
    /// Storage reads that failed.
    pub io_failures: u64,
    /// WRITEs into a requester's buffer that failed (requester gone or bad buffer).
    pub write_failures: u64,
    /// `DONE` messages that could not be sent.
    pub done_lost: u64,
    /// Requests too malformed to answer.
    pub malformed: u64,
    /// Requests dropped unanswered because even the refusal queue was full.
    pub dropped: u64,
}

enum Job {
    Read(WorkerId, ReadReq),
    Refuse(WorkerId, u64, ReadStatus),
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    parked: Vec<Waker>,
    byes: u32,
    closed: bool,
}

impl Queue {
    fn push(&mut self, job: Job) {
        self.jobs.push_back(job);
        if let Some(w) = self.parked.pop() {
            w.wake();
        }
    }
}

/// Waits for the next job; `None` once the service closed and the queue drained.
struct NextJob<'a>(&'a RefCell<Queue>);

impl Future for NextJob<'_> {
    type Output = Option<Job>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Job>> {
        let mut q = self.0.borrow_mut();
        if let Some(j) = q.jobs.pop_front() {
            return Poll::Ready(Some(j));
        }
        if q.closed {
            return Poll::Ready(None);
        }
        q.parked.push(cx.waker().clone());
        Poll::Pending
    }
}

/// The checked target of a request.
fn check(exports: &Exports, req: &ReadReq, max_len: u32) -> Result<(), ReadStatus> {
    let f = exports.get(req.file).ok_or(ReadStatus::UnknownFile)?;
    if req.len > max_len {
        return Err(ReadStatus::TooLarge);
    }
    match req.offset.checked_add(u64::from(req.len)) {
        Some(end) if end <= f.file.len() => Ok(()),
        _ => Err(ReadStatus::PastEnd),
    }
}

/// Makes worker `w` serve reads of `exports` with `engine`; returns its counters.
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
pub fn serve<E: Endpoint + 'static>(
    w: &mut Worker<E>,
    exports: Arc<Exports>,
    engine: Engine,
    cfg: ServiceConfig,
) -> Rc<RefCell<ServiceStats>> {
    let stats = Rc::new(RefCell::new(ServiceStats::default()));
    let queue = Rc::new(RefCell::new(Queue::default()));
    let me = w.co().me();
    {
        let (queue, stats) = (queue.clone(), stats.clone());
        w.handle(
            wire::READ,
            Box::new(move |ctx, bytes| {
                let mut q = queue.borrow_mut();
                let Some(req) = ReadReq::decode(bytes) else {
                    match bytes.get(..8) {
                        Some(id) => {
                            let id = u64::from_le_bytes(id.try_into().expect("8 bytes"));
                            q.push(Job::Refuse(ctx.src, id, ReadStatus::Malformed));
                        }
                        None => stats.borrow_mut().malformed += 1,
                    }
                    return;
                };
                if q.jobs.len() >= 2 * cfg.queue_max.max(1) {
                    // Refusals are queued too; past this even they are dropped and the
                    // requester times out.
                    stats.borrow_mut().dropped += 1;
                    return;
                }
                if q.jobs.len() >= cfg.queue_max {
                    q.push(Job::Refuse(ctx.src, req.req_id, ReadStatus::Busy));
                    return;
                }
                q.push(Job::Read(ctx.src, req));
            }),
        );
    }
    {
        let exports = exports.clone();
        w.handle(
            wire::LOOKUP,
            Box::new(move |ctx, name| {
                let found = std::str::from_utf8(name).ok().and_then(|n| exports.lookup(n));
                match found.and_then(|id| exports.get(id).map(|f| (id, f.file.len()))) {
                    Some((id, len)) => {
                        ctx.reply.push(0);
                        ctx.reply.extend_from_slice(&id.0.to_le_bytes());
                        ctx.reply.extend_from_slice(&len.to_le_bytes());
                    }
                    None => ctx.reply.push(1),
                }
            }),
        );
    }
    {
        let queue = queue.clone();
        w.handle(
            wire::BYE,
            Box::new(move |_ctx, _| {
                let mut q = queue.borrow_mut();
                q.byes += 1;
                if cfg.byes_expected.is_some_and(|n| q.byes >= n) {
                    q.closed = true;
                    for w in q.parked.drain(..) {
                        w.wake();
                    }
                }
            }),
        );
    }
    if cfg.byes_expected == Some(0) {
        return stats;
    }
    for k in 0..cfg.layout.server_slots {
        let slot = cfg.layout.server_slot(me.index, k);
        let (queue, stats, exports, engine) =
            (queue.clone(), stats.clone(), exports.clone(), engine.clone());
        w.spawn(move |co| async move {
            let region = co.region(cfg.rkey).expect("the I/O region is registered");
            let mut msg = Vec::with_capacity(wire::DONE_HEADER_LEN);
            let mut data = Vec::new();
            while let Some(job) = NextJob(&queue).await {
                msg.clear();
                let (src, req) = match job {
                    Job::Refuse(src, id, status) => {
                        stats.borrow_mut().refused += 1;
                        encode_done(&mut msg, id, status, 0, &[]);
                        send_done(&co, src, &msg, &stats);
                        continue;
                    }
                    Job::Read(src, req) => (src, req),
                };
                if let Err(status) = check(&exports, &req, cfg.layout.max_len) {
                    stats.borrow_mut().refused += 1;
                    encode_done(&mut msg, req.req_id, status, 0, &[]);
                    send_done(&co, src, &msg, &stats);
                    continue;
                }
                let file = &exports.get(req.file).expect("checked").file;
                if engine.read(&co, file, req.offset, req.len, &region, slot).await.is_err() {
                    stats.borrow_mut().io_failures += 1;
                    encode_done(&mut msg, req.req_id, ReadStatus::IoFailed, 0, &[]);
                    send_done(&co, src, &msg, &stats);
                    continue;
                }
                let padded = u64::from(req.len).div_ceil(8) * 8;
                if req.len <= cfg.inline_max {
                    data.resize(padded as usize, 0);
                    region.read_bytes(slot, &mut data);
                    encode_done(
                        &mut msg,
                        req.req_id,
                        ReadStatus::Ok,
                        req.len,
                        &data[..req.len as usize],
                    );
                } else {
                    let wr = WorkRequest::Write {
                        remote: RemoteAddr {
                            node: src.node,
                            rkey: req.dst_rkey,
                            offset: req.dst_offset,
                        },
                        src: WriteSrc::Local {
                            addr: LocalAddr { rkey: cfg.rkey, offset: slot },
                            len: padded as u32,
                        },
                    };
                    if write(&co, Qp::to(src.node), &wr).await.is_err() {
                        stats.borrow_mut().write_failures += 1;
                        encode_done(&mut msg, req.req_id, ReadStatus::BadBuffer, 0, &[]);
                        send_done(&co, src, &msg, &stats);
                        continue;
                    }
                    encode_done(&mut msg, req.req_id, ReadStatus::Ok, req.len, &[]);
                }
                stats.borrow_mut().served += 1;
                send_done(&co, src, &msg, &stats);
            }
        });
    }
    stats
}

/// Posts one WRITE and waits for it, retrying while the connection's queue is full.
async fn write<E: Endpoint>(co: &Co<E>, qp: Qp, wr: &WorkRequest<'_>) -> Result<u64, OpError> {
    loop {
        match co.issue(qp, std::slice::from_ref(wr)) {
            Ok(t) => return co.wait(t).await,
            Err(OpError::Post(hytra_fabric::PostError::QueueFull)) => co.yield_now().await,
            Err(e) => return Err(e),
        }
    }
}

fn send_done<E: Endpoint>(co: &Co<E>, dest: WorkerId, msg: &[u8], stats: &RefCell<ServiceStats>) {
    if co.send_oneway(dest, wire::DONE, msg).is_err() {
        stats.borrow_mut().done_lost += 1;
    }
}
