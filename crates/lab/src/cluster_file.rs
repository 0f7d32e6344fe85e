//! The cluster file: a TOML file that names the nodes of a cluster of processes (host and
//! bootstrap port; or only their number, for processes a PMIx launcher starts), the
//! cluster token, the UCX transports and the benchmark to run.
//! [`parse`] reads and checks one; running it is the `hytra` binary's business (`hytra
//! node`, `hytra cluster`). Not for: resolving hosts or building the benchmark's options.

use serde::Deserialize;
use thiserror::Error;

use crate::{unknown_workload, WORKLOADS};

/// A cluster file.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Shared secret: a node presenting another one is refused.
    pub token: String,
    /// UCX transports (UCX_TLS syntax).
    #[serde(default = "default_transports")]
    pub transports: String,
    /// Workload name, as for `hytra bench --workload`, or `io` for one point of `hytra
    /// io` on two nodes.
    #[serde(default = "default_workload")]
    pub workload: String,
    /// Design preset; `None`: [`ClusterFile::design`] chooses from the transports.
    pub design: Option<String>,
    /// What a node's threads do when they have nothing to do; `None`: poll.
    pub wait: Option<Wait>,
    /// Workers per node (connections for `io`).
    #[serde(default = "one")]
    pub workers: u16,
    /// Coroutines per worker.
    pub coroutines: Option<u16>,
    /// Replication factor.
    pub replication: Option<u16>,
    /// Measured seconds.
    pub seconds: Option<f64>,
    /// Seconds a node waits for the others (joining, and every exchange).
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// Further `hytra bench` (or `hytra io`) options, spelled as on its command line.
    #[serde(default)]
    pub bench_args: Vec<String>,
    /// The nodes, node 0 first, where `hytra node --id` meets its peers (the TCP
    /// bootstrap). Not needed under a PMIx launcher, which tells every process its place.
    #[serde(default)]
    pub nodes: Vec<NodeEntry>,
    /// How many nodes the cluster has, for a file without `[[nodes]]`; with them, it
    /// must equal their number. Under a launcher the job must have this many processes.
    pub node_count: Option<u16>,
    /// Where `hytra cluster` commits the configurations of a run (recovery's
    /// compare-and-set): `etcd://HOST:PORT[,HOST:PORT...]`, the client endpoints of an
    /// etcd (3.4 or later) cluster. `None`: the launcher holds the store itself.
    pub store: Option<String>,
    /// `HOST:PORT` where `hytra hub` serves the nodes of a cluster, so that the run
    /// outlives any node: every node joins the hub instead of node 0 (started by hand
    /// with `hytra node --id`) or of the PMIx launcher's collectives (under `mpirun
    /// --enable-recovery`). Needs an etcd `store` and a `journal`.
    pub hub: Option<String>,
    /// With `hub`: the directory where every worker journals its history, which the
    /// survivors read a dead node's part from, so one every host reaches (on several
    /// hosts, a shared file system).
    pub journal: Option<std::path::PathBuf>,
}

/// What a node's threads do when none of their workers has work (`hytra bench --wait`).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Wait {
    /// Keep polling, yielding the core at once when there is nothing to do.
    Poll,
    /// Once idle for a while (`ucx::EVENT_SPIN`), sleep until UCX has an event: leaves
    /// idle cores to other work on the host.
    Event,
}

impl Wait {
    /// Every way, in the order `--wait` lists them.
    pub const ALL: [Wait; 2] = [Wait::Poll, Wait::Event];

    /// As `--wait` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Wait::Poll => "poll",
            Wait::Event => "event",
        }
    }

    /// The way named `name`, as [`Wait::name`] spells it.
    pub fn parse(name: &str) -> Option<Wait> {
        Wait::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// The design a cluster file runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileDesign {
    /// The file's own `design`.
    Named(String),
    /// No `design`: DrTM+H's preset.
    Drtmh,
    /// No `design`, and the nodes reach each other only over TCP: DrTM+H with every phase
    /// on RPCs and no location cache, which is `fasst` with DrTM+H's passive ACK.
    DrtmhTwoSided,
}

impl FileDesign {
    /// The `--design` it runs.
    pub fn name(&self) -> &str {
        match self {
            FileDesign::Named(d) => d,
            FileDesign::Drtmh | FileDesign::DrtmhTwoSided => "drtmh",
        }
    }
}

