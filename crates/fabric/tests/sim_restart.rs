//! Restarting a crashed node in the simulator: its memory is wiped, its workers get new
//! programs of the next incarnation, one-sided requests between it and the others fail
//! until both sides admit each other while datagrams pass, and the programs of its
//! earlier life are finished too.

use hytra_fabric::sim::faults::{FaultConfig, NodeFault, NodeFaultKind};
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{
    Backend, ClusterShape, Completion, Endpoint, NodeId, OpFlags, Program, Qp, RegionSpec,
    RemoteAddr, Rkey, RunLimits, Status, Step, WorkRequest, WorkerId, WriteSrc,
};

const CRASH_NS: u64 = 5_000;
const END_NS: u64 = 2_000_000;
/// What node 0 writes, and where in node 1's region: before the crash, between the
/// restart and node 1's admission of it, after that.
const WRITES: [(u64, u64); 3] = [(0, 7), (8, 9), (16, 11)];

/// Node 0: WRITE 7 to node 1, then after the crash WRITE 9 (node 1 is not connected) and
/// say hello by datagram until node 1 answers it admitted node 0, then admit it back and
/// WRITE 11. Node 1 (each life): answers a hello by admitting node 0 and saying so.
struct Script {
    ep: <SimCluster as Backend>::Ep,
    key: Rkey,
    /// Node 0: writes posted, and their statuses.
    posted: usize,
    statuses: Vec<Status>,
    in_flight: bool,
    admitted: bool,
    done: bool,
}

impl Script {
    fn new(ep: <SimCluster as Backend>::Ep, key: Rkey) -> Script {
        let statuses = Vec::new();
        Script { ep, key, posted: 0, statuses, in_flight: false, admitted: false, done: false }
    }

    fn write(&mut self, k: usize) {
        let (offset, value) = WRITES[k];
        let bytes = value.to_le_bytes();
        let remote = RemoteAddr { node: NodeId(1), rkey: self.key, offset };
        let wr = WorkRequest::Write { remote, src: WriteSrc::Bytes(&bytes) };
        self.ep
            .post(Qp::to(NodeId(1)), k as u64, &wr, OpFlags::SIGNALED | OpFlags::INLINE)
            .expect("room for one WRITE");
        self.posted += 1;
        self.in_flight = true;
    }
}

impl Program for Script {
    fn step(&mut self) -> Step {
        let now = self.ep.now_ns();
        let mut buf = [0u8; 16];
        let hello = WorkerId { node: NodeId(1), index: 0 };
        if self.ep.me().node == NodeId(1) {
            while let Some((from, _)) = self.ep.recv(&mut buf) {
                assert!(self.ep.admit(from.node), "the simulator admits");
                self.ep.send(from, b"in", OpFlags::NONE).expect("room for an answer");
            }
            self.done = now >= END_NS;
            return Step::Idle { wake_at_ns: Some(END_NS), progressed: false };
        }
        let mut out = [Completion::EMPTY; 4];
        let n = self.ep.poll_cq(&mut out);
        if n > 0 {
            self.statuses.extend(out[..n].iter().map(|c| c.status));
            self.in_flight = false;
        }
        while let Some((from, _)) = self.ep.recv(&mut buf) {
            // A connection needs both sides: node 0 admits the new life back.
            assert!(self.ep.admit(from.node));
            self.admitted = true;
        }
        if !self.in_flight {
            match self.posted {
                0 => self.write(0),
                1 if now > CRASH_NS + 200_000 => self.write(1),
                1 => {}
                2 if self.admitted => self.write(2),
                2 => {
                    let _ = self.ep.send(hello, b"hi", OpFlags::NONE);
                }
                _ => self.done = true,
            }
        }
        Step::Idle { wake_at_ns: Some(now + 10_000), progressed: n > 0 }
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

#[test]
fn a_restarted_node_comes_back_wiped_and_reconnects_only_when_admitted() {
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let faults = FaultConfig {
        node_faults: vec![
            NodeFault { node: NodeId(1), at_ns: CRASH_NS, kind: NodeFaultKind::Crash },
            // Before the transport's timeout: it waits for it.
            NodeFault { node: NodeId(1), at_ns: CRASH_NS + 1, kind: NodeFaultKind::Restart },
        ],
        ..FaultConfig::default()
    };
    let mut b = SimCluster::new(SimConfig { faults, ..SimConfig::new(shape, 3) }).unwrap();
    let key = b.register_all(RegionSpec::new(64)).unwrap();
    let (results, stats) = b
        .run(
            |ep| Script::new(ep, key),
            |s| (s.ep.me().node, s.ep.incarnation(), s.statuses),
            RunLimits { time_limit_ns: 10 * END_NS },
        )
        .unwrap();
    assert!(stats.all_done, "the restarted node's new program finished");
    assert!(stats.crashed.is_empty(), "node 1 is up at the end: {:?}", stats.crashed);
    // Both workers' programs of their last lives, then node 1's first.
    let lives: Vec<(NodeId, u32)> = results.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(lives, vec![(NodeId(0), 0), (NodeId(1), 1), (NodeId(1), 0)]);
    let statuses = &results[0].2;
    assert_eq!(
        statuses,
        &vec![Status::Success, Status::Unreachable, Status::Success],
        "before the crash a WRITE lands, before admission it fails, after it lands"
    );
    let region = b.region(NodeId(1), key).unwrap();
    let words: Vec<u64> = WRITES.iter().map(|&(off, _)| region.load(off)).collect();
    assert_eq!(words, vec![0, 0, 11], "the restart wiped what landed before it");
}

#[test]
fn a_restart_of_a_node_that_never_crashed_does_nothing() {
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let faults = FaultConfig {
        node_faults: vec![NodeFault {
            node: NodeId(1),
            at_ns: CRASH_NS,
            kind: NodeFaultKind::Restart,
        }],
        ..FaultConfig::default()
    };
    let mut b = SimCluster::new(SimConfig { faults, ..SimConfig::new(shape, 3) }).unwrap();
    let key = b.register_all(RegionSpec::new(64)).unwrap();
    let (results, stats) = b
        .run(
            |ep| Script::new(ep, key),
            |s| (s.ep.incarnation(), s.statuses),
            RunLimits { time_limit_ns: 10 * END_NS },
        )
        .unwrap();
    assert!(stats.all_done);
    assert_eq!(results.len(), 2, "no program was replaced");
    assert!(results.iter().all(|r| r.0 == 0));
    assert_eq!(results[0].1, vec![Status::Success; 3], "nothing stood in node 0's way");
    assert_eq!(b.region(NodeId(1), key).unwrap().load(0), 7);
}
