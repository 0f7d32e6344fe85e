//! The raw-primitive benchmark as a library (DrTM+H §4.2, Fig. 5, and the multi-object
//! benchmark of Fig. 6): a checked [`MicroPlan`] in, measured points out, each on a
//! fresh cluster of its backend; on UCX, optionally next to a minimal UCP program doing
//! the same operation; the matrix as the text `hytra micro` prints. Not for: choosing the
//! plan from flags, or printing.

use std::time::Instant;

use hytra_fabric::constants::DATAGRAM_MTU;
use hytra_fabric::cpu::CpuTable;
use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{CpuMode, SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, RunStats};
use hytra_workloads::micro::{
    check_payload, effective_payload, run_point_settled, MicroError, MicroParams, Point, Primitive,
};
use serde::{Deserialize, Serialize};

use crate::table::{mops, us, Table};

/// Where a micro benchmark runs, with what only that backend takes.
#[derive(Clone, Debug)]
pub enum MicroBackend {
    /// The simulator: its NIC profile and how it charges CPU time.
    Sim {
        /// NIC profile (boxed: ten times the size of the other variants).
        profile: Box<NicProfile>,
        /// Cost model or measured steps.
        cpu: CpuMode,
        /// What each term of the runtime's CPU work costs under [`CpuMode::Model`].
        costs: CpuTable,
    },
    /// Threads of this process.
    Local {
        /// OS threads; `None`: one per core.
        threads: Option<usize>,
    },
    /// UCX between threads of this process (a build with the `ucx` feature).
    Ucx {
        /// UCX transports (`UCX_TLS` syntax).
        transports: String,
        /// OS threads; `None`: one per core.
        threads: Option<usize>,
    },
}

impl MicroBackend {
    /// The longest window a point may be measured over (asked for, or lengthened to
    /// when too short for its latency): a virtual second on sim, where a 16 x 24 point
    /// simulates about a million events per wall-second; ten minutes in real time.
    pub fn window_max_ns(&self) -> u64 {
        match self {
            MicroBackend::Sim { .. } => 1_000_000_000,
            MicroBackend::Local { .. } | MicroBackend::Ucx { .. } => 600_000_000_000,
        }
    }

    /// The simulator's configuration for a cluster of `shape` run from `seed` (`None`
    /// on the real backends).
    pub fn sim_config(&self, shape: ClusterShape, seed: u64) -> Option<SimConfig> {
        match self {
            MicroBackend::Sim { profile, cpu, costs } => Some(SimConfig {
                profile: NicProfile::clone(profile),
                cpu: *cpu,
                cpu_profile: costs.clone(),
                ..SimConfig::new(shape, seed)
            }),
            MicroBackend::Local { .. } | MicroBackend::Ucx { .. } => None,
        }
    }

    /// As `--backend` names it.
    pub fn name(&self) -> &'static str {
        match self {
            MicroBackend::Sim { .. } => "sim",
            MicroBackend::Local { .. } => "local",
            MicroBackend::Ucx { .. } => "ucx",
        }
    }

    /// Whether time is virtual.
    pub fn is_sim(&self) -> bool {
        matches!(self, MicroBackend::Sim { .. })
    }

    /// OS threads of the run (`None`: one per core).
    pub fn threads(&self) -> Option<usize> {
        match self {
            MicroBackend::Sim { .. } => None,
            MicroBackend::Local { threads } | MicroBackend::Ucx { threads, .. } => *threads,
        }
    }
}

/// A checked micro benchmark.
#[derive(Clone, Debug)]
pub struct MicroPlan {
    /// The backend.
    pub backend: MicroBackend,
    /// The cluster (its lanes are replaced by each point's).
    pub shape: ClusterShape,
    /// Primitives to measure.
    pub primitives: Vec<Primitive>,
    /// Payloads in bytes (atomics always use 8).
    pub payloads: Vec<u32>,
    /// Connections per peer per worker to measure with.
    pub lanes: Vec<u16>,
    /// Coroutines, batch, windows, seed and the optimisations on.
    pub params: MicroParams,
    /// On UCX with two nodes: run the minimal UCP program after each point.
    pub ucp_baseline: bool,
}

