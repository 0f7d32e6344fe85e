//! A file appended through a shared mapping of it: what a process journals so that a
//! reader can still see it after the process is killed.
//!
//! Bytes copied into a `MAP_SHARED` mapping of a file are in the kernel's page cache the
//! moment the copy ends, as they would be after a `write(2)`: a killed process loses
//! none of them, and the kernel writes them back as it does any dirty page. But no
//! system call is made per append, only a mapping per window, whose pages are faulted
//! in with one `madvise(MADV_POPULATE_WRITE)`. A journal written with one `write` per
//! line cost its cluster three quarters of its throughput over shared memory
//! (docs/PERFORMANCE.md §36).
//!
//! While the file is open its length is a whole number of windows and the bytes after
//! the last append read as zeros; [`AppendFile`]'s drop cuts the file to what was
//! appended. A reader of the file of a killed process, or of one still writing,
//! therefore keeps only the whole lines before the first zero byte (see
//! [`whole_lines`]): what is appended must hold no zero byte, as JSON lines do not.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::ptr::NonNull;

/// Bytes mapped at a time: a multiple of every page size, small enough that an idle
/// journal costs little, large enough that remapping is rare (a SmallBank worker
/// journals about 1 KB per transaction).
const WINDOW: usize = 4 << 20;

/// A file opened for appending through a shared mapping (see the module doc).
pub struct AppendFile {
    file: File,
    /// The mapped window `[start, start + WINDOW)` of the file, if one is mapped.
    window: Option<(NonNull<u8>, u64)>,
    /// Bytes appended: the file's length once this is dropped.
    len: u64,
}

// SAFETY: the mapping is owned by this value alone and only written through `&mut self`,
// so moving it to another thread moves its only user.
unsafe impl Send for AppendFile {}

impl std::fmt::Debug for AppendFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendFile").field("len", &self.len).finish_non_exhaustive()
    }
}

impl AppendFile {
    /// Creates (or truncates) the file at `path`.
    ///
    /// # Errors
    /// When the file cannot be created for reading and writing (a shared writable
    /// mapping needs both).
    pub fn create(path: &Path) -> io::Result<AppendFile> {
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        Ok(AppendFile { file, window: None, len: 0 })
    }

    /// Bytes appended so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `parts` one after another.
    ///
    /// # Errors
    /// When the file cannot grow or be mapped. A device that runs out of space while
    /// the kernel fills a page is a `SIGBUS`, as for any mapped file.
    pub fn append(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        for part in parts {
            let mut rest = *part;
            while !rest.is_empty() {
                let (ptr, start) = self.window_at_end()?;
                let off = usize::try_from(self.len - start).expect("within one window");
                let n = rest.len().min(WINDOW - off);
                // SAFETY: `ptr` maps WINDOW bytes of the file from `start`, and
                // `off + n <= WINDOW`; the mapping is this value's alone and `rest` is a
                // borrowed slice elsewhere, so the ranges do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), ptr.as_ptr().add(off), n) };
                self.len += n as u64;
                rest = &rest[n..];
            }
        }
        Ok(())
    }

    /// The window holding offset `len` (where the next byte goes), mapping it first if
    /// the current one ends there.
    fn window_at_end(&mut self) -> io::Result<(NonNull<u8>, u64)> {
        if let Some((ptr, start)) = self.window {
            if self.len < start + WINDOW as u64 {
                return Ok((ptr, start));
            }
            unmap(ptr);
            self.window = None;
        }
        let start = self.len - self.len % WINDOW as u64;
        self.file.set_len(start + WINDOW as u64)?;
        let ptr = map_shared(&self.file, start)?;
        self.window = Some((ptr, start));
        Ok((ptr, start))
    }
}

impl Drop for AppendFile {
    fn drop(&mut self) {
        if let Some((ptr, _)) = self.window.take() {
            unmap(ptr);
        }
        // A file left a window long reads as trailing zeros, which readers drop; a
        // failure here loses nothing.
        let _ = self.file.set_len(self.len);
    }
}

/// What `bytes`, read from an [`AppendFile`] of content without zero bytes, surely holds:
/// all of it before the first zero byte. A killed process leaves its last window's tail
/// zero-filled; and a reader racing a live writer can see a later page written and an
/// earlier one not yet, but every non-zero byte it sees was written, and each position
/// is written once, so the bytes before the first zero are a prefix of what was
/// appended (whose last line may be cut short).
fn appended(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

/// The whole lines (without their newline) of `bytes`, read from an [`AppendFile`] of
/// newline-ended lines without zero bytes: those of `appended`'s prefix, except its
/// last, which a kill or a racing read may have cut short and which is dropped unless
/// its newline made it. The order in which a line's bytes are copied does not matter: a
/// line missing any byte has a zero where it is missing, and is cut there.
pub fn whole_lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let text = appended(bytes);
    let end = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    text[..end].split_inclusive(|&b| b == b'\n').map(|l| &l[..l.len() - 1])
}

