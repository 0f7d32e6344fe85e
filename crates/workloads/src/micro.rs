//! The raw-primitive benchmark of DrTM+H §4.2 (Fig. 5): per-machine throughput and
//! latency of READ, WRITE, CAS, FAA and RPCs against payload size, every machine both
//! issuing and serving (the paper's symmetric model).
//!
//! Method. Every worker runs `coroutines` coroutines. A one-sided coroutine picks a
//! random remote node and one of its connections (the "80-node" setting uses 5 per
//! peer), posts `batch` requests to random payload-aligned offsets there behind one
//! doorbell (last one signaled), and waits. An RPC coroutine sends `batch` requests to
//! the same-index worker of random remote nodes and gathers the replies; the request
//! carries an offset and the reply `payload` bytes (a two-sided read). `wrpc` is an RPC
//! built from two WRITEs into mailboxes that the callee and the caller poll (the paper's
//! RC-WRITE-based RPC). Throughput counts requests completed inside the measurement
//! window per node; latency is per batch, from post to completion.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::Waker;

use hytra_fabric::rng::Rng;
use hytra_fabric::{
    Backend, BackendError, Endpoint, LocalAddr, NodeId, OpFlags, PostError, Qp, RegionSpec,
    RemoteAddr, Rkey, RunLimits, RunStats, WorkRequest, WorkerId, WriteSrc,
};
use hytra_rt::constants::{BATCH_MAX, COROUTINES_MAX, RPC_PAYLOAD_MAX};
use hytra_rt::hist::Histogram;
use hytra_rt::{run_workers_with, Co, OpError, OpTicket, RpcError, RpcType, RtConfig, Worker};
use thiserror::Error;

/// A primitive the benchmark measures.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Hash)]
pub enum Primitive {
    /// One-sided READ.
    Read,
    /// One-sided WRITE.
    Write,
    /// Compare-and-swap (8 bytes).
    Cas,
    /// Fetch-and-add (8 bytes).
    Faa,
    /// RPC over datagrams (UD SEND/RECV).
    Rpc,
    /// RPC over two WRITEs into polled mailboxes (RC WRITE).
    WriteRpc,
    /// A two-sided write: an RPC whose request carries the payload and whose reply is
    /// empty (with passive ACK, a one-way message).
    RpcWrite,
}

impl Primitive {
    /// Every primitive, in table order.
    pub const ALL: [Primitive; 7] = [
        Primitive::Read,
        Primitive::Write,
        Primitive::Cas,
        Primitive::Faa,
        Primitive::Rpc,
        Primitive::WriteRpc,
        Primitive::RpcWrite,
    ];

