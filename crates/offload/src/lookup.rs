//! An offloaded lookup in a bucket array ([`Buckets`]): the recycled program that
//! answers one client slot on the server's NIC, the request that triggers it, and how
//! the client reads the answer.
//!
//! The client sends, per candidate bucket, the CAS operands (the key word and the same
//! word with a WRITE opcode) and the bucket's offset, then a sequence number. The NIC
//! READs each bucket into a response entry (its key word becomes the entry's header, its
//! scatter/gather entry the entry's local buffer), turns the response into a WRITE of
//! that buffer if the key matches, and ends with a WRITE of the sequence number into the
//! client's completion word. Several keys may share a word (the transaction engine files
//! records under a 48-bit [`tag`](crate::hash::tag) of their key), so a client that needs
//! to know which bucket answered asks for the response entries too ([`Answer::entries`]).

use hytra_fabric::wq::{field, Sge, WqOpcode, Wqe, WQE_BYTES};
use hytra_fabric::{LocalAddr, NodeId, Rkey};

use crate::hash::{key_word, Buckets};
use crate::program::{Program, ProgramError};

/// How the offload searches the two candidate buckets.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub enum Search {
    /// One queue, one bucket after the other.
    Sequential,
    /// Two queues, both buckets at once.
    Parallel,
}

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

/// Emits the recycled lookup program of one client slot, in three kinds of queue
/// (RedN §5.2, Fig. 9, with recycling):
///
/// - control `K` (recycled, holds the RECV): WAIT for the request, ENABLE the lookup
///   queue(s), the FAAs that advance K's own counts, WAIT for the lookups' CASes, ENABLE
///   the response queue, then the FAAs on the lookups' WAIT counts and K's next round;
/// - lookup `W` (or `W1` and `W2` for [`Search::Parallel`]): per bucket a READ of the
///   bucket into a response entry's header and item scatter/gather entry, a WAIT for it,
///   and a CAS that turns the response into a WRITE if the bucket holds the key;
/// - response `R` (connected to the client): the two response entries, the copy of them
///   if the answer asks for it, then a WRITE of the request's sequence number into the
///   client's completion word.
///
/// Each ENABLE comes after the verbs that rewrote what it enables completed (doorbell
/// order): the lookups after the RECV scattered the request into them, the responses
/// after the CASes. `index` is the region of the bucket arrays on `server`; the request
/// names the buckets.
pub fn lookup_program(
    p: &mut Program,
    server: NodeId,
    search: Search,
    index: Rkey,
    client: NodeId,
    answer: Answer,
) -> Result<(), ProgramError> {
    let parallel = search == Search::Parallel;
    // Two RECVs: the next request may arrive before this round re-posts its RECV.
    let k = p.queue(server, true, 2);
    let w1 = p.queue(server, true, 0);
    let w2 = if parallel { p.queue(server, true, 0) } else { w1 };
    let r = p.queue(client, true, 0);
    let item = Wqe::Write {
        local: Sge { addr: LocalAddr { rkey: answer.rkey, offset: 0 }, len: 0 },
        remote_key: answer.rkey,
        remote: answer.item,
    };
    // A READ of a bucket fills a response's header (key word, NOOP) and its local
    // scatter/gather entry (the item).
    let resp1 = p.body(r, item);
    let resp2 = p.body(r, item);
    // The request's sequence number, scattered by the RECV into the LOCAL_ADDR field of
    // a NOOP of K that only serves as storage; R's last WRITE sends it back.
    let seq_word = p.reserve(k);
    p.set(seq_word, Wqe::Noop, false, 0)?;
    let seq_at = p.field(seq_word, field::LOCAL_ADDR);
    if let Some(entries) = answer.entries {
        let from = p.field(resp1, field::HEADER);
        // One WRITE copies both: the responses are neighbours in R's ring.
        assert_eq!(p.field(resp2, field::HEADER).offset, from.offset + WQE_BYTES);
        let local = Sge { addr: from, len: ENTRIES_BYTES as u32 };
        p.push(r, Wqe::Write { local, remote_key: answer.rkey, remote: entries }, false);
    }
    p.push(
        r,
        Wqe::Write {
            local: Sge { addr: seq_at, len: 8 },
            remote_key: answer.rkey,
            remote: answer.done,
        },
        false,
    );
    let lookup = |p: &mut Program, w, resp| -> Result<_, ProgramError> {
        let dest = p.field(resp, field::HEADER);
        let read = p.push(
            w,
            Wqe::Read { local: Sge { addr: dest, len: 24 }, remote_key: index, remote: 0 },
            true,
        );
        p.wait_all(w, w);
        let cas = p.cas_header(w, resp)?;
        Ok((read, cas))
    };
    let (read1, cas1) = lookup(p, w1, resp1)?;
    let (read2, cas2) = lookup(p, w2, resp2)?;
    p.begin_round(k)?;
    let kq = p.wq(k);
    p.push(k, Wqe::Wait { target: kq, count: 1, recv: true }, false);
    p.enable_all(k, w1);
    if parallel {
        p.enable_all(k, w2);
    }
    // K's own FAAs run while the lookups do.
    p.advance_here(k)?;
    p.wait_all(k, w1);
    if parallel {
        p.wait_all(k, w2);
    }
    p.enable_all(k, r);
    p.end_round(k)?;
    let sge = |addr: LocalAddr, words: u32| Sge { addr, len: words * 8 };
    // In the order of `request`.
    p.post_recv(
        k,
        &[
            sge(p.field(cas1, field::OPERAND_A), 2),
            sge(p.field(cas2, field::OPERAND_A), 2),
            sge(p.field(read1, field::REMOTE_ADDR), 1),
            sge(p.field(read2, field::REMOTE_ADDR), 1),
            sge(seq_at, 1),
        ],
    )?;
    Ok(())
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
