//! hytra's workloads: benchmarks that each carry their own correctness oracle.
//!
//! - [`micro`]: the raw-primitive benchmark of DrTM+H §4.2 (READ, WRITE, CAS, FAA, UD
//!   RPC and WRITE-based RPC against payload size)
//!
//! Still to come (see docs/ARCHITECTURE.md): SmallBank, TPC-C, TPC-E customer-position,
//! TATP, YCSB and the multi-object micro-benchmarks of §4, built on the transaction
//! engine.

pub mod micro;
