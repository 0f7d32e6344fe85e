//! Engines: how a node performs the storage reads it serves (or, in the local baseline,
//! its own reads).
//!
//! - `Pool`: a static pool of I/O threads per node, started before the run; the worker
//!   hands each read to it through a queue (the paper's winning design).
//! - `ThreadPerRequest`: a new OS thread per read (the paper's baseline, kept to show
//!   why not).
//! - `Uring`: io_uring per worker; reads queued during a step are submitted together
//!   and reaped by polling, with no thread per read.
//! - `NoIo`: no storage access at all (the paper's "RDMA communication" measurement):
//!   the buffer is returned as it is.
//!
//! With real timing, completions come back from threads or the kernel and a per-worker
//! poller wakes the waiting coroutine. With modelled timing (the simulator), a read
//! reserves time on a modelled device ([`DeviceModel`]) and on the modelled engine
//! (pool threads, thread creation on the worker's CPU), sleeps in virtual time until
//! then, and then reads the real bytes, so data is exact and timing is the model's.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use hytra_fabric::disk::{AlignedBuf, DiskFile, UringReader, DIRECT_ALIGN};
use hytra_fabric::{Endpoint, Region};
use hytra_rt::{Co, Worker};

/// Which engine performs reads.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum EngineKind {
    /// A static pool of this many I/O threads per node.
    Pool {
        /// Threads in the pool.
        threads: u16,
    },
    /// A new thread for every read.
    ThreadPerRequest,
    /// io_uring, this many reads in flight per worker.
    Uring {
        /// Ring slots per worker.
        depth: u32,
    },
    /// No storage access.
    NoIo,
}

impl EngineKind {
    /// Short name for tables.
    pub fn name(&self) -> &'static str {
        match self {
            EngineKind::Pool { .. } => "pool",
            EngineKind::ThreadPerRequest => "thread",
            EngineKind::Uring { .. } => "uring",
            EngineKind::NoIo => "none",
        }
    }
}

/// A modelled storage device set (for the simulator): `devices` identical SSDs striped
/// by `stripe_bytes`; each has `channels` reads in progress at once, each taking
/// `latency_ns`, then a transfer over the device's link at `bytes_per_sec`.
#[derive(Copy, Clone, PartialEq, Debug, serde::Serialize, serde::Deserialize)]
pub struct DeviceModel {
    /// Number of devices.
    pub devices: u16,
    /// Concurrent reads per device (flash dies and planes the controller keeps busy).
    pub channels: u16,
    /// Time of one read inside the device, before transfer.
    pub latency_ns: u64,
    /// Transfer rate of one device.
    pub bytes_per_sec: u64,
    /// Striping unit across devices.
    pub stripe_bytes: u64,
}

impl DeviceModel {
    /// The remote-I/O paper's storage: ten Intel SSDPE2MD800G4 (DC P3700, 800 GB) NVMe
    /// drives. Datasheet figures: 2,800 MB/s sequential read, about 460 K IOPS of 4 KiB
    /// random reads. Assumed: 85 µs per read inside the device and 40 concurrent reads,
    /// which gives 470 K IOPS per drive for small reads (the paper measured 4.8 M IOPS
    /// over ten drives at 512 B).
    pub const P3700_X10: DeviceModel = DeviceModel {
        devices: 10,
        channels: 40,
        latency_ns: 85_000,
        bytes_per_sec: 2_800_000_000,
        stripe_bytes: 1 << 20,
    };

    /// One such drive.
    pub const P3700: DeviceModel = DeviceModel { devices: 1, ..DeviceModel::P3700_X10 };

    /// A model by name (`p3700x10`, `p3700`).
    pub fn by_name(name: &str) -> Option<DeviceModel> {
        match name {
            "p3700x10" => Some(DeviceModel::P3700_X10),
            "p3700" => Some(DeviceModel::P3700),
            _ => None,
        }
    }

    /// Reads per second for `len`-byte reads with enough of them in flight.
    pub fn max_iops(&self, len: u64) -> f64 {
        let per_dev_channels = f64::from(self.channels) * 1e9 / self.latency_ns as f64;
        let per_dev_link = self.bytes_per_sec as f64 / len.max(1) as f64;
        f64::from(self.devices) * per_dev_channels.min(per_dev_link)
    }
}

