//! Requests to the engine's handlers that no coordinator sends, as they could arrive from
//! the network: each is answered as malformed (or refused), and the node that receives
//! them keeps serving. Run on a two-node simulator; node 0 sends them to node 1.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, NodeId, RunLimits, WorkerId};
use hytra_rt::{run_workers_with, RpcType, RtConfig};
use hytra_store::layout::KEY_MAX;
use hytra_store::{Catalog, Fill, IndexLayout, Partitioner, TableId, TableSpec};
use hytra_txn::wire::{self, CommitReq, RecordReply, RecordReq, Status};
use hytra_txn::{Design, Engine, TxnConfig};

const T: TableId = TableId(0);

/// What node 1 answers to each request: the reply's bytes.
fn answers(requests: Vec<(RpcType, Vec<u8>)>) -> Vec<Vec<u8>> {
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let mut b = SimCluster::new(SimConfig::new(shape, 1)).unwrap();
    let table = TableSpec {
        id: T,
        name: "t".into(),
        payload_words: 2,
        capacity: 64,
        partitioner: Partitioner::Modulo,
        index: IndexLayout::Hashed,
        fill: Fill::Dense,
    };
    let cfg = TxnConfig { replication: 2, ..TxnConfig::preset(Design::DrtmH) };
    let catalog = Catalog::new(vec![table], 2, 2).unwrap();
    let engine = Engine::setup(&mut b, catalog, cfg, 1).unwrap();
    for key in 0..16u64 {
        engine.load(T, key, &[key, key]).unwrap();
    }
    engine.finish_loading();
    let requests = Arc::new(requests);
    let (results, stats) = run_workers_with(
        &mut b,
        RtConfig::default(),
        RunLimits { time_limit_ns: 50_000_000 },
        |w| {
            let _wt = engine.install(w, false);
            let out = Rc::new(RefCell::new(Vec::new()));
            if w.co().me().node.0 == 0 {
                let (o, requests) = (out.clone(), requests.clone());
                w.spawn(move |co| async move {
                    let dest = WorkerId { node: NodeId(1), index: 0 };
                    for (ty, bytes) in requests.iter() {
                        let t = co.call(dest, *ty, bytes).unwrap();
                        let reply = co.reply(t, |r| r.to_vec()).await.unwrap();
                        o.borrow_mut().push(reply);
                    }
                });
            }
            out
        },
        |_, out| out.take(),
    )
    .unwrap();
    assert!(stats.all_done, "the run did not finish");
    results.into_iter().next().unwrap()
}

fn word(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// A COMMIT of a key that was never inserted, or with a payload of another length than
/// the table's, is answered 0; the handler used to `expect` the record and assert the
/// length, so a forged COMMIT stopped the node.
#[test]
fn a_forged_commit_is_refused() {
    let commit = |key, payload: &[u64]| {
        let mut b = Vec::new();
        let epoch = hytra_txn::membership::EPOCH_FIRST as u32;
        CommitReq { table: 0, flags: 0, epoch, key, owner: 5, version: 1 << 8 }
            .encode(payload, &mut b);
        (wire::COMMIT, b)
    };
    let got = answers(vec![commit(41, &[1, 1]), commit(3, &[1]), commit(3, &[1, 1, 1])]);
    assert_eq!(got, vec![word(0), word(0), word(0)]);
}

/// Record requests naming a table the catalog lacks or a reserved key are refused, and
/// a LOG that no coordinator could have placed is answered as malformed.
#[test]
fn forged_record_and_log_requests_are_refused() {
    let record = |ty, table, key| {
        let mut b = Vec::new();
        let epoch = hytra_txn::membership::EPOCH_FIRST as u32;
        RecordReq { table, flags: wire::WANT_OFFSET, epoch, key, owner: 5 }.encode(&mut b);
        (ty, b)
    };
    // Off a word, and so near the end of the stream that the entry wraps: placing it
    // stored a SKIP word at an unaligned offset (the region asserts alignment).
    let mut log = Vec::new();
    wire::encode_log(u64::MAX - 3, &[1, 2, 3, 4], &mut log);
    let got = answers(vec![
        record(wire::READ, 9, 3),
        record(wire::VALIDATE, 0, KEY_MAX + 2),
        (wire::LOG, log),
    ]);
    let status = |b: &[u8]| RecordReply::decode(b, &mut Vec::new()).map(|r| r.status);
    assert_eq!(status(&got[0]), Some(Status::Refused));
    assert_eq!(status(&got[1]), Some(Status::Refused));
    assert_eq!(got[2], word(wire::MALFORMED), "never a ring head, which would acknowledge it");
}
