//! `hytra node` and `hytra cluster`: a benchmark on a cluster of processes over UCX.
//!
//! A cluster file (TOML) names the nodes (host and bootstrap port, or only their number),
//! the cluster token, the UCX transports and the benchmark. `hytra node` runs one node
//! and learns which in one of two ways: under a PMIx launcher (`srun --mpi=pmix`,
//! `mpirun`; feature `pmix`) its rank is its node, and the launcher's key-value store
//! carries addresses and results; with `--id N` it is node N of the file's `[[nodes]]`
//! and joins the others through node 0's TCP bootstrap port. Either way node 0 prints the
//! cluster's report. `hytra cluster` starts every node of a one-machine file as a child
//! process and stops them all on exit, error or Ctrl-C.
//!
//! `workload = "io"` runs one point of `hytra io` on two nodes instead (node 0 reads
//! node 1's file; `bench_args` are `hytra io` options, `workers` its connections).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
#[cfg(feature = "ucx")]
use std::process::{Child, Command, Stdio};
#[cfg(feature = "pmix")]
use std::sync::{Arc, Mutex};
use std::time::Duration;
#[cfg(feature = "ucx")]
use std::time::Instant;

use clap::{Args, Parser};
use hytra_lab::cluster_file::{self, ClusterFile, NodeEntry};

use crate::bench::{run_bench, BenchArgs};
use crate::io::IoArgs;
use crate::span::Span;
use crate::{usage, CliError};

/// This process's place in a cluster of processes.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "ucx"), allow(dead_code))]
pub struct Placement {
    /// Node id.
    pub me: u16,
    /// How the processes meet.
    pub bootstrap: Bootstrap,
    /// Bound on joining and on every exchange.
    pub timeout: Duration,
    /// What `hytra cluster` shares with its nodes so that the run survives one of them
    /// dying; `None` elsewhere.
    pub launcher: Option<Launcher>,
}

/// What a node started by `hytra cluster` learns of its launcher.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "ucx"), allow(dead_code))]
pub struct Launcher {
    /// Where configurations are committed.
    pub store: StoreAt,
    /// The directory where every worker journals its history.
    pub journal: PathBuf,
}

/// Where a node started by `hytra cluster` commits configurations; passed to it as
/// `--store ADDR` (the launcher's own store, served over TCP) or
/// `--store etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (etcd, under the run's key prefix).
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "ucx"), allow(dead_code))]
pub enum StoreAt {
    /// The store the launcher serves.
    Launcher(SocketAddr),
    /// An etcd cluster.
    Etcd(hytra_txn::config_store::etcd::EtcdStore),
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
        hytra_txn::config_store::etcd::EtcdStore::new(endpoints, prefix)
            .map(StoreAt::Etcd)
            .map_err(|e| e.to_string())
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
fn resolve_endpoint(e: &str) -> Result<SocketAddr, String> {
    e.trim()
        .to_socket_addrs()
        .map_err(|why| format!("{e}: {why}"))?
        .next()
        .ok_or_else(|| format!("{e}: names no address"))
}

/// How the processes of a cluster meet.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "ucx"), allow(dead_code))]
pub enum Bootstrap {
    /// A TCP star around node 0, which listens at `root`; `token` admits a node.
    Tcp {
        /// Node 0's bootstrap address.
        root: SocketAddr,
        /// The cluster token.
        token: String,
    },
    /// The hub that `hytra cluster` runs at `addr`: every node is a member, so that the
    /// run outlives any of them.
    Hub {
        /// The hub's address.
        addr: SocketAddr,
        /// The cluster token.
        token: String,
    },
    /// The key-value store of the PMIx launcher that started the process, joined (and
    /// the token checked) already; the run takes it.
    #[cfg(feature = "pmix")]
    Pmix(Arc<Mutex<Option<hytra_fabric::ucx::PmixExchange>>>),
}

impl Placement {
    /// Joins the other processes of a cluster of `nodes` nodes.
    #[cfg(feature = "ucx")]
    pub fn exchange(
        &self,
        nodes: u16,
    ) -> Result<Box<dyn hytra_fabric::ucx::Exchange>, hytra_fabric::BackendError> {
        match &self.bootstrap {
            Bootstrap::Tcp { root, token } => Ok(Box::new(hytra_fabric::ucx::TcpExchange::join(
                self.me,
                nodes,
                *root,
                token,
                self.timeout,
            )?)),
            Bootstrap::Hub { addr, token } => {
                Ok(Box::new(hytra_fabric::ucx::TcpExchange::join_hub(
                    self.me,
                    nodes,
                    *addr,
                    token,
                    self.timeout,
                )?))
            }
            #[cfg(feature = "pmix")]
            Bootstrap::Pmix(slot) => {
                let ex = slot.lock().expect("the PMIx slot is never poisoned").take();
                let ex = ex.ok_or_else(|| {
                    hytra_fabric::BackendError::Cluster(
                        "the PMIx job serves one run per process".into(),
                    )
                })?;
                Ok(Box::new(ex))
            }
        }
    }
}

/// Reads and checks a cluster file; every message names the file.
fn read_file(path: &Path) -> Result<ClusterFile, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    cluster_file::parse(&text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))
}