/// Transports that carry one-sided operations only as messages the target's CPU answers
/// (UCX's software RMA), and those that never leave the host.
const EMULATED_RMA: [&str; 2] = ["tcp", "sockcm"];
const ON_HOST: [&str; 8] = ["sm", "shm", "posix", "sysv", "mm", "cma", "knem", "xpmem"];

/// The scheme of [`ClusterFile::store`].
const ETCD_SCHEME: &str = "etcd://";

impl ClusterFile {
    /// The etcd endpoints of [`ClusterFile::store`] (`host:port` each, checked by
    /// [`parse`]), if the file names one.
    pub fn etcd_endpoints(&self) -> Option<Vec<String>> {
        let rest = self.store.as_deref()?.strip_prefix(ETCD_SCHEME)?;
        Some(rest.split(',').map(|e| e.trim().to_string()).collect())
    }

    /// The design to run: the file's, else DrTM+H, with every phase on RPCs (and no
    /// location cache) where nodes reach each other only over TCP (no other network
    /// transport, and shared memory absent or the nodes on several hosts). TCP emulates
    /// one-sided operations on the target's CPU, so there the one-sided phases cost more
    /// than RPCs (the two-sided design ran 4.8-8x the others: docs/PERFORMANCE.md §18),
    /// and the hybrid's choice for each phase is the RPC.
    pub fn design(&self) -> FileDesign {
        if let Some(d) = &self.design {
            return FileDesign::Named(d.clone());
        }
        let names: Vec<&str> = self
            .transports
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty() && *n != "self")
            .collect();
        // Shared memory carries what stays on one host: TCP only between hosts.
        let hosts: std::collections::BTreeSet<&str> =
            self.nodes.iter().map(|n| n.host.as_str()).collect();
        let on_host = names.iter().any(|n| ON_HOST.contains(n));
        let tcp_only = !self.transports.trim_start().starts_with('^')
            && names.iter().any(|n| EMULATED_RMA.contains(n))
            && names.iter().all(|n| EMULATED_RMA.contains(n) || ON_HOST.contains(n))
            && (!on_host || hosts.len() > 1);
        if tcp_only {
            FileDesign::DrtmhTwoSided
        } else {
            FileDesign::Drtmh
        }
    }

    /// The key prefix in etcd of a run served by `hytra hub`: the same in every node,
    /// which cannot ask a launcher for one, and different for each token and hub (two
    /// clusters sharing an etcd never mix). The hub clears it before and after the run.
    pub fn hub_prefix(&self) -> Option<String> {
        let hub = self.hub.as_deref()?;
        // FNV-1a: stable across builds and hosts, unlike the standard library's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.token.bytes().chain([0]).chain(hub.bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        Some(format!("/hytra/hub-{h:016x}"))
    }

    /// How many nodes the cluster has (checked by [`parse`] to be at least one).
    pub fn node_count(&self) -> usize {
        self.node_count.map_or(self.nodes.len(), usize::from)
    }
}

/// One node of a cluster file.
#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// Host name or address.
    pub host: String,
    /// Bootstrap port.
    pub port: u16,
}

fn default_transports() -> String {
    "sm".into()
}
fn default_workload() -> String {
    "smallbank".into()
}
fn one() -> u16 {
    1
}
fn default_timeout() -> u64 {
    120
}

/// Why a cluster file was refused. The messages name no file: the caller prefixes the
/// path.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ClusterFileError {
    /// Not TOML, or not the fields of a cluster file.
    #[error("line {line}: {message}")]
    Toml {
        /// Where the parser stopped (1-based).
        line: usize,
        /// What it found wrong.
        message: String,
    },
    /// A setting out of its range.
    #[error("{key} = {value}: expected {range}")]
    Range {
        /// The setting.
        key: &'static str,
        /// Its value.
        value: String,
        /// What it may be.
        range: &'static str,
    },
    /// Neither `[[nodes]]` nor a positive `node_count`.
    #[error("no [[nodes]] and no node_count (say how many nodes the cluster has)")]
    NoNodes,
    /// `node_count` and the `[[nodes]]` disagree.
    #[error("node_count = {count} but {listed} [[nodes]] are listed")]
    NodeCount {
        /// `node_count`.
        count: u16,
        /// How many `[[nodes]]`.
        listed: usize,
    },
    /// An empty token.
    #[error("the token must not be empty")]
    EmptyToken,
    /// `workload = "io"` on other than two nodes.
    #[error("workload 'io' runs on two nodes (node 0 reads node 1's file), not {0}")]
    IoNodes(usize),
    /// `workload = "io"` with settings of a transactional benchmark.
    #[error("coroutines and replication are not io settings (use --depths in bench_args)")]
    IoSettings,
    /// `hub` without what a hand-started cluster needs to outlive a node, or with a
    /// job that cannot.
    #[error("hub = {hub:?}: {why}")]
    Hub {
        /// The file's `hub`.
        hub: String,
        /// What is missing or wrong.
        why: &'static str,
    },
    /// `journal` without `hub` (elsewhere the launcher keeps the journals).
    #[error(
        "journal is the directory of a run served by hytra hub: give hub too, or leave journal out"
    )]
    JournalWithoutHub,
    /// A workload that is neither `io` nor one of [`WORKLOADS`].
    #[error("{}", unknown_workload(.0))]
    UnknownWorkload(String),
}

