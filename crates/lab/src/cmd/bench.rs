//! `hytra bench`'s options, and their checks into the plan of a run: the backend, the
//! workload and its sizes, the design and its per-phase overrides, crashes, the window.

use std::path::PathBuf;

use clap::Args;
use hytra_fabric::local::LocalConfig;
use hytra_fabric::sim::faults::FaultConfig;
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{CpuMode, SimConfig};
use hytra_fabric::{ClusterShape, NodeId};
use hytra_rt::constants::COROUTINES_MAX;
use hytra_rt::RtConfig;
use hytra_txn::{
    ConfigError, Design, ExecStrategy, LockStrategy, Primitive, RecoveryParams, Rereplication,
    TxnConfig,
};
use hytra_workloads::bench::BenchParams;
use hytra_workloads::tpcc::{TpccMix, TYPES as TPCC_TYPES};
use hytra_workloads::ycsb::{KeyDist, Mix as YcsbMix};

use crate::bench::Crash;
use crate::cluster_file::Wait;
use crate::cmd::choice::{named, on_or, Switch};
use crate::cmd::{usage, BackendKind, Usage};
use crate::judge::SIM_DEFAULT_WINDOW_NS;
use crate::span::{check_warmup, warmup_ns, Span};
use crate::{unknown_workload, CpuProfile, CPU_PROFILE_DEFAULT, CRASH_TIMELINE_NS, WORKLOADS};
use crate::{BackendSpec, RunSpec, UcxSpec, WorkloadSpec};