    /// The primitives of DrTM+H Fig. 5.
    pub const FIG5: [Primitive; 6] = [
        Primitive::Read,
        Primitive::Write,
        Primitive::Cas,
        Primitive::Faa,
        Primitive::Rpc,
        Primitive::WriteRpc,
    ];

    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Primitive::Read => "read",
            Primitive::Write => "write",
            Primitive::Cas => "cas",
            Primitive::Faa => "faa",
            Primitive::Rpc => "rpc",
            Primitive::WriteRpc => "wrpc",
            Primitive::RpcWrite => "rpc-write",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Primitive> {
        Primitive::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether the primitive moves a fixed 8-byte word (payload does not apply).
    pub fn is_atomic(self) -> bool {
        matches!(self, Primitive::Cas | Primitive::Faa)
    }
}

/// The payload actually measured for a requested one: RPC replies are capped by the
/// frame header inside the MTU, so a 4 KiB request is measured at `RPC_PAYLOAD_MAX`.
pub fn effective_payload(p: Primitive, payload: u32) -> u32 {
    match p {
        Primitive::Cas | Primitive::Faa => 8,
        Primitive::Rpc | Primitive::RpcWrite => payload.min(RPC_PAYLOAD_MAX as u32 / 8 * 8),
        _ => payload,
    }
}

/// Largest payload a `wrpc` mailbox slot carries.
pub const WRPC_PAYLOAD_MAX: u32 = 1024;

/// Distinct payload-sized slots of the data region each node serves from: enough that
/// requests spread over memory, few enough to stay in cache (the simulator really
/// copies the bytes).
const DATA_SLOTS: u64 = 1024;

/// Request type of the RPC variant.
const GET: RpcType = RpcType(1);
/// Request type of the two-sided write.
const PUT: RpcType = RpcType(2);

/// CPU cost of checking one mailbox slot for a new message: one load that usually hits
/// the cache. An assumption; it is what makes WRITE-based RPC pay for polling.
const MAILBOX_SLOT_CHECK_NS: u64 = 1;

/// Benchmark parameters for one measurement.
#[derive(Copy, Clone, Debug)]
pub struct MicroParams {
    /// Coroutines per worker.
    pub coroutines: u16,
    /// Requests per doorbell batch (per gather for RPCs).
    pub batch: u16,
    /// Time before the measurement window opens.
    pub warmup_ns: u64,
    /// Length of the measurement window.
    pub measure_ns: u64,
    /// Seed for the coroutines' choices.
    pub seed: u64,
    /// RPC timeout.
    pub rpc_timeout_ns: u64,
    /// Let the runtime put several RPC frames to one destination in one datagram. Off
    /// measures the raw primitive (one request per message), as the paper does.
    pub rpc_coalescing: bool,
    /// Doorbell batching (DB): the requests of a batch to one connection share a
    /// doorbell, and a step's datagrams share one.
    pub doorbell: bool,
    /// Passive ACK (PA): one-sided requests signal only the last of each connection's
    /// group, and two-sided writes go one way (no reply). Off, every one-sided request
    /// is signaled and every RPC answered.
    pub passive_ack: bool,
}

impl MicroParams {
    /// The optimisations of the raw-primitive benchmark (Fig. 5): doorbell batching and
    /// one signal per connection group on, RPC coalescing off.
    pub fn fig5(coroutines: u16, batch: u16, warmup_ns: u64, measure_ns: u64, seed: u64) -> Self {
        MicroParams {
            coroutines,
            batch,
            warmup_ns,
            measure_ns,
            seed,
            rpc_timeout_ns: 1_000_000,
            rpc_coalescing: false,
            doorbell: true,
            passive_ack: true,
        }
    }
}

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    /// What was measured.
    pub primitive: Primitive,
    /// Payload in bytes (8 for atomics).
    pub payload: u32,
    /// Connections per peer per worker (1: the cluster as it is; 5: the 80-node setting).
    pub lanes: u16,
    /// Requests completed in the window, all nodes.
    pub ops: u64,
    /// Requests per second per node.
    pub ops_per_sec: f64,
    /// Median batch latency.
    pub p50_ns: u64,
    /// 99th-percentile batch latency.
    pub p99_ns: u64,
    /// Requests that failed (timeouts, errors).
    pub failures: u64,
    /// The measured window the rate is over (longer than asked when
    /// [`run_point_settled`] had to extend it).
    pub window_ns: u64,
}

use hytra_rt::window;
pub use hytra_rt::window::{RERUNS_MAX, SETTLED_OPS_MIN};

impl Point {
    /// Whether the window was long enough for what it measured: enough completions, and
    /// at least twice the 99th-percentile latency (a window shorter than the latency
    /// counts only the requests that happened to finish early, and reports a rate near
    /// zero and percentiles too low).
    pub fn settled(&self) -> bool {
        hytra_rt::window::settled(self.ops, self.window_ns, self.p99_ns)
    }
}

/// Why a measurement could not be made.
#[derive(Debug, Error)]
pub enum MicroError {
    /// Payload not a positive multiple of 8, or too large for the primitive.
    #[error("payload {payload} B: {reason}")]
    Payload {
        /// The payload.
        payload: u32,
        /// Why.
        reason: String,
    },
    /// Bad parameters.
    #[error("{0}")]
    Params(String),
    /// Even the longest window allowed did not settle the point ([`Point::settled`]).
    #[error(
        "the window is too short to measure: {ops} requests completed in {window_ns} ns (at least {SETTLED_OPS_MIN} and a window of twice the p99 latency, {p99_ns} ns, are needed); give a longer window"
    )]
    Unsettled {
        /// Requests completed in the last window tried.
        ops: u64,
        /// The last window tried.
        window_ns: u64,
        /// Its p99 latency.
        p99_ns: u64,
    },
    /// The cluster could not be set up or run.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Checks a primitive/payload combination.
pub fn check_payload(p: Primitive, payload: u32, mtu: usize) -> Result<(), MicroError> {
    let bad = |reason: String| Err(MicroError::Payload { payload, reason });
    if payload == 0 || payload % 8 != 0 {
        return bad("must be a positive multiple of 8".into());
    }
    if payload as usize > mtu {
        return bad(format!(
            "more than {mtu} B, the datagram MTU, which bounds every payload measured"
        ));
    }
    if matches!(p, Primitive::Rpc | Primitive::RpcWrite) && payload as usize > RPC_PAYLOAD_MAX {
        return bad(format!("an RPC reply carries at most {RPC_PAYLOAD_MAX} B"));
    }
    if p == Primitive::WriteRpc && payload > WRPC_PAYLOAD_MAX {
        return bad(format!("wrpc mailboxes carry at most {WRPC_PAYLOAD_MAX} B"));
    }
    Ok(())
}

