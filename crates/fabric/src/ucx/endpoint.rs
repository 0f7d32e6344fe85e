//! The data path of the `ucx` backend: UCP workers and endpoints of this process, and a
//! hytra worker's [`UcxEndpoint`] over them. Not for: process setup (see `mod.rs`).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::exchange::Peers;
use super::lanes::{self, Order, Verdict};
use super::{ffi, Context, RunShared};
use crate::constants::{SQ_DEPTH, WORD};
use crate::endpoint::post_each;
use crate::endpoint::{BackendError, Caps, Endpoint};
use crate::exec::{validate_post, validate_request};
use crate::ids::{ClusterShape, NodeId, Qp, Rkey, WorkerId, WrId};
use crate::memory::Region;
use crate::verbs::{
    AccessError, BatchPost, BatchRefused, Completion, OpFlags, PostError, Status, WorkRequest,
    WriteSrc,
};

/// A connection: a UCP endpoint with the target node's regions, their keys unpacked for
/// it (by rkey).
#[derive(Clone)]
struct Lane {
    ep: *mut ffi::Ep,
    regions: Vec<RemoteRegion>,
}

/// A region of the node at the other end of a lane, as its owner announced it.
#[derive(Copy, Clone)]
struct RemoteRegion {
    base: u64,
    len: u64,
    rkey: *mut ffi::RkeyHandle,
}

impl Lane {
    /// The target address of `[offset, offset + len)` in region `rkey` of the lane's node,
    /// and the key to reach it, if the owner would accept the access.
    fn check_remote(
        &self,
        rkey: Rkey,
        offset: u64,
        len: u64,
    ) -> Result<(u64, *mut ffi::RkeyHandle), AccessError> {
        let r = self.regions.get(rkey.0 as usize).ok_or(AccessError::UnknownKey)?;
        if offset % WORD != 0 || len % WORD != 0 {
            return Err(AccessError::Misaligned);
        }
        match offset.checked_add(len) {
            Some(end) if end <= r.len => Ok((r.base + offset, r.rkey)),
            _ => Err(AccessError::OutOfBounds),
        }
    }
}

/// The UCP resources of one hosted worker.
struct WorkerRes {
    index: usize,
    raw: NonNull<ffi::Worker>,
    address: Vec<u8>,
    /// Endpoints to every worker of the cluster, by dense index (datagrams).
    eps: Vec<*mut ffi::Ep>,
    /// Connections by `node * lanes_per_peer + lane` (lane 0 shares the datagram
    /// endpoint to the same-index worker of the node).
    lanes: Vec<Lane>,
    /// Extra endpoints the lanes above 0 own.
    lane_eps: Vec<*mut ffi::Ep>,
}

/// This process's UCP workers, from creation to teardown.
pub(crate) struct WorkerSet {
    shape: ClusterShape,
    workers: Vec<WorkerRes>,
    _ctx: Arc<Context>,
}

// SAFETY: the raw handles are used by one thread at a time: by the thread that owns the
// set during setup and teardown, and during a run by the one thread each worker's
// `Setup` was handed to (workers are created in UCS_THREAD_MODE_SERIALIZED).
unsafe impl Send for WorkerSet {}

fn err_of(what: &str, err: &[std::ffi::c_char; ffi::ERR_LEN]) -> BackendError {
    err_of_text(what, &ffi::err_text(err))
}

fn err_of_text(what: &str, text: &str) -> BackendError {
    BackendError::Config(format!("UCX {what}: {text}"))
}

/// Reads the lanes UCP chose for `ep` and tells the shim how to keep its operations in
/// order: as the lanes require, or `forced`.
fn adopt(ep: *mut ffi::Ep, forced: Option<Order>) -> Result<lanes::EpLanes, String> {
    let mut buf = vec![0 as std::ffi::c_char; 16 << 10];
    // SAFETY: `ep` was just created and is alive; `buf` is writable for its length, and
    // the shim NUL-terminates what it writes there.
    let n = unsafe { ffi::hx_ep_info(ep, buf.as_mut_ptr(), buf.len()) };
    if n < 0 || n as usize >= buf.len() {
        return Err(format!("UCP's description of the endpoint is unreadable ({n} bytes)"));
    }
    let text: Vec<u8> = buf[..n as usize].iter().map(|&c| c as u8).collect();
    let chosen = lanes::parse(&String::from_utf8_lossy(&text))?;
    let order = forced.unwrap_or_else(|| chosen.order());
    // SAFETY: `ep` is alive and has not posted anything yet.
    unsafe { ffi::hx_ep_set_order(ep, order as i32) };
    Ok(chosen)
}

