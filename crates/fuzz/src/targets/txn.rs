//! The transaction engine's RPC messages, and the log rings backups apply: a ring's
//! bytes arrive by one-sided WRITEs or LOG calls from coordinators, so `apply` must
//! refuse whatever is not a whole, well-formed entry (`CorruptLog`) and never panic.

use std::cell::RefCell;
use std::sync::Arc;

use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, Region, Rkey};
use hytra_store::{
    Catalog, Fill, IndexLayout, NodeStore, Partitioner, ReplicaImage, TableId, TableSpec,
};
use hytra_txn::log::{
    apply, place, put, resolve, scan, skip_word, EntryBuilder, LogLayout, LOGGED_DELETE,
};
use hytra_txn::wire::{self, CommitReq, RecordReply, RecordReq, Status};

use super::{bytes_of, words_of};
use crate::Target;

/// The targets of this file.
pub const TARGETS: &[Target] = &[
    Target {
        name: "txn-record-req",
        about: "READ, LOCK, VALIDATE and UNLOCK requests (hytra_txn::wire::RecordReq)",
        seeds: record_req_seeds,
        run: record_req_run,
    },
    Target {
        name: "txn-record-reply",
        about: "replies to READ, LOCK and VALIDATE (hytra_txn::wire::RecordReply)",
        seeds: record_reply_seeds,
        run: record_reply_run,
    },
    Target {
        name: "txn-commit-req",
        about: "COMMIT requests (hytra_txn::wire::CommitReq)",
        seeds: commit_seeds,
        run: commit_run,
    },
    Target {
        name: "txn-log-msg",
        about: "LOG requests (hytra_txn::wire::decode_log)",
        seeds: log_msg_seeds,
        run: log_msg_run,
    },
    Target {
        name: "txn-reclaim",
        about: "RECLAIM requests and eight-byte replies (decode_reclaim, decode_word)",
        seeds: reclaim_seeds,
        run: reclaim_run,
    },
    Target {
        name: "txn-log-apply",
        about: "a backup's log ring applied to its replicas (hytra_txn::log::apply)",
        seeds: apply_seeds,
        run: apply_run,
    },
];

fn record_req_seeds() -> Vec<Vec<u8>> {
    let reqs = [
        RecordReq { table: 0, flags: wire::WANT_OFFSET, epoch: 1, key: 42, owner: 0 },
        RecordReq {
            table: 3,
            flags: wire::LOCK_IT | wire::CREATE,
            epoch: 7,
            key: 1 << 40,
            owner: 77,
        },
    ];
    reqs.iter()
        .map(|r| {
            let mut b = Vec::new();
            r.encode(&mut b);
            b
        })
        .collect()
}

fn record_req_run(input: &[u8]) {
    if let Some(r) = RecordReq::decode(input) {
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(b.len(), input.len());
        assert_eq!(RecordReq::decode(&b), Some(r), "a request decodes to itself");
    }
}

fn record_reply_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (status, payload) in [(Status::Ok, &[1u64, 2, 3][..]), (Status::Locked, &[][..])] {
        let mut b = Vec::new();
        RecordReply { status, lock: 5, version: 6 << 8, offset: 4096 }.encode(&mut b);
        wire::Out(&mut b).words(payload);
        out.push(b);
    }
    out
}

fn record_reply_run(input: &[u8]) {
    let mut payload = Vec::new();
    if let Some(r) = RecordReply::decode(input, &mut payload) {
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(b.len(), RecordReply::FIXED);
        wire::Out(&mut b).words(&payload);
        let mut again = Vec::new();
        assert_eq!(RecordReply::decode(&b, &mut again), Some(r), "a reply decodes to itself");
        assert_eq!(again, payload);
    }
}

fn commit_seeds() -> Vec<Vec<u8>> {
    let c =
        CommitReq { table: 1, flags: wire::DELETE, epoch: 2, key: 9, owner: 3, version: 4 << 8 };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    c.encode(&[7, 8, 9], &mut a);
    CommitReq { flags: 0, ..c }.encode(&[], &mut b);
    vec![a, b]
}

fn commit_run(input: &[u8]) {
    let mut payload = Vec::new();
    if let Some(c) = CommitReq::decode(input, &mut payload) {
        let mut b = Vec::new();
        c.encode(&payload, &mut b);
        assert_eq!(b.len(), input.len());
        let mut again = Vec::new();
        assert_eq!(CommitReq::decode(&b, &mut again), Some(c), "a commit decodes to itself");
        assert_eq!(again, payload);
    }
}

