//! The files `hytra io` reads: its data file (given, or generated from the seed and removed
//! when dropped) and the traces it replays (read from a file, or a TPC-H Q3-like one
//! generated for the data file). Every refusal says which option is at fault, before any
//! run starts.
//!
//! Not for: the runs (see `io.rs`) or removing a generated file on a signal (the binary's:
//! [`DataFile::generate`] tells it the path before the file exists).

use std::io::Write;
use std::path::{Path, PathBuf};

use hytra_io::trace::{self, TraceOp};
use thiserror::Error;

/// The largest trace file read (about 20 M reads).
pub const TRACE_BYTES_MAX: u64 = 256 << 20;

/// The largest generated data file, MiB.
pub const FILE_MIB_MAX: u64 = 64 << 10;

/// Bytes of a page of the Q3-like trace.
const Q3_PAGE_BYTES: u32 = 16384;

/// The smallest file a Q3-like trace reads: 40 pages.
pub const Q3_BYTES_MIN: u64 = 40 * Q3_PAGE_BYTES as u64;

/// Why a file of `hytra io` cannot be used.
#[derive(Debug, Error)]
pub enum IoFileError {
    /// The trace file is missing, too large, binary, malformed or empty.
    #[error("--trace {path}: {why}")]
    Trace {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The given data file is not a regular file.
    #[error("--file '{0}' is not a readable regular file")]
    NotAFile(String),
    /// The generated data file's size is out of range.
    #[error("--file-mib must be 1 ..= {FILE_MIB_MAX}")]
    FileMib(u64),
    /// The data file holds too few pages for a Q3-like trace.
    #[error("the file is too small for a Q3-like trace (40 pages of 16 KiB)")]
    TooSmall,
    /// Reading or writing a file failed.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
}

impl IoFileError {
    /// Whether the user's arguments are at fault (rather than the machine's files).
    pub fn is_usage(&self) -> bool {
        !matches!(self, IoFileError::Io { .. })
    }
}

/// Reads and parses a trace file of `offset,length` lines (a missing, unreadable,
/// binary or empty file is the user's to fix).
pub fn read_trace(p: &Path) -> Result<Vec<TraceOp>, IoFileError> {
    let bad = |why: String| IoFileError::Trace { path: p.display().to_string(), why };
    let len = std::fs::metadata(p).map_err(|e| bad(e.to_string()))?.len();
    if len > TRACE_BYTES_MAX {
        return Err(bad(format!(
            "{len} bytes; traces of at most {TRACE_BYTES_MAX} bytes are read"
        )));
    }
    let bytes = std::fs::read(p).map_err(|e| bad(e.to_string()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| bad("not a text file of offset,length lines".to_string()))?;
    let ops = trace::parse(&text).map_err(|e| bad(e.to_string()))?;
    if ops.is_empty() {
        return Err(bad("the trace has no reads".to_string()));
    }
    Ok(ops)
}

/// A Q3-like trace of at most `ops` reads of a file of `file_len` bytes (the query ends
/// with the ORDERS scan: a small file holds fewer reads than asked).
pub fn q3_trace(file_len: u64, ops: usize, seed: u64) -> Result<Vec<TraceOp>, IoFileError> {
    if file_len < Q3_BYTES_MIN {
        return Err(IoFileError::TooSmall);
    }
    Ok(trace::tpch_q3(file_len, Q3_PAGE_BYTES, ops, seed))
}

/// Writes a Q3-like trace of the file at `data` to `path`; the reads written.
pub fn write_q3_trace(
    data: &Path,
    path: &Path,
    ops: usize,
    seed: u64,
) -> Result<usize, IoFileError> {
    let io =
        |what, p: &Path, source| IoFileError::Io { what, path: p.display().to_string(), source };
    let len = std::fs::metadata(data).map_err(|e| io("reading the size of", data, e))?.len();
    let trace = q3_trace(len, ops, seed)?;
    std::fs::write(path, trace::format(&trace)).map_err(|e| io("writing", path, e))?;
    Ok(trace.len())
}

/// The file the runs read: given, or generated (and removed when dropped).
#[derive(Debug)]
pub struct DataFile {
    path: PathBuf,
    generated: bool,
}

impl DataFile {
    /// A file the user gave, which must be a regular file.
    pub fn given(path: &Path) -> Result<DataFile, IoFileError> {
        if !path.is_file() {
            return Err(IoFileError::NotAFile(path.display().to_string()));
        }
        Ok(DataFile { path: path.to_path_buf(), generated: false })
    }

    /// Generates `mib` MiB of bytes drawn from `seed` at `path`, calling `before` with the
    /// path before the file exists (so that a caller that removes it on a signal leaves
    /// nothing behind at any instant).
    pub fn generate(
        path: PathBuf,
        mib: u64,
        seed: u64,
        before: impl FnOnce(&Path),
    ) -> Result<DataFile, IoFileError> {
        if mib == 0 || mib > FILE_MIB_MAX {
            return Err(IoFileError::FileMib(mib));
        }
        before(&path);
        // From here on, dropping `f` removes whatever was written.
        let f = DataFile { path, generated: true };
        let failed = |what: &'static str| {
            let path = f.path.display().to_string();
            move |source| IoFileError::Io { what, path, source }
        };
        let file = std::fs::File::create(&f.path).map_err(failed("creating"))?;
        let mut out = std::io::BufWriter::new(file);
        let mut rng = hytra_fabric::rng::Rng::new(seed);
        let mut chunk = vec![0u8; 1 << 20];
        for _ in 0..mib {
            for w in chunk.chunks_exact_mut(8) {
                w.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            out.write_all(&chunk).map_err(failed("writing"))?;
        }
        out.flush().map_err(failed("writing"))?;
        drop(out);
        Ok(f)
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DataFile {
    fn drop(&mut self) {
        if self.generated {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("hytra-io-files-{}-{name}", std::process::id()))
    }

    /// A generated file has the size asked for, the same bytes from the same seed, and is
    /// gone once dropped; its path is told before it exists.
    #[test]
    fn a_generated_file_is_seeded_and_removed_when_dropped() {
        let (a, b) = (scratch("a"), scratch("b"));
        let mut told = None;
        let fa = DataFile::generate(a.clone(), 1, 9, |p| {
            assert!(!p.exists(), "told before the file exists");
            told = Some(p.to_path_buf());
        })
        .unwrap();
        assert_eq!(told.as_deref(), Some(a.as_path()));
        let fb = DataFile::generate(b.clone(), 1, 9, |_| {}).unwrap();
        assert_eq!(std::fs::metadata(fa.path()).unwrap().len(), 1 << 20);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "same seed, same bytes");
        drop((fa, fb));
        assert!(!a.exists() && !b.exists());
        assert!(matches!(
            DataFile::generate(a.clone(), 0, 9, |_| {}),
            Err(IoFileError::FileMib(0))
        ));
        assert!(!a.exists());
    }

    /// Every kind of bad trace file is refused as the user's to fix, naming the file.
    #[test]
    fn bad_trace_files_are_refused_with_their_name() {
        let (empty, binary, bad) = (scratch("empty"), scratch("binary"), scratch("bad"));
        std::fs::write(&empty, "").unwrap();
        std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
        std::fs::write(&bad, "12,x\n").unwrap();
        let missing = scratch("missing");
        for p in [&empty, &binary, &bad, &missing] {
            let e = read_trace(p).unwrap_err();
            assert!(e.is_usage(), "{e}");
            assert!(e.to_string().contains(&p.display().to_string()), "{e}");
        }
        for p in [empty, binary, bad] {
            std::fs::remove_file(p).unwrap();
        }
    }

    /// A trace written for a file reads back as the same reads; a file too small for it
    /// is refused.
    #[test]
    fn a_written_q3_trace_reads_back() {
        let (data, out) = (scratch("q3-data"), scratch("q3-trace"));
        let file = DataFile::generate(data, 1, 3, |_| {}).unwrap();
        let n = write_q3_trace(file.path(), &out, 500, 3).unwrap();
        let back = read_trace(&out).unwrap();
        assert_eq!(back.len(), n);
        assert_eq!(back, q3_trace(1 << 20, 500, 3).unwrap());
        std::fs::remove_file(&out).unwrap();
        assert!(matches!(q3_trace(Q3_BYTES_MIN - 1, 10, 3), Err(IoFileError::TooSmall)));
    }
}
