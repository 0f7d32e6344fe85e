//! Redo logs on backups: ring buffers, entries, and their application.
//!
//! Every node has one log region holding a ring per coordinator worker of the cluster
//! and, before the rings, one head word per ring. A coordinator appends entries to its
//! ring at a backup (one-sided WRITE, or an RPC whose handler copies them in); an entry
//! carries its length in its first and last word, so a torn or partial entry is never
//! mistaken for a whole one. The backup applies entries lazily, when the coordinator
//! tells it how far its log is committed (RECLAIM), then advances the ring's head word,
//! which the coordinator reads to learn its credit (docs/INVARIANTS.md L1-L4).
//!
//! Entry (words): `LOG | len`, owner, record count, then per record
//! `table << 48 | payload words << 32 | flags`, key, version word, the record's offset at
//! its primary (a hint: replicas loaded alike hold it at the same offset), payload; last,
//! `LOG | len` again. A ring position that cannot fit the next entry holds `SKIP` and the entry
//! starts over at offset 0.

use std::collections::VecDeque;

use hytra_fabric::{Region, Rkey};
use hytra_store::layout::KEY_MAX;
use hytra_store::{NodeStore, TableId};

/// Marks the first and last word of an entry (with its length in words below bit 40).
pub const LOG_MAGIC: u64 = 0x004C_4F47 << 40;
/// Marks the rest of a ring, up to its end, as unused.
pub const SKIP: u64 = 0x0053_4B50 << 40;
const MAGIC_MASK: u64 = !((1 << 40) - 1);

/// Flag of a logged record: the write deletes it.
pub const LOGGED_DELETE: u64 = 1;

/// Largest entry, in words: one entry must travel in one RPC frame (two-sided logging)
/// and fit a ring comfortably. Bigger logs are split into several entries.
pub const ENTRY_WORDS_MAX: usize = 500;

/// Where the rings and head words are in a node's log region.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LogLayout {
    /// The log region's key (the same on every node).
    pub rkey: Rkey,
    /// Bytes per ring.
    pub ring_bytes: u64,
    /// Rings per node: one per worker of the cluster.
    pub rings: u64,
}

impl LogLayout {
    /// Bytes of the head words, rounded to a cache line.
    fn heads_bytes(&self) -> u64 {
        (self.rings * 8).div_ceil(64) * 64
    }

    /// Bytes of a node's log region.
    pub fn region_bytes(&self) -> u64 {
        self.heads_bytes() + self.rings * self.ring_bytes
    }

    /// Offset of coordinator `c`'s head word.
    pub fn head_offset(&self, c: usize) -> u64 {
        assert!((c as u64) < self.rings, "coordinator {c} has no ring");
        c as u64 * 8
    }

    /// Offset of coordinator `c`'s ring.
    pub fn ring_offset(&self, c: usize) -> u64 {
        assert!((c as u64) < self.rings, "coordinator {c} has no ring");
        self.heads_bytes() + c as u64 * self.ring_bytes
    }
}

/// Where an entry of `len` bytes starting at stream position `start` goes in a ring of
/// `ring` bytes: (position of a SKIP word if the ring wraps first, ring offset of the
/// entry, stream position after it). Coordinator and backup compute it alike.
pub fn place(start: u64, len: u64, ring: u64) -> (Option<u64>, u64, u64) {
    assert!(len <= ring / 2, "entry of {len} bytes too big for a ring of {ring}");
    let pos = start % ring;
    if pos + len <= ring {
        (None, pos, start + len)
    } else {
        (Some(pos), 0, start + (ring - pos) + len)
    }
}

/// Copies an entry that a LOG call carried into coordinator `c`'s ring at stream
/// position `start`, where [`place`] puts it (with a SKIP word first if the ring wraps).
/// Position and entry came over the network: one the coordinator could not have placed
/// (a position not on a word, an entry longer than half the ring, a position so far on
/// that the stream would overflow) is refused and nothing is written.
pub fn put(
    region: &Region,
    layout: &LogLayout,
    c: usize,
    start: u64,
    entry: &[u64],
) -> Result<(), CorruptLog> {
    let (ring, len) = (layout.ring_bytes, entry.len() as u64 * 8);
    let placeable = start % 8 == 0 && len <= ring / 2 && start.checked_add(ring + len).is_some();
    if !placeable {
        return Err(CorruptLog { position: start, word: entry.first().copied().unwrap_or(0) });
    }
    let ring_at = layout.ring_offset(c);
    let (skip, at, _) = place(start, len, ring);
    if let Some(pos) = skip {
        region.store(ring_at + pos, SKIP);
    }
    region.write_words(ring_at + at, entry);
    Ok(())
}