/// Options of `hytra bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Workload: smallbank, tpcc (the standard mix), tpcc-no (New-Order only, every
    /// transaction distributed), tpce-cp (TPC-E Customer-Position), tatp, or ycsb.
    #[arg(long, default_value = "smallbank")]
    pub workload: String,
    /// Design preset: every phase's primitive as in that system; `auto` runs a short
    /// trial of each preset (and of drtmh with two-sided locks) on this backend first,
    /// then from the fastest tries each phase's other primitives one at a time, and keeps
    /// what runs clearly faster (9 to 21 trials: seconds to a minute before the run).
    #[arg(long, default_value = "drtmh", value_parser = design_parser())]
    pub design: DesignPick,
    /// Backend: sim (virtual time), local (threads, real time) or ucx (UCX, every node
    /// in this process; needs a build with the ucx feature).
    #[arg(long, default_value = "sim")]
    pub backend: String,
    /// UCX transports for --backend ucx (UCX_TLS syntax: sm, tcp, rc, ...; all: UCX's
    /// choice).
    #[arg(long, default_value = "sm")]
    pub transports: String,
    /// --backend ucx: what a thread does when its workers have nothing to do: poll
    /// (yield the core and step again; the faster) or event (the same for 50 µs, then sleep on UCX's
    /// event fds until a message or completion arrives; leaves idle cores to other work
    /// on the host) [default: poll].
    #[arg(long, value_parser = wait_parser())]
    pub wait: Option<Wait>,
    /// This process's place in a cluster spread over processes (set by `hytra node`).
    #[arg(skip)]
    pub placement: Option<crate::Placement>,
    /// NIC profile of the simulator: cx3, cx4, cx5, roce, or local (the `local` backend on
    /// this project's test machine, fitted to `hytra micro --backend local`).
    #[arg(long, default_value = "cx4")]
    pub profile: String,
    /// CPU profile of the simulator, what hytra's own code costs: paper, host, assumed,
    /// a file `hytra calibrate` wrote, or measured (each step's own time on this machine,
    /// as `hytra calibrate` measures it; not replayable) [default: paper].
    #[arg(long)]
    pub cpu_profile: Option<String>,
    /// Nodes.
    #[arg(long, default_value_t = 4)]
    pub nodes: u16,
    /// Workers per node.
    #[arg(long, default_value_t = 4)]
    pub workers: u16,
    /// Coroutines per worker.
    #[arg(long, default_value_t = 8)]
    pub coroutines: u16,
    /// Measured time, virtual on sim: a number and a unit (2ms, 1.5s) or bare seconds
    /// [default: 10ms on sim, lengthened up to 16-fold when shorter than twice the p99
    /// latency; 5s on local and ucx]. A window given here that held no commit or was that
    /// short is refused.
    #[arg(long, alias = "seconds", value_name = "DURATION")]
    pub duration: Option<Span>,
    /// Warm-up before measuring, as a fraction of --duration.
    #[arg(long, default_value_t = 0.1)]
    pub warmup: f64,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Record the history and check serializability (memory grows with the run).
    #[arg(long)]
    pub check: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Copies of every partition.
    #[arg(long, default_value_t = 3)]
    pub replication: u16,
    /// SmallBank accounts per worker thread (about 0.5 KB each with 3 copies, location
    /// caches included).
    #[arg(long, default_value_t = 100_000)]
    pub accounts_per_worker: u64,
    /// TPC-C warehouses per worker thread.
    #[arg(long, default_value_t = 1)]
    pub warehouses_per_worker: u64,
    /// TPC-C customers per district (3000 in the specification). With 3 copies a
    /// warehouse takes about 110 MB at the defaults and 360 MB at the specification's
    /// sizes (3000, 100000), so the default 4 x 4 cluster loads in under 2 GB; each
    /// committed New-Order then adds its rows, about 5 KB with 3 copies (on local and
    /// ucx, whose default window is 5 s of wall time, 0.1-0.2 GB a second).
    #[arg(long, default_value_t = 1000)]
    pub customers: u64,
    /// TPC-C items (100000 in the specification; each warehouse stocks every item).
    #[arg(long, default_value_t = 20_000)]
    pub items: u64,
    /// TPC-C: percentage of New-Order lines supplied by another warehouse.
    #[arg(long, default_value_t = 1)]
    pub remote_item_pct: u64,
    /// TPC-C: run one transaction type alone (new-order, payment, order-status,
    /// delivery, stock-level).
    #[arg(long)]
    pub tpcc_only: Option<String>,
    /// TPC-E: customers per worker thread.
    #[arg(long, default_value_t = 1000)]
    pub tpce_customers_per_worker: u64,
    /// TPC-E: percentage of price-moving transactions (the rest are Customer-Position).
    #[arg(long, default_value_t = 10)]
    pub market_feed_pct: u64,
    /// TATP: subscribers per worker thread (about 4 KB each with 3 copies: a subscriber
    /// reserves rows for every facility and forwarding it may have).
    #[arg(long, default_value_t = 20_000)]
    pub subscribers_per_worker: u64,
    /// TATP: choose subscribers uniformly (default: the specification's skew).
    #[arg(long)]
    pub tatp_uniform: bool,
    /// YCSB: core workload.
    #[arg(long, default_value = "a", ignore_case = true, value_parser = named(&YcsbMix::ALL, YcsbMix::name))]
    pub ycsb_mix: YcsbMix,
    /// YCSB: records per worker thread (about 3.3 KB each with 3 copies at the default
    /// 1 KB of fields).
    #[arg(long, default_value_t = 20_000)]
    pub records_per_worker: u64,
    /// YCSB: zipfian constant θ (0: uniform).
    #[arg(long, default_value_t = 0.99)]
    pub zipf_theta: f64,
    /// YCSB: operations per transaction.
    #[arg(long, default_value_t = 1)]
    pub ops_per_txn: u16,
    /// YCSB: fields per record and bytes per field.
    #[arg(long, default_value_t = 10)]
    pub fields: u16,
    /// YCSB: bytes per field (a multiple of 8).
    #[arg(long, default_value_t = 96)]
    pub field_bytes: u16,
    /// Connections per peer per worker (5: the paper's 80-node setting).
    #[arg(long, default_value_t = 1)]
    pub lanes: u16,
    /// OS threads (local only) [default: one per core].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Override the execution strategy (offload: cache misses answered by the primary's
    /// NIC; sim with --profile cx5, or local).
    #[arg(long, value_parser = named(ExecStrategy::ALL, ExecStrategy::name))]
    pub exec: Option<ExecStrategy>,
    /// Override locking.
    #[arg(long, value_parser = named(LockStrategy::ALL, LockStrategy::name))]
    pub lock: Option<LockStrategy>,
    /// Override read validation.
    #[arg(long, value_parser = named(Primitive::ALL, Primitive::name))]
    pub validate: Option<Primitive>,
    /// Override logging.
    #[arg(long, value_parser = named(Primitive::ALL, Primitive::name))]
    pub log: Option<Primitive>,
    /// Override the commit phase.
    #[arg(long, value_parser = named(Primitive::ALL, Primitive::name))]
    pub commit: Option<Primitive>,
    /// Passive ACK on the commit phase [default: the design's].
    #[arg(long)]
    pub passive_ack: Option<Switch>,
    /// Outstanding requests (parallel reads, locks, logs) [default: the design's].
    #[arg(long)]
    pub outstanding: Option<Switch>,
    /// Doorbell batching [default: on].
    #[arg(long)]
    pub doorbell_batching: Option<Switch>,
    /// Inline small write-backs [default: the design's].
    #[arg(long)]
    pub inline: Option<Switch>,
    /// Several RPC requests (or replies) to one worker share a datagram when sent in the
    /// same step [default: on].
    #[arg(long)]
    pub rpc_coalescing: Option<Switch>,
    /// Start with warm location caches (every remote record's address, as after a long
    /// run) or empty ones [default: on].
    #[arg(long)]
    pub warm_cache: Option<Switch>,
    /// Location cache per node in MiB (0: none).
    #[arg(long)]
    pub cache_mib: Option<u64>,
    /// Datagram loss, duplication, reordering and delay, in parts per million (sim only).
    #[arg(long, default_value_t = 0)]
    pub faults_ppm: u32,
    /// Crash node NODE at WHEN from the start of the run (2ms, 1.5s or bare seconds;
    /// warm-up included; inside the measured window), and report how long recovery took.
    /// Repeatable, as long as every partition keeps two copies through each failure
    /// (crashes within three leases fail together; later ones meet re-replication's
    /// copies) (sim and local) [--duration then defaults to twenty leases: 100ms on sim,
    /// 40s on local; --lease-ms 100 shortens local runs].
    #[arg(long, value_name = "NODE@WHEN")]
    pub crash: Vec<String>,
    /// Restart node NODE, crashed by --crash before WHEN, at WHEN: its memory wiped, it
    /// joins the cluster again as a new member and takes the backups the survivors lack;
    /// the report says when it was a member again (sim only; not with --exec offload).
    #[arg(long, value_name = "NODE@WHEN")]
    pub restart: Vec<String>,
    /// Lease of every node with the configuration manager, in milliseconds: a node is
    /// removed this long after it stopped renewing [default: 5 on sim, 2000 on local
    /// and ucx].
    #[arg(long)]
    pub lease_ms: Option<f64>,
    /// After a failure, copy each partition that lost a replica to a new backup at this
    /// rate in MB/s into each receiving node, or `off` to run on with the copies left
    /// [default: 250 on sim, 128 on local and ucx].
    #[arg(long, value_name = "MBPS|off")]
    pub rereplicate: Option<String>,
    /// The options given on the command line, by id ([`BenchArgs::given_in`]); empty
    /// where nothing was parsed (the default run).
    #[arg(skip)]
    pub given: Vec<String>,
}

