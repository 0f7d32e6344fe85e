//! hytra's experiment layer: what the `hytra` binary and Rust programs call to run
//! experiments, between the workloads and the command line.
//!
//! - `cmd`: every command's options, declared for clap and checked into the plan of a run
//!   before any work ([`cmd::Usage`] on refusal)
//! - `workload`: workloads by name, with their sizing ([`WorkloadSpec`])
//! - `backend`: backends by name ([`BackendSpec`])
//! - `auto`: `--design auto`'s choice by trial runs ([`auto::pick_design`])
//! - `run`: one run of a workload on a backend, measured and judged ([`run()`])
//! - `bench`: what a `hytra bench` run reports, typed ([`bench::BenchReport`]), and the
//!   recovery times of its crashes
//! - `io_files`: the files `hytra io` reads: its data file, given or generated, and traces
//! - `judge`: whether a bench window can report a rate, the longer window a default one
//!   is measured again over, and whether a run fits in memory
//! - `bench_text`: that report as the text `hytra bench` prints
//! - `micro`: the raw-primitive benchmark (and the multi-object one), measured point by
//!   point
//! - `io`: the remote-I/O benchmark's matrix of points and trace replays, measured
//!   ([`io::measure`]), and its report
//! - `cpu_profile`: CPU profiles, the simulator's costs of hytra's own code
//! - `calibrate`: measuring those costs on this machine and fitting a profile
//! - `swarm`: whole configurations drawn from a seed, run and judged by every oracle
//! - `offload`: RedN's scenarios for `hytra offload`, and its report
//! - `launch`: `hytra cluster`'s launcher of a benchmark's node processes (feature
//!   `ucx`)
//! - `cluster_file`: the cluster file (TOML) of a benchmark spread over processes
//! - `reproduce`: the paper's figures and claims as a matrix of simulated runs, and its
//!   report (HTML with SVG charts, JSON)
//! - `span`: lengths of time as every command takes and prints them ([`span::Span`])
//! - `table`: tables printed with aligned columns, and the numbers in them

pub mod auto;
pub mod backend;
pub mod bench;
pub mod bench_text;
pub mod calibrate;
pub mod cluster_file;
pub mod cmd;
pub mod cpu_profile;
pub mod io;
pub mod io_files;
pub mod judge;
pub mod launch;
pub mod micro;
pub mod offload;
pub mod place;
pub mod reproduce;
pub mod run;
pub mod span;
pub mod swarm;
pub mod swarm_processes;
pub mod table;
pub mod workload;

pub use backend::{BackendSpec, Bootstrap, Launcher, Placement, StoreAt, UcxSpec};
pub use cpu_profile::{CpuProfile, CPU_PROFILES};
pub use run::{run, Outcome, RunSpec, Watch};
pub use workload::{unknown_workload, WorkloadSpec, WORKLOADS};

/// The CPU profile of simulated transactional runs unless one is named: the paper's
/// machines (`hytra bench`, `hytra reproduce`).
pub const CPU_PROFILE_DEFAULT: &str = "paper";

/// Timeline interval of a run with crashes (at least; long runs get wider ones): fine
/// enough to see a recovery of a few leases.
pub const CRASH_TIMELINE_NS: u64 = 100_000;