/// Per-run accumulation of every coroutine's results.
#[derive(Default)]
struct Tally {
    ops: u64,
    failures: u64,
    hist: Histogram,
}

/// Regions of one measurement.
#[derive(Copy, Clone)]
struct Layout {
    data: Rkey,
    scratch: Rkey,
    /// `wrpc` request and reply mailboxes: one region per worker (keys `first + index`),
    /// each watched by its worker so the simulator wakes it when a message lands.
    inbox_first: Rkey,
    outbox_first: Rkey,
    /// Bytes of one mailbox slot (payload + sequence word).
    slot: u64,
    scratch_per_worker: u64,
}

impl Layout {
    fn inbox(&self, index: u16) -> Rkey {
        Rkey(self.inbox_first.0 + u32::from(index))
    }

    fn outbox(&self, index: u16) -> Rkey {
        Rkey(self.outbox_first.0 + u32::from(index))
    }
}

/// Measures one point on `backend` (a fresh cluster: a backend runs once).
pub fn run_point<B: Backend>(
    backend: &mut B,
    primitive: Primitive,
    payload: u32,
    params: MicroParams,
) -> Result<(Point, RunStats), MicroError> {
    let shape = backend.shape();
    if shape.nodes < 2 {
        return Err(MicroError::Params("the benchmark needs at least 2 nodes".into()));
    }
    if params.coroutines == 0
        || params.coroutines > COROUTINES_MAX
        || params.batch == 0
        || usize::from(params.batch) > BATCH_MAX
    {
        return Err(MicroError::Params(format!(
            "coroutines in 1..={COROUTINES_MAX} and batch in 1..={BATCH_MAX}"
        )));
    }
    let payload = effective_payload(primitive, payload);
    check_payload(primitive, payload, hytra_fabric::constants::DATAGRAM_MTU)?;
    // Each request's local buffer holds its payload and, for wrpc, a sequence word after it.
    let per_co = u64::from(params.batch) * (u64::from(payload) + 8);
    let slot = u64::from(payload) + 8;
    let slots_per_worker =
        u64::from(shape.nodes) * u64::from(params.coroutines) * u64::from(params.batch);
    let workers = u64::from(shape.workers_per_node);
    let data = backend.register_all(RegionSpec::new(DATA_SLOTS * u64::from(payload)))?;
    let scratch =
        backend.register_all(RegionSpec::new(workers * u64::from(params.coroutines) * per_co))?;
    // Mailboxes exist only for wrpc; others get token regions (keys stay dense).
    let mailbox_bytes = if primitive == Primitive::WriteRpc { slots_per_worker * slot } else { 8 };
    let mut mailboxes = |i: u16| {
        backend.register_all(RegionSpec { watcher: Some(i), ..RegionSpec::new(mailbox_bytes) })
    };
    let inbox_first = mailboxes(0)?;
    for i in 1..shape.workers_per_node {
        mailboxes(i)?;
    }
    let outbox_first = mailboxes(0)?;
    for i in 1..shape.workers_per_node {
        mailboxes(i)?;
    }
    let layout = Layout {
        data,
        scratch,
        inbox_first,
        outbox_first,
        slot,
        scratch_per_worker: u64::from(params.coroutines) * per_co,
    };
    let tally = Arc::new(Mutex::new(Tally::default()));
    let cfg = RtConfig {
        rpc_timeout_ns: params.rpc_timeout_ns,
        rpc_coalescing: params.rpc_coalescing,
        doorbell_batching: params.doorbell,
    };
    let limits =
        RunLimits { time_limit_ns: params.warmup_ns + params.measure_ns + params.rpc_timeout_ns };
    let (served, stats) = run_workers_with(
        backend,
        cfg,
        limits,
        |w| setup_worker(w, primitive, payload, params, layout, tally.clone()),
        |_, served| served.get(),
    )?;
    let mut tally = tally.lock().expect("no coroutine panicked holding the tally");
    if primitive == Primitive::RpcWrite {
        // With passive ACK nothing comes back to count: a two-sided write counts when
        // its target serves it (also without, for one measure).
        tally.ops = served.iter().sum();
    }
    let window_s = params.measure_ns as f64 / 1e9;
    let point = Point {
        primitive,
        payload,
        lanes: shape.lanes_per_peer,
        ops: tally.ops,
        ops_per_sec: tally.ops as f64 / window_s / f64::from(shape.nodes),
        p50_ns: tally.hist.quantile(0.5),
        p99_ns: tally.hist.quantile(0.99),
        failures: tally.failures,
        window_ns: params.measure_ns,
    };
    Ok((point, stats))
}

