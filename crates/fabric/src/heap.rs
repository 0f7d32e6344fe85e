//! The process's heap for programs that build and drop many large clusters in turn
//! (`hytra reproduce`): every run builds gigabytes of tables, indexes and caches and drops
//! them, hundreds of times in one process. Not for: a single run, which keeps the
//! allocator's defaults.

/// Makes every allocation of 1 MiB or more a mapping of its own, returned to the
/// system when freed. By default glibc raises that threshold (up to 32 MiB) whenever
/// such a block is freed, so later runs' large buffers (histories, logs, results) would
/// come from the heap instead and what a run frees would stay resident for the next.
/// Regions and caches do not depend on it: [`crate::Zeroed`] maps those of 256 KiB or
/// more itself.
pub fn map_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter, before the runs' threads
    // start; a failure leaves glibc's default, which is harmless.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Returns the heap's free pages to the system after a run (what the run's smaller
/// allocations left), so that the next run starts from the live memory only.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe (it locks each arena) and releases only
    // memory that no allocation uses.
    unsafe {
        libc::malloc_trim(0);
    }
}
