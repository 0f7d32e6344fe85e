//! The swarm over UCX (feature `ucx`): seeds draw shared memory or TCP and polling or
//! event waits, never a fault UCX cannot inject; they pass every oracle, and the oracles
//! catch a planted bug there as on the simulator. Without the feature, this file holds
//! no test (`cargo test --features ucx` runs it, as CI does).

#[cfg(feature = "ucx")]
mod with_ucx {
    use hytra_lab::swarm::{draw, run_seed, SwarmBackend};
    use hytra_lab::BackendSpec;
    use hytra_txn::{ExecStrategy, PlantedFault};

    /// Seeds drawn for the UCX swarm (not run).
    const DRAWN: u64 = 200;

    /// The transports and waiting of seed `seed`'s draw.
    fn transport_of(seed: u64) -> (String, &'static str) {
        match draw(seed, SwarmBackend::Ucx, None).spec.backend {
            BackendSpec::Ucx(u) => (u.transports.expect("a drawn transport"), u.wait.name()),
            other => panic!("seed {seed} drew {} for the ucx swarm", other.name()),
        }
    }

    /// Every combination of transport and waiting is drawn; no draw has a fault, a node
    /// loss or an offloaded execution (UCX runs no verb programs and cannot stop one node
    /// of a process).
    #[test]
    fn ucx_seeds_draw_both_transports_and_waits_and_no_fault() {
        let mut seen: Vec<(String, &str)> = Vec::new();
        for seed in 0..DRAWN {
            let d = draw(seed, SwarmBackend::Ucx, None);
            let BackendSpec::Ucx(u) = &d.spec.backend else { panic!("seed {seed}: not ucx") };
            // Every node in this process, on two threads (as on `local`).
            assert!(u.placement.is_none() && u.threads == Some(2), "seed {seed}: {u:?}");
            assert_eq!(d.spec.txn.crash_point, None, "seed {seed}");
            assert_eq!(d.spec.txn.recovery, None, "seed {seed}: no loss, so the default leases");
            assert_ne!(d.spec.txn.exec, ExecStrategy::Offload, "seed {seed}");
            assert_eq!(d.heal_ns, 0, "seed {seed}");
            let t = transport_of(seed);
            assert!(d.summary().contains(&format!("on ucx/{} {}", t.0, t.1)), "{}", d.summary());
            if !seen.contains(&t) {
                seen.push(t);
            }
        }
        seen.sort();
        let want = [("sm", "event"), ("sm", "poll"), ("tcp", "event"), ("tcp", "poll")];
        let want: Vec<(String, &str)> = want.iter().map(|&(t, w)| (t.to_string(), w)).collect();
        assert_eq!(seen, want);
    }

    /// The first two seeds over each transport pass every oracle, with commits; a
    /// planted bug is caught over both.
    #[test]
    fn ucx_seeds_pass_every_oracle_and_a_planted_bug_is_caught() {
        for tls in ["sm", "tcp"] {
            let seeds: Vec<u64> =
                (0..DRAWN).filter(|&s| transport_of(s).0 == tls).take(2).collect();
            assert_eq!(seeds.len(), 2, "{tls} is drawn");
            for seed in seeds {
                let r = run_seed(seed, SwarmBackend::Ucx, None);
                assert!(r.passed(), "seed {seed}: {}: {:?}", r.summary, r.findings);
                assert!(r.commits > 0, "seed {seed}: {}", r.summary);
            }
            // Not every seed exposes a skipped version bump (a read-only mix cannot):
            // among the first eight of the transport, one must.
            let caught = (0..DRAWN).filter(|&s| transport_of(s).0 == tls).take(8).any(|s| {
                !run_seed(s, SwarmBackend::Ucx, Some(PlantedFault::SkipVersionBump)).passed()
            });
            assert!(caught, "a skipped version bump went unnoticed over {tls}");
        }
    }
}
