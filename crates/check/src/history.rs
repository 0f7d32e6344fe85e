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

/// One access: a record and a version of it. It serializes as the tuple `[table, key,
/// version, digest]`: a cluster's processes journal and ship every access of every
/// transaction, and the named form was twice as long.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Access {
    /// The record.
    pub key: Key,
    /// For a read, the version read; for a write, the version installed.
    pub version: u64,
    /// A digest of the record's contents as read or installed, so that a read of a
    /// version whose contents are not what its writer installed (torn, or corrupted on
    /// the way) is caught even though its version number is right. 0: not recorded
    /// (the record held no value, or the engine keeps no digests).
    pub digest: u64,
}

impl serde::Serialize for Access {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.key.table, self.key.key, self.version, self.digest).serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Access {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Access, D::Error> {
        let (table, key, version, digest) = <(u16, u64, u64, u64)>::deserialize(d)?;
        Ok(Access { key: Key { table, key }, version, digest })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_with_its_accesses_as_tuples() {
        let acc = |table, key, version, digest| Access { key: Key { table, key }, version, digest };
        let r = TxnRecord {
            id: 7,
            reads: vec![acc(1, u64::MAX, 3, 0), acc(65535, 0, u64::MAX, 1)],
            writes: vec![acc(2, 42, 4, 0xDEAD_BEEF)],
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            json,
            r#"{"id":7,"reads":[[1,18446744073709551615,3,0],[65535,0,18446744073709551615,1]],"writes":[[2,42,4,3735928559]]}"#
        );
        assert_eq!(serde_json::from_str::<TxnRecord>(&json).unwrap(), r);
        // A tuple of the wrong length or type is refused, not read as something else.
        assert!(serde_json::from_str::<Access>("[1,2,3]").is_err());
        assert!(serde_json::from_str::<Access>("[70000,2,3,4]").is_err());
    }
}
