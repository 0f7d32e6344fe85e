//! Local storage, the device side of remote I/O: files opened for direct I/O where the
//! file system allows it, and an io_uring reader that keeps many reads in flight from one
//! thread.
//!
//! It lives next to the NIC backends because it is the other device hytra drives
//! directly (and the only other place that needs `unsafe`: io_uring reads into memory the
//! kernel writes after the submitting call returns). The `io` crate builds its engines on
//! it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// Offsets, lengths and buffers of direct I/O are aligned to this (the largest logical
/// block size in common use; devices with 512-byte blocks accept it too).
pub const DIRECT_ALIGN: usize = 4096;

/// A heap buffer whose usable part starts on a [`DIRECT_ALIGN`] boundary, as direct I/O
/// requires. Its address never changes (the storage is allocated once).
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` usable bytes.
    pub fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        assert!(start < DIRECT_ALIGN, "a byte pointer can always be aligned");
        AlignedBuf { raw, start, len }
    }

    /// Usable length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the usable part is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The usable bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The usable bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// The aligned span that covers `[offset, offset + len)`: its start, its length, and
/// where the wanted bytes begin inside it.
pub fn aligned_span(offset: u64, len: usize) -> (u64, usize, usize) {
    let align = DIRECT_ALIGN as u64;
    let start = offset / align * align;
    let end = (offset + len as u64).div_ceil(align) * align;
    (start, (end - start) as usize, (offset - start) as usize)
}

/// A regular file opened for reading, with `O_DIRECT` when asked for and supported.
pub struct DiskFile {
    file: File,
    direct: bool,
    len: u64,
}

impl DiskFile {
    /// Opens `path` read-only. With `want_direct`, tries `O_DIRECT` first and falls back
    /// to buffered I/O where the file system refuses it (tmpfs, some overlays); see
    /// [`DiskFile::direct`]. Anything but a regular file is refused.
    pub fn open(path: &Path, want_direct: bool) -> io::Result<DiskFile> {
        let open = |flags: i32| OpenOptions::new().read(true).custom_flags(flags).open(path);
        let (file, direct) = match want_direct {
            true => match open(libc::O_DIRECT) {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(0)?, false),
                Err(e) => return Err(e),
            },
            false => (open(0)?, false),
        };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
        }
        let mut f = DiskFile { file, direct, len: meta.len() };
        if f.direct && f.len > 0 && !f.probe_direct() {
            f = DiskFile { file: open(0)?, direct: false, len: meta.len() };
        }
        Ok(f)
    }

    /// Some file systems accept `O_DIRECT` at open and fail every read; one aligned read
    /// finds out.
    fn probe_direct(&self) -> bool {
        let mut buf = AlignedBuf::new(DIRECT_ALIGN);
        self.file.read_at(buf.as_mut_slice(), 0).is_ok()
    }

    /// Whether reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Size in bytes when opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads `[offset, offset + len)`, which must lie inside the file, into `scratch`
    /// (at least `aligned_span(offset, len).1` bytes for a direct file, `len` otherwise)
    /// and returns the bytes.
    pub fn read_at<'b>(
        &self,
        offset: u64,
        len: usize,
        scratch: &'b mut AlignedBuf,
    ) -> io::Result<&'b [u8]> {
        let (start, span, skip) =
            if self.direct { aligned_span(offset, len) } else { (offset, len, 0) };
        let need = skip + len;
        let buf = &mut scratch.as_mut_slice()[..span];
        let mut got = 0;
        while got < need {
            match self.file.read_at(&mut buf[got..], start + got as u64) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(&scratch.as_slice()[skip..need])
    }

    fn raw_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.file.as_raw_fd()
    }
}

/// One read slot of a [`UringReader`]: the buffer the kernel fills and what the read
/// was for. While `file` is `Some`, the kernel may be writing `buf`.
struct Slot {
    buf: AlignedBuf,
    file: Option<Arc<DiskFile>>,
    skip: usize,
    want: usize,
    tag: u64,
}

/// Reads through io_uring: up to `depth` reads in flight, submitted in batches by one
/// thread, with no thread per read.
pub struct UringReader {
    ring: io_uring::IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    unsubmitted: u32,
}

impl UringReader {
    /// A reader with `depth` slots of `max_len` bytes (plus alignment slack).
    pub fn new(depth: u32, max_len: usize) -> io::Result<UringReader> {
        if depth == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "io_uring depth 0"));
        }
        let ring = io_uring::IoUring::new(depth.next_power_of_two())?;
        let span = max_len + 2 * DIRECT_ALIGN;
        let slots = (0..depth)
            .map(|_| Slot { buf: AlignedBuf::new(span), file: None, skip: 0, want: 0, tag: 0 })
            .collect();
        Ok(UringReader { ring, slots, free: (0..depth).rev().collect(), unsubmitted: 0 })
    }

    /// Reads in flight or queued.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Queues a read of `[offset, offset + len)` of `file` (inside the file, `len` at
    /// most the reader's `max_len`) reported under `tag`; false when every slot is busy.
    /// Queued reads reach the kernel at the next [`UringReader::submit`].
    pub fn try_queue(&mut self, file: &Arc<DiskFile>, offset: u64, len: usize, tag: u64) -> bool {
        let Some(&i) = self.free.last() else { return false };
        let (start, span, skip) =
            if file.direct() { aligned_span(offset, len) } else { (offset, len, 0) };
        let slot = &mut self.slots[i as usize];
        assert!(span <= slot.buf.len(), "read of {len} bytes exceeds the reader's slot size");
        let sqe = io_uring::opcode::Read::new(
            io_uring::types::Fd(file.raw_fd()),
            slot.buf.as_mut_slice().as_mut_ptr(),
            span as u32,
        )
        .offset(start)
        .build()
        .user_data(u64::from(i));
        // SAFETY: the kernel writes at most `span` bytes (checked above against the
        // buffer's length) into slot `i`'s buffer, whose heap storage is allocated once
        // and neither moved nor freed while the slot is in flight: the slot leaves the
        // free list here and returns to it only in `reap` after its completion was
        // consumed, and `Drop` waits for every in-flight read before the buffers go.
        // The descriptor stays open because the slot holds an `Arc` of the file until
        // then.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_err() {
            return false;
        }
        self.free.pop();
        slot.file = Some(file.clone());
        slot.skip = skip;
        slot.want = len;
        slot.tag = tag;
        self.unsubmitted += 1;
        true
    }

    /// Hands queued reads to the kernel (one system call for the whole batch).
    pub fn submit(&mut self) -> io::Result<()> {
        if self.unsubmitted > 0 {
            self.ring.submit()?;
            self.unsubmitted = 0;
        }
        Ok(())
    }

    /// Blocks until at least one read completes (submitting queued reads first).
    pub fn wait_one(&mut self) -> io::Result<()> {
        self.unsubmitted = 0;
        self.ring.submit_and_wait(1).map(|_| ())
    }

    /// Calls `done(tag, bytes)` for every completed read, without blocking.
    pub fn reap(&mut self, mut done: impl FnMut(u64, io::Result<&[u8]>)) {
        loop {
            let Some(cqe) = self.ring.completion().next() else { return };
            let i = cqe.user_data() as usize;
            let slot = &mut self.slots[i];
            let res = cqe.result();
            let out = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else if (res as usize) < slot.skip + slot.want {
                Err(io::ErrorKind::UnexpectedEof.into())
            } else {
                Ok(&slot.buf.as_slice()[slot.skip..slot.skip + slot.want])
            };
            done(slot.tag, out);
            slot.file = None;
            self.free.push(i as u32);
        }
    }
}

impl Drop for UringReader {
    fn drop(&mut self) {
        // The kernel may still write into the slot buffers: wait for every read.
        while self.in_flight() > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                // Nothing sane is left: leak the buffers rather than free memory the
                // kernel may write.
                std::mem::forget(std::mem::take(&mut self.slots));
                return;
            }
            self.reap(|_, _| {});
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A scratch directory of its own for each file a test makes, removed when the
    /// test ends (passed or not).
    struct Scratch(std::path::PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn file_with(bytes: &[u8]) -> (Scratch, Arc<DiskFile>) {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("hytra-disk-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("f{}", bytes.len()));
        std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
        let f = Arc::new(DiskFile::open(&path, true).unwrap());
        (Scratch(dir), f)
    }

    #[test]
    fn unaligned_reads_return_exact_bytes_direct_or_not() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let (_scratch, f) = file_with(&data);
        let mut scratch = AlignedBuf::new(8192 + 2 * DIRECT_ALIGN);
        for (off, len) in [(0, 512), (1, 17), (4095, 2), (12_345, 7_000), (19_999, 1)] {
            let got = f.read_at(off, len, &mut scratch).unwrap();
            assert_eq!(got, &data[off as usize..off as usize + len], "read {off}+{len}");
        }
        let mut ring = UringReader::new(4, 8192).unwrap();
        let reads = [(0u64, 512usize), (3, 4096), (15_000, 4_999), (8191, 8192)];
        for (tag, &(off, len)) in reads.iter().enumerate() {
            assert!(ring.try_queue(&f, off, len, tag as u64));
        }
        assert!(!ring.try_queue(&f, 0, 8, 9), "a fifth read fits no slot");
        let mut seen = 0;
        while seen < reads.len() {
            ring.wait_one().unwrap();
            ring.reap(|tag, got| {
                let (off, len) = reads[tag as usize];
                assert_eq!(got.unwrap(), &data[off as usize..off as usize + len]);
                seen += 1;
            });
        }
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn aligned_span_covers_the_request() {
        assert_eq!(aligned_span(0, 512), (0, 4096, 0));
        assert_eq!(aligned_span(4095, 2), (0, 8192, 4095));
        assert_eq!(aligned_span(8192, 4096), (8192, 4096, 0));
    }
}
