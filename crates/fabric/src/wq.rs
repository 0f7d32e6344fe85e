//! Work queues that live in registered memory, for verb programs (RedN): the format of
//! a work-queue entry (WQE), the queue's description, and its counters.
//!
//! A verb program is a set of WQEs that the NIC executes without the host CPU. Because
//! the entries sit in registered memory, verbs of the program can READ, WRITE or CAS
//! them: a CAS on an entry's header turns a NOOP into a WRITE (an `if`), a READ can fill
//! an entry's fields from a data structure, and a RECV can scatter a client's message
//! into fields. Ordering comes from WAIT (hold a queue until another queue has produced
//! a number of completions) and ENABLE (let the NIC fetch a managed queue's entries up to
//! an index). Entry indices grow without bound while slots wrap around the ring, so a
//! chain that ENABLEs its own next round runs again (queue recycling).
//!
//! Not for: timing and scheduling, which belong to the backends that run programs (the
//! simulator's NIC model, the `local` backend's NIC thread); or building programs, which
//! is the `offload` crate's job. The effects both backends share (checking a queue,
//! scattering a message into a RECV, applying a data verb) are here, crate-private.

use thiserror::Error;

use crate::constants::DATAGRAM_MTU;
use crate::exec::{execute, TargetOp};
use crate::ids::{ClusterShape, LocalAddr, NodeId, Rkey};
use crate::memory::Region;
use crate::verbs::{PostError, Status};

/// Bytes of one send-queue entry: eight words.
pub const WQE_BYTES: u64 = 64;
/// Bytes of one receive-queue entry: a header and up to [`RECV_SGE_MAX`] scatter entries.
pub const RECV_WQE_BYTES: u64 = 256;
/// Scatter entries one RECV may name (ConnectX allows 16 per receive; RedN §5.3).
pub const RECV_SGE_MAX: usize = 15;
/// Operands that share a word with the opcode (the entry's id field) have 48 bits.
pub const ID_BITS: u32 = 48;
/// Largest value of the id field.
pub const ID_MAX: u64 = (1 << ID_BITS) - 1;

/// Word indices of the fields of a send-queue entry.
pub mod field {
    /// Header: opcode (bits 0-7), flags (bits 8-15), id (bits 16-63).
    pub const HEADER: u64 = 0;
    /// Local buffer offset (READ/CAS/FAA destination, WRITE source).
    pub const LOCAL_ADDR: u64 = 1;
    /// Local buffer length (low 32 bits) and region key (high 32 bits).
    pub const LOCAL_LEN_KEY: u64 = 2;
    /// Remote offset on the queue's peer node.
    pub const REMOTE_ADDR: u64 = 3;
    /// Remote region key (low 32 bits).
    pub const REMOTE_KEY: u64 = 4;
    /// CAS compare value, FAA addend, WAIT/ENABLE count.
    pub const OPERAND_A: u64 = 5;
    /// CAS swap value; WAIT/ENABLE target queue (low 32 bits) and, for WAIT, bit 32 set
    /// to count the target's receive completions instead of its send completions.
    pub const OPERAND_B: u64 = 6;
    /// Not read by the NIC for any opcode: a program may keep a word of data here (a
    /// READ that fills an entry's first words can drop its leading word into the spare
    /// word of the entry before).
    pub const SPARE: u64 = 7;
}

/// Byte offset of word `word` of an entry.
pub const fn field_offset(word: u64) -> u64 {
    word * 8
}

/// What an entry does.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum WqOpcode {
    /// Nothing (a zeroed slot is an unsignaled NOOP).
    Noop = 0,
    /// Copy the local buffer to the peer.
    Write = 1,
    /// Copy from the peer into the local buffer.
    Read = 2,
    /// Compare-and-swap an 8-byte word of the peer; the old value lands in the local word.
    Cas = 3,
    /// Fetch-and-add on an 8-byte word of the peer; the old value lands in the local word.
    Faa = 4,
    /// Hold this queue until the target queue has `count` completions.
    Wait = 5,
    /// Let the NIC fetch the target (managed) queue's entries with index below `count`.
    Enable = 6,
}