/// Builds entries for one backup, splitting them at `ENTRY_WORDS_MAX`.
#[derive(Default)]
pub struct EntryBuilder {
    words: Vec<u64>,
    /// Start of the entry being built in `words`.
    open: Option<usize>,
    /// (start, end) in `words` of finished entries.
    entries: Vec<(usize, usize)>,
}

impl EntryBuilder {
    /// Forgets everything (keeps the memory).
    pub fn clear(&mut self) {
        self.words.clear();
        self.open = None;
        self.entries.clear();
    }

    /// Adds a record of the transaction `owner` (`hint`: its offset at the primary, or 0).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        owner: u64,
        table: TableId,
        key: u64,
        version: u64,
        flags: u64,
        hint: u64,
        payload: &[u64],
    ) {
        let need = 4 + payload.len();
        assert!(
            need + 4 <= ENTRY_WORDS_MAX,
            "a record of {} words cannot be logged",
            payload.len()
        );
        if let Some(start) = self.open {
            if self.words.len() - start + need + 1 > ENTRY_WORDS_MAX {
                self.close();
            }
        }
        if self.open.is_none() {
            self.open = Some(self.words.len());
            self.words.extend_from_slice(&[0, owner, 0]);
        }
        let start = self.open.expect("just opened");
        self.words[start + 2] += 1;
        self.words.push(u64::from(table.0) << 48 | (payload.len() as u64) << 32 | flags);
        self.words.extend_from_slice(&[key, version, hint]);
        self.words.extend_from_slice(payload);
    }

    fn close(&mut self) {
        if let Some(start) = self.open.take() {
            let len = (self.words.len() - start + 1) as u64;
            self.words[start] = LOG_MAGIC | len;
            self.words.push(LOG_MAGIC | len);
            self.entries.push((start, self.words.len()));
        }
    }

    /// The finished entries.
    pub fn finish(&mut self) -> impl Iterator<Item = &[u64]> {
        self.close();
        self.entries.iter().map(|&(a, b)| &self.words[a..b])
    }

    /// Whether no record was added.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// Why an entry could not be applied: the ring holds something that is not a whole entry
/// where a committed one must be (a protocol or memory bug, never a race).
#[derive(Debug, PartialEq, Eq)]
pub struct CorruptLog {
    /// Ring position.
    pub position: u64,
    /// Word found there.
    pub word: u64,
}

/// The coordinator's view of its ring at one backup.
#[derive(Clone, Debug, Default)]
pub struct RingOut {
    /// Stream position after the last reserved entry.
    pub tail: u64,
    /// Head as last learned from the backup: everything before it is free.
    pub head_known: u64,
    /// Reservations not yet acknowledged: (start, acknowledged).
    inflight: VecDeque<(u64, bool)>,
    /// Position up to which a reclaim was sent.
    pub reclaim_sent: u64,
}

impl RingOut {
    /// Reserves room for an entry of `len` bytes: (skip word position, entry offset,
    /// stream start) or `None` if the ring has no credit for it.
    pub fn reserve(&mut self, len: u64, ring: u64) -> Option<(Option<u64>, u64, u64)> {
        let (skip, at, end) = place(self.tail, len, ring);
        if end - self.head_known > ring {
            return None;
        }
        let start = self.tail;
        self.inflight.push_back((start, false));
        self.tail = end;
        Some((skip, at, start))
    }

    /// Marks the reservation starting at `start` acknowledged by the backup.
    pub fn acknowledged(&mut self, start: u64) {
        let r = self
            .inflight
            .iter_mut()
            .find(|(s, _)| *s == start)
            .expect("acknowledged entry was reserved");
        r.1 = true;
        while self.inflight.front().is_some_and(|&(_, done)| done) {
            self.inflight.pop_front();
        }
    }

    /// Everything before this position is acknowledged (so committed): safe to apply.
    pub fn committed_to(&self) -> u64 {
        self.inflight.front().map_or(self.tail, |&(start, _)| start)
    }

    /// Learns a newer head.
    pub fn learn_head(&mut self, head: u64) {
        self.head_known = self.head_known.max(head);
    }
}

