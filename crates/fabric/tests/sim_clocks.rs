//! Drifting clocks in the simulator: a node reads its own clock, fast or slow against
//! true time, and its timers fire when that clock reaches their reading.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hytra_fabric::sim::faults::{ClockDrift, FaultConfig};
use hytra_fabric::sim::{SimCluster, SimConfig, SimEndpoint};
use hytra_fabric::{Backend, ClusterShape, Endpoint, NodeId, Program, RunLimits, Step};

const MS: u64 = 1_000_000;
/// Every node sleeps until its own clock reads this.
const END_NS: u64 = 10 * MS;

/// Sleeps from timer to timer (`every_ns` apart on its own clock) until its clock reads
/// [`END_NS`]; node 0's also publishes each reading as true time (its clock is true).
struct Sleeper {
    ep: SimEndpoint,
    every_ns: u64,
    next_ns: u64,
    true_now: Arc<AtomicU64>,
    /// (true time, own clock) when it woke for the last timer.
    ended: Arc<[AtomicU64; 2]>,
    late_ns: u64,
    done: bool,
}

impl Program for Sleeper {
    fn step(&mut self) -> Step {
        let now = self.ep.now_ns();
        if self.ep.me().node == NodeId(0) {
            self.true_now.store(now, Ordering::Relaxed);
        }
        if now >= self.next_ns {
            // A timer fires once its node's clock reaches it, not before and not later.
            self.late_ns = self.late_ns.max(now - self.next_ns);
            if self.next_ns >= END_NS && !self.done {
                self.done = true;
                self.ended[0].store(self.true_now.load(Ordering::Relaxed), Ordering::Relaxed);
                self.ended[1].store(now, Ordering::Relaxed);
            }
            self.next_ns += self.every_ns;
        }
        Step::Idle { wake_at_ns: Some(self.next_ns), progressed: true }
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

#[test]
fn a_drifting_node_reads_its_own_clock_and_its_timers_follow_it() {
    let shape = ClusterShape { nodes: 3, workers_per_node: 1, lanes_per_peer: 1 };
    let mut config = SimConfig::new(shape, 3);
    config.faults = FaultConfig {
        clock_drift: vec![
            ClockDrift { node: NodeId(1), ppm: 50_000 },
            ClockDrift { node: NodeId(2), ppm: -50_000 },
        ],
        ..FaultConfig::none()
    };
    let mut b = SimCluster::new(config).unwrap();
    let true_now = Arc::new(AtomicU64::new(0));
    let ended: Vec<Arc<[AtomicU64; 2]>> =
        (0..3).map(|_| Arc::new([AtomicU64::new(0), AtomicU64::new(0)])).collect();
    let (sleepers, stats) = b
        .run(
            |ep| {
                let node = usize::from(ep.me().node.0);
                // Node 0 ticks every microsecond: the true time the others are read against.
                let every_ns = if node == 0 { 1_000 } else { MS };
                Sleeper {
                    ep,
                    every_ns,
                    next_ns: every_ns,
                    true_now: true_now.clone(),
                    ended: ended[node].clone(),
                    late_ns: 0,
                    done: false,
                }
            },
            |s| s.late_ns,
            RunLimits { time_limit_ns: 100 * MS },
        )
        .unwrap();
    assert!(stats.all_done);
    for (node, late) in sleepers.iter().enumerate() {
        assert!(*late <= 1, "node {node}'s timers fired {late} ns late");
    }
    let at = |n: usize| (ended[n][0].load(Ordering::Relaxed), ended[n][1].load(Ordering::Relaxed));
    // Node 1 gains 5%: its clock reads 10 ms at 10/1.05 ms of true time; node 2 loses 5%.
    for (node, ppm) in [(1usize, 50_000i64), (2, -50_000)] {
        let (true_ns, own_ns) = at(node);
        assert_eq!(own_ns, END_NS, "node {node} woke at its own {own_ns} ns");
        let expected = END_NS as f64 * 1e6 / (1e6 + ppm as f64);
        assert!(
            (true_ns as f64 - expected).abs() <= 1_000.0,
            "node {node} ended at {true_ns} ns of true time, expected {expected:.0}"
        );
    }
    // The run lasts as long as the slowest clock needs.
    assert!(stats.elapsed_ns >= at(2).0, "{} < {}", stats.elapsed_ns, at(2).0);
}

#[test]
fn drifts_out_of_range_or_on_missing_nodes_are_refused() {
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    for drift in [
        vec![ClockDrift { node: NodeId(2), ppm: 10 }],
        vec![ClockDrift { node: NodeId(1), ppm: 100_001 }],
        vec![ClockDrift { node: NodeId(1), ppm: -100_001 }],
        vec![ClockDrift { node: NodeId(1), ppm: 5 }, ClockDrift { node: NodeId(1), ppm: 6 }],
    ] {
        let mut config = SimConfig::new(shape, 1);
        config.faults.clock_drift = drift.clone();
        assert!(SimCluster::new(config).is_err(), "{drift:?} accepted");
    }
}
