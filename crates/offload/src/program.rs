//! A builder for verb programs.
//!
//! A [`Program`] owns a code area in a registered region of one node and a set of work
//! queues whose rings it lays out there. Entries are appended per queue; their indices
//! are absolute (they keep growing across rounds), which is what WAIT and ENABLE counts
//! refer to. Constructs:
//!
//! - [`Program::if_eq`]: a CAS on the header of a managed entry whose id field holds `x`
//!   turns it from NOOP into its real opcode when `x == y`; a WAIT for the CAS and an
//!   ENABLE make sure the NIC fetches the entry only after that (doorbell order). A
//!   managed queue fetches everything it is allowed to run at once, so an entry that a
//!   verb rewrites must not be enabled before that verb completes.
//! - unrolled loops: the caller emits iterations (each entry is data-independent of how
//!   many came before); [`Program::brk`] turns the ENABLE that lets the next iteration run
//!   into a NOOP when `x == y`, so the queue stops where it is.
//! - recycled rounds: [`Program::begin_round`] / [`Program::end_round`] make a managed
//!   queue run the same entries forever, together with the queues it ENABLEs: each ring
//!   holds exactly one round, FAAs add each round's growth to every WAIT and ENABLE count
//!   of those queues and re-post the RECVs, and the queue ENABLEs its own next round
//!   (RedN §3.4, "WQ recycling"). The FAAs rewrite entries the NIC has already fetched
//!   for this round, so they take effect at the next round's fetch.
//! - run queues: [`Program::begin_run`] / [`Program::end_run`] make a managed queue whose
//!   ring holds one loop iteration advance its own counts (and those of the ENABLEs that
//!   start it) each time it runs, so that a `break` may skip it in some rounds.
//!
//! [`Program::check`] refuses programs the NIC would run wrongly (see
//! [`ProgramError`]) before anything is written.

use hytra_fabric::wq::{
    entry_field, field, header, recv_header, Sge, WqId, WqOpcode, WqSpec, Wqe, ID_MAX,
    RECV_SGE_MAX, RECV_WQE_BYTES, WQE_BYTES, WQE_SIGNALED,
};
use hytra_fabric::{LocalAddr, NodeId, Region};
use thiserror::Error;

/// Entries one queue of a program may hold (a bound on what one client's offload may
/// make the NIC do per round).
pub const ENTRIES_MAX: usize = 4096;

/// Why a program was refused.
#[derive(Clone, PartialEq, Eq, Debug, Error)]
pub enum ProgramError {
    /// An operand that shares a word with an opcode exceeds 48 bits.
    #[error("operand {0:#x} exceeds 48 bits")]
    OperandTooLarge(u64),
    /// A queue holds more entries than [`ENTRIES_MAX`].
    #[error("queue {0} holds {1} entries (at most {ENTRIES_MAX})")]
    TooManyEntries(usize, usize),
    /// An `if` body, ENABLE target or `break` target is not on a managed queue, so the
    /// NIC could have prefetched it before it was rewritten.
    #[error("entry {0:?} is rewritten at run time but its queue is not managed")]
    NotManaged(Wr),
    /// An entry was reserved but never set.
    #[error("entry {0:?} was reserved but never written")]
    Unset(Wr),
    /// A WAIT can never be satisfied: it waits for more completions than the program
    /// produces.
    #[error("entry {0:?} waits for {1} completions of a queue that produces {2}")]
    WaitNeverSatisfied(Wr, u64, u64),
    /// A RECV names more scatter entries than the NIC allows.
    #[error("a RECV with {0} scatter entries (at most {RECV_SGE_MAX})")]
    TooManyScatters(usize),
    /// A round was begun and not ended, or ended twice.
    #[error("queue {0}: {1}")]
    Round(usize, &'static str),
    /// The program does not fit its code area.
    #[error("program needs {0} bytes of code area, has {1}")]
    CodeAreaTooSmall(u64, u64),
    /// A ring was sized for a different number of entries (see [`Program::build`]).
    #[error("queue {0}: ring of {1} slots for {2} entries")]
    RingSize(usize, u32, usize),
}

/// A queue of a program.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Q(pub usize);

/// An entry of a program: its queue and absolute index.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Wr {
    /// Queue.
    pub q: Q,
    /// Absolute index in the queue.
    pub index: u64,
}

