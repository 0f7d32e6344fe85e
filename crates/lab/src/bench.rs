//! What one `hytra bench` run reports, as a typed value: the numbers the command prints
//! and writes as JSON come from one [`BenchReport`], so the two cannot disagree, and a
//! program can read the JSON back into the same type. Also the recovery times of the
//! crashes a run injected. Not for: running (see `run.rs`) or printing.

use std::collections::BTreeMap;
use std::time::Duration;

use hytra_fabric::{ClusterShape, NodeFault, NodeFaultKind, NodeId};
use hytra_txn::{AbortClass, AbortReason, RecoveryStep, TxnConfig};
use hytra_workloads::bench::{BenchParams, BenchResult, RecoveryTimes, RECOVERED_SHARE};
use serde::{Deserialize, Serialize};

/// The version of [`BenchReport`]'s layout; it changes when a field changes meaning or
/// goes away (new fields keep it).
pub const BENCH_SCHEMA: u32 = 1;

/// A node to crash, when, and when it restarts (if it does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crash {
    /// The node.
    pub node: u16,
    /// When, in ns from the start of the run (warm-up included).
    pub at_ns: u64,
    /// When the node restarts, wiped, to join again (simulator only), if it does.
    pub restart_ns: Option<u64>,
}

impl Crash {
    /// The faults a backend injects: the crash, and the restart if there is one.
    pub fn faults(&self) -> impl Iterator<Item = NodeFault> {
        let node = NodeId(self.node);
        let crash = NodeFault { node, at_ns: self.at_ns, kind: NodeFaultKind::Crash };
        let restart =
            self.restart_ns.map(|at_ns| NodeFault { node, at_ns, kind: NodeFaultKind::Restart });
        std::iter::once(crash).chain(restart)
    }

    /// Time from the crash until the restarted node was a member again: its new life
    /// activated in a configuration (in `r`'s recovery steps); `None` without a restart
    /// or a join.
    pub fn rejoined_ns<R>(&self, r: &BenchResult<R>) -> Option<u64> {
        let restart = self.restart_ns?;
        let node = NodeId(self.node);
        let (_, active) = r.recovery.events.iter().find(|(n, e)| {
            *n == node && e.at_ns >= restart && matches!(e.step, RecoveryStep::Active { .. })
        })?;
        Some(active.at_ns - self.at_ns)
    }
}

/// The recovery times of each crash of a run, in the order given (sorted by time).
/// Crashes at one instant are one failure and share its times; each crash's rates are
/// measured between the recovery from the one before (its crash time if it never
/// recovered) and the next crash.
pub fn recovery_times<R>(
    crashes: &[Crash],
    params: &BenchParams,
    r: &BenchResult<R>,
) -> Vec<(Crash, RecoveryTimes)> {
    let (mut from, to) = (params.warmup_ns, params.warmup_ns + params.measure_ns);
    let mut out: Vec<(Crash, RecoveryTimes)> = Vec::with_capacity(crashes.len());
    for (k, &c) in crashes.iter().enumerate() {
        if let Some(t) = out.last().filter(|(p, _)| p.at_ns == c.at_ns).map(|&(_, t)| t) {
            out.push((c, t));
            continue;
        }
        let until = crashes[k + 1..].iter().map(|n| n.at_ns).find(|&t| t > c.at_ns).unwrap_or(to);
        let t = r.recovery.times(c.at_ns, params.timeline_ns, from.min(c.at_ns), until);
        from = t.recovered_ns.map_or(c.at_ns, |ns| c.at_ns + ns);
        out.push((c, t));
    }
    out
}

/// What a run was, beside its numbers: the labels a report carries.
#[derive(Clone, Debug)]
pub struct BenchSetup<'a> {
    /// The workload, as `--workload` names it.
    pub workload: &'a str,
    /// The backend, as `--backend` names it.
    pub backend: &'a str,
    /// The cluster.
    pub shape: ClusterShape,
    /// The seed of every random choice.
    pub seed: u64,
    /// The measured window, in the backend's clock.
    pub seconds: f64,
    /// The engine's configuration the run used.
    pub cfg: &'a TxnConfig,
    /// The run's parameters.
    pub params: &'a BenchParams,
    /// On the simulator: its NIC and CPU profiles.
    pub sim: Option<(&'a str, &'a str)>,
    /// On UCX: the transports and how idle threads waited.
    pub ucx: Option<(&'a str, &'a str)>,
    /// The workload's transaction types (index = type id).
    pub types: &'a [&'a str],
}

