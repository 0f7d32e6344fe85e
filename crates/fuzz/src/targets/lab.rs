//! The cluster file (TOML) a user writes for `hytra node` and `hytra cluster`.

use hytra_lab::cluster_file::parse;
use hytra_lab::WORKLOADS;

use crate::Target;

/// The targets of this file.
pub const TARGETS: &[Target] = &[Target {
    name: "cluster-file",
    about: "a cluster file (hytra_lab::cluster_file::parse)",
    seeds,
    run,
}];

fn seeds() -> Vec<Vec<u8>> {
    let files = [
        "token = \"s3cret\"\n\n[[nodes]]\nhost = \"127.0.0.1\"\nport = 7000\n\n\
         [[nodes]]\nhost = \"127.0.0.1\"\nport = 7001\n",
        "token = \"t\"\ntransports = \"tcp\"\nworkload = \"tpcc\"\ndesign = \"fasst\"\n\
         workers = 4\ncoroutines = 8\nreplication = 3\nseconds = 2.5\ntimeout_s = 30\n\
         bench_args = [\"--seed\", \"7\", \"--warehouses\", \"2\"]\n\
         nodes = [{ host = \"a\", port = 1 }, { host = \"b\", port = 2 }, { host = \"c\", port = 3 }]\n",
        "# one point of hytra io\ntoken = \"io\"\nworkload = \"io\"\nworkers = 2\n\
         bench_args = [\"--depths\", \"1,4\"]\n\
         [[nodes]]\nhost = \"localhost\"\nport = 9000\n[[nodes]]\nhost = \"localhost\"\nport = 9001\n",
        "token = \"job\"\ntransports = \"rc\"\nnode_count = 4\n",
    ];
    files.iter().map(|f| f.as_bytes().to_vec()).collect()
}

fn run(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    if let Ok(f) = parse(&text) {
        assert!(f.node_count() > 0 && !f.token.is_empty());
        assert!(f.nodes.is_empty() || f.nodes.len() == f.node_count());
        if f.workload == "io" {
            assert_eq!(f.node_count(), 2);
        } else {
            assert!(WORKLOADS.contains(&f.workload.as_str()));
        }
    }
}
