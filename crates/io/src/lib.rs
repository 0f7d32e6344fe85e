//! Remote storage I/O over hytra's fabric (disaggregated storage): a node serves reads
//! of its exported files to remote workers, which get the bytes by one-sided WRITE into
//! their registered buffers.
//!
//! - [`export`]: the fixed table of readable files (no path ever crosses the wire)
//! - [`wire`]: `READ`, `DONE`, `LOOKUP`, `BYE` messages
//! - [`engine`]: how the owner reads: a static pool of I/O threads, a thread per
//!   request, io_uring, or no I/O; real timing or a modelled device on the simulator
//! - [`service`]: the serving worker (queue, server coroutines, WRITE then `DONE`)
//! - [`client`]: `read(node, file, offset, len)` for coroutines
//! - [`trace`]: `offset,length` traces and a TPC-H Q3-like generator
//! - [`bench`](mod@bench): the `hytra io` measurements
//!
//! It needs only `fabric` and `rt`, not the transaction engine.

#![forbid(unsafe_code)]

pub mod bench;
pub mod client;
pub mod engine;
pub mod export;
pub mod service;
pub mod trace;
pub mod wire;

pub use client::{ClientConfig, IoClient, IoError};
pub use engine::{DeviceModel, Engine, EngineCosts, EngineKind, NodeIo, Timing};
pub use export::{Exports, FileId};
pub use service::{serve, IoLayout, ServiceConfig, ServiceStats};
pub use wire::ReadStatus;
