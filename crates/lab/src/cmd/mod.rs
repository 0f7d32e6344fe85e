//! The commands' options: what each `hytra` command takes, declared once for clap (the
//! help, the names, the ranges), and checked into the plan of a run before any work
//! starts. A Rust program builds the same options (from arguments with [`parse`], or by
//! fields) and gets the same checks and the same plan.
//!
//! - `bench`: `hytra bench`'s options, checked into a [`bench::BenchPlan`]
//! - `micro`: `hytra micro`'s, into a [`crate::micro::MicroPlan`]
//! - `io`: `hytra io`'s, into an [`io::IoCommand`]
//! - `offload`, `swarm`, `reproduce`, `calibrate`: those commands' options
//! - `cluster`: a cluster file's command, and `hytra cluster --kill`
//! - `choice`: options whose value is one of a fixed set (`on`/`off`, a library's enum)
//!
//! Not for: running, printing or exit codes (the binary's), or what a run measures (the
//! modules beside this one).

pub mod bench;
pub mod calibrate;
pub mod choice;
pub mod cluster;
pub mod io;
pub mod micro;
pub mod offload;
pub mod reproduce;
pub mod swarm;

use clap::{CommandFactory, FromArgMatches, Parser};
use thiserror::Error;

/// Options that cannot make a run: the user's to fix (the binary exits 2), said in one
/// line.
#[derive(Clone, PartialEq, Eq, Debug, Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// Shorthand for a refusal.
pub fn usage<T>(msg: impl Into<String>) -> Result<T, Usage> {
    Err(Usage(msg.into()))
}

/// A backend named by `--backend`.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum BackendKind {
    /// The simulator (virtual time).
    Sim,
    /// Threads of this process (real time).
    Local,
    /// UCX (only in a build with the `ucx` feature).
    Ucx,
}

impl BackendKind {
    /// Parses `--backend`; `ucx` is refused with the way to get it in a build without it.
    pub fn parse(name: &str) -> Result<BackendKind, Usage> {
        match name {
            "sim" => Ok(BackendKind::Sim),
            "local" => Ok(BackendKind::Local),
            "ucx" if cfg!(feature = "ucx") => Ok(BackendKind::Ucx),
            "ucx" => usage(
                "backend 'ucx' is not in this build: install libucx-dev and build with --features ucx",
            ),
            other => usage(format!("unknown backend '{other}' (expected sim, local or ucx)")),
        }
    }

    /// The longest window a point of `micro` or `io` may be measured over (asked for, or
    /// lengthened to when it was too short for its latency; `hytra_rt::window`): a
    /// virtual second on sim, where a 16 x 24 point simulates about a million events per
    /// wall-second; ten minutes in real time.
    pub fn window_max_ns(self) -> u64 {
        match self {
            BackendKind::Sim => 1_000_000_000,
            BackendKind::Local | BackendKind::Ucx => 600_000_000_000,
        }
    }
}

/// Collapses clap's multi-line message into one line.
pub fn one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("For more information") && !l.starts_with("Usage:")
        })
        .collect();
    lines.join(" ").trim_start_matches("error: ").to_string()
}

/// Parses a command's options from `argv` (its name first, as `hytra` sees it after
/// the subcommand: `["bench", "--nodes", "4"]`), with what clap saw of each, or clap's
/// refusal in one line.
pub fn parse<T: clap::Args + FromArgMatches>(
    argv: &[impl AsRef<str>],
) -> Result<(T, clap::ArgMatches), Usage> {
    #[derive(Parser)]
    struct Wrapper<A: clap::Args> {
        #[command(flatten)]
        args: A,
    }
    let argv = argv.iter().map(AsRef::as_ref);
    let bad = |e: clap::Error| Usage(one_line(&e));
    let command = Wrapper::<T>::command().allow_negative_numbers(true);
    let m = command.try_get_matches_from(argv).map_err(bad)?;
    let w = Wrapper::<T>::from_arg_matches(&m).map_err(bad)?;
    Ok((w.args, m))
}

#[cfg(test)]
mod tests {
    use super::{bench, io, micro, offload, parse, swarm, Usage};

