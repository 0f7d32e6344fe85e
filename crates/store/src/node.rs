//! A node's share of the store: a replica region of every partition of every table
//! (those the placement gives it hold data; the others stay untouched), and its location
//! cache. Shared by the node's workers (`Arc`), safe across threads: everything inside is
//! atomics or registered memory.

use std::sync::Arc;

use hytra_fabric::{Backend, BackendError, NodeId, Pages, RegionSpec};

use crate::cache::LocationCache;
use crate::catalog::{Catalog, Fill, TableId};
use crate::replica::Replica;

/// What one node holds.
pub struct NodeStore {
    /// The node.
    pub node: NodeId,
    catalog: Arc<Catalog>,
    /// Index: table * replication + slot.
    replicas: Vec<Replica>,
    cache: LocationCache,
}

impl NodeStore {
    /// The bytes of each node's location cache when at most `limit` are allowed: no more
    /// than one entry per key the tables can hold, since each table's band fits its
    /// dense keys exactly (a larger cache would only spread entries over memory that is
    /// never reused).
    pub fn cache_bytes(catalog: &Catalog, limit: u64) -> u64 {
        let keys: u64 = catalog.tables().map(|t| t.capacity * u64::from(catalog.nodes())).sum();
        limit.min(keys * crate::cache::ENTRY_BYTES)
    }

    /// Registers every node's store regions on `backend` (the same regions in the same
    /// order everywhere) and builds the node stores. `cache_bytes` bounds each node's
    /// location cache (0: none); it is capped at what the tables' keys can fill.
    pub fn register<B: Backend>(
        backend: &mut B,
        catalog: Catalog,
        cache_bytes: u64,
    ) -> Result<(Arc<Catalog>, Vec<Arc<NodeStore>>), BackendError> {
        let nodes = backend.shape().nodes;
        assert_eq!(catalog.nodes(), nodes, "catalog built for another cluster size");
        let mut first = None;
        for (table, partition, bytes, fill) in catalog.regions() {
            let pages = match fill {
                Fill::Dense => Pages::Huge,
                Fill::Sparse => Pages::Base,
            };
            let rkey = backend.register_all(RegionSpec::new(bytes).with_pages(pages))?;
            let first = *first.get_or_insert(rkey);
            let expect = Catalog::clone(&catalog).with_first_rkey(first).rkey(table, partition);
            assert_eq!(rkey, expect, "store regions registered out of order");
        }
        let first = first.expect("a catalog has at least one table");
        let catalog = Arc::new(catalog.with_first_rkey(first));
        let stores = (0..nodes)
            .map(|n| {
                let node = NodeId(n);
                let replicas = catalog
                    .regions()
                    .map(|(table, partition, _, _)| {
                        let rkey = catalog.rkey(table, partition);
                        let region = backend.region(node, rkey).expect("region just registered");
                        Replica::new(table, partition, rkey, region, catalog.geometry(table))
                    })
                    .collect();
                Arc::new(NodeStore {
                    node,
                    catalog: catalog.clone(),
                    replicas,
                    cache: NodeStore::new_cache(&catalog, cache_bytes),
                })
            })
            .collect();
        Ok((catalog, stores))
    }

    /// This node's store after a restart wiped its memory: empty replicas over the same
    /// regions, an empty location cache of `cache_bytes` at most (as given to
    /// [`NodeStore::register`]). The regions must be all zeroes.
    pub fn reborn(&self, cache_bytes: u64) -> NodeStore {
        let catalog = self.catalog.clone();
        let replicas = self
            .replicas
            .iter()
            .map(|r| {
                let region = r.region().clone();
                assert!(
                    region.len_bytes() < 8 || region.load(0) == 0,
                    "a reborn replica's region is wiped"
                );
                Replica::new(r.table, r.partition, r.rkey, region, catalog.geometry(r.table))
            })
            .collect();
        let cache = NodeStore::new_cache(&catalog, cache_bytes);
        NodeStore { node: self.node, catalog, replicas, cache }
    }

    /// An empty location cache of `limit` bytes at most, with a band for every table's
    /// keys on every node.
    fn new_cache(catalog: &Catalog, limit: u64) -> LocationCache {
        LocationCache::new(NodeStore::cache_bytes(catalog, limit), &Self::cache_keys(catalog))
    }

    /// Whether each node's location cache of `limit` bytes at most has a set for every
    /// block of its tables' keys: dense keys then fill it without an eviction, and nodes
    /// that know the same partitions can share one warm image of it.
    pub fn cache_holds_every_key(catalog: &Catalog, limit: u64) -> bool {
        let bytes = NodeStore::cache_bytes(catalog, limit);
        LocationCache::holds_every_key(bytes, &Self::cache_keys(catalog))
    }

    /// Each table and its keys on every node, as the location cache sizes its bands.
    fn cache_keys(catalog: &Catalog) -> Vec<(TableId, u64)> {
        let nodes = u64::from(catalog.nodes());
        catalog.tables().map(|t| (t.id, t.capacity * nodes)).collect()
    }

    /// The catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// This node's replica region of `partition` of `table` (whether the placement gives
    /// the node that partition is the caller's business).
    pub fn replica(&self, table: TableId, partition: u16) -> &Replica {
        &self.replicas
            [usize::from(table.0) * usize::from(self.catalog.partitions()) + usize::from(partition)]
    }

    /// [`NodeStore::replica`], or `None` if the catalog has no such table or partition
    /// (for placements read from elsewhere).
    pub fn replica_at(&self, table: TableId, partition: u16) -> Option<&Replica> {
        let exists = usize::from(table.0) < self.catalog.tables().count()
            && partition < self.catalog.partitions();
        exists.then(|| self.replica(table, partition))
    }

    /// The location cache.
    pub fn cache(&self) -> &LocationCache {
        &self.cache
    }

    /// Every replica region of this node (of every partition, held or not).
    pub fn replicas(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter()
    }
}
