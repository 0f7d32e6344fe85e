//! Semantics every backend shares: what a post must satisfy, and what a one-sided
//! request does to the target's memory.
//!
//! Backends differ in when and on which thread these run (the simulator at a modelled
//! time, `local` on the posting thread at the doorbell); keeping the rules here makes
//! them behave the same. Not for: timing or queueing.

use crate::constants::{INLINE_MAX, TRANSFER_MAX, WORD};
use crate::endpoint::{BackendError, RegionSpec};
use crate::ids::{ClusterShape, LocalAddr, NodeId, Qp, RemoteAddr, Rkey};
use crate::memory::Region;
use crate::verbs::{AccessError, OpFlags, OpKind, PostError, Status, WorkRequest, WriteSrc};

/// Checks a region to be registered on `node` of a cluster of `shape`.
pub(crate) fn check_region(
    shape: &ClusterShape,
    node: NodeId,
    spec: RegionSpec,
) -> Result<(), BackendError> {
    let err = |reason: &str| BackendError::Register {
        node,
        len_bytes: spec.len_bytes,
        reason: reason.into(),
    };
    if node.0 >= shape.nodes {
        return Err(err("no such node"));
    }
    if spec.len_bytes == 0 || spec.len_bytes % WORD != 0 {
        return Err(err("length must be a positive multiple of 8"));
    }
    if spec.watcher.is_some_and(|w| w >= shape.workers_per_node) {
        return Err(err("watcher is not a worker of the node"));
    }
    Ok(())
}

/// A validated one-sided request with its fields flattened, as a backend queues it (the
/// payload of an inline WRITE is kept by the backend, see [`Flat::inline_payload`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Flat {
    pub(crate) kind: OpKind,
    pub(crate) remote: RemoteAddr,
    /// The poster's buffer: READ destination, WRITE source, atomic old value.
    pub(crate) local: LocalAddr,
    pub(crate) len: u32,
    pub(crate) compare: u64,
    /// Swap value of a CAS, addend of a FAA.
    pub(crate) operand: u64,
}

impl Flat {
    pub(crate) fn of(wr: &WorkRequest<'_>) -> Flat {
        let no_buffer = (LocalAddr { rkey: Rkey(0), offset: 0 }, 0);
        let (local, _) = wr.local().unwrap_or(no_buffer);
        let (compare, operand) = match *wr {
            WorkRequest::Cas { compare, swap, .. } => (compare, swap),
            WorkRequest::Faa { add, .. } => (0, add),
            _ => (0, 0),
        };
        Flat {
            kind: wr.kind(),
            remote: wr.remote(),
            local,
            len: wr.payload_len(),
            compare,
            operand,
        }
    }

    /// The bytes a WRITE copies at post time (`INLINE`, or a byte payload), read from the
    /// poster's regions into `tmp` if needed; `None` for everything else.
    pub(crate) fn inline_payload<'a>(
        wr: &'a WorkRequest<'a>,
        flags: OpFlags,
        own_regions: &[Region],
        tmp: &'a mut [u8; INLINE_MAX],
    ) -> Option<&'a [u8]> {
        match *wr {
            WorkRequest::Write { src: WriteSrc::Bytes(bytes), .. } => Some(bytes),
            WorkRequest::Write { src: WriteSrc::Local { addr, len }, .. }
                if flags.has(OpFlags::INLINE) =>
            {
                let bytes = &mut tmp[..len as usize];
                own_regions[addr.rkey.0 as usize].read_bytes(addr.offset, bytes);
                Some(bytes)
            }
            _ => None,
        }
    }

    /// The request as its target executes it: `own_regions` are the poster's regions,
    /// `inline` the payload copied at post time.
    pub(crate) fn target_op<'a>(
        &self,
        own_regions: &'a [Region],
        inline: Option<&'a [u8]>,
    ) -> TargetOp<'a> {
        let (offset, len) = (self.remote.offset, u64::from(self.len));
        let local = || &own_regions[self.local.rkey.0 as usize];
        let dst_offset = self.local.offset;
        match (self.kind, inline) {
            (OpKind::Read, _) => TargetOp::Read { offset, len, dst: local(), dst_offset },
            (OpKind::Write, Some(bytes)) => TargetOp::WriteBytes { offset, bytes },
            (OpKind::Write, None) => {
                TargetOp::WriteFrom { offset, len, src: local(), src_offset: dst_offset }
            }
            (OpKind::Cas, _) => TargetOp::Cas {
                offset,
                compare: self.compare,
                swap: self.operand,
                dst: local(),
                dst_offset,
            },
            (OpKind::Faa, _) => {
                TargetOp::Faa { offset, add: self.operand, dst: local(), dst_offset }
            }
            (OpKind::Send, _) => unreachable!("datagrams are not one-sided"),
        }
    }
}

