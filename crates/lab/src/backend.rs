//! Backends by name: a [`BackendSpec`] says which fabric a run uses and how it is set up;
//! [`BackendSpec::with`] builds it and hands it, with its concrete type, to a
//! [`BackendVisitor`]. Not for: what runs on it (see `run.rs`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
#[cfg(feature = "pmix")]
use std::sync::Mutex;
use std::time::Duration;

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::NodeFault;
use hytra_fabric::{Backend, BackendError, ClusterShape};
use hytra_txn::config_store::etcd::EtcdStore;
use hytra_txn::config_store::TcpStore;
use hytra_workloads::bench::Processes;

use crate::cluster_file::Wait;

/// This process's place in a cluster spread over processes.
#[derive(Clone, Debug)]
pub struct Placement {
    /// This process's node.
    pub me: u16,
    /// How the processes meet.
    pub bootstrap: Bootstrap,
    /// Bound on joining and on every exchange.
    pub timeout: Duration,
    /// What the nodes share so that the run survives one of them dying (under `hytra
    /// cluster`, or `hytra hub`); `None` elsewhere.
    pub launcher: Option<Launcher>,
}

/// What a node started by `hytra cluster`, or joining `hytra hub`, shares with the
/// others.
#[derive(Clone, Debug)]
pub struct Launcher {
    /// Where configurations are committed.
    pub store: StoreAt,
    /// The directory where every worker journals its history.
    pub journal: PathBuf,
}

/// Where a node started by `hytra cluster` commits configurations; spelled (by
/// [`FromStr`](std::str::FromStr) and [`Display`](std::fmt::Display)) `ADDR` for the
/// launcher's own store, served over TCP, or `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`
/// for etcd, under the run's key prefix.
#[derive(Clone, Debug)]
pub enum StoreAt {
    /// The store the launcher serves.
    Launcher(SocketAddr),
    /// An etcd cluster.
    Etcd(EtcdStore),
}

impl std::str::FromStr for StoreAt {
    type Err = String;

    fn from_str(s: &str) -> Result<StoreAt, String> {
        let Some(rest) = s.strip_prefix("etcd://") else {
            return s.parse().map(StoreAt::Launcher).map_err(|e| format!("{s:?}: {e}"));
        };
        let (hosts, prefix) = rest
            .find('/')
            .map(|at| rest.split_at(at))
            .ok_or_else(|| format!("{s:?}: no key prefix after the endpoints"))?;
        let endpoints = hosts.split(',').map(resolve_endpoint).collect::<Result<Vec<_>, _>>()?;
        EtcdStore::new(endpoints, prefix).map(StoreAt::Etcd).map_err(|e| e.to_string())
    }
}

impl std::fmt::Display for StoreAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreAt::Launcher(a) => write!(f, "{a}"),
            StoreAt::Etcd(e) => {
                let hosts: Vec<String> = e.endpoints().iter().map(ToString::to_string).collect();
                write!(f, "etcd://{}{}", hosts.join(","), e.prefix())
            }
        }
    }
}

/// The first address `host:port` names.
pub fn resolve_endpoint(e: &str) -> Result<SocketAddr, String> {
    e.trim()
        .to_socket_addrs()
        .map_err(|why| format!("{e}: {why}"))?
        .next()
        .ok_or_else(|| format!("{e}: names no address"))
}

/// The etcd a cluster file names, under `prefix` (not yet asked anything); `None` for a
/// file without one.
pub fn etcd_store(
    f: &crate::cluster_file::ClusterFile,
    prefix: &str,
) -> Result<Option<EtcdStore>, String> {
    let Some(hosts) = f.etcd_endpoints() else {
        return Ok(None);
    };
    let endpoints = hosts.iter().map(|h| resolve_endpoint(h)).collect::<Result<Vec<_>, _>>()?;
    EtcdStore::new(endpoints, prefix).map(Some).map_err(|e| e.to_string())
}

/// How the processes of a cluster meet.
#[derive(Clone, Debug)]
pub enum Bootstrap {
    /// A TCP star around node 0, which listens at `root`; `token` admits a node.
    Tcp {
        /// Node 0's bootstrap address.
        root: SocketAddr,
        /// The cluster token.
        token: String,
    },
    /// The hub that `hytra cluster` or `hytra hub` runs at `addr`: every node is a
    /// member, so that the run outlives any of them.
    Hub {
        /// The hub's address.
        addr: SocketAddr,
        /// The cluster token.
        token: String,
    },
    /// The key-value store of the PMIx launcher that started the process, joined (and
    /// the token checked) already; the run takes it (so a process runs once).
    #[cfg(feature = "pmix")]
    Pmix(Arc<Mutex<Option<hytra_fabric::ucx::PmixExchange>>>),
}

