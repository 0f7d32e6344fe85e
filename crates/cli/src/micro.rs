//! `hytra micro`: the raw-primitive benchmark (DrTM+H §4.2, Fig. 5) on the simulator, on
//! threads or over UCX; with `--ucp-baseline`, each UCX point next to a minimal UCP
//! program doing the same operation (what hytra's layers cost).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use hytra_fabric::constants::DATAGRAM_MTU;
use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{CpuMode, SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, RunStats};
use hytra_workloads::micro::{
    check_payload, effective_payload, run_point_settled, MicroError, MicroParams, Point, Primitive,
    SETTLED_OPS_MIN,
};
use serde_json::json;

use crate::choice::{named, on_or, Switch};
use crate::span::{check_warmup, warmup_ns, Span};
use crate::table::{mops, open_output, us, write_json, Table};
use crate::{usage, BackendKind, CliError};

/// Options of `hytra micro`.
#[derive(Args, Debug, Clone)]
pub struct MicroArgs {
    /// Backend: sim (simulated cluster, virtual time), local (threads, real time) or
    /// ucx (UCX between threads of this process; needs the ucx feature).
    #[arg(long, default_value = "sim")]
    backend: String,
    /// UCX transports for --backend ucx (UCX_TLS syntax).
    #[arg(long, default_value = "sm")]
    transports: String,
    /// NIC profile of the simulator: cx3, cx4, cx5 or roce.
    #[arg(long, default_value = "cx4")]
    profile: String,
    /// Nodes [default: 16 on sim, 2 on local].
    #[arg(long)]
    nodes: Option<u16>,
    /// Workers per node [default: 24 on sim, 1 on local].
    #[arg(long)]
    workers: Option<u16>,
    /// OS threads (local only) [default: one per core].
    #[arg(long)]
    threads: Option<usize>,
    /// Coroutines per worker.
    #[arg(long, default_value_t = 4)]
    coroutines: u16,
    /// Requests per doorbell batch (per gather for RPCs).
    #[arg(long, default_value_t = 8)]
    batch: u16,
    /// Primitives to measure, comma-separated [default: all but rpc-write, which
    /// --multi-object measures].
    #[arg(long, value_delimiter = ',', value_parser = named(&Primitive::ALL, Primitive::name))]
    primitives: Option<Vec<Primitive>>,
    /// Payloads in bytes [default: 8,16,...,4096].
    #[arg(long, value_delimiter = ',')]
    payloads: Option<Vec<u32>>,
    /// Connections per peer per worker to measure with [default: 1,5 on sim (16-node and
    /// 80-node settings), 1 on local].
    #[arg(long, value_delimiter = ',')]
    lanes: Option<Vec<u16>>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Measured time per point, virtual on sim: a number and a unit (60us, 400ms) or
    /// bare seconds; lengthened where too short for the point's latency [default: 60us
    /// on sim, 400ms elsewhere (100ms with --quick)].
    #[arg(long, value_name = "DURATION")]
    duration: Option<Span>,
    /// Warm-up before each point, as a fraction of --duration [default: 0.333 on sim
    /// (20us of the default 60us; a third of any --duration), 0.25 elsewhere (0.2 with
    /// --quick)].
    #[arg(long)]
    warmup: Option<f64>,
    /// Let RPC frames to one destination share a datagram (the runtime's default in
    /// `hytra bench`) [default: off, which measures the raw primitive, one request per
    /// message, as the paper does].
    #[arg(long)]
    rpc_coalescing: Option<Switch>,
    /// How the simulator charges CPU time: `model` (deterministic cost model) or
    /// `measured[:SCALE]` (the clock time of each step's own code, times SCALE; not replayable).
    #[arg(long, default_value = "model")]
    cpu: String,
    /// Run every simulated point twice and fail unless both runs have the same trace hash.
    #[arg(long)]
    self_check: bool,
    /// Fewer payloads and shorter windows.
    #[arg(long)]
    quick: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Instead of the primitive matrix, the multi-object benchmark of Fig. 6: each
    /// transaction reads or writes this many 64-byte objects on random remote nodes,
    /// one-sided and two-sided, with the optimisations added one by one (+CO, +OR, +DB,
    /// +PA). Typical: 10.
    #[arg(long)]
    multi_object: Option<u16>,
    /// With --backend ucx and --nodes 2: after each point, run a minimal UCP program
    /// (crates/fabric/src/ucx/minimal.c, no hytra in between) doing the same operation
    /// with the same transports, payload, windows and operations in flight, and print its
    /// rate and the ratio UCP/hytra (how much hytra costs).
    #[arg(long)]
    ucp_baseline: bool,
}

