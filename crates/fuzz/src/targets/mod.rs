//! Every fuzz target, one file per crate that owns the decoders, and the list of them.
//!
//! A target's seeds come from the real encoders (so that mutations stay near valid
//! inputs, where decoders have their bugs); its run decodes, and where the decode
//! succeeds re-encodes and compares (`decode(encode(x)) == x`) and exercises what
//! consumes the value: a restored image, an applied log ring.

mod fabric;
mod io;
mod lab;
mod offload;
mod rt;
mod store;
mod txn;
mod workloads;

use crate::Target;

/// Every target, in a fixed order.
pub fn all() -> Vec<Target> {
    [
        rt::TARGETS,
        txn::TARGETS,
        store::TARGETS,
        io::TARGETS,
        offload::TARGETS,
        fabric::TARGETS,
        workloads::TARGETS,
        lab::TARGETS,
    ]
    .concat()
}

/// The target called `name`.
pub fn find(name: &str) -> Option<Target> {
    all().into_iter().find(|t| t.name == name)
}

/// Little-endian words of `bytes`, the last one padded with zeros.
fn words_of(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// Bytes of little-endian words.
fn bytes_of(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
