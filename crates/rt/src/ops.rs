//! One-sided requests in flight: tickets, completion routing and send-queue accounting.
//!
//! A ticket stands for a batch of requests on one connection whose last request is
//! signaled; the batch is done when that completion arrives, and fails with the first
//! error any member reported (errors always complete, even unsignaled ones, and arrive in
//! connection order before the signaled one). Fire-and-forget requests (passive ACK) get
//! no ticket; the runtime signals one itself every `SIGNAL_EVERY` so the send queue
//! drains. Not for: posting (see `Co::issue` in `worker.rs`).

use std::task::Waker;

use hytra_fabric::{Completion, Status, WrId};

use crate::constants::SIGNAL_EVERY;

/// Identifies an issued batch; wait for it with [`Co::wait`](crate::Co::wait). A ticket
/// must be waited for exactly once, or its slot stays taken.
#[must_use = "a ticket must be waited for, or its slot is never freed"]
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct OpTicket {
    pub(crate) idx: u32,
    pub(crate) gen: u32,
}

/// `wr_id` of fire-and-forget requests; their errors are counted, not delivered.
pub(crate) const UNSIGNALED: WrId = u64::MAX;

/// Marks the `wr_id` of a batch's last (signaled) member; the others carry the same id
/// without it, so that their errors are recorded without settling the batch.
pub(crate) const LAST: WrId = 1 << 63;

#[derive(Clone, Debug)]
enum SlotState {
    Free,
    Pending,
    Done { status: Status, value: u64 },
}

#[derive(Clone, Debug)]
struct OpSlot {
    gen: u32,
    state: SlotState,
    /// First error a member of the batch reported.
    first_error: Option<Status>,
    /// Connection (dense index) and how many requests this completion retires there.
    qp: u32,
    covers: u32,
    /// Signaled by the runtime to drain the send queue; nobody waits for it.
    internal: bool,
    /// The waker of the last coroutine that waited on this slot. Kept after the slot is
    /// freed, so that the next wait, usually by the same coroutine, need not clone it.
    waker: Option<Waker>,
    /// Whether the current batch's owner waits on `waker` (set by `poll`): a kept waker
    /// may belong to an earlier owner, which must not be woken.
    armed: bool,
}

/// Send-queue bookkeeping of one connection.
#[derive(Copy, Clone, Debug, Default)]
struct QpAccount {
    /// Requests posted and not yet retired by a completion.
    outstanding: u32,
    /// Unsignaled requests since the last signaled one.
    unsignaled_run: u32,
    /// Requests posted on the connection since the start, and of those retired by a
    /// completion (known to have taken effect): marks for [`Co::qp_mark`].
    posted: u64,
    retired: u64,
}

/// How the next batch on a connection must be posted. Two words, so that it comes back
/// from [`OpTable::plan`] in registers: returned through memory and read back in other
/// pieces than it was written, it stalled every post on store forwarding.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Plan {
    /// `wr_id` of every member but the last: the slot's id, or `UNSIGNALED`.
    pub(crate) wr_id: WrId,
    /// Whether the caller gets a ticket for the batch.
    ticketed: bool,
}

impl Plan {
    /// Whether the last member is signaled.
    pub(crate) fn signal_last(&self) -> bool {
        self.wr_id != UNSIGNALED
    }

    /// `wr_id` of the last member.
    pub(crate) fn last_wr_id(&self) -> WrId {
        if self.signal_last() {
            self.wr_id | LAST
        } else {
            UNSIGNALED
        }
    }

    /// The ticket, if the caller asked for one.
    pub(crate) fn ticket(&self) -> Option<OpTicket> {
        self.ticketed.then_some(OpTicket { idx: self.wr_id as u32, gen: (self.wr_id >> 32) as u32 })
    }
}

/// Counters of one-sided traffic.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpStats {
    /// Completions reaped.
    pub completions: u64,
    /// Signals the runtime added to drain send queues.
    pub internal_signals: u64,
    /// Errors of fire-and-forget requests (nobody waits for them).
    pub unsignaled_errors: u64,
    /// The last such error.
    #[serde(skip)]
    pub last_unsignaled_error: Option<Status>,
}

