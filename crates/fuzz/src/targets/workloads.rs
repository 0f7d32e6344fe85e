//! The results one process of a multi-process cluster sends the first: counters, the
//! history and workload reports (JSON), then replica images (binary).

use hytra_rt::WorkerStats;
use hytra_txn::TxnStats;
use hytra_workloads::bench::{Part, PlacedImage};

use crate::Target;

/// The targets of this file.
pub const TARGETS: &[Target] = &[Target {
    name: "results-part",
    about: "a process's results and replica images (hytra_workloads::bench::Part::decode)",
    seeds,
    run,
}];

/// The workload report type of the fuzzed parts.
type Report = Vec<u64>;

fn part(reports: Vec<(usize, Report)>, history: Vec<hytra_check::TxnRecord>) -> Part<Report> {
    Part {
        stats: TxnStats::default(),
        rt: WorkerStats::default(),
        history,
        reports,
        attempts_total: 41,
        leaked: 0,
        all_done: true,
        elapsed_ns: 5_000_000,
        wall_ns: 6,
        datagrams_dropped: 2,
        event_sleeps: 3,
        event_wakeups: 1,
    }
}

fn seeds() -> Vec<Vec<u8>> {
    use hytra_check::{Access, Key, TxnRecord};
    let access = |key, version| Access { key: Key { table: 1, key }, version, digest: key ^ 7 };
    let history = vec![
        TxnRecord { id: 1, reads: vec![access(3, 0)], writes: vec![access(3, 1)] },
        TxnRecord { id: 2, reads: vec![access(3, 1), access(4, 0)], writes: vec![access(4, 1)] },
    ];
    let placed = |node, partition, image| PlacedImage { node, table: 0, partition, image };
    let images = super::store::images();
    vec![
        part(vec![(0, vec![1, 2])], Vec::new()).encode(std::iter::empty()),
        part(vec![(2, vec![]), (3, vec![9])], history)
            .encode(images.iter().enumerate().map(|(i, im)| placed(1, i as u16, im.clone()))),
    ]
}

fn run(input: &[u8]) {
    let Ok((p, images)) = Part::<Report>::decode(input) else { return };
    // The JSON may be spelled differently (spaces, field order), so compare encodings:
    // the encoding of the decoded part decodes to a part that encodes the same.
    let bytes = p.encode(images.iter().cloned());
    let (back, back_images) = Part::<Report>::decode(&bytes).expect("an encoded part decodes");
    assert_eq!(back.encode(back_images.iter().cloned()), bytes, "a part decodes to itself");
    assert_eq!(back_images, images);
    // What the first process does with it: check the history, restore the images.
    let mut history = hytra_check::History::new();
    history.txns = p.history;
    let _ = hytra_check::check(&history);
    for image in &images {
        super::store::restore(&image.image);
    }
}