/// Measures one point with a window long enough for it: when a run does not settle
/// ([`Point::settled`]), runs it again on a fresh cluster (`fresh`) with the warm-up and
/// the window lengthened ([`hytra_rt::window::extend`]), up to [`RERUNS_MAX`] times or a
/// window of `window_max_ns`; then refuses it. A settled first run is returned as it is
/// (same trace).
pub fn run_point_settled<B: Backend>(
    mut fresh: impl FnMut() -> Result<B, BackendError>,
    primitive: Primitive,
    payload: u32,
    params: MicroParams,
    window_max_ns: u64,
) -> Result<(Point, RunStats), MicroError> {
    let asked = params.measure_ns;
    let measured = window::until_settled(asked, window_max_ns, |w| {
        let warmup_ns = window::scaled(params.warmup_ns, asked, w);
        let p = MicroParams { measure_ns: w, warmup_ns, ..params };
        let (point, stats) = run_point(&mut fresh()?, primitive, payload, p)?;
        let held =
            window::Held { ops: point.ops, window_ns: point.window_ns, p99_ns: point.p99_ns };
        Ok::<_, MicroError>(((point, stats), held))
    })?;
    measured.map(|(m, _)| m).map_err(|h| MicroError::Unsettled {
        ops: h.ops,
        window_ns: h.window_ns,
        p99_ns: h.p99_ns,
    })
}

fn setup_worker<E: Endpoint + 'static>(
    w: &mut Worker<E>,
    primitive: Primitive,
    payload: u32,
    params: MicroParams,
    layout: Layout,
    tally: Arc<Mutex<Tally>>,
) -> Rc<std::cell::Cell<u64>> {
    let served = Rc::new(std::cell::Cell::new(0));
    let me = w.co().me();
    let waiters = Rc::new(RefCell::new(Mailboxes::new(&w.co(), layout, params)));
    match primitive {
        Primitive::Rpc => {
            let data = w.co().region(layout.data).expect("data region");
            w.handle(
                GET,
                Box::new(move |ctx, req| {
                    let offset = u64::from_le_bytes(req[..8].try_into().expect("8-byte request"));
                    let len = usize::from(u16::from_le_bytes([req[8], req[9]]));
                    let at = ctx.reply.len();
                    ctx.reply.resize(at + len, 0);
                    data.read_bytes(offset, &mut ctx.reply[at..]);
                }),
            );
        }
        Primitive::RpcWrite => {
            let data = w.co().region(layout.data).expect("data region");
            let (start, end) = (params.warmup_ns, params.warmup_ns + params.measure_ns);
            let count = served.clone();
            w.handle(
                PUT,
                Box::new(move |ctx, req| {
                    let offset = u64::from_le_bytes(req[..8].try_into().expect("8-byte header"));
                    data.write_bytes(offset, &req[8..]);
                    if (start..end).contains(&ctx.ep.now_ns()) {
                        count.set(count.get() + 1);
                    }
                }),
            );
        }
        Primitive::WriteRpc => {
            let mb = waiters.clone();
            w.poll_with(Box::new(move |co| mb.borrow_mut().poll(co)));
        }
        _ => {}
    }
    for k in 0..params.coroutines {
        let stream = (w.co().shape().worker_index(me) as u64) << 16 | u64::from(k);
        let rng = Rng::derive(params.seed, stream);
        let tally = tally.clone();
        let waiters = waiters.clone();
        w.spawn(move |co| async move {
            let n = usize::from(params.batch);
            let shape = co.shape();
            let targets = Targets {
                rng,
                me: u64::from(co.me().node.0),
                nodes: u64::from(shape.nodes),
                lanes: u64::from(shape.lanes_per_peer),
                payload: u64::from(payload),
            };
            let mut c = Client {
                co,
                targets,
                k,
                primitive,
                payload,
                params,
                layout,
                mine: Tally::default(),
                qps: Vec::with_capacity(n),
                wrs: Vec::with_capacity(n),
                group: Vec::with_capacity(n),
                tickets: Vec::with_capacity(n),
            };
            c.run(&waiters).await;
            let mut t = tally.lock().expect("tally");
            t.ops += c.mine.ops;
            t.failures += c.mine.failures;
            t.hist.merge(&c.mine.hist);
        });
    }
    served
}

