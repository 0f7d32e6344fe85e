//! hytra's fabric: the RDMA verbs model every other layer is written against, and its
//! backends.
//!
//! - `ids`: nodes, workers, region keys, remote addresses, queue pairs
//! - `verbs`: work requests, flags, completions, errors
//! - `memory`: registered regions, touched only through word-granular atomics
//! - `endpoint`: the [`Endpoint`], [`Program`] and [`Backend`] traits
//! - `exec`: post-time validation and target-side effects shared by every backend
//! - `constants`: limits shared by all backends (the IB MTU, inline size, queue depths)
//! - [`wq`]: work queues in registered memory, for verb programs run by the NIC
//! - [`append`]: files appended through a shared mapping (journals a killed process
//!   leaves behind)
//! - `disk` (Linux): direct-I/O files and an io_uring reader, the storage device of
//!   remote I/O
//! - [`heap`]: allocator settings for programs that run many clusters in turn
//! - `rng`: the seeded generator every deterministic component draws from
//! - [`sim`]: deterministic discrete-event simulation of a whole cluster
//! - [`local`]: every node as threads of this process, in real time
//! - `ucx` (feature `ucx`): processes and networks through UCX
//! - [`testing`]: test harness shared by the suites of every crate (one suite, every
//!   backend)
//!
//! The model follows verbs so that readers of the papers recognise it: per-(worker, node)
//! reliable connections carrying READ/WRITE/CAS/FAA in FIFO order, a per-worker datagram
//! endpoint, per-worker completion queues, and the flags `signaled`, `inline` and `more`.
//! See docs/ARCHITECTURE.md for the map and docs/INVARIANTS.md for the rules.

pub mod append;
pub mod constants;
pub mod cpu;
#[cfg(target_os = "linux")]
pub mod disk;
mod endpoint;
mod exec;
pub mod heap;
mod ids;
pub mod local;
mod memory;
mod node_fault;
pub mod rng;
pub mod sim;
mod stepper;
pub mod testing;
#[cfg(feature = "ucx")]
pub mod ucx;
mod verbs;
pub mod wq;

pub use endpoint::{
    validate_shape, Backend, BackendError, Caps, Endpoint, Pages, Program, RegionSpec, RunLimits,
    RunStats, Step,
};
pub use ids::{ClusterShape, LocalAddr, NodeId, Qp, RemoteAddr, Rkey, WorkerId, WrId};
pub use memory::{
    witness_atomics, zeroed_u32s, zeroed_words, zeroed_words_small_pages, Region, Zeroed,
};
pub use node_fault::{NodeFault, NodeFaultKind, LIVES_MAX};
pub use verbs::{
    AccessError, BatchPost, BatchRefused, Completion, OpFlags, OpKind, PostError, Status,
    WorkRequest, WriteSrc,
};