/// Why a point could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum MicroRunError {
    /// The benchmark itself failed.
    #[error(transparent)]
    Point(#[from] MicroError),
    /// A simulated point did not replay.
    #[error("self-check failed: trace hash {first:#018x} then {second:#018x} for the same seed")]
    SelfCheck {
        /// The first run's trace hash.
        first: u64,
        /// The replay's.
        second: u64,
    },
    /// The minimal UCP program failed or saw wrong data.
    #[error("minimal UCP program: {0}")]
    Baseline(String),
    /// The ucx backend was asked for in a build without it.
    #[error(
        "the ucx backend is not in this build: install libucx-dev and build with --features ucx"
    )]
    NoUcx,
}

/// One measured point with the run's statistics.
#[derive(Clone, Debug)]
pub struct Measured {
    /// What it measured.
    pub point: Point,
    /// The backend's counters of the run.
    pub stats: RunStats,
    /// The minimal UCP program on the same point (`None` without `ucp_baseline`, or for
    /// primitives it has no equivalent of).
    pub baseline: Option<Baseline>,
    /// The window asked for (`point.window_ns` is longer when it had to be extended).
    pub asked_ns: u64,
}

/// What the minimal UCP program measured for one point.
#[derive(Clone, Debug)]
pub struct Baseline {
    /// The UCP operation it ran for hytra's primitive.
    pub op: &'static str,
    /// Operations in flight per worker.
    pub outstanding: u32,
    /// Puts per flush (WRITE only; hytra's signaled WRITE is followed by a flush).
    pub signal_every: u32,
    /// Operations completed in the window, both workers.
    pub ops: u64,
    /// Per node, as hytra's rate.
    pub ops_per_sec: f64,
    /// Per operation (per flushed group of puts for WRITE), not per batch as hytra's.
    pub mean_ns: u64,
    /// Median per operation.
    pub p50_ns: u64,
    /// 99th percentile per operation.
    pub p99_ns: u64,
}

impl Baseline {
    /// UCP's rate over hytra's: how many times faster plain UCP is (the goal is <= 1.5).
    pub fn ratio(&self, hytra_ops_per_sec: f64) -> Option<f64> {
        (hytra_ops_per_sec > 0.0).then(|| self.ops_per_sec / hytra_ops_per_sec)
    }
}

/// Why the WRITE-based RPCs have no baseline.
pub const NO_BASELINE: &str =
    "no UCP baseline: an RPC built from WRITEs into polled mailboxes has no single UCP operation to compare with";

/// Operations a node keeps in flight in hytra's benchmark, which the minimal program's one
/// worker per node keeps too: every coroutine of every worker posts `batch` requests and
/// waits for them all.
pub fn baseline_outstanding(shape: ClusterShape, params: &MicroParams) -> u64 {
    u64::from(params.coroutines) * u64::from(params.batch) * u64::from(shape.workers_per_node)
}

/// Operations in flight the minimal UCP program's workers support (0 in a build without
/// UCX).
pub fn baseline_outstanding_max() -> u64 {
    #[cfg(feature = "ucx")]
    return u64::from(hytra_fabric::ucx::minimal::OUTSTANDING_MAX);
    #[cfg(not(feature = "ucx"))]
    0
}

