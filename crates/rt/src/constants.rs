//! Limits and default costs of the runtime, each with why it has its value.

use hytra_fabric::constants::DATAGRAM_MTU;

/// Coroutines (async tasks) per worker. The paper needs at most a few tens to hide RDMA
/// latency (DrTM+H §3.2: "a small number of coroutines is sufficient ... e.g., 8"); the
/// ready set is a fixed bitmap of this many bits.
pub const TASKS_MAX: usize = 256;

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

/// Data calls one worker may have waiting for replies from one destination worker: its
/// credits with that destination. They bound what a receiver has queued: a worker is
/// called by the workers of the same index on every node, so a 16-node cluster queues at
/// most 1 024 requests at one worker, a quarter of its receive queue, and about 0.4 ms
/// of handler time at a few hundred nanoseconds a request. Without them a burst of scans
/// queued 4 096 requests (1.4 ms) at one worker: its callers timed out and sent them
/// again, and the leases queued behind them lapsed.
pub const CALLS_PER_PEER: u16 = 64;

const _: () = assert!(TASKS_MAX % 64 == 0);
const _: () = assert!(16 * CALLS_PER_PEER as usize <= hytra_fabric::constants::RECV_DEPTH / 4);
const _: () = assert!(SIGNAL_EVERY as usize >= BATCH_MAX);
const _: () = assert!(SIGNAL_EVERY + BATCH_MAX as u32 <= hytra_fabric::constants::SQ_DEPTH);
const _: () = assert!(RPC_PAYLOAD_MAX <= u16::MAX as usize);
