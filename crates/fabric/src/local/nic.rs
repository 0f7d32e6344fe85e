//! The `local` backend's NIC for verb programs: a thread that runs the work queues of
//! every node (see [`crate::wq`]) while the workers run, with no worker involved.
//!
//! It keeps the ordering rules of the simulator's NIC model, without its timing: an
//! unmanaged queue copies its entries at the doorbell; a managed queue copies every
//! entry it is allowed to run when it runs out of fetched ones; a WAIT holds its queue
//! until the counter it names is reached; an entry changed after it was fetched runs as
//! it was fetched. A data verb takes effect and completes when it issues, which is one
//! of the orders the simulator allows (a program that is correct there, because it
//! orders dependent verbs with WAIT and ENABLE, is correct here).
//!
//! Workers ring doorbells and clients send messages from their own threads; both only
//! change the queues' state under the lock and wake the NIC thread, which does all the
//! work. Not for: timing (the host sees completions at once).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::ids::{ClusterShape, NodeId};
use crate::memory::Region;
use crate::verbs::{PostError, Status};
use crate::wq::{
    apply_data_verb, check_message, check_spec, local_buffer_ok, recv_posted, scatter_recv,
    WqCounters, WqId, WqSpec, Wqe, WqeError, WQE_BYTES, WQE_SIGNALED,
};

/// Entries run under one hold of the lock, so that doorbells and messages get in while
/// a program loops.
const BUDGET: usize = 256;

/// How long the idle NIC thread sleeps before it looks again without being woken: a
/// safety net only, every state change wakes it.
const IDLE_WAIT: Duration = Duration::from_millis(1);

/// One work queue.
struct Queue {
    spec: WqSpec,
    /// Entries with an index below this may be fetched.
    limit: u64,
    /// Next entry to run.
    head: u64,
    /// Fetched copies of the entries from `head` on.
    fetched: VecDeque<[u64; 8]>,
    /// The WAIT holding the queue: target queue, count, receive side, signaled.
    blocked: Option<(u32, u64, bool, bool)>,
    counters: WqCounters,
}

#[derive(Default)]
struct State {
    /// Queues of each node, by id.
    queues: Vec<Vec<Queue>>,
    stop: bool,
}

/// The NIC of every node of a `local` cluster.
pub(crate) struct LocalNic {
    state: Mutex<State>,
    wake: Condvar,
    /// Where atomics put an old value nobody asked for.
    scratch: Region,
}

