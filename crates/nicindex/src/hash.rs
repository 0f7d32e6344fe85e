//! A two-choice hash table laid out for the NIC: a bucket is one entry's key (in the
//! id-field form a CAS can compare with a WQE header) and the scatter/gather entry of its
//! item, so that one READ of a bucket rewrites a response WQE into "send this item".
//!
//! Bucket (32 bytes): `key << 16`, item offset, item length | region key << 32, unused.
//! Item: `key << 16`, value length, value bytes padded to 8. Key 0 is reserved (empty).
//! Every key lives in one of its two candidate buckets (cuckoo insertion), so a lookup
//! reads at most two buckets (RedN §5.2 uses two hashes).
//!
//! The bucket array ([`Buckets`], [`place`], [`find`]) also stands alone: an index
//! whose entries name items kept elsewhere (the transaction engine's records, found by
//! the 48-bit [`tag`] of their key).

use hytra_fabric::wq::{header, Sge, WqOpcode, ID_MAX};
use hytra_fabric::{LocalAddr, Region, Rkey};
use thiserror::Error;

/// Bytes of a bucket.
pub const BUCKET_BYTES: u64 = 32;
/// Bytes of an item's header (key word, value length).
pub const ITEM_HEADER: u64 = 16;
/// Cuckoo displacements tried before an insert gives up.
const KICKS_MAX: usize = 64;

/// Why an insert failed.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
pub enum TableError {
    /// Keys are 1..2^48.
    #[error("key {0:#x} is 0 or exceeds 48 bits")]
    BadKey(u64),
    /// No room for the item.
    #[error("item area full")]
    Full,
    /// Both candidate buckets stayed taken after the displacements; the entry displaced
    /// last (key in the payload) is no longer in the array.
    #[error("no bucket for key {0:#x}")]
    NoBucket(u64),
}

/// An array of `count` buckets from byte `base` of region `rkey`.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Buckets {
    /// Region.
    pub rkey: Rkey,
    /// Offset of bucket 0.
    pub base: u64,
    /// Number of buckets (at least one).
    pub count: u64,
}

impl Buckets {
    /// Bytes the array takes.
    pub fn bytes(&self) -> u64 {
        self.count * BUCKET_BYTES
    }

    /// Offset of bucket `b`.
    pub fn bucket(&self, b: u64) -> u64 {
        debug_assert!(b < self.count, "bucket {b} of {}", self.count);
        self.base + b * BUCKET_BYTES
    }

    /// The two candidate buckets of `key` (distinct when there are at least two).
    pub fn candidates(&self, key: u64) -> [u64; 2] {
        let h1 = mix(key) % self.count;
        let mut h2 = mix(key ^ 0x9E37_79B9_7F4A_7C15) % self.count;
        if h2 == h1 && self.count > 1 {
            h2 = (h1 + 1) % self.count;
        }
        [h1, h2]
    }

    /// Offsets of the two candidate buckets of `key`.
    pub fn candidate_offsets(&self, key: u64) -> [u64; 2] {
        self.candidates(key).map(|b| self.bucket(b))
    }
}

/// The 48-bit key a record of any 64-bit key is filed under in a bucket array (never 0).
/// Different keys may share a tag: whoever follows an entry checks the key it finds.
pub fn tag(key: u64) -> u64 {
    (mix(key ^ 0x5851_F42D_4C95_7F2D) & ID_MAX).max(1)
}

/// Files `key` (1..=[`ID_MAX`]) with `entry` in one of its candidate buckets of `b`
/// (replacing its entry if it is there): in `which` (0 or 1) if given, moving what was
/// there to its other candidate, else in a free one, displacing entries cuckoo-style.
/// Not safe against concurrent calls on one array; NIC READs may run meanwhile and see a
/// bucket whose key word names an entry it does not hold yet, or no longer.
pub fn place(
    region: &Region,
    b: Buckets,
    key: u64,
    entry: Sge,
    which: Option<usize>,
) -> Result<(), TableError> {
    if key == 0 || key > ID_MAX {
        return Err(TableError::BadKey(key));
    }
    let c = b.candidates(key);
    for at in c {
        if load_bucket(region, b, at).0 == key_word(key) {
            store_bucket(region, b, at, key, entry);
            return Ok(());
        }
    }
    let mut at = match which {
        Some(w) => c[w],
        None => *c.iter().find(|&&x| load_bucket(region, b, x).0 == 0).unwrap_or(&c[0]),
    };
    let (mut k, mut e) = (key, entry);
    for _ in 0..KICKS_MAX {
        let old = load_bucket(region, b, at);
        store_bucket(region, b, at, k, e);
        if old.0 == 0 {
            return Ok(());
        }
        // Move the evicted entry to its other candidate.
        let (ok, oe) = (old.0 >> 16, old.1);
        let oc = b.candidates(ok);
        at = if oc[0] == at { oc[1] } else { oc[0] };
        (k, e) = (ok, oe);
    }
    Err(TableError::NoBucket(k))
}

