//! Replica images: what another process of a cluster sends the first one at the end of a
//! run, decoded and restored onto a replica of the same table.

use hytra_fabric::{Region, Rkey};
use hytra_store::{
    Catalog, Fill, IndexLayout, Partitioner, Replica, ReplicaImage, TableId, TableSpec,
};

use crate::Target;

/// The targets of this file.
pub const TARGETS: &[Target] = &[Target {
    name: "replica-image",
    about: "a replica image, decoded and restored (ReplicaImage::decode, Replica::restore)",
    seeds,
    run,
}];

/// Records the fuzzed replica holds: small, so that pages are few and inputs short.
const CAPACITY: u64 = 48;

/// A fresh, empty replica of the one table images are restored onto.
pub(super) fn replica() -> Replica {
    let spec = TableSpec {
        id: TableId(0),
        name: "t".into(),
        payload_words: 2,
        capacity: CAPACITY,
        partitioner: Partitioner::Modulo,
        index: IndexLayout::Hashed,
        fill: Fill::Dense,
    };
    let catalog = Catalog::new(vec![spec], 1, 1).expect("a valid catalog");
    let g = catalog.geometry(TableId(0));
    Replica::new(TableId(0), 0, Rkey(0), Region::zeroed(g.region_bytes()), g)
}

/// Images of the replica holding `0`, a few and all of its records.
pub(super) fn images() -> Vec<ReplicaImage> {
    [0, 5, CAPACITY]
        .iter()
        .map(|&n| {
            let r = replica();
            for k in 0..n {
                r.load(k * 7 + 1, &[k, !k]).expect("within capacity");
            }
            r.image()
        })
        .collect()
}

fn seeds() -> Vec<Vec<u8>> {
    images()
        .iter()
        .map(|image| {
            let mut b = Vec::new();
            image.encode(&mut b);
            b
        })
        .collect()
}

fn run(input: &[u8]) {
    let mut rest = input;
    let Ok(image) = ReplicaImage::decode(&mut rest) else { return };
    let mut again = Vec::new();
    image.encode(&mut again);
    assert_eq!(again, input[..input.len() - rest.len()], "an image re-encodes to its bytes");
    restore(&image);
}

/// Restores `image` onto a fresh replica: it fits and lands whole, or is refused.
pub(super) fn restore(image: &ReplicaImage) {
    let r = replica();
    if r.restore(image).is_err() {
        return;
    }
    let bytes = r.region().len_bytes();
    for (offset, words) in &image.pages {
        assert!(offset + words.len() as u64 * 8 <= bytes, "a page restored past the region");
    }
    // What reads a restored replica's allocation counters copes with any of them.
    let _ = r.image();
}
