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
//!
//! A warm start (every record's address, as after a long run) is nearly the same for
//! every node of a process, so it is built once as an image that the nodes' caches share
//! read-only. The image may hold entries a node's own warm start would not (the records
//! of its own partitions, which it never looks up): a node copies a set into its own
//! entries the first time it changes it (copy on write, per set), leaving those out and
//! keeping the others in their order, so the set is then exactly what its own warm start
//! would have put there, provided the image evicted nothing. A process simulating
//! sixteen nodes holds one warm image instead of sixteen. Two threads changing the same
//! untouched set at once may lose one change (one copies the image over the other's
//! entry): a lost entry is a later miss, never a wrong answer.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::catalog::TableId;

/// Entries per set.
const WAYS: usize = 4;
/// Bytes per entry (two words).
pub const ENTRY_BYTES: u64 = 16;

/// Which entries of a warm image a cache leaves out when it copies a set: (table, key)
/// of the records its own warm start would not have cached.
pub type Foreign = Box<dyn Fn(TableId, u64) -> bool + Send + Sync>;

/// A shared warm image and what of it is not this cache's.
struct Start {
    /// Shared, never written after it was installed.
    image: Arc<LocationCache>,
    foreign: Foreign,
}

/// A node's location cache.
pub struct LocationCache {
    /// Per entry: the key, then `table << 56 | generation << 48 | offset_words + 1` (0:
    /// empty). With an image, only the sets marked in `own` are this cache's.
    words: hytra_fabric::Zeroed<AtomicU64>,
    /// The warm image this cache started from, if any.
    image: OnceLock<Start>,
    /// One bit per set: its entries are in `words` (copied from the image on the first
    /// change); clear: the image's are this cache's.
    own: hytra_fabric::Zeroed<AtomicU64>,
    /// Sets marked in `own`: while none is, a lookup goes straight to the image without
    /// reading `own` (one cache miss fewer per lookup at a large cluster's size).
    owned: AtomicUsize,
    /// Next way to evict, per set.
    victim: hytra_fabric::Zeroed<AtomicU32>,
    /// Entries evicted so far.
    evicted: AtomicU64,
    sets: usize,
    /// Per table id: (first set, sets) of its band.
    bands: Vec<(usize, usize)>,
}

/// The sets of a cache of at most `bytes` for `tables`, and per table id its band (first
/// set, sets): a share of the sets proportional to its keys.
fn layout(bytes: u64, tables: &[(TableId, u64)]) -> (usize, Vec<(usize, usize)>) {
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
    (sets, bands)
}

impl LocationCache {
    /// A cache of at most `bytes` (0 disables it) for the given tables and their key
    /// counts; each table gets a share of the sets proportional to its keys.
    pub fn new(bytes: u64, tables: &[(TableId, u64)]) -> LocationCache {
        let (sets, bands) = layout(bytes, tables);
        LocationCache {
            // Sparse: most bands stay empty, so no huge pages (see `zeroed_words_small_pages`).
            words: hytra_fabric::zeroed_words_small_pages(sets * WAYS * 2),
            image: OnceLock::new(),
            own: hytra_fabric::zeroed_words_small_pages(sets.div_ceil(64)),
            owned: AtomicUsize::new(0),
            victim: hytra_fabric::zeroed_u32s(sets),
            evicted: AtomicU64::new(0),
            sets,
            bands,
        }
    }

    /// Whether a cache of `bytes` for `tables` gives every table a set per block of
    /// `WAYS` keys: one whose tables' keys are dense then never evicts, so a warm image
    /// of it is whole.
    pub fn holds_every_key(bytes: u64, tables: &[(TableId, u64)]) -> bool {
        let (sets, bands) = layout(bytes, tables);
        sets > 0
            && tables.iter().all(|&(t, keys)| {
                let (_, share) = bands[usize::from(t.0)];
                share as u64 >= keys.div_ceil(WAYS as u64)
            })
    }

    /// An empty cache of the same size and bands, to fill as a warm image.
    pub fn blank(&self) -> LocationCache {
        LocationCache {
            words: hytra_fabric::zeroed_words_small_pages(self.words.len()),
            image: OnceLock::new(),
            own: hytra_fabric::zeroed_words_small_pages(self.own.len()),
            owned: AtomicUsize::new(0),
            victim: hytra_fabric::zeroed_u32s(self.sets),
            evicted: AtomicU64::new(0),
            sets: self.sets,
            bands: self.bands.clone(),
        }
    }

