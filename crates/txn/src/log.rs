//! Redo logs on backups: ring buffers, entries, their application, and what recovery
//! reads of them.
//!
//! Every node has one log region holding a ring per coordinator worker of the cluster
//! and, before the rings, three words per ring: its head (everything before it is
//! applied), the sequence number of the last transaction applied, and the epoch below
//! which an entry not resolved by recovery is void. A coordinator appends entries to its
//! ring at a backup (one-sided WRITE, or an RPC whose handler copies them in); an entry
//! carries its length in its first and last word, and its stream position in its header
//! and (hashed) in its last word, so that an entry of an earlier lap at the same place is
//! never taken for a new one, nor is a new one torn over it: the first lines of a WRITE
//! whose writer died may have landed over an entry of the same length an earlier lap
//! left there, whose last word would otherwise pass for the new entry's (M2). The backup
//! applies entries lazily, when the coordinator tells it how far its log is committed
//! (RECLAIM), then advances the ring's head word, which the coordinator reads to learn
//! its credit (docs/INVARIANTS.md L1-L6).
//!
//! Entry (words): `LOG | len`; owner; record count, part and parts (`count | part << 16 |
//! parts << 32`: a transaction's log to one backup may take several entries); the
//! epoch it was written in; the coordinator's transaction sequence number; the entry's
//! stream position; the number of partitions the transaction writes, then those
//! partitions, four to a word; then per record `table << 48 | payload words << 32 |
//! flags`, key, version word, the record's offset at its primary (a hint: replicas loaded
//! alike hold it at the same offset), payload; last, `LOG | lap | len` ([`trailer`]). A
//! ring position that cannot fit the next entry holds `SKIP | position / 8` and the entry
//! starts over at offset 0.

use std::collections::VecDeque;

use hytra_fabric::{Region, Rkey};
use hytra_store::layout::KEY_MAX;
use hytra_store::{NodeStore, TableId};

/// Marks the first and last word of an entry: with its length in words in the low 16 bits,
/// and in the last word a hash of its position above them ([`trailer`]).
pub const LOG_MAGIC: u64 = 0x004C_4F47 << 40;
/// Bits of an entry's first and last word that hold its length in words.
const LEN_MASK: u64 = 0xFFFF;

const _: () = assert!(ENTRY_WORDS_MAX as u64 <= LEN_MASK);

/// The last word of an entry of `len` words at stream position `position`: the magic, the
/// length, and 24 bits of a hash of the position between them. An entry that an earlier
/// lap left at the same ring offset ends in another word (but for a 2^-24 chance of
/// equal hashes), so a new entry torn over it is never read as whole.
pub fn trailer(len: u64, position: u64) -> u64 {
    assert!(len <= LEN_MASK, "an entry of {len} words");
    let lap = position.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    LOG_MAGIC | lap << 16 | len
}

/// Marks the rest of a ring, up to its end, as unused (with the position below bit 40).
pub const SKIP_MAGIC: u64 = 0x0053_4B50 << 40;
const MAGIC_MASK: u64 = !((1 << 40) - 1);

/// The SKIP word of a ring position: the position's lap makes one of an earlier lap
/// tell itself apart.
pub fn skip_word(position: u64) -> u64 {
    SKIP_MAGIC | ((position / 8) & !MAGIC_MASK)
}

/// Flag of a logged record: the write deletes it.
pub const LOGGED_DELETE: u64 = 1;

/// Largest entry, in words: one entry must travel in one RPC frame (two-sided logging)
/// and fit a ring comfortably. Bigger logs are split into several entries.
pub const ENTRY_WORDS_MAX: usize = 500;

/// Words of an entry's header before its list of written partitions.
const HEADER_WORDS: usize = 7;
/// Word of the header holding the epoch.
pub const EPOCH_WORD: usize = 3;
/// Word of the header holding the transaction sequence number.
const TSEQ_WORD: usize = 4;
/// Word of the header holding the entry's stream position.
pub const POSITION_WORD: usize = 5;

/// Partitions one transaction may write: its entries list them all (recovery needs to
/// know every partition a transaction wrote from any one of its entries).
pub const WRITTEN_PARTITIONS_MAX: usize = 120;