impl WorkerSet {
    /// Creates one UCP worker per hosted worker (dense indexes in `hosted`).
    pub(crate) fn create(
        ctx: &Arc<Context>,
        shape: ClusterShape,
        hosted: &[usize],
    ) -> Result<WorkerSet, BackendError> {
        let mut set = WorkerSet { shape, workers: Vec::new(), _ctx: ctx.clone() };
        for &index in hosted {
            let mut addr: *mut c_void = std::ptr::null_mut();
            let mut len = 0usize;
            let mut err = [0; ffi::ERR_LEN];
            // SAFETY: the context is alive (held by `set`); out-pointers are live locals.
            let raw = unsafe {
                ffi::hx_worker_create(
                    ctx.raw.as_ptr(),
                    u32::from(shape.nodes),
                    u32::from(shape.workers_per_node),
                    &mut addr,
                    &mut len,
                    err.as_mut_ptr(),
                    err.len(),
                )
            };
            let raw = NonNull::new(raw).ok_or_else(|| err_of("worker", &err))?;
            // SAFETY: on success the shim returned an address of `len` bytes, copied here
            // and released once.
            let address = unsafe {
                let v = std::slice::from_raw_parts(addr.cast::<u8>(), len).to_vec();
                ffi::hx_worker_address_release(raw.as_ptr(), addr);
                v
            };
            set.workers.push(WorkerRes {
                index,
                raw,
                address,
                eps: Vec::new(),
                lanes: Vec::new(),
                lane_eps: Vec::new(),
            });
        }
        Ok(set)
    }

    /// Whether a worker of `node` is among this set.
    pub(crate) fn hosts_node(&self, node: NodeId) -> bool {
        self.workers.iter().any(|w| self.shape.worker_at(w.index).node == node)
    }

    /// The UCP address of hosted worker `index`.
    pub(crate) fn address(&self, index: usize) -> &[u8] {
        &self.workers.iter().find(|w| w.index == index).expect("a hosted worker").address
    }

    /// Creates every endpoint, unpacks every remote key, and sets how each endpoint
    /// keeps order from the lanes UCP chose for it (`forced`: this order everywhere).
    /// `peer_errors`: ask UCP to report failed peers (not available on shared memory).
    /// Returns what this process's endpoints promise.
    pub(crate) fn connect(
        &mut self,
        peers: &Peers,
        peer_errors: bool,
        forced: Option<Order>,
    ) -> Result<Verdict, BackendError> {
        let shape = self.shape;
        let mut verdict = Verdict::default();
        for w in &mut self.workers {
            let me = shape.worker_at(w.index);
            let ep_to =
                |raw: NonNull<ffi::Worker>, t: usize| -> Result<*mut ffi::Ep, BackendError> {
                    let mut err = [0; ffi::ERR_LEN];
                    let addr = &peers.addresses[t];
                    // SAFETY: the worker is alive; `addr` is a UCP worker address a peer
                    // announced, valid for the duration of the call.
                    let ep = unsafe {
                        ffi::hx_ep_create(
                            raw.as_ptr(),
                            addr.as_ptr().cast(),
                            i32::from(peer_errors),
                            err.as_mut_ptr(),
                            err.len(),
                        )
                    };
                    if ep.is_null() {
                        return Err(err_of(&format!("endpoint to {}", shape.worker_at(t)), &err));
                    }
                    Ok(ep)
                };
            for t in 0..shape.workers_total() {
                let ep = ep_to(w.raw, t)?;
                w.eps.push(ep);
                let chosen = adopt(ep, forced)
                    .map_err(|e| err_of_text(&format!("endpoint to {}", shape.worker_at(t)), &e))?;
                verdict.add(&format!("worker {}", shape.worker_at(t)), &chosen);
            }
            for n in 0..shape.nodes {
                let target = shape.worker_index(WorkerId { node: NodeId(n), index: me.index });
                for lane in 0..shape.lanes_per_peer {
                    let ep = if lane == 0 {
                        w.eps[target]
                    } else {
                        let ep = ep_to(w.raw, target)?;
                        w.lane_eps.push(ep);
                        adopt(ep, forced).map_err(|e| err_of_text("an endpoint", &e))?;
                        ep
                    };
                    let mut regions = Vec::new();
                    for (k, r) in peers.regions[usize::from(n)].iter().enumerate() {
                        let mut h = std::ptr::null_mut();
                        // SAFETY: `ep` was just created on this worker; the buffer is a
                        // key the owner packed with ucp_rkey_pack.
                        let rc = unsafe {
                            ffi::hx_rkey_unpack(ep, r.packed_rkey.as_ptr().cast(), &mut h)
                        };
                        if rc != 0 {
                            return Err(BackendError::Config(format!(
                                "UCX: cannot unpack the key of region {k} of node {n}"
                            )));
                        }
                        regions.push(RemoteRegion { base: r.base, len: r.len, rkey: h });
                    }
                    w.lanes.push(Lane { ep, regions });
                }
            }
        }
        Ok(verdict)
    }