/// Parses and checks a cluster file's text.
pub fn parse(text: &str) -> Result<ClusterFile, ClusterFileError> {
    let f: ClusterFile = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(0, |r| r.start.min(text.len()));
        let line = text[..at].matches('\n').count() + 1;
        ClusterFileError::Toml { line, message: e.message().to_string() }
    })?;
    let range = |key, value: String, range| Err(ClusterFileError::Range { key, value, range });
    if f.workers == 0 {
        return range("workers", "0".into(), "at least 1");
    }
    if f.coroutines == Some(0) {
        return range("coroutines", "0".into(), "at least 1");
    }
    if f.replication == Some(0) {
        return range("replication", "0".into(), "at least 1");
    }
    if let Some(s) = f.seconds.filter(|s| !(s.is_finite() && *s > 0.0)) {
        return range("seconds", s.to_string(), "a positive number");
    }
    if f.timeout_s == 0 {
        return range("timeout_s", "0".into(), "at least 1");
    }
    match f.node_count {
        Some(0) => return Err(ClusterFileError::NoNodes),
        Some(count) if !f.nodes.is_empty() && usize::from(count) != f.nodes.len() => {
            return Err(ClusterFileError::NodeCount { count, listed: f.nodes.len() })
        }
        None if f.nodes.is_empty() => return Err(ClusterFileError::NoNodes),
        _ => {}
    }
    if f.token.is_empty() {
        return Err(ClusterFileError::EmptyToken);
    }
    let endpoint_ok = |e: &str| {
        e.trim().rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
        })
    };
    if let Some(store) = &f.store {
        let ok =
            store.strip_prefix(ETCD_SCHEME).is_some_and(|rest| rest.split(',').all(endpoint_ok));
        if !ok {
            return range("store", format!("{store:?}"), "\"etcd://HOST:PORT[,HOST:PORT...]\"");
        }
    }
    check_hub(&f, endpoint_ok)?;
    if f.workload == "io" {
        if f.node_count() != 2 {
            return Err(ClusterFileError::IoNodes(f.node_count()));
        }
        if f.coroutines.is_some() || f.replication.is_some() {
            return Err(ClusterFileError::IoSettings);
        }
        return Ok(f);
    }
    if !WORKLOADS.contains(&f.workload.as_str()) {
        return Err(ClusterFileError::UnknownWorkload(f.workload));
    }
    Ok(f)
}

