//! `hytra node` and `hytra cluster`: a benchmark on a cluster of processes over UCX.
//!
//! A cluster file (TOML) names the nodes (host and bootstrap port, or only their number),
//! the cluster token, the UCX transports and the benchmark. `hytra node` runs one node
//! and learns which in one of two ways: under a PMIx launcher (`srun --mpi=pmix`,
//! `mpirun`; feature `pmix`) its rank is its node, and the launcher's key-value store
//! carries addresses and results; with `--id N` it is node N of the file's `[[nodes]]`
//! and joins the others through node 0's TCP bootstrap port, or through the hub that
//! `hytra hub` serves when the file names one (then the run outlives any node). Node 0
//! prints the cluster's report, or with a hub the lowest survivor. `hytra cluster` starts
//! every node of a one-machine file as a child process and stops them all on exit, error
//! or Ctrl-C.
//!
//! `workload = "io"` runs one point of `hytra io` on two nodes instead (node 0 reads
//! node 1's file; `bench_args` are `hytra io` options, `workers` its connections).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use hytra_lab::cluster_file::ClusterFile;
use hytra_lab::cmd::cluster::{job, parse_kill, read_file, survivable, Job};
use hytra_lab::cmd::BackendKind;
use hytra_lab::launch::Job as LaunchJob;
use hytra_lab::place::{self, PlaceError};
use hytra_lab::span::Span;
use hytra_lab::{Bootstrap, Launcher, Placement, StoreAt};

use crate::bench::run_bench;
use crate::{usage, CliError};

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
    if f.hub.is_some() {
        // As `hytra hub` does: a node started before it must not wait to learn this.
        if let Job::Bench(args) = job(&f, None)? {
            survivable("hub", &args)?;
        }
    }
    // Every node runs over UCX: say so before meeting anyone or touching a journal (a
    // hub's placement does); a place in the cluster wrongly given is told first where
    // finding it touches nothing.
    if a.id.is_some() && (a.hub.is_some() || f.hub.is_some()) {
        BackendKind::parse("ucx")?;
    }
    let placement = match a.id {
        Some(id) if a.hub.is_some() => {
            let mut p = placed(&a.config, place::tcp(&f, id, timeout))?;
            let (Some(addr), Some(store), Some(journal)) = (a.hub, a.store, a.journal.clone())
            else {
                return usage("--hub, --store and --journal come together");
            };
            p.bootstrap = Bootstrap::Hub { addr, token: f.token.clone() };
            p.launcher = Some(Launcher { store, journal });
            p
        }
        Some(id) if f.hub.is_some() => placed(&a.config, place::hub(&f, id, timeout))?,
        Some(id) => placed(&a.config, place::tcp(&f, id, timeout))?,
        None if place::launched_by_pmix() => placed(&a.config, pmix_placement(&f, timeout))?,
        None => {
            return usage(format!(
                "hytra node needs its place in the cluster: start it under a PMIx launcher (srun --mpi=pmix or mpirun, in a build with --features pmix), or give --id N with the hosts listed as [[nodes]] in {}",
                a.config.display()
            ))
        }
    };
    BackendKind::parse("ucx")?;
    if let (Bootstrap::Tcp { root, .. }, false) = (&placement.bootstrap, a.launched) {
        eprintln!(
            "node {} of {}: meeting the others through node 0 at {root} (for up to {} s)",
            placement.me,
            f.nodes.len(),
            timeout.as_secs()
        );
    }
    if let (Bootstrap::Hub { addr, .. }, false) = (&placement.bootstrap, a.launched) {
        let (me, nodes) = (placement.me, f.node_count());
        eprintln!("node {me} of {nodes}: joining the hub at {addr} (for up to {} s)", f.timeout_s);
        if me == 0 && place::mpirun_ends_job_on_death() {
            eprintln!(
                "warning: mpirun ends the whole job when one process dies; start it with --enable-recovery so that the others outlive it through the hub"
            );
        }
    }
    if f.store.is_some() && placement.launcher.is_none() && placement.me == 0 {
        // Said, not refused: the same file may serve `hytra cluster`, which uses it.
        eprintln!(
            "warning: the file's store is not used: nodes that meet through node 0 or a PMIx launcher do not outlive a dead one; add hub = \"HOST:PORT\" and run hytra hub (docs/CLUSTERS.md)"
        );
    }
    // Node 0 reports, or with a hub whichever node survives first.
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

/// `place`'s refusals, with the file's path where the file is at fault.
fn placed(config: &Path, p: Result<Placement, PlaceError>) -> Result<Placement, CliError> {
    p.map_err(|e| match e {
        PlaceError::Pmix(_) => CliError::Usage(e.to_string()),
        e => CliError::Usage(format!("{}: {e}", config.display())),
    })
}

#[cfg(feature = "pmix")]
fn pmix_placement(f: &ClusterFile, timeout: Duration) -> Result<Placement, PlaceError> {
    place::pmix(f, timeout)
}

