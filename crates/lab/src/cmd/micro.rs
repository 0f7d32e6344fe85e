//! `hytra micro`'s options, and their checks into a [`MicroPlan`]: the backend, the
//! primitives, payloads and lanes of the matrix (or the multi-object benchmark's one
//! point), the window and the simulator's CPU costs.

use std::path::PathBuf;

use clap::Args;
use hytra_fabric::constants::DATAGRAM_MTU;
use hytra_fabric::cpu::CpuTable;
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::CpuMode;
use hytra_fabric::ClusterShape;
use hytra_workloads::micro::{
    check_payload, effective_payload, MicroError, MicroParams, Primitive,
};

use crate::cmd::choice::{named, on_or, Switch};
use crate::cmd::{usage, BackendKind, Usage};
use crate::micro::{
    baseline_outstanding, baseline_outstanding_max, MicroBackend, MicroPlan, MULTI_COLUMNS,
};
use crate::span::{check_warmup, check_window, warmup_ns, Span};
use crate::CpuProfile;

/// Options of `hytra micro`.
#[derive(Args, Debug, Clone)]
pub struct MicroArgs {
    /// Backend: sim (simulated cluster, virtual time), local (threads, real time) or
    /// ucx (UCX between threads of this process; needs the ucx feature).
    #[arg(long, default_value = "sim")]
    pub backend: String,
    /// UCX transports for --backend ucx (UCX_TLS syntax).
    #[arg(long, default_value = "sm")]
    pub transports: String,
    /// NIC profile of the simulator: cx3, cx4, cx5, roce, or local (the `local` backend on
    /// this project's test machine, fitted to `hytra micro --backend local`).
    #[arg(long, default_value = "cx4")]
    pub profile: String,
    /// Nodes [default: 16 on sim, 2 on local].
    #[arg(long)]
    pub nodes: Option<u16>,
    /// Workers per node [default: 24 on sim, 1 on local].
    #[arg(long)]
    pub workers: Option<u16>,
    /// OS threads (local only) [default: one per core].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Coroutines per worker.
    #[arg(long, default_value_t = 4)]
    pub coroutines: u16,
    /// Requests per doorbell batch (per gather for RPCs).
    #[arg(long, default_value_t = 8)]
    pub batch: u16,
    /// Primitives to measure, comma-separated [default: all but rpc-write, which
    /// --multi-object measures].
    #[arg(long, value_delimiter = ',', value_parser = named(&Primitive::ALL, Primitive::name))]
    pub primitives: Option<Vec<Primitive>>,
    /// Payloads in bytes [default: 8,16,...,4096].
    #[arg(long, value_delimiter = ',')]
    pub payloads: Option<Vec<u32>>,
    /// Connections per peer per worker to measure with [default: 1,5 on sim (16-node and
    /// 80-node settings), 1 on local].
    #[arg(long, value_delimiter = ',')]
    pub lanes: Option<Vec<u16>>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Measured time per point, virtual on sim: a number and a unit (60us, 400ms) or
    /// bare seconds; lengthened where too short for the point's latency [default: 60us
    /// on sim, 400ms elsewhere (100ms with --quick)].
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<Span>,
    /// Warm-up before each point, as a fraction of --duration [default: 0.333 on sim
    /// (20us of the default 60us; a third of any --duration), 0.25 elsewhere (0.2 with
    /// --quick)].
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Let RPC frames to one destination share a datagram (the runtime's default in
    /// `hytra bench`) [default: off, which measures the raw primitive, one request per
    /// message, as the paper does].
    #[arg(long)]
    pub rpc_coalescing: Option<Switch>,
    /// How the simulator charges CPU time: `model` (deterministic cost model) or
    /// `measured[:SCALE]` (the clock time of each step's own code, times SCALE; not replayable).
    #[arg(long, default_value = "model")]
    pub cpu: String,
    /// What the runtime's CPU work costs on sim with `--cpu model`: `assumed` (the
    /// default), `host`, `paper` or a CPU profile file (see `hytra calibrate`).
    #[arg(long)]
    pub cpu_profile: Option<String>,
    /// Run every simulated point twice and fail unless both runs have the same trace hash.
    #[arg(long)]
    pub self_check: bool,
    /// Fewer payloads and shorter windows.
    #[arg(long)]
    pub quick: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Instead of the primitive matrix, the multi-object benchmark of Fig. 6: each
    /// transaction reads or writes this many objects (64 B, or the one --payloads size)
    /// on random remote nodes, one-sided and two-sided, with the optimisations added one
    /// by one (+CO, +OR, +DB, +PA). Typical: 10.
    #[arg(long)]
    pub multi_object: Option<u16>,
    /// With --backend ucx and --nodes 2: after each point, run a minimal UCP program
    /// (crates/fabric/src/ucx/minimal.c, no hytra in between) doing the same operation
    /// with the same transports, payload, windows and operations in flight, and print its
    /// rate and the ratio UCP/hytra (how much hytra costs).
    #[arg(long)]
    pub ucp_baseline: bool,
}

/// Checks every flag and builds the plan, before any point runs.
pub fn plan(a: &MicroArgs) -> Result<MicroPlan, Usage> {
    let backend = BackendKind::parse(&a.backend)?;
    let Some(profile) = NicProfile::by_name(&a.profile) else {
        return usage(format!(
            "unknown NIC profile '{}' (expected one of: {})",
            a.profile,
            NicProfile::NAMES.join(", ")
        ));
    };
    let sim = backend == BackendKind::Sim;
    let (cpu, costs) = cpu_costs(a, sim)?;
    let nodes = a.nodes.unwrap_or(if sim { 16 } else { 2 });
    let workers = a.workers.unwrap_or(if sim { 24 } else { 1 });
    if nodes < 2 {
        return usage(format!("--nodes {nodes}: the benchmark needs at least 2 nodes"));
    }
    if workers == 0 {
        return usage("--workers must be at least 1");
    }
    use hytra_rt::constants::{BATCH_MAX, COROUTINES_MAX};
    if a.coroutines == 0 || a.coroutines > COROUTINES_MAX {
        return usage(format!("--coroutines {}: expected 1..={COROUTINES_MAX}", a.coroutines));
    }
    if a.batch == 0 || usize::from(a.batch) > BATCH_MAX {
        return usage(format!("--batch {}: expected 1..={BATCH_MAX}", a.batch));
    }
    if a.threads == Some(0) {
        return usage("--threads must be at least 1");
    }
    if a.threads.is_some() && BackendKind::parse(&a.backend)? == BackendKind::Sim {
        return usage("--threads applies to the local and ucx backends (sim runs in virtual time)");
    }
    let (primitives, payloads, lanes) = match a.multi_object {
        Some(_) => multi_shape(a)?,
        None => matrix_shape(a, sim)?,
    };
    let (measure, warmup) = window(a, backend)?;
    let params = MicroParams {
        rpc_timeout_ns: if sim { 1_000_000 } else { 1_000_000_000 },
        rpc_coalescing: on_or(a.rpc_coalescing, false),
        ..MicroParams::fig5(a.coroutines, a.batch, warmup_ns(measure, warmup), measure, a.seed)
    };
    let shape = ClusterShape { nodes, workers_per_node: workers, lanes_per_peer: 1 };
    if let Err(e) = hytra_fabric::validate_shape(shape) {
        return usage(e.to_string());
    }
    if a.ucp_baseline {
        check_baseline(a, backend, shape, &lanes, &params)?;
    }
    let backend = match backend {
        BackendKind::Sim => MicroBackend::Sim { profile: Box::new(profile), cpu, costs },
        BackendKind::Local => MicroBackend::Local { threads: a.threads },
        BackendKind::Ucx => {
            MicroBackend::Ucx { transports: a.transports.clone(), threads: a.threads }
        }
    };
    Ok(MicroPlan {
        backend,
        shape,
        primitives,
        payloads,
        lanes,
        params,
        ucp_baseline: a.ucp_baseline,
    })
}

/// What a micro run measures: its primitives, payloads and lane counts.
type Shape = (Vec<Primitive>, Vec<u32>, Vec<u16>);

/// The primitive matrix's rows, payloads and lanes. Where both --primitives and
/// --payloads were given, each primitive but the atomics (always 8 B, which `hytra micro`
/// notes) must run at one of the payloads as given: an RPC carries at most its reply's
/// size, a `wrpc` mailbox its own.
fn matrix_shape(a: &MicroArgs, sim: bool) -> Result<Shape, Usage> {
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
            return usage(format!("--payloads {payload}: {reason}"));
        }
    }
    if a.primitives.is_some() && a.payloads.is_some() {
        let as_given = |&p: &Primitive, size: u32| {
            effective_payload(p, size) == size && check_payload(p, size, DATAGRAM_MTU).is_ok()
        };
        let unmet = |p: &&Primitive| !p.is_atomic() && !payloads.iter().any(|&s| as_given(p, s));
        if let Some(p) = primitives.iter().find(unmet) {
            let why = match check_payload(*p, payloads[0], DATAGRAM_MTU) {
                Err(MicroError::Payload { reason, .. }) => reason,
                _ => format!("it carries at most {} B", effective_payload(*p, payloads[0])),
            };
            return usage(format!(
                "--primitives {} runs at none of --payloads {}: {why}",
                p.name(),
                payloads.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            ));
        }
    }
    let lanes = a.lanes.clone().unwrap_or_else(|| if sim { vec![1, 5] } else { vec![1] });
    check_lanes(&lanes)?;
    Ok((primitives, payloads, lanes))
}

