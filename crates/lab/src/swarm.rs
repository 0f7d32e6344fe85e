//! The swarm: every seed draws a whole configuration (workload, design and per-phase
//! overrides, cluster shape, knobs, NIC profile, atomics coherence, faults), runs it for a
//! short window and judges it with every oracle: the serializability checker (with the
//! contents of every read), the workload's invariants (replicas equal their primaries, no
//! lock left, no ticket or call leaked, the NIC index whole), no panic, no hang, progress
//! after the faults heal, and, for a sample of simulated seeds, the same trace twice.
//!
//! A seed is the whole description: `hytra swarm --seed S` draws and runs the same
//! configuration again, on the simulator with the same trace hash. Not for: printing
//! (the command line does) or measuring performance (the windows are short and the
//! tables tiny on purpose, to make conflicts and rare paths common).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Once};
use std::time::{Duration, Instant};

use hytra_fabric::cpu::CpuTable;
use hytra_fabric::local::LocalConfig;
use hytra_fabric::rng::Rng;
use hytra_fabric::sim::faults::{
    ClockDrift, CrashTiming, FaultConfig, NodeFault, NodeFaultKind, Partition, Way,
};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{Fencing, SimConfig};
use hytra_fabric::{ClusterShape, NodeId};
use hytra_rt::RtConfig;
use hytra_txn::suspect::SUSPICION_LEASES;
use hytra_txn::{
    Config, CrashPoint, Design, ExecStrategy, LockStrategy, PlantedFault, Primitive, ProtocolPoint,
    RecoveryParams, RecoveryStep, Rereplication, TxnConfig,
};
use hytra_workloads::bench::BenchParams;
use hytra_workloads::tpcc::TpccMix;
use hytra_workloads::ycsb::{KeyDist, Mix as YcsbMix};

use serde::{Deserialize, Serialize};

use crate::backend::{BackendSpec, UcxSpec};
use crate::cluster_file::Wait;
use crate::cpu_profile::CpuProfile;
use crate::run::{run, Outcome, RunSpec, Watch};
use crate::workload::{partition_bytes, WorkloadSpec};

/// The backend a swarm runs on.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum SwarmBackend {
    /// The simulator: deterministic, every fault, many seeds at once.
    Sim,
    /// Threads in real time: real races, no injected faults, one seed at a time.
    Local,
    /// UCX with every node in this process, over shared memory or TCP and polling or
    /// waiting on events (drawn per seed): the real transports' ordering and emulated
    /// one-sided operations, no injected faults or node losses (it cannot stop one node
    /// of a process), one seed at a time. Only in a build with the `ucx` feature.
    Ucx,
    /// Clusters of processes of this machine over UCX, most seeds with a process killed
    /// mid-run (`crate::swarm_processes`), one seed at a time. Only in a build with the
    /// `ucx` feature, run from the `hytra` binary (it launches itself).
    Processes,
}

impl SwarmBackend {
    /// Name, as `--backend` spells it.
    pub fn name(self) -> &'static str {
        match self {
            SwarmBackend::Sim => "sim",
            SwarmBackend::Local => "local",
            SwarmBackend::Ucx => "ucx",
            SwarmBackend::Processes => "processes",
        }
    }

    /// Whether this build can run seeds on it.
    pub fn available(self) -> bool {
        match self {
            SwarmBackend::Sim | SwarmBackend::Local => true,
            SwarmBackend::Ucx | SwarmBackend::Processes => cfg!(feature = "ucx"),
        }
    }
}

/// Stream of a UCX seed's transports and waiting, apart from the rest of its draw.
const UCX_STREAM: u64 = 0x5_3A4E;

/// What a UCX seed runs over (`UCX_TLS` syntax, with its name in the summary).
const UCX_TRANSPORTS: [&str; 2] = ["sm", "tcp"];

/// Stream of the seed the drawing uses (runs use the seed itself, with their own streams).
const DRAW_STREAM: u64 = 0x5_3A4D;
/// Every how many simulated seeds one runs twice to compare trace hashes.
const REPLAY_EVERY: u64 = 16;
/// Width of the commit timeline's intervals: simulated, and in real time.
const TIMELINE_SIM_NS: u64 = 50_000;
const TIMELINE_LOCAL_NS: u64 = 10_000_000;
/// RPC timeout of simulated runs: above the longest datagram delay the faults add (P4).
const RPC_TIMEOUT_SIM_NS: u64 = 1_000_000;
/// Virtual time a simulated cluster gets after its window to finish before it counts as
/// hung: a thousand RPC timeouts.
const DRAIN_SIM_NS: u64 = 1_000_000_000;
/// Time after the last fault heals that the window still runs, so that progress after
/// it can be seen: several RPC timeouts (retries, backoffs, unlocks).
const AFTER_HEAL_SIM_NS: u64 = 4 * RPC_TIMEOUT_SIM_NS;
/// Stream of the crash draw: a stream of its own, so that a seed without crashes draws
/// the same configuration as before crashes were drawn.
const CRASH_STREAM: u64 = 0xC_2A54;
/// Stream of the draw of a crash at a point of the protocol (see [`draw_point_crash`]).
const POINT_STREAM: u64 = 0x9_0147;
/// Stream of the long-pause draw (see [`draw_long_pause`]).
const LONG_PAUSE_STREAM: u64 = 0x10_9A05E;
/// Stream of the draw of a long network cut (see [`draw_long_cut`]).
const LONG_CUT_STREAM: u64 = 0x10_C07;
/// Stream of the draw of which way each partition cuts (see [`draw_ways`]).
const WAY_STREAM: u64 = 0x1_3A7;
/// Stream of the CPU profile a simulated seed's workers cost their work with.
const CPU_STREAM: u64 = 0xC9_C05;
/// Stream of the draws of clock drift and fencing (see [`add_leased_faults`]).
const LEASE_FAULTS_STREAM: u64 = 0xC10C_D21F;
/// Largest drift drawn for one node's clock: two nodes then differ by at most 4%,
/// within the sixteenth of a lease the engine allows between two clocks (F1a).
const CLOCK_DRIFT_PPM: i32 = 20_000;
/// Leases of the seeds with crashes: the simulator's 5 ms, and shorter ones that put
/// detection and recovery several times into a short window.
const CRASH_LEASES_NS: [u64; 3] = [1_000_000, 2_000_000, 5_000_000];
/// Leases of the threads backend's seeds with crashes: real time on a loaded 2-core
/// host, where a thread may lose its core for milliseconds (a lapsed lease removes a
/// live node), yet short enough to recover within a few tenths of a second.
const CRASH_LEASES_LOCAL_NS: [u64; 2] = [100_000_000, 200_000_000];
/// Leases a threads cluster gets after its last crash to recover, beyond the three
/// that detect it: two rounds of recovery that each wait up to two leases (four RPC
/// timeouts of half a lease) for a member that crashed during them.
const RECOVERY_SLACK_LEASES: u64 = 4;
/// Real time after the faults heal that a threads run's window still runs: ten
/// intervals of its commit timeline.
const AFTER_HEAL_LOCAL_NS: u64 = 10 * TIMELINE_LOCAL_NS;
/// Virtual time a cluster gets after its last crash to detect it and recover, beyond
/// three leases (a manager's crash is found a lease and a quarter late): the store's
/// commits and the rounds of recovery.
const RECOVERY_SLACK_NS: u64 = 3_000_000;
/// Stream of the re-replication draws (see [`draw_rereplication`]).
const REREPLICATION_STREAM: u64 = 0x2E_2E91;
/// Virtual time a simulated seed gives the copies of one failure, at most: the copy
/// rate goes up for partitions that would take longer at the drawn one.
const COPY_BUDGET_NS: u64 = 20_000_000;
/// The same on threads, in real time. A partition's regions are sized for every row the
/// window may insert, far more than a copy reads (only the rows the primary holds), so
/// that at threads' default rate the window would grow by seconds, the tables sized for
/// it with them, and the host run out of memory.
const COPY_BUDGET_LOCAL_NS: u64 = 300_000_000;
/// Stream of the restart draws (see [`draw_restarts`]).
const RESTART_STREAM: u64 = 0x2E_57A27;
/// Later crashes a seed may draw after its first failure's copies are whole.
const LATER_CRASHES_MAX: u64 = 2;
/// Longest partition drawn: below the profiles' transport retry time (0.5 ms), so that
/// one-sided requests wait for the partition to heal rather than fail (a failing
/// transport is a crash to the engine, which needs recovery).
const PARTITION_MAX_NS: u64 = 400_000;

/// Where the location cache stands.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum CacheSize {
    /// None.
    Off,
    /// A few KiB: entries evict each other all the time.
    Tiny(u64),
    /// The default size (room for every key).
    Full,
}

/// One seed's configuration.
#[derive(Clone, Debug)]
pub struct Draw {
    /// The seed.
    pub seed: u64,
    /// What runs.
    pub spec: RunSpec,
    /// The NIC profile's name (simulator).
    pub profile: &'static str,
    /// Whether NIC atomics are coherent with CPU atomics.
    pub coherent: bool,
    /// The location cache.
    pub cache: CacheSize,
    /// When the last fault is over (0: no fault), in the backend's clock.
    pub heal_ns: u64,
    /// When every partition that lost a copy to the seed's failures has it back at the
    /// latest (re-replication on, a node lost), in the backend's clock.
    pub replicated_by_ns: Option<u64>,
}