const _: () = assert!(HEADER_WORDS + WRITTEN_PARTITIONS_MAX / 4 + 1 + 4 + 1 < ENTRY_WORDS_MAX / 2);

/// Where the rings and their state words are in a node's log region.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LogLayout {
    /// The log region's key (the same on every node).
    pub rkey: Rkey,
    /// Bytes per ring.
    pub ring_bytes: u64,
    /// Rings per node: one per worker of the cluster.
    pub rings: u64,
}

/// State words per ring: head, last applied sequence number, void epoch.
const RING_STATE_WORDS: u64 = 3;

impl LogLayout {
    /// Bytes of the rings' state words, rounded to a cache line.
    fn heads_bytes(&self) -> u64 {
        (self.rings * RING_STATE_WORDS * 8).div_ceil(64) * 64
    }

    /// Bytes of a node's log region.
    pub fn region_bytes(&self) -> u64 {
        self.heads_bytes() + self.rings * self.ring_bytes
    }

    /// Offset of coordinator `c`'s head word.
    pub fn head_offset(&self, c: usize) -> u64 {
        assert!((c as u64) < self.rings, "coordinator {c} has no ring");
        c as u64 * RING_STATE_WORDS * 8
    }

    /// Offset of the word holding the sequence number of coordinator `c`'s last applied
    /// transaction.
    pub fn tseq_offset(&self, c: usize) -> u64 {
        self.head_offset(c) + 8
    }

    /// Offset of the word holding the epoch below which coordinator `c`'s entries that
    /// recovery did not resolve are void.
    pub fn void_epoch_offset(&self, c: usize) -> u64 {
        self.head_offset(c) + 16
    }

    /// Offset of coordinator `c`'s ring.
    pub fn ring_offset(&self, c: usize) -> u64 {
        assert!((c as u64) < self.rings, "coordinator {c} has no ring");
        self.heads_bytes() + c as u64 * self.ring_bytes
    }
}

/// Where an entry of `len` bytes reserved at stream position `start` goes in a ring of
/// `ring` bytes: (position of a SKIP word if the ring wraps first, ring offset of the
/// entry, stream position after it). Coordinator and backup compute it alike; the entry
/// itself lies at the stream position `end - len` (its position word).
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
/// (a position not on a word, an entry longer than half the ring or naming another
/// position in its header or its trailer, a position so far on that the stream would
/// overflow) is refused and nothing is written.
pub fn put(
    region: &Region,
    layout: &LogLayout,
    c: usize,
    start: u64,
    entry: &[u64],
) -> Result<(), CorruptLog> {
    let (ring, len) = (layout.ring_bytes, entry.len() as u64 * 8);
    let placeable = start % 8 == 0
        && len <= ring / 2
        && len / 8 <= ENTRY_WORDS_MAX as u64
        && start.checked_add(ring + len).is_some();
    if !placeable {
        return Err(CorruptLog { position: start, word: entry.first().copied().unwrap_or(0) });
    }
    let ring_at = layout.ring_offset(c);
    let (skip, at, end) = place(start, len, ring);
    let whole = entry.last() == Some(&trailer(len / 8, end - len));
    if entry.get(POSITION_WORD) != Some(&(end - len)) || !whole {
        return Err(CorruptLog { position: start, word: entry.first().copied().unwrap_or(0) });
    }
    if let Some(pos) = skip {
        region.store(ring_at + pos, skip_word(start));
    }
    region.write_words(ring_at + at, entry);
    Ok(())
}

/// Builds a transaction's entries for one backup, splitting them at `ENTRY_WORDS_MAX`.
#[derive(Default)]
pub struct EntryBuilder {
    words: Vec<u64>,
    /// The header every entry of the transaction starts with (its first word and part
    /// fields filled at `finish`).
    header: Vec<u64>,
    /// Start of the entry being built in `words`.
    open: Option<usize>,
    /// (start, end) in `words` of finished entries.
    entries: Vec<(usize, usize)>,
}

impl EntryBuilder {
    /// Forgets everything (keeps the memory).
    pub fn clear(&mut self) {
        self.words.clear();
        self.header.clear();
        self.open = None;
        self.entries.clear();
    }