#[derive(Clone, Debug)]
struct Draft {
    wq: WqId,
    peer: NodeId,
    managed: bool,
    entries: Vec<Option<[u64; 8]>>,
    signaled: u64,
    recvs: Vec<Vec<Sge>>,
    /// Ring, receive ring and doorbell record offsets in the code area.
    ring: u64,
    recv_ring: u64,
    dbr: u64,
    recv_slots: u32,
    slots: u32,
    round: RoundState,
    /// Slots reserved by [`Program::advance_here`]: first index and count.
    advance: Option<(u64, usize)>,
    /// A run queue ([`Program::begin_run`]): it advances its own counts.
    run: bool,
}

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum RoundState {
    None,
    Open,
    Closed,
}

/// A verb program under construction (see the module documentation).
#[derive(Clone, Debug)]
pub struct Program {
    node: NodeId,
    code: LocalAddr,
    first_wq: u32,
    queues: Vec<Draft>,
    /// Ring sizes measured by the previous pass of [`Program::build`].
    sizes: Option<Vec<u32>>,
    /// Per queue, the FAAs its round advances its own counts with, as the previous pass
    /// of [`Program::build`] counted them (for [`Program::advance_here`]).
    own_faas: Option<Vec<usize>>,
    /// What this pass counted for `own_faas`.
    own_faas_seen: Vec<usize>,
    /// Bytes of the code area handed out so far.
    used: u64,
}

impl Program {
    /// A program on `node` whose rings live in `code_len` bytes at `code`; its queues will
    /// be created in order and get ids from `first_wq` on.
    fn new(node: NodeId, code: LocalAddr, first_wq: WqId) -> Program {
        Program {
            node,
            code,
            first_wq: first_wq.0,
            queues: Vec::new(),
            sizes: None,
            own_faas: None,
            own_faas_seen: Vec::new(),
            used: 0,
        }
    }

    /// Builds a program on `node` whose rings live in `code_len` bytes at `code`; its
    /// queues will be created in order with ids from `first_wq` on. `emit` runs a few
    /// times (it must be deterministic): until each queue's entry count (and the slots
    /// [`Program::advance_here`] reserves) come out as the pass before assumed, so that
    /// a recycled round fills its ring exactly.
    pub fn build(
        node: NodeId,
        code: LocalAddr,
        code_len: u64,
        first_wq: WqId,
        emit: impl Fn(&mut Program) -> Result<(), ProgramError>,
    ) -> Result<Installed, ProgramError> {
        let mut sizes = None;
        let mut own_faas = None;
        let mut passes = 0;
        let p = loop {
            let mut p = Program::new(node, code, first_wq);
            p.sizes = sizes.clone();
            p.own_faas = own_faas.clone();
            emit(&mut p)?;
            let seen: Vec<u32> = p.queues.iter().map(|d| d.entries.len().max(1) as u32).collect();
            let mut faas = p.own_faas_seen.clone();
            faas.resize(p.queues.len(), 0);
            if sizes.as_ref() == Some(&seen) && own_faas.as_ref() == Some(&faas) {
                break p;
            }
            passes += 1;
            // Each pass fixes what the one before measured; the counts depend on nothing
            // else, so this settles in three passes.
            assert!(passes < 8, "program layout does not settle (emit is not deterministic)");
            sizes = Some(seen);
            own_faas = Some(faas);
        };
        if p.used > code_len {
            return Err(ProgramError::CodeAreaTooSmall(p.used, code_len));
        }
        p.finish()
    }

