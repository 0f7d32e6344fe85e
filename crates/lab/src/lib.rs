//! hytra's experiment layer: what the `hytra` binary and Rust programs call to run
//! experiments, between the workloads and the command line.
//!
//! - [`cluster_file`]: the cluster file (TOML) of a benchmark spread over processes
//! - [`WORKLOADS`]: the transactional workloads by name

pub mod cluster_file;

/// The transactional workloads `hytra bench --workload` and cluster files name.
pub const WORKLOADS: [&str; 6] = ["smallbank", "tpcc", "tpcc-no", "tpce-cp", "tatp", "ycsb"];

/// What is said of a workload name that is not one of [`WORKLOADS`].
pub fn unknown_workload(name: &str) -> String {
    format!("unknown workload '{name}' (expected one of {})", WORKLOADS.join(", "))
}
