//! `hytra swarm`: many whole configurations, each drawn from a seed and judged by every
//! oracle; a failure prints its seed, its configuration and the command that replays it.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use hytra_lab::swarm::{run_seed, run_swarm, SeedReport, SwarmBackend, SwarmOptions, SwarmSummary};
use hytra_txn::PlantedFault;

use crate::table::{open_output, write_json};
use crate::{usage, CliError};

/// Seeds a swarm runs when neither --seeds nor --minutes says.
const SEEDS_DEFAULT: u64 = 100;
/// Longest swarm by time: a week.
const MINUTES_MAX: f64 = 7.0 * 24.0 * 60.0;

/// Options of `hytra swarm`.
#[derive(Args, Debug)]
pub struct SwarmArgs {
    /// Backend: sim (deterministic, with faults), local (threads in real time, with node
    /// losses) or ucx (every node in this process over UCX shared memory or TCP, drawn per
    /// seed, without faults; a build with --features ucx).
    #[arg(long, default_value = "sim", value_parser = ["sim", "local", "ucx"])]
    backend: String,
    /// Seeds to run [default: 100, or as many as fit in --minutes].
    #[arg(long, allow_negative_numbers = true)]
    seeds: Option<i64>,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// Run this one seed: print its configuration, its result and its trace hash.
    #[arg(long, conflicts_with_all = ["seeds", "from", "minutes"])]
    seed: Option<u64>,
    /// Stop starting seeds after this many minutes.
    #[arg(long, allow_negative_numbers = true)]
    minutes: Option<f64>,
    /// Seeds run at once on sim [default: one per core].
    #[arg(long)]
    jobs: Option<usize>,
    /// Keep going after a failing seed (the default stops at the first).
    #[arg(long)]
    keep_going: bool,
    /// Write every seed's result and the summary to this file as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Plant a bug in every seed to see the oracles catch it: skip-read-validation,
    /// skip-version-bump, unlock-before-write-back, accept-torn-read,
    /// commit-before-logged, skip-insert-lock.
    #[arg(long, hide = true)]
    plant: Option<String>,
}

fn backend(name: &str) -> Result<SwarmBackend, CliError> {
    match name {
        "sim" => Ok(SwarmBackend::Sim),
        "local" => Ok(SwarmBackend::Local),
        "ucx" if !SwarmBackend::Ucx.available() => usage(
            "the ucx backend is not in this build: install libucx-dev and build with --features ucx",
        ),
        "ucx" => Ok(SwarmBackend::Ucx),
        other => unreachable!("clap refused --backend {other}"),
    }
}

/// The command that replays one seed.
fn replay(seed: u64, backend: SwarmBackend, planted: Option<PlantedFault>) -> String {
    let mut cmd = format!("hytra swarm --seed {seed}");
    if backend != SwarmBackend::Sim {
        cmd.push_str(&format!(" --backend {}", backend.name()));
    }
    if let Some(p) = planted {
        cmd.push_str(&format!(" --plant {}", p.name()));
    }
    cmd
}

fn print_failure(r: &SeedReport, backend: SwarmBackend, planted: Option<PlantedFault>) {
    println!("FAIL seed {}: {}", r.seed, r.summary);
    for f in &r.findings {
        println!("  - {f}");
    }
    if let Some(h) = r.trace_hash {
        println!("  trace hash {h:#018x}");
    }
    println!("  replay: {}", replay(r.seed, backend, planted));
}

/// `--seed N`: runs one seed and says what every oracle found.
fn run_one(
    seed: u64,
    backend: SwarmBackend,
    planted: Option<PlantedFault>,
    out: Option<(std::fs::File, &std::path::Path)>,
) -> Result<(), CliError> {
    let r = run_seed(seed, backend, planted);
    println!("seed {seed}: {}", r.summary);
    if let Some(h) = r.trace_hash {
        println!("trace hash {h:#018x}");
    }
    println!("commits {} in {:.2} s of wall time", r.commits, r.wall.as_secs_f64());
    if let Some((file, path)) = out {
        write_json(file, path, &r.row())?;
    }
    if r.passed() {
        println!("ok: every oracle passed");
        return Ok(());
    }
    print_failure(&r, backend, planted);
    Err(CliError::Run(anyhow::anyhow!("seed {seed} failed (see above)")))
}

/// Prints what a swarm found and what it covered; the seeds that failed.
fn print_summary(summary: &SwarmSummary) -> Vec<u64> {
    let failures: Vec<u64> = summary.failures().map(|r| r.seed).collect();
    println!(
        "swarm: {} seeds in {:.1} s ({:.0} seeds/min), {} failed{}",
        summary.seeds.len(),
        summary.wall.as_secs_f64(),
        summary.seeds_per_minute(),
        failures.len(),
        if failures.is_empty() { String::new() } else { format!(": seeds {failures:?}") }
    );
    println!("covered:");
    for (dim, values) in &summary.coverage {
        let list: Vec<String> = values.iter().map(|(v, n)| format!("{v} {n}")).collect();
        println!("  {dim:<18} {}", list.join(", "));
    }
    failures
}

