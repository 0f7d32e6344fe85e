//! Limits and default costs of the runtime, each with why it has its value.

use hytra_fabric::constants::DATAGRAM_MTU;

/// Coroutines (async tasks) per worker. The paper needs at most a few tens to hide RDMA
/// latency (DrTM+H §3.2: "a small number of coroutines is sufficient ... e.g., 8"); the
/// ready set is a fixed bitmap of this many bits.
pub const TASKS_MAX: usize = 256;

/// Client coroutines a benchmark may run per worker: half of `TASKS_MAX`, so that the
/// engine's own tasks on a worker (recovery, passive acknowledgements, re-replication,
/// the NIC's lookup programs) always have room beside them.
pub const COROUTINES_MAX: u16 = (TASKS_MAX / 2) as u16;

/// Work requests in one doorbell batch. Real NICs take a few dozen WQEs per doorbell
/// before the gain flattens; the bound also keeps a batch well inside the send queue.
pub const BATCH_MAX: usize = 64;

/// Unsignaled requests a connection may accumulate before the runtime signals one itself,
/// so that the send queue (`SQ_DEPTH`) drains even under pure passive ACK.
pub const SIGNAL_EVERY: u32 = 64;

/// Bytes of an RPC frame header inside a datagram.
pub const FRAME_HEADER: usize = 16;

/// Largest RPC payload (request or reply): one frame must fit one datagram.
pub const RPC_PAYLOAD_MAX: usize = DATAGRAM_MTU - FRAME_HEADER;

/// RPC types a worker can register handlers for.
pub const RPC_TYPES_MAX: usize = 64;

/// Datagrams one step receives before it returns (so CQ polling and coroutines are not
/// starved by a flood of requests).
pub const RECV_PER_STEP_MAX: usize = 64;

/// Completions one step reaps per poll call.
pub const CQ_POLL_BATCH: usize = 32;

/// Calls one worker may have waiting for replies.
pub const CALLS_MAX: usize = 4096;

/// Data calls one worker may have waiting for replies from one destination worker (its
/// credits with it) in a cluster of up to [`CREDIT_NODES`] nodes; larger clusters give
/// each caller fewer ([`credits_per_peer`]). A worker is called by the workers of its
/// index on every node, so credits bound the requests queued at it: at 16 nodes at most
/// 1 024, a quarter of its receive queue and about 0.4 ms of handler time at a few hundred
/// nanoseconds a request. Without them a burst of scans queued 4 096 requests (1.4 ms)
/// at one worker: its callers timed out and sent them again, and the leases queued
/// behind them lapsed.
pub const CALLS_PER_PEER: u16 = 64;

/// Nodes up to which every caller gets [`CALLS_PER_PEER`] credits.
pub const CREDIT_NODES: u16 = 16;

/// Credits of a caller with one destination worker in a cluster of `nodes` nodes: the
/// requests every node's callers may have queued at one worker stay within a quarter of
/// its receive queue (one credit at least, for clusters of over a thousand nodes).
pub const fn credits_per_peer(nodes: u16) -> u16 {
    let share = hytra_fabric::constants::RECV_DEPTH / 4 / (nodes as usize);
    let n = if share < CALLS_PER_PEER as usize { share as u16 } else { CALLS_PER_PEER };
    if n == 0 {
        1
    } else {
        n
    }
}

const _: () = assert!(TASKS_MAX % 64 == 0);
const _: () = assert!(credits_per_peer(CREDIT_NODES) == CALLS_PER_PEER);
const _: () = assert!(SIGNAL_EVERY as usize >= BATCH_MAX);
const _: () = assert!(SIGNAL_EVERY + BATCH_MAX as u32 <= hytra_fabric::constants::SQ_DEPTH);
const _: () = assert!(RPC_PAYLOAD_MAX <= u16::MAX as usize);
