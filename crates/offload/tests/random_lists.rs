//! Offloaded list gets, with and without `break`, on random lists return exactly what
//! the server CPU's traversal returns: keys at every position, lists shorter than the
//! loop (the null node's iterations), values of many lengths, absent keys, and keys of
//! another list; on the simulated cx5 NIC and on the `local` backend's NIC thread.

use std::cell::RefCell;
use std::rc::Rc;

mod common;

use common::{check_answers, local, sim, LOCAL_TIMEOUT_NS};
use hytra_fabric::{Backend, NodeId, RunLimits};
use hytra_offload::list::ListStore;
use hytra_offload::service::{cpu_get_in_list, GetMode, GetResult, KvConfig, KvService, Structure};
use hytra_rt::{run_workers_with, RtConfig};
use proptest::prelude::*;

type Lists = Vec<Vec<(u64, Vec<u8>)>>;

/// Per-get timeout on the simulator (virtual time).
const SIM_TIMEOUT_NS: u64 = 80_000;

/// Stores `lists`, gets every (list, key) of `asks` through the offload (one slot, one
/// get at a time) and returns each answer next to the CPU's traversal.
fn offloaded_vs_cpu<B: Backend>(
    mut sim: B,
    timeout_ns: u64,
    max_len: u32,
    brk: bool,
    lists: &Lists,
    asks: &[(usize, u64)],
) -> Vec<(u64, GetResult, Option<Vec<u8>>)> {
    let n: u64 = lists.iter().map(|l| l.len() as u64).sum();
    let kv = KvConfig {
        server: NodeId(0),
        structure: Structure::List { nodes: n + 1, max_len, brk },
        item_bytes: n * (16 + 256),
        value_max: 256,
        slots_per_worker: 1,
        server_op_ns: 1_000,
    };
    let mut heads = Vec::new();
    let svc = KvService::setup_list(&mut sim, kv, |s: &mut ListStore| {
        for l in lists {
            heads.push(s.push_list(l)?);
        }
        Ok(())
    })
    .unwrap();
    let limit_ns = (timeout_ns + 20_000) * (asks.len() as u64 + 1) + 1_000_000;
    let asks: Vec<(u64, u64)> = asks.iter().map(|&(l, k)| (heads[l], k)).collect();
    let per_worker = run_workers_with(
        &mut sim,
        RtConfig::default(),
        RunLimits { time_limit_ns: limit_ns },
        |w| {
            let answers: Rc<RefCell<Vec<(u64, u64, GetResult)>>> = Rc::default();
            if w.co().me().node == NodeId(0) {
                // Start the programs; the server's CPU serves nothing.
                svc.serve(w, 0, 0);
            } else {
                let waits = hytra_rt::Waits::default();
                w.poll_with(waits.poller());
                let (svc, answers, asks) = (svc.clone(), answers.clone(), asks.clone());
                w.spawn(move |co| async move {
                    let mut client = svc.client(&co, &waits, 0);
                    for (head, key) in asks {
                        let mode = GetMode::Offload;
                        let r = client.get_in_list(&co, mode, head, key, timeout_ns).await;
                        answers.borrow_mut().push((head, key, r));
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
    answers.into_iter().map(|(h, k, r)| (k, r, cpu_get_in_list(&sim, &svc, h, k))).collect()
}

/// Lists of distinct keys, 1..=`max_len` nodes each (some shorter than the loop), and
/// asks: every stored key in its own list, then random (list, key) pairs.
fn lists(max_len: usize) -> impl Strategy<Value = (Lists, Vec<(usize, u64)>)> {
    let value =
        (1usize..=32, any::<u8>()).prop_map(|(w, b)| (0..w * 8).map(|i| b ^ i as u8).collect());
    let list = prop::collection::btree_map(1u64..200, value, 1..=max_len)
        .prop_map(|m| m.into_iter().collect::<Vec<_>>())
        .prop_shuffle();
    prop::collection::vec(list, 1..4).prop_flat_map(|ls: Lists| {
        let count = ls.len();
        let extra = prop::collection::vec((0..count, 1u64..220), 0..8);
        (Just(ls), extra).prop_map(|(ls, extra)| {
            let mut asks: Vec<(usize, u64)> =
                ls.iter().enumerate().flat_map(|(i, l)| l.iter().map(move |e| (i, e.0))).collect();
            asks.extend(extra);
            (ls, asks)
        })
    })
}

/// Checks every answer against the CPU's traversal. The loop runs at least as many
/// iterations as the longest list has nodes, plus `slack`.
fn check<B: Backend>(
    backend: B,
    timeout_ns: u64,
    ls: &Lists,
    asks: &[(usize, u64)],
    brk: bool,
    slack: u32,
) -> Result<(), TestCaseError> {
    let longest = ls.iter().map(Vec::len).max().unwrap_or(1) as u32;
    let got = offloaded_vs_cpu(backend, timeout_ns, longest + slack, brk, ls, asks);
    check_answers(got, asks.len(), &format!("break {brk}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn offloaded_list_gets_match_the_cpu_traversal(
        (ls, asks) in lists(6),
        seed in any::<u64>(),
        brk in any::<bool>(),
        slack in 0u32..3,
    ) {
        check(sim(seed), SIM_TIMEOUT_NS, &ls, &asks, brk, slack)?;
    }
}

proptest! {
    // Real threads: fewer cases, each a run of its own.
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn offloaded_list_gets_on_the_nic_thread_match_the_cpu_traversal(
        (ls, asks) in lists(6),
        brk in any::<bool>(),
        slack in 0u32..3,
    ) {
        check(local(), LOCAL_TIMEOUT_NS, &ls, &asks, brk, slack)?;
    }
}

#[test]
fn a_list_longer_than_the_loop_answers_only_its_first_nodes() {
    let list: Vec<_> = (1..=6u64).map(|k| (k, vec![k as u8; 8])).collect();
    let asks: Vec<_> = (1..=6u64).map(|k| (0, k)).collect();
    for brk in [false, true] {
        let lists = vec![list.clone()];
        let on_sim = offloaded_vs_cpu(sim(3), SIM_TIMEOUT_NS, 4, brk, &lists, &asks);
        let on_threads = offloaded_vs_cpu(local(), LOCAL_TIMEOUT_NS, 4, brk, &lists, &asks);
        for (key, r, cpu) in on_sim.into_iter().chain(on_threads) {
            let want =
                if key <= 4 { GetResult::Found(vec![key as u8; 8]) } else { GetResult::Absent };
            assert_eq!(r, want, "key {key} break {brk}");
            assert_eq!(cpu.is_some(), key <= 4);
        }
    }
}