/// What a cluster file runs.
enum Job {
    Bench(Box<BenchArgs>),
    Io(Box<IoArgs>),
}

fn job(f: &ClusterFile, json: Option<&Path>) -> Result<Job, CliError> {
    match f.workload.as_str() {
        "io" => io_args(f, json).map(|a| Job::Io(Box::new(a))),
        _ => bench_args(f, json).map(|a| Job::Bench(Box::new(a))),
    }
}

/// The `hytra io` arguments of a cluster file whose workload is `io`.
fn io_args(f: &ClusterFile, json: Option<&Path>) -> Result<IoArgs, CliError> {
    let connections = ("connections", f.workers.to_string());
    parse_args("io", f, json, vec![connections])
}

/// The `hytra bench` arguments a cluster file stands for.
fn bench_args(f: &ClusterFile, json: Option<&Path>) -> Result<BenchArgs, CliError> {
    let mut own = vec![
        ("workload", f.workload.clone()),
        ("design", f.design()),
        ("nodes", f.node_count().to_string()),
        ("workers", f.workers.to_string()),
    ];
    own.extend(f.wait.map(|w| ("wait", w.name().to_string())));
    own.extend(f.coroutines.map(|c| ("coroutines", c.to_string())));
    own.extend(f.replication.map(|r| ("replication", r.to_string())));
    parse_args("bench", f, json, own)
}

/// Parses the options of `hytra <command>` that a cluster file stands for: the backend
/// and transports, `own` (the command's own settings from the file), the measured
/// seconds, the JSON output, then the file's further options.
fn parse_args<T: clap::Args + clap::FromArgMatches>(
    command: &str,
    f: &ClusterFile,
    json: Option<&Path>,
    own: Vec<(&str, String)>,
) -> Result<T, CliError> {
    let mut argv: Vec<String> = vec![command.into()];
    let mut push = |k: &str, v: String| {
        argv.push(format!("--{k}"));
        argv.push(v);
    };
    push("backend", "ucx".into());
    push("transports", f.transports.clone());
    for (k, v) in own {
        push(k, v);
    }
    if let Some(s) = f.seconds {
        // Bare seconds, which --duration reads as such.
        push("duration", s.to_string());
    }
    if let Some(j) = json {
        push("json", j.display().to_string());
    }
    argv.extend(f.bench_args.iter().cloned());
    #[derive(Parser)]
    struct Wrapper<A: clap::Args> {
        #[command(flatten)]
        args: A,
    }
    Wrapper::<T>::try_parse_from(&argv)
        .map(|w| w.args)
        .map_err(|e| CliError::Usage(format!("cluster file: {}", crate::one_line(&e))))
}

fn resolve(n: &NodeEntry) -> Result<SocketAddr, CliError> {
    (n.host.as_str(), n.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| CliError::Usage(format!("cannot resolve {}:{}", n.host, n.port)))
}

