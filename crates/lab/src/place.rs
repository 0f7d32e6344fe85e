//! Where a process of a cluster file stands ([`Placement`]): node N of the file's
//! `[[nodes]]` meeting the others through node 0's TCP port ([`tcp`]), node N joining
//! `hytra hub` ([`hub`]), or the rank a PMIx launcher gave it (`pmix`, feature `pmix`).
//! Every refusal is the user's to fix and comes before the process waits for anyone.
//! Not for: starting processes (`launch.rs`) or what a node runs.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::backend::{etcd_store, resolve_endpoint, Bootstrap, Launcher, Placement, StoreAt};
use crate::cluster_file::{ClusterFile, NodeEntry};

/// Why a process cannot take its place; the messages name no file (the caller prefixes
/// its path).
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// `--id` on a file without hosts.
    #[error("--id needs the hosts listed as [[nodes]] (or start hytra node under a PMIx launcher: srun --mpi=pmix, mpirun)")]
    NoHosts,
    /// An id or rank beyond the file's nodes.
    #[error("{what} {id} is not a node of the file (0..{nodes})")]
    NotANode {
        /// `--id` or `PMIx rank`.
        what: &'static str,
        /// The id asked for.
        id: u64,
        /// The file's number of nodes.
        nodes: usize,
    },
    /// A host that does not resolve.
    #[error("cannot resolve {0}")]
    Resolve(String),
    /// The hub's address, store or journal directory.
    #[error("{0}")]
    Hub(String),
    /// A launcher's job of another size than the file's.
    #[error("the PMIx job has {size} processes but the file describes {count} nodes: start one process per node (mpirun -np {count}, srun -n {count})")]
    JobSize {
        /// Processes in the job.
        size: u32,
        /// Nodes in the file.
        count: usize,
    },
    /// Joining the launcher's job, or its token check.
    #[error("{0}")]
    Pmix(String),
}

/// Where node `n` of a file listens.
pub fn resolve(n: &NodeEntry) -> Result<SocketAddr, PlaceError> {
    (n.host.as_str(), n.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| PlaceError::Resolve(format!("{}:{}", n.host, n.port)))
}

/// `id` checked against the file's `nodes`.
fn node_of(what: &'static str, id: u64, nodes: usize) -> Result<u16, PlaceError> {
    u16::try_from(id).ok().filter(|&n| usize::from(n) < nodes).ok_or(PlaceError::NotANode {
        what,
        id,
        nodes,
    })
}

/// Node `id` of the file's `[[nodes]]`, meeting the others through node 0's TCP port.
pub fn tcp(f: &ClusterFile, id: u16, timeout: Duration) -> Result<Placement, PlaceError> {
    if f.nodes.is_empty() {
        return Err(PlaceError::NoHosts);
    }
    let me = node_of("--id", id.into(), f.nodes.len())?;
    let root = resolve(&f.nodes[0])?;
    let bootstrap = Bootstrap::Tcp { root, token: f.token.clone() };
    Ok(Placement { me, bootstrap, timeout, launcher: None })
}

