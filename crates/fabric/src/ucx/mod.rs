//! `ucx`: the verbs model over UCX (UCP): shared memory and TCP on one machine, RDMA
//! transports (rc, ud, dc) on InfiniBand/RoCE clusters.
//!
//! A [`UcxCluster`] hosts some of a cluster's nodes in this process (all of them for
//! tests and `hytra bench --backend ucx`; one per process under `hytra node`). The nodes
//! it does not host exist here only as shadows: their regions have the right size and
//! keys (so every process builds the same catalog) but are never touched by the data
//! path. Processes learn each other's worker addresses and remote keys through an
//! [`Exchange`] (a TCP bootstrap across processes, [`Solo`] within one).
//!
//! Mapping (docs/ARCHITECTURE.md has the whole table):
//! - a hytra worker is a UCP worker; its connection `(node, lane)` is a UCP endpoint to
//!   the worker with the same index on `node` (one endpoint per lane);
//! - READ/WRITE are `ucp_get_nbx`/`ucp_put_nbx`, CAS/FAA `ucp_atomic_op_nbx` (CSWAP,
//!   ADD with a reply); a signaled WRITE is followed by an endpoint flush, so that its
//!   completion means the data is at the target, as with RC;
//! - FIFO per connection: UCP orders nothing by itself; each endpoint is kept in order
//!   as the lanes UCP chose for it require (`lanes.rs`: a fence behind an operation in
//!   flight on shared memory, behind a READ or atomic on one network lane, a flush
//!   between RMA and atomics on different lanes);
//! - what the fabric promises (atomics coherent with the CPU's, one-sided operations
//!   without the target's CPU) is read from the lanes every process's endpoints got, not
//!   from the transport list; where an RDMA NIC may be used, atomics run in device mode so
//!   that a node's own lock words are also changed by the NIC (M6);
//! - `MORE` is accepted and ignored: UCP hands each operation to the transport at once
//!   and batches on its own (shared memory completes most operations inline);
//! - remote protection checks (key, bounds, alignment) are made by the poster against
//!   the region sizes exchanged with the keys, since UCP does not check bounds;
//! - datagrams are active messages sent eagerly with the sender's index as header.
//!
//! Regions are allocated by UCP (`ucp_mem_map` with ALLOCATE) so that shared-memory
//! peers map them and complete one-sided operations without this process's CPU.
//!
//! [`minimal`] is not part of the backend: it is a plain UCP program (its own C file)
//! that `hytra micro --ucp-baseline` measures the backend against.

pub mod bootstrap;
mod endpoint;
pub mod exchange;
mod ffi;
pub mod hub;
mod lanes;
pub mod minimal;
#[cfg(feature = "pmix")]
pub mod pmix;
mod wait;

use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use self::bootstrap::TcpExchange;
pub use self::endpoint::UcxEndpoint;
pub use self::exchange::{Exchange, Quiescence, Solo, Waves};
pub use self::hub::{Hub, HubOutcome};

#[cfg(feature = "pmix")]
pub use self::pmix::PmixExchange;
use crate::constants::{DATAGRAM_MTU, INLINE_MAX, SQ_DEPTH};
use crate::endpoint::{
    Backend, BackendError, Caps, Pages, Program, RegionSpec, RunLimits, RunStats,
};
use crate::exec::check_region;
use crate::ids::{ClusterShape, NodeId, Rkey};
use crate::memory::Region;
use crate::stepper::{Rest, Stepper};
use crate::validate_shape;

/// Configuration of a UCX cluster (or of this process's part of it).
#[derive(Clone, Debug)]
pub struct UcxConfig {
    /// The whole cluster's size.
    pub shape: ClusterShape,
    /// Nodes this process hosts (all of them when `None`).
    pub hosted: Option<Vec<NodeId>>,
    /// UCX transports (`UCX_TLS` syntax, e.g. `sm` or `tcp`); `None`: UCX's choice. The
    /// `self` transport is added so that a worker can reach its own node.
    pub transports: Option<String>,
    /// OS threads for this process's workers; `None`: one per core, at most one per
    /// hosted worker.
    pub threads: Option<usize>,
    /// How connections are kept in order.
    pub ordering: UcxOrdering,
    /// What a thread does when none of its workers has work.
    pub waiting: UcxWaiting,
}

