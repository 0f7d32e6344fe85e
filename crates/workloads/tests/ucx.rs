//! The engine over UCX, with every node in this process: SmallBank under every design
//! over shared memory and over TCP keeps the money, the replicas and serializability.
//! Built only with the `ucx` feature (it needs the system UCX).

#[cfg(feature = "ucx")]
mod with_ucx {
    use hytra_fabric::ucx::{UcxCluster, UcxConfig};
    use hytra_fabric::ClusterShape;
    use hytra_rt::RtConfig;
    use hytra_txn::{Design, TxnConfig};
    use hytra_workloads::bench::{run, BenchParams};
    use hytra_workloads::smallbank::SmallBank;

    fn cluster(transports: &str) -> UcxCluster {
        let shape = ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 };
        let mut config = UcxConfig::new(shape);
        config.transports = Some(transports.to_string());
        UcxCluster::new(config).expect("UCX cluster")
    }

    fn params(measure_ms: u64) -> BenchParams {
        BenchParams {
            coroutines: 4,
            warmup_ns: 2_000_000,
            measure_ns: measure_ms * 1_000_000,
            seed: 3,
            check: true,
            rt: RtConfig { rpc_timeout_ns: 2_000_000_000, ..RtConfig::default() },
            drain_ns: 30_000_000_000,
            warm_cache: true,
            timeline_ns: 0,
        }
    }

    fn every_design_is_correct(transports: &str, measure_ms: u64) {
        for d in Design::ALL {
            let mut b = cluster(transports);
            let bank = SmallBank { accounts_per_worker: 50 };
            let r = run(&mut b, &bank, TxnConfig::preset(d), params(measure_ms)).unwrap();
            let c = r.checker.as_ref().expect("checked");
            assert!(
                c.serializable(),
                "{transports} {}: {:?}",
                d.name(),
                &c.violations[..c.violations.len().min(3)]
            );
            assert!(r.invariant.ok, "{transports} {}: {:?}", d.name(), r.invariant.details);
            assert!(
                r.stats.commits > 50,
                "{transports} {}: only {} commits",
                d.name(),
                r.stats.commits
            );
        }
    }

    #[test]
    fn smallbank_every_design_over_shared_memory() {
        every_design_is_correct("sm", 50);
    }

    #[test]
    fn smallbank_every_design_over_tcp() {
        every_design_is_correct("tcp", 200);
    }
}

/// Stands for the tests of this file in a build without the `ucx` feature, so that
/// the test output says they were not built.
#[cfg(not(feature = "ucx"))]
#[test]
#[ignore = "the ucx backend is not in this build: install libucx-dev and run `cargo test --features ucx`"]
fn not_built() {}