/// `--multi-object`: its own four columns, one object size (64 B unless given) and one
/// lane count.
fn multi_shape(a: &MicroArgs) -> Result<Shape, Usage> {
    let n = a.multi_object.unwrap_or(0);
    if n == 0 || usize::from(n) > hytra_rt::constants::BATCH_MAX {
        return usage(format!(
            "--multi-object {n}: objects per transaction must be in 1..={}",
            hytra_rt::constants::BATCH_MAX
        ));
    }
    if a.primitives.is_some() {
        return usage(
            "--primitives chooses the primitive matrix's rows; --multi-object measures its own \
             columns (reads and writes, one- and two-sided)",
        );
    }
    let payloads = a.payloads.clone().unwrap_or_else(|| vec![64]);
    let lanes = a.lanes.clone().unwrap_or_else(|| vec![1]);
    if payloads.len() != 1 || lanes.len() != 1 {
        return usage(
            "--multi-object measures one object size and one lane count: give --payloads and \
             --lanes one value each (64 and 1 unless given)",
        );
    }
    for &p in &payloads {
        if let Err(MicroError::Payload { payload, reason }) =
            check_payload(Primitive::RpcWrite, p, DATAGRAM_MTU)
        {
            return usage(format!("--payloads {payload}: {reason}"));
        }
    }
    check_lanes(&lanes)?;
    Ok((MULTI_COLUMNS.iter().map(|&(_, p)| p).collect(), payloads, lanes))
}