impl Draw {
    /// The configuration on one line.
    pub fn summary(&self) -> String {
        let s = &self.spec;
        let t = &s.txn;
        let shape = s.backend.shape();
        let on = |b: bool| if b { "on" } else { "off" };
        let mut line = format!(
            "{} on {}{} {}x{}x{} R={} design {} [exec {}, lock {}, validate {}, log {}, commit {}; pa {}, outstanding {}, inline {}, db {}, coalescing {}], cache {:?} {}, {}{} window {:.2} ms",
            s.workload.describe(),
            s.backend.name(),
            match &s.backend {
                BackendSpec::Sim(c) => format!("/{} cpu {}", self.profile, c.cpu_profile.name()),
                BackendSpec::Ucx(u) => format!("/{} {}", self.profile, u.wait.name()),
                BackendSpec::Local(_) => String::new(),
            },
            shape.nodes,
            shape.workers_per_node,
            s.params.coroutines,
            t.replication,
            t.design.name(),
            t.exec.name(),
            t.lock.name(),
            t.validate.name(),
            t.log.name(),
            t.commit.name(),
            on(t.passive_ack),
            on(t.outstanding),
            on(t.inline),
            on(s.params.rt.doorbell_batching),
            on(s.params.rt.rpc_coalescing),
            self.cache,
            if s.params.warm_cache { "warm" } else { "cold" },
            if self.coherent { "coherent atomics" } else { "NIC atomics" },
            match t.planted {
                Some(f) => format!(", planted {}", f.name()),
                None => String::new(),
            },
            s.params.measure_ns as f64 / 1e6,
        );
        match &s.backend {
            BackendSpec::Sim(c) if c.faults != FaultConfig::none() => {
                line.push_str(&format!("; faults {}", c.faults));
            }
            BackendSpec::Local(c) if !c.node_faults.is_empty() => {
                let each: Vec<String> = c.node_faults.iter().map(|f| f.to_string()).collect();
                line.push_str(&format!("; faults {}", each.join(", ")));
            }
            _ => {}
        }
        if let Some(c) = t.crash_point {
            line.push_str(&format!(
                "; crash {} {} from {} to {} us",
                c.node,
                c.point.name(),
                c.from_ns / 1000,
                c.until_ns / 1000
            ));
        }
        if let Some(r) = t.recovery {
            line.push_str(&format!("; lease {} ms", r.lease_ns / 1_000_000));
            match r.rereplication {
                Rereplication::Off => line.push_str(", no re-replication"),
                Rereplication::Paced { bytes_per_sec } => {
                    line.push_str(&format!(
                        ", re-replication at {} MB/s",
                        bytes_per_sec / 1_000_000
                    ));
                }
            }
        }
        line
    }

    /// Every dimension the draw covers, as (dimension, value) pairs, for the summary of
    /// what a swarm reached.
    pub fn dimensions(&self) -> Vec<(&'static str, String)> {
        let s = &self.spec;
        let t = &s.txn;
        let shape = s.backend.shape();
        let mut d = vec![
            ("workload", s.workload.name()),
            ("design", t.design.name().to_string()),
            ("exec", t.exec.name().to_string()),
            ("lock", t.lock.name().to_string()),
            ("validate", t.validate.name().to_string()),
            ("log", t.log.name().to_string()),
            ("commit", t.commit.name().to_string()),
            ("passive ack", t.passive_ack.to_string()),
            ("outstanding", t.outstanding.to_string()),
            ("inline", t.inline.to_string()),
            ("doorbell batching", s.params.rt.doorbell_batching.to_string()),
            ("rpc coalescing", s.params.rt.rpc_coalescing.to_string()),
            ("nodes", shape.nodes.to_string()),
            ("workers", shape.workers_per_node.to_string()),
            ("coroutines", bucket(u64::from(s.params.coroutines))),
            ("replication", t.replication.to_string()),
            ("cache", format!("{:?}", self.cache).split('(').next().unwrap_or("").to_string()),
            ("warm cache", s.params.warm_cache.to_string()),
            ("profile", self.profile.to_string()),
            ("cpu profile", cpu_label(&s.backend)),
            ("coherent atomics", self.coherent.to_string()),
        ];
        if let BackendSpec::Ucx(u) = &s.backend {
            d.push(("wait", u.wait.name().to_string()));
        }
        let kinds = self.fault_kinds();
        for (name, on) in kinds {
            if on {
                d.push(("faults", name.to_string()));
            }
        }
        if kinds.iter().all(|(_, on)| !on) {
            d.push(("faults", "none".to_string()));
        }
        let crashed = self.crashes();
        d.push(("crashes", crashed.len().to_string()));
        if !crashed.is_empty() {
            let manager = crashed.iter().any(|&(n, _)| n == NodeId(0));
            d.push(("crashed", if manager { "the manager" } else { "others" }.to_string()));
        }
        if let Some(c) = t.crash_point {
            d.push(("crash point", c.point.name().to_string()));
        }
        if let Some(r) = t.recovery {
            d.push(("lease", format!("{} ms", r.lease_ns / 1_000_000)));
            let copies = match (r.rereplication, self.replicated_by_ns) {
                (Rereplication::Off, _) => "off",
                (_, None) => "nothing to copy",
                // A crash after the copies of the first failure, on a copy made then.
                (_, Some(_)) if later_crashes(&crashed, r.lease_ns) => "copied, then crashed again",
                (_, Some(_)) => "copied",
            };
            d.push(("re-replication", copies.to_string()));
        }
        d
    }

    /// Which kinds of fault the draw has: (name, whether it does).
    fn fault_kinds(&self) -> [(&'static str, bool); 15] {
        let (s, t) = (&self.spec, &self.spec.txn);
        let none = FaultConfig::none();
        let (net, fencing) = match &s.backend {
            BackendSpec::Sim(c) => (&c.faults, c.fencing),
            _ => (&none, Fencing::Nic),
        };
        let node_faults = s.backend.node_faults();
        // A pause past the lease: the node is removed while it sleeps.
        let long = |n: &NodeFault| match (n.kind, t.recovery) {
            (NodeFaultKind::Pause { for_ns }, Some(r)) => for_ns > r.lease_ns,
            _ => false,
        };
        [
            ("loss", net.loss_ppm > 0),
            ("duplication", net.duplicate_ppm > 0),
            ("reordering", net.reorder_ppm > 0),
            ("delay", net.delay_ppm > 0),
            (
                "pause",
                node_faults
                    .iter()
                    .any(|n| matches!(n.kind, NodeFaultKind::Pause { .. }) && !long(n)),
            ),
            ("long pause", node_faults.iter().any(long)),
            ("crash", node_faults.iter().any(|n| n.kind == NodeFaultKind::Crash)),
            ("crash mid-write", net.crash_timing == CrashTiming::MidWrite),
            ("restart", node_faults.iter().any(|n| n.kind == NodeFaultKind::Restart)),
            ("crash at a point", t.crash_point.is_some()),
            (
                "partition",
                net.partitions.iter().any(|p| p.until_ns - p.from_ns <= PARTITION_MAX_NS),
            ),
            ("long cut", net.partitions.iter().any(|p| p.until_ns - p.from_ns > PARTITION_MAX_NS)),
            ("one way", net.partitions.iter().any(|p| p.way == Way::FromSide)),
            ("clock drift", !net.clock_drift.is_empty()),
            ("no fencing", fencing == Fencing::Unavailable),
        ]
    }

    /// The nodes the draw restarts, and when (ns), in time order.
    pub fn restarts(&self) -> Vec<(NodeId, u64)> {
        self.node_faults_of(NodeFaultKind::Restart)
    }

    /// The nodes the draw crashes, and when (ns), in time order.
    pub fn crashes(&self) -> Vec<(NodeId, u64)> {
        self.node_faults_of(NodeFaultKind::Crash)
    }

    /// The node faults of `kind` the draw has, by node and time (ns), in time order.
    fn node_faults_of(&self, kind: NodeFaultKind) -> Vec<(NodeId, u64)> {
        let faults = self.spec.backend.node_faults();
        let mut out: Vec<(NodeId, u64)> =
            faults.iter().filter(|f| f.kind == kind).map(|f| (f.node, f.at_ns)).collect();
        out.sort_by_key(|&(_, at)| at);
        out
    }
}

/// The earliest a node's clock may read at true time `at_ns`: clocks drift by up to
/// [`CLOCK_DRIFT_PPM`].
fn behind_by_drift(at_ns: u64) -> u64 {
    at_ns - at_ns / 1_000_000 * CLOCK_DRIFT_PPM as u64
}

/// Whether `crashes` (by time) come in more than one group, each more than the three
/// leases apart that make crashes fail together.
fn later_crashes(crashes: &[(NodeId, u64)], lease_ns: u64) -> bool {
    crashes.windows(2).any(|w| w[1].1 >= w[0].1 + 3 * lease_ns)
}

/// Powers of two as ranges: 1, 2-3, 4-7, 8-15, 16.
fn bucket(n: u64) -> String {
    let lo = 1u64 << (63 - n.max(1).leading_zeros());
    if lo == n {
        n.to_string()
    } else {
        format!("{lo}-{}", 2 * lo - 1)
    }
}

/// A choice among `items`.
pub(crate) fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[rng.below(items.len() as u64) as usize]
}

