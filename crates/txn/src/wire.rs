//! Wire formats of the engine's RPCs (little endian, fixed fields first).
//!
//! Requests are small structs encoded by hand; every decoder checks lengths and returns
//! `None` on malformed input (never trust the network). Not for: what the handlers do
//! (see `handlers.rs`).

use hytra_rt::RpcType;

/// Read a record (execution phase, two-sided or hybrid miss).
pub const READ: RpcType = RpcType(1);
/// Lock a record (two-sided locking, inserts).
pub const LOCK: RpcType = RpcType(2);
/// Return a record's lock and version (two-sided validation).
pub const VALIDATE: RpcType = RpcType(3);
/// Write back and unlock (two-sided commit).
pub const COMMIT: RpcType = RpcType(4);
/// Release a lock if the sender's attempt holds it.
pub const UNLOCK: RpcType = RpcType(5);
/// Put a log entry into the sender's ring (two-sided logging).
pub const LOG: RpcType = RpcType(6);
/// Apply the sender's committed log entries up to a position (lazy, one-way).
pub const RECLAIM: RpcType = RpcType(7);

/// The first RPC type a workload may register its own handlers for; the engine's types
/// stay below it.
pub const WORKLOAD_TYPES_FIRST: u16 = 32;

/// Flag of READ: also return the record's offset (to fill the location cache).
pub const WANT_OFFSET: u8 = 1;
/// Flag of READ: lock the record for the sender (FaSST's locking at execution).
pub const LOCK_IT: u8 = 2;
/// Flag of LOCK: create the record (absent) if it does not exist (inserts).
pub const CREATE: u8 = 4;
/// Flag of COMMIT: the write is a delete (install an absent version).
pub const DELETE: u8 = 8;
/// Flag of RECLAIM: reply with the ring's head once applied (a synchronous flush).
pub const SYNC: u8 = 16;
/// Flag of LOCK: find (with `CREATE`, create) the record and answer its offset, lock and
/// version, but lock nothing: the sender locks it by NIC CAS. Explicit rather than
/// inferred from the fabric, so that a coherent fabric's handler never takes a CPU lock
/// for an attempt whose NIC CAS would then find it held (docs/INVARIANTS.md S1).
pub const NO_LOCK: u8 = 32;

/// Status byte of replies.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// No such record.
    Absent = 1,
    /// Held by another transaction.
    Locked = 2,
    /// Torn by a concurrent write-back; try again.
    Torn = 3,
    /// The record is not in this node's partition, or the request is malformed.
    Refused = 4,
    /// A store limit was hit (partition full).
    Full = 5,
    /// The request's configuration epoch is not the one in force here: nothing was done.
    Stale = 6,
}

impl Status {
    /// Decodes a status byte.
    pub fn from_u8(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Ok,
            1 => Status::Absent,
            2 => Status::Locked,
            3 => Status::Torn,
            4 => Status::Refused,
            5 => Status::Full,
            6 => Status::Stale,
            _ => return None,
        })
    }
}

/// Appends little-endian fields.
pub struct Out<'a>(pub &'a mut Vec<u8>);

impl Out<'_> {
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Two bytes.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Four bytes.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Eight bytes.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Words.
    pub fn words(&mut self, ws: &[u64]) -> &mut Self {
        for w in ws {
            self.u64(*w);
        }
        self
    }
}

/// Reads little-endian fields; every getter returns `None` past the end.
pub struct In<'a>(pub &'a [u8]);

impl In<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    /// One byte.
    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    /// Two bytes.
    pub fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    /// Four bytes.
    pub fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    /// Eight bytes.
    pub fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    /// The remaining bytes as words (`None` unless a multiple of 8).
    pub fn rest_words(&mut self, out: &mut Vec<u64>) -> Option<()> {
        if self.0.len() % 8 != 0 {
            return None;
        }
        out.clear();
        out.extend(
            self.0.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
        );
        self.0 = &[];
        Some(())
    }
    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.0.len()
    }
}

