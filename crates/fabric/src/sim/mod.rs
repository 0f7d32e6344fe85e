//! `sim`: the whole cluster in one OS thread, in virtual time.
//!
//! Every worker of every node runs the real program; the network and NICs are the model
//! of a [`NicProfile`]. Same seed and configuration give the same event trace, bit for
//! bit, which [`SimRun::trace_hash`] summarises and [`replay_check`] verifies.
//!
//! - `profile.rs`: NIC profiles and where each number comes from
//! - `faults.rs`: seeded fault injection (datagram loss/duplication/reordering/delay,
//!   node pause and crash, partitions)
//! - `core.rs`: event queue, worker clocks and queues, node faults
//! - `nic.rs`: the NIC model: resources a request books, memory effects, completions
//! - `timeline.rs`: capacity of NIC engines and links over time
//! - `qp_cache.rs`: the NIC's queue-pair context cache
//! - `endpoint.rs`: the [`Endpoint`](crate::Endpoint) of a simulated worker
//! - `trace.rs`: the trace hash

mod calendar;
mod core;
mod endpoint;
pub mod faults;
mod measure;
mod nic;
pub mod profile;
mod qp_cache;
mod timeline;
mod trace;
mod wq;

use std::cell::RefCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::time::Instant;

pub use self::core::SimStats;
use self::core::{Core, Event, Struck};
pub use self::endpoint::SimEndpoint;
use self::faults::FaultConfig;
use self::measure::{MeasuredCpu, ProgramCpu};
use self::profile::NicProfile;
use crate::constants::{DATAGRAM_MTU, INLINE_MAX, SQ_DEPTH};
use crate::cpu::{CpuSamples, CpuTable};
use crate::endpoint::{
    Backend, BackendError, Caps, Program, RegionSpec, RunLimits, RunStats, Step,
};
use crate::exec::check_region;
use crate::ids::{ClusterShape, NodeId, Rkey};
use crate::memory::Region;
use crate::wq::{WqCounters, WqId, WqSpec};

/// How a worker's CPU time is charged to its virtual clock.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum CpuMode {
    /// From the deterministic cost model: what the program charges, costed by
    /// [`SimConfig::cpu_profile`]. Replays bit for bit.
    Model,
    /// From the time each step's own code really took (the simulator's excluded), times
    /// `scale` (e.g. the ratio of the modelled machine's speed to this one's); the steps
    /// are recorded by the terms they charged ([`SimCluster::cpu_samples`]). Not
    /// deterministic.
    Measured {
        /// Multiplier applied to measured time.
        scale: f64,
    },
}

/// Everything that determines a simulation.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Cluster size.
    pub shape: ClusterShape,
    /// NIC and host model.
    pub profile: NicProfile,
    /// Faults to inject.
    pub faults: FaultConfig,
    /// Seed of every random choice the simulator makes.
    pub seed: u64,
    /// How CPU time is charged.
    pub cpu: CpuMode,
    /// What each term of the programs' CPU work costs under [`CpuMode::Model`]; the NIC's
    /// host costs come from [`SimConfig::profile`] in either mode.
    pub cpu_profile: CpuTable,
    /// Whether a node can fence others off.
    pub fencing: Fencing,
}

/// Whether the simulated fabric can fence a node off ([`crate::Endpoint::fence`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// Each NIC refuses what comes from the nodes it fenced off, as closing their
    /// connections does.
    Nic,
    /// Nothing can be fenced off, as with shared memory that another process maps: only
    /// a removed node's own lease stops it. For testing the leases alone.
    Unavailable,
}

impl SimConfig {
    /// A fault-free cx4 cluster of the given shape.
    pub fn new(shape: ClusterShape, seed: u64) -> SimConfig {
        SimConfig {
            shape,
            profile: NicProfile::cx4(),
            faults: FaultConfig::none(),
            seed,
            cpu: CpuMode::Model,
            cpu_profile: CpuTable::assumed(),
            fencing: Fencing::Nic,
        }
    }