/// Where a coroutine's requests go, drawn at random. A batch works on a copy in locals,
/// so that the generator's state stays in registers (kept in the coroutine, its loads and
/// stores showed as a tenth of the benchmark's own time over UCX shared memory).
#[derive(Clone)]
struct Targets {
    rng: Rng,
    me: u64,
    nodes: u64,
    lanes: u64,
    payload: u64,
}

impl Targets {
    /// Any node but this one. Neither this nor [`Targets::lane`] draws from a range of
    /// one value: such draws decide nothing and cost a visible share of a request over
    /// UCX shared memory.
    fn peer(&mut self) -> NodeId {
        // A wrap-around instead of `%`, whose division also showed.
        let pick = self.me + 1 + if self.nodes == 2 { 0 } else { self.rng.below(self.nodes - 1) };
        NodeId((if pick >= self.nodes { pick - self.nodes } else { pick }) as u16)
    }

    /// Any connection to the chosen node.
    fn lane(&mut self) -> u16 {
        if self.lanes == 1 {
            0
        } else {
            self.rng.below(self.lanes) as u16
        }
    }

    /// A payload-aligned offset into the data region.
    fn offset(&mut self) -> u64 {
        self.rng.below(DATA_SLOTS) * self.payload
    }
}

/// One benchmark coroutine.
struct Client<E> {
    co: Co<E>,
    targets: Targets,
    k: u16,
    primitive: Primitive,
    payload: u32,
    params: MicroParams,
    layout: Layout,
    mine: Tally,
    /// Buffers reused across batches (the data path allocates nothing after warm-up):
    /// a batch's connections and requests, and one connection's share of them.
    qps: Vec<Qp>,
    wrs: Vec<WorkRequest<'static>>,
    group: Vec<WorkRequest<'static>>,
    tickets: Vec<OpTicket>,
}

impl<E: Endpoint> Client<E> {
    fn scratch(&self, i: u16) -> LocalAddr {
        let me = self.co.me().index;
        let stride = u64::from(self.payload) + 8;
        let per_co = u64::from(self.params.batch) * stride;
        let offset = u64::from(me) * self.layout.scratch_per_worker
            + u64::from(self.k) * per_co
            + u64::from(i) * stride;
        LocalAddr { rkey: self.layout.scratch, offset }
    }

    async fn run(&mut self, mailboxes: &Rc<RefCell<Mailboxes>>) {
        let (start, end) = (self.params.warmup_ns, self.params.warmup_ns + self.params.measure_ns);
        // A batch ends when the next one starts. Its span is measured in steps' start
        // times (the step that issued it to the step that resumed this coroutine), as
        // the minimal UCP program reads the clock once per turn of its loop: reading a
        // real clock in every coroutine per batch cost about 9% of the rate over UCX
        // shared memory.
        let mut t0 = self.co.step_time_ns();
        while t0 < end {
            let ok = match self.primitive {
                Primitive::Rpc => self.rpc_batch().await,
                Primitive::RpcWrite => self.rpc_write_batch().await,
                Primitive::WriteRpc => self.wrpc_batch(mailboxes).await,
                _ => self.one_sided_batch().await,
            };
            let t1 = self.co.step_time_ns();
            if (start..end).contains(&t1) {
                if ok {
                    self.mine.ops += u64::from(self.params.batch);
                    self.mine.hist.record(t1 - t0);
                } else {
                    self.mine.failures += u64::from(self.params.batch);
                }
            }
            t0 = t1;
        }
    }

