//! `hytra cluster`'s launcher: starts a benchmark's nodes as processes of this machine,
//! with what they share so that the run outlives any of them (the hub every node joins,
//! the configuration store, the directory of their journals), kills one on request, and
//! waits for them all, stopping every one on a failure, a timeout or an interrupt. And
//! `hytra hub`'s service for nodes started by hand or by `mpirun` (`serve_hub`, feature
//! `ucx`): the hub alone, with the configurations in etcd (a node's side of it is
//! `place::hub`). Not for: what a node runs (`hytra node`) or checking the file's
//! benchmark.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cluster_file::ClusterFile;

/// A node to kill with SIGKILL, and when (after the run started).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kill {
    /// The node.
    pub node: u16,
    /// Time into the run.
    pub after: Duration,
}

/// What the nodes of a launch run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// A benchmark: the launcher serves the hub, the store and the journals it needs to
    /// survive a dead node, and may kill one.
    Bench {
        /// The node to kill, if any.
        kill: Option<Kill>,
    },
    /// One point of `hytra io` (two nodes, no recovery).
    Io,
}

/// One launch.
#[derive(Clone, Debug)]
pub struct LaunchSpec<'a> {
    /// The `hytra` binary the nodes run (`hytra node`).
    pub exe: PathBuf,
    /// The cluster file, as the nodes read it.
    pub config: &'a Path,
    /// The file, read and checked.
    pub file: &'a ClusterFile,
    /// Where the reporting node writes its JSON report.
    pub json: Option<&'a Path>,
    /// What the nodes run.
    pub job: Job,
    /// The measured window the nodes were asked for, in seconds: the launch waits at most
    /// the file's timeout, twice this and a minute.
    pub run_s: f64,
    /// A directory for every node's output (`node-N.out`, `node-N.err`); `None`: the
    /// launcher's own (node 0's report, or a survivor's, and every node's errors).
    pub logs: Option<&'a Path>,
}

/// Why a launch failed; every node it started is stopped by then.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The caller said to stop.
    #[error("interrupted: stopped every node")]
    Interrupted,
    /// The nodes outlived the bound.
    #[error("the cluster did not finish within {0} s: stopped every node")]
    Timeout(u64),
    /// Nodes exited with an error (the others were stopped).
    #[error("{0}; stopped every node")]
    Failed(String),
    /// Starting, watching or killing a process, or the services, failed.
    #[error("{0}")]
    System(String),
    /// The killed node's end was never noticed by the hub.
    #[error("node {0} was killed, but the hub never saw it go")]
    Unseen(u16),
    /// The run ended before the kill was due.
    #[error("the run ended before the kill was due: nothing was killed")]
    KillNotDue,
}

#[cfg(feature = "ucx")]
pub use imp::{launch, serve_hub};

#[cfg(feature = "ucx")]
mod imp {
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use hytra_fabric::ucx::{Hub, HubOutcome};
    use hytra_fabric::BackendError;
    use hytra_txn::config_store::etcd::EtcdStore;
    use hytra_txn::config_store::{serve, ConfigStore, MemoryStore};

    use super::{Job, Kill, LaunchError, LaunchSpec};
    use crate::backend::{etcd_store, resolve_endpoint, StoreAt};
    use crate::cluster_file::ClusterFile;

    /// A directory removed with everything in it when dropped.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Kills and reaps every child still running.
    struct Children(Vec<(u16, Child)>);

