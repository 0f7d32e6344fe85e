//! Event waiting on the `ucx` backend: a thread whose workers have had nothing to do for
//! its spin sleeps on UCX's event fds and is woken by what arrives, not only by the bound
//! on its sleep, and never sleeps within the spin; nothing is lost meanwhile. Datagrams ping-pong between two nodes, each on its own
//! thread, so that each side sleeps while the other answers. Over shared memory, and over
//! TCP with `HYTRA_UCX_TLS=tcp`.

#[cfg(feature = "ucx")]
mod with_ucx {
    use std::time::Duration;

    use hytra_fabric::testing::TestBackend;
    use hytra_fabric::ucx::{UcxCluster, UcxConfig, UcxWaiting};
    use hytra_fabric::{
        Backend, ClusterShape, Endpoint, NodeId, OpFlags, Program, RunLimits, RunStats, Step,
        WorkerId,
    };

    /// Round trips of the ping-pong.
    const ROUNDS: u64 = 2_000;

    /// Node 0 sends ping `i` and waits for its echo before the next; node 1 echoes.
    struct PingPong<E> {
        ep: E,
        /// Pings sent (node 0) or echoed (node 1).
        count: u64,
        /// Node 0: an echo is awaited.
        waiting: bool,
    }

    impl<E: Endpoint> Program for PingPong<E> {
        fn step(&mut self) -> Step {
            let peer = WorkerId { node: NodeId(1 - self.ep.me().node.0), index: 0 };
            let mut progressed = false;
            let mut buf = [0u8; 64];
            while let Some((from, len)) = self.ep.recv(&mut buf) {
                assert_eq!((from, len), (peer, 8), "an 8-byte datagram from the peer");
                let n = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
                assert_eq!(n, self.count, "datagrams in order, none lost");
                if self.ep.me().node.0 == 1 {
                    self.ep.send(peer, &buf[..8], OpFlags::NONE).expect("echo");
                    self.count += 1;
                } else {
                    assert!(self.waiting, "an echo nobody asked for");
                    self.waiting = false;
                    self.count += 1;
                }
                progressed = true;
            }
            if self.ep.me().node.0 == 0 && !self.waiting && self.count < ROUNDS {
                self.ep.send(peer, &self.count.to_le_bytes(), OpFlags::NONE).expect("ping");
                self.waiting = true;
                progressed = true;
            }
            Step::Idle { wake_at_ns: None, progressed }
        }

        fn is_done(&self) -> bool {
            self.count == ROUNDS
        }
    }

    fn ping_pong(waiting: UcxWaiting) -> RunStats {
        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let mut config = UcxConfig::new(shape);
        config.transports =
            Some(std::env::var("HYTRA_UCX_TLS").unwrap_or_else(|_| "sm".to_string()));
        config.threads = Some(2);
        config.waiting = waiting;
        let mut b = UcxCluster::new(config).expect("UCX cluster");
        let limits = RunLimits { time_limit_ns: UcxCluster::test_time_limit_ns() };
        let (counts, stats) = b
            .run(|ep| PingPong { ep, count: 0, waiting: false }, |p| p.count, limits)
            .expect("the run");
        assert!(stats.all_done, "the ping-pong did not finish ({counts:?} of {ROUNDS})");
        assert_eq!(counts, [ROUNDS, ROUNDS]);
        stats
    }

    #[test]
    fn event_waiting_threads_sleep_and_are_woken_by_what_arrives() {
        // Without a spin, every wait for an echo is a sleep.
        let stats = ping_pong(UcxWaiting::Event { spin: Duration::ZERO });
        assert!(stats.event_sleeps > 0, "no thread ever slept: {stats:?}");
        // Each side waits for the other about ROUNDS times; were arrivals not waking the
        // sleepers, each of those waits would end at the sleep's bound instead.
        assert!(
            stats.event_wakeups >= ROUNDS / 2,
            "{} of {} sleeps ended by an event, expected at least {}",
            stats.event_wakeups,
            stats.event_sleeps,
            ROUNDS / 2
        );
    }

    #[test]
    fn event_waiting_threads_do_not_sleep_within_their_spin() {
        // A spin longer than the test's time limit: each thread yields through every wait.
        let stats = ping_pong(UcxWaiting::Event { spin: Duration::from_secs(3_600) });
        assert_eq!((stats.event_sleeps, stats.event_wakeups), (0, 0));
    }

    #[test]
    fn polling_threads_never_sleep() {
        let stats = ping_pong(UcxWaiting::Poll);
        assert_eq!((stats.event_sleeps, stats.event_wakeups), (0, 0));
    }
}

/// Stands for the tests of this file in a build without the `ucx` feature, so that
/// the test output says they were not built.
#[cfg(not(feature = "ucx"))]
#[test]
#[ignore = "the ucx backend is not in this build: install libucx-dev and run `cargo test --features ucx`"]
fn not_built() {}