/// Checks a one-sided post against the cluster and the poster's own regions (everything
/// that can be known without the target). Remote checks happen at the target.
#[inline]
pub(crate) fn validate_post(
    shape: &ClusterShape,
    own_regions: &[Region],
    qp: Qp,
    wr: &WorkRequest<'_>,
    flags: OpFlags,
) -> Result<(), PostError> {
    if !shape.has_qp(qp) {
        return Err(PostError::NoSuchPeer);
    }
    validate_request(own_regions, qp, wr, flags)
}

/// [`validate_post`] without the check that `qp` exists: for a batch on one connection,
/// checked once.
#[inline]
pub(crate) fn validate_request(
    own_regions: &[Region],
    qp: Qp,
    wr: &WorkRequest<'_>,
    flags: OpFlags,
) -> Result<(), PostError> {
    if wr.remote().node != qp.node {
        return Err(PostError::NoSuchPeer);
    }
    let local_check = |rkey: crate::Rkey, offset: u64, len: u32| {
        let region = own_regions
            .get(rkey.0 as usize)
            .ok_or(PostError::LocalAccess(AccessError::UnknownKey))?;
        region.check(offset, u64::from(len)).map_err(PostError::LocalAccess)
    };
    let inline = flags.has(OpFlags::INLINE);
    match *wr {
        WorkRequest::Read { local, len, .. } => {
            check_len(u64::from(len))?;
            if inline {
                return Err(PostError::Inline(len as usize));
            }
            local_check(local.rkey, local.offset, len)
        }
        WorkRequest::Write { src: WriteSrc::Local { addr, len }, .. } => {
            check_len(u64::from(len))?;
            if inline && len as usize > INLINE_MAX {
                return Err(PostError::Inline(len as usize));
            }
            local_check(addr.rkey, addr.offset, len)
        }
        WorkRequest::Write { src: WriteSrc::Bytes(bytes), .. } => {
            check_len(bytes.len() as u64)?;
            if !inline || bytes.len() > INLINE_MAX {
                return Err(PostError::Inline(bytes.len()));
            }
            Ok(())
        }
        WorkRequest::Cas { local, .. } | WorkRequest::Faa { local, .. } => {
            if inline {
                return Err(PostError::Inline(8));
            }
            local_check(local.rkey, local.offset, 8)
        }
    }
}

fn check_len(len: u64) -> Result<(), PostError> {
    if len == 0 || len % WORD != 0 || len > TRANSFER_MAX {
        return Err(PostError::BadLength(len));
    }
    Ok(())
}