impl WqOpcode {
    /// Decodes the opcode byte.
    pub fn from_byte(b: u8) -> Option<WqOpcode> {
        Some(match b {
            0 => WqOpcode::Noop,
            1 => WqOpcode::Write,
            2 => WqOpcode::Read,
            3 => WqOpcode::Cas,
            4 => WqOpcode::Faa,
            5 => WqOpcode::Wait,
            6 => WqOpcode::Enable,
            _ => return None,
        })
    }
}

/// The flag bit that makes an entry produce a completion (counted by WAITs).
pub const WQE_SIGNALED: u8 = 1;

/// The header word of an entry. The id must fit 48 bits.
pub fn header(op: WqOpcode, flags: u8, id: u64) -> u64 {
    assert!(id <= ID_MAX, "id {id:#x} exceeds 48 bits");
    id << 16 | u64::from(flags) << 8 | op as u64
}

/// The header word of a RECV entry with `sges` scatter entries.
pub fn recv_header(sges: usize) -> u64 {
    assert!(sges <= RECV_SGE_MAX, "{sges} scatter entries exceed {RECV_SGE_MAX}");
    (sges as u64) << 16 | RECV_OPCODE
}

/// Opcode byte of a receive-queue entry.
pub const RECV_OPCODE: u64 = 7;

/// A local buffer as a WQE names it: region key, offset, length.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Sge {
    /// Start.
    pub addr: LocalAddr,
    /// Bytes, a multiple of 8.
    pub len: u32,
}

impl Sge {
    /// The two words of a scatter/gather entry (offset; length | key << 32).
    pub fn words(self) -> [u64; 2] {
        [self.addr.offset, u64::from(self.len) | u64::from(self.addr.rkey.0) << 32]
    }

    /// Decodes the two words of a scatter/gather entry.
    pub fn from_words(offset: u64, len_key: u64) -> Sge {
        Sge { addr: LocalAddr { rkey: Rkey((len_key >> 32) as u32), offset }, len: len_key as u32 }
    }
}

/// A decoded send-queue entry.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Wqe {
    /// NOOP.
    Noop,
    /// WRITE `local` to the peer's `(remote_key, remote)`.
    Write {
        /// Source.
        local: Sge,
        /// Destination key on the peer.
        remote_key: Rkey,
        /// Destination offset on the peer.
        remote: u64,
    },
    /// READ the peer's bytes into `local`.
    Read {
        /// Destination (its length is the transfer length).
        local: Sge,
        /// Source key on the peer.
        remote_key: Rkey,
        /// Source offset on the peer.
        remote: u64,
    },
    /// CAS on the peer's word; the old value is written to `local` unless its length is 0.
    Cas {
        /// Where the old value goes (length 8, or 0 to discard it).
        local: Sge,
        /// Target key on the peer.
        remote_key: Rkey,
        /// Target offset on the peer.
        remote: u64,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// FAA on the peer's word; the old value is written to `local` unless its length is 0.
    Faa {
        /// Where the old value goes (length 8, or 0 to discard it).
        local: Sge,
        /// Target key on the peer.
        remote_key: Rkey,
        /// Target offset on the peer.
        remote: u64,
        /// Addend.
        add: u64,
    },
    /// Hold the queue until `target` has `count` send (or receive) completions.
    Wait {
        /// Queue whose completions are counted (on this node).
        target: WqId,
        /// Completions to wait for (absolute, since the queue was created).
        count: u64,
        /// Count receive completions (RECVs consumed) instead of send completions.
        recv: bool,
    },
    /// Let `target` fetch its entries with index below `count`.
    Enable {
        /// Managed queue on this node.
        target: WqId,
        /// Fetch limit (absolute entry index).
        count: u64,
    },
}

