//! `hytra io`: remote storage I/O measurements (random reads local, fabric-only and
//! remote with each engine, and trace replay), as in the remote-I/O paper.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{Backend, ClusterShape};
use hytra_io::bench::{self, IoParams, IoReport, Mode, Target};
use hytra_io::trace::{self, TraceOp};
use hytra_io::{DeviceModel, EngineKind, Exports, FileId, Timing};
use serde_json::json;

use crate::span::{check_warmup, warmup_ns, Span};
use crate::table::{open_output, write_json, Table};
use crate::{usage, BackendKind, CliError};

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
    /// remote-I/O paper's 56 Gb/s FDR).
    #[arg(long, default_value = "cx4")]
    profile: String,
    /// Storage device model on sim: p3700x10 (the paper's ten NVMe drives) or p3700.
    #[arg(long, default_value = "p3700x10")]
    device: String,
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
    /// Reads of the generated trace.
    #[arg(long, default_value_t = 20_000)]
    trace_ops: usize,
    /// Skip trace replay.
    #[arg(long)]
    no_trace: bool,
    /// Write the generated Q3-like trace to this file and exit.
    #[arg(long)]
    gen_trace: Option<PathBuf>,
    /// Reads up to this size come back inside the completion message instead of by
    /// WRITE.
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
    pub(crate) placement: Option<crate::cluster::Placement>,
}

struct Plan {
    backend: BackendKind,
    profile: NicProfile,
    device: DeviceModel,
    modes: Vec<Mode>,
    engines: Vec<&'static str>,
    /// Measured seconds per point.
    seconds: f64,
    /// `--trace`, read and parsed before any run.
    trace: Option<Vec<TraceOp>>,
}

/// Checks the options without running anything (for `hytra cluster`, before it starts
/// the nodes).
pub(crate) fn check(a: &IoArgs) -> Result<(), CliError> {
    plan(a).map(|_| ())
}

fn plan(a: &IoArgs) -> Result<Plan, CliError> {
    let backend = BackendKind::parse(&a.backend)?;
    let Some(profile) = NicProfile::by_name(&a.profile) else {
        return usage(format!(
            "unknown NIC profile '{}' (expected one of: {})",
            a.profile,
            NicProfile::NAMES.join(", ")
        ));
    };
    let Some(device) = DeviceModel::by_name(&a.device) else {
        return usage(format!("unknown device '{}' (expected p3700x10 or p3700)", a.device));
    };
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
        engines.push(match e.as_str() {
            "pool" => "pool",
            "thread" => "thread",
            "uring" => "uring",
            other => {
                return usage(format!("unknown engine '{other}' (expected pool, thread, uring)"))
            }
        });
    }
    if a.sizes.iter().any(|&s| s == 0 || s > 1 << 20) {
        return usage("read sizes must be 1 B ..= 1 MiB");
    }
    if a.connections.iter().chain(&a.depths).chain(&a.io_threads).any(|&n| n == 0) {
        return usage("connections, depths and io-threads must be positive");
    }
    if a.connections.iter().any(|&c| c > 64) || a.depths.iter().any(|&d| d > 200) {
        return usage("at most 64 connections and 200 reads in flight per connection");
    }
    let default = if backend == BackendKind::Sim { 20_000_000 } else { 1_000_000_000 };
    let duration = a.duration.unwrap_or(Span::from_ns(default));
    let max = Span::from_ns(backend.window_max_ns());
    if duration > max {
        return usage(format!("--duration {duration}: expected at most {max} on {}", a.backend));
    }
    let seconds = duration.secs();
    check_warmup(a.warmup)?;
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
        (Some(p), false) => Some(read_trace(p)?),
        (None, _) => None,
    };
    if a.placement.is_some() {
        // The processes join once, for one run: one point of the matrix.
        let points = modes.len() * engines.len() * a.sizes.len() * a.connections.len();
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
    Ok(Plan { backend, profile, device, modes, engines, seconds, trace })
}

/// The largest trace file read (about 20 M reads).
const TRACE_BYTES_MAX: u64 = 256 << 20;

