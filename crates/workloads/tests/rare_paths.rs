//! Paths of the engine that a benchmark takes too rarely to prove them, each forced once
//! on a two-node simulator: a torn record, a stale location-cache entry, an index slot
//! read before its offset, a lock held by someone else (once, or across attempts), a read
//! that changed before validation; and how soon a commit releases its locks.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, Endpoint, RunLimits};
use hytra_rt::{run_workers_with, RtConfig};
use hytra_store::layout::{is_present, slot_tag, Owner, ABSENT, RECORD_HEADER_WORDS};
use hytra_store::{Catalog, Fill, IndexLayout, Partitioner, TableId, TableSpec};
use hytra_txn::{AbortReason, Design, Engine, NodeEngine, Outcome, TxnConfig, TxnCtx, TxnStats};

const T: TableId = TableId(0);
/// Odd keys live on node 1 (primary) and node 0 (backup); the test coroutine runs on
/// node 0, so its accesses to `KEY` are remote.
const KEY: u64 = 1;
const OTHER: u64 = 3;

#[derive(Copy, Clone, Debug)]
enum Scenario {
    /// The primary's copy of `KEY` has a payload that disagrees with its checksum.
    Torn,
    /// Node 0's location cache points `KEY` at `OTHER`'s record.
    StaleCache,
    /// Someone else holds `KEY`'s lock while the transaction updates it.
    Locked,
    /// `KEY` gets a new version between the transaction's read and its commit.
    Changed,
    /// `NEW`'s index slot shows its tag but not yet its offset (a READ that returned the
    /// slot's words out of order looks the same) until node 1 publishes it, at
    /// `PUBLISH_AT_NS`, while the reader is retrying.
    Unpublished,
    /// Nothing planted: one transaction writes every record of node 1; a few round trips
    /// after it commits, the payload reports how many are still locked.
    WriteMany,
    /// `KEY` is deleted (absent at a version above 0) and `NEVER` was never inserted: a
    /// transaction reads both for update, finds them absent, writes neither and commits.
    /// The payload reports whether each holds a value afterwards.
    ReadAbsentForUpdate,
    /// The transaction reads `NEVER` (absent), then, before it commits, another inserts
    /// and deletes it; the transaction's insert over the absence it read must fail
    /// validation. The second attempt inserts it.
    InsertOverChangedAbsence,
    /// The transaction inserts `NEVER` (on node 1, a remote primary).
    Insert,
    /// Someone else holds `key`'s lock across attempts of one transaction, which reads
    /// it for update or, `read_only`, reads it and updates another record of its node;
    /// `torn`: the holder's write-back of it stopped part way (a writer that died), so
    /// its words do not verify either. Played by [`stuck`]: the payload reports, per
    /// abort, whether the retry waited ([`TxnCtx::await_stuck_lock`]).
    Stuck { key: u64, read_only: bool, torn: bool },
}

/// A key never loaded (odd: primary on node 1).
const NEVER: u64 = 41;

/// A key inserted by the Unpublished scenario (odd: primary on node 1).
const NEW: u64 = 21;
const PUBLISH_AT_NS: u64 = 8_000;
/// A few round trips: every write-back of a commit is on its way at once, so all of them
/// land in this time, passive ACK or not.
const WRITE_MANY_GRACE_NS: u64 = 8_000;

fn setup(mut cfg: TxnConfig, coherent: bool) -> (SimCluster, Engine) {
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let mut sim = SimConfig::new(shape, 1);
    sim.profile.atomics_coherent = coherent;
    let mut b = SimCluster::new(sim).unwrap();
    let table = TableSpec {
        id: T,
        name: "t".into(),
        payload_words: 2,
        capacity: 64,
        partitioner: Partitioner::Modulo,
        index: IndexLayout::Hashed,
        fill: Fill::Dense,
    };
    cfg.replication = 2;
    let catalog = Catalog::new(vec![table], 2, 2).unwrap();
    let engine = Engine::setup(&mut b, catalog, cfg, 1).unwrap();
    for key in 0..16u64 {
        engine.load(T, key, &[key, key]).unwrap();
    }
    // Before a scenario plants anything in one replica, so that the copies stay clean.
    engine.finish_loading();
    (b, engine)
}

/// Runs `scenario` in one coroutine on node 0: the first attempt meets the planted
/// condition, then the condition is removed and the second attempt runs. Returns both
/// outcomes, the payload the second attempt read, and node 0's counters.
fn run(design: Design, scenario: Scenario) -> (Vec<Outcome>, Vec<u64>, TxnStats) {
    run_cfg(TxnConfig::preset(design), scenario)
}