/// CPU costs of the engines in modelled runs. `spawn_ns` and `handoff_ns` are medians
/// measured by [`calibrate`] on a 2-core shared VM (`hytra io --calibrate` prints them
/// for yours: 11.6-13.2 µs in three of four runs, one outlier of 73.8 µs next to a
/// build, and 3.9-4.2 µs in all four); `uring_ns` is an assumption
/// (one SQE prepared and one CQE reaped, amortised over a batch's system call).
#[derive(Copy, Clone, PartialEq, Debug, serde::Serialize, serde::Deserialize)]
pub struct EngineCosts {
    /// Creating and starting a thread, charged to the serving worker per read.
    pub spawn_ns: u64,
    /// Handing a read to a waiting pool thread and getting it back (queue + wake-up).
    pub handoff_ns: u64,
    /// Queueing one io_uring read and reaping it, charged to the worker.
    pub uring_ns: u64,
}

impl Default for EngineCosts {
    fn default() -> Self {
        EngineCosts { spawn_ns: 12_000, handoff_ns: 4_000, uring_ns: 1_500 }
    }
}

/// How engine timing is obtained.
#[derive(Copy, Clone, PartialEq, Debug)]
pub enum Timing {
    /// Real threads and the real device (local and ucx backends).
    Real,
    /// The simulator: a modelled device and engine costs, in virtual time.
    Modelled {
        /// The device.
        device: DeviceModel,
        /// Engine CPU costs.
        costs: EngineCosts,
    },
}

/// Why an engine read failed.
pub type ReadFailure = io::ErrorKind;

/// A read handed to an I/O thread.
struct Job {
    file: Arc<DiskFile>,
    offset: u64,
    len: usize,
    dst: Region,
    dst_offset: u64,
    tag: u64,
    done: Sender<(u64, Result<(), ReadFailure>)>,
}

thread_local! {
    static SCRATCH: RefCell<(AlignedBuf, Vec<u8>)> = RefCell::new((AlignedBuf::new(0), Vec::new()));
}

/// Copies `bytes` into `dst` at `dst_offset` (8-aligned), padding the tail word with
/// zeros (registered memory is written in whole words).
pub(crate) fn put_padded(dst: &Region, dst_offset: u64, bytes: &[u8], pad: &mut Vec<u8>) {
    let whole = bytes.len() / 8 * 8;
    if whole > 0 {
        dst.write_bytes(dst_offset, &bytes[..whole]);
    }
    if whole < bytes.len() {
        pad.clear();
        pad.extend_from_slice(&bytes[whole..]);
        pad.resize(8, 0);
        dst.write_bytes(dst_offset + whole as u64, pad);
    }
}

/// Reads `len` bytes of `file` at `offset` into `dst`, with this thread's scratch.
fn read_into(
    file: &DiskFile,
    offset: u64,
    len: usize,
    dst: &Region,
    dst_offset: u64,
) -> Result<(), ReadFailure> {
    SCRATCH.with(|s| {
        let (scratch, pad) = &mut *s.borrow_mut();
        let need = len + 2 * DIRECT_ALIGN;
        if scratch.len() < need {
            *scratch = AlignedBuf::new(need);
        }
        let bytes = file.read_at(offset, len, scratch).map_err(|e| e.kind())?;
        put_padded(dst, dst_offset, bytes, pad);
        Ok(())
    })
}

fn run_job(job: Job) {
    let r = read_into(&job.file, job.offset, job.len, &job.dst, job.dst_offset);
    // The requesting worker may be gone (run over); nothing to tell then.
    let _ = job.done.send((job.tag, r));
}