/// Runs the minimal UCP program for `primitive`; `None` for the WRITE-based RPCs, which
/// have no single UCP operation to compare with.
#[cfg(feature = "ucx")]
fn measure_baseline(
    plan: &MicroPlan,
    primitive: Primitive,
    payload: u32,
) -> Result<Option<Baseline>, MicroRunError> {
    use hytra_fabric::ucx::minimal::{run_minimal, MinimalOp, MinimalParams};
    let MicroBackend::Ucx { transports, .. } = &plan.backend else {
        return Err(MicroRunError::Baseline("it runs on the ucx backend only".into()));
    };
    let op = match primitive {
        Primitive::Read => MinimalOp::Get,
        Primitive::Write => MinimalOp::Put,
        Primitive::Cas => MinimalOp::Cswap,
        Primitive::Faa => MinimalOp::FetchAdd,
        Primitive::Rpc => MinimalOp::AmRoundTrip,
        Primitive::WriteRpc | Primitive::RpcWrite => return Ok(None),
    };
    let outstanding = u32::try_from(baseline_outstanding(plan.shape, &plan.params))
        .map_err(|_| MicroRunError::Baseline("too many operations in flight".into()))?;
    let params = MinimalParams {
        transports: Some(transports.clone()),
        op,
        nodes: plan.shape.nodes,
        payload: effective_payload(primitive, payload),
        outstanding,
        // With passive ACK only the last request of a batch is signaled, and the shim
        // flushes after a signaled WRITE only: one flush per batch.
        signal_every: if plan.params.passive_ack { u32::from(plan.params.batch) } else { 1 },
        warmup_ns: plan.params.warmup_ns,
        measure_ns: plan.params.measure_ns,
    };
    let r = run_minimal(&params).map_err(|e| MicroRunError::Baseline(e.to_string()))?;
    // A yardstick that lost operations or read wrong data measures nothing.
    for (i, n) in r.nodes.iter().enumerate() {
        if n.failed != 0 || n.bad_data != 0 {
            return Err(MicroRunError::Baseline(format!(
                "its worker {i} saw {} failed operations and {} wrong data",
                n.failed, n.bad_data
            )));
        }
    }
    Ok(Some(Baseline {
        op: op.name(),
        outstanding,
        signal_every: if op == MinimalOp::Put { params.signal_every } else { 1 },
        ops: r.ops,
        ops_per_sec: r.ops_per_sec,
        mean_ns: r.mean_ns,
        p50_ns: r.p50_ns,
        p99_ns: r.p99_ns,
    }))
}

#[cfg(not(feature = "ucx"))]
fn measure_baseline(
    _plan: &MicroPlan,
    _primitive: Primitive,
    _payload: u32,
) -> Result<Option<Baseline>, MicroRunError> {
    Err(MicroRunError::NoUcx)
}

/// Measures one point on a fresh cluster (twice on sim with `self_check`, which must
/// replay).
pub fn measure(
    plan: &MicroPlan,
    primitive: Primitive,
    payload: u32,
    lanes: u16,
    self_check: bool,
) -> Result<Measured, MicroRunError> {
    let shape = ClusterShape { lanes_per_peer: lanes, ..plan.shape };
    let mut params = plan.params;
    if plan.backend.is_sim() {
        // Large payloads are bandwidth-bound: the same number of requests in flight takes
        // proportionally longer to drain, so the windows grow with the payload.
        let scale = u64::from(payload.div_ceil(256)).max(1);
        params.warmup_ns *= scale;
        params.measure_ns *= scale;
    }
    let max = plan.backend.window_max_ns();
    let (point, stats) = match &plan.backend {
        MicroBackend::Sim { .. } => {
            let cfg = plan.backend.sim_config(shape, params.seed).expect("a simulated backend");
            let fresh = || SimCluster::new(cfg.clone());
            let (point, stats) = run_point_settled(fresh, primitive, payload, params, max)?;
            if self_check {
                let (_, replay) = run_point_settled(fresh, primitive, payload, params, max)?;
                if replay.trace_hash != stats.trace_hash {
                    return Err(MicroRunError::SelfCheck {
                        first: stats.trace_hash,
                        second: replay.trace_hash,
                    });
                }
            }
            (point, stats)
        }
        MicroBackend::Local { threads } => {
            let mut cfg = LocalConfig::new(shape);
            cfg.threads = *threads;
            run_point_settled(|| LocalCluster::new(cfg.clone()), primitive, payload, params, max)?
        }
        MicroBackend::Ucx { transports, threads } => {
            measure_ucx(shape, transports, *threads, primitive, payload, params, max)?
        }
    };
    Ok(Measured { point, stats, baseline: None, asked_ns: params.measure_ns })
}

#[cfg(feature = "ucx")]
fn measure_ucx(
    shape: ClusterShape,
    transports: &str,
    threads: Option<usize>,
    primitive: Primitive,
    payload: u32,
    params: MicroParams,
    max: u64,
) -> Result<(Point, RunStats), MicroRunError> {
    let mut cfg = hytra_fabric::ucx::UcxConfig::new(shape);
    cfg.threads = threads;
    cfg.transports = Some(transports.to_string());
    let fresh = || hytra_fabric::ucx::UcxCluster::new(cfg.clone());
    Ok(run_point_settled(fresh, primitive, payload, params, max)?)
}

