//! The simulated NIC's executor of verb programs: work queues whose entries live in
//! registered memory (see [`crate::wq`]), run by the NIC without any worker.
//!
//! A queue runs one entry per `WqRun` event. Entries issue from a buffer of fetched
//! copies, with intervals that depend on how they are ordered (RedN §5.1, Fig. 8): an
//! entry follows 0.17 us after its predecessor (WQ order) and 0.19 us after the
//! completion that released a WAIT before it (completion order). An unmanaged queue
//! copies its entries at the doorbell. A managed queue copies every entry it is allowed
//! to run when its buffer runs dry (after an ENABLE raised its limit): that fetch reads
//! memory as it is then, holds the NIC's one fetch unit, and its first entry issues
//! 0.54 us later (doorbell order). Data verbs take effect at their modelled target time
//! in a `WqEffect` event and complete later in a `WqComplete` event, so memory changes
//! happen in event order like every other verb.

use crate::ids::{LocalAddr, NodeId, WorkerId};
use crate::memory::Region;
use crate::sim::core::{ps, Core, Event, Ps};
use crate::sim::nic::NodeState;
use crate::sim::profile::OffloadCosts;
use crate::verbs::{PostError, Status};
use crate::wq::{
    apply_data_verb, check_message, check_spec, local_buffer_ok, recv_posted, scatter_recv,
    WqCounters, WqId, WqSpec, Wqe, WqeError, WQE_BYTES, WQE_SIGNALED,
};

/// Offload costs in picoseconds.
pub(super) struct OffloadModel {
    first_fetch: Ps,
    wq_order: Ps,
    completion_order: Ps,
    doorbell_order: Ps,
    fetch_unit: Ps,
}

impl OffloadModel {
    pub(super) fn new(c: &OffloadCosts) -> OffloadModel {
        OffloadModel {
            first_fetch: ps(c.first_fetch_ns),
            wq_order: ps(c.wq_order_ns),
            completion_order: ps(c.completion_order_ns),
            doorbell_order: ps(c.doorbell_order_ns),
            fetch_unit: ps(c.managed_fetch_unit_ns),
        }
    }
}

/// What a queue is doing.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Run {
    /// Nothing fetchable.
    Idle,
    /// A `WqRun` event is pending.
    Scheduled,
    /// Held by a WAIT (which completes when released, if signaled).
    Blocked { target: u32, count: u64, recv: bool, signaled: bool },
    /// Stopped by an error.
    Failed,
}

/// One work queue of a node.
pub(super) struct SimWq {
    spec: WqSpec,
    /// Entries with an index below this may be fetched.
    limit: u64,
    /// Next entry to run.
    head: u64,
    /// Fetched copies of the entries from `head` on (at the doorbell for unmanaged
    /// queues, at each fetch for managed ones).
    prefetched: std::collections::VecDeque<[u64; 8]>,
    /// Managed queues: from a fetch's start to its first entry issuing (a host doorbell
    /// costs the first-fetch latency, an ENABLE the doorbell-order one).
    fetch_delay: Ps,
    run: Run,
    counters: WqCounters,
    /// Completions are counted in order.
    last_complete: Ps,
    /// Data verbs of one queue take effect in order.
    last_effect: Ps,
    /// Completions not yet visible to the host, with their times.
    host_visible: std::collections::VecDeque<(Ps, u64)>,
    host_completions: u64,
    notify: Option<u32>,
    /// Queues of the node held by a WAIT on this one (a completion looks only at them,
    /// not at every queue of the node: a node may run thousands).
    waiters: Vec<u32>,
}

/// A data verb between issue and effect.
pub(crate) struct WqEffect {
    node: NodeId,
    wq: u32,
    wqe: Wqe,
    signaled: bool,
    complete_at: Ps,
}

/// A client's message on its way to a queue's RECV.
pub(crate) struct Trigger {
    node: NodeId,
    wq: u32,
    buf: u32,
    len: u32,
}

impl Core {
    fn offload_model(&self) -> &OffloadModel {
        self.offload.as_ref().expect("checked when the queue was created")
    }