fn check_lanes(lanes: &[u16]) -> Result<(), Usage> {
    if let Some(l) = lanes.iter().find(|&&l| l == 0 || l > hytra_fabric::constants::LANES_MAX) {
        return usage(format!(
            "--lanes {l}: must be in 1..={}",
            hytra_fabric::constants::LANES_MAX
        ));
    }
    Ok(())
}

/// How the simulator costs CPU work (`--cpu`, `--cpu-profile`), checked against the
/// backend and `--self-check`.
fn cpu_costs(a: &MicroArgs, sim: bool) -> Result<(CpuMode, CpuTable), Usage> {
    let cpu = parse_cpu(&a.cpu)?;
    if !sim && (a.cpu != "model" || a.self_check) {
        return usage("--cpu and --self-check apply to the sim backend only");
    }
    if a.self_check && cpu != CpuMode::Model {
        return usage("--self-check needs --cpu model (measured CPU time does not replay)");
    }
    let costs = match (&a.cpu_profile, sim, cpu) {
        (None, _, _) => CpuTable::assumed(),
        (Some(_), false, _) => {
            return usage("--cpu-profile is the simulator's: real backends take their real time")
        }
        (Some(_), true, CpuMode::Measured { .. }) => {
            return usage("--cpu-profile costs steps under --cpu model; --cpu measured times them")
        }
        (Some(name), true, CpuMode::Model) => {
            CpuProfile::load(name).map_err(|e| Usage(e.to_string()))?.table("micro", &[])
        }
    };
    Ok((cpu, costs))
}

/// Each point's measured window in ns, and its warm-up as a fraction of it.
fn window(a: &MicroArgs, backend: BackendKind) -> Result<(u64, f64), Usage> {
    let sim = backend == BackendKind::Sim;
    let max = Span::from_ns(backend.window_max_ns());
    if let Some(d) = a.duration {
        check_window(d, max, &format!(" on {}", a.backend)).map_err(Usage)?;
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
    check_warmup(warmup).map_err(Usage)?;
    Ok((measure, warmup))
}

/// Refuses `--ucp-baseline` where the minimal UCP program could not do the same thing as
/// hytra: it runs exactly one worker per node, two nodes, one endpoint per peer.
fn check_baseline(
    a: &MicroArgs,
    backend: BackendKind,
    shape: ClusterShape,
    lanes: &[u16],
    params: &MicroParams,
) -> Result<(), Usage> {
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

fn parse_cpu(s: &str) -> Result<CpuMode, Usage> {
    let bad = || Usage(format!("--cpu '{s}': expected model, measured or measured:SCALE"));
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