/// Applies coordinator `c`'s ring entries on this backup up to `up_to` and advances the
/// ring's head word; returns the head. Record versions decide: a record is written only
/// if the entry's version is newer than the replica's (entries of different coordinators
/// arrive in any order).
pub fn apply(
    store: &NodeStore,
    region: &Region,
    layout: &LogLayout,
    c: usize,
    up_to: u64,
    buf: &mut Vec<u64>,
) -> Result<u64, CorruptLog> {
    let head_at = layout.head_offset(c);
    let ring_at = layout.ring_offset(c);
    let ring = layout.ring_bytes;
    let mut head = region.load(head_at);
    // A coordinator never has more than a ring's worth of log past the head it learned,
    // which is at most this one (L2): asked to apply further, the loop below would go
    // round the ring again and again (a SKIP at offset 0 and `up_to` near 2^64 spin it
    // for 2^53 rounds).
    if up_to.saturating_sub(head) > ring {
        return Err(CorruptLog { position: head, word: up_to });
    }
    while head < up_to {
        let pos = head % ring;
        let first = region.load(ring_at + pos);
        if first == SKIP {
            head += ring - pos;
            continue;
        }
        let len = first & !MAGIC_MASK;
        if first & MAGIC_MASK != LOG_MAGIC || len < 4 || pos + len * 8 > ring {
            return Err(CorruptLog { position: head, word: first });
        }
        buf.resize(len as usize, 0);
        region.read_words(ring_at + pos, buf);
        if buf[len as usize - 1] != first {
            return Err(CorruptLog { position: head + len * 8 - 8, word: buf[len as usize - 1] });
        }
        apply_entry(store, &buf[..len as usize])
            .map_err(|()| CorruptLog { position: head, word: first })?;
        head += len * 8;
    }
    region.store(head_at, head);
    Ok(head)
}

