//! The recycled program that answers one client slot of an offloaded lookup in a
//! bucket array on the server's NIC. The request and the answer are laid out in
//! [`hytra_nicindex::lookup`] (re-exported here), which the transaction engine uses too;
//! [`Redn`] builds the engine's programs.

use hytra_fabric::wq::{field, Sge, WqId, Wqe, WQE_BYTES};
use hytra_fabric::{LocalAddr, NodeId, Rkey};
pub use hytra_nicindex::lookup::{
    fired, request, Answer, BuiltLookup, LookupError, LookupPrograms, ENTRIES_BYTES, REQUEST_WORDS,
};

use crate::program::{Program, ProgramError, Q};

/// How the offload searches the two candidate buckets.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub enum Search {
    /// One queue, one bucket after the other.
    Sequential,
    /// Two queues, both buckets at once.
    Parallel,
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

/// The lookup programs of the transaction engine's `offload` strategy: sequential
/// searches (the two buckets cost one fetch of the lookup queue on the NIC's fetch unit,
/// where a parallel search costs two; RedN §5.2, PERFORMANCE §14) that also copy the
/// response entries, so the engine learns which record answered.
#[derive(Copy, Clone, Debug, Default)]
pub struct Redn;

impl LookupPrograms for Redn {
    fn code_bytes(&self) -> Result<u64, LookupError> {
        let at = LocalAddr { rkey: Rkey(0), offset: 0 };
        let answer = Answer { rkey: Rkey(0), done: 0, item: 0, entries: Some(0) };
        let sample = Program::build(NodeId(0), at, u64::MAX, WqId(0), |p| {
            lookup_program(p, NodeId(0), Search::Sequential, Rkey(0), NodeId(1), answer)
        })
        .map_err(|e| LookupError(Box::new(e)))?;
        Ok(sample.code_bytes().div_ceil(64) * 64)
    }

    fn build(
        &self,
        server: NodeId,
        code: LocalAddr,
        code_bytes: u64,
        first: WqId,
        index: Rkey,
        client: NodeId,
        answer: Answer,
    ) -> Result<BuiltLookup, LookupError> {
        assert!(answer.entries.is_some(), "the engine reads which bucket answered");
        let installed = Program::build(server, code, code_bytes, first, |p| {
            lookup_program(p, server, Search::Sequential, index, client, answer)
        })
        .map_err(|e| LookupError(Box::new(e)))?;
        let trigger = installed.wq(Q(0));
        Ok(BuiltLookup {
            specs: installed.specs(),
            trigger,
            write: Box::new(move |region| installed.write(region)),
        })
    }
}
