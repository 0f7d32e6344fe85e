//! `hytra calibrate`: measures what hytra's own code costs on this machine and writes
//! the simulator's CPU profile.

use hytra_lab::calibrate::{calibrate, plan, Calibration};
use hytra_lab::cmd::calibrate::CalibrateArgs;
use serde_json::json;
use std::io::{IsTerminal, Write};

use crate::table::{open_output, sibling, write_json};
use crate::{signals, CliError};

/// Runs `hytra calibrate`.
pub fn run(a: CalibrateArgs) -> Result<(), CliError> {
    a.check()?;
    // The outputs' places are tried before the runs, without touching a file that is
    // already there: the profile goes to a file beside it, renamed over it at the end.
    let staged = sibling(&a.out, "hytra-tmp");
    signals::remove_on_signal(&staged);
    let mut out = open_output(&staged)?;
    let fail = |e: CliError| {
        let _ = std::fs::remove_file(&staged);
        e
    };
    if let Some(j) = &a.json {
        let probe = sibling(j, "hytra-probe");
        open_output(&probe).map_err(fail)?;
        let _ = std::fs::remove_file(&probe);
    }
    let extent = a.extent();
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
    .map_err(|e| fail(CliError::Run(e.into())))?;
    if tty {
        eprint!("\r{:80}\r", "");
    }
    print_fit(&c);
    // What it writes must load: a fit far off (a term seen in a handful of steps) is
    // refused here rather than by the run that tries to use it.
    c.profile.validate().map_err(|e| {
        fail(CliError::Run(anyhow::anyhow!("the fitted profile is not usable: {e}")))
    })?;
    out.set_len(0)
        .and_then(|()| out.write_all(header(&c).as_bytes()))
        .and_then(|()| out.write_all(c.profile.to_toml().as_bytes()))
        .and_then(|()| out.sync_all())
        .and_then(|()| std::fs::rename(&staged, &a.out))
        .map_err(|e| fail(CliError::Run(anyhow::anyhow!("writing {}: {e}", a.out.display()))))?;
    println!("profile    written to {} (use it with --cpu-profile {0})", a.out.display());
    if let Some(path) = &a.json {
        let terms: Vec<_> = c
            .terms
            .iter()
            .map(|t| json!({"term": t.name, "ns": t.ns, "assumed_ns": t.assumed_ns, "steps": t.steps}))
            .collect();
        let profile = serde_json::to_value(&c.profile).expect("a profile serialises");
        let file = open_output(path)?;
        write_json(file, path, &json!({"schema": 1, "profile": profile, "terms": terms}))?;
    }
    Ok(())
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