/// Options of `hytra node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The cluster file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// This node's id (its position in the file's `[[nodes]]`), for the TCP bootstrap;
    /// leave it out under a PMIx launcher (`srun --mpi=pmix`, `mpirun`), which gives it.
    #[arg(long)]
    id: Option<u16>,
    /// Write node 0's report as JSON here (ignored on other nodes).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Started by `hytra cluster`, which tells the user what the nodes wait for.
    #[arg(long, hide = true)]
    launched: bool,
    /// Started by `hytra cluster`: its hub, configuration store and journal directory
    /// (all three or none).
    #[arg(long, hide = true, requires_all = ["store", "journal"])]
    hub: Option<SocketAddr>,
    #[arg(long, hide = true, requires = "hub")]
    store: Option<StoreAt>,
    #[arg(long, hide = true, requires = "hub")]
    journal: Option<PathBuf>,
}

/// Runs `hytra node`.
pub fn run_node(a: NodeArgs) -> Result<(), CliError> {
    let f = read_file(&a.config)?;
    let timeout = Duration::from_secs(f.timeout_s);
    let placement = match a.id {
        Some(id) if a.hub.is_some() => {
            let mut p = tcp_placement(&f, &a.config, id, timeout)?;
            let (Some(addr), Some(store), Some(journal)) = (a.hub, a.store, a.journal.clone())
            else {
                return usage("--hub, --store and --journal come together");
            };
            p.bootstrap = Bootstrap::Hub { addr, token: f.token.clone() };
            p.launcher = Some(Launcher { store, journal });
            p
        }
        Some(id) => {
            let p = tcp_placement(&f, &a.config, id, timeout)?;
            if let (false, Bootstrap::Tcp { root, .. }) = (a.launched, &p.bootstrap) {
                eprintln!(
                    "node {id} of {}: meeting the others through node 0 at {root} (for up to {} s)",
                    f.nodes.len(),
                    timeout.as_secs()
                );
            }
            p
        }
        None if launched_by_pmix() => pmix_placement(&f, &a.config, timeout)?,
        None => {
            return usage(format!(
                "hytra node needs its place in the cluster: start it under a PMIx launcher (srun --mpi=pmix or mpirun, in a build with --features pmix), or give --id N with the hosts listed as [[nodes]] in {}",
                a.config.display()
            ))
        }
    };
    // Node 0 reports, or under `hytra cluster` whichever node survives first.
    let json =
        if placement.me == 0 || placement.launcher.is_some() { a.json.as_deref() } else { None };
    match job(&f, json)? {
        Job::Bench(mut args) => {
            args.placement = Some(placement);
            run_bench(*args)
        }
        Job::Io(mut args) => {
            args.placement = Some(placement);
            crate::io::run(*args)
        }
    }
}

/// Node `id` of the file's `[[nodes]]`, meeting the others through node 0's TCP port.
fn tcp_placement(
    f: &ClusterFile,
    config: &Path,
    id: u16,
    timeout: Duration,
) -> Result<Placement, CliError> {
    if f.nodes.is_empty() {
        return usage(format!(
            "--id needs the hosts listed as [[nodes]] in {} (or start hytra node under a PMIx launcher: srun --mpi=pmix, mpirun)",
            config.display()
        ));
    }
    let nodes = u16::try_from(f.nodes.len()).unwrap_or(u16::MAX);
    if id >= nodes {
        return usage(format!("--id {id} is not a node of {} (0..{nodes})", config.display()));
    }
    let root = resolve(&f.nodes[0])?;
    Ok(Placement {
        me: id,
        bootstrap: Bootstrap::Tcp { root, token: f.token.clone() },
        timeout,
        launcher: None,
    })
}

/// Whether a PMIx launcher started this process: it tells its children their namespace
/// and rank in the environment (Slurm's `srun --mpi=pmix` and Open MPI's `mpirun` both).
fn launched_by_pmix() -> bool {
    std::env::var_os("PMIX_NAMESPACE").is_some() && std::env::var_os("PMIX_RANK").is_some()
}

