//! A two-choice hash table laid out for the NIC: a bucket is one entry's key (in the
//! id-field form a CAS can compare with a WQE header) and the scatter/gather entry of its
//! item, so that one READ of a bucket rewrites a response WQE into "send this item".
//!
//! Bucket (32 bytes): `key << 16`, item offset, item length | region key << 32, unused.
//! Item: `key << 16`, value length, value bytes padded to 8. Key 0 is reserved (empty).
//! Every key lives in one of its two candidate buckets (cuckoo insertion), so a lookup
//! reads at most two buckets (RedN §5.2 uses two hashes).

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
    /// Both candidate buckets stayed taken after the displacements.
    #[error("no bucket for key {0:#x}")]
    NoBucket(u64),
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

    /// Offset of bucket `b`.
    pub fn bucket(&self, b: u64) -> u64 {
        b * BUCKET_BYTES
    }

    /// The two candidate buckets of `key` (distinct when there are at least two).
    pub fn candidates(&self, key: u64) -> [u64; 2] {
        let h1 = mix(key) % self.buckets;
        let mut h2 = mix(key ^ 0x9E37_79B9_7F4A_7C15) % self.buckets;
        if h2 == h1 && self.buckets > 1 {
            h2 = (h1 + 1) % self.buckets;
        }
        [h1, h2]
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
        let c = self.layout.candidates(key);
        for b in c {
            if self.bucket_key(b) == key_word(key) {
                self.store_bucket(b, key, item);
                return Ok(());
            }
        }
        let mut b = match which {
            Some(w) => c[w],
            None => *c.iter().find(|&&b| self.bucket_key(b) == 0).unwrap_or(&c[0]),
        };
        let (mut k, mut it) = (key, item);
        for _ in 0..KICKS_MAX {
            let old = self.load_bucket(b);
            self.store_bucket(b, k, it);
            if old.0 == 0 {
                return Ok(());
            }
            // Move the evicted entry to its other candidate.
            let (ok, oitem) = (old.0 >> 16, old.1);
            let oc = self.layout.candidates(ok);
            b = if oc[0] == b { oc[1] } else { oc[0] };
            (k, it) = (ok, oitem);
        }
        Err(TableError::NoBucket(key))
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

    fn bucket_key(&self, b: u64) -> u64 {
        self.region.load(self.layout.bucket(b))
    }

    fn load_bucket(&self, b: u64) -> (u64, Sge) {
        let mut w = [0u64; 3];
        self.region.read_words(self.layout.bucket(b), &mut w);
        (w[0], Sge::from_words(w[1], w[2]))
    }

    fn store_bucket(&self, b: u64, key: u64, item: Sge) {
        let [a, l] = item.words();
        self.region.write_words(self.layout.bucket(b), &[key_word(key), a, l]);
    }

    /// Offset of `key`'s item, if present.
    pub fn item_of(&self, key: u64) -> Option<u64> {
        self.layout.candidates(key).into_iter().find_map(|b| {
            let (k, sge) = self.load_bucket(b);
            (k == key_word(key)).then_some(sge.addr.offset)
        })
    }

    /// The CPU lookup: the value of `key`, if present.
    pub fn get(&self, key: u64) -> Option<Vec<u8>> {
        lookup(&self.region, self.layout, key)
    }
}

/// The CPU lookup over a table's region (the server's two-sided path and the reference
/// the other paths are checked against).
pub fn lookup(region: &Region, layout: TableLayout, key: u64) -> Option<Vec<u8>> {
    if key == 0 || key > ID_MAX {
        return None;
    }
    for b in layout.candidates(key) {
        let mut w = [0u64; 3];
        region.read_words(layout.bucket(b), &mut w);
        if w[0] == key_word(key) {
            let sge = Sge::from_words(w[1], w[2]);
            return Some(read_item(region, sge.addr.offset));
        }
    }
    None
}

/// Bytes an item of a `value_len`-byte value takes.
pub fn item_bytes(value_len: usize) -> u64 {
    ITEM_HEADER + (value_len as u64).div_ceil(8) * 8
}

/// Writes an item (key word, value length, value padded to 8) at `at` of `region` and
/// returns its scatter/gather entry.
pub(crate) fn write_item(region: &Region, at: LocalAddr, key: u64, value: &[u8]) -> Sge {
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
}