/// `--wait`: the cluster file's names, listed in the help and in errors.
fn wait_parser() -> impl clap::builder::TypedValueParser<Value = Wait> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Wait::ALL.map(Wait::name))
        .map(|s: String| Wait::parse(&s).expect("one of the possible values"))
}

/// `--wait` as given, or its default.
pub fn wait_name(w: Option<Wait>) -> &'static str {
    w.unwrap_or(Wait::Poll).name()
}

impl BenchArgs {
    /// `a` with the options `m` says were given on the command line (or in a cluster
    /// file's arguments), so that one given at its default value still counts as given.
    pub fn given_in(mut a: BenchArgs, m: &clap::ArgMatches) -> BenchArgs {
        use clap::parser::ValueSource;
        a.given = m
            .ids()
            .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine))
            .map(|id| id.to_string())
            .collect();
        a
    }

    /// What `hytra` with no arguments runs.
    pub fn default_run() -> BenchArgs {
        crate::cmd::parse::<BenchArgs>(&["hytra"]).expect("the defaults parse").0
    }
}

/// `--design`: a preset, or the fastest of short trials on the backend at hand.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum DesignPick {
    /// Every phase as in this preset (and the overrides given).
    Preset(Design),
    /// The fastest of [`auto_candidates`] in a trial of this workload on this backend,
    /// with the one-phase changes of it that run clearly faster (`hytra_lab::auto`).
    Auto,
}

/// `--design`'s parser: the presets' names and `auto`, listed in the help.
fn design_parser() -> impl clap::builder::TypedValueParser<Value = DesignPick> {
    use clap::builder::TypedValueParser;
    let names = Design::ALL.iter().map(|d| d.name()).chain(["auto"]);
    clap::builder::PossibleValuesParser::new(names)
        .map(|s: String| Design::parse(&s).map_or(DesignPick::Auto, DesignPick::Preset))
}

/// `--design auto`'s candidates, labelled: every preset, and DrTM+H with its locks taken
/// by RPC (where atomics run in a NIC that is not coherent with the CPU, a node locks its
/// own records through its NIC too, which costs more than an RPC; docs/PERFORMANCE.md
/// §26). Combinations the cluster cannot run are left out.
pub fn auto_candidates(a: &BenchArgs) -> Result<Vec<(String, TxnConfig)>, Usage> {
    let mut all = Vec::new();
    for d in Design::ALL {
        all.push((d.name().to_string(), build_config(a, d)?));
    }
    let mut c = build_config(a, Design::DrtmH)?;
    c.lock = LockStrategy::TwoSided;
    all.push(("drtmh (two-sided locks)".to_string(), c));
    let mut refused = Vec::new();
    let mut out = Vec::new();
    for (label, c) in all {
        match c.check(a.nodes) {
            Ok(()) => out.push((label, c)),
            Err(e) => refused.push(format!("{label}: {e}")),
        }
    }
    if out.is_empty() {
        return usage(format!(
            "--design auto: no design runs with these options ({})",
            refused.join("; ")
        ));
    }
    Ok(out)
}

/// The run's configuration, and `--design auto`'s candidates (none for a named design;
/// the run's configuration then stands for the checks made before the trials).
fn designs(a: &BenchArgs) -> Result<(TxnConfig, Vec<(String, TxnConfig)>), Usage> {
    Ok(match a.design {
        DesignPick::Preset(d) => (txn_config(a, d)?, Vec::new()),
        DesignPick::Auto => {
            check_auto(a)?;
            let candidates = auto_candidates(a)?;
            // What the checks before the run need (leases, re-replication) is the same
            // in every candidate.
            (candidates[0].1, candidates)
        }
    })
}

