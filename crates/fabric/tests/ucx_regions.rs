//! Registered regions of the `ucx` backend: large ones go on explicit huge pages where
//! the host has free ones (and the transports let hytra allocate them: a network, not
//! shared memory), and a region that cannot be registered is a clear error naming the
//! node, the size and UCX's reason. Alone in its test binary, so that the host's huge
//! page counters move only for this test.
#![cfg(all(feature = "ucx", target_os = "linux"))]

use hytra_fabric::ucx::{UcxCluster, UcxConfig};
use hytra_fabric::{Backend, ClusterShape, NodeId, RegionSpec};

fn one_node(transports: &str) -> UcxCluster {
    let shape = ClusterShape { nodes: 1, workers_per_node: 1, lanes_per_peer: 1 };
    let mut config = UcxConfig::new(shape);
    config.transports = Some(transports.to_string());
    UcxCluster::new(config).expect("UCX cluster")
}

/// Huge pages of the host neither used nor reserved.
fn available_huge_pages() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        let line = info.lines().find(|l| l.starts_with(name)).unwrap_or("x 0");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    field("HugePages_Free:") - field("HugePages_Rsvd:")
}

#[test]
fn large_regions_use_huge_pages_where_the_host_has_them() {
    const REGION: u64 = 4 << 20;
    let before = available_huge_pages();
    let mut b = one_node("tcp");
    let key = b.register(NodeId(0), RegionSpec::new(REGION)).expect("a 4 MiB region");
    let taken = before.saturating_sub(available_huge_pages());
    if before >= 2 {
        assert!(taken >= 2, "{before} huge pages were free and the region took {taken}");
    } else {
        eprintln!("this host has no free huge pages: the region is on ordinary pages");
        assert_eq!(taken, 0);
    }
    let r = b.region(NodeId(0), key).unwrap();
    for offset in (0..REGION).step_by(4096) {
        assert_eq!(r.load(offset), 0, "offset {offset}");
    }
    r.store(REGION - 8, 7);
    assert_eq!(r.load(REGION - 8), 7);
    drop(r);
    drop(b);
    assert_eq!(available_huge_pages(), before, "the huge pages went back");
}

#[test]
fn a_region_that_cannot_be_registered_is_a_clear_error() {
    // Over TCP UCP allocates from the heap or an anonymous mapping, which refuses a
    // petabyte at once (a shared-memory allocator could first fill /dev/shm).
    let mut b = one_node("tcp");
    let e = b.register(NodeId(0), RegionSpec::new(1 << 50)).expect_err("a petabyte");
    let msg = e.to_string();
    assert!(msg.contains("cannot register a region of 1125899906842624 bytes on"), "{msg}");
    assert!(msg.contains("UCX: ucp_mem_map"), "{msg}");
}