    fn bench_plan(argv: &[&str]) -> Result<bench::BenchPlan, Usage> {
        let (a, m) = parse::<bench::BenchArgs>(argv)?;
        bench::plan(&bench::BenchArgs::given_in(a, &m))
    }

    /// Options parsed from arguments plan the run they name, as the binary's do.
    #[test]
    fn parsed_options_plan_the_run_they_name() {
        let plan =
            bench_plan(&["bench", "--nodes", "4", "--workers", "2", "--design", "fasst"]).unwrap();
        let shape = plan.spec.backend.shape();
        assert_eq!((shape.nodes, shape.workers_per_node), (4, 2));
        assert!(plan.spec.backend.is_sim());
        assert_eq!(plan.spec.txn, hytra_txn::TxnConfig::preset(hytra_txn::Design::Fasst));
        assert!(plan.candidates.is_empty() && plan.crashes.is_empty());
        let plan = bench_plan(&["bench", "--design", "auto"]).unwrap();
        assert_eq!(plan.candidates.len(), 5, "four presets and drtmh with two-sided locks");
    }

    /// Refusals come as one line, before anything is built: clap's and the checks' own.
    #[test]
    fn bad_options_are_refused_in_one_line() {
        let refused = |argv: &[&str]| bench_plan(argv).unwrap_err().0;
        let e = refused(&["bench", "--nodes", "2"]);
        assert!(e.starts_with("--nodes 2 cannot hold 3 copies"), "{e}");
        let e = refused(&["bench", "--no-such-flag"]);
        assert!(e.contains("--no-such-flag") && !e.contains('\n'), "{e}");
        let e = refused(&["bench", "--nodes", "-1"]);
        assert!(e.contains("-1") && !e.contains("unexpected argument"), "{e}");
        let e = refused(&["bench", "--workload", "smallbank", "--items", "10"]);
        assert!(e.contains("--items applies to --workload tpcc"), "{e}");
        let e = refused(&["bench", "--crash", "7@1ms", "--nodes", "4"]);
        assert!(e.contains("there is no node 7"), "{e}");
    }

    /// Every other command's options check the same way.
    #[test]
    fn every_command_checks_its_options() {
        let (a, _) = parse::<micro::MicroArgs>(&["micro", "--quick"]).unwrap();
        let plan = micro::plan(&a).unwrap();
        assert_eq!((plan.shape.nodes, plan.shape.workers_per_node), (16, 24));
        assert_eq!(plan.payloads, [8, 64, 512, 4096]);
        let (a, _) = parse::<micro::MicroArgs>(&["micro", "--nodes", "1"]).unwrap();
        assert!(micro::plan(&a).unwrap_err().0.contains("at least 2 nodes"));

        let (a, _) = parse::<io::IoArgs>(&["io", "--trace", "t.csv", "--no-trace"]).unwrap();
        assert!(io::plan(&a).unwrap_err().0.contains("--no-trace"));
        let (a, _) = parse::<io::IoArgs>(&["io"]).unwrap();
        let plan = io::plan(&a).unwrap();
        assert!(plan.trace.is_none() && plan.io.points().len() > 1);

        let (a, _) = parse::<offload::OffloadArgs>(&["offload", "--sizes", "12"]).unwrap();
        assert!(offload::plan(&a).unwrap_err().0.contains("multiples of 8"));
        let (a, _) = parse::<offload::OffloadArgs>(&["offload"]).unwrap();
        assert_eq!(offload::plan(&a).unwrap().duration_ns, 2_000_000);

        let never = || false;
        let (a, _) = parse::<swarm::SwarmArgs>(&["swarm", "--seeds", "0"]).unwrap();
        assert!(swarm::options(&a, never).unwrap_err().0.contains("at least one seed"));
        let (a, _) = parse::<swarm::SwarmArgs>(&["swarm", "--from", "5"]).unwrap();
        let o = swarm::options(&a, never).unwrap();
        assert_eq!((o.first_seed, o.seeds), (5, Some(swarm::SEEDS_DEFAULT)));
    }
}
