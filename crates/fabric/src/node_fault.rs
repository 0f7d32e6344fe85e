//! Faults of whole nodes at a time of the run: what the simulator and the threads
//! backend can do to a node (crash it, pause its CPUs; the simulator also restarts a
//! crashed one). Not for: faults of the network (the simulator's `FaultConfig` draws
//! those).

use std::fmt;

use crate::ids::NodeId;

/// Lives a node may have in one run: its first, and at most `LIVES_MAX - 1` restarts
/// (the runtime keeps each life's call numbers apart, and the engine each life's state).
pub const LIVES_MAX: u32 = 8;

/// What happens to a node at a time.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum NodeFaultKind {
    /// The node's CPUs stop for `for_ns` (a long GC pause, a descheduled process); its
    /// NIC keeps serving one-sided requests and buffering datagrams (on threads: its
    /// workers are not stepped, its memory stays reachable, its inboxes fill).
    Pause {
        /// How long.
        for_ns: u64,
    },
    /// The node stops for good: CPUs and NIC. Requests to it complete `Unreachable` (on
    /// the simulator after the transport timeout); datagrams to and from it vanish.
    Crash,
    /// A node that crashed comes back, as a host that rebooted: its memory is wiped, it
    /// has new connections, and its workers' programs are built again (their endpoints
    /// say which incarnation they are). It has no connection with any other node until
    /// both sides admit each other (`Endpoint::admit`): one-sided requests between them
    /// fail, datagrams pass. Strikes at `at_ns` or a transport timeout
    /// after the crash, whichever is later, so that nothing of the old incarnation is
    /// still in flight; does nothing if the node has not crashed by then, or once every
    /// program is done. Simulator only.
    Restart,
}

/// A fault on one node.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct NodeFault {
    /// Which node.
    pub node: NodeId,
    /// When, in nanoseconds from the start of the run (virtual time on the
    /// simulator, the run's clock on threads).
    pub at_ns: u64,
    /// What.
    pub kind: NodeFaultKind,
}

impl NodeFault {
    /// When the fault is over: at once for a crash (the node is gone for good), at the
    /// end for a pause.
    pub fn ends_at_ns(&self) -> u64 {
        match self.kind {
            NodeFaultKind::Pause { for_ns } => self.at_ns.saturating_add(for_ns),
            NodeFaultKind::Crash | NodeFaultKind::Restart => self.at_ns,
        }
    }
}

impl fmt::Display for NodeFault {
    /// The swarm's compact form: `crash n2 at 800 us`, `pause n1 at 20 us for 500 us`,
    /// `restart n2 at 3000 us`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.at_ns / 1000;
        match self.kind {
            NodeFaultKind::Pause { for_ns } => {
                write!(f, "pause {} at {at} us for {} us", self.node, for_ns / 1000)
            }
            NodeFaultKind::Crash => write!(f, "crash {} at {at} us", self.node),
            NodeFaultKind::Restart => write!(f, "restart {} at {at} us", self.node),
        }
    }
}
