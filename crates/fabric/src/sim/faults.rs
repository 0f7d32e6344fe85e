//! Seeded fault injection for the simulator: what can go wrong, and when.
//!
//! Not for: deciding outcomes. The core draws from the fault generator at the points
//! where a fault could strike (a datagram leaving, a node event's time arriving).

use crate::ids::NodeId;

pub use crate::node_fault::{NodeFault, NodeFaultKind};

/// A network partition: during the window, what `side` and the rest of the cluster send
/// each other is lost, both ways or one way.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Partition {
    /// One side of the cut; the rest of the cluster is the other.
    pub side: Vec<NodeId>,
    /// Start, virtual nanoseconds.
    pub from_ns: u64,
    /// End (exclusive).
    pub until_ns: u64,
    /// Which way packets are lost.
    pub way: Way,
}

/// Which way a [`Partition`] cuts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Way {
    /// Neither side hears the other.
    Both,
    /// What `side` sends to the rest is lost; what the rest sends to `side` arrives (a
    /// one-way cut: a request may take effect and its answer be lost).
    FromSide,
}

impl Partition {
    /// Whether this partition, at `now_ns`, loses what `from` sends to `to`.
    fn cuts(&self, from: NodeId, to: NodeId, now_ns: u64) -> bool {
        if !(self.from_ns..self.until_ns).contains(&now_ns) {
            return false;
        }
        let (a, b) = (self.side.contains(&from), self.side.contains(&to));
        match self.way {
            Way::Both => a != b,
            Way::FromSide => a && !b,
        }
    }
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
    /// When a crash strikes.
    pub crash_timing: CrashTiming,
}

/// When a [`NodeFaultKind::Crash`] strikes on the simulator.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum CrashTiming {
    /// At its time: the node's NIC sends nothing from then on.
    #[default]
    AtTime,
    /// At the first WRITE of several packets its node sends from its time on (at most
    /// [`CRASH_WAIT_NS`] later, else then): the NIC dies after a number of that
    /// WRITE's packets drawn from the seed, as a host that loses power mid-transfer.
    /// The target holds a torn copy of what the WRITE carried, which is what recovery
    /// must cope with (docs/INVARIANTS.md R7).
    MidWrite,
}

/// How long a [`CrashTiming::MidWrite`] crash waits at most for a WRITE to tear.
pub const CRASH_WAIT_NS: u64 = 50_000;

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
            let restarts = self
                .node_faults
                .iter()
                .filter(|g| g.node == f.node && g.kind == NodeFaultKind::Restart)
                .count();
            if restarts >= crate::LIVES_MAX as usize {
                return Err(format!(
                    "{restarts} restarts of {}: at most {} a run",
                    f.node,
                    crate::LIVES_MAX - 1
                ));
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

    /// The first time from `now_ns` on at which what `from` sends `to` arrives
    /// (`now_ns` itself if it does).
    pub fn heals_at(&self, from: NodeId, to: NodeId, now_ns: u64) -> u64 {
        let mut t = now_ns;
        // Each window can end the search at most once: windows that cover `t` move it to
        // their end, and `t` only grows.
        for _ in 0..=self.partitions.len() {
            match self.partitions.iter().find(|p| p.cuts(from, to, t)) {
                Some(p) => t = p.until_ns,
                None => return t,
            }
        }
        unreachable!("partition windows cover {t} after moving past each of them")
    }

    /// The first time from `now_ns` on at which `a` and `b` hear each other both ways:
    /// when a request and its answer both arrive.
    pub fn round_trip_at(&self, a: NodeId, b: NodeId, now_ns: u64) -> u64 {
        let mut t = now_ns;
        // Each pass either ends or moves `t` past the end of at least one window.
        for _ in 0..=2 * self.partitions.len() {
            let there = self.heals_at(a, b, t);
            let back = self.heals_at(b, a, there);
            if back == there {
                return back;
            }
            t = back;
        }
        unreachable!("partition windows cover {t} after moving past each of them")
    }

    /// Whether what `from` sends `to` at `now_ns` is lost.
    pub fn cuts(&self, from: NodeId, to: NodeId, now_ns: u64) -> bool {
        self.partitions.iter().any(|p| p.cuts(from, to, now_ns))
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
            let what = match p.way {
                Way::Both => "partition",
                Way::FromSide => "one-way cut from",
            };
            parts.push(format!(
                "{what} [{}] {}-{} us",
                side.join(" "),
                us(p.from_ns),
                us(p.until_ns)
            ));
        }
        for d in &self.clock_drift {
            parts.push(format!("clock of {} {:+} ppm", d.node, d.ppm));
        }
        if self.crash_timing == CrashTiming::MidWrite {
            parts.push("crashes mid-write".to_string());
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}