    /// Entries evicted to make room so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Starts this cache from `image` (filled through [`LocationCache::blank`] of a cache
    /// like this one): its entries read as this cache's, but for the `foreign` ones,
    /// which this cache must never look up, until a set is changed. Once, before
    /// anything was put into this cache (its own entries would be hidden).
    pub fn start_from(&self, image: Arc<LocationCache>, foreign: Foreign) {
        assert!(
            image.sets == self.sets && image.bands == self.bands,
            "a cache image of another geometry"
        );
        assert!(image.image.get().is_none(), "an image must hold its own entries");
        assert!(self.image.set(Start { image, foreign }).is_ok(), "the cache already has an image");
    }

    /// The words holding set `set`'s entries now: the image's until this cache owns it.
    fn set_words(&self, set: usize) -> &[AtomicU64] {
        let range = set * WAYS * 2..(set + 1) * WAYS * 2;
        match self.image.get() {
            Some(start) if !self.owns(set) => &start.image.words[range],
            _ => &self.words[range],
        }
    }

    fn owns(&self, set: usize) -> bool {
        self.owned.load(Ordering::Acquire) > 0
            && self.own[set / 64].load(Ordering::Acquire) & (1 << (set % 64)) != 0
    }

    /// The words of set `set`, to change: copied from the image first if it has one and
    /// this cache does not own the set yet.
    fn set_words_mut(&self, set: usize) -> &[AtomicU64] {
        let range = set * WAYS * 2..(set + 1) * WAYS * 2;
        if let Some(start) = self.image.get() {
            if !self.owns(set) {
                // The image's entries but the foreign ones, in their order from way 0: as
                // this cache's own warm start would have filled the set.
                let theirs = &start.image.words[range.clone()];
                let mine = &self.words[range.clone()];
                let mut to = 0;
                for w in 0..WAYS {
                    let key = theirs[2 * w].load(Ordering::Relaxed);
                    let tag = theirs[2 * w + 1].load(Ordering::Relaxed);
                    if tag == 0 || (start.foreign)(TableId((tag >> 56) as u16), key) {
                        continue;
                    }
                    mine[2 * to].store(key, Ordering::Relaxed);
                    mine[2 * to + 1].store(tag, Ordering::Relaxed);
                    to += 1;
                }
                // Release: a reader that sees the bit (and the count) sees the copied
                // entries.
                let bit = 1 << (set % 64);
                if self.own[set / 64].fetch_or(bit, Ordering::Release) & bit == 0 {
                    self.owned.fetch_add(1, Ordering::Release);
                }
            }
        }
        &self.words[range]
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
        let words = self.set_words(self.set_of(table, key)?);
        let want = u64::from(table.0) << 8 | u64::from(generation);
        for w in 0..WAYS {
            let i = 2 * w;
            if words[i].load(Ordering::Acquire) == key {
                let tag = words[i + 1].load(Ordering::Acquire);
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
        let tag = Self::tag(table, generation, offset);
        let words = self.set_words_mut(set);
        let tag_at = |w: usize| words[2 * w + 1].load(Ordering::Relaxed);
        // The key's own entry, else an empty way, else a victim in round-robin order.
        let way = (0..WAYS)
            .find(|&w| {
                let t = tag_at(w);
                t != 0
                    && t >> 56 == u64::from(table.0)
                    && words[2 * w].load(Ordering::Relaxed) == key
            })
            .or_else(|| (0..WAYS).find(|&w| tag_at(w) == 0))
            .unwrap_or_else(|| {
                self.evicted.fetch_add(1, Ordering::Relaxed);
                self.victim[set].fetch_add(1, Ordering::Relaxed) as usize % WAYS
            });
        let i = 2 * way;
        // Invalidate, then fill: a concurrent reader sees the old entry, none, or the new
        // one, or a torn mix that the record's key check rejects.
        words[i + 1].store(0, Ordering::Release);
        words[i].store(key, Ordering::Release);
        words[i + 1].store(tag, Ordering::Release);
    }

    /// Drops a key's entry (after it led to the wrong record).
    pub fn forget(&self, table: TableId, key: u64) {
        let Some(set) = self.set_of(table, key) else { return };
        if !self.set_words(set).iter().step_by(2).any(|k| k.load(Ordering::Relaxed) == key) {
            return;
        }
        let words = self.set_words_mut(set);
        for w in 0..WAYS {
            if words[2 * w].load(Ordering::Relaxed) == key {
                words[2 * w + 1].store(0, Ordering::Release);
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
    fn a_cache_holds_every_key_only_with_a_set_for_every_block_of_each_table() {
        // As many entries as keys, but 9 keys get 2 sets of 4: key 8 evicts one.
        let tables = [(T0, 9), (T1, 1000)];
        let fill = |bytes: u64| {
            let c = LocationCache::new(bytes, &tables);
            for &(t, keys) in &tables {
                (0..keys).for_each(|k| c.put(t, k, 0, k * 8));
            }
            c.evicted()
        };
        let tight = 1009 * ENTRY_BYTES;
        assert!(!LocationCache::holds_every_key(tight, &tables));
        assert!(fill(tight) > 0);
        let roomy = 2 * tight;
        assert!(LocationCache::holds_every_key(roomy, &tables));
        assert_eq!(fill(roomy), 0);
        assert!(!LocationCache::holds_every_key(0, &tables), "no cache holds nothing");
    }

    #[test]
    fn caches_started_from_one_image_change_apart() {
        let tables = [(T0, 64), (T1, 64)];
        let a = LocationCache::new(128 * ENTRY_BYTES, &tables);
        let b = LocationCache::new(128 * ENTRY_BYTES, &tables);
        let image = a.blank();
        for k in 0..64 {
            image.put(T0, k, 0, (k + 1) * 8);
        }
        let image = Arc::new(image);
        // Key 4 is a's own record: a never looks it up, and its copy of the set drops it.
        a.start_from(image.clone(), Box::new(|t, k| t == T0 && k == 4));
        b.start_from(image.clone(), Box::new(|_, _| false));
        assert_eq!(a.get(T0, 5, 0), Some(48), "the image's entries are every cache's");
        a.put(T0, 5, 1, 4096);
        a.forget(T0, 6);
        a.put(T1, 9, 0, 800);
        assert_eq!(a.get(T0, 5, 1), Some(4096));
        assert_eq!(a.get(T0, 6, 0), None);
        assert_eq!(a.get(T0, 7, 0), Some(64), "the rest of a copied set stays");
        assert_eq!(a.get(T0, 4, 0), None, "a foreign entry is left out of the copy");
        assert_eq!(b.get(T0, 4, 0), Some(40));
        assert_eq!(a.get(T1, 9, 0), Some(800));
        assert_eq!(b.get(T0, 5, 0), Some(48), "a change stays in its cache");
        assert_eq!(b.get(T0, 6, 0), Some(56));
        assert_eq!(b.get(T1, 9, 0), None);
        assert_eq!(image.get(T0, 5, 0), Some(48), "the image is never written");
        let c = LocationCache::new(64 * ENTRY_BYTES, &tables);
        let start = std::panic::AssertUnwindSafe(|| c.start_from(image, Box::new(|_, _| false)));
        let refused = std::panic::catch_unwind(start);
        assert!(refused.is_err(), "an image of another size is refused");
    }

    #[test]
    fn a_copied_set_is_what_the_nodes_own_warm_start_would_hold() {
        // Keys 4..8 share a set, and so do 68, 132, ... (16 sets in table 0's band). The
        // node's own warm start skips its key 4; started from the shared image instead, it
        // must fill and evict exactly as that one would, whatever comes next.
        let tables = [(T0, 64), (T1, 64)];
        let own = LocationCache::new(128 * ENTRY_BYTES, &tables);
        let shared = LocationCache::new(128 * ENTRY_BYTES, &tables);
        let image = shared.blank();
        for k in 4..8 {
            image.put(T0, k, 0, k * 8);
            if k != 4 {
                own.put(T0, k, 0, k * 8);
            }
        }
        shared.start_from(Arc::new(image), Box::new(|_, k| k == 4));
        for k in [68, 132, 196, 6, 260, 324] {
            own.put(T0, k, 0, k * 8 + 8);
            shared.put(T0, k, 0, k * 8 + 8);
        }
        for k in [4, 5, 6, 7, 68, 132, 196, 260, 324] {
            assert_eq!(shared.get(T0, k, 0), own.get(T0, k, 0), "key {k}");
        }
        assert_eq!(shared.evicted(), own.evicted());
        assert!(own.evicted() > 0, "the sequence evicts");
    }

    #[test]
    fn a_disabled_cache_misses_quietly() {
        let c = LocationCache::new(0, &[(T0, 10)]);
        c.put(TableId(0), 1, 0, 8);
        assert_eq!(c.get(TableId(0), 1, 0), None);
        assert!(!c.enabled());
    }
}
