//! The location cache: (table, key) -> byte offset of the record at its primary, so that
//! a read of a remote record takes one READ instead of an index traversal or an RPC
//! (DrTM+H §5.1, §6.1).
//!
//! One cache per node, shared by its workers without locks: each entry is two words
//! written separately, so a reader can see a torn entry. That is harmless by design: the
//! record header carries its key, and a reader that reaches the wrong record falls back
//! (and the entry is refreshed). The primary node and region key are not stored; they
//! follow from (table, key) and the placement in force. An entry keeps the generation of
//! its partition's placement it was learned under: one learned before the partition's
//! primary moved names an offset in another replica's layout and is not used. Set-associative, bounded in bytes, round-robin eviction per
//! set (deterministic in the simulator). It keeps no counters: shared counters would make
//! every lookup of every thread contend on one cache line (the engine counts per worker).
//!
//! Each table owns a band of sets in proportion to its keys, and a key's set within the
//! band is its block of `WAYS` neighbouring keys, modulo the band: a table whose keys
//! are dense fills its band without a single conflict when the cache is as large as the
//! table, and tables never evict each other. Workloads with composite keys should encode
//! them densely.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::catalog::TableId;

/// Entries per set.
const WAYS: usize = 4;
/// Bytes per entry (two words).
pub const ENTRY_BYTES: u64 = 16;

/// A node's location cache.
pub struct LocationCache {
    /// Per entry: the key, then `table << 56 | generation << 48 | offset_words + 1` (0:
    /// empty).
    words: Box<[AtomicU64]>,
    /// Next way to evict, per set.
    victim: Box<[AtomicU32]>,
    sets: usize,
    /// Per table id: (first set, sets) of its band.
    bands: Vec<(usize, usize)>,
}