/// A node's static pool of I/O threads. Dropping it stops and joins them.
pub struct IoPool {
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl IoPool {
    /// Starts `threads` I/O threads.
    pub fn start(threads: u16) -> io::Result<IoPool> {
        let (tx, rx): (Sender<Job>, Receiver<Job>) = crossbeam_channel::unbounded();
        let mut handles = Vec::new();
        for i in 0..threads {
            let rx = rx.clone();
            let h = std::thread::Builder::new().name(format!("hytra-io-{i}")).spawn(move || {
                while let Ok(job) = rx.recv() {
                    run_job(job);
                }
            })?;
            handles.push(h);
        }
        Ok(IoPool { jobs: Some(tx), threads: handles })
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.jobs = None;
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

/// Modelled device and pool state of one node, shared by its workers.
#[derive(Debug)]
struct ModelState {
    /// Per device: when each channel is free, when its link is free.
    channels: Vec<Vec<u64>>,
    link_free: Vec<u64>,
    /// When each modelled pool thread is free.
    pool_free: Vec<u64>,
}

impl ModelState {
    /// Everything idle at time 0.
    fn new(device: &DeviceModel, pool_threads: usize) -> ModelState {
        ModelState {
            channels: vec![vec![0; usize::from(device.channels)]; usize::from(device.devices)],
            link_free: vec![0; usize::from(device.devices)],
            pool_free: vec![0; pool_threads],
        }
    }
}

/// What a node's engines share: the I/O pool (real timing) or the modelled device
/// (modelled timing). Build one per node before the run and hand a clone to each
/// worker's [`Engine`].
#[derive(Clone)]
pub struct NodeIo {
    kind: EngineKind,
    timing: Timing,
    pool: Option<Arc<IoPool>>,
    model: Option<Arc<Mutex<ModelState>>>,
}

impl NodeIo {
    /// Prepares a node's engine state (starts the I/O pool for `Pool` with real timing).
    pub fn new(kind: EngineKind, timing: Timing) -> io::Result<NodeIo> {
        let pool = match (kind, timing) {
            (EngineKind::Pool { threads }, Timing::Real) => Some(Arc::new(IoPool::start(threads)?)),
            _ => None,
        };
        let model = match timing {
            Timing::Real => None,
            Timing::Modelled { device, .. } => {
                let pool_threads = match kind {
                    EngineKind::Pool { threads } => usize::from(threads),
                    _ => 0,
                };
                Some(Arc::new(Mutex::new(ModelState::new(&device, pool_threads))))
            }
        };
        if let EngineKind::Pool { threads: 0 } = kind {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an I/O pool needs threads"));
        }
        Ok(NodeIo { kind, timing, pool, model })
    }

    /// The engine kind.
    pub fn kind(&self) -> EngineKind {
        self.kind
    }
}

/// A read waiting for its completion.
struct Pending {
    waker: Option<Waker>,
    result: Option<Result<(), ReadFailure>>,
    /// For io_uring: where the bytes go once reaped.
    dst: Option<(Region, u64)>,
}

struct EngineState {
    pending: Vec<Option<Pending>>,
    free: Vec<u64>,
    done_tx: Sender<(u64, Result<(), ReadFailure>)>,
    done_rx: Receiver<(u64, Result<(), ReadFailure>)>,
    uring: Option<UringReader>,
    pad: Vec<u8>,
    scratch: AlignedBuf,
    reads: u64,
}

impl EngineState {
    fn start(&mut self, dst: Option<(Region, u64)>) -> u64 {
        let tag = match self.free.pop() {
            Some(t) => t,
            None => {
                self.pending.push(None);
                (self.pending.len() - 1) as u64
            }
        };
        self.pending[tag as usize] = Some(Pending { waker: None, result: None, dst });
        tag
    }

    fn settle(&mut self, tag: u64, r: Result<(), ReadFailure>) {
        if let Some(p) = self.pending.get_mut(tag as usize).and_then(Option::as_mut) {
            p.result = Some(r);
            if let Some(w) = p.waker.take() {
                w.wake();
            }
        }
    }
}

/// One worker's engine handle. Cheap to clone; not `Send` (it lives on its worker).
#[derive(Clone)]
pub struct Engine {
    node: NodeIo,
    state: Rc<RefCell<EngineState>>,
}

impl Engine {
    /// The engine of the worker `w`, sharing `node`'s pool or model; installs the poller
    /// that reaps completions (real timing). `max_len` bounds one read.
    pub fn install<E: Endpoint + 'static>(
        w: &mut Worker<E>,
        node: &NodeIo,
        max_len: u32,
    ) -> io::Result<Engine> {
        let uring = match (node.kind, node.timing) {
            (EngineKind::Uring { depth }, Timing::Real) => {
                Some(UringReader::new(depth, max_len as usize)?)
            }
            _ => None,
        };
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let state = Rc::new(RefCell::new(EngineState {
            pending: Vec::new(),
            free: Vec::new(),
            done_tx,
            done_rx,
            uring,
            pad: Vec::new(),
            scratch: AlignedBuf::new(max_len as usize + 2 * DIRECT_ALIGN),
            reads: 0,
        }));
        let engine = Engine { node: node.clone(), state };
        if node.timing == Timing::Real && node.kind != EngineKind::NoIo {
            let e = engine.clone();
            w.poll_with(Box::new(move |_co| e.reap()));
        }
        Ok(engine)
    }

    /// Reads completed so far by this worker's engine.
    pub fn reads(&self) -> u64 {
        self.state.borrow().reads
    }

    /// Collects completions from threads or the ring; returns whether any arrived.
    fn reap(&self) -> bool {
        let mut s = self.state.borrow_mut();
        let s = &mut *s;
        let mut got = false;
        while let Ok((tag, r)) = s.done_rx.try_recv() {
            s.settle(tag, r);
            got = true;
        }
        if let Some(mut ring) = s.uring.take() {
            // A refused submission (the kernel is short of resources) leaves the reads
            // queued; the next step submits them again.
            let _ = ring.submit();
            let mut done = Vec::new();
            ring.reap(|tag, bytes| {
                let r = match bytes {
                    Ok(b) => {
                        let p = s.pending[tag as usize].as_ref().expect("reaped read is pending");
                        let (dst, off) = p.dst.as_ref().expect("ring reads have a destination");
                        put_padded(dst, *off, b, &mut s.pad);
                        Ok(())
                    }
                    Err(e) => Err(e.kind()),
                };
                done.push((tag, r));
            });
            s.uring = Some(ring);
            got |= !done.is_empty();
            for (tag, r) in done {
                s.settle(tag, r);
            }
        }
        got
    }

    /// Reads `len` bytes of `file` at `offset` (inside the file) into `dst` at
    /// `dst_offset` (8-aligned, room for `len` rounded up to 8).
    pub async fn read<E: Endpoint>(
        &self,
        co: &Co<E>,
        file: &Arc<DiskFile>,
        offset: u64,
        len: u32,
        dst: &Region,
        dst_offset: u64,
    ) -> Result<(), ReadFailure> {
        let r = match self.node.timing {
            Timing::Modelled { device, costs } => {
                self.read_modelled(co, device, costs, file, offset, len, dst, dst_offset).await
            }
            Timing::Real => self.read_real(co, file, offset, len, dst, dst_offset).await,
        };
        self.state.borrow_mut().reads += 1;
        r
    }

    async fn read_real<E: Endpoint>(
        &self,
        co: &Co<E>,
        file: &Arc<DiskFile>,
        offset: u64,
        len: u32,
        dst: &Region,
        dst_offset: u64,
    ) -> Result<(), ReadFailure> {
        let len = len as usize;
        let job = |s: &EngineState, tag| Job {
            file: file.clone(),
            offset,
            len,
            dst: dst.clone(),
            dst_offset,
            tag,
            done: s.done_tx.clone(),
        };
        let tag = match self.node.kind {
            EngineKind::NoIo => return Ok(()),
            EngineKind::Pool { .. } => {
                let mut s = self.state.borrow_mut();
                let tag = s.start(None);
                let pool = self.node.pool.as_ref().expect("a pool engine has a pool");
                let tx = pool.jobs.as_ref().expect("the pool runs while engines exist");
                tx.send(job(&s, tag)).expect("pool threads outlive the run");
                tag
            }
            EngineKind::ThreadPerRequest => {
                let mut s = self.state.borrow_mut();
                let tag = s.start(None);
                let j = job(&s, tag);
                if let Err(e) = std::thread::Builder::new().spawn(move || run_job(j)) {
                    s.pending[tag as usize] = None;
                    s.free.push(tag);
                    return Err(e.kind());
                }
                tag
            }
            EngineKind::Uring { .. } => loop {
                {
                    let mut s = self.state.borrow_mut();
                    let tag = s.start(Some((dst.clone(), dst_offset)));
                    let ring = s.uring.as_mut().expect("a ring engine has a ring");
                    if ring.try_queue(file, offset, len, tag) {
                        break tag;
                    }
                    s.pending[tag as usize] = None;
                    s.free.push(tag);
                }
                // Every slot is in flight: let the poller reap some.
                co.yield_now().await;
            },
        };
        WaitRead { state: &self.state, tag }.await
    }

    #[allow(clippy::too_many_arguments)]
    async fn read_modelled<E: Endpoint>(
        &self,
        co: &Co<E>,
        device: DeviceModel,
        costs: EngineCosts,
        file: &Arc<DiskFile>,
        offset: u64,
        len: u32,
        dst: &Region,
        dst_offset: u64,
    ) -> Result<(), ReadFailure> {
        let model = self.node.model.as_ref().expect("modelled timing has a model");
        let kind = self.node.kind;
        match kind {
            EngineKind::NoIo => return Ok(()),
            EngineKind::ThreadPerRequest => co.charge(costs.spawn_ns),
            EngineKind::Uring { .. } => co.charge(costs.uring_ns),
            EngineKind::Pool { .. } => {}
        }
        let now = co.now_ns();
        let done_at = {
            let mut m = model.lock().expect("model lock");
            schedule(&mut m, &device, costs, kind, now, offset, u64::from(len))
        };
        co.sleep_until(done_at).await;
        let mut s = self.state.borrow_mut();
        let s = &mut *s;
        let bytes = file.read_at(offset, len as usize, &mut s.scratch).map_err(|e| e.kind())?;
        put_padded(dst, dst_offset, bytes, &mut s.pad);
        Ok(())
    }
}

/// Reserves a modelled read starting at `now`; returns when its data is ready.
fn schedule(
    m: &mut ModelState,
    device: &DeviceModel,
    costs: EngineCosts,
    kind: EngineKind,
    now: u64,
    offset: u64,
    len: u64,
) -> u64 {
    // A pool read waits for a free I/O thread, which then blocks for the whole read.
    let (start, thread) = match kind {
        EngineKind::Pool { .. } => {
            let (i, &free) =
                m.pool_free.iter().enumerate().min_by_key(|&(_, f)| *f).expect("pool has threads");
            ((now + costs.handoff_ns / 2).max(free), Some(i))
        }
        _ => (now, None),
    };
    let dev = ((offset / device.stripe_bytes) % u64::from(device.devices)) as usize;
    let chans = &mut m.channels[dev];
    let (c, &free) =
        chans.iter().enumerate().min_by_key(|&(_, f)| *f).expect("device has channels");
    let ready = start.max(free) + device.latency_ns;
    chans[c] = ready;
    let xfer = len * 1_000_000_000 / device.bytes_per_sec.max(1);
    let done = ready.max(m.link_free[dev]) + xfer;
    m.link_free[dev] = done;
    match thread {
        Some(i) => {
            m.pool_free[i] = done;
            done + costs.handoff_ns / 2
        }
        None => done,
    }
}

/// Future of a real read's completion.
struct WaitRead<'a> {
    state: &'a Rc<RefCell<EngineState>>,
    tag: u64,
}

impl Future for WaitRead<'_> {
    type Output = Result<(), ReadFailure>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.state.borrow_mut();
        let p = s.pending[self.tag as usize].as_mut().expect("awaited read is pending");
        match p.result.take() {
            Some(r) => {
                s.pending[self.tag as usize] = None;
                s.free.push(self.tag);
                Poll::Ready(r)
            }
            None => {
                p.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Measured engine costs of this machine (see [`EngineCosts`]): thread creation and a
/// queue hand-off round trip, each the median of `rounds`.
pub fn calibrate(rounds: u32) -> EngineCosts {
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let mut spawn = Vec::new();
    for _ in 0..rounds {
        let t = std::time::Instant::now();
        let h = std::thread::spawn(|| std::hint::black_box(1u64));
        let _ = h.join();
        spawn.push(t.elapsed().as_nanos() as u64);
    }
    let (tx, rx) = crossbeam_channel::bounded::<u64>(1);
    let (back_tx, back_rx) = crossbeam_channel::bounded::<u64>(1);
    let echo = std::thread::spawn(move || {
        while let Ok(v) = rx.recv() {
            if back_tx.send(v).is_err() {
                break;
            }
        }
    });
    let mut handoff = Vec::new();
    for i in 0..u64::from(rounds) {
        let t = std::time::Instant::now();
        tx.send(i).expect("echo thread runs");
        let _ = back_rx.recv();
        handoff.push(t.elapsed().as_nanos() as u64);
    }
    drop(tx);
    let _ = echo.join();
    EngineCosts { spawn_ns: median(spawn), handoff_ns: median(handoff), ..EngineCosts::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// When the last of `n` reads of `len` bytes, all issued at time 0, is done.
    fn last_done(kind: EngineKind, costs: EngineCosts, n: u64, len: u64) -> u64 {
        let d = DeviceModel::P3700;
        let threads = match kind {
            EngineKind::Pool { threads } => usize::from(threads),
            _ => 0,
        };
        let mut m = ModelState::new(&d, threads);
        (0..n).map(|i| schedule(&mut m, &d, costs, kind, 0, i * len, len)).max().unwrap()
    }

    #[test]
    fn device_model_reaches_its_ceilings() {
        let d = DeviceModel::P3700;
        // Small reads are channel-bound (40 per 85 µs), large ones link-bound.
        for len in [512, 16384] {
            let last = last_done(EngineKind::NoIo, EngineCosts::default(), 4000, len);
            let iops = 4000.0 * 1e9 / last as f64;
            assert!((iops / d.max_iops(len) - 1.0).abs() < 0.02, "{len} B: {iops:.0} IOPS");
        }
    }

    #[test]
    fn a_modelled_pool_bounds_concurrency_by_its_threads() {
        let d = DeviceModel::P3700;
        let costs = EngineCosts { handoff_ns: 0, ..EngineCosts::default() };
        let last = last_done(EngineKind::Pool { threads: 4 }, costs, 400, 512);
        // Four threads, each blocked ~85 µs per read: 100 rounds.
        assert!(last >= 100 * d.latency_ns && last < 101 * (d.latency_ns + 1_000), "{last}");
    }
}
