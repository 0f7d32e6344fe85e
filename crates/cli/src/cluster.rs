//! `hytra node` and `hytra cluster`: a benchmark on a cluster of processes over UCX.
//!
//! A cluster file (TOML) names the nodes (host and bootstrap port), the cluster token,
//! the UCX transports and the benchmark. `hytra node --id N` runs node N: it joins the
//! others through node 0's bootstrap port, runs its workers, and sends its results to
//! node 0, which prints the cluster's report. `hytra cluster` starts every node of a
//! one-machine file as a child process and stops them all on exit, error or Ctrl-C.
//!
//! `workload = "io"` runs one point of `hytra io` on two nodes instead (node 0 reads
//! node 1's file; `bench_args` are `hytra io` options, `workers` its connections).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser};
use hytra_lab::cluster_file::{self, ClusterFile, NodeEntry};

use crate::bench::{run_bench, BenchArgs};
use crate::io::IoArgs;
use crate::{usage, CliError};

/// This process's place in a cluster of processes.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "ucx"), allow(dead_code))]
pub struct Placement {
    /// Node id.
    pub me: u16,
    /// Node 0's bootstrap address.
    pub root: SocketAddr,
    /// The cluster token.
    pub token: String,
    /// Bound on joining and on every exchange.
    pub timeout: Duration,
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
        ("design", f.design.clone()),
        ("nodes", f.nodes.len().to_string()),
        ("workers", f.workers.to_string()),
    ];
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
        push("seconds", s.to_string());
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
    /// This node's id (its position in the file's `[[nodes]]`).
    #[arg(long)]
    id: u16,
    /// Write node 0's report as JSON here (ignored on other nodes).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs `hytra node`.
pub fn run_node(a: NodeArgs) -> Result<(), CliError> {
    let f = read_file(&a.config)?;
    let nodes = u16::try_from(f.nodes.len()).unwrap_or(u16::MAX);
    if a.id >= nodes {
        return usage(format!(
            "--id {} is not a node of {} (0..{nodes})",
            a.id,
            a.config.display()
        ));
    }
    let placement = Placement {
        me: a.id,
        root: resolve(&f.nodes[0])?,
        token: f.token.clone(),
        timeout: Duration::from_secs(f.timeout_s),
    };
    match job(&f, if a.id == 0 { a.json.as_deref() } else { None })? {
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

/// Options of `hytra cluster`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// The cluster file (TOML); every node must be on this machine.
    #[arg(long)]
    config: PathBuf,
    /// Write the cluster's report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
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

/// Runs `hytra cluster`.
pub fn run_cluster(a: ClusterArgs) -> Result<(), CliError> {
    let f = read_file(&a.config)?;
    // Check the benchmark options here once, not in every child.
    if let Job::Io(mut args) = job(&f, a.json.as_deref())? {
        args.placement = Some(Placement {
            me: 0,
            root: resolve(&f.nodes[0])?,
            token: f.token.clone(),
            timeout: Duration::from_secs(f.timeout_s),
        });
        crate::io::check(&args)?;
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
    // SAFETY: installs a handler that only stores to an atomic (async-signal-safe);
    // `on_signal` has the signature signal(2) expects.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Run(anyhow::anyhow!("cannot find the hytra binary: {e}")))?;
    let mut children = Children(Vec::new());
    for id in 0..f.nodes.len() as u16 {
        let mut cmd = Command::new(&exe);
        cmd.arg("node").arg("--config").arg(&a.config).arg("--id").arg(id.to_string());
        if let (0, Some(j)) = (id, &a.json) {
            cmd.arg("--json").arg(j);
        }
        // Node 0 prints the report; the others only their errors.
        if id != 0 {
            cmd.stdout(Stdio::null());
        }
        let child = cmd
            .spawn()
            .map_err(|e| CliError::Run(anyhow::anyhow!("cannot start node {id}: {e}")))?;
        children.0.push((id, child));
    }
    let limit = Duration::from_secs(f.timeout_s)
        + Duration::from_secs_f64(f.seconds.unwrap_or(5.0) * 2.0)
        + Duration::from_secs(60);
    let started = Instant::now();
    let mut failed: Vec<String> = Vec::new();
    while !children.0.is_empty() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            return Err(CliError::Run(anyhow::anyhow!("interrupted: stopped every node")));
        }
        if started.elapsed() > limit {
            return Err(CliError::Run(anyhow::anyhow!(
                "the cluster did not finish within {} s: stopped every node",
                limit.as_secs()
            )));
        }
        let mut i = 0;
        while i < children.0.len() {
            let (id, c) = &mut children.0[i];
            match c.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
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
    Ok(())
}