/// The engine's choices for each phase, and the knobs that change what a run costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs, reason = "each is the TxnConfig or RtConfig field of the same name")]
pub struct ConfigReport {
    pub exec: String,
    pub lock: String,
    pub validate: String,
    pub log: String,
    pub commit: String,
    pub passive_ack: bool,
    pub outstanding: bool,
    pub inline: bool,
    pub doorbell_batching: bool,
    pub rpc_coalescing: bool,
    pub warm_cache: bool,
    pub cache_bytes: u64,
    pub retries_max: u32,
    pub log_ring_bytes: u64,
}

/// Latency of committed transactions, from their first attempt, in µs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs, reason = "quantiles")]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// Mean time per committed transaction in each phase, in µs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs, reason = "the four phases")]
pub struct Phases {
    pub execution: f64,
    pub validation: f64,
    pub logging: f64,
    pub commit: f64,
}

/// Commits and aborts of one transaction type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs, reason = "counts in the measured window")]
pub struct TypeCounts {
    pub commits: u64,
    pub aborts: u64,
}

/// The serializability checker's verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckerReport {
    /// Whether the history was recorded and checked (`--check`).
    pub checked: bool,
    /// Its verdict, if checked.
    pub serializable: Option<bool>,
    /// Transactions checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transactions: Option<usize>,
    /// Dependency edges of the graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<usize>,
    /// Violations found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub violations: Option<usize>,
    /// The first few violations, as text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_violations: Vec<String>,
}

/// Location cache lookups of the whole run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs, reason = "counts")]
pub struct CacheReport {
    pub hits: u64,
    pub misses: u64,
}

/// Lookups sent to a primary's NIC (`--exec offload`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicLookupReport {
    /// Sent.
    pub sent: u64,
    /// Answered with the record.
    pub found: u64,
    /// Answered without it: the read went by RPC.
    pub fell_back: u64,
    /// Not sent, the coroutine's slot at that node taken: the read went by RPC.
    pub slot_busy: u64,
    /// Not answered in time: the read went by RPC.
    pub timed_out: u64,
}

/// A UCX run's transports and waiting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs, reason = "the flags and the backend's counters of the same name")]
pub struct UcxReport {
    pub transports: String,
    pub wait: String,
    pub event_sleeps: u64,
    pub event_wakeups: u64,
}

/// The simulator's profiles and its own speed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// NIC profile.
    pub profile: String,
    /// CPU profile.
    pub cpu_profile: String,
    /// Events simulated (setup and loading excluded).
    pub events: u64,
    /// Verbs simulated.
    pub verbs: u64,
    /// Wall time of the simulated run, without setup and loading.
    pub run_wall_s: f64,
    /// Events per wall-second of the run.
    pub events_per_wall_s: f64,
    /// Transaction attempts (warm-up and retries included) per wall-second of the run.
    pub txn_per_wall_s: f64,
}

/// One crash the run injected, and how long recovery took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrashReport {
    /// The node.
    pub node: u16,
    /// When, in seconds from the start of the run.
    pub at_s: f64,
    /// To the manager setting out to remove it, ms after the crash.
    pub detected_ms: Option<f64>,
    /// To the new configuration committed.
    pub configured_ms: Option<f64>,
    /// To every partition served again.
    pub active_ms: Option<f64>,
    /// To every partition's copies whole again.
    pub replicated_ms: Option<f64>,
    /// To the survivors back to `recovered_share` of their throughput before.
    pub recovered_ms: Option<f64>,
    /// When the node restarted (`--restart`), in seconds from the start of the run.
    #[serde(default)]
    pub restart_s: Option<f64>,
    /// To the restarted node a member again (activated), ms after the crash.
    #[serde(default)]
    pub rejoined_ms: Option<f64>,
    /// The share of the survivors' throughput before the crash that counts as recovered.
    pub recovered_share: f64,
    /// The survivors' throughput before the crash.
    pub survivors_tps_before: f64,
    /// The survivors' throughput from their recovery on.
    pub survivors_tps_after: f64,
}

