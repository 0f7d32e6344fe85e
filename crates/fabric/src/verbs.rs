//! Work requests, flags, completions and errors: the vocabulary of the data path.
//!
//! Not for: executing anything. Backends interpret these values; `exec` applies their
//! memory effects so that every backend changes memory the same way.

use thiserror::Error;

use crate::ids::{LocalAddr, RemoteAddr, WrId};

/// A one-sided operation on a reliable connection.
#[derive(Copy, Clone, Debug)]
pub enum WorkRequest<'a> {
    /// Copy `len` bytes from `remote` into the poster's `local` buffer.
    Read {
        /// Source.
        remote: RemoteAddr,
        /// Destination on the posting node; its contents are undefined until completion.
        local: LocalAddr,
        /// Bytes, a multiple of 8.
        len: u32,
    },
    /// Copy bytes to `remote`.
    Write {
        /// Destination.
        remote: RemoteAddr,
        /// Source of the payload.
        src: WriteSrc<'a>,
    },
    /// Compare-and-swap one 8-byte word. The old value lands in `local` (so an unsignaled
    /// CAS still yields it once a later request completes) and in the completion.
    Cas {
        /// Target word, 8-byte aligned.
        remote: RemoteAddr,
        /// Where the old value is written on the posting node (8 bytes).
        local: LocalAddr,
        /// Expected value.
        compare: u64,
        /// New value if the word equals `compare`.
        swap: u64,
    },
    /// Fetch-and-add on one 8-byte word (wrapping); the old value lands in `local` and in
    /// the completion.
    Faa {
        /// Target word, 8-byte aligned.
        remote: RemoteAddr,
        /// Where the old value is written on the posting node (8 bytes).
        local: LocalAddr,
        /// Addend.
        add: u64,
    },
}

/// Where a WRITE's payload comes from.
#[derive(Copy, Clone, Debug)]
pub enum WriteSrc<'a> {
    /// A registered buffer of the posting node, read by the NIC some time before the
    /// completion: it must not change until then (unless the WRITE is `inline`).
    Local {
        /// Buffer start.
        addr: LocalAddr,
        /// Bytes, a multiple of 8.
        len: u32,
    },
    /// Bytes copied into the work request at post time; requires [`OpFlags::INLINE`].
    Bytes(&'a [u8]),
}

impl WorkRequest<'_> {
    /// The remote address the operation targets.
    pub fn remote(&self) -> RemoteAddr {
        match *self {
            WorkRequest::Read { remote, .. }
            | WorkRequest::Write { remote, .. }
            | WorkRequest::Cas { remote, .. }
            | WorkRequest::Faa { remote, .. } => remote,
        }
    }

    /// The remote address, to point the same request elsewhere (a client that posts the
    /// same kind of batch again only redraws where each request goes).
    pub fn remote_mut(&mut self) -> &mut RemoteAddr {
        match self {
            WorkRequest::Read { remote, .. }
            | WorkRequest::Write { remote, .. }
            | WorkRequest::Cas { remote, .. }
            | WorkRequest::Faa { remote, .. } => remote,
        }
    }

    /// The posting node's buffer the operation reads from or writes into, if any.
    pub fn local(&self) -> Option<(LocalAddr, u32)> {
        match *self {
            WorkRequest::Read { local, len, .. } => Some((local, len)),
            WorkRequest::Write { src: WriteSrc::Local { addr, len }, .. } => Some((addr, len)),
            WorkRequest::Write { src: WriteSrc::Bytes(_), .. } => None,
            WorkRequest::Cas { local, .. } | WorkRequest::Faa { local, .. } => Some((local, 8)),
        }
    }

    /// The operation's kind.
    pub fn kind(&self) -> OpKind {
        match self {
            WorkRequest::Read { .. } => OpKind::Read,
            WorkRequest::Write { .. } => OpKind::Write,
            WorkRequest::Cas { .. } => OpKind::Cas,
            WorkRequest::Faa { .. } => OpKind::Faa,
        }
    }

    /// Bytes of payload moved (8 for atomics).
    pub fn payload_len(&self) -> u32 {
        match *self {
            WorkRequest::Read { len, .. } => len,
            WorkRequest::Write { src: WriteSrc::Local { len, .. }, .. } => len,
            WorkRequest::Write { src: WriteSrc::Bytes(b), .. } => b.len() as u32,
            WorkRequest::Cas { .. } | WorkRequest::Faa { .. } => 8,
        }
    }
}

/// Kinds of operations, for costs, statistics and traces.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum OpKind {
    /// One-sided READ.
    Read,
    /// One-sided WRITE.
    Write,
    /// Compare-and-swap.
    Cas,
    /// Fetch-and-add.
    Faa,
    /// Datagram SEND (two-sided).
    Send,
}

