//! Offloaded gets on random tables return exactly what the server CPU's lookup returns:
//! present keys in either candidate bucket, values of many lengths, and absent keys; on
//! the simulated cx5 NIC and on the `local` backend's NIC thread.

use std::cell::RefCell;
use std::rc::Rc;

mod common;

use common::{check_answers, local, sim, LOCAL_TIMEOUT_NS};
use hytra_fabric::{Backend, NodeId, RunLimits};
use hytra_offload::hash::HashTable;
use hytra_offload::service::{cpu_get, GetMode, GetResult, KvConfig, KvService, Search, Structure};
use hytra_rt::{run_workers_with, RtConfig};
use proptest::prelude::*;

/// Per-get timeout on the simulator (virtual time).
const SIM_TIMEOUT_NS: u64 = 40_000;

/// Inserts `entries` into a fresh table, gets every key in `asks` through the offload
/// (one slot, one get at a time) and returns each answer next to the CPU's lookup.
fn offloaded_vs_cpu<B: Backend>(
    mut sim: B,
    timeout_ns: u64,
    search: Search,
    entries: &[(u64, Vec<u8>)],
    asks: &[u64],
) -> Vec<(u64, GetResult, Option<Vec<u8>>)> {
    let n = entries.len() as u64;
    let kv = KvConfig {
        server: NodeId(0),
        structure: Structure::Hash { buckets: 4 * n + 4, search },
        item_bytes: n * (16 + 256),
        value_max: 256,
        slots_per_worker: 1,
        server_op_ns: 1_000,
    };
    let svc = KvService::setup(&mut sim, kv, |t: &mut HashTable| {
        for (k, v) in entries {
            // A key that finds no bucket is simply not in the table: the CPU lookup
            // below is the oracle either way.
            let _ = t.insert(*k, v);
        }
        Ok(())
    })
    .unwrap();
    let limit_ns = (timeout_ns + 10_000) * (asks.len() as u64 + 1) + 1_000_000;
    let per_worker = run_workers_with(
        &mut sim,
        RtConfig::default(),
        RunLimits { time_limit_ns: limit_ns },
        |w| {
            let answers: Rc<RefCell<Vec<(u64, GetResult)>>> = Rc::default();
            if w.co().me().node == NodeId(0) {
                // Start the programs; the server's CPU serves nothing.
                svc.serve(w, 0, 0);
            } else {
                let waits = hytra_rt::Waits::default();
                w.poll_with(waits.poller());
                let (svc, answers, asks) = (svc.clone(), answers.clone(), asks.to_vec());
                w.spawn(move |co| async move {
                    let mut client = svc.client(&co, &waits, 0);
                    for key in asks {
                        let r = client.get(&co, GetMode::Offload, key, timeout_ns).await;
                        answers.borrow_mut().push((key, r));
                    }
                });
            }
            answers
        },
        |_, a| a.take(),
    )
    .unwrap()
    .0;
    let answers: Vec<_> = per_worker.into_iter().flatten().collect();
    answers.into_iter().map(|(k, r)| (k, r, cpu_get(&sim, &svc, k))).collect()
}

fn table() -> impl Strategy<Value = (Vec<(u64, Vec<u8>)>, Vec<u64>)> {
    // Keys from a small range so that buckets collide and displacements happen.
    let entry = (1u64..4096, 1usize..=32, any::<u8>())
        .prop_map(|(k, words, b)| (k, (0..words * 8).map(|i| b ^ i as u8).collect()));
    (prop::collection::vec(entry, 1..40), prop::collection::vec(1u64..6000, 1..24))
}

/// Checks every answer against the CPU's; asks for every inserted key and for random
/// others (mostly absent).
fn check<B: Backend>(
    backend: B,
    timeout_ns: u64,
    entries: &[(u64, Vec<u8>)],
    extra: Vec<u64>,
    parallel: bool,
) -> Result<(), TestCaseError> {
    let search = if parallel { Search::Parallel } else { Search::Sequential };
    let mut asks: Vec<u64> = entries.iter().map(|e| e.0).collect();
    asks.extend(extra);
    let got = offloaded_vs_cpu(backend, timeout_ns, search, entries, &asks);
    check_answers(got, asks.len(), &format!("{search:?}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn offloaded_gets_match_the_cpu_lookup(
        (entries, extra) in table(),
        seed in any::<u64>(),
        parallel in any::<bool>(),
    ) {
        check(sim(seed), SIM_TIMEOUT_NS, &entries, extra, parallel)?;
    }
}

proptest! {
    // Real threads: fewer cases, each a run of its own.
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn offloaded_gets_on_the_nic_thread_match_the_cpu_lookup(
        (entries, extra) in table(),
        parallel in any::<bool>(),
    ) {
        check(local(), LOCAL_TIMEOUT_NS, &entries, extra, parallel)?;
    }
}
