//! Registered memory: regions of 8-byte words that local CPUs and remote peers share.
//!
//! A region is touched only through word-granular atomic accessors. Relaxed loads and
//! stores compile to plain moves, so this costs nothing on x86, yet no `&mut [u8]` ever
//! aliases memory a peer may read or write at the same moment (docs/INVARIANTS.md, M1).
//! Not for: deciding who may access what; protection checks live in [`Region::check`]
//! and are applied by each backend on the target side of an operation.
//!
//! For tests, regions can carry a witness of M6 ([`witness_atomics`]): it remembers, per
//! word, whether CPU or fabric atomics changed it, and panics when the other kind (or a
//! CPU write, T5) changes a word that fabric atomics use.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::constants::WORD;
use crate::endpoint::Pages;
use crate::verbs::AccessError;

/// A registered memory region. Cloning is cheap and shares the memory.
#[derive(Clone)]
pub struct Region {
    ptr: NonNull<AtomicU64>,
    words: usize,
    /// Keeps the memory behind `ptr` alive (a [`Zeroed`] slice here, a UCX mapping
    /// elsewhere).
    _owner: Arc<dyn Send + Sync>,
    /// Per word, which kind of atomic changed it ([`witness_atomics`]); `None` normally.
    witness: Option<Arc<Zeroed<AtomicU32>>>,
    /// Whose memory it is.
    memory: Memory,
}

/// Whose memory a region is.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Memory {
    /// A private allocation of this process: the kernel can drop its pages back to zero.
    Private,
    /// Memory something else maps (UCX), perhaps shared with other processes.
    Foreign,
}

/// Whether regions made from now on carry a witness of M6.
static WITNESS: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while a backend applies a one-sided request's effect (the NIC's side).
    static FABRIC: Cell<bool> = const { Cell::new(false) };
}

/// Witness states of a word (0: no atomic changed it yet).
const CPU_ATOMIC: u32 = 1;
const NIC_ATOMIC: u32 = 2;

/// Makes every region created from now on in this process check docs/INVARIANTS.md M6
/// and T5: a word changed by a fabric atomic is never changed by a CPU atomic or a CPU
/// write, and a word changed by a CPU atomic never by a fabric atomic; a violation
/// panics. For tests of fabrics whose atomics are not coherent (the simulator's NIC
/// profiles): on a coherent fabric the engine mixes the two on purpose. Costs four bytes
/// of (lazily mapped) memory per word and a check per write.
pub fn witness_atomics(on: bool) {
    WITNESS.store(on, Ordering::SeqCst);
}

/// Runs `f` as the fabric: the region changes it makes are the NIC's, not the CPU's.
pub(crate) fn as_fabric<T>(f: impl FnOnce() -> T) -> T {
    /// Restores the thread's state even when `f` panics (a witness that fired).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            FABRIC.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FABRIC.with(|c| c.replace(true)));
    f()
}

// SAFETY: a Region only hands out shared references to `AtomicU64`s, which are Sync, and
// `_owner` keeps the allocation alive for as long as any clone exists.
unsafe impl Send for Region {}
// SAFETY: as above; all mutation goes through atomic operations.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("len_bytes", &self.len_bytes()).finish()
    }
}

impl Region {
    /// A zero-filled region of `len_bytes` (a multiple of 8) owned by this process. Its
    /// pages are mapped on first touch, so untouched parts cost no memory.
    pub fn zeroed(len_bytes: u64) -> Region {
        Region::zeroed_on(len_bytes, Pages::Huge)
    }