/// Everything validated, ready to run.
#[derive(Clone)]
struct Plan {
    backend: BackendKind,
    #[cfg_attr(not(feature = "ucx"), allow(dead_code))]
    transports: String,
    profile: NicProfile,
    cpu: CpuMode,
    shape: ClusterShape,
    threads: Option<usize>,
    primitives: Vec<Primitive>,
    payloads: Vec<u32>,
    lanes: Vec<u16>,
    params: MicroParams,
    /// Run the minimal UCP program after each point (`--ucp-baseline`).
    ucp_baseline: bool,
}

#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
fn plan(a: &MicroArgs) -> Result<Plan, CliError> {
    let backend = BackendKind::parse(&a.backend)?;
    let Some(profile) = NicProfile::by_name(&a.profile) else {
        return usage(format!(
            "unknown NIC profile '{}' (expected one of: {})",
            a.profile,
            NicProfile::NAMES.join(", ")
        ));
    };
    let sim = backend == BackendKind::Sim;
    let cpu = parse_cpu(&a.cpu)?;
    if !sim && (a.cpu != "model" || a.self_check) {
        return usage("--cpu and --self-check apply to the sim backend only");
    }
    if a.self_check && cpu != CpuMode::Model {
        return usage("--self-check needs --cpu model (measured CPU time does not replay)");
    }
    let nodes = a.nodes.unwrap_or(if sim { 16 } else { 2 });
    let workers = a.workers.unwrap_or(if sim { 24 } else { 1 });
    if nodes < 2 {
        return usage(format!("--nodes {nodes}: the benchmark needs at least 2 nodes"));
    }
    if workers == 0 {
        return usage("--workers must be at least 1");
    }
    if a.coroutines == 0 || a.batch == 0 || usize::from(a.batch) > hytra_rt::constants::BATCH_MAX {
        return usage(format!(
            "--coroutines must be positive and --batch in 1..={}",
            hytra_rt::constants::BATCH_MAX
        ));
    }
    if a.threads == Some(0) {
        return usage("--threads must be at least 1");
    }
    let primitives = a.primitives.clone().unwrap_or_else(|| Primitive::FIG5.to_vec());
    let default_payloads: &[u32] = if a.quick {
        &[8, 64, 512, 4096]
    } else {
        &[8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    };
    let payloads = a.payloads.clone().unwrap_or_else(|| default_payloads.to_vec());
    for &p in &payloads {
        if let Err(MicroError::Payload { payload, reason }) =
            check_payload(Primitive::Read, p, DATAGRAM_MTU)
        {
            return usage(format!("payload {payload} B {reason}"));
        }
    }
    let lanes = a.lanes.clone().unwrap_or_else(|| if sim { vec![1, 5] } else { vec![1] });
    if let Some(l) = lanes.iter().find(|&&l| l == 0 || l > hytra_fabric::constants::LANES_MAX) {
        return usage(format!(
            "--lanes {l}: must be in 1..={}",
            hytra_fabric::constants::LANES_MAX
        ));
    }
    let max = Span::from_ns(backend.window_max_ns());
    if let Some(d) = a.duration.filter(|&d| d > max) {
        return usage(format!("--duration {d}: expected at most {max} on {}", a.backend));
    }
    let measure = a.duration.map_or(
        match (sim, a.quick) {
            (true, _) => 60_000,
            (false, false) => 400_000_000,
            (false, true) => 100_000_000,
        },
        Span::ns,
    );
    let warmup = a.warmup.unwrap_or(match (sim, a.quick) {
        (true, _) => 1.0 / 3.0,
        (false, false) => 0.25,
        (false, true) => 0.2,
    });
    check_warmup(warmup)?;
    let params = MicroParams {
        rpc_timeout_ns: if sim { 1_000_000 } else { 1_000_000_000 },
        rpc_coalescing: on_or(a.rpc_coalescing, false),
        ..MicroParams::fig5(a.coroutines, a.batch, warmup_ns(measure, warmup), measure, a.seed)
    };
    if let Some(n) = a.multi_object {
        if n == 0 || usize::from(n) > hytra_rt::constants::BATCH_MAX {
            return usage(format!(
                "--multi-object {n}: objects per transaction must be in 1..={}",
                hytra_rt::constants::BATCH_MAX
            ));
        }
    }
    let shape = ClusterShape { nodes, workers_per_node: workers, lanes_per_peer: 1 };
    if let Err(e) = hytra_fabric::validate_shape(shape) {
        return usage(e.to_string());
    }
    if a.ucp_baseline {
        check_baseline(a, backend, shape, &lanes, &params)?;
    }
    Ok(Plan {
        backend,
        transports: a.transports.clone(),
        profile,
        cpu,
        shape,
        threads: a.threads,
        primitives,
        payloads,
        lanes,
        params,
        ucp_baseline: a.ucp_baseline,
    })
}

/// Refuses `--ucp-baseline` where the minimal UCP program could not do the same thing as
/// hytra: it runs exactly one worker per node, two nodes, one endpoint per peer.
fn check_baseline(
    a: &MicroArgs,
    backend: BackendKind,
    shape: ClusterShape,
    lanes: &[u16],
    params: &MicroParams,
) -> Result<(), CliError> {
    if !cfg!(feature = "ucx") {
        return usage(
            "--ucp-baseline needs the ucx backend, which is not in this build: install libucx-dev and build with --features ucx",
        );
    }
    if backend != BackendKind::Ucx {
        return usage("--ucp-baseline compares the ucx backend with plain UCP: add --backend ucx");
    }
    if shape.nodes != 2 {
        return usage(format!(
            "--ucp-baseline needs --nodes 2 (got {}): the minimal UCP program pairs two workers",
            shape.nodes
        ));
    }
    if lanes != [1] {
        return usage(
            "--ucp-baseline needs --lanes 1: the minimal UCP program has one endpoint per peer",
        );
    }
    if a.multi_object.is_some() {
        return usage("--ucp-baseline applies to the primitive matrix, not to --multi-object");
    }
    let outstanding = baseline_outstanding(shape, params);
    let max = baseline_outstanding_max();
    if outstanding > max {
        return usage(format!(
            "--ucp-baseline: coroutines x batch x workers = {outstanding} operations in flight per node; the minimal UCP program keeps at most {max}"
        ));
    }
    Ok(())
}

/// Operations in flight the minimal UCP program's workers support.
#[cfg(feature = "ucx")]
fn baseline_outstanding_max() -> u64 {
    u64::from(hytra_fabric::ucx::minimal::OUTSTANDING_MAX)
}

#[cfg(not(feature = "ucx"))]
fn baseline_outstanding_max() -> u64 {
    unreachable!("--ucp-baseline is refused by plan() without the ucx feature")
}

/// Operations a node keeps in flight in hytra's benchmark, which the minimal program's one
/// worker per node keeps too: every coroutine of every worker posts `batch` requests and
/// waits for them all.
fn baseline_outstanding(shape: ClusterShape, params: &MicroParams) -> u64 {
    u64::from(params.coroutines) * u64::from(params.batch) * u64::from(shape.workers_per_node)
}

fn parse_cpu(s: &str) -> Result<CpuMode, CliError> {
    let bad =
        || CliError::Usage(format!("--cpu '{s}': expected model, measured or measured:SCALE"));
    match s.split_once(':') {
        None if s == "model" => Ok(CpuMode::Model),
        None if s == "measured" => Ok(CpuMode::Measured { scale: 1.0 }),
        Some(("measured", scale)) => match scale.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(CpuMode::Measured { scale: x }),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// One measured point with the run's statistics.
struct Measured {
    point: Point,
    stats: RunStats,
    /// The minimal UCP program on the same point (`--ucp-baseline`; `None` without it or
    /// for primitives it has no equivalent of).
    baseline: Option<Baseline>,
    /// The window asked for (`point.window_ns` is longer when it had to be extended).
    asked_ns: u64,
}

impl Measured {
    /// What to add to a progress line when the window was extended.
    fn extension_note(&self) -> String {
        if self.point.window_ns > self.asked_ns {
            format!(
                " (window extended from {} to {}: the shorter one held fewer than {SETTLED_OPS_MIN} completions or less than twice the p99 latency)",
                Span::from_ns(self.asked_ns),
                Span::from_ns(self.point.window_ns)
            )
        } else {
            String::new()
        }
    }
}

/// What the minimal UCP program measured for one point.
#[derive(Clone, Debug)]
struct Baseline {
    /// The UCP operation it ran for hytra's primitive.
    op: &'static str,
    /// Operations in flight per worker.
    outstanding: u32,
    /// Puts per flush (WRITE only; hytra's signaled WRITE is followed by a flush).
    signal_every: u32,
    /// Operations completed in the window, both workers.
    ops: u64,
    /// Per node, as hytra's rate.
    ops_per_sec: f64,
    /// Per operation (per flushed group of puts for WRITE), not per batch as hytra's.
    mean_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
}

impl Baseline {
    /// UCP's rate over hytra's: how many times faster plain UCP is (the goal is <= 1.5).
    fn ratio(&self, hytra_ops_per_sec: f64) -> Option<f64> {
        (hytra_ops_per_sec > 0.0).then(|| self.ops_per_sec / hytra_ops_per_sec)
    }
}

/// Runs the minimal UCP program for `primitive`; `None` for the WRITE-based RPCs, which
/// have no single UCP operation to compare with.
#[cfg(feature = "ucx")]
fn measure_baseline(
    plan: &Plan,
    primitive: Primitive,
    payload: u32,
) -> anyhow::Result<Option<Baseline>> {
    use hytra_fabric::ucx::minimal::{run_minimal, MinimalOp, MinimalParams};
    let op = match primitive {
        Primitive::Read => MinimalOp::Get,
        Primitive::Write => MinimalOp::Put,
        Primitive::Cas => MinimalOp::Cswap,
        Primitive::Faa => MinimalOp::FetchAdd,
        Primitive::Rpc => MinimalOp::AmRoundTrip,
        Primitive::WriteRpc | Primitive::RpcWrite => return Ok(None),
    };
    let outstanding = u32::try_from(baseline_outstanding(plan.shape, &plan.params))
        .expect("checked against OUTSTANDING_MAX by plan()");
    let params = MinimalParams {
        transports: Some(plan.transports.clone()),
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
    let r = run_minimal(&params)?;
    // A yardstick that lost operations or read wrong data measures nothing.
    for (i, n) in r.nodes.iter().enumerate() {
        anyhow::ensure!(
            n.failed == 0 && n.bad_data == 0,
            "the minimal UCP program's worker {i} saw {} failed operations and {} wrong data",
            n.failed,
            n.bad_data
        );
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
    _plan: &Plan,
    _primitive: Primitive,
    _payload: u32,
) -> anyhow::Result<Option<Baseline>> {
    unreachable!("--ucp-baseline is refused by plan() without the ucx feature")
}

fn measure(
    plan: &Plan,
    primitive: Primitive,
    payload: u32,
    lanes: u16,
    self_check: bool,
) -> anyhow::Result<Measured> {
    let shape = ClusterShape { lanes_per_peer: lanes, ..plan.shape };
    let mut params = plan.params;
    if plan.backend == BackendKind::Sim {
        // Large payloads are bandwidth-bound: the same number of requests in flight takes
        // proportionally longer to drain, so the windows grow with the payload.
        let scale = u64::from(payload.div_ceil(256)).max(1);
        params.warmup_ns *= scale;
        params.measure_ns *= scale;
    }
    let max = plan.backend.window_max_ns();
    let (point, stats) = match plan.backend {
        BackendKind::Sim => {
            let cfg = SimConfig {
                profile: plan.profile.clone(),
                cpu: plan.cpu,
                ..SimConfig::new(shape, plan.params.seed)
            };
            let fresh = || SimCluster::new(cfg.clone());
            let (point, stats) = run_point_settled(fresh, primitive, payload, params, max)?;
            if self_check {
                let (_, replay) = run_point_settled(fresh, primitive, payload, params, max)?;
                anyhow::ensure!(
                    replay.trace_hash == stats.trace_hash,
                    "self-check failed: trace hash {:#018x} then {:#018x} for the same seed",
                    stats.trace_hash,
                    replay.trace_hash
                );
            }
            (point, stats)
        }
        BackendKind::Local => {
            let mut cfg = LocalConfig::new(shape);
            cfg.threads = plan.threads;
            run_point_settled(|| LocalCluster::new(cfg.clone()), primitive, payload, params, max)?
        }
        #[cfg(feature = "ucx")]
        BackendKind::Ucx => {
            let mut cfg = hytra_fabric::ucx::UcxConfig::new(shape);
            cfg.threads = plan.threads;
            cfg.transports = Some(plan.transports.clone());
            let fresh = || hytra_fabric::ucx::UcxCluster::new(cfg.clone());
            run_point_settled(fresh, primitive, payload, params, max)?
        }
        #[cfg(not(feature = "ucx"))]
        BackendKind::Ucx => unreachable!("refused by plan() without the ucx feature"),
    };
    Ok(Measured { point, stats, baseline: None, asked_ns: params.measure_ns })
}

/// The steps of the multi-object benchmark (Fig. 6), each adding one optimisation.
const LADDER: [&str; 5] = ["baseline", "+CO", "+OR", "+DB", "+PA"];

/// The parameters of ladder step `step` for transactions of `objects` objects.
fn ladder_params(base: MicroParams, objects: u16, coroutines: u16, step: usize) -> MicroParams {
    MicroParams {
        coroutines: if step >= 1 { coroutines } else { 1 },
        batch: if step >= 2 { objects } else { 1 },
        doorbell: step >= 3,
        passive_ack: step >= 4,
        ..base
    }
}

/// `hytra micro --multi-object N`: transactions per second per machine at each step.
fn run_multi(args: &MicroArgs, plan: Plan, objects: u16) -> Result<(), CliError> {
    let out = args.json.as_deref().map(open_output).transpose()?;
    let payload = plan.payloads.first().copied().unwrap_or(64);
    let lanes = plan.lanes.first().copied().unwrap_or(1);
    // Read: one-sided READ vs an RPC returning the object. Write: one-sided WRITE vs an
    // RPC carrying it. Passive ACK applies to writes only (a read needs its data).
    let columns = [
        ("read", Primitive::Read),
        ("read", Primitive::Rpc),
        ("write", Primitive::Write),
        ("write", Primitive::RpcWrite),
    ];
    let mut rows = Vec::new();
    let mut t =
        Table::new(&["step", "read 1-sided", "read 2-sided", "write 1-sided", "write 2-sided"]);
    for (step, name) in LADDER.iter().enumerate() {
        let mut cells = vec![name.to_string()];
        for &(op, p) in &columns {
            if step == 4 && op == "read" {
                cells.push("-".into());
                continue;
            }
            let params = ladder_params(plan.params, objects, plan.params.coroutines, step);
            let step_plan = Plan { params, ..plan.clone() };
            let m = measure(&step_plan, p, payload, lanes, false)
                .with_context(|| format!("measuring {} at step {name}", p.name()))?;
            // Per-operation rates become transactions of `objects` operations.
            let txn_per_sec = m.point.ops_per_sec / f64::from(objects);
            eprintln!(
                "{name:<8} {op:<5} {:<9}: {} M txn/s per node{}",
                p.name(),
                mops(txn_per_sec),
                m.extension_note()
            );
            cells.push(mops(txn_per_sec));
            rows.push(json!({
                "step": name,
                "op": op,
                "primitive": if p == Primitive::Read || p == Primitive::Write { "one-sided" } else { "two-sided" },
                "txn_per_sec": txn_per_sec,
                "p50_us": m.point.p50_ns as f64 / 1e3,
                "p99_us": m.point.p99_ns as f64 / 1e3,
                "window_us": m.point.window_ns as f64 / 1e3,
                "coroutines": params.coroutines,
                "outstanding": params.batch,
                "doorbell_batching": params.doorbell,
                "passive_ack": params.passive_ack,
            }));
        }
        t.row(cells);
    }
    println!(
        "
multi-object transactions of {objects} x {payload} B, M txn/s per machine\n\n{}",
        t.render()
    );
    if let (Some(file), Some(path)) = (out, args.json.as_deref()) {
        let doc = json!({
            "command": "micro",
            "mode": "multi-object",
            "backend": args.backend,
            "nodes": plan.shape.nodes,
            "workers": plan.shape.workers_per_node,
            "objects": objects,
            "payload": payload,
            "seed": plan.params.seed,
            "results": rows,
        });
        write_json(file, path, &doc)?;
    }
    Ok(())
}

/// Runs `hytra micro`.
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
pub fn run(args: MicroArgs) -> Result<(), CliError> {
    let plan = plan(&args)?;
    if let Some(objects) = args.multi_object {
        return run_multi(&args, plan, objects);
    }
    let out = args.json.as_deref().map(open_output).transpose()?;
    let sim = plan.backend == BackendKind::Sim;
    if sim {
        let cfg = SimConfig {
            profile: plan.profile.clone(),
            ..SimConfig::new(plan.shape, plan.params.seed)
        };
        eprintln!("{}", cfg.describe());
    }
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
    let wall = Instant::now();
    let mut results = Vec::new();
    let mut trace = 0xCBF2_9CE4_8422_2325u64;
    let mut events = 0u64;
    let mut verbs = 0u64;
    for (i, &(p, payload, lanes)) in todo.iter().enumerate() {
        let replay = || {
            let argv: Vec<String> = std::env::args().skip(1).collect();
            format!("measuring {} at {payload} B (replay: hytra {})", p.name(), argv.join(" "))
        };
        let mut m = measure(&plan, p, payload, lanes, args.self_check).with_context(replay)?;
        if plan.ucp_baseline {
            // Right after hytra's run, so that both see the same machine load.
            m.baseline = measure_baseline(&plan, p, payload)
                .with_context(|| format!("minimal UCP program: {}", replay()))?;
        }
        eprintln!(
            "[{}/{}] {:<5} {:>4} B lanes={}: {} Mops/s per node, p50 {} µs{}",
            i + 1,
            todo.len(),
            p.name(),
            m.point.payload,
            lanes,
            mops(m.point.ops_per_sec),
            us(m.point.p50_ns),
            m.extension_note()
        );
        if let Some(b) = &m.baseline {
            eprintln!(
                "      minimal UCP {}: {} Mops/s per node, op p50 {} µs; UCP/hytra {}",
                b.op,
                mops(b.ops_per_sec),
                us(b.p50_ns),
                ratio_text(b.ratio(m.point.ops_per_sec))
            );
        }
        trace = (trace ^ m.stats.trace_hash).wrapping_mul(0x0000_0100_0000_01B3);
        events += m.stats.events;
        verbs += m.stats.verbs;
        results.push(m);
    }
    let wall_s = wall.elapsed().as_secs_f64();
    print_table(&plan, &results);
    let threads =
        LocalConfig { threads: plan.threads, ..LocalConfig::new(plan.shape) }.thread_count();
    let cores = if sim {
        None
    } else {
        Some(threads.min(std::thread::available_parallelism().map_or(1, |n| n.get())))
    };
    if args.self_check {
        println!("\nself-check: every point ran twice with identical trace hashes");
    }
    if sim {
        println!(
            "\nsimulated {events} events ({verbs} verbs) in {wall_s:.2} s of wall time: {:.2} M events/s, {:.2} M verbs/s; trace hash {trace:#018x}",
            events as f64 / wall_s / 1e6,
            verbs as f64 / wall_s / 1e6
        );
    } else {
        println!(
            "\n{} threads on {} cores; per-core rates divide the cluster total by the cores",
            threads,
            cores.unwrap_or(1)
        );
    }
    if let (Some(file), Some(path)) = (out, args.json.as_deref()) {
        let rows: Vec<_> = results
            .iter()
            .map(|m| {
                let p = &m.point;
                let mut row = json!({
                    "primitive": p.primitive.name(),
                    "payload": p.payload,
                    "lanes": p.lanes,
                    "setting": if p.lanes == 1 { format!("{}-node", plan.shape.nodes) } else { format!("{}-node connections", u32::from(plan.shape.nodes) * u32::from(p.lanes)) },
                    "ops_per_sec": p.ops_per_sec,
                    "p50_us": p.p50_ns as f64 / 1e3,
                    "p99_us": p.p99_ns as f64 / 1e3,
                    "ops": p.ops,
                    "window_us": p.window_ns as f64 / 1e3,
                    "failures": p.failures,
                });
                if let Some(c) = cores {
                    row["ops_per_sec_per_core"] = json!(p.ops_per_sec * f64::from(plan.shape.nodes) / c as f64);
                }
                if plan.ucp_baseline {
                    add_baseline_json(&mut row, m);
                }
                row
            })
            .collect();
        let mut doc = json!({
            "command": "micro",
            "backend": args.backend,
            "nodes": plan.shape.nodes,
            "workers": plan.shape.workers_per_node,
            "coroutines": plan.params.coroutines,
            "batch": plan.params.batch,
            "rpc_coalescing": plan.params.rpc_coalescing,
            "seed": plan.params.seed,
            "results": rows,
            "wall_s": wall_s,
        });
        if sim {
            doc["profile"] = json!(plan.profile.name);
            doc["cpu"] = json!(args.cpu);
            doc["trace_hash"] = json!(format!("{trace:#018x}"));
            doc["sim"] = json!({
                "events": events,
                "events_per_sec": events as f64 / wall_s,
                "verbs": verbs,
                "verbs_per_sec": verbs as f64 / wall_s,
            });
        } else {
            doc["threads"] = json!(threads);
            doc["cores"] = json!(cores);
        }
        if plan.ucp_baseline {
            doc["transports"] = json!(plan.transports);
            doc["ucp_baseline"] = json!({
                "program": "crates/fabric/src/ucx/minimal.c",
                "outstanding_per_node": baseline_outstanding(plan.shape, &plan.params),
                "ratio": "ucp_minimal.ops_per_sec / ops_per_sec (goal <= 1.5)",
                "latency": "per operation (per flushed group of puts for write); hytra's p50/p99 are per batch",
            });
        }
        write_json(file, path, &doc)?;
    }
    Ok(())
}

/// The `--ucp-baseline` fields of one JSON row.
fn add_baseline_json(row: &mut serde_json::Value, m: &Measured) {
    match &m.baseline {
        Some(b) => {
            row["ucp_minimal"] = json!({
                "op": b.op,
                "ops_per_sec": b.ops_per_sec,
                "ops": b.ops,
                "outstanding": b.outstanding,
                "signal_every": b.signal_every,
                "op_mean_us": b.mean_ns as f64 / 1e3,
                "op_p50_us": b.p50_ns as f64 / 1e3,
                "op_p99_us": b.p99_ns as f64 / 1e3,
            });
            row["ucp_minimal_ratio"] = json!(b.ratio(m.point.ops_per_sec));
        }
        None => {
            row["ucp_minimal"] = serde_json::Value::Null;
            row["ucp_minimal_ratio"] = serde_json::Value::Null;
            row["ucp_minimal_note"] = json!(NO_BASELINE);
        }
    }
}

/// Why the WRITE-based RPCs have no baseline.
const NO_BASELINE: &str =
    "no UCP baseline: an RPC built from WRITEs into polled mailboxes has no single UCP operation to compare with";

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

fn print_table(plan: &Plan, results: &[Measured]) {
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
    let who = if plan.backend == BackendKind::Sim {
        format!("per node, profile {}", plan.profile.name)
    } else {
        "per node".into()
    };
    println!(
        "\nraw primitives: {} nodes x {} workers, {} coroutines x batch {} ({who}; x5 = 5 connections per peer, the 80-node setting)\n",
        plan.shape.nodes, plan.shape.workers_per_node, plan.params.coroutines, plan.params.batch
    );
    println!("{}", t.render());
    if plan.ucp_baseline {
        println!(
            "\nUCP = a minimal UCP program (crates/fabric/src/ucx/minimal.c) on the same {} transports, payload and windows: one worker per node, {} operations in flight each (coroutines x batch x workers), a WRITE flushed every {} puts as hytra's signaled WRITE is; UCP/hytra is how many times faster plain UCP is (goal: <= 1.5). n/a: {NO_BASELINE}.",
            plan.transports,
            baseline_outstanding(plan.shape, &plan.params),
            if plan.params.passive_ack { plan.params.batch } else { 1 },
        );
    }
}
