//! The offloaded get service's requests (decoded by the server CPU) and the answers of
//! an offloaded lookup (read by the client from what the server's NIC wrote).

use hytra_offload::lookup::{fired, ENTRIES_BYTES};
use hytra_offload::service::decode_words;

use super::{bytes_of, words_of};
use crate::Target;

/// The targets of this file.
pub const TARGETS: &[Target] = &[
    Target {
        name: "offload-words",
        about: "a get or put request to the server CPU (hytra_offload::service::decode_words)",
        seeds: words_seeds,
        run: words_run,
    },
    Target {
        name: "offload-answer",
        about: "the response entries of an offloaded lookup (hytra_offload::lookup::fired)",
        seeds: answer_seeds,
        run: answer_run,
    },
];

fn words_seeds() -> Vec<Vec<u8>> {
    let mut put = bytes_of(&[42]);
    put.extend_from_slice(&[9; 24]);
    vec![bytes_of(&[42, 7, 4096, 0]), bytes_of(&[u64::MAX, 1, 0, 64]), put]
}

fn words_run(input: &[u8]) {
    if let Some(req) = decode_words::<4>(input) {
        assert_eq!(bytes_of(&req), input, "a get request re-encodes to its bytes");
    }
    // A put: the key word, then the value (as the put handler splits it).
    if let Some([key]) = decode_words::<1>(&input[..input.len().min(8)]) {
        assert_eq!(bytes_of(&[key]), input[..8]);
        assert_eq!(input[8..].len(), input.len() - 8);
    }
}

const ENTRY_WORDS: usize = (ENTRIES_BYTES / 8) as usize;

fn answer_seeds() -> Vec<Vec<u8>> {
    use hytra_fabric::wq::{Sge, Wqe};
    use hytra_fabric::{LocalAddr, Rkey};
    let item = Sge { addr: LocalAddr { rkey: Rkey(4), offset: 8192 }, len: 48 };
    let write = Wqe::Write { local: item, remote_key: Rkey(1), remote: 64 }.encode(0, 3);
    let enable = Wqe::Enable { target: hytra_fabric::wq::WqId(2), count: 5 }.encode(0, 4);
    let answer = |first: [u64; 8], second: [u64; 8]| {
        let mut w = first.to_vec();
        w.extend_from_slice(&second[..ENTRY_WORDS - 8]);
        bytes_of(&w)
    };
    vec![answer(write, enable), answer(enable, write), answer(enable, enable)]
}

fn answer_run(input: &[u8]) {
    let mut entries = [0u64; ENTRY_WORDS];
    for (dst, src) in entries.iter_mut().zip(words_of(input)) {
        *dst = src;
    }
    for (k, sge) in fired(&entries).into_iter().enumerate() {
        if let Some(sge) = sge {
            let at = k * 8;
            assert_eq!(entries[at] & 0xff, hytra_fabric::wq::WqOpcode::Write as u64);
            assert_eq!(sge.words(), [entries[at + 1], entries[at + 2]]);
        }
    }
}
