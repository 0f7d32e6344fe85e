//! `hytra offload`'s options, and their checks into an [`OffloadPlan`].

use std::path::PathBuf;

use clap::Args;
use hytra_offload::service::LIST_LEN_MAX;

use crate::cmd::{usage, BackendKind, Usage};
use crate::offload::OffloadPlan;
use crate::span::{check_window, Span};

/// The largest value: one READ fetches it with its item header.
const VALUE_MAX: u32 = hytra_offload::bench::VALUE_MAX;
/// The most `if` chains: each registers its own code region and two work queues.
const IF_CHAINS_MAX: u32 = 1024;

/// Arguments of `hytra offload`.
#[derive(Args, Debug, Clone)]
pub struct OffloadArgs {
    /// Value sizes in bytes for the latency sweep (multiples of 8).
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024,4096,16384,65536")]
    pub sizes: Vec<u32>,
    /// Background writer counts for the isolation run.
    #[arg(long, value_delimiter = ',', default_value = "0,1,4,16")]
    pub writers: Vec<u16>,
    /// Nodes per list of the list-traversal runs (1..=13; RedN uses 8).
    #[arg(long, default_value_t = 8)]
    pub list_len: u32,
    /// Ranges of the list-traversal runs: a get's key sits at a uniform position below
    /// the range (each at most --list-len).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub list_ranges: Vec<u32>,
    /// Independent chains for the `if`-construct rate (each runs 200 unrolled `if`s).
    #[arg(long, value_delimiter = ',', default_value = "1,2,8")]
    pub if_chains: Vec<u32>,
    /// Virtual time per scenario: a number and a unit (2ms, 500us) or bare seconds.
    #[arg(long, default_value = "2ms", value_name = "DURATION")]
    pub duration: Span,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write every scenario and outcome as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Refuses values no scenario can take, before any runs, and plans the scenarios.
pub fn plan(a: &OffloadArgs) -> Result<OffloadPlan, Usage> {
    if let Some(s) = a.sizes.iter().find(|&&s| s == 0 || s % 8 != 0 || s > VALUE_MAX) {
        return usage(format!(
            "--sizes {s}: values are positive multiples of 8 up to {VALUE_MAX} B (an item with its 16-byte header is one READ)"
        ));
    }
    if let Some(c) = a.if_chains.iter().find(|&&c| c == 0 || c > IF_CHAINS_MAX) {
        return usage(format!("--if-chains {c}: expected 1..={IF_CHAINS_MAX}"));
    }
    let max = Span::from_ns(BackendKind::Sim.window_max_ns());
    check_window(a.duration, max, "").map_err(Usage)?;
    // Each writer is a worker of its own: the shape must hold them.
    if let Some(w) = a.writers.iter().find(|&&w| w > hytra_fabric::constants::WORKERS_PER_NODE_MAX)
    {
        return usage(format!(
            "--writers {w}: at most {} (one worker each)",
            hytra_fabric::constants::WORKERS_PER_NODE_MAX
        ));
    }
    if !(1..=LIST_LEN_MAX).contains(&a.list_len) {
        return usage(format!("--list-len must be 1..={LIST_LEN_MAX}"));
    }
    if a.list_ranges.iter().any(|&r| r == 0 || r > a.list_len) {
        return usage("--list-ranges must be 1..=--list-len");
    }
    Ok(OffloadPlan {
        sizes: a.sizes.clone(),
        writers: a.writers.clone(),
        list_len: a.list_len,
        list_ranges: a.list_ranges.clone(),
        duration_ns: a.duration.ns(),
        seed: a.seed,
    })
}
