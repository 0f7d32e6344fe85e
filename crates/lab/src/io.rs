//! `hytra io`'s experiment, the remote-I/O paper's: a matrix of random-read points
//! (local, fabric-only and remote reads; each engine, read size, connection count, depth
//! and pool size) and trace replays, each on a backend by name over a window long enough
//! for it; the ratios the paper discusses; the typed report. Not for: the files read
//! (see `io_files.rs`) or printing.

use std::collections::BTreeMap;
use std::sync::Arc;

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{Backend, BackendError, ClusterShape};
use hytra_io::bench::{self, BenchError, IoParams, IoReport, Mode, Target};
use hytra_io::trace::TraceOp;
use hytra_io::{DeviceModel, EngineKind, Timing};
use serde::{Deserialize, Serialize};

use crate::backend::Placement;

/// Where `hytra io` reads: two nodes, node 0 requesting and node 1 owning the file.
#[derive(Clone, Debug)]
pub enum IoBackend {
    /// The simulator, with a modelled device (virtual time).
    Sim {
        /// The NIC.
        profile: Box<NicProfile>,
        /// The storage device.
        device: DeviceModel,
    },
    /// Threads of this process, reading this machine's storage.
    Local,
    /// UCX; only usable in a build with the `ucx` feature.
    Ucx {
        /// UCX transports (`UCX_TLS` syntax).
        transports: String,
        /// This process's node, for a run spread over two processes; `None`: both here.
        placement: Option<Placement>,
    },
}

/// An engine that performs the owner's reads, as `--engines` names it.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum IoEngine {
    /// A static pool of I/O threads.
    Pool,
    /// A new thread for every read.
    Thread,
    /// io_uring.
    Uring,
}

impl IoEngine {
    /// Every engine, in the order `--engines` lists them.
    pub const ALL: [IoEngine; 3] = [IoEngine::Pool, IoEngine::Thread, IoEngine::Uring];