/// What a thread does after a round in which none of its workers had work.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum UcxWaiting {
    /// Yield the core and step again: the fastest measured, with cores to spare and on
    /// hosts with more busy threads than cores alike (docs/PERFORMANCE.md §18).
    #[default]
    Poll,
    /// Once idle for `spin` (yielding meanwhile), sleep on the UCP workers' event file
    /// descriptors until a message or completion arrives, a program's timer is due, or
    /// [`EVENT_WAIT_MAX`] passes: leaves idle cores to other work on the host, at the
    /// price of a wake-up per arrival at a sleeping thread. The bound covers what
    /// raises no event: memory that a peer writes one-sidedly without the target's CPU
    /// (shared memory, RDMA) and that a program polls, and the stop flag.
    Event {
        /// Idle time before a sleep; [`EVENT_SPIN`] unless a test needs another.
        spin: Duration,
    },
}

impl UcxWaiting {
    /// Event waiting after the measured spin, [`EVENT_SPIN`].
    pub const EVENT: UcxWaiting = UcxWaiting::Event { spin: EVENT_SPIN };
}

/// Longest sleep of an event-waiting thread.
pub const EVENT_WAIT_MAX: Duration = Duration::from_micros(100);

/// How long an event-waiting thread stays idle, yielding as a polling one does, before it
/// sleeps. Most waits end within microseconds: across three processes on two cores,
/// sleeping at once ran YCSB and SmallBank over TCP at 0.76 and 0.68 of polling's rate
/// (medians), and sleeping after this spin at 0.81 and 0.87 (docs/PERFORMANCE.md §50).
pub const EVENT_SPIN: Duration = Duration::from_micros(50);

/// How the backend keeps each connection's operations in order (R1).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum UcxOrdering {
    /// As the lanes UCP chose for each endpoint require: the cheapest correct way.
    #[default]
    Auto,
    /// Every operation waits until the previous ones of its connection are complete at
    /// the target: the path of endpoints whose RMA and atomics take different lanes,
    /// forced everywhere so that tests on any host exercise it.
    Flush,
}

impl UcxConfig {
    /// All nodes in this process, UCX's transports, one thread per core.
    pub fn new(shape: ClusterShape) -> Self {
        UcxConfig {
            shape,
            hosted: None,
            transports: None,
            threads: None,
            ordering: UcxOrdering::Auto,
            waiting: UcxWaiting::Poll,
        }
    }

    /// Whether this configuration hosts `node`.
    pub fn hosts(&self, node: NodeId) -> bool {
        self.hosted.as_ref().is_none_or(|h| h.contains(&node))
    }

    fn tls(&self) -> Option<String> {
        tls_list(self.transports.as_deref())
    }

    /// The `UCX_ATOMIC_MODE` to ask for: `device` where an RDMA NIC may carry the
    /// cluster, so that every endpoint, a worker's own included, executes atomics in that
    /// one NIC and a lock word never sees CPU and NIC atomics (M6); unless the user set
    /// `UCX_ATOMIC_MODE`, which then rules (the lanes still show what it gave).
    fn atomic_mode(&self) -> Option<&'static str> {
        let user = std::env::var_os("UCX_ATOMIC_MODE").is_some();
        (!user && rdma_devices_present() && lanes::may_use_rdma(self.tls().as_deref()))
            .then_some("device")
    }
}

/// Largest datagram over UCX: four of the simulator's [`DATAGRAM_MTU`]. An RPC frame
/// stays within `DATAGRAM_MTU` on every backend, but UCP's active messages are not bound
/// to one IB MTU (UCP splits and reassembles them), so more of a step's frames to one
/// peer share a send. Over TCP every send is a system call and a trip through the
/// loopback stack: YCSB's 10-record transactions took 9.6 datagrams each with 4 KiB
/// and 3.6 with 16 KiB, and the cluster file ran 1.3-1.5x faster (docs/PERFORMANCE.md
/// §36); 64 KiB gained nothing more.
pub const UCX_DATAGRAM_MTU: usize = 4 * DATAGRAM_MTU;

