//! `hytra swarm`'s options, and their checks into the swarm's [`SwarmOptions`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use hytra_txn::PlantedFault;

use crate::cmd::{usage, Usage};
use crate::swarm::{SwarmBackend, SwarmOptions};

/// Seeds a swarm runs when neither --seeds nor --minutes says.
pub const SEEDS_DEFAULT: u64 = 100;
/// Longest swarm by time: a week.
const MINUTES_MAX: f64 = 7.0 * 24.0 * 60.0;

/// Options of `hytra swarm`.
#[derive(Args, Debug)]
pub struct SwarmArgs {
    /// Backend: sim (deterministic, with faults), local (threads in real time, with node
    /// losses), ucx (every node in this process over UCX shared memory or TCP, drawn per
    /// seed, without faults) or processes (a process per node over UCX, most seeds with
    /// one killed by SIGKILL mid-run); the last two in a build with --features ucx.
    #[arg(long, default_value = "sim", value_parser = ["sim", "local", "ucx", "processes"])]
    pub backend: String,
    /// Seeds to run [default: 100, or as many as fit in --minutes].
    #[arg(long, allow_negative_numbers = true)]
    pub seeds: Option<i64>,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Run this one seed: print its configuration, its result and its trace hash.
    #[arg(long, conflicts_with_all = ["seeds", "from", "minutes"])]
    pub seed: Option<u64>,
    /// Stop starting seeds after this many minutes.
    #[arg(long, allow_negative_numbers = true)]
    pub minutes: Option<f64>,
    /// Seeds run at once on sim [default: one per core].
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Keep going after a failing seed (the default stops at the first).
    #[arg(long)]
    pub keep_going: bool,
    /// Write every seed's result and the summary to this file as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Plant a bug in every seed to see the oracles catch it: skip-read-validation,
    /// skip-version-bump, unlock-before-write-back, accept-torn-read,
    /// commit-before-logged, skip-insert-lock.
    #[arg(long, hide = true)]
    pub plant: Option<String>,
}

/// `--backend`, refused where this build lacks it.
fn backend(name: &str) -> Result<SwarmBackend, Usage> {
    match name {
        "sim" => Ok(SwarmBackend::Sim),
        "local" => Ok(SwarmBackend::Local),
        "ucx" if !SwarmBackend::Ucx.available() => usage(
            "the ucx backend is not in this build: install libucx-dev and build with --features ucx",
        ),
        "ucx" => Ok(SwarmBackend::Ucx),
        "processes" if !SwarmBackend::Processes.available() => usage(
            "the processes backend is not in this build: install libucx-dev and build with --features ucx",
        ),
        "processes" => Ok(SwarmBackend::Processes),
        other => unreachable!("clap refused --backend {other}"),
    }
}

/// `--plant NAME`: the planted fault it names.
fn planted(name: Option<&str>) -> Result<Option<PlantedFault>, Usage> {
    let Some(name) = name else { return Ok(None) };
    match PlantedFault::parse(name) {
        Some(f) => Ok(Some(f)),
        None => usage(format!("--plant '{name}': expected one of {}", PlantedFault::names())),
    }
}

/// Checks `a` into the swarm's options; `stop_early` is asked before each seed starts
/// (the command line's Ctrl-C).
pub fn options(a: &SwarmArgs, stop_early: fn() -> bool) -> Result<SwarmOptions, Usage> {
    let backend = backend(&a.backend)?;
    let planted = planted(a.plant.as_deref())?;
    if planted.is_some() && backend == SwarmBackend::Processes {
        return usage(
            "--plant plants a bug in a run of this process: not with --backend processes",
        );
    }
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
        stop_early,
    };
    Ok(opts)
}
