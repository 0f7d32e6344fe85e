//! `hytra`: the command users run. Everything environmental (bad arguments, unwritable
//! files, a cluster that cannot start) becomes a one-line message and a distinct exit
//! code here, at the edge; the libraries below report typed errors. Each command's
//! options and their checks are `hytra_lab::cmd`'s; its module here runs and prints.
//!
//! - `bench.rs`: `hytra bench`, transactional workloads
//! - `calibrate.rs`: `hytra calibrate`, the simulator's CPU profile of this machine
//! - `cluster.rs`: `hytra node` and `hytra cluster`, a benchmark on processes over UCX
//! - `io.rs`: `hytra io`, remote storage I/O
//! - `micro.rs`: `hytra micro`, the raw-primitive benchmarks
//! - `offload.rs`: `hytra offload`, NIC-offloaded gets against one- and two-sided ones
//! - `reproduce`: `hytra reproduce` (the matrix and its report are `hytra_lab::reproduce`)
//! - `signals.rs`: a closed pipe, Ctrl-C and SIGTERM
//! - `swarm.rs`: `hytra swarm`, configurations drawn from seeds and judged by every oracle
//! - `table.rs`: terminal tables and JSON output helpers

mod bench;
mod calibrate;
mod cluster;
mod io;
mod micro;
mod offload;
mod reproduce;
mod signals;
mod swarm;
mod table;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Exit code for bad arguments or input.
const EXIT_USAGE: u8 = 2;
/// Exit code for a failure while running.
const EXIT_RUN: u8 = 1;

#[derive(Parser)]
#[command(name = "hytra", version, about = "Hybrid RDMA transactions: benchmarks and tools")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// A transactional workload: throughput, aborts, latency, per-phase time, checker.
    Bench(hytra_lab::cmd::bench::BenchArgs),
    /// Raw-primitive throughput and latency (DrTM+H §4.2, Fig. 5), or the multi-object
    /// benchmark (Fig. 6).
    Micro(hytra_lab::cmd::micro::MicroArgs),
    /// The experiment matrix behind DrTM+H's figures 5-21 and RedN's offloaded gets on
    /// the simulator, written as an HTML report with SVG charts and a JSON file.
    Reproduce(hytra_lab::cmd::reproduce::ReproduceArgs),
    /// One node of a cluster of processes over UCX (see `hytra cluster`).
    Node(cluster::NodeArgs),
    /// Every node of a one-machine cluster file as child processes over UCX; prints
    /// node 0's report and stops every node on exit, error or Ctrl-C.
    Cluster(cluster::ClusterArgs),
    /// The hub of a cluster whose nodes are started by hand (`hytra node --id` on each
    /// host) or by `mpirun --enable-recovery`: serves one run so that it outlives the
    /// death of any node.
    Hub(cluster::HubArgs),
    /// Remote storage I/O: local, fabric-only and remote random reads, trace replay.
    Io(hytra_lab::cmd::io::IoArgs),
    /// NIC-offloaded gets (verb programs) vs one-sided and two-sided gets, on sim/cx5.
    Offload(hytra_lab::cmd::offload::OffloadArgs),
    /// Measures what hytra's own code costs on this machine (the engine in the simulator
    /// with measured CPU) and writes the CPU profile that `--cpu-profile` takes.
    Calibrate(hytra_lab::cmd::calibrate::CalibrateArgs),
    /// Whole configurations (workload, design, knobs, NIC, faults) drawn from seeds, each
    /// run and judged by every oracle; a failure prints the command that replays it.
    Swarm(hytra_lab::cmd::swarm::SwarmArgs),
}

/// An error that is the user's to fix (exit 2) or a failure of the run (exit 1).
pub enum CliError {
    /// Bad arguments or input.
    Usage(String),
    /// The run failed.
    Run(anyhow::Error),
    /// A stop signal ended the run early, after it said what it had done; the process
    /// exits 128 + the signal, as a process the signal killed.
    Stopped(i32),
}

impl From<anyhow::Error> for CliError {
    fn from(e: anyhow::Error) -> Self {
        CliError::Run(e)
    }
}

/// Shorthand for usage errors.
pub fn usage<T>(msg: impl Into<String>) -> Result<T, CliError> {
    Err(CliError::Usage(msg.into()))
}

impl From<hytra_lab::cmd::Usage> for CliError {
    fn from(e: hytra_lab::cmd::Usage) -> Self {
        CliError::Usage(e.0)
    }
}

fn main() -> ExitCode {
    signals::default_sigpipe();
    // `--nodes -1` should read as a bad number, not as an unknown flag `-1`.
    let command = Cli::command().mut_subcommands(|c| c.allow_negative_numbers(true));
    let parsed = command.try_get_matches().and_then(|m| Ok((Cli::from_arg_matches(&m)?, m)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            print!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {}", hytra_lab::cmd::one_line(&e));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match cli.command {
        Some(Command::Bench(args)) => {
            let m = matches.subcommand_matches("bench").expect("the bench command's matches");
            bench::run_bench(hytra_lab::cmd::bench::BenchArgs::given_in(args, m))
        }
        Some(Command::Micro(args)) => micro::run(args),
        Some(Command::Io(args)) => io::run(args),
        Some(Command::Offload(args)) => offload::run(args),
        Some(Command::Swarm(args)) => swarm::run(args),
        Some(Command::Calibrate(args)) => calibrate::run(args),
        Some(Command::Reproduce(args)) => reproduce::run_reproduce(args),
        Some(Command::Node(args)) => cluster::run_node(args),
        Some(Command::Cluster(args)) => cluster::run_cluster(args),
        Some(Command::Hub(args)) => cluster::run_hub(args),
        // With no command, run the default benchmark.
        None => bench::run_bench(hytra_lab::cmd::bench::BenchArgs::default_run()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(CliError::Run(e)) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_RUN)
        }
        Err(CliError::Stopped(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(EXIT_RUN)),
    }
}