/// True with probability `num / den`.
pub(crate) fn chance(rng: &mut Rng, num: u64, den: u64) -> bool {
    rng.below(den) < num
}

/// Draws seed `seed`'s configuration on `backend`, one that runs seeds in this process (not
/// `Processes`: see `crate::swarm_processes`), with `planted` planted.
pub fn draw(seed: u64, backend: SwarmBackend, planted: Option<PlantedFault>) -> Draw {
    let mut rng = Rng::derive(seed, DRAW_STREAM);
    let sim = backend == SwarmBackend::Sim;
    let nodes = if sim { 2 + rng.below(5) as u16 } else { 2 + rng.below(3) as u16 };
    let workers = if sim { 1 + rng.below(4) as u16 } else { 1 + rng.below(2) as u16 };
    let coroutines = pick(&mut rng, &[1u16, 2, 3, 4, 8, 16]);
    let lanes = if chance(&mut rng, 1, 6) { 2 } else { 1 };
    let shape = ClusterShape { nodes, workers_per_node: workers, lanes_per_peer: lanes };
    let workload = draw_workload(&mut rng, nodes);
    let (profile, nic, offload_ok) = draw_nic(&mut rng, seed, backend);
    let coherent = nic.atomics_coherent;
    let (mut txn, cache) = draw_txn(&mut rng, nodes, offload_ok, planted);
    let mut rt = RtConfig {
        doorbell_batching: !chance(&mut rng, 1, 4),
        rpc_coalescing: !chance(&mut rng, 1, 4),
        rpc_timeout_ns: if sim { RPC_TIMEOUT_SIM_NS } else { 1_000_000_000 },
    };
    let warm_cache = chance(&mut rng, 1, 2);
    let warmup_ns = if sim { rng.below(300_000) } else { rng.below(30_000_000) };
    let mut measure_ns =
        if sim { 500_000 + rng.below(1_500_000) } else { 60_000_000 + rng.below(120_000_000) };
    let (mut faults, mut heal_ns) = if sim && chance(&mut rng, 1, 2) {
        draw_faults(&mut rng, nodes, warmup_ns + measure_ns)
    } else {
        (FaultConfig::none(), 0)
    };
    let span_ns = warmup_ns + measure_ns;
    let crashes = match backend {
        SwarmBackend::Ucx => None,
        _ => draw_node_losses(seed, sim, nodes, span_ns, &mut txn),
    };
    let (mut local_faults, mut fencing) = (Vec::new(), Fencing::Nic);
    let mut replicated_by_ns = None;
    if let Some((mut crashes, lease_ns, point_heal_ns, cut)) = crashes {
        let base = if sim { RecoveryParams::simulated() } else { RecoveryParams::real() };
        let part_bytes =
            partition_bytes(&workload, span_ns as f64 / 1e9, seed, shape, txn.replication);
        // A crash at the manager's point of the protocol takes a second node.
        let point =
            usize::from(txn.crash_point.is_some_and(|c| c.point == ProtocolPoint::Reconfiguring));
        let losses =
            Losses { seed, sim, nodes, replication: txn.replication, lease_ns, part_bytes, point };
        let (rereplication, mut copy_ns) = draw_rereplication(&losses, base, &mut crashes);
        if sim && txn.exec != ExecStrategy::Offload {
            copy_ns = add_restarts(seed, &mut crashes, lease_ns, copy_ns);
        }
        // When the last node fault ends: a crash at once, a pause when the node wakes.
        let last = crashes.iter().map(NodeFault::ends_at_ns).max().unwrap_or(0).max(point_heal_ns);
        let recovery = RecoveryParams { lease_ns, rereplication, ..base };
        if sim {
            heal_ns = heal_ns.max(last + 3 * lease_ns + RECOVERY_SLACK_NS + copy_ns);
            fencing = add_leased_faults(&mut faults, crashes, lease_ns, seed, nodes);
            faults.partitions.extend(cut);
        } else {
            // Calls to a crashed node wait out their timeout, and a round of recovery
            // takes a member for dead after four of them: half a lease keeps both within
            // the window (threads' default of a second would not).
            rt.rpc_timeout_ns = lease_ns / 2;
            heal_ns = last + 3 * lease_ns + RECOVERY_SLACK_LEASES * lease_ns + copy_ns;
            local_faults = crashes;
        }
        txn.recovery = Some(recovery);
        if rereplication != Rereplication::Off {
            replicated_by_ns = Some(heal_ns);
        }
    }
    draw_ways(seed, nodes, &mut faults.partitions);
    if heal_ns > 0 {
        let after = if sim { AFTER_HEAL_SIM_NS } else { AFTER_HEAL_LOCAL_NS };
        measure_ns = measure_ns.max(heal_ns + after - warmup_ns);
    }
    let params = BenchParams {
        coroutines,
        warmup_ns,
        measure_ns,
        seed,
        check: true,
        rt,
        drain_ns: if sim { DRAIN_SIM_NS } else { 60_000_000_000 },
        warm_cache,
        timeline_ns: if sim { TIMELINE_SIM_NS } else { TIMELINE_LOCAL_NS },
    };
    let backend = match backend {
        SwarmBackend::Sim => sim_backend(shape, seed, nic, faults, fencing, &workload),
        SwarmBackend::Local => local_backend(shape, local_faults),
        SwarmBackend::Ucx | SwarmBackend::Processes => ucx_backend(shape, seed),
    };
    Draw {
        seed,
        spec: RunSpec { backend, workload, txn, params },
        profile,
        coherent,
        cache,
        heal_ns,
        replicated_by_ns,
    }
}

/// What costs CPU time in a draw: a simulated profile, or the real one.
fn cpu_label(b: &BackendSpec) -> String {
    match b {
        BackendSpec::Sim(c) => c.cpu_profile.name().to_string(),
        BackendSpec::Local(_) => "threads".to_string(),
        BackendSpec::Ucx(_) => "ucx".to_string(),
    }
}

/// The draw's NIC: its name in the summary, the model (the simulator's; elsewhere only
/// its atomics' coherence counts), and whether it runs verb programs. On the simulator, a
/// profile, its atomics coherent with the CPU's or not; on threads atomics are the CPU's
/// and verb programs run; over UCX (shared memory or TCP, drawn from a stream of the
/// seed's own) atomics are coherent and no verb program runs.
fn draw_nic(rng: &mut Rng, seed: u64, backend: SwarmBackend) -> (&'static str, NicProfile, bool) {
    let mut nic = NicProfile::by_name("cx4").expect("a known profile");
    nic.atomics_coherent = true;
    match backend {
        SwarmBackend::Sim => {
            let profile = pick(rng, NicProfile::RNICS);
            let mut nic = NicProfile::by_name(profile).expect("a known profile");
            nic.atomics_coherent = chance(rng, 1, 2);
            let offload = nic.offload.is_some();
            (profile, nic, offload)
        }
        SwarmBackend::Local => ("threads", nic, true),
        SwarmBackend::Ucx => (draw_ucx(seed).0, nic, false),
        SwarmBackend::Processes => unreachable!("a seed of processes is drawn by swarm_processes"),
    }
}

/// The simulated cluster of a draw.
fn sim_backend(
    shape: ClusterShape,
    seed: u64,
    profile: NicProfile,
    faults: FaultConfig,
    fencing: Fencing,
    workload: &WorkloadSpec,
) -> BackendSpec {
    BackendSpec::Sim(Box::new(SimConfig {
        profile,
        faults,
        fencing,
        cpu_profile: draw_cpu(seed, workload),
        ..SimConfig::new(shape, seed)
    }))
}

/// The CPU costs of a simulated seed: half the seeds cost hytra's code as measured (the
/// `paper` profile), half as assumed (about a tenth of that), so that the same protocol
/// runs with the CPU and with the NIC the bottleneck.
fn draw_cpu(seed: u64, workload: &WorkloadSpec) -> CpuTable {
    let mut rng = Rng::derive(seed, CPU_STREAM);
    let name = if chance(&mut rng, 1, 2) { "paper" } else { "assumed" };
    let profile = CpuProfile::load(name).expect("a built-in CPU profile loads");
    let (workload, types) = workload.types();
    profile.table(workload, types)
}

/// The threads of a draw, two at a time so that the host's other core stays free.
fn local_backend(shape: ClusterShape, node_faults: Vec<NodeFault>) -> BackendSpec {
    BackendSpec::Local(LocalConfig { threads: Some(2), node_faults, ..LocalConfig::new(shape) })
}

/// The UCX cluster of a draw, its transports and waiting drawn from the seed.
fn ucx_backend(shape: ClusterShape, seed: u64) -> BackendSpec {
    let (transports, wait) = draw_ucx(seed);
    BackendSpec::Ucx(UcxSpec {
        shape,
        transports: Some(transports.to_string()),
        threads: Some(2),
        wait,
        placement: None,
    })
}

/// A UCX seed's transports and waiting, from a stream of their own (so that the rest of
/// the draw is the one the seed makes on threads).
fn draw_ucx(seed: u64) -> (&'static str, Wait) {
    let mut rng = Rng::derive(seed, UCX_STREAM);
    let transports = pick(&mut rng, &UCX_TRANSPORTS);
    (transports, if chance(&mut rng, 1, 2) { Wait::Event } else { Wait::Poll })
}

