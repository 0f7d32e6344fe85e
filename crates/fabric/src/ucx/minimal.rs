//! The minimal UCP program (`minimal.c`): the same operations the `ucx` backend posts,
//! issued straight through UCP with nothing of hytra in between, so that
//! `hytra micro --ucp-baseline` can say how much hytra's layers cost per operation.
//!
//! Not for: running anything of hytra. The C side shares no code or state with the
//! backend's shim; this module is only its declarations and a safe wrapper,
//! [`run_minimal`].

use std::ffi::{c_char, c_int, CString};

use super::{peer_errors, tls_list};
use crate::endpoint::BackendError;

/// Workers the program supports at most; mirrors `HYTRA_UCP_MINIMAL_NODES_MAX` in
/// minimal.c (the result's layout depends on it, and [`run_minimal`] checks the two agree).
pub const NODES_MAX: usize = 8;

/// Operations a worker may keep in flight at most; mirrors `MIN_OUTSTANDING_MAX` in
/// minimal.c (each in-flight operation has a slot, and an RPC server a reply entry per
/// slot of each peer).
pub const OUTSTANDING_MAX: u32 = 1024;

/// Length of the C side's error buffer (`MIN_ERR_LEN`).
const ERR_LEN: usize = 256;

/// The operation every worker keeps in flight.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MinimalOp {
    /// `ucp_get_nbx` of `payload` bytes (hytra's READ).
    Get,
    /// `signal_every` × `ucp_put_nbx` of `payload` bytes, then one `ucp_ep_flush_nbx`
    /// (hytra's WRITE group, whose last, signaled WRITE the shim follows with a flush).
    Put,
    /// `ucp_atomic_op_nbx` CSWAP on an 8-byte word (hytra's CAS).
    Cswap,
    /// `ucp_atomic_op_nbx` ADD with the old value fetched (hytra's FAA).
    FetchAdd,
    /// An active-message request, answered by the peer's progress loop with an
    /// active-message reply of `payload` bytes (hytra's RPC, a two-sided read).
    AmRoundTrip,
}