    /// `batch` outstanding requests, each to a random connection (the paper picks "the
    /// QPs randomly to post upon issuing a request", §4.2), then waits for all. Requests
    /// that drew the same connection share a doorbell (outstanding requests plus doorbell
    /// batching); on a large cluster nearly every request gets its own.
    async fn one_sided_batch(&mut self) -> bool {
        let n = self.params.batch;
        let (mut qps, mut wrs) = (std::mem::take(&mut self.qps), std::mem::take(&mut self.wrs));
        if wrs.len() != usize::from(n) {
            self.fill_template(&mut qps, &mut wrs);
        }
        // Every batch is the same requests from the same buffers: only where each goes
        // (and a CAS's new value) is drawn again, in place. Building and copying them
        // afresh cost a few percent of the rate over UCX shared memory.
        let mut targets = self.targets.clone();
        for (qp, wr) in qps.iter_mut().zip(wrs.iter_mut()) {
            let node = targets.peer();
            *qp = Qp { node, lane: targets.lane() };
            *wr.remote_mut() =
                RemoteAddr { node, rkey: self.layout.data, offset: targets.offset() };
            if let WorkRequest::Cas { swap, .. } = wr {
                *swap = targets.rng.next_u64();
            }
        }
        self.targets = targets;
        // Inline small WRITEs, as the paper does below 64 bytes (§3.1).
        let small_write = self.primitive == Primitive::Write && self.payload <= 64;
        let flags = if small_write { OpFlags::INLINE } else { OpFlags::NONE };
        let mut tickets = std::mem::take(&mut self.tickets);
        let mut group = std::mem::take(&mut self.group);
        tickets.clear();
        let mut to_group = qps.len();
        if !(self.params.doorbell && self.params.passive_ack) {
            self.post_one_by_one(&qps, &wrs, flags, &mut tickets).await;
            to_group = 0;
        }
        // Group by connection, connections in order of first appearance and each
        // connection's requests in order. When the rest of the batch goes to one
        // connection (all of it, on two nodes with one lane), it is posted as it is,
        // without the copy.
        let mut grouped = [false; BATCH_MAX];
        for first in 0..to_group {
            if grouped[first] {
                continue;
            }
            let qp = qps[first];
            let rest_on_qp = qps[first..].iter().all(|&q| q == qp);
            let batch: &[WorkRequest<'static>] = if rest_on_qp {
                &wrs[first..]
            } else {
                group.clear();
                for (j, wr) in wrs.iter().enumerate().skip(first) {
                    if qps[j] == qp {
                        grouped[j] = true;
                        group.push(*wr);
                    }
                }
                &group
            };
            let t = loop {
                match self.co.issue_with(qp, batch, flags) {
                    Ok(t) => break t,
                    Err(OpError::Post(PostError::QueueFull)) => self.co.yield_now().await,
                    Err(e) => panic!("micro benchmark post failed: {e}"),
                }
            };
            tickets.push(t);
            if rest_on_qp {
                break;
            }
        }
        let mut ok = true;
        for &t in &tickets {
            ok &= self.co.wait(t).await.is_ok();
        }
        (self.qps, self.wrs, self.tickets, self.group) = (qps, wrs, tickets, group);
        ok
    }

    /// The batch's requests, each from its own scratch buffer, aimed nowhere yet
    /// ([`Client::one_sided_batch`] draws the targets).
    fn fill_template(&self, qps: &mut Vec<Qp>, wrs: &mut Vec<WorkRequest<'static>>) {
        let me = self.co.me().node;
        let remote = RemoteAddr { node: me, rkey: self.layout.data, offset: 0 };
        qps.clear();
        wrs.clear();
        for i in 0..self.params.batch {
            let local = self.scratch(i);
            let wr = match self.primitive {
                Primitive::Read => WorkRequest::Read { remote, local, len: self.payload },
                Primitive::Write => WorkRequest::Write {
                    remote,
                    src: WriteSrc::Local { addr: local, len: self.payload },
                },
                Primitive::Cas => WorkRequest::Cas { remote, local, compare: 0, swap: 0 },
                _ => WorkRequest::Faa { remote, local, add: 1 },
            };
            qps.push(Qp::to(me));
            wrs.push(wr);
        }
    }

