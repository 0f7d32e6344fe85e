//! `hytra io`: remote storage I/O measurements (random reads local, fabric-only and
//! remote with each engine, and trace replay), as in the remote-I/O paper.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use hytra_fabric::sim::profile::NicProfile;
use hytra_io::bench::IoReport;
use hytra_io::bench::{Mode, Target};
use hytra_io::trace::TraceOp;
use hytra_io::{DeviceModel, Exports, FileId};
use hytra_lab::io::{
    measure, summarise, FileReport, IoBackend, IoEngine, IoPlan, IoRunReport, TraceReport,
    IO_SCHEMA,
};
use hytra_lab::io_files::{q3_trace, read_trace, write_q3_trace, DataFile, IoFileError};

use crate::table::{open_output, write_json, Table};
use crate::{usage, BackendKind, CliError};
use hytra_lab::span::{check_warmup, check_window, warmup_ns, Span};

/// Options of `hytra io`.
#[derive(Args, Debug, Clone)]
pub struct IoArgs {
    /// Backend: local (threads and this machine's storage; the default here, since the
    /// point is to measure real storage), sim (a modelled device, virtual time) or ucx.
    #[arg(long, default_value = "local")]
    backend: String,
    /// UCX transports for --backend ucx.
    #[arg(long, default_value = "sm")]
    transports: String,
    /// NIC profile on sim, as in hytra bench and micro: cx3, cx4, cx5, roce or local (cx3 is the
    /// remote-I/O paper's 56 Gb/s FDR) [default: cx4].
    #[arg(long)]
    profile: Option<String>,
    /// Storage device model on sim: p3700x10 (the paper's ten NVMe drives) or p3700
    /// [default: p3700x10].
    #[arg(long)]
    device: Option<String>,
    /// Modes: local, fabric, remote.
    #[arg(long, value_delimiter = ',', default_value = "local,fabric,remote")]
    modes: Vec<String>,
    /// Engines: pool, thread, uring (local mode uses pool and uring only).
    #[arg(long, value_delimiter = ',', default_value = "pool,thread,uring")]
    engines: Vec<String>,
    /// Read sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "512,16384")]
    sizes: Vec<u32>,
    /// Connections (workers per node).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    connections: Vec<u16>,
    /// Reads in flight per connection.
    #[arg(long, value_delimiter = ',', default_value = "32")]
    depths: Vec<u16>,
    /// I/O threads of the pool engine (per node).
    #[arg(long, value_delimiter = ',', default_value = "8")]
    io_threads: Vec<u16>,
    /// io_uring slots per worker.
    #[arg(long, default_value_t = 64)]
    uring_depth: u32,
    /// Measured time per point, virtual on sim: a number and a unit (20ms, 1s) or bare
    /// seconds [default: 20ms on sim, where a modelled second of the paper's drives takes
    /// minutes of wall time; 1s elsewhere].
    #[arg(long, alias = "seconds", value_name = "DURATION")]
    pub(crate) duration: Option<Span>,
    /// Warm-up before each point, as a fraction of --duration (as in hytra bench).
    #[arg(long, default_value_t = 0.2)]
    warmup: f64,
    /// File to read (default: a fresh file of --file-mib MiB in the temp directory,
    /// removed afterwards).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Size of the generated file.
    #[arg(long, default_value_t = 256)]
    file_mib: u64,
    /// Read through the page cache instead of O_DIRECT.
    #[arg(long)]
    buffered: bool,
    /// Replay this trace (offset,length lines) locally and remotely [default: a
    /// generated TPC-H Q3-like trace at 16 KiB].
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Reads of the generated trace, at most (the query may end sooner on a small
    /// file).
    #[arg(long, default_value_t = 20_000)]
    trace_ops: usize,
    /// Skip trace replay.
    #[arg(long)]
    no_trace: bool,
    /// Write the generated Q3-like trace to this file and exit.
    #[arg(long)]
    gen_trace: Option<PathBuf>,
    /// Reads up to this size come back inside the completion message instead of by
    /// WRITE (at most what one datagram holds, about 4 KB).
    #[arg(long, default_value_t = 0)]
    inline_max: u32,
    /// Seed of offsets and the generated trace.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Measure thread creation and queue hand-off on this machine (the engine costs of
    /// modelled runs) and exit.
    #[arg(long)]
    calibrate: bool,
    /// This process's place in a cluster spread over processes (set by `hytra node`):
    /// node 0 requests, node 1 owns the file.
    #[arg(skip)]
    pub(crate) placement: Option<hytra_lab::Placement>,
}

/// A checked `hytra io`: the matrix, and `--trace` read and parsed before any run.
struct Plan {
    io: IoPlan,
    trace: Option<Vec<TraceOp>>,
}

/// Checks the options without running anything (for `hytra cluster`, before it starts
/// the nodes).
pub(crate) fn check(a: &IoArgs) -> Result<(), CliError> {
    plan(a).map(|_| ())
}

fn plan(a: &IoArgs) -> Result<Plan, CliError> {
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
    check_window(duration, max, &format!(" on {}", a.backend)).map_err(CliError::Usage)?;
    check_warmup(a.warmup).map_err(CliError::Usage)?;
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
        (Some(p), false) => Some(read_trace(p).map_err(file_error)?),
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
    Ok(Plan { io, trace })
}

/// The simulator's NIC and storage models; refused on a real backend, which has its own.
fn sim_models(a: &IoArgs, backend: BackendKind) -> Result<(NicProfile, DeviceModel), CliError> {
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
fn check_counts(a: &IoArgs) -> Result<(), CliError> {
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
fn check_spread(a: &IoArgs, backend: BackendKind, modes: &[Mode]) -> Result<(), CliError> {
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

/// The file the runs read: given, or generated (removed on a signal, and when dropped).
fn data_file(a: &IoArgs) -> Result<DataFile, CliError> {
    match &a.file {
        Some(p) => DataFile::given(p),
        None => {
            let path = std::env::temp_dir().join(format!("hytra-io-{}.dat", std::process::id()));
            DataFile::generate(path, a.file_mib, a.seed, crate::signals::remove_on_signal)
        }
    }
    .map_err(file_error)
}

/// A file's error: the user's arguments at fault (exit 2), or the machine's files (1).
fn file_error(e: IoFileError) -> CliError {
    match e.is_usage() {
        true => CliError::Usage(e.to_string()),
        false => CliError::Run(e.into()),
    }
}

/// What to add to a progress line when a point's window had to be lengthened.
fn extension_note(r: &IoReport) -> String {
    r.extended_from_s.map_or(String::new(), |from| {
        format!(
            " (window extended from {} to {}: the shorter one held fewer than {} reads or less than twice the p99 latency)",
            Span::from_ns((from * 1e9).round() as u64),
            Span::from_ns((r.seconds * 1e9).round() as u64),
            hytra_rt::window::SETTLED_OPS_MIN
        )
    })
}

fn row(t: &mut Table, r: &IoReport, what: &str) {
    t.row(vec![
        what.to_string(),
        r.engine.clone(),
        r.io_threads.map_or("-".into(), |n| n.to_string()),
        r.size.to_string(),
        r.connections.to_string(),
        r.depth.to_string(),
        format!("{:.0}", r.iops),
        format!("{:.1}", r.mib_per_s),
        format!("{:.1}", r.p50_us),
        format!("{:.1}", r.p99_us),
        format!("{:.3}", r.seconds),
        r.errors.to_string(),
    ]);
}

/// `--gen-trace PATH`: writes a Q3-like trace of the file at `data` and says so.
fn gen_trace(a: &IoArgs, data: &Path, path: &Path) -> Result<(), CliError> {
    let n = write_q3_trace(data, path, a.trace_ops, a.seed).map_err(file_error)?;
    let whole = if n < a.trace_ops { " (the whole query on this file)" } else { "" };
    println!("wrote {n} reads to {}{whole}", path.display());
    Ok(())
}

/// Replays `trace` (or a generated Q3-like one) locally and remotely and prints the
/// table; the reports and the trace's reads.
fn replay(
    a: &IoArgs,
    io: &IoPlan,
    trace: Option<Vec<TraceOp>>,
    target: &Target,
    file_len: u64,
) -> Result<(Vec<IoReport>, usize), CliError> {
    let ops = match trace {
        Some(ops) => ops,
        None => q3_trace(file_len, a.trace_ops, a.seed).map_err(file_error)?,
    };
    // A replay times the whole trace, however short: not a window to lengthen, but a
    // rate from few reads is noise, and the reader should know it.
    if ops.len() < hytra_rt::window::SETTLED_OPS_MIN as usize {
        eprintln!(
            "note: the trace holds {} reads, fewer than the {} a measured window needs: its replay's IOPS and percentiles vary from run to run",
            ops.len(),
            hytra_rt::window::SETTLED_OPS_MIN
        );
    }
    let ops = Arc::new(ops);
    let mut t = Table::new(&[
        "replay", "engine", "threads", "max size", "conn", "depth", "IOPS", "MiB/s", "p50 µs",
        "p99 µs", "seconds", "errors",
    ]);
    let mut replays = Vec::new();
    for p in io.replays() {
        let r = measure(io, target, &p, Some(ops.clone()))
            .map_err(|e| CliError::Run(anyhow::anyhow!("{e}")))?;
        row(&mut t, &r, &format!("{} ({} reads)", p.mode.name(), ops.len()));
        replays.push(r);
    }
    println!("\n{}", t.render());
    Ok((replays, ops.len()))
}

/// Entry point of `hytra io`.
pub fn run(a: IoArgs) -> Result<(), CliError> {
    if a.calibrate {
        let c = hytra_io::engine::calibrate(200);
        println!(
            "thread create+join: {:.1} µs   queue hand-off round trip: {:.1} µs   (medians of 200)",
            c.spawn_ns as f64 / 1e3,
            c.handoff_ns as f64 / 1e3
        );
        return Ok(());
    }
    let mut plan = plan(&a)?;
    let out = a.json.as_deref().map(open_output).transpose()?;
    let file = data_file(&a)?;
    if let Some(path) = &a.gen_trace {
        return gen_trace(&a, file.path(), path);
    }
    let mut ex = Exports::new();
    ex.add_file("data", file.path(), !a.buffered)
        .map_err(|e| CliError::Run(anyhow::anyhow!("{e}")))?;
    let direct = ex.get(FileId(0)).is_some_and(|f| f.file.direct());
    let file_len = ex.get(FileId(0)).map_or(0, |f| f.file.len());
    let target = Target { exports: Arc::new(ex), file: FileId(0) };
    eprintln!(
        "hytra io: backend {}, file {} ({} MiB, {})",
        a.backend,
        file.path().display(),
        file_len >> 20,
        if direct { "O_DIRECT" } else { "page cache: O_DIRECT refused or --buffered" }
    );
    let mut table = Table::new(&[
        "mode", "engine", "threads", "size", "conn", "depth", "IOPS", "MiB/s", "p50 µs", "p99 µs",
        "seconds", "errors",
    ]);
    let io = &plan.io;
    let failed = |e: hytra_io::bench::BenchError| CliError::Run(anyhow::anyhow!("{e}"));
    let mut reports = Vec::new();
    for p in io.points() {
        let r = measure(io, &target, &p, None).map_err(failed)?;
        row(&mut table, &r, p.mode.name());
        // The owner of a spread run has no reads to tell.
        if io.reports() {
            let (mode, size, note) = (p.mode.name(), p.size, extension_note(&r));
            eprintln!("  {mode} {} {size} B: {:.0} IOPS{note}", r.engine, r.iops);
        }
        reports.push(r);
    }
    // Spread over processes, node 0 (the requester) reports; the owner only served.
    if !io.reports() {
        return Ok(());
    }
    if !reports.is_empty() {
        println!("{}", table.render());
    }
    let ratios = summarise(&reports);
    for (k, v) in &ratios {
        println!("{k}: {v:.2}");
    }
    // A replay is two more runs (local and remote): not for processes that join once.
    let (replays, trace_reads) = match !a.no_trace && !io.spread() {
        true => replay(&a, io, plan.trace.take(), &target, file_len)?,
        false => (Vec::new(), 0),
    };
    if let (Some(f), Some(path)) = (out, a.json.as_deref()) {
        let report = IoRunReport {
            schema: IO_SCHEMA,
            backend: a.backend.clone(),
            processes: if io.spread() { 2 } else { 1 },
            file: FileReport { path: file.path().display().to_string(), bytes: file_len, direct },
            device: match &io.backend {
                IoBackend::Sim { device, .. } => Some(*device),
                _ => None,
            },
            runs: reports,
            ratios: ratios.into_iter().collect(),
            replay: replays,
            trace: TraceReport {
                source: a
                    .trace
                    .as_ref()
                    .map_or("tpch-q3 generator".to_string(), |p| p.display().to_string()),
                reads: trace_reads,
            },
        };
        write_json(f, path, &report)?;
    }
    Ok(())
}
