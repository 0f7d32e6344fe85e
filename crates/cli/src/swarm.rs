//! `hytra swarm`: many whole configurations, each drawn from a seed and judged by every
//! oracle; a failure prints its seed, its configuration and the command that replays it.

use std::io::{IsTerminal, Write};

use hytra_lab::cmd::swarm::{options, SwarmArgs};
use hytra_lab::swarm::{run_seed_on, run_swarm, SeedReport, SwarmBackend, SwarmSummary};
use hytra_txn::PlantedFault;

use crate::table::{open_output, write_json};
use crate::CliError;

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
    if backend == SwarmBackend::Processes {
        // Ctrl-C stops the seed's processes before this one ends.
        crate::signals::catch_stop_signals();
    }
    let Some(r) = run_seed_on(seed, backend, planted, crate::signals::interrupted) else {
        let sig = crate::signals::stop_signal().expect("only a signal stops a seed");
        return Err(CliError::Stopped(sig));
    };
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

/// Runs `hytra swarm`.
pub fn run(a: SwarmArgs) -> Result<(), CliError> {
    let opts = options(&a, crate::signals::interrupted)?;
    let (backend, planted, seeds) = (opts.backend, opts.planted, opts.seeds);
    let out = a.json.as_deref().map(open_output).transpose()?;
    if let Some(seed) = a.seed {
        return run_one(seed, backend, planted, out.zip(a.json.as_deref()));
    }
    let bound = match (seeds, a.minutes) {
        (Some(n), Some(m)) => format!("seeds {}..{} or {m} minutes", a.from, a.from + n - 1),
        (Some(n), None) => format!("seeds {}..{}", a.from, a.from + n - 1),
        (None, Some(m)) => format!("seeds from {} for {m} minutes", a.from),
        (None, None) => unreachable!("a bound was set above"),
    };
    let at_once = match backend {
        SwarmBackend::Sim => format!("{} at once", opts.jobs),
        SwarmBackend::Local | SwarmBackend::Ucx | SwarmBackend::Processes => {
            "one at a time".to_string()
        }
    };
    eprintln!("swarm on {}: {bound}, {at_once}", backend.name());
    // Ctrl-C stops starting seeds and the summary says what ran. In this process the
    // running seeds finish, and a second Ctrl-C ends it at once; a seed of processes
    // stops with them at the first (its launcher stops its nodes within milliseconds),
    // and ending this process sooner would leave them running.
    if backend == SwarmBackend::Processes {
        crate::signals::catch_stop_signals();
    } else {
        crate::signals::exit_on_second_signal();
    }
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