fn run_cfg(cfg: TxnConfig, scenario: Scenario) -> (Vec<Outcome>, Vec<u64>, TxnStats) {
    run_on(cfg, scenario, false)
}

/// [`run_cfg`] on a NIC whose atomics are coherent with the CPU's (`coherent`) or not.
fn run_on(
    cfg: TxnConfig,
    scenario: Scenario,
    coherent: bool,
) -> (Vec<Outcome>, Vec<u64>, TxnStats) {
    let design = cfg.design;
    let (mut b, engine) = setup(cfg, coherent);
    let unpublished = matches!(scenario, Scenario::Unpublished).then(|| hide_offset(&engine));
    let limits = RunLimits { time_limit_ns: 50_000_000 };
    let (mut results, stats) = run_workers_with(
        &mut b,
        RtConfig::default(),
        limits,
        |w| {
            let wt = engine.install(w, false);
            let out = Rc::new(RefCell::new((Vec::new(), Vec::new())));
            if w.co().me().node.0 == 0 {
                let mut ctx = wt.ctx(w.co(), 0);
                let (here, there) = (engine.nodes[0].clone(), engine.nodes[1].clone());
                let o = out.clone();
                w.spawn(move |_| async move {
                    let r = play(&mut ctx, scenario, &here, &there).await;
                    *o.borrow_mut() = r;
                });
            } else if let Some((at, off)) = unpublished {
                let primary = engine.nodes[1].clone();
                w.spawn(move |co| async move {
                    while co.now_ns() < PUBLISH_AT_NS {
                        co.yield_now().await;
                    }
                    primary.store.replica(T, 1).region().store(at, off);
                });
            }
            (wt, out)
        },
        |_, (wt, out)| (wt.stats(), out.take()),
    )
    .unwrap();
    assert!(stats.all_done, "{design:?} {scenario:?}: the run did not finish");
    let (stats, (outcomes, payload)) = results.swap_remove(0);
    (outcomes, payload, stats)
}

/// Inserts `NEW` at node 1 and zeroes its index slot's offset word; returns where that
/// word is and what belongs there.
fn hide_offset(engine: &Engine) -> (u64, u64) {
    let primary = engine.nodes[1].store.replica(T, 1);
    let off = primary.lookup_or_insert(NEW).unwrap();
    primary.write_back(off, 0, NEW, &[NEW, NEW]);
    let g = primary.geometry();
    let b = g.home_bucket(NEW);
    let s = primary.bucket_words(b).iter().step_by(2).position(|&w| w == slot_tag(NEW));
    let at = g.bucket_offset(b) + 16 * s.expect("NEW in its home bucket") as u64 + 8;
    primary.region().store(at, 0);
    (at, off)
}

