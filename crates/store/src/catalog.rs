//! Tables, partitions and their regions.
//!
//! A table is split into one partition per node. Every node registers one region per
//! (table, partition), in the same order everywhere, so a region key names the same
//! (table, partition) on every node; which nodes hold a partition (its primary and
//! backups) is the [`Placement`](crate::Placement)'s business, and changes when nodes
//! fail. A region a node does not hold stays untouched, and untouched memory costs
//! nothing.

use hytra_fabric::Rkey;
use thiserror::Error;

use crate::layout::{BUCKET_BYTES, PAYLOAD_WORDS_MAX, RECORD_HEADER_WORDS};

/// Identifies a table.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TableId(pub u16);

/// How keys map to partitions.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Partitioner {
    /// `key % nodes`: neighbouring keys on different nodes (no locality).
    Modulo,
    /// `(key / keys_per_partition) % nodes`: ranges of keys together (e.g. by warehouse).
    Range {
        /// Keys per range.
        keys_per_partition: u64,
    },
}

/// How a table's index places keys in buckets.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub enum IndexLayout {
    /// Keys hashed over the buckets: any key set spreads evenly.
    #[default]
    Hashed,
    /// Keys numbered densely within their partition (position 0, 1, 2, ... as the
    /// partitioner lays them out): a key's home bucket follows its position, so
    /// neighbouring keys share buckets, a partition filled up to its capacity never
    /// overflows a bucket, and inserting keys in order touches memory in order (tables
    /// that grow during a run, such as orders, then cost memory only for what they hold).
    Sequential,
}

/// A table's shape.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TableSpec {
    /// Id (its index in the catalog).
    pub id: TableId,
    /// Name, for reports.
    pub name: String,
    /// Payload words per record.
    pub payload_words: u16,
    /// Records one partition holds at most.
    pub capacity: u64,
    /// Key to partition.
    pub partitioner: Partitioner,
    /// Key to bucket.
    pub index: IndexLayout,
    /// How much of the region loading fills, which decides how its memory is backed.
    pub fill: Fill,
}

/// How much of a table's region its loaded records fill.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Most of it, and reads land anywhere in it: backed by huge pages where the host
    /// has them, which saves a TLB miss on nearly every random access.
    Dense,
    /// Small islands in a large range (a table sized for the keys a run may insert,
    /// such as TPC-C's orders): base pages, since one huge page per island would make
    /// most of the range resident and zero it for nothing.
    Sparse,
}

/// Why a catalog is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CatalogError {
    /// Replication factor 0 or above the node count.
    #[error("replication factor {replication} is not in 1..={nodes} (the number of nodes)")]
    Replication {
        /// Requested factor.
        replication: u16,
        /// Nodes in the cluster.
        nodes: u16,
    },
    /// A table spec is unusable.
    #[error("table {name}: {reason}")]
    Table {
        /// Table name.
        name: String,
        /// Why.
        reason: String,
    },
}

/// Keys per main bucket a full partition holds (of 7 slots: room for hashing's spread).
const KEYS_PER_BUCKET: u64 = 5;

/// Geometry of one replica region of a table.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Geometry {
    /// Main buckets.
    pub buckets: u64,
    /// Overflow buckets after them.
    pub overflow: u64,
    /// Bytes of one record.
    pub record_bytes: u64,
    /// Records the region holds.
    pub capacity: u64,
    /// Key to bucket, with what `Sequential` needs to find a key's position.
    index: IndexLayout,
    partitioner: Partitioner,
    nodes: u64,
}

impl Geometry {
    fn of(spec: &TableSpec, nodes: u16) -> Geometry {
        // About five keys per 7-slot bucket: one READ finds most keys, and the index
        // costs ~26 bytes per record (about one in eight hashed buckets overflows).
        let buckets = spec.capacity.div_ceil(KEYS_PER_BUCKET).max(1);
        let overflow = spec.capacity / 12 + 16;
        let record_bytes = (RECORD_HEADER_WORDS + u64::from(spec.payload_words)) * 8;
        Geometry {
            buckets,
            overflow,
            record_bytes,
            capacity: spec.capacity,
            index: spec.index,
            partitioner: spec.partitioner,
            nodes: u64::from(nodes),
        }
    }

    /// Byte offset of bucket `i` (main buckets first, then overflow buckets).
    pub fn bucket_offset(&self, i: u64) -> u64 {
        assert!(i < self.buckets + self.overflow, "bucket {i} out of range");
        i * BUCKET_BYTES
    }

    /// Byte offset of the first record.
    pub fn records_offset(&self) -> u64 {
        (self.buckets + self.overflow) * BUCKET_BYTES
    }

    /// Byte offset of record slot `i`.
    pub fn record_offset(&self, i: u64) -> u64 {
        assert!(i < self.capacity, "record {i} beyond capacity {}", self.capacity);
        self.records_offset() + i * self.record_bytes
    }

    /// Bytes of the whole region.
    pub fn region_bytes(&self) -> u64 {
        self.records_offset() + self.capacity * self.record_bytes
    }

    /// Main bucket of a key.
    pub fn home_bucket(&self, key: u64) -> u64 {
        match self.index {
            IndexLayout::Hashed => {
                // Mixing, then multiply-shift range reduction.
                let mut h = key ^ (key >> 31);
                h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                h ^= h >> 29;
                ((u128::from(h) * u128::from(self.buckets)) >> 64) as u64
            }
            IndexLayout::Sequential => {
                let position = match self.partitioner {
                    Partitioner::Modulo => key / self.nodes,
                    Partitioner::Range { keys_per_partition: k } => {
                        key / (k * self.nodes) * k + key % k
                    }
                };
                (position / KEYS_PER_BUCKET) % self.buckets
            }
        }
    }
}

