//! Memory layouts shared by every access path: records and index buckets, as words of a
//! registered region. A one-sided READ returns exactly these words, so the parsers here
//! serve the local CPU and remote readers alike.
//!
//! Record (words): `lock | version | key | checksum | payload...`
//!
//! - `lock`: 0 when free, else the owner (a transaction attempt, see [`Owner`]). ONE lock
//!   word per record, used by the local, RPC and one-sided paths alike.
//! - `version`: bumped by one at every commit, whichever path writes the record back; the
//!   top bit marks the record absent (never inserted, or deleted).
//! - `key`: the record's key, so that a reader arriving through a stale cache entry or a
//!   racing index slot can tell it reached the wrong record.
//! - `checksum`: of version, key and payload, so that a torn read (a READ concurrent with
//!   a write-back) is detected even when nothing re-checks the version later.
//!
//! Bucket (16 words, 128 bytes): 7 slots of `key + 1 | record offset` (0: empty, so that
//! zeroed memory is an empty index), then the index + 1 of an overflow bucket (0: none),
//! then a spare word.

/// Words before the payload of a record.
pub const RECORD_HEADER_WORDS: u64 = 4;
/// Word offset of the lock word.
pub const LOCK_WORD: u64 = 0;
/// Word offset of the version.
pub const VERSION_WORD: u64 = 1;
/// Word offset of the key.
pub const KEY_WORD: u64 = 2;
/// Word offset of the checksum.
pub const CHECKSUM_WORD: u64 = 3;

/// Largest payload of a record, in words (a record is at most 128 words, 1 KiB: larger
/// rows, such as TPC-C's customer with its 500-byte data field, fit; anything larger
/// belongs in several records).
pub const PAYLOAD_WORDS_MAX: u16 = 124;
/// Largest record, in words.
pub const RECORD_WORDS_MAX: usize = RECORD_HEADER_WORDS as usize + PAYLOAD_WORDS_MAX as usize;

/// Top bit of the version word: the record holds no value.
pub const ABSENT: u64 = 1 << 63;

/// Slots per bucket.
pub const SLOTS: usize = 7;
/// Words per bucket.
pub const BUCKET_WORDS: u64 = 16;
/// Bytes per bucket.
pub const BUCKET_BYTES: u64 = BUCKET_WORDS * 8;
/// Word of a bucket holding the overflow link.
pub const NEXT_WORD: u64 = 2 * SLOTS as u64;

/// Slot word of an empty slot.
pub const EMPTY: u64 = 0;
/// Slot word of a slot being filled.
pub const BUSY: u64 = u64::MAX;
/// Largest usable key (slots hold `key + 1`, and `u64::MAX` marks a busy slot).
pub const KEY_MAX: u64 = u64::MAX - 2;

/// The slot word that stands for `key`.
pub fn slot_tag(key: u64) -> u64 {
    assert!(key <= KEY_MAX, "key {key} is reserved");
    key + 1
}

const _: () = assert!(NEXT_WORD < BUCKET_WORDS);

/// Number of a version, without the absent bit.
pub fn version_number(v: u64) -> u64 {
    v & !ABSENT
}

/// Whether a version word says the record holds a value.
pub fn is_present(v: u64) -> bool {
    v & ABSENT == 0
}

/// The checksum of a record's version, key and payload.
///
/// Four lanes mix every fourth word each, so the multiplications of neighbouring words
/// overlap instead of waiting on each other: every read of a record verifies it and every
/// write seals it, and for a record of a hundred words a single chain was most of what
/// loading and checking a TPC-C database cost. Version, key and length are each mixed
/// into a lane's seed before any payload word meets it: a seed that only xored the
/// version would count it as `version ^ payload[0]`, and YCSB bumps both by one on
/// every update, so a torn read of one write's version with another's payload would
/// verify. Each step is a bijection of its lane, so a change to any one word changes
/// the mixed value (of which the final `| 1` hides only the lowest bit).
pub fn checksum(version: u64, key: u64, payload: &[u64]) -> u64 {
    const MUL: u64 = 0x9E37_79B9_7F4A_7C15;
    fn mix(h: u64, w: u64) -> u64 {
        let h = (h ^ w).wrapping_mul(MUL);
        h ^ (h >> 29)
    }
    let mut lanes = [
        mix(0x243F_6A88_85A3_08D3, version),
        mix(0x1319_8A2E_0370_7344, key),
        0xA409_3822_299F_31D0,
        mix(0x082E_FA98_EC4E_6C89, payload.len() as u64),
    ];
    let mut chunks = payload.chunks_exact(4);
    for c in &mut chunks {
        for (l, &w) in lanes.iter_mut().zip(c) {
            *l = mix(*l, w);
        }
    }
    for (l, &w) in lanes.iter_mut().zip(chunks.remainder()) {
        *l = mix(*l, w);
    }
    let h = lanes[1..].iter().fold(mix(lanes[0], 0), |h, &l| mix(h, l));
    // Never 0, so that an all-zero (never written) record fails verification.
    h | 1
}

