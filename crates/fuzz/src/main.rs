//! `hytra-fuzz`: runs the fuzz targets from the command line.
//!
//! `hytra-fuzz --target NAME --seed S --execs N` runs one target (or `all`) and replays
//! exactly; `--input HEX` runs one input (what a failure report prints); `--list` names
//! the targets. A failure (a panic, an allocation over the bound, or an execution that
//! runs longer than `--hang-s`) prints the target, seed, execution and input, and the
//! commands that replay it, and exits with status 1.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use hytra_fuzz::alloc::{self, CountingAlloc};
use hytra_fuzz::runner::{from_hex, input_at, to_hex, RUNNING, STARTED};
use hytra_fuzz::{execute, fuzz, targets, Target};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Fuzzes hytra's decoders: seeded, replayable, stable Rust.
#[derive(Parser, Debug)]
#[command(name = "hytra-fuzz")]
struct Args {
    /// The target to run, or `all`.
    #[arg(long, default_value = "all")]
    target: String,
    /// The seed of every mutation.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Executions per target (its seeds first, then mutations).
    #[arg(long, default_value_t = 100_000)]
    execs: u64,
    /// Run this one input (hex) instead of fuzzing.
    #[arg(long)]
    input: Option<String>,
    /// List the targets and exit.
    #[arg(long)]
    list: bool,
    /// Seconds one execution may run before it counts as a hang (a failure).
    #[arg(long, default_value_t = 10)]
    hang_s: u64,
}

/// Position in the chosen targets of the one running now, for the watchdog.
static CURRENT: AtomicUsize = AtomicUsize::new(0);

/// Watches the executions of a run from another thread: one that runs longer than
/// `hang_s` seconds is reported as a failure (with its input, rebuilt from the seed) and
/// ends the process, since the stuck thread cannot be stopped.
fn watchdog(chosen: Vec<Target>, seed: u64, hang_s: u64) {
    std::thread::spawn(move || {
        let (mut seen, mut still) = (u64::MAX, 0);
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let started = STARTED.load(Ordering::Relaxed);
            still = if started == seen { still + 1 } else { 0 };
            seen = started;
            if started == 0 || still < hang_s {
                continue;
            }
            let t = &chosen[CURRENT.load(Ordering::Relaxed)];
            let index = RUNNING.load(Ordering::Relaxed);
            let hex = to_hex(&input_at(t, seed, index));
            println!(
                "FAIL: target {}, seed {seed}, execution {index}: still running after {hang_s} s",
                t.name
            );
            println!("input: {hex}");
            println!("replay the input: hytra-fuzz --target {} --input {hex}", t.name);
            println!(
                "replay the run:   hytra-fuzz --target {} --seed {seed} --execs {}",
                t.name,
                index + 1
            );
            std::process::exit(1);
        }
    });
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("hytra-fuzz: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs what `a` asks for; `Ok(false)` when a target failed.
fn run(a: Args) -> anyhow::Result<bool> {
    let all = targets::all();
    if a.list {
        for t in &all {
            println!("{:<18} {}", t.name, t.about);
        }
        return Ok(true);
    }
    assert!(alloc::installed(), "the counting allocator is the global allocator");
    let chosen: Vec<Target> = match a.target.as_str() {
        "all" => all,
        name => {
            vec![targets::find(name).with_context(|| format!("no target '{name}' (see --list)"))?]
        }
    };
    if let Some(hex) = &a.input {
        if chosen.len() != 1 {
            bail!("--input needs one --target");
        }
        let input = from_hex(hex)?;
        return Ok(match execute(&chosen[0], &input, 0) {
            Ok(usage) => {
                println!(
                    "ok: {} on {} bytes (largest allocation {} bytes, peak live {} bytes)",
                    chosen[0].name,
                    input.len(),
                    usage.largest_bytes,
                    usage.peak_live_bytes
                );
                true
            }
            Err(problem) => {
                println!("FAIL: target {}: {problem}", chosen[0].name);
                false
            }
        });
    }
    println!("hytra-fuzz --seed {} --execs {}", a.seed, a.execs);
    watchdog(chosen.clone(), a.seed, a.hang_s);
    for (i, t) in chosen.iter().enumerate() {
        CURRENT.store(i, Ordering::Relaxed);
        match fuzz(t, a.seed, a.execs) {
            Ok(s) => {
                let secs = s.elapsed.as_secs_f64();
                println!(
                    "{:<18} {:>11} execs in {:>8.1} s ({:>9.0}/s), largest allocation {} B, peak live {} B",
                    t.name,
                    s.execs,
                    secs,
                    s.execs as f64 / secs.max(1e-9),
                    s.largest_bytes,
                    s.peak_live_bytes
                );
            }
            Err(failure) => {
                println!("{failure}");
                return Ok(false);
            }
        }
    }
    Ok(true)
}
