//! hytra's store: tables in registered memory, reachable by the local CPU and by remote
//! one-sided verbs alike.
//!
//! - `layout`: record and bucket layouts (one lock word, one version, key, checksum)
//! - `catalog`: tables, partitions, region keys
//! - `placement`: which nodes hold each partition (primary and backups)
//! - `replica`: one replica's hash index and records, as the local CPU operates them
//! - `cache`: the per-node location cache of remote record offsets
//! - `node`: a node's replicas and cache, and their registration on a backend
//!
//! See docs/INVARIANTS.md (S1-S5) for the rules that make CPU and NIC access safe
//! together.

pub mod cache;
pub mod catalog;
pub mod layout;
pub mod node;
pub mod placement;
pub mod replica;

pub use cache::LocationCache;
pub use catalog::{
    Catalog, CatalogError, Fill, Geometry, IndexLayout, Partitioner, TableId, TableSpec,
};
pub use layout::{Owner, RecordHeader};
pub use node::NodeStore;
pub use placement::{BackupState, PartitionPlace, Placement};
pub use replica::{take_word, ImageDecodeError, Replica, ReplicaImage, Snapshot, StoreError};
