//! One replica of one table partition on one node: its hash index and records, as
//! operated by the local CPU (RPC handlers, local transactions, log apply, loading).
//!
//! Remote peers reach the same memory with one-sided verbs; the rules that make both
//! safe together are in docs/INVARIANTS.md (S1-S5). Not for: deciding how a transaction
//! reaches a record (see `hytra-txn`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hytra_fabric::{Region, Rkey};
use thiserror::Error;

use crate::catalog::{Geometry, TableId};
use crate::layout::{
    checksum, is_present, slot_tag, version_number, Owner, RecordHeader, ABSENT, BUCKET_BYTES,
    BUCKET_WORDS, BUSY, CHECKSUM_WORD, EMPTY, KEY_WORD, LOCK_WORD, NEXT_WORD, PAYLOAD_WORDS_MAX,
    RECORD_HEADER_WORDS, RECORD_WORDS_MAX, SLOTS, VERSION_WORD,
};

/// Stripes of the insert lock: inserts of keys hashing to different stripes proceed in
/// parallel; lookups never lock.
const INSERT_STRIPES: usize = 64;

/// Stripes of the apply lock: logged writes of records in different stripes are applied
/// in parallel.
const APPLY_STRIPES: usize = 64;

/// Times a CPU read retries a torn record before telling its caller to come back later.
const TORN_RETRIES: u32 = 64;

/// Why a store operation failed.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
pub enum StoreError {
    /// The partition is full.
    #[error("table {0:?}: partition full")]
    Full(TableId),
    /// The index ran out of overflow buckets.
    #[error("table {0:?}: index overflow area full")]
    IndexFull(TableId),
    /// The record was being written and stayed torn; retry later.
    #[error("record torn by a concurrent write")]
    Torn,
    /// A replica image from another process does not fit this replica.
    #[error("table {0:?}: an image page at byte {1} does not fit the replica")]
    ImageMismatch(TableId, u64),
    /// A write (from a log entry) whose payload is not the table's size.
    #[error("table {0:?}: a payload of {1} words does not fit its records")]
    PayloadSize(TableId, usize),
}

/// What a CPU read of a record saw.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Snapshot {
    /// Lock word.
    pub lock: u64,
    /// Version word (with the absent bit).
    pub version: u64,
}

/// A replica's contents as [`Replica::image`] copies them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaImage {
    /// Records allocated.
    pub next_record: u64,
    /// Overflow buckets allocated.
    pub next_overflow: u64,
    /// Non-zero pages: byte offset and words.
    pub pages: Vec<(u64, Vec<u64>)>,
}

/// Why bytes did not decode as a [`ReplicaImage`].
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
#[error("a replica image ends early: {needed} more bytes expected, {left} left")]
pub struct ImageDecodeError {
    /// Bytes the next field needs.
    pub needed: u64,
    /// Bytes that were left.
    pub left: u64,
}

impl ReplicaImage {
    /// Appends the image to `out` as little-endian words: the two counters, the number
    /// of pages, then each page's offset, length in words and words. Images hold every
    /// record of a replica, so they travel in this form rather than as text.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let words: usize = self.pages.iter().map(|(_, w)| w.len() + 2).sum();
        out.reserve((3 + words) * 8);
        for w in [self.next_record, self.next_overflow, self.pages.len() as u64] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for (offset, page) in &self.pages {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&(page.len() as u64).to_le_bytes());
            for w in page {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
    }

    /// Reads one image that [`ReplicaImage::encode`] wrote from the front of `input`,
    /// and advances `input` past it.
    pub fn decode(input: &mut &[u8]) -> Result<ReplicaImage, ImageDecodeError> {
        let next_record = take_word(input)?;
        let next_overflow = take_word(input)?;
        let count = take_word(input)?;
        let mut pages = Vec::new();
        for _ in 0..count {
            let offset = take_word(input)?;
            let len = take_word(input)?;
            // A length is checked against what is left before anything is allocated.
            let bytes = len.saturating_mul(8);
            if bytes > input.len() as u64 {
                return Err(ImageDecodeError { needed: bytes, left: input.len() as u64 });
            }
            let (body, rest) = input.split_at(bytes as usize);
            let words = body
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of eight")))
                .collect();
            *input = rest;
            pages.push((offset, words));
        }
        Ok(ReplicaImage { next_record, next_overflow, pages })
    }
}

/// Takes one little-endian word from the front of `input`.
pub fn take_word(input: &mut &[u8]) -> Result<u64, ImageDecodeError> {
    match input.split_first_chunk::<8>() {
        Some((word, rest)) => {
            *input = rest;
            Ok(u64::from_le_bytes(*word))
        }
        None => Err(ImageDecodeError { needed: 8, left: input.len() as u64 }),
    }
}

/// One replica region of a table.
pub struct Replica {
    /// Table.
    pub table: TableId,
    /// Partition held.
    pub partition: u16,
    /// Region key, the same on every node for (table, partition).
    pub rkey: Rkey,
    region: Region,
    geom: Geometry,
    next_record: AtomicU64,
    next_overflow: AtomicU64,
    insert_locks: Vec<Mutex<()>>,
    apply_locks: Vec<Mutex<()>>,
}