fn map_shared(file: &File, start: u64) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    let offset = libc::off_t::try_from(start).map_err(|_| io::Error::other("file too long"))?;
    // SAFETY: a new shared mapping of WINDOW bytes of an open file descriptor, at a
    // page-aligned offset within the file's length (set just before); it aliases no
    // memory of this process, and the kernel chooses its address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            WINDOW,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    populate(p)?;
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Faults a new window's pages in, writable, in one call rather than one fault per page
/// as appends reach them. The whole window is dirty from then on, so up to a window of
/// zeros may be written back before the file is cut. Kernels before 5.14 do not know
/// the advice (`EINVAL`): their pages fault in one by one. Any other failure (`EFAULT`
/// when the file system cannot back a page, e.g. a full device) is the append's error.
#[cfg(target_os = "linux")]
fn populate(p: *mut libc::c_void) -> io::Result<()> {
    // SAFETY: `p` is the WINDOW-byte mapping just made by `map_shared`; populating it
    // faults its pages in writable and changes no byte of it.
    let done = unsafe { libc::madvise(p, WINDOW, libc::MADV_POPULATE_WRITE) };
    let err = io::Error::last_os_error();
    if done == 0 || err.raw_os_error() == Some(libc::EINVAL) {
        return Ok(());
    }
    // SAFETY: as above; the mapping is not handed out, so nothing refers to it.
    unsafe { libc::munmap(p, WINDOW) };
    Err(err)
}

#[cfg(not(target_os = "linux"))]
fn populate(_p: *mut libc::c_void) -> io::Result<()> {
    Ok(())
}

fn unmap(ptr: NonNull<u8>) {
    // SAFETY: `ptr` is one whole WINDOW-byte mapping made by `map_shared` and owned by
    // the `AppendFile` that forgets it here.
    let done = unsafe { libc::munmap(ptr.as_ptr().cast(), WINDOW) };
    debug_assert_eq!(done, 0, "munmap of an owned mapping failed");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("hytra-append-{}-{name}", std::process::id()))
    }

    #[test]
    fn appends_across_windows_read_back_exactly() {
        let path = temp_path("windows");
        let mut expect = Vec::new();
        {
            let mut f = AppendFile::create(&path).unwrap();
            // Lines of 1024 bytes end exactly on the first window's end; lines of 1003
            // straddle the second's.
            let short: Vec<u8> = (0..1021u32).map(|i| (i % 251 + 1) as u8).collect();
            let long: Vec<u8> = (0..1000u32).map(|i| (i % 241 + 2) as u8).collect();
            let (mut appends, mut on_edge) = (0, false);
            while expect.len() < 2 * WINDOW + 5000 {
                appends += 1;
                let line = if expect.len() < WINDOW { &short } else { &long };
                on_edge |= expect.len() == WINDOW;
                f.append(&[b"D ", line, b"\n"]).unwrap();
                expect.extend_from_slice(b"D ");
                expect.extend_from_slice(line);
                expect.push(b'\n');
                assert_eq!(f.len(), expect.len() as u64);
                // Readable by another reader at once, before the file is closed.
                if appends % 500 == 0 {
                    let now = std::fs::read(&path).unwrap();
                    assert_eq!(appended(&now), &expect[..]);
                }
            }
            assert!(on_edge, "a line ended exactly on the first window's end");
            let open = std::fs::read(&path).unwrap();
            assert_eq!(open.len() % WINDOW, 0, "open: whole windows");
            assert_eq!(appended(&open), &expect[..]);
        }
        let closed = std::fs::read(&path).unwrap();
        assert_eq!(closed, expect, "closed: cut to what was appended");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_empty_file_stays_empty_and_trailing_zeros_are_dropped() {
        let path = temp_path("empty");
        drop(AppendFile::create(&path).unwrap());
        assert!(std::fs::read(&path).unwrap().is_empty());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(appended(b"H 1\n\0\0\0"), b"H 1\n");
        assert_eq!(appended(b"\0\0"), b"");
        assert_eq!(appended(b"H 1\nH 2"), b"H 1\nH 2");
        // A reader that raced its writer: a later page seen, an earlier one not yet.
        assert_eq!(appended(b"H 1\nH 2\0\0\0\0 3\nH 4\n\0"), b"H 1\nH 2");
    }

    #[test]
    fn only_whole_lines_are_read() {
        let lines = |b: &'static [u8]| whole_lines(b).collect::<Vec<_>>();
        assert_eq!(lines(b"D 1\nC 12345\n"), vec![&b"D 1"[..], b"C 12345"]);
        // A line cut short (here one that would still parse) is not read, with or
        // without the zeros after it.
        assert_eq!(lines(b"D 1\nC 123"), vec![&b"D 1"[..]]);
        assert_eq!(lines(b"D 1\nC 123\0\0\0"), vec![&b"D 1"[..]]);
        // Nor is anything after a zero a racing reader saw.
        assert_eq!(lines(b"D 1\nC 1\0\0\nD 2\n"), vec![&b"D 1"[..]]);
        assert_eq!(lines(b"\n\nR x\n"), vec![&b""[..], b"", b"R x"]);
        assert!(lines(b"").is_empty() && lines(b"H").is_empty() && lines(b"\0\n").is_empty());
    }
}