    /// Declares a queue. `peer` is the node its data verbs target (this node for a
    /// loopback queue); `recv_slots` RECVs may be posted ahead on it.
    pub fn queue(&mut self, peer: NodeId, managed: bool, recv_slots: u32) -> Q {
        let q = self.queues.len();
        let slots = match &self.sizes {
            Some(s) => s[q],
            None => ENTRIES_MAX as u32,
        };
        let dbr = self.used;
        // Doorbell record (two words), then a spare word (see `word_before`), then the ring.
        let ring = dbr + 24;
        let recv_ring = ring + u64::from(slots) * WQE_BYTES;
        self.used = recv_ring + u64::from(recv_slots) * RECV_WQE_BYTES;
        self.queues.push(Draft {
            wq: WqId(self.first_wq + q as u32),
            peer,
            managed,
            entries: Vec::new(),
            signaled: 0,
            recvs: Vec::new(),
            ring,
            recv_ring,
            dbr,
            recv_slots,
            slots,
            round: RoundState::None,
            run: false,
            advance: None,
        });
        Q(q)
    }

    /// The fabric id the queue will have.
    pub fn wq(&self, q: Q) -> WqId {
        self.queues[q.0].wq
    }

    /// Reserves the next entry of `q`, to be written later with [`Program::set`].
    pub fn reserve(&mut self, q: Q) -> Wr {
        let d = &mut self.queues[q.0];
        d.entries.push(None);
        Wr { q, index: d.entries.len() as u64 - 1 }
    }

    /// Writes a reserved entry. `id` must fit 48 bits.
    pub fn set(&mut self, wr: Wr, wqe: Wqe, signaled: bool, id: u64) -> Result<(), ProgramError> {
        if id > ID_MAX {
            return Err(ProgramError::OperandTooLarge(id));
        }
        let d = &mut self.queues[wr.q.0];
        assert!(d.entries[wr.index as usize].is_none(), "entry {wr:?} set twice");
        let flags = if signaled { WQE_SIGNALED } else { 0 };
        d.entries[wr.index as usize] = Some(wqe.encode(flags, id));
        d.signaled += u64::from(signaled);
        Ok(())
    }

    /// Appends an entry.
    pub fn push(&mut self, q: Q, wqe: Wqe, signaled: bool) -> Wr {
        let wr = self.reserve(q);
        self.set(wr, wqe, signaled, 0).expect("id 0 fits");
        wr
    }

    /// Changes word `word` (not the header) of an entry already emitted: for an operand
    /// known only after later entries exist (an ENABLE count, the address of a later
    /// entry's field).
    pub fn patch(&mut self, wr: Wr, word: u64, value: u64) {
        assert!(word != field::HEADER && word < 8, "patch changes operands, not headers");
        let e = self.queues[wr.q.0].entries[wr.index as usize].as_mut();
        e.expect("patch an entry that was emitted")[word as usize] = value;
    }

    /// Appends the body of an `if`: `then`'s fields under a NOOP header (unsignaled, id
    /// 0) on managed queue `q`, for [`Program::if_eq`] (or a READ that fills the header)
    /// to turn into `then`.
    pub fn body(&mut self, q: Q, then: Wqe) -> Wr {
        let wr = self.reserve(q);
        let mut e = then.encode(0, 0);
        e[field::HEADER as usize] = header(WqOpcode::Noop, 0, 0);
        self.queues[q.0].entries[wr.index as usize] = Some(e);
        wr
    }

    /// Appends a CAS on `target`'s header with operands a RECV will fill (see
    /// [`Program::field`] of the returned entry's `OPERAND_A`/`OPERAND_B`).
    pub fn cas_header(&mut self, ctl: Q, target: Wr) -> Result<Wr, ProgramError> {
        if !self.queues[target.q.0].managed {
            return Err(ProgramError::NotManaged(target));
        }
        Ok(self.cas_on(ctl, target, 0, 0))
    }

    /// Signaled entries of `q` so far: a WAIT for this count waits for all of them.
    pub fn completions(&self, q: Q) -> u64 {
        self.queues[q.0].signaled
    }

    /// Entries of `q` so far: an ENABLE for this count lets all of them run.
    pub fn len(&self, q: Q) -> u64 {
        self.queues[q.0].entries.len() as u64
    }

    /// Appends a WAIT for all completions of `target` emitted so far.
    pub fn wait_all(&mut self, on: Q, target: Q) -> Wr {
        let count = self.completions(target);
        let wq = self.wq(target);
        self.push(on, Wqe::Wait { target: wq, count, recv: false }, false)
    }

