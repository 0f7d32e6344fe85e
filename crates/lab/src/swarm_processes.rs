//! `hytra swarm --backend processes`: seeds run as clusters of processes on this machine
//! (`hytra cluster`'s launcher), one process per node over UCX shared memory or TCP, and
//! most of them with a node's process killed by SIGKILL mid-run. What the in-process
//! backends cannot show: a process that really dies, with its sockets, shared memory and
//! journal, while the others go on through the hub. The oracles: every survivor ends
//! well, the whole history (the dead node's part from its journal) is serializable, the
//! workload's invariants hold, the dead node and only it is reported lost, and the run
//! committed. One seed at a time; a seed's draw is a function of the seed, but its run is
//! real time and is not replayed bit for bit.

use std::time::Duration;

use hytra_fabric::rng::Rng;

use crate::bench::BenchReport;
use crate::launch::Kill;
use crate::swarm::{chance, pick};

/// Stream of a processes seed's draw.
const PROCESSES_STREAM: u64 = 0x50_5C;

/// Longest a launched node waits for the others or the hub, in seconds.
const TIMEOUT_S: u64 = 60;

/// One seed's cluster: what its cluster file says, and the node to kill.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessesDraw {
    /// The seed (the benchmark's `--seed` too).
    pub seed: u64,
    /// UCX transports: `tcp` or `sm`.
    pub transports: &'static str,
    /// The workload, as the cluster file names it.
    pub workload: &'static str,
    /// The workload's options (sizes, mix).
    pub workload_args: Vec<String>,
    /// The design; `None` leaves the file's default for its transports.
    pub design: Option<&'static str>,
    /// Processes.
    pub nodes: u16,
    /// Coroutines of each node's one worker.
    pub coroutines: u16,
    /// How an idle thread waits: `poll` or `event`.
    pub wait: &'static str,
    /// The measured window, in seconds.
    pub seconds: f64,
    /// The lease, in milliseconds.
    pub lease_ms: u64,
    /// The process killed, and when; `None` in a quarter of the seeds.
    pub kill: Option<Kill>,
}

/// Draws seed `seed`'s cluster.
pub fn draw(seed: u64) -> ProcessesDraw {
    let mut rng = Rng::derive(seed, PROCESSES_STREAM);
    let transports = pick(&mut rng, &["tcp", "sm"]);
    let (workload, workload_args) = match rng.below(6) {
        0 => {
            let accounts = pick(&mut rng, &[100u64, 1_000, 10_000]);
            ("smallbank", vec!["--accounts-per-worker".into(), accounts.to_string()])
        }
        1 => ("tpcc", Vec::new()),
        2 => ("tpcc-no", Vec::new()),
        3 => ("tatp", Vec::new()),
        4 => ("tpce-cp", Vec::new()),
        _ => {
            let records = pick(&mut rng, &[1_000u64, 20_000]);
            let mix = pick(&mut rng, &["a", "b", "c", "d", "e", "f"]);
            let args = ["--records-per-worker", &records.to_string(), "--ycsb-mix", mix];
            ("ycsb", args.iter().map(|s| s.to_string()).collect())
        }
    };
    let design = pick(&mut rng, &[None, Some("drtmh"), Some("fasst"), Some("farm"), Some("drtmr")]);
    let nodes = pick(&mut rng, &[3u16, 4, 4]);
    let coroutines = pick(&mut rng, &[2u16, 4, 8]);
    let wait = pick(&mut rng, &["poll", "event"]);
    // Four processes share two cores here: a shorter lease would take a process that
    // waits for a time slice for dead.
    let lease_ms = pick(&mut rng, &[1_000u64, 2_000]);
    // The transactions that meet the dead node wait about a lease for its removal, and
    // in a slow configuration (TPC-E over TCP commits a few hundred a second) they are
    // more than a hundredth of all: the p99 latency is then that wait, and a window
    // shorter than twice it measures no rate (the run fails saying so).
    let seconds = lease_ms as f64 / 1e3 * 3.0 + pick(&mut rng, &[0.0, 1.0, 2.0]);
    // From a fifth of the window until a lease and a half before its end: the survivors
    // have time to remove the dead node and run on before it ends.
    let (earliest, latest) = (seconds * 0.2, seconds - 1.5 * lease_ms as f64 / 1e3);
    let kill = (!chance(&mut rng, 1, 4)).then(|| Kill {
        node: rng.below(u64::from(nodes)) as u16,
        after: Duration::from_secs_f64(
            earliest + (latest - earliest) * rng.below(1_000) as f64 / 1e3,
        ),
    });
    ProcessesDraw {
        seed,
        transports,
        workload,
        workload_args,
        design,
        nodes,
        coroutines,
        wait,
        seconds,
        lease_ms,
        kill,
    }
}