    /// What each hosted worker's endpoint is built from, in hosted order.
    pub(crate) fn setups(&self, regions: &[Vec<Region>]) -> Vec<Setup> {
        self.workers
            .iter()
            .map(|w| {
                let me = self.shape.worker_at(w.index);
                Setup {
                    me,
                    index: w.index,
                    worker: w.raw,
                    eps: w.eps.clone(),
                    lanes: w.lanes.clone(),
                    regions: regions[usize::from(me.node.0)].clone(),
                }
            })
            .collect()
    }

    /// Releases keys, endpoints and workers (after every thread using them has ended).
    pub(crate) fn destroy(self) {
        for w in &self.workers {
            // SAFETY: no endpoint built from this set outlives the run (they are owned by
            // programs that `finish` consumed), so nothing else uses these handles; each
            // is released exactly once, keys before their endpoints, endpoints before
            // their worker.
            unsafe {
                for lane in &w.lanes {
                    for r in &lane.regions {
                        ffi::hx_rkey_destroy(r.rkey);
                    }
                }
                for &ep in w.lane_eps.iter().chain(&w.eps) {
                    ffi::hx_ep_destroy(w.raw.as_ptr(), ep);
                }
                ffi::hx_worker_destroy(w.raw.as_ptr());
            }
        }
    }
}

/// Everything one worker's endpoint needs, handed to the thread that runs it.
pub(crate) struct Setup {
    me: WorkerId,
    index: usize,
    worker: NonNull<ffi::Worker>,
    eps: Vec<*mut ffi::Ep>,
    lanes: Vec<Lane>,
    regions: Vec<Region>,
}

// SAFETY: a Setup's handles belong to one UCP worker (SERIALIZED mode) and the Setup is
// moved to exactly one thread, which alone uses them until the run ends.
unsafe impl Send for Setup {}

impl Setup {
    pub(crate) fn me(&self) -> WorkerId {
        self.me
    }
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The UCP worker, for the run loop's own progress calls.
    pub(crate) fn worker(&self) -> Progress {
        Progress(self.worker)
    }

    /// The worker's datagram counters, for the coordinator.
    pub(crate) fn datagram_counts(&self) -> DatagramCounts {
        DatagramCounts(self.worker)
    }
}

/// Lets the run loop progress a worker whose program is not polling: a NIC moves queued
/// requests without the application, and UCP moves them only inside progress calls.
#[derive(Copy, Clone)]
pub(crate) struct Progress(NonNull<ffi::Worker>);

impl Progress {
    /// One progress call; returns how many events UCP handled.
    pub(crate) fn run(self) -> u32 {
        // SAFETY: called only by the thread that runs this worker's program, between its
        // steps, while the worker is alive (it is destroyed after the run's threads end).
        unsafe { ffi::hx_progress(self.0.as_ptr()) }
    }

