//! Seeded fault injection for the simulator: what can go wrong, and when.
//!
//! Not for: deciding outcomes. The core draws from the fault generator at the points
//! where a fault could strike (a datagram leaving, a node event's time arriving).

use crate::ids::NodeId;

pub use crate::node_fault::{NodeFault, NodeFaultKind};

/// A network partition: nodes in `side` cannot talk to the others during the window.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Partition {
    /// One side of the cut; the rest of the cluster is the other.
    pub side: Vec<NodeId>,
    /// Start, virtual nanoseconds.
    pub from_ns: u64,
    /// End (exclusive).
    pub until_ns: u64,
}

/// Faults to inject; probabilities in parts per million per datagram.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct FaultConfig {
    /// Datagrams lost.
    pub loss_ppm: u32,
    /// Datagrams delivered twice.
    pub duplicate_ppm: u32,
    /// Datagrams held back by a uniform delay in `0..reorder_window_ns`, so that later
    /// ones overtake them.
    pub reorder_ppm: u32,
    /// Window of the reordering delay.
    pub reorder_window_ns: u64,
    /// Datagrams delayed by `delay_ns` (a congestion spike long enough to trip timeouts).
    pub delay_ppm: u32,
    /// Length of such a delay.
    pub delay_ns: u64,
    /// Node pauses and crashes.
    pub node_faults: Vec<NodeFault>,
    /// Partitions.
    pub partitions: Vec<Partition>,
    /// Nodes whose clocks run fast or slow.
    pub clock_drift: Vec<ClockDrift>,
}

/// A node whose clock runs fast (positive) or slow against true time: what it reads
/// from its clock and the timers it sets. Faults, partitions and the run's window are in
/// true time.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ClockDrift {
    /// The node.
    pub node: NodeId,
    /// Parts per million its clock gains (or, negative, loses) against true time.
    pub ppm: i32,
}

/// The largest drift a clock may have: a tenth, far beyond any crystal's, so that the
/// margins the engine keeps for drift can be tested past their limit.
pub const CLOCK_DRIFT_PPM_MAX: i32 = 100_000;

impl FaultConfig {
    /// No faults.
    pub fn none() -> Self {
        FaultConfig::default()
    }

    /// Lossy, reordering, delaying network at `loss_ppm`, with the other datagram faults
    /// at the same rate: the standard chaos setting of the tests.
    pub fn lossy(loss_ppm: u32) -> Self {
        FaultConfig {
            loss_ppm,
            duplicate_ppm: loss_ppm,
            reorder_ppm: loss_ppm,
            reorder_window_ns: 20_000,
            delay_ppm: loss_ppm,
            delay_ns: 200_000,
            ..FaultConfig::default()
        }
    }

    /// Whether any datagram fault is possible (so the generator is consulted at all).
    pub fn datagram_faults(&self) -> bool {
        self.loss_ppm + self.duplicate_ppm + self.reorder_ppm + self.delay_ppm > 0
    }

    /// Checks ranges against the cluster size.
    pub fn validate(&self, nodes: u16) -> Result<(), String> {
        for p in [self.loss_ppm, self.duplicate_ppm, self.reorder_ppm, self.delay_ppm] {
            if p > 1_000_000 {
                return Err(format!("fault probability {p} ppm exceeds 1000000"));
            }
        }
        for f in &self.node_faults {
            if f.node.0 >= nodes {
                return Err(format!("fault on {} but the cluster has {nodes} nodes", f.node));
            }
        }
        for p in &self.partitions {
            if p.side.iter().any(|n| n.0 >= nodes) || p.from_ns >= p.until_ns {
                return Err(format!("bad partition {p:?}"));
            }
        }
        for (i, d) in self.clock_drift.iter().enumerate() {
            if d.node.0 >= nodes {
                return Err(format!("clock drift on {} but the cluster has {nodes} nodes", d.node));
            }
            if d.ppm.abs() > CLOCK_DRIFT_PPM_MAX {
                return Err(format!(
                    "clock drift of {} ppm on {}: at most {CLOCK_DRIFT_PPM_MAX} either way",
                    d.ppm, d.node
                ));
            }
            if self.clock_drift[..i].iter().any(|e| e.node == d.node) {
                return Err(format!("two clock drifts on {}", d.node));
            }
        }
        Ok(())
    }

    /// The first time from `now_ns` on at which `a` and `b` are not cut off from each
    /// other (`now_ns` itself if they are not).
    pub fn heals_at(&self, a: NodeId, b: NodeId, now_ns: u64) -> u64 {
        let mut t = now_ns;
        // Each window can end the search at most once: windows that cover `t` move it to
        // their end, and `t` only grows.
        for _ in 0..=self.partitions.len() {
            match self.partitions.iter().find(|p| {
                (p.from_ns..p.until_ns).contains(&t) && (p.side.contains(&a) != p.side.contains(&b))
            }) {
                Some(p) => t = p.until_ns,
                None => return t,
            }
        }
        unreachable!("partition windows cover {t} after moving past each of them")
    }

    /// Whether `a` and `b` are cut off from each other at `now_ns`.
    pub fn partitioned(&self, a: NodeId, b: NodeId, now_ns: u64) -> bool {
        self.partitions.iter().any(|p| {
            (p.from_ns..p.until_ns).contains(&now_ns)
                && (p.side.contains(&a) != p.side.contains(&b))
        })
    }
}

/// One line for reports (`hytra bench`'s header, the swarm's configurations): `none`,
/// or each fault that is set, times in microseconds.
impl std::fmt::Display for FaultConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let us = |ns: u64| ns / 1000;
        if self.loss_ppm > 0 {
            parts.push(format!("loss {} ppm", self.loss_ppm));
        }
        if self.duplicate_ppm > 0 {
            parts.push(format!("dup {} ppm", self.duplicate_ppm));
        }
        if self.reorder_ppm > 0 {
            parts.push(format!(
                "reorder {} ppm within {} us",
                self.reorder_ppm,
                us(self.reorder_window_ns)
            ));
        }
        if self.delay_ppm > 0 {
            parts.push(format!("delay {} ppm by {} us", self.delay_ppm, us(self.delay_ns)));
        }
        parts.extend(self.node_faults.iter().map(NodeFault::to_string));
        for p in &self.partitions {
            let side: Vec<String> = p.side.iter().map(|n| n.to_string()).collect();
            parts.push(format!(
                "partition [{}] {}-{} us",
                side.join(" "),
                us(p.from_ns),
                us(p.until_ns)
            ));
        }
        for d in &self.clock_drift {
            parts.push(format!("clock of {} {:+} ppm", d.node, d.ppm));
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}