/// Why an entry could not be executed.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
pub enum WqeError {
    /// The opcode byte names no operation.
    #[error("unknown opcode {0}")]
    BadOpcode(u8),
    /// A transfer length is zero, not a multiple of 8, or too large; or an atomic's
    /// local length is neither 0 nor 8.
    #[error("bad length {0}")]
    BadLength(u32),
    /// A WAIT or ENABLE names a queue that does not exist, or ENABLE an unmanaged one.
    #[error("bad target queue {0}")]
    BadQueue(u32),
    /// A RECV entry names more than [`RECV_SGE_MAX`] scatter entries or is not a RECV.
    #[error("malformed receive entry")]
    BadRecv,
    /// A local or remote buffer is outside registered memory.
    #[error("access error")]
    Access,
}

impl Wqe {
    /// The entry's words (header flags and id as given).
    pub fn encode(&self, flags: u8, id: u64) -> [u64; 8] {
        let mut w = [0u64; 8];
        let (op, local, remote_key, remote, a, b) = match *self {
            Wqe::Noop => (WqOpcode::Noop, None, Rkey(0), 0, 0, 0),
            Wqe::Write { local, remote_key, remote } => {
                (WqOpcode::Write, Some(local), remote_key, remote, 0, 0)
            }
            Wqe::Read { local, remote_key, remote } => {
                (WqOpcode::Read, Some(local), remote_key, remote, 0, 0)
            }
            Wqe::Cas { local, remote_key, remote, compare, swap } => {
                (WqOpcode::Cas, Some(local), remote_key, remote, compare, swap)
            }
            Wqe::Faa { local, remote_key, remote, add } => {
                (WqOpcode::Faa, Some(local), remote_key, remote, add, 0)
            }
            Wqe::Wait { target, count, recv } => (
                WqOpcode::Wait,
                None,
                Rkey(0),
                0,
                count,
                u64::from(target.0) | u64::from(recv) << 32,
            ),
            Wqe::Enable { target, count } => {
                (WqOpcode::Enable, None, Rkey(0), 0, count, u64::from(target.0))
            }
        };
        w[field::HEADER as usize] = header(op, flags, id);
        if let Some(sge) = local {
            let [a0, a1] = sge.words();
            w[field::LOCAL_ADDR as usize] = a0;
            w[field::LOCAL_LEN_KEY as usize] = a1;
        }
        w[field::REMOTE_ADDR as usize] = remote;
        w[field::REMOTE_KEY as usize] = u64::from(remote_key.0);
        w[field::OPERAND_A as usize] = a;
        w[field::OPERAND_B as usize] = b;
        w
    }

    /// Decodes an entry; returns it with its flags byte.
    pub fn decode(w: &[u64; 8]) -> Result<(Wqe, u8), WqeError> {
        let h = w[field::HEADER as usize];
        let flags = (h >> 8) as u8;
        let op = WqOpcode::from_byte(h as u8).ok_or(WqeError::BadOpcode(h as u8))?;
        let local = Sge::from_words(w[1], w[2]);
        let remote_key = Rkey(w[field::REMOTE_KEY as usize] as u32);
        let remote = w[field::REMOTE_ADDR as usize];
        let (a, b) = (w[field::OPERAND_A as usize], w[field::OPERAND_B as usize]);
        let atomic_local = |sge: Sge| match sge.len {
            0 | 8 => Ok(sge),
            n => Err(WqeError::BadLength(n)),
        };
        let transfer = |sge: Sge| {
            if sge.len == 0
                || sge.len % 8 != 0
                || u64::from(sge.len) > crate::constants::TRANSFER_MAX
            {
                Err(WqeError::BadLength(sge.len))
            } else {
                Ok(sge)
            }
        };
        let wqe = match op {
            WqOpcode::Noop => Wqe::Noop,
            WqOpcode::Write => Wqe::Write { local: transfer(local)?, remote_key, remote },
            WqOpcode::Read => Wqe::Read { local: transfer(local)?, remote_key, remote },
            WqOpcode::Cas => {
                Wqe::Cas { local: atomic_local(local)?, remote_key, remote, compare: a, swap: b }
            }
            WqOpcode::Faa => Wqe::Faa { local: atomic_local(local)?, remote_key, remote, add: a },
            WqOpcode::Wait => {
                Wqe::Wait { target: WqId(b as u32), count: a, recv: b >> 32 & 1 == 1 }
            }
            WqOpcode::Enable => Wqe::Enable { target: WqId(b as u32), count: a },
        };
        Ok((wqe, flags))
    }
}