/// Why `--design auto` is refused for a cluster spread over processes.
const AUTO_SPREAD: &str = "--design auto runs its trials within one process; a cluster spread over processes takes its design from its file (without one: drtmh, with every phase on RPCs where only TCP joins the nodes)";

/// Refuses `--design auto` beside anything that decides a phase (it would contradict
/// the trials) or in a cluster spread over processes (each would pick on its own).
fn check_auto(a: &BenchArgs) -> Result<(), Usage> {
    let phases = [
        ("exec", a.exec.is_some()),
        ("lock", a.lock.is_some()),
        ("validate", a.validate.is_some()),
        ("log", a.log.is_some()),
        ("commit", a.commit.is_some()),
        ("passive-ack", a.passive_ack.is_some()),
        ("outstanding", a.outstanding.is_some()),
        ("inline", a.inline.is_some()),
    ];
    if let Some((flag, _)) = phases.iter().find(|(_, given)| *given) {
        return usage(format!(
            "--design auto chooses every phase itself: drop --{flag}, or name a design (drtmh, fasst, farm, drtmr) to override its phases"
        ));
    }
    if a.placement.is_some() {
        return usage(AUTO_SPREAD);
    }
    Ok(())
}

/// `design` with the options given, checked against the cluster.
fn txn_config(a: &BenchArgs, design: Design) -> Result<TxnConfig, Usage> {
    let c = build_config(a, design)?;
    let d = design.name();
    match c.check(a.nodes) {
        Ok(()) => Ok(c),
        Err(e @ ConfigError::NoCache(_)) if a.cache_mib == Some(0) => {
            usage(format!("--cache-mib 0: {e} (design {d}); give it 1 or more, or --exec two-sided"))
        }
        Err(ConfigError::NoCache(x)) if a.exec.is_some() => usage(format!(
            "--exec {}: finds remote records through the location cache, and design {d} keeps none; add --cache-mib ({} is the other designs')",
            x.name(),
            hytra_txn::CACHE_BYTES_DEFAULT >> 20
        )),
        Err(ConfigError::LockAtExecution(x)) if a.exec.is_some() && a.lock.is_none() => {
            // One-sided (NIC) locks need a one-sided commit to release them.
            let lock = match c.commit {
                Primitive::TwoSided => "--lock two-sided",
                Primitive::OneSided => "--lock one-sided or two-sided",
            };
            usage(format!(
                "--exec {}: design {d} locks at execution, which rides on the two-sided read RPC; add {lock}",
                x.name()
            ))
        }
        Err(ConfigError::LockAtExecution(x)) if a.lock.is_some() => usage(format!(
            "--lock at-execution rides on the two-sided read RPC, and execution is {} ({}); add --exec two-sided",
            x.name(),
            if a.exec.is_some() { "--exec".to_string() } else { format!("design {d}'s") }
        )),
        Err(e) => usage(e.to_string()),
    }
}

/// `design` with the options given (each checked on its own, the whole not yet).
fn build_config(a: &BenchArgs, design: Design) -> Result<TxnConfig, Usage> {
    let mut c = TxnConfig::preset(design);
    c.replication = a.replication;
    c.exec = a.exec.unwrap_or(c.exec);
    c.lock = a.lock.unwrap_or(c.lock);
    c.validate = a.validate.unwrap_or(c.validate);
    c.log = a.log.unwrap_or(c.log);
    c.commit = a.commit.unwrap_or(c.commit);
    c.passive_ack = on_or(a.passive_ack, c.passive_ack);
    c.outstanding = on_or(a.outstanding, c.outstanding);
    c.inline = on_or(a.inline, c.inline);
    if let Some(m) = a.cache_mib {
        c.cache_bytes = m << 20;
    }
    let sim = a.backend == "sim";
    let base = if sim { RecoveryParams::simulated() } else { RecoveryParams::real() };
    if let Some(ms) = a.lease_ms {
        if !(ms.is_finite() && (0.1..=600_000.0).contains(&ms)) {
            return usage(format!("--lease-ms {ms}: expected 0.1 to 600000"));
        }
        let r = c.recovery.unwrap_or(base);
        c.recovery = Some(RecoveryParams { lease_ns: (ms * 1e6) as u64, ..r });
    }
    if let Some(rate) = &a.rereplicate {
        let rereplication = match rate.as_str() {
            "off" => Rereplication::Off,
            mbps => match mbps.parse::<f64>() {
                Ok(m) if m.is_finite() && (1.0..=100_000.0).contains(&m) => {
                    Rereplication::Paced { bytes_per_sec: (m * 1e6) as u64 }
                }
                _ => {
                    return usage(format!(
                        "--rereplicate {rate}: expected off, or a rate of 1 to 100000 MB/s"
                    ))
                }
            },
        };
        let r = c.recovery.unwrap_or(base);
        c.recovery = Some(RecoveryParams { rereplication, ..r });
    }
    Ok(c)
}

