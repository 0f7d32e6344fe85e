//! A node that crashes while it sends a WRITE of several packets (docs/INVARIANTS.md
//! R7): the target holds the whole packets that left before the crash and nothing of
//! the rest, and nothing the node posted behind that WRITE lands.

use std::sync::Mutex;

use hytra_fabric::sim::faults::{CrashTiming, FaultConfig, NodeFault, NodeFaultKind};
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::testing::run_scripts;
use hytra_fabric::{
    Backend, ClusterShape, Completion, Endpoint, LocalAddr, NodeId, OpFlags, Qp, RegionSpec,
    RemoteAddr, Rkey, WorkRequest, WriteSrc,
};

/// Bytes of a packet in the simulator's model of a WRITE cut short.
const PACKET: usize = 256;

/// Where the WRITE behind the torn one goes.
const BEHIND_AT: u64 = 1 << 20;

/// What node 0 saw once node 1 was gone: the torn WRITE's range, and the word the WRITE
/// behind it aimed at.
struct Seen {
    words: Vec<u64>,
    behind: u64,
}

/// Runs node 1 posting, once `post_at_ns` has passed, a WRITE of `len` bytes (word `i`
/// holds `i + 1`) and an 8-byte WRITE behind it on the same connection, under `faults`;
/// returns what node 0 holds afterwards and how many requests were cut short and how
/// many failed.
fn tear(len: usize, post_at_ns: u64, faults: FaultConfig) -> (Seen, (u64, u64)) {
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let mut config = SimConfig::new(shape, 7);
    config.faults = faults;
    let mut b = SimCluster::new(config).unwrap();
    let data = b.register_all(RegionSpec::new(BEHIND_AT + 64)).unwrap();
    let seen = Mutex::new(None);
    run_scripts(&mut b, |ep| {
        let me = ep.me();
        let seen = &seen;
        let mut posted = false;
        move |ep: &mut _| {
            let ep: &mut <SimCluster as Backend>::Ep = ep;
            if me.node == NodeId(1) {
                if posted || ep.now_ns() < post_at_ns {
                    return false; // the crash ends this worker
                }
                posted = true;
                post_writes(ep, data, len);
                return false;
            }
            if ep.now_ns() < 2_000_000 {
                return false;
            }
            let r = ep.region(data).unwrap();
            let words = (0..len as u64 / 8).map(|i| r.load(i * 8)).collect();
            *seen.lock().unwrap() = Some(Seen { words, behind: r.load(BEHIND_AT) });
            true
        }
    });
    let stats = b.sim_run().stats;
    let counts = (stats.cut_short, stats.unreachable);
    (seen.into_inner().unwrap().expect("node 0 looked"), counts)
}

fn post_writes(ep: &mut impl Endpoint, data: Rkey, len: usize) {
    let r = ep.region(data).unwrap();
    for i in 0..len as u64 / 8 {
        r.store(i * 8, i + 1);
    }
    r.store(BEHIND_AT, 99);
    let to = |offset| RemoteAddr { node: NodeId(0), rkey: data, offset };
    let body = WorkRequest::Write {
        remote: to(0),
        src: WriteSrc::Local { addr: LocalAddr { rkey: data, offset: 0 }, len: len as u32 },
    };
    let behind = WorkRequest::Write {
        remote: to(BEHIND_AT),
        src: WriteSrc::Local { addr: LocalAddr { rkey: data, offset: BEHIND_AT }, len: 8 },
    };
    // One doorbell for both: the second is on the NIC's queue behind the first.
    ep.post(Qp::to(NodeId(0)), 1, &body, OpFlags::SIGNALED | OpFlags::MORE).unwrap();
    ep.post(Qp::to(NodeId(0)), 2, &behind, OpFlags::SIGNALED).unwrap();
    let mut c = [Completion::EMPTY; 2];
    assert_eq!(ep.poll_cq(&mut c), 0, "nothing completes at once");
}

/// Checks that `words` hold a prefix of whole packets of the WRITE, not all of it, and
/// nothing else; returns the prefix's bytes.
fn whole_packets(words: &[u64]) -> usize {
    let landed = words.iter().enumerate().take_while(|&(i, &w)| w == i as u64 + 1).count();
    assert!(words[landed..].iter().all(|&w| w == 0), "only a prefix landed: {words:?}");
    let bytes = landed * 8;
    assert_eq!(bytes % PACKET, 0, "{bytes} bytes landed: not whole packets");
    bytes
}

fn crash(at_ns: u64, timing: CrashTiming) -> FaultConfig {
    FaultConfig {
        node_faults: vec![NodeFault { node: NodeId(1), at_ns, kind: NodeFaultKind::Crash }],
        crash_timing: timing,
        ..FaultConfig::none()
    }
}

#[test]
fn a_crash_that_waits_for_a_write_tears_it_at_a_packet() {
    let len = 16 * PACKET;
    // The crash is due at 10 us; the node's first WRITE after it is at 20 us.
    let (seen, counts) = tear(len, 20_000, crash(10_000, CrashTiming::MidWrite));
    let bytes = whole_packets(&seen.words);
    assert!(bytes > 0 && bytes < len, "{bytes} of {len} bytes landed: not torn");
    assert_eq!(seen.behind, 0, "the WRITE behind the torn one landed");
    // The WRITE behind may have left before the cut (it fills a gap on the link) or
    // after it: it fails either way, and counts as cut short only in the second case.
    let (cut, failed) = counts;
    assert!((1..=2).contains(&cut), "{cut} requests cut short");
    assert_eq!(failed, 1, "the WRITE behind the torn one did not fail");
}

#[test]
fn a_crash_at_its_time_tears_the_write_on_the_link() {
    // 1 MiB takes about 80 us on the link: the crash at 40 us falls inside.
    let len = 1 << 20;
    let (seen, counts) = tear(len, 10_000, crash(40_000, CrashTiming::AtTime));
    let bytes = whole_packets(&seen.words);
    assert!(bytes > 0 && bytes < len, "{bytes} of {len} bytes landed: not torn");
    assert_eq!(seen.behind, 0, "the WRITE behind the torn one landed");
    // The WRITE behind may have left before the cut (it fills a gap on the link) or
    // after it: it fails either way, and counts as cut short only in the second case.
    let (cut, failed) = counts;
    assert!((1..=2).contains(&cut), "{cut} requests cut short");
    assert_eq!(failed, 1, "the WRITE behind the torn one did not fail");
}

#[test]
fn a_crash_that_finds_no_write_to_tear_strikes_when_its_wait_is_over() {
    // Node 1 posts nothing before the wait is over: the crash strikes then, and what it
    // posts later never runs.
    let late = 10_000 + hytra_fabric::sim::faults::CRASH_WAIT_NS + 1_000;
    let (seen, counts) = tear(4 * PACKET, late, crash(10_000, CrashTiming::MidWrite));
    assert_eq!(whole_packets(&seen.words), 0, "a dead node wrote");
    assert_eq!(seen.behind, 0, "a dead node wrote");
    assert_eq!(counts, (0, 0), "nothing was posted, nothing cut short");
}
