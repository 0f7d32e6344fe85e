//! Verb programs that the NIC runs without the host CPU (RedN), on the fabric's work
//! queues in registered memory ([`hytra_fabric::wq`]).
//!
//! - [`program`]: a builder for verb programs: `if` (a CAS on an entry's header),
//!   unrolled loops, recycled rounds that re-arm themselves, `break`; programs are
//!   checked before they are written to memory
//! - [`hash`]: a two-choice hash table laid out so the NIC can search it, and the CPU
//!   lookup every other path must agree with (the layout crate's, re-exported)
//! - [`list`]: linked lists laid out the same way, and the CPU traversal
//! - [`lookup`]: the offloaded lookup in a bucket array: the program, and the request and
//!   answer of the layout crate; the get service uses it, and [`lookup::Redn`] builds
//!   the programs of the transaction engine's `offload` execution strategy
//! - [`service`]: a key-value get service built from them, with three ways to get:
//!   offloaded (one SEND, answered by the server's NIC), one-sided (READs, two round
//!   trips), two-sided (an RPC served by the server's CPU)
//! - [`bench`](mod@bench): the `hytra offload` scenarios
//!
//! Two backends run verb programs: the simulator (profile `cx5`, with RedN's costs) and
//! `local` (a NIC thread, real time).

#![forbid(unsafe_code)]

pub mod bench;
pub use hytra_nicindex::hash;
pub mod list;
pub mod lookup;
pub mod program;
pub mod service;
