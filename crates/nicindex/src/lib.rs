//! The data layout a NIC searches without the host CPU, in the fabric's work-request
//! format ([`hytra_fabric::wq`]), and nothing that builds or runs verb programs:
//!
//! - [`hash`]: a two-choice hash table whose bucket is one READ away from a response
//!   "send this item", the bucket array alone (an index of records kept elsewhere), and
//!   the CPU lookup every other path must agree with
//! - [`lookup`]: the request that triggers an offloaded lookup, where its program
//!   answers and how the client reads the answer, and the interface
//!   ([`lookup::LookupPrograms`]) through which a side system builds the programs
//!
//! The transaction engine's `offload` strategy depends on this layout only; the verb
//! programs come from `hytra-offload`, handed to the engine by its caller.

#![forbid(unsafe_code)]

pub mod hash;
pub mod lookup;
