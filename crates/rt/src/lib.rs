//! hytra's runtime: what every worker runs on top of the fabric.
//!
//! - `worker`: the event loop ([`Worker`], a fabric [`Program`](hytra_fabric::Program))
//!   and [`Co`], the handle coroutines use to issue one-sided batches and RPCs
//! - `executor`: per-worker task slots and ready bitmap; no allocation per request
//! - `ops`: tickets for one-sided batches, completion routing, send-queue accounting,
//!   passive ACK
//! - `rpc`: frames over datagrams ([`frames`] parses a received one), per-destination
//!   coalescing, call slots and timeouts
//! - `cluster`: running one worker per endpoint of a backend
//! - `config`: the optimisation switches (doorbell batching, timeouts) and the CPU terms
//!   the runtime charges in the simulator
//! - `constants`: limits
//! - `hist`: mergeable latency histograms
//! - `waits`: coroutines waiting for a word in memory to reach a value (answers a NIC
//!   writes without a completion)
//!
//! The same code runs on every backend: coroutines are `async` tasks on a per-worker,
//! single-threaded executor, and all I/O goes through [`hytra_fabric::Endpoint`]. The
//! paper's optimisations map as follows: coroutines (CO) = several tasks per worker;
//! outstanding requests (OR) = several tickets or calls in flight before waiting;
//! doorbell batching (DB) = [`RtConfig::doorbell_batching`]; passive ACK (PA) =
//! [`Co::issue_unsignaled`] and [`Co::send_oneway`].

pub mod cluster;
pub mod config;
pub mod constants;
mod executor;
pub mod hist;
mod ops;
mod rpc;
mod timer;
mod waits;
pub mod window;
mod worker;

pub use cluster::{run_workers, run_workers_with, EpOf, WorkerReport};
pub use config::RtConfig;
pub use executor::YieldNow;
pub use ops::{OpStats, OpTicket};
pub use rpc::{
    frames, CallTicket, Frame, FrameKind, Frames, MalformedFrame, RemoteError, RpcError, RpcStats,
    RpcType,
};
pub use waits::Waits;
pub use worker::{
    Co, Handler, HandlerCtx, OpError, Poller, Sleep, StepBudget, WaitOp, WaitReply, Worker,
    WorkerStats,
};