    /// Starts the entries of transaction attempt `owner`, logged in `epoch`, which writes
    /// the partitions `written`.
    pub fn begin(&mut self, owner: u64, epoch: u64, written: &[u16]) {
        assert!(
            written.len() <= WRITTEN_PARTITIONS_MAX,
            "a transaction writes {} partitions, more than {WRITTEN_PARTITIONS_MAX}",
            written.len()
        );
        self.clear();
        self.header.extend_from_slice(&[0, owner, 0, epoch, 0, 0, written.len() as u64]);
        for four in written.chunks(4) {
            let packed =
                four.iter().enumerate().fold(0u64, |w, (i, &p)| w | u64::from(p) << (16 * i));
            self.header.push(packed);
        }
    }

    /// Adds a record (`hint`: its offset at the primary, or 0).
    pub fn record(
        &mut self,
        table: TableId,
        key: u64,
        version: u64,
        flags: u64,
        hint: u64,
        payload: &[u64],
    ) {
        assert!(!self.header.is_empty(), "begin an entry before its records");
        let need = 4 + payload.len();
        assert!(
            self.header.len() + need < ENTRY_WORDS_MAX,
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
            self.words.extend_from_slice(&self.header);
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

    /// Closes the last entry and numbers the parts; returns how many entries there are.
    pub fn finish(&mut self) -> usize {
        self.close();
        let parts = self.entries.len() as u64;
        for (part, &(a, _)) in self.entries.iter().enumerate() {
            self.words[a + 2] |= (part as u64) << 16 | parts << 32;
        }
        self.entries.len()
    }

    /// Entry `i` (after `finish`), with the coordinator's transaction sequence number
    /// and its stream position stamped in (in its header and its [`trailer`]).
    pub fn stamped(&mut self, i: usize, tseq: u64, position: u64) -> &[u64] {
        let (a, b) = self.entries[i];
        self.words[a + TSEQ_WORD] = tseq;
        self.words[a + POSITION_WORD] = position;
        self.words[b - 1] = trailer((b - a) as u64, position);
        &self.words[a..b]
    }

    /// Length in words of entry `i` (after `finish`).
    pub fn entry_words(&self, i: usize) -> usize {
        let (a, b) = self.entries[i];
        b - a
    }

    /// Whether no record was added.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// What recovery needs to know of an entry beyond a ring's head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InDoubt {
    /// Its stream position.
    pub position: u64,
    /// The transaction attempt.
    pub owner: u64,
    /// The epoch it was logged in.
    pub epoch: u64,
    /// The coordinator's sequence number of the transaction.
    pub tseq: u64,
    /// Which part of the transaction's log to this backup, and of how many.
    pub part: u16,
    /// Parts of the transaction's log to this backup.
    pub parts: u16,
    /// Every partition the transaction writes.
    pub written: Vec<u16>,
}

/// An entry's header, read from its words (whole: both markers agree).
struct Header {
    owner: u64,
    count: u64,
    part: u16,
    parts: u16,
    epoch: u64,
    tseq: u64,
    written: usize,
    /// Where its records start.
    records: usize,
}

/// The epoch an entry was logged in and the records it carries, if its header reads at
/// all.
pub fn entry_epoch(entry: &[u64]) -> Option<(u64, u64)> {
    header(entry).map(|h| (h.epoch, h.count))
}

/// What [`apply`] did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The ring's head after it: everything before is applied.
    pub head: u64,
    /// Records applied (of entries not void).
    pub records: u64,
}

fn header(entry: &[u64]) -> Option<Header> {
    let first = *entry.first()?;
    if first & MAGIC_MASK != LOG_MAGIC {
        return None;
    }
    let w = *entry.get(6)? as usize;
    if w > WRITTEN_PARTITIONS_MAX {
        return None;
    }
    let records = HEADER_WORDS + w.div_ceil(4);
    if entry.len() < records + 1 {
        return None;
    }
    let counts = entry[2];
    Some(Header {
        owner: entry[1],
        count: counts & 0xFFFF,
        part: (counts >> 16) as u16,
        parts: (counts >> 32) as u16,
        epoch: entry[EPOCH_WORD],
        tseq: entry[TSEQ_WORD],
        written: w,
        records,
    })
}

/// The partitions a whole entry's header lists as written.
fn written(entry: &[u64], h: &Header) -> Vec<u16> {
    (0..h.written).map(|i| (entry[HEADER_WORDS + i / 4] >> (16 * (i % 4))) as u16).collect()
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
    /// Reservations not yet resolved: (start, resolved). An entry is resolved once its
    /// whole transaction is committed (or recovery decided it), never before: a backup
    /// may apply it only then.
    inflight: VecDeque<(u64, bool)>,
    /// Position up to which a reclaim was sent.
    pub reclaim_sent: u64,
    /// A recovery resolved this ring since it was last used: its reservations are void
    /// and the head moved; [`RingOut::resync`] with the backup's head before using it.
    pub stale: bool,
    /// The epoch whose recovery made the ring stale: only a head the backup gave in that
    /// epoch is where the ring starts over (one asked for before it, and answered late,
    /// is from before the recovery moved the head).
    pub stale_epoch: u64,
}

impl RingOut {
    /// Whether an entry of `len` bytes would find credit now.
    pub fn has_room(&self, len: u64, ring: u64) -> bool {
        let (_, _, end) = place(self.tail, len, ring);
        end - self.head_known <= ring
    }

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