    /// As [`Region::zeroed`], backed by `pages`.
    pub fn zeroed_on(len_bytes: u64, pages: Pages) -> Region {
        assert!(len_bytes % WORD == 0, "region length {len_bytes} is not a multiple of 8");
        let words = usize::try_from(len_bytes / WORD).expect("region fits in memory");
        let mem = match pages {
            Pages::Huge => zeroed_words(words),
            Pages::Base => zeroed_words_small_pages(words),
        };
        let ptr = NonNull::new(mem.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        let witness = WITNESS.load(Ordering::SeqCst).then(|| Arc::new(zeroed_u32s(words)));
        Region { ptr, words, _owner: Arc::new(mem), witness, memory: Memory::Private }
    }

    /// Wraps memory that something else allocated and keeps alive (UCX's `ucp_mem_map`).
    ///
    /// # Safety
    /// `ptr` must be 8-byte aligned, valid for reads and writes of `words * 8` bytes for
    /// as long as `owner` lives, and accessed by everyone else only through atomics or by
    /// hardware that behaves like an RNIC's DMA.
    pub unsafe fn from_raw(ptr: NonNull<u64>, words: usize, owner: Arc<dyn Send + Sync>) -> Region {
        Region { ptr: ptr.cast(), words, _owner: owner, witness: None, memory: Memory::Foreign }
    }

    /// The witness's part of an atomic on the word at `offset` (M6).
    fn witness_atomic(&self, offset: u64) {
        let Some(w) = &self.witness else { return };
        let (mine, other, who) = if FABRIC.with(Cell::get) {
            (NIC_ATOMIC, CPU_ATOMIC, "a fabric atomic after CPU atomics")
        } else {
            (CPU_ATOMIC, NIC_ATOMIC, "a CPU atomic after fabric atomics")
        };
        let was = w[(offset / WORD) as usize].swap(mine, Ordering::Relaxed);
        assert!(was != other, "M6 broken: {who} on the word at offset {offset}");
    }

    /// The witness's part of a write of `words` words at `offset`: the CPU must not
    /// write a word that fabric atomics use (T5); the fabric's WRITEs may.
    fn witness_write(&self, offset: u64, words: usize) {
        let Some(w) = &self.witness else { return };
        if FABRIC.with(Cell::get) {
            return;
        }
        let first = (offset / WORD) as usize;
        for (i, s) in w[first..][..words].iter().enumerate() {
            let state = s.load(Ordering::Relaxed);
            assert!(
                state != NIC_ATOMIC,
                "T5 broken: a CPU write to the word at offset {}, which fabric atomics use",
                offset + i as u64 * WORD
            );
        }
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` points to `words` initialised AtomicU64s kept alive by `_owner`
        // (constructor contracts); a dangling pointer is only used with `words == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.words) }
    }

    /// The address of byte `offset`, for backends whose library moves the bytes (UCX).
    /// Only ever written through by DMA-like copies and atomics, as the region's memory
    /// model requires.
    #[cfg_attr(not(feature = "ucx"), allow(dead_code))]
    pub(crate) fn addr_of(&self, offset: u64) -> *mut u8 {
        assert!(offset <= self.len_bytes(), "offset {offset} outside the region");
        // The offset is in bounds (or one past the end), so this stays in the allocation.
        self.ptr.as_ptr().cast::<u8>().wrapping_add(offset as usize)
    }

    /// Length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.words as u64 * WORD
    }

    /// Checks that `[offset, offset + len)` is inside the region and word aligned.
    pub fn check(&self, offset: u64, len: u64) -> Result<(), AccessError> {
        if offset % WORD != 0 || len % WORD != 0 {
            return Err(AccessError::Misaligned);
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len_bytes() => Ok(()),
            _ => Err(AccessError::OutOfBounds),
        }
    }

    fn word(&self, offset: u64) -> &AtomicU64 {
        assert!(offset % WORD == 0, "unaligned word access at {offset}");
        &self.words()[(offset / WORD) as usize]
    }

    /// Loads one word with acquire ordering.
    pub fn load(&self, offset: u64) -> u64 {
        self.word(offset).load(Ordering::Acquire)
    }

    /// Stores one word with release ordering.
    pub fn store(&self, offset: u64, value: u64) {
        self.witness_write(offset, 1);
        self.word(offset).store(value, Ordering::Release)
    }

    /// Compare-and-swap on one word; returns the previous value (equal to `current` iff
    /// the swap happened).
    pub fn cas(&self, offset: u64, current: u64, new: u64) -> u64 {
        self.witness_atomic(offset);
        match self.word(offset).compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(v) | Err(v) => v,
        }
    }

    /// Fetch-and-add on one word (wrapping); returns the previous value.
    pub fn faa(&self, offset: u64, add: u64) -> u64 {
        self.witness_atomic(offset);
        self.word(offset).fetch_add(add, Ordering::AcqRel)
    }

    /// Copies words into `out`. Each word is read atomically but the copy as a whole is
    /// not: a concurrent writer can leave a torn mix, which callers detect (versions or
    /// checksums), exactly as with an RDMA READ. Words are read in address order, each
    /// with acquire ordering, so that a word read later is never older than one read
    /// before it (S3 reads a lock word, then the version behind it; on x86 an acquire
    /// load is a plain move, elsewhere relaxed loads could be reordered).
    pub fn read_words(&self, offset: u64, out: &mut [u64]) {
        let src = &self.words()[(offset / WORD) as usize..][..out.len()];
        for (o, w) in out.iter_mut().zip(src) {
            *o = w.load(Ordering::Acquire);
        }
    }

    /// Writes words from `data` (not atomic as a whole; see [`Region::read_words`]). The
    /// last word is stored with release ordering: a reader that acquires it sees the
    /// rest, which is what "poll the last word of a message" protocols rely on (and what
    /// RNICs provide by writing a message in address order).
    pub fn write_words(&self, offset: u64, data: &[u64]) {
        self.witness_write(offset, data.len());
        let dst = &self.words()[(offset / WORD) as usize..][..data.len()];
        publish(dst, data.iter().copied());
    }

    /// As [`Region::write_words`], `head` then `tail` as one write: for callers that
    /// assemble a write from parts (a record's header and payload), without a buffer to
    /// copy them into first.
    pub fn write_words_parts(&self, offset: u64, head: &[u64], tail: &[u64]) {
        let len = head.len() + tail.len();
        self.witness_write(offset, len);
        let dst = &self.words()[(offset / WORD) as usize..][..len];
        publish(dst, head.iter().chain(tail).copied());
    }

    /// Copies bytes out; `offset` and `out.len()` must be multiples of 8. Words are stored
    /// little-endian, so byte `i` of the region is byte `i % 8` of word `i / 8`.
    pub fn read_bytes(&self, offset: u64, out: &mut [u8]) {
        assert!(offset % WORD == 0 && out.len() % 8 == 0, "unaligned byte read");
        let src = &self.words()[(offset / WORD) as usize..][..out.len() / 8];
        // In address order, each word with acquire ordering (see `read_words`).
        for (chunk, w) in out.chunks_exact_mut(8).zip(src) {
            chunk.copy_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
        }
    }

    /// Copies bytes in; `offset` and `data.len()` must be multiples of 8. The last word
    /// is published with release ordering (see [`Region::write_words`]).
    pub fn write_bytes(&self, offset: u64, data: &[u8]) {
        assert!(offset % WORD == 0 && data.len() % 8 == 0, "unaligned byte write");
        self.witness_write(offset, data.len() / 8);
        let dst = &self.words()[(offset / WORD) as usize..][..data.len() / 8];
        publish(
            dst,
            data.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk"))),
        );
    }

    /// Copies `len` bytes from this region to `dst` (an RDMA data movement). Both ranges
    /// must have been checked.
    /// The last word is published with release ordering (see [`Region::write_words`]).
    pub fn copy_to(&self, offset: u64, dst: &Region, dst_offset: u64, len: u64) {
        let n = (len / WORD) as usize;
        dst.witness_write(dst_offset, n);
        let src = &self.words()[(offset / WORD) as usize..][..n];
        let to = &dst.words()[(dst_offset / WORD) as usize..][..n];
        // Source words in address order, each with acquire ordering (see `read_words`).
        publish(to, src.iter().map(|s| s.load(Ordering::Acquire)));
    }

    /// Bytes of the pages this region spans that are in memory now (touched, and not
    /// given back or swapped out), or `None` where that cannot be told. The first and
    /// last pages may be shared with other allocations. For measuring what a structure
    /// costs.
    pub fn resident_bytes(&self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: sysconf only reads a system constant.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
            let start = self.ptr.as_ptr() as usize;
            let (first, end) =
                (start / page * page, (start + self.words * WORD as usize).next_multiple_of(page));
            let mut vec = vec![0u8; (end - first) / page];
            // SAFETY: mincore only reads the page tables over [first, end), which holds
            // this region's memory (kept mapped by `_owner`), and writes one byte per page
            // into `vec`, which has room for each; it fails, harmlessly, if any of the
            // range is not mapped.
            let done =
                unsafe { libc::mincore(first as *mut libc::c_void, end - first, vec.as_mut_ptr()) };
            (done == 0).then(|| vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * page as u64)
        }
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// Zeroes the whole region, as a host that restarted finds its memory, without
    /// making it resident: the whole pages of a private allocation go back to the kernel
    /// (mapped again, zeroed, on their next touch), where writing zeros would touch every
    /// page of a sparse region. The caller makes sure nothing else accesses the region
    /// meanwhile (the simulator wipes a crashed node's regions between events).
    pub fn wipe(&self) {
        let (start, len) = (self.ptr.as_ptr() as usize, self.words * WORD as usize);
        match self.release_pages(start, len) {
            Some((first, end)) => {
                let word = WORD as usize;
                self.clear(0, (first - start) / word);
                self.clear((end - start) / word, self.words);
            }
            None => self.clear(0, self.words),
        }
        if let Some(w) = &self.witness {
            for s in w.iter() {
                s.store(0, Ordering::Relaxed);
            }
        }
        fence(Ordering::SeqCst);
    }

    /// Gives the whole pages of `[start, start + len)` (this region) back to the kernel,
    /// if the region is a private allocation and the kernel takes them: returns the
    /// range released, now reading zeros.
    #[cfg(target_os = "linux")]
    fn release_pages(&self, start: usize, len: usize) -> Option<(usize, usize)> {
        // SAFETY: sysconf only reads a system constant.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        let (first, end) = (start.next_multiple_of(page), (start + len) / page * page);
        if self.memory != Memory::Private || end <= first {
            return None;
        }
        // SAFETY: [first, end) are whole pages inside this region's private anonymous
        // allocation, which `_owner` keeps alive; the caller guarantees no other access
        // to the region meanwhile, and MADV_DONTNEED makes their next touch read zeros,
        // a valid value of every AtomicU64 in them.
        let done =
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED) };
        (done == 0).then_some((first, end))
    }

    #[cfg(not(target_os = "linux"))]
    fn release_pages(&self, _start: usize, _len: usize) -> Option<(usize, usize)> {
        None
    }

    /// Stores 0 into words `[from, to)`, unchecked by the witness (a wipe resets it).
    fn clear(&self, from: usize, to: usize) {
        for w in &self.words()[from..to] {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Fills `[offset, offset + len)` with zeros.
    pub fn zero(&self, offset: u64, len: u64) {
        self.witness_write(offset, (len / WORD) as usize);
        for w in &self.words()[(offset / WORD) as usize..][..(len / WORD) as usize] {
            w.store(0, Ordering::Relaxed);
        }
        fence(Ordering::Release);
    }
}

/// `n` zeroed atomic words, mapped by the kernel on first touch (see [`Zeroed`]), so a
/// large, mostly untouched cache or table costs only what is used. Large allocations are
/// advised to use huge pages (see [`zeroed_words_small_pages`] for sparse ones).
pub fn zeroed_words(n: usize) -> Zeroed<AtomicU64> {
    let words = Zeroed::<AtomicU64>::new(n);
    advise_pages(words.as_ptr().cast(), words.len() * 8, Backing::Huge);
    words
}

/// As [`zeroed_words`], advised against huge pages: for memory that stays sparse (a
/// cache sized for every key of the cluster), where one 2 MiB page per touched entry
/// would make most of it resident. The advice matters where the host backs all memory
/// with transparent huge pages unless told otherwise (`enabled` set to `always`).
pub fn zeroed_words_small_pages(n: usize) -> Zeroed<AtomicU64> {
    let words = Zeroed::<AtomicU64>::new(n);
    advise_pages(words.as_ptr().cast(), words.len() * 8, Backing::Base);
    words
}

/// `n` zeroed 32-bit atomics, mapped on first touch as [`zeroed_words`].
pub fn zeroed_u32s(n: usize) -> Zeroed<AtomicU32> {
    Zeroed::new(n)
}

mod sealed {
    /// Types whose all-zero bytes are a valid value.
    pub trait ZeroValid {}
    impl ZeroValid for std::sync::atomic::AtomicU64 {}
    impl ZeroValid for std::sync::atomic::AtomicU32 {}
}

/// A zero-filled slice of atomics.
///
/// Large ones (`MAP_FROM` bytes or more) are anonymous mappings of their own, which the
/// kernel fills with zeroed pages on first touch and takes back whole when dropped. The
/// C allocator serves requests below its mapping threshold (adaptive up to 32 MiB; 1 MiB
/// under `heap::map_large_allocations`) from the heap, and `calloc` clears heap memory
/// that earlier allocations dirtied: every page of such a region was written, and made
/// resident, before a run touched any. Small ones still come from the heap.
pub struct Zeroed<T: sealed::ZeroValid> {
    storage: Storage<T>,
}

/// Where a [`Zeroed`] slice lives.
enum Storage<T> {
    /// Small: an ordinary zeroing allocation.
    Heap(Box<[T]>),
    /// Large: an anonymous private mapping of `bytes` bytes holding `len` elements.
    Mapped { ptr: NonNull<T>, len: usize, bytes: usize },
}

// SAFETY: a `Zeroed` owns its memory exclusively and only hands out `&[T]`; with T an
// atomic (the only `ZeroValid` types), `&[T]` may cross and be shared between threads.
unsafe impl<T: sealed::ZeroValid + Sync> Send for Zeroed<T> {}
// SAFETY: as above.
unsafe impl<T: sealed::ZeroValid + Sync> Sync for Zeroed<T> {}

impl<T: sealed::ZeroValid> Zeroed<T> {
    /// Below this many bytes the heap serves: a mapping costs a system call and whole
    /// pages, and small slices (rings, per-worker state) are many. Above it, regions of
    /// a few hundred kilobytes were the ones the heap cleared (§35 of PERFORMANCE.md).
    const MAP_FROM: usize = 256 << 10;

    fn new(len: usize) -> Zeroed<T> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("allocation size overflows");
        if bytes >= Self::MAP_FROM {
            if let Some(ptr) = map_anonymous(bytes) {
                return Zeroed { storage: Storage::Mapped { ptr: ptr.cast(), len, bytes } };
            }
        }
        Zeroed { storage: Storage::Heap(heap_zeroed(len)) }
    }
}