/// Checks the options of a benchmark to be spread over processes without running
/// anything (for `hytra cluster`, before it starts the nodes).
pub fn check(a: &BenchArgs) -> Result<(), Usage> {
    if a.design == DesignPick::Auto {
        return usage(AUTO_SPREAD);
    }
    plan(a).map(|_| ())
}

/// Validates every option, and the run they make against the cluster and this machine's
/// memory, without building anything.
pub fn plan(a: &BenchArgs) -> Result<BenchPlan, Usage> {
    let sim = BackendKind::parse(&a.backend)? == BackendKind::Sim;
    let Some(profile) = NicProfile::by_name(&a.profile) else {
        return usage(format!(
            "unknown NIC profile '{}' (expected one of: {})",
            a.profile,
            NicProfile::NAMES.join(", ")
        ));
    };
    let cpu = match (&a.cpu_profile, sim) {
        (Some(_), false) => {
            return usage("--cpu-profile is the simulator's: real backends take their real time")
        }
        (Some(name), true) if name == CPU_MEASURED => None,
        (name, true) => Some(
            CpuProfile::load(name.as_deref().unwrap_or(CPU_PROFILE_DEFAULT))
                .map_err(|e| Usage(e.to_string()))?,
        ),
        (None, false) => None,
    };
    check_cluster_options(a, sim)?;
    if let Some(m) = a.cache_mib.filter(|&m| m > CACHE_MIB_MAX) {
        return usage(format!(
            "--cache-mib {m}: at most {CACHE_MIB_MAX} MiB per node (a cache larger than the tables it maps is never filled)"
        ));
    }
    if a.exec == Some(ExecStrategy::Offload) && sim && profile.offload.is_none() {
        return usage(format!(
            "--exec offload needs a NIC that runs verb programs: profile {} has none (use --profile cx5, or --backend local)",
            profile.name
        ));
    }
    check_workload_options(a)?;
    let (cfg, candidates) = designs(a)?;
    let default_s = match (sim, a.crash.is_empty()) {
        (false, true) => 5.0,
        (true, true) => SIM_DEFAULT_WINDOW_NS as f64 / 1e9,
        // Twenty leases: room to detect, reconfigure and run on.
        (_, false) => 20.0 * lease_of(&cfg, sim).lease_ns as f64 / 1e9,
    };
    let seconds = a.duration.map_or(default_s, Span::secs);
    let max_s = if sim { SIM_SECONDS_MAX } else { REAL_SECONDS_MAX };
    if seconds > max_s {
        return usage(format!(
            "--duration {}: expected at most {} on {}",
            Span::from_ns((seconds * 1e9).round() as u64),
            Span::from_ns((max_s * 1e9).round() as u64),
            a.backend
        ));
    }
    check_warmup(a.warmup).map_err(Usage)?;
    let crashes = crashes(a, &cfg, seconds)?;
    let shape =
        ClusterShape { nodes: a.nodes, workers_per_node: a.workers, lanes_per_peer: a.lanes };
    let workload = workload_spec(a)?;
    let params = bench_params(a, sim, seconds, &crashes);
    let backend = backend_spec(a, profile, cpu, shape, &workload, &crashes)?;
    let spec = RunSpec { backend, workload, txn: cfg, params };
    spec.validate().map_err(Usage)?;
    spec.check_memory().map_err(|e| Usage(e.to_string()))?;
    Ok(BenchPlan { spec, candidates, crashes })
}

/// Checks the cluster's size and the options that apply to some backends only.
fn check_cluster_options(a: &BenchArgs, sim: bool) -> Result<(), Usage> {
    if a.nodes == 0 || a.workers == 0 || a.coroutines == 0 {
        return usage("--nodes, --workers and --coroutines must be at least 1");
    }
    if a.coroutines > COROUTINES_MAX {
        return usage(format!(
            "--coroutines {}: at most {COROUTINES_MAX} per worker (the engine's own tasks share the worker)",
            a.coroutines
        ));
    }
    if a.replication == 0 {
        return usage("--replication 0: every partition needs at least one copy");
    }
    if a.replication > a.nodes {
        return usage(format!(
            "--nodes {} cannot hold {} copies of each partition (one per node; --replication defaults to 3): give --replication 1..={} or more nodes",
            a.nodes, a.replication, a.nodes
        ));
    }
    if a.faults_ppm > 0 && !sim {
        return usage("--faults-ppm applies to the sim backend only");
    }
    if a.faults_ppm > 1_000_000 {
        return usage(format!("--faults-ppm {}: parts per million, at most 1000000", a.faults_ppm));
    }
    // Options of one backend given to another would be ignored, and believed applied.
    let d = BenchArgs::default_run();
    let named = |id: &str| a.given.iter().any(|g| g == id);
    if (a.transports != d.transports || named("transports")) && a.backend != "ucx" {
        return usage("--transports applies to the ucx backend");
    }
    if (a.profile != d.profile || named("profile")) && !sim {
        return usage(format!(
            "--profile is the simulator's NIC model: the {} backend runs on this machine's own",
            a.backend
        ));
    }
    if a.wait.is_some() && a.backend != "ucx" {
        return usage(
            "--wait applies to the ucx backend (sim runs in virtual time, local threads poll)",
        );
    }
    match a.threads {
        Some(_) if sim => {
            return usage(
                "--threads applies to the local and ucx backends (sim runs in virtual time)",
            )
        }
        Some(t) if t == 0 || t > THREADS_MAX => {
            return usage(format!("--threads {t}: expected 1..={THREADS_MAX}"))
        }
        _ => {}
    }
    Ok(())
}