impl LocalNic {
    pub(crate) fn new(nodes: u16) -> LocalNic {
        let queues = (0..nodes).map(|_| Vec::new()).collect();
        LocalNic {
            state: Mutex::new(State { queues, ..State::default() }),
            wake: Condvar::new(),
            scratch: Region::zeroed(8),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counters consistent (every change is a
        // single assignment), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any queue exists (the NIC thread runs only then).
    pub(crate) fn has_queues(&self) -> bool {
        self.lock().queues.iter().any(|q| !q.is_empty())
    }

    pub(crate) fn create_wq(
        &self,
        shape: ClusterShape,
        node: NodeId,
        spec: WqSpec,
        regions: &[Region],
    ) -> Result<WqId, String> {
        check_spec(shape, node, &spec, regions)?;
        let mut st = self.lock();
        let list = &mut st.queues[usize::from(node.0)];
        let id = WqId(u32::try_from(list.len()).map_err(|_| "too many queues")?);
        list.push(Queue {
            spec,
            limit: 0,
            head: 0,
            fetched: VecDeque::new(),
            blocked: None,
            counters: WqCounters::default(),
        });
        Ok(id)
    }

    pub(crate) fn counters(&self, node: NodeId, wq: WqId) -> Option<WqCounters> {
        let st = self.lock();
        st.queues.get(usize::from(node.0))?.get(wq.0 as usize).map(|q| q.counters)
    }

    /// The host rang a queue's doorbell: the NIC reads the posted count from the
    /// doorbell record (an unmanaged queue copies the new entries now).
    pub(crate) fn doorbell(
        &self,
        node: NodeId,
        wq: WqId,
        regions: &[Region],
    ) -> Result<(), PostError> {
        let mut st = self.lock();
        let Some(q) = st.queues[usize::from(node.0)].get_mut(wq.0 as usize) else {
            return Err(PostError::NoSuchPeer);
        };
        let dbr = q.spec.doorbell_record;
        let posted = regions[dbr.rkey.0 as usize].load(dbr.offset);
        raise_limit(q, posted, regions);
        drop(st);
        self.wake.notify_one();
        Ok(())
    }

    /// A client's message reaches queue `wq` of `node`: it consumes a RECV, or is
    /// dropped and counted if none is posted.
    pub(crate) fn deliver(
        &self,
        node: NodeId,
        wq: WqId,
        regions: &[Region],
        bytes: &[u8],
    ) -> Result<(), PostError> {
        check_message(bytes)?;
        let mut st = self.lock();
        let Some(q) = st.queues.get_mut(usize::from(node.0)).and_then(|l| l.get_mut(wq.0 as usize))
        else {
            return Err(PostError::NoSuchPeer);
        };
        if !recv_posted(&q.spec, &q.counters, regions) {
            q.counters.rnr_drops += 1;
            return Ok(());
        }
        match scatter_recv(&q.spec, q.counters.recv_completions, regions, bytes) {
            Ok(()) => q.counters.recv_completions += 1,
            Err(e) => {
                q.counters.error.get_or_insert(e);
            }
        }
        drop(st);
        self.wake.notify_one();
        Ok(())
    }

    /// Readies the NIC for a run (before its thread starts, so that a run whose workers
    /// finish at once still stops it).
    pub(crate) fn arm(&self) {
        self.lock().stop = false;
    }

    /// Tells the NIC thread to return.
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_one();
    }

    /// The NIC thread: runs queues until [`LocalNic::stop`]. `regions` are every node's.
    /// It holds the lock from finding nothing to run until it waits (which releases it),
    /// so a doorbell or message cannot slip in between unseen.
    pub(crate) fn serve(&self, regions: &[Vec<Region>]) {
        let mut st = self.lock();
        while !st.stop {
            if pump(&mut st, regions, &self.scratch) {
                // Let workers ring doorbells and poll counters between bursts.
                drop(st);
                std::thread::yield_now();
                st = self.lock();
            } else {
                st = self.wake.wait_timeout(st, IDLE_WAIT).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
    }
}

/// Lets `q` fetch entries below `limit`; an unmanaged queue copies them now.
fn raise_limit(q: &mut Queue, limit: u64, regions: &[Region]) {
    if limit <= q.limit {
        return;
    }
    if !q.spec.managed {
        let from = q.limit.max(q.head);
        copy_entries(q, from, limit, regions);
    }
    q.limit = limit;
}

/// Appends copies of entries `from..to` of the queue's ring, as memory holds them now.
fn copy_entries(q: &mut Queue, from: u64, to: u64, regions: &[Region]) {
    let ring = &regions[q.spec.ring.rkey.0 as usize];
    for i in from..to {
        let mut e = [0u64; 8];
        let slot = i % u64::from(q.spec.slots);
        ring.read_words(q.spec.ring.offset + slot * WQE_BYTES, &mut e);
        q.fetched.push_back(e);
    }
}

/// Runs entries of every queue until none can run or the budget is spent; returns
/// whether any ran.
fn pump(st: &mut State, regions: &[Vec<Region>], scratch: &Region) -> bool {
    let mut ran = 0;
    loop {
        let before = ran;
        for n in 0..st.queues.len() {
            for i in 0..st.queues[n].len() {
                while ran < BUDGET && step(&mut st.queues[n], i, n, regions, scratch) {
                    ran += 1;
                }
            }
        }
        if ran == before || ran >= BUDGET {
            return ran > 0;
        }
    }
}

/// Runs the next entry of queue `i` of node `n` if it can run; returns whether it did
/// (releasing a WAIT counts).
fn step(
    queues: &mut [Queue],
    i: usize,
    n: usize,
    regions: &[Vec<Region>],
    scratch: &Region,
) -> bool {
    let own = &regions[n];
    if queues[i].counters.error.is_some() {
        return false;
    }
    if let Some((target, count, recv, signaled)) = queues[i].blocked {
        let t = &queues[target as usize].counters;
        if (if recv { t.recv_completions } else { t.completions }) < count {
            return false;
        }
        let q = &mut queues[i];
        q.blocked = None;
        if signaled {
            q.counters.completions += 1;
        }
        return true;
    }
    let q = &mut queues[i];
    if q.head >= q.limit {
        return false;
    }
    if q.fetched.is_empty() {
        // A managed queue: one fetch copies every allowed entry, at most a ring's worth.
        let (from, to) = (q.head, q.limit.min(q.head + u64::from(q.spec.slots)));
        copy_entries(q, from, to, own);
    }
    let words = q.fetched.pop_front().expect("fetched up to the limit");
    let (wqe, flags) = match Wqe::decode(&words) {
        Ok(x) => x,
        Err(e) => return fail(q, e),
    };
    let signaled = flags & WQE_SIGNALED != 0;
    let bad_target = match wqe {
        Wqe::Wait { target, .. } => (target.0 as usize >= queues.len()).then_some(target),
        Wqe::Enable { target, .. } => {
            (!queues.get(target.0 as usize).is_some_and(|t| t.spec.managed)).then_some(target)
        }
        _ => None,
    };
    let q = &mut queues[i];
    if let Some(target) = bad_target {
        return fail(q, WqeError::BadQueue(target.0));
    }
    // A data verb's local buffer is checked when it issues, the remote one at the target.
    if !local_buffer_ok(&wqe, own) {
        return fail(q, WqeError::Access);
    }
    q.head += 1;
    q.counters.executed += 1;
    match wqe {
        // Checked on the next step, like any held WAIT.
        Wqe::Wait { target, count, recv } => q.blocked = Some((target.0, count, recv, signaled)),
        Wqe::Enable { target, count } => {
            q.counters.completions += u64::from(signaled);
            raise_limit(&mut queues[target.0 as usize], count, own);
        }
        Wqe::Noop => q.counters.completions += u64::from(signaled),
        _ => {
            let peer = &regions[usize::from(q.spec.peer.0)];
            let (status, _, _) = apply_data_verb(&wqe, own, peer, scratch);
            if status != Status::Success {
                return fail(q, WqeError::Access);
            }
            q.counters.completions += u64::from(signaled);
        }
    }
    true
}

/// Stops a queue after a failed entry, as a real queue enters the error state.
fn fail(q: &mut Queue, e: WqeError) -> bool {
    q.counters.error.get_or_insert(e);
    true
}
