//! The `local` NIC profile reproduces the primitives it was fitted to.
//!
//! The profile's host costs were fitted so that the simulator, with the built-in `host`
//! CPU profile for the runtime's own work, gives what `hytra micro --backend local`
//! measured on this project's test machine (docs/PERFORMANCE.md §29: medians of five runs,
//! 2 nodes x 1 worker, 64 B). The figures below are those measurements. A change to the
//! `host` profile or to the runtime's costs moves the simulated side: this test then
//! says that the fit has to be redone, with the same commands.

use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::CpuMode;
use hytra_fabric::ClusterShape;
use hytra_lab::micro::{run_matrix, MicroBackend, MicroPlan};
use hytra_lab::CpuProfile;
use hytra_workloads::micro::{MicroParams, Primitive};

/// `hytra micro --backend local`, 8 coroutines x batch 8: Mops/s per node.
const READ_RATE: f64 = 17.75e6;
const RPC_RATE: f64 = 2.70e6;
/// The same with 1 coroutine x batch 1: an RPC's round trip, p50.
const RPC_P50_NS: f64 = 1850.0;
/// How far a fitted figure may be from its measurement (the local runs themselves
/// spread by about this much around their median).
const TOLERANCE: f64 = 0.10;

fn plan(coroutines: u16, batch: u16) -> MicroPlan {
    let costs = CpuProfile::load("host").expect("the built-in host profile").table("micro", &[]);
    MicroPlan {
        backend: MicroBackend::Sim {
            profile: Box::new(NicProfile::local()),
            cpu: CpuMode::Model,
            costs,
        },
        shape: ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 },
        primitives: vec![Primitive::Read, Primitive::Rpc],
        payloads: vec![64],
        lanes: vec![1],
        params: MicroParams::fig5(coroutines, batch, 20_000, 60_000, 1),
        ucp_baseline: false,
    }
}

fn within(what: &str, got: f64, want: f64) {
    let ratio = got / want;
    assert!(
        (1.0 - TOLERANCE..=1.0 + TOLERANCE).contains(&ratio),
        "{what}: the simulator gives {got:.0}, the local backend measured {want:.0} ({ratio:.2}x)"
    );
}

#[test]
fn rates_with_8_coroutines_match_the_local_backend() {
    let run = run_matrix(&plan(8, 8), false, &mut |_, _, _| {}).expect("the points run");
    let rate = |p: Primitive| {
        run.results.iter().find(|m| m.point.primitive == p).expect("measured").point.ops_per_sec
    };
    within("READ rate", rate(Primitive::Read), READ_RATE);
    within("RPC rate", rate(Primitive::Rpc), RPC_RATE);
}

#[test]
fn an_rpc_round_trip_matches_the_local_backend() {
    let run = run_matrix(&plan(1, 1), false, &mut |_, _, _| {}).expect("the points run");
    let rpc = run.results.iter().find(|m| m.point.primitive == Primitive::Rpc).expect("measured");
    within("RPC p50", rpc.point.p50_ns as f64, RPC_P50_NS);
}
