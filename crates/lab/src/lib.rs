//! hytra's experiment layer: what the `hytra` binary and Rust programs call to run
//! experiments, between the workloads and the command line.