    impl Drop for Children {
        fn drop(&mut self) {
            for (_, c) in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// What the launcher runs beside a benchmark's nodes.
    struct Services {
        hub: JoinHandle<Result<HubOutcome, BackendError>>,
        store: StoreService,
        stop: Arc<AtomicBool>,
        started: Arc<Mutex<Option<Instant>>>,
        /// The options that tell a node where they are.
        args: Vec<String>,
        _journal: TempDir,
    }

    /// Tells the services' threads to stop when a launch returns, whichever way: after a
    /// failure they would otherwise serve on for as long as the process lives (a swarm of
    /// processes launches many clusters from one process).
    struct StopOnDrop(Arc<AtomicBool>);

    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    /// The configuration store of a launch: served by the launcher, or this run's keys in
    /// etcd (deleted when the run ends).
    enum StoreService {
        Served(JoinHandle<()>),
        Etcd(EtcdStore),
    }

    fn system(e: impl ToString) -> LaunchError {
        LaunchError::System(e.to_string())
    }

    impl StoreService {
        /// The file's etcd (reachable, checked before any node starts), else a store
        /// served on `loopback` until `stop`; and where the nodes find it.
        fn start(
            f: &ClusterFile,
            loopback: SocketAddr,
            stop: &Arc<AtomicBool>,
        ) -> Result<(StoreService, StoreAt), LaunchError> {
            // A run of its own: keys of an earlier run with the same file never mix in.
            let since = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let prefix = format!("/hytra/run-{}-{since}", std::process::id());
            let etcd = etcd_store(f, &prefix).map_err(|e| system(format!("store: {e}")))?;
            if let Some(etcd) = etcd {
                etcd.get().map_err(|e| {
                    system(format!("store = {:?}: {e}", f.store.as_deref().unwrap_or("")))
                })?;
                return Ok((StoreService::Etcd(etcd.clone()), StoreAt::Etcd(etcd)));
            }
            let listener = std::net::TcpListener::bind(loopback)
                .map_err(|e| system(format!("the configuration store cannot listen: {e}")))?;
            let addr =
                listener.local_addr().map_err(|e| system(format!("the store's address: {e}")))?;
            let stop = stop.clone();
            let memory = Arc::new(MemoryStore::default());
            let served = std::thread::spawn(move || serve(listener, memory, stop));
            Ok((StoreService::Served(served), StoreAt::Launcher(addr)))
        }

        /// Stops serving (`stop` set already), or deletes the run's keys from etcd.
        fn finish(self, notice: &mut dyn FnMut(String)) {
            match self {
                StoreService::Served(t) => {
                    let _ = t.join();
                }
                StoreService::Etcd(e) => {
                    if let Err(why) = e.clear() {
                        notice(format!("the run's keys under {} stay in etcd: {why}", e.prefix()));
                    }
                }
            }
        }
    }

    impl Services {
        fn start(f: &ClusterFile) -> Result<Services, LaunchError> {
            let nodes = u16::try_from(f.nodes.len()).unwrap_or(u16::MAX);
            let timeout = Duration::from_secs(f.timeout_s);
            let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
            let hub = Hub::bind(loopback, nodes, &f.token, timeout).map_err(system)?;
            let hub_addr = hub.addr().map_err(system)?;
            let dir = std::env::temp_dir().join(format!("hytra-cluster-{}", std::process::id()));
            std::fs::create_dir_all(&dir)
                .map_err(|e| system(format!("cannot create {}: {e}", dir.display())))?;
            let journal = TempDir(dir);
            let stop = Arc::new(AtomicBool::new(false));
            let started = Arc::new(Mutex::new(None));
            let (store, store_at) = StoreService::start(f, loopback, &stop)?;
            let hub = {
                let (stop, started) = (stop.clone(), started.clone());
                std::thread::spawn(move || {
                    hub.serve(
                        |at| *started.lock().expect("never poisoned") = Some(at),
                        || stop.load(Ordering::Acquire),
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

        /// When the hub saw the run start.
        fn started(&self) -> Option<Instant> {
            *self.started.lock().expect("never poisoned")
        }

        /// Stops the store and the hub; what the hub saw of the run.
        fn finish(self, notice: &mut dyn FnMut(String)) -> Option<HubOutcome> {
            self.stop.store(true, Ordering::Release);
            self.store.finish(notice);
            self.hub.join().ok().and_then(Result::ok)
        }
    }

    /// Serves the hub of a cluster whose nodes are started by hand or by a PMIx launcher
    /// (`hytra hub`): clears the run's keys in etcd (so no earlier run's configuration
    /// mixes in), listens at the file's `hub` for its nodes, serves one run to its end,
    /// and clears the keys again.
    /// `interrupted` is asked every half millisecond whether to stop; `notice` hears what
    /// the user should know. Returns what the hub saw of the run.
    pub fn serve_hub(
        f: &ClusterFile,
        interrupted: &dyn Fn() -> bool,
        notice: &mut dyn FnMut(String),
    ) -> Result<HubOutcome, LaunchError> {
        let (Some(hub), Some(prefix)) = (&f.hub, f.hub_prefix()) else {
            return Err(system("the cluster file names no hub (hub = \"HOST:PORT\")"));
        };
        let addr = resolve_endpoint(hub).map_err(|e| system(format!("hub = {hub:?}: {e}")))?;
        let etcd = etcd_store(f, &prefix)
            .map_err(|e| system(format!("store: {e}")))?
            .ok_or_else(|| system("a file with a hub commits its configurations to etcd"))?;
        let nodes = u16::try_from(f.node_count()).map_err(system)?;
        // The listening socket is the run's lock: a second hub for the same file stops
        // here, before it touches the keys of the run the first one serves.
        let hub =
            Hub::bind(addr, nodes, &f.token, Duration::from_secs(f.timeout_s)).map_err(system)?;
        let store = f.store.as_deref().unwrap_or("");
        etcd.clear().map_err(|e| system(format!("store = {store:?}: {e}")))?;
        notice(format!(
            "hub at {addr}: waiting for {nodes} nodes (up to {} s); configurations in {store}{prefix}",
            f.timeout_s
        ));
        let outcome = hub.serve(|_| notice("the run started".into()), interrupted);
        StoreService::Etcd(etcd).finish(notice);
        outcome.map_err(|e| if interrupted() { LaunchError::Interrupted } else { system(e) })
    }

    /// Kills `k`'s node if its time into the run (started at `run`) has come: the node
    /// and when, if it was killed.
    fn kill_when_due(
        children: &mut Children,
        k: Kill,
        run: Instant,
        notice: &mut dyn FnMut(String),
    ) -> Result<Option<(u16, f64)>, LaunchError> {
        if run.elapsed() < k.after {
            return Ok(None);
        }
        let Some((_, c)) = children.0.iter_mut().find(|(id, _)| *id == k.node) else {
            return Ok(None);
        };
        // Child::kill sends SIGKILL: the process gets no chance to say goodbye.
        c.kill().map_err(|e| system(format!("cannot kill node {}: {e}", k.node)))?;
        let at = run.elapsed().as_secs_f64();
        notice(format!("killed node {} (SIGKILL) {at:.2} s into the run", k.node));
        Ok(Some((k.node, at)))
    }

    /// Starts one `hytra node` process per node of the spec's file (and, for a
    /// benchmark, the services they share), kills one if asked, and waits for them all;
    /// `interrupted` is asked every few milliseconds whether to stop, and `notice` hears
    /// what the user should know.
    pub fn launch(
        spec: &LaunchSpec<'_>,
        interrupted: &dyn Fn() -> bool,
        notice: &mut dyn FnMut(String),
    ) -> Result<(), LaunchError> {
        let f = spec.file;
        let kill = match spec.job {
            Job::Bench { kill } => kill,
            Job::Io => None,
        };
        let services = match spec.job {
            Job::Bench { .. } => Some(Services::start(f)?),
            Job::Io => None,
        };
        let _stop = services.as_ref().map(|s| StopOnDrop(s.stop.clone()));
        let mut children = Children(Vec::new());
        for id in 0..u16::try_from(f.nodes.len()).map_err(system)? {
            let mut cmd = Command::new(&spec.exe);
            cmd.arg("node").arg("--config").arg(spec.config).arg("--id").arg(id.to_string());
            cmd.arg("--launched");
            if let Some(s) = &services {
                cmd.args(&s.args);
            }
            // Node 0 prints the report, or under the hub whichever survivor gets the
            // results; the others only their errors.
            if let Some(j) = spec.json.filter(|_| id == 0 || services.is_some()) {
                cmd.arg("--json").arg(j);
            }
            if let Some(dir) = spec.logs {
                let file = |ext: &str| {
                    let path = dir.join(format!("node-{id}.{ext}"));
                    std::fs::File::create(&path)
                        .map_err(|e| system(format!("cannot create {}: {e}", path.display())))
                };
                cmd.stdout(file("out")?).stderr(file("err")?);
            } else if id != 0 && services.is_none() {
                cmd.stdout(Stdio::null());
            }
            let child = cmd.spawn().map_err(|e| system(format!("cannot start node {id}: {e}")))?;
            children.0.push((id, child));
        }
        let limit = Duration::from_secs(f.timeout_s)
            + Duration::from_secs_f64(spec.run_s * 2.0)
            + Duration::from_secs(60);
        let started = Instant::now();
        let mut killed: Option<(u16, f64)> = None;
        while !children.0.is_empty() {
            if interrupted() {
                return Err(LaunchError::Interrupted);
            }
            if started.elapsed() > limit {
                return Err(LaunchError::Timeout(limit.as_secs()));
            }
            if let (Some(k), None, Some(run)) =
                (kill, killed, services.as_ref().and_then(Services::started))
            {
                killed = kill_when_due(&mut children, k, run, notice)?;
            }
            let mut failed: Vec<String> = Vec::new();
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
                    Err(e) => return Err(system(format!("node {id}: {e}"))),
                }
            }
            if !failed.is_empty() {
                // One node failed: the others stop on their own with an error once they
                // notice; do not wait for that.
                return Err(LaunchError::Failed(failed.join(", ")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(outcome) = services.and_then(|s| s.finish(notice)) {
            if let Some((node, _)) = killed {
                if !outcome.dead.contains(&node) {
                    return Err(LaunchError::Unseen(node));
                }
            }
        }
        if kill.is_some() && killed.is_none() {
            return Err(LaunchError::KillNotDue);
        }
        Ok(())
    }
}
