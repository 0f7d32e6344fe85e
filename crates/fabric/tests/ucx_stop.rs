//! The end of a `ucx` run: a process stops only once every datagram sent was handed to
//! its target's program, so a burst sent just before its sender finishes is not lost
//! when every worker is done (done workers still take what arrives). Over shared memory,
//! and over TCP with `HYTRA_UCX_TLS=tcp`.

#[cfg(feature = "ucx")]
mod with_ucx {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use hytra_fabric::testing::TestBackend;
    use hytra_fabric::ucx::UcxCluster;
    use hytra_fabric::{
        Backend, ClusterShape, Endpoint, OpFlags, Program, RunLimits, Step, WorkerId,
    };

    /// Datagrams of the burst: more than one poll of the end of the run lets through.
    const BURST: u64 = 3_000;

    /// Worker 0 sends the burst to worker 1 and is done; worker 1 is done from the start and
    /// takes one datagram per step, slowly, so that most of the burst is still on its way
    /// when both are done.
    struct Burst<E> {
        ep: E,
        sent: bool,
        taken: Arc<AtomicU64>,
    }

    impl<E: Endpoint> Program for Burst<E> {
        fn step(&mut self) -> Step {
            let to = WorkerId { node: hytra_fabric::NodeId(1), index: 0 };
            let mut progressed = false;
            if self.ep.me().node.0 == 0 && !self.sent {
                for i in 0..BURST {
                    self.ep
                        .send(to, &i.to_le_bytes(), OpFlags::NONE)
                        .unwrap_or_else(|e| panic!("send {i}: {e:?}"));
                }
                self.sent = true;
                progressed = true;
            }
            let mut buf = [0u8; 64];
            if let Some((_, len)) = self.ep.recv(&mut buf) {
                assert_eq!(len, 8);
                self.taken.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_micros(10));
                progressed = true;
            }
            Step::Idle { wake_at_ns: None, progressed }
        }

        fn is_done(&self) -> bool {
            self.ep.me().node.0 != 0 || self.sent
        }
    }

    #[test]
    fn a_burst_sent_just_before_the_end_is_taken_whole() {
        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let mut b = UcxCluster::for_test(shape, 1);
        let taken = Arc::new(AtomicU64::new(0));
        let limits = RunLimits { time_limit_ns: UcxCluster::test_time_limit_ns() };
        let (_, stats) = b
            .run(|ep| Burst { ep, sent: false, taken: taken.clone() }, |_| (), limits)
            .expect("the run");
        assert!(stats.all_done, "the run did not end by itself");
        let taken = taken.load(Ordering::Relaxed);
        assert_eq!(taken + stats.datagrams_dropped, BURST, "datagrams lost at the end of the run");
    }
}

/// Stands for the tests of this file in a build without the `ucx` feature, so that
/// the test output says they were not built.
#[cfg(not(feature = "ucx"))]
#[test]
#[ignore = "the ucx backend is not in this build: install libucx-dev and run `cargo test --features ucx`"]
fn not_built() {}
