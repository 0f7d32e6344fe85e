//! The `hytra io` measurements: random reads (local baseline, fabric only, remote with
//! an engine) and trace replay, on any backend.
//!
//! Node 0 requests; node 1 owns the file and serves it. `connections` workers per node
//! pair up (requester worker i talks to serving worker i); each requester runs `depth`
//! coroutines, each with one read outstanding. The local baseline runs the same engine
//! on node 0 with no fabric in between.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use hytra_fabric::disk::DiskFile;
use hytra_fabric::rng::Rng;
use hytra_fabric::{Backend, BackendError, Endpoint, NodeId, Rkey, RunLimits};
use hytra_rt::hist::Histogram;
use hytra_rt::{run_workers_with, Co, RtConfig};
use thiserror::Error;

use crate::client::{ClientConfig, ClientStats, IoClient};
use crate::engine::{Engine, EngineKind, NodeIo, Timing};
use crate::export::{Exports, FileId};
use crate::service::{serve, IoLayout, ServiceConfig, ServiceStats};
use crate::trace::TraceOp;

/// What is measured.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// Reads of the local file, no fabric (the baseline).
    Local,
    /// Requests and WRITEs back with no storage access at the owner.
    Fabric,
    /// Reads of the owner's file through the fabric.
    Remote,
}

impl Mode {
    /// Name for tables.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Fabric => "fabric",
            Mode::Remote => "remote",
        }
    }
}

/// One measurement's settings.
#[derive(Copy, Clone, Debug)]
pub struct IoParams {
    /// What is measured.
    pub mode: Mode,
    /// The engine (ignored for `Fabric`, which uses none).
    pub engine: EngineKind,
    /// Bytes per read.
    pub size: u32,
    /// Workers per node (connections between requester and owner).
    pub connections: u16,
    /// Reads outstanding per requesting worker.
    pub depth: u16,
    /// Measured time.
    pub duration_ns: u64,
    /// Time before measuring.
    pub warmup_ns: u64,
    /// Seed of the offsets.
    pub seed: u64,
    /// Reads up to this size return inside `DONE`.
    pub inline_max: u32,
    /// How long a read waits for its answer.
    pub timeout_ns: u64,
}

/// One measurement's result.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct IoReport {
    /// What was measured.
    pub mode: Mode,
    /// Engine name.
    pub engine: String,
    /// I/O threads of a pool engine.
    pub io_threads: Option<u16>,
    /// Bytes per read.
    pub size: u32,
    /// Workers per node.
    pub connections: u16,
    /// Reads outstanding per requesting worker.
    pub depth: u16,
    /// Reads completed in the measured window (or the whole trace).
    pub reads: u64,
    /// Length of the window in seconds (virtual on the simulator).
    pub seconds: f64,
    /// The window asked for, in seconds, when [`run_settled`] had to lengthen it
    /// (`seconds` is the window measured).
    #[serde(default)]
    pub extended_from_s: Option<f64>,
    /// Reads per second.
    pub iops: f64,
    /// Payload throughput.
    pub mib_per_s: f64,
    /// Latency percentiles of one read, microseconds.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// Reads that failed (refused or timed out).
    pub errors: u64,
    /// Whether the file was read with O_DIRECT (page cache bypassed).
    pub direct: bool,
    /// Requester counters, summed.
    pub client: ClientStats,
    /// Owner counters, summed.
    pub service: ServiceStats,
}

/// Why a measurement could not run.
#[derive(Debug, Error)]
pub enum BenchError {
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Settings that cannot work.
    #[error("{0}")]
    Params(String),
    /// Engine threads or rings could not be set up.
    #[error("engine: {0}")]
    Engine(#[from] std::io::Error),
    /// Even the longest window allowed was too short for what it measured
    /// ([`hytra_rt::window::settled`]).
    #[error(
        "{size} B reads: the window is too short to measure: {reads} reads completed in {window_s} s (at least {min} and a window of twice the p99 latency, {p99_us} µs, are needed); give a longer --duration",
        min = hytra_rt::window::SETTLED_OPS_MIN
    )]
    Unsettled {
        /// Bytes per read.
        size: u32,
        /// Reads completed in the last window tried.
        reads: u64,
        /// That window, seconds.
        window_s: f64,
        /// Its p99 latency, microseconds.
        p99_us: f64,
    },
}

/// The file a measurement reads: the owner's export table and the file's id in it.
#[derive(Clone)]
pub struct Target {
    /// The exports of the owner (node 1; node 0 in local mode).
    pub exports: Arc<Exports>,
    /// The file.
    pub file: FileId,
}

