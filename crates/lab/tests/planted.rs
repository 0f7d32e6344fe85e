//! The swarm's oracles catch planted bugs: each bug is planted in every seed, and the
//! swarm must fail within a bounded number of seeds (the first failing seed of each is
//! recorded in docs/TESTING.md). A failing seed replays with the same trace hash.

use hytra_lab::swarm::{run_seed, run_swarm, SwarmBackend, SwarmOptions};
use hytra_txn::PlantedFault;

/// Seeds each planted bug may take to be caught (the slowest, `accept-torn-read`, takes 64 today).
const SEEDS_MAX: u64 = 80;

fn first_caught(planted: PlantedFault) -> Option<u64> {
    let opts = SwarmOptions {
        backend: SwarmBackend::Sim,
        first_seed: 1,
        seeds: Some(SEEDS_MAX),
        time_limit: None,
        jobs: 2,
        planted: Some(planted),
        stop_at_failure: true,
        stop_early: || false,
    };
    run_swarm(&opts, |_| {}).failures().map(|r| r.seed).min()
}

#[test]
fn every_planted_bug_is_caught() {
    // `CommitBeforeLogged` shows only when a node dies between the commit and the logs:
    // the seeds that crash one catch it.
    for planted in PlantedFault::ALL.iter() {
        let seed = first_caught(*planted);
        assert!(seed.is_some(), "{} went unnoticed in {SEEDS_MAX} seeds", planted.name());
    }
}

#[test]
fn a_failing_seed_replays_exactly() {
    let planted = Some(PlantedFault::SkipVersionBump);
    let a = run_seed(1, SwarmBackend::Sim, planted);
    let b = run_seed(1, SwarmBackend::Sim, planted);
    assert!(!a.passed(), "the planted bug is caught on seed 1");
    assert!(a.trace_hash.is_some());
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.findings, b.findings);
    assert_eq!(a.summary, b.summary);
}
