//! Backends by name: a [`BackendSpec`] says which fabric a run uses and how it is set up;
//! [`BackendSpec::with`] builds it and hands it, with its concrete type, to a
//! [`BackendVisitor`]. Not for: what runs on it (see `run.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::NodeFault;
use hytra_fabric::{Backend, BackendError, ClusterShape};

/// A node's place in a cluster spread over processes (its peers are reached through
/// node 0's bootstrap address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// This process's node.
    pub me: u16,
    /// Node 0's bootstrap address.
    pub root: SocketAddr,
    /// The cluster token.
    pub token: String,
    /// Bound on joining and on every exchange.
    pub timeout: Duration,
}

/// How to set up the UCX backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UcxSpec {
    /// Cluster size.
    pub shape: ClusterShape,
    /// UCX transports (`UCX_TLS` syntax); `None`: UCX's choice.
    pub transports: Option<String>,
    /// OS threads of this process; `None`: one per core.
    pub threads: Option<usize>,
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
    use hytra_fabric::ucx::{TcpExchange, UcxCluster, UcxConfig};
    let mut uc = UcxConfig::new(spec.shape);
    uc.transports = spec.transports.clone();
    uc.threads = spec.threads;
    let mut b = match &spec.placement {
        None => UcxCluster::new(uc)?,
        Some(p) => {
            uc.hosted = Some(vec![hytra_fabric::NodeId(p.me)]);
            let ex = TcpExchange::join(p.me, spec.shape.nodes, p.root, &p.token, p.timeout)?;
            UcxCluster::with_exchange(uc, Box::new(ex))?
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