/// Reads and parses `--trace` (a missing, unreadable, binary or empty file is the
/// user's to fix).
fn read_trace(p: &std::path::Path) -> Result<Vec<TraceOp>, CliError> {
    let bad = |e: std::io::Error| CliError::Usage(format!("--trace {}: {e}", p.display()));
    let len = std::fs::metadata(p).map_err(bad)?.len();
    if len > TRACE_BYTES_MAX {
        return usage(format!(
            "--trace {}: {len} bytes; traces of at most {TRACE_BYTES_MAX} bytes are read",
            p.display()
        ));
    }
    let bytes = std::fs::read(p).map_err(bad)?;
    let text = String::from_utf8(bytes).map_err(|_| {
        CliError::Usage(format!("--trace {}: not a text file of offset,length lines", p.display()))
    })?;
    let ops = trace::parse(&text)
        .map_err(|e| CliError::Usage(format!("--trace {}: {e}", p.display())))?;
    if ops.is_empty() {
        return usage(format!("--trace {}: the trace has no reads", p.display()));
    }
    Ok(ops)
}

/// The file the runs read: given, or generated (and removed when dropped).
struct DataFile {
    path: PathBuf,
    generated: bool,
}

impl Drop for DataFile {
    fn drop(&mut self) {
        if self.generated {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn data_file(a: &IoArgs) -> Result<DataFile, CliError> {
    if let Some(p) = &a.file {
        if !p.is_file() {
            return usage(format!("--file '{}' is not a readable regular file", p.display()));
        }
        return Ok(DataFile { path: p.clone(), generated: false });
    }
    if a.file_mib == 0 || a.file_mib > 64 << 10 {
        return usage("--file-mib must be 1 ..= 65536");
    }
    let path = std::env::temp_dir().join(format!("hytra-io-{}.dat", std::process::id()));
    // Before the file exists, so that no instant of a Ctrl-C leaves it behind.
    crate::signals::remove_on_signal(&path);
    let f = DataFile { path: path.clone(), generated: true };
    let mut rng = hytra_fabric::rng::Rng::new(a.seed);
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?,
    );
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..a.file_mib {
        for w in chunk.chunks_exact_mut(8) {
            w.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        std::io::Write::write_all(&mut out, &chunk).context("writing the data file")?;
    }
    std::io::Write::flush(&mut out).context("writing the data file")?;
    drop(out);
    Ok(f)
}

fn engine_kind(name: &str, io_threads: u16, uring_depth: u32) -> EngineKind {
    match name {
        "pool" => EngineKind::Pool { threads: io_threads },
        "thread" => EngineKind::ThreadPerRequest,
        _ => EngineKind::Uring { depth: uring_depth },
    }
}

fn timing(plan: &Plan) -> Timing {
    match plan.backend {
        BackendKind::Sim => Timing::Modelled { device: plan.device, costs: Default::default() },
        _ => Timing::Real,
    }
}

/// One random-read point (over a window long enough for it, [`bench::run_settled`]) or
/// one replay.
fn measure(
    plan: &Plan,
    a: &IoArgs,
    target: &Target,
    p: &IoParams,
    trace: Option<Arc<Vec<TraceOp>>>,
) -> Result<IoReport, CliError> {
    let shape = ClusterShape { nodes: 2, workers_per_node: p.connections, lanes_per_peer: 1 };
    let t = timing(plan);
    // Processes that joined once cannot start a fresh cluster to measure again: a window
    // too short there is refused, not lengthened. Only the requester (node 0) has reads
    // to judge.
    let max = match &a.placement {
        None => plan.backend.window_max_ns(),
        Some(pl) if pl.me == 0 => p.duration_ns,
        Some(_) => u64::MAX,
    };
    let judge = a.placement.as_ref().is_none_or(|pl| pl.me == 0);
    let r = match plan.backend {
        BackendKind::Sim => {
            let cfg = SimConfig { profile: plan.profile.clone(), ..SimConfig::new(shape, a.seed) };
            let fresh = || SimCluster::new(cfg.clone());
            point(fresh, target, p, t, trace, judge, max)
        }
        BackendKind::Local => {
            let fresh = || LocalCluster::new(LocalConfig::new(shape));
            point(fresh, target, p, t, trace, judge, max)
        }
        #[cfg(feature = "ucx")]
        BackendKind::Ucx => {
            use hytra_fabric::ucx::{UcxCluster, UcxConfig};
            let mut cfg = UcxConfig::new(shape);
            cfg.transports = Some(a.transports.clone());
            let fresh = || match &a.placement {
                None => UcxCluster::new(cfg.clone()),
                Some(pl) => {
                    let mut cfg = cfg.clone();
                    cfg.hosted = Some(vec![hytra_fabric::NodeId(pl.me)]);
                    let ex = pl.exchange(shape.nodes).map_err(|e| {
                        hytra_fabric::BackendError::Cluster(format!(
                            "joining the other process: {e}"
                        ))
                    })?;
                    UcxCluster::with_exchange(cfg, ex)
                }
            };
            point(fresh, target, p, t, trace, judge, max)
        }
        #[cfg(not(feature = "ucx"))]
        BackendKind::Ucx => unreachable!("refused by plan() without the ucx feature"),
    };
    r.map_err(|e| CliError::Run(anyhow::anyhow!("{e}")))
}

/// A replay, a point whose window this process does not judge (the owner of a run
/// spread over processes), or a point over a settled window.
fn point<B: Backend>(
    mut fresh: impl FnMut() -> Result<B, hytra_fabric::BackendError>,
    target: &Target,
    p: &IoParams,
    t: Timing,
    trace: Option<Arc<Vec<TraceOp>>>,
    judge: bool,
    window_max_ns: u64,
) -> Result<IoReport, bench::BenchError> {
    match trace {
        Some(tr) => bench::replay(&mut fresh()?, target, p, t, tr),
        None if !judge => bench::run(&mut fresh()?, target, p, t),
        None => bench::run_settled(fresh, target, p, t, window_max_ns),
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

/// Entry point of `hytra io`.
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
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
        let len = std::fs::metadata(&file.path).context("reading the file size")?.len();
        if len < 40 * 16384 {
            return usage("the file is too small for a Q3-like trace (40 pages of 16 KiB)");
        }
        let ops = trace::tpch_q3(len, 16384, a.trace_ops, a.seed);
        std::fs::write(path, trace::format(&ops))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} reads to {}", ops.len(), path.display());
        return Ok(());
    }
    let mut ex = Exports::new();
    ex.add_file("data", &file.path, !a.buffered)
        .map_err(|e| CliError::Run(anyhow::anyhow!("{e}")))?;
    let direct = ex.get(FileId(0)).is_some_and(|f| f.file.direct());
    let file_len = ex.get(FileId(0)).map_or(0, |f| f.file.len());
    let target = Target { exports: Arc::new(ex), file: FileId(0) };
    eprintln!(
        "hytra io: backend {}, file {} ({} MiB, {})",
        a.backend,
        file.path.display(),
        file_len >> 20,
        if direct { "O_DIRECT" } else { "page cache: O_DIRECT refused or --buffered" }
    );
    let base = |mode, engine, size, connections, depth| IoParams {
        mode,
        engine,
        size,
        connections,
        depth,
        duration_ns: (plan.seconds * 1e9).round() as u64,
        warmup_ns: warmup_ns((plan.seconds * 1e9).round() as u64, a.warmup),
        seed: a.seed,
        inline_max: a.inline_max,
        timeout_ns: 5_000_000_000,
    };
    let mut table = Table::new(&[
        "mode", "engine", "threads", "size", "conn", "depth", "IOPS", "MiB/s", "p50 µs", "p99 µs",
        "seconds", "errors",
    ]);
    let mut reports = Vec::new();
    for &size in &a.sizes {
        for &connections in &a.connections {
            for &depth in &a.depths {
                for &mode in &plan.modes {
                    let engines: Vec<&str> = match mode {
                        Mode::Fabric => vec!["none"],
                        Mode::Local => {
                            plan.engines.iter().copied().filter(|e| *e != "thread").collect()
                        }
                        Mode::Remote => plan.engines.clone(),
                    };
                    for e in engines {
                        let threads: Vec<u16> =
                            if e == "pool" { a.io_threads.clone() } else { vec![0] };
                        for &th in &threads {
                            let kind = match e {
                                "none" => EngineKind::NoIo,
                                _ => engine_kind(e, th, a.uring_depth),
                            };
                            let p = base(mode, kind, size, connections, depth);
                            let r = measure(&plan, &a, &target, &p, None)?;
                            row(&mut table, &r, mode.name());
                            // The owner of a spread run has no reads to tell.
                            if a.placement.as_ref().is_none_or(|p| p.me == 0) {
                                eprintln!(
                                    "  {} {} {} B: {:.0} IOPS{}",
                                    mode.name(),
                                    r.engine,
                                    size,
                                    r.iops,
                                    extension_note(&r)
                                );
                            }
                            reports.push(r);
                        }
                    }
                }
            }
        }
    }
    // Spread over processes, node 0 (the requester) reports; the owner only served.
    if a.placement.as_ref().is_some_and(|p| p.me != 0) {
        return Ok(());
    }
    println!("{}", table.render());
    let ratios = summarise(&reports);
    for (k, v) in &ratios {
        println!("{k}: {v:.2}");
    }
    let mut replays = Vec::new();
    let mut trace_reads = 0;
    // A replay is two more runs (local and remote): not for processes that join once.
    if !a.no_trace && a.placement.is_none() {
        let ops: Vec<TraceOp> = match plan.trace.take() {
            Some(ops) => ops,
            None if file_len >= 40 * 16384 => trace::tpch_q3(file_len, 16384, a.trace_ops, a.seed),
            None => return usage("the file is too small for a Q3-like trace (40 pages of 16 KiB)"),
        };
        trace_reads = ops.len();
        let ops = Arc::new(ops);
        let mut t = Table::new(&[
            "replay", "engine", "threads", "max size", "conn", "depth", "IOPS", "MiB/s", "p50 µs",
            "p99 µs", "seconds", "errors",
        ]);
        let (th, conn, depth) = (a.io_threads[0], a.connections[0], a.depths[0]);
        for mode in [Mode::Local, Mode::Remote] {
            let p = base(mode, EngineKind::Pool { threads: th }, 0, conn, depth);
            let r = measure(&plan, &a, &target, &p, Some(ops.clone()))?;
            row(&mut t, &r, &format!("{} ({} reads)", mode.name(), ops.len()));
            replays.push(r);
        }
        println!("\n{}", t.render());
    }
    if let (Some(f), Some(path)) = (out, a.json.as_deref()) {
        let v = json!({
            "backend": a.backend,
            // One process per node (`hytra node`/`hytra cluster`), or all in this one.
            "processes": if a.placement.is_some() { 2 } else { 1 },
            "file": { "path": file.path.display().to_string(), "bytes": file_len, "direct": direct },
            "device": if plan.backend == BackendKind::Sim { json!(plan.device) } else { json!(null) },
            "runs": reports,
            "ratios": ratios.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "replay": replays,
            "trace": {
                "source": a.trace.as_ref().map_or("tpch-q3 generator".to_string(), |p| p.display().to_string()),
                "reads": trace_reads,
            },
        });
        write_json(f, path, &v)?;
    }
    Ok(())
}

/// The ratios the paper discusses: remote/local at each size (best engine of each) and
/// static pool vs thread per request.
fn summarise(reports: &[IoReport]) -> Vec<(String, f64)> {
    let best = |mode: Mode, size: u32, engines: &[&str]| {
        reports
            .iter()
            .filter(|r| r.mode == mode && r.size == size && engines.contains(&r.engine.as_str()))
            .map(|r| r.iops)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    let mut sizes: Vec<u32> = reports.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = Vec::new();
    for s in sizes {
        if let (Some(r), Some(l)) =
            (best(Mode::Remote, s, &["pool", "uring"]), best(Mode::Local, s, &["pool", "uring"]))
        {
            out.push((format!("remote/local at {s} B (best of pool, uring)"), r / l));
        }
        if let (Some(p), Some(t)) =
            (best(Mode::Remote, s, &["pool"]), best(Mode::Remote, s, &["thread"]))
        {
            out.push((format!("static pool / thread per request at {s} B"), p / t));
        }
        if let (Some(r), Some(f)) =
            (best(Mode::Remote, s, &["pool", "uring"]), best(Mode::Fabric, s, &["none"]))
        {
            out.push((format!("remote/fabric-only at {s} B"), r / f));
        }
    }
    out
}
