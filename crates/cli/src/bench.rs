//! `hytra bench`: a transactional workload on the simulator or on threads, with a table
//! of throughput, aborts, latency and per-phase time, and the checker's verdict. The
//! options and their checks are `hytra_lab::cmd::bench`'s.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hytra_lab::auto::{pick_design, AutoError, Refine};
use hytra_lab::bench::{BenchReport, Crash, TrialReport};
use hytra_lab::cmd::bench::{lease_of, plan, report, BenchArgs, BenchPlan};
use hytra_lab::span::Span;
use hytra_lab::{BackendSpec, RunSpec};
use hytra_workloads::bench::BenchError;

use crate::table::{open_output, rate, write_json};
use crate::CliError;

/// Runs `hytra bench`.
pub fn run_bench(a: BenchArgs) -> Result<(), CliError> {
    let BenchPlan { mut spec, candidates, crashes } = plan(&a)?;
    let out = a.json.as_deref().map(open_output).transpose()?;
    let auto = if candidates.is_empty() {
        None
    } else {
        let told = |t: &TrialReport, ns: u64| {
            let (label, tps) = (&t.candidate, t.throughput_tps);
            eprintln!("design auto: {label}: {} txn/s over {}", rate(tps), Span::from_ns(ns));
        };
        let (txn, report) = pick_design(&spec, candidates, Refine::Phases, a.warmup, told)
            .map_err(|e| match e {
                AutoError::Params(m) => CliError::Usage(m),
                e => CliError::Run(e.into()),
            })?;
        spec.txn = txn;
        Some(report)
    };
    let (mut reruns, asked_ns, started) = (0, spec.params.measure_ns, Instant::now());
    // Only a default window on sim is lengthened: one the user gave, a real backend's and
    // one with crashes timed in it are judged as they are.
    let lengthens = a.duration.is_none() && spec.backend.is_sim() && crashes.is_empty();
    let (mut report, types) = loop {
        let Some((mut report, types)) = run_once(&a, &spec, &crashes, reruns == 0)? else {
            return Ok(());
        };
        report.design_auto = auto.clone();
        let Some(next) = lengthens.then(|| spec.lengthened(&report, reruns)).flatten() else {
            break (report, types);
        };
        eprintln!(
            "the window of {} {}: measuring again over {}",
            Span::from_ns(spec.params.measure_ns),
            report.shortfall(),
            Span::from_ns(next.params.measure_ns)
        );
        spec = next;
        reruns += 1;
    };
    if spec.params.measure_ns != asked_ns {
        report.window_extended_from_s = Some(asked_ns as f64 / 1e9);
        report.wall_s = started.elapsed().as_secs_f64();
    }
    let correct = report.correct();
    if correct {
        report.settled().map_err(|e| CliError::Run(e.into()))?;
    }
    print!("{}", report.text(types, lease_of(&spec.txn, spec.backend.is_sim()).lease_ns));
    if let (Some(file), Some(path)) = (out, a.json.as_deref()) {
        write_json(file, path, &report)?;
    }
    if !correct {
        return Err(CliError::Run(anyhow::anyhow!("correctness check failed (see above)")));
    }
    Ok(())
}

/// One run of `spec` and its report (without `--design auto`'s trials), or `None` on a
/// node of a cluster spread over processes that does not report. The simulator's
/// description is printed on the `first` run only (a lengthened window changes nothing
/// of it).
fn run_once(
    a: &BenchArgs,
    spec: &RunSpec,
    crashes: &[Crash],
    first: bool,
) -> Result<Option<(BenchReport, &'static [&'static str])>, CliError> {
    // The run's own wall time, after any trials.
    let started = Instant::now();
    let total_ns = spec.params.warmup_ns + spec.params.measure_ns;
    let result = if let BackendSpec::Sim(sc) = &spec.backend {
        if first {
            eprintln!("{}", sc.describe());
        }
        let mut bar = ProgressBar::new(started, total_ns, "virtual");
        hytra_lab::run(spec, Some(Box::new(move |now| bar.show(now))))
    } else {
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = wall_progress(started, total_ns, stop.clone());
        let r = hytra_lab::run(spec, None);
        stop.store(true, Ordering::Relaxed);
        let _ = ticker.join();
        r
    };
    if std::io::stderr().is_terminal() {
        eprint!("\r{:60}\r", "");
    }
    let outcome = match result {
        Ok(Some(o)) => o,
        // A node of a cluster spread over processes that did not get the results: node
        // 0, or under `hytra cluster` the lowest survivor, reports for everyone.
        Ok(None) => return Ok(None),
        Err(BenchError::Params(m)) => return Err(CliError::Usage(m)),
        Err(other) => {
            let argv: Vec<String> = std::env::args().skip(1).collect();
            return Err(CliError::Run(anyhow::anyhow!(
                "{other} (replay: hytra {})",
                argv.join(" ")
            )));
        }
    };
    let report = report(a, spec, crashes, &outcome, started.elapsed());
    Ok(Some((report, outcome.txn_types)))
}

/// A progress bar on standard error, shown once a run has lasted two seconds.
struct ProgressBar {
    started: Instant,
    total_ns: u64,
    clock: &'static str,
}

impl ProgressBar {
    fn new(started: Instant, total_ns: u64, clock: &'static str) -> ProgressBar {
        ProgressBar { started, total_ns, clock }
    }

    fn show(&mut self, now_ns: u64) {
        let wall = self.started.elapsed();
        // Only people watching a terminal want it; logs and pipes do not.
        if wall < Duration::from_secs(2) || !std::io::stderr().is_terminal() {
            return;
        }
        let frac = (now_ns as f64 / self.total_ns as f64).min(1.0);
        let filled = (frac * 30.0) as usize;
        let eta = if frac > 0.0 { wall.as_secs_f64() * (1.0 - frac) / frac } else { 0.0 };
        eprint!(
            "\r[{}{}] {:>3.0}% of {} time, ETA {:.0} s  ",
            "#".repeat(filled),
            " ".repeat(30 - filled),
            frac * 100.0,
            self.clock,
            eta
        );
        let _ = std::io::stderr().flush();
    }
}

fn wall_progress(
    started: Instant,
    total_ns: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut bar = ProgressBar::new(started, total_ns, "wall");
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
            bar.show(started.elapsed().as_nanos() as u64);
        }
    })
}
