//! Where the cluster's configuration is committed: a store with compare-and-set on the
//! epoch, so that of two configuration managers that each believe they lead, exactly one
//! moves the cluster to the next epoch (FaRM commits its configurations to ZooKeeper the
//! same way). The engine only ever asks it two things: what is stored, and "replace epoch
//! `e` with this one". Not for: agreement among the nodes themselves (the store is the
//! one arbiter; nodes never vote).
//!
//! [`MemoryStore`] is the store of a cluster in one process (the simulator, threads); a
//! cluster of processes uses one held by its launcher or an etcd server, behind the
//! same trait.

use std::sync::Mutex;

use thiserror::Error;

/// Why the store could not answer.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreFailure {
    /// The store is out of reach or failed; the caller may try again later.
    #[error("configuration store unavailable: {0}")]
    Unavailable(String),
}

/// The outcome of a compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas {
    /// Stored: the new configuration is committed.
    Done,
    /// Another configuration was stored first: this one (epoch, bytes) is in force.
    Lost(u64, Vec<u8>),
}

/// A store of one encoded configuration, replaced by compare-and-set on its epoch.
pub trait ConfigStore: Send + Sync {
    /// The stored configuration (epoch, bytes), if any.
    fn get(&self) -> Result<Option<(u64, Vec<u8>)>, StoreFailure>;

    /// Stores `bytes` as epoch `epoch` if the stored epoch is `expected` (or nothing is
    /// stored and `expected` is 0).
    fn cas(&self, expected: u64, epoch: u64, bytes: &[u8]) -> Result<Cas, StoreFailure>;
}

/// A store in this process's memory.
#[derive(Default)]
pub struct MemoryStore {
    value: Mutex<Option<(u64, Vec<u8>)>>,
}

impl ConfigStore for MemoryStore {
    fn get(&self) -> Result<Option<(u64, Vec<u8>)>, StoreFailure> {
        Ok(self.value.lock().expect("no store user panicked").clone())
    }

    fn cas(&self, expected: u64, epoch: u64, bytes: &[u8]) -> Result<Cas, StoreFailure> {
        assert!(epoch > expected, "epoch {epoch} does not follow {expected}");
        let mut value = self.value.lock().expect("no store user panicked");
        let current = value.as_ref().map_or(0, |(e, _)| *e);
        if current != expected {
            let (e, b) = value.clone().expect("a stored configuration");
            return Ok(Cas::Lost(e, b));
        }
        *value = Some((epoch, bytes.to_vec()));
        Ok(Cas::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_expected_epoch_is_replaced() {
        let s = MemoryStore::default();
        assert_eq!(s.get(), Ok(None));
        assert_eq!(s.cas(0, 1, b"one"), Ok(Cas::Done));
        assert_eq!(s.cas(0, 2, b"two"), Ok(Cas::Lost(1, b"one".to_vec())));
        assert_eq!(s.cas(1, 2, b"two"), Ok(Cas::Done));
        assert_eq!(s.get(), Ok(Some((2, b"two".to_vec()))));
    }
}