/// What one worker measured: latencies and counts of the reads that completed inside
/// the window (all reads when there is none), and the first start and last end among
/// them. Counting by completion keeps the rate unbiased however long a read takes: a
/// count of reads both issued and completed in the window would miss one latency's
/// worth of reads at its end.
struct Recorder {
    window: Option<(u64, u64)>,
    hist: RefCell<Histogram>,
    reads: Cell<u64>,
    errors: Cell<u64>,
    span: Cell<(u64, u64)>,
}

impl Recorder {
    fn new(window: Option<(u64, u64)>) -> Recorder {
        Recorder {
            window,
            hist: RefCell::new(Histogram::new()),
            reads: Cell::new(0),
            errors: Cell::new(0),
            span: Cell::new((u64::MAX, 0)),
        }
    }

    /// Whether a coroutine that started at `start` may begin a read at `now`.
    fn open(&self, start: u64, now: u64) -> bool {
        self.window.is_none_or(|(_, end)| now - start < end)
    }

    /// A read issued at `t` ended at `done`.
    fn note(&self, start: u64, t: u64, done: u64, ok: bool) {
        if !ok {
            self.errors.set(self.errors.get() + 1);
            return;
        }
        let inside = match self.window {
            Some((from, end)) => (from..=end).contains(&(done - start)),
            None => true,
        };
        if inside {
            self.hist.borrow_mut().record(done - t);
            self.reads.set(self.reads.get() + 1);
            let (a, b) = self.span.get();
            self.span.set((a.min(t), b.max(done)));
        }
    }
}

/// How a requesting coroutine reads: the engine on its own node (local baseline) or
/// the I/O client (fabric and remote modes).
enum Reader<E> {
    Local { engine: Engine, file: Arc<DiskFile>, slot: u64, rkey: Rkey },
    Remote { client: IoClient<E>, owner: NodeId, file: FileId, finished: Rc<Cell<u16>> },
}

impl<E: Endpoint + 'static> Reader<E> {
    async fn read(&self, co: &Co<E>, op: TraceOp) -> bool {
        match self {
            Reader::Local { engine, file, slot, rkey } => {
                let region = co.region(*rkey).expect("the I/O region is registered");
                engine.read(co, file, op.offset, op.len, &region, *slot).await.is_ok()
            }
            Reader::Remote { client, owner, file, .. } => {
                client.read_with(*owner, *file, op.offset, op.len, |_, _, _| ()).await.is_ok()
            }
        }
    }

    /// The coroutine is done; the last of a worker's `depth` says `BYE` to the owner.
    fn finish(&self, depth: u16) {
        if let Reader::Remote { client, owner, finished, .. } = self {
            finished.set(finished.get() + 1);
            if finished.get() == depth {
                // Lost, the owner's serving worker runs on to the time limit.
                let _ = client.bye(*owner);
            }
        }
    }
}

struct PerWorker<E> {
    rec: Rc<Recorder>,
    client: Option<IoClient<E>>,
    service: Option<Rc<RefCell<ServiceStats>>>,
}

struct Summary {
    hist: Histogram,
    reads: u64,
    errors: u64,
    span: (u64, u64),
    client: ClientStats,
    service: ServiceStats,
}

fn check_shape<B: Backend>(b: &B, p: &IoParams) -> Result<(), BenchError> {
    let s = b.shape();
    if s.nodes < 2 && p.mode != Mode::Local {
        return Err(BenchError::Params("remote and fabric modes need 2 nodes".into()));
    }
    if s.workers_per_node != p.connections {
        return Err(BenchError::Params(format!(
            "the cluster has {} workers per node, the run wants {} connections",
            s.workers_per_node, p.connections
        )));
    }
    if p.depth == 0 || p.size == 0 {
        return Err(BenchError::Params("depth and size must be positive".into()));
    }
    if p.inline_max > crate::wire::INLINE_MAX {
        return Err(BenchError::Params(format!(
            "reads inline up to {} B: at most {} B fit in a completion datagram",
            p.inline_max,
            crate::wire::INLINE_MAX
        )));
    }
    Ok(())
}

/// Random reads: the offsets are uniform over the file, aligned to the read size.
pub fn run<B: Backend>(
    b: &mut B,
    target: &Target,
    p: &IoParams,
    timing: Timing,
) -> Result<IoReport, BenchError> {
    let file_len = target.exports.get(target.file).map(|f| f.file.len()).unwrap_or(0);
    if file_len < u64::from(p.size) {
        return Err(BenchError::Params(format!(
            "the file ({file_len} B) is smaller than one read"
        )));
    }
    let blocks = file_len / u64::from(p.size);
    let size = p.size;
    let ops = move |rng: &mut Rng, _: u64| {
        Some(TraceOp { offset: rng.below(blocks) * u64::from(size), len: size })
    };
    let end = p.warmup_ns + p.duration_ns;
    let (s, direct) = drive(b, target, p, timing, ops, Some((p.warmup_ns, end)))?;
    let seconds = p.duration_ns as f64 / 1e9;
    Ok(report(p, s, seconds, direct))
}