/// All tickets and connection accounts of one worker.
pub(crate) struct OpTable {
    slots: Vec<OpSlot>,
    free: Vec<u32>,
    qps: Vec<QpAccount>,
    sq_depth: u32,
    pub(crate) stats: OpStats,
    /// Per connection, whether a request on it completed `Unreachable` since
    /// [`OpTable::take_unreachable`] last looked: what the engine's failure detection
    /// takes as a suspicion of the connection's node.
    unreachable: Vec<bool>,
    /// Whether any entry of `unreachable` is set.
    any_unreachable: bool,
}

fn wr_id(idx: u32, gen: u32) -> WrId {
    // Generations use 31 bits so that `LAST` stays free.
    u64::from(gen & 0x7FFF_FFFF) << 32 | u64::from(idx)
}

impl OpTable {
    pub(crate) fn new(connections: usize, sq_depth: u32) -> OpTable {
        OpTable {
            slots: Vec::with_capacity(1024),
            free: Vec::with_capacity(1024),
            qps: vec![QpAccount::default(); connections],
            sq_depth,
            stats: OpStats::default(),
            unreachable: vec![false; connections],
            any_unreachable: false,
        }
    }

    fn alloc(&mut self, qp: u32, covers: u32, internal: bool) -> (u32, u32) {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(OpSlot {
                    gen: 0,
                    state: SlotState::Free,
                    first_error: None,
                    qp: 0,
                    covers: 0,
                    internal: false,
                    waker: None,
                    armed: false,
                });
                u32::try_from(self.slots.len() - 1).expect("op slots fit u32")
            }
        };
        let s = &mut self.slots[idx as usize];
        debug_assert!(matches!(s.state, SlotState::Free));
        s.gen = s.gen.wrapping_add(1) & 0x7FFF_FFFF;
        s.state = SlotState::Pending;
        s.first_error = None;
        s.armed = false;
        (s.qp, s.covers, s.internal) = (qp, covers, internal);
        (idx, s.gen)
    }

    /// Reserves room for `n` requests on connection `qp`. `None` if the send queue cannot
    /// take them now (wait for completions and retry).
    pub(crate) fn plan(&mut self, qp: u32, n: u32, want_ticket: bool) -> Option<Plan> {
        let acct = self.qps[qp as usize];
        if acct.outstanding + n > self.sq_depth {
            return None;
        }
        let force = !want_ticket && acct.unsignaled_run + n >= SIGNAL_EVERY;
        let plan = if want_ticket || force {
            let covers = acct.unsignaled_run + n;
            let (idx, gen) = self.alloc(qp, covers, !want_ticket);
            self.qps[qp as usize].unsignaled_run = 0;
            if force {
                self.stats.internal_signals += 1;
            }
            Plan { wr_id: wr_id(idx, gen), ticketed: want_ticket }
        } else {
            self.qps[qp as usize].unsignaled_run += n;
            Plan { wr_id: UNSIGNALED, ticketed: false }
        };
        self.qps[qp as usize].outstanding += n;
        self.qps[qp as usize].posted += u64::from(n);
        Some(plan)
    }

    /// Requests posted on connection `qp` so far, and of those known to have taken effect.
    pub(crate) fn marks(&self, qp: u32) -> (u64, u64) {
        let a = &self.qps[qp as usize];
        (a.posted, a.retired)
    }

    /// Undoes part of a plan whose posts were refused after `posted` of `n` requests went
    /// out: the posted ones stay, unsignaled, to be retired by a later signal.
    pub(crate) fn abandon(&mut self, qp: u32, plan: &Plan, n: u32, posted: u32) {
        let acct = &mut self.qps[qp as usize];
        acct.outstanding -= n - posted;
        acct.posted -= u64::from(n - posted);
        if plan.signal_last() {
            let idx = (plan.wr_id & 0xFFFF_FFFF) as usize;
            let covers = self.slots[idx].covers;
            // The signal never went out: its run of unsignaled requests is still open.
            self.qps[qp as usize].unsignaled_run += covers - n + posted;
            self.slots[idx].state = SlotState::Free;
            self.free.push(idx as u32);
        } else {
            acct.unsignaled_run -= n - posted;
        }
    }

    /// The connections (dense indices) on which a request completed `Unreachable` since the
    /// last call, each once.
    pub(crate) fn take_unreachable(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        // Looked at on every turn of every worker's recovery task; failures are rare.
        if !std::mem::take(&mut self.any_unreachable) {
            return out;
        }
        for (i, u) in self.unreachable.iter_mut().enumerate() {
            if std::mem::take(u) {
                out.push(i as u32);
            }
        }
        out
    }

    /// Routes one completion; returns the waker to wake, if any. The slot keeps its
    /// waker: the next wait on the slot, usually by the same coroutine, then needs no
    /// clone.
    pub(crate) fn complete(&mut self, c: &Completion) -> Option<&Waker> {
        self.stats.completions += 1;
        if c.wr_id == UNSIGNALED {
            debug_assert_ne!(c.status, Status::Success, "unsignaled success never completes");
            self.stats.unsignaled_errors += 1;
            self.stats.last_unsignaled_error = Some(c.status);
            return None;
        }
        let last = c.wr_id & LAST != 0;
        let (idx, gen) = ((c.wr_id & 0xFFFF_FFFF) as usize, ((c.wr_id & !LAST) >> 32) as u32);
        let slot = &mut self.slots[idx];
        // A slot is freed only after its last completion was collected, so a completion
        // always finds its own generation still pending.
        assert!(
            slot.gen == gen && matches!(slot.state, SlotState::Pending),
            "stray completion {c:?}"
        );
        if c.status != Status::Success && slot.first_error.is_none() {
            slot.first_error = Some(c.status);
        }
        // Errors of unsignaled members arrive first (connection order); only the last
        // member's completion settles the batch.
        if !last {
            return None;
        }
        let status = slot.first_error.unwrap_or(c.status);
        let (qp, covers, internal) = (slot.qp, slot.covers, slot.internal);
        if status == Status::Unreachable {
            self.unreachable[qp as usize] = true;
            self.any_unreachable = true;
        }
        self.qps[qp as usize].outstanding -= covers;
        // Only a success says that the requests before it took effect (R3): after an
        // error the connection carries nothing more (an RC queue pair in the error
        // state), and what was in flight may not have landed, its target perhaps alive.
        if status == Status::Success {
            self.qps[qp as usize].retired += u64::from(covers);
        }
        if internal {
            if status != Status::Success {
                self.stats.unsignaled_errors += 1;
                self.stats.last_unsignaled_error = Some(status);
            }
            slot.state = SlotState::Free;
            self.free.push(idx as u32);
            return None;
        }
        slot.state = SlotState::Done { status, value: c.value };
        if slot.armed {
            slot.waker.as_ref()
        } else {
            None
        }
    }

    /// The result of a ticket if it is done (freeing its slot), else records `waker`.
    pub(crate) fn poll(&mut self, t: OpTicket, waker: &Waker) -> Option<(Status, u64)> {
        let slot = &mut self.slots[t.idx as usize];
        assert!(
            slot.gen == t.gen && !matches!(slot.state, SlotState::Free),
            "ticket waited for twice"
        );
        match slot.state {
            SlotState::Done { status, value } => {
                slot.state = SlotState::Free;
                self.free.push(t.idx);
                Some((status, value))
            }
            SlotState::Pending => {
                if !slot.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    slot.waker = Some(waker.clone());
                }
                slot.armed = true;
                None
            }
            SlotState::Free => unreachable!("ticket of a free slot"),
        }
    }

    /// Tickets issued and not yet collected (for leak checks in tests).
    pub(crate) fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hytra_fabric::AccessError;
    use std::task::Waker;

    fn cqe(wr_id: WrId, status: Status, value: u64) -> Completion {
        Completion { wr_id, status, value }
    }

    #[test]
    fn a_batch_settles_on_its_last_completion_with_the_first_error() {
        let mut t = OpTable::new(2, 256);
        let plan = t.plan(1, 3, true).unwrap();
        let ticket = plan.ticket().unwrap();
        assert!(plan.signal_last() && plan.last_wr_id() == plan.wr_id | LAST);
        // An unsignaled member fails first; the batch is not settled yet.
        let bad = Status::RemoteAccess(AccessError::OutOfBounds);
        assert!(t.complete(&cqe(plan.wr_id, bad, 0)).is_none());
        assert!(t.poll(ticket, Waker::noop()).is_none(), "still pending");
        t.complete(&cqe(plan.last_wr_id(), Status::Success, 7));
        assert_eq!(t.poll(ticket, Waker::noop()), Some((bad, 7)));
        assert_eq!(t.qps[1].outstanding, 0, "the completion retired all three requests");
        assert_eq!(t.live(), 0);
    }

    #[test]
    fn a_failed_completion_lands_nothing_and_names_its_connection() {
        let mut t = OpTable::new(3, 256);
        let plan = t.plan(2, 2, true).unwrap();
        t.complete(&cqe(plan.last_wr_id(), Status::Unreachable, 0));
        assert_eq!(t.qps[2].outstanding, 0, "the send queue is free again");
        assert_eq!(t.marks(2), (2, 0), "but nothing before the error counts as landed");
        assert_eq!(t.take_unreachable(), vec![2]);
        assert!(t.take_unreachable().is_empty(), "each failure is told once");
        // A later success on the broken connection does not make up for the lost ones.
        let next = t.plan(2, 1, true).unwrap();
        t.complete(&cqe(next.last_wr_id(), Status::Success, 0));
        assert_eq!(t.marks(2), (3, 1));
    }

    #[test]
    fn passive_ack_is_drained_by_a_forced_signal() {
        let mut t = OpTable::new(1, 256);
        let mut forced = None;
        for i in 0..SIGNAL_EVERY {
            let plan = t.plan(0, 1, false).unwrap();
            assert!(plan.ticket().is_none());
            if plan.signal_last() {
                assert_eq!(i, SIGNAL_EVERY - 1, "the 64th request is signaled");
                forced = Some(plan.last_wr_id());
            } else {
                assert_eq!(plan.wr_id, UNSIGNALED);
            }
        }
        assert_eq!(t.qps[0].outstanding, SIGNAL_EVERY);
        assert!(t.complete(&cqe(forced.unwrap(), Status::Success, 0)).is_none(), "nobody waits");
        assert_eq!(t.qps[0].outstanding, 0);
        assert_eq!((t.stats.internal_signals, t.live()), (1, 0));
        // Errors of fire-and-forget requests are counted.
        t.complete(&cqe(UNSIGNALED, Status::Unreachable, 0));
        assert_eq!(t.stats.unsignaled_errors, 1);
    }

    #[test]
    fn a_full_send_queue_refuses_and_abandon_restores_the_accounts() {
        let mut t = OpTable::new(1, 8);
        let plan = t.plan(0, 5, true).unwrap();
        assert!(t.plan(0, 4, true).is_none(), "5 + 4 > 8");
        // Two of the five got posted before the fabric refused the third.
        t.abandon(0, &plan, 5, 2);
        assert_eq!(t.qps[0].outstanding, 2);
        assert_eq!(t.qps[0].unsignaled_run, 2, "the posted two wait for a later signal");
        assert_eq!(t.live(), 0, "the batch's slot is free again");
        let next = t.plan(0, 1, true).unwrap();
        t.complete(&cqe(next.last_wr_id(), Status::Success, 0));
        assert_eq!(t.qps[0].outstanding, 0, "the next signal retired the abandoned two");
        let _ = t.poll(next.ticket().unwrap(), Waker::noop());
    }

    /// Counts its wakes.
    struct CountWakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountWakes {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn a_kept_waker_wakes_only_the_owner_that_waits() {
        use std::sync::atomic::Ordering;
        use std::sync::Arc;
        let mut t = OpTable::new(1, 8);
        let first = Arc::new(CountWakes(0.into()));
        let first_waker = Waker::from(first.clone());
        let a = t.plan(0, 1, true).unwrap();
        let ticket = a.ticket().unwrap();
        assert!(t.poll(ticket, &first_waker).is_none());
        t.complete(&cqe(a.last_wr_id(), Status::Success, 1)).expect("the waiter").wake_by_ref();
        assert_eq!(t.poll(ticket, &first_waker), Some((Status::Success, 1)));
        assert_eq!(first.0.load(Ordering::Relaxed), 1);
        // The slot is reused, its waker kept; the new batch completes before its owner
        // waits, so nobody is woken (least of all the first owner).
        let b = t.plan(0, 1, true).unwrap();
        assert_eq!(b.ticket().unwrap().idx, ticket.idx, "the same slot");
        assert!(t.complete(&cqe(b.last_wr_id(), Status::Success, 2)).is_none());
        let second = Waker::from(Arc::new(CountWakes(0.into())));
        assert_eq!(t.poll(b.ticket().unwrap(), &second), Some((Status::Success, 2)));
        assert_eq!(first.0.load(Ordering::Relaxed), 1);
    }
}