impl ProcessesDraw {
    /// The configuration on one line.
    pub fn summary(&self) -> String {
        let args = match self.workload_args.is_empty() {
            true => String::new(),
            false => format!(" ({})", self.workload_args.join(" ")),
        };
        let kill = match self.kill {
            Some(k) => format!("kill node {} at {:.2} s", k.node, k.after.as_secs_f64()),
            None => "no kill".to_string(),
        };
        format!(
            "processes over {}, {}{args}, {}, {} x 1 x {}, wait {}, {} s, lease {} ms, {kill}",
            self.transports,
            self.workload,
            self.design.unwrap_or("the file's default design"),
            self.nodes,
            self.coroutines,
            self.wait,
            self.seconds,
            self.lease_ms
        )
    }

    /// Its dimensions, for the coverage summary.
    pub fn dimensions(&self) -> Vec<(&'static str, String)> {
        vec![
            ("transports", self.transports.to_string()),
            ("workload", self.workload.to_string()),
            ("design", self.design.unwrap_or("default").to_string()),
            ("nodes", self.nodes.to_string()),
            ("coroutines", self.coroutines.to_string()),
            ("wait", self.wait.to_string()),
            ("lease ms", self.lease_ms.to_string()),
            ("killed", self.kill.map_or("none".to_string(), |k| format!("node {}", k.node))),
        ]
    }

    /// The cluster file, its nodes at `ports` of 127.0.0.1.
    pub fn cluster_file(&self, ports: &[u16]) -> String {
        assert_eq!(ports.len(), usize::from(self.nodes), "a port per node");
        let quoted = |a: &[String]| a.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>();
        let mut args = quoted(&self.workload_args);
        let seed = self.seed.to_string();
        let lease = self.lease_ms.to_string();
        args.extend(quoted(&["--check".into(), "--seed".into(), seed, "--lease-ms".into(), lease]));
        let design = self.design.map_or(String::new(), |d| format!("design = \"{d}\"\n"));
        let mut text = format!(
            "token = \"swarm-{seed}\"\ntransports = \"{tr}\"\nworkload = \"{w}\"\n{design}\
             workers = 1\ncoroutines = {co}\nreplication = 3\nseconds = {s:?}\nwait = \"{wait}\"\n\
             timeout_s = {TIMEOUT_S}\nbench_args = [{args}]\n",
            seed = self.seed,
            tr = self.transports,
            w = self.workload,
            co = self.coroutines,
            s = self.seconds,
            wait = self.wait,
            args = args.join(", "),
        );
        for p in ports {
            text.push_str(&format!("\n[[nodes]]\nhost = \"127.0.0.1\"\nport = {p}\n"));
        }
        text
    }
}

/// What is wrong with a cluster's report for `d`.
pub fn judge(d: &ProcessesDraw, r: &BenchReport) -> Vec<String> {
    let mut findings = Vec::new();
    match r.checker.serializable {
        Some(true) => {}
        Some(false) => findings.push(format!(
            "not serializable: {} violations, first {:?}",
            r.checker.violations.unwrap_or(0),
            r.checker.first_violations
        )),
        None => findings.push("the history was not checked".into()),
    }
    if !r.invariant_ok {
        findings.push(format!("an invariant failed: {}", r.invariant.join("; ")));
    }
    let lost = r.lost_nodes.clone().unwrap_or_default();
    let killed: Vec<u16> = d.kill.iter().map(|k| k.node).collect();
    if lost != killed {
        findings.push(format!("lost nodes {lost:?}, but killed {killed:?}"));
    }
    if r.committed == 0 {
        findings.push("nothing committed in the window".into());
    }
    findings
}