    pub(crate) fn create_wq(&mut self, node: NodeId, spec: WqSpec) -> Result<WqId, String> {
        if self.offload.is_none() {
            return Err("this NIC profile has no verb-program costs (use cx5)".into());
        }
        if node.0 >= self.shape.nodes {
            return Err("no such node".into());
        }
        check_spec(self.shape, node, &spec, &self.regions[usize::from(node.0)])?;
        let list = &mut self.wqs[usize::from(node.0)];
        let id = WqId(u32::try_from(list.len()).map_err(|_| "too many queues")?);
        let notify =
            spec.notify.map(|i| self.shape.worker_index(WorkerId { node, index: i }) as u32);
        list.push(SimWq {
            spec,
            limit: 0,
            head: 0,
            prefetched: Default::default(),
            fetch_delay: 0,
            run: Run::Idle,
            counters: WqCounters::default(),
            last_complete: 0,
            last_effect: 0,
            host_visible: Default::default(),
            host_completions: 0,
            notify,
            waiters: Vec::new(),
        });
        Ok(id)
    }

    pub(crate) fn wq_counters(&self, node: NodeId, wq: WqId) -> Option<WqCounters> {
        self.wqs.get(usize::from(node.0))?.get(wq.0 as usize).map(|q| q.counters)
    }

    /// Counters as worker `w` sees them: completions reach host memory `completion` after
    /// the NIC counts them.
    pub(crate) fn wq_counters_seen(&mut self, w: u32, wq: WqId) -> Option<WqCounters> {
        let node = self.shape.worker_at(w as usize).node;
        let clock = self.workers[w as usize].clock.max(self.now);
        let q = self.wqs.get_mut(usize::from(node.0))?.get_mut(wq.0 as usize)?;
        while q.host_visible.front().is_some_and(|&(t, _)| t <= clock) {
            q.host_completions = q.host_visible.pop_front().expect("peeked").1;
        }
        Some(WqCounters { completions: q.host_completions, ..q.counters })
    }

    fn region_of(&self, node: NodeId, a: LocalAddr) -> Option<&Region> {
        self.regions[usize::from(node.0)].get(a.rkey.0 as usize)
    }

    /// The host rang the queue's doorbell: the NIC reads the posted count from the
    /// doorbell record (an unmanaged queue also prefetches the new entries; a managed
    /// queue takes the count as an ENABLE).
    pub(crate) fn wq_doorbell(&mut self, w: u32, wq: WqId) -> Result<(), PostError> {
        let node = self.shape.worker_at(w as usize).node;
        let n = usize::from(node.0);
        let Some(q) = self.wqs[n].get(wq.0 as usize) else { return Err(PostError::NoSuchPeer) };
        let dbr = q.spec.doorbell_record;
        let posted = self.region_of(node, dbr).expect("checked at creation").load(dbr.offset);
        let charge = self.model.doorbell_cpu;
        self.charge(w, charge);
        let at = self.workers[w as usize].clock + self.model.doorbell_latency;
        self.raise_limit(node, wq.0, posted, at, true);
        Ok(())
    }

    /// Lets the queue fetch entries below `limit`; starts it if it was idle.
    fn raise_limit(&mut self, node: NodeId, wq: u32, limit: u64, at: Ps, by_host: bool) {
        let n = usize::from(node.0);
        let q = &mut self.wqs[n][wq as usize];
        if limit <= q.limit {
            return;
        }
        if !q.spec.managed {
            // Prefetch: the NIC copies the entries now; later changes are not seen.
            let from = q.limit.max(q.head);
            self.copy_entries(n, wq, from, limit);
        }
        let q = &mut self.wqs[n][wq as usize];
        q.limit = limit;
        let managed = q.spec.managed;
        let m = self.offload_model();
        let delay = if by_host { m.first_fetch } else { m.doorbell_order };
        if managed {
            // The fetch itself happens when the queue runs dry (now, if it is idle).
            self.wqs[n][wq as usize].fetch_delay = delay;
        }
        let q = &self.wqs[n][wq as usize];
        if q.run == Run::Idle && q.head < q.limit {
            self.schedule_wq(node, wq, if managed { at } else { at + delay });
        }
    }

