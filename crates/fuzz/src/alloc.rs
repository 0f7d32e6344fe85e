//! A counting wrapper around the system allocator: how the fuzzer sees the memory one
//! execution asks for (its largest single allocation and its peak of live bytes), so that
//! a decoder that trusts a length from its input fails the run instead of passing while
//! it reserves gigabytes.
//!
//! The counters are per thread, so executions on several test threads do not mix. The
//! wrapper counts only where a program installs it as its `#[global_allocator]` (the
//! `hytra-fuzz` binary and this crate's tests do); [`installed`] tells whether it is.
//! Not for: limiting the memory of anything but a fuzzed execution.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;

/// Bytes above which an allocation requested during an execution is refused outright
/// (and the process stops with a report), rather than handed to the system: far above
/// any execution's bound ([`crate::ALLOC_BYTES_MAX`]), so every allocation a bound can
/// judge is still made and measured, while one that could exhaust the machine is not.
pub const REFUSE_BYTES: usize = 1 << 32;

const _: () = assert!(REFUSE_BYTES as u64 > crate::ALLOC_BYTES_MAX);

thread_local! {
    /// Whether this thread is inside an execution ([`measure`]).
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated minus bytes freed on this thread since the execution started.
    static LIVE: Cell<i64> = const { Cell::new(0) };
    /// Highest `LIVE` seen.
    static PEAK: Cell<i64> = const { Cell::new(0) };
    /// Largest single allocation.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    /// The execution's input and what names it, for the report of a refused allocation:
    /// (input address, input length, execution index).
    static CONTEXT: Cell<(usize, usize, u64)> = const { Cell::new((0, 0, 0)) };
}

/// The counting allocator; install it with
/// `#[global_allocator] static ALLOC: CountingAlloc = CountingAlloc;`.
pub struct CountingAlloc;

/// What one execution allocated.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// The largest single allocation, in bytes.
    pub largest_bytes: u64,
    /// The most bytes live at once (allocated during the execution and not yet freed).
    pub peak_live_bytes: u64,
}

fn note_alloc(size: usize) {
    // `try_with`: a thread being torn down has no counters left, and is not measured.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    let _ = LIVE.try_with(|live| {
        let now = live.get() + size as i64;
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn note_free(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get() - size as i64));
}

/// Whether an allocation of `size` bytes must be refused: only inside an execution.
/// Refusing stops the process (the standard library aborts on a failed allocation), so
/// the report is written first, from the input [`measure`] recorded.
fn refuse(size: usize) -> bool {
    if size <= REFUSE_BYTES || !MEASURING.try_with(Cell::get).unwrap_or(false) {
        return false;
    }
    let (addr, len, index) = CONTEXT.try_with(Cell::get).unwrap_or((0, 0, 0));
    // Written with a stack buffer: nothing here may allocate.
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "FAIL: execution {index} asked for one allocation of {size} bytes (refused; the \
         process stops); input ({len} bytes, hex): "
    );
    if addr != 0 {
        // SAFETY: `measure` recorded the address and length of the input slice it was
        // given, and that slice is borrowed for the whole execution, during which this
        // allocation is requested; the bytes are only read.
        let input = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        let mut hex = [0u8; 128];
        for chunk in input.chunks(hex.len() / 2) {
            for (i, b) in chunk.iter().enumerate() {
                hex[2 * i] = b"0123456789abcdef"[usize::from(b >> 4)];
                hex[2 * i + 1] = b"0123456789abcdef"[usize::from(b & 15)];
            }
            let _ = err.write_all(&hex[..2 * chunk.len()]);
        }
    }
    let _ = writeln!(err, "\nreplay it with: hytra-fuzz --target NAME --input HEX");
    true
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged and
// returns what `System` returned (or null, which `GlobalAlloc` allows for a failed
// allocation); the bookkeeping only touches thread-local cells of plain integers, which
// neither allocate nor unwind.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if refuse(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller upholds `alloc`'s contract for `layout`; passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if refuse(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller upholds `alloc_zeroed`'s contract for `layout`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_free(layout.size());
        // SAFETY: the caller passes a block this allocator (that is, `System`) returned
        // for `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if refuse(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller passes a block `System` returned for `layout` and a valid
        // new size; passed on as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note_free(layout.size());
            note_alloc(new_size);
        }
        p
    }
}

/// Runs `f` as one execution on `input` (execution `index`) and returns what it
/// allocated on this thread.
pub fn measure<R>(input: &[u8], index: u64, f: impl FnOnce() -> R) -> (R, Usage) {
    LIVE.set(0);
    PEAK.set(0);
    LARGEST.set(0);
    CONTEXT.set((input.as_ptr() as usize, input.len(), index));
    MEASURING.set(true);
    let out = f();
    MEASURING.set(false);
    CONTEXT.set((0, 0, 0));
    let usage =
        Usage { largest_bytes: LARGEST.get() as u64, peak_live_bytes: PEAK.get().max(0) as u64 };
    (out, usage)
}

/// Whether the counting allocator is this program's global allocator.
pub fn installed() -> bool {
    let (_, usage) = measure(&[], 0, || std::hint::black_box(vec![0u8; 4096]));
    usage.largest_bytes >= 4096
}