#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
async fn play<E: Endpoint>(
    ctx: &mut TxnCtx<E>,
    scenario: Scenario,
    here: &Arc<NodeEngine>,
    there: &Arc<NodeEngine>,
) -> (Vec<Outcome>, Vec<u64>) {
    let primary = there.store.replica(T, 1);
    let off = primary.lookup(KEY).unwrap();
    let payload_at = off + RECORD_HEADER_WORDS * 8;
    let foreign = Owner::new(1, 0, hytra_txn::membership::EPOCH_FIRST, 77);
    if let Scenario::Stuck { key, read_only, torn } = scenario {
        return stuck(ctx, if key % 2 == 0 { here } else { there }, key, read_only, torn).await;
    }
    let key = if let Scenario::Unpublished = scenario { NEW } else { KEY };
    match scenario {
        Scenario::Torn => primary.region().store(payload_at, 999),
        Scenario::StaleCache => {
            here.store.cache().put(T, KEY, 0, primary.lookup(OTHER).unwrap());
        }
        Scenario::Locked => primary.try_lock(off, foreign).unwrap(),
        Scenario::ReadAbsentForUpdate => {
            // Deleted at version 5, at the primary and its backup alike.
            for node in [here, there] {
                let r = node.store.replica(T, 1);
                let at = r.lookup(KEY).unwrap();
                r.write_back(at, 5 | ABSENT, KEY, &[KEY, KEY]);
            }
        }
        Scenario::Changed
        | Scenario::Unpublished
        | Scenario::WriteMany
        | Scenario::InsertOverChangedAbsence
        | Scenario::Insert => {}
        Scenario::Stuck { .. } => unreachable!("played by stuck()"),
    }
    let mut outcomes = Vec::new();
    let mut seen = Vec::new();
    for round in 0..2 {
        if round == 1 {
            match scenario {
                Scenario::Torn => primary.region().store(payload_at, KEY),
                Scenario::Locked => assert!(primary.unlock_if(off, foreign)),
                Scenario::StaleCache
                | Scenario::Changed
                | Scenario::Unpublished
                | Scenario::WriteMany
                | Scenario::ReadAbsentForUpdate
                | Scenario::InsertOverChangedAbsence
                | Scenario::Insert => {}
                Scenario::Stuck { .. } => unreachable!("played by stuck()"),
            }
        }
        let mut t = ctx.begin(0);
        let body = async {
            match scenario {
                Scenario::Torn | Scenario::StaleCache | Scenario::Unpublished => {
                    let r = t.read(T, key).await?;
                    seen = t.get(r).to_vec();
                }
                Scenario::Locked => {
                    let r = t.read_for_update(T, KEY).await?;
                    t.update(r)[0] += 1;
                    seen = t.get(r).to_vec();
                }
                Scenario::Changed => {
                    let r = t.read(T, KEY).await?;
                    seen = t.get(r).to_vec();
                    let w = t.read_for_update(T, OTHER).await?;
                    t.update(w)[1] += 1;
                    if round == 0 {
                        let h = primary.header(off);
                        primary.write_back(off, h.version + 1, KEY, &[KEY, KEY]);
                    }
                }
                Scenario::WriteMany => {
                    for key in (1..16).step_by(2) {
                        let r = t.read_for_update(T, key).await?;
                        t.update(r)[0] += 1;
                    }
                }
                Scenario::ReadAbsentForUpdate => {
                    let [a, b] = t.read_many([(T, KEY), (T, NEVER)], true).await?;
                    assert!(!t.exists(a) && !t.exists(b), "both read as absent");
                }
                Scenario::InsertOverChangedAbsence => {
                    let r = t.read(T, NEVER).await?;
                    assert!(!t.exists(r));
                    if round == 0 {
                        // Another transaction inserts NEVER (version 1), a third deletes
                        // it (version 2, absent).
                        let at = primary.lookup_or_insert(NEVER).unwrap();
                        primary.write_back(at, 2 | ABSENT, NEVER, &[0, 0]);
                    }
                    t.insert_over(r, &[NEVER, NEVER])?;
                }
                Scenario::Insert => {
                    t.insert(T, NEVER, &[NEVER, NEVER])?;
                }
                Scenario::Stuck { .. } => unreachable!("played by stuck()"),
            }
            Ok(())
        }
        .await;
        outcomes.push(t.finish(body).await);
        if let Scenario::WriteMany = scenario {
            let until = ctx.co().now_ns() + WRITE_MANY_GRACE_NS;
            while ctx.co().now_ns() < until {
                ctx.co().yield_now().await;
            }
            let locked = (1..16u64)
                .step_by(2)
                .filter(|&k| primary.header(primary.lookup(k).unwrap()).lock != 0)
                .count();
            seen = vec![locked as u64];
        }
        if let Scenario::ReadAbsentForUpdate = scenario {
            seen = [KEY, NEVER]
                .iter()
                .map(|&k| {
                    primary
                        .lookup(k)
                        .map_or(0, |o| u64::from(is_present(primary.header(o).version)))
                })
                .collect();
        }
        if let Scenario::Insert = scenario {
            // With passive ACK the write-back may still be on its way.
            let until = ctx.co().now_ns() + WRITE_MANY_GRACE_NS;
            while ctx.co().now_ns() < until {
                ctx.co().yield_now().await;
            }
            let at = primary.lookup(NEVER).expect("inserted");
            let h = primary.header(at);
            seen = vec![h.lock, u64::from(is_present(h.version))];
            if round == 0 {
                // Delete it again behind the engine's back, for the second attempt.
                primary.write_back(at, h.version | ABSENT, NEVER, &[0, 0]);
            }
        }
    }
    (outcomes, seen)
}