    /// One line naming everything that determines the run, printed before it starts so
    /// that any run can be replayed.
    pub fn describe(&self) -> String {
        format!(
            "sim: seed={} nodes={} workers/node={} lanes={} profile={} cpu={:?} cpu-profile={}{}; faults: {}",
            self.seed,
            self.shape.nodes,
            self.shape.workers_per_node,
            self.shape.lanes_per_peer,
            self.profile.name,
            self.cpu,
            match self.cpu {
                CpuMode::Model => self.cpu_profile.name(),
                CpuMode::Measured { .. } => "measured",
            },
            match self.fencing {
                Fencing::Nic => "",
                Fencing::Unavailable => " fencing=unavailable",
            },
            self.faults
        )
    }
}

/// Events taken from the queue between two calls of a progress callback (lines run in
/// line, `Core::run_next_in_line`, do not count: the calls only show progress).
const PROGRESS_EVERY_EVENTS: u64 = 1 << 16;

/// After every worker is done, the simulation goes on for at most this long (virtual
/// time) so that requests still in flight reach their targets (fire-and-forget WRITEs of
/// passive ACK, unlocks, datagrams that done workers still handle), as they would on
/// real NICs. The run's elapsed time is taken when the last worker finished.
const DRAIN_PS: u64 = 1_000_000_000;

/// A simulated cluster: register regions, then [`Backend::run`] programs on it.
pub struct SimCluster {
    config: SimConfig,
    core: Rc<RefCell<Core>>,
    ran: bool,
    progress: Option<Box<dyn FnMut(u64)>>,
}

/// Results of the last run beyond [`RunStats`].
#[derive(Clone, Debug)]
pub struct SimRun {
    /// Digest of the event trace.
    pub trace_hash: u64,
    /// Counters.
    pub stats: SimStats,
}

impl SimCluster {
    /// A cluster with no regions yet.
    pub fn new(config: SimConfig) -> Result<SimCluster, BackendError> {
        crate::validate_shape(config.shape)?;
        config.profile.validate().map_err(BackendError::Config)?;
        config.faults.validate(config.shape.nodes).map_err(BackendError::Config)?;
        if let CpuMode::Measured { scale } = config.cpu {
            if !(scale.is_finite() && scale > 0.0) {
                return Err(BackendError::Config(format!("CPU scale {scale} must be positive")));
            }
        }
        let program_cpu = match config.cpu {
            CpuMode::Model => ProgramCpu::Model(config.cpu_profile.clone()),
            CpuMode::Measured { .. } => ProgramCpu::Measured(Box::new(MeasuredCpu::new())),
        };
        let core = Core::new(
            config.shape,
            &config.profile,
            config.faults.clone(),
            config.seed,
            program_cpu,
        );
        Ok(SimCluster { config, core: Rc::new(RefCell::new(core)), ran: false, progress: None })
    }

    /// Calls `f` with the virtual time (ns) every few tens of thousands of events while
    /// the cluster runs (for progress bars; it must not touch the simulation).
    pub fn set_progress(&mut self, f: Box<dyn FnMut(u64)>) {
        self.progress = Some(f);
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// The steps measured so far, by the terms they charged; `None` unless the cluster
    /// runs in [`CpuMode::Measured`].
    pub fn cpu_samples(&self) -> Option<CpuSamples> {
        match &self.core.borrow().program_cpu {
            ProgramCpu::Model(_) => None,
            ProgramCpu::Measured(m) => Some(m.samples.clone()),
        }
    }

    /// Keeps only the measured steps that start at or after `ns` of virtual time (those
    /// before, a warm-up, are still charged). No effect unless steps are measured.
    pub fn keep_cpu_samples_from(&mut self, ns: u64) {
        if let ProgramCpu::Measured(m) = &mut self.core.borrow_mut().program_cpu {
            m.from_ps = ns.saturating_mul(1000);
        }
    }

    /// Trace hash and counters so far.
    pub fn sim_run(&self) -> SimRun {
        let core = self.core.borrow();
        SimRun { trace_hash: core.trace_hash(), stats: core.stats.clone() }
    }

    fn caps(&self) -> Caps {
        Caps {
            mtu: DATAGRAM_MTU,
            inline_max: INLINE_MAX,
            sq_depth: SQ_DEPTH,
            atomics_coherent: self.config.profile.atomics_coherent,
            one_sided_bypasses_target: true,
        }
    }
}

impl Backend for SimCluster {
    fn virtual_time(&self) -> bool {
        true
    }