#[cfg(not(feature = "ucx"))]
fn measure_ucx(
    _: ClusterShape,
    _: &str,
    _: Option<usize>,
    _: Primitive,
    _: u32,
    _: MicroParams,
    _: u64,
) -> Result<(Point, RunStats), MicroRunError> {
    Err(MicroRunError::NoUcx)
}

/// The points of the primitive matrix, in the order they run: (primitive, payload,
/// lanes), atomics at 8 bytes only, each once.
pub fn points(plan: &MicroPlan) -> Vec<(Primitive, u32, u16)> {
    let mut todo = Vec::new();
    for &lanes in &plan.lanes {
        for &p in &plan.primitives {
            let payloads: &[u32] = if p.is_atomic() { &[8] } else { &plan.payloads };
            for &payload in payloads {
                let payload = effective_payload(p, payload);
                if check_payload(p, payload, DATAGRAM_MTU).is_ok()
                    && !todo.contains(&(p, payload, lanes))
                {
                    todo.push((p, payload, lanes));
                }
            }
        }
    }
    todo
}

/// The primitive matrix, measured.
#[derive(Clone, Debug)]
pub struct MatrixRun {
    /// Every point, in the order of [`points`].
    pub results: Vec<Measured>,
    /// The points' trace hashes folded into one (sim).
    pub trace: u64,
    /// Events simulated, all points.
    pub events: u64,
    /// Verbs simulated, all points.
    pub verbs: u64,
    /// Wall time of the whole matrix.
    pub wall_s: f64,
}

/// A point that failed: which, and why (the cause is this error's source, not part of
/// its message, so that a printed chain names it once).
#[derive(Debug, thiserror::Error)]
#[error("measuring {} at {payload} B{}", primitive.name(), step.map_or(String::new(), |s| format!(", step {s}")))]
pub struct PointError {
    /// The primitive.
    pub primitive: Primitive,
    /// The payload.
    pub payload: u32,
    /// The multi-object ladder's step (`None` in the matrix).
    pub step: Option<&'static str>,
    /// Why.
    #[source]
    pub cause: MicroRunError,
}

/// Measures every point of [`points`]; `on_point` gets each as it is done, with its
/// index and the number of points.
pub fn run_matrix(
    plan: &MicroPlan,
    self_check: bool,
    on_point: &mut dyn FnMut(usize, usize, &Measured),
) -> Result<MatrixRun, PointError> {
    let todo = points(plan);
    let wall = Instant::now();
    let mut run = MatrixRun {
        results: Vec::new(),
        trace: 0xCBF2_9CE4_8422_2325,
        events: 0,
        verbs: 0,
        wall_s: 0.0,
    };
    for (i, &(primitive, payload, lanes)) in todo.iter().enumerate() {
        let failed = |cause| PointError { primitive, payload, step: None, cause };
        let mut m = measure(plan, primitive, payload, lanes, self_check).map_err(failed)?;
        if plan.ucp_baseline {
            // Right after hytra's run, so that both see the same machine load.
            m.baseline = measure_baseline(plan, primitive, payload).map_err(failed)?;
        }
        on_point(i, todo.len(), &m);
        run.trace = (run.trace ^ m.stats.trace_hash).wrapping_mul(0x0000_0100_0000_01B3);
        run.events += m.stats.events;
        run.verbs += m.stats.verbs;
        run.results.push(m);
    }
    run.wall_s = wall.elapsed().as_secs_f64();
    Ok(run)
}

