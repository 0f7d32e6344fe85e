//! `hytra reproduce`: the options, then the matrix of `hytra_lab::reproduce`.

use std::path::PathBuf;

use clap::Args;
use hytra_lab::reproduce::{run_reproduce as run, ReproduceError, ReproduceSpec};

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
    let r = run(spec).map_err(|e| match e {
        ReproduceError::Usage(m) => CliError::Usage(m),
    })?;
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