    /// How many progress calls the worker has had, its program's included.
    pub(crate) fn calls(self) -> u64 {
        // SAFETY: as for `run`; this only reads a counter the same thread writes.
        unsafe { ffi::hx_progress_calls(self.0.as_ptr()) }
    }

    /// Whether anything (an operation, a datagram, an endpoint flush) was handed to UCP
    /// or queued for it after the worker's last progress call: UCP sends the later
    /// fragments of a large message, and issues what waits behind a flush, only inside
    /// progress calls.
    pub(crate) fn submitted_since(self) -> bool {
        // SAFETY: as for `calls`.
        unsafe { ffi::hx_submitted_since_progress(self.0.as_ptr()) != 0 }
    }

    /// The worker's event file descriptor (the context must have been made for event
    /// waiting).
    pub(crate) fn efd(self) -> Result<std::os::fd::RawFd, BackendError> {
        let mut err = [0; ffi::ERR_LEN];
        // SAFETY: as for `run`; `err` is a writable buffer of ERR_LEN bytes.
        let fd = unsafe { ffi::hx_worker_efd(self.0.as_ptr(), err.as_mut_ptr(), err.len()) };
        if fd < 0 {
            return Err(err_of("event fd", &err));
        }
        Ok(fd)
    }

    /// Arms the worker's event fd: true when the thread may now sleep on it (armed, and
    /// nothing waits in the worker's rings), false when there is work to take first.
    pub(crate) fn arm(self) -> Result<bool, BackendError> {
        // SAFETY: as for `run`.
        match unsafe { ffi::hx_worker_arm(self.0.as_ptr()) } {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err(err_of_text("worker arm", "ucp_worker_arm failed")),
        }
    }

    /// Whether everything this worker posted so far is complete at its target; starts
    /// or polls a flush of each of its endpoints that is not cut (call again after
    /// [`Progress::run`] until true).
    pub(crate) fn flushed(self) -> bool {
        // SAFETY: as for `run`: the running thread, between steps, worker alive.
        unsafe { ffi::hx_worker_flush_poll(self.0.as_ptr()) != 0 }
    }
}

/// Lets the process's coordinator thread read a worker's datagram counters while another
/// thread runs the worker.
#[derive(Copy, Clone)]
pub(crate) struct DatagramCounts(NonNull<ffi::Worker>);

// SAFETY: the handle only reads counters that the shim stores and loads atomically
// (`hx_datagram_counts_by_node`); the worker outlives every thread of the run.
unsafe impl Send for DatagramCounts {}
// SAFETY: as for `Send`: reads are atomic loads, so any thread may make them at once.
unsafe impl Sync for DatagramCounts {}

impl DatagramCounts {
    /// Adds (sent, received or dropped) by peer node to `sent` and `received`.
    pub(crate) fn add_by_node(self, sent: &mut [u64], received: &mut [u64]) {
        assert_eq!(sent.len(), received.len(), "one count of each per node");
        // SAFETY: the worker is alive (see the `Send` note); the shim writes at most
        // `sent.len()` words into each of the two live slices.
        unsafe {
            ffi::hx_datagram_counts_by_node(
                self.0.as_ptr(),
                sent.as_mut_ptr(),
                received.as_mut_ptr(),
                sent.len(),
            )
        };
    }
}

/// Bits of a completion tag that hold the sequence number; the lane is above them.
const SEQ_BITS: u32 = 48;

/// Per-connection accounting of the verbs send-queue rule: a request stays outstanding
/// until it or a later signaled request on the connection completes.
#[derive(Copy, Clone, Default)]
struct SendQueue {
    posted: u64,
    retired: u64,
}

/// A worker's endpoint in the `ucx` backend.
pub struct UcxEndpoint {
    shared: Arc<RunShared>,
    s: Setup,
    queues: Vec<SendQueue>,
    /// Completions this side made up: refused remote accesses, unreachable peers.
    errors: VecDeque<Completion>,
    cqes: Vec<ffi::Cqe>,
    /// Per node: whether this worker cut its endpoints to it; and how many it cut.
    cut: Vec<bool>,
    cuts: usize,
    /// Whether [`Endpoint::poll_cq`] made a progress call that [`Endpoint::recv`] has not
    /// yet drained the ring after. Over TCP every progress call is an `epoll_wait`; a
    /// step that polls completions and then receives needs only the one (the next
    /// step's poll picks up whatever lands in between).
    fresh: bool,
}