/// [`run`] over a window long enough for it: when a run does not settle
/// ([`hytra_rt::window::settled`]), runs it again on a fresh cluster (`fresh`) with the warm-up
/// and the window lengthened ([`hytra_rt::window::extend`]), up to a window of
/// `window_max_ns`; then refuses it. A settled first run is returned as it is.
pub fn run_settled<B: Backend>(
    mut fresh: impl FnMut() -> Result<B, BackendError>,
    target: &Target,
    p: &IoParams,
    timing: Timing,
    window_max_ns: u64,
) -> Result<IoReport, BenchError> {
    use hytra_rt::window;
    let asked = p.duration_ns;
    let measured = window::until_settled(asked, window_max_ns, |w| {
        let warmup_ns = window::scaled(p.warmup_ns, asked, w);
        let params = IoParams { duration_ns: w, warmup_ns, ..*p };
        let r = run(&mut fresh()?, target, &params, timing)?;
        let held =
            window::Held { ops: r.reads, window_ns: w, p99_ns: (r.p99_us * 1e3).ceil() as u64 };
        Ok::<_, BenchError>((r, held))
    })?;
    match measured {
        Ok((mut r, reruns)) => {
            r.extended_from_s = (reruns > 0).then_some(asked as f64 / 1e9);
            Ok(r)
        }
        Err(h) => Err(BenchError::Unsettled {
            size: p.size,
            reads: h.ops,
            window_s: h.window_ns as f64 / 1e9,
            p99_us: h.p99_ns as f64 / 1e3,
        }),
    }
}

/// Replays `trace` (split round-robin over the requesting workers, each replaying its
/// share with `depth` reads in flight); `seconds` is the time until the last read.
pub fn replay<B: Backend>(
    b: &mut B,
    target: &Target,
    p: &IoParams,
    timing: Timing,
    trace: Arc<Vec<TraceOp>>,
) -> Result<IoReport, BenchError> {
    let file_len = target.exports.get(target.file).map(|f| f.file.len()).unwrap_or(0);
    if let Some(bad) = trace.iter().find(|o| o.offset + u64::from(o.len) > file_len) {
        return Err(BenchError::Params(format!(
            "trace read {}+{} ends past the file ({file_len} B)",
            bad.offset, bad.len
        )));
    }
    let max = trace.iter().map(|o| o.len).max().unwrap_or(1);
    let ops = move |_: &mut Rng, i: u64| trace.get(i as usize).copied();
    let p2 = IoParams { size: max, ..*p };
    let (s, direct) = drive(b, target, &p2, timing, ops, None)?;
    let seconds = s.span.1.saturating_sub(s.span.0) as f64 / 1e9;
    let mut rep = report(&p2, s, seconds, direct);
    rep.size = max;
    Ok(rep)
}

fn report(p: &IoParams, s: Summary, seconds: f64, direct: bool) -> IoReport {
    let iops = s.reads as f64 / seconds.max(1e-9);
    let engine = if p.mode == Mode::Fabric { EngineKind::NoIo } else { p.engine };
    IoReport {
        mode: p.mode,
        engine: engine.name().to_string(),
        io_threads: match engine {
            EngineKind::Pool { threads } => Some(threads),
            _ => None,
        },
        size: p.size,
        connections: p.connections,
        depth: p.depth,
        reads: s.reads,
        seconds,
        extended_from_s: None,
        iops,
        mib_per_s: iops * f64::from(p.size) / f64::from(1 << 20),
        p50_us: s.hist.quantile(0.5) as f64 / 1e3,
        p99_us: s.hist.quantile(0.99) as f64 / 1e3,
        errors: s.errors,
        direct,
        client: s.client,
        service: s.service,
    }
}

