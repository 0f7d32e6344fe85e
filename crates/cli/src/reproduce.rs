//! `hytra reproduce`: the options, then the matrix of `hytra_lab::reproduce`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;
use hytra_lab::reproduce::{run_reproduce as run, Progress, ReproduceError, ReproduceSpec};

use crate::CliError;

/// Options of `hytra reproduce`.
#[derive(Args, Debug, Clone)]
pub struct ReproduceArgs {
    /// A smaller matrix (4 nodes x 4 workers, small databases, three coroutine counts):
    /// a few minutes on two cores.
    #[arg(long)]
    quick: bool,
    /// Directory for index.html and results.json (created if needed).
    #[arg(long, default_value = "reproduce")]
    out: PathBuf,
    /// Only these figures (e.g. fig7,fig12; RedN's: redn-get, redn-list, redn-isolation).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Simulated clusters run at once [default: one per core].
    #[arg(long)]
    jobs: Option<usize>,
    /// Nodes of the transactional experiments [default: 8, 4 with --quick].
    #[arg(long)]
    nodes: Option<u16>,
    /// Workers per node of the transactional experiments [default: 8, 4 with --quick].
    #[arg(long)]
    workers: Option<u16>,
    /// Seed of every run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// CPU profile of the transactional runs, what hytra's own code costs: paper, host,
    /// assumed, or a file `hytra calibrate` wrote [default: the one of `hytra bench`].
    #[arg(long)]
    cpu_profile: Option<String>,
}

/// What is said of bad input, naming the flag that gave it.
fn flagged(e: &ReproduceError) -> String {
    match e {
        ReproduceError::TooSmall { .. } | ReproduceError::Shape(_) => {
            format!("--nodes, --workers: {e}")
        }
        ReproduceError::Jobs { jobs, max } => format!("--jobs {jobs}: expected 1..={max}"),
        ReproduceError::UnknownFigure { name, known } => {
            format!("--only {name}: no such figure (expected one of {})", known.join(", "))
        }
        ReproduceError::CpuProfile(_) => format!("--cpu-profile: {e}"),
        ReproduceError::Output { .. } => format!("--out: {e}"),
    }
}

/// Runs `hytra reproduce`.
pub fn run_reproduce(a: ReproduceArgs) -> Result<(), CliError> {
    let spec = ReproduceSpec {
        quick: a.quick,
        out: a.out,
        only: a.only,
        jobs: a.jobs,
        nodes: a.nodes,
        workers: a.workers,
        seed: a.seed,
        cpu_profile: a.cpu_profile,
    };
    let out = spec.out.clone();
    let terminal = std::io::stderr().is_terminal();
    // Runs done at the last line printed to a log (none yet).
    let mut shown: Option<usize> = None;
    let mut show = |p: Progress| {
        if p.elapsed_s == 0.0 && p.done == 0 {
            eprintln!(
                "reproduce: {} runs on {} threads, writing {}",
                p.total,
                p.threads,
                out.display()
            );
            return;
        }
        let eta = match p.done {
            0 => 0.0,
            d => p.elapsed_s / d as f64 * (p.total - d) as f64,
        };
        let filled = p.done * 30 / p.total.max(1);
        let line = format!(
            "[{}{}] {}/{} runs, ETA {eta:.0} s",
            "#".repeat(filled),
            " ".repeat(30 - filled),
            p.done,
            p.total
        );
        if terminal {
            eprint!("\r{line}  ");
        } else if shown.is_none_or(|s| p.done / 20 != s / 20) {
            // Logs get a line every 20 runs, not one per tick.
            eprintln!("{line}");
            shown = Some(p.done);
        }
        let _ = std::io::stderr().flush();
    };
    let r = run(spec, &mut show).map_err(|e| CliError::Usage(flagged(&e)))?;
    eprintln!();
    println!("{}", r.claims);
    if let Some(why) = r.report_error {
        return Err(CliError::Run(anyhow::anyhow!("the report was not written: {why}")));
    }
    println!(
        "wrote {}/index.html and {}/results.json ({:.0} s)",
        out.display(),
        out.display(),
        r.wall_s
    );
    match r.failures.first() {
        None => Ok(()),
        Some(first) => {
            Err(CliError::Run(anyhow::anyhow!("{} runs failed; first: {first}", r.failures.len())))
        }
    }
}
