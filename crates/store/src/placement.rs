//! Where each partition's replicas live: its primary, which serves reads and locks and
//! takes write-backs, and its backups, which take its log and stand in for it when it
//! fails. At the start, partition `p`'s primary is node `p` and its backups are the next
//! `R - 1` nodes; recovery moves them (the engine's configuration holds the placement in
//! force). Not for: deciding moves (see the engine's membership).

use hytra_fabric::NodeId;

/// How far a backup is from holding everything its partition holds.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum BackupState {
    /// It has applied (or holds in its logs) every committed write: it can be promoted.
    Ready,
    /// It was added after a failure and is still being copied the partition's records;
    /// it takes the log already, but cannot be promoted until the copy is done.
    Syncing {
        /// The configuration epoch from which it takes the partition's log: it holds no
        /// entry of a transaction logged before.
        since: u64,
    },
}

impl BackupState {
    /// Whether it is still being copied.
    pub fn syncing(self) -> bool {
        matches!(self, BackupState::Syncing { .. })
    }

    /// Whether it takes the log of transactions logged in `epoch`.
    pub fn logs_from(self, epoch: u64) -> bool {
        match self {
            BackupState::Ready => true,
            BackupState::Syncing { since } => epoch >= since,
        }
    }
}

/// One partition's replicas.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PartitionPlace {
    /// The primary.
    pub primary: NodeId,
    /// The backups, each with its state.
    pub backups: Vec<(NodeId, BackupState)>,
    /// Times the primary moved: a location cached under another generation may name a
    /// record of the old primary's region layout.
    pub generation: u8,
}

/// Every partition's replicas.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Placement {
    parts: Vec<PartitionPlace>,
}

impl Placement {
    /// The placement at the start: partition `p`'s primary is node `p`, its backups the
    /// next `replication - 1` nodes.
    pub fn initial(nodes: u16, replication: u16) -> Placement {
        assert!(replication >= 1 && replication <= nodes, "{replication} copies on {nodes} nodes");
        let parts = (0..nodes)
            .map(|p| PartitionPlace {
                primary: NodeId(p),
                backups: (1..replication)
                    .map(|r| (NodeId((p + r) % nodes), BackupState::Ready))
                    .collect(),
                generation: 0,
            })
            .collect();
        Placement { parts }
    }

    /// A placement of the given partitions (checked by [`Placement::check`]).
    pub fn from_parts(parts: Vec<PartitionPlace>) -> Placement {
        Placement { parts }
    }

    /// Number of partitions.
    pub fn partitions(&self) -> u16 {
        self.parts.len() as u16
    }

    /// Partition `p`'s replicas.
    pub fn part(&self, p: u16) -> &PartitionPlace {
        &self.parts[usize::from(p)]
    }

    /// Every partition's replicas, by partition.
    pub fn parts(&self) -> &[PartitionPlace] {
        &self.parts
    }

    /// Partition `p`'s primary.
    pub fn primary(&self, p: u16) -> NodeId {
        self.parts[usize::from(p)].primary
    }

    /// Partition `p`'s backups (ready or syncing).
    pub fn backups(&self, p: u16) -> impl Iterator<Item = NodeId> + '_ {
        self.parts[usize::from(p)].backups.iter().map(|&(n, _)| n)
    }

    /// Whether `node` holds a replica of partition `p` (primary or backup).
    pub fn holds(&self, node: NodeId, p: u16) -> bool {
        let part = &self.parts[usize::from(p)];
        part.primary == node || part.backups.iter().any(|&(n, _)| n == node)
    }

    /// The partitions whose primary is `node`.
    pub fn primaries_of(&self, node: NodeId) -> impl Iterator<Item = u16> + '_ {
        (0..self.partitions()).filter(move |&p| self.primary(p) == node)
    }

    /// The partitions `node` holds a replica of.
    pub fn held_by(&self, node: NodeId) -> impl Iterator<Item = u16> + '_ {
        (0..self.partitions()).filter(move |&p| self.holds(node, p))
    }

    /// Checks that the placement fits a cluster of `nodes`: one entry per partition,
    /// every node in range, no node twice in one partition.
    pub fn check(&self, nodes: u16) -> Result<(), String> {
        if self.parts.len() != usize::from(nodes) {
            return Err(format!("{} partitions placed on {nodes} nodes", self.parts.len()));
        }
        for (p, part) in self.parts.iter().enumerate() {
            let mut seen = vec![part.primary];
            for &(b, _) in &part.backups {
                if seen.contains(&b) {
                    return Err(format!("partition {p}: {b} holds two replicas"));
                }
                seen.push(b);
            }
            if let Some(n) = seen.iter().find(|n| n.0 >= nodes) {
                return Err(format!("partition {p}: {n} is not a node of {nodes}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_placement_puts_backups_on_the_next_nodes() {
        let pl = Placement::initial(5, 3);
        assert_eq!(pl.check(5), Ok(()));
        for p in 0..5u16 {
            assert_eq!(pl.primary(p), NodeId(p));
            let b: Vec<NodeId> = pl.backups(p).collect();
            assert_eq!(b, vec![NodeId((p + 1) % 5), NodeId((p + 2) % 5)]);
            let holders = (0..5).filter(|&n| pl.holds(NodeId(n), p)).count();
            assert_eq!(holders, 3);
        }
        assert_eq!(pl.primaries_of(NodeId(3)).collect::<Vec<_>>(), vec![3]);
        assert_eq!(pl.held_by(NodeId(0)).collect::<Vec<_>>(), vec![0, 3, 4]);
        let one = Placement::initial(2, 1);
        assert_eq!(one.backups(1).count(), 0);
    }

    #[test]
    fn a_bad_placement_is_refused() {
        let mut parts = Placement::initial(3, 2).parts;
        parts[1].backups.push((NodeId(1), BackupState::Syncing { since: 2 }));
        assert!(Placement::from_parts(parts.clone()).check(3).is_err());
        parts[1].backups.pop();
        parts[2].primary = NodeId(7);
        assert!(Placement::from_parts(parts).check(3).is_err());
        assert!(Placement::initial(3, 2).check(4).is_err());
    }
}