/// Runs requesters that take reads from `next(rng, i)` (i counts reads of the whole
/// run, interleaved over workers) until it returns `None` or the window ends.
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
fn drive<B, N>(
    b: &mut B,
    target: &Target,
    p: &IoParams,
    timing: Timing,
    next: N,
    window: Option<(u64, u64)>,
) -> Result<(Summary, bool), BenchError>
where
    B: Backend,
    N: Fn(&mut Rng, u64) -> Option<TraceOp> + Sync + Send + Clone + 'static,
{
    check_shape(b, p)?;
    let engine_kind = if p.mode == Mode::Fabric { EngineKind::NoIo } else { p.engine };
    let owner = if p.mode == Mode::Local { NodeId(0) } else { NodeId(1) };
    let layout = IoLayout {
        workers: p.connections,
        server_slots: if p.mode == Mode::Local { 0 } else { p.depth },
        client_slots: p.depth,
        max_len: p.size,
    };
    let rkey = layout.register(b)?;
    let node_io = NodeIo::new(engine_kind, timing)?;
    let direct = target.exports.get(target.file).is_some_and(|f| f.file.direct());
    let cfg = RtConfig { rpc_timeout_ns: p.timeout_ns, ..RtConfig::default() };
    let time_limit_ns =
        window.map_or(u64::MAX / 4, |(_, end)| end + p.timeout_ns * 4 + 2_000_000_000);
    let workers = u64::from(p.connections);
    let (depth, file_id) = (p.depth, target.file);
    let (results, _) = run_workers_with(
        b,
        cfg,
        RunLimits { time_limit_ns },
        |w| {
            let me = w.co().me();
            let mut st =
                PerWorker { rec: Rc::new(Recorder::new(window)), client: None, service: None };
            let requester = match (p.mode, me.node.0) {
                (Mode::Local, 0) => true,
                (Mode::Local, _) => false,
                (_, 1) => {
                    let engine = Engine::install(w, &node_io, p.size)
                        .expect("engine setup was checked by NodeIo");
                    let cfg = ServiceConfig {
                        layout,
                        rkey,
                        inline_max: p.inline_max,
                        queue_max: usize::from(p.depth) * 4,
                        byes_expected: Some(1),
                    };
                    st.service = Some(serve(w, target.exports.clone(), engine, cfg));
                    false
                }
                (_, 0) => {
                    let cfg = ClientConfig { layout, rkey, timeout_ns: p.timeout_ns };
                    st.client = Some(IoClient::install(w, cfg));
                    true
                }
                _ => false,
            };
            if !requester {
                return st;
            }
            let engine = (p.mode == Mode::Local).then(|| {
                Engine::install(w, &node_io, p.size).expect("engine setup was checked by NodeIo")
            });
            let finished = Rc::new(Cell::new(0u16));
            for c in 0..p.depth {
                let reader = match (&engine, &st.client) {
                    (Some(engine), _) => Reader::Local {
                        engine: engine.clone(),
                        file: target.exports.get(file_id).expect("target exported").file.clone(),
                        slot: layout.client_slot(me.index, c),
                        rkey,
                    },
                    (None, Some(client)) => Reader::Remote {
                        client: client.clone(),
                        owner,
                        file: file_id,
                        finished: finished.clone(),
                    },
                    (None, None) => unreachable!("a requester has an engine or a client"),
                };
                let (rec, next) = (st.rec.clone(), next.clone());
                let seed = p.seed ^ (u64::from(me.index) << 32) ^ u64::from(c);
                w.spawn(move |co| async move {
                    let mut rng = Rng::new(seed);
                    let start = co.now_ns();
                    // Trace replay: worker w, coroutine c takes reads w + k * workers with
                    // k = c, c + depth, ... (random reads ignore the index).
                    let mut k = u64::from(c);
                    while let Some(op) = next(&mut rng, u64::from(me.index) + k * workers) {
                        let t = co.now_ns();
                        if !rec.open(start, t) {
                            break;
                        }
                        let ok = reader.read(&co, op).await;
                        rec.note(start, t, co.now_ns(), ok);
                        k += u64::from(depth);
                    }
                    reader.finish(depth);
                });
            }
            st
        },
        |_w, st| Summary {
            hist: st.rec.hist.borrow().clone(),
            reads: st.rec.reads.get(),
            errors: st.rec.errors.get(),
            span: st.rec.span.get(),
            client: st.client.as_ref().map(IoClient::stats).unwrap_or_default(),
            service: st.service.as_ref().map(|s| s.borrow().clone()).unwrap_or_default(),
        },
    )?;
    let mut total = Summary {
        hist: Histogram::new(),
        reads: 0,
        errors: 0,
        span: (u64::MAX, 0),
        client: ClientStats::default(),
        service: ServiceStats::default(),
    };
    for r in results {
        total.hist.merge(&r.hist);
        total.reads += r.reads;
        total.errors += r.errors;
        total.span = (total.span.0.min(r.span.0), total.span.1.max(r.span.1));
        add_client(&mut total.client, &r.client);
        add_service(&mut total.service, &r.service);
    }
    if total.span.0 == u64::MAX {
        total.span = (0, 0);
    }
    Ok((total, direct))
}

fn add_client(a: &mut ClientStats, b: &ClientStats) {
    a.completed += b.completed;
    a.refused += b.refused;
    a.timeouts += b.timeouts;
    a.late += b.late;
}

fn add_service(a: &mut ServiceStats, b: &ServiceStats) {
    a.served += b.served;
    a.refused += b.refused;
    a.io_failures += b.io_failures;
    a.write_failures += b.write_failures;
    a.done_lost += b.done_lost;
    a.malformed += b.malformed;
    a.dropped += b.dropped;
}