/// A work queue's number on its node (dense, in creation order).
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct WqId(pub u32);

/// Where a work queue lives and whom it talks to.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct WqSpec {
    /// Slot 0 of the send ring (in a registered region of the queue's node).
    pub ring: LocalAddr,
    /// Send ring slots; entry `i` lives in slot `i % slots`.
    pub slots: u32,
    /// Slot 0 of the receive ring (unused if `recv_slots` is 0).
    pub recv_ring: LocalAddr,
    /// Receive ring slots.
    pub recv_slots: u32,
    /// Two words: entries posted to the send ring, RECVs posted to the receive ring. The
    /// host (or a verb of a program, which is how a recycled chain re-arms its RECV)
    /// advances them; the NIC reads the send count at a doorbell and the receive count
    /// when a message arrives.
    pub doorbell_record: LocalAddr,
    /// The node the queue's READ/WRITE/CAS/FAA target: the queue's own node for a
    /// loopback queue, a client's node for a queue that answers it.
    pub peer: NodeId,
    /// Managed: the NIC fetches no entry before an ENABLE (or a host doorbell) allows it;
    /// when it runs out of fetched entries it reads every allowed one from memory in one
    /// fetch, so verbs that completed before that ENABLE may have rewritten them (RedN's
    /// doorbell order: a WAIT then an ENABLE is the barrier). Unmanaged: the NIC
    /// prefetches all posted entries at the doorbell. Either way, changes to an entry
    /// after it was fetched are not seen.
    pub managed: bool,
    /// A worker of the node that the simulator steps when the queue completes a signaled
    /// entry (so a host that polls [`WqCounters`] need not spin); real NICs ignore it.
    pub notify: Option<u16>,
}

/// Address of word `word` of entry `index` of a send ring at `ring` with `slots` slots.
pub fn entry_field(ring: LocalAddr, slots: u32, index: u64, word: u64) -> LocalAddr {
    LocalAddr {
        rkey: ring.rkey,
        offset: ring.offset + (index % u64::from(slots)) * WQE_BYTES + field_offset(word),
    }
}

/// A work queue's counters as the NIC keeps them.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub struct WqCounters {
    /// Entries fetched and run (a WAIT counts when fetched, whether or not it holds).
    pub executed: u64,
    /// Completions of signaled send entries.
    pub completions: u64,
    /// RECVs consumed by arriving messages.
    pub recv_completions: u64,
    /// Messages that found no posted RECV (dropped; a real RC queue would NAK them).
    pub rnr_drops: u64,
    /// Set when an entry failed: the queue stopped (as a real queue enters the error
    /// state).
    pub error: Option<WqeError>,
}

