//! What the simulator shows of one-sided requests that real NICs show too: a READ or
//! WRITE longer than a cache line takes effect line by line, so a READ racing a WRITE can
//! return a torn mix (M2); a connection still applies its requests in order (R1) and
//! completes them in order, unsignaled ones included; and a partition that heals within
//! the transport's retry time only delays requests.

use std::sync::atomic::{AtomicU64, Ordering};

use hytra_fabric::sim::faults::{FaultConfig, Partition, Way};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::testing::run_scripts;
use hytra_fabric::{
    Backend, ClusterShape, Completion, Endpoint, LocalAddr, NodeId, OpFlags, Qp, RegionSpec,
    RemoteAddr, Rkey, Status, WorkRequest, WriteSrc,
};

const BODY_WORDS: u64 = 128;
const BODY_BYTES: u64 = BODY_WORDS * 8;
const ROUNDS: u64 = 40;

fn cluster(nodes: u16, faults: FaultConfig) -> (SimCluster, Rkey, Rkey) {
    let shape = ClusterShape { nodes, workers_per_node: 1, lanes_per_peer: 1 };
    let mut cfg = SimConfig::new(shape, 5);
    cfg.faults = faults;
    let mut b = SimCluster::new(cfg).unwrap();
    let data = b.register_all(RegionSpec::new(BODY_BYTES + 64)).unwrap();
    let scratch = b.register_all(RegionSpec::new(18 * BODY_BYTES)).unwrap();
    (b, data, scratch)
}

fn write_body(ep: &mut impl Endpoint, scratch: Rkey, data: Rkey, value: u64, flags: OpFlags) {
    write_body_at(ep, scratch, data, value, 0, flags);
}

/// WRITEs `value` into every word of node 0's body from scratch at `from`, which stays
/// untouched until the WRITE completes (M5).
fn write_body_at(
    ep: &mut impl Endpoint,
    scratch: Rkey,
    data: Rkey,
    value: u64,
    from: u64,
    flags: OpFlags,
) {
    let s = ep.region(scratch).unwrap().clone();
    for w in 0..BODY_WORDS {
        s.store(from + w * 8, value);
    }
    let wr = WorkRequest::Write {
        remote: RemoteAddr { node: NodeId(0), rkey: data, offset: 0 },
        src: WriteSrc::Local {
            addr: LocalAddr { rkey: scratch, offset: from },
            len: BODY_BYTES as u32,
        },
    };
    ep.post(Qp::to(NodeId(0)), value, &wr, flags).unwrap();
}

