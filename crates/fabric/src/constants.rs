//! Limits of the verbs model shared by every backend.
//!
//! Each value is a limit a real RNIC or our memory model imposes; the backends assert
//! against them so that code which runs on the simulator also runs on hardware.

/// Largest datagram payload on the simulator and on threads, and the largest RPC frame on
/// every backend. UD on InfiniBand carries at most one MTU per message and 4 KiB is the
/// largest IB MTU; the paper's RPCs use it (§3.1). UCX, whose active messages are not
/// bound to one MTU, carries datagrams of several frames up to its own larger limit
/// (`ucx::UCX_DATAGRAM_MTU`); every backend states its own in `Caps::mtu`.
pub const DATAGRAM_MTU: usize = 4096;

/// Every one-sided transfer moves whole 8-byte words at 8-byte aligned offsets: registered
/// memory is only touched through word-granular atomics (see docs/INVARIANTS.md).
pub const WORD: u64 = 8;

/// Largest single READ or WRITE. RC allows up to 2 GiB; nothing in hytra moves more than
/// a log segment or an I/O block at once, and a bound keeps a typo from copying gigabytes.
pub const TRANSFER_MAX: u64 = 1 << 20;

/// Largest WRITE whose payload may be copied into the work request (`inline`). ConnectX-4
/// accepts a few hundred bytes; the paper inlines WRITEs below 64 bytes (§3.1).
pub const INLINE_MAX: usize = 256;

/// Work requests a connection may have outstanding (posted and not yet known complete).
/// An unsignaled request stays outstanding until a later signaled one on the same
/// connection completes, so users must signal at least every `SQ_DEPTH` requests.
pub const SQ_DEPTH: u32 = 256;

/// Completions a worker's completion queue holds. Backends refuse a signaled post (queue
/// full) while the worker already has this many signaled requests in flight, so the
/// queue cannot overflow; a real CQ overflow would break the queue pairs behind it.
pub const CQ_DEPTH: usize = 8192;

/// Datagrams a worker's receive queue holds; more arrive only to be dropped, as on a UD
/// queue pair that ran out of posted receive buffers.
pub const RECV_DEPTH: usize = 4096;

/// Upper bound on nodes in a cluster (wire headers use u16 node ids).
pub const NODES_MAX: u16 = 1024;

/// Upper bound on workers per node.
pub const WORKERS_PER_NODE_MAX: u16 = 256;

/// Upper bound on lanes (connections per peer per worker).
pub const LANES_MAX: u16 = 16;

const _: () = assert!(DATAGRAM_MTU % WORD as usize == 0);
const _: () = assert!(INLINE_MAX % WORD as usize == 0 && INLINE_MAX <= DATAGRAM_MTU);
const _: () = assert!(TRANSFER_MAX % WORD == 0);
const _: () = assert!(CQ_DEPTH >= SQ_DEPTH as usize);