/// A record request: table, flags, epoch, key, owner (READ, LOCK, VALIDATE, UNLOCK).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct RecordReq {
    /// Table id.
    pub table: u16,
    /// Flags (`WANT_OFFSET`, `LOCK_IT`, `CREATE`, `NO_LOCK`).
    pub flags: u8,
    /// The sender's configuration epoch (its low 32 bits).
    pub epoch: u32,
    /// Key.
    pub key: u64,
    /// Lock owner (0 if the request locks nothing).
    pub owner: u64,
}

impl RecordReq {
    /// Encodes into `buf` (cleared first).
    pub fn encode(&self, buf: &mut Vec<u8>) {
        buf.clear();
        Out(buf).u16(self.table).u8(self.flags).u8(0).u32(self.epoch).u64(self.key).u64(self.owner);
    }

    /// Decodes.
    pub fn decode(b: &[u8]) -> Option<RecordReq> {
        let mut i = In(b);
        let (table, flags) = (i.u16()?, i.u8()?);
        i.u8()?;
        let epoch = i.u32()?;
        let (key, owner) = (i.u64()?, i.u64()?);
        (i.remaining() == 0).then_some(RecordReq { table, flags, epoch, key, owner })
    }
}

/// Reply to READ, LOCK and VALIDATE: status, lock, version, offset, then (READ only) the
/// payload words.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RecordReply {
    /// Outcome.
    pub status: Status,
    /// Lock word seen.
    pub lock: u64,
    /// Version word seen (or locked at).
    pub version: u64,
    /// Record offset at the primary (0 if not asked for or absent).
    pub offset: u64,
}

impl RecordReply {
    /// Bytes before the payload.
    pub const FIXED: usize = 32;

    /// Encodes the fixed part into `buf` (appending; the payload follows).
    pub fn encode(&self, buf: &mut Vec<u8>) {
        Out(buf)
            .u8(self.status as u8)
            .u8(0)
            .u16(0)
            .u32(0)
            .u64(self.lock)
            .u64(self.version)
            .u64(self.offset);
    }

    /// Decodes the fixed part; the payload words go to `payload`.
    pub fn decode(b: &[u8], payload: &mut Vec<u64>) -> Option<RecordReply> {
        let mut i = In(b);
        let status = Status::from_u8(i.u8()?)?;
        i.u8()?;
        i.u16()?;
        i.u32()?;
        let (lock, version, offset) = (i.u64()?, i.u64()?, i.u64()?);
        i.rest_words(payload)?;
        Some(RecordReply { status, lock, version, offset })
    }
}

/// COMMIT: write back a record's new version and payload, then unlock.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CommitReq {
    /// Table id.
    pub table: u16,
    /// `DELETE` or 0.
    pub flags: u8,
    /// The sender's configuration epoch (its low 32 bits).
    pub epoch: u32,
    /// Key.
    pub key: u64,
    /// Lock owner.
    pub owner: u64,
    /// Version word to install.
    pub version: u64,
}

impl CommitReq {
    /// Encodes with the payload into `buf` (cleared first).
    pub fn encode(&self, payload: &[u64], buf: &mut Vec<u8>) {
        buf.clear();
        Out(buf)
            .u16(self.table)
            .u8(self.flags)
            .u8(0)
            .u32(self.epoch)
            .u64(self.key)
            .u64(self.owner)
            .u64(self.version)
            .words(payload);
    }

    /// Decodes; the payload goes to `payload`.
    pub fn decode(b: &[u8], payload: &mut Vec<u64>) -> Option<CommitReq> {
        let mut i = In(b);
        let (table, flags) = (i.u16()?, i.u8()?);
        i.u8()?;
        let epoch = i.u32()?;
        let (key, owner, version) = (i.u64()?, i.u64()?, i.u64()?);
        i.rest_words(payload)?;
        Some(CommitReq { table, flags, epoch, key, owner, version })
    }
}