impl<T: sealed::ZeroValid> std::ops::Deref for Zeroed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.storage {
            Storage::Heap(b) => b,
            // SAFETY: the mapping holds `len` elements (`bytes >= len * size_of::<T>()`),
            // is page-aligned (so aligned for T), lives until `self` drops, and reads as
            // zeros until written, a valid T (`ZeroValid`); all writes go through `&T`
            // atomics, so sharing it as `&[T]` aliases nothing mutably.
            Storage::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: sealed::ZeroValid> Drop for Zeroed<T> {
    fn drop(&mut self) {
        if let Storage::Mapped { ptr, bytes, .. } = self.storage {
            unmap(ptr.cast(), bytes);
        }
    }
}

/// A zeroed heap slice of `len` elements.
fn heap_zeroed<T: sealed::ZeroValid>(len: usize) -> Box<[T]> {
    let layout = std::alloc::Layout::array::<T>(len).expect("allocation size overflows");
    if layout.size() == 0 {
        return Vec::new().into_boxed_slice();
    }
    // SAFETY: the layout has a non-zero size (no `ZeroValid` type is zero-sized, so
    // `len > 0`); zeroed memory is a valid [T; len] (`ZeroValid`), and Box frees it with
    // the same layout (that of `[T]` of `len`).
    unsafe {
        let raw = std::alloc::alloc_zeroed(layout).cast::<T>();
        if raw.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(raw, len))
    }
}

