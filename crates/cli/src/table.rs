//! Terminal tables and output files.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::CliError;

pub use hytra_lab::table::Table;

/// Opens `path` for the JSON report before any work starts, so that a bad path fails
/// at once rather than after a long run.
pub fn open_output(path: &Path) -> Result<File, CliError> {
    // Opened without truncating: what the file held stays until the report replaces it,
    // so a run that is interrupted or fails never erases earlier results.
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| CliError::Usage(format!("cannot write '{}': {e}", path.display())))
}

/// Writes a report (or any JSON value) to an opened file.
pub fn write_json(
    mut file: File,
    path: &Path,
    value: &impl serde::Serialize,
) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).expect("reports serialize");
    file.set_len(0)
        .and_then(|()| file.write_all(text.as_bytes()))
        .and_then(|()| file.write_all(b"\n"))
        .map_err(|e| CliError::Run(anyhow::anyhow!("writing '{}': {e}", path.display())))
}

/// Formats a rate in millions per second with three significant digits.
pub fn mops(rate: f64) -> String {
    format!("{:.2}", rate / 1e6)
}

/// A rate with a unit prefix a reader takes in at a glance: `13.38 M`, `152.3 K`, `870`.
pub fn rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} K", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Formats nanoseconds as microseconds.
pub fn us(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e3)
}