impl Placement {
    /// Joins the other processes of a cluster of `nodes` nodes.
    #[cfg(feature = "ucx")]
    pub fn exchange(
        &self,
        nodes: u16,
    ) -> Result<Box<dyn hytra_fabric::ucx::Exchange>, BackendError> {
        use hytra_fabric::ucx::TcpExchange;
        match &self.bootstrap {
            Bootstrap::Tcp { root, token } => {
                Ok(Box::new(TcpExchange::join(self.me, nodes, *root, token, self.timeout)?))
            }
            Bootstrap::Hub { addr, token } => {
                Ok(Box::new(TcpExchange::join_hub(self.me, nodes, *addr, token, self.timeout)?))
            }
            #[cfg(feature = "pmix")]
            Bootstrap::Pmix(slot) => {
                let ex = slot.lock().expect("the PMIx slot is never poisoned").take();
                let ex = ex.ok_or_else(|| {
                    BackendError::Cluster("the PMIx job serves one run per process".into())
                })?;
                Ok(Box::new(ex))
            }
        }
    }

    /// What the processes share beyond the fabric: under `hytra cluster`, its
    /// configuration store and journal directory; elsewhere a store of this process.
    pub fn processes(&self) -> Processes {
        match &self.launcher {
            None => Processes::default(),
            Some(l) => Processes {
                store: match &l.store {
                    StoreAt::Launcher(addr) => Arc::new(TcpStore::new(*addr)),
                    StoreAt::Etcd(etcd) => Arc::new(etcd.clone()),
                },
                journal: Some(l.journal.clone()),
            },
        }
    }
}

/// How to set up the UCX backend.
#[derive(Clone, Debug)]
pub struct UcxSpec {
    /// Cluster size.
    pub shape: ClusterShape,
    /// UCX transports (`UCX_TLS` syntax); `None`: UCX's choice.
    pub transports: Option<String>,
    /// OS threads of this process; `None`: one per core.
    pub threads: Option<usize>,
    /// How an idle thread waits.
    pub wait: Wait,
    /// This process's place, for a cluster of processes; `None`: every node here.
    pub placement: Option<Placement>,
}

/// Which fabric a run uses.
#[derive(Clone, Debug)]
pub enum BackendSpec {
    /// The simulator (virtual time). Boxed: a simulator's configuration (its NIC
    /// profile and faults) is ten times the size of the others.
    Sim(Box<SimConfig>),
    /// Threads of this process (real time).
    Local(LocalConfig),
    /// UCX: every node in this process, or one node of a cluster of processes. Only
    /// usable in a build with the `ucx` feature.
    Ucx(UcxSpec),
}

/// Receives a backend with its concrete type.
pub trait BackendVisitor {
    /// What the visit returns.
    type Out;
    /// Does something with `b`.
    fn visit<B: Backend>(self, b: &mut B) -> Self::Out;
}

/// A callback with the virtual time (ns), called every so often while a simulation runs.
pub type Progress = Box<dyn FnMut(u64)>;

impl BackendSpec {
    /// The cluster's shape.
    pub fn shape(&self) -> ClusterShape {
        match self {
            BackendSpec::Sim(c) => c.shape,
            BackendSpec::Local(c) => c.shape,
            BackendSpec::Ucx(c) => c.shape,
        }
    }

    /// The nodes it crashes or pauses, and when.
    pub fn node_faults(&self) -> &[NodeFault] {
        match self {
            BackendSpec::Sim(c) => &c.faults.node_faults,
            BackendSpec::Local(c) => &c.node_faults,
            BackendSpec::Ucx(_) => &[],
        }
    }

    /// The same backend without the crashes and pauses it injects (for a trial run).
    pub fn without_node_faults(&self) -> BackendSpec {
        let mut b = self.clone();
        match &mut b {
            BackendSpec::Sim(c) => c.faults.node_faults.clear(),
            BackendSpec::Local(c) => c.node_faults.clear(),
            BackendSpec::Ucx(_) => {}
        }
        b
    }

    /// What the processes of the cluster share beyond the fabric (see
    /// [`Placement::processes`]); a store of this process where every node is here.
    pub fn processes(&self) -> Processes {
        match self {
            BackendSpec::Ucx(UcxSpec { placement: Some(p), .. }) => p.processes(),
            _ => Processes::default(),
        }
    }