/// Where the run goes: the backend `a` names, set up for `workload` with `crashes`.
fn backend_spec(
    a: &BenchArgs,
    profile: NicProfile,
    cpu: Option<CpuProfile>,
    shape: ClusterShape,
    workload: &WorkloadSpec,
    crashes: &[Crash],
) -> Result<BackendSpec, Usage> {
    Ok(match BackendKind::parse(&a.backend)? {
        BackendKind::Sim => {
            let mut sc = SimConfig { profile, ..SimConfig::new(shape, a.seed) };
            match cpu {
                Some(p) => {
                    let (name, types) = workload.types();
                    sc.cpu_profile = p.table(name, types);
                }
                None => sc.cpu = CpuMode::Measured { scale: 1.0 },
            }
            if a.faults_ppm > 0 {
                sc.faults = FaultConfig::lossy(a.faults_ppm);
            }
            sc.faults.node_faults.extend(crashes.iter().flat_map(Crash::faults));
            BackendSpec::Sim(Box::new(sc))
        }
        BackendKind::Local => {
            let mut lc = LocalConfig { threads: a.threads, ..LocalConfig::new(shape) };
            lc.node_faults.extend(crashes.iter().flat_map(Crash::faults));
            BackendSpec::Local(lc)
        }
        BackendKind::Ucx => BackendSpec::Ucx(UcxSpec {
            shape,
            transports: Some(a.transports.clone()),
            threads: a.threads,
            wait: a.wait.unwrap_or(Wait::Poll),
            placement: a.placement.clone(),
        }),
    })
}

/// The workload `a` names, sized.
fn workload_spec(a: &BenchArgs) -> Result<WorkloadSpec, Usage> {
    Ok(match a.workload.as_str() {
        "smallbank" => WorkloadSpec::SmallBank { accounts_per_worker: a.accounts_per_worker },
        "tpcc" | "tpcc-no" => {
            let mix = match (a.workload.as_str(), a.tpcc_only.as_deref()) {
                // `check_workload_options` refused --tpcc-only on tpcc-no.
                ("tpcc-no", _) => TpccMix::NewOrderOnly,
                (_, None) => TpccMix::Standard,
                (_, Some(name)) => match TPCC_TYPES.iter().position(|t| t.replace('_', "-") == name) {
                    Some(i) => TpccMix::Only(i as u8),
                    None => {
                        return usage(format!(
                            "--tpcc-only '{name}': expected one of new-order, payment, order-status, delivery, stock-level"
                        ))
                    }
                },
            };
            WorkloadSpec::Tpcc {
                mix,
                warehouses_per_worker: a.warehouses_per_worker,
                customers: a.customers,
                items: a.items,
                remote_item_pct: a.remote_item_pct,
            }
        }
        "tpce-cp" => WorkloadSpec::TpceCp {
            customers_per_worker: a.tpce_customers_per_worker,
            market_feed_pct: a.market_feed_pct,
        },
        "tatp" => WorkloadSpec::Tatp {
            subscribers_per_worker: a.subscribers_per_worker,
            uniform: a.tatp_uniform,
        },
        "ycsb" => WorkloadSpec::Ycsb {
            mix: a.ycsb_mix,
            records_per_worker: a.records_per_worker,
            fields: a.fields,
            field_bytes: a.field_bytes,
            ops_per_txn: a.ops_per_txn,
            dist: if a.zipf_theta == 0.0 {
                KeyDist::Uniform
            } else {
                KeyDist::Zipfian(a.zipf_theta)
            },
        },
        other => unreachable!("check_workload_options refused workload '{other}'"),
    })
}

/// The run's window, seed, coroutines and checks.
fn bench_params(a: &BenchArgs, sim: bool, seconds: f64, crashes: &[Crash]) -> BenchParams {
    let measure_ns = (seconds * 1e9).round() as u64;
    let rt = RtConfig {
        doorbell_batching: on_or(a.doorbell_batching, true),
        rpc_coalescing: on_or(a.rpc_coalescing, true),
        // Longer than any delay the simulator's faults add (P4); threads may be
        // descheduled for milliseconds on a loaded machine.
        rpc_timeout_ns: if sim { 1_000_000 } else { 1_000_000_000 },
    };
    BenchParams {
        coroutines: a.coroutines,
        warmup_ns: warmup_ns(measure_ns, a.warmup),
        measure_ns,
        seed: a.seed,
        check: a.check,
        rt,
        drain_ns: if sim { 1_000_000_000 } else { 60_000_000_000 },
        warm_cache: on_or(a.warm_cache, true),
        // Intervals fine enough to see a recovery of a few leases.
        timeline_ns: if crashes.is_empty() {
            0
        } else {
            (((seconds * (1.0 + a.warmup)) * 1e9) as u64 / 10_000).max(CRASH_TIMELINE_NS)
        },
    }
}