/// Attempts of one transaction that a foreign owner's lock on `key` (at `node`, its
/// primary) aborts until, before the fifth, it is released; after each abort, whether
/// the retry waited. Then a new transaction meets a new lock of the same owner once.
async fn stuck<E: Endpoint>(
    ctx: &mut TxnCtx<E>,
    node: &Arc<NodeEngine>,
    key: u64,
    read_only: bool,
    torn: bool,
) -> (Vec<Outcome>, Vec<u64>) {
    let replica = node.store.replica(T, (key % 2) as u16);
    let off = replica.lookup(key).unwrap();
    let foreign = Owner::new(1, 0, hytra_txn::membership::EPOCH_FIRST, 77);
    let payload_at = off + RECORD_HEADER_WORDS * 8;
    let whole = replica.region().load(payload_at);
    let mut outcomes = Vec::new();
    let mut waited = Vec::new();
    for attempt in 0..7 {
        if attempt == 5 {
            // With passive ACK the commit's unlock may still be on its way.
            let until = ctx.co().now_ns() + WRITE_MANY_GRACE_NS;
            while ctx.co().now_ns() < until {
                ctx.co().yield_now().await;
            }
        }
        match attempt {
            0 | 5 => replica.try_lock(off, foreign).unwrap(),
            4 | 6 => assert!(replica.unlock_if(off, foreign), "the foreign lock held"),
            _ => {}
        }
        if torn {
            // Torn while held, whole again once released.
            let word = if matches!(attempt, 0 | 5) { whole ^ 0xdead } else { whole };
            if matches!(attempt, 0 | 4 | 5 | 6) {
                replica.region().store(payload_at, word);
            }
        }
        if attempt == 6 {
            break;
        }
        let mut t = if matches!(attempt, 0 | 5) { ctx.begin(0) } else { ctx.retry() };
        let body = async {
            let r =
                if read_only { t.read(T, key).await? } else { t.read_for_update(T, key).await? };
            let w = if read_only { t.read_for_update(T, key + 2).await? } else { r };
            t.update(w)[1] += 1;
            Ok(())
        }
        .await;
        let outcome = t.finish(body).await;
        outcomes.push(outcome);
        if outcome != Outcome::Committed {
            waited.push(u64::from(ctx.await_stuck_lock().await));
        }
    }
    (outcomes, waited)
}

#[test]
fn a_lock_held_across_three_attempts_makes_the_retries_wait() {
    for design in Design::ALL {
        for key in [KEY, 2] {
            for read_only in [false, true] {
                let what = format!("{design:?}, key {key}, read only {read_only}");
                let scenario = Scenario::Stuck { key, read_only, torn: false };
                let (outcomes, waited, stats) = run(design, scenario);
                let blocked = |o: &Outcome| {
                    matches!(o, Outcome::Aborted(AbortReason::Conflict | AbortReason::Validation))
                };
                assert!(outcomes[..4].iter().all(blocked), "{what}: {outcomes:?}");
                assert_eq!(outcomes[4], Outcome::Committed, "{what}");
                assert!(blocked(&outcomes[5]), "{what}: {outcomes:?}");
                // The third and fourth blocks wait; a new transaction counts afresh.
                assert_eq!(waited, [0, 0, 1, 1, 0], "{what}");
                assert_eq!(stats.stuck_lock_waits, 2, "{what}");
            }
        }
    }
}

/// A record that a dead writer left torn and locked: its readers, which abort as torn
/// (or, locking it, on its lock), wait as for any stuck lock.
#[test]
fn a_record_left_torn_under_a_lock_makes_the_retries_wait() {
    for design in Design::ALL {
        for key in [KEY, 2] {
            let what = format!("{design:?}, key {key}");
            let (outcomes, waited, stats) =
                run(design, Scenario::Stuck { key, read_only: true, torn: true });
            let blocked = |o: &Outcome| {
                matches!(
                    o,
                    Outcome::Aborted(
                        AbortReason::Torn | AbortReason::Conflict | AbortReason::Validation
                    )
                )
            };
            assert!(outcomes[..4].iter().all(blocked), "{what}: {outcomes:?}");
            assert!(
                outcomes.contains(&Outcome::Aborted(AbortReason::Torn)),
                "{what}: {outcomes:?}"
            );
            assert_eq!(outcomes[4], Outcome::Committed, "{what}");
            assert_eq!(waited, [0, 0, 1, 1, 0], "{what}");
            assert_eq!(stats.stuck_lock_waits, 2, "{what}");
        }
    }
}

#[test]
fn a_torn_record_aborts_the_attempt_and_the_next_one_commits() {
    for design in [Design::DrtmH, Design::DrtmR, Design::Farm, Design::Fasst] {
        let (outcomes, payload, stats) = run(design, Scenario::Torn);
        assert_eq!(
            outcomes,
            [Outcome::Aborted(AbortReason::Torn), Outcome::Committed],
            "{design:?}"
        );
        assert!(stats.torn_reads >= 16, "{design:?}: {} torn reads", stats.torn_reads);
        assert_eq!(payload, [KEY, KEY], "{design:?}: the repaired record");
    }
}