impl UcxEndpoint {
    pub(crate) fn new(shared: Arc<RunShared>, s: Setup) -> UcxEndpoint {
        let queues = vec![SendQueue::default(); s.lanes.len()];
        let nodes = usize::from(shared.shape.nodes);
        UcxEndpoint {
            shared,
            s,
            queues,
            errors: VecDeque::new(),
            cqes: vec![ffi::Cqe::default(); 256],
            cut: vec![false; nodes],
            cuts: 0,
            fresh: false,
        }
    }

    /// Cuts this worker's endpoints to every node the engine fenced off since the last
    /// call (on any worker of this process): their operations in flight complete in
    /// error (as `Unreachable`), later ones fail at once, datagrams to them are dropped.
    fn apply_cuts(&mut self) {
        let shape = self.shared.shape;
        let lanes = usize::from(shape.lanes_per_peer);
        let per_node = usize::from(shape.workers_per_node);
        for n in 0..usize::from(shape.nodes) {
            if self.cut[n] || !self.shared.cut[n].load(Ordering::Acquire) {
                continue;
            }
            self.cut[n] = true;
            self.cuts += 1;
            let w = self.s.worker.as_ptr();
            let eps = self.s.lanes[n * lanes..(n + 1) * lanes]
                .iter()
                .map(|l| l.ep)
                .chain(self.s.eps[n * per_node..(n + 1) * per_node].iter().copied());
            for ep in eps {
                // SAFETY: live handles of this worker, used only by this thread; a cut
                // endpoint stays allocated (the shim posts nothing more on it) until
                // `Workers::destroy` frees it after the run.
                unsafe { ffi::hx_ep_cut(w, ep) };
            }
        }
    }

    fn local_ptr(&self, rkey: Rkey, offset: u64) -> *mut u8 {
        self.s.regions[rkey.0 as usize].addr_of(offset)
    }

    /// Which connection `qp` is (it exists).
    fn lane_index(&self, qp: Qp) -> usize {
        usize::from(qp.node.0) * usize::from(self.shared.shape.lanes_per_peer)
            + usize::from(qp.lane)
    }

    /// Whether connection `lane_index` has room for `n` more requests.
    fn has_room(&self, lane_index: usize, n: usize) -> bool {
        let queue = &self.queues[lane_index];
        queue.posted - queue.retired + n as u64 <= u64::from(SQ_DEPTH)
    }