/// What the re-replication draws need to know of a seed that loses nodes.
struct Losses {
    seed: u64,
    sim: bool,
    nodes: u16,
    replication: u16,
    lease_ns: u64,
    /// Bytes of one partition's regions: the most a copy of it reads.
    part_bytes: u64,
    /// Nodes a crash at a point of the protocol takes beyond those drawn by time.
    point: usize,
}

impl Losses {
    /// Time to copy what losing `lost` nodes at once leaves short onto the `left`
    /// members, at `bytes_per_sec` per receiving node, and to mark the copies ready: as
    /// if one node received the share of the busiest, twice over (rows inserted since
    /// loading, and the copy's own pace), plus the lease the manager may wait for every
    /// report and a round of marking.
    fn copy_ns(&self, lost: u16, left: u16, bytes_per_sec: u64) -> u64 {
        let bytes = 2 * self.busiest_bytes(lost, left);
        bytes.saturating_mul(1_000_000_000) / bytes_per_sec.max(1) + 2 * self.lease_ns + 1_000_000
    }

    /// The most one receiving node copies after losing `lost` nodes of `lost + left`:
    /// the partitions the lost held (partitions, one per node, times copies, over the
    /// members before) spread over the members left, each at its largest.
    fn busiest_bytes(&self, lost: u16, left: u16) -> u64 {
        let before = u64::from(left + lost);
        let held = (u64::from(self.nodes) * u64::from(self.replication)).div_ceil(before.max(1));
        let parts = (u64::from(lost) * held).div_ceil(u64::from(left.max(1)));
        parts * self.part_bytes
    }
}

/// Re-replication for a seed that loses nodes (`crashes`, by time): off on a quarter of
/// them; else paced at the backend's default rate, and on half of the simulated seeds
/// that only crash, up to [`LATER_CRASHES_MAX`] more crashes, each once the copies the
/// failure before it started should be whole, of a node whose loss then leaves every
/// partition two copies (some only through those copies). Returns the re-replication and
/// the time after the last failure its copies need. A stream of its own: the rest of the
/// seed draws what it drew before.
fn draw_rereplication(
    l: &Losses,
    base: RecoveryParams,
    crashes: &mut Vec<NodeFault>,
) -> (Rereplication, u64) {
    let mut rng = Rng::derive(l.seed, REREPLICATION_STREAM);
    if chance(&mut rng, 1, 4) {
        return (Rereplication::Off, 0);
    }
    let rate = match base.rereplication {
        // The simulator's default, or faster (shorter runs; correctness does not
        // depend on the pace).
        // Tables sized for many inserts go faster still: their copies stay within
        // COPY_BUDGET_NS (COPY_BUDGET_LOCAL_NS on threads) however full they get.
        Rereplication::Paced { bytes_per_sec } => {
            let (times, budget) = match l.sim {
                true => (pick(&mut rng, &[1, 4, 16]), COPY_BUDGET_NS),
                false => (1, COPY_BUDGET_LOCAL_NS),
            };
            let most = l.busiest_bytes(l.nodes - 1, 1).saturating_mul(1_000_000_000) / budget;
            (bytes_per_sec * times).max(most)
        }
        Rereplication::Off => return (Rereplication::Off, 0),
    };
    // Nodes lost: those drawn, or the one a crash point takes.
    let lost = |c: &[NodeFault]| ((c.len() + l.point) as u16).max(1);
    // The last failure: the nodes lost within three leases of the last one.
    let last_at = crashes.iter().map(|c| c.at_ns).max().unwrap_or(0);
    let mut last_group = lost(
        &crashes
            .iter()
            .filter(|c| c.at_ns + 3 * l.lease_ns >= last_at)
            .copied()
            .collect::<Vec<_>>(),
    );
    let only_crashes = crashes.iter().all(|c| c.kind == NodeFaultKind::Crash);
    if l.sim && only_crashes && l.point == 0 && !crashes.is_empty() && chance(&mut rng, 1, 2) {
        for _ in 0..1 + rng.below(LATER_CRASHES_MAX) {
            let prev = crashes[crashes.len() - 1].at_ns;
            let left = l.nodes.saturating_sub(lost(crashes));
            let at_ns = prev
                + 3 * l.lease_ns
                + RECOVERY_SLACK_NS
                + l.copy_ns(last_group, left, rate)
                + rng.below(l.lease_ns);
            let timed: Vec<(NodeId, u64)> = crashes.iter().map(|c| (c.node, c.at_ns)).collect();
            let candidates: Vec<NodeId> = (0..l.nodes)
                .map(NodeId)
                .filter(|n| !timed.iter().any(|(c, _)| c == n))
                .filter(|&n| {
                    let mut with = timed.clone();
                    with.push((n, at_ns));
                    let r = l.replication;
                    hytra_txn::resync::survivable(l.nodes, r, r, &with, 3 * l.lease_ns).is_ok()
                })
                .collect();
            if candidates.is_empty() {
                break;
            }
            let node = candidates[rng.below(candidates.len() as u64) as usize];
            crashes.push(NodeFault { node, at_ns, kind: NodeFaultKind::Crash });
            last_group = 1;
        }
    }
    let left = l.nodes - lost(crashes).min(l.nodes - 1);
    (Rereplication::Paced { bytes_per_sec: rate }, l.copy_ns(last_group, left, rate))
}

/// Adds restarts of crashed nodes, on half the simulated seeds with crashes by time: each
/// crashed node comes back, wiped, with a chance of one in two, from half a transport
/// timeout (the simulator holds it back to a whole one) to three leases after its crash,
/// before or after its earlier life is removed. A stream of its own: the rest of the seed
/// draws what it drew before.
/// Returns the time the copies after the last failure need, `copy_ns` before the
/// restarts: a restarted node joins once its earlier life is removed and the copies that
/// removal started are whole, then copies its own share.
fn add_restarts(seed: u64, crashes: &mut Vec<NodeFault>, lease_ns: u64, copy_ns: u64) -> u64 {
    let mut rng = Rng::derive(seed, RESTART_STREAM);
    if !chance(&mut rng, 1, 2) {
        return copy_ns;
    }
    let mut restarts = Vec::new();
    for c in crashes.iter().filter(|c| c.kind == NodeFaultKind::Crash) {
        if chance(&mut rng, 1, 2) {
            let at_ns = c.at_ns + 250_000 + rng.below(3 * lease_ns);
            restarts.push(NodeFault { node: c.node, at_ns, kind: NodeFaultKind::Restart });
        }
    }
    if restarts.is_empty() {
        return copy_ns;
    }
    crashes.extend(restarts);
    2 * copy_ns + 3 * lease_ns + RECOVERY_SLACK_NS
}

fn draw_workload(rng: &mut Rng, nodes: u16) -> WorkloadSpec {
    match rng.below(11) {
        0 => WorkloadSpec::SmallBank { accounts_per_worker: pick(rng, &[8, 64, 512, 4096]) },
        k @ (1 | 2) => {
            // TPC-C/no needs two nodes (every transaction is distributed); one type alone
            // now and then, so that the rare ones (delivery, stock-level) run often.
            let mix = match (k, rng.below(4)) {
                (2, _) if nodes >= 2 => TpccMix::NewOrderOnly,
                (_, 0) => TpccMix::Only(rng.below(5) as u8),
                _ => TpccMix::Standard,
            };
            WorkloadSpec::Tpcc {
                mix,
                warehouses_per_worker: 1 + rng.below(2),
                customers: pick(rng, &[30, 60, 120]),
                items: pick(rng, &[100, 500, 2000]),
                remote_item_pct: pick(rng, &[1, 10, 50]),
            }
        }
        3 => WorkloadSpec::TpceCp {
            customers_per_worker: pick(rng, &[10, 100, 500]),
            market_feed_pct: pick(rng, &[0, 10, 50]),
        },
        4 => WorkloadSpec::Tatp {
            subscribers_per_worker: pick(rng, &[20, 200, 2000]),
            uniform: chance(rng, 1, 2),
        },
        k => WorkloadSpec::Ycsb {
            mix: YcsbMix::ALL[(k - 5) as usize],
            // Workload E scans up to 100 records: the table must hold that many.
            records_per_worker: match k {
                9 => pick(rng, &[100, 256, 4096]),
                _ => pick(rng, &[16, 256, 4096]),
            },
            fields: pick(rng, &[1, 4, 10]),
            field_bytes: pick(rng, &[8, 32, 96]),
            ops_per_txn: pick(rng, &[1, 2, 4, 10]),
            dist: match rng.below(3) {
                0 => KeyDist::Uniform,
                1 => KeyDist::Zipfian(0.6),
                _ => KeyDist::Zipfian(0.99),
            },
        },
    }
}