#[test]
fn a_stale_cache_entry_is_detected_and_refetched() {
    for design in [Design::DrtmH, Design::DrtmR] {
        let (outcomes, payload, stats) = run(design, Scenario::StaleCache);
        assert_eq!(outcomes, [Outcome::Committed, Outcome::Committed], "{design:?}");
        assert_eq!(stats.stale_cache, 1, "{design:?}");
        assert_eq!(payload, [KEY, KEY], "{design:?}: read the right record");
        assert!(stats.cache_hits >= 2, "{design:?}: the fixed entry is used again");
    }
}

#[test]
fn a_foreign_lock_aborts_with_conflict_and_is_never_released_by_us() {
    for design in Design::ALL {
        let (outcomes, payload, _) = run(design, Scenario::Locked);
        assert_eq!(
            outcomes,
            [Outcome::Aborted(AbortReason::Conflict), Outcome::Committed],
            "{design:?}"
        );
        // `unlock_if` in round 1 asserted the foreign lock survived the aborted attempt.
        assert_eq!(payload, [KEY + 1, KEY], "{design:?}");
    }
}

#[test]
fn a_read_that_changed_before_commit_fails_validation() {
    for design in Design::ALL {
        let (outcomes, _, stats) = run(design, Scenario::Changed);
        assert_eq!(
            outcomes,
            [Outcome::Aborted(AbortReason::Validation), Outcome::Committed],
            "{design:?}"
        );
        assert_eq!(stats.aborts[1], 1, "{design:?}: counted as a validation abort");
    }
}

#[test]
fn an_index_slot_without_its_offset_is_read_again() {
    // The designs that traverse the index with one-sided READs.
    for design in [Design::Farm, Design::DrtmR] {
        let (outcomes, payload, stats) = run(design, Scenario::Unpublished);
        // The reader re-reads the bucket, not the record at offset 0, so it finds the
        // offset once published and commits at the first attempt.
        assert_eq!(outcomes, [Outcome::Committed, Outcome::Committed], "{design:?}");
        assert!(stats.torn_reads >= 1, "{design:?}: {} re-reads", stats.torn_reads);
        assert_eq!(payload, [NEW, NEW], "{design:?}");
    }
}

#[test]
fn a_commit_releases_all_its_locks_within_a_few_round_trips() {
    for design in Design::ALL {
        for passive_ack in [false, true] {
            let cfg = TxnConfig { passive_ack, ..TxnConfig::preset(design) };
            let (outcomes, locked, _) = run_cfg(cfg, Scenario::WriteMany);
            let what = format!("{design:?}, passive ACK {passive_ack}");
            assert_eq!(outcomes, [Outcome::Committed, Outcome::Committed], "{what}");
            assert_eq!(locked, [0], "{what}: records still locked");
        }
    }
}

#[test]
fn a_record_read_absent_and_not_written_stays_absent() {
    for design in Design::ALL {
        let (outcomes, present, _) = run(design, Scenario::ReadAbsentForUpdate);
        assert_eq!(outcomes, [Outcome::Committed, Outcome::Committed], "{design:?}");
        // Neither a deleted record nor one never inserted comes back as a row.
        assert_eq!(present, [0, 0], "{design:?}: records with a value afterwards");
    }
}

#[test]
fn an_insert_over_an_absence_that_changed_fails_validation() {
    for design in Design::ALL {
        let (outcomes, _, _) = run(design, Scenario::InsertOverChangedAbsence);
        assert_eq!(
            outcomes,
            [Outcome::Aborted(AbortReason::Validation), Outcome::Committed],
            "{design:?}"
        );
    }
}

#[test]
fn a_remote_insert_locks_once_whatever_the_atomics() {
    // On a NIC whose atomics are coherent with the CPU's, the primary's handler once
    // locked the record it created for a NIC-locking insert, whose CAS then failed.
    for design in Design::ALL {
        for coherent in [false, true] {
            let (outcomes, seen, _) = run_on(TxnConfig::preset(design), Scenario::Insert, coherent);
            let what = format!("{design:?}, coherent atomics {coherent}");
            assert_eq!(outcomes, [Outcome::Committed, Outcome::Committed], "{what}");
            assert_eq!(seen, [0, 1], "{what}: unlocked and present after the commit");
        }
    }
}
