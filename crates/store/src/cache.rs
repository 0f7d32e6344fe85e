//! The location cache: (table, key) -> byte offset of the record at its primary, so that
//! a read of a remote record takes one READ instead of an index traversal or an RPC
//! (DrTM+H §5.1, §6.1).
//!
//! One cache per node, shared by its workers without locks: each entry is two words
//! written separately, so a reader can see a torn entry. That is harmless by design: the
//! record header carries its key, and a reader that reaches the wrong record falls back
//! (and the entry is refreshed). The primary node and region key are not stored; they
//! follow from (table, key). Set-associative, bounded in bytes, round-robin eviction per
//! set (deterministic in the simulator). It keeps no counters: shared counters would make
//! every lookup of every thread contend on one cache line (the engine counts per worker).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::catalog::TableId;

/// Entries per set.
const WAYS: usize = 4;
/// Bytes per entry (two words).
pub const ENTRY_BYTES: u64 = 16;

/// A node's location cache.
pub struct LocationCache {
    /// Per entry: the key, then `table << 48 | offset_words + 1` (0: empty).
    words: Box<[AtomicU64]>,
    /// Next way to evict, per set.
    victim: Box<[AtomicU32]>,
    sets: usize,
}

impl LocationCache {
    /// A cache of at most `bytes` (0 disables it).
    pub fn new(bytes: u64) -> LocationCache {
        let entries = (bytes / ENTRY_BYTES) as usize;
        let sets = entries / WAYS;
        LocationCache {
            words: hytra_fabric::zeroed_words(sets * WAYS * 2),
            victim: (0..sets).map(|_| AtomicU32::new(0)).collect(),
            sets,
        }
    }

    /// Whether the cache holds anything at all.
    pub fn enabled(&self) -> bool {
        self.sets > 0
    }

    /// Bytes used by entries.
    pub fn bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// The set of (table, key): neighbouring keys of a table share a set (and so a cache
    /// line), so a dense hot range of keys occupies few lines instead of one each;
    /// tables start at far-apart sets.
    fn set_of(&self, table: TableId, key: u64) -> usize {
        let start = u64::from(table.0).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
        ((key / WAYS as u64).wrapping_add(start) % self.sets as u64) as usize
    }

    fn tag(table: TableId, offset: u64) -> u64 {
        assert!(offset % 8 == 0 && offset / 8 + 1 < 1 << 48, "offset {offset} not encodable");
        u64::from(table.0) << 48 | (offset / 8 + 1)
    }

    /// The cached offset of a record, if any (possibly stale: verify the record's key).
    pub fn get(&self, table: TableId, key: u64) -> Option<u64> {
        if !self.enabled() {
            return None;
        }
        let base = self.set_of(table, key) * WAYS * 2;
        for w in 0..WAYS {
            let i = base + 2 * w;
            if self.words[i].load(Ordering::Acquire) == key {
                let tag = self.words[i + 1].load(Ordering::Acquire);
                if tag != 0 && tag >> 48 == u64::from(table.0) {
                    return Some(((tag & ((1 << 48) - 1)) - 1) * 8);
                }
            }
        }
        None
    }

    /// Caches a record's offset (replacing the key's entry, or evicting one).
    pub fn put(&self, table: TableId, key: u64, offset: u64) {
        if !self.enabled() {
            return;
        }
        let set = self.set_of(table, key);
        let base = set * WAYS * 2;
        let tag = Self::tag(table, offset);
        let way = (0..WAYS)
            .find(|&w| {
                let i = base + 2 * w;
                self.words[i].load(Ordering::Relaxed) == key
                    && self.words[i + 1].load(Ordering::Relaxed) >> 48 == u64::from(table.0)
            })
            .unwrap_or_else(|| self.victim[set].fetch_add(1, Ordering::Relaxed) as usize % WAYS);
        let i = base + 2 * way;
        // Invalidate, then fill: a concurrent reader sees the old entry, none, or the new
        // one, or a torn mix that the record's key check rejects.
        self.words[i + 1].store(0, Ordering::Release);
        self.words[i].store(key, Ordering::Release);
        self.words[i + 1].store(tag, Ordering::Release);
    }

    /// Drops a key's entry (after it led to the wrong record).
    pub fn forget(&self, table: TableId, key: u64) {
        if !self.enabled() {
            return;
        }
        let base = self.set_of(table, key) * WAYS * 2;
        for w in 0..WAYS {
            if self.words[base + 2 * w].load(Ordering::Relaxed) == key {
                self.words[base + 2 * w + 1].store(0, Ordering::Release);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_forget_and_bounded_size() {
        let c = LocationCache::new(64 * ENTRY_BYTES);
        assert_eq!(c.bytes(), 64 * ENTRY_BYTES);
        c.put(TableId(1), 5, 4096);
        assert_eq!(c.get(TableId(1), 5), Some(4096));
        assert_eq!(c.get(TableId(2), 5), None, "tables do not alias");
        c.put(TableId(1), 5, 8192);
        assert_eq!(c.get(TableId(1), 5), Some(8192), "replaced in place");
        c.forget(TableId(1), 5);
        assert_eq!(c.get(TableId(1), 5), None);
        for k in 0..10_000 {
            c.put(TableId(0), k, k * 8);
        }
        let kept = (0..10_000).filter(|&k| c.get(TableId(0), k) == Some(k * 8)).count();
        assert!((32..=64).contains(&kept), "a bounded cache keeps about its capacity: {kept}");
    }

    #[test]
    fn a_disabled_cache_misses_quietly() {
        let c = LocationCache::new(0);
        c.put(TableId(0), 1, 8);
        assert_eq!(c.get(TableId(0), 1), None);
        assert!(!c.enabled());
    }
}
