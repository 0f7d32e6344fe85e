//! `hytra io`'s options, and their checks into the plan of a run: the matrix of points,
//! the window, and the trace read before any run.

use std::path::PathBuf;

use clap::Args;
use hytra_fabric::sim::profile::NicProfile;
use hytra_io::bench::Mode;
use hytra_io::trace::TraceOp;
use hytra_io::DeviceModel;

use crate::cmd::{usage, BackendKind, Usage};
use crate::io::{IoBackend, IoEngine, IoPlan};
use crate::io_files::read_trace;
use crate::span::{check_warmup, check_window, warmup_ns, Span};

/// Options of `hytra io`.
#[derive(Args, Debug, Clone)]
pub struct IoArgs {
    /// Backend: local (threads and this machine's storage; the default here, since the
    /// point is to measure real storage), sim (a modelled device, virtual time) or ucx.
    #[arg(long, default_value = "local")]
    pub backend: String,
    /// UCX transports for --backend ucx.
    #[arg(long, default_value = "sm")]
    pub transports: String,
    /// NIC profile on sim, as in hytra bench and micro: cx3, cx4, cx5, roce or local (cx3 is the
    /// remote-I/O paper's 56 Gb/s FDR) [default: cx4].
    #[arg(long)]
    pub profile: Option<String>,
    /// Storage device model on sim: p3700x10 (the paper's ten NVMe drives) or p3700
    /// [default: p3700x10].
    #[arg(long)]
    pub device: Option<String>,
    /// Modes: local, fabric, remote.
    #[arg(long, value_delimiter = ',', default_value = "local,fabric,remote")]
    pub modes: Vec<String>,
    /// Engines: pool, thread, uring (local mode uses pool and uring only).
    #[arg(long, value_delimiter = ',', default_value = "pool,thread,uring")]
    pub engines: Vec<String>,
    /// Read sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "512,16384")]
    pub sizes: Vec<u32>,
    /// Connections (workers per node).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub connections: Vec<u16>,
    /// Reads in flight per connection.
    #[arg(long, value_delimiter = ',', default_value = "32")]
    pub depths: Vec<u16>,
    /// I/O threads of the pool engine (per node).
    #[arg(long, value_delimiter = ',', default_value = "8")]
    pub io_threads: Vec<u16>,
    /// io_uring slots per worker.
    #[arg(long, default_value_t = 64)]
    pub uring_depth: u32,
    /// Measured time per point, virtual on sim: a number and a unit (20ms, 1s) or bare
    /// seconds [default: 20ms on sim, where a modelled second of the paper's drives takes
    /// minutes of wall time; 1s elsewhere].
    #[arg(long, alias = "seconds", value_name = "DURATION")]
    pub duration: Option<Span>,
    /// Warm-up before each point, as a fraction of --duration (as in hytra bench).
    #[arg(long, default_value_t = 0.2)]
    pub warmup: f64,
    /// File to read (default: a fresh file of --file-mib MiB in the temp directory,
    /// removed afterwards).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Size of the generated file.
    #[arg(long, default_value_t = 256)]
    pub file_mib: u64,
    /// Read through the page cache instead of O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// Replay this trace (offset,length lines) locally and remotely [default: a
    /// generated TPC-H Q3-like trace at 16 KiB].
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Reads of the generated trace, at most (the query may end sooner on a small
    /// file).
    #[arg(long, default_value_t = 20_000)]
    pub trace_ops: usize,
    /// Skip trace replay.
    #[arg(long)]
    pub no_trace: bool,
    /// Write the generated Q3-like trace to this file and exit.
    #[arg(long)]
    pub gen_trace: Option<PathBuf>,
    /// Reads up to this size come back inside the completion message instead of by
    /// WRITE (at most what one datagram holds, about 4 KB).
    #[arg(long, default_value_t = 0)]
    pub inline_max: u32,
    /// Seed of offsets and the generated trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Measure thread creation and queue hand-off on this machine (the engine costs of
    /// modelled runs) and exit.
    #[arg(long)]
    pub calibrate: bool,
    /// This process's place in a cluster spread over processes (set by `hytra node`):
    /// node 0 requests, node 1 owns the file.
    #[arg(skip)]
    pub placement: Option<crate::Placement>,
}

/// A checked `hytra io`: the matrix, and `--trace` read and parsed before any run.
#[derive(Debug)]
pub struct IoCommand {
    /// The matrix of points and its backend.
    pub io: IoPlan,
    /// `--trace`'s reads.
    pub trace: Option<Vec<TraceOp>>,
}

/// Checks the options without running anything (for `hytra cluster`, before it starts
/// the nodes).
pub fn check(a: &IoArgs) -> Result<(), Usage> {
    plan(a).map(|_| ())
}

/// Validates every option and reads `--trace`, without running anything.
pub fn plan(a: &IoArgs) -> Result<IoCommand, Usage> {
    let backend = BackendKind::parse(&a.backend)?;
    let (profile, device) = sim_models(a, backend)?;
    let mut modes = Vec::new();
    for m in &a.modes {
        modes.push(match m.as_str() {
            "local" => Mode::Local,
            "fabric" => Mode::Fabric,
            "remote" => Mode::Remote,
            other => {
                return usage(format!("unknown mode '{other}' (expected local, fabric, remote)"))
            }
        });
    }
    let mut engines = Vec::new();
    for e in &a.engines {
        match IoEngine::parse(e) {
            Some(e) => engines.push(e),
            None => return usage(format!("unknown engine '{e}' (expected pool, thread, uring)")),
        }
    }
    check_counts(a)?;
    let default = if backend == BackendKind::Sim { 20_000_000 } else { 1_000_000_000 };
    let duration = a.duration.unwrap_or(Span::from_ns(default));
    let max = Span::from_ns(backend.window_max_ns());
    check_window(duration, max, &format!(" on {}", a.backend)).map_err(Usage)?;
    check_warmup(a.warmup).map_err(Usage)?;
    if let Some(path) = &a.gen_trace {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            return usage(format!(
                "--gen-trace {}: the directory {} does not exist",
                path.display(),
                dir.map_or(String::new(), |d| d.display().to_string())
            ));
        }
    }
    let trace = match (&a.trace, a.no_trace || a.gen_trace.is_some()) {
        (Some(_), true) => {
            return usage("--trace replays a trace, and --no-trace or --gen-trace says not to")
        }
        (Some(p), false) => Some(read_trace(p).map_err(|e| {
            // A trace the user named is the user's to fix, however it fails.
            debug_assert!(e.is_usage(), "{e}");
            Usage(e.to_string())
        })?),
        (None, _) => None,
    };
    check_spread(a, backend, &modes)?;
    // Only the random reads: a replay (local and remote, with a pool) or a trace written
    // still has work.
    let matrix_only = a.no_trace && a.gen_trace.is_none();
    let empty =
        modes.iter().all(|&m| m == Mode::Local) && engines.iter().all(|&e| e == IoEngine::Thread);
    if matrix_only && empty {
        return usage(
            "nothing to measure: local mode reads with the pool and uring engines (a thread \
             per request is a remote-mode engine); add one of them to --engines, or replay a \
             trace",
        );
    }
    let io_backend = match backend {
        BackendKind::Sim => IoBackend::Sim { profile: Box::new(profile), device },
        BackendKind::Local => IoBackend::Local,
        BackendKind::Ucx => {
            IoBackend::Ucx { transports: a.transports.clone(), placement: a.placement.clone() }
        }
    };
    let duration_ns = duration.ns();
    let io = IoPlan {
        backend: io_backend,
        modes,
        engines,
        sizes: a.sizes.clone(),
        connections: a.connections.clone(),
        depths: a.depths.clone(),
        io_threads: a.io_threads.clone(),
        uring_depth: a.uring_depth,
        duration_ns,
        warmup_ns: warmup_ns(duration_ns, a.warmup),
        seed: a.seed,
        inline_max: a.inline_max,
        window_max_ns: backend.window_max_ns(),
    };
    Ok(IoCommand { io, trace })
}

