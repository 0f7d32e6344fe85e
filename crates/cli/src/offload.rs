//! `hytra offload`: NIC-offloaded gets (RedN) against one-sided and two-sided gets on the
//! simulator's cx5 NIC model.

use std::path::PathBuf;

use clap::Args;
use hytra_lab::offload::{scenarios, OffloadPlan, OffloadReport, OffloadRun, OFFLOAD_SCHEMA};
use hytra_offload::bench::{self, Outcome, Scenario};
use hytra_offload::service::LIST_LEN_MAX;

use crate::table::{open_output, write_json, Table};
use crate::{usage, BackendKind, CliError};
use hytra_lab::span::{check_window, Span};

/// The largest value: one READ fetches it with its item header.
const VALUE_MAX: u32 = hytra_offload::bench::VALUE_MAX;
/// The most `if` chains: each registers its own code region and two work queues.
const IF_CHAINS_MAX: u32 = 1024;

/// Arguments of `hytra offload`.
#[derive(Args, Debug, Clone)]
pub struct OffloadArgs {
    /// Value sizes in bytes for the latency sweep (multiples of 8).
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024,4096,16384,65536")]
    sizes: Vec<u32>,
    /// Background writer counts for the isolation run.
    #[arg(long, value_delimiter = ',', default_value = "0,1,4,16")]
    writers: Vec<u16>,
    /// Nodes per list of the list-traversal runs (1..=13; RedN uses 8).
    #[arg(long, default_value_t = 8)]
    list_len: u32,
    /// Ranges of the list-traversal runs: a get's key sits at a uniform position below
    /// the range (each at most --list-len).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    list_ranges: Vec<u32>,
    /// Independent chains for the `if`-construct rate (each runs 200 unrolled `if`s).
    #[arg(long, value_delimiter = ',', default_value = "1,2,8")]
    if_chains: Vec<u32>,
    /// Virtual time per scenario: a number and a unit (2ms, 500us) or bare seconds.
    #[arg(long, default_value = "2ms", value_name = "DURATION")]
    duration: Span,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write every scenario and outcome as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn row(t: &mut Table, what: &str, s: &Scenario, o: &Outcome) {
    t.row(vec![
        what.to_string(),
        s.path.name().to_string(),
        s.value_bytes.to_string(),
        s.list.map_or("-".to_string(), |l| format!("{}/{}", l.range, l.len)),
        o.gets.to_string(),
        // Marked when lengthened from --duration to hold enough gets (hytra_rt::window).
        match o.extended_from_ns {
            Some(_) => format!("{}*", o.window_ns / 1000),
            None => (o.window_ns / 1000).to_string(),
        },
        format!("{:.2}", o.mean_ns as f64 / 1e3),
        format!("{:.2}", o.p50_ns as f64 / 1e3),
        format!("{:.2}", o.p99_ns as f64 / 1e3),
        format!("{:.0}", o.gets_per_sec / 1e3),
        o.timeouts.to_string(),
        o.wrong.to_string(),
        o.gets_after_pause.to_string(),
    ]);
}

/// Refuses values no scenario can take, before any runs.
fn check(a: &OffloadArgs) -> Result<(), CliError> {
    if let Some(s) = a.sizes.iter().find(|&&s| s == 0 || s % 8 != 0 || s > VALUE_MAX) {
        return usage(format!(
            "--sizes {s}: values are positive multiples of 8 up to {VALUE_MAX} B (an item with its 16-byte header is one READ)"
        ));
    }
    if let Some(c) = a.if_chains.iter().find(|&&c| c == 0 || c > IF_CHAINS_MAX) {
        return usage(format!("--if-chains {c}: expected 1..={IF_CHAINS_MAX}"));
    }
    let max = Span::from_ns(BackendKind::Sim.window_max_ns());
    check_window(a.duration, max, "").map_err(CliError::Usage)?;
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
    Ok(())
}

/// Runs the scenarios and prints one table.
pub fn run(a: OffloadArgs) -> Result<(), CliError> {
    check(&a)?;
    let max = Span::from_ns(BackendKind::Sim.window_max_ns());
    let out = a.json.as_deref().map(open_output).transpose()?;
    let runs = scenarios(&OffloadPlan {
        sizes: a.sizes.clone(),
        writers: a.writers.clone(),
        list_len: a.list_len,
        list_ranges: a.list_ranges.clone(),
        duration_ns: a.duration.ns(),
        seed: a.seed,
    });
    let mut t = Table::new(&[
        "scenario",
        "path",
        "value B",
        "list range",
        "gets",
        "window µs",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "K gets/s",
        "timeouts",
        "wrong",
        "after pause",
    ]);
    let mut measured = Vec::new();
    let mut extended = 0;
    for (k, (what, s)) in runs.iter().enumerate() {
        let o = bench::run_settled(s, max.ns()).map_err(|e| CliError::Run(e.into()))?;
        // Progress, as `micro` gives it: the whole run takes seconds.
        eprintln!(
            "[{}/{}] {what} {} {} B: p50 {:.2} µs over {}",
            k + 1,
            runs.len(),
            s.path.name(),
            s.value_bytes,
            o.p50_ns as f64 / 1e3,
            Span::from_ns(o.window_ns)
        );
        extended += usize::from(o.extended_from_ns.is_some());
        row(&mut t, what, s, &o);
        let (scenario, path) = (what.clone(), s.path.name().to_string());
        measured.push(OffloadRun { scenario, path, params: s.clone(), outcome: o });
    }
    print!("{}", t.render());
    if extended > 0 {
        println!(
            "\n* window lengthened from {} (--duration) for {extended} of {} scenarios, to hold {} gets and twice the p99 latency",
            a.duration,
            runs.len(),
            hytra_rt::window::SETTLED_OPS_MIN
        );
    }
    let mut ifs = Table::new(&["if chains", "ifs per chain", "elapsed µs", "M ifs/s"]);
    let mut json_ifs = Vec::new();
    for &chains in &a.if_chains {
        let r = bench::if_rate(chains, 200, a.seed).map_err(|e| CliError::Run(e.into()))?;
        ifs.row(vec![
            chains.to_string(),
            r.ifs_per_chain.to_string(),
            format!("{:.2}", r.elapsed_ns as f64 / 1e3),
            format!("{:.3}", r.ifs_per_sec / 1e6),
        ]);
        json_ifs.push(r);
    }
    println!();
    print!("{}", ifs.render());
    if let (Some(file), Some(path)) = (out, a.json.as_deref()) {
        let report = OffloadReport {
            schema: OFFLOAD_SCHEMA,
            profile: "cx5".into(),
            runs: measured,
            if_rate: json_ifs,
        };
        write_json(file, path, &report)?;
    }
    Ok(())
}