    /// Whether this process runs one node of a cluster spread over processes.
    pub fn spread(&self) -> bool {
        matches!(self, BackendSpec::Ucx(UcxSpec { placement: Some(_), .. }))
    }

    /// Whether time is virtual (a simulation).
    pub fn is_sim(&self) -> bool {
        matches!(self, BackendSpec::Sim(_))
    }

    /// Name, as `--backend` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            BackendSpec::Sim(_) => "sim",
            BackendSpec::Local(_) => "local",
            BackendSpec::Ucx(_) => "ucx",
        }
    }

    /// Builds the backend and hands it to `v`; `progress` is called with the virtual
    /// time while a simulation runs (other backends ignore it).
    pub fn with<V: BackendVisitor>(
        &self,
        progress: Option<Progress>,
        v: V,
    ) -> Result<V::Out, BackendError> {
        match self {
            BackendSpec::Sim(c) => {
                let mut b = SimCluster::new(SimConfig::clone(c))?;
                if let Some(p) = progress {
                    b.set_progress(p);
                }
                Ok(v.visit(&mut b))
            }
            BackendSpec::Local(c) => Ok(v.visit(&mut LocalCluster::new(c.clone())?)),
            BackendSpec::Ucx(spec) => with_ucx(spec, v),
        }
    }
}

#[cfg(feature = "ucx")]
fn with_ucx<V: BackendVisitor>(spec: &UcxSpec, v: V) -> Result<V::Out, BackendError> {
    use hytra_fabric::ucx::{UcxCluster, UcxConfig, UcxWaiting};
    let mut uc = UcxConfig::new(spec.shape);
    uc.transports = spec.transports.clone();
    uc.threads = spec.threads;
    uc.waiting = match spec.wait {
        Wait::Poll => UcxWaiting::Poll,
        Wait::Event => UcxWaiting::EVENT,
    };
    let mut b = match &spec.placement {
        None => UcxCluster::new(uc)?,
        Some(p) => {
            uc.hosted = Some(vec![hytra_fabric::NodeId(p.me)]);
            UcxCluster::with_exchange(uc, p.exchange(spec.shape.nodes)?)?
        }
    };
    Ok(v.visit(&mut b))
}

#[cfg(not(feature = "ucx"))]
fn with_ucx<V: BackendVisitor>(_: &UcxSpec, _: V) -> Result<V::Out, BackendError> {
    Err(BackendError::Config(
        "the ucx backend is not in this build: install libucx-dev and build with --features ucx"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_address_reads_back_as_written() {
        for s in [
            "127.0.0.1:2380",
            "etcd://127.0.0.1:2379/hytra/run-1",
            "etcd://127.0.0.1:1,127.0.0.1:2/p",
        ] {
            let at: StoreAt = s.parse().unwrap();
            assert_eq!(at.to_string(), s);
        }
        let err = "etcd://127.0.0.1:2379".parse::<StoreAt>().unwrap_err();
        assert!(err.contains("no key prefix"), "{err}");
        assert!("nowhere".parse::<StoreAt>().is_err());
    }

    #[test]
    fn a_trial_backend_keeps_everything_but_the_crashes() {
        let shape = ClusterShape { nodes: 3, workers_per_node: 1, lanes_per_peer: 1 };
        let crash = NodeFault {
            node: hytra_fabric::NodeId(1),
            at_ns: 1_000,
            kind: hytra_fabric::NodeFaultKind::Crash,
        };
        let mut lc = LocalConfig::new(shape);
        lc.node_faults.push(crash);
        let b = BackendSpec::Local(lc);
        assert_eq!(b.node_faults().len(), 1);
        let t = b.without_node_faults();
        assert!(t.node_faults().is_empty());
        assert_eq!((t.shape(), t.name(), t.spread()), (shape, "local", false));
        // On sim, the datagram faults stay (they are the run's conditions); the crash goes.
        let mut sc = SimConfig::new(shape, 3);
        sc.faults = hytra_fabric::sim::faults::FaultConfig::lossy(1_000);
        let lossy = sc.faults.clone();
        sc.faults.node_faults.push(crash);
        let t = BackendSpec::Sim(Box::new(sc)).without_node_faults();
        let BackendSpec::Sim(c) = &t else { unreachable!("still the simulator") };
        assert!(t.node_faults().is_empty());
        assert_eq!(c.faults, lossy);
        assert_eq!((t.shape(), t.name(), t.is_sim()), (shape, "sim", true));
    }
}