/// The entry filed under `key` in `b`, if any (the CPU lookup).
pub fn find(region: &Region, b: Buckets, key: u64) -> Option<Sge> {
    if key == 0 || key > ID_MAX {
        return None;
    }
    b.candidates(key).into_iter().find_map(|at| {
        let (k, e) = load_bucket(region, b, at);
        (k == key_word(key)).then_some(e)
    })
}

fn load_bucket(region: &Region, b: Buckets, at: u64) -> (u64, Sge) {
    let mut w = [0u64; 3];
    region.read_words(b.bucket(at), &mut w);
    (w[0], Sge::from_words(w[1], w[2]))
}

fn store_bucket(region: &Region, b: Buckets, at: u64, key: u64, entry: Sge) {
    let off = b.bucket(at);
    let [a, l] = entry.words();
    // Key word last (a release store): a reader that sees the new key sees its entry.
    // Clearing it first keeps a reader from pairing the old key with the new entry.
    region.store(off, 0);
    region.write_words(off + 8, &[a, l]);
    region.store(off, key_word(key));
}

/// Where a table lives in its node's registered memory.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct TableLayout {
    /// Region.
    pub rkey: Rkey,
    /// Number of buckets.
    pub buckets: u64,
    /// Bytes for items after the buckets.
    pub item_bytes: u64,
}

impl TableLayout {
    /// Bytes of region the table needs (buckets, then items).
    pub fn region_bytes(&self) -> u64 {
        self.buckets * BUCKET_BYTES + self.item_bytes
    }

    /// The table's bucket array (at the start of its region).
    pub fn index(&self) -> Buckets {
        Buckets { rkey: self.rkey, base: 0, count: self.buckets }
    }

    /// Offset of bucket `b`.
    pub fn bucket(&self, b: u64) -> u64 {
        self.index().bucket(b)
    }

    /// The two candidate buckets of `key` (distinct when there are at least two).
    pub fn candidates(&self, key: u64) -> [u64; 2] {
        self.index().candidates(key)
    }
}

/// The key word of a bucket or item: a NOOP header whose id is the key.
pub fn key_word(key: u64) -> u64 {
    header(WqOpcode::Noop, 0, key)
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ x >> 33
}

/// The host's view of a table: inserts (setup time) and the CPU lookup.
pub struct HashTable {
    layout: TableLayout,
    region: Region,
    next_item: u64,
}

impl HashTable {
    /// An empty table over a zeroed region.
    pub fn new(layout: TableLayout, region: Region) -> HashTable {
        assert!(region.len_bytes() >= layout.region_bytes(), "region too small for the table");
        assert!(layout.buckets > 0, "a table needs buckets");
        HashTable { layout, next_item: layout.buckets * BUCKET_BYTES, region }
    }

    /// The layout.
    pub fn layout(&self) -> TableLayout {
        self.layout
    }

    /// Inserts `key` (or replaces its value) in either candidate bucket.
    pub fn insert(&mut self, key: u64, value: &[u8]) -> Result<(), TableError> {
        self.insert_in(key, value, None)
    }

    /// Inserts `key` into candidate bucket `which` (0 or 1) if given, moving what was
    /// there to its other candidate.
    pub fn insert_in(
        &mut self,
        key: u64,
        value: &[u8],
        which: Option<usize>,
    ) -> Result<(), TableError> {
        if key == 0 || key > ID_MAX {
            return Err(TableError::BadKey(key));
        }
        let item = self.alloc_item(key, value)?;
        place(&self.region, self.layout.index(), key, item, which)
    }

    fn alloc_item(&mut self, key: u64, value: &[u8]) -> Result<Sge, TableError> {
        let len = item_bytes(value.len());
        if self.next_item + len > self.layout.region_bytes() {
            return Err(TableError::Full);
        }
        let at = self.next_item;
        self.next_item += len;
        Ok(write_item(&self.region, LocalAddr { rkey: self.layout.rkey, offset: at }, key, value))
    }

    /// Offset of `key`'s item, if present.
    pub fn item_of(&self, key: u64) -> Option<u64> {
        find(&self.region, self.layout.index(), key).map(|sge| sge.addr.offset)
    }

    /// The CPU lookup: the value of `key`, if present.
    pub fn get(&self, key: u64) -> Option<Vec<u8>> {
        lookup(&self.region, self.layout, key)
    }
}

/// The CPU lookup over a table's region (the server's two-sided path and the reference
/// the other paths are checked against).
pub fn lookup(region: &Region, layout: TableLayout, key: u64) -> Option<Vec<u8>> {
    find(region, layout.index(), key).map(|sge| read_item(region, sge.addr.offset))
}