impl LocationCache {
    /// A cache of at most `bytes` (0 disables it) for the given tables and their key
    /// counts; each table gets a share of the sets proportional to its keys.
    pub fn new(bytes: u64, tables: &[(TableId, u64)]) -> LocationCache {
        let entries = (bytes / ENTRY_BYTES) as usize;
        let mut sets = entries / WAYS;
        if sets < tables.len() {
            sets = 0; // Too small to give every table a set: no cache at all.
        }
        let total: u64 = tables.iter().map(|&(_, k)| k.max(1)).sum();
        let max_id = tables.iter().map(|(t, _)| usize::from(t.0)).max().unwrap_or(0);
        let mut bands = vec![(0, 0); if sets == 0 { 0 } else { max_id + 1 }];
        let mut next = 0;
        for (i, &(t, keys)) in tables.iter().enumerate() {
            if sets == 0 {
                break;
            }
            // Proportional share, at least one set; the last table takes what is left.
            let share = if i + 1 == tables.len() {
                sets - next
            } else {
                ((sets as u128 * u128::from(keys.max(1)) / u128::from(total)) as usize)
                    .clamp(1, sets - next - (tables.len() - i - 1))
            };
            assert_eq!(bands[usize::from(t.0)], (0, 0), "table {t:?} listed twice");
            bands[usize::from(t.0)] = (next, share);
            next += share;
        }
        LocationCache {
            // Sparse: most bands stay empty, so no huge pages (see `zeroed_words_small_pages`).
            words: hytra_fabric::zeroed_words_small_pages(sets * WAYS * 2),
            victim: hytra_fabric::zeroed_u32s(sets),
            sets,
            bands,
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

    /// The set of (table, key), if the table has a band: neighbouring keys share a set
    /// (and so a cache line), so a dense hot range of keys occupies few lines.
    fn set_of(&self, table: TableId, key: u64) -> Option<usize> {
        let &(first, sets) = self.bands.get(usize::from(table.0))?;
        (sets > 0).then(|| first + ((key / WAYS as u64) % sets as u64) as usize)
    }

    fn tag(table: TableId, generation: u8, offset: u64) -> u64 {
        assert!(table.0 < 256, "table {table:?} beyond the cache's 256");
        assert!(offset % 8 == 0 && offset / 8 + 1 < 1 << 48, "offset {offset} not encodable");
        u64::from(table.0) << 56 | u64::from(generation) << 48 | (offset / 8 + 1)
    }

    /// The cached offset of a record learned under `generation` of its partition's
    /// placement, if any (possibly stale: verify the record's key).
    pub fn get(&self, table: TableId, key: u64, generation: u8) -> Option<u64> {
        let base = self.set_of(table, key)? * WAYS * 2;
        let want = u64::from(table.0) << 8 | u64::from(generation);
        for w in 0..WAYS {
            let i = base + 2 * w;
            if self.words[i].load(Ordering::Acquire) == key {
                let tag = self.words[i + 1].load(Ordering::Acquire);
                if tag != 0 && tag >> 48 == want {
                    return Some(((tag & ((1 << 48) - 1)) - 1) * 8);
                }
            }
        }
        None
    }

    /// Caches a record's offset, learned under `generation` of its partition's placement
    /// (replacing the key's entry, or evicting one).
    pub fn put(&self, table: TableId, key: u64, generation: u8, offset: u64) {
        let Some(set) = self.set_of(table, key) else { return };
        let base = set * WAYS * 2;
        let tag = Self::tag(table, generation, offset);
        let tag_at = |w: usize| self.words[base + 2 * w + 1].load(Ordering::Relaxed);
        // The key's own entry, else an empty way, else a victim in round-robin order.
        let way = (0..WAYS)
            .find(|&w| {
                let t = tag_at(w);
                t != 0
                    && t >> 56 == u64::from(table.0)
                    && self.words[base + 2 * w].load(Ordering::Relaxed) == key
            })
            .or_else(|| (0..WAYS).find(|&w| tag_at(w) == 0))
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
        let Some(set) = self.set_of(table, key) else { return };
        let base = set * WAYS * 2;
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

    const T0: TableId = TableId(0);
    const T1: TableId = TableId(1);
    const T2: TableId = TableId(2);

    #[test]
    fn put_get_forget_and_bounded_size() {
        let c = LocationCache::new(64 * ENTRY_BYTES, &[(T0, 10), (T1, 10), (T2, 10)]);
        assert_eq!(c.bytes(), 64 * ENTRY_BYTES);
        c.put(TableId(1), 5, 0, 4096);
        assert_eq!(c.get(TableId(1), 5, 0), Some(4096));
        assert_eq!(c.get(TableId(2), 5, 0), None, "tables do not alias");
        assert_eq!(c.get(TableId(1), 5, 1), None, "learned under another placement");
        c.put(TableId(1), 5, 1, 8192);
        assert_eq!(c.get(TableId(1), 5, 1), Some(8192), "replaced in place");
        assert_eq!(c.get(TableId(1), 5, 0), None);
        c.forget(TableId(1), 5);
        assert_eq!(c.get(TableId(1), 5, 1), None);
        for k in 0..10_000 {
            c.put(TableId(0), k, 0, k * 8);
        }
        let kept = (0..10_000).filter(|&k| c.get(TableId(0), k, 0) == Some(k * 8)).count();
        // Table 0's band: a third of the 16 sets.
        assert_eq!(kept, 5 * WAYS, "a bounded cache keeps exactly its band");
        assert_eq!(c.get(TableId(7), 1, 0), None, "an unknown table is never cached");
        c.put(TableId(7), 1, 0, 8);
        assert_eq!(c.get(TableId(7), 1, 0), None);
    }

    #[test]
    fn dense_keys_of_several_tables_never_conflict_when_they_fit() {
        // Three tables of different sizes, exactly as many entries as keys.
        let tables = [(T0, 4000), (T1, 1000), (T2, 3000)];
        let c = LocationCache::new(8000 * ENTRY_BYTES, &tables);
        for &(t, keys) in &tables {
            for k in 0..keys {
                c.put(t, k, 0, (k + 1) * 8);
            }
        }
        for &(t, keys) in &tables {
            for k in 0..keys {
                assert_eq!(c.get(t, k, 0), Some((k + 1) * 8), "{t:?}/{k} evicted");
            }
        }
    }

    #[test]
    fn a_disabled_cache_misses_quietly() {
        let c = LocationCache::new(0, &[(T0, 10)]);
        c.put(TableId(0), 1, 0, 8);
        assert_eq!(c.get(TableId(0), 1, 0), None);
        assert!(!c.enabled());
    }
}