    /// Posts each request on its own: one doorbell each unless doorbell batching defers
    /// them all to one ring per connection; every request signaled unless passive ACK
    /// leaves all but each connection's last unsignaled.
    async fn post_one_by_one(
        &mut self,
        qps: &[Qp],
        wrs: &[WorkRequest<'static>],
        flags: OpFlags,
        tickets: &mut Vec<OpTicket>,
    ) {
        let (db, pa) = (self.params.doorbell, self.params.passive_ack);
        for (idx, (&qp, &wr)) in qps.iter().zip(wrs).enumerate() {
            let last_on_qp = !qps[idx + 1..].contains(&qp);
            let signaled = !pa || last_on_qp;
            loop {
                let r = match (signaled, db) {
                    (true, true) => self.co.issue_deferred_with(qp, &[wr], flags).map(Some),
                    (true, false) => self.co.issue_with(qp, &[wr], flags).map(Some),
                    (false, true) => {
                        self.co.issue_unsignaled_deferred(qp, &[wr], flags).map(|_| None)
                    }
                    (false, false) => self.co.issue_unsignaled(qp, &[wr], flags).map(|_| None),
                };
                match r {
                    Ok(t) => {
                        tickets.extend(t);
                        break;
                    }
                    Err(OpError::Post(PostError::QueueFull)) => {
                        self.co.ring_doorbells();
                        self.co.yield_now().await
                    }
                    Err(e) => panic!("micro benchmark post failed: {e}"),
                }
            }
        }
        self.co.ring_doorbells();
    }

    async fn rpc_batch(&mut self) -> bool {
        let me = self.co.me();
        let n = usize::from(self.params.batch);
        let mut tickets = [None; BATCH_MAX];
        for t in tickets.iter_mut().take(n) {
            let dest = WorkerId { node: self.targets.peer(), index: me.index };
            let mut req = [0u8; 10];
            req[..8].copy_from_slice(&self.targets.offset().to_le_bytes());
            req[8..].copy_from_slice(&(self.payload as u16).to_le_bytes());
            *t = self.co.call_waiting(dest, GET, &req).await.ok();
        }
        let mut ok = true;
        for t in tickets.into_iter().take(n) {
            match t {
                Some(t) => {
                    ok &= self
                        .co
                        .reply(t, |r| r.len() == self.payload as usize)
                        .await
                        .unwrap_or(false)
                }
                None => ok = false,
            }
        }
        ok
    }

    /// `batch` two-sided writes to random peers; with passive ACK they go one way and
    /// nothing is waited for.
    async fn rpc_write_batch(&mut self) -> bool {
        let me = self.co.me();
        let n = usize::from(self.params.batch);
        let mut tickets = [None; BATCH_MAX];
        let mut req = [0u8; 8 + RPC_PAYLOAD_MAX];
        let len = 8 + self.payload as usize;
        for t in tickets.iter_mut().take(n) {
            let dest = WorkerId { node: self.targets.peer(), index: me.index };
            req[..8].copy_from_slice(&self.targets.offset().to_le_bytes());
            if self.params.passive_ack {
                // A full send queue is waited out: the NIC, not the coroutine, sets the
                // rate.
                while let Err(e) = self.co.send_oneway(dest, PUT, &req[..len]) {
                    match e {
                        RpcError::Post(PostError::QueueFull) => self.co.yield_now().await,
                        other => panic!("micro benchmark send failed: {other}"),
                    }
                }
            } else {
                *t = self.co.call_waiting(dest, PUT, &req[..len]).await.ok();
                if t.is_none() {
                    return false;
                }
            }
        }
        if self.params.passive_ack {
            // Nothing to wait for: let the step end so the messages leave.
            self.co.yield_now().await;
            return true;
        }
        let mut ok = true;
        for t in tickets.into_iter().take(n).flatten() {
            ok &= self.co.reply(t, |_| ()).await.is_ok();
        }
        ok
    }

    async fn wrpc_batch(&mut self, mailboxes: &Rc<RefCell<Mailboxes>>) -> bool {
        let me = self.co.me();
        let n = self.params.batch;
        for i in 0..n {
            let node = self.targets.peer();
            let seq = mailboxes.borrow_mut().next_seq(self.k, i, node);
            // Request: payload then the sequence word, in one WRITE into our slot of the
            // callee's inbox; a WRITE lands in address order, so the word comes last.
            let local = self.scratch(i);
            let lay = self.layout;
            self.co
                .region(lay.scratch)
                .expect("scratch")
                .store(local.offset + u64::from(self.payload), seq);
            let slot = mailbox_slot(&lay, me.node, self.k, i, self.params);
            let remote = RemoteAddr { node, rkey: lay.inbox(me.index), offset: slot };
            let wrs = [WorkRequest::Write {
                remote,
                src: WriteSrc::Local { addr: local, len: self.payload + 8 },
            }];
            if self.co.issue_unsignaled(Qp::to(node), &wrs, OpFlags::NONE).is_err() {
                return false;
            }
        }
        for i in 0..n {
            ReplyWait { mailboxes, k: self.k, i }.await;
        }
        true
    }
}

/// Offset, in a peer's mailbox, of the slot of coroutine `k`'s request `i` from `node`
/// (the same layout serves the inbox and the outbox).
fn mailbox_slot(l: &Layout, node: NodeId, k: u16, i: u16, p: MicroParams) -> u64 {
    let per_node = u64::from(p.coroutines) * u64::from(p.batch);
    let slot = u64::from(node.0) * per_node + u64::from(k) * u64::from(p.batch) + u64::from(i);
    slot * l.slot
}

/// The `wrpc` mailboxes of one worker: its poller answers requests that arrive in the
/// inbox and notices replies that arrive in the outbox.
struct Mailboxes {
    layout: Layout,
    params: MicroParams,
    me: WorkerId,
    /// Last sequence answered, per inbox slot.
    answered: Vec<u64>,
    /// Per outgoing (k, i): sequence sent, node it went to, sequence of the last reply,
    /// and the coroutine waiting for it.
    outgoing: Vec<Outgoing>,
}

#[derive(Clone, Default)]
struct Outgoing {
    sent: u64,
    node: u16,
    replied: u64,
    waker: Option<Waker>,
}

impl Mailboxes {
    fn new<E: Endpoint>(co: &Co<E>, layout: Layout, params: MicroParams) -> Mailboxes {
        let per_node = usize::from(params.coroutines) * usize::from(params.batch);
        Mailboxes {
            layout,
            params,
            me: co.me(),
            answered: vec![0; usize::from(co.shape().nodes) * per_node],
            outgoing: vec![Outgoing::default(); per_node],
        }
    }