/// All tables and their placement in a cluster.
#[derive(Clone, Debug)]
pub struct Catalog {
    tables: Vec<(TableSpec, Geometry)>,
    nodes: u16,
    replication: u16,
    /// Key of the first region the store registers (tables follow in order).
    first_rkey: Rkey,
}

impl Catalog {
    /// A catalog for `tables` (ids must be 0, 1, 2, ...) on `nodes` nodes with
    /// `replication` copies of every partition.
    pub fn new(
        tables: Vec<TableSpec>,
        nodes: u16,
        replication: u16,
    ) -> Result<Catalog, CatalogError> {
        if replication == 0 || replication > nodes {
            return Err(CatalogError::Replication { replication, nodes });
        }
        let mut out = Vec::with_capacity(tables.len());
        for (i, t) in tables.into_iter().enumerate() {
            let bad =
                |reason: &str| CatalogError::Table { name: t.name.clone(), reason: reason.into() };
            if usize::from(t.id.0) != i {
                return Err(bad("table ids must be 0, 1, 2, ... in order"));
            }
            if t.payload_words == 0 || t.capacity == 0 {
                return Err(bad("payload and capacity must be positive"));
            }
            if t.payload_words > PAYLOAD_WORDS_MAX {
                return Err(bad(&format!(
                    "a record holds at most {PAYLOAD_WORDS_MAX} payload words, not {}",
                    t.payload_words
                )));
            }
            if let Partitioner::Range { keys_per_partition: 0 } = t.partitioner {
                return Err(bad("a range partition holds at least one key"));
            }
            let g = Geometry::of(&t, nodes);
            out.push((t, g));
        }
        Ok(Catalog { tables: out, nodes, replication, first_rkey: Rkey(0) })
    }

    /// Records where the store's regions start (set by the setup code).
    pub fn with_first_rkey(mut self, rkey: Rkey) -> Catalog {
        self.first_rkey = rkey;
        self
    }

    /// Nodes.
    pub fn nodes(&self) -> u16 {
        self.nodes
    }

    /// Replication factor.
    pub fn replication(&self) -> u16 {
        self.replication
    }

    /// Tables.
    pub fn tables(&self) -> impl Iterator<Item = &TableSpec> {
        self.tables.iter().map(|(t, _)| t)
    }

    /// A table's spec.
    pub fn spec(&self, t: TableId) -> &TableSpec {
        &self.tables[usize::from(t.0)].0
    }

    /// A table's replica geometry.
    pub fn geometry(&self, t: TableId) -> Geometry {
        self.tables[usize::from(t.0)].1
    }

    /// Partition of a key.
    pub fn partition(&self, t: TableId, key: u64) -> u16 {
        let n = u64::from(self.nodes);
        let p = match self.spec(t).partitioner {
            Partitioner::Modulo => key % n,
            Partitioner::Range { keys_per_partition } => (key / keys_per_partition) % n,
        };
        p as u16
    }

    /// Partitions of every table (one per node).
    pub fn partitions(&self) -> u16 {
        self.nodes
    }

    /// Region key of (table, partition), the same on every node.
    pub fn rkey(&self, t: TableId, partition: u16) -> Rkey {
        assert!(partition < self.nodes, "partition {partition} of {} nodes", self.nodes);
        Rkey(self.first_rkey.0 + u32::from(t.0) * u32::from(self.nodes) + u32::from(partition))
    }

    /// Regions the store registers on every node, in registration order: (table,
    /// partition, bytes, fill).
    pub fn regions(&self) -> impl Iterator<Item = (TableId, u16, u64, Fill)> + '_ {
        self.tables.iter().flat_map(move |(t, g)| {
            (0..self.nodes).map(move |p| (t.id, p, g.region_bytes(), t.fill))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(id: u16, capacity: u64) -> TableSpec {
        TableSpec {
            id: TableId(id),
            name: format!("t{id}"),
            payload_words: 1,
            capacity,
            partitioner: Partitioner::Modulo,
            index: IndexLayout::Hashed,
            fill: Fill::Dense,
        }
    }

    #[test]
    fn every_node_has_a_region_per_table_and_partition() {
        let c = Catalog::new(vec![table(0, 100), table(1, 50)], 5, 3).unwrap();
        assert_eq!(c.rkey(TableId(1), 2), Rkey(7));
        assert_eq!(c.regions().count(), 10);
        let keys: Vec<Rkey> = c.regions().map(|(t, p, _, _)| c.rkey(t, p)).collect();
        assert_eq!(keys, (0..10).map(Rkey).collect::<Vec<_>>(), "registration order");
    }

    #[test]
    fn bad_catalogs_are_refused() {
        assert_eq!(
            Catalog::new(vec![table(0, 1)], 2, 3).unwrap_err(),
            CatalogError::Replication { replication: 3, nodes: 2 }
        );
        assert!(Catalog::new(vec![table(1, 1)], 2, 1).is_err());
        assert!(Catalog::new(vec![table(0, 0)], 2, 1).is_err());
    }

    #[test]
    fn geometry_fits_the_region() {
        let g = Geometry::of(&table(0, 1000), 1);
        assert_eq!(g.buckets, 200);
        assert_eq!(g.record_offset(999) + g.record_bytes, g.region_bytes());
        let spread =
            (0..10_000u64).map(|k| g.home_bucket(k)).collect::<std::collections::BTreeSet<_>>();
        assert_eq!(spread.len() as u64, g.buckets, "every bucket used");
    }
}