/// This process's rank of the launcher's job as its node. Every check fails the same way
/// in every process of the job, so all stop at once, without waiting for each other.
#[cfg(feature = "pmix")]
fn pmix_placement(
    f: &ClusterFile,
    config: &Path,
    timeout: Duration,
) -> Result<Placement, CliError> {
    use hytra_fabric::ucx::PmixExchange;
    let mut ex = PmixExchange::join(timeout).map_err(|e| CliError::Usage(e.to_string()))?;
    let (rank, size, count) = (ex.rank(), ex.size(), f.node_count());
    if size as usize != count {
        return usage(format!(
            "the PMIx job has {size} processes but {} describes {count} nodes: start one process per node (mpirun -np {count}, srun -n {count})",
            config.display()
        ));
    }
    let me = u16::try_from(rank).ok().filter(|&r| usize::from(r) < count).ok_or_else(|| {
        CliError::Usage(format!(
            "PMIx rank {rank} is not a node of {} (0..{count})",
            config.display()
        ))
    })?;
    ex.check_token(&f.token).map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(Placement {
        me,
        bootstrap: Bootstrap::Pmix(Arc::new(Mutex::new(Some(ex)))),
        timeout,
        launcher: None,
    })
}

#[cfg(not(feature = "pmix"))]
fn pmix_placement(_: &ClusterFile, _: &Path, _: Duration) -> Result<Placement, CliError> {
    usage("a PMIx launcher started hytra node, but this build has no PMIx support: install libpmix-dev and build with --features pmix (or give --id N with the hosts as [[nodes]])")
}

/// Options of `hytra cluster`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// The cluster file (TOML); every node must be on this machine.
    #[arg(long)]
    config: PathBuf,
    /// Write the cluster's report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Kill node NODE's process with SIGKILL at WHEN after the run started (1.5s, 800ms
    /// or bare seconds; a benchmark with --check and replication 3 or more): the
    /// survivors remove it, go on, and check the whole history, the dead node's part
    /// from its journal. `random` (or `random@WHEN`) draws the node, node 0 included, and
    /// the time (between a quarter and three fifths of the run) from the benchmark's
    /// --seed, and says which.
    #[arg(long, value_name = "NODE@WHEN|random[@WHEN]")]
    kill: Option<String>,
}

/// Kills and reaps every child still running.
#[cfg(feature = "ucx")]
struct Children(Vec<(u16, Child)>);

#[cfg(feature = "ucx")]
impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A node to kill, and when (after the run started).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "ucx"), allow(dead_code))]
struct Kill {
    node: u16,
    after: Duration,
}

/// Stream of `--kill random`'s draw from the benchmark's seed.
const KILL_STREAM: u64 = 0x4B_1110;

/// `--kill NODE@WHEN` or `--kill random[@WHEN]`, checked against the file and its
/// benchmark.
fn parse_kill(spec: &str, f: &ClusterFile, args: &BenchArgs) -> Result<Kill, CliError> {
    let nodes = f.nodes.len();
    let seconds = args.duration.map_or(5.0, Span::secs);
    // The draw is made whatever the spec, so that `random` and `random@S` pick the
    // same node.
    let mut rng = hytra_fabric::rng::Rng::derive(args.seed, KILL_STREAM);
    let drawn_at = seconds * (0.25 + 0.35 * rng.below(1_000) as f64 / 1_000.0);
    let drawn_node = rng.below(nodes as u64) as u16;
    let (node, at) = match spec.split_once('@') {
        Some((node, at)) => (node, at.to_string()),
        None if spec == "random" => (spec, format!("{drawn_at:.3}")),
        None => {
            return usage(format!(
                "--kill '{spec}': expected NODE@WHEN, such as 2@1.5s, or random[@WHEN]"
            ))
        }
    };
    let node: u16 = match node {
        "random" => drawn_node,
        n => match n.parse() {
            Ok(n) if usize::from(n) < nodes => n,
            _ => {
                return usage(format!(
                    "--kill '{spec}': there is no node {n} (nodes are 0..{nodes})"
                ))
            }
        },
    };
    let after = match at.parse::<Span>().map(Span::secs) {
        Ok(t) if t < seconds => Duration::from_secs_f64(t),
        _ => {
            return usage(format!(
                "--kill '{spec}': the time must lie in the run, after 0 and before its {seconds} s"
            ))
        }
    };
    if !args.check {
        return usage(
            "--kill: the survivors check the dead node's part from its journal, which is kept with --check only: add \"--check\" to bench_args",
        );
    }
    if args.replication < 3 {
        return usage(format!(
            "--kill: with replication {} a partition would keep {} copy; recovery needs two (a backup's log decides the transactions in doubt)",
            args.replication,
            args.replication.saturating_sub(1)
        ));
    }
    if spec.starts_with("random") {
        eprintln!(
            "hytra cluster: --kill {spec} (seed {}) picked node {node} at {:.3} s",
            args.seed,
            after.as_secs_f64()
        );
    }
    Ok(Kill { node, after })
}

