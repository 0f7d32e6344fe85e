//! Terminal tables and output files.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::CliError;

pub use hytra_lab::table::{mops, rate, us, Table};

/// Opens `path` for the JSON report before any work starts, so that a bad path fails
/// at once rather than after a long run. Nothing it holds is truncated here: see
/// [`write_json`].
pub fn open_output(path: &Path) -> Result<File, CliError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| CliError::Usage(format!("cannot write '{}': {e}", path.display())))
}

/// Writes a report (or any JSON value) to the file [`open_output`] opened. A regular
/// file is replaced whole: the report goes to a file beside it, renamed over it, so that
/// a run that fails or is interrupted, even while writing, leaves what it held before.
/// Anything else (a pipe, a terminal, `/dev/null`) is written as it is.
pub fn write_json(
    mut file: File,
    path: &Path,
    value: &impl serde::Serialize,
) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).expect("reports serialize") + "\n";
    let fail =
        |e: std::io::Error| CliError::Run(anyhow::anyhow!("writing '{}': {e}", path.display()));
    if !file.metadata().map_err(fail)?.is_file() {
        return file.write_all(text.as_bytes()).map_err(fail);
    }
    drop(file);
    // Only for the instant of the write: a signal then may leave it behind.
    let staged = sibling(path, "hytra-tmp");
    std::fs::write(&staged, text).and_then(|()| std::fs::rename(&staged, path)).map_err(|e| {
        let _ = std::fs::remove_file(&staged);
        fail(e)
    })
}

/// A hidden file beside `path`, for this process.
pub fn sibling(path: &Path, what: &str) -> PathBuf {
    let name = path.file_name().map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{what}-{}", std::process::id()))
}
