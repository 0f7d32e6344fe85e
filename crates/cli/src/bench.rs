//! `hytra bench`: a transactional workload on the simulator or on threads, with a table
//! of throughput, aborts, latency and per-phase time, and the checker's verdict. The
//! options and their checks are `hytra_lab::cmd::bench`'s.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hytra_lab::auto::{pick_design, AutoError, Refine};
use hytra_lab::bench::{BenchReport, Crash, TrialReport};
use hytra_lab::cmd::bench::{lease_of, plan, report, BenchArgs, BenchPlan};
use hytra_lab::span::Span;
use hytra_lab::{BackendSpec, RunSpec, Watch};
use hytra_workloads::bench::{BenchError, Stage};

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
    let sim = spec.backend.is_sim();
    if first {
        if let BackendSpec::Sim(sc) = &spec.backend {
            eprintln!("{}", sc.describe());
        }
    }
    let status = Arc::new(Mutex::new(Status::new(started, total_ns, sim)));
    // Only people watching a terminal want it; logs and pipes do not.
    let shown = std::io::stderr().is_terminal();
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = shown.then(|| ticker(status.clone(), stop.clone()));
    let on_stage = {
        let status = status.clone();
        move |s: Stage| lock(&status).enter(s, Instant::now())
    };
    let on_clock = {
        let status = status.clone();
        move |now_ns: u64| {
            if shown {
                // Drawn after the lock is let go: a stalled terminal must not hold up
                // the run's thread, which takes it to enter a stage.
                let line = lock(&status).line(Instant::now(), Some(now_ns));
                show(line);
            }
        }
    };
    let watch = Watch {
        virtual_time: sim.then(|| Box::new(on_clock) as Box<dyn FnMut(u64)>),
        stage: Some(Box::new(on_stage)),
    };
    let result = hytra_lab::run(spec, watch);
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        // Woken, not waited out: its nap would count in the run's wall time.
        t.thread().unpark();
        let _ = t.join();
    }
    if shown {
        eprint!("\r{:72}\r", "");
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

/// What `hytra bench` shows on standard error while a run goes on, once it has lasted
/// two seconds: the stage its setup or checks are in, and while it runs a bar of its
/// clock (virtual on the simulator, else wall).
struct Status {
    started: Instant,
    total_ns: u64,
    /// The simulator's bar is drawn where the simulation reports its virtual time.
    sim: bool,
    /// The stage the run is in, and since when.
    stage: Option<(Stage, Instant)>,
}

impl Status {
    fn new(started: Instant, total_ns: u64, sim: bool) -> Status {
        Status { started, total_ns, sim, stage: None }
    }

    fn enter(&mut self, stage: Stage, now: Instant) {
        self.stage = Some((stage, now));
    }

    /// The line to show at `now`, if any; `virtual_ns` is the simulation's clock when the
    /// simulation itself asks (a ticker asks with `None`).
    fn line(&self, now: Instant, virtual_ns: Option<u64>) -> Option<String> {
        if now.saturating_duration_since(self.started) < Duration::from_secs(2) {
            return None;
        }
        let (stage, since) = self.stage?;
        let in_stage = now.saturating_duration_since(since);
        if stage != Stage::Running {
            return Some(format!("{stage}: {:.1} s", in_stage.as_secs_f64()));
        }
        let (ran_ns, clock) = match (self.sim, virtual_ns) {
            (true, Some(ns)) => (ns, "virtual"),
            (false, _) => (u64::try_from(in_stage.as_nanos()).unwrap_or(u64::MAX), "wall"),
            // The simulation draws its own bar.
            (true, None) => return None,
        };
        let frac = (ran_ns as f64 / self.total_ns as f64).min(1.0);
        let filled = (frac * 30.0) as usize;
        let wall = in_stage.as_secs_f64();
        let eta = if frac > 0.0 { wall * (1.0 - frac) / frac } else { 0.0 };
        Some(format!(
            "[{}{}] {:>3.0}% of {clock} time, ETA {eta:.0} s",
            "#".repeat(filled),
            " ".repeat(30 - filled),
            frac * 100.0,
        ))
    }
}

fn lock(status: &Mutex<Status>) -> std::sync::MutexGuard<'_, Status> {
    // The status is only ever overwritten whole: a panic elsewhere leaves it usable.
    status.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn show(line: Option<String>) {
    if let Some(line) = line {
        eprint!("\r{line:72}");
        let _ = std::io::stderr().flush();
    }
}

/// Redraws the status every fifth of a second until `stop` (set before the thread is
/// unparked).
fn ticker(status: Arc<Mutex<Status>>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        std::thread::park_timeout(Duration::from_millis(200));
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let line = lock(&status).line(Instant::now(), None);
        show(line);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_waits_two_seconds_then_names_the_stage_or_draws_the_bar() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut sim = Status::new(t0, 10_000_000, true);
        sim.enter(Stage::Loading, at(0.0));
        assert_eq!(sim.line(at(1.9), None), None, "nothing before two seconds");
        assert_eq!(sim.line(at(2.5), None).as_deref(), Some("loading the tables: 2.5 s"));
        sim.enter(Stage::Running, at(3.0));
        assert_eq!(sim.line(at(4.0), None), None, "the simulation draws its own bar");
        let bar = sim.line(at(4.0), Some(5_000_000)).unwrap();
        assert!(bar.contains(" 50% of virtual time, ETA 1 s"), "{bar}");
        assert!(bar.starts_with(&format!("[{}{}]", "#".repeat(15), " ".repeat(15))), "{bar}");
        sim.enter(Stage::Checking { history: true }, at(5.0));
        let line = sim.line(at(5.5), Some(10_000_000));
        assert_eq!(line.as_deref(), Some("checking the history and the database: 0.5 s"));
        sim.enter(Stage::Checking { history: false }, at(5.0));
        assert_eq!(sim.line(at(6.0), None).as_deref(), Some("checking the database: 1.0 s"));

        let mut wall = Status::new(t0, 4_000_000_000, false);
        assert_eq!(wall.line(at(3.0), None), None, "no stage yet");
        wall.enter(Stage::Running, at(2.0));
        let bar = wall.line(at(3.0), None).unwrap();
        assert!(bar.contains(" 25% of wall time, ETA 3 s"), "{bar}");
        let bar = wall.line(at(9.0), None).unwrap();
        assert!(bar.contains("100% of wall time, ETA 0 s"), "past the end: {bar}");
    }
}