    /// Appends an ENABLE that lets `target` run every entry emitted so far.
    pub fn enable_all(&mut self, on: Q, target: Q) -> Wr {
        let count = self.len(target);
        let wq = self.wq(target);
        self.push(on, Wqe::Enable { target: wq, count }, false)
    }

    /// Address of word `word` of entry `wr`.
    pub fn field(&self, wr: Wr, word: u64) -> LocalAddr {
        let d = &self.queues[wr.q.0];
        let ring = LocalAddr { rkey: self.code.rkey, offset: self.code.offset + d.ring };
        entry_field(ring, self.slots(wr.q), wr.index, word)
    }

    /// Address of the word just before entry `wr`'s header: the [`field::SPARE`] word of
    /// the slot before it, or the spare word in front of the ring for slot 0. A READ of
    /// `n + 1` words into this address fills the entry's first `n` words and leaves the
    /// leading word where no opcode reads it.
    pub fn word_before(&self, wr: Wr) -> LocalAddr {
        let slots = u64::from(self.slots(wr.q));
        if wr.index % slots == 0 {
            let ring = self.code.offset + self.queues[wr.q.0].ring;
            LocalAddr { rkey: self.code.rkey, offset: ring - 8 }
        } else {
            self.field(Wr { q: wr.q, index: wr.index - 1 }, field::SPARE)
        }
    }

    fn slots(&self, q: Q) -> u32 {
        self.queues[q.0].slots
    }

    /// `if (x == y) then body`: `body` (a reserved-and-set NOOP on a managed queue whose
    /// id field will hold `x` when this runs) becomes `then`. Appends the CAS, a WAIT for
    /// it and an ENABLE of the body's queue up to the body on `ctl`.
    ///
    /// The body's other fields must already hold `then`'s operands. With
    /// `body_signaled`, the body completes only if taken (so the program's completion
    /// counts, which WAITs rely on, do not include it).
    pub fn if_eq(
        &mut self,
        ctl: Q,
        body: Wr,
        y: u64,
        then: WqOpcode,
        body_signaled: bool,
    ) -> Result<(), ProgramError> {
        let flags = if body_signaled { WQE_SIGNALED } else { 0 };
        let (cmp, swap) = self.cas_operands(body, y, (WqOpcode::Noop, 0), (then, flags))?;
        self.cas_on(ctl, body, cmp, swap);
        self.wait_all(ctl, ctl);
        let wq = self.wq(body.q);
        self.push(ctl, Wqe::Enable { target: wq, count: body.index + 1 }, false);
        Ok(())
    }

    /// `break` out of an unrolled loop when `x == y`: `gate` is the (unsignaled) ENABLE
    /// that lets the next iteration run, on a managed queue, with `x` in its id field; the
    /// CAS turns it into a NOOP so the loop's queue runs out of enabled entries and stops.
    /// The gate's queue must be ENABLEd up to the gate only after this CAS completes (a
    /// WAIT, then the ENABLE), or the NIC runs the gate it fetched before.
    pub fn brk(&mut self, ctl: Q, gate: Wr, y: u64) -> Result<(), ProgramError> {
        let (cmp, swap) = self.cas_operands(gate, y, (WqOpcode::Enable, 0), (WqOpcode::Noop, 0))?;
        self.cas_on(ctl, gate, cmp, swap);
        Ok(())
    }

    fn cas_operands(
        &self,
        target: Wr,
        y: u64,
        (from, from_flags): (WqOpcode, u8),
        (to, to_flags): (WqOpcode, u8),
    ) -> Result<(u64, u64), ProgramError> {
        if y > ID_MAX {
            return Err(ProgramError::OperandTooLarge(y));
        }
        if !self.queues[target.q.0].managed {
            return Err(ProgramError::NotManaged(target));
        }
        Ok((header(from, from_flags, y), header(to, to_flags, y)))
    }

