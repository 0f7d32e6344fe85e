//! The design space: which of the four designs wins as the CPU's costs and the NIC
//! change, per workload. No paper draws this map; it answers "is the hybrid design
//! better on my hardware?" for the CPU and NIC a user has, and marks the paper's point
//! (its CPU, the profile `paper` at 1x, on cx4).

use hytra_fabric::ClusterShape;
use hytra_txn::{Design, TxnConfig};

use super::{BenchJob, Chart, Figure, Job, Plan, Scale, Wl};

/// Multipliers of the CPU profile's costs: a CPU four times faster to four times slower.
const SCALES: [f64; 5] = [0.25, 0.5, 1.0, 2.0, 4.0];
const SCALES_QUICK: [f64; 3] = [0.25, 1.0, 4.0];
/// The NIC profiles, slowest first.
const NICS: [&str; 4] = ["cx3", "roce", "cx4", "cx5"];
const NICS_QUICK: [&str; 2] = ["cx3", "cx4"];

/// Commits each design of a cell must reach for the cell to name a winner: with fewer,
/// one abort more or less decides it.
const COMMITS_MIN: f64 = 100.0;

/// Adds the map: for each workload, the four designs at every CPU scale and NIC.
pub(super) fn design_map_figure(plan: &mut Plan, s: &Scale, quick: bool) {
    let scales: &[f64] = if quick { &SCALES_QUICK } else { &SCALES };
    let nics: &[&'static str] = if quick { &NICS_QUICK } else { &NICS };
    let shape = ClusterShape { nodes: s.nodes, workers_per_node: s.workers, lanes_per_peer: 1 };
    let mut charts = Vec::new();
    for wl in [Wl::SmallBank, Wl::TpccNo] {
        let cells = scales
            .iter()
            .map(|&cpu_scale| {
                nics.iter()
                    .map(|&profile| {
                        Design::ALL
                            .iter()
                            .map(|&d| {
                                plan.push(Job::Bench(BenchJob {
                                    wl,
                                    profile,
                                    shape,
                                    coroutines: s.max_co(),
                                    cfg: TxnConfig::preset(d),
                                    label: format!("{} x{cpu_scale} {profile}", d.name()),
                                    cpu_scale,
                                }))
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        charts.push(Chart::Winners {
            title: format!(
                "{}: the fastest design, {}x{}, {} coroutines",
                wl.name(),
                s.nodes,
                s.workers,
                s.max_co()
            ),
            rows: scales.iter().map(|x| format!("CPU x{x}")).collect(),
            cols: nics.iter().map(|n| (*n).to_string()).collect(),
            contenders: Design::ALL.iter().map(|d| d.name().to_string()).collect(),
            cells,
            mark: scales.iter().position(|&x| x == 1.0).zip(nics.iter().position(|&n| n == "cx4")),
            commits_min: COMMITS_MIN,
        });
    }
    plan.figures.push(Figure {
        id: "design-map",
        title: "The design space: the fastest design by CPU cost and NIC".into(),
        paper: format!(
            "Not in the paper: every design at every cell, the CPU profile '{}' scaled from 0.25x (a CPU four times faster) to 4x, on each NIC profile. A cell names the winner and its margin over the runner-up (blank where a design committed fewer than {COMMITS_MIN} transactions, too few to rank; a dearer CPU's window is longer by its factor); the outlined cell is the paper's setting.",
            s.cpu.name
        ),
        charts,
    });
}