/// `--plant NAME`: the planted fault it names.
fn planted(name: Option<&str>) -> Result<Option<PlantedFault>, CliError> {
    let Some(name) = name else { return Ok(None) };
    match PlantedFault::parse(name) {
        Some(f) => Ok(Some(f)),
        None => usage(format!("--plant '{name}': expected one of {}", PlantedFault::names())),
    }
}

/// Runs `hytra swarm`.
pub fn run(a: SwarmArgs) -> Result<(), CliError> {
    let backend = backend(&a.backend)?;
    let planted = planted(a.plant.as_deref())?;
    let seeds = match a.seeds {
        Some(n) if n < 1 => return usage(format!("--seeds {n}: at least one seed")),
        Some(n) => Some(n as u64),
        None => None,
    };
    let time_limit = match a.minutes {
        Some(m) if !(m.is_finite() && m > 0.0 && m <= MINUTES_MAX) => {
            return usage(format!("--minutes {m}: expected a positive number up to {MINUTES_MAX}"))
        }
        Some(m) => Some(Duration::from_secs_f64(m * 60.0)),
        None => None,
    };
    if a.jobs == Some(0) {
        return usage("--jobs must be at least 1");
    }
    if a.from.checked_add(seeds.unwrap_or(SEEDS_DEFAULT)).is_none() {
        return usage(format!("--from {}: the seeds would run past {}", a.from, u64::MAX));
    }
    let out = a.json.as_deref().map(open_output).transpose()?;
    if let Some(seed) = a.seed {
        return run_one(seed, backend, planted, out.zip(a.json.as_deref()));
    }
    let seeds = if seeds.is_none() && time_limit.is_none() { Some(SEEDS_DEFAULT) } else { seeds };
    let jobs =
        a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let opts = SwarmOptions {
        backend,
        first_seed: a.from,
        seeds,
        time_limit,
        jobs,
        planted,
        stop_at_failure: !a.keep_going,
        stop_early: crate::signals::interrupted,
    };
    let bound = match (seeds, a.minutes) {
        (Some(n), Some(m)) => format!("seeds {}..{} or {m} minutes", a.from, a.from + n - 1),
        (Some(n), None) => format!("seeds {}..{}", a.from, a.from + n - 1),
        (None, Some(m)) => format!("seeds from {} for {m} minutes", a.from),
        (None, None) => unreachable!("a bound was set above"),
    };
    let at_once = match backend {
        SwarmBackend::Sim => format!("{jobs} at once"),
        SwarmBackend::Local | SwarmBackend::Ucx => "one at a time".to_string(),
    };
    eprintln!("swarm on {}: {bound}, {at_once}", backend.name());
    // Ctrl-C stops starting seeds; the running ones finish and the summary says what ran.
    // A second one ends the process at once.
    crate::signals::exit_on_second_signal();
    let terminal = std::io::stderr().is_terminal();
    let (mut done, mut failed) = (0u64, 0u64);
    let started = std::time::Instant::now();
    let mut told = false;
    let summary = run_swarm(&opts, |r| {
        done += 1;
        if !told && crate::signals::interrupted() {
            told = true;
            eprintln!(
                "\nstopping: no new seeds; the running ones finish (Ctrl-C again ends at once)"
            );
        }
        if !r.passed() {
            failed += 1;
            if terminal {
                eprint!("\r{:70}\r", "");
            }
            print_failure(r, backend, planted);
        }
        let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9) * 60.0;
        let total = seeds.map_or(String::new(), |n| format!("/{n}"));
        if terminal {
            eprint!("\r{done}{total} seeds, {failed} failed, {rate:.0} seeds/min  ");
            let _ = std::io::stderr().flush();
        } else if done % 50 == 0 {
            eprintln!("{done}{total} seeds, {failed} failed, {rate:.0} seeds/min");
        }
    });
    if terminal {
        eprint!("\r{:70}\r", "");
    }
    let failures = print_summary(&summary);
    if let (Some(file), Some(path)) = (out, a.json.as_deref()) {
        write_json(file, path, &summary.report(&opts))?;
    }
    verdict(&summary, &failures)
}

/// How a swarm ends: failed (whether or not a signal stopped it), stopped by a signal
/// (after the summary of what ran), or passed.
fn verdict(summary: &SwarmSummary, failures: &[u64]) -> Result<(), CliError> {
    let stopped = crate::signals::stop_signal().filter(|_| summary.stopped_early);
    if stopped.is_some() {
        eprintln!(
            "swarm stopped by a signal before its bound: {} seeds ran, {} failed",
            summary.seeds.len(),
            failures.len()
        );
    }
    match (failures.len(), stopped) {
        (0, None) => Ok(()),
        (0, Some(sig)) => Err(CliError::Stopped(sig)),
        (n, _) => Err(CliError::Run(anyhow::anyhow!("{n} seeds failed (see above)"))),
    }
}
