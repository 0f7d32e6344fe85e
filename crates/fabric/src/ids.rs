//! Identifiers and addresses of the verbs model: nodes, workers, regions, queue pairs.
//!
//! Not for: anything with behaviour. These are plain values so that they can be copied
//! into work requests, wire headers and traces.

use std::fmt;

/// One machine of the cluster.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct NodeId(pub u16);

/// One thread of a node with its own NIC context: `index` counts from 0 within the node.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct WorkerId {
    /// The node the worker runs on.
    pub node: NodeId,
    /// Index of the worker within its node.
    pub index: u16,
}

/// Key of a registered memory region of one node. Keys are handed out in registration
/// order, so nodes that register the same regions in the same order agree on them.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Rkey(pub u32);

/// A byte address in a region of a (usually remote) node.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct RemoteAddr {
    /// Node that owns the memory.
    pub node: NodeId,
    /// Region on that node.
    pub rkey: Rkey,
    /// Byte offset inside the region.
    pub offset: u64,
}

/// A byte address in a region of the posting worker's own node (the verbs "lkey + addr").
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct LocalAddr {
    /// Region on the posting node.
    pub rkey: Rkey,
    /// Byte offset inside the region.
    pub offset: u64,
}

/// A reliable connection of the posting worker to `node`. Each worker has
/// `lanes_per_peer` connections to every node (its own included, for loopback); more
/// than one lane emulates the queue-pair count of a larger cluster (paper §4.2).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Qp {
    /// Node at the other end.
    pub node: NodeId,
    /// Which of the connections to that node.
    pub lane: u16,
}

impl Qp {
    /// The first (usually only) connection to `node`.
    pub const fn to(node: NodeId) -> Self {
        Qp { node, lane: 0 }
    }
}

/// Caller-chosen tag of a work request, returned in its completion.
pub type WrId = u64;

/// Size of the cluster: how many nodes and how many workers on each.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct ClusterShape {
    /// Number of nodes.
    pub nodes: u16,
    /// Workers on every node.
    pub workers_per_node: u16,
    /// Reliable connections from each worker to each node.
    pub lanes_per_peer: u16,
}

impl ClusterShape {
    /// Total number of workers in the cluster.
    pub fn workers_total(&self) -> usize {
        usize::from(self.nodes) * usize::from(self.workers_per_node)
    }

    /// Dense index of a worker, `node * workers_per_node + index`.
    pub fn worker_index(&self, w: WorkerId) -> usize {
        debug_assert!(self.contains(w), "{w} outside {self:?}");
        usize::from(w.node.0) * usize::from(self.workers_per_node) + usize::from(w.index)
    }

    /// Inverse of [`ClusterShape::worker_index`].
    pub fn worker_at(&self, index: usize) -> WorkerId {
        assert!(index < self.workers_total(), "worker index {index} outside {self:?}");
        let per = usize::from(self.workers_per_node);
        WorkerId {
            node: NodeId(u16::try_from(index / per).expect("node id fits u16")),
            index: u16::try_from(index % per).expect("worker index fits u16"),
        }
    }

    /// Whether the worker exists in this cluster.
    pub fn contains(&self, w: WorkerId) -> bool {
        w.node.0 < self.nodes && w.index < self.workers_per_node
    }

    /// Whether the queue pair names an existing connection.
    pub fn has_qp(&self, qp: Qp) -> bool {
        qp.node.0 < self.nodes && qp.lane < self.lanes_per_peer
    }

    /// All workers, in dense-index order.
    pub fn workers(&self) -> impl Iterator<Item = WorkerId> + '_ {
        (0..self.workers_total()).map(|i| self.worker_at(i))
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}.w{}", self.node.0, self.index)
    }
}

impl fmt::Display for RemoteAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:r{}+{}", self.node, self.rkey.0, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_index_round_trips() {
        let shape = ClusterShape { nodes: 3, workers_per_node: 5, lanes_per_peer: 1 };
        for i in 0..shape.workers_total() {
            let w = shape.worker_at(i);
            assert!(shape.contains(w));
            assert_eq!(shape.worker_index(w), i);
        }
        assert_eq!(shape.worker_at(7), WorkerId { node: NodeId(1), index: 2 });
        assert!(!shape.contains(WorkerId { node: NodeId(3), index: 0 }));
        assert!(!shape.has_qp(Qp { node: NodeId(0), lane: 1 }));
    }
}