/// Node `id` of a file with a hub (checked by the file's parser to come with etcd and a
/// journal): it joins `hytra hub` at the file's address, commits configurations to the
/// run's keys in etcd, and journals in the run's own directory under the file's
/// `journal` (created if missing; named as the keys, so two clusters sharing a directory
/// never mix). This node's journals of an earlier run there are removed first: the run
/// cannot start before every node has joined, so a journal the survivors read is always
/// this run's.
pub fn hub(f: &ClusterFile, id: u16, timeout: Duration) -> Result<Placement, PlaceError> {
    let me = node_of("--id", id.into(), f.node_count())?;
    let (Some(hub), Some(prefix), Some(journal)) = (&f.hub, f.hub_prefix(), &f.journal) else {
        return Err(PlaceError::Hub("the file names no hub, or no journal".into()));
    };
    let addr = resolve_endpoint(hub).map_err(|e| PlaceError::Hub(format!("hub = {e}")))?;
    let etcd =
        etcd_store(f, &prefix).map_err(|e| PlaceError::Hub(format!("store: {e}")))?.ok_or_else(
            || PlaceError::Hub("a file with a hub commits its configurations to etcd".into()),
        )?;
    let run = prefix.rsplit('/').next().expect("a prefix has a last part");
    let dir = journal.join(run);
    let bad = |e: std::io::Error| PlaceError::Hub(format!("journal {}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(bad)?;
    let per = usize::from(f.workers);
    for index in usize::from(me) * per..(usize::from(me) + 1) * per {
        match std::fs::remove_file(hytra_workloads::bench::journal_path(&dir, index)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(bad(e)),
            _ => {}
        }
    }
    let bootstrap = Bootstrap::Hub { addr, token: f.token.clone() };
    let launcher = Launcher { store: StoreAt::Etcd(etcd), journal: dir };
    Ok(Placement { me, bootstrap, timeout, launcher: Some(launcher) })
}

/// Whether a PMIx launcher started this process: it tells its children their namespace
/// and rank in the environment (Slurm's `srun --mpi=pmix` and Open MPI's `mpirun` both).
pub fn launched_by_pmix() -> bool {
    std::env::var_os("PMIX_NAMESPACE").is_some() && std::env::var_os("PMIX_RANK").is_some()
}

/// Whether Open MPI's `mpirun` started this process without `--enable-recovery`, so
/// that the death of any process ends the whole job (it says so in the environment).
pub fn mpirun_ends_job_on_death() -> bool {
    std::env::var_os("OMPI_MCA_orte_hnp_uri").is_some()
        && !std::env::var("OMPI_MCA_orte_enable_recovery").is_ok_and(|v| v == "1")
}

/// This process's rank of the launcher's job as its node. Every check fails the same way
/// in every process of the job, so all stop at once, without waiting for each other.
/// With a hub in the file, the launcher only places the process: a collective of its
/// job would wait for a dead process for ever, so the run goes through the hub, and PMIx
/// is finalized here, while every process still lives.
#[cfg(feature = "pmix")]
pub fn pmix(f: &ClusterFile, timeout: Duration) -> Result<Placement, PlaceError> {
    use hytra_fabric::ucx::PmixExchange;
    use std::sync::{Arc, Mutex};
    let pmix = |e: hytra_fabric::BackendError| PlaceError::Pmix(e.to_string());
    let mut ex = PmixExchange::join(timeout).map_err(pmix)?;
    let (size, count) = (ex.size(), f.node_count());
    if size as usize != count {
        return Err(PlaceError::JobSize { size, count });
    }
    let me = node_of("PMIx rank", ex.rank().into(), count)?;
    ex.check_token(&f.token).map_err(pmix)?;
    if f.hub.is_some() {
        drop(ex);
        return hub(f, me, timeout);
    }
    let bootstrap = Bootstrap::Pmix(Arc::new(Mutex::new(Some(ex))));
    Ok(Placement { me, bootstrap, timeout, launcher: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(extra: &str) -> ClusterFile {
        crate::cluster_file::parse(&format!(
            "token = \"t\"\n{extra}[[nodes]]\nhost = \"127.0.0.1\"\nport = 7000\n\
             [[nodes]]\nhost = \"127.0.0.1\"\nport = 7001\n"
        ))
        .unwrap()
    }

    #[test]
    fn a_node_of_the_tcp_star_meets_node_0() {
        let t = Duration::from_secs(1);
        let p = tcp(&file(""), 1, t).unwrap();
        assert_eq!(p.me, 1);
        assert!(p.launcher.is_none());
        assert!(matches!(p.bootstrap, Bootstrap::Tcp { root, .. } if root.port() == 7000));
        let e = tcp(&file(""), 2, t).unwrap_err();
        assert!(matches!(e, PlaceError::NotANode { id: 2, nodes: 2, .. }), "{e}");
        let counted = crate::cluster_file::parse("token = \"t\"\nnode_count = 2\n").unwrap();
        assert!(matches!(tcp(&counted, 0, t), Err(PlaceError::NoHosts)));
    }

    #[test]
    fn a_node_of_a_hub_joins_it_with_the_files_store_and_journal() {
        let journal = std::env::temp_dir().join(format!("hytra-place-{}", std::process::id()));
        let f = file(&format!(
            "workers = 2\nhub = \"127.0.0.1:7100\"\nstore = \"etcd://127.0.0.1:2379\"\njournal = {:?}\n",
            journal.display().to_string()
        ));
        let prefix = f.hub_prefix().unwrap();
        let dir = journal.join(prefix.rsplit('/').next().unwrap());
        // An earlier run's journals: node 1's (workers 2 and 3) go, node 0's stay.
        std::fs::create_dir_all(&dir).unwrap();
        let old = |i: usize| hytra_workloads::bench::journal_path(&dir, i);
        for i in 0..4 {
            std::fs::write(old(i), "earlier run").unwrap();
        }
        let t = Duration::from_secs(1);
        let p = hub(&f, 1, t).unwrap();
        assert!(matches!(p.bootstrap, Bootstrap::Hub { addr, .. } if addr.port() == 7100));
        let l = p.launcher.expect("a hub's node shares the store and journals");
        assert_eq!(l.journal, dir, "the run's own directory under the file's");
        assert!(matches!(&l.store, StoreAt::Etcd(e) if e.prefix() == prefix));
        assert_eq!((0..4).map(|i| old(i).exists()).collect::<Vec<_>>(), [true, true, false, false]);
        assert!(matches!(hub(&f, 2, t), Err(PlaceError::NotANode { .. })));
        assert!(matches!(hub(&file(""), 0, t), Err(PlaceError::Hub(_))));
        std::fs::remove_dir_all(&journal).unwrap();
    }
}
