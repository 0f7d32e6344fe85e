//! Messages of the I/O service, carried as runtime RPC frames over datagrams.
//!
//! A read is two one-way messages: `READ` from the requester, `DONE` from the owner once
//! the data is in the requester's buffer (or carried in `DONE` itself for small reads).
//! One-way messages, not a call, because the owner answers after its I/O completes, long
//! after the handler that received the request returned.

use hytra_fabric::Rkey;
use hytra_rt::RpcType;

use crate::export::FileId;

/// Request to read (requester to owner, one-way).
pub const READ: RpcType = RpcType(48);
/// Completion of a read (owner to requester, one-way).
pub const DONE: RpcType = RpcType(49);
/// Name to file id and size (a call, answered inline).
pub const LOOKUP: RpcType = RpcType(50);
/// A requester is finished with this server worker (one-way).
pub const BYE: RpcType = RpcType(51);

/// How a read ended, as `DONE` reports it.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum ReadStatus {
    /// The bytes are in the requester's buffer.
    Ok = 0,
    /// No file with that id is exported.
    UnknownFile = 1,
    /// The range ends past the end of the file.
    PastEnd = 2,
    /// Longer than the service's maximum read.
    TooLarge = 3,
    /// The storage read failed.
    IoFailed = 4,
    /// The service's queue was full.
    Busy = 5,
    /// The request was malformed.
    Malformed = 6,
    /// The owner could not WRITE into the buffer the request named (wrong key or range).
    BadBuffer = 7,
}

impl ReadStatus {
    fn from_u8(b: u8) -> Option<ReadStatus> {
        use ReadStatus::*;
        [Ok, UnknownFile, PastEnd, TooLarge, IoFailed, Busy, Malformed, BadBuffer]
            .get(usize::from(b))
            .copied()
    }
}

/// A read request.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct ReadReq {
    /// The requester's identifier of this read.
    pub req_id: u64,
    /// Which file.
    pub file: FileId,
    /// Where in the file.
    pub offset: u64,
    /// How many bytes.
    pub len: u32,
    /// The requester's buffer: region and offset (8-byte aligned) on the requester's node.
    pub dst_rkey: Rkey,
    /// See `dst_rkey`.
    pub dst_offset: u64,
}

/// Encoded size of [`ReadReq`].
pub const READ_REQ_LEN: usize = 36;

impl ReadReq {
    /// Appends the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.req_id.to_le_bytes());
        out.extend_from_slice(&self.file.0.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.dst_rkey.0.to_le_bytes());
        out.extend_from_slice(&self.dst_offset.to_le_bytes());
    }

    /// Decodes a request; `None` if the bytes are not one.
    pub fn decode(b: &[u8]) -> Option<ReadReq> {
        if b.len() != READ_REQ_LEN {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Some(ReadReq {
            req_id: u64_at(0),
            file: FileId(u32_at(8)),
            offset: u64_at(12),
            len: u32_at(20),
            dst_rkey: Rkey(u32_at(24)),
            dst_offset: u64_at(28),
        })
    }
}

/// Header size of a `DONE` message (the data of an inline read follows it).
pub const DONE_HEADER_LEN: usize = 13;

/// The largest read whose data fits inside its `DONE` datagram: what `inline_max` may
/// be. A larger setting would put reads in datagrams no worker can send.
pub const INLINE_MAX: u32 = (hytra_rt::constants::RPC_PAYLOAD_MAX - DONE_HEADER_LEN) as u32;

/// Appends a `DONE` message to `out`.
pub fn encode_done(out: &mut Vec<u8>, req_id: u64, status: ReadStatus, len: u32, data: &[u8]) {
    out.extend_from_slice(&req_id.to_le_bytes());
    out.push(status as u8);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(data);
}

/// Decodes a `DONE` message: request id, status, length, inline data (empty when the
/// data went by WRITE).
pub fn decode_done(b: &[u8]) -> Option<(u64, ReadStatus, u32, &[u8])> {
    if b.len() < DONE_HEADER_LEN {
        return None;
    }
    let req_id = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let status = ReadStatus::from_u8(b[8])?;
    let len = u32::from_le_bytes(b[9..13].try_into().expect("4 bytes"));
    Some((req_id, status, len, &b[DONE_HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let r = ReadReq {
            req_id: 7,
            file: FileId(3),
            offset: 1 << 40,
            len: 16384,
            dst_rkey: Rkey(2),
            dst_offset: 4096,
        };
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(b.len(), READ_REQ_LEN);
        assert_eq!(ReadReq::decode(&b), Some(r));
        assert_eq!(ReadReq::decode(&b[1..]), None);
        b.clear();
        encode_done(&mut b, 9, ReadStatus::PastEnd, 5, b"hello");
        assert_eq!(decode_done(&b), Some((9, ReadStatus::PastEnd, 5, &b"hello"[..])));
        b[8] = 99;
        assert_eq!(decode_done(&b), None);
    }
}