impl MatrixRun {
    /// The report of this run of `plan`: every point's row, and what the backend was.
    /// `threads` and `cores` are a real backend's OS threads and the cores they ran on
    /// (per-core rates divide the cluster's total by the cores).
    pub fn report(&self, plan: &MicroPlan, threads: usize, cores: usize) -> MicroReport {
        let nodes = plan.shape.nodes;
        let sim = plan.backend.is_sim();
        let results = self
            .results
            .iter()
            .map(|m| {
                let p = &m.point;
                let setting = match p.lanes {
                    1 => format!("{nodes}-node"),
                    l => format!("{}-node connections", u32::from(nodes) * u32::from(l)),
                };
                let baseline = m.baseline.as_ref();
                MicroRow {
                    primitive: p.primitive.name().to_string(),
                    payload: p.payload,
                    lanes: p.lanes,
                    setting,
                    ops_per_sec: p.ops_per_sec,
                    p50_us: p.p50_ns as f64 / 1e3,
                    p99_us: p.p99_ns as f64 / 1e3,
                    ops: p.ops,
                    window_us: p.window_ns as f64 / 1e3,
                    failures: p.failures,
                    ops_per_sec_per_core: (!sim)
                        .then(|| p.ops_per_sec * f64::from(nodes) / cores.max(1) as f64),
                    ucp_minimal: baseline.map(UcpMinimal::of),
                    ucp_minimal_ratio: baseline.and_then(|b| b.ratio(p.ops_per_sec)),
                    ucp_minimal_note: (plan.ucp_baseline && baseline.is_none())
                        .then(|| NO_BASELINE.to_string()),
                }
            })
            .collect();
        let per_sec = |n: u64| n as f64 / self.wall_s;
        let (mut profile, mut cpu, mut cpu_profile) = (None, None, None);
        if let MicroBackend::Sim { profile: nic, cpu: mode, costs } = &plan.backend {
            profile = Some(nic.name.to_string());
            cpu = Some(cpu_mode_name(*mode));
            cpu_profile = Some(costs.name().to_string());
        }
        let (transports, ucp_baseline) = match (&plan.backend, plan.ucp_baseline) {
            (MicroBackend::Ucx { transports, .. }, true) => (
                Some(transports.clone()),
                Some(BaselineNote {
                    program: "crates/fabric/src/ucx/minimal.c".into(),
                    outstanding_per_node: baseline_outstanding(plan.shape, &plan.params),
                    ratio: "ucp_minimal.ops_per_sec / ops_per_sec (goal <= 1.5)".into(),
                    latency: "per operation (per flushed group of puts for write); hytra's p50/p99 are per batch".into(),
                }),
            ),
            _ => (None, None),
        };
        MicroReport {
            schema: MICRO_SCHEMA,
            command: "micro".into(),
            backend: plan.backend.name().into(),
            nodes,
            workers: plan.shape.workers_per_node,
            coroutines: plan.params.coroutines,
            batch: plan.params.batch,
            rpc_coalescing: plan.params.rpc_coalescing,
            seed: plan.params.seed,
            results,
            wall_s: self.wall_s,
            profile,
            cpu,
            cpu_profile,
            trace_hash: sim.then(|| format!("{:#018x}", self.trace)),
            sim: sim.then(|| SimCounts {
                events: self.events,
                events_per_sec: per_sec(self.events),
                verbs: self.verbs,
                verbs_per_sec: per_sec(self.verbs),
            }),
            threads: (!sim).then_some(threads),
            cores: (!sim).then_some(cores),
            transports,
            ucp_baseline,
        }
    }
}

/// `mode` as `--cpu` spells it: `model`, `measured`, or `measured:SCALE`.
pub fn cpu_mode_name(mode: CpuMode) -> String {
    match mode {
        CpuMode::Model => "model".into(),
        CpuMode::Measured { scale: 1.0 } => "measured".into(),
        CpuMode::Measured { scale } => format!("measured:{scale}"),
    }
}

/// The version of [`MicroReport`]'s and [`MultiReport`]'s layouts; it changes when a
/// field changes meaning or goes away (new fields keep it).
pub const MICRO_SCHEMA: u32 = 1;

/// One point of a primitive matrix, as reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MicroRow {
    /// The primitive, as `--primitives` names it.
    pub primitive: String,
    /// Bytes per request.
    pub payload: u32,
    /// Connections per peer.
    pub lanes: u16,
    /// The connection setting it stands for (`16-node`, or `80-node connections`).
    pub setting: String,
    /// Per node.
    pub ops_per_sec: f64,
    /// Median latency of a batch.
    pub p50_us: f64,
    /// 99th percentile latency of a batch.
    pub p99_us: f64,
    /// Operations completed in the window.
    pub ops: u64,
    /// The window measured (longer than asked when it had to be extended).
    pub window_us: f64,
    /// Operations that failed.
    pub failures: u64,
    /// The cluster's rate over the cores it ran on (real backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_per_sec_per_core: Option<f64>,
    /// The minimal UCP program on the same point, where asked and where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ucp_minimal: Option<UcpMinimal>,
    /// Its rate over hytra's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ucp_minimal_ratio: Option<f64>,
    /// Why a point asked for has no baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ucp_minimal_note: Option<String>,
}

