//! `hytra calibrate`: measures what hytra's own code costs on this machine and writes
//! the simulator's CPU profile.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;
use hytra_lab::calibrate::{calibrate, plan, Calibration, Extent};
use serde_json::json;

use crate::table::{open_output, write_json};
use crate::{usage, CliError};

/// Options of `hytra calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Write the profile (TOML) here; `--cpu-profile FILE` then uses it.
    #[arg(long, default_value = "hytra-cpu-host.toml")]
    out: PathBuf,
    /// Also write the fit, term by term, as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// A few short runs (seconds; a rough fit, for trying the command).
    #[arg(long)]
    quick: bool,
    /// Seed of the runs' workloads.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs `hytra calibrate`.
pub fn run(a: CalibrateArgs) -> Result<(), CliError> {
    // Both outputs are opened before the minutes of measuring, so that a path that
    // cannot be written is refused at once.
    if a.seed > u64::MAX / 2 {
        return usage(format!("--seed {} must be at most {}", a.seed, u64::MAX / 2));
    }
    let mut out = open_output(&a.out)?;
    let json_out = match a.json.as_deref().map(|p| open_output(p).map(|f| (f, p))).transpose() {
        Ok(j) => j,
        Err(e) => return Err(forget(&a.out, e)),
    };
    let extent = if a.quick { Extent::Tiny } else { Extent::Full };
    let runs = plan(extent).len();
    eprintln!(
        "calibrate: {runs} runs of the engine in the simulator with measured CPU (the machine should be otherwise idle)"
    );
    let tty = std::io::stderr().is_terminal();
    let c = calibrate(extent, a.seed, |i, n, r| {
        if tty {
            eprint!("\r  run {}/{n}: {:60}", i + 1, r.describe());
        }
    })
    .map_err(|e| forget(&a.out, CliError::Run(e.into())))?;
    if tty {
        eprint!("\r{:80}\r", "");
    }
    print_fit(&c);
    out.write_all(header(&c).as_bytes())
        .and_then(|()| out.write_all(c.profile.to_toml().as_bytes()))
        .map_err(|e| CliError::Run(anyhow::anyhow!("writing {}: {e}", a.out.display())))?;
    println!("profile    written to {} (use it with --cpu-profile {0})", a.out.display());
    if let Some((file, path)) = json_out {
        let terms: Vec<_> = c
            .terms
            .iter()
            .map(|t| json!({"term": t.name, "ns": t.ns, "assumed_ns": t.assumed_ns, "steps": t.steps}))
            .collect();
        let profile = serde_json::to_value(&c.profile).expect("a profile serialises");
        write_json(file, path, &json!({"schema": 1, "profile": profile, "terms": terms}))?;
    }
    Ok(())
}

/// Removes the profile file opened for a calibration that did not finish, and passes
/// on why.
fn forget(out: &std::path::Path, e: CliError) -> CliError {
    let _ = std::fs::remove_file(out);
    e
}

fn header(c: &Calibration) -> String {
    format!(
        "# Written by `hytra calibrate`: {} runs, {:.0} s. Costs in ns of this machine.\n",
        c.runs, c.wall_s
    )
}

fn print_fit(c: &Calibration) {
    println!("{:<34} {:>9} {:>9} {:>12}", "term", "ns", "assumed", "steps");
    for t in &c.terms {
        let ns = if t.steps == 0 { "-".to_string() } else { format!("{:.1}", t.ns) };
        println!("{:<34} {:>9} {:>9.1} {:>12}", t.name, ns, t.assumed_ns, t.steps);
    }
    if let Some(f) = &c.profile.fit {
        println!(
            "fit        {} steps in {} mixes; R^2 {:.3}; median error of a mix {:.1}%; predicted/measured total {:.3}",
            f.steps,
            f.mixes,
            f.r2,
            100.0 * f.median_rel_error,
            f.total_ratio
        );
        if !f.unmeasured.is_empty() {
            println!("unmeasured {} (kept at their assumed cost)", f.unmeasured.join(", "));
        }
    }
    println!("runs       {} in {:.1} s", c.runs, c.wall_s);
}
