//! Semantics every backend shares: what a post must satisfy, and what a one-sided
//! request does to the target's memory.
//!
//! Backends differ in when and on which thread these run (the simulator at a modelled
//! time, `local` on the posting thread at the doorbell); keeping the rules here makes
//! them behave the same. Not for: timing or queueing.

use crate::constants::{INLINE_MAX, TRANSFER_MAX, WORD};
use crate::ids::{ClusterShape, Qp};
use crate::memory::Region;
use crate::verbs::{AccessError, OpFlags, PostError, Status, WorkRequest, WriteSrc};

/// Checks a one-sided post against the cluster and the poster's own regions (everything
/// that can be known without the target). Remote checks happen at the target.
pub(crate) fn validate_post(
    shape: &ClusterShape,
    own_regions: &[Region],
    qp: Qp,
    wr: &WorkRequest<'_>,
    flags: OpFlags,
) -> Result<(), PostError> {
    if !shape.has_qp(qp) || wr.remote().node != qp.node {
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

/// Checks the target range and applies the effect; a refused access touches nothing.
/// Returns the status and, for atomics, the old value.
pub(crate) fn execute(target: Option<&Region>, op: TargetOp<'_>) -> (Status, u64) {
    let Some(region) = target else {
        return (Status::RemoteAccess(AccessError::UnknownKey), 0);
    };
    let (offset, len) = match op {
        TargetOp::Read { offset, len, .. } | TargetOp::WriteFrom { offset, len, .. } => {
            (offset, len)
        }
        TargetOp::WriteBytes { offset, bytes } => (offset, bytes.len() as u64),
        TargetOp::Cas { offset, .. } | TargetOp::Faa { offset, .. } => (offset, WORD),
    };
    if let Err(e) = region.check(offset, len) {
        return (Status::RemoteAccess(e), 0);
    }
    let value = match op {
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
    };
    (Status::Success, value)
}