/// Runs `hytra bench`.
/// `--cpu-profile` that measures every step instead of costing it from a profile.
const CPU_MEASURED: &str = "measured";
/// The longest measured window on sim, in virtual seconds: a 4 x 4 SmallBank run
/// simulates about 150 K transactions per wall-second, so this is hours of wall time.
const SIM_SECONDS_MAX: f64 = 60.0;
/// The longest measured window on local and ucx, in seconds.
const REAL_SECONDS_MAX: f64 = 86_400.0;
/// OS threads a local or ucx run may start.
const THREADS_MAX: usize = 4096;
/// The largest location cache per node, in MiB.
const CACHE_MIB_MAX: u64 = 1 << 20;

/// Refuses an option of one workload given to another (it would be ignored, and the
/// user would believe it applied). An option counts as given when it was named, even at
/// its default value, or differs from its default.
fn check_workload_options(a: &BenchArgs) -> Result<(), Usage> {
    if !WORKLOADS.contains(&a.workload.as_str()) {
        return usage(unknown_workload(&a.workload));
    }
    let d = BenchArgs::default_run();
    // Given: named on the command line, or set (a cluster file's own settings).
    let named = |id: &str| a.given.iter().any(|g| g == id);
    let given: [(&str, bool, &[&str]); 16] = [
        ("accounts-per-worker", a.accounts_per_worker != d.accounts_per_worker, &["smallbank"]),
        ("warehouses-per-worker", a.warehouses_per_worker != d.warehouses_per_worker, TPCC),
        ("customers", a.customers != d.customers, TPCC),
        ("items", a.items != d.items, TPCC),
        ("remote-item-pct", a.remote_item_pct != d.remote_item_pct, TPCC),
        ("tpcc-only", a.tpcc_only.is_some(), &["tpcc"]),
        (
            "tpce-customers-per-worker",
            a.tpce_customers_per_worker != d.tpce_customers_per_worker,
            &["tpce-cp"],
        ),
        ("market-feed-pct", a.market_feed_pct != d.market_feed_pct, &["tpce-cp"]),
        ("subscribers-per-worker", a.subscribers_per_worker != d.subscribers_per_worker, &["tatp"]),
        ("tatp-uniform", a.tatp_uniform, &["tatp"]),
        ("ycsb-mix", a.ycsb_mix != d.ycsb_mix, &["ycsb"]),
        ("records-per-worker", a.records_per_worker != d.records_per_worker, &["ycsb"]),
        ("zipf-theta", a.zipf_theta != d.zipf_theta, &["ycsb"]),
        ("ops-per-txn", a.ops_per_txn != d.ops_per_txn, &["ycsb"]),
        ("fields", a.fields != d.fields, &["ycsb"]),
        ("field-bytes", a.field_bytes != d.field_bytes, &["ycsb"]),
    ];
    for (flag, set, workloads) in given {
        let set = set || named(&flag.replace('-', "_"));
        if set && !workloads.contains(&a.workload.as_str()) {
            return usage(format!(
                "--{flag} applies to --workload {}, not {}",
                workloads.join(" or "),
                a.workload
            ));
        }
    }
    Ok(())
}

/// The workloads that take TPC-C's options.
const TPCC: &[&str] = &["tpcc", "tpcc-no"];

/// `--crash NODE@SECONDS`, checked against the cluster and the run's window.
fn crashes(a: &BenchArgs, cfg: &TxnConfig, seconds: f64) -> Result<Vec<Crash>, Usage> {
    if a.crash.is_empty() {
        if let Some(r) = a.restart.first() {
            return usage(format!("--restart '{r}': a node restarts only after a --crash"));
        }
        return Ok(Vec::new());
    }
    if a.backend == "ucx" {
        return usage(
            "--crash applies to the sim and local backends (processes of a ucx cluster cannot be crashed yet)",
        );
    }
    let (from, to) = (seconds * a.warmup, seconds * (1.0 + a.warmup));
    let show = |s: f64| match (s * 1e9).round() as u64 {
        0 => "0s".to_string(),
        ns => Span::from_ns(ns).to_string(),
    };
    let mut out: Vec<Crash> = Vec::new();
    for c in &a.crash {
        let (node, at) =
            crate::span::node_at(c).or_else(|e| usage(format!("--crash '{c}': {e}")))?;
        let (at_ns, at) = (at.ns(), at.secs());
        if node >= a.nodes {
            return usage(format!(
                "--crash '{c}': there is no node {node} (nodes are 0 to {})",
                a.nodes - 1
            ));
        }
        if !(at >= from && at < to) {
            return usage(format!(
                "--crash '{c}': the time must lie in the measured window, {} to {} from the start",
                show(from),
                show(to)
            ));
        }
        if out.iter().any(|o| o.node == node) {
            return usage(format!("--crash '{c}': node {node} is crashed twice"));
        }
        out.push(Crash { node, at_ns, restart_ns: None });
    }
    restarts(a, cfg, &mut out, ((to * 1e9).round() as u64, show(to)))?;
    out.sort_by_key(|c| c.at_ns);
    // Recovery decides the transactions in doubt from a surviving backup's log: every
    // partition must keep two copies through each failure. Crashes within three leases
    // of each other fail together (a manager's crash is detected only after a lease and
    // a quarter, and then recovered from);
    // later ones meet the copies re-replication made, if they are whole by then.
    let params = lease_of(cfg, a.backend == "sim");
    let timed: Vec<(NodeId, u64)> = out.iter().map(|c| (NodeId(c.node), c.at_ns)).collect();
    let copies = params.rereplication.target(a.replication);
    let apart = 3 * params.lease_ns;
    if let Err(why) = hytra_txn::resync::survivable(a.nodes, a.replication, copies, &timed, apart) {
        return usage(format!("--crash: {why}"));
    }
    Ok(out)
}

