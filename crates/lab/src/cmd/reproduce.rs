//! `hytra reproduce`'s options, into a [`ReproduceSpec`], and its refusals named by the
//! flag at fault.

use std::path::PathBuf;

use clap::Args;

use crate::reproduce::{ReproduceError, ReproduceSpec};

/// Options of `hytra reproduce`.
#[derive(Args, Debug, Clone)]
pub struct ReproduceArgs {
    /// A smaller matrix (4 nodes x 4 workers, small databases, three coroutine counts):
    /// a few minutes on two cores.
    #[arg(long)]
    pub quick: bool,
    /// Directory for index.html and results.json (created if needed).
    #[arg(long, default_value = "reproduce")]
    pub out: PathBuf,
    /// Only these figures (e.g. fig7,fig12; RedN's: redn-get, redn-list, redn-isolation).
    #[arg(long, value_delimiter = ',')]
    pub only: Option<Vec<String>>,
    /// Simulated clusters run at once [default: one per core].
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Nodes of the transactional experiments [default: 8, 4 with --quick].
    #[arg(long)]
    pub nodes: Option<u16>,
    /// Workers per node of the transactional experiments [default: 8, 4 with --quick].
    #[arg(long)]
    pub workers: Option<u16>,
    /// Seed of every run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// CPU profile of the transactional runs, what hytra's own code costs: paper, host,
    /// assumed, or a file `hytra calibrate` wrote [default: the one of `hytra bench`].
    #[arg(long)]
    pub cpu_profile: Option<String>,
}

/// What is said of bad input, naming the flag that gave it.
pub fn flagged(e: &ReproduceError) -> String {
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

impl ReproduceArgs {
    /// The matrix these options ask for (checked when it is planned).
    pub fn spec(self) -> ReproduceSpec {
        ReproduceSpec {
            quick: self.quick,
            out: self.out,
            only: self.only,
            jobs: self.jobs,
            nodes: self.nodes,
            workers: self.workers,
            seed: self.seed,
            cpu_profile: self.cpu_profile,
        }
    }
}