/// The settings of a cluster served by `hytra hub` belong together: configurations in
/// etcd (no process of the run holds them), and journals the survivors can read.
fn check_hub(f: &ClusterFile, endpoint_ok: impl Fn(&str) -> bool) -> Result<(), ClusterFileError> {
    let Some(hub) = &f.hub else {
        return match f.journal {
            Some(_) => Err(ClusterFileError::JournalWithoutHub),
            None => Ok(()),
        };
    };
    let why = if !endpoint_ok(hub) {
        "expected \"HOST:PORT\""
    } else if f.etcd_endpoints().is_none() {
        "no process of the run may hold its configurations: give store = \"etcd://HOST:PORT\""
    } else if f.journal.as_ref().is_none_or(|j| j.as_os_str().is_empty()) {
        "the survivors read a dead node's part from its journal: give journal = \"DIR\", a directory every host reaches"
    } else if f.workload == "io" {
        "workload 'io' does not survive a dead node: leave hub out"
    } else {
        return Ok(());
    };
    Err(ClusterFileError::Hub { hub: hub.clone(), why })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_design_is_two_sided_where_only_tcp_joins_the_nodes() {
        let file = |tls: &str, hosts: [&str; 2], design: &str| {
            let nodes: String = hosts
                .iter()
                .enumerate()
                .map(|(i, h)| format!("[[nodes]]\nhost = \"{h}\"\nport = {}\n", 7000 + i))
                .collect();
            parse(&format!("token = \"t\"\ntransports = \"{tls}\"\n{design}{nodes}")).unwrap()
        };
        let one = ["127.0.0.1", "127.0.0.1"];
        let two = ["10.0.0.1", "10.0.0.2"];
        use FileDesign::{Drtmh, DrtmhTwoSided};
        for (tls, hosts, want) in [
            ("tcp", one, DrtmhTwoSided),
            ("tcp,self", two, DrtmhTwoSided),
            ("sm,tcp", two, DrtmhTwoSided),
            ("sm,tcp", one, Drtmh),
            ("sm", one, Drtmh),
            ("rc,sm,tcp", two, Drtmh),
            ("^rc", two, Drtmh),
            ("all", two, Drtmh),
        ] {
            let design = file(tls, hosts, "").design();
            assert_eq!(design, want, "{tls} on {hosts:?}");
            assert_eq!(design.name(), "drtmh");
        }
        let own = file("tcp", one, "design = \"drtmr\"\n").design();
        assert_eq!(own, FileDesign::Named("drtmr".into()), "the file's own");
        assert_eq!(own.name(), "drtmr");
    }

    #[test]
    fn a_store_is_an_etcd_url_or_refused() {
        let f = |extra: &str| parse(&format!("token = \"t\"\nnode_count = 2\n{extra}"));
        assert_eq!(f("").unwrap().etcd_endpoints(), None);
        let one = f("store = \"etcd://127.0.0.1:2379\"\n").unwrap();
        assert_eq!(one.etcd_endpoints(), Some(vec!["127.0.0.1:2379".to_string()]));
        let two = f("store = \"etcd://a:1, b:2\"\n").unwrap();
        assert_eq!(two.etcd_endpoints(), Some(vec!["a:1".to_string(), "b:2".to_string()]));
        for bad in ["zk://a:1", "etcd://", "etcd://a", "etcd://a:0", "etcd://a:1,", "etcd://a:1/x"]
        {
            let e = f(&format!("store = \"{bad}\"\n")).unwrap_err();
            assert!(matches!(e, ClusterFileError::Range { key: "store", .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn a_hub_comes_with_nodes_an_etcd_store_and_a_journal() {
        let nodes = "[[nodes]]\nhost = \"127.0.0.1\"\nport = 7000\n";
        let full =
            "hub = \"127.0.0.1:7100\"\nstore = \"etcd://127.0.0.1:2379\"\njournal = \"/tmp/j\"\n";
        let f = |extra: &str, nodes: &str| parse(&format!("token = \"t\"\n{extra}{nodes}"));
        let ok = f(full, nodes).unwrap();
        assert_eq!(ok.hub.as_deref(), Some("127.0.0.1:7100"));
        let prefix = ok.hub_prefix().unwrap();
        assert!(prefix.starts_with("/hytra/hub-"), "{prefix}");
        let other = f(&full.replace("7100", "7101"), nodes).unwrap();
        assert_ne!(other.hub_prefix(), Some(prefix), "another hub, other keys");
        assert_eq!(f("", nodes).unwrap().hub_prefix(), None);
        let refused = |extra: &str, nodes: &str, says: &str| {
            let e = f(extra, nodes).unwrap_err();
            assert!(matches!(e, ClusterFileError::Hub { .. }), "{extra}: {e}");
            assert!(e.to_string().contains(says), "{extra}: {e}");
        };
        refused(&full.replace("127.0.0.1:7100", "nowhere"), nodes, "HOST:PORT");
        let counted = f(&format!("node_count = 2\n{full}"), "").unwrap();
        assert_eq!(counted.node_count(), 2, "a launcher's job needs no hosts");
        refused(&full.replace("store = \"etcd://127.0.0.1:2379\"\n", ""), nodes, "etcd");
        refused(&full.replace("journal = \"/tmp/j\"\n", ""), nodes, "journal");
        refused(&full.replace("journal = \"/tmp/j\"", "journal = \"\""), nodes, "journal");
        let two = format!("{nodes}[[nodes]]\nhost = \"127.0.0.1\"\nport = 7001\n");
        refused(&format!("workload = \"io\"\n{full}"), &two, "io");
        assert_eq!(f("journal = \"/tmp/j\"\n", nodes), Err(ClusterFileError::JournalWithoutHub));
    }

    #[test]
    fn the_wait_is_the_files_or_none() {
        let f = |extra: &str| parse(&format!("token = \"t\"\nnode_count = 2\n{extra}"));
        assert_eq!(f("").unwrap().wait, None);
        assert_eq!(f("wait = \"event\"\n").unwrap().wait, Some(Wait::Event));
        assert_eq!(f("wait = \"poll\"\n").unwrap().wait, Some(Wait::Poll));
        assert!(matches!(f("wait = \"spin\"\n"), Err(ClusterFileError::Toml { line: 3, .. })));
        for w in Wait::ALL {
            assert_eq!(Wait::parse(w.name()), Some(w));
        }
        assert_eq!(Wait::parse("spin"), None);
    }

    #[test]
    fn the_example_files_parse() {
        for (name, text) in [
            ("cluster-3", include_str!("../../../examples/cluster-3.toml")),
            ("cluster-3-tcp", include_str!("../../../examples/cluster-3-tcp.toml")),
            ("cluster-3-tcp-ycsb", include_str!("../../../examples/cluster-3-tcp-ycsb.toml")),
            ("cluster-pmix-3", include_str!("../../../examples/cluster-pmix-3.toml")),
            ("cluster-4-kill", include_str!("../../../examples/cluster-4-kill.toml")),
            ("cluster-4-hub", include_str!("../../../examples/cluster-4-hub.toml")),
            ("io-2", include_str!("../../../examples/io-2.toml")),
        ] {
            let f = parse(text).unwrap_or_else(|e| panic!("examples/{name}.toml: {e}"));
            if name.contains("tcp") {
                assert_eq!(f.design(), FileDesign::DrtmhTwoSided, "{name}");
            }
        }
    }

    #[test]
    fn a_file_parses_with_defaults_and_bad_ones_are_refused() {
        let f = parse(
            "token = \"t\"\n[[nodes]]\nhost = \"127.0.0.1\"\nport = 7000\n\
             [[nodes]]\nhost = \"127.0.0.1\"\nport = 7001\n",
        )
        .unwrap();
        assert_eq!((f.workload.as_str(), f.workers, f.timeout_s), ("smallbank", 1, 120));
        assert_eq!(f.nodes[1], NodeEntry { host: "127.0.0.1".into(), port: 7001 });
        assert_eq!(parse("token = \"t\"\nnodes = []\n"), Err(ClusterFileError::NoNodes));
        let one = "[[nodes]]\nhost = \"h\"\nport = 1\n";
        assert_eq!(parse(&format!("token = \"\"\n{one}")), Err(ClusterFileError::EmptyToken));
        assert_eq!(
            parse(&format!("token = \"t\"\nworkload = \"io\"\n{one}")),
            Err(ClusterFileError::IoNodes(1))
        );
        assert_eq!(
            parse(&format!("token = \"t\"\nworkload = \"nope\"\n{one}")),
            Err(ClusterFileError::UnknownWorkload("nope".into()))
        );
        assert!(matches!(parse("token = 3\n"), Err(ClusterFileError::Toml { line: 1, .. })));
        assert!(matches!(
            parse("token = \"t\"\nworkers = \"x\"\n"),
            Err(ClusterFileError::Toml { line: 2, .. })
        ));
        let zero = parse("token = \"t\"\nnode_count = 2\nworkers = 0\n");
        assert!(matches!(zero, Err(ClusterFileError::Range { key: "workers", .. })), "{zero:?}");
        assert!(parse(&format!("token = \"t\"\nextra = 1\n{one}")).is_err(), "unknown field");
        // A launcher's job needs only the number of nodes.
        let counted = parse("token = \"t\"\nnode_count = 3\n").unwrap();
        assert_eq!((counted.node_count(), counted.nodes.len()), (3, 0));
        assert_eq!(parse("token = \"t\"\nnode_count = 0\n"), Err(ClusterFileError::NoNodes));
        assert_eq!(
            parse(&format!("token = \"t\"\nnode_count = 2\n{one}")),
            Err(ClusterFileError::NodeCount { count: 2, listed: 1 })
        );
        assert_eq!(
            parse(&format!("token = \"t\"\nnode_count = 1\n{one}")).unwrap().node_count(),
            1
        );
    }
}