    type Ep = SimEndpoint;

    fn shape(&self) -> ClusterShape {
        self.config.shape
    }

    fn register(&mut self, node: NodeId, spec: RegionSpec) -> Result<Rkey, BackendError> {
        if self.ran {
            let reason = "regions must be registered before the cluster runs".into();
            return Err(BackendError::Register { node, len_bytes: spec.len_bytes, reason });
        }
        check_region(&self.config.shape, node, spec)?;
        let region = Region::zeroed_on(spec.len_bytes, spec.pages);
        Ok(self.core.borrow_mut().add_region(node, region, spec.watcher))
    }

    fn region(&self, node: NodeId, rkey: Rkey) -> Option<Region> {
        self.core.borrow().regions.get(usize::from(node.0))?.get(rkey.0 as usize).cloned()
    }

    fn create_wq(&mut self, node: NodeId, spec: WqSpec) -> Result<WqId, BackendError> {
        if self.ran {
            return Err(BackendError::Config("work queues must be created before the run".into()));
        }
        self.core
            .borrow_mut()
            .create_wq(node, spec)
            .map_err(|reason| BackendError::Config(format!("work queue on {node}: {reason}")))
    }

    fn wq_counters(&self, node: NodeId, wq: WqId) -> Option<WqCounters> {
        self.core.borrow().wq_counters(node, wq)
    }

    fn run<P, R, F, G>(
        &mut self,
        make: F,
        finish: G,
        limits: RunLimits,
    ) -> Result<(Vec<R>, RunStats), BackendError>
    where
        P: Program,
        R: Send,
        F: Fn(SimEndpoint) -> P + Sync,
        G: Fn(P) -> R + Sync,
    {
        if self.ran {
            return Err(BackendError::Config(
                "a simulated cluster runs once; build a new one".into(),
            ));
        }
        self.ran = true;
        let shape = self.config.shape;
        let caps = self.caps();
        let endpoint = |i: usize, life: u32| {
            let me = shape.worker_at(i);
            let regions = self.core.borrow().regions[usize::from(me.node.0)].clone();
            SimEndpoint {
                core: self.core.clone(),
                me,
                index: i as u32,
                shape,
                caps,
                regions,
                fencing: self.config.fencing,
                measured: matches!(self.config.cpu, CpuMode::Measured { .. }),
                life,
            }
        };
        let mut programs: Vec<P> =
            (0..shape.workers_total()).map(|i| make(endpoint(i, 0))).collect();
        let remake = |i: usize, life: u32| make(endpoint(i, life));
        // Programs of nodes' earlier lives, finished after the others.
        let mut retired: Vec<P> = Vec::new();
        let wall = Instant::now();
        let limit_ps = limits.time_limit_ns.saturating_mul(1000);
        {
            let mut core = self.core.borrow_mut();
            core.schedule_faults();
            for w in 0..programs.len() {
                core.wake(w as u32, 0);
            }
        }
        let mut done: Vec<bool> = programs.iter().map(|p| p.is_done()).collect();
        let mut remaining = done.iter().filter(|d| !**d).count();
        let mut progress = self.progress.take();
        let mut finished_at = 0;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut run = Running {
                programs: &mut programs,
                done: &mut done,
                remaining: &mut remaining,
                remake: &remake,
                retired: &mut retired,
            };
            self.event_loop(&mut run, Until::AllDone, limit_ps, &mut progress);
            finished_at = self.core.borrow().now;
            if *run.remaining == 0 {
                let until = finished_at.saturating_add(DRAIN_PS).min(limit_ps);
                self.event_loop(&mut run, Until::Drained, until, &mut progress);
            }
        }));
        if let Err(panic) = outcome {
            let now_ns = self.core.try_borrow().map_or(0, |c| c.now / 1000);
            eprintln!(
                "simulation failed at virtual time {now_ns} ns; it replays exactly from: {}",
                self.config.describe()
            );
            resume_unwind(panic);
        }
        let core = self.core.borrow();
        let stats = RunStats {
            elapsed_ns: finished_at / 1000,
            wall_ns: wall.elapsed().as_nanos() as u64,
            all_done: remaining == 0,
            events: core.stats.events,
            verbs: core.stats.one_sided
                + core.stats.unreachable
                + core.stats.datagrams_delivered
                + core.stats.datagrams_dropped,
            trace_hash: core.trace_hash(),
            datagrams_dropped: core.stats.datagrams_dropped,
            crashed: core.crashed(),
            event_sleeps: 0,
            event_wakeups: 0,
        };
        drop(core);
        let results = programs.into_iter().chain(retired).map(finish).collect();
        Ok((results, stats))
    }
}