    fn cas_on(&mut self, ctl: Q, target: Wr, compare: u64, swap: u64) -> Wr {
        let at = self.field(target, field::HEADER);
        let none = Sge { addr: at, len: 0 };
        let peer_is_self = self.queues[ctl.0].peer == self.node;
        assert!(peer_is_self, "a CAS on this node's code runs on a loopback queue");
        self.push(
            ctl,
            Wqe::Cas { local: none, remote_key: at.rkey, remote: at.offset, compare, swap },
            true,
        )
    }

    /// Posts a RECV on `q` that scatters an incoming message over `sges` in order.
    pub fn post_recv(&mut self, q: Q, sges: &[Sge]) -> Result<(), ProgramError> {
        if sges.len() > RECV_SGE_MAX {
            return Err(ProgramError::TooManyScatters(sges.len()));
        }
        self.queues[q.0].recvs.push(sges.to_vec());
        Ok(())
    }

    /// Starts a recycled round on managed queue `q`. Every entry of `q`, also those
    /// appended before this call, runs once per round.
    pub fn begin_round(&mut self, q: Q) -> Result<(), ProgramError> {
        let d = &self.queues[q.0];
        if d.round != RoundState::None || !d.managed {
            return Err(ProgramError::Round(q.0, "a round needs a managed queue not yet in one"));
        }
        self.queues[q.0].round = RoundState::Open;
        Ok(())
    }

    /// Reserves, at this point of `q`'s round, the FAAs that advance `q`'s own WAIT and
    /// ENABLE counts (and re-post its RECV) for the next round; [`Program::end_round`]
    /// fills them. They may run any time in the round (the NIC fetched this round's
    /// entries before they change), so placing them before the round's slow part keeps
    /// them off its critical path. Without this call they go at the round's end.
    pub fn advance_here(&mut self, q: Q) -> Result<(), ProgramError> {
        if self.queues[q.0].round != RoundState::Open {
            return Err(ProgramError::Round(q.0, "advance_here outside a round"));
        }
        let n = self.own_faas.as_ref().map_or(0, |v| v.get(q.0).copied().unwrap_or(0));
        let start = self.len(q);
        for _ in 0..n {
            self.reserve(q);
        }
        // The FAAs are signaled: WAITs for all of `q`'s completions emitted from here on
        // cover them.
        let d = &mut self.queues[q.0];
        d.signaled += n as u64;
        d.advance = Some((start, n));
        Ok(())
    }