    /// Appends copies of entries `from..to` of a queue's ring, as memory holds them now,
    /// to the entries the queue has fetched.
    fn copy_entries(&mut self, n: usize, wq: u32, from: u64, to: u64) {
        let q = &mut self.wqs[n][wq as usize];
        let region = &self.regions[n][q.spec.ring.rkey.0 as usize];
        for i in from..to {
            let mut e = [0u64; 8];
            let slot = i % u64::from(q.spec.slots);
            region.read_words(q.spec.ring.offset + slot * WQE_BYTES, &mut e);
            q.prefetched.push_back(e);
        }
    }

    fn schedule_wq(&mut self, node: NodeId, wq: u32, at: Ps) {
        let at = at.max(self.now);
        self.wqs[usize::from(node.0)][wq as usize].run = Run::Scheduled;
        self.schedule(at, Event::WqRun { node, wq });
    }

    /// Runs the queue's next entry.
    pub(crate) fn wq_run(&mut self, node: NodeId, wq: u32) {
        let n = usize::from(node.0);
        if self.nics[n].state == NodeState::Crashed {
            return;
        }
        let now = self.now;
        let q = &mut self.wqs[n][wq as usize];
        debug_assert_eq!(q.run, Run::Scheduled);
        if q.head >= q.limit {
            q.run = Run::Idle;
            return;
        }
        if q.prefetched.is_empty() {
            debug_assert!(q.spec.managed, "unmanaged queues prefetch up to the limit");
            // Doorbell order: one fetch copies every allowed entry (at most a ring's
            // worth) as memory holds it now; they issue after the fetch latency.
            let (from, to) = (q.head, q.limit.min(q.head + u64::from(q.spec.slots)));
            let delay = q.fetch_delay;
            self.copy_entries(n, wq, from, to);
            let unit = self.offload_model().fetch_unit;
            let start = self.nics[n].wq_fetch.book(now, unit, now).saturating_sub(unit).max(now);
            self.schedule_wq(node, wq, start + delay);
            return;
        }
        let words = q.prefetched.pop_front().expect("checked non-empty");
        self.trace.add(u64::from(node.0) << 48 ^ u64::from(wq) << 32 ^ words[0]);
        let (wqe, flags) = match Wqe::decode(&words) {
            Ok(x) => x,
            Err(e) => return self.wq_fail(node, wq, e),
        };
        let signaled = flags & WQE_SIGNALED != 0;
        let step = self.offload_model().wq_order;
        let issue = now;
        let q = &mut self.wqs[n][wq as usize];
        match wqe {
            Wqe::Wait { target, count, recv } => {
                if self.wqs[n].get(target.0 as usize).is_none() {
                    return self.wq_fail(node, wq, WqeError::BadQueue(target.0));
                }
                let t = &self.wqs[n][target.0 as usize].counters;
                let have = if recv { t.recv_completions } else { t.completions };
                let q = &mut self.wqs[n][wq as usize];
                q.head += 1;
                q.counters.executed += 1;
                if have >= count {
                    let next = issue + self.offload_model().completion_order;
                    self.after_issue(node, wq, issue, signaled, next);
                } else {
                    q.run = Run::Blocked { target: target.0, count, recv, signaled };
                    self.wqs[n][target.0 as usize].waiters.push(wq);
                }
                return;
            }
            Wqe::Enable { target, count } => {
                let ok = self.wqs[n].get(target.0 as usize).is_some_and(|t| t.spec.managed);
                if !ok {
                    return self.wq_fail(node, wq, WqeError::BadQueue(target.0));
                }
                let q = &mut self.wqs[n][wq as usize];
                q.head += 1;
                q.counters.executed += 1;
                self.after_issue(node, wq, issue, signaled, issue + step);
                self.raise_limit(node, target.0, count, issue, false);
                return;
            }
            Wqe::Noop => {
                q.head += 1;
                q.counters.executed += 1;
                self.after_issue(node, wq, issue, signaled, issue + step);
                return;
            }
            _ => {}
        }
        // A data verb: local checks now, remote checks at the target.
        if !local_buffer_ok(&wqe, &self.regions[n]) {
            return self.wq_fail(node, wq, WqeError::Access);
        }
        let peer = self.wqs[n][wq as usize].spec.peer;
        let (effect_at, complete_at) = self.data_verb_times(node, peer, &wqe, issue);
        let q = &mut self.wqs[n][wq as usize];
        let effect_at = effect_at.max(q.last_effect);
        q.last_effect = effect_at;
        q.head += 1;
        q.counters.executed += 1;
        let effect = WqEffect { node, wq, wqe, signaled, complete_at: complete_at.max(effect_at) };
        self.schedule(effect_at, Event::WqEffect(Box::new(effect)));
        self.continue_at(node, wq, issue + step);
    }