#[cfg(feature = "ucx")]
pub use imp::run_seed;

#[cfg(feature = "ucx")]
mod imp {
    use std::path::{Path, PathBuf};
    use std::time::Instant;

    use super::{draw, judge, ProcessesDraw};
    use crate::bench::BenchReport;
    use crate::swarm::SeedReport;

    /// A TCP port of 127.0.0.1 that was free a moment ago.
    fn free_port() -> Result<u16, String> {
        let l =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
        Ok(l.local_addr().map_err(|e| e.to_string())?.port())
    }

    /// Runs seed `seed` as a cluster of processes of the running `hytra` binary; `None` if
    /// `interrupted` stopped it (every process stopped by then). A failing seed's cluster
    /// file and every node's output stay in a directory its findings name.
    pub fn run_seed(seed: u64, interrupted: fn() -> bool) -> Option<SeedReport> {
        let started = Instant::now();
        let d = draw(seed);
        let dir = std::env::temp_dir().join(format!("hytra-swarm-{}-{seed}", std::process::id()));
        let mut report = SeedReport::new(seed, d.summary(), d.dimensions());
        match run_cluster(&d, &dir, interrupted) {
            Ok(Some(r)) => {
                report.commits = r.committed;
                report.findings = judge(&d, &r);
                if let Some(re) = r.replicated {
                    report.dimensions.push(("copies whole again", re.to_string()));
                }
            }
            Ok(None) => {
                let _ = std::fs::remove_dir_all(&dir);
                return None;
            }
            Err(e) => report.findings.push(e),
        }
        if report.passed() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            report
                .findings
                .push(format!("the cluster file and each node's output: {}", dir.display()));
        }
        report.wall = started.elapsed();
        Some(report)
    }

    /// The last line each node wrote to its error output in `dir`, where it wrote one.
    fn last_words(dir: &Path, nodes: u16) -> String {
        (0..nodes)
            .filter_map(|n| {
                let err = std::fs::read_to_string(dir.join(format!("node-{n}.err"))).ok()?;
                let last = err.lines().rev().find(|l| !l.trim().is_empty())?;
                Some(format!("; node {n} said: {last}"))
            })
            .collect()
    }

    /// Writes `d`'s cluster file in `dir`, launches it, and reads node 0's (or the reporting
    /// survivor's) report; `Ok(None)` if interrupted.
    fn run_cluster(
        d: &ProcessesDraw,
        dir: &Path,
        interrupted: fn() -> bool,
    ) -> Result<Option<BenchReport>, String> {
        use crate::cmd::cluster::{job, Job};
        use crate::launch::{launch, Job as LaunchJob, LaunchError, LaunchSpec};
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let ports = (0..d.nodes).map(|_| free_port()).collect::<Result<Vec<u16>, String>>()?;
        let config: PathBuf = dir.join("cluster.toml");
        let text = d.cluster_file(&ports);
        std::fs::write(&config, &text)
            .map_err(|e| format!("cannot write the cluster file: {e}"))?;
        let f = crate::cluster_file::parse(&text).map_err(|e| format!("the cluster file: {e}"))?;
        let json = dir.join("out.json");
        match job(&f, Some(&json)).map_err(|e| format!("the cluster file: {e}"))? {
            Job::Bench(args) => crate::cmd::bench::check(&args).map_err(|e| e.to_string())?,
            Job::Io(_) => unreachable!("the draw names a transactional workload"),
        }
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find the hytra binary: {e}"))?;
        let spec = LaunchSpec {
            exe,
            config: &config,
            file: &f,
            json: Some(&json),
            job: LaunchJob::Bench { kill: d.kill },
            run_s: d.seconds,
            logs: Some(dir),
        };
        let mut notices = Vec::new();
        match launch(&spec, &interrupted, &mut |m| notices.push(m)) {
            Ok(()) => {}
            Err(LaunchError::Interrupted) => return Ok(None),
            Err(e) => {
                let said = last_words(dir, d.nodes);
                return Err(format!("the cluster failed: {e} ({}){said}", notices.join("; ")));
            }
        }
        let text = std::fs::read_to_string(&json)
            .map_err(|e| format!("no report at {}: {e}", json.display()))?;
        serde_json::from_str(&text).map(Some).map_err(|e| format!("an unreadable report: {e}"))
    }
}