#[cfg(unix)]
fn map_anonymous(bytes: usize) -> Option<NonNull<u8>> {
    // SAFETY: a fresh anonymous private mapping touches no existing memory; the kernel
    // chooses the address and fills it with zeros on first touch.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then(|| NonNull::new(p.cast())).flatten()
}

#[cfg(not(unix))]
fn map_anonymous(_bytes: usize) -> Option<NonNull<u8>> {
    None
}

#[cfg(unix)]
fn unmap(ptr: NonNull<u8>, bytes: usize) {
    // SAFETY: [ptr, ptr + bytes) is exactly one mapping made by `map_anonymous` and
    // owned by the `Zeroed` being dropped, so nothing refers to it any more.
    let done = unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
    // Only an invalid range fails, which the SAFETY argument rules out; a release build
    // in a destructor has nothing better to do than leak it.
    debug_assert_eq!(done, 0, "munmap of an owned mapping failed");
}

#[cfg(not(unix))]
fn unmap(_ptr: NonNull<u8>, _bytes: usize) {
    unreachable!("no mappings are made off unix");
}

/// How the kernel should back a large allocation.
#[derive(Copy, Clone)]
enum Backing {
    /// Transparent huge pages (fewer TLB misses where the memory is touched densely).
    Huge,
    /// Base pages only (each touched spot makes 4 KiB resident, not 2 MiB).
    Base,
}

