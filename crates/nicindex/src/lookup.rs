//! The request and answer of an offloaded lookup in a bucket array ([`Buckets`]): what a
//! client sends to trigger a lookup program on the server's NIC, where the program
//! answers, and how the client reads the answer. The program itself is built by a side
//! system ([`LookupPrograms`]).
//!
//! The client sends, per candidate bucket, the CAS operands (the key word and the same
//! word with a WRITE opcode) and the bucket's offset, then a sequence number. The NIC
//! READs each bucket into a response entry (its key word becomes the entry's header, its
//! scatter/gather entry the entry's local buffer), turns the response into a WRITE of
//! that buffer if the key matches, and ends with a WRITE of the sequence number into the
//! client's completion word. Several keys may share a word (the transaction engine files
//! records under a 48-bit [`tag`](crate::hash::tag) of their key), so a client that needs
//! to know which bucket answered asks for the response entries too ([`Answer::entries`]).

use hytra_fabric::wq::{field, Sge, WqId, WqOpcode, WqSpec, WQE_BYTES};
use hytra_fabric::{LocalAddr, NodeId, Region, Rkey};

use crate::hash::{key_word, Buckets};

/// Where a lookup program answers, in one region of the client.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Answer {
    /// The client's region.
    pub rkey: Rkey,
    /// Completion word: the request's sequence number lands here after everything else.
    pub done: u64,
    /// Where the item of a matching bucket lands (both buckets' matches land here).
    pub item: u64,
    /// Where the first [`ENTRIES_BYTES`] of the two response entries land, if wanted:
    /// which of them the NIC turned into a WRITE, and of which buffer ([`fired`]).
    pub entries: Option<u64>,
}

/// Bytes of the response entries' copy: the first entry whole, then the header and
/// scatter/gather entry of the second.
pub const ENTRIES_BYTES: u64 = WQE_BYTES + 24;

/// Words a request carries.
pub const REQUEST_WORDS: usize = 7;

/// The request of a lookup of `key` (1..=2^48-1) in `b`, answered with sequence number
/// `seq`.
pub fn request(b: Buckets, key: u64, seq: u64) -> [u64; REQUEST_WORDS] {
    let [b1, b2] = b.candidate_offsets(key);
    let kw = key_word(key);
    let swap = kw | WqOpcode::Write as u64;
    [kw, swap, kw, swap, b1, b2, seq]
}

/// From a copy of the response entries ([`Answer::entries`]): per candidate bucket, the
/// buffer its response sent, if the key matched.
pub fn fired(entries: &[u64; (ENTRIES_BYTES / 8) as usize]) -> [Option<Sge>; 2] {
    let at = |w: usize| {
        let is_write = entries[w] & 0xff == WqOpcode::Write as u64;
        let (a, l) =
            (entries[w + field::LOCAL_ADDR as usize], entries[w + field::LOCAL_LEN_KEY as usize]);
        is_write.then(|| Sge::from_words(a, l))
    };
    [at(0), at((WQE_BYTES / 8) as usize)]
}

/// A lookup program built for one client slot, ready to install on its server: the work
/// queues to create there (numbered from the first one asked for), the queue a request
/// goes to, and the code to write into the code region.
pub struct BuiltLookup {
    /// The queues to create, in order.
    pub specs: Vec<WqSpec>,
    /// The queue whose RECV takes the client's request.
    pub trigger: WqId,
    /// Writes the program's code into the server's code region.
    pub write: Box<dyn FnOnce(&Region)>,
}

/// Why a side system could not build a lookup program (its own error, kept whole).
#[derive(Debug, thiserror::Error)]
#[error("lookup program: {0}")]
pub struct LookupError(pub Box<dyn std::error::Error + Send + Sync>);

/// Builds the lookup programs the transaction engine's `offload` strategy installs (one
/// per client slot, every one the same shape): the engine uses this layout, and a side
/// system that builds verb programs (`hytra-offload`) provides the programs.
pub trait LookupPrograms: Send + Sync {
    /// Bytes of one program's code, a multiple of 64.
    fn code_bytes(&self) -> Result<u64, LookupError>;

    /// Builds the program at `code` on `server` (`code_bytes` long, its queues numbered
    /// from `first`) that searches the bucket arrays of region `index` for `client` and
    /// answers at `answer`.
    #[allow(clippy::too_many_arguments)] // each names one part of the program's place
    fn build(
        &self,
        server: NodeId,
        code: LocalAddr,
        code_bytes: u64,
        first: WqId,
        index: Rkey,
        client: NodeId,
        answer: Answer,
    ) -> Result<BuiltLookup, LookupError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use hytra_fabric::wq::header;

    #[test]
    fn fired_reads_which_response_became_a_write() {
        let sge = |o: u64| Sge { addr: LocalAddr { rkey: Rkey(5), offset: o }, len: 40 };
        let mut entries = [0u64; (ENTRIES_BYTES / 8) as usize];
        let second = (WQE_BYTES / 8) as usize;
        let fill = |e: &mut [u64; 11], at: usize, op: WqOpcode, s: Sge| {
            e[at] = header(op, 0, 77);
            [e[at + 1], e[at + 2]] = s.words();
        };
        fill(&mut entries, 0, WqOpcode::Noop, sge(64));
        fill(&mut entries, second, WqOpcode::Write, sge(128));
        assert_eq!(fired(&entries), [None, Some(sge(128))]);
        fill(&mut entries, 0, WqOpcode::Write, sge(64));
        assert_eq!(fired(&entries), [Some(sge(64)), Some(sge(128))]);
        fill(&mut entries, second, WqOpcode::Noop, sge(0));
        assert_eq!(fired(&entries), [Some(sge(64)), None]);
    }

    #[test]
    fn a_request_names_both_candidates_in_the_scatter_order() {
        let b = Buckets { rkey: Rkey(1), base: 4096, count: 100 };
        let r = request(b, 42, 7);
        let kw = key_word(42);
        assert_eq!(&r[..4], &[kw, kw | 1, kw, kw | 1]);
        assert_eq!([r[4], r[5]], b.candidate_offsets(42));
        assert_eq!(r[6], 7);
    }
}
