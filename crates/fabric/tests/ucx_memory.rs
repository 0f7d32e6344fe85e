//! Memory of the `ucx` backend: a large region reads as zeros without being made resident
//! (stores size their regions for the most they may ever hold; TPC-C's touch a small part).
//! Alone in its test binary, so that the process's memory counters see only this test.
#![cfg(all(feature = "ucx", target_os = "linux"))]

use hytra_fabric::testing::TestBackend;
use hytra_fabric::ucx::UcxCluster;
use hytra_fabric::{Backend, ClusterShape, NodeId, RegionSpec};

/// Resident kibibytes of this process, anonymous and shared memory together.
fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .filter(|l| l.starts_with("RssAnon:") || l.starts_with("RssShmem:"))
        .map(|l| {
            let kib = l.split_whitespace().nth(1).expect("a value");
            kib.parse::<u64>().expect("kibibytes")
        })
        .sum()
}

#[test]
fn a_large_region_reads_as_zeros_without_becoming_resident() {
    const REGION: u64 = 512 << 20;
    let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
    let mut b = UcxCluster::for_test(shape, 1);
    let before = resident_kib();
    let key = b.register_all(RegionSpec::new(REGION)).expect("two 512 MiB regions");
    let grown_mib = resident_kib().saturating_sub(before) / 1024;
    // Zeroing them whole would make 1 GiB resident.
    assert!(grown_mib < 128, "registering 2 x 512 MiB made {grown_mib} MiB resident");
    for n in 0..shape.nodes {
        let r = b.region(NodeId(n), key).expect("the region");
        for offset in (0..REGION).step_by(4099 * 8) {
            assert_eq!(r.load(offset), 0, "node {n}, offset {offset}");
        }
        r.store(REGION - 8, 7);
        assert_eq!(r.load(REGION - 8), 7);
    }
}