/// Draws a design, per-phase overrides and knobs until the combination is one the engine
/// accepts (a bounded number of times; the plain preset always is).
fn draw_txn(
    rng: &mut Rng,
    nodes: u16,
    offload_ok: bool,
    planted: Option<PlantedFault>,
) -> (TxnConfig, CacheSize) {
    const TRIES_MAX: usize = 32;
    let design = pick(rng, &Design::ALL);
    let replication = 1 + rng.below(u64::from(nodes.min(3))) as u16;
    let cache = match rng.below(4) {
        0 => CacheSize::Off,
        1 => CacheSize::Tiny(pick(rng, &[1u64 << 10, 4 << 10, 16 << 10])),
        _ => CacheSize::Full,
    };
    let base = TxnConfig { replication, planted, ..TxnConfig::preset(design) };
    let exec_choices: &[ExecStrategy] = if offload_ok {
        ExecStrategy::ALL
    } else {
        &ExecStrategy::ALL[..ExecStrategy::ALL.len() - 1]
    };
    for _ in 0..TRIES_MAX {
        let mut c = base;
        if chance(rng, 1, 3) {
            c.exec = pick(rng, exec_choices);
        }
        if chance(rng, 1, 3) {
            c.lock = pick(rng, LockStrategy::ALL);
        }
        for p in [&mut c.validate, &mut c.log, &mut c.commit] {
            if chance(rng, 1, 3) {
                *p = pick(rng, Primitive::ALL);
            }
        }
        for knob in [&mut c.passive_ack, &mut c.outstanding, &mut c.inline] {
            if chance(rng, 1, 4) {
                *knob = !*knob;
            }
        }
        c.cache_bytes = match cache {
            CacheSize::Off => 0,
            CacheSize::Tiny(b) => b,
            CacheSize::Full => base.cache_bytes.max(hytra_txn::config::CACHE_BYTES_DEFAULT),
        };
        // Strategies that need a cache get a tiny one rather than a refusal.
        if c.cache_bytes == 0 && c.exec.needs_cache() {
            c.cache_bytes = 4 << 10;
        }
        if c.check(nodes).is_ok() {
            let cache = match c.cache_bytes {
                0 => CacheSize::Off,
                b if b < 1 << 20 => CacheSize::Tiny(b),
                _ => CacheSize::Full,
            };
            return (c, cache);
        }
    }
    let c = TxnConfig { cache_bytes: TxnConfig::preset(design).cache_bytes, ..base };
    let cache = if c.cache_bytes == 0 { CacheSize::Off } else { CacheSize::Full };
    (c, cache)
}

/// Datagram faults, node pauses and healing partitions, all over before `span_ns` ends;
/// returns them and when the last is over.
fn draw_faults(rng: &mut Rng, nodes: u16, span_ns: u64) -> (FaultConfig, u64) {
    let mut f = FaultConfig::none();
    let rate = |rng: &mut Rng| pick(rng, &[0u32, 0, 1_000, 10_000, 50_000]);
    f.loss_ppm = rate(rng);
    f.duplicate_ppm = rate(rng);
    f.reorder_ppm = rate(rng);
    f.reorder_window_ns = 20_000;
    f.delay_ppm = rate(rng);
    f.delay_ns = 200_000;
    let mut heal = 0;
    if f.datagram_faults() {
        // Datagram faults last the whole run: progress is judged over its last part.
        heal = span_ns / 2;
    }
    for _ in 0..rng.below(3) {
        let at_ns = rng.below(span_ns / 2 + 1);
        // Shorter than the simulator's lease (5 ms): a longer pause removes the node,
        // which the crash tests cover (workloads/tests/recovery.rs).
        let for_ns = pick(rng, &[10_000, 100_000, 500_000, 2_000_000]);
        let node = NodeId(rng.below(u64::from(nodes)) as u16);
        f.node_faults.push(NodeFault { node, at_ns, kind: NodeFaultKind::Pause { for_ns } });
        heal = heal.max(at_ns + for_ns);
    }
    // Partitions overlap within one window no longer than PARTITION_MAX_NS, so that two
    // nodes are never cut off for longer, even by a chain of partitions.
    let window = rng.below(span_ns / 2 + 1);
    for _ in 0..rng.below(3) {
        // A proper, non-empty subset of the nodes on one side.
        let mask = 1 + rng.below((1u64 << nodes) - 2);
        let side = (0..nodes).filter(|n| mask >> n & 1 == 1).map(NodeId).collect();
        let from_ns = window + rng.below(PARTITION_MAX_NS - 10_000);
        let until_ns = from_ns + 10_000 + rng.below(window + PARTITION_MAX_NS - from_ns - 10_000);
        f.partitions.push(Partition { side, from_ns, until_ns, way: Way::Both });
        heal = heal.max(until_ns);
    }
    if f == FaultConfig::none() {
        f.loss_ppm = 10_000;
        heal = span_ns / 2;
    }
    (f, heal)
}

/// Which way each partition cuts, from a stream of its own (the other draws stay as they
/// were): a third of them lose only what their side sends, a third only what it
/// receives (what the rest sends it), the rest both ways. One way, a request may take
/// effect and its answer be lost, and a node may hear the manager's grants while its
/// renewals are lost, or the reverse.
fn draw_ways(seed: u64, nodes: u16, partitions: &mut [Partition]) {
    let mut rng = Rng::derive(seed, WAY_STREAM);
    for p in partitions {
        match rng.below(3) {
            0 => {}
            1 => p.way = Way::FromSide,
            _ => {
                p.side = (0..nodes).map(NodeId).filter(|n| !p.side.contains(n)).collect();
                p.way = Way::FromSide;
            }
        }
    }
}

/// The generator of `stream` and the starting configuration, on one in `one_in` of the
/// seeds whose replication leaves every partition two copies after losing a node.
fn may_lose_a_node(
    seed: u64,
    stream: u64,
    one_in: u64,
    nodes: u16,
    replication: u16,
) -> Option<(Rng, Config)> {
    let mut rng = Rng::derive(seed, stream);
    let start = Config::initial(nodes, replication);
    (chance(&mut rng, 1, one_in) && start.fewest_copies_without(&[NodeId(0)]).1 >= 2)
        .then_some((rng, start))
}

/// Crashes of one or two nodes, on a third of the seeds whose replication leaves every
/// partition two copies after them (recovery decides the transactions in doubt from a
/// surviving backup's log), at any time of the run; and the lease that detects them.
fn draw_crashes(
    seed: u64,
    nodes: u16,
    replication: u16,
    span_ns: u64,
    leases_ns: &[u64],
) -> Option<(Vec<NodeFault>, u64)> {
    let (mut rng, start) = may_lose_a_node(seed, CRASH_STREAM, 3, nodes, replication)?;
    let lease_ns = pick(&mut rng, leases_ns);
    let first = NodeId(rng.below(u64::from(nodes)) as u16);
    let at_ns = rng.below(span_ns);
    let mut crashes = vec![NodeFault { node: first, at_ns, kind: NodeFaultKind::Crash }];
    if chance(&mut rng, 1, 3) {
        // Among the nodes whose loss with the first still leaves every partition two
        // copies (without re-replication, one copy is a backup short of surviving what
        // was in doubt): with 3 copies, only the node opposite the first on 6.
        let pick_second = rng.below(u64::from(nodes)) as usize;
        let candidates: Vec<NodeId> = (0..nodes)
            .map(NodeId)
            .filter(|&n| n != first && start.fewest_copies_without(&[first, n]).1 >= 2)
            .collect();
        // At the same instant, or while the cluster may still be recovering from the first.
        let at_ns = if chance(&mut rng, 1, 2) { at_ns } else { at_ns + rng.below(3 * lease_ns) };
        if !candidates.is_empty() {
            let second = candidates[pick_second % candidates.len()];
            crashes.push(NodeFault { node: second, at_ns, kind: NodeFaultKind::Crash });
        }
    }
    Some((crashes, lease_ns))
}

/// What may cost the cluster a node: crashes, else a long pause, else a crash
/// at a point of the protocol, which goes into `txn`, else (on the simulator) a long
/// network cut. Returns the faults by time, the lease that detects them, when a crash at
/// a point or a cut's removal is over at the latest (0 without one), and the cut.
fn draw_node_losses(
    seed: u64,
    sim: bool,
    nodes: u16,
    span_ns: u64,
    txn: &mut TxnConfig,
) -> Option<(Vec<NodeFault>, u64, u64, Option<Partition>)> {
    let leases: &[u64] = if sim { &CRASH_LEASES_NS } else { &CRASH_LEASES_LOCAL_NS };
    let r = txn.replication;
    let by_time = draw_crashes(seed, nodes, r, span_ns, leases)
        .or_else(|| draw_long_pause(seed, nodes, r, span_ns, leases));
    if by_time.is_some() {
        return by_time.map(|(faults, lease_ns)| (faults, lease_ns, 0, None));
    }
    if let Some(point) = draw_point_crash(seed, nodes, r, span_ns, leases) {
        let (faults, point, lease_ns) = point;
        txn.crash_point = Some(point);
        // A crash at the point comes by its window's end or never.
        return Some((faults, lease_ns, point.until_ns, None));
    }
    if !sim {
        return None;
    }
    // The cut's node is removed once its suspicions stood their time and reached the
    // manager at its next turn (a lease); or the manager steps down, and a member takes
    // over a lease and a quarter later.
    let (cut, lease_ns) = draw_long_cut(seed, nodes, r, span_ns, leases)?;
    let settled = cut.until_ns + (SUSPICION_LEASES + 3) * lease_ns;
    Some((Vec::new(), lease_ns, settled, Some(cut)))
}