/// What the minimal UCP program measured, as reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UcpMinimal {
    /// The UCP operation.
    pub op: String,
    /// Per node.
    pub ops_per_sec: f64,
    /// Completed in the window.
    pub ops: u64,
    /// In flight per worker.
    pub outstanding: u32,
    /// Puts per flush.
    pub signal_every: u32,
    /// Mean per operation.
    pub op_mean_us: f64,
    /// Median per operation.
    pub op_p50_us: f64,
    /// 99th percentile per operation.
    pub op_p99_us: f64,
}

impl UcpMinimal {
    fn of(b: &Baseline) -> UcpMinimal {
        UcpMinimal {
            op: b.op.to_string(),
            ops_per_sec: b.ops_per_sec,
            ops: b.ops,
            outstanding: b.outstanding,
            signal_every: b.signal_every,
            op_mean_us: b.mean_ns as f64 / 1e3,
            op_p50_us: b.p50_ns as f64 / 1e3,
            op_p99_us: b.p99_ns as f64 / 1e3,
        }
    }
}

/// What the simulator did over a whole matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimCounts {
    /// Events simulated.
    pub events: u64,
    /// Per wall-second.
    pub events_per_sec: f64,
    /// Verbs simulated.
    pub verbs: u64,
    /// Per wall-second.
    pub verbs_per_sec: f64,
}

/// How the minimal UCP program's numbers read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineNote {
    /// Its source.
    pub program: String,
    /// Operations a node keeps in flight, as hytra's benchmark does.
    pub outstanding_per_node: u64,
    /// What the ratio is.
    pub ratio: String,
    /// What its latencies are.
    pub latency: String,
}

/// Everything a `hytra micro` matrix measured (its `--json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MicroReport {
    /// [`MICRO_SCHEMA`].
    pub schema: u32,
    /// Always `micro`.
    pub command: String,
    /// As `--backend` names it.
    pub backend: String,
    /// Nodes.
    pub nodes: u16,
    /// Workers per node.
    pub workers: u16,
    /// Coroutines per worker.
    pub coroutines: u16,
    /// Requests each coroutine posts before it waits.
    pub batch: u16,
    /// Whether RPCs to one node share a datagram.
    pub rpc_coalescing: bool,
    /// The seed.
    pub seed: u64,
    /// Every point, in the order measured.
    pub results: Vec<MicroRow>,
    /// Wall time of the whole matrix.
    pub wall_s: f64,
    /// The NIC profile (sim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// How CPU work was costed (sim): `--cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// The CPU profile (sim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_profile: Option<String>,
    /// Every point's trace folded into one (sim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_hash: Option<String>,
    /// The simulator's own speed (sim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimCounts>,
    /// OS threads (real backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// Cores they ran on (real backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<usize>,
    /// UCX transports, with the UCP baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transports: Option<String>,
    /// How to read the baseline's numbers, where it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ucp_baseline: Option<BaselineNote>,
}

/// One cell of the multi-object benchmark, as reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiRow {
    /// The ladder step.
    pub step: String,
    /// `read` or `write`.
    pub op: String,
    /// `one-sided` or `two-sided`.
    pub primitive: String,
    /// Transactions per second per node.
    pub txn_per_sec: f64,
    /// Median latency of a batch.
    pub p50_us: f64,
    /// 99th percentile latency of a batch.
    pub p99_us: f64,
    /// The window measured.
    pub window_us: f64,
    /// Coroutines per worker.
    pub coroutines: u16,
    /// Requests in flight per coroutine.
    pub outstanding: u16,
    /// Whether doorbells were batched.
    pub doorbell_batching: bool,
    /// Whether writes were acknowledged passively.
    pub passive_ack: bool,
}