    /// When a data verb issued at `t` takes effect at its target and when it completes.
    fn data_verb_times(&mut self, node: NodeId, peer: NodeId, wqe: &Wqe, t: Ps) -> (Ps, Ps) {
        let m = &self.model;
        let (target_time, payload_out, payload_back) = match *wqe {
            Wqe::Write { local, .. } => (m.target_write, u64::from(local.len), 0),
            Wqe::Read { local, .. } => (m.target_read, 0, u64::from(local.len)),
            Wqe::Cas { .. } => (m.target_read, 16, 8),
            _ => (m.target_read, 8, 8),
        };
        let atomic = matches!(wqe, Wqe::Cas { .. } | Wqe::Faa { .. });
        let (hdr, wire, completion) = (m.rc_header, m.wire, m.completion);
        let (req, resp) = {
            let k = match wqe {
                Wqe::Write { .. } => 1,
                Wqe::Read { .. } => 0,
                _ => 2,
            };
            (m.req[k], m.resp[k])
        };
        let atomic_unit = m.atomic_unit;
        let now = self.now;
        let mut te = if peer == node {
            // Loopback: the NIC's own engine serves it over PCIe; no wire.
            self.engine_at(node, t, req + resp)
        } else {
            let t1 = self.engine_at(node, t, req);
            let left = self.transmit_at(node, t1, hdr + payload_out);
            let arrive = self.receive_at(peer, left + wire, hdr + payload_out);
            self.engine_at(peer, arrive, resp)
        };
        if atomic {
            te = self.nics[usize::from(peer.0)].atomic_unit.book(te, atomic_unit, now);
        }
        te += target_time;
        let back = if peer == node {
            te
        } else {
            let left = self.transmit_at(peer, te, hdr + payload_back);
            self.receive_at(node, left + wire, hdr + payload_back)
        };
        (te, back + completion)
    }

    /// A data verb reaches its target: check, apply, and schedule its completion.
    pub(crate) fn wq_effect(&mut self, e: WqEffect) {
        let n = usize::from(e.node.0);
        let peer = self.wqs[n][e.wq as usize].spec.peer;
        if self.nics[usize::from(peer.0)].state == NodeState::Crashed {
            return self.wq_fail(e.node, e.wq, WqeError::Access);
        }
        let (own, far) = (&self.regions[n], &self.regions[usize::from(peer.0)]);
        let (status, value, rkey) = apply_data_verb(&e.wqe, own, far, &self.wq_scratch);
        self.stats.one_sided += 1;
        self.trace.add(u64::from(e.wq) << 40 ^ value);
        if status != Status::Success {
            self.stats.access_errors += 1;
            return self.wq_fail(e.node, e.wq, WqeError::Access);
        }
        if !matches!(e.wqe, Wqe::Read { .. }) {
            self.wake_watcher(peer, rkey, self.now);
        }
        if e.signaled {
            self.schedule(e.complete_at, Event::WqComplete { node: e.node, wq: e.wq });
        }
    }

    /// A signaled entry completed: count it, release WAITs, tell the host.
    pub(crate) fn wq_complete(&mut self, node: NodeId, wq: u32) {
        let n = usize::from(node.0);
        let completion = self.model.completion;
        let q = &mut self.wqs[n][wq as usize];
        let at = self.now.max(q.last_complete);
        q.last_complete = at;
        q.counters.completions += 1;
        let c = q.counters.completions;
        q.host_visible.push_back((at + completion, c));
        if let Some(w) = q.notify {
            self.wake(w, at + completion);
        }
        self.release_waiters(node, wq, false, at);
    }