/// Asks the kernel to back a large allocation as `backing` says. Huge pages where the
/// memory is dense: tables, indexes and caches of millions of records are read at
/// random, and with 4 KiB pages nearly every access misses the TLB (and the first touch
/// of every page faults). Base pages where it is sparse, even on a host that would
/// otherwise use huge pages everywhere. Small allocations are left alone (a huge page
/// would cost 2 MiB where 4 KiB do).
fn advise_pages(start: *const u8, len: usize, backing: Backing) {
    const HUGE: usize = 2 << 20;
    #[cfg(target_os = "linux")]
    {
        if len < 4 * HUGE {
            return;
        }
        let first = (start as usize).next_multiple_of(HUGE);
        let end = (start as usize + len) / HUGE * HUGE;
        let advice = match backing {
            Backing::Huge => libc::MADV_HUGEPAGE,
            Backing::Base => libc::MADV_NOHUGEPAGE,
        };
        if end > first {
            // SAFETY: [first, end) lies inside the live allocation [start, start + len)
            // that the caller owns; MADV_HUGEPAGE and MADV_NOHUGEPAGE only change how the
            // kernel backs the pages (contents are preserved, zero pages stay zero), and a
            // failure (no transparent huge pages) is harmless, so the result is ignored.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, advice);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len, HUGE, backing);
}

/// Stores `values` into `dst` in address order, the last one with release ordering after
/// a release fence, so that everything before it is visible to whoever acquires it.
fn publish(dst: &[AtomicU64], values: impl Iterator<Item = u64>) {
    let last = dst.len().saturating_sub(1);
    fence(Ordering::Release);
    for (i, (w, v)) in dst.iter().zip(values).enumerate() {
        if i == last {
            w.store(v, Ordering::Release);
        } else {
            w.store(v, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_little_endian() {
        let r = Region::zeroed(64);
        r.write_bytes(8, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(r.load(8), u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
        let mut out = [0u8; 16];
        r.read_bytes(8, &mut out);
        assert_eq!(out[15], 16);
        let other = Region::zeroed(32);
        r.copy_to(8, &other, 16, 16);
        assert_eq!(other.load(24), r.load(16));
    }

    #[test]
    fn a_wiped_region_reads_zeros_everywhere_and_takes_writes_again() {
        for len in [64u64, 3 * 4096 + 24, 8 << 20] {
            let r = Region::zeroed_on(len, Pages::Base);
            let spots: Vec<u64> = [0, 8, 4088, 4096, len / 2 / 8 * 8, len - 8]
                .into_iter()
                .filter(|&at| at < len)
                .collect();
            for &at in &spots {
                r.store(at, at + 1);
            }
            r.wipe();
            for &at in &spots {
                assert_eq!(r.load(at), 0, "{len} bytes: word at {at} survived the wipe");
            }
            r.store(len - 8, 5);
            assert_eq!(r.faa(len - 8, 1), 5);
        }
    }

    #[test]
    fn zeroed_memory_reads_zeros_and_large_slices_are_mappings_of_their_own() {
        for n in [0usize, 1, 1000, (256 << 10) / 8, 3 << 20] {
            let w = zeroed_words(n);
            assert_eq!(w.len(), n);
            let mapped = matches!(w.storage, Storage::Mapped { .. });
            assert_eq!(mapped, cfg!(unix) && n * 8 >= Zeroed::<AtomicU64>::MAP_FROM, "{n} words");
            let spots: Vec<usize> =
                [0, n / 2, n.saturating_sub(1)].into_iter().filter(|&at| at < n).collect();
            assert!(spots.iter().all(|&at| w[at].load(Ordering::Relaxed) == 0));
            for &at in &spots {
                w[at].store(at as u64 + 1, Ordering::Relaxed);
            }
            assert!(spots.iter().all(|&at| w[at].load(Ordering::Relaxed) == at as u64 + 1));
            let h = zeroed_u32s(n);
            assert!(h.iter().step_by(4099).all(|x| x.load(Ordering::Relaxed) == 0));
        }
    }

    #[test]
    fn resident_bytes_count_the_pages_touched() {
        let r = Region::zeroed_on(64 << 20, Pages::Base);
        let before = r.resident_bytes();
        if cfg!(target_os = "linux") {
            assert_eq!(before, Some(0), "a fresh mapping holds nothing");
        }
        for at in [0u64, 8 << 20, 40 << 20] {
            r.store(at, 1);
        }
        if let Some(bytes) = r.resident_bytes() {
            assert!((3 * 4096..=3 * (64 << 10)).contains(&bytes), "{bytes} bytes resident");
        }
    }

    #[test]
    fn a_write_from_parts_lands_in_order() {
        let r = Region::zeroed(64);
        r.write_words_parts(8, &[1, 2], &[3]);
        assert_eq!((r.load(0), r.load(8), r.load(16), r.load(24), r.load(32)), (0, 1, 2, 3, 0));
        r.write_words_parts(32, &[], &[4, 5]);
        assert_eq!((r.load(24), r.load(32), r.load(40), r.load(48)), (3, 4, 5, 0));
    }

    #[test]
    fn check_rejects_outside_and_unaligned() {
        let r = Region::zeroed(64);
        assert_eq!(r.check(0, 64), Ok(()));
        assert_eq!(r.check(8, 64), Err(AccessError::OutOfBounds));
        assert_eq!(r.check(4, 8), Err(AccessError::Misaligned));
        assert_eq!(r.check(u64::MAX - 7, 16), Err(AccessError::OutOfBounds));
    }

    #[test]
    fn atomics_return_previous_value() {
        let r = Region::zeroed(16);
        assert_eq!(r.cas(8, 0, 5), 0);
        assert_eq!(r.cas(8, 0, 6), 5);
        assert_eq!(r.faa(8, 3), 5);
        assert_eq!(r.load(8), 8);
    }
}
