//! A `ucx` run of several processes that cannot end: each process fails with the reason
//! once its time limit passes, instead of waiting for the others (or for their hub)
//! forever. Two "processes" here are two clusters of one node each in threads of this
//! test, meeting through a hub as `hytra cluster`'s nodes do; node 1's program never
//! finishes.

#[cfg(feature = "ucx")]
mod with_ucx {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use hytra_fabric::ucx::{Hub, HubOutcome, TcpExchange, UcxCluster, UcxConfig, UcxEndpoint};
    use hytra_fabric::{
        Backend, BackendError, ClusterShape, Endpoint, NodeId, OpFlags, Program, RunLimits, Step,
        WorkerId,
    };

    /// Bounds joining the hub and every exchange.
    const TIMEOUT: Duration = Duration::from_secs(20);

    /// A thread's outcome, joined.
    type Joined<T> = JoinHandle<Result<T, BackendError>>;

    /// A hub serving two "processes" of one node each, threads running `program` over
    /// shared memory with a time limit of `limit_ns`: the hub's outcome and each node's.
    fn two_processes<P: Program + 'static>(
        limit_ns: u64,
        program: fn(UcxEndpoint) -> P,
    ) -> (Joined<HubOutcome>, Vec<Joined<()>>) {
        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let hub = Hub::bind(([127, 0, 0, 1], 0).into(), 2, "t", TIMEOUT).expect("the hub");
        let at = hub.addr().expect("its address");
        let served = std::thread::spawn(move || hub.serve(|_| {}, || false));
        let nodes = (0..2u16)
            .map(|me| {
                std::thread::spawn(move || {
                    let exchange = TcpExchange::join_hub(me, 2, at, "t", TIMEOUT)?;
                    let config = UcxConfig {
                        hosted: Some(vec![NodeId(me)]),
                        transports: Some("sm".into()),
                        threads: Some(1),
                        ..UcxConfig::new(shape)
                    };
                    let mut b = UcxCluster::with_exchange(config, Box::new(exchange))?;
                    let limits = RunLimits { time_limit_ns: limit_ns };
                    b.run(program, |_| (), limits).map(|_| ())
                })
            })
            .collect();
        (served, nodes)
    }

    /// Done at once on node 0, never on node 1.
    struct Stubborn<E> {
        ep: E,
    }

    impl<E: Endpoint> Program for Stubborn<E> {
        fn step(&mut self) -> Step {
            Step::Idle { wake_at_ns: None, progressed: false }
        }

        fn is_done(&self) -> bool {
            self.ep.me().node.0 == 0
        }
    }

    #[test]
    fn a_run_past_its_time_limit_fails_every_process_with_the_reason() {
        let started = Instant::now();
        let (served, nodes) = two_processes(1_000_000_000, |ep| Stubborn { ep });
        let errors: Vec<String> = nodes
            .into_iter()
            .map(|h| h.join().expect("no panic").expect_err("the run cannot end").to_string())
            .collect();
        assert!(started.elapsed() < TIMEOUT, "a process waited past its time limit");
        for e in &errors {
            assert!(e.contains("did not end within its time limit (1.0 s)"), "{e}");
        }
        assert!(errors[0].contains("the others never said the run was over"), "{}", errors[0]);
        assert!(errors[1].contains("workers [1] of this process never finished"), "{}", errors[1]);
        // Both left without the barrier after the run: to the hub, both died.
        let hub = served.join().expect("no panic");
        assert!(hub.is_err_and(|e| e.to_string().contains("every node died")));
    }

    /// Node 1 stops making progress (as a dead process would), holding every UCP
    /// resource it has; released by the test at the end.
    static RELEASE: AtomicBool = AtomicBool::new(false);

    /// Datagrams node 0 sends the stalled node 1: many times what a shared-memory receive
    /// queue holds (UCX's FIFO has 64 elements by default), so that most stay pending in
    /// node 0's worker, and its flush cannot end while node 1 stalls.
    const BURST: u64 = 5_000;

    /// Lets node 1 go on when dropped, even if the test failed before it said so.
    struct Release;

    impl Drop for Release {
        fn drop(&mut self) {
            RELEASE.store(true, Ordering::Release);
        }
    }

    /// Node 0 sends node 1 a burst and is done; once its worker flush (which cannot end
    /// while node 1 stalls) has begun, it fences node 1 off, as the engine does when a
    /// node is removed. Node 1 stalls until released.
    struct FenceLate<E> {
        ep: E,
        sent: Option<Instant>,
        fenced: bool,
    }

    impl<E: Endpoint> Program for FenceLate<E> {
        fn step(&mut self) -> Step {
            if self.ep.me().node.0 == 1 {
                while !RELEASE.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.fenced = true;
                return Step::Idle { wake_at_ns: None, progressed: false };
            }
            let to = WorkerId { node: NodeId(1), index: 0 };
            match self.sent {
                None => {
                    for i in 0..BURST {
                        // A refused send is a datagram lost, which a datagram may be.
                        let _ = self.ep.send(to, &i.to_le_bytes(), OpFlags::NONE);
                    }
                    self.sent = Some(Instant::now());
                }
                Some(at) if !self.fenced && at.elapsed() > Duration::from_millis(300) => {
                    self.ep.fence(NodeId(1));
                    self.fenced = true;
                }
                Some(_) => {}
            }
            Step::Idle { wake_at_ns: None, progressed: false }
        }

        fn is_done(&self) -> bool {
            match self.ep.me().node.0 {
                0 => self.sent.is_some(),
                _ => self.fenced,
            }
        }
    }

    /// A worker flush that began while a peer was alive ends once that peer is fenced
    /// off: over shared memory a dead peer never lets it end, and a process whose flush
    /// never ends is never done (the hub then waits for it until its time limit). Node 0
    /// must report itself done and its requests complete.
    #[test]
    fn a_flush_begun_before_a_fence_ends_with_it() {
        let (served, nodes) =
            two_processes(2_000_000_000, |ep| FenceLate { ep, sent: None, fenced: false });
        let release = Release;
        let mut nodes = nodes.into_iter();
        let first = nodes.next().expect("node 0").join().expect("no panic");
        drop(release);
        let second = nodes.next().expect("node 1").join().expect("no panic");
        let e = first.expect_err("node 1 never ends the run").to_string();
        assert!(e.contains("this process finished; the others never said"), "{e}");
        assert!(second.is_err(), "node 1 stalled past its time limit");
        let _ = served.join().expect("no panic");
    }
}

/// Stands for the tests of this file in a build without the `ucx` feature, so that
/// the test output says they were not built.
#[cfg(not(feature = "ucx"))]
#[test]
#[ignore = "the ucx backend is not in this build: install libucx-dev and run `cargo test --features ucx`"]
fn not_built() {}
