//! R1 over UCX with delays injected on both sides: the requests of one connection take
//! effect at the target in post order, over shared memory and over TCP, with each
//! endpoint's ordering chosen from its lanes and with the strictest ordering forced (the
//! path of endpoints whose RMA and atomics take different lanes).
//!
//! Each round, node 0 posts on its connection to node 1, without waiting in between: a
//! 16 KiB WRITE of the round number, an inline WRITE of the round number to a flag (the
//! engine's write-back then unlock), a CAS of a counter from the previous round to this
//! one, and a signaled READ of the counter (the engine's lock then read). Node 1 watches
//! the flag: every data word must be at least the flag's round once the flag shows it.
//! Node 0 checks that each CAS found the previous round's value and each READ its own
//! round's. Node 1 sleeps now and then, so that over TCP, where the target's progress
//! carries one-sided requests, they pile up behind it; node 0 sleeps too, so that
//! batches vary. Built only with the `ucx` feature.

#[cfg(feature = "ucx")]
mod with_ucx {
    use hytra_fabric::testing::run_scripts;
    use hytra_fabric::ucx::{UcxCluster, UcxConfig, UcxOrdering};
    use hytra_fabric::{
        Backend, ClusterShape, Completion, Endpoint, LocalAddr, NodeId, OpFlags, Qp, RegionSpec,
        RemoteAddr, WorkRequest, WriteSrc,
    };

    const ROUNDS: u64 = 2000;
    /// Rounds in flight at once (each round's source buffer is its own until it completes).
    const WINDOW: u64 = 4;
    const BIG: u64 = 16 << 10;
    /// Layout of node 1's target region: the data, then the flag, then the counter.
    const FLAG: u64 = BIG;
    const COUNTER: u64 = BIG + 8;
    /// Layout of node 0's scratch region: a source buffer per window slot, then per slot the
    /// CAS's old value and the READ's result.
    const RESULTS: u64 = WINDOW * BIG;

    /// A small seeded generator (xorshift64): the delays differ between rounds, not runs.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn order_holds(transports: &str, ordering: UcxOrdering) {
        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let mut config = UcxConfig { threads: Some(2), ordering, ..UcxConfig::new(shape) };
        config.transports = Some(transports.to_string());
        let mut b = UcxCluster::new(config).expect("UCX cluster");
        let target = b.register_all(RegionSpec::new(BIG + 64)).unwrap();
        let scratch = b.register_all(RegionSpec::new(RESULTS + WINDOW * 16)).unwrap();
        let what = format!("{transports}, {ordering:?}");
        run_scripts(&mut b, |ep| {
            let sender = ep.me().node == NodeId(0);
            let (mut next, mut done) = (1u64, 1u64);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(sender));
            let mut seen = 0u64;
            let what = what.clone();
            move |ep: &mut <UcxCluster as Backend>::Ep| {
                if rng.below(4) == 0 {
                    std::thread::sleep(std::time::Duration::from_micros(rng.below(300)));
                }
                if !sender {
                    // A worker polls while it runs; over TCP that progress is what carries
                    // the one-sided requests aimed at it.
                    let mut none = [Completion::EMPTY; 1];
                    assert_eq!(ep.poll_cq(&mut none), 0);
                    let r = ep.region(target).unwrap();
                    let flag = r.load(FLAG);
                    assert!(flag >= seen, "{what}: the flag went back from {seen} to {flag}");
                    seen = flag;
                    for w in 0..BIG / 8 {
                        let v = r.load(w * 8);
                        assert!(
                            v >= flag,
                            "{what}: flag {flag} landed before word {w} of its data ({v})"
                        );
                    }
                    return flag == ROUNDS;
                }
                let qp = Qp::to(NodeId(1));
                while next <= ROUNDS && next < done + WINDOW {
                    let slot = next % WINDOW;
                    let s = ep.region(scratch).unwrap();
                    for w in 0..BIG / 8 {
                        s.store(slot * BIG + w * 8, next);
                    }
                    let at = |offset| RemoteAddr { node: NodeId(1), rkey: target, offset };
                    let local = |offset| LocalAddr { rkey: scratch, offset };
                    let data = WorkRequest::Write {
                        remote: at(0),
                        src: WriteSrc::Local { addr: local(slot * BIG), len: BIG as u32 },
                    };
                    let round = next.to_le_bytes();
                    let flag =
                        WorkRequest::Write { remote: at(FLAG), src: WriteSrc::Bytes(&round) };
                    let cas = WorkRequest::Cas {
                        remote: at(COUNTER),
                        local: local(RESULTS + slot * 16),
                        compare: next - 1,
                        swap: next,
                    };
                    let read = WorkRequest::Read {
                        remote: at(COUNTER),
                        local: local(RESULTS + slot * 16 + 8),
                        len: 8,
                    };
                    ep.post(qp, 0, &data, OpFlags::MORE).unwrap();
                    ep.post(qp, 0, &flag, OpFlags::INLINE | OpFlags::MORE).unwrap();
                    ep.post(qp, 0, &cas, OpFlags::MORE).unwrap();
                    ep.post(qp, next, &read, OpFlags::SIGNALED).unwrap();
                    next += 1;
                }
                let mut got = [Completion::EMPTY; 8];
                let n = ep.poll_cq(&mut got);
                for c in &got[..n] {
                    assert_eq!(
                        c.status,
                        hytra_fabric::Status::Success,
                        "{what}: round {} failed: {c:?}",
                        c.wr_id
                    );
                    assert_eq!(c.wr_id, done, "{what}: rounds complete in order");
                    let s = ep.region(scratch).unwrap();
                    let slot = done % WINDOW;
                    let (old, read) =
                        (s.load(RESULTS + slot * 16), s.load(RESULTS + slot * 16 + 8));
                    assert_eq!(old, done - 1, "{what}: round {done}'s CAS found {old}");
                    assert_eq!(read, done, "{what}: round {done}'s READ did not see its CAS");
                    done += 1;
                }
                done > ROUNDS
            }
        });
        let flag = b.region(NodeId(1), target).unwrap().load(FLAG);
        assert_eq!(flag, ROUNDS, "{what}");
    }

    #[test]
    fn order_holds_over_shared_memory() {
        order_holds("sm", UcxOrdering::Auto);
        order_holds("sm", UcxOrdering::Flush);
    }

    #[test]
    fn order_holds_over_tcp_with_delays() {
        order_holds("tcp", UcxOrdering::Auto);
        order_holds("tcp", UcxOrdering::Flush);
    }
}

/// Stands for the tests of this file in a build without the `ucx` feature, so that
/// the test output says they were not built.
#[cfg(not(feature = "ucx"))]
#[test]
#[ignore = "the ucx backend is not in this build: install libucx-dev and run `cargo test --features ucx`"]
fn not_built() {}