fn log_msg_seeds() -> Vec<Vec<u8>> {
    let mut builder = EntryBuilder::default();
    builder.begin(7, 1, &[0, 1]);
    builder.record(TableId(0), 42, 3 << 8, 0, 0, &[1, 2]);
    builder.record(TableId(1), 43, 5 << 8, LOGGED_DELETE, 4096, &[3, 4, 5]);
    assert_eq!(builder.finish(), 1);
    let entry = builder.stamped(0, 9, 640).to_vec();
    let mut b = Vec::new();
    wire::encode_log(640, &entry, &mut b);
    vec![b]
}

fn log_msg_run(input: &[u8]) {
    let mut entry = Vec::new();
    if let Some(position) = wire::decode_log(input, &mut entry) {
        let mut b = Vec::new();
        wire::encode_log(position, &entry, &mut b);
        assert_eq!(b, input, "a LOG re-encodes to its bytes");
        // What the LOG handler does with it: copy it into the sender's ring.
        let layout = LogLayout { rkey: Rkey(0), ring_bytes: RING_BYTES, rings: 1 };
        let region = Region::zeroed(layout.region_bytes());
        if put(&region, &layout, 0, position, &entry).is_ok() {
            let (_, at, _) = place(position, entry.len() as u64 * 8, RING_BYTES);
            let mut back = vec![0u64; entry.len()];
            region.read_words(layout.ring_offset(0) + at, &mut back);
            assert_eq!(back, entry, "the entry landed where apply will read it");
        }
    }
}

fn reclaim_seeds() -> Vec<Vec<u8>> {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    wire::encode_reclaim(wire::SYNC, 3, 4096, &mut a);
    wire::encode_word(1 << 20, &mut b);
    vec![a, b]
}

fn reclaim_run(input: &[u8]) {
    if let Some((flags, epoch, up_to)) = wire::decode_reclaim(input) {
        let mut b = Vec::new();
        wire::encode_reclaim(flags, epoch, up_to, &mut b);
        assert_eq!(b.len(), input.len());
        assert_eq!(wire::decode_reclaim(&b), Some((flags, epoch, up_to)));
    }
    if let Some(v) = wire::decode_word(input) {
        let mut b = Vec::new();
        wire::encode_word(v, &mut b);
        assert_eq!(b, input, "a word re-encodes to its bytes");
    }
}

/// Bytes of the fuzzed ring: small, so that inputs cover all of it.
const RING_BYTES: u64 = 2048;

/// Keys loaded into each table before an input is applied, so that entries may name
/// records that exist (and carry their offsets as hints) or new ones.
const LOADED_KEYS: u64 = 8;

/// A backup node's store (node 1 of two, holding both partitions of two tables with
/// payloads of different lengths) and its log region with one ring.
struct Backup {
    store: Arc<NodeStore>,
    log: Region,
    layout: LogLayout,
}

fn tables() -> Vec<TableSpec> {
    let spec = |id, payload_words, index| TableSpec {
        id: TableId(id),
        name: format!("t{id}"),
        payload_words,
        capacity: 24,
        partitioner: Partitioner::Modulo,
        index,
        fill: Fill::Dense,
    };
    vec![spec(0, 2, IndexLayout::Hashed), spec(1, 3, IndexLayout::Sequential)]
}

impl Backup {
    fn new() -> Backup {
        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let mut backend = SimCluster::new(SimConfig::new(shape, 1)).expect("a simulated cluster");
        let catalog = Catalog::new(tables(), 2, 2).expect("a valid catalog");
        let (_, stores) = NodeStore::register(&mut backend, catalog, 0).expect("regions fit");
        let layout = LogLayout { rkey: Rkey(0), ring_bytes: RING_BYTES, rings: 1 };
        let log = Region::zeroed(layout.region_bytes());
        Backup { store: stores[1].clone(), log, layout }
    }