/// Identifies the holder of a record lock: a transaction attempt of a coroutine of a
/// worker, in an epoch of the cluster's configuration. Every attempt gets a new `seq`, so
/// a delayed unlock of an old attempt cannot release a newer attempt's lock; and a lock
/// taken in an earlier epoch than the one in force is free (recovery resolved every
/// transaction of that epoch before the new one began: L6).
///
/// Word: `worker + 1` (18 bits) | coroutine (8 bits) | epoch (its low 14 bits) | `seq`
/// (its low 24 bits).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Owner(pub u64);

/// Bits of the epoch an owner word keeps.
const OWNER_EPOCH_BITS: u32 = 14;
/// Bits of the attempt number an owner word keeps.
const OWNER_SEQ_BITS: u32 = 24;

impl Owner {
    /// The owner word of attempt `seq` of coroutine `co` of the worker with dense index
    /// `worker`, in configuration epoch `epoch`.
    pub fn new(worker: usize, co: u16, epoch: u64, seq: u32) -> Owner {
        assert!(worker < (1 << 18) - 1 && co < 256, "owner fields out of range");
        let epoch = epoch & ((1 << OWNER_EPOCH_BITS) - 1);
        let seq = u64::from(seq) & ((1 << OWNER_SEQ_BITS) - 1);
        Owner(((worker as u64 + 1) << 46) | (u64::from(co) << 38) | (epoch << OWNER_SEQ_BITS) | seq)
    }

    /// Dense index of the worker that holds the lock (for recovery and diagnostics).
    pub fn worker(self) -> usize {
        ((self.0 >> 46) - 1) as usize
    }

    /// The low bits of the epoch the lock was taken in.
    pub fn epoch_tag(self) -> u64 {
        (self.0 >> OWNER_SEQ_BITS) & ((1 << OWNER_EPOCH_BITS) - 1)
    }

    /// Whether a lock held by this owner is still held for a transaction of `epoch`'s
    /// owner: taken in the same epoch. A lock of an earlier epoch is stale (L6).
    pub fn holds_in(self, epoch_of: Owner) -> bool {
        self.epoch_tag() == epoch_of.epoch_tag()
    }
}

/// A record as read (by the CPU or a one-sided READ).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// Lock word.
    pub lock: u64,
    /// Version word (with the absent bit).
    pub version: u64,
    /// Key word.
    pub key: u64,
    /// Whether the checksum matched (false: torn or never written).
    pub intact: bool,
}

impl RecordHeader {
    /// Parses a record's words (header then payload).
    pub fn parse(words: &[u64]) -> RecordHeader {
        let h = RECORD_HEADER_WORDS as usize;
        assert!(words.len() >= h, "a record has at least its header");
        RecordHeader::parse_parts(&words[..h], &words[h..])
    }

    /// As [`RecordHeader::parse`], with the header's words and the payload's apart.
    pub fn parse_parts(header: &[u64], payload: &[u64]) -> RecordHeader {
        assert_eq!(header.len(), RECORD_HEADER_WORDS as usize, "a record header's words");
        let (version, key) = (header[VERSION_WORD as usize], header[KEY_WORD as usize]);
        let intact = header[CHECKSUM_WORD as usize] == checksum(version, key, payload);
        RecordHeader { lock: header[LOCK_WORD as usize], version, key, intact }
    }
}

