//! hytra's workloads: benchmarks that each carry their own correctness oracle.
//!
//! - [`micro`] — the raw-primitive benchmarks of DrTM+H §4 (READ, WRITE, CAS, FAA, UD
//!   RPC and WRITE-based RPC against payload size, Fig. 5; multi-object transactions
//!   with the optimisations switched on one by one, Fig. 6)
//! - [`mod@bench`] — running a transactional workload and judging it (checker, invariants)
//! - [`smallbank`] — SmallBank (H-Store)
//! - [`tpcc`] — TPC-C, the standard mix and DrTM+H's New-Order-only TPC-C/no
//! - [`tpce`] — TPC-E's Customer-Position (read-only, distributed)
//! - [`tatp`] — TATP (FaRM's and FaSST's telecom benchmark)
//! - [`tally`] — what clients committed, and what a crash left in doubt, for the invariants
//! - [`ycsb`] — YCSB core workloads A-F

pub mod bench;
pub mod micro;
pub mod smallbank;
pub mod tally;
pub mod tatp;
pub mod tpcc;
pub mod tpce;
pub mod ycsb;