/// The capabilities of a cluster whose endpoints promise `p`.
fn caps_of(p: lanes::Promises) -> Caps {
    Caps {
        mtu: UCX_DATAGRAM_MTU,
        inline_max: INLINE_MAX,
        sq_depth: SQ_DEPTH,
        atomics_coherent: p.atomics_coherent,
        one_sided_bypasses_target: p.one_sided_bypasses_target,
    }
}

impl UcxConfig {
    /// Whether endpoints can ask UCP to report failed peers: not when shared memory may
    /// carry them (UCX 1.13's shared-memory transports refuse that mode).
    fn peer_errors(&self) -> bool {
        peer_errors(self.tls().as_deref())
    }
}

/// Whether endpoints over this `UCX_TLS` value (see [`tls_list`]) can ask UCP to report
/// failed peers: not when shared memory may carry them, nor when UCX chooses.
pub(crate) fn peer_errors(tls: Option<&str>) -> bool {
    const SHARED_MEMORY: [&str; 7] = ["sm", "shm", "posix", "sysv", "cma", "knem", "xpmem"];
    tls.is_some_and(|t| !t.split(',').any(|n| SHARED_MEMORY.contains(&n.trim())))
}

/// The `UCX_TLS` value for a transport list: `None` for UCX's own choice (nothing, empty
/// or `all`), else the list with `self` added so that a worker can reach its own node.
/// The minimal UCP program uses it too, so that both run over exactly the same list.
pub(crate) fn tls_list(transports: Option<&str>) -> Option<String> {
    let t = transports?.trim();
    if t.is_empty() || t == "all" {
        return None;
    }
    if t.split(',').any(|x| x.trim() == "self") {
        Some(t.to_string())
    } else {
        Some(format!("{t},self"))
    }
}

/// Free explicit huge pages of the host, if it says.
fn free_huge_pages() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("HugePages_Free:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What to add to a failed registration's reason: RDMA NICs pin registered memory, which
/// the locked-memory limit bounds (`ulimit -l`; batch systems often set it low).
fn memlock_hint() -> String {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the live local it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return String::new();
    }
    format!(
        " (registered memory is pinned and the locked-memory limit is {} KiB: raise `ulimit -l`, e.g. to unlimited in the job's limits)",
        lim.rlim_cur / 1024
    )
}

fn rdma_devices_present() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

/// The process's UCP context; everything else holds it alive.
pub(crate) struct Context {
    raw: NonNull<ffi::Context>,
}

// SAFETY: the context is created with `mt_workers_shared`, so UCP allows its workers to
// be used from different threads; the handle itself is only passed to UCP calls that
// take the context (memory mapping, worker creation) under `&mut UcxCluster`.
unsafe impl Send for Context {}
// SAFETY: as above; no Rust-side state behind the pointer.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: created by hx_context_create; every worker and mapping holds an Arc to
        // this context, so none is left when it drops.
        unsafe { ffi::hx_context_destroy(self.raw.as_ptr()) }
    }
}

/// Memory UCP allocated and mapped for one region (or huge pages hytra mapped and UCP
/// registered: `mapped` bytes at `addr`).
struct Mapping {
    ctx: Arc<Context>,
    memh: NonNull<ffi::MemHandle>,
    addr: *mut c_void,
    mapped: usize,
}

// SAFETY: the handle and address are only used to unmap, once, on drop; UCP's memory map calls on a
// context created with `mt_workers_shared` may run on any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: memh, addr and mapped came from hx_mem_alloc on this context and are
        // released only here; the Region that points into the memory owns this Mapping,
        // so it is gone too.
        unsafe {
            ffi::hx_mem_free(self.ctx.raw.as_ptr(), self.memh.as_ptr(), self.addr, self.mapped)
        }
    }
}

