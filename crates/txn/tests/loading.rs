//! Loading fills one copy of each partition and `finish_loading` makes the others: after
//! it every replica holds what loading each one record by record would have left, and
//! nothing can be loaded any more.

use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, NodeId, RunLimits};
use hytra_rt::{run_workers_with, RtConfig};
use hytra_store::{Catalog, Fill, IndexLayout, Partitioner, TableId, TableSpec};
use hytra_txn::{Design, Engine, TxnConfig};

const T: TableId = TableId(0);
const KEYS: u64 = 3_000;

fn engine() -> Engine {
    engine_on().1
}

fn engine_on() -> (SimCluster, Engine) {
    let shape = ClusterShape { nodes: 4, workers_per_node: 1, lanes_per_peer: 1 };
    let mut b = SimCluster::new(SimConfig::new(shape, 1)).unwrap();
    let table = TableSpec {
        id: T,
        name: "t".into(),
        payload_words: 3,
        capacity: KEYS,
        partitioner: Partitioner::Modulo,
        index: IndexLayout::Hashed,
        fill: Fill::Dense,
    };
    let cfg = TxnConfig { replication: 3, ..TxnConfig::preset(Design::DrtmH) };
    let catalog = Catalog::new(vec![table], 4, 3).unwrap();
    let e = Engine::setup(&mut b, catalog, cfg, 1).unwrap();
    (b, e)
}

/// Loads `keys` (each with a payload made from it) and asserts that, loading not
/// finished, only the primary of a partition holds them.
fn load(e: &Engine, keys: &[u64]) {
    for &k in keys {
        e.load(T, k, &[k, !k, k]).unwrap();
    }
    let held = copies(e, keys[7]);
    assert_eq!(held.len(), 3, "three copies of every partition");
    let primary = e.final_config().placement.primary(e.catalog.partition(T, keys[7]));
    for (n, found) in held {
        assert_eq!(found.is_some(), n == primary, "node {n:?} before loading finished");
    }
}

/// Asserts that every copy holds what [`load`] loaded.
fn assert_all_loaded(e: &Engine, keys: &[u64]) {
    for &k in keys {
        let held = copies(e, k);
        assert_eq!(held.len(), 3);
        for (n, found) in held {
            assert_eq!(found, Some(([k, !k, k], 0)), "key {k} on node {n:?}");
        }
    }
}

/// A few keys in order.
fn few() -> Vec<u64> {
    (0..40).collect()
}

/// A record's payload and version as one copy holds it.
type Held = Option<([u64; 3], u64)>;

/// Every node's replica of `key`'s partition that holds it: (node, payload, version).
fn copies(e: &Engine, key: u64) -> Vec<(NodeId, Held)> {
    let p = e.catalog.partition(T, key);
    let config = e.final_config();
    (0..4)
        .map(NodeId)
        .filter(|&n| config.placement.holds(n, p))
        .map(|n| {
            let r = e.node(n).store.replica(T, p);
            let found = r.lookup(key).map(|off| {
                let mut payload = [0u64; 3];
                let snap = r.read(off, key, &mut payload).unwrap();
                (payload, snap.version)
            });
            (n, found)
        })
        .collect()
}

#[test]
fn every_replica_holds_the_loaded_records_once_loading_finishes() {
    let e = engine();
    // Keys scattered over a wide range, not one dense run.
    let keys: Vec<u64> =
        (0..KEYS / 4 * 3).map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20).collect();
    load(&e, &keys);
    // A second call would copy over the copies, which panics: it must do nothing.
    e.finish_loading();
    e.finish_loading();
    assert_all_loaded(&e, &keys);
}

#[test]
#[should_panic(expected = "loaded after loading finished")]
fn nothing_is_loaded_after_loading_finished() {
    let e = engine();
    e.load(T, 1, &[1, 2, 3]).unwrap();
    e.finish_loading();
    let _ = e.load(T, 2, &[1, 2, 3]);
}

#[test]
fn workers_start_only_once_loading_finished() {
    let (mut b, e) = engine_on();
    load(&e, &few());
    // Nobody finishes loading by hand: installing the first worker does.
    let (_, _) = run_workers_with(
        &mut b,
        RtConfig::default(),
        RunLimits { time_limit_ns: 1_000_000 },
        |w| {
            let _wt = e.install(w, false);
        },
        |_, ()| (),
    )
    .unwrap();
    assert_all_loaded(&e, &few());
}

#[test]
fn warming_the_caches_finishes_loading_first() {
    let e = engine();
    load(&e, &few());
    e.warm_caches();
    assert_all_loaded(&e, &few());
}