/// The simulator's NIC and storage models; refused on a real backend, which has its own.
fn sim_models(a: &IoArgs, backend: BackendKind) -> Result<(NicProfile, DeviceModel), Usage> {
    if backend != BackendKind::Sim {
        if let Some(flag) = [("--profile", &a.profile), ("--device", &a.device)]
            .iter()
            .find_map(|(flag, v)| v.is_some().then_some(flag))
        {
            return usage(format!(
                "{flag} is a model of the simulator: the {} backend runs on this machine's own NIC and storage",
                a.backend
            ));
        }
    }
    let name = a.profile.as_deref().unwrap_or("cx4");
    let Some(profile) = NicProfile::by_name(name) else {
        return usage(format!(
            "unknown NIC profile '{name}' (expected one of: {})",
            NicProfile::NAMES.join(", ")
        ));
    };
    let name = a.device.as_deref().unwrap_or("p3700x10");
    let Some(device) = DeviceModel::by_name(name) else {
        return usage(format!("unknown device '{name}' (expected p3700x10 or p3700)"));
    };
    Ok((profile, device))
}

/// Checks the sizes and counts of the matrix, and what may ride inline.
fn check_counts(a: &IoArgs) -> Result<(), Usage> {
    if a.sizes.iter().any(|&s| s == 0 || s > 1 << 20) {
        return usage("read sizes must be 1 B ..= 1 MiB");
    }
    if a.connections.iter().chain(&a.depths).chain(&a.io_threads).any(|&n| n == 0) {
        return usage("connections, depths and io-threads must be positive");
    }
    if a.connections.iter().any(|&c| c > 64) || a.depths.iter().any(|&d| d > 200) {
        return usage("at most 64 connections and 200 reads in flight per connection");
    }
    if a.uring_depth == 0 || a.trace_ops == 0 {
        return usage("--uring-depth and --trace-ops must be at least 1");
    }
    if a.inline_max > hytra_io::wire::INLINE_MAX {
        return usage(format!(
            "--inline-max {}: at most {} B (a read's data must fit in its completion datagram)",
            a.inline_max,
            hytra_io::wire::INLINE_MAX
        ));
    }
    Ok(())
}

/// Refuses a matrix of more than one point for a run spread over processes (which join
/// once), or one off the ucx backend.
fn check_spread(a: &IoArgs, backend: BackendKind, modes: &[Mode]) -> Result<(), Usage> {
    if a.placement.is_some() {
        // The processes join once, for one run: one point of the matrix.
        let points = modes.len() * a.engines.len() * a.sizes.len() * a.connections.len();
        if points * a.depths.len() * a.io_threads.len() != 1 || modes[0] == Mode::Local {
            return usage(
                "spread over processes, hytra io measures one point: give one of --modes \
                 (fabric or remote), --engines, --sizes, --connections (the cluster file's \
                 workers), --depths and --io-threads",
            );
        }
        if backend != BackendKind::Ucx {
            return usage("a cluster spread over processes runs on the ucx backend");
        }
    }
    Ok(())
}
