//! hytra's workloads: benchmarks that each carry their own correctness oracle.
//!
//! - [`micro`]: the raw-primitive benchmark of DrTM+H §4.2 (READ, WRITE, CAS, FAA, UD
//!   RPC and WRITE-based RPC against payload size)
//! - [`mod@bench`]: running a transactional workload and judging it (checker, invariants)
//! - [`smallbank`]: the SmallBank benchmark (H-Store)
//!
//! Still to come (see docs/ARCHITECTURE.md): TPC-C, TPC-E customer-position, TATP, YCSB
//! and the multi-object micro-benchmarks of §4.

pub mod bench;
pub mod micro;
pub mod smallbank;
pub mod tpcc;
