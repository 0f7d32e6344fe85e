//! What the test binaries share: scratch paths that are removed when no test uses them.

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How many [`Scratch`] paths are alive in this process. The directory exists while
/// the count is above zero; the last one to go removes it, so a test binary leaves
/// nothing behind however its tests interleave.
static HOLDERS: Mutex<usize> = Mutex::new(0);

/// This process's scratch directory.
fn dir() -> PathBuf {
    std::env::temp_dir().join(format!("hytra-test-{}", std::process::id()))
}

/// A path in this process's scratch directory, which stays while the path is held.
pub struct Scratch(PathBuf);

/// `name` in the scratch directory (a file or a directory the test makes there).
pub fn scratch(name: &str) -> Scratch {
    assert!(!name.is_empty() && !name.contains('/'), "one plain name: {name:?}");
    let mut holders = HOLDERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    std::fs::create_dir_all(dir()).expect("the scratch directory can be made");
    *holders += 1;
    Scratch(dir().join(name))
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let mut holders = HOLDERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(*holders > 0, "a scratch path outlived the count of them");
        *holders -= 1;
        if *holders == 0 {
            let _ = std::fs::remove_dir_all(dir());
        }
    }
}

impl Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}
