//! `hytra calibrate`'s options.

use std::path::PathBuf;

use clap::Args;

use crate::calibrate::Extent;
use crate::cmd::{usage, Usage};

/// Options of `hytra calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Write the profile (TOML) here; `--cpu-profile FILE` then uses it.
    #[arg(long, default_value = "hytra-cpu-host.toml")]
    pub out: PathBuf,
    /// Also write the fit, term by term, as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// A few short runs (seconds; a rough fit, for trying the command).
    #[arg(long)]
    pub quick: bool,
    /// Seed of the runs' workloads.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl CalibrateArgs {
    /// Refuses a seed the runs cannot derive theirs from, and one file named twice.
    pub fn check(&self) -> Result<(), Usage> {
        if self.seed > u64::MAX / 2 {
            return usage(format!("--seed {} must be at most {}", self.seed, u64::MAX / 2));
        }
        if self.json.as_ref() == Some(&self.out) {
            return usage(format!("--json and --out both name '{}'", self.out.display()));
        }
        Ok(())
    }

    /// How many runs: a few short ones with `--quick`, else the full set.
    pub fn extent(&self) -> Extent {
        if self.quick {
            Extent::Tiny
        } else {
            Extent::Full
        }
    }
}
