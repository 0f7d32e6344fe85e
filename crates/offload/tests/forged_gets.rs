//! A two-sided get names the client's answer slot; the request comes from the network,
//! so a slot at the end of the address space must cost the server nothing but an answer
//! the fabric refuses, and the next get is served as usual.

use std::cell::RefCell;
use std::rc::Rc;

use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, NodeId, RunLimits, WorkerId};
use hytra_offload::hash::HashTable;
use hytra_offload::service::{GetMode, GetResult, KvConfig, KvService, Search, Structure, GET_RPC};
use hytra_rt::{run_workers_with, RtConfig};

#[test]
fn a_get_answering_past_the_address_space_is_dropped() {
    // A server (node 0) and a client (node 1).
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let mut sim = SimCluster::new(SimConfig::new(shape, 1)).unwrap();
    let kv = KvConfig {
        server: NodeId(0),
        structure: Structure::Hash { buckets: 16, search: Search::Sequential },
        item_bytes: 4096,
        value_max: 64,
        slots_per_worker: 1,
        server_op_ns: 1_000,
    };
    let svc = KvService::setup(&mut sim, kv, |t: &mut HashTable| {
        t.insert(7, &[3; 16]).unwrap();
        Ok(())
    })
    .unwrap();
    let end_ns = 1_000_000;
    let got = run_workers_with(
        &mut sim,
        RtConfig::default(),
        RunLimits { time_limit_ns: 10 * end_ns },
        |w| {
            let got = Rc::new(RefCell::new(Vec::new()));
            if w.co().me().node == NodeId(0) {
                svc.serve(w, 1, end_ns);
            } else {
                let waits = hytra_rt::Waits::default();
                w.poll_with(waits.poller());
                let (svc, got) = (svc.clone(), got.clone());
                w.spawn(move |co| async move {
                    // Key 7, sequence number 1, answer slot 8 bytes before 2^64, no list.
                    let forged: Vec<u8> =
                        [7u64, 1, u64::MAX - 7, 0].iter().flat_map(|w| w.to_le_bytes()).collect();
                    let server = WorkerId { node: NodeId(0), index: 0 };
                    co.send_oneway(server, GET_RPC, &forged).unwrap();
                    let mut client = svc.client(&co, &waits, 0);
                    let r = client.get(&co, GetMode::TwoSided, 7, 200_000).await;
                    got.borrow_mut().push(r);
                });
            }
            got
        },
        |_, got| got.take(),
    )
    .unwrap()
    .0;
    let answers: Vec<GetResult> = got.into_iter().flatten().collect();
    assert_eq!(answers, vec![GetResult::Found(vec![3; 16])]);
}
