//! The cluster's configuration — its epoch, its members, and where every partition's
//! replicas live — and each node's view of the one in force.
//!
//! Every routing decision goes through a configuration: which node is a partition's
//! primary (reads, locks, write-backs) and which are its backups (logs). A node installs
//! a new configuration when recovery commits one; its workers pick it up at their next
//! transaction attempt (one atomic load of the epoch per attempt). Not for: deciding a
//! new configuration (see `recover.rs`).

use std::cell::{Ref, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hytra_fabric::NodeId;
use hytra_store::{BackupState, PartitionPlace, Placement};

/// The epoch of the configuration a cluster starts with.
pub const EPOCH_FIRST: u64 = 1;

/// A configuration: an epoch, the member nodes, and the placement of every partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Increases with every configuration that moves a route (members, primaries,
    /// backups); messages carry it, and a message from an older epoch is refused.
    pub epoch: u64,
    /// Increases with every configuration committed to the store, including those that
    /// only mark new backups ready (same epoch: nothing is routed otherwise, so nothing
    /// of the epoch stops). The store's compare-and-set is on it. Never below `epoch`.
    pub revision: u64,
    /// Per node, whether it is a member.
    members: Vec<bool>,
    /// Where every partition's replicas live (only on members).
    pub placement: Placement,
}

impl Config {
    /// The configuration a cluster of `nodes` starts with: every node a member, the
    /// initial placement with `replication` copies.
    pub fn initial(nodes: u16, replication: u16) -> Config {
        Config {
            epoch: EPOCH_FIRST,
            revision: EPOCH_FIRST,
            members: vec![true; usize::from(nodes)],
            placement: Placement::initial(nodes, replication),
        }
    }

    /// A configuration of `members` (per node) and `placement`, checked: the placement
    /// fits the cluster and names members only.
    pub fn new(epoch: u64, members: Vec<bool>, placement: Placement) -> Result<Config, String> {
        let nodes = members.len() as u16;
        placement.check(nodes)?;
        for (p, part) in placement.parts().iter().enumerate() {
            let named = std::iter::once(part.primary).chain(part.backups.iter().map(|&(n, _)| n));
            for n in named {
                if !members[usize::from(n.0)] {
                    return Err(format!("partition {p} placed on {n}, which is not a member"));
                }
            }
        }
        if !members.iter().any(|&m| m) {
            return Err("a configuration without members".into());
        }
        Ok(Config { epoch, revision: epoch, members, placement })
    }

    /// The same configuration as revision `revision` (at least its epoch).
    pub fn with_revision(mut self, revision: u64) -> Config {
        assert!(revision >= self.epoch, "revision {revision} below epoch {}", self.epoch);
        self.revision = revision;
        self
    }

    /// Nodes of the cluster (members or not).
    pub fn nodes(&self) -> u16 {
        self.members.len() as u16
    }

    /// Whether `node` is a member.
    pub fn is_member(&self, node: NodeId) -> bool {
        self.members.get(usize::from(node.0)).copied().unwrap_or(false)
    }

    /// The members, in node order.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes()).map(NodeId).filter(|&n| self.is_member(n))
    }

    /// The configuration manager: the lowest member.
    pub fn manager(&self) -> NodeId {
        self.members().next().expect("a configuration has members")
    }

    /// Partition `p`'s primary.
    pub fn primary(&self, p: u16) -> NodeId {
        self.placement.primary(p)
    }

    /// The partition that would keep the fewest copies if `dead` failed, and how many
    /// it would keep. Recovery decides the transactions in doubt from a surviving
    /// backup's log, so a failure is survivable when every partition keeps two.
    pub fn fewest_copies_without(&self, dead: &[NodeId]) -> (u16, usize) {
        let parts = self.placement.parts().iter().enumerate();
        let left = parts.map(|(p, part)| {
            let copies = std::iter::once(part.primary).chain(part.backups.iter().map(|&(n, _)| n));
            (p as u16, copies.filter(|n| !dead.contains(n)).count())
        });
        left.min_by_key(|&(_, n)| n).expect("a configuration places at least one partition")
    }
}

/// Why bytes did not decode as a configuration.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConfigDecodeError;