#[test]
fn a_read_racing_a_write_can_return_a_mix_of_whole_lines() {
    // Node 1 writes the body over and over, each time with a new value; node 2 reads it
    // over and over. Some READ must see two values, and each 64-byte line one.
    let (mut b, data, scratch) = cluster(3, FaultConfig::none());
    let torn = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    run_scripts(&mut b, |ep| {
        let me = ep.me().node.0;
        let (mut round, mut waiting) = (0u64, false);
        let (torn, reads) = (&torn, &reads);
        move |ep: &mut _| {
            let ep: &mut <SimCluster as Backend>::Ep = ep;
            let mut c = [Completion::EMPTY; 4];
            if waiting {
                if ep.poll_cq(&mut c) == 0 {
                    return false;
                }
                assert_eq!(c[0].status, Status::Success);
                waiting = false;
                if me == 2 {
                    let s = ep.region(scratch).unwrap();
                    let words: Vec<u64> =
                        (0..BODY_WORDS).map(|w| s.load(BODY_BYTES + w * 8)).collect();
                    for line in words.chunks(8) {
                        assert!(line.iter().all(|&w| w == line[0]), "a line torn inside: {line:?}");
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                    if words.iter().any(|&w| w != words[0]) {
                        torn.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if round == ROUNDS * 4 || me == 0 {
                return true;
            }
            round += 1;
            waiting = true;
            if me == 1 {
                // A batch of WRITEs back to back keeps the body being written most of the
                // time; each has its own source buffer (M5).
                for k in 0..16u64 {
                    let value = round * 16 + k;
                    let flags = if k == 15 { OpFlags::SIGNALED } else { OpFlags::NONE };
                    write_body_at(ep, scratch, data, value, (2 + k) * BODY_BYTES, flags);
                }
            } else {
                let wr = WorkRequest::Read {
                    remote: RemoteAddr { node: NodeId(0), rkey: data, offset: 0 },
                    local: LocalAddr { rkey: scratch, offset: BODY_BYTES },
                    len: BODY_BYTES as u32,
                };
                ep.post(Qp::to(NodeId(0)), round, &wr, OpFlags::SIGNALED).unwrap();
            }
            false
        }
    });
    assert_eq!(reads.load(Ordering::Relaxed), ROUNDS * 4);
    assert!(torn.load(Ordering::Relaxed) > 0, "no READ saw a WRITE half done");
}

#[test]
fn a_connection_applies_a_request_after_the_last_line_of_the_one_before() {
    // Also when both were held back by a partition and go through together as it heals.
    let partition =
        Partition { side: vec![NodeId(0)], from_ns: 5_000, until_ns: 100_000, way: Way::Both };
    for faults in
        [FaultConfig::none(), FaultConfig { partitions: vec![partition], ..FaultConfig::none() }]
    {
        write_then_flag(faults);
    }
}

/// Node 1 writes the body with a value, then a flag word with the same value, on one
/// connection. Node 0 watches: whenever the flag shows a value, the whole body shows it
/// or a later one.
fn write_then_flag(faults: FaultConfig) {
    let (mut b, data, scratch) = cluster(2, faults);
    let checks = AtomicU64::new(0);
    run_scripts(&mut b, |ep| {
        let me = ep.me().node.0;
        let mut round = 0u64;
        let checks = &checks;
        move |ep: &mut _| {
            let ep: &mut <SimCluster as Backend>::Ep = ep;
            if me == 0 {
                let d = ep.region(data).unwrap();
                let flag = d.load(BODY_BYTES);
                for w in 0..BODY_WORDS {
                    let v = d.load(w * 8);
                    assert!(v >= flag, "word {w} is {v} after flag {flag}: the flag overtook");
                }
                checks.fetch_add(1, Ordering::Relaxed);
                return flag == ROUNDS;
            }
            let mut c = [Completion::EMPTY; 4];
            if round > 0 && ep.poll_cq(&mut c) == 0 {
                return false;
            }
            if round == ROUNDS {
                return true;
            }
            round += 1;
            write_body(ep, scratch, data, round, OpFlags::NONE);
            let flag = WorkRequest::Write {
                remote: RemoteAddr { node: NodeId(0), rkey: data, offset: BODY_BYTES },
                src: WriteSrc::Bytes(&round.to_le_bytes()),
            };
            ep.post(Qp::to(NodeId(0)), 0, &flag, OpFlags::SIGNALED | OpFlags::INLINE).unwrap();
            false
        }
    });
    assert!(checks.load(Ordering::Relaxed) > ROUNDS, "the watcher looked often enough");
}

#[test]
fn a_completion_comes_after_the_unsignaled_atomics_before_it() {
    // A train of CASes to one word, then a READ on the same connection. The atomic
    // unit serialises the CASes; the READ's answer leaves behind theirs (RC answers in
    // order), so it completes no sooner than the last CAS does when that one is
    // signaled. Were it to overtake them, a poster waiting on it would never feel the
    // unit's queue and could feed it without bound.
    let last_cas = cas_train(Tail::SignaledCas);
    let read = cas_train(Tail::UnsignaledCasThenRead);
    // The two runs' workers differ by a few ns in their own posting and polling; a READ
    // that overtakes the last CAS does so by that CAS's time in the unit (hundreds).
    assert!(
        read + 50 >= last_cas,
        "the READ completed after {read} ns, the CASes before it after {last_cas} ns"
    );
}

enum Tail {
    SignaledCas,
    UnsignaledCasThenRead,
}

/// Node 1 posts 64 CASes to one word of node 0 (a cx3, whose atomics are slow), all
/// unsignaled but maybe the last, then maybe a signaled READ; returns how long after
/// posting the one signaled request completed.
fn cas_train(tail: Tail) -> u64 {
    const CASES: u64 = 64;
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let mut cfg = SimConfig::new(shape, 5);
    cfg.profile = NicProfile::cx3();
    let mut b = SimCluster::new(cfg).unwrap();
    let data = b.register_all(RegionSpec::new(64)).unwrap();
    let scratch = b.register_all(RegionSpec::new(CASES * 8 + 64)).unwrap();
    let took = std::sync::Mutex::new(None);
    run_scripts(&mut b, |ep| {
        let me = ep.me().node.0;
        let mut posted_at = None;
        let (took, tail) = (&took, &tail);
        move |ep: &mut _| {
            let ep: &mut <SimCluster as Backend>::Ep = ep;
            if me == 0 {
                return true;
            }
            let remote = RemoteAddr { node: NodeId(0), rkey: data, offset: 0 };
            let Some(t0) = posted_at else {
                // Before posting: the READ's own post must not count against it.
                posted_at = Some(ep.now_ns());
                for k in 0..CASES {
                    let local = LocalAddr { rkey: scratch, offset: k * 8 };
                    let wr = WorkRequest::Cas { remote, local, compare: k, swap: k + 1 };
                    let flags = match tail {
                        Tail::SignaledCas if k + 1 == CASES => OpFlags::SIGNALED,
                        _ => OpFlags::NONE,
                    };
                    ep.post(Qp::to(NodeId(0)), k, &wr, flags).unwrap();
                }
                if let Tail::UnsignaledCasThenRead = tail {
                    let local = LocalAddr { rkey: scratch, offset: CASES * 8 };
                    let wr = WorkRequest::Read { remote, local, len: 8 };
                    ep.post(Qp::to(NodeId(0)), CASES, &wr, OpFlags::SIGNALED).unwrap();
                }
                return false;
            };
            let mut c = [Completion::EMPTY; 1];
            if ep.poll_cq(&mut c) == 0 {
                return false;
            }
            assert_eq!(c[0].status, Status::Success);
            if let Tail::UnsignaledCasThenRead = tail {
                let s = ep.region(scratch).unwrap();
                assert_eq!(s.load(CASES * 8), CASES, "every CAS took effect before the READ");
            }
            *took.lock().unwrap() = Some(ep.now_ns() - t0);
            true
        }
    });
    let took = took.lock().unwrap().expect("the signaled request completed");
    took
}

/// What node 0 posts to node 1 in [`one_request_across`].
#[derive(Clone, Copy)]
enum Across {
    /// A 64-byte READ.
    Read,
    /// A WRITE of 128 bytes of 7s.
    Write,
}

/// What came of [`one_request_across`].
struct Outcome {
    status: Status,
    /// When node 0 saw the completion.
    at_ns: u64,
    /// Node 1's first and last word of the 128 bytes, at 2 ms.
    held: (u64, u64),
}

/// Node 0 posts one request to node 1 at `post_at_ns`, across `partition`.
fn one_request_across(partition: Partition, post_at_ns: u64, what: Across) -> Outcome {
    let faults = FaultConfig { partitions: vec![partition], ..FaultConfig::none() };
    let (mut b, data, scratch) = cluster(2, faults);
    let done = std::sync::Mutex::new(None);
    let held = std::sync::Mutex::new((0, 0));
    run_scripts(&mut b, |ep| {
        let me = ep.me().node.0;
        let mut posted = false;
        let (done, held) = (&done, &held);
        move |ep: &mut _| {
            let ep: &mut <SimCluster as Backend>::Ep = ep;
            if me == 1 {
                if ep.now_ns() < 2_000_000 {
                    return false;
                }
                let r = ep.region(data).unwrap();
                *held.lock().unwrap() = (r.load(0), r.load(120));
                return true;
            }
            if !posted {
                if ep.now_ns() < post_at_ns {
                    return false;
                }
                let remote = RemoteAddr { node: NodeId(1), rkey: data, offset: 0 };
                let local = LocalAddr { rkey: scratch, offset: 0 };
                let wr = match what {
                    Across::Read => WorkRequest::Read { remote, local, len: 64 },
                    Across::Write => {
                        let s = ep.region(scratch).unwrap();
                        for w in 0..16 {
                            s.store(w * 8, 7);
                        }
                        WorkRequest::Write {
                            remote,
                            src: WriteSrc::Local { addr: local, len: 128 },
                        }
                    }
                };
                ep.post(Qp::to(NodeId(1)), 1, &wr, OpFlags::SIGNALED).unwrap();
                posted = true;
            }
            let mut c = [Completion::EMPTY; 1];
            if ep.poll_cq(&mut c) == 0 {
                return false;
            }
            *done.lock().unwrap() = Some((c[0].status, ep.now_ns()));
            true
        }
    });
    let (status, at_ns) = done.into_inner().unwrap().expect("the request completed");
    Outcome { status, at_ns, held: held.into_inner().unwrap() }
}

/// Node 0 READs node 1 once, at `post_at_ns`; returns the status and when it completed.
fn read_across(partition: Partition, post_at_ns: u64) -> (Status, u64) {
    let o = one_request_across(partition, post_at_ns, Across::Read);
    (o.status, o.at_ns)
}

#[test]
fn a_partition_that_heals_in_time_delays_requests_and_a_longer_one_fails_them() {
    let short =
        Partition { side: vec![NodeId(1)], from_ns: 10_000, until_ns: 200_000, way: Way::Both };
    let (status, at) = read_across(short, 50_000);
    assert_eq!(status, Status::Success, "retransmitted once the partition healed");
    assert!(at > 200_000 && at < 210_000, "completed at {at} ns, after the partition");
    // The profiles give up after 0.5 ms of retries.
    let long =
        Partition { side: vec![NodeId(1)], from_ns: 10_000, until_ns: 5_000_000, way: Way::Both };
    let (status, at) = read_across(long, 50_000);
    assert_eq!(status, Status::Unreachable);
    assert!(at < 5_000_000, "failed at {at} ns, before the partition healed");
}

/// Node 0 WRITEs 128 bytes of 7s to node 1 at 50 µs; returns the completion's status and
/// what node 1's first and last words hold at 2 ms.
fn write_across(partition: Partition) -> (Status, u64, u64) {
    let o = one_request_across(partition, 50_000, Across::Write);
    (o.status, o.held.0, o.held.1)
}

#[test]
fn a_one_way_cut_loses_either_the_request_or_only_its_answer() {
    let cut = |side: u16| Partition {
        side: vec![NodeId(side)],
        from_ns: 10_000,
        until_ns: 5_000_000,
        way: Way::FromSide,
    };
    // What node 0 sends is lost: the WRITE never lands, and fails.
    let (status, first, last) = write_across(cut(0));
    assert_eq!((status, first, last), (Status::Unreachable, 0, 0));
    // What node 1 sends is lost: the WRITE lands whole, yet its poster sees it fail.
    let (status, first, last) = write_across(cut(1));
    assert_eq!((status, first, last), (Status::Unreachable, 7, 7));
    // Both ways open again in time: it lands and succeeds.
    let short = Partition { until_ns: 200_000, ..cut(1) };
    let (status, first, last) = write_across(short);
    assert_eq!((status, first, last), (Status::Success, 7, 7));
}
