//! The recovery figure: the survivors' throughput over time around a crash, as FaRM
//! plots it, with the times from the crash to its detection, to the new configuration,
//! to every partition served again, to the survivors back at 80% of their rate, and to
//! every partition's copies whole again (re-replication).
//! DrTM+H leaves recovery to FaRM's protocol, so FaRM's figure is the one compared with.

use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, NodeFault, NodeFaultKind, NodeId};
use hytra_txn::{Design, TxnConfig};
use hytra_workloads::bench::{run, BenchParams, RecoveryTimes, RECOVERED_SHARE};
use hytra_workloads::smallbank::SmallBank;

use super::{Chart, Claim, Compare, Figure, Job, Plan, Res, Scale};

/// A SmallBank run on sim cx4 in which one node crashes.
#[derive(Clone, Debug)]
pub(super) struct FailureJob {
    pub(super) shape: ClusterShape,
    pub(super) coroutines: u16,
    /// The node that crashes.
    pub(super) node: u16,
    /// When it crashes, from the start of the run (virtual).
    pub(super) at_ns: u64,
    /// When the run ends (virtual).
    pub(super) end_ns: u64,
    pub(super) label: String,
}

/// Width of the timeline's intervals: `hytra bench --crash`'s, fine enough to see a
/// recovery of a few leases.
const INTERVAL_NS: u64 = crate::CRASH_TIMELINE_NS;

/// Runs one failure job: the survivors' timeline (ms from the crash, M txn/s) and the
/// recovery times, checked by the workload's invariants on the survivors.
pub(super) fn run_failure_job(
    j: &FailureJob,
    s: &Scale,
    seed: u64,
) -> Result<Res, super::JobError> {
    let profile =
        NicProfile::by_name("cx4").ok_or_else(|| super::JobError::from_text("profile"))?;
    let cpu_profile = s.cpu.table("smallbank", &hytra_workloads::smallbank::TYPES);
    let mut config = SimConfig { profile, cpu_profile, ..SimConfig::new(j.shape, seed) };
    config.faults.node_faults.push(NodeFault {
        node: NodeId(j.node),
        at_ns: j.at_ns,
        kind: NodeFaultKind::Crash,
    });
    let mut b = SimCluster::new(config)?;
    let params = BenchParams {
        timeline_ns: INTERVAL_NS,
        ..super::bench_params(s, j.coroutines, j.end_ns - s.warmup_ns, seed)
    };
    let cfg = TxnConfig::preset(Design::DrtmH);
    let r = run(&mut b, &SmallBank { accounts_per_worker: s.accounts }, cfg, params)?;
    let times = r.recovery.times(j.at_ns, INTERVAL_NS, s.warmup_ns, j.end_ns);
    let first = s.warmup_ns.div_ceil(INTERVAL_NS) as usize;
    let last = (j.end_ns / INTERVAL_NS) as usize;
    let timeline = (first..last)
        .map(|i| {
            let commits = r.recovery.survivors_timeline.get(i).copied().unwrap_or(0);
            let from_crash_ns = (i as u64 * INTERVAL_NS) as f64 - j.at_ns as f64;
            (from_crash_ns / 1e6, commits as f64 / (INTERVAL_NS as f64 / 1e9) / 1e6)
        })
        .collect();
    let mut res = super::summarize(r, j.end_ns - s.warmup_ns);
    if times.active_ns.is_none() && res.error.is_none() {
        res.error = Some(format!(
            "the cluster did not recover from the crash within the run's {:.1} ms",
            (j.end_ns - j.at_ns) as f64 / 1e6
        ));
    }
    res.timeline = timeline;
    res.recovery = Some(times);
    Ok(res)
}

/// Describes a job for progress and failure messages.
pub(super) fn describe(j: &FailureJob) -> String {
    format!(
        "SmallBank {} on cx4 {}x{}, node {} crashing at {:.1} ms",
        j.label,
        j.shape.nodes,
        j.shape.workers_per_node,
        j.node,
        j.at_ns as f64 / 1e6
    )
}

/// The recovery times of a job, for the figure's table.
pub(super) fn times_text(t: Option<&RecoveryTimes>) -> String {
    let ms = |t: Option<u64>| t.map_or_else(|| "-".into(), |ns| format!("{:.2}", ns as f64 / 1e6));
    match t {
        Some(t) => format!(
            "ms after the crash: detected {}, configured {}, active {}, back to {:.0}% {}, copies whole again {}",
            ms(t.detected_ns),
            ms(t.configured_ns),
            ms(t.active_ns),
            RECOVERED_SHARE * 100.0,
            ms(t.recovered_ns),
            ms(t.replicated_ns)
        ),
        None => "no recovery measured".into(),
    }
}

/// Milliseconds from the crash until the survivors were back at 80% (infinite if never).
fn recovered_ms(r: &Res) -> f64 {
    r.recovery.and_then(|t| t.recovered_ns).map_or(f64::INFINITY, |ns| ns as f64 / 1e6)
}

pub(super) fn recovery_figure(plan: &mut Plan, s: &Scale, quick: bool) {
    let shape = ClusterShape { nodes: s.nodes, workers_per_node: s.workers, lanes_per_peer: 1 };
    // The simulator's lease is 5 ms: a crash is detected after about a lease, and the
    // window runs on for a few more to show the rate after recovery.
    let (at_ns, end_ns) = if quick { (5_000_000, 20_000_000) } else { (10_000_000, 30_000_000) };
    let mut series = Vec::new();
    for (node, who) in [(1u16, "a member"), (0, "the configuration manager")] {
        let label = format!("crash of {who} (node {node})");
        let j = plan.push(Job::Failure(FailureJob {
            shape,
            coroutines: s.max_co(),
            node,
            at_ns,
            end_ns,
            label: label.clone(),
        }));
        series.push((label, j));
        plan.claims.push(Claim {
            figure: "recovery",
            what: format!(
                "ms from the crash of {who} to the survivors at 80% of their rate (FaRM: all back under 50 ms)"
            ),
            paper: 50.0,
            ours: Box::new(move |r: &[Res]| recovered_ms(&r[j])),
            compare: Compare::AtMost,
            cause: None,
        });
    }
    plan.figures.push(Figure {
        id: "recovery",
        title: "Recovery: the survivors' throughput around a crash".into(),
        paper: "DrTM+H leaves recovery to FaRM's protocol. FaRM (SOSP'15) recovers from a failure in under 50 ms, with leases of 10 ms; hytra's simulated lease is 5 ms.".into(),
        charts: vec![Chart::Timeline {
            title: format!(
                "SmallBank, DrTM+H, {}x{} on cx4, {} coroutines",
                s.nodes,
                s.workers,
                s.max_co()
            ),
            x_label: "ms from the crash".into(),
            y_label: "survivors' M txn/s".into(),
            series,
        }],
    });
}
