//! `hytra offload`'s experiment, RedN's: which scenarios compare NIC-offloaded gets with
//! one-sided and two-sided ones (latency by value size, a key in the second bucket,
//! isolation from writers, throughput, a paused server, list traversal), and the typed
//! report. Not for: running one scenario (`hytra_offload::bench`) or printing.

use hytra_offload::bench::{IfRate, Outcome, Path, Scenario};
use hytra_offload::service::Search;
use serde::Serialize;

/// What `hytra offload` measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadPlan {
    /// Value sizes of the latency sweep.
    pub sizes: Vec<u32>,
    /// Background writer counts of the isolation runs.
    pub writers: Vec<u16>,
    /// Nodes per list of the list-traversal runs.
    pub list_len: u32,
    /// Key ranges of the list-traversal runs.
    pub list_ranges: Vec<u32>,
    /// Virtual time per scenario.
    pub duration_ns: u64,
    /// Seed of every scenario.
    pub seed: u64,
}

/// Every scenario of `plan`, labelled, in the order run.
pub fn scenarios(plan: &OffloadPlan) -> Vec<(String, Scenario)> {
    let (dur, seed) = (plan.duration_ns, plan.seed);
    let offload = Path::Offload(Search::Sequential);
    let mut runs = Vec::new();
    let mut add = |what: &str, mut s: Scenario| {
        (s.duration_ns, s.seed) = (dur, seed);
        runs.push((what.to_string(), s));
    };
    for &size in &plan.sizes {
        for path in [offload, Path::OneSided, Path::TwoSided, Path::Read] {
            add("latency", Scenario::latency(path, size));
        }
    }
    for path in [offload, Path::Offload(Search::Parallel), Path::OneSided, Path::TwoSided] {
        add("second-bucket", Scenario { second_bucket: true, ..Scenario::latency(path, 64) });
    }
    for &writers in &plan.writers {
        for path in [offload, Path::TwoSided] {
            let s = Scenario { writers, ..Scenario::latency(path, 64) };
            add(&format!("isolation w={writers}"), s);
        }
    }
    for path in [offload, Path::TwoSided] {
        for size in [1024, 65536] {
            add("throughput", Scenario { clients: 4, depth: 4, ..Scenario::latency(path, size) });
        }
    }
    for path in [offload, Path::TwoSided] {
        let s = Scenario { pause_server_at_ns: Some(dur / 2), ..Scenario::latency(path, 64) };
        add("resilience", s);
    }
    for &range in &plan.list_ranges {
        for path in [offload, Path::OffloadBreak, Path::OneSided, Path::TwoSided] {
            add("list", Scenario::list_latency(path, plan.list_len, range));
        }
    }
    runs
}

/// The version of [`OffloadReport`]'s layout; it changes when a field changes meaning or
/// goes away (new fields keep it).
pub const OFFLOAD_SCHEMA: u32 = 1;

/// One scenario, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct OffloadRun {
    /// Its label.
    pub scenario: String,
    /// How gets travel.
    pub path: String,
    /// Its settings.
    pub params: Scenario,
    /// What it measured.
    pub outcome: Outcome,
}

/// Everything `hytra offload` measured (its `--json`).
#[derive(Clone, Debug, Serialize)]
pub struct OffloadReport {
    /// [`OFFLOAD_SCHEMA`].
    pub schema: u32,
    /// The NIC profile (always `cx5`, the NIC RedN ran on).
    pub profile: String,
    /// Every scenario, in the order run.
    pub runs: Vec<OffloadRun>,
    /// The `if`-construct rate at each chain count.
    pub if_rate: Vec<IfRate>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_takes_the_plans_window_and_seed() {
        let plan = OffloadPlan {
            sizes: vec![64, 1024],
            writers: vec![0, 4],
            list_len: 8,
            list_ranges: vec![1, 8],
            duration_ns: 123_000,
            seed: 9,
        };
        let runs = scenarios(&plan);
        // 2 sizes x 4 paths, 4 second-bucket, 2 writer counts x 2, 2 x 2 throughput,
        // 2 resilience, 2 ranges x 4.
        assert_eq!(runs.len(), 8 + 4 + 4 + 4 + 2 + 8);
        assert!(runs.iter().all(|(_, s)| s.duration_ns == 123_000 && s.seed == 9));
        let isolation: Vec<(&str, u16)> = runs
            .iter()
            .filter(|(w, _)| w.starts_with("isolation"))
            .map(|(w, s)| (w.as_str(), s.writers))
            .collect();
        assert_eq!(
            isolation,
            [
                ("isolation w=0", 0),
                ("isolation w=0", 0),
                ("isolation w=4", 4),
                ("isolation w=4", 4)
            ]
        );
        let paused: Vec<_> = runs.iter().filter(|(w, _)| w == "resilience").collect();
        assert!(paused.iter().all(|(_, s)| s.pause_server_at_ns == Some(61_500)));
    }
}
