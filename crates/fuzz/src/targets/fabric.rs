//! Work queue entries as a NIC fetches them from registered memory (which a program's
//! own verbs, or a peer's message scattered by a RECV, may have rewritten).

use hytra_fabric::wq::{Wqe, WQE_BYTES};

use super::{bytes_of, words_of};
use crate::Target;

/// The targets of this file.
pub const TARGETS: &[Target] = &[Target {
    name: "wqe",
    about: "a work queue entry (hytra_fabric::wq::Wqe::decode)",
    seeds,
    run,
}];

fn seeds() -> Vec<Vec<u8>> {
    use hytra_fabric::wq::{Sge, WqId};
    use hytra_fabric::{LocalAddr, Rkey};
    let local = Sge { addr: LocalAddr { rkey: Rkey(2), offset: 4096 }, len: 64 };
    let atomic = Sge { len: 8, ..local };
    let entries = [
        Wqe::Noop,
        Wqe::Write { local, remote_key: Rkey(1), remote: 128 },
        Wqe::Read { local, remote_key: Rkey(3), remote: 0 },
        Wqe::Cas { local: atomic, remote_key: Rkey(1), remote: 8, compare: 5, swap: 6 },
        Wqe::Faa { local: Sge { len: 0, ..local }, remote_key: Rkey(1), remote: 16, add: 1 },
        Wqe::Wait { target: WqId(3), count: 10, recv: true },
        Wqe::Enable { target: WqId(1), count: 1 << 40 },
    ];
    entries.iter().enumerate().map(|(i, e)| bytes_of(&e.encode(i as u8, 77 + i as u64))).collect()
}

fn run(input: &[u8]) {
    let mut w = [0u64; (WQE_BYTES / 8) as usize];
    for (dst, src) in w.iter_mut().zip(words_of(input)) {
        *dst = src;
    }
    if let Ok((wqe, flags)) = Wqe::decode(&w) {
        let again = wqe.encode(flags, w[0] >> 16);
        assert_eq!(Wqe::decode(&again), Ok((wqe, flags)), "an entry decodes to itself");
    }
}