    fn index(&self, k: u16, i: u16) -> usize {
        usize::from(k) * usize::from(self.params.batch) + usize::from(i)
    }

    fn next_seq(&mut self, k: u16, i: u16, node: NodeId) -> u64 {
        let idx = self.index(k, i);
        let o = &mut self.outgoing[idx];
        o.sent += 1;
        o.node = node.0;
        o.sent
    }

    /// Answers new requests and notices replies; returns whether anything happened.
    fn poll<E: Endpoint>(&mut self, co: &Co<E>) -> bool {
        let l = self.layout;
        let payload = l.slot - 8;
        let me = self.me.index;
        let (inbox, outbox) =
            (co.region(l.inbox(me)).expect("inbox"), co.region(l.outbox(me)).expect("outbox"));
        co.charge(MAILBOX_SLOT_CHECK_NS * (self.answered.len() + self.outgoing.len()) as u64);
        let per_node = self.outgoing.len();
        let batch = usize::from(self.params.batch);
        let mut worked = false;
        for idx in 0..self.answered.len() {
            let base = idx as u64 * l.slot;
            let seq = inbox.load(base + payload);
            if seq == self.answered[idx] {
                continue;
            }
            self.answered[idx] = seq;
            worked = true;
            // The reply echoes payload and sequence word into the caller's outbox slot.
            let node = NodeId((idx / per_node) as u16);
            let (k, i) = ((idx % per_node / batch) as u16, (idx % batch) as u16);
            let remote = RemoteAddr {
                node,
                rkey: l.outbox(me),
                offset: mailbox_slot(&l, self.me.node, k, i, self.params),
            };
            let src = WriteSrc::Local {
                addr: LocalAddr { rkey: l.inbox(me), offset: base },
                len: (payload + 8) as u32,
            };
            // Passive ACK: nobody waits for the reply's completion. A refused post (full
            // send queue) loses the reply; the caller then counts a failure at the end.
            let _ = co.issue_unsignaled(
                Qp::to(node),
                &[WorkRequest::Write { remote, src }],
                OpFlags::NONE,
            );
        }
        for (idx, o) in self.outgoing.iter_mut().enumerate() {
            if o.replied == o.sent {
                continue;
            }
            let (k, i) = ((idx / batch) as u16, (idx % batch) as u16);
            let slot = mailbox_slot(&l, NodeId(o.node), k, i, self.params);
            if outbox.load(slot + payload) == o.sent {
                o.replied = o.sent;
                if let Some(w) = o.waker.take() {
                    w.wake();
                }
                worked = true;
            }
        }
        worked
    }
}

/// Waits until the reply of outgoing slot `(k, i)` has arrived.
struct ReplyWait<'a> {
    mailboxes: &'a Rc<RefCell<Mailboxes>>,
    k: u16,
    i: u16,
}

impl std::future::Future for ReplyWait<'_> {
    type Output = ();
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let mut mb = self.mailboxes.borrow_mut();
        let idx = mb.index(self.k, self.i);
        let o = &mut mb.outgoing[idx];
        if o.replied == o.sent {
            return std::task::Poll::Ready(());
        }
        o.waker = Some(cx.waker().clone());
        std::task::Poll::Pending
    }
}
