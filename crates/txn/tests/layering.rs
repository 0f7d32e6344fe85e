//! The engine depends on no side system's service code (docs/ARCHITECTURE.md, the layers): the NIC
//! lookup's layout comes from `hytra-nicindex`, its verb programs from the engine's
//! caller. Read from the manifest, so that a dependency added back fails here and not
//! only in review.

#[test]
fn the_engine_depends_on_no_side_system() {
    let manifest = include_str!("../Cargo.toml");
    let deps: Vec<&str> = manifest
        .lines()
        .skip_while(|l| l.trim() != "[dependencies]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split(['=', ' ', '.']).next().filter(|d| !d.is_empty()))
        .collect();
    assert!(deps.contains(&"hytra-nicindex"), "the layout crate is a dependency: {deps:?}");
    for side in ["hytra-offload", "hytra-io", "hytra-workloads", "hytra-lab"] {
        assert!(!deps.contains(&side), "txn depends on {side}: {deps:?}");
    }
}
