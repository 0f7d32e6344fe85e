//! What the offload property tests share: the two backends they run on and the check of
//! every answer against the server CPU's.

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_offload::service::GetResult;
use proptest::prelude::*;

/// A server (node 0) and a client (node 1).
pub const SHAPE: ClusterShape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };

/// Per-get timeout on threads: real time, on a shared machine.
pub const LOCAL_TIMEOUT_NS: u64 = 2_000_000_000;

/// The simulated cluster with the cx5 NIC.
pub fn sim(seed: u64) -> SimCluster {
    let mut cfg = SimConfig::new(SHAPE, seed);
    cfg.profile = NicProfile::cx5();
    SimCluster::new(cfg).unwrap()
}

/// Threads, with the `local` backend's NIC thread.
pub fn local() -> LocalCluster {
    LocalCluster::new(LocalConfig::new(SHAPE)).unwrap()
}

/// Every one of `asked` gets was answered, each exactly as the CPU answered it, and
/// some key was present. `what` names the case in failure messages.
pub fn check_answers(
    got: Vec<(u64, GetResult, Option<Vec<u8>>)>,
    asked: usize,
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), asked, "every get answered");
    let mut present = 0;
    for (key, r, cpu) in got {
        match (&r, &cpu) {
            (GetResult::Found(v), Some(c)) => {
                prop_assert_eq!(v, c, "key {} ({})", key, what);
                present += 1;
            }
            (GetResult::Absent, None) => {}
            _ => prop_assert!(false, "key {key} ({what}): offload {r:?}, CPU {cpu:?}"),
        }
    }
    prop_assert!(present > 0, "some key was present");
    Ok(())
}