/// Everything a `hytra micro --multi-object` run measured (its `--json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiReport {
    /// [`MICRO_SCHEMA`].
    pub schema: u32,
    /// Always `micro`.
    pub command: String,
    /// Always `multi-object`.
    pub mode: String,
    /// As `--backend` names it.
    pub backend: String,
    /// Nodes.
    pub nodes: u16,
    /// Workers per node.
    pub workers: u16,
    /// Objects per transaction.
    pub objects: u16,
    /// Bytes per object.
    pub payload: u32,
    /// The seed.
    pub seed: u64,
    /// Every cell measured (reads with passive ACK are not).
    pub results: Vec<MultiRow>,
}

/// The report of `cells`, the multi-object benchmark of `plan` with `objects` objects.
pub fn multi_report(plan: &MicroPlan, objects: u16, cells: &[MultiCell]) -> MultiReport {
    MultiReport {
        schema: MICRO_SCHEMA,
        command: "micro".into(),
        mode: "multi-object".into(),
        backend: plan.backend.name().into(),
        nodes: plan.shape.nodes,
        workers: plan.shape.workers_per_node,
        objects,
        payload: plan.payloads[0],
        seed: plan.params.seed,
        results: cells.iter().filter_map(MultiCell::row).collect(),
    }
}

/// The steps of the multi-object benchmark (Fig. 6), each adding one optimisation.
pub const LADDER: [&str; 5] = ["baseline", "+CO", "+OR", "+DB", "+PA"];

/// The columns of the multi-object benchmark: read by one-sided READ or by an RPC that
/// returns the object; write by one-sided WRITE or by an RPC that carries it.
pub const MULTI_COLUMNS: [(&str, Primitive); 4] = [
    ("read", Primitive::Read),
    ("read", Primitive::Rpc),
    ("write", Primitive::Write),
    ("write", Primitive::RpcWrite),
];

/// The parameters of ladder step `step` for transactions of `objects` objects.
pub fn ladder_params(base: MicroParams, objects: u16, step: usize) -> MicroParams {
    MicroParams {
        coroutines: if step >= 1 { base.coroutines } else { 1 },
        batch: if step >= 2 { objects } else { 1 },
        doorbell: step >= 3,
        passive_ack: step >= 4,
        ..base
    }
}

/// One cell of the multi-object benchmark.
#[derive(Clone, Debug)]
pub struct MultiCell {
    /// The ladder step's name.
    pub step: &'static str,
    /// `read` or `write`.
    pub op: &'static str,
    /// The primitive.
    pub primitive: Primitive,
    /// The step's parameters.
    pub params: MicroParams,
    /// `None`: not measured (passive ACK applies to writes only: a read needs its data).
    pub measured: Option<Measured>,
    /// Transactions of `objects` operations per second per node.
    pub txn_per_sec: f64,
}

impl MultiCell {
    /// The cell's row (`None` if it was not measured).
    pub fn row(&self) -> Option<MultiRow> {
        let m = self.measured.as_ref()?;
        let one_sided = matches!(self.primitive, Primitive::Read | Primitive::Write);
        Some(MultiRow {
            step: self.step.into(),
            op: self.op.into(),
            primitive: if one_sided { "one-sided" } else { "two-sided" }.into(),
            txn_per_sec: self.txn_per_sec,
            p50_us: m.point.p50_ns as f64 / 1e3,
            p99_us: m.point.p99_ns as f64 / 1e3,
            window_us: m.point.window_ns as f64 / 1e3,
            coroutines: self.params.coroutines,
            outstanding: self.params.batch,
            doorbell_batching: self.params.doorbell,
            passive_ack: self.params.passive_ack,
        })
    }
}