    fn release_waiters(&mut self, node: NodeId, target: u32, recv: bool, at: Ps) {
        let n = usize::from(node.0);
        let t = &self.wqs[n][target as usize].counters;
        let have = if recv { t.recv_completions } else { t.completions };
        let resume = at + self.offload_model().completion_order;
        let mut waiting = std::mem::take(&mut self.wqs[n][target as usize].waiters);
        // In queue order, so that same-time releases are scheduled in a fixed order.
        waiting.sort_unstable();
        let mut still = Vec::new();
        for i in waiting {
            let Run::Blocked { target: tq, count, recv: r, signaled } = self.wqs[n][i as usize].run
            else {
                continue;
            };
            debug_assert_eq!(tq, target, "a waiter is listed at the queue it waits on");
            if r == recv && have >= count {
                self.wqs[n][i as usize].run = Run::Idle;
                self.after_issue(node, i, at, signaled, resume);
            } else {
                still.push(i);
            }
        }
        // Releasing only schedules: nothing blocked on `target` meanwhile.
        let w = &mut self.wqs[n][target as usize].waiters;
        debug_assert!(w.is_empty());
        *w = still;
    }

    /// Bookkeeping after a control entry issued at `t`: its completion, then the next.
    fn after_issue(&mut self, node: NodeId, wq: u32, t: Ps, signaled: bool, next: Ps) {
        if signaled {
            self.schedule(t, Event::WqComplete { node, wq });
        }
        self.continue_at(node, wq, next);
    }

    fn continue_at(&mut self, node: NodeId, wq: u32, at: Ps) {
        let q = &mut self.wqs[usize::from(node.0)][wq as usize];
        if q.head < q.limit {
            self.schedule_wq(node, wq, at);
        } else {
            q.run = Run::Idle;
        }
    }

    fn wq_fail(&mut self, node: NodeId, wq: u32, e: WqeError) {
        let q = &mut self.wqs[usize::from(node.0)][wq as usize];
        q.run = Run::Failed;
        q.counters.error.get_or_insert(e);
        self.stats.wq_errors += 1;
    }

    /// A client sends a message to a queue's RECV (one RC SEND).
    pub(crate) fn trigger(
        &mut self,
        w: u32,
        node: NodeId,
        wq: WqId,
        payload: &[u8],
    ) -> Result<(), PostError> {
        if node.0 >= self.shape.nodes || self.wqs[usize::from(node.0)].get(wq.0 as usize).is_none()
        {
            return Err(PostError::NoSuchPeer);
        }
        check_message(payload)?;
        let src = self.shape.worker_at(w as usize).node;
        let cost =
            self.model.wqe_cpu + self.model.copy_cpu(payload.len()) + self.model.doorbell_cpu;
        self.charge(w, cost);
        let t = self.workers[w as usize].clock + self.model.doorbell_latency;
        let bytes = self.model.rc_header + payload.len() as u64;
        let req = self.model.req[4];
        let t = self.engine_at(src, t, req);
        let left = self.transmit_at(src, t, bytes);
        let buf = self.msg_pool.put(payload);
        let trig = Trigger { node, wq: wq.0, buf, len: payload.len() as u32 };
        self.schedule(left + self.model.wire, Event::Trigger(trig));
        Ok(())
    }

    /// A client's message reaches the queue: consume a RECV and scatter into memory.
    pub(crate) fn trigger_arrive(&mut self, t: Trigger) {
        let n = usize::from(t.node.0);
        let bytes = self.msg_pool.get(t.buf).to_vec();
        self.msg_pool.release(t.buf);
        if self.nics[n].state == NodeState::Crashed {
            return;
        }
        let wire_bytes = self.model.rc_header + u64::from(t.len);
        let t_in = self.receive_at(t.node, self.now, wire_bytes);
        let resp = self.model.resp[4];
        let done = self.engine_at(t.node, t_in, resp) + self.model.target_write;
        let q = &self.wqs[n][t.wq as usize];
        if !recv_posted(&q.spec, &q.counters, &self.regions[n]) {
            self.wqs[n][t.wq as usize].counters.rnr_drops += 1;
            return;
        }
        if let Err(e) = scatter_recv(&q.spec, q.counters.recv_completions, &self.regions[n], &bytes)
        {
            return self.wq_fail(t.node, t.wq, e);
        }
        self.trace.add(0x7EC << 48 ^ u64::from(t.wq) << 32 ^ u64::from(t.len));
        let q = &mut self.wqs[n][t.wq as usize];
        q.counters.recv_completions += 1;
        self.release_waiters(t.node, t.wq, true, done);
    }
}
