//! hytra's experiment layer: what the `hytra` binary and Rust programs call to run
//! experiments, between the workloads and the command line.
//!
//! - `workload`: workloads by name, with their sizing ([`WorkloadSpec`])
//! - `backend`: backends by name ([`BackendSpec`])
//! - `run`: one run of a workload on a backend, measured and judged ([`run()`])
//! - `cpu_profile`: CPU profiles, the simulator's costs of hytra's own code
//! - `calibrate`: measuring those costs on this machine and fitting a profile
//! - `swarm`: whole configurations drawn from a seed, run and judged by every oracle
//! - `cluster_file`: the cluster file (TOML) of a benchmark spread over processes

pub mod backend;
pub mod calibrate;
pub mod cluster_file;
pub mod cpu_profile;
pub mod run;
pub mod swarm;
pub mod workload;

pub use backend::{BackendSpec, Placement, UcxSpec};
pub use cpu_profile::{CpuProfile, CPU_PROFILES};
pub use run::{run, Outcome, RunSpec};
pub use workload::{unknown_workload, WorkloadSpec, WORKLOADS};