    /// Gives back the latest reservation, which starts at `start` (a transaction that
    /// could not reserve room for all its entries at once takes none).
    pub fn unreserve(&mut self, start: u64) {
        let last = self.inflight.pop_back();
        assert_eq!(last, Some((start, false)), "only the latest reservation is given back");
        self.tail = start;
    }

    /// Marks the reservation starting at `start` resolved: its transaction committed
    /// (every backup acknowledged it) or recovery decided its fate.
    pub fn acknowledged(&mut self, start: u64) {
        let k = self.inflight.iter().position(|(s, _)| *s == start);
        let k = k.unwrap_or_else(|| {
            panic!("entry {start} was not reserved: {:?} tail {}", self.inflight, self.tail)
        });
        self.inflight[k].1 = true;
        while self.inflight.front().is_some_and(|&(_, done)| done) {
            self.inflight.pop_front();
        }
    }

    /// Marks the ring stale: the recovery of `epoch` resolves it.
    pub fn mark_stale(&mut self, epoch: u64) {
        self.stale = true;
        self.stale_epoch = self.stale_epoch.max(epoch);
    }

    /// [`RingOut::resync`] with a head the backup gave when the ring was stale since
    /// `epoch`, if it still is stale since that epoch (and no other coroutine started it
    /// over meanwhile); returns whether it did.
    pub fn resync_if(&mut self, head: u64, epoch: u64) -> bool {
        let current = self.stale && self.stale_epoch == epoch;
        if current {
            self.resync(head);
        }
        current
    }

    /// Starts over at `head`, the backup's head after a recovery resolved the ring:
    /// every reservation is gone (recovery decided each), and the stream goes on there.
    pub fn resync(&mut self, head: u64) {
        self.inflight.clear();
        self.tail = head;
        self.head_known = head;
        self.reclaim_sent = head;
        self.stale = false;
    }

    /// Everything before this position is resolved: safe to apply.
    pub fn committed_to(&self) -> u64 {
        self.inflight.front().map_or(self.tail, |&(start, _)| start)
    }