/// The multi-object benchmark: every step of [`LADDER`] for every column of
/// [`MULTI_COLUMNS`] at the one payload and lane count of `plan`; `on_cell` gets each cell
/// as it is done.
pub fn run_multi(
    plan: &MicroPlan,
    objects: u16,
    on_cell: &mut dyn FnMut(&MultiCell),
) -> Result<Vec<MultiCell>, PointError> {
    let (&[payload], &[lanes]) = (plan.payloads.as_slice(), plan.lanes.as_slice()) else {
        panic!(
            "a multi-object plan has one payload and one lane count, not {:?} and {:?}",
            plan.payloads, plan.lanes
        );
    };
    let mut cells = Vec::new();
    for (step, name) in LADDER.iter().enumerate() {
        for &(op, primitive) in &MULTI_COLUMNS {
            let params = ladder_params(plan.params, objects, step);
            let mut cell =
                MultiCell { step: name, op, primitive, params, measured: None, txn_per_sec: 0.0 };
            if !(step == 4 && op == "read") {
                let step_plan = MicroPlan { params, ..plan.clone() };
                let m = measure(&step_plan, primitive, payload, lanes, false)
                    .map_err(|cause| PointError { primitive, payload, step: Some(*name), cause })?;
                // Per-operation rates become transactions of `objects` operations.
                cell.txn_per_sec = m.point.ops_per_sec / f64::from(objects);
                cell.measured = Some(m);
            }
            on_cell(&cell);
            cells.push(cell);
        }
    }
    Ok(cells)
}

/// A ratio as the tables print it (`-` where there is none).
pub fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// The primitive matrix as `hytra micro` prints it: a blank line, its title, the table of
/// every primitive and payload by lane count (with the minimal UCP program's rate where
/// it ran), and what UCP means there.
pub fn matrix_text(plan: &MicroPlan, results: &[Measured]) -> String {
    let mut header = vec!["primitive".to_string(), "payload".to_string()];
    for &l in &plan.lanes {
        let tag = if l == 1 { String::new() } else { format!(" x{l}") };
        header.push(format!("Mops/s{tag}"));
        header.push(format!("p50 µs{tag}"));
        header.push(format!("p99 µs{tag}"));
    }
    if plan.ucp_baseline {
        header.push("UCP Mops/s".into());
        header.push("UCP/hytra".into());
    }
    let titles: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&titles);
    let mut keys: Vec<(Primitive, u32)> = Vec::new();
    for m in results {
        let k = (m.point.primitive, m.point.payload);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (p, payload) in keys {
        let mut row = vec![p.name().to_string(), format!("{payload} B")];
        for &l in &plan.lanes {
            match results.iter().find(|m| {
                m.point.primitive == p && m.point.payload == payload && m.point.lanes == l
            }) {
                Some(m) => {
                    row.extend([mops(m.point.ops_per_sec), us(m.point.p50_ns), us(m.point.p99_ns)])
                }
                None => row.extend(["-".into(), "-".into(), "-".into()]),
            }
        }
        if plan.ucp_baseline {
            let m = results.iter().find(|m| m.point.primitive == p && m.point.payload == payload);
            match m.and_then(|m| m.baseline.as_ref().map(|b| (b, m.point.ops_per_sec))) {
                Some((b, hytra)) => row.extend([mops(b.ops_per_sec), ratio_text(b.ratio(hytra))]),
                None => row.extend(["n/a".into(), "n/a".into()]),
            }
        }
        t.row(row);
    }
    let who = match &plan.backend {
        MicroBackend::Sim { profile, .. } => format!("per node, profile {}", profile.name),
        _ => "per node".into(),
    };
    let mut o = format!(
        "\nraw primitives: {} nodes x {} workers, {} coroutines x batch {} ({who}; x5 = 5 connections per peer, the 80-node setting)\n\n",
        plan.shape.nodes, plan.shape.workers_per_node, plan.params.coroutines, plan.params.batch
    );
    o += &t.render();
    o += "\n";
    if let (true, MicroBackend::Ucx { transports, .. }) = (plan.ucp_baseline, &plan.backend) {
        o += &format!(
            "\nUCP = a minimal UCP program (crates/fabric/src/ucx/minimal.c) on the same {} transports, payload and windows: one worker per node, {} operations in flight each (coroutines x batch x workers), a WRITE flushed every {} puts as hytra's signaled WRITE is; UCP/hytra is how many times faster plain UCP is (goal: <= 1.5). n/a: {NO_BASELINE}.\n",
            transports,
            baseline_outstanding(plan.shape, &plan.params),
            if plan.params.passive_ack { plan.params.batch } else { 1 },
        );
    }
    o
}