/// `--restart NODE@WHEN`, each of a node `crashes` crash before WHEN, within the window
/// (which ends at `end`).
fn restarts(
    a: &BenchArgs,
    cfg: &TxnConfig,
    crashes: &mut [Crash],
    (end_ns, end): (u64, String),
) -> Result<(), Usage> {
    for r in &a.restart {
        if a.backend != "sim" {
            return usage(format!(
                "--restart '{r}': only the simulator restarts nodes (use --backend sim)"
            ));
        }
        if cfg.exec == ExecStrategy::Offload {
            return usage(format!(
                "--restart '{r}': the offload strategy's NIC programs are not rebuilt on a restarted node; choose another --exec"
            ));
        }
        let (node, at) =
            crate::span::node_at(r).or_else(|e| usage(format!("--restart '{r}': {e}")))?;
        let Some(crash) = crashes.iter_mut().find(|c| c.node == node) else {
            return usage(format!(
                "--restart '{r}': node {node} is not crashed (give --crash {node}@WHEN first)"
            ));
        };
        if crash.restart_ns.is_some() {
            return usage(format!("--restart '{r}': node {node} is restarted twice"));
        }
        if at.ns() <= crash.at_ns || at.ns() >= end_ns {
            return usage(format!(
                "--restart '{r}': the time must come after node {node}'s crash and before the window ends at {end}"
            ));
        }
        crash.restart_ns = Some(at.ns());
    }
    Ok(())
}

/// A checked `hytra bench`: the run, `--design auto`'s candidates (empty for a named
/// design) and its crashes.
#[derive(Debug)]
pub struct BenchPlan {
    /// The run (for `--design auto`, with the first candidate until the trials pick).
    pub spec: RunSpec,
    /// `--design auto`'s candidates, labelled; empty for a named design.
    pub candidates: Vec<(String, TxnConfig)>,
    /// `--crash`es, by time.
    pub crashes: Vec<Crash>,
}

/// The leases a run uses: `--lease-ms`, or the backend's.
pub fn lease_of(cfg: &TxnConfig, sim: bool) -> RecoveryParams {
    cfg.recovery.unwrap_or(if sim { RecoveryParams::simulated() } else { RecoveryParams::real() })
}

/// The report of one run of `spec` with `crashes` that `a` asked for, begun `wall` ago:
/// its setup, the recovery times of its crashes, and the nodes of a cluster that died
/// (`hytra cluster --kill`), whose part came from their journals.
pub fn report(
    a: &BenchArgs,
    spec: &RunSpec,
    crashes: &[Crash],
    outcome: &crate::Outcome,
    wall: std::time::Duration,
) -> crate::bench::BenchReport {
    let result = &outcome.result;
    let sim = spec.backend.is_sim();
    let cpu_name = a.cpu_profile.as_deref().unwrap_or(CPU_PROFILE_DEFAULT);
    let setup = crate::bench::BenchSetup {
        workload: &a.workload,
        backend: &a.backend,
        shape: spec.backend.shape(),
        seed: a.seed,
        seconds: spec.params.measure_ns as f64 / 1e9,
        cfg: &spec.txn,
        params: &spec.params,
        sim: sim.then_some((a.profile.as_str(), cpu_name)),
        ucx: (a.backend == "ucx").then_some((a.transports.as_str(), wait_name(a.wait))),
        types: outcome.txn_types,
    };
    let mut report = crate::bench::BenchReport::new(&setup, result, wall);
    let recovered = crate::bench::recovery_times(crashes, &spec.params, result);
    if !recovered.is_empty() {
        report = report.with_crashes(&recovered, result);
    }
    if crashes.is_empty() && !result.recovery.crashed.is_empty() {
        report = report.with_lost(result.recovery.crashed.iter().map(|n| n.0).collect(), result);
    }
    report
}
