//! The history format: what an engine records about each committed transaction.

/// Identifies a record: (table, key).
#[derive(
    Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
pub struct Key {
    /// Table id.
    pub table: u16,
    /// Key within the table.
    pub key: u64,
}

/// Identifies a committed transaction (unique within a history).
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TxnId(pub u64);

/// One access: a record and a version of it.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct Access {
    /// The record.
    pub key: Key,
    /// For a read, the version read; for a write, the version installed.
    pub version: u64,
    /// A digest of the record's contents as read or installed, so that a read of a
    /// version whose contents are not what its writer installed (torn, or corrupted on
    /// the way) is caught even though its version number is right. 0: not recorded
    /// (the record held no value, or the engine keeps no digests).
    #[serde(default)]
    pub digest: u64,
}

/// What one committed transaction did.
#[derive(Clone, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TxnRecord {
    /// Unique id (the checker reports cycles with it).
    pub id: u64,
    /// Versions read (a key read and then written appears in both lists).
    pub reads: Vec<Access>,
    /// Versions installed; each must be exactly one more than the key's previous version.
    pub writes: Vec<Access>,
}

/// A history: the committed transactions of a run, in any order.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// The transactions.
    pub txns: Vec<TxnRecord>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        History::default()
    }

    /// Adds a transaction.
    pub fn push(&mut self, t: TxnRecord) {
        self.txns.push(t);
    }

    /// Adds every transaction of another history (e.g. another worker's).
    pub fn extend(&mut self, other: History) {
        self.txns.extend(other.txns);
    }
}