impl Replica {
    /// Wraps a zeroed region of `geom.region_bytes()` (zero is an empty index).
    pub fn new(
        table: TableId,
        partition: u16,
        rkey: Rkey,
        region: Region,
        geom: Geometry,
    ) -> Replica {
        assert!(region.len_bytes() >= geom.region_bytes(), "region too small for its table");
        Replica {
            table,
            partition,
            rkey,
            region,
            geom,
            next_record: AtomicU64::new(0),
            next_overflow: AtomicU64::new(0),
            insert_locks: (0..INSERT_STRIPES).map(|_| Mutex::new(())).collect(),
            apply_locks: (0..APPLY_STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    /// The region.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.geom
    }

    /// Byte offset of a key's record, if the key was ever inserted.
    pub fn lookup(&self, key: u64) -> Option<u64> {
        let tag = slot_tag(key);
        let mut bucket = self.geom.home_bucket(key);
        loop {
            let base = self.geom.bucket_offset(bucket);
            for s in 0..SLOTS as u64 {
                // Acquire on the tag orders the offset load after the inserter's store of
                // it (S2).
                if self.region.load(base + 16 * s) == tag {
                    return Some(self.region.load(base + 16 * s + 8));
                }
            }
            match self.region.load(base + NEXT_WORD * 8) {
                0 => return None,
                next => bucket = self.geom.buckets + next - 1,
            }
        }
    }

    /// The record of `key`, inserting an absent one if there is none. Inserts of one
    /// replica are serialised per stripe; readers never wait.
    pub fn lookup_or_insert(&self, key: u64) -> Result<u64, StoreError> {
        if let Some(off) = self.lookup(key) {
            return Ok(off);
        }
        let home = self.geom.home_bucket(key);
        let _guard =
            self.insert_locks[(home as usize) % INSERT_STRIPES].lock().expect("no insert panicked");
        if let Some(off) = self.lookup(key) {
            return Ok(off);
        }
        let slot = self.next_record.fetch_add(1, Ordering::Relaxed);
        if slot >= self.geom.capacity {
            return Err(StoreError::Full(self.table));
        }
        let off = self.geom.record_offset(slot);
        self.init_record(off, key);
        self.link(home, key, off)?;
        Ok(off)
    }

    /// Writes a new record's header under its apply stripe: a log applier that finds the
    /// slot through an offset hint ([`Replica::apply_logged`]) holds the same stripe, so
    /// it sees the header either not yet written or whole, and its write can never be
    /// overwritten by the rest of the initialisation.
    fn init_record(&self, off: u64, key: u64) {
        let payload_words = (self.geom.record_bytes / 8 - RECORD_HEADER_WORDS) as usize;
        static ZEROS: [u64; PAYLOAD_WORDS_MAX as usize] = [0; PAYLOAD_WORDS_MAX as usize];
        let words = [ABSENT, key, checksum(ABSENT, key, &ZEROS[..payload_words])];
        let _guard = self.apply_stripe(off);
        self.region.write_words(off + VERSION_WORD * 8, &words);
        debug_assert_eq!(self.region.load(off + LOCK_WORD * 8), 0);
    }

    fn apply_stripe(&self, off: u64) -> std::sync::MutexGuard<'_, ()> {
        let stripe = (off / self.geom.record_bytes) as usize % APPLY_STRIPES;
        self.apply_locks[stripe].lock().expect("no applier panicked")
    }

    /// Puts `key -> off` into the first free slot of the chain from `bucket`.
    fn link(&self, mut bucket: u64, key: u64, off: u64) -> Result<(), StoreError> {
        loop {
            let base = self.geom.bucket_offset(bucket);
            for s in 0..SLOTS as u64 {
                let at = base + 16 * s;
                if self.region.cas(at, EMPTY, BUSY) == EMPTY {
                    // Offset first, tag last with release (S2).
                    self.region.store(at + 8, off);
                    self.region.store(at, slot_tag(key));
                    return Ok(());
                }
            }
            let next_at = base + NEXT_WORD * 8;
            bucket = match self.region.load(next_at) {
                0 => {
                    let n = self.next_overflow.fetch_add(1, Ordering::Relaxed);
                    if n >= self.geom.overflow {
                        return Err(StoreError::IndexFull(self.table));
                    }
                    // The stripe lock makes us the only writer of this chain's tail.
                    self.region.store(next_at, n + 1);
                    self.geom.buckets + n
                }
                next => self.geom.buckets + next - 1,
            };
        }
    }

    /// Whether `off` is the offset of an initialised record of `key` here: a cheap check
    /// of an offset learned elsewhere (a primary's, when replicas were loaded alike),
    /// instead of a lookup. The key word is immutable once the record exists; a slot
    /// still being initialised has a zero checksum (zeroed memory never verifies, S4),
    /// which the caller must read under the slot's apply stripe to trust.
    fn holds(&self, off: u64, key: u64) -> bool {
        let records = self.geom.records_offset();
        let allocated = self.geom.record_offset(0) + self.len() * self.geom.record_bytes;
        off >= records
            && off < allocated
            && (off - records) % self.geom.record_bytes == 0
            && self.region.load(off + KEY_WORD * 8) == key
            && self.region.load(off + CHECKSUM_WORD * 8) != 0
    }

    /// Applies a logged write of `key` (L4): at `hint` if that is the key's initialised
    /// record here, else at the key's record found or created through the index; written
    /// only if newer (see [`Replica::write_back_if_newer`]).
    pub fn apply_logged(
        &self,
        hint: u64,
        key: u64,
        version: u64,
        payload: &[u64],
    ) -> Result<(), StoreError> {
        if payload.len() != self.payload_words() {
            return Err(StoreError::PayloadSize(self.table, payload.len()));
        }
        {
            let _guard = self.apply_stripe(hint);
            if self.holds(hint, key) {
                self.write_if_newer_locked(hint, version, key, payload);
                return Ok(());
            }
        }
        let off = self.lookup_or_insert(key)?;
        self.write_back_if_newer(off, version, key, payload);
        Ok(())
    }

    /// Reads a record's lock, version and payload (into `payload`), retrying while it is
    /// torn by a concurrent write-back. On an error `payload` holds whatever the last try
    /// read.
    pub fn read(&self, off: u64, key: u64, payload: &mut [u64]) -> Result<Snapshot, StoreError> {
        const H: usize = RECORD_HEADER_WORDS as usize;
        assert!(
            H + payload.len() <= RECORD_WORDS_MAX,
            "payload of {} words too long",
            payload.len()
        );
        // Header and payload straight into their places (a record-sized buffer would be
        // cleared and copied on every read); together they are one read in address order.
        let mut header = [0u64; H];
        for _ in 0..TORN_RETRIES {
            self.region.read_words(off, &mut header);
            self.region.read_words(off + H as u64 * 8, payload);
            let header = RecordHeader::parse_parts(&header, payload);
            if header.intact {
                assert_eq!(header.key, key, "index led to another key's record");
                return Ok(Snapshot { lock: header.lock, version: header.version });
            }
            std::hint::spin_loop();
        }
        Err(StoreError::Torn)
    }

    /// Whether the record at `off` holds exactly the words (version, key, checksum and
    /// payload; not the lock) of `other`'s record at `other_off`, a replica of the same
    /// table. Where `other`'s record verifies, equal words verify too, so comparing copies
    /// needs one checksum, not one per copy. For quiescent checks: the words are read
    /// without retrying a torn copy.
    pub fn same_words(&self, off: u64, other: &Replica, other_off: u64) -> bool {
        assert_eq!(self.geom.record_bytes, other.geom.record_bytes, "replicas of one table");
        const CHUNK: usize = 16;
        let words = (self.geom.record_bytes / 8 - VERSION_WORD) as usize;
        let (mut a, mut b) = ([0u64; CHUNK], [0u64; CHUNK]);
        (0..words).step_by(CHUNK).all(|at| {
            let n = CHUNK.min(words - at);
            let from = (VERSION_WORD as usize + at) as u64 * 8;
            self.region.read_words(off + from, &mut a[..n]);
            other.region.read_words(other_off + from, &mut b[..n]);
            a[..n] == b[..n]
        })
    }

    /// Lock and version words (no payload, no checksum: enough to validate).
    pub fn header(&self, off: u64) -> Snapshot {
        // Lock before version (S3): a writer that locks after the lock load is serialised
        // after the reader; one that wrote back before the version load shows its version.
        let lock = self.region.load(off + LOCK_WORD * 8);
        let version = self.region.load(off + VERSION_WORD * 8);
        Snapshot { lock, version }
    }

    /// CPU compare-and-swap of the lock word from free to `owner`; the current owner if
    /// it is held (or `owner` itself, when a duplicate request locks again). A lock taken
    /// in another epoch than `owner`'s is stale and is taken over (L6).
    pub fn try_lock(&self, off: u64, owner: Owner) -> Result<(), u64> {
        let at = off + LOCK_WORD * 8;
        let mut expect = 0;
        // A stale holder can be replaced by a newer stale one only through recovery,
        // which runs no transactions: two rounds always settle it.
        for _ in 0..3 {
            match self.region.cas(at, expect, owner.0) {
                o if o == expect || o == owner.0 => return Ok(()),
                o if !Owner(o).holds_in(owner) => expect = o,
                o => return Err(o),
            }
        }
        Err(self.region.load(at))
    }

    /// Releases a lock held by `owner`; a no-op if someone else holds it (a delayed or
    /// duplicated release of an older attempt).
    pub fn unlock_if(&self, off: u64, owner: Owner) -> bool {
        self.region.cas(off + LOCK_WORD * 8, owner.0, 0) == owner.0
    }

    /// Releases a lock the caller knows it holds (a plain store, safe with NIC atomics:
    /// nobody else can change a held lock word).
    pub fn unlock(&self, off: u64) {
        self.region.store(off + LOCK_WORD * 8, 0);
    }

    /// Writes version, key, checksum and payload (not the lock word) as one publication.
    pub fn write_back(&self, off: u64, version: u64, key: u64, payload: &[u64]) {
        const _: () = assert!(KEY_WORD == VERSION_WORD + 1 && CHECKSUM_WORD == KEY_WORD + 1);
        assert!(
            RECORD_HEADER_WORDS as usize + payload.len() <= RECORD_WORDS_MAX,
            "payload of {} words too long",
            payload.len()
        );
        let header = [version, key, checksum(version, key, payload)];
        self.region.write_words_parts(off + VERSION_WORD * 8, &header, payload);
    }

    /// Writes a logged version of a record as [`Replica::write_back`] does, but only if
    /// it is newer than the record's (or the record is absent and the logged write is
    /// not): how a backup applies its log (L4). The workers of a node apply different
    /// coordinators' rings at once, on several threads in real backends, so the
    /// comparison and the write hold the record's apply stripe: otherwise an older
    /// version compared before a newer one was written could overwrite it afterwards.
    pub fn write_back_if_newer(&self, off: u64, version: u64, key: u64, payload: &[u64]) {
        let _guard = self.apply_stripe(off);
        self.write_if_newer_locked(off, version, key, payload);
    }

    /// [`Replica::write_back_if_newer`] for a caller that holds `off`'s apply stripe.
    fn write_if_newer_locked(&self, off: u64, version: u64, key: u64, payload: &[u64]) {
        let current = self.region.load(off + VERSION_WORD * 8);
        if version_number(version) > version_number(current)
            || (current == ABSENT && is_present(version))
        {
            self.write_back(off, version, key, payload);
        }
    }

    /// Writes a committed record that recovery hands to its primary, for the dead
    /// coordinator `owner` (F3): as [`Replica::apply_logged`], and also over the same
    /// version when the record's words do not verify and `owner` still holds its lock.
    /// That is a write-back of this very commit that stopped part way, its writer dead
    /// (an RDMA WRITE cut off with its host, a killed process's copy into shared
    /// memory): the version, first in address order, is already the new one, its lock is
    /// still the writer's (its release comes after the write-back), and the logged words
    /// are the ones it meant, so writing them mends the record (L4). One read decides:
    /// a whole record, or one another owner locked, is left alone.
    pub fn apply_recovered(
        &self,
        key: u64,
        version: u64,
        payload: &[u64],
        owner: Owner,
    ) -> Result<u64, StoreError> {
        if payload.len() != self.payload_words() {
            return Err(StoreError::PayloadSize(self.table, payload.len()));
        }
        let off = self.lookup_or_insert(key)?;
        let _guard = self.apply_stripe(off);
        const H: usize = RECORD_HEADER_WORDS as usize;
        let (mut header, mut words) = ([0u64; H], [0u64; PAYLOAD_WORDS_MAX as usize]);
        let now = &mut words[..payload.len()];
        self.region.read_words(off, &mut header);
        self.region.read_words(off + H as u64 * 8, now);
        let h = RecordHeader::parse_parts(&header, now);
        let torn_by_owner = h.version == version && !h.intact && h.lock == owner.0;
        if torn_by_owner {
            self.write_back(off, version, key, payload);
        } else {
            self.write_if_newer_locked(off, version, key, payload);
        }
        Ok(off)
    }

    /// Loads an initial value: inserts the key and writes version 0.
    pub fn load(&self, key: u64, payload: &[u64]) -> Result<u64, StoreError> {
        // Touch the home bucket with a write (adding zero changes nothing) before the
        // lookup reads it: a first read of a page of buckets maps the kernel's shared
        // zero page, and the insert's write then faults again to copy it, flushing the
        // other cores' TLBs. Loading touches most pages of buckets; this saves the
        // second fault and its flush on each (about 8% of a TPC-C run's faults).
        self.region.faa(self.geom.bucket_offset(self.geom.home_bucket(key)), 0);
        let off = self.lookup_or_insert(key)?;
        self.write_back(off, 0, key, payload);
        Ok(off)
    }

    /// Records allocated so far.
    pub fn len(&self) -> u64 {
        self.next_record.load(Ordering::Relaxed).min(self.geom.capacity)
    }

    /// A copy of this replica's contents (its memory, without pages that are all zero,
    /// and its allocation counters), to rebuild it in another process: how the results
    /// of a cluster spread over processes are checked in one place.
    ///
    /// Only what can have been written is read: the records allocated so far, the
    /// pages of main buckets that are home to one of their keys (a key is only ever
    /// linked into its home bucket's chain, and records are never freed), and the
    /// overflow buckets allocated so far. The rest is sized for the most the table could
    /// ever hold and was never touched; reading it would make it resident (a read of
    /// shared memory allocates the page), which for TPC-C's order lines is gigabytes.
    pub fn image(&self) -> ReplicaImage {
        let mut pages = Vec::new();
        self.written_pages(|at, words| pages.push((at, words.to_vec())));
        ReplicaImage {
            next_record: self.next_record.load(Ordering::Acquire),
            next_overflow: self.next_overflow.load(Ordering::Acquire),
            pages,
        }
    }

    /// Calls `f` with every page (or the part of one inside a written range) that can
    /// have been written and is not all zeros, in address order: what [`Replica::image`]
    /// holds, without holding it all at once.
    fn written_pages(&self, mut f: impl FnMut(u64, &[u64])) {
        const PAGE_BYTES: u64 = 4096;
        const _: () = assert!(PAGE_BYTES % BUCKET_BYTES == 0, "a bucket never spans two pages");
        let g = &self.geom;
        let overflow_used = self.next_overflow.load(Ordering::Acquire).min(g.overflow);
        let records_used = self.next_record.load(Ordering::Acquire).min(g.capacity);
        let main_bytes = g.buckets * BUCKET_BYTES;
        let mut homes = vec![false; main_bytes.div_ceil(PAGE_BYTES) as usize];
        for (_, key) in self.records() {
            homes[(g.bucket_offset(g.home_bucket(key)) / PAGE_BYTES) as usize] = true;
        }
        let mut written: Vec<(u64, u64)> = homes
            .iter()
            .enumerate()
            .filter(|(_, &home)| home)
            .map(|(page, _)| {
                (page as u64 * PAGE_BYTES, ((page as u64 + 1) * PAGE_BYTES).min(main_bytes))
            })
            .collect();
        written.push((main_bytes, main_bytes + overflow_used * BUCKET_BYTES));
        written.push((g.records_offset(), g.records_offset() + records_used * g.record_bytes));
        let mut buf = vec![0u64; (PAGE_BYTES / 8) as usize];
        for (start, end) in written {
            let mut at = start;
            while at < end {
                let n = (PAGE_BYTES - at % PAGE_BYTES).min(end - at);
                let words = &mut buf[..(n / 8) as usize];
                self.region.read_words(at, words);
                if words.iter().any(|&w| w != 0) {
                    f(at, words);
                }
                at += n;
            }
        }
    }

    /// Makes each of `others` (replicas of this table and partition on other nodes of
    /// this process, untouched since setup) hold what this one holds, as if every record
    /// had been loaded into each: loading fills one copy, and this copies its written
    /// pages to the rest, which costs less than loading each (no index probes, no
    /// checksums) and leaves every copy word for word the same. Before a run only:
    /// nothing may access the replicas meanwhile.
    pub fn copy_loaded_to(&self, others: &[&Replica]) {
        for o in others {
            assert!(
                o.table == self.table && o.partition == self.partition && o.is_empty(),
                "a loaded replica is copied to empty replicas of its own partition"
            );
            assert_eq!(o.geom, self.geom, "replicas of one partition have one geometry");
        }
        if others.is_empty() || self.is_empty() {
            return;
        }
        self.written_pages(|at, words| {
            for o in others {
                o.region.write_words(at, words);
            }
        });
        for o in others {
            o.next_record.store(self.next_record.load(Ordering::Acquire), Ordering::Release);
            o.next_overflow.store(self.next_overflow.load(Ordering::Acquire), Ordering::Release);
        }
    }

    /// Makes this replica (untouched since setup) hold `image`.
    pub fn restore(&self, image: &ReplicaImage) -> Result<(), StoreError> {
        for (offset, words) in &image.pages {
            if self.region.check(*offset, words.len() as u64 * 8).is_err() {
                return Err(StoreError::ImageMismatch(self.table, *offset));
            }
            self.region.write_words(*offset, words);
        }
        self.next_record.store(image.next_record, Ordering::Release);
        self.next_overflow.store(image.next_overflow, Ordering::Release);
        Ok(())
    }

    /// Whether no record was allocated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every allocated record as (offset, key), in allocation order.
    pub fn records(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.records_from(0)
    }

    /// As [`Replica::records`], from the `first`-th record allocated on.
    pub fn records_from(&self, first: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        (first.min(self.len())..self.len()).map(move |i| {
            let off = self.geom.record_offset(i);
            (off, self.region.load(off + KEY_WORD * 8))
        })
    }

    /// Payload words of this table's records.
    pub fn payload_words(&self) -> usize {
        (self.geom.record_bytes / 8 - RECORD_HEADER_WORDS) as usize
    }

    /// Words of one bucket, for checks and tests.
    pub fn bucket_words(&self, i: u64) -> [u64; BUCKET_WORDS as usize] {
        let mut w = [0u64; BUCKET_WORDS as usize];
        self.region.read_words(self.geom.bucket_offset(i), &mut w);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, Fill, IndexLayout, Partitioner, TableSpec};
    use crate::layout::{is_present, search_bucket, version_number};

    fn replica(capacity: u64) -> Replica {
        replica_with(capacity, Partitioner::Modulo, IndexLayout::Hashed, 1)
    }

    fn replica_with(
        capacity: u64,
        partitioner: Partitioner,
        index: IndexLayout,
        nodes: u16,
    ) -> Replica {
        replica_of(capacity, partitioner, index, nodes, 2)
    }

    fn replica_of(
        capacity: u64,
        partitioner: Partitioner,
        index: IndexLayout,
        nodes: u16,
        payload_words: u16,
    ) -> Replica {
        let spec = TableSpec {
            id: TableId(0),
            name: "t".into(),
            payload_words,
            capacity,
            partitioner,
            index,
            fill: Fill::Dense,
        };
        let c = Catalog::new(vec![spec], nodes, 1).unwrap();
        let g = c.geometry(TableId(0));
        Replica::new(TableId(0), 0, Rkey(0), Region::zeroed(g.region_bytes()), g)
    }

    #[test]
    fn an_image_restores_the_replica_and_skips_what_was_never_allocated() {
        let capacity = 20_000;
        let r = replica(capacity);
        // Scattered keys, so that some buckets overflow.
        let key = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 16;
        for k in 0..16_000 {
            r.load(key(k), &[k, !k]).unwrap();
        }
        assert!(r.next_overflow.load(Ordering::Relaxed) > 0, "the test must use overflow buckets");
        let image = r.image();
        let g = r.geometry();
        let overflow_end = g.bucket_offset(g.buckets + r.next_overflow.load(Ordering::Relaxed));
        let records_end = g.record_offset(r.len());
        for (at, words) in &image.pages {
            let end = at + words.len() as u64 * 8;
            let in_buckets = end <= overflow_end;
            let in_records = *at >= g.records_offset() && end <= records_end;
            assert!(in_buckets || in_records, "page at {at}..{end} was never written");
        }
        let copy = replica(capacity);
        copy.restore(&image).unwrap();
        assert_eq!(copy.len(), 16_000);
        let all = g.region_bytes() / 8;
        let (mut a, mut b) = (vec![0u64; all as usize], vec![0u64; all as usize]);
        r.region().read_words(0, &mut a);
        copy.region().read_words(0, &mut b);
        assert!(a == b, "the restored replica differs from the original");
        let mut p = [0u64; 2];
        copy.read(copy.lookup(key(15_999)).unwrap(), key(15_999), &mut p).unwrap();
        assert_eq!(p, [15_999, !15_999]);
        // What lies beyond the allocated buckets and records is not read at all.
        let scribble = |from: u64, to: u64| {
            for at in (from..to).step_by(8) {
                r.region().store(at, 0xdead_beef);
            }
        };
        scribble(overflow_end, g.records_offset());
        scribble(records_end, g.region_bytes());
        let again = r.image();
        assert!(again.pages == image.pages, "the image read unallocated memory");
    }

    #[test]
    fn copies_of_a_loaded_replica_equal_one_loaded_record_by_record() {
        let capacity = 20_000;
        let key = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 16;
        let (loaded, by_hand) = (replica(capacity), replica(capacity));
        for k in 0..16_000 {
            loaded.load(key(k), &[k, !k]).unwrap();
            by_hand.load(key(k), &[k, !k]).unwrap();
        }
        assert!(loaded.next_overflow.load(Ordering::Relaxed) > 0, "the test must overflow");
        let copies = [replica(capacity), replica(capacity)];
        loaded.copy_loaded_to(&copies.iter().collect::<Vec<_>>());
        let all = (loaded.geometry().region_bytes() / 8) as usize;
        let words = |r: &Replica| {
            let mut w = vec![0u64; all];
            r.region().read_words(0, &mut w);
            w
        };
        let expect = words(&by_hand);
        for c in &copies {
            assert!(words(c) == expect, "a copy differs from a replica loaded record by record");
            assert_eq!(c.len(), by_hand.len());
            assert_eq!(
                c.next_overflow.load(Ordering::Relaxed),
                by_hand.next_overflow.load(Ordering::Relaxed)
            );
        }
        // Each copy goes on by itself: an insert takes the next record and overflow bucket
        // as it would in a replica loaded by hand, and the others do not see it.
        let (a, b) = (&copies[0], &copies[1]);
        for k in 16_000..16_500 {
            let at = a.load(key(k), &[k, k]).unwrap();
            assert_eq!(at, by_hand.load(key(k), &[k, k]).unwrap());
        }
        assert!(words(a) == words(&by_hand));
        assert_eq!(b.lookup(key(16_499)), None);
        assert!(words(b) == expect);
    }

    #[test]
    #[should_panic(expected = "copied to empty replicas")]
    fn a_loaded_replica_is_not_copied_over_records() {
        let (a, b) = (replica(100), replica(100));
        a.load(1, &[1, 1]).unwrap();
        b.load(2, &[2, 2]).unwrap();
        a.copy_loaded_to(&[&b]);
    }

    #[test]
    fn an_image_reads_only_the_bucket_pages_its_keys_live_in() {
        // A sequential index fills its buckets in key order: two runs of keys far apart
        // use two short runs of buckets, and the pages between stay untouched.
        let r = replica_with(200_000, Partitioner::Modulo, IndexLayout::Sequential, 1);
        let keys: Vec<u64> = (0..500).chain(150_000..150_500).collect();
        for &k in &keys {
            r.load(k, &[k, 1]).unwrap();
        }
        let image = r.image();
        let g = r.geometry();
        let home_pages: std::collections::BTreeSet<u64> =
            keys.iter().map(|&k| g.bucket_offset(g.home_bucket(k)) / 4096).collect();
        for page in 0..g.records_offset() / 4096 {
            if !home_pages.contains(&page) && (page + 1) * 4096 <= g.bucket_offset(g.buckets) {
                r.region().store(page * 4096, 0xdead_beef);
            }
        }
        assert!(r.image().pages == image.pages, "the image read a bucket page no key lives in");
        let copy = replica_with(200_000, Partitioner::Modulo, IndexLayout::Sequential, 1);
        copy.restore(&image).unwrap();
        let mut p = [0u64; 2];
        for &k in &keys {
            copy.read(copy.lookup(k).unwrap(), k, &mut p).unwrap();
            assert_eq!(p, [k, 1]);
        }
    }

    #[test]
    fn an_encoded_image_decodes_to_itself_and_a_cut_one_is_refused() {
        let r = replica(1_000);
        for k in 0..700 {
            r.load(k * 3, &[k, k << 32]).unwrap();
        }
        let image = r.image();
        assert!(image.pages.len() > 2);
        let mut bytes = vec![7u8];
        image.encode(&mut bytes);
        bytes.push(9);
        let mut input = &bytes[1..];
        assert_eq!(ReplicaImage::decode(&mut input), Ok(image.clone()));
        assert_eq!(input, &[9], "decoding stops right after the image");
        for cut in [1, 8, 25, bytes.len() / 2, bytes.len() - 2] {
            let mut input = &bytes[1..cut];
            assert!(ReplicaImage::decode(&mut input).is_err(), "{cut} bytes decoded");
        }
        // A corrupt page length is refused, not allocated.
        let mut forged = Vec::new();
        for w in [0, 0, 1, 0, u64::MAX / 4] {
            forged.extend_from_slice(&w.to_le_bytes());
        }
        let err = ReplicaImage::decode(&mut forged.as_slice()).unwrap_err();
        assert_eq!(err.left, 0);
    }

    #[test]
    fn copies_compare_by_their_words_all_of_them() {
        let words = 40u16;
        let copy = || replica_of(16, Partitioner::Modulo, IndexLayout::Hashed, 1, words);
        let (a, b) = (copy(), copy());
        let payload: Vec<u64> = (0..u64::from(words)).collect();
        // Different keys first, so the same key sits at different offsets.
        b.load(99, &payload).unwrap();
        let (oa, ob) = (a.load(7, &payload).unwrap(), b.load(7, &payload).unwrap());
        assert_ne!(oa, ob);
        assert!(a.same_words(oa, &b, ob));
        assert!(a.try_lock(oa, Owner::new(1, 0, 1, 0)).is_ok(), "the lock word is not compared");
        assert!(a.same_words(oa, &b, ob));
        for at in [39usize, 0, 16] {
            let mut changed = payload.clone();
            changed[at] += 1;
            b.write_back(ob, 0, 7, &changed);
            assert!(!a.same_words(oa, &b, ob), "word {at} changed");
        }
        b.write_back(ob, 1, 7, &payload);
        assert!(!a.same_words(oa, &b, ob), "only the version changed");
        b.write_back(ob, 0, 7, &payload);
        assert!(a.same_words(oa, &b, ob));
    }

    #[test]
    fn load_lookup_read_write_back() {
        let r = replica(100);
        for k in 0..100 {
            r.load(k * 7, &[k, k + 1]).unwrap();
        }
        assert_eq!(r.load(5000, &[0, 0]), Err(StoreError::Full(TableId(0))));
        let off = r.lookup(21).unwrap();
        let mut p = [0u64; 2];
        let s = r.read(off, 21, &mut p).unwrap();
        assert_eq!((s.lock, version_number(s.version), p), (0, 0, [3, 4]));
        assert!(is_present(s.version));
        r.write_back(off, 1, 21, &[9, 9]);
        assert_eq!(r.read(off, 21, &mut p).unwrap().version, 1);
        assert_eq!(p, [9, 9]);
        assert_eq!(r.lookup(22), None);
        assert_eq!(r.records().count(), 100);
    }

    #[test]
    fn overflow_chains_are_searchable_remotely_too() {
        let r = replica(64);
        // 12 buckets, 60 keys: some buckets must overflow their 7 slots.
        for k in 0..60u64 {
            r.lookup_or_insert(k).unwrap();
        }
        for k in 0..60u64 {
            let mut b = r.geometry().home_bucket(k);
            let found = loop {
                match search_bucket(&r.bucket_words(b), k) {
                    Ok(found) => break found,
                    Err(next) => b = r.geometry().buckets + next,
                }
            };
            assert_eq!(found, r.lookup(k), "key {k}");
        }
    }

    #[test]
    fn a_sequential_index_fills_a_partition_without_overflow() {
        // Partition 1 of 3 under each partitioner, filled to capacity in key order.
        let cases = [
            (Partitioner::Modulo, (0..500u64).map(|i| i * 3 + 1).collect::<Vec<_>>()),
            // Ranges of 100 keys; node 1 holds ranges 1, 4, 7, 10, 13.
            (
                Partitioner::Range { keys_per_partition: 100 },
                [1u64, 4, 7, 10, 13].iter().flat_map(|r| r * 100..r * 100 + 100).collect(),
            ),
        ];
        for (partitioner, keys) in cases {
            let r = replica_with(500, partitioner, IndexLayout::Sequential, 3);
            for &k in &keys {
                r.load(k, &[k, k]).unwrap();
            }
            let g = r.geometry();
            for (i, &k) in keys.iter().enumerate() {
                assert_eq!(g.home_bucket(k), i as u64 / 5, "{partitioner:?}: key {k}");
                assert_eq!(r.bucket_words(g.home_bucket(k))[NEXT_WORD as usize], 0, "no overflow");
                assert!(r.lookup(k).is_some());
            }
        }
    }

    #[test]
    fn catalog_refuses_records_too_large() {
        let spec = TableSpec {
            id: TableId(0),
            name: "wide".into(),
            payload_words: crate::layout::PAYLOAD_WORDS_MAX + 1,
            capacity: 10,
            partitioner: Partitioner::Modulo,
            index: IndexLayout::Hashed,
            fill: Fill::Dense,
        };
        assert!(Catalog::new(vec![spec], 1, 1).is_err());
    }

    #[test]
    fn locks_have_one_owner() {
        let r = replica(4);
        let off = r.lookup_or_insert(1).unwrap();
        let (a, b) = (Owner::new(0, 0, 1, 1), Owner::new(1, 0, 1, 1));
        assert_eq!(r.try_lock(off, a), Ok(()));
        assert_eq!(r.try_lock(off, a), Ok(()), "a duplicate request is harmless");
        assert_eq!(r.try_lock(off, b), Err(a.0));
        assert!(!r.unlock_if(off, b));
        assert!(!r.unlock_if(off, Owner::new(0, 0, 1, 0)), "an older attempt cannot unlock");
        assert!(r.unlock_if(off, a));
        assert_eq!(r.header(off).lock, 0);
        // A lock of an earlier epoch is stale: the next epoch's attempt takes it over.
        assert_eq!(r.try_lock(off, a), Ok(()));
        let c = Owner::new(1, 0, 2, 1);
        assert_eq!(r.try_lock(off, c), Ok(()));
        assert_eq!(r.header(off).lock, c.0);
    }

    #[test]
    fn a_torn_record_is_reported_not_returned() {
        let r = replica(4);
        let off = r.load(1, &[1, 1]).unwrap();
        // A half-done write-back: new payload, old checksum.
        r.region().store(off + (RECORD_HEADER_WORDS + 1) * 8, 77);
        let mut p = [0u64; 2];
        assert_eq!(r.read(off, 1, &mut p), Err(StoreError::Torn));
    }

    #[test]
    fn a_write_back_left_half_done_under_its_lock_is_mended_by_recovery_and_only_then() {
        let r = replica(4);
        let off = r.load(1, &[1, 1]).unwrap();
        let (dead, other) = (Owner::new(1, 0, 2, 1), Owner::new(2, 0, 2, 1));
        r.try_lock(off, dead).unwrap();
        // A write-back of version 3 that stopped after its header (version, key and
        // checksum come first): the old payload is under the new checksum.
        let header = [3, 1, checksum(3, 1, &[5, 6])];
        r.region().write_words(off + VERSION_WORD * 8, &header);
        let mut p = [0u64; 2];
        assert_eq!(r.read(off, 1, &mut p), Err(StoreError::Torn));
        // A backup's apply of the same version, an older version, or another owner's
        // hand-over does not touch it.
        r.apply_logged(off, 1, 3, &[5, 6]).unwrap();
        assert_eq!(r.apply_recovered(1, 2, &[7, 7], dead), Ok(off));
        assert_eq!(r.apply_recovered(1, 3, &[5, 6], other), Ok(off));
        assert_eq!(r.read(off, 1, &mut p), Err(StoreError::Torn));
        // The dead owner's commit, handed over by recovery from the log, mends it.
        assert_eq!(r.apply_recovered(1, 3, &[5, 6], dead), Ok(off));
        assert_eq!(r.read(off, 1, &mut p).unwrap().version, 3);
        assert_eq!(p, [5, 6]);
        // A whole record is never written again by its own version: words that differ
        // from it (which no log of version 3 could hold) are not taken.
        r.apply_recovered(1, 3, &[9, 9], dead).unwrap();
        assert_eq!(r.read(off, 1, &mut p).unwrap().version, 3);
        assert_eq!(p, [5, 6]);
        // A newer version is written as by any apply.
        r.apply_recovered(1, 4, &[8, 8], other).unwrap();
        assert_eq!(r.read(off, 1, &mut p).unwrap().version, 4);
        assert_eq!(p, [8, 8]);
    }

    #[test]
    fn a_log_applier_never_writes_a_slot_still_being_initialised() {
        let r = replica(16);
        // A slot another applier allocated and began to initialise: its key word is
        // there, its checksum not yet. The hint points at it.
        let slot = r.next_record.fetch_add(1, Ordering::Relaxed);
        let off = r.geom.record_offset(slot);
        r.region.store(off + KEY_WORD * 8, 7);
        r.apply_logged(off, 7, 3, &[1, 2]).unwrap();
        // Written there, the rest of the initialisation would have overwritten the
        // version (and left the checksum of another record): the index is used instead.
        assert_eq!(r.region.load(off + VERSION_WORD * 8), 0, "the half-made slot was written");
        let at = r.lookup(7).unwrap();
        assert_ne!(at, off);
        let mut p = [0u64; 2];
        assert_eq!(version_number(r.read(at, 7, &mut p).unwrap().version), 3);
        assert_eq!(p, [1, 2]);
        // An initialised record is written at its hint, and a payload of another length
        // is refused (a log entry from another node is not trusted).
        r.apply_logged(at, 7, 4, &[5, 6]).unwrap();
        assert_eq!(version_number(r.header(at).version), 4);
        assert_eq!(r.apply_logged(at, 7, 5, &[1]), Err(StoreError::PayloadSize(TableId(0), 1)));
    }

    #[test]
    fn concurrent_inserts_of_one_key_give_one_record() {
        let r = std::sync::Arc::new(replica(1000));
        let offs: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| (0..200).map(|k| r.lookup_or_insert(k).unwrap()).collect::<Vec<_>>())
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(r.len(), 200, "each key inserted once");
        for (i, off) in offs.iter().enumerate() {
            assert_eq!(Some(*off), r.lookup(i as u64 % 200));
        }
    }
}