/// Bytes an item of a `value_len`-byte value takes.
pub fn item_bytes(value_len: usize) -> u64 {
    ITEM_HEADER + (value_len as u64).div_ceil(8) * 8
}

/// Writes an item (key word, value length, value padded to 8) at `at` of `region` and
/// returns its scatter/gather entry.
pub fn write_item(region: &Region, at: LocalAddr, key: u64, value: &[u8]) -> Sge {
    let len = item_bytes(value.len());
    region.write_words(at.offset, &[key_word(key), value.len() as u64]);
    let mut bytes = value.to_vec();
    bytes.resize((len - ITEM_HEADER) as usize, 0);
    if !bytes.is_empty() {
        region.write_bytes(at.offset + ITEM_HEADER, &bytes);
    }
    Sge { addr: at, len: len as u32 }
}

/// The value of the item at `offset` of `region`.
pub fn read_item(region: &Region, offset: u64) -> Vec<u8> {
    let len = region.load(offset + 8) as usize;
    let mut v = vec![0u8; len.div_ceil(8) * 8];
    if !v.is_empty() {
        region.read_bytes(offset + ITEM_HEADER, &mut v);
    }
    v.truncate(len);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_land_in_a_candidate_and_are_found() {
        let layout = TableLayout { rkey: Rkey(0), buckets: 128, item_bytes: 1 << 16 };
        let mut t = HashTable::new(layout, Region::zeroed(layout.region_bytes()));
        for k in 1..=48u64 {
            t.insert(k, &k.to_le_bytes()[..(k % 8) as usize]).unwrap();
        }
        for k in 1..=48u64 {
            assert_eq!(t.get(k).unwrap(), &k.to_le_bytes()[..(k % 8) as usize]);
        }
        assert_eq!(t.get(1000), None);
        assert_eq!(t.insert(0, b"x"), Err(TableError::BadKey(0)));
        t.insert_in(5000, b"second", Some(1)).unwrap();
        let b = layout.candidates(5000)[1];
        assert_eq!(t.region.load(layout.bucket(b)), key_word(5000));
    }

    #[test]
    fn arrays_share_a_region_and_keep_their_entries() {
        let region = Region::zeroed(64 * BUCKET_BYTES);
        let a = Buckets { rkey: Rkey(3), base: 0, count: 24 };
        let b = Buckets { rkey: Rkey(3), base: a.bytes(), count: 40 };
        let entry = |k: u64| Sge { addr: LocalAddr { rkey: Rkey(9), offset: k * 64 }, len: 48 };
        for k in 1..=9u64 {
            place(&region, a, tag(k), entry(k), None).unwrap();
            place(&region, b, tag(k), entry(k + 100), None).unwrap();
        }
        for k in 1..=9u64 {
            assert_eq!(find(&region, a, tag(k)), Some(entry(k)));
            assert_eq!(find(&region, b, tag(k)), Some(entry(k + 100)));
            for at in b.candidate_offsets(tag(k)) {
                assert!((a.bytes()..a.bytes() + b.bytes()).contains(&at));
            }
        }
        // Filing a key again replaces its entry in place.
        place(&region, a, tag(4), entry(44), None).unwrap();
        assert_eq!(find(&region, a, tag(4)), Some(entry(44)));
        assert_eq!(find(&region, a, tag(10)), None);
    }

    #[test]
    fn tags_fit_an_entry_id_and_are_never_empty() {
        for k in (0..10_000u64).chain([u64::MAX, u64::MAX - 2, 1 << 48, ID_MAX]) {
            let t = tag(k);
            assert!((1..=ID_MAX).contains(&t), "{k}: {t}");
        }
        assert_ne!(tag(1), tag(2));
    }

    #[test]
    fn a_full_array_reports_the_entry_it_dropped() {
        let region = Region::zeroed(4 * BUCKET_BYTES);
        let b = Buckets { rkey: Rkey(0), base: 0, count: 4 };
        let e = Sge { addr: LocalAddr { rkey: Rkey(0), offset: 0 }, len: 8 };
        let results: Vec<_> = (1..=6u64).map(|k| place(&region, b, k, e, None)).collect();
        let dropped: Vec<u64> = results
            .iter()
            .filter_map(|r| match r {
                Err(TableError::NoBucket(k)) => Some(*k),
                _ => None,
            })
            .collect();
        assert_eq!(dropped.len(), 2, "{results:?}");
        let kept = (1..=6u64).filter(|&k| find(&region, b, k).is_some()).count();
        assert_eq!(kept, 4);
        for k in dropped {
            assert_eq!(find(&region, b, k), None);
        }
    }
}