    /// The name `--engines` takes.
    pub fn name(self) -> &'static str {
        match self {
            IoEngine::Pool => "pool",
            IoEngine::Thread => "thread",
            IoEngine::Uring => "uring",
        }
    }

    /// The engine named `name`.
    pub fn parse(name: &str) -> Option<IoEngine> {
        IoEngine::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// A checked `hytra io` matrix.
#[derive(Clone, Debug)]
pub struct IoPlan {
    /// Where it runs.
    pub backend: IoBackend,
    /// What is measured.
    pub modes: Vec<Mode>,
    /// The engines of local and remote reads (local reads take no thread per request).
    pub engines: Vec<IoEngine>,
    /// Bytes per read.
    pub sizes: Vec<u32>,
    /// Connections (workers per node).
    pub connections: Vec<u16>,
    /// Reads in flight per connection.
    pub depths: Vec<u16>,
    /// I/O threads of the pool engine.
    pub io_threads: Vec<u16>,
    /// io_uring slots per worker.
    pub uring_depth: u32,
    /// Measured time per point (virtual on sim).
    pub duration_ns: u64,
    /// Time before measuring, per point.
    pub warmup_ns: u64,
    /// Seed of offsets.
    pub seed: u64,
    /// Reads up to this size come back inside the completion message.
    pub inline_max: u32,
    /// The longest a point's window may be lengthened to (a window shorter than its
    /// reads' latency would report a wrong rate).
    pub window_max_ns: u64,
}

/// How long a read waits for its answer.
const READ_TIMEOUT_NS: u64 = 5_000_000_000;

impl IoPlan {
    /// Whether this process measures: everywhere but on the owner of a run spread over
    /// processes, which only serves.
    pub fn reports(&self) -> bool {
        match &self.backend {
            IoBackend::Ucx { placement: Some(p), .. } => p.me == 0,
            _ => true,
        }
    }

    /// Whether the nodes are spread over processes (which join once, for one point).
    pub fn spread(&self) -> bool {
        matches!(self.backend, IoBackend::Ucx { placement: Some(_), .. })
    }

    /// One point's settings.
    pub fn params(
        &self,
        mode: Mode,
        engine: EngineKind,
        size: u32,
        connections: u16,
        depth: u16,
    ) -> IoParams {
        IoParams {
            mode,
            engine,
            size,
            connections,
            depth,
            duration_ns: self.duration_ns,
            warmup_ns: self.warmup_ns,
            seed: self.seed,
            inline_max: self.inline_max,
            timeout_ns: READ_TIMEOUT_NS,
        }
    }

    /// Every random-read point of the matrix, in the order measured: by size, then
    /// connections, depth, mode, engine and pool size.
    pub fn points(&self) -> Vec<IoParams> {
        let mut out = Vec::new();
        for &size in &self.sizes {
            for &connections in &self.connections {
                for &depth in &self.depths {
                    for &mode in &self.modes {
                        for engine in self.kinds(mode) {
                            out.push(self.params(mode, engine, size, connections, depth));
                        }
                    }
                }
            }
        }
        out
    }

    /// The engines a mode runs with: none for fabric-only reads, no thread per request
    /// for local ones, and a pool of each size.
    fn kinds(&self, mode: Mode) -> Vec<EngineKind> {
        if mode == Mode::Fabric {
            return vec![EngineKind::NoIo];
        }
        let mut out = Vec::new();
        for &e in &self.engines {
            match e {
                IoEngine::Thread if mode == Mode::Local => {}
                IoEngine::Thread => out.push(EngineKind::ThreadPerRequest),
                IoEngine::Uring => out.push(EngineKind::Uring { depth: self.uring_depth }),
                IoEngine::Pool => {
                    out.extend(self.io_threads.iter().map(|&threads| EngineKind::Pool { threads }))
                }
            }
        }
        out
    }

    /// The replays of a trace: local and remote, with a pool of the first size, the first
    /// connection count and depth.
    pub fn replays(&self) -> [IoParams; 2] {
        let pool = EngineKind::Pool { threads: self.io_threads[0] };
        let (c, d) = (self.connections[0], self.depths[0]);
        [Mode::Local, Mode::Remote].map(|m| self.params(m, pool, 0, c, d))
    }

    fn timing(&self) -> Timing {
        match &self.backend {
            IoBackend::Sim { device, .. } => {
                Timing::Modelled { device: *device, costs: Default::default() }
            }
            _ => Timing::Real,
        }
    }
}

/// Measures one point `p` of `plan` reading `target`: a replay of `trace` if given, else
/// random reads over a window lengthened until it holds enough reads (a run spread over
/// processes joins once, so there the window is refused rather than lengthened).
pub fn measure(
    plan: &IoPlan,
    target: &Target,
    p: &IoParams,
    trace: Option<Arc<Vec<TraceOp>>>,
) -> Result<IoReport, BenchError> {
    let shape = ClusterShape { nodes: 2, workers_per_node: p.connections, lanes_per_peer: 1 };
    let max = if plan.spread() { p.duration_ns } else { plan.window_max_ns };
    let judge = plan.reports();
    let t = plan.timing();
    match &plan.backend {
        IoBackend::Sim { profile, .. } => {
            let cfg = SimConfig {
                profile: NicProfile::clone(profile),
                ..SimConfig::new(shape, plan.seed)
            };
            let fresh = || SimCluster::new(cfg.clone());
            point(fresh, target, p, t, trace, judge, max)
        }
        IoBackend::Local => {
            let fresh = || LocalCluster::new(LocalConfig::new(shape));
            point(fresh, target, p, t, trace, judge, max)
        }
        IoBackend::Ucx { transports, placement } => {
            measure_ucx(shape, transports, placement.as_ref(), target, p, t, trace, judge, max)
        }
    }
}

#[cfg(feature = "ucx")]
#[allow(clippy::too_many_arguments, reason = "measure's arguments, passed through")]
fn measure_ucx(
    shape: ClusterShape,
    transports: &str,
    placement: Option<&Placement>,
    target: &Target,
    p: &IoParams,
    t: Timing,
    trace: Option<Arc<Vec<TraceOp>>>,
    judge: bool,
    max: u64,
) -> Result<IoReport, BenchError> {
    use hytra_fabric::ucx::{UcxCluster, UcxConfig};
    let mut cfg = UcxConfig::new(shape);
    cfg.transports = Some(transports.to_string());
    let fresh = || match placement {
        None => UcxCluster::new(cfg.clone()),
        Some(pl) => {
            let mut cfg = cfg.clone();
            cfg.hosted = Some(vec![hytra_fabric::NodeId(pl.me)]);
            let ex = pl
                .exchange(shape.nodes)
                .map_err(|e| BackendError::Cluster(format!("joining the other process: {e}")))?;
            UcxCluster::with_exchange(cfg, ex)
        }
    };
    point(fresh, target, p, t, trace, judge, max)
}

#[cfg(not(feature = "ucx"))]
#[allow(clippy::too_many_arguments, reason = "measure's arguments, passed through")]
fn measure_ucx(
    _: ClusterShape,
    _: &str,
    _: Option<&Placement>,
    _: &Target,
    _: &IoParams,
    _: Timing,
    _: Option<Arc<Vec<TraceOp>>>,
    _: bool,
    _: u64,
) -> Result<IoReport, BenchError> {
    Err(BenchError::Backend(BackendError::Config(
        "the ucx backend is not in this build: install libucx-dev and build with --features ucx"
            .into(),
    )))
}

/// A replay, a point whose window this process does not judge (the owner of a run
/// spread over processes), or a point over a settled window.
fn point<B: Backend>(
    mut fresh: impl FnMut() -> Result<B, BackendError>,
    target: &Target,
    p: &IoParams,
    t: Timing,
    trace: Option<Arc<Vec<TraceOp>>>,
    judge: bool,
    window_max_ns: u64,
) -> Result<IoReport, BenchError> {
    match trace {
        Some(tr) => bench::replay(&mut fresh()?, target, p, t, tr),
        None if !judge => bench::run(&mut fresh()?, target, p, t),
        None => bench::run_settled(fresh, target, p, t, window_max_ns),
    }
}

/// The ratios the paper discusses, by name: remote over local reads at each size (the
/// best engine of each), a static pool over a thread per request, and remote over
/// fabric-only reads.
pub fn summarise(reports: &[IoReport]) -> Vec<(String, f64)> {
    let best = |mode: Mode, size: u32, engines: &[&str]| {
        reports
            .iter()
            .filter(|r| r.mode == mode && r.size == size && engines.contains(&r.engine.as_str()))
            .map(|r| r.iops)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    let mut sizes: Vec<u32> = reports.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = Vec::new();
    for s in sizes {
        if let (Some(r), Some(l)) =
            (best(Mode::Remote, s, &["pool", "uring"]), best(Mode::Local, s, &["pool", "uring"]))
        {
            out.push((format!("remote/local at {s} B (best of pool, uring)"), r / l));
        }
        if let (Some(p), Some(t)) =
            (best(Mode::Remote, s, &["pool"]), best(Mode::Remote, s, &["thread"]))
        {
            out.push((format!("static pool / thread per request at {s} B"), p / t));
        }
        if let (Some(r), Some(f)) =
            (best(Mode::Remote, s, &["pool", "uring"]), best(Mode::Fabric, s, &["none"]))
        {
            out.push((format!("remote/fabric-only at {s} B"), r / f));
        }
    }
    out
}

/// The file a run read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileReport {
    /// Its path.
    pub path: String,
    /// Its length.
    pub bytes: u64,
    /// Whether it was read with `O_DIRECT` (else through the page cache).
    pub direct: bool,
}

/// The trace a run replayed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceReport {
    /// The trace file, or the generator.
    pub source: String,
    /// Reads in it (0: no replay).
    pub reads: usize,
}