/// Looks `key` up in a bucket's words: `Ok(Some(offset))` if found, `Ok(None)` if not
/// and the bucket has no overflow, `Err(next)` with the overflow bucket's index if the
/// search continues there. An offset of 0 (never a record's: bucket 0 is there) means the
/// slot's tag was read before its offset was published; read the bucket again (S2).
pub fn search_bucket(words: &[u64], key: u64) -> Result<Option<u64>, u64> {
    assert_eq!(words.len() as u64, BUCKET_WORDS, "a whole bucket");
    let tag = slot_tag(key);
    for s in 0..SLOTS {
        if words[2 * s] == tag {
            return Ok(Some(words[2 * s + 1]));
        }
    }
    match words[NEXT_WORD as usize] {
        0 => Ok(None),
        next => Err(next - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_detects_a_mixed_record() {
        let old = [5u64, 6, 7];
        let new = [8u64, 9, 10];
        let c_old = checksum(3, 42, &old);
        let c_new = checksum(4, 42, &new);
        assert_ne!(c_old, c_new);
        let torn = [8u64, 6, 7];
        assert_ne!(checksum(4, 42, &torn), c_new);
        assert_ne!(checksum(3, 42, &torn), c_old);
        assert_ne!(checksum(0, 0, &[0, 0]), 0, "zeroed memory never verifies");
    }

    #[test]
    fn checksum_sees_every_word_and_its_place() {
        for len in [0usize, 1, 3, 4, 5, 9, 124] {
            let payload: Vec<u64> = (0..len as u64).map(|i| i * 0x0101 + 7).collect();
            let c = checksum(9, 77, &payload);
            assert_ne!(checksum(10, 77, &payload), c, "version, {len} words");
            assert_ne!(checksum(9, 78, &payload), c, "key, {len} words");
            for i in 0..len {
                let mut changed = payload.clone();
                changed[i] ^= 1 << (i % 64);
                assert_ne!(checksum(9, 77, &changed), c, "word {i} of {len} flipped");
                if i + 1 < len {
                    let mut swapped = payload.clone();
                    swapped.swap(i, i + 1);
                    assert_ne!(checksum(9, 77, &swapped), c, "words {i} and {} swapped", i + 1);
                }
            }
            if len > 0 {
                // YCSB's counter field: word 0 equals the version and both go up by one
                // on every update. A read of the newer version and word 0 with the rest
                // of the older write must not verify as the older record did.
                for v in [0u64, 5, 9] {
                    let mut older = payload.clone();
                    older[0] = v;
                    let mut torn = older.clone();
                    torn[0] = v + 1;
                    assert_ne!(
                        checksum(v + 1, 77, &torn),
                        checksum(v, 77, &older),
                        "version and word 0 bumped together, {len} words"
                    );
                }
            }
            let longer: Vec<u64> = payload.iter().copied().chain([0]).collect();
            assert_ne!(checksum(9, 77, &longer), c, "a zero word appended to {len}");
        }
    }

    #[test]
    fn owners_are_distinct_and_nonzero() {
        let a = Owner::new(0, 0, 1, 0);
        assert_ne!(a.0, 0);
        assert_ne!(Owner::new(0, 0, 1, 1), a);
        assert_ne!(Owner::new(1, 0, 1, 0), a);
        assert_ne!(Owner::new(0, 1, 1, 0), a);
        assert_eq!(Owner::new(383, 7, 3, 9).worker(), 383);
        assert_eq!(Owner::new(383, 7, 3, 9).epoch_tag(), 3);
        assert!(Owner::new(5, 1, 3, 9).holds_in(Owner::new(7, 2, 3, 1)));
        assert!(!Owner::new(5, 1, 3, 9).holds_in(Owner::new(7, 2, 4, 1)), "an older epoch");
    }

    #[test]
    fn bucket_search_follows_the_chain() {
        let mut b = [EMPTY; BUCKET_WORDS as usize];
        b[4] = slot_tag(77);
        b[5] = 4096;
        assert_eq!(search_bucket(&b, 77), Ok(Some(4096)));
        assert_eq!(search_bucket(&b, 78), Ok(None));
        b[NEXT_WORD as usize] = 3;
        assert_eq!(search_bucket(&b, 78), Err(2));
    }
}