/// A directory removed with everything in it when dropped.
#[cfg(feature = "ucx")]
struct TempDir(PathBuf);

#[cfg(feature = "ucx")]
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the launcher runs beside a benchmark's nodes: the hub they all join, the
/// configuration store they share, and the directory of their journals.
#[cfg(feature = "ucx")]
struct Services {
    hub: std::thread::JoinHandle<Result<hytra_fabric::ucx::HubOutcome, hytra_fabric::BackendError>>,
    store: StoreService,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    started: std::sync::Arc<std::sync::Mutex<Option<Instant>>>,
    args: Vec<String>,
    _journal: TempDir,
}

/// The configuration store of a launch: served by the launcher, or this run's keys in
/// etcd (deleted when the run ends).
#[cfg(feature = "ucx")]
enum StoreService {
    Served(std::thread::JoinHandle<()>),
    Etcd(hytra_txn::config_store::etcd::EtcdStore),
}

#[cfg(feature = "ucx")]
impl StoreService {
    /// The file's etcd (reachable, checked before any node starts), else a store served
    /// on `loopback` until `stop`; and where the nodes find it.
    fn start(
        f: &ClusterFile,
        loopback: SocketAddr,
        stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<(StoreService, StoreAt), CliError> {
        use hytra_txn::config_store::ConfigStore;
        let run = |e: String| CliError::Run(anyhow::anyhow!(e));
        if let Some(hosts) = f.etcd_endpoints() {
            let endpoints = hosts
                .iter()
                .map(|h| resolve_endpoint(h))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| run(format!("store: {e}")))?;
            // A run of its own: keys of an earlier run with the same file never mix in.
            let since = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let prefix = format!("/hytra/run-{}-{since}", std::process::id());
            let etcd = hytra_txn::config_store::etcd::EtcdStore::new(endpoints, &prefix)
                .map_err(|e| run(e.to_string()))?;
            etcd.get()
                .map_err(|e| run(format!("store = {:?}: {e}", f.store.as_deref().unwrap_or(""))))?;
            return Ok((StoreService::Etcd(etcd.clone()), StoreAt::Etcd(etcd)));
        }
        let listener = std::net::TcpListener::bind(loopback)
            .map_err(|e| run(format!("the configuration store cannot listen: {e}")))?;
        let addr = listener.local_addr().map_err(|e| run(format!("the store's address: {e}")))?;
        let stop = stop.clone();
        let memory = std::sync::Arc::new(hytra_txn::config_store::MemoryStore::default());
        let served =
            std::thread::spawn(move || hytra_txn::config_store::serve(listener, memory, stop));
        Ok((StoreService::Served(served), StoreAt::Launcher(addr)))
    }

    /// Stops serving (`stop` set already), or deletes the run's keys from etcd.
    fn finish(self) {
        match self {
            StoreService::Served(t) => {
                let _ = t.join();
            }
            StoreService::Etcd(e) => {
                if let Err(why) = e.clear() {
                    eprintln!(
                        "hytra cluster: the run's keys under {} stay in etcd: {why}",
                        e.prefix()
                    );
                }
            }
        }
    }
}