/// A step of recovery on a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    /// The node.
    pub node: u16,
    /// When, in seconds from the start of the run.
    pub at_s: f64,
    /// The step.
    pub step: String,
}

/// A partition still being copied to a new backup when the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyingReport {
    /// The partition.
    pub partition: u16,
    /// The new backup copying it.
    pub node: u16,
}

/// The crashes of a run and recovery's steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrashesReport {
    /// Each crash, by time.
    pub each: Vec<CrashReport>,
    /// Recovery's steps on every node, by time.
    pub steps: Vec<StepReport>,
    /// Commits of the survivors per timeline interval.
    pub survivors_timeline: Vec<u64>,
    /// Partitions still being copied at the end.
    pub still_copying: Vec<CopyingReport>,
}

/// A candidate of `--design auto` and its trial's throughput.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialReport {
    /// The candidate.
    pub candidate: String,
    /// Its throughput in the trial, transactions per second.
    pub throughput_tps: f64,
}

/// What `--design auto` tried and chose.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutoReport {
    /// The chosen candidate.
    pub chose: String,
    /// Every trial, in the order run.
    pub trials: Vec<TrialReport>,
}

/// Everything one `hytra bench` run measured and found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// [`BENCH_SCHEMA`].
    pub schema: u32,
    /// Always `bench`.
    pub command: String,
    /// The workload.
    pub workload: String,
    /// The design preset.
    pub design: String,
    /// The backend.
    pub backend: String,
    /// Nodes.
    pub nodes: u16,
    /// Workers per node.
    pub workers: u16,
    /// Coroutines per worker.
    pub coroutines: u16,
    /// Copies of every partition.
    pub replication: u16,
    /// The measured window, in seconds of the backend's clock.
    pub seconds: f64,
    /// The default window asked for, in seconds, when it held less than twice the p99
    /// latency and `seconds` is the longer one measured instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_extended_from_s: Option<f64>,
    /// The seed.
    pub seed: u64,
    /// The engine's configuration.
    pub config: ConfigReport,
    /// Commits per second of the window.
    pub throughput_tps: f64,
    /// Aborted attempts over all attempts.
    pub abort_rate: f64,
    /// Attempts aborted by concurrency control over all attempts.
    pub abort_rate_cc: f64,
    /// Abort rate per class of cause.
    pub abort_rate_by_class: BTreeMap<String, f64>,
    /// Commits in the window.
    pub committed: u64,
    /// Transactions that gave up after `config.retries_max` attempts.
    pub gave_up: u64,
    /// Retries that waited because the same attempt of another transaction kept a lock
    /// across the transaction's blocked attempts (a holder whose node died keeps it
    /// until recovery removes the node); the whole run.
    #[serde(default)]
    pub stuck_lock_waits: u64,
    /// Aborts per reason.
    pub aborts: BTreeMap<String, u64>,
    /// Latency quantiles.
    pub latency_us: Quantiles,
    /// Mean time per phase.
    pub phases_us: Phases,
    /// Commits and aborts per transaction type.
    pub per_type: BTreeMap<String, TypeCounts>,
    /// The checker's verdict.
    pub checker: CheckerReport,
    /// Whether the workload's invariants held.
    pub invariant_ok: bool,
    /// What each invariant check found.
    pub invariant: Vec<String>,
    /// Location cache lookups.
    pub location_cache: CacheReport,
    /// Lookups sent to NICs.
    pub nic_lookups: NicLookupReport,
    /// Wall time of the run, setup and checks included (of every run, when a window was
    /// lengthened: see `window_extended_from_s`).
    pub wall_s: f64,
    /// On UCX: transports and waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ucx: Option<UcxReport>,
    /// On the simulator: the trace hash that a replay of the seed must reproduce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_hash: Option<String>,
    /// On the simulator: its profiles and speed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimReport>,
    /// Crashes the run injected, and recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crashes: Option<CrashesReport>,
    /// What `--design auto` tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub design_auto: Option<AutoReport>,
    /// Processes of a cluster that died during the run (`hytra cluster --kill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_nodes: Option<Vec<u16>>,
    /// With `lost_nodes`: whether every partition's copies were whole again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicated: Option<bool>,
    /// With `lost_nodes`: (partition, node) still copying at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub still_copying: Option<Vec<[u16; 2]>>,
}