    /// Back to the state every execution starts from: the loaded keys, an empty ring.
    fn reset(&self) {
        for replica in self.store.replicas() {
            let zeros = vec![0u64; (replica.region().len_bytes() / 8) as usize];
            replica.region().write_words(0, &zeros);
            let empty = ReplicaImage { next_record: 0, next_overflow: 0, pages: Vec::new() };
            replica.restore(&empty).expect("an empty image fits");
            let payload = vec![1u64; replica.payload_words()];
            for k in 0..LOADED_KEYS {
                // Keys of the replica's partition: key % nodes == partition.
                let key = k * 2 + u64::from(replica.partition);
                replica.load(key, &payload).expect("a few keys fit");
            }
        }
        let zeros = vec![0u64; (self.log.len_bytes() / 8) as usize];
        self.log.write_words(0, &zeros);
    }
}

thread_local! {
    static BACKUP: RefCell<Option<Backup>> = const { RefCell::new(None) };
}

/// Stream positions the head word may hold: a backup starts its head at 0 and only
/// ever advances it by applying entries, whole words at a time, so it stays a multiple
/// of 8 and far below 2^48 (bytes of log through one ring); other heads are not states
/// a backup can be in.
const HEAD_MASK: u64 = ((1 << 48) - 1) & !7;

/// Input: the ring's head word (as the backup left it: see `HEAD_MASK`), the `up_to` word of
/// a RECLAIM, then the ring's bytes (cut or padded with zeros to the ring's size).
fn apply_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    // (head, entries): a few from 0, a ring almost full, and a ring that wraps (SKIP).
    for (head, entries) in [(0u64, 3u64), (0, 10), (RING_BYTES * 3 + RING_BYTES - 296, 4)] {
        let mut ring = vec![0u64; (RING_BYTES / 8) as usize];
        let mut tail = head;
        let mut builder = EntryBuilder::default();
        for round in 0..entries {
            builder.begin(5 + round, 1, &[0, 1]);
            for r in 0..3 {
                let table = TableId((r % 2) as u16);
                let words = if table.0 == 0 { 2 } else { 3 };
                // Keys of both partitions, some loaded already, some new.
                let key = (round * 3 + r) % 20;
                let hint = if r == 1 { 4096 } else { 0 };
                let flags = if r == 2 { LOGGED_DELETE } else { 0 };
                let payload = vec![round * 10 + r; words];
                builder.record(table, key, (round + 2) << 8, flags, hint, &payload);
            }
            for i in 0..builder.finish() {
                let len = builder.entry_words(i) as u64 * 8;
                let (skip, at, end) = place(tail, len, RING_BYTES);
                if skip.is_some() {
                    ring[(tail % RING_BYTES / 8) as usize] = skip_word(tail);
                }
                let entry = builder.stamped(i, round + 1, end - len);
                ring[(at / 8) as usize..][..entry.len()].copy_from_slice(entry);
                tail = end;
            }
        }
        let mut input = bytes_of(&[head, tail]);
        input.extend_from_slice(&bytes_of(&ring));
        seeds.push(input);
    }
    seeds
}

fn apply_run(input: &[u8]) {
    let words = words_of(input);
    let [head, up_to, ring_words @ ..] = words.as_slice() else { return };
    BACKUP.with_borrow_mut(|backup| {
        let backup = backup.get_or_insert_with(Backup::new);
        backup.reset();
        let layout = backup.layout;
        let n = ring_words.len().min((RING_BYTES / 8) as usize);
        backup.log.write_words(layout.ring_offset(0), &ring_words[..n]);
        backup.log.store(layout.head_offset(0), head & HEAD_MASK);
        let mut buf = Vec::new();
        if let Ok(applied) = apply(&backup.store, &backup.log, &layout, 0, *up_to, &mut buf) {
            assert!(applied.head >= *up_to, "apply stopped short of up_to");
        }
        // What recovery does with the rest of the ring: read it, then resolve it
        // (transactions of odd owners committed), whatever it holds.
        let found = scan(&backup.log, &layout, 0, &mut buf);
        assert!(found.windows(2).all(|w| w[0].position < w[1].position), "in ring order");
        let committed = |owner: u64| owner % 2 == 1;
        let _ = resolve(&backup.store, &backup.log, &layout, 0, 2, committed, |_| {}, &mut buf);
        // Whatever was applied left every record whole: its checksum verifies.
        for replica in backup.store.replicas() {
            let mut payload = vec![0u64; replica.payload_words()];
            for (off, key) in replica.records() {
                assert!(replica.read(off, key, &mut payload).is_ok(), "record {key} torn");
            }
        }
    });
}