    /// Learns a newer head.
    pub fn learn_head(&mut self, head: u64) {
        self.head_known = self.head_known.max(head);
    }
}

/// Reads the whole entry (or SKIP) at stream position `head` of a ring into `buf`:
/// `Ok(None)` for a SKIP (the entry is at the start of the next lap), `Ok(Some(len))`
/// for an entry of `len` words, `Err` for anything else (not written yet, an earlier
/// lap's, torn).
fn entry_at(
    region: &Region,
    ring_at: u64,
    ring: u64,
    head: u64,
    buf: &mut Vec<u64>,
) -> Result<Option<usize>, CorruptLog> {
    let pos = head % ring;
    let first = region.load(ring_at + pos);
    if first == skip_word(head) {
        return Ok(None);
    }
    let len = first & !MAGIC_MASK;
    let magic = first & MAGIC_MASK;
    let sane = magic == LOG_MAGIC
        && len as usize > HEADER_WORDS
        && len as usize <= ENTRY_WORDS_MAX
        && pos + len * 8 <= ring;
    if !sane {
        return Err(CorruptLog { position: head, word: first });
    }
    buf.resize(len as usize, 0);
    region.read_words(ring_at + pos, buf);
    let last = buf[len as usize - 1];
    if last != trailer(len, head) || buf.get(POSITION_WORD) != Some(&head) {
        return Err(CorruptLog { position: head, word: last });
    }
    Ok(Some(len as usize))
}

/// Applies coordinator `c`'s ring entries on this backup up to `up_to` and advances the
/// ring's head word; returns the head. Record versions decide: a record is written only
/// if the entry's version is newer than the replica's (entries of different coordinators
/// arrive in any order). Entries of epochs before the ring's void epoch are passed over:
/// recovery resolved every entry of those epochs it found, and one it did not find was
/// of a transaction it aborted.
pub fn apply(
    store: &NodeStore,
    region: &Region,
    layout: &LogLayout,
    c: usize,
    up_to: u64,
    buf: &mut Vec<u64>,
) -> Result<Applied, CorruptLog> {
    let head_at = layout.head_offset(c);
    let ring_at = layout.ring_offset(c);
    let ring = layout.ring_bytes;
    let void_epoch = region.load(layout.void_epoch_offset(c));
    let mut head = region.load(head_at);
    let mut records = 0;
    // A coordinator never has more than a ring's worth of log past the head it learned,
    // which is at most this one (L2): asked to apply further, the loop below would go
    // round the ring again and again (a SKIP at offset 0 and `up_to` near 2^64 spin it
    // for 2^53 rounds).
    if up_to.saturating_sub(head) > ring {
        return Err(CorruptLog { position: head, word: up_to });
    }
    while head < up_to {
        let Some(len) = entry_at(region, ring_at, ring, head, buf)? else {
            head += ring - head % ring;
            continue;
        };
        let h = header(&buf[..len]).ok_or(CorruptLog { position: head, word: buf[0] })?;
        if h.epoch >= void_epoch {
            apply_entry(store, &buf[..len], &h)
                .map_err(|()| CorruptLog { position: head, word: buf[0] })?;
            region.store(layout.tseq_offset(c), h.tseq);
            records += h.count;
        }
        head += len as u64 * 8;
    }
    region.store(head_at, head);
    Ok(Applied { head, records })
}

fn apply_entry(store: &NodeStore, entry: &[u64], h: &Header) -> Result<(), ()> {
    let mut i = h.records;
    for _ in 0..h.count {
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

/// A logged record, as recovery hands it on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRecord {
    /// Table.
    pub table: TableId,
    /// Key.
    pub key: u64,
    /// Version word installed.
    pub version: u64,
    /// Payload.
    pub payload: Vec<u64>,
}

/// The records of a whole entry.
pub fn records(entry: &[u64]) -> Vec<LoggedRecord> {
    let Some(h) = header(entry) else { return Vec::new() };
    let mut out = Vec::new();
    let mut i = h.records;
    for _ in 0..h.count {
        let Some(&meta) = entry.get(i) else { break };
        let words = ((meta >> 32) & 0xFFFF) as usize;
        let Some(payload) = entry.get(i + 4..i + 4 + words) else { break };
        out.push(LoggedRecord {
            table: TableId((meta >> 48) as u16),
            key: entry[i + 1],
            version: entry[i + 2],
            payload: payload.to_vec(),
        });
        i += 4 + words;
    }
    out
}

/// The sequence number of the last transaction applied from coordinator `c`'s ring.
pub fn applied_tseq(region: &Region, layout: &LogLayout, c: usize) -> u64 {
    region.load(layout.tseq_offset(c))
}

/// The whole entries of coordinator `c`'s ring within a ring's length past its head, in
/// stream order: (position, length in words), of epochs at or after the ring's void
/// epoch. The search goes word by word, not entry by entry: an entry whose WRITE never
/// landed (its coordinator froze or died before posting it) leaves a hole of unknown
/// length, and entries after it may be of transactions past their commit point. A word
/// starts a whole entry only if both its markers agree with its length and both its
/// position word and its last word name this very stream position, which no entry of
/// another lap, and no torn one (its last word not yet landed), does.
fn whole_entries(
    region: &Region,
    layout: &LogLayout,
    c: usize,
    buf: &mut Vec<u64>,
) -> Vec<(u64, usize)> {
    let (ring_at, ring) = (layout.ring_offset(c), layout.ring_bytes);
    let head = region.load(layout.head_offset(c));
    let void_epoch = region.load(layout.void_epoch_offset(c));
    let mut pos = head;
    let mut out = Vec::new();
    while pos - head < ring {
        match entry_at(region, ring_at, ring, pos, buf) {
            Ok(None) => pos += ring - pos % ring,
            Ok(Some(len)) => {
                if header(&buf[..len]).is_some_and(|h| h.epoch >= void_epoch) {
                    out.push((pos, len));
                }
                pos += len as u64 * 8;
            }
            Err(_) => pos += 8,
        }
    }
    out
}

/// Every entry of coordinator `c`'s ring that recovery must decide: the whole ones past
/// the head (see `whole_entries`).
pub fn scan(region: &Region, layout: &LogLayout, c: usize, buf: &mut Vec<u64>) -> Vec<InDoubt> {
    let ring_at = layout.ring_offset(c);
    let mut out = Vec::new();
    for (pos, len) in whole_entries(region, layout, c, buf) {
        buf.resize(len, 0);
        region.read_words(ring_at + pos % layout.ring_bytes, buf);
        let Some(h) = header(buf) else { continue };
        out.push(InDoubt {
            position: pos,
            owner: h.owner,
            epoch: h.epoch,
            tseq: h.tseq,
            part: h.part,
            parts: h.parts,
            written: written(buf, &h),
        });
    }
    out
}

/// Resolves the entries [`scan`] finds in coordinator `c`'s ring for the recovery of
/// `epoch`: applies, in stream order, those of epochs before it whose transactions
/// committed (`committed(owner)`), handing each to `applied`; then moves the head past
/// the last whole entry (everything else there is void: never applied, and found by no
/// later scan) and raises the void epoch to `epoch`. Returns the new head.
pub fn resolve(
    store: &NodeStore,
    region: &Region,
    layout: &LogLayout,
    c: usize,
    epoch: u64,
    committed: impl Fn(u64) -> bool,
    mut applied: impl FnMut(&[u64]),
    buf: &mut Vec<u64>,
) -> Result<u64, CorruptLog> {
    let ring_at = layout.ring_offset(c);
    let head_at = layout.head_offset(c);
    let mut head = region.load(head_at);
    for (pos, len) in whole_entries(region, layout, c, buf) {
        buf.resize(len, 0);
        region.read_words(ring_at + pos % layout.ring_bytes, buf);
        let h = header(buf).ok_or(CorruptLog { position: pos, word: buf[0] })?;
        // Recovery runs with every member quiesced: no coordinator logged in `epoch` yet,
        // so an entry claiming it (or a later one) was not written by one.
        if h.epoch >= epoch {
            return Err(CorruptLog { position: pos, word: buf[0] });
        }
        if committed(h.owner) {
            apply_entry(store, buf, &h).map_err(|()| CorruptLog { position: pos, word: buf[0] })?;
            region.store(layout.tseq_offset(c), h.tseq);
            applied(buf);
        }
        head = pos + len as u64 * 8;
    }
    region.store(layout.void_epoch_offset(c), epoch);
    region.store(head_at, head);
    Ok(head)
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

    /// A head asked for while a ring was stale from one recovery, and answered after a
    /// later recovery made it stale again, is from before that recovery moved the head:
    /// the ring must not start over there.
    #[test]
    fn a_late_head_of_an_earlier_recovery_does_not_resync_the_ring() {
        let mut r = RingOut::default();
        r.mark_stale(5);
        let asked_in = r.stale_epoch;
        r.mark_stale(6);
        assert!(!r.resync_if(0, asked_in), "a head of epoch 5 after the recovery of 6");
        assert!(r.stale);
        assert!(r.resync_if(2144, 6));
        assert!(!r.stale);
        assert_eq!((r.tail, r.head_known), (2144, 2144));
        assert!(!r.resync_if(0, 6), "started over once");
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
        use hytra_store::{Catalog, Fill, IndexLayout, Partitioner, TableSpec};

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
            fill: Fill::Dense,
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
                        for round in 0..ROUNDS {
                            let version = 2 * round as u64 + 1 + c as u64;
                            b.begin(c as u64, 1, &[0]);
                            for &k in keys {
                                b.record(TableId(0), k, version, 0, 0, &[version; 2]);
                            }
                            assert_eq!(b.finish(), 1);
                            let len = b.entry_words(0) as u64 * 8;
                            let end = place(tail, len, layout.ring_bytes).2;
                            let entry = b.stamped(0, round as u64 + 1, end - len);
                            put(region, &layout, c, tail, entry).unwrap();
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
        use hytra_store::{Catalog, Fill, IndexLayout, Partitioner, TableSpec};

        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let mut backend = LocalCluster::for_test(shape, 0);
        let spec = TableSpec {
            id: TableId(0),
            name: "t".into(),
            payload_words: 2,
            capacity: 16,
            partitioner: Partitioner::Modulo,
            index: IndexLayout::Hashed,
            fill: Fill::Dense,
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
            b.begin(3, 1, &[0]);
            b.record(table, key, 5 << 8, 0, 0, payload);
            b.finish();
            let entry = b.stamped(0, 1, 0).to_vec();
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
        let at = 4096 * 5 + 64;
        let mut entry = [LOG_MAGIC | 9, 0, 0, 0, 0, at, 0, 0, LOG_MAGIC | 9];
        assert!(put(&region, &layout, 0, at, &entry).is_err(), "a trailer without its lap");
        entry[8] = trailer(9, at - 4096);
        assert!(put(&region, &layout, 0, at, &entry).is_err(), "an earlier lap's trailer");
        entry[8] = trailer(9, at);
        assert!(put(&region, &layout, 0, at, &entry).is_ok());
        let mut back = [0; 9];
        region.read_words(layout.ring_offset(0) + 64, &mut back);
        assert_eq!(back, entry);
        assert!(put(&region, &layout, 0, at + 8, &entry).is_err(), "names another position");
        entry[POSITION_WORD] = 4;
        assert!(put(&region, &layout, 0, 4, &entry).is_err(), "off a word");
        entry[POSITION_WORD] = u64::MAX - 7;
        assert!(put(&region, &layout, 0, u64::MAX - 7, &entry).is_err(), "overflows");
        let mut long = [0; 257];
        long[POSITION_WORD] = 0;
        assert!(put(&region, &layout, 0, 0, &long).is_err(), "over half the ring");
    }

    /// RECLAIM's `up_to` comes from the network: more than a ring ahead of the head is
    /// corrupt. A ring that starts with a SKIP used to be gone round 2^53 times.
    #[test]
    fn applying_more_than_a_ring_ahead_is_corrupt() {
        let (store, region, layout) = backup();
        region.store(layout.ring_offset(0), skip_word(0));
        let mut buf = Vec::new();
        assert_eq!(
            apply(&store, &region, &layout, 0, 4096, &mut buf),
            Ok(Applied { head: 4096, records: 0 })
        );
        let far = 4096 + 4096 * 3;
        assert_eq!(
            apply(&store, &region, &layout, 0, far, &mut buf),
            Err(CorruptLog { position: 4096, word: far })
        );
        let err = apply(&store, &region, &layout, 0, u64::MAX, &mut buf).unwrap_err();
        assert_eq!(err.position, 4096);
    }

    #[test]
    fn entries_split_and_carry_markers_and_the_transaction() {
        let mut b = EntryBuilder::default();
        let written = [3u16, 0, 9, 1, 7];
        b.begin(7, 4, &written);
        for k in 0..100 {
            b.record(TableId(1), k, 1, 0, 0, &[k; 10]);
        }
        let n = b.finish();
        assert!(n >= 3);
        let mut records = 0;
        for i in 0..n {
            let e = b.stamped(i, 11, 4096 * i as u64).to_vec();
            assert!(e.len() <= ENTRY_WORDS_MAX);
            assert_eq!(*e.last().unwrap(), trailer(e.len() as u64, 4096 * i as u64));
            assert_eq!(e[0] & MAGIC_MASK, LOG_MAGIC);
            assert_eq!(e[0] & !MAGIC_MASK, e.len() as u64);
            let h = header(&e).unwrap();
            assert_eq!((h.owner, h.epoch, h.tseq), (7, 4, 11));
            assert_eq!(e[POSITION_WORD], 4096 * i as u64);
            assert_eq!((h.part, h.parts), (i as u16, n as u16));
            assert_eq!(written_of(&e, &h), written);
            records += h.count;
            assert_eq!(super::records(&e).len() as u64, h.count);
        }
        assert_eq!(records, 100);
    }

    /// A WRITE of an entry that stopped part way (its writer died, M2) over an entry of
    /// the same length that the previous lap left at the same place: the new first line
    /// and the old last word. It must not read as whole, or recovery would decide on words
    /// of two transactions.
    #[test]
    fn an_entry_torn_over_an_earlier_laps_is_not_whole() {
        let (_, region, layout) = backup();
        let (ring_at, ring) = (layout.ring_offset(0), layout.ring_bytes);
        let entry = |tseq: u64, position: u64| {
            let mut b = EntryBuilder::default();
            b.begin(7, 4, &[0]);
            b.record(TableId(0), 2, tseq, 0, 0, &[tseq; 2]);
            assert_eq!(b.finish(), 1);
            b.stamped(0, tseq, position).to_vec()
        };
        let at = 512;
        let old = entry(1, at);
        put(&region, &layout, 0, at, &old).unwrap();
        let mut buf = Vec::new();
        assert_eq!(entry_at(&region, ring_at, ring, at, &mut buf), Ok(Some(old.len())));
        let new = entry(2, at + ring);
        assert_eq!(new.len(), old.len());
        assert!(new.len() > 8, "an entry of more than one line");
        region.write_words(ring_at + at, &new[..8]);
        assert!(entry_at(&region, ring_at, ring, at + ring, &mut buf).is_err(), "torn read whole");
        assert!(entry_at(&region, ring_at, ring, at, &mut buf).is_err(), "neither lap's");
        put(&region, &layout, 0, at + ring, &new).unwrap();
        assert_eq!(entry_at(&region, ring_at, ring, at + ring, &mut buf), Ok(Some(new.len())));
    }

    fn written_of(e: &[u64], h: &Header) -> Vec<u16> {
        written(e, h)
    }

    /// Recovery's view of a ring: the entries past the head, in order; a stale entry of
    /// an earlier lap ends them; resolving applies the committed, voids the others and
    /// makes later entries of the old epoch void.
    #[test]
    fn scan_and_resolve_a_ring() {
        let (store, region, layout) = backup();
        let mut b = EntryBuilder::default();
        let mut at = 0;
        let mut put_txn = |owner: u64, epoch: u64, version: u64| {
            b.begin(owner, epoch, &[0]);
            b.record(TableId(0), 4, version, 0, 0, &[version, version]);
            b.finish();
            let e = b.stamped(0, owner, at).to_vec();
            put(&region, &layout, 0, at, &e).unwrap();
            at += e.len() as u64 * 8;
            e.len() as u64 * 8
        };
        let len = put_txn(1, 1, 1 << 8);
        put_txn(2, 1, 2 << 8);
        put_txn(3, 1, 3 << 8);
        let mut buf = Vec::new();
        // A stale entry of the previous lap right after them ends the scan.
        let owners: Vec<u64> =
            scan(&region, &layout, 0, &mut buf).iter().map(|d| d.owner).collect();
        assert_eq!(owners, vec![1, 2, 3]);
        assert_eq!(scan(&region, &layout, 0, &mut buf)[1].position, len);
        // Transactions 1 and 3 committed, 2 not.
        let mut seen = Vec::new();
        let head =
            resolve(&store, &region, &layout, 0, 2, |o| o != 2, |e| seen.push(e[1]), &mut buf)
                .unwrap();
        assert_eq!(head, 3 * len);
        assert_eq!(seen, vec![1, 3]);
        assert_eq!(applied_tseq(&region, &layout, 0), 3);
        let replica = store.replica(TableId(0), 0);
        assert_eq!(replica.header(replica.lookup(4).unwrap()).version, 3 << 8);
        assert!(scan(&region, &layout, 0, &mut buf).is_empty());
        // An entry of epoch 1 landing afterwards is void; one of epoch 2 applies.
        put_txn(4, 1, 9 << 8);
        put_txn(5, 2, 5 << 8);
        // The void entry's record is not counted as applied.
        assert_eq!(
            apply(&store, &region, &layout, 0, at, &mut buf),
            Ok(Applied { head: at, records: 1 })
        );
        assert_eq!(replica.header(replica.lookup(4).unwrap()).version, 5 << 8);
    }
}