/// A registered region of a hosted node, with what peers need to reach it.
pub(crate) struct HostedRegion {
    region: Region,
    base: u64,
    packed_rkey: Vec<u8>,
}

/// A region of some node as this process knows it.
pub(crate) enum RegionSlot {
    Hosted(HostedRegion),
    /// A node of another process: memory of the right size that the data path never
    /// touches (mapped lazily, so it costs nothing unless someone writes it).
    Shadow(Region),
}

impl RegionSlot {
    fn region(&self) -> &Region {
        match self {
            RegionSlot::Hosted(h) => &h.region,
            RegionSlot::Shadow(r) => r,
        }
    }
}

/// A cluster, or this process's part of one, over UCX.
pub struct UcxCluster {
    config: UcxConfig,
    ctx: Arc<Context>,
    regions: Vec<Vec<RegionSlot>>,
    exchange: Box<dyn Exchange>,
}

impl UcxCluster {
    /// A cluster whose every node lives in this process.
    pub fn new(config: UcxConfig) -> Result<UcxCluster, BackendError> {
        UcxCluster::with_exchange(config, Box::new(Solo::default()))
    }

    /// This process's part of a cluster; `exchange` reaches the other processes.
    pub fn with_exchange(
        config: UcxConfig,
        exchange: Box<dyn Exchange>,
    ) -> Result<UcxCluster, BackendError> {
        validate_shape(config.shape)?;
        if let Some(h) = &config.hosted {
            if h.is_empty() || h.iter().any(|n| n.0 >= config.shape.nodes) {
                return Err(BackendError::Config(format!(
                    "hosted nodes {h:?} do not fit a cluster of {} nodes",
                    config.shape.nodes
                )));
            }
        }
        let tls = config.tls().map(|t| CString::new(t).expect("transport names have no NUL"));
        let atomic_mode = config.atomic_mode().map(|m| CString::new(m).expect("no NUL"));
        let mut err = [0; ffi::ERR_LEN];
        // SAFETY: `tls` and `atomic_mode` are valid C strings or null, `err` a writable
        // buffer of ERR_LEN.
        let raw = unsafe {
            ffi::hx_context_create(
                tls.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
                atomic_mode.as_ref().map_or(std::ptr::null(), |m| m.as_ptr()),
                i32::from(matches!(config.waiting, UcxWaiting::Event { .. })),
                err.as_mut_ptr(),
                err.len(),
            )
        };
        let Some(raw) = NonNull::new(raw) else {
            return Err(BackendError::Config(format!("UCX: {}", ffi::err_text(&err))));
        };
        let regions = (0..config.shape.nodes).map(|_| Vec::new()).collect();
        Ok(UcxCluster { config, ctx: Arc::new(Context { raw }), regions, exchange })
    }

    /// The configuration.
    pub fn config(&self) -> &UcxConfig {
        &self.config
    }

    /// Whether a region of `len` bytes goes on explicit huge pages: a large one, where no
    /// shared-memory peer needs UCP's own allocation to map it, and the host has enough
    /// free huge pages (`HugePages_Free`, 2 MiB each).
    fn wants_huge_pages(&self, len: u64) -> bool {
        const HUGE: u64 = 2 << 20;
        let tls = self.config.tls();
        let network = match &tls {
            Some(_) => self.config.peer_errors(),
            None => rdma_devices_present(),
        };
        len >= HUGE && network && free_huge_pages().is_some_and(|n| n * HUGE >= len)
    }

