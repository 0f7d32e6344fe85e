//! What a node lets others read: a fixed table of exported files, built once at start.
//!
//! Requesters name files by id (looked up by name first); every id maps to a file that
//! was opened when the table was built, so no request can reach a path outside the
//! table: there is no path in a read request to traverse. Directory exports take only
//! regular files whose real location (after resolving symlinks) lies inside the
//! directory.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use hytra_fabric::disk::DiskFile;
use thiserror::Error;

/// Identifier of an exported file on its node (dense, in export order).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct FileId(pub u32);

/// Why an export could not be built.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The file or directory could not be opened or listed.
    #[error("cannot export {path}: {source}")]
    Io {
        /// What was being exported.
        path: PathBuf,
        /// The system's reason.
        source: std::io::Error,
    },
    /// Two exports under one name.
    #[error("export name '{0}' is used twice")]
    DuplicateName(String),
    /// A name that is empty, absolute, or has `.`/`..` components.
    #[error("export name '{0}' is not a plain relative name")]
    BadName(String),
}

/// One exported file.
pub struct Exported {
    /// Its name in lookups.
    pub name: String,
    /// Where it lives on this node (after resolving symlinks).
    pub path: PathBuf,
    /// The open file.
    pub file: Arc<DiskFile>,
}

/// The exported files of one node.
#[derive(Default)]
pub struct Exports {
    files: Vec<Exported>,
    by_name: BTreeMap<String, FileId>,
    /// Entries of exported directories that were left out, with why (symlinks leading
    /// outside, special files).
    pub skipped: Vec<(PathBuf, &'static str)>,
}

/// Whether `name` is a relative path of normal components only.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && Path::new(name).components().all(|c| matches!(c, Component::Normal(_)))
        && !name.ends_with('/')
}

impl Exports {
    /// An empty table.
    pub fn new() -> Exports {
        Exports::default()
    }

    /// Exports the regular file at `path` as `name`; `direct` asks for `O_DIRECT`.
    pub fn add_file(
        &mut self,
        name: &str,
        path: &Path,
        direct: bool,
    ) -> Result<FileId, ExportError> {
        if !plain_name(name) {
            return Err(ExportError::BadName(name.to_string()));
        }
        if self.by_name.contains_key(name) {
            return Err(ExportError::DuplicateName(name.to_string()));
        }
        let io = |source| ExportError::Io { path: path.to_path_buf(), source };
        let real = path.canonicalize().map_err(io)?;
        let file = DiskFile::open(&real, direct).map_err(io)?;
        let id = FileId(self.files.len() as u32);
        self.files.push(Exported { name: name.to_string(), path: real, file: Arc::new(file) });
        self.by_name.insert(name.to_string(), id);
        Ok(id)
    }

    /// Exports every regular file under `dir` (recursively) by its path relative to
    /// `dir`, `/`-separated. Symlinks are followed only to targets inside `dir`.
    pub fn add_dir(&mut self, dir: &Path, direct: bool) -> Result<usize, ExportError> {
        let io = |source| ExportError::Io { path: dir.to_path_buf(), source };
        let root = dir.canonicalize().map_err(io)?;
        let mut stack = vec![root.clone()];
        let mut added = 0;
        while let Some(d) = stack.pop() {
            let mut entries: Vec<_> = std::fs::read_dir(&d)
                .map_err(|source| ExportError::Io { path: d.clone(), source })?
                .collect::<Result<_, _>>()
                .map_err(|source| ExportError::Io { path: d.clone(), source })?;
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let p = e.path();
                let Ok(real) = p.canonicalize() else {
                    self.skipped.push((p, "dangling symlink"));
                    continue;
                };
                if !real.starts_with(&root) {
                    self.skipped.push((p, "symlink leads outside the exported directory"));
                    continue;
                }
                let meta = std::fs::metadata(&real)
                    .map_err(|source| ExportError::Io { path: real.clone(), source })?;
                if meta.is_dir() {
                    // A symlink to a directory inside the root would list files twice.
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(real);
                    }
                    continue;
                }
                if !meta.is_file() {
                    self.skipped.push((p, "not a regular file"));
                    continue;
                }
                let rel = p.strip_prefix(&root).expect("listed under the root");
                let name = rel.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/");
                self.add_file(&name, &real, direct)?;
                added += 1;
            }
        }
        Ok(added)
    }

    /// The file `id`, if exported.
    pub fn get(&self, id: FileId) -> Option<&Exported> {
        self.files.get(id.0 as usize)
    }

    /// The id of the file exported as `name`.
    pub fn lookup(&self, name: &str) -> Option<FileId> {
        self.by_name.get(name).copied()
    }

    /// Every exported file, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (FileId, &Exported)> {
        self.files.iter().enumerate().map(|(i, f)| (FileId(i as u32), f))
    }

    /// Number of exported files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether nothing is exported.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_plain() {
        for bad in ["", "/etc/passwd", "../x", "a/../b", "./a", "a/"] {
            assert!(!plain_name(bad), "{bad:?} accepted");
        }
        for good in ["a", "a/b", "table.dat"] {
            assert!(plain_name(good), "{good:?} refused");
        }
    }
}