#[cfg(feature = "ucx")]
impl Services {
    fn start(f: &ClusterFile) -> Result<Services, CliError> {
        use std::sync::atomic::AtomicBool;
        let run = |e: String| CliError::Run(anyhow::anyhow!(e));
        let nodes = u16::try_from(f.nodes.len()).unwrap_or(u16::MAX);
        let timeout = Duration::from_secs(f.timeout_s);
        let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
        let hub = hytra_fabric::ucx::Hub::bind(loopback, nodes, &f.token, timeout)
            .map_err(|e| run(e.to_string()))?;
        let hub_addr = hub.addr().map_err(|e| run(e.to_string()))?;
        let dir = std::env::temp_dir().join(format!("hytra-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| run(format!("cannot create {}: {e}", dir.display())))?;
        let journal = TempDir(dir);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let started = std::sync::Arc::new(std::sync::Mutex::new(None));
        let (store, store_at) = StoreService::start(f, loopback, &stop)?;
        let hub = {
            let (stop, started) = (stop.clone(), started.clone());
            std::thread::spawn(move || {
                hub.serve(
                    |at| *started.lock().expect("never poisoned") = Some(at),
                    || stop.load(std::sync::atomic::Ordering::Acquire),
                )
            })
        };
        let args = vec![
            "--hub".into(),
            hub_addr.to_string(),
            "--store".into(),
            store_at.to_string(),
            "--journal".into(),
            journal.0.display().to_string(),
        ];
        Ok(Services { hub, store, stop, started, args, _journal: journal })
    }

    fn started(&self) -> Option<Instant> {
        *self.started.lock().expect("never poisoned")
    }

    /// Stops the store and the hub; what the hub saw of the run.
    fn finish(self) -> Option<hytra_fabric::ucx::HubOutcome> {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.store.finish();
        self.hub.join().ok().and_then(Result::ok)
    }
}

/// Runs `hytra cluster`.
pub fn run_cluster(a: ClusterArgs) -> Result<(), CliError> {
    let f = read_file(&a.config)?;
    // Every node runs over UCX: say so once here, not once per child.
    crate::BackendKind::parse("ucx")?;
    // Check the benchmark options here once, not in every child.
    let mut kill = None;
    // The measured window the nodes were asked for (the file's `seconds`, which goes on
    // as `--duration`, or one given in `bench_args`): 5 s, `hytra bench`'s default over
    // UCX, when neither gives one (`hytra io` measures 1 s then).
    let mut run_s = 5.0;
    let bench = match job(&f, a.json.as_deref())? {
        Job::Io(mut args) => {
            run_s = args.duration.map_or(run_s, Span::secs);
            let timeout = Duration::from_secs(f.timeout_s);
            args.placement = Some(tcp_placement(&f, &a.config, 0, timeout)?);
            crate::io::check(&args)?;
            if a.kill.is_some() {
                return usage("--kill applies to benchmarks (the io workload has no recovery)");
            }
            false
        }
        Job::Bench(args) => {
            run_s = args.duration.map_or(run_s, Span::secs);
            crate::bench::check(&args)?;
            if let Some(k) = &a.kill {
                kill = Some(parse_kill(k, &f, &args)?);
            }
            true
        }
    };
    if f.nodes.is_empty() {
        return usage(format!(
            "hytra cluster starts the processes of the [[nodes]] in {}, and it lists none (a file with only node_count is for srun or mpirun)",
            a.config.display()
        ));
    }
    for n in &f.nodes {
        let addr = resolve(n)?;
        if !addr.ip().is_loopback() {
            return usage(format!(
                "hytra cluster starts local processes only, and node {}:{} is not on 127.0.0.1 (run `hytra node` on each host instead)",
                n.host, n.port
            ));
        }
    }
    launch(&a, &f, bench, kill, run_s)
}

#[cfg(not(feature = "ucx"))]
fn launch(
    _: &ClusterArgs,
    _: &ClusterFile,
    _: bool,
    _: Option<Kill>,
    _: f64,
) -> Result<(), CliError> {
    unreachable!("refused by run_cluster without the ucx feature")
}

/// Kills `k`'s node if its time into the run (started at `run`) has come: the node and
/// when, if it was killed.
#[cfg(feature = "ucx")]
fn kill_when_due(
    children: &mut Children,
    k: Kill,
    run: Instant,
) -> Result<Option<(u16, f64)>, CliError> {
    if run.elapsed() < k.after {
        return Ok(None);
    }
    let Some((_, c)) = children.0.iter_mut().find(|(id, _)| *id == k.node) else {
        return Ok(None);
    };
    // Child::kill sends SIGKILL: the process gets no chance to say goodbye.
    c.kill().map_err(|e| CliError::Run(anyhow::anyhow!("cannot kill node {}: {e}", k.node)))?;
    let at = run.elapsed().as_secs_f64();
    eprintln!("hytra cluster: killed node {} (SIGKILL) {at:.2} s into the run", k.node);
    Ok(Some((k.node, at)))
}

/// Starts the nodes (and, for a benchmark, the services they share), kills one if asked,
/// and waits for them all.
#[cfg(feature = "ucx")]
/// Starts every node of `f` and waits for them, at most the file's timeout plus twice
/// the measured window (`run_s` seconds) and a minute.
fn launch(
    a: &ClusterArgs,
    f: &ClusterFile,
    bench: bool,
    kill: Option<Kill>,
    run_s: f64,
) -> Result<(), CliError> {
    crate::signals::catch_stop_signals();
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Run(anyhow::anyhow!("cannot find the hytra binary: {e}")))?;
    let services = if bench { Some(Services::start(f)?) } else { None };
    let mut children = Children(Vec::new());
    for id in 0..f.nodes.len() as u16 {
        let mut cmd = Command::new(&exe);
        cmd.arg("node").arg("--config").arg(&a.config).arg("--id").arg(id.to_string());
        cmd.arg("--launched");
        if let Some(s) = &services {
            cmd.args(&s.args);
        }
        // Node 0 prints the report, or under the hub whichever survivor gets the results;
        // the others only their errors.
        if let Some(j) = a.json.as_ref().filter(|_| id == 0 || services.is_some()) {
            cmd.arg("--json").arg(j);
        }
        if id != 0 && services.is_none() {
            cmd.stdout(Stdio::null());
        }
        let child = cmd
            .spawn()
            .map_err(|e| CliError::Run(anyhow::anyhow!("cannot start node {id}: {e}")))?;
        children.0.push((id, child));
    }
    let limit = Duration::from_secs(f.timeout_s)
        + Duration::from_secs_f64(run_s * 2.0)
        + Duration::from_secs(60);
    let started = Instant::now();
    let mut failed: Vec<String> = Vec::new();
    let mut killed: Option<(u16, f64)> = None;
    while !children.0.is_empty() {
        if crate::signals::interrupted() {
            return Err(CliError::Run(anyhow::anyhow!("interrupted: stopped every node")));
        }
        if started.elapsed() > limit {
            return Err(CliError::Run(anyhow::anyhow!(
                "the cluster did not finish within {} s: stopped every node",
                limit.as_secs()
            )));
        }
        if let (Some(k), None, Some(run)) =
            (kill, killed, services.as_ref().and_then(Services::started))
        {
            killed = kill_when_due(&mut children, k, run)?;
        }
        let mut i = 0;
        while i < children.0.len() {
            let (id, c) = &mut children.0[i];
            match c.try_wait() {
                Ok(Some(status)) => {
                    let ours = killed.is_some_and(|(k, _)| k == *id);
                    if !status.success() && !ours {
                        failed.push(format!("node {id} exited with {status}"));
                    }
                    children.0.swap_remove(i);
                }
                Ok(None) => i += 1,
                Err(e) => return Err(CliError::Run(anyhow::anyhow!("node {id}: {e}"))),
            }
        }
        if !failed.is_empty() {
            // One node failed: the others stop on their own with an error once they
            // notice; do not wait for that.
            return Err(CliError::Run(anyhow::anyhow!(
                "{}; stopped every node",
                failed.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(outcome) = services.and_then(Services::finish) {
        if let Some((node, _)) = killed {
            if !outcome.dead.contains(&node) {
                return Err(CliError::Run(anyhow::anyhow!(
                    "node {node} was killed, but the hub never saw it go"
                )));
            }
        }
    }
    if kill.is_some() && killed.is_none() {
        return Err(CliError::Run(anyhow::anyhow!(
            "the run ended before the kill was due: nothing was killed"
        )));
    }
    Ok(())
}