/// A one-sided request as the target sees it, with its payload source resolved.
pub(crate) enum TargetOp<'a> {
    /// Copy from the target into `dst` at `dst_offset`.
    Read { offset: u64, len: u64, dst: &'a Region, dst_offset: u64 },
    /// Copy `len` bytes from `src` at `src_offset` into the target.
    WriteFrom { offset: u64, len: u64, src: &'a Region, src_offset: u64 },
    /// Write bytes copied at post time.
    WriteBytes { offset: u64, bytes: &'a [u8] },
    /// Compare-and-swap; the old value goes to `dst` at `dst_offset`.
    Cas { offset: u64, compare: u64, swap: u64, dst: &'a Region, dst_offset: u64 },
    /// Fetch-and-add; the old value goes to `dst` at `dst_offset`.
    Faa { offset: u64, add: u64, dst: &'a Region, dst_offset: u64 },
}

impl<'a> TargetOp<'a> {
    /// The target range: (offset, bytes).
    pub(crate) fn span(&self) -> (u64, u64) {
        match *self {
            TargetOp::Read { offset, len, .. } | TargetOp::WriteFrom { offset, len, .. } => {
                (offset, len)
            }
            TargetOp::WriteBytes { offset, bytes } => (offset, bytes.len() as u64),
            TargetOp::Cas { offset, .. } | TargetOp::Faa { offset, .. } => (offset, WORD),
        }
    }

    /// Bytes `[from, from + len)` of a READ or WRITE, as a request of their own (for a
    /// target that applies a transfer a piece at a time).
    pub(crate) fn piece(self, from: u64, len: u64) -> TargetOp<'a> {
        let (_, total) = self.span();
        assert!(from + len <= total && len > 0, "piece {from}+{len} of a {total}-byte transfer");
        match self {
            TargetOp::Read { offset, dst, dst_offset, .. } => {
                TargetOp::Read { offset: offset + from, len, dst, dst_offset: dst_offset + from }
            }
            TargetOp::WriteFrom { offset, src, src_offset, .. } => TargetOp::WriteFrom {
                offset: offset + from,
                len,
                src,
                src_offset: src_offset + from,
            },
            TargetOp::WriteBytes { offset, bytes } => TargetOp::WriteBytes {
                offset: offset + from,
                bytes: &bytes[from as usize..(from + len) as usize],
            },
            TargetOp::Cas { .. } | TargetOp::Faa { .. } => unreachable!("atomics are one word"),
        }
    }
}

/// Checks the target range of `op` without applying it.
pub(crate) fn check_target(target: Option<&Region>, op: &TargetOp<'_>) -> Status {
    let Some(region) = target else {
        return Status::RemoteAccess(AccessError::UnknownKey);
    };
    let (offset, len) = op.span();
    match region.check(offset, len) {
        Ok(()) => Status::Success,
        Err(e) => Status::RemoteAccess(e),
    }
}

/// Checks the target range and applies the effect; a refused access touches nothing.
/// Returns the status and, for atomics, the old value.
pub(crate) fn execute(target: Option<&Region>, op: TargetOp<'_>) -> (Status, u64) {
    let Some(region) = target else {
        return (Status::RemoteAccess(AccessError::UnknownKey), 0);
    };
    let (offset, len) = op.span();
    if let Err(e) = region.check(offset, len) {
        return (Status::RemoteAccess(e), 0);
    }
    // What follows is the NIC's doing, not a CPU's (for the M6 witness).
    let value = crate::memory::as_fabric(|| match op {
        TargetOp::Read { offset, len, dst, dst_offset } => {
            region.copy_to(offset, dst, dst_offset, len);
            0
        }
        TargetOp::WriteFrom { offset, len, src, src_offset } => {
            src.copy_to(src_offset, region, offset, len);
            0
        }
        TargetOp::WriteBytes { offset, bytes } => {
            region.write_bytes(offset, bytes);
            0
        }
        TargetOp::Cas { offset, compare, swap, dst, dst_offset } => {
            let old = region.cas(offset, compare, swap);
            dst.store(dst_offset, old);
            old
        }
        TargetOp::Faa { offset, add, dst, dst_offset } => {
            let old = region.faa(offset, add);
            dst.store(dst_offset, old);
            old
        }
    });
    (Status::Success, value)
}