impl Config {
    /// The configuration as bytes (little endian): epoch, revision, node count, a member bitmap,
    /// then per partition its primary, generation, backup count and backups (node, with
    /// bit 15 set for a syncing backup, which the epoch it syncs since follows).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.revision.to_le_bytes());
        out.extend_from_slice(&self.nodes().to_le_bytes());
        for chunk in self.members.chunks(8) {
            out.push(chunk.iter().enumerate().fold(0u8, |b, (i, &m)| b | u8::from(m) << i));
        }
        for part in self.placement.parts() {
            out.extend_from_slice(&part.primary.0.to_le_bytes());
            out.push(part.generation);
            out.push(part.backups.len() as u8);
            for &(n, state) in &part.backups {
                match state {
                    BackupState::Ready => out.extend_from_slice(&n.0.to_le_bytes()),
                    BackupState::Syncing { since } => {
                        out.extend_from_slice(&(n.0 | 1 << 15).to_le_bytes());
                        out.extend_from_slice(&since.to_le_bytes());
                    }
                }
            }
        }
    }

    /// Reads what [`Config::encode`] wrote, checked like [`Config::new`].
    pub fn decode(b: &[u8]) -> Result<Config, ConfigDecodeError> {
        let mut i = 0usize;
        let mut take = |n: usize| -> Result<&[u8], ConfigDecodeError> {
            let s = b.get(i..i + n).ok_or(ConfigDecodeError)?;
            i += n;
            Ok(s)
        };
        let epoch = u64::from_le_bytes(take(8)?.try_into().expect("eight bytes"));
        let revision = u64::from_le_bytes(take(8)?.try_into().expect("eight bytes"));
        if revision < epoch {
            return Err(ConfigDecodeError);
        }
        let nodes = u16::from_le_bytes(take(2)?.try_into().expect("two bytes"));
        if nodes == 0 || nodes > hytra_fabric::constants::NODES_MAX {
            return Err(ConfigDecodeError);
        }
        let bitmap = take(usize::from(nodes).div_ceil(8))?.to_vec();
        let members = (0..usize::from(nodes)).map(|n| bitmap[n / 8] >> (n % 8) & 1 == 1).collect();
        let mut parts = Vec::with_capacity(usize::from(nodes));
        for _ in 0..nodes {
            let primary = NodeId(u16::from_le_bytes(take(2)?.try_into().expect("two bytes")));
            let head = take(2)?;
            let (generation, count) = (head[0], head[1]);
            let mut backups = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let w = u16::from_le_bytes(take(2)?.try_into().expect("two bytes"));
                let state = if w & 1 << 15 != 0 {
                    let since = u64::from_le_bytes(take(8)?.try_into().expect("eight bytes"));
                    BackupState::Syncing { since }
                } else {
                    BackupState::Ready
                };
                backups.push((NodeId(w & !(1 << 15)), state));
            }
            parts.push(PartitionPlace { primary, backups, generation });
        }
        if i != b.len() {
            return Err(ConfigDecodeError);
        }
        let c = Config::new(epoch, members, Placement::from_parts(parts));
        Ok(c.map_err(|_| ConfigDecodeError)?.with_revision(revision))
    }
}

/// A node's view of the configuration in force, shared by its workers (threads on real
/// backends).
pub struct Membership {
    /// The installed configuration's epoch, read by every attempt.
    epoch: AtomicU64,
    /// The installed configuration's revision, read by every worker's view.
    revision: AtomicU64,
    config: Mutex<Arc<Config>>,
}

impl Membership {
    /// A view that starts with `config`.
    pub fn new(config: Config) -> Membership {
        Membership {
            epoch: AtomicU64::new(config.epoch),
            revision: AtomicU64::new(config.revision),
            config: Mutex::new(Arc::new(config)),
        }
    }

    /// The epoch in force.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The revision in force.
    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Config> {
        self.config.lock().expect("no installer panicked").clone()
    }

    /// Installs a newer configuration (a later revision); an older or equal one is
    /// ignored. Returns whether it was installed.
    pub fn install(&self, config: Arc<Config>) -> bool {
        let mut current = self.config.lock().expect("no installer panicked");
        // A later revision never has an older epoch (the store orders both); one that
        // claims so did not come from the store.
        if config.revision <= current.revision || config.epoch < current.epoch {
            return false;
        }
        assert_eq!(config.nodes(), current.nodes(), "a configuration of another cluster");
        self.epoch.store(config.epoch, Ordering::Release);
        self.revision.store(config.revision, Ordering::Release);
        *current = config;
        true
    }
}