/// Flags of a posted work request or datagram.
#[derive(Copy, Clone, PartialEq, Eq, Default, Debug)]
pub struct OpFlags(u8);

impl OpFlags {
    /// No flags: unsignaled, not inline, rings the doorbell.
    pub const NONE: OpFlags = OpFlags(0);
    /// Produce a completion on success. Without it, success is implied by the completion
    /// of a later signaled request on the same connection (errors always complete).
    pub const SIGNALED: OpFlags = OpFlags(1);
    /// Copy the payload at post time (WRITE only, at most `INLINE_MAX` bytes).
    pub const INLINE: OpFlags = OpFlags(2);
    /// Doorbell batching: queue the request; the next post on the same queue pair (the
    /// connection, or the worker's datagram endpoint) without `MORE` hands the whole batch
    /// to the NIC with one doorbell. A worker must not end its step with a batch open.
    pub const MORE: OpFlags = OpFlags(4);

    /// Whether all flags of `other` are set.
    pub const fn has(self, other: OpFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for OpFlags {
    type Output = OpFlags;
    fn bitor(self, rhs: OpFlags) -> OpFlags {
        OpFlags(self.0 | rhs.0)
    }
}

/// How [`crate::Endpoint::post_batch`] posts a batch: every request but the last alike,
/// the last on its own terms (it is the one that closes a doorbell batch, and the one a
/// signaled batch reports).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct BatchPost {
    /// `wr_id` of every request but the last.
    pub wr_id: WrId,
    /// Flags of every request but the last.
    pub flags: OpFlags,
    /// `wr_id` of the last request.
    pub last_wr_id: WrId,
    /// Flags of the last request.
    pub last_flags: OpFlags,
}

impl BatchPost {
    /// The `wr_id` and flags of request `i` of a batch of `n`.
    pub fn of(&self, i: usize, n: usize) -> (WrId, OpFlags) {
        if i + 1 == n {
            (self.last_wr_id, self.last_flags)
        } else {
            (self.wr_id, self.flags)
        }
    }
}

/// A batch refused part-way: the first `posted` requests were posted, the next was
/// refused for `error`, and the rest were not tried.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct BatchRefused {
    /// Requests posted before the refusal.
    pub posted: usize,
    /// Why the next one was refused.
    pub error: PostError,
}

/// Why an access to registered memory was refused.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Error)]
pub enum AccessError {
    /// No region with that key on that node.
    #[error("unknown memory key")]
    UnknownKey,
    /// The range leaves the region.
    #[error("access outside the region")]
    OutOfBounds,
    /// Offset or length is not a multiple of 8 (for atomics: the word is unaligned).
    #[error("misaligned access")]
    Misaligned,
}

/// Outcome of a work request as reported in its completion.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Status {
    /// Done; memory effects happened.
    Success,
    /// The target refused the access; nothing was touched.
    RemoteAccess(AccessError),
    /// The target did not answer (crashed or partitioned) within the transport timeout;
    /// the effect may or may not have happened.
    Unreachable,
}

/// A completion-queue entry.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Completion {
    /// Tag given at post time.
    pub wr_id: WrId,
    /// Outcome.
    pub status: Status,
    /// Old value for CAS and FAA, 0 otherwise.
    pub value: u64,
}

impl Completion {
    /// An empty entry, for preallocated completion buffers.
    pub const EMPTY: Completion = Completion { wr_id: 0, status: Status::Success, value: 0 };
}

/// Why a post was refused at once (nothing was queued, nothing will complete).
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
pub enum PostError {
    /// The connection's send queue, or the worker's completion budget, is full; poll
    /// completions and retry.
    #[error("send queue full")]
    QueueFull,
    /// The local buffer is outside the posting node's registered memory.
    #[error("local buffer: {0}")]
    LocalAccess(AccessError),
    /// Length zero, not a multiple of 8, or above the transfer limit.
    #[error("bad transfer length {0}")]
    BadLength(u64),
    /// `INLINE` on a payload larger than `INLINE_MAX`, or a byte payload without `INLINE`.
    #[error("inline payload of {0} bytes not allowed")]
    Inline(usize),
    /// No such node, lane or worker in this cluster.
    #[error("no such peer")]
    NoSuchPeer,
    /// Datagram longer than the MTU.
    #[error("datagram of {0} bytes exceeds the MTU")]
    TooLarge(usize),
    /// This backend does not offer the operation (verb programs need a NIC model).
    #[error("not supported by this backend")]
    Unsupported,
}
