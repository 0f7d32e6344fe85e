//! `hytra reproduce`: the matrix of `hytra_lab::reproduce` with a progress bar, and its
//! claims (the options are `hytra_lab::cmd::reproduce`'s).

use hytra_lab::cmd::reproduce::{flagged, ReproduceArgs};
use hytra_lab::reproduce::{run_reproduce as run, Progress};
use std::io::{IsTerminal, Write};

use crate::CliError;

/// Runs `hytra reproduce`.
pub fn run_reproduce(a: ReproduceArgs) -> Result<(), CliError> {
    let spec = a.spec();
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