/// Checks a queue about to be created on `node`, whose registered regions are `regions`.
pub(crate) fn check_spec(
    shape: ClusterShape,
    node: NodeId,
    spec: &WqSpec,
    regions: &[Region],
) -> Result<(), String> {
    if node.0 >= shape.nodes || spec.peer.0 >= shape.nodes {
        return Err("no such node".into());
    }
    let check = |a: LocalAddr, len: u64, what: &str| -> Result<(), String> {
        let r = regions.get(a.rkey.0 as usize).ok_or(format!("{what}: unknown region"))?;
        r.check(a.offset, len).map_err(|e| format!("{what}: {e}"))
    };
    if spec.slots == 0 {
        return Err("a queue needs at least one send slot".into());
    }
    check(spec.ring, u64::from(spec.slots) * WQE_BYTES, "send ring")?;
    if spec.recv_slots > 0 {
        check(spec.recv_ring, u64::from(spec.recv_slots) * RECV_WQE_BYTES, "receive ring")?;
    }
    check(spec.doorbell_record, 16, "doorbell record")?;
    if spec.notify.is_some_and(|w| w >= shape.workers_per_node) {
        return Err("notified worker is not a worker of the node".into());
    }
    Ok(())
}

/// Checks a message for a queue's RECV: whole words, at least one, at most the MTU.
pub(crate) fn check_message(payload: &[u8]) -> Result<(), PostError> {
    if payload.len() > DATAGRAM_MTU {
        return Err(PostError::TooLarge(payload.len()));
    }
    if payload.is_empty() || payload.len() % 8 != 0 {
        return Err(PostError::BadLength(payload.len() as u64));
    }
    Ok(())
}

/// Whether a message may consume a RECV of a queue now: the queue runs, has a receive
/// ring, and the host (or the program) posted more RECVs than were consumed.
pub(crate) fn recv_posted(spec: &WqSpec, counters: &WqCounters, regions: &[Region]) -> bool {
    let dbr = &regions[spec.doorbell_record.rkey.0 as usize];
    let posted = dbr.load(spec.doorbell_record.offset + 8);
    counters.error.is_none() && spec.recv_slots > 0 && counters.recv_completions < posted
}

/// Scatters `bytes` into the memory named by the queue's next RECV entry (the one after
/// `consumed` entries), in order. A message longer than the entries' total is a length
/// error; a scatter entry outside registered memory or not a whole number of words an
/// access error.
pub(crate) fn scatter_recv(
    spec: &WqSpec,
    consumed: u64,
    regions: &[Region],
    bytes: &[u8],
) -> Result<(), WqeError> {
    let slot = consumed % u64::from(spec.recv_slots);
    let mut e = [0u64; 1 + 2 * RECV_SGE_MAX];
    regions[spec.recv_ring.rkey.0 as usize]
        .read_words(spec.recv_ring.offset + slot * RECV_WQE_BYTES, &mut e);
    let sges = (e[0] >> 16) as usize;
    if e[0] & 0xFF != RECV_OPCODE || sges > RECV_SGE_MAX {
        return Err(WqeError::BadRecv);
    }
    let mut rest = bytes;
    for k in 0..sges {
        if rest.is_empty() {
            break;
        }
        let sge = Sge::from_words(e[1 + 2 * k], e[2 + 2 * k]);
        let take = rest.len().min(sge.len as usize);
        let Some(region) = regions.get(sge.addr.rkey.0 as usize) else {
            return Err(WqeError::Access);
        };
        if take % 8 != 0 || region.check(sge.addr.offset, take as u64).is_err() {
            return Err(WqeError::Access);
        }
        region.write_bytes(sge.addr.offset, &rest[..take]);
        rest = &rest[take..];
    }
    if !rest.is_empty() {
        return Err(WqeError::BadLength(bytes.len() as u32));
    }
    Ok(())
}

/// Whether a data verb's local buffer lies in registered memory of the queue's node
/// (`own`), checked when the verb issues; an atomic's zero-length buffer names none.
pub(crate) fn local_buffer_ok(wqe: &Wqe, own: &[Region]) -> bool {
    let local = match *wqe {
        Wqe::Write { local, .. } | Wqe::Read { local, .. } => local,
        Wqe::Cas { local, .. } | Wqe::Faa { local, .. } if local.len > 0 => local,
        _ => return true,
    };
    own.get(local.addr.rkey.0 as usize)
        .is_some_and(|r| r.check(local.addr.offset, u64::from(local.len)).is_ok())
}

