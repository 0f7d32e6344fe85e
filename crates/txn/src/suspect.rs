//! Suspicion: a node whose requests to a live member keep failing (its connections broke:
//! a network cut longer than the transport's retries) cannot wait for a lease to lapse,
//! since both sides still renew theirs; its transactions stay frozen until a
//! reconfiguration. Each node notes the members its requests found unreachable; a
//! suspicion that still stands two leases later (a crashed node is removed by its lapsed
//! lease long before that, so crashes are handled as without suspicion) goes to the
//! manager with the lease renewals, and the manager removes the fewest members that
//! leave no suspicion standing between two members (of a pair, the higher id goes, so
//! of a pair with the manager the other member). If that is the manager itself (cut
//! off from most members), it steps down: it stops, and the members take over from it
//! as from a dead one.
//!
//! Not for: detecting crashes (leases do), or deciding anything but whom to remove.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use hytra_fabric::NodeId;

use crate::membership::Config;

/// How long a suspicion must stand, in leases, before it is reported.
pub const SUSPICION_LEASES: u64 = 2;

/// The suspicions of one node: its own, and, as manager, those its members reported.
#[derive(Default)]
pub struct Suspicions {
    /// Own: per suspected node, the epoch and the time (this node's clock) since when.
    own: Mutex<BTreeMap<NodeId, (u64, u64)>>,
    /// Manager: (epoch, from, of) as reported.
    reported: Mutex<BTreeSet<(u64, NodeId, NodeId)>>,
    /// Manager: the epoch and time (its clock) of the first suspicion it held in it.
    first: Mutex<Option<(u64, u64)>>,
}

impl Suspicions {
    /// This node's request to `node` failed at `now` in `epoch`. A suspicion of an older
    /// epoch starts over; one of this epoch keeps its start.
    pub fn note(&self, node: NodeId, epoch: u64, now: u64) {
        let mut own = self.own.lock().expect("no suspicion holder panicked");
        let e = own.entry(node).or_insert((epoch, now));
        if e.0 < epoch {
            *e = (epoch, now);
        }
    }

    /// This node's suspicions of `epoch` that have stood for `age_ns` by `now`.
    pub fn standing(&self, epoch: u64, now: u64, age_ns: u64) -> Vec<NodeId> {
        let mut own = self.own.lock().expect("no suspicion holder panicked");
        own.retain(|_, &mut (e, _)| e >= epoch);
        own.iter()
            .filter(|&(_, &(e, since))| e == epoch && now.saturating_sub(since) >= age_ns)
            .map(|(&n, _)| n)
            .collect()
    }

    /// Manager: member `from` reports, in `epoch`, that it suspects `of`.
    pub fn report(&self, epoch: u64, from: NodeId, of: impl Iterator<Item = NodeId>) {
        let mut reported = self.reported.lock().expect("no suspicion holder panicked");
        reported.extend(of.filter(|&n| n != from).map(|n| (epoch, from, n)));
    }

    /// Manager of `cfg`, at `now`: the members to remove so that no suspicion between two
    /// members of `cfg` stands, the reported ones and `own` (this manager's standing
    /// ones); the manager among them if it is the one most suspicions touch. Nothing
    /// until `settle_ns` after the first suspicion of the epoch, so that the reports of
    /// one cut, which come with renewals spread over a turn, are judged together (one
    /// alone is a tie that could name the wrong side).
    pub fn to_remove(&self, cfg: &Config, own: &[NodeId], now: u64, settle_ns: u64) -> Vec<NodeId> {
        let me = cfg.manager();
        let mut reported = self.reported.lock().expect("no suspicion holder panicked");
        reported.retain(|&(e, ..)| e >= cfg.epoch);
        let pairs: Vec<(NodeId, NodeId)> = reported
            .iter()
            .filter(|&&(e, ..)| e == cfg.epoch)
            .map(|&(_, a, b)| (a, b))
            .chain(own.iter().map(|&n| (me, n)))
            .filter(|&(a, b)| a != b && cfg.is_member(a) && cfg.is_member(b))
            .collect();
        if pairs.is_empty() {
            return Vec::new();
        }
        let mut first = self.first.lock().expect("no suspicion holder panicked");
        let since = match *first {
            Some((e, at)) if e == cfg.epoch => at,
            _ => first.insert((cfg.epoch, now)).1,
        };
        if now < since + settle_ns {
            return Vec::new();
        }
        cover(&pairs)
    }
}

/// The fewest nodes (greedily) that touch every pair: the node in the most pairs first,
/// on a tie the highest id (the manager is the lowest, and the lowest members take over
/// from it).
fn cover(pairs: &[(NodeId, NodeId)]) -> Vec<NodeId> {
    let mut left: Vec<(NodeId, NodeId)> = pairs.to_vec();
    let mut out = Vec::new();
    // Every round takes at least one pair out.
    for _ in 0..=pairs.len() {
        if left.is_empty() {
            break;
        }
        let mut degree: BTreeMap<NodeId, usize> = BTreeMap::new();
        for &(a, b) in &left {
            *degree.entry(a).or_default() += 1;
            *degree.entry(b).or_default() += 1;
        }
        let pick = degree
            .iter()
            .max_by_key(|&(&n, &d)| (d, n))
            .map(|(&n, _)| n)
            .expect("a pair left has nodes");
        out.push(pick);
        left.retain(|&(a, b)| a != pick && b != pick);
    }
    assert!(left.is_empty(), "every pair covered");
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u16) -> NodeId {
        NodeId(i)
    }

    #[test]
    fn a_node_cut_off_from_everyone_is_the_one_removed() {
        // Node 4 cut off: it suspects every other node, and every other node it.
        let mut pairs = Vec::new();
        for i in [0, 1, 2, 3, 5] {
            pairs.push((n(4), n(i)));
            pairs.push((n(i), n(4)));
        }
        assert_eq!(cover(&pairs), vec![n(4)]);
        // The manager cut off: it goes (and steps down), not every member.
        let mut pairs = Vec::new();
        for i in 1..6 {
            pairs.push((n(0), n(i)));
            pairs.push((n(i), n(0)));
        }
        assert_eq!(cover(&pairs), vec![n(0)]);
    }

    #[test]
    fn of_a_pair_with_the_manager_the_other_goes_and_of_two_members_the_higher() {
        assert_eq!(cover(&[(n(2), n(0)), (n(0), n(2))]), vec![n(2)]);
        assert_eq!(cover(&[(n(1), n(3)), (n(3), n(1))]), vec![n(3)]);
        // Two broken links sharing node 2: it alone goes.
        assert_eq!(cover(&[(n(1), n(2)), (n(2), n(3))]), vec![n(2)]);
        assert!(cover(&[]).is_empty());
    }

    #[test]
    fn a_suspicion_reports_only_once_it_stood_long_enough_and_only_in_its_epoch() {
        let s = Suspicions::default();
        s.note(n(3), 1, 100);
        s.note(n(3), 1, 150); // keeps its start
        assert!(s.standing(1, 150, 100).is_empty());
        assert_eq!(s.standing(1, 200, 100), vec![n(3)]);
        // A newer epoch: the old suspicion is gone.
        assert!(s.standing(2, 1_000, 100).is_empty());
        s.note(n(3), 2, 1_000);
        assert_eq!(s.standing(2, 1_100, 100), vec![n(3)]);
    }
}