/// A network cut of one node from the others, at least 1 ms past the transport's retries
/// (0.5 ms: a request posted while more than that is left of the cut fails, and its
/// connection stays broken, as an RC queue pair in the error state) and at times longer
/// than a lease, on a sixth of the simulated seeds that could lose a
/// node but draw no crash, long pause or crash point: the node, or the manager if cut,
/// is removed by suspicion or by its lapsed lease. Returns the cut and the lease.
fn draw_long_cut(
    seed: u64,
    nodes: u16,
    replication: u16,
    span_ns: u64,
    leases_ns: &[u64],
) -> Option<(Partition, u64)> {
    let (mut rng, _) = may_lose_a_node(seed, LONG_CUT_STREAM, 6, nodes, replication)?;
    let lease_ns = pick(&mut rng, leases_ns);
    let node = NodeId(rng.below(u64::from(nodes)) as u16);
    let from_ns = rng.below(span_ns);
    let for_ns = pick(&mut rng, &[1_500_000, 3_000_000, 2 * lease_ns]);
    let until_ns = from_ns + for_ns;
    Some((Partition { side: vec![node], from_ns, until_ns, way: Way::Both }, lease_ns))
}

/// A crash at a point of the protocol, on a fifth of the seeds that could lose a node but
/// draw no crash and no long pause: a coordinator that has landed one log entry
/// of several, or has written back one record of several; or the manager that has just
/// committed the configuration removing a node crashed at the same time (drawn only
/// where losing both leaves every partition two copies, as for [`draw_crashes`]'s second
/// crash). Returns the crashes by time that go with it, the point, and the lease.
fn draw_point_crash(
    seed: u64,
    nodes: u16,
    replication: u16,
    span_ns: u64,
    leases_ns: &[u64],
) -> Option<(Vec<NodeFault>, CrashPoint, u64)> {
    let (mut rng, start) = may_lose_a_node(seed, POINT_STREAM, 5, nodes, replication)?;
    let lease_ns = pick(&mut rng, leases_ns);
    let node = NodeId(rng.below(u64::from(nodes)) as u16);
    let from_ns = rng.below(span_ns);
    let point = pick(&mut rng, ProtocolPoint::ALL);
    if point != ProtocolPoint::Reconfiguring {
        let until_ns = from_ns + lease_ns;
        return Some((Vec::new(), CrashPoint { node, point, from_ns, until_ns }, lease_ns));
    }
    // The node crashed by time, among those whose loss with the manager of their
    // recovery leaves every partition two copies. That manager is node 0, or node 1
    // when node 0 is the one lost (the first of the members ranked to take over).
    let manager_of = |n: NodeId| if n == NodeId(0) { NodeId(1) } else { NodeId(0) };
    let candidates: Vec<NodeId> = (0..nodes)
        .map(NodeId)
        .filter(|&n| start.fewest_copies_without(&[n, manager_of(n)]).1 >= 2)
        .collect();
    if candidates.is_empty() {
        // A coordinator's point where the manager's cannot be drawn.
        let point = ProtocolPoint::LoggedPartly;
        let until_ns = from_ns + lease_ns;
        return Some((Vec::new(), CrashPoint { node, point, from_ns, until_ns }, lease_ns));
    }
    let crashed = candidates[usize::from(node.0) % candidates.len()];
    let crash = NodeFault { node: crashed, at_ns: from_ns, kind: NodeFaultKind::Crash };
    // The manager gets there once it has found the crash: a lease after it for a
    // member, two or three for the manager (its successor takes over).
    let until_ns = from_ns + 4 * lease_ns;
    let manager = manager_of(crashed);
    Some((vec![crash], CrashPoint { node: manager, point, from_ns, until_ns }, lease_ns))
}

/// A pause longer than a lease of one node, on a sixth of the seeds that crash nothing
/// but could lose a node (see [`draw_crashes`]): two to six leases, so that the node is
/// removed while it sleeps (a manager is taken over two or three leases into its
/// silence), wakes with its lease long lapsed, and must do no harm: post nothing that
/// takes effect, report no outcome recovery did not decide, learn that it was removed
/// and stop. A stream of its own, so seeds that crash draw what they drew before.
fn draw_long_pause(
    seed: u64,
    nodes: u16,
    replication: u16,
    span_ns: u64,
    leases_ns: &[u64],
) -> Option<(Vec<NodeFault>, u64)> {
    let (mut rng, _) = may_lose_a_node(seed, LONG_PAUSE_STREAM, 6, nodes, replication)?;
    let lease_ns = pick(&mut rng, leases_ns);
    let node = NodeId(rng.below(u64::from(nodes)) as u16);
    let at_ns = rng.below(span_ns);
    let for_ns = lease_ns * pick(&mut rng, &[2, 3, 6]);
    Some((vec![NodeFault { node, at_ns, kind: NodeFaultKind::Pause { for_ns } }], lease_ns))
}

/// Adds a seed's crashes or long pause, drawn with leases of `lease_ns`, to the
/// network's faults, with what else tests the leases: drifting clocks, and on a quarter
/// of the seeds a fabric that cannot fence (only a removed node's lease stops it, as on
/// UCX shared memory), which it returns. Those two have a stream of their own: the rest
/// of the seed draws what it drew before.
fn add_leased_faults(
    faults: &mut FaultConfig,
    crashes: Vec<NodeFault>,
    lease_ns: u64,
    seed: u64,
    nodes: u16,
) -> Fencing {
    // A pause as long as a lease would remove a live node: the pauses drawn with the
    // network's faults stay within the ratio of the default lease to the longest of them
    // (5 to 2); only a long pause drawn as such removes one.
    for f in &mut faults.node_faults {
        if let NodeFaultKind::Pause { for_ns } = &mut f.kind {
            *for_ns = (*for_ns).min(lease_ns * 2 / 5);
        }
    }
    faults.node_faults.extend(crashes);
    let mut rng = Rng::derive(seed, LEASE_FAULTS_STREAM);
    // Half the seeds: each node's clock off by up to CLOCK_DRIFT_PPM either way.
    if chance(&mut rng, 1, 2) {
        let span = 2 * CLOCK_DRIFT_PPM as u64 + 1;
        faults.clock_drift = (0..nodes)
            .map(|n| ClockDrift { node: NodeId(n), ppm: rng.below(span) as i32 - CLOCK_DRIFT_PPM })
            .filter(|d| d.ppm != 0)
            .collect();
    }
    let fencing = match chance(&mut rng, 1, 4) {
        true => Fencing::Unavailable,
        false => Fencing::Nic,
    };
    // Half the seeds that crash a node: at a WRITE of several packets, torn.
    let crashes = faults.node_faults.iter().any(|f| f.kind == NodeFaultKind::Crash);
    if crashes && chance(&mut rng, 1, 2) {
        faults.crash_timing = CrashTiming::MidWrite;
    }
    fencing
}

/// What one seed's run showed.
#[derive(Clone, Debug)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Its configuration on one line.
    pub summary: String,
    /// Its dimensions (for the coverage summary).
    pub dimensions: Vec<(&'static str, String)>,
    /// What the oracles found wrong; empty if the seed passed.
    pub findings: Vec<String>,
    /// Trace hash (simulator).
    pub trace_hash: Option<u64>,
    /// Transactions committed in the window.
    pub commits: u64,
    /// Wall time of the seed.
    pub wall: Duration,
}

impl SeedReport {
    /// The report of seed `seed` before its run: its configuration and dimensions, no
    /// finding yet.
    pub fn new(seed: u64, summary: String, dimensions: Vec<(&'static str, String)>) -> Self {
        SeedReport {
            seed,
            summary,
            dimensions,
            findings: Vec::new(),
            trace_hash: None,
            commits: 0,
            wall: Duration::ZERO,
        }
    }

    /// Whether every oracle was satisfied.
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }
}

thread_local! {
    /// The last panic message of this thread, while a seed runs on it.
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    static CAPTURING: RefCell<bool> = const { RefCell::new(false) };
}

/// Installs (once) a panic hook that keeps the message of a panic on a thread that runs
/// a seed, instead of printing it, and leaves every other panic to the previous hook.
fn capture_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(|c| *c.borrow()) {
                let msg = match info.payload().downcast_ref::<&str>() {
                    Some(s) => s.to_string(),
                    None => info.payload().downcast_ref::<String>().cloned().unwrap_or_default(),
                };
                let at = info.location().map(|l| format!(" at {l}")).unwrap_or_default();
                let trace = hytra_frames(&std::backtrace::Backtrace::force_capture().to_string());
                PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}{trace}")));
            } else {
                previous(info);
            }
        }));
    });
}

/// The frames of a backtrace that are hytra's own code (where a panic came from, without
/// the standard library's and the panic machinery's frames), as " (via f, g, ...)".
fn hytra_frames(trace: &str) -> String {
    const FRAMES_MAX: usize = 8;
    let frames: Vec<&str> = trace
        .lines()
        .map(str::trim)
        .filter_map(|l| l.split_once(": ").map(|(_, f)| f))
        .filter(|f| f.starts_with("hytra_") && !f.contains("swarm::capture_panics"))
        .take(FRAMES_MAX)
        .collect();
    match frames.is_empty() {
        true => String::new(),
        false => format!(" (via {})", frames.join(" <- ")),
    }
}