/// When an event loop stops, short of its time limit.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Until {
    /// Every program is done.
    AllDone,
    /// No event is left before the limit (the drain after every program is done: what
    /// is in flight lands).
    Drained,
}

/// The programs of a run under way.
struct Running<'a, P> {
    /// Per worker, the program of its node's current life.
    programs: &'a mut [P],
    done: &'a mut [bool],
    /// Programs not done.
    remaining: &'a mut usize,
    /// Builds worker `i`'s program of life `life` (after its node restarted).
    remake: &'a dyn Fn(usize, u32) -> P,
    /// Programs of earlier lives.
    retired: &'a mut Vec<P>,
}

impl SimCluster {
    /// Processes events until `until` or the next event is past the limit.
    fn event_loop<P: Program>(
        &self,
        run: &mut Running<'_, P>,
        until: Until,
        limit_ps: u64,
        progress: &mut Option<Box<dyn FnMut(u64)>>,
    ) {
        let mut countdown = PROGRESS_EVERY_EVENTS;
        while *run.remaining > 0 || until == Until::Drained {
            countdown -= 1;
            if countdown == 0 {
                countdown = PROGRESS_EVERY_EVENTS;
                if let Some(f) = progress.as_mut() {
                    let now = self.core.borrow().now / 1000;
                    f(now);
                }
            }
            let Some(event) = self.core.borrow_mut().pop(limit_ps) else { break };
            self.dispatch(event, run);
        }
    }

    fn dispatch<P: Program>(&self, event: Event, run: &mut Running<'_, P>) {
        let Running { programs, done, remaining, .. } = run;
        match event {
            Event::Arrive(op) => self.core.borrow_mut().arrive(op),
            Event::Line { op, from, cqe_at, answer } => {
                self.core.borrow_mut().line(op, from, cqe_at, answer)
            }
            Event::Deliver(dg) => self.core.borrow_mut().deliver(dg),
            Event::NodeFault { index } => {
                // Once every program is done, the run is over: nobody restarts.
                let over = **remaining == 0;
                let f = self.config.faults.node_faults[index];
                if over && f.kind == crate::NodeFaultKind::Restart {
                    return;
                }
                let struck = self.core.borrow_mut().node_fault(index);
                match struck {
                    Struck::Quietly => {}
                    Struck::Crashed(node) => self.count_crashed_done(node, done, remaining),
                    Struck::Restarted(node, life) => self.restart(node, life, run),
                }
            }
            Event::CrashDue { node } => {
                if let Struck::Crashed(node) = self.core.borrow_mut().crash_due(node) {
                    self.count_crashed_done(node, done, remaining);
                }
            }
            Event::Resume { node } => self.core.borrow_mut().resume(node),
            Event::WqRun { node, wq } => self.core.borrow_mut().wq_run(node, wq),
            Event::WqEffect(e) => self.core.borrow_mut().wq_effect(*e),
            Event::WqComplete { node, wq } => self.core.borrow_mut().wq_complete(node, wq),
            Event::Trigger(t) => self.core.borrow_mut().trigger_arrive(t),
            Event::Step { worker, token } => {
                if !self.core.borrow_mut().begin_step(worker, token) {
                    return;
                }
                let w = worker as usize;
                let outcome = self.step_one(&mut programs[w], worker);
                if !done[w] && programs[w].is_done() {
                    done[w] = true;
                    **remaining -= 1;
                }
                let node = self.config.shape.worker_at(w).node;
                if self.core.borrow().node_crashed(node) {
                    // It crashed itself in this step (`crash_here`): never stepped again.
                    return self.count_crashed_done(node, done, remaining);
                }
                self.schedule_next(worker, outcome);
            }
        }
    }