/// LOG: a log entry and where it goes in the sender's ring.
pub fn encode_log(position: u64, entry: &[u64], buf: &mut Vec<u8>) {
    buf.clear();
    Out(buf).u64(position).words(entry);
}

/// Decodes LOG: (position, entry words into `entry`).
pub fn decode_log(b: &[u8], entry: &mut Vec<u64>) -> Option<u64> {
    let mut i = In(b);
    let position = i.u64()?;
    i.rest_words(entry)?;
    Some(position)
}

/// RECLAIM: apply the sender's ring up to `up_to`, sent under configuration `epoch`
/// (the backup refuses it under another, or while recovering: the ring's head may be
/// about to move).
pub fn encode_reclaim(flags: u8, epoch: u32, up_to: u64, buf: &mut Vec<u8>) {
    buf.clear();
    Out(buf).u8(flags).u8(0).u16(0).u32(epoch).u64(up_to);
}

/// Decodes RECLAIM: (flags, epoch, up_to).
pub fn decode_reclaim(b: &[u8]) -> Option<(u8, u32, u64)> {
    let mut i = In(b);
    let flags = i.u8()?;
    i.u8()?;
    i.u16()?;
    let epoch = i.u32()?;
    let up_to = i.u64()?;
    (i.remaining() == 0).then_some((flags, epoch, up_to))
}

/// The answer of a LOG, RECLAIM or COMMIT the receiver refused for now (it is
/// recovering, or the request is of another epoch): not a ring head, never an
/// acknowledgement.
pub const REFUSED: u64 = u64::MAX;

/// The answer of a LOG whose entry the backup could not decode or place: not a ring
/// head, never an acknowledgement (the transaction is not logged there). A coordinator
/// never sends such an entry; one that is answered so has a bug.
pub const MALFORMED: u64 = u64::MAX - 1;

/// An eight-byte reply (an acknowledgement, or a ring head).
pub fn encode_word(v: u64, buf: &mut Vec<u8>) {
    Out(buf).u64(v);
}

/// Decodes an eight-byte reply.
pub fn decode_word(b: &[u8]) -> Option<u64> {
    let mut i = In(b);
    let v = i.u64()?;
    (i.remaining() == 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_truncation() {
        let mut buf = Vec::new();
        let r = RecordReq { table: 3, flags: WANT_OFFSET | LOCK_IT, epoch: 5, key: 99, owner: 7 };
        r.encode(&mut buf);
        assert_eq!(RecordReq::decode(&buf), Some(r));
        assert_eq!(RecordReq::decode(&buf[..buf.len() - 1]), None);
        buf.clear();
        let rep = RecordReply { status: Status::Locked, lock: 5, version: 6, offset: 4096 };
        rep.encode(&mut buf);
        Out(&mut buf).words(&[11, 12]);
        let mut p = Vec::new();
        assert_eq!(RecordReply::decode(&buf, &mut p), Some(rep));
        assert_eq!(p, vec![11, 12]);
        buf.push(0);
        assert_eq!(RecordReply::decode(&buf, &mut p), None, "ragged payload");
        let c = CommitReq { table: 1, flags: DELETE, epoch: 5, key: 2, owner: 3, version: 4 };
        c.encode(&[8, 9], &mut buf);
        assert_eq!(CommitReq::decode(&buf, &mut p), Some(c));
        assert_eq!(p, vec![8, 9]);
        encode_log(64, &[1, 2, 3], &mut buf);
        assert_eq!(decode_log(&buf, &mut p), Some(64));
        encode_reclaim(SYNC, 7, 128, &mut buf);
        assert_eq!(decode_reclaim(&buf), Some((SYNC, 7, 128)));
        assert_eq!(Status::from_u8(9), None);
        assert_eq!(Status::from_u8(Status::Stale as u8), Some(Status::Stale));
    }
}