impl ConfigReport {
    /// The configuration `cfg` with the runtime's knobs of `params`.
    fn of(cfg: &TxnConfig, params: &BenchParams) -> ConfigReport {
        ConfigReport {
            exec: cfg.exec.name().into(),
            lock: cfg.lock.name().into(),
            validate: cfg.validate.name().into(),
            log: cfg.log.name().into(),
            commit: cfg.commit.name().into(),
            passive_ack: cfg.passive_ack,
            outstanding: cfg.outstanding,
            inline: cfg.inline,
            doorbell_batching: params.rt.doorbell_batching,
            rpc_coalescing: params.rt.rpc_coalescing,
            warm_cache: params.warm_cache,
            cache_bytes: cfg.cache_bytes,
            retries_max: cfg.retries_max,
            log_ring_bytes: cfg.log_ring_bytes,
        }
    }
}

impl CheckerReport {
    /// The verdict of `checked`, if the run was checked.
    fn of(checked: Option<&hytra_check::Report>) -> CheckerReport {
        match checked {
            Some(c) => CheckerReport {
                checked: true,
                serializable: Some(c.serializable()),
                transactions: Some(c.txns),
                dependencies: Some(c.edges),
                violations: Some(c.violations.len()),
                first_violations: c
                    .violations
                    .iter()
                    .take(VIOLATIONS_SHOWN)
                    .map(|v| format!("{v:?}"))
                    .collect(),
            },
            None => CheckerReport {
                checked: false,
                serializable: None,
                transactions: None,
                dependencies: None,
                violations: None,
                first_violations: Vec::new(),
            },
        }
    }
}

/// How many violations a report spells out.
const VIOLATIONS_SHOWN: usize = 3;