    fn alloc(&self, node: NodeId, len: u64, pages: Pages) -> Result<HostedRegion, BackendError> {
        let fail = |reason: String| BackendError::Register { node, len_bytes: len, reason };
        let bytes = usize::try_from(len).map_err(|_| fail("larger than memory".into()))?;
        let huge = pages == Pages::Huge && self.wants_huge_pages(len);
        let mut memh = std::ptr::null_mut();
        let mut addr: *mut c_void = std::ptr::null_mut();
        let mut rkey_buf: *mut c_void = std::ptr::null_mut();
        let mut rkey_len = 0usize;
        let mut mapped = 0usize;
        let mut err = [0; ffi::ERR_LEN];
        // SAFETY: every out-pointer refers to a live local; the context is alive.
        let rc = unsafe {
            ffi::hx_mem_alloc(
                self.ctx.raw.as_ptr(),
                bytes,
                i32::from(huge),
                &mut memh,
                &mut addr,
                &mut rkey_buf,
                &mut rkey_len,
                &mut mapped,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if rc != 0 {
            return Err(fail(format!("UCX: {}{}", ffi::err_text(&err), memlock_hint())));
        }
        // SAFETY: on success the shim returned a packed key of `rkey_len` bytes that we
        // copy and then release exactly once.
        let packed_rkey = unsafe {
            let v = std::slice::from_raw_parts(rkey_buf.cast::<u8>(), rkey_len).to_vec();
            ffi::hx_rkey_buffer_release(rkey_buf);
            v
        };
        let memh = NonNull::new(memh).expect("hx_mem_alloc returned a handle");
        let ptr = NonNull::new(addr.cast::<u64>()).expect("hx_mem_alloc returned memory");
        let owner = Arc::new(Mapping { ctx: self.ctx.clone(), memh, addr, mapped });
        // SAFETY: the shim checked that the mapping is 8-byte aligned and at least `len`
        // bytes, and zeroed it; `owner` unmaps it only when the last Region clone is gone;
        // peers touch it only through UCP (DMA-like copies and CPU atomics).
        let region = unsafe { Region::from_raw(ptr, bytes / 8, owner) };
        Ok(HostedRegion { region, base: addr as u64, packed_rkey })
    }
}

impl Backend for UcxCluster {
    type Ep = UcxEndpoint;

    fn shape(&self) -> ClusterShape {
        self.config.shape
    }

    fn hosts(&self, node: NodeId) -> bool {
        self.config.hosts(node)
    }

    fn register(&mut self, node: NodeId, spec: RegionSpec) -> Result<Rkey, BackendError> {
        check_region(&self.config.shape, node, spec)?;
        let slot = if self.config.hosts(node) {
            RegionSlot::Hosted(self.alloc(node, spec.len_bytes, spec.pages)?)
        } else {
            RegionSlot::Shadow(Region::zeroed_on(spec.len_bytes, spec.pages))
        };
        let list = &mut self.regions[usize::from(node.0)];
        list.push(slot);
        Ok(Rkey(u32::try_from(list.len() - 1).expect("region count fits u32")))
    }

    fn region(&self, node: NodeId, rkey: Rkey) -> Option<Region> {
        Some(self.regions.get(usize::from(node.0))?.get(rkey.0 as usize)?.region().clone())
    }

    fn gather(&mut self, mine: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, BackendError> {
        self.exchange.gather(mine)
    }

    #[allow(
        clippy::too_many_lines,
        reason = "longer than the limit before the limit was set; split it when it next changes"
    )]
    fn run<P, R, F, G>(
        &mut self,
        make: F,
        finish: G,
        limits: RunLimits,
    ) -> Result<(Vec<R>, RunStats), BackendError>
    where
        P: Program,
        R: Send,
        F: Fn(UcxEndpoint) -> P + Sync,
        G: Fn(P) -> R + Sync,
    {
        let shape = self.config.shape;
        let hosted: Vec<usize> = (0..shape.workers_total())
            .filter(|&i| self.config.hosts(shape.worker_at(i).node))
            .collect();
        let mut workers = endpoint::WorkerSet::create(&self.ctx, shape, &hosted)?;
        let blob = exchange::encode_local(shape, &workers, &self.regions);
        let all = self.exchange.allgather(blob)?;
        let peers = exchange::decode_all(shape, &all, &self.regions)?;
        let forced = match self.config.ordering {
            UcxOrdering::Auto => None,
            UcxOrdering::Flush => Some(lanes::Order::Flush),
        };
        let verdict = match workers.connect(&peers, self.config.peer_errors(), forced) {
            Ok(v) => v,
            Err(e) => {
                workers.destroy();
                return Err(e);
            }
        };
        // Everyone is connected: agree on what the fabric promises, and start the clocks
        // together.
        let caps = self.exchange.allgather(verdict.encode()).and_then(|all| {
            let all: Vec<lanes::Verdict> = all
                .iter()
                .map(|b| lanes::Verdict::decode(b))
                .collect::<Result<_, _>>()
                .map_err(BackendError::Config)?;
            lanes::Verdict::merge(&all).map(caps_of).map_err(BackendError::Config)
        });
        let caps = match caps {
            Ok(c) => c,
            Err(e) => {
                workers.destroy();
                return Err(e);
            }
        };
        let threads = self
            .config
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let threads = threads.clamp(1, hosted.len());
        let run_shared = Arc::new(RunShared {
            shape,
            caps,
            start: Instant::now(),
            done: AtomicUsize::new(0),
            threads,
            flushed: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            waiting: self.config.waiting,
            event_sleeps: AtomicU64::new(0),
            event_wakeups: AtomicU64::new(0),
            abort: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            cut: (0..shape.nodes).map(|_| AtomicBool::new(false)).collect(),
            cuts: AtomicUsize::new(0),
            peers_elsewhere: hosted.len() < shape.workers_total(),
        });
        let own_regions: Vec<Vec<Region>> =
            self.regions.iter().map(|l| l.iter().map(|s| s.region().clone()).collect()).collect();
        let setups = workers.setups(&own_regions);
        let counts: Vec<endpoint::DatagramCounts> =
            setups.iter().map(endpoint::Setup::datagram_counts).collect();
        let mut per_thread: Vec<Vec<endpoint::Setup>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, s) in setups.into_iter().enumerate() {
            per_thread[i % threads].push(s);
        }
        let exchange = Mutex::new(&mut self.exchange);
        let total_local = hosted.len();
        let outputs: Vec<Result<Vec<(usize, R)>, BackendError>> = std::thread::scope(|s| {
            let handles: Vec<_> = per_thread
                .into_iter()
                .enumerate()
                .map(|(t, mine)| {
                    let (shared, make, finish, exchange, counts) =
                        (run_shared.clone(), &make, &finish, &exchange, &counts);
                    s.spawn(move || {
                        let first = mine.first().map(|s| s.me());
                        let result = catch_unwind(AssertUnwindSafe(|| {
                            let coordinator = (t == 0).then_some(Coordinator { exchange, counts });
                            run_thread(
                                &shared,
                                mine,
                                make,
                                finish,
                                limits,
                                total_local,
                                coordinator,
                            )
                        }));
                        match result {
                            Ok(r) => r,
                            Err(payload) => {
                                shared.abort.store(true, Ordering::Relaxed);
                                Err(BackendError::WorkerPanicked {
                                    worker: first.unwrap_or(shape.worker_at(0)),
                                    message: crate::local::panic_message(&payload),
                                })
                            }
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread result is caught")).collect()
        });
        let elapsed = run_shared.start.elapsed().as_nanos() as u64;
        let failed = outputs.iter().any(Result::is_err);
        // Nobody touches a peer once every process has stopped: then tear down. After a
        // failure there is no barrier: this process leaves, and its closed connections
        // tell the others at once.
        let barrier = if failed { Ok(Vec::new()) } else { self.exchange.allgather(Vec::new()) };
        workers.destroy();
        let mut results: Vec<(usize, R)> = Vec::with_capacity(total_local);
        for out in outputs {
            results.extend(out?);
        }
        barrier?;
        results.sort_by_key(|(w, _)| *w);
        let stats = RunStats {
            elapsed_ns: elapsed,
            wall_ns: elapsed,
            all_done: !run_shared.abort.load(Ordering::Relaxed)
                && run_shared.done.load(Ordering::Relaxed) == total_local
                && run_shared.stop.load(Ordering::Relaxed),
            datagrams_dropped: run_shared.dropped.load(Ordering::Relaxed),
            event_sleeps: run_shared.event_sleeps.load(Ordering::Relaxed),
            event_wakeups: run_shared.event_wakeups.load(Ordering::Relaxed),
            ..RunStats::default()
        };
        Ok((results.into_iter().map(|(_, r)| r).collect(), stats))
    }
}

/// What the threads of one run share.
pub(crate) struct RunShared {
    pub(crate) shape: ClusterShape,
    pub(crate) caps: Caps,
    pub(crate) start: Instant,
    done: AtomicUsize,
    /// Threads of this run, and how many have all their workers done with everything
    /// they posted complete at its target. Only then is this process done: a request
    /// still in flight (an unsignaled WRITE of passive ACK, which over TCP lands only
    /// while its target progresses) must land before any process stops progressing.
    threads: usize,
    flushed: AtomicUsize,
    /// Every worker of the cluster is done (or the run ends): leave the loop.
    stop: AtomicBool,
    /// What a thread does without work.
    waiting: UcxWaiting,
    /// Sleeps of event-waiting threads, and those an event ended.
    event_sleeps: AtomicU64,
    event_wakeups: AtomicU64,
    abort: AtomicBool,
    pub(crate) dropped: AtomicU64,
    /// Per node: the engine fenced it off (it left the run), so every worker of this
    /// process cuts its endpoints to it, each on its own thread; and how many nodes are
    /// cut, which a worker compares with what it has applied on every poll.
    pub(crate) cut: Vec<AtomicBool>,
    pub(crate) cuts: AtomicUsize,
    /// Some nodes of the run are in other processes: a thread that reaches the time limit
    /// before they agree the run is over fails the run rather than wait in a barrier.
    peers_elsewhere: bool,
}

/// What the thread that talks to the other processes holds: the exchange, and the
/// datagram counters of every worker of this process.
struct Coordinator<'a, 'x> {
    exchange: &'a Mutex<&'x mut Box<dyn Exchange>>,
    counts: &'a [endpoint::DatagramCounts],
}

/// Why a thread of a run across processes reached the run's time limit (`limit_ns`)
/// before the processes agreed that the run is over: its workers (`ids`) unfinished,
/// their requests incomplete (`flushed` false), or the others silent.
fn overran<P: Program>(
    ids: &[usize],
    programs: &[P],
    flushed: bool,
    limit_ns: u64,
) -> BackendError {
    let not_done: Vec<usize> =
        ids.iter().zip(programs).filter(|(_, p)| !p.is_done()).map(|(&i, _)| i).collect();
    let why = if !not_done.is_empty() {
        format!("workers {not_done:?} of this process never finished")
    } else if !flushed {
        format!(
            "workers {ids:?} of this process finished, but not every request they posted completed"
        )
    } else {
        "this process finished; the others never said the run was over".to_string()
    };
    BackendError::Cluster(format!(
        "the run did not end within its time limit ({:.1} s): {why}",
        limit_ns as f64 / 1e9
    ))
}

/// The loop of one OS thread: steps its workers until the whole cluster is done, the
/// time limit passes, or something failed. Thread 0 also talks to the other processes.
fn run_thread<P, R, F, G>(
    shared: &Arc<RunShared>,
    mine: Vec<endpoint::Setup>,
    make: &F,
    finish: &G,
    limits: RunLimits,
    total_local: usize,
    coordinator: Option<Coordinator<'_, '_>>,
) -> Result<Vec<(usize, R)>, BackendError>
where
    P: Program,
    F: Fn(UcxEndpoint) -> P,
    G: Fn(P) -> R,
{
    let ids: Vec<usize> = mine.iter().map(|s| s.index()).collect();
    let progress: Vec<endpoint::Progress> = mine.iter().map(|s| s.worker()).collect();
    let mut programs: Vec<P> =
        mine.into_iter().map(|s| make(UcxEndpoint::new(shared.clone(), s))).collect();
    let mut stepper = Stepper::new(programs.len());
    let mut sleeper = match shared.waiting {
        UcxWaiting::Poll => None,
        UcxWaiting::Event { spin } => Some(wait::Sleeper::new(&progress, EVENT_WAIT_MAX, spin)?),
    };
    // Per program, the worker's progress calls when the loop last progressed it.
    let mut progressed_at: Vec<u64> = progress.iter().map(|p| p.calls()).collect();
    let mut last_poll = Instant::now();
    let mut failure = None;
    let mut flushed = false;
    loop {
        let rest = |rest: Rest| match &mut sleeper {
            None => std::thread::yield_now(),
            Some(s) => {
                let now = shared.start.elapsed().as_nanos() as u64;
                if let Err(e) = s.rest(rest, now) {
                    failure = Some(e);
                    shared.abort.store(true, Ordering::Relaxed);
                }
            }
        };
        let check = stepper.round(
            &mut programs,
            &shared.done,
            |i| {
                // A NIC moves queued requests without the application; UCP only inside
                // progress calls, so the loop makes one for a program that made none
                // since the loop last looked, or submitted anything after the last one.
                // Not otherwise: over TCP each call is an `epoll_wait`, and an idle
                // step that polled has just made one.
                if progress[i].calls() == progressed_at[i] || progress[i].submitted_since() {
                    progress[i].run();
                }
                progressed_at[i] = progress[i].calls();
            },
            rest,
        );
        if !check && failure.is_none() {
            continue;
        }
        if !flushed && programs.iter().all(P::is_done) {
            // Poll every worker's flush (not only up to the first unfinished one), so
            // that they all run at once.
            let pending = progress.iter().filter(|p| !p.flushed()).count();
            if pending == 0 {
                flushed = true;
                shared.flushed.fetch_add(1, Ordering::AcqRel);
            }
        }
        let elapsed = shared.start.elapsed().as_nanos() as u64;
        if let Some(c) = &coordinator {
            if last_poll.elapsed() >= Duration::from_micros(500) {
                last_poll = Instant::now();
                let done = shared.done.load(Ordering::Acquire) == total_local
                    && shared.flushed.load(Ordering::Acquire) == shared.threads;
                let nodes = usize::from(shared.shape.nodes);
                let (mut to, mut from) = (vec![0; nodes], vec![0; nodes]);
                c.counts.iter().for_each(|c| c.add_by_node(&mut to, &mut from));
                let (sent, received) = (to.iter().sum(), from.iter().sum());
                let by_node = to.into_iter().zip(from).collect();
                let mut ex = c.exchange.lock().expect("exchange lock");
                match ex.poll_done(Quiescence { done, sent, received, by_node }) {
                    Ok(true) => shared.stop.store(true, Ordering::Release),
                    Ok(false) => {}
                    Err(e) => {
                        failure = Some(e);
                        shared.abort.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
        if shared.stop.load(Ordering::Acquire)
            || elapsed > limits.time_limit_ns
            || shared.abort.load(Ordering::Relaxed)
        {
            break;
        }
    }
    if let Some(s) = &sleeper {
        shared.event_sleeps.fetch_add(s.sleeps, Ordering::Relaxed);
        shared.event_wakeups.fetch_add(s.wakeups, Ordering::Relaxed);
    }
    let timed_out = !shared.stop.load(Ordering::Acquire) && !shared.abort.load(Ordering::Relaxed);
    if failure.is_none() && timed_out && shared.peers_elsewhere {
        // The time limit passed before the processes agreed that the run is over. Other
        // processes (or a hub) may still wait for this one's word, and would wait for it
        // in the barrier after the run too: leave with the reason instead, and the closed
        // connections tell them. (The exchange may end the run in the same instant; a
        // run failed then had already overrun its window by the limit's margin.)
        shared.abort.store(true, Ordering::Relaxed);
        failure = Some(overran(&ids, &programs, flushed, limits.time_limit_ns));
    }
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(ids.into_iter().zip(programs.into_iter().map(finish)).collect())
}