    /// Gives restarted `node`'s workers new programs of life `life`, and starts them.
    fn restart<P: Program>(&self, node: NodeId, life: u32, run: &mut Running<'_, P>) {
        let per = usize::from(self.config.shape.workers_per_node);
        let first = usize::from(node.0) * per;
        for w in first..first + per {
            let fresh = (run.remake)(w, life);
            let old = std::mem::replace(&mut run.programs[w], fresh);
            run.retired.push(old);
            assert!(run.done[w], "a crashed node's programs count as done");
            if !run.programs[w].is_done() {
                run.done[w] = false;
                *run.remaining += 1;
            }
        }
        self.core.borrow_mut().start_node(node);
    }

    /// A crashed node's programs will never run again: they count as done.
    fn count_crashed_done(&self, node: NodeId, done: &mut [bool], remaining: &mut usize) {
        let per = usize::from(self.config.shape.workers_per_node);
        let first = usize::from(node.0) * per;
        for d in done[first..first + per].iter_mut().filter(|d| !**d) {
            *d = true;
            *remaining -= 1;
        }
    }

    fn step_one<P: Program>(&self, program: &mut P, worker: u32) -> Step {
        let outcome = match self.config.cpu {
            CpuMode::Model => program.step(),
            CpuMode::Measured { scale } => {
                let started = self.core.borrow().workers[worker as usize].clock;
                let t0 = Instant::now();
                let outcome = program.step();
                let read = t0.elapsed().as_nanos() as f64;
                let mut core = self.core.borrow_mut();
                let ProgramCpu::Measured(m) = &mut core.program_cpu else {
                    unreachable!("a measured cluster's core measures")
                };
                let spent = (m.end_step(started, read) * scale * 1000.0) as u64;
                core.workers[worker as usize].clock += spent;
                outcome
            }
        };
        self.core.borrow_mut().end_step(worker);
        outcome
    }

    fn schedule_next(&self, worker: u32, outcome: Step) {
        let mut core = self.core.borrow_mut();
        let now = core.now;
        let next = match outcome {
            Step::Busy => {
                let ws = &mut core.workers[worker as usize];
                // A step that did no CPU work and wants to run again would spin forever
                // at one instant; charge it a nanosecond so virtual time advances.
                if ws.clock == now {
                    ws.clock += 1000;
                }
                Some(ws.clock)
            }
            Step::Idle { wake_at_ns, .. } => {
                // Timers are set on the node's clock.
                let node = self.config.shape.worker_at(worker as usize).node;
                let timer = wake_at_ns.map(|t| core.true_ps(node, t));
                match (core.next_visible(worker), timer) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
        };
        if let Some(at) = next {
            core.wake(worker, at);
        }
    }
}

/// Runs `run` twice and checks that both runs produced the same trace hash; returns it.
/// `run` must build its cluster from scratch each time.
pub fn replay_check(mut run: impl FnMut() -> u64) -> Result<u64, String> {
    let a = run();
    let b = run();
    if a == b {
        Ok(a)
    } else {
        Err(format!("nondeterminism: trace hash {a:#018x} then {b:#018x} for the same seed"))
    }
}