/// One worker's copy of its node's configuration, refreshed when the epoch moves: the
/// hot paths read it without a lock.
pub(crate) struct View {
    membership: Arc<Membership>,
    cached: RefCell<Arc<Config>>,
}

impl View {
    pub(crate) fn new(membership: Arc<Membership>) -> View {
        let cached = RefCell::new(membership.current());
        View { membership, cached }
    }

    /// The configuration in force (refreshed first if a newer one was installed, of a
    /// later epoch or a later revision of the same).
    pub(crate) fn get(&self) -> Ref<'_, Arc<Config>> {
        if self.cached.borrow().revision != self.membership.revision() {
            *self.cached.borrow_mut() = self.membership.current();
        }
        self.cached.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_follows_installed_configurations_and_ignores_older_ones() {
        let m = Arc::new(Membership::new(Config::initial(4, 3)));
        let view = View::new(m.clone());
        assert_eq!(view.get().epoch, EPOCH_FIRST);
        assert_eq!(view.get().manager(), NodeId(0));
        let mut members = vec![true; 4];
        members[0] = false;
        let mut parts = Placement::initial(4, 3).parts().to_vec();
        for part in &mut parts {
            if part.primary == NodeId(0) {
                part.primary = part.backups.remove(0).0;
            }
            part.backups.retain(|&(n, _)| n != NodeId(0));
        }
        let next = Config::new(2, members, Placement::from_parts(parts)).unwrap();
        assert!(m.install(Arc::new(next.clone())));
        assert_eq!(view.get().epoch, 2);
        assert_eq!(view.get().manager(), NodeId(1));
        assert_eq!(view.get().primary(0), NodeId(1));
        assert!(!m.install(Arc::new(Config::initial(4, 3))), "an older epoch");
        assert_eq!(m.epoch(), 2);
    }

    #[test]
    fn a_configuration_travels_as_bytes_and_a_cut_one_is_refused() {
        let mut parts = Placement::initial(5, 3).parts().to_vec();
        parts[2].backups[1].1 = BackupState::Syncing { since: 4 };
        parts[4].generation = 7;
        let mut members = vec![true; 5];
        members[4] = false;
        for part in &mut parts {
            part.backups.retain(|&(n, _)| n != NodeId(4));
            if part.primary == NodeId(4) {
                part.primary = part.backups.remove(0).0;
            }
        }
        let c = Config::new(9, members, Placement::from_parts(parts)).unwrap();
        let mut b = Vec::new();
        c.encode(&mut b);
        assert_eq!(Config::decode(&b), Ok(c));
        for cut in [0, 1, 9, b.len() - 1] {
            assert!(Config::decode(&b[..cut]).is_err(), "{cut} bytes");
        }
        b.push(0);
        assert!(Config::decode(&b).is_err(), "a trailing byte");
    }

    #[test]
    fn a_configuration_places_partitions_on_members_only() {
        let mut members = vec![true; 3];
        members[2] = false;
        let err = Config::new(2, members, Placement::initial(3, 2)).unwrap_err();
        assert!(err.contains("not a member"), "{err}");
        assert!(Config::new(2, vec![false; 3], Placement::initial(3, 1)).is_err());
    }

    #[test]
    fn copies_left_count_every_replica_of_the_worst_partition() {
        let c = Config::initial(6, 3); // partition p on p, p+1, p+2
        assert_eq!(c.fewest_copies_without(&[]).1, 3);
        assert_eq!(c.fewest_copies_without(&[NodeId(2)]).1, 2);
        // 0 and 3 share no partition; 2 and 3 share partitions 1, 2 and 3.
        assert_eq!(c.fewest_copies_without(&[NodeId(0), NodeId(3)]).1, 2);
        assert_eq!(c.fewest_copies_without(&[NodeId(2), NodeId(3)]), (1, 1));
        assert_eq!(Config::initial(3, 2).fewest_copies_without(&[NodeId(1)]).1, 1);
    }
}
