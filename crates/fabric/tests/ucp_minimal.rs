//! The minimal UCP program behind `hytra micro --ucp-baseline`: briefly, for each
//! operation, that it really did the operations it counts (the data it read is the
//! owner's, the atomics add up, the puts landed, every request was answered), so that
//! the baseline it reports cannot be a loop that measures nothing.

#[cfg(feature = "ucx")]
mod ucx {
    use std::sync::Mutex;

    use hytra_fabric::ucx::minimal::{run_minimal, MinimalOp, MinimalParams, MinimalResult};
    use hytra_fabric::BackendError;

    /// Each run spins one thread per worker; run one at a time so that the window is not
    /// spent waiting for a core (TCP's connection setup needs both workers to progress).
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// Short: a 20 ms window after a warm-up long enough for TCP's connection setup on a
    /// busy machine (the drain adds little).
    fn brief(op: MinimalOp, payload: u32, transports: &str) -> MinimalParams {
        MinimalParams {
            transports: Some(transports.into()),
            outstanding: 8,
            signal_every: 4,
            warmup_ns: if transports == "tcp" { 100_000_000 } else { 5_000_000 },
            measure_ns: 20_000_000,
            ..MinimalParams::new(op, payload)
        }
    }

    fn run(op: MinimalOp, payload: u32, transports: &str) -> MinimalResult {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let r = run_minimal(&brief(op, payload, transports))
            .unwrap_or_else(|e| panic!("{op:?} over {transports}: {e}"));
        assert!(r.ops > 0, "{op:?} over {transports}: nothing completed in the window: {r:?}");
        assert_eq!(r.nodes.len(), 2);
        assert!(r.latency_samples > 0 && r.p50_ns <= r.p99_ns, "{r:?}");
        for (i, n) in r.nodes.iter().enumerate() {
            assert!(n.completed >= n.in_window && n.completed > 0, "worker {i}: {n:?}");
            assert_eq!(n.failed, 0, "worker {i}: {n:?}");
            assert_eq!(n.bad_data, 0, "worker {i}: {n:?}");
        }
        r
    }

    /// Worker `i` issues to worker `(i + 1) % 2`: the target of `i` is the other one.
    fn target(i: usize) -> usize {
        (i + 1) % 2
    }

    fn reads_return_the_owners_pattern(transports: &str) {
        // bad_data == 0 (checked in `run`) means every READ returned the words the
        // target wrote into its region before the run.
        let r = run(MinimalOp::Get, 64, transports);
        assert!(r.nodes.iter().all(|n| n.completed > 0));
    }

    fn faa_leaves_the_count_of_completed_adds(transports: &str) {
        let r = run(MinimalOp::FetchAdd, 8, transports);
        for (i, n) in r.nodes.iter().enumerate() {
            assert_eq!(r.nodes[target(i)].word0, n.completed, "worker {i}'s adds: {r:?}");
        }
    }

    fn cas_leaves_the_count_of_won_swaps(transports: &str) {
        let r = run(MinimalOp::Cswap, 8, transports);
        for (i, n) in r.nodes.iter().enumerate() {
            assert!(n.cas_won > 0, "worker {i}: {n:?}");
            assert!(n.cas_won <= n.completed, "worker {i}: {n:?}");
            assert_eq!(r.nodes[target(i)].word0, n.cas_won, "worker {i}'s swaps: {r:?}");
        }
    }

    fn puts_land_whole(transports: &str) {
        let r = run(MinimalOp::Put, 128, transports);
        for (i, n) in r.nodes.iter().enumerate() {
            assert_eq!(n.completed % 4, 0, "puts complete in flushed groups of 4: {n:?}");
            // The writer walks every slot of the target's 1024 before repeating.
            let landed = r.nodes[target(i)].slots_written;
            assert_eq!(landed, n.completed.min(1024), "worker {i}'s puts: {r:?}");
        }
    }

    fn every_request_is_answered(transports: &str) {
        let r = run(MinimalOp::AmRoundTrip, 256, transports);
        for (i, n) in r.nodes.iter().enumerate() {
            assert_eq!(r.nodes[target(i)].am_served, n.completed, "worker {i}: {r:?}");
        }
    }

    #[test]
    fn sm_get() {
        reads_return_the_owners_pattern("sm");
    }

    #[test]
    fn sm_fetch_add() {
        faa_leaves_the_count_of_completed_adds("sm");
    }

    #[test]
    fn sm_cswap() {
        cas_leaves_the_count_of_won_swaps("sm");
    }

    #[test]
    fn sm_put() {
        puts_land_whole("sm");
    }

    #[test]
    fn sm_am_round_trip() {
        every_request_is_answered("sm");
    }

    #[test]
    fn tcp_get() {
        reads_return_the_owners_pattern("tcp");
    }

    #[test]
    fn tcp_fetch_add() {
        faa_leaves_the_count_of_completed_adds("tcp");
    }

    #[test]
    fn tcp_put() {
        puts_land_whole("tcp");
    }

    #[test]
    fn tcp_am_round_trip() {
        every_request_is_answered("tcp");
    }

    #[test]
    fn bad_parameters_are_errors_not_aborts() {
        let cases = [
            (MinimalParams { nodes: 1, ..brief(MinimalOp::Get, 64, "sm") }, "nodes 1"),
            (brief(MinimalOp::Get, 12, "sm"), "payload 12"),
            (brief(MinimalOp::FetchAdd, 64, "sm"), "atomics move 8 bytes"),
            (MinimalParams { outstanding: 0, ..brief(MinimalOp::Get, 64, "sm") }, "outstanding 0"),
            (MinimalParams { signal_every: 3, ..brief(MinimalOp::Put, 64, "sm") }, "signal_every"),
            (MinimalParams { measure_ns: 0, ..brief(MinimalOp::Get, 64, "sm") }, "window"),
            // UCX accepts unknown names and finds no way to the peer.
            (brief(MinimalOp::Get, 64, "no-such-transport"), "minimal UCP program"),
        ];
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        for (params, want) in cases {
            match run_minimal(&params) {
                Err(BackendError::Config(msg)) => assert!(msg.contains(want), "{want}: {msg}"),
                other => panic!("{want}: expected a configuration error, got {other:?}"),
            }
        }
    }
}

/// Stands for the tests above in a build without the `ucx` feature, so that the test
/// output says they were not built.
#[cfg(not(feature = "ucx"))]
#[test]
#[ignore = "the ucx backend is not in this build: install libucx-dev and run `cargo test --features ucx`"]
fn ucp_minimal_not_built() {}