fn apply_entry(store: &NodeStore, entry: &[u64]) -> Result<(), ()> {
    let count = entry[2];
    let mut i = 3;
    for _ in 0..count {
        let meta = *entry.get(i).ok_or(())?;
        let (table, words) = (TableId((meta >> 48) as u16), ((meta >> 32) & 0xFFFF) as usize);
        let (key, version, hint) = (
            *entry.get(i + 1).ok_or(())?,
            *entry.get(i + 2).ok_or(())?,
            *entry.get(i + 3).ok_or(())?,
        );
        let payload = entry.get(i + 4..i + 4 + words).ok_or(())?;
        // The entry came over the network: a table the catalog does not have, or a
        // reserved key, is corrupt, not an index.
        if usize::from(table.0) >= store.catalog().tables().count() || key > KEY_MAX {
            return Err(());
        }
        let partition = store.catalog().partition(table, key);
        let replica = store.replica(table, partition);
        // A payload not of the table's length (it would leave a record whose checksum
        // covers other words than its reads do: torn for ever) is refused by the replica.
        replica.apply_logged(hint, key, version, payload).map_err(|_| ())?;
        i += 4 + words;
    }
    (i + 1 == entry.len()).then_some(()).ok_or(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn placement_wraps_with_a_skip() {
        assert_eq!(place(0, 100, 1000), (None, 0, 100));
        assert_eq!(place(950, 100, 1000), (Some(950), 0, 1100));
        assert_eq!(place(1100, 100, 1000), (None, 100, 1200));
    }

    #[test]
    fn credits_and_committed_prefix() {
        let mut r = RingOut::default();
        let a = r.reserve(400, 1000).unwrap();
        let b = r.reserve(400, 1000).unwrap();
        assert!(r.reserve(400, 1000).is_none(), "no credit beyond the ring");
        assert_eq!(r.committed_to(), 0);
        r.acknowledged(b.2);
        assert_eq!(r.committed_to(), 0, "the first entry is still in flight");
        r.acknowledged(a.2);
        assert_eq!(r.committed_to(), 800);
        r.learn_head(800);
        assert!(r.reserve(400, 1000).is_some());
    }

    /// Two workers of one backup node apply the rings of two coordinators at the same
    /// time (each worker owns the rings of the coordinators with its index), and both
    /// rings log the same records: every round, coordinator 0 logs version `2r + 1` and
    /// coordinator 1 version `2r + 2` of each. Whatever the interleaving, every record
    /// must end the round at the newer version (L4), not overwritten by the older one.
    #[test]
    fn concurrent_appliers_keep_the_newest_version() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use hytra_fabric::local::LocalCluster;
        use hytra_fabric::testing::TestBackend;
        use hytra_fabric::ClusterShape;
        use hytra_store::layout::version_number;
        use hytra_store::{Catalog, IndexLayout, Partitioner, TableSpec};

        const ROUNDS: usize = 2_000;
        const KEYS: u64 = 40;
        let shape = ClusterShape { nodes: 2, workers_per_node: 2, lanes_per_peer: 1 };
        let mut backend = LocalCluster::for_test(shape, 0);
        let spec = TableSpec {
            id: TableId(0),
            name: "t".into(),
            payload_words: 2,
            capacity: 2 * KEYS,
            partitioner: Partitioner::Modulo,
            index: IndexLayout::Hashed,
        };
        let catalog = Catalog::new(vec![spec], 2, 2).unwrap();
        let (_, stores) = NodeStore::register(&mut backend, catalog, 0).unwrap();
        // Even keys are partition 0: primary on node 0, backup on node 1.
        let keys: Vec<u64> = (0..KEYS).map(|i| i * 2).collect();
        let backup = &*stores[1];
        let replica = backup.replica(TableId(0), 0);
        for &k in &keys {
            replica.load(k, &[0, 0]).unwrap();
        }
        let layout = LogLayout { rkey: Rkey(0), ring_bytes: 64 << 10, rings: 4 };
        let region = Region::zeroed(layout.region_bytes());
        // A barrier of the two threads: spins, so that both leave it together and their
        // applications overlap, and yields when the other thread is not running.
        let arrived = AtomicUsize::new(0);
        let barrier = |round: usize, phase: usize| {
            arrived.fetch_add(1, Ordering::AcqRel);
            let mut spins = 0u32;
            while arrived.load(Ordering::Acquire) < 4 * round + 2 * phase {
                spins = spins.wrapping_add(1);
                if spins % 1024 == 0 {
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
            }
        };
        let (keys, region, barrier) = (&keys, &region, &barrier);
        let went_back: Vec<String> = std::thread::scope(|s| {
            let appliers: Vec<_> = (0..2usize)
                .map(|c| {
                    s.spawn(move || {
                        let (mut b, mut buf, mut tail, mut went_back) =
                            (EntryBuilder::default(), Vec::new(), 0, Vec::new());
                        let ring_at = layout.ring_offset(c);
                        for round in 0..ROUNDS {
                            let version = 2 * round as u64 + 1 + c as u64;
                            b.clear();
                            for &k in keys {
                                b.record(c as u64, TableId(0), k, version, 0, 0, &[version; 2]);
                            }
                            let entry = b.finish().next().expect("one entry");
                            let (skip, at, end) =
                                place(tail, entry.len() as u64 * 8, layout.ring_bytes);
                            if let Some(pos) = skip {
                                region.store(ring_at + pos, SKIP);
                            }
                            region.write_words(ring_at + at, entry);
                            tail = end;
                            barrier(round, 1);
                            apply(backup, region, &layout, c, tail, &mut buf).unwrap();
                            barrier(round, 2);
                            if c == 0 {
                                for &k in keys {
                                    let off = replica.lookup(k).unwrap();
                                    let v = version_number(replica.header(off).version);
                                    if v != version + 1 {
                                        went_back.push(format!("round {round}: {k} at v{v}"));
                                    }
                                }
                            }
                        }
                        went_back
                    })
                })
                .collect();
            appliers.into_iter().flat_map(|a| a.join().unwrap()).collect()
        });
        assert!(
            went_back.is_empty(),
            "{} records lost their newest version, first: {:?}",
            went_back.len(),
            &went_back[..went_back.len().min(3)]
        );
    }

    /// A backup (node 1 of two, both partitions) of one table with two payload words,
    /// with key 4 loaded, and a log region of one 4 KiB ring.
    fn backup() -> (Arc<NodeStore>, Region, LogLayout) {
        use hytra_fabric::local::LocalCluster;
        use hytra_fabric::testing::TestBackend;
        use hytra_fabric::ClusterShape;
        use hytra_store::{Catalog, IndexLayout, Partitioner, TableSpec};

        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let mut backend = LocalCluster::for_test(shape, 0);
        let spec = TableSpec {
            id: TableId(0),
            name: "t".into(),
            payload_words: 2,
            capacity: 16,
            partitioner: Partitioner::Modulo,
            index: IndexLayout::Hashed,
        };
        let catalog = Catalog::new(vec![spec], 2, 2).unwrap();
        let (_, stores) = NodeStore::register(&mut backend, catalog, 0).unwrap();
        stores[1].replica(TableId(0), 0).load(4, &[1, 1]).unwrap();
        let layout = LogLayout { rkey: Rkey(0), ring_bytes: 4096, rings: 1 };
        let region = Region::zeroed(layout.region_bytes());
        (stores[1].clone(), region, layout)
    }

    /// Entries whose record names a table the catalog lacks, a reserved key, or a
    /// payload of another length than its table's are corrupt: they used to index the
    /// catalog out of bounds, trip the store's key assertion, or leave a record torn.
    #[test]
    fn an_entry_naming_what_cannot_be_is_corrupt() {
        use hytra_store::layout::KEY_MAX;

        let (store, region, layout) = backup();
        let cases: [(TableId, u64, &[u64]); 4] = [
            (TableId(1), 4, &[2, 2]),
            (TableId(7), 4, &[2, 2]),
            (TableId(0), KEY_MAX + 1, &[2, 2]),
            (TableId(0), 4, &[2]),
        ];
        for (table, key, payload) in cases {
            let mut b = EntryBuilder::default();
            b.record(3, table, key, 5 << 8, 0, 0, payload);
            let entry = b.finish().next().unwrap().to_vec();
            region.store(layout.head_offset(0), 0);
            region.write_words(layout.ring_offset(0), &entry);
            let got = apply(&store, &region, &layout, 0, entry.len() as u64 * 8, &mut Vec::new());
            assert!(got.is_err(), "table {table:?} key {key} payload {payload:?}: {got:?}");
        }
        let replica = store.replica(TableId(0), 0);
        let mut p = [0; 2];
        replica.read(replica.lookup(4).unwrap(), 4, &mut p).unwrap();
        assert_eq!(p, [1, 1], "the record is untouched and whole");
    }

    /// A LOG call's position and entry come from the network: one the coordinator could
    /// not have placed is refused (a position off a word used to trip the region's
    /// alignment assertion).
    #[test]
    fn a_log_call_that_cannot_be_placed_is_refused() {
        let (_, region, layout) = backup();
        let entry = [LOG_MAGIC | 4, 0, 0, LOG_MAGIC | 4];
        assert!(put(&region, &layout, 0, 4096 * 5 + 64, &entry).is_ok());
        let mut back = [0; 4];
        region.read_words(layout.ring_offset(0) + 64, &mut back);
        assert_eq!(back, entry);
        assert!(put(&region, &layout, 0, 4, &entry).is_err(), "off a word");
        assert!(put(&region, &layout, 0, u64::MAX - 7, &entry).is_err(), "overflows");
        assert!(put(&region, &layout, 0, 0, &[0; 257]).is_err(), "over half the ring");
    }

    /// RECLAIM's `up_to` comes from the network: more than a ring ahead of the head is
    /// corrupt. A ring that starts with a SKIP used to be gone round 2^53 times.
    #[test]
    fn applying_more_than_a_ring_ahead_is_corrupt() {
        let (store, region, layout) = backup();
        region.store(layout.ring_offset(0), SKIP);
        let mut buf = Vec::new();
        assert_eq!(apply(&store, &region, &layout, 0, 4096, &mut buf), Ok(4096));
        let far = 4096 + 4096 * 3;
        assert_eq!(
            apply(&store, &region, &layout, 0, far, &mut buf),
            Err(CorruptLog { position: 4096, word: far })
        );
        let err = apply(&store, &region, &layout, 0, u64::MAX, &mut buf).unwrap_err();
        assert_eq!(err.position, 4096);
    }

    #[test]
    fn entries_split_and_carry_markers() {
        let mut b = EntryBuilder::default();
        for k in 0..100 {
            b.record(7, TableId(1), k, 1, 0, 0, &[k; 10]);
        }
        let entries: Vec<Vec<u64>> = b.finish().map(|e| e.to_vec()).collect();
        assert!(entries.len() >= 3);
        let mut records = 0;
        for e in &entries {
            assert!(e.len() <= ENTRY_WORDS_MAX);
            assert_eq!(e[0], *e.last().unwrap());
            assert_eq!(e[0] & MAGIC_MASK, LOG_MAGIC);
            assert_eq!(e[0] & !MAGIC_MASK, e.len() as u64);
            records += e[2];
        }
        assert_eq!(records, 100);
    }
}
