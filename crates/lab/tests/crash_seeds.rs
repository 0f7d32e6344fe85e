//! Swarm seeds that crash nodes (or pause one past its lease, or cut it off), and others
//! that once failed, each replayed: the bug it found stays fixed. Each names what it found (docs/TESTING.md, "What it found").

use hytra_lab::swarm::{draw, run_seed, SwarmBackend};
use hytra_txn::ProtocolPoint;

/// (seed, what it found).
const FOUND: [(u64, &str); 19] = [
    (19, "a crashed coordinator's updates that recovery committed were not counted"),
    (124, "an answer from before a recovery started a log ring over below its new head: a new backup never applied what was logged there"),
    (228, "a takeover counted a new backup that never took a transaction's log among those that must hold it"),
    (48, "a member took the new manager for dead while it reconfigured"),
    (178, "one lost datagram made a live member silent in a round"),
    (244, "TPC-C's customer name lookups went to the crashed node"),
    (397, "a passive acknowledgement of an epoch that is over was dropped uncollected"),
    (2513, "an APPLY lost on the way left a committed transaction off its primary"),
    (2563, "the manager's own rounds outlasted the leases of its members"),
    (6049, "the manager took itself for silent while it applied its decisions; later, a round of many APPLYs took its last requests for silent before they were sent"),
    (7407, "a member took the manager for dead while its rounds ran without granting"),
    (7651, "one slow member held up the retries to the others, and the live one was removed"),
    (31701, "scans queued 4 096 READs at the manager's worker: the callers timed out and resent them, the renewals queued behind them lapsed, and live nodes were removed until a partition was lost"),
    (52199, "a copy took four blocks per round of its worker's coroutines, and rounds of Stock-Level attempts (170 us each) held it to a tenth of its pace: three partitions per survivor were still copying when the run ended"),
    (77058, "with a step budget on worker 0 alone, Stock-Level turns on the other workers held re-replication's copies to one turn per 2-3 ms: two were still copying when the run ended"),
    (78515, "a new backup asked the primary's worker for its record counts with a 1 ms timeout, and that worker's steps (a budget of 625 us and a Stock-Level turn) took 2 ms to answer: every request timed out, each answer arriving during the next, and two copies never began"),
    (74837, "twenty Stock-Level turns of 100-170 us in one step held a member's renewals back for 3.4 ms, past its 2 ms lease: the manager, hearing no member, stepped down, and every node stopped"),
    (112008, "a log entry torn by its writer's crash mid-WRITE, over an earlier lap's entry of the same length, passed for whole while its last word named no position: replayed, it wrote words of two transactions (fails with the trailer's position taken out)"),
    (102279, "a member that took the dead manager for dead removed it again after the configuration without it was installed: a node running rounds beside the live manager removed that one too, and a third crash met a partition still copying"),
];

/// Runs `seed` on `backend` and requires every oracle to pass.
fn passes(seed: u64, backend: SwarmBackend, found: &str) {
    let r = run_seed(seed, backend, None);
    assert!(r.passed(), "seed {seed} on {backend:?} ({found}): {:?}\n{}", r.findings, r.summary);
}

#[test]
fn crash_seeds_that_found_bugs_pass() {
    for (seed, found) in FOUND {
        let d = draw(seed, SwarmBackend::Sim, None);
        assert!(!d.crashes().is_empty(), "seed {seed} crashes a node: {}", d.summary());
        passes(seed, SwarmBackend::Sim, found);
    }
}

/// Seeds that pause a node past its lease and once failed: (seed, what it found).
const LONG_PAUSES: [(u64, &str); 3] = [
    (38, "a removed node's coroutines, stopped with tickets in hand, counted as leaks"),
    (377, "the manager woke after its removal, took everyone for dead and stopped the cluster"),
    (9325, "READs overtook unsignaled CASes, the atomic unit's queue grew without bound, and a live node's renewals waited behind it"),
];

/// Seeds that cut a node off past the transport's retries and once failed.
const LONG_CUTS: [(u64, &str); 6] = [
    (387, "the cut-off manager took every member for dead and removed them all"),
    (403, "the same, on TPC-C"),
    (680, "the same, with a lease of 1 ms"),
    (1142, "a failed write-back counted as landed, and its committed version was lost"),
    (40123, "a lock request's resend refused as stale was taken to mean the record was not locked, though the send before it, unanswered, had locked it: the lock was never released"),
    (88320, "the manager removed a member whose grants were lost one way, but kept granting it: the cut healed, the grants arrived, and the member, which could not be fenced off, committed under its new lease after the configuration without it was in force: updates lost, versions written twice"),
];

/// Runs every seed of `found` on the simulator, each first checked to draw `fault`.
fn sim_seeds_with_fault_pass(found: &[(u64, &str)], fault: &str) {
    for &(seed, what) in found {
        let d = draw(seed, SwarmBackend::Sim, None);
        assert!(
            d.dimensions().contains(&("faults", fault.to_string())),
            "seed {seed} draws a {fault}: {}",
            d.summary()
        );
        passes(seed, SwarmBackend::Sim, what);
    }
}

#[test]
fn long_cut_seeds_that_found_bugs_pass() {
    sim_seeds_with_fault_pass(&LONG_CUTS, "long cut");
}

#[test]
fn long_pause_seeds_that_found_bugs_pass() {
    sim_seeds_with_fault_pass(&LONG_PAUSES, "long pause");
}

/// Seeds on threads that pause the manager past its lease (threads cannot fence a node
/// off, so only the lease stops it) and once failed; real time, so a replay is the same
/// configuration, not the same interleaving: (seed, what it found).
const LONG_PAUSES_ON_THREADS: [(u64, &str); 2] = [
    (323, "the manager woke, renewed its own lapsed lease and wrote versions twice"),
    (893, "the manager woke, renewed its own lapsed lease and wrote versions twice"),
];

#[test]
fn long_pauses_on_threads_that_found_bugs_pass() {
    for (seed, found) in LONG_PAUSES_ON_THREADS {
        passes(seed, SwarmBackend::Local, found);
    }
}

/// Seeds that crash a node at each point of the protocol the swarm draws: (seed, point).
const POINT_CRASHES: [(u64, ProtocolPoint); 3] = [
    (81, ProtocolPoint::LoggedPartly),
    (140, ProtocolPoint::WrittenBackPartly),
    (74, ProtocolPoint::Reconfiguring),
];

#[test]
fn crashes_at_each_point_of_the_protocol_are_recovered_from() {
    for (seed, point) in POINT_CRASHES {
        let d = draw(seed, SwarmBackend::Sim, None);
        let drawn = d.spec.txn.crash_point.map(|c| c.point);
        assert_eq!(drawn, Some(point), "seed {seed} draws the point: {}", d.summary());
        let r = run_seed(seed, SwarmBackend::Sim, None);
        let reached = r.dimensions.iter().any(|(k, v)| *k == "crash point reached" && v == "true");
        assert!(reached, "seed {seed} reached {point:?}: {}", r.summary);
        assert!(r.passed(), "seed {seed} ({point:?}): {:?}\n{}", r.findings, r.summary);
    }
}

/// Seeds with no node fault that once failed: (seed, what it found).
const OTHERS: [(u64, &str); 1] = [(
    42344,
    "YCSB-E's coroutines each sent a READ for every record of their scans before collecting any: together they took every call slot of their worker, and each waited for one more",
)];

#[test]
fn other_seeds_that_found_bugs_pass() {
    for (seed, found) in OTHERS {
        passes(seed, SwarmBackend::Sim, found);
    }
}