impl BenchReport {
    /// The report of run `r` of `setup`, which took `wall` in all.
    pub fn new<R>(setup: &BenchSetup<'_>, r: &BenchResult<R>, wall: Duration) -> BenchReport {
        let (s, cfg, params) = (&r.stats, setup.cfg, setup.params);
        let q = |p: f64| s.latency.quantile(p) as f64 / 1e3;
        let n = s.commits.max(1) as f64;
        let ph = s.phase_ns.map(|v| v as f64 / n / 1e3);
        let per_type = setup
            .types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (commits, aborts) = s.per_type[i];
                (t.to_string(), TypeCounts { commits, aborts })
            })
            .collect();
        let checker = CheckerReport::of(r.checker.as_ref());
        let sim = setup.sim.map(|(profile, cpu_profile)| {
            let run_s = r.run.wall_ns as f64 / 1e9;
            SimReport {
                profile: profile.to_string(),
                cpu_profile: cpu_profile.to_string(),
                events: r.run.events,
                verbs: r.run.verbs,
                run_wall_s: run_s,
                events_per_wall_s: r.run.events as f64 / run_s,
                txn_per_wall_s: r.attempts_total as f64 / run_s,
            }
        });
        BenchReport {
            schema: BENCH_SCHEMA,
            command: "bench".into(),
            workload: setup.workload.into(),
            design: cfg.design.name().into(),
            backend: setup.backend.into(),
            nodes: setup.shape.nodes,
            workers: setup.shape.workers_per_node,
            coroutines: params.coroutines,
            replication: cfg.replication,
            seconds: setup.seconds,
            seed: setup.seed,
            config: ConfigReport::of(cfg, params),
            throughput_tps: s.commits as f64 / setup.seconds,
            abort_rate: s.abort_rate(),
            abort_rate_cc: s.cc_abort_rate(),
            abort_rate_by_class: AbortClass::ALL
                .iter()
                .map(|c| (c.key().to_string(), s.abort_rate_of(*c)))
                .collect(),
            committed: s.commits,
            gave_up: s.gave_up,
            stuck_lock_waits: s.stuck_lock_waits,
            aborts: AbortReason::ALL
                .iter()
                .map(|a| (a.name().to_string(), s.aborts[a.index_pub()]))
                .collect(),
            latency_us: Quantiles { p50: q(0.5), p90: q(0.9), p99: q(0.99) },
            phases_us: Phases {
                execution: ph[0],
                validation: ph[1],
                logging: ph[2],
                commit: ph[3],
            },
            per_type,
            checker,
            invariant_ok: r.invariant.ok,
            invariant: r.invariant.details.clone(),
            location_cache: CacheReport { hits: r.cache_hits, misses: r.cache_misses },
            nic_lookups: NicLookupReport {
                sent: s.nic_lookups,
                found: s.nic_found,
                fell_back: s.nic_fallbacks,
                slot_busy: s.nic_busy,
                timed_out: s.nic_timeouts,
            },
            wall_s: wall.as_secs_f64(),
            ucx: setup.ucx.map(|(transports, wait)| UcxReport {
                transports: transports.into(),
                wait: wait.into(),
                event_sleeps: r.run.event_sleeps,
                event_wakeups: r.run.event_wakeups,
            }),
            trace_hash: sim.as_ref().map(|_| format!("{:#018x}", r.run.trace_hash)),
            sim,
            crashes: None,
            design_auto: None,
            window_extended_from_s: None,
            lost_nodes: None,
            replicated: None,
            still_copying: None,
        }
    }

    /// Adds the crashes the run injected, with their recovery `times`.
    pub fn with_crashes<R>(mut self, times: &[(Crash, RecoveryTimes)], r: &BenchResult<R>) -> Self {
        let ms = |t: Option<u64>| t.map(|ns| ns as f64 / 1e6);
        let each = times
            .iter()
            .map(|(c, t)| CrashReport {
                node: c.node,
                at_s: c.at_ns as f64 / 1e9,
                detected_ms: ms(t.detected_ns),
                configured_ms: ms(t.configured_ns),
                active_ms: ms(t.active_ns),
                replicated_ms: ms(t.replicated_ns),
                recovered_ms: ms(t.recovered_ns),
                restart_s: c.restart_ns.map(|ns| ns as f64 / 1e9),
                rejoined_ms: ms(c.rejoined_ns(r)),
                recovered_share: RECOVERED_SHARE,
                survivors_tps_before: t.before_tps,
                survivors_tps_after: t.after_tps,
            })
            .collect();
        let steps = r
            .recovery
            .events
            .iter()
            .map(|(n, e)| StepReport {
                node: n.0,
                at_s: e.at_ns as f64 / 1e9,
                step: format!("{:?}", e.step),
            })
            .collect();
        self.crashes = Some(CrashesReport {
            each,
            steps,
            survivors_timeline: r.recovery.survivors_timeline.clone(),
            still_copying: copying(r)
                .map(|[partition, node]| CopyingReport { partition, node })
                .collect(),
        });
        self
    }

    /// Adds the nodes of a cluster of processes that died during the run: their part
    /// came from their journals.
    pub fn with_lost<R>(mut self, lost: Vec<u16>, r: &BenchResult<R>) -> Self {
        self.lost_nodes = Some(lost);
        self.replicated = Some(re_replicated(r));
        self.still_copying = Some(copying(r).collect());
        self
    }
}

/// Whether re-replication made every partition whole again after the last loss, as far
/// as this process saw (the manager, which reports, records it).
pub fn re_replicated<R>(r: &BenchResult<R>) -> bool {
    r.recovery.events.iter().any(|(_, e)| matches!(e.step, RecoveryStep::Replicated { .. }))
}

/// (partition, node) of every new backup still copying at the end of the run.
fn copying<R>(r: &BenchResult<R>) -> impl Iterator<Item = [u16; 2]> + '_ {
    r.recovery.still_copying.iter().map(|&(p, n)| [p, n.0])
}