/// Stands for [`run_seed`] in a build without UCX, which cannot launch the processes.
#[cfg(not(feature = "ucx"))]
pub fn run_seed(seed: u64, _interrupted: fn() -> bool) -> Option<crate::swarm::SeedReport> {
    let d = draw(seed);
    let mut report = crate::swarm::SeedReport::new(seed, d.summary(), d.dimensions());
    report.findings.push("this build has no UCX: build with --features ucx".into());
    Some(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every draw is a function of its seed and a cluster file the benchmark accepts,
    /// with a kill the run can outlive.
    #[test]
    fn every_draw_is_a_cluster_file_the_benchmark_accepts() {
        use crate::cmd::cluster::{job, parse_kill, Job};
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let d = draw(seed);
            assert_eq!(d, draw(seed), "seed {seed}");
            let ports: Vec<u16> = (0..d.nodes).map(|i| 20_000 + i).collect();
            let f = crate::cluster_file::parse(&d.cluster_file(&ports))
                .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", d.cluster_file(&ports)));
            let Job::Bench(args) = job(&f, None).unwrap() else { panic!("seed {seed}: io") };
            if cfg!(feature = "ucx") {
                // Without UCX the check refuses the backend before anything else.
                crate::cmd::bench::check(&args).unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
            }
            assert_eq!(args.seed, seed);
            if let Some(k) = d.kill {
                let spec = format!("{}@{}", k.node, k.after.as_secs_f64());
                let parsed = parse_kill(&spec, &f, &args).expect("a kill the run outlives");
                assert_eq!(parsed.node, k.node, "seed {seed}");
            }
            kinds.insert((d.workload, d.transports, d.kill.is_some()));
        }
        assert_eq!(kinds.len(), 6 * 2 * 2, "every workload over both transports, killed or not");
    }

    /// A whole report passes; each oracle finds what it is about: a history not
    /// serializable or not checked, an invariant that failed, another node lost than the
    /// one killed (or one lost where none was), nothing committed.
    #[test]
    fn each_oracle_finds_what_it_is_about() {
        use crate::judge::tests::{report, spec};
        let mut whole = report(&spec(1_000_000));
        whole.lost_nodes = Some(vec![2]);
        let mut d = draw(1);
        d.kill = Some(Kill { node: 2, after: Duration::from_secs(1) });
        assert_eq!(judge(&d, &whole), Vec::<String>::new());
        /// A change that breaks a whole report, and what its finding says.
        type Broken = (fn(&mut BenchReport), &'static str);
        let broken: [Broken; 6] = [
            (|r| r.checker.serializable = Some(false), "not serializable"),
            (|r| r.checker.serializable = None, "not checked"),
            (|r| r.invariant_ok = false, "an invariant failed"),
            (|r| r.lost_nodes = Some(vec![1, 2]), "lost nodes [1, 2], but killed [2]"),
            (|r| r.lost_nodes = None, "lost nodes [], but killed [2]"),
            (|r| r.committed = 0, "nothing committed"),
        ];
        for (apply, says) in broken {
            let mut r = whole.clone();
            apply(&mut r);
            let found = judge(&d, &r);
            assert!(found.len() == 1 && found[0].contains(says), "{says}: {found:?}");
        }
        d.kill = None;
        let found = judge(&d, &whole);
        assert!(found.len() == 1 && found[0].contains("but killed []"), "{found:?}");
    }
}
