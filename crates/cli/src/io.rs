//! `hytra io`: remote storage I/O measurements (random reads local, fabric-only and
//! remote with each engine, and trace replay), as in the remote-I/O paper. The options
//! and their checks are `hytra_lab::cmd::io`'s.

use std::path::Path;
use std::sync::Arc;

use hytra_io::bench::IoReport;
use hytra_io::bench::Target;
use hytra_io::trace::TraceOp;
use hytra_io::{Exports, FileId};
use hytra_lab::cmd::io::{plan, IoArgs};
use hytra_lab::io::{
    measure, summarise, FileReport, IoBackend, IoPlan, IoRunReport, TraceReport, IO_SCHEMA,
};
use hytra_lab::io_files::{q3_trace, write_q3_trace, DataFile, IoFileError};
use hytra_lab::span::Span;

use crate::table::{open_output, write_json, Table};
use crate::CliError;

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