/// The version of [`IoRunReport`]'s layout; it changes when a field changes meaning or
/// goes away (new fields keep it).
pub const IO_SCHEMA: u32 = 1;

/// Everything one `hytra io` run measured (its `--json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IoRunReport {
    /// [`IO_SCHEMA`].
    pub schema: u32,
    /// The backend, as `--backend` names it.
    pub backend: String,
    /// Processes the nodes ran in: one per node (`hytra node`, `hytra cluster`), or 1.
    pub processes: u16,
    /// The file read.
    pub file: FileReport,
    /// The modelled device (on sim).
    pub device: Option<DeviceModel>,
    /// Every random-read point, in the order measured.
    pub runs: Vec<IoReport>,
    /// [`summarise`]'s ratios.
    pub ratios: BTreeMap<String, f64>,
    /// The replays (local, remote), if any.
    pub replay: Vec<IoReport>,
    /// The trace replayed.
    pub trace: TraceReport,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(modes: Vec<Mode>, engines: Vec<IoEngine>, io_threads: Vec<u16>) -> IoPlan {
        IoPlan {
            backend: IoBackend::Local,
            modes,
            engines,
            sizes: vec![512, 16384],
            connections: vec![1],
            depths: vec![32],
            io_threads,
            uring_depth: 64,
            duration_ns: 1_000_000,
            warmup_ns: 200_000,
            seed: 1,
            inline_max: 0,
            window_max_ns: 10_000_000,
        }
    }

    #[test]
    fn points_give_each_mode_its_engines_in_order() {
        let all = vec![Mode::Local, Mode::Fabric, Mode::Remote];
        let p = plan(all, IoEngine::ALL.to_vec(), vec![4, 8]);
        let points = p.points();
        // Per size: local (pool 4, pool 8, uring), fabric (none), remote (pool 4, pool 8,
        // thread, uring).
        assert_eq!(points.len(), 2 * (3 + 1 + 4));
        let first: Vec<(Mode, EngineKind)> =
            points[..8].iter().map(|p| (p.mode, p.engine)).collect();
        assert_eq!(
            first,
            vec![
                (Mode::Local, EngineKind::Pool { threads: 4 }),
                (Mode::Local, EngineKind::Pool { threads: 8 }),
                (Mode::Local, EngineKind::Uring { depth: 64 }),
                (Mode::Fabric, EngineKind::NoIo),
                (Mode::Remote, EngineKind::Pool { threads: 4 }),
                (Mode::Remote, EngineKind::Pool { threads: 8 }),
                (Mode::Remote, EngineKind::ThreadPerRequest),
                (Mode::Remote, EngineKind::Uring { depth: 64 }),
            ]
        );
        assert!(points[..8].iter().all(|q| q.size == 512 && q.warmup_ns == 200_000));
        assert!(points[8..].iter().all(|q| q.size == 16384));
    }

    #[test]
    fn local_reads_take_no_thread_per_request() {
        let p = plan(vec![Mode::Local], vec![IoEngine::Thread], vec![8]);
        assert!(p.points().is_empty());
        let [local, remote] = p.replays();
        assert_eq!((local.mode, remote.mode), (Mode::Local, Mode::Remote));
        assert_eq!(local.engine, EngineKind::Pool { threads: 8 });
    }

    #[test]
    fn engines_parse_their_names() {
        for e in IoEngine::ALL {
            assert_eq!(IoEngine::parse(e.name()), Some(e));
        }
        assert_eq!(IoEngine::parse("spdk"), None);
    }

    #[test]
    fn ratios_pair_the_best_engine_of_each_mode() {
        let r = |mode, engine: &str, iops| IoReport {
            mode,
            engine: engine.into(),
            io_threads: None,
            size: 512,
            connections: 1,
            depth: 32,
            reads: 1000,
            seconds: 0.1,
            extended_from_s: None,
            iops,
            mib_per_s: 0.0,
            p50_us: 1.0,
            p99_us: 2.0,
            errors: 0,
            direct: true,
            client: Default::default(),
            service: Default::default(),
        };
        let reports = [
            r(Mode::Local, "pool", 100.0),
            r(Mode::Local, "uring", 200.0),
            r(Mode::Remote, "pool", 150.0),
            r(Mode::Remote, "thread", 50.0),
            r(Mode::Fabric, "none", 300.0),
        ];
        let ratios: BTreeMap<String, f64> = summarise(&reports).into_iter().collect();
        assert_eq!(ratios["remote/local at 512 B (best of pool, uring)"], 0.75);
        assert_eq!(ratios["static pool / thread per request at 512 B"], 3.0);
        assert_eq!(ratios["remote/fabric-only at 512 B"], 0.5);
    }
}