    /// Ends the round of `q`. The round's members are `q` and every queue it ENABLEs;
    /// their rings must hold all their entries by now, and `q` must already WAIT for
    /// every member whose WAIT or ENABLE counts it advances (so that member has fetched
    /// this round's entries before they change). Appends FAAs that add one round's
    /// growth to every WAIT and ENABLE count of the members (and re-post `q`'s RECV),
    /// then a WAIT for all of `q`'s completions and the ENABLE of `q`'s next round. Each
    /// round consumes one RECV of every queue whose RECVs a member waits on.
    #[allow(
        clippy::too_many_lines,
        reason = "longer than the limit before the limit was set; split it when it next changes"
    )]
    pub fn end_round(&mut self, q: Q) -> Result<(), ProgramError> {
        if self.queues[q.0].round != RoundState::Open {
            return Err(ProgramError::Round(q.0, "end_round without begin_round"));
        }
        let control_of = |p: &Program, m: Q| p.control_entries(m);
        let own = control_of(self, q);
        let mut members = vec![q];
        let mut waited = Vec::new();
        for (_, w) in &own {
            match *w {
                Wqe::Enable { target, .. } => {
                    let t = self.queue_of(target).expect("targets are queues of the program");
                    if !members.contains(&t) {
                        members.push(t);
                    }
                }
                Wqe::Wait { target, recv: false, .. } => {
                    waited.push(self.queue_of(target).expect("targets are queues of the program"))
                }
                _ => {}
            }
        }
        let mut theirs = Vec::new();
        for &m in &members[1..] {
            if self.queues[m.0].run {
                return Err(ProgramError::Round(q.0, "a run queue is no round's member"));
            }
            let c = control_of(self, m);
            if !c.is_empty() && !waited.contains(&m) {
                return Err(ProgramError::Round(
                    q.0,
                    "a member's counts change before the round waited for it",
                ));
            }
            theirs.extend(c);
        }
        // FAAs: one per control entry, one for the RECV doorbell, two for the closing
        // WAIT and ENABLE; all signaled, so the closing WAIT covers them. The ones on
        // `q`'s own entries go into the slots `advance_here` reserved if they fit.
        let recvs = u64::from(self.queues[q.0].recv_slots > 0);
        let own_faas = own.len() + recvs as usize + 2;
        if self.own_faas_seen.len() <= q.0 {
            self.own_faas_seen.resize(q.0 + 1, 0);
        }
        self.own_faas_seen[q.0] = own_faas;
        let early = self.queues[q.0].advance.filter(|&(_, n)| n == own_faas);
        let tail = theirs.len() as u64 + if early.is_some() { 0 } else { own_faas as u64 };
        let unreserved = if early.is_some() { 0 } else { own_faas };
        let final_sig = self.completions(q) + (theirs.len() + unreserved) as u64;
        let final_len = self.len(q) + tail + 2;
        let growth = |p: &Program, w: Wqe| -> u64 {
            match w {
                Wqe::Wait { recv: true, .. } => 1,
                Wqe::Wait { target, .. } => match p.queue_of(target) {
                    Some(t) if t == q => final_sig,
                    Some(t) => p.completions(t),
                    None => 0,
                },
                Wqe::Enable { target, .. } => match p.queue_of(target) {
                    Some(t) if t == q => final_len,
                    Some(t) => p.len(t),
                    None => 0,
                },
                _ => unreachable!("control entries only"),
            }
        };
        let wait_at = Wr { q, index: self.len(q) + tail };
        let enable_at = Wr { q, index: self.len(q) + tail + 1 };
        let mut own_adds = Vec::with_capacity(own_faas);
        for (wr, w) in own {
            own_adds.push((self.field(wr, field::OPERAND_A), growth(self, w)));
        }
        if recvs > 0 {
            let d = &self.queues[q.0];
            let dbr = LocalAddr { rkey: self.code.rkey, offset: self.code.offset + d.dbr + 8 };
            own_adds.push((dbr, 1));
        }
        own_adds.push((self.field(wait_at, field::OPERAND_A), final_sig));
        own_adds.push((self.field(enable_at, field::OPERAND_A), final_len));
        let their_adds: Vec<_> = theirs
            .iter()
            .map(|&(wr, w)| (self.field(wr, field::OPERAND_A), growth(self, w)))
            .collect();
        match early {
            Some((start, _)) => {
                for (i, (addr, add)) in own_adds.into_iter().enumerate() {
                    self.fill_reserved_faa(Wr { q, index: start + i as u64 }, addr, add);
                }
            }
            None => {
                for (addr, add) in own_adds {
                    self.faa(q, addr, add);
                }
            }
        }
        for (addr, add) in their_adds {
            self.faa(q, addr, add);
        }
        let wq = self.wq(q);
        let wait = self.push(q, Wqe::Wait { target: wq, count: final_sig, recv: false }, false);
        // The closing ENABLE lets the next round run: one round ahead of the others.
        let enable = self.push(q, Wqe::Enable { target: wq, count: 2 * final_len }, false);
        debug_assert_eq!((wait, enable), (wait_at, enable_at));
        debug_assert_eq!((self.completions(q), self.len(q)), (final_sig, final_len));
        self.queues[q.0].round = RoundState::Closed;
        Ok(())
    }

    /// The WAIT and ENABLE entries of `q` as emitted so far.
    fn control_entries(&self, q: Q) -> Vec<(Wr, Wqe)> {
        self.queues[q.0]
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match Wqe::decode(e.as_ref()?) {
                Ok((w @ (Wqe::Wait { .. } | Wqe::Enable { .. }), _)) => {
                    Some((Wr { q, index: i as u64 }, w))
                }
                _ => None,
            })
            .collect()
    }

    /// Makes managed queue `q` a run queue: its ring holds one run, which happens each
    /// time some ENABLE lets it, and perhaps not in every round of the program (the body
    /// of a loop iteration that a `break` may skip). Since no round knows how often it
    /// ran, the run advances its own counts: reserve the FAAs with
    /// [`Program::advance_here`] and close it with [`Program::end_run`].
    pub fn begin_run(&mut self, q: Q) -> Result<(), ProgramError> {
        let d = &mut self.queues[q.0];
        if d.round != RoundState::None || !d.managed {
            return Err(ProgramError::Round(q.0, "a run needs a managed queue not yet in one"));
        }
        d.round = RoundState::Open;
        d.run = true;
        Ok(())
    }

    /// Ends the run of `q`: fills the FAAs [`Program::advance_here`] reserved so that the
    /// next run finds its counts one run ahead: every WAIT and ENABLE of `q` (a queue
    /// that `q` waits for or ENABLEs must run exactly once per run of `q`) and each entry
    /// of `enabled_by`, the ENABLEs of `q` elsewhere in the program. Those must run
    /// before `q` does and not again before `q`'s next run fetched them anew.
    pub fn end_run(&mut self, q: Q, enabled_by: &[Wr]) -> Result<(), ProgramError> {
        let d = &self.queues[q.0];
        if d.round != RoundState::Open || !d.run {
            return Err(ProgramError::Round(q.0, "end_run without begin_run"));
        }
        let Some((start, reserved)) = d.advance else {
            return Err(ProgramError::Round(q.0, "a run reserves its FAAs with advance_here"));
        };
        let wq = self.wq(q);
        let mut adds = Vec::new();
        for (wr, w) in self.control_entries(q) {
            let add = match w {
                Wqe::Wait { recv: true, .. } => 1,
                Wqe::Wait { target, .. } => {
                    self.queue_of(target).map_or(0, |t| self.completions(t))
                }
                Wqe::Enable { target, .. } => self.queue_of(target).map_or(0, |t| self.len(t)),
                _ => unreachable!("control entries only"),
            };
            adds.push((self.field(wr, field::OPERAND_A), add));
        }
        for &wr in enabled_by {
            let words = self.queues[wr.q.0].entries[wr.index as usize];
            let target = words.map(|w| w[field::OPERAND_B as usize] as u32);
            if wr.q == q || target != Some(wq.0) {
                return Err(ProgramError::Round(
                    q.0,
                    "enabled_by names an entry that is not an ENABLE of it elsewhere",
                ));
            }
            adds.push((self.field(wr, field::OPERAND_A), self.len(q)));
        }
        if self.own_faas_seen.len() <= q.0 {
            self.own_faas_seen.resize(q.0 + 1, 0);
        }
        self.own_faas_seen[q.0] = adds.len();
        // A pass whose reservation missed the count is redone by `build` with the count
        // this pass saw; its entries are thrown away.
        if reserved == adds.len() {
            for (i, (addr, add)) in adds.into_iter().enumerate() {
                self.fill_reserved_faa(Wr { q, index: start + i as u64 }, addr, add);
            }
        }
        self.queues[q.0].round = RoundState::Closed;
        Ok(())
    }

    /// Writes a signaled FAA into a slot [`Program::advance_here`] reserved (and already
    /// counted as signaled).
    fn fill_reserved_faa(&mut self, wr: Wr, addr: LocalAddr, add: u64) {
        let e = &mut self.queues[wr.q.0].entries[wr.index as usize];
        assert!(e.is_none(), "reserved slot {wr:?} filled twice");
        *e = Some(Self::faa_wqe(addr, add).encode(WQE_SIGNALED, 0));
    }

    fn faa_wqe(addr: LocalAddr, add: u64) -> Wqe {
        Wqe::Faa { local: Sge { addr, len: 0 }, remote_key: addr.rkey, remote: addr.offset, add }
    }

    fn faa(&mut self, q: Q, addr: LocalAddr, add: u64) -> Wr {
        self.push(q, Self::faa_wqe(addr, add), true)
    }

    fn queue_of(&self, wq: WqId) -> Option<Q> {
        self.queues.iter().position(|d| d.wq == wq).map(Q)
    }

    /// Checks the program and fixes it for installation.
    fn finish(self) -> Result<Installed, ProgramError> {
        self.check()?;
        for (i, d) in self.queues.iter().enumerate() {
            if u64::from(d.slots) != d.entries.len() as u64 {
                return Err(ProgramError::RingSize(i, d.slots, d.entries.len()));
            }
        }
        Ok(Installed { program: self })
    }

    /// Checks the program (also done by [`Program::build`]).
    pub fn check(&self) -> Result<(), ProgramError> {
        for (qi, d) in self.queues.iter().enumerate() {
            if d.entries.len() > ENTRIES_MAX {
                return Err(ProgramError::TooManyEntries(qi, d.entries.len()));
            }
            if d.round == RoundState::Open {
                return Err(ProgramError::Round(qi, "round begun but not ended"));
            }
            for (i, e) in d.entries.iter().enumerate() {
                let wr = Wr { q: Q(qi), index: i as u64 };
                let Some(words) = e else { return Err(ProgramError::Unset(wr)) };
                let (wqe, _) = Wqe::decode(words).expect("the builder encodes valid entries");
                match wqe {
                    Wqe::Enable { target, .. } => {
                        let t = self.queue_of(target).expect("targets are queues of the program");
                        if !self.queues[t.0].managed {
                            return Err(ProgramError::NotManaged(Wr { q: t, index: 0 }));
                        }
                    }
                    Wqe::Wait { target, count, recv: false } if d.round == RoundState::None => {
                        let t = self.queue_of(target).expect("targets are queues of the program");
                        let total = self.completions(t);
                        if count > total {
                            return Err(ProgramError::WaitNeverSatisfied(wr, count, total));
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// A checked, laid-out program: write it to memory and create its queues.
#[derive(Clone, Debug)]
pub struct Installed {
    program: Program,
}

impl Installed {
    /// The queues to create, in order (their ids must come out as the program assumed).
    pub fn specs(&self) -> Vec<WqSpec> {
        let p = &self.program;
        let at = |off: u64| LocalAddr { rkey: p.code.rkey, offset: p.code.offset + off };
        p.queues
            .iter()
            .enumerate()
            .map(|(i, d)| WqSpec {
                ring: at(d.ring),
                slots: p.slots(Q(i)),
                recv_ring: at(d.recv_ring),
                recv_slots: d.recv_slots,
                doorbell_record: at(d.dbr),
                peer: d.peer,
                managed: d.managed,
                notify: None,
            })
            .collect()
    }

    /// Fabric id of a queue.
    pub fn wq(&self, q: Q) -> WqId {
        self.program.wq(q)
    }

    /// Bytes of the code area the program takes (rings, RECVs and doorbell records).
    pub fn code_bytes(&self) -> u64 {
        self.program.used
    }

    /// Address of a field of an entry.
    pub fn field(&self, wr: Wr, word: u64) -> LocalAddr {
        self.program.field(wr, word)
    }

    /// Writes rings, RECVs and doorbell records into `code` (the code region of the
    /// program's node): every entry is posted; the host then rings the doorbell of the
    /// queues that start the program.
    pub fn write(&self, code: &Region) {
        let p = &self.program;
        for (i, d) in p.queues.iter().enumerate() {
            let base = p.code.offset;
            for (k, e) in d.entries.iter().enumerate() {
                let e = e.expect("checked");
                let at = p.field(Wr { q: Q(i), index: k as u64 }, 0);
                code.write_words(at.offset, &e);
            }
            for slot in 0..d.recv_slots as usize {
                let Some(sges) = d.recvs.get(slot % d.recvs.len().max(1)) else { break };
                let mut w = vec![0u64; (RECV_WQE_BYTES / 8) as usize];
                w[0] = recv_header(sges.len());
                for (k, s) in sges.iter().enumerate() {
                    let [a, b] = s.words();
                    w[1 + 2 * k] = a;
                    w[2 + 2 * k] = b;
                }
                code.write_words(base + d.recv_ring + slot as u64 * RECV_WQE_BYTES, &w);
            }
            let posted_recvs = if d.recvs.is_empty() { 0 } else { u64::from(d.recv_slots) };
            code.write_words(base + d.dbr, &[d.entries.len() as u64, posted_recvs]);
        }
    }
}