    /// Posts a request that passed the checks of [`validate_request`] on connection
    /// `lane_index`, whose send queue has room.
    fn post_on_lane(
        &mut self,
        lane_index: usize,
        wr_id: WrId,
        wr: &WorkRequest<'_>,
        flags: OpFlags,
    ) {
        let lane = &self.s.lanes[lane_index];
        let queue = &mut self.queues[lane_index];
        let tag = ((lane_index as u64) << SEQ_BITS) | queue.posted;
        queue.posted += 1;
        // validate_request checked that the request's node is the lane's.
        let remote = wr.remote();
        let (raddr, rkey) =
            match lane.check_remote(remote.rkey, remote.offset, u64::from(wr.payload_len())) {
                Ok(a) => a,
                Err(e) => {
                    // Refused at the target, as an RNIC would, unless the target is gone: it
                    // completes (and retires what came before it on the connection).
                    // SAFETY: the endpoint handle is alive for the whole run.
                    let failed = unsafe { ffi::hx_ep_failed(lane.ep) } != 0;
                    let status = if failed { Status::Unreachable } else { Status::RemoteAccess(e) };
                    self.queues[lane_index].retired = self.queues[lane_index].posted;
                    self.errors.push_back(Completion { wr_id, status, value: 0 });
                    return;
                }
            };
        let (w, ep) = (self.s.worker.as_ptr(), lane.ep);
        let signaled = i32::from(flags.has(OpFlags::SIGNALED));
        // SAFETY: in every arm, `w`, `ep` and `rkey` are live handles of this worker; local
        // pointers lie inside this node's registered regions (validate_request checked the
        // ranges) which stay mapped for the run; the remote range was checked against
        // the region size its owner announced. The shim copies inline payloads it still
        // needs, and a non-inline WRITE's source must stay unchanged until completion by
        // the verbs contract.
        let rc = unsafe {
            match *wr {
                WorkRequest::Read { local, len, .. } => ffi::hx_get(
                    w,
                    ep,
                    self.local_ptr(local.rkey, local.offset).cast(),
                    len as usize,
                    raddr,
                    rkey,
                    wr_id,
                    tag,
                    signaled,
                ),
                WorkRequest::Write { src: WriteSrc::Local { addr, len }, .. } => ffi::hx_put(
                    w,
                    ep,
                    self.local_ptr(addr.rkey, addr.offset).cast_const().cast(),
                    len as usize,
                    raddr,
                    rkey,
                    wr_id,
                    tag,
                    signaled,
                    i32::from(flags.has(OpFlags::INLINE)),
                ),
                WorkRequest::Write { src: WriteSrc::Bytes(bytes), .. } => ffi::hx_put(
                    w,
                    ep,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    raddr,
                    rkey,
                    wr_id,
                    tag,
                    signaled,
                    1,
                ),
                WorkRequest::Cas { local, compare, swap, .. } => ffi::hx_atomic(
                    w,
                    ep,
                    1,
                    compare,
                    swap,
                    self.local_ptr(local.rkey, local.offset).cast(),
                    raddr,
                    rkey,
                    wr_id,
                    tag,
                    signaled,
                ),
                WorkRequest::Faa { local, add, .. } => ffi::hx_atomic(
                    w,
                    ep,
                    0,
                    0,
                    add,
                    self.local_ptr(local.rkey, local.offset).cast(),
                    raddr,
                    rkey,
                    wr_id,
                    tag,
                    signaled,
                ),
            }
        };
        if rc == ffi::HX_EP_FAILED {
            // The peer failed before this post: nothing was sent; the request completes
            // in error and retires what came before it on the connection.
            self.queues[lane_index].retired = self.queues[lane_index].posted;
            self.errors.push_back(Completion { wr_id, status: Status::Unreachable, value: 0 });
        } else {
            debug_assert_eq!(rc, 0, "the shim reports other failures as completions");
        }
    }
}

impl Drop for UcxEndpoint {
    fn drop(&mut self) {
        // SAFETY: the worker outlives its endpoint (destroyed after the run's threads).
        let dropped = unsafe { ffi::hx_dropped(self.s.worker.as_ptr()) };
        self.shared.dropped.fetch_add(dropped, Ordering::Relaxed);
    }
}

impl Endpoint for UcxEndpoint {
    fn me(&self) -> WorkerId {
        self.s.me
    }

    fn shape(&self) -> ClusterShape {
        self.shared.shape
    }

    fn caps(&self) -> Caps {
        self.shared.caps
    }

    fn now_ns(&self) -> u64 {
        self.shared.start.elapsed().as_nanos() as u64
    }

    fn charge_cpu(&mut self, _ns: u64) {}

    fn region(&self, rkey: Rkey) -> Option<&Region> {
        self.s.regions.get(rkey.0 as usize)
    }

    fn post(
        &mut self,
        qp: Qp,
        wr_id: WrId,
        wr: &WorkRequest<'_>,
        flags: OpFlags,
    ) -> Result<(), PostError> {
        validate_post(&self.shared.shape, &self.s.regions, qp, wr, flags)?;
        let lane_index = self.lane_index(qp);
        if !self.has_room(lane_index, 1) {
            return Err(PostError::QueueFull);
        }
        self.post_on_lane(lane_index, wr_id, wr, flags);
        Ok(())
    }