#[cfg(not(feature = "pmix"))]
fn pmix_placement(_: &ClusterFile, _: Duration) -> Result<Placement, PlaceError> {
    Err(PlaceError::Pmix("a PMIx launcher started hytra node, but this build has no PMIx support: install libpmix-dev and build with --features pmix (or give --id N with the hosts as [[nodes]])".into()))
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

/// Runs `hytra cluster`.
pub fn run_cluster(a: ClusterArgs) -> Result<(), CliError> {
    let f = read_file(&a.config)?;
    if f.hub.is_some() {
        return usage(format!(
            "{}: hub is for nodes started by hand (hytra hub, then hytra node --id on each host); hytra cluster runs its own: leave it out",
            a.config.display()
        ));
    }
    // Every node runs over UCX: say so once here, not once per child.
    BackendKind::parse("ucx")?;
    // Check the benchmark options here once, not in every child.
    // The measured window the nodes were asked for (the file's `seconds`, which goes on
    // as `--duration`, or one given in `bench_args`): 5 s, `hytra bench`'s default over
    // UCX, when neither gives one (`hytra io` measures 1 s then).
    let mut run_s = 5.0;
    let launched = match job(&f, a.json.as_deref())? {
        Job::Io(mut args) => {
            run_s = args.duration.map_or(run_s, Span::secs);
            let timeout = Duration::from_secs(f.timeout_s);
            args.placement = Some(placed(&a.config, place::tcp(&f, 0, timeout))?);
            hytra_lab::cmd::io::check(&args)?;
            if a.kill.is_some() {
                return usage("--kill applies to benchmarks (the io workload has no recovery)");
            }
            LaunchJob::Io
        }
        Job::Bench(args) => {
            run_s = args.duration.map_or(run_s, Span::secs);
            hytra_lab::cmd::bench::check(&args)?;
            let kill = a.kill.as_deref().map(|k| parse_kill(k, &f, &args)).transpose()?;
            if let (Some(spec), Some(k)) = (a.kill.as_deref(), &kill) {
                if spec.starts_with("random") {
                    let (seed, at) = (args.seed, k.after.as_secs_f64());
                    eprintln!(
                        "hytra cluster: --kill {spec} (seed {seed}) picked node {} at {at:.3} s",
                        k.node
                    );
                }
            }
            LaunchJob::Bench { kill }
        }
    };
    if f.nodes.is_empty() {
        return usage(format!(
            "hytra cluster starts the processes of the [[nodes]] in {}, and it lists none (a file with only node_count is for srun or mpirun)",
            a.config.display()
        ));
    }
    for n in &f.nodes {
        let addr = place::resolve(n).map_err(|e| CliError::Usage(e.to_string()))?;
        if !addr.ip().is_loopback() {
            return usage(format!(
                "hytra cluster starts local processes only, and node {}:{} is not on 127.0.0.1 (run `hytra node` on each host instead)",
                n.host, n.port
            ));
        }
    }
    launch(&a, &f, launched, run_s)
}

#[cfg(not(feature = "ucx"))]
fn launch(_: &ClusterArgs, _: &ClusterFile, _: LaunchJob, _: f64) -> Result<(), CliError> {
    // Reached only in a build whose library has UCX and whose binary has not.
    usage("this hytra binary was built without --features ucx: hytra cluster is not in it")
}

/// Starts every node of `f` (and what a benchmark's nodes share) and waits for them.
#[cfg(feature = "ucx")]
fn launch(a: &ClusterArgs, f: &ClusterFile, job: LaunchJob, run_s: f64) -> Result<(), CliError> {
    use hytra_lab::launch::{launch, LaunchSpec};
    crate::signals::catch_stop_signals();
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Run(anyhow::anyhow!("cannot find the hytra binary: {e}")))?;
    let spec = LaunchSpec {
        exe,
        config: &a.config,
        file: f,
        json: a.json.as_deref(),
        job,
        run_s,
        logs: None,
    };
    let mut notice = |m: String| eprintln!("hytra cluster: {m}");
    launch(&spec, &crate::signals::interrupted, &mut notice).map_err(|e| CliError::Run(e.into()))
}

/// Options of `hytra hub`.
#[derive(Args, Debug)]
pub struct HubArgs {
    /// The cluster file (TOML), with `hub`, `store` (etcd) and `journal`: the same file
    /// every node is started with.
    #[arg(long)]
    config: PathBuf,
}

/// Runs `hytra hub`: serves one run of the file's nodes (started by hand with `hytra
/// node --id`, or by `mpirun --enable-recovery`), and says which died.
pub fn run_hub(a: HubArgs) -> Result<(), CliError> {
    let f = read_file(&a.config)?;
    BackendKind::parse("ucx")?;
    if f.hub.is_none() {
        return usage(format!(
            "{} names no hub: add hub = \"HOST:PORT\" (with store = \"etcd://...\" and journal = \"DIR\"), or start the nodes with hytra cluster",
            a.config.display()
        ));
    }
    if let Some(hub) = &f.hub {
        hytra_lab::backend::resolve_endpoint(hub)
            .map_err(|e| CliError::Usage(format!("{}: hub = {e}", a.config.display())))?;
    }
    // The nodes would each refuse a bad benchmark; say it here, once, before any waits.
    match job(&f, None)? {
        Job::Bench(args) => {
            hytra_lab::cmd::bench::check(&args)?;
            survivable("hub", &args)?;
        }
        Job::Io(_) => unreachable!("the file's parser refuses io with a hub"),
    }
    serve_hub(&f)
}

#[cfg(not(feature = "ucx"))]
fn serve_hub(_: &ClusterFile) -> Result<(), CliError> {
    // Reached only in a build whose library has UCX and whose binary has not.
    usage("this hytra binary was built without --features ucx: hytra hub is not in it")
}

#[cfg(feature = "ucx")]
fn serve_hub(f: &ClusterFile) -> Result<(), CliError> {
    crate::signals::catch_stop_signals();
    let mut notice = |m: String| eprintln!("hytra hub: {m}");
    let outcome = hytra_lab::launch::serve_hub(f, &crate::signals::interrupted, &mut notice)
        .map_err(|e| CliError::Run(e.into()))?;
    match outcome.dead.as_slice() {
        [] => println!("hub: the run is over; every node lived to its end"),
        dead => println!("hub: the run is over; nodes {dead:?} died, the others carried on"),
    }
    Ok(())
}
