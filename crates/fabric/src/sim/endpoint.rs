//! The simulator's [`Endpoint`]: a worker's handle on the shared simulation core.
//!
//! Every call borrows the core for its duration only, so programs (and their async
//! tasks) can hold the endpoint across steps while the event loop owns the core between
//! them.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use crate::cpu::CpuTerm;
use crate::endpoint::{Caps, Endpoint};
use crate::ids::{ClusterShape, NodeId, Qp, Rkey, WorkerId, WrId};
use crate::memory::Region;
use crate::sim::core::Core;
use crate::sim::measure::ProgramCpu;
use crate::sim::Fencing;
use crate::verbs::{Completion, OpFlags, PostError, WorkRequest};
use crate::wq::{WqCounters, WqId};

/// A worker's endpoint in the simulator.
pub struct SimEndpoint {
    pub(super) core: Rc<RefCell<Core>>,
    pub(super) me: WorkerId,
    pub(super) index: u32,
    pub(super) shape: ClusterShape,
    pub(super) caps: Caps,
    /// This node's regions (registration is over before endpoints exist).
    pub(super) regions: Vec<Region>,
    pub(super) fencing: Fencing,
    /// Whether steps are measured: the simulator's own time is then read around every
    /// call into it, to be taken off the step's.
    pub(super) measured: bool,
    /// The node's incarnation this endpoint belongs to.
    pub(super) life: u32,
}

impl Endpoint for SimEndpoint {
    fn me(&self) -> WorkerId {
        self.me
    }

    fn shape(&self) -> ClusterShape {
        self.shape
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn now_ns(&self) -> u64 {
        let core = self.core.borrow();
        // While stepping, the worker lives at its own clock, ahead of the event time by
        // the CPU work it has done so far; its node's clock may drift from true time.
        core.local_ns(self.me.node, core.workers[self.index as usize].clock.max(core.now))
    }

    fn charge_cpu(&mut self, ns: u64) {
        self.core.borrow_mut().charge_program_ns(self.index, ns);
    }

    fn charge(&mut self, term: CpuTerm, count: u32) {
        self.core.borrow_mut().charge_term(self.index, term, count);
    }

    fn region(&self, rkey: Rkey) -> Option<&Region> {
        self.regions.get(rkey.0 as usize)
    }

    fn post(
        &mut self,
        qp: Qp,
        wr_id: WrId,
        wr: &WorkRequest<'_>,
        flags: OpFlags,
    ) -> Result<(), PostError> {
        if self.dead() {
            return Ok(());
        }
        self.in_core(|core| core.post(self.index, qp, wr_id, wr, flags))
    }

    fn ring_doorbells(&mut self) {
        if self.dead() {
            return;
        }
        self.in_core(|core| core.ring_all(self.index));
    }

    fn poll_cq(&mut self, out: &mut [Completion]) -> usize {
        if self.dead() {
            return 0;
        }
        self.in_core(|core| core.poll_cq(self.index, out))
    }

    fn send(&mut self, to: WorkerId, payload: &[u8], flags: OpFlags) -> Result<(), PostError> {
        if self.dead() {
            return Ok(());
        }
        self.in_core(|core| core.send(self.index, to, payload, flags))
    }

    fn crash_here(&mut self) -> bool {
        self.core.borrow_mut().crash_here(self.me.node);
        true
    }

    fn admit(&mut self, node: NodeId) -> bool {
        assert_ne!(node, self.me.node, "a node admits others, never itself");
        // New connections, whatever `fencing` says: it concerns cutting connections off.
        self.core.borrow_mut().admit(self.me.node, node);
        true
    }

    fn incarnation(&self) -> u32 {
        self.life
    }

    fn fence(&mut self, node: NodeId) -> bool {
        assert_ne!(node, self.me.node, "a node fences others off, never itself");
        match self.fencing {
            Fencing::Nic => {
                self.core.borrow_mut().fence(self.me.node, node);
                true
            }
            Fencing::Unavailable => false,
        }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Option<(WorkerId, usize)> {
        if self.dead() {
            return None;
        }
        self.in_core(|core| core.recv(self.index, buf))
    }

    fn wq_doorbell(&mut self, wq: WqId) -> Result<(), PostError> {
        if self.dead() {
            return Ok(());
        }
        self.in_core(|core| core.wq_doorbell(self.index, wq))
    }

    fn wq_counters(&self, wq: WqId) -> Option<WqCounters> {
        self.core.borrow_mut().wq_counters_seen(self.index, wq)
    }

    fn trigger(&mut self, node: NodeId, wq: WqId, payload: &[u8]) -> Result<(), PostError> {
        if self.dead() {
            return Ok(());
        }
        self.in_core(|core| core.trigger(self.index, node, wq, payload))
    }
}

impl SimEndpoint {
    /// Runs `f` on the core; when steps are measured, the time it took is the
    /// simulator's, not the program's.
    fn in_core<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        if !self.measured {
            return f(&mut self.core.borrow_mut());
        }
        let t0 = Instant::now();
        let mut core = self.core.borrow_mut();
        let r = f(&mut core);
        let read = t0.elapsed().as_nanos() as f64;
        if let ProgramCpu::Measured(m) = &mut core.program_cpu {
            m.exclude(read);
        }
        r
    }

    /// Whether this worker's node crashed during the worker's current step (`crash_here`):
    /// what it still posts, sends or rings in that step vanishes and it learns of no
    /// completion or datagram, as a dead CPU. A node crashed by time is never stepped
    /// again, so this is the only way to be here dead.
    fn dead(&self) -> bool {
        self.core.borrow().node_crashed(self.me.node)
    }
}