/// Applies a data verb of a queue on a node with regions `own` to its peer's regions
/// `peer` (`scratch` takes an atomic's discarded old value). Returns the status, the
/// old value of an atomic, and the peer region the verb targeted.
pub(crate) fn apply_data_verb(
    wqe: &Wqe,
    own: &[Region],
    peer: &[Region],
    scratch: &Region,
) -> (Status, u64, Rkey) {
    let dst = |l: Sge| -> (&Region, u64) {
        if l.len == 0 {
            (scratch, 0)
        } else {
            (&own[l.addr.rkey.0 as usize], l.addr.offset)
        }
    };
    let (rkey, op) = match *wqe {
        Wqe::Write { local, remote_key, remote } => (
            remote_key,
            TargetOp::WriteFrom {
                offset: remote,
                len: u64::from(local.len),
                src: &own[local.addr.rkey.0 as usize],
                src_offset: local.addr.offset,
            },
        ),
        Wqe::Read { local, remote_key, remote } => (
            remote_key,
            TargetOp::Read {
                offset: remote,
                len: u64::from(local.len),
                dst: &own[local.addr.rkey.0 as usize],
                dst_offset: local.addr.offset,
            },
        ),
        Wqe::Cas { local, remote_key, remote, compare, swap } => {
            let (d, o) = dst(local);
            (remote_key, TargetOp::Cas { offset: remote, compare, swap, dst: d, dst_offset: o })
        }
        Wqe::Faa { local, remote_key, remote, add } => {
            let (d, o) = dst(local);
            (remote_key, TargetOp::Faa { offset: remote, add, dst: d, dst_offset: o })
        }
        Wqe::Noop | Wqe::Wait { .. } | Wqe::Enable { .. } => {
            unreachable!("only data verbs touch memory")
        }
    };
    let (status, value) = execute(peer.get(rkey.0 as usize), op);
    (status, value, rkey)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let sge = Sge { addr: LocalAddr { rkey: Rkey(3), offset: 64 }, len: 24 };
        let cases = [
            Wqe::Noop,
            Wqe::Write { local: sge, remote_key: Rkey(1), remote: 128 },
            Wqe::Read { local: sge, remote_key: Rkey(2), remote: 8 },
            Wqe::Cas {
                local: Sge { len: 8, ..sge },
                remote_key: Rkey(0),
                remote: 16,
                compare: 7,
                swap: 9,
            },
            Wqe::Faa { local: Sge { len: 0, ..sge }, remote_key: Rkey(0), remote: 0, add: 5 },
            Wqe::Wait { target: WqId(4), count: 1 << 40, recv: true },
            Wqe::Enable { target: WqId(2), count: 77 },
        ];
        for c in cases {
            let w = c.encode(WQE_SIGNALED, 0xABCDEF);
            assert_eq!(Wqe::decode(&w), Ok((c, WQE_SIGNALED)), "{c:?}");
            assert_eq!(w[0] >> 16, 0xABCDEF);
        }
    }

    #[test]
    fn a_zeroed_slot_is_an_unsignaled_noop_and_junk_is_refused() {
        assert_eq!(Wqe::decode(&[0; 8]), Ok((Wqe::Noop, 0)));
        assert_eq!(Wqe::decode(&[0xFE, 0, 0, 0, 0, 0, 0, 0]), Err(WqeError::BadOpcode(0xFE)));
        let bad_len = Wqe::Write {
            local: Sge { addr: LocalAddr { rkey: Rkey(0), offset: 0 }, len: 12 },
            remote_key: Rkey(0),
            remote: 0,
        }
        .encode(0, 0);
        assert_eq!(Wqe::decode(&bad_len), Err(WqeError::BadLength(12)));
    }

    #[test]
    #[should_panic(expected = "exceeds 48 bits")]
    fn ids_are_48_bits() {
        header(WqOpcode::Noop, 0, 1 << 48);
    }
}