/// Runs a draw, catching a panic as a finding.
fn run_caught(d: &Draw) -> Result<Outcome, String> {
    CAPTURING.with(|c| *c.borrow_mut() = true);
    let r = catch_unwind(AssertUnwindSafe(|| run(&d.spec, Watch::default())));
    CAPTURING.with(|c| *c.borrow_mut() = false);
    match r {
        Ok(Ok(Some(o))) => Ok(o),
        Ok(Ok(None)) => Err("the run reported nothing (not the first process)".into()),
        Ok(Err(e)) => Err(format!("the run failed: {e}")),
        Err(_) => {
            let msg = PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default();
            Err(format!("panic: {msg}"))
        }
    }
}

/// Draws, runs and judges one seed in this process (a seed of processes runs with
/// [`run_seed_on`]).
pub fn run_seed(seed: u64, backend: SwarmBackend, planted: Option<PlantedFault>) -> SeedReport {
    capture_panics();
    let started = Instant::now();
    let d = draw(seed, backend, planted);
    let mut report = SeedReport::new(seed, d.summary(), d.dimensions());
    match run_caught(&d) {
        Ok(o) => {
            report.commits = o.result.stats.commits;
            if d.spec.backend.is_sim() {
                report.trace_hash = Some(o.result.run.trace_hash);
            }
            report.findings = judge(&d, &o);
            if let Some(c) = d.spec.txn.crash_point {
                // Whether the run got there: coverage of the points, not an oracle.
                let reached = o.result.recovery.crashed.contains(&c.node);
                report.dimensions.push(("crash point reached", reached.to_string()));
            }
            if d.spec.backend.is_sim() && seed % REPLAY_EVERY == 0 && report.findings.is_empty() {
                match run_caught(&d) {
                    Ok(again) if again.result.run.trace_hash != o.result.run.trace_hash => {
                        report.findings.push(format!(
                            "not deterministic: trace hash {:#018x}, then {:#018x}",
                            o.result.run.trace_hash, again.result.run.trace_hash
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => report.findings.push(format!("the replay failed: {e}")),
                }
            }
        }
        Err(e) => report.findings.push(e),
    }
    report.wall = started.elapsed();
    report
}

/// Runs seed `seed` on `backend`: [`run_seed`] in this process, or as processes
/// ([`crate::swarm_processes::run_seed`], which alone may stop at `interrupted` and then
/// reports nothing).
pub fn run_seed_on(
    seed: u64,
    backend: SwarmBackend,
    planted: Option<PlantedFault>,
    interrupted: fn() -> bool,
) -> Option<SeedReport> {
    match backend {
        SwarmBackend::Processes => {
            assert!(planted.is_none(), "no bug is planted in processes");
            crate::swarm_processes::run_seed(seed, interrupted)
        }
        SwarmBackend::Sim | SwarmBackend::Local | SwarmBackend::Ucx => {
            Some(run_seed(seed, backend, planted))
        }
    }
}

/// The oracles: what is wrong with a finished run of `d`.
pub fn judge(d: &Draw, o: &Outcome) -> Vec<String> {
    let r = &o.result;
    let mut findings = Vec::new();
    match &r.checker {
        Some(c) if c.serializable() => {}
        Some(c) => findings.push(format!(
            "not serializable: {} violations, first {:?}",
            c.violations.len(),
            &c.violations[..c.violations.len().min(2)]
        )),
        None => findings.push("the history was not checked".into()),
    }
    if !r.invariant.ok {
        findings.push(format!("invariant violated: {}", r.invariant.details.join("; ")));
    }
    // Crashes: every crashed node removed, and every removal finished. Steps are timed
    // by their node's clock, which may run behind true time by the drift drawn.
    let crashes: Vec<(NodeId, u64)> =
        d.crashes().into_iter().map(|(n, at)| (n, behind_by_drift(at))).collect();
    for &(node, at_ns) in &crashes {
        let removed = r.recovery.events.iter().any(|(_, e)| {
            e.at_ns >= at_ns
                && matches!(&e.step, RecoveryStep::Removing { dead, .. } if dead.contains(&node))
        });
        if !removed {
            findings.push(format!("{node} crashed at {} us and was never removed", at_ns / 1000));
        }
    }
    // Restarts: every node drawn to restart was a member again: its new life (no earlier
    // than the restart; the earlier one was dead by then) was activated in a
    // configuration.
    for (node, at_ns) in d.restarts() {
        let at_ns = behind_by_drift(at_ns);
        let joined = r.recovery.events.iter().any(|(n, e)| {
            *n == node && e.at_ns >= at_ns && matches!(e.step, RecoveryStep::Active { .. })
        });
        if !joined {
            findings
                .push(format!("{node} restarted at {} us and never joined again", at_ns / 1000));
        }
    }
    // A crash at a point of the protocol happens when the run gets there: every node the
    // run saw crash, removed too, and not before the point's window opened.
    let point = d.spec.txn.crash_point.filter(|c| r.recovery.crashed.contains(&c.node));
    for &node in r.recovery.crashed.iter().filter(|n| !crashes.iter().any(|(c, _)| c == *n)) {
        let from = point.filter(|c| c.node == node).map_or(0, |c| c.from_ns);
        let removed = r.recovery.events.iter().any(|(_, e)| {
            e.at_ns >= from
                && matches!(&e.step, RecoveryStep::Removing { dead, .. } if dead.contains(&node))
        });
        if !removed {
            findings.push(format!("{node} crashed at its crash point and was never removed"));
        }
    }
    // Every configuration committed to the store (without a crashed node, or one paused
    // past its lease) ends with every member active in it. A removal that lost the
    // store's race (a removed node waking and taking the manager for dead) commits none.
    let at = |pred: &dyn Fn(&RecoveryStep) -> bool| {
        r.recovery.events.iter().filter(|(_, e)| pred(&e.step)).map(|(_, e)| e.at_ns).max()
    };
    if let Some(removing) = at(&|s| matches!(s, RecoveryStep::Committed { .. })) {
        let crashed = crashes.last().map_or(0, |&(_, t)| t).max(point.map_or(0, |c| c.from_ns));
        let active = at(&|s| matches!(s, RecoveryStep::ActiveEverywhere { .. }));
        if active.is_none_or(|a| a < removing.max(crashed)) {
            findings.push(format!(
                "the cluster was not active everywhere after its last new configuration ({} us; last crash at {} us)",
                removing / 1000,
                crashed / 1000
            ));
        }
    }
    // Re-replication: every copy a failure started is whole, and marked so, by the time
    // the draw allowed for it.
    if d.replicated_by_ns.is_some() && !r.recovery.still_copying.is_empty() {
        findings.push(format!(
            "re-replication not done by the end of the run: {:?} (partition, node) still copying",
            r.recovery.still_copying
        ));
    }
    // Progress: something commits over the whole run, and after the faults heal.
    let timeline = &r.stats.timeline;
    let width = d.spec.params.timeline_ns;
    let total: u64 = timeline.iter().sum();
    if total == 0 {
        findings.push("no progress: nothing committed in the whole run".into());
    } else if d.heal_ns > 0 {
        let from = usize::try_from(d.heal_ns.div_ceil(width)).unwrap_or(usize::MAX);
        let after: u64 = timeline.iter().skip(from).sum();
        if after == 0 {
            findings.push(format!(
                "no progress after the faults healed at {} us ({total} commits before)",
                d.heal_ns / 1000
            ));
        }
    }
    findings
}

/// What a swarm runs.
#[derive(Clone, Debug)]
pub struct SwarmOptions {
    /// The backend.
    pub backend: SwarmBackend,
    /// The first seed.
    pub first_seed: u64,
    /// Seeds to run (`None`: until the time limit).
    pub seeds: Option<u64>,
    /// Stop starting seeds after this long (`None`: no limit).
    pub time_limit: Option<Duration>,
    /// Seeds run at once (the simulator is one thread per seed; `local`, `ucx` and
    /// `processes` run one at a time whatever this says).
    pub jobs: usize,
    /// A bug planted in every seed (to prove that the oracles catch it).
    pub planted: Option<PlantedFault>,
    /// Stop at the first failing seed.
    pub stop_at_failure: bool,
    /// Asked before each seed starts: true stops the swarm there (the command line's
    /// Ctrl-C); the seeds already running finish and are reported.
    pub stop_early: fn() -> bool,
}

/// What a swarm found.
#[derive(Clone, Debug, Default)]
pub struct SwarmSummary {
    /// Every seed run, in seed order.
    pub seeds: Vec<SeedReport>,
    /// Wall time.
    pub wall: Duration,
    /// (dimension, value) -> seeds that had it.
    pub coverage: BTreeMap<&'static str, BTreeMap<String, u64>>,
    /// Whether [`SwarmOptions::stop_early`] ended it before its bound.
    pub stopped_early: bool,
}

impl SwarmSummary {
    /// The seeds that failed.
    pub fn failures(&self) -> impl Iterator<Item = &SeedReport> {
        self.seeds.iter().filter(|s| !s.passed())
    }

    /// Seeds per minute of wall time.
    pub fn seeds_per_minute(&self) -> f64 {
        self.seeds.len() as f64 / self.wall.as_secs_f64().max(1e-9) * 60.0
    }
}

/// The version of [`SwarmReport`]'s and [`SeedRow`]'s layouts; it changes when a field
/// changes meaning or goes away (new fields keep it).
pub const SWARM_SCHEMA: u32 = 1;

/// One seed, as reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedRow {
    /// [`SWARM_SCHEMA`].
    pub schema: u32,
    /// The seed.
    pub seed: u64,
    /// Whether every oracle was satisfied.
    pub passed: bool,
    /// Its configuration on one line.
    pub configuration: String,
    /// What the oracles found wrong.
    pub findings: Vec<String>,
    /// Trace hash (simulator), in hex.
    pub trace_hash: Option<String>,
    /// Transactions committed in the window.
    pub commits: u64,
    /// Wall time of the seed.
    pub wall_s: f64,
}

impl SeedReport {
    /// The seed's row.
    pub fn row(&self) -> SeedRow {
        SeedRow {
            schema: SWARM_SCHEMA,
            seed: self.seed,
            passed: self.passed(),
            configuration: self.summary.clone(),
            findings: self.findings.clone(),
            trace_hash: self.trace_hash.map(|h| format!("{h:#018x}")),
            commits: self.commits,
            wall_s: self.wall.as_secs_f64(),
        }
    }
}

/// Everything a swarm found (`hytra swarm --json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SwarmReport {
    /// [`SWARM_SCHEMA`].
    pub schema: u32,
    /// Always `swarm`.
    pub command: String,
    /// The backend, as `--backend` names it.
    pub backend: String,
    /// The first seed.
    pub first_seed: u64,
    /// The bug planted in every seed, if any.
    pub planted: Option<String>,
    /// Seeds run.
    pub seeds_run: usize,
    /// The seeds that failed.
    pub failed: Vec<u64>,
    /// Whether a stop signal ended the swarm before its bound (`seeds_run` then counts
    /// the seeds that finished).
    #[serde(default)]
    pub stopped_early: bool,
    /// Wall time.
    pub wall_s: f64,
    /// Seeds per minute of wall time.
    pub seeds_per_minute: f64,
    /// Dimension -> value -> seeds that had it.
    pub coverage: BTreeMap<String, BTreeMap<String, u64>>,
    /// Every seed, in seed order.
    pub results: Vec<SeedRow>,
}

impl SwarmSummary {
    /// The report of this swarm, run as `opts` says.
    pub fn report(&self, opts: &SwarmOptions) -> SwarmReport {
        SwarmReport {
            schema: SWARM_SCHEMA,
            command: "swarm".into(),
            backend: opts.backend.name().into(),
            first_seed: opts.first_seed,
            planted: opts.planted.map(|p| p.name().to_string()),
            seeds_run: self.seeds.len(),
            failed: self.failures().map(|r| r.seed).collect(),
            stopped_early: self.stopped_early,
            wall_s: self.wall.as_secs_f64(),
            seeds_per_minute: self.seeds_per_minute(),
            coverage: self.coverage.iter().map(|(d, v)| (d.to_string(), v.clone())).collect(),
            results: self.seeds.iter().map(SeedReport::row).collect(),
        }
    }
}

/// What a seed's run costs, roughly, in units of one simulated worker over one virtual
/// millisecond of SmallBank-like work: workers in the cluster times the virtual time run,
/// four times over for TPC-C, whose transactions touch tens of records and whose
/// conflicts abort more (seeds 1-200: a median of 13-16 ms of wall time per worker and
/// virtual ms for TPC-C against 2-6 for every other workload).
pub fn cost_estimate(d: &Draw) -> u64 {
    let shape = d.spec.backend.shape();
    let workers = u64::from(shape.nodes) * u64::from(shape.workers_per_node);
    let span_us = (d.spec.params.warmup_ns + d.spec.params.measure_ns) / 1_000;
    let weight = match d.spec.workload {
        WorkloadSpec::Tpcc { .. } => 4,
        _ => 1,
    };
    workers * span_us * weight
}

/// The order in which a swarm starts its seeds (offsets from the first): the costliest
/// first where several run at once and every seed will run (a fixed count, no time
/// limit), so that one long seed does not start last and leave the other jobs idle at
/// the end; in seed order otherwise (a time-limited swarm runs the seeds it reaches).
fn start_order(opts: &SwarmOptions, jobs: usize) -> Option<Vec<u64>> {
    let n = opts.seeds.filter(|_| jobs > 1 && opts.time_limit.is_none())?;
    let mut order: Vec<(u64, u64)> = (0..n)
        .map(|i| (cost_estimate(&draw(opts.first_seed + i, opts.backend, opts.planted)), i))
        .collect();
    // Costliest first; ties in seed order (the sort is stable).
    order.sort_by_key(|&(cost, _)| std::cmp::Reverse(cost));
    Some(order.into_iter().map(|(_, i)| i).collect())
}

/// Runs seeds as `opts` says; `on_seed` sees each report as it comes (in completion
/// order), for progress lines.
pub fn run_swarm(opts: &SwarmOptions, mut on_seed: impl FnMut(&SeedReport)) -> SwarmSummary {
    assert!(opts.seeds.is_some() || opts.time_limit.is_some(), "a swarm needs a bound");
    let started = Instant::now();
    let jobs = match opts.backend {
        SwarmBackend::Sim => opts.jobs.max(1),
        SwarmBackend::Local | SwarmBackend::Ucx | SwarmBackend::Processes => 1,
    };
    let order = start_order(opts, jobs);
    let next = AtomicU64::new(0);
    let (stop, stopped_early) = (AtomicBool::new(false), AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<SeedReport>();
    let mut summary = SwarmSummary::default();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, stop, stopped_early, order) = (&next, &stop, &stopped_early, &order);
            s.spawn(move || loop {
                if stop.load(Ordering::Relaxed)
                    || opts.time_limit.is_some_and(|t| started.elapsed() >= t)
                {
                    return;
                }
                // Every seed started: the swarm ends at its bound, whatever the signal.
                if opts.seeds.is_some_and(|n| next.load(Ordering::Relaxed) >= n) {
                    return;
                }
                if (opts.stop_early)() {
                    stopped_early.store(true, Ordering::Relaxed);
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if opts.seeds.is_some_and(|n| i >= n) {
                    return;
                }
                let offset = order.as_ref().map_or(i, |o| o[i as usize]);
                let seed = opts.first_seed + offset;
                let Some(report) = run_seed_on(seed, opts.backend, opts.planted, opts.stop_early)
                else {
                    // Stopped by the signal: the seed's processes are gone, and it is not
                    // reported.
                    stopped_early.store(true, Ordering::Relaxed);
                    return;
                };
                if tx.send(report).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        for report in rx {
            on_seed(&report);
            if !report.passed() && opts.stop_at_failure {
                stop.store(true, Ordering::Relaxed);
            }
            summary.seeds.push(report);
        }
    });
    summary.seeds.sort_by_key(|r| r.seed);
    for r in &summary.seeds {
        for (dim, value) in &r.dimensions {
            *summary.coverage.entry(dim).or_default().entry(value.clone()).or_default() += 1;
        }
    }
    summary.wall = started.elapsed();
    summary.stopped_early = stopped_early.into_inner();
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draw_is_a_function_of_its_seed() {
        for seed in 0..50 {
            let (a, b) = (draw(seed, SwarmBackend::Sim, None), draw(seed, SwarmBackend::Sim, None));
            assert_eq!(a.summary(), b.summary());
            assert_eq!(a.spec.validate(), Ok(()), "seed {seed}: {}", a.summary());
            assert!(a.spec.txn.check(a.spec.backend.shape().nodes).is_ok());
        }
        let distinct: std::collections::BTreeSet<String> =
            (0..50).map(|s| draw(s, SwarmBackend::Sim, None).summary()).collect();
        assert!(distinct.len() > 45, "seeds draw different configurations");
    }

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket(1), "1");
        assert_eq!(bucket(3), "2-3");
        assert_eq!(bucket(16), "16");
        assert_eq!(bucket(12), "8-15");
    }

    /// Several jobs and a fixed count start the costliest seeds first, every seed once;
    /// one job, or a time limit, keeps seed order.
    #[test]
    fn the_costliest_seeds_start_first_where_all_will_run() {
        let opts = |jobs: usize, time_limit: Option<Duration>| SwarmOptions {
            backend: SwarmBackend::Sim,
            first_seed: 150,
            seeds: Some(20),
            time_limit,
            jobs,
            planted: None,
            stop_at_failure: false,
            stop_early: || false,
        };
        let order = start_order(&opts(2, None), 2).expect("an order for two jobs");
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).collect::<Vec<u64>>(), "every seed once");
        let cost = |i: u64| cost_estimate(&draw(150 + i, SwarmBackend::Sim, None));
        assert!(order.windows(2).all(|w| cost(w[0]) >= cost(w[1])), "{order:?}");
        // Seed 160 (TPC-C New-Order on 6 x 4 for 69 virtual ms) runs longest of these.
        assert_eq!(order[0], 10);
        assert_ne!(order, (0..20).collect::<Vec<u64>>());
        assert_eq!(start_order(&opts(1, None), 1), None);
        assert_eq!(start_order(&opts(2, Some(Duration::from_secs(60))), 2), None);
    }
}