impl MinimalOp {
    fn code(self) -> u32 {
        match self {
            MinimalOp::Get => 0,
            MinimalOp::Put => 1,
            MinimalOp::Cswap => 2,
            MinimalOp::FetchAdd => 3,
            MinimalOp::AmRoundTrip => 4,
        }
    }

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            MinimalOp::Get => "get",
            MinimalOp::Put => "put+flush",
            MinimalOp::Cswap => "cswap",
            MinimalOp::FetchAdd => "fetch-add",
            MinimalOp::AmRoundTrip => "am round trip",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct MinimalParams {
    /// UCX transports, `UCX_TLS` syntax (`sm`, `tcp`, ...); `None`: UCX's choice. `self`
    /// is added as the backend adds it, and endpoints get the backend's error mode (peer
    /// failures reported unless shared memory may carry them), so that both run over the
    /// same protocols.
    pub transports: Option<String>,
    /// The operation.
    pub op: MinimalOp,
    /// Workers, one per thread, each issuing to the next: 2..=[`NODES_MAX`].
    pub nodes: u16,
    /// Bytes per operation (a positive multiple of 8; exactly 8 for the atomics).
    pub payload: u32,
    /// Operations each worker keeps in flight.
    pub outstanding: u32,
    /// [`MinimalOp::Put`] only: puts per flush; must divide `outstanding`.
    pub signal_every: u32,
    /// Time before the measurement window opens.
    pub warmup_ns: u64,
    /// Length of the measurement window.
    pub measure_ns: u64,
}

impl MinimalParams {
    /// Two workers over shared memory, 16 operations in flight each, a flush every 8 puts,
    /// 50 ms of warm-up and a 300 ms window.
    pub fn new(op: MinimalOp, payload: u32) -> MinimalParams {
        MinimalParams {
            transports: Some("sm".into()),
            op,
            nodes: 2,
            payload,
            outstanding: 16,
            signal_every: 8,
            warmup_ns: 50_000_000,
            measure_ns: 300_000_000,
        }
    }
}

/// What one worker did, and what the others left in its region.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MinimalNode {
    /// Operations it issued that completed successfully, warm-up and drain included.
    pub completed: u64,
    /// Of those, the ones that completed inside the measurement window.
    pub in_window: u64,
    /// Operations that completed with an error.
    pub failed: u64,
    /// READ or RPC data that was not the owner's pattern, or PUT slots of its region
    /// that were torn.
    pub bad_data: u64,
    /// CSWAPs that found the value they expected (each added one to the target word).
    pub cas_won: u64,
    /// RPC requests it answered.
    pub am_served: u64,
    /// Word 0 of its region after the run: the atomics' target.
    pub word0: u64,
    /// Payload slots of its region holding the writer's whole PUT image after the run.
    pub slots_written: u64,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct MinimalResult {
    /// Operations completed inside the window, all workers.
    pub ops: u64,
    /// `ops` per second per worker (per node): the unit of `hytra micro`'s Mops/s.
    pub ops_per_sec: f64,
    /// Latency samples (one per operation; one per put group for [`MinimalOp::Put`]).
    pub latency_samples: u64,
    /// Mean latency from post to the loop turn that saw the completion.
    pub mean_ns: u64,
    /// Median latency (log2 histogram, 12.5% resolution).
    pub p50_ns: u64,
    /// 99th-percentile latency (same histogram).
    pub p99_ns: u64,
    /// Per worker, in worker order (worker `i` issues to worker `(i + 1) % nodes`).
    pub nodes: Vec<MinimalNode>,
}

#[repr(C)]
struct RawParams {
    transports: *const c_char,
    op: u32,
    nodes: u32,
    payload: u32,
    outstanding: u32,
    signal_every: u32,
    peer_errors: u32,
    warmup_ns: u64,
    measure_ns: u64,
}

#[repr(C)]
#[derive(Copy, Clone)]
struct RawNode {
    completed: u64,
    in_window: u64,
    failed: u64,
    bad_data: u64,
    cas_won: u64,
    am_served: u64,
    word0: u64,
    slots_written: u64,
}

#[repr(C)]
struct RawResult {
    ops: u64,
    latency_samples: u64,
    latency_mean_ns: u64,
    latency_p50_ns: u64,
    latency_p99_ns: u64,
    node: [RawNode; NODES_MAX],
    error: [c_char; ERR_LEN],
}

extern "C" {
    fn hytra_ucp_minimal_abi(
        params_size: *mut usize,
        result_size: *mut usize,
        nodes_max: *mut u32,
        outstanding_max: *mut u32,
    );
    fn hytra_ucp_minimal_run(p: *const RawParams, r: *mut RawResult) -> c_int;
}

/// Whether this file's declarations have minimal.c's layout (a mismatch would be a build
/// bug: the two are edited together).
fn abi_matches() -> bool {
    let (mut params, mut result, mut nodes, mut outstanding) = (0usize, 0usize, 0u32, 0u32);
    // SAFETY: the function only writes the four values through the pointers, which point
    // to live locals.
    unsafe { hytra_ucp_minimal_abi(&mut params, &mut result, &mut nodes, &mut outstanding) };
    params == size_of::<RawParams>()
        && result == size_of::<RawResult>()
        && nodes as usize == NODES_MAX
        && outstanding == OUTSTANDING_MAX
}

fn text(err: &[c_char; ERR_LEN]) -> String {
    let bytes: Vec<u8> = err.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Runs the minimal UCP program: creates a UCP context over `params.transports`, one
/// worker per node on its own thread, keeps `outstanding` operations in flight from each
/// worker to the next for the warm-up and the window, drains, checks what the operations
/// left in memory, and tears everything down. Blocks for the whole run.
///
/// Bad parameters and UCX failures (no such transport, a stuck drain) come back as
/// [`BackendError::Config`] with the program's message; nothing aborts the process.
pub fn run_minimal(params: &MinimalParams) -> Result<MinimalResult, BackendError> {
    assert!(abi_matches(), "minimal.rs and minimal.c disagree on the layout of their structs");
    let tls_value = tls_list(params.transports.as_deref());
    let peer_errors = peer_errors(tls_value.as_deref());
    let tls = tls_value
        .map(CString::new)
        .transpose()
        .map_err(|_| BackendError::Config("UCX transports contain a NUL byte".into()))?;
    let raw = RawParams {
        transports: tls.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
        op: params.op.code(),
        nodes: u32::from(params.nodes),
        payload: params.payload,
        outstanding: params.outstanding,
        signal_every: params.signal_every,
        peer_errors: u32::from(peer_errors),
        warmup_ns: params.warmup_ns,
        measure_ns: params.measure_ns,
    };
    let empty = RawNode {
        completed: 0,
        in_window: 0,
        failed: 0,
        bad_data: 0,
        cas_won: 0,
        am_served: 0,
        word0: 0,
        slots_written: 0,
    };
    let mut out = RawResult {
        ops: 0,
        latency_samples: 0,
        latency_mean_ns: 0,
        latency_p50_ns: 0,
        latency_p99_ns: 0,
        node: [empty; NODES_MAX],
        error: [0; ERR_LEN],
    };
    // SAFETY: `raw` and `out` have minimal.c's layout (checked by abi_matches above);
    // `raw.transports` is null or a NUL-terminated string (`tls`) that outlives the call;
    // the C side reads `raw` and writes only `out`, and keeps neither pointer after it
    // returns (its threads are joined before).
    let rc = unsafe { hytra_ucp_minimal_run(&raw, &mut out) };
    if rc != 0 {
        return Err(BackendError::Config(format!("minimal UCP program: {}", text(&out.error))));
    }
    let nodes: Vec<MinimalNode> = out.node[..usize::from(params.nodes)]
        .iter()
        .map(|n| MinimalNode {
            completed: n.completed,
            in_window: n.in_window,
            failed: n.failed,
            bad_data: n.bad_data,
            cas_won: n.cas_won,
            am_served: n.am_served,
            word0: n.word0,
            slots_written: n.slots_written,
        })
        .collect();
    assert_eq!(
        out.ops,
        nodes.iter().map(|n| n.in_window).sum::<u64>(),
        "the program's total is the sum of its workers' windows"
    );
    let window_s = params.measure_ns as f64 / 1e9;
    Ok(MinimalResult {
        ops: out.ops,
        ops_per_sec: out.ops as f64 / window_s / f64::from(params.nodes),
        latency_samples: out.latency_samples,
        mean_ns: out.latency_mean_ns,
        p50_ns: out.latency_p50_ns,
        p99_ns: out.latency_p99_ns,
        nodes,
    })
}