    fn post_batch(
        &mut self,
        qp: Qp,
        wrs: &[WorkRequest<'_>],
        how: BatchPost,
    ) -> Result<(), BatchRefused> {
        if !self.shared.shape.has_qp(qp) {
            return Err(BatchRefused { posted: 0, error: PostError::NoSuchPeer });
        }
        let lane_index = self.lane_index(qp);
        if !self.has_room(lane_index, wrs.len()) {
            // The queue fills part-way: one by one, to refuse exactly where post would.
            return post_each(self, qp, wrs, how);
        }
        for (i, wr) in wrs.iter().enumerate() {
            let (wr_id, flags) = how.of(i, wrs.len());
            validate_request(&self.s.regions, qp, wr, flags)
                .map_err(|error| BatchRefused { posted: i, error })?;
            self.post_on_lane(lane_index, wr_id, wr, flags);
        }
        Ok(())
    }

    fn ring_doorbells(&mut self) {}

    /// UCX cannot refuse a peer's requests (its RMA is served by the shim, or, on shared
    /// memory, by the peer itself through the mapped segment), so this only cuts every
    /// endpoint of this process to `node`: over shared memory a dead peer never fails
    /// one, and requests to it would otherwise never complete.
    fn fence(&mut self, node: NodeId) -> bool {
        assert_ne!(node, self.s.me.node, "a node never fences itself off");
        if !self.shared.cut[usize::from(node.0)].swap(true, Ordering::AcqRel) {
            self.shared.cuts.fetch_add(1, Ordering::AcqRel);
        }
        self.apply_cuts();
        false
    }

    fn poll_cq(&mut self, out: &mut [Completion]) -> usize {
        if self.shared.cuts.load(Ordering::Acquire) != self.cuts {
            self.apply_cuts();
        }
        let mut n = 0;
        while n < out.len() {
            let Some(c) = self.errors.pop_front() else { break };
            out[n] = c;
            n += 1;
        }
        let want = (out.len() - n).min(self.cqes.len());
        if want == 0 {
            return n;
        }
        let w = self.s.worker.as_ptr();
        // SAFETY: the worker is alive and used only by this thread; `cqes` has room for
        // `want` entries.
        let got = unsafe {
            ffi::hx_progress(w);
            ffi::hx_poll(w, self.cqes.as_mut_ptr(), want)
        };
        self.fresh = true;
        for c in &self.cqes[..got] {
            let queue = &mut self.queues[(c.tag >> SEQ_BITS) as usize];
            let seq = c.tag & ((1 << SEQ_BITS) - 1);
            queue.retired = queue.retired.max(seq + 1);
            let status = if c.status == 0 { Status::Success } else { Status::Unreachable };
            out[n] = Completion {
                wr_id: c.wr_id,
                status,
                value: if c.status == 0 { c.value } else { 0 },
            };
            n += 1;
        }
        n
    }

    fn send(&mut self, to: WorkerId, payload: &[u8], _flags: OpFlags) -> Result<(), PostError> {
        let shape = self.shared.shape;
        if !shape.contains(to) {
            return Err(PostError::NoSuchPeer);
        }
        if payload.len() > self.shared.caps.mtu {
            return Err(PostError::TooLarge(payload.len()));
        }
        let ep = self.s.eps[shape.worker_index(to)];
        // SAFETY: live handles of this worker; the shim copies the payload if UCP still
        // needs it after the call.
        unsafe {
            ffi::hx_am_send(
                self.s.worker.as_ptr(),
                ep,
                self.s.index as u32,
                u32::from(to.node.0),
                payload.as_ptr().cast(),
                payload.len(),
            );
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> Option<(WorkerId, usize)> {
        let total = self.shared.shape.workers_total();
        let w = self.s.worker.as_ptr();
        let mut progressed = false;
        loop {
            let mut from = 0u32;
            // SAFETY: the worker is alive and used only by this thread; `buf` is writable
            // for its length.
            let n = unsafe { ffi::hx_recv(w, &mut from, buf.as_mut_ptr(), buf.len()) };
            if n < 0 {
                if progressed || std::mem::take(&mut self.fresh) {
                    return None;
                }
                // Messages arrive only inside progress calls: make one before saying
                // nothing came (unless `poll_cq` made one since the ring was last empty).
                // SAFETY: as above.
                unsafe { ffi::hx_progress(w) };
                progressed = true;
                continue;
            }
            if (from as usize) < total {
                return Some((self.shared.shape.worker_at(from as usize), n as usize));
            }
        }
    }
}
