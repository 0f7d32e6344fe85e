//! `hytra node` under the launchers of clusters, whose PMIx servers tell each process its
//! rank and carry the addresses and results: Open MPI's `mpirun`, and Slurm's `srun
//! --mpi=pmix` on a one-node Slurm the tests start on 127.0.0.1. SmallBank on three
//! processes over UCX shared memory and TCP, checked serializable with its invariants;
//! the bad inputs of a launched job (a job size other than the file's node count, a
//! libpmix that cannot be loaded) stop every process with exit 2; and with a hub, a rank
//! killed mid-run is survived. Built only with the `pmix` feature; needs `mpirun`
//! (Debian: apt-get install -y openmpi-bin), etcd for the hub (etcd-server), and Slurm
//! and MUNGE for `srun` (slurmd slurmctld slurm-client munge: without them the Slurm
//! tests say so and pass, unless `HYTRA_REQUIRE_SLURM=1`, which CI sets).

#[cfg(feature = "pmix")]
mod with_pmix {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Output, Stdio};
    use std::time::{Duration, Instant};

    /// A directory of this test process's files, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!("hytra-pmix-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A cluster file of `nodes` nodes known only by number, as a launcher's job uses it.
    fn cluster_file(dir: &Path, transports: &str, nodes: u16) -> PathBuf {
        let text = format!(
            "token = \"job\"\ntransports = \"{transports}\"\nworkload = \"smallbank\"\n\
         workers = 1\ncoroutines = 4\nreplication = 3\nseconds = 0.5\ntimeout_s = 30\n\
         bench_args = [\"--accounts-per-worker\", \"2000\", \"--check\"]\nnode_count = {nodes}\n"
        );
        let path = dir.join(format!("{transports}-{nodes}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `mpirun -np n hytra node --config file [extra]`, as root in a container too: Open MPI
    /// refuses root without `--allow-run-as-root`, and two cores hold three processes only
    /// with `--oversubscribe`. The processes of the job only talk over 127.0.0.1 (the PMIx
    /// server listens there, UCX TCP is held to `lo`).
    fn mpirun(n: u16, file: &Path, env: &[(&str, &str)], extra: &[&str]) -> Child {
        mpirun_with(&[], n, file, env, extra)
    }

    /// [`mpirun`] with mpirun's own `options` too.
    fn mpirun_with(
        options: &[&str],
        n: u16,
        file: &Path,
        env: &[(&str, &str)],
        extra: &[&str],
    ) -> Child {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-np", &n.to_string()]);
        c.args(options);
        c.args(["-x", "UCX_NET_DEVICES=lo"]);
        for (k, v) in env {
            c.args(["-x", &format!("{k}={v}")]);
        }
        c.arg(env!("CARGO_BIN_EXE_hytra")).args(["node", "--config"]).arg(file).args(extra);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn()
            .unwrap_or_else(|e| panic!("cannot start mpirun ({e}): apt-get install -y openmpi-bin"))
    }

    /// How long a launched job may take.
    const LIMIT: Duration = Duration::from_secs(120);

    /// Waits for `c` at most `limit`; past it, stops the job (`mpirun` and `srun` pass
    /// SIGTERM on to every process they started) and fails.
    fn wait_bounded(mut c: Child, limit: Duration) -> Output {
        let started = Instant::now();
        while c.try_wait().unwrap().is_none() {
            if started.elapsed() > limit {
                // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
                unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
                std::thread::sleep(Duration::from_secs(5));
                let _ = c.kill();
                let _ = c.wait();
                panic!("the launcher still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_with_output().unwrap()
    }

    /// Jobs that run a benchmark go one at a time: on two cores, beside another job's
    /// processes, their leases would lapse. So do the Slurm clusters: two at once, each
    /// numbering its jobs from 1, mixed up their jobs' output (before each had a `TmpFS`
    /// of its own; not tried since).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A process killed and reaped when dropped (after a failed assertion too).
    struct KillOnDrop(Option<Child>);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if let Some(c) = &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    fn three_ranks_run_smallbank(transports: &str) {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = Scratch::new(transports);
        let file = cluster_file(&dir.0, transports, 3);
        let json = dir.0.join("out.json");
        let job = mpirun(3, &file, &[], &["--json", json.to_str().unwrap()]);
        three_ranks_ran_smallbank(&wait_bounded(job, LIMIT), &json);
    }

    /// A job of three ranks (`out`, its JSON report at `json`) ended well: only rank 0
    /// (node 0) printed the cluster's report, and the run was serializable, kept its
    /// invariants and committed.
    fn three_ranks_ran_smallbank(out: &Output, json: &Path) {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.matches("smallbank on ucx").count(), 1, "{stdout}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        assert_eq!(v["nodes"], 3);
        assert_eq!(v["checker"]["serializable"], true, "{v}");
        assert_eq!(v["invariant_ok"], true, "{v}");
        assert!(v["committed"].as_u64().unwrap() > 100, "{v}");
    }

    #[test]
    fn mpirun_runs_three_ranks_over_shared_memory() {
        three_ranks_run_smallbank("sm");
    }

    #[test]
    fn mpirun_runs_three_ranks_over_tcp() {
        three_ranks_run_smallbank("tcp");
    }

    /// The process of `rank` among those running `hytra node --config file`, found by
    /// the rank PMIx put in its environment.
    fn rank_pid(file: &Path, rank: u32) -> Option<libc::pid_t> {
        let wanted = format!("PMIX_RANK={rank}");
        let file = file.to_str()?;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
                continue;
            };
            let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let cmd = String::from_utf8_lossy(&cmd);
            if !cmd.contains("node\0--config") || !cmd.contains(file) {
                continue;
            }
            let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
            if env.split(|&b| b == 0).any(|v| v == wanted.as_bytes()) {
                return Some(pid);
            }
        }
        None
    }

    /// A file with a hub takes each process's place from PMIx and runs through `hytra
    /// hub`, the configurations in etcd (started here on 127.0.0.1): four ranks, started
    /// by `launch` (given the file and the JSON output's path), of which rank 1 dies by
    /// SIGKILL mid-run; the others remove it and carry on, and node 0 reports the whole
    /// history checked, node 1's part read from its journal. `launched` checks how the
    /// launcher itself ended. The caller holds [`ONE_AT_A_TIME`].
    fn a_hub_outlives_a_killed_rank(
        name: &str,
        launch: impl FnOnce(&Path, &Path) -> Child,
        launched: impl FnOnce(&Output),
    ) {
        use hytra_txn::config_store::etcd::LocalEtcd;
        use std::io::BufRead;
        let Some(etcd) = LocalEtcd::start(name).unwrap() else {
            eprintln!("no etcd binary (Debian: etcd-server): not run");
            return;
        };
        let dir = Scratch::new(name);
        let file = cluster_file(&dir.0, "tcp", 4);
        let hub_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let text = std::fs::read_to_string(&file)
            .unwrap()
            .replace("seconds = 0.5", "seconds = 4.0\nwait = \"event\"")
            .replace("\"--check\"", "\"--check\", \"--lease-ms\", \"1000\"")
            + &format!(
                "hub = \"{hub_port}\"\nstore = \"etcd://{}\"\njournal = \"{}\"\n",
                etcd.client,
                dir.0.join("journal").display()
            );
        std::fs::write(&file, text).unwrap();
        let mut hub = KillOnDrop(Some(
            Command::new(env!("CARGO_BIN_EXE_hytra"))
                .args(["hub", "--config"])
                .arg(&file)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ));
        let (tx, rx) = std::sync::mpsc::channel();
        let hub_stderr = hub.0.as_mut().and_then(|c| c.stderr.take()).unwrap();
        let lines = std::io::BufReader::new(hub_stderr);
        let said = std::thread::spawn(move || {
            lines.lines().map_while(Result::ok).fold(String::new(), |all, line| {
                let _ = tx.send(line.clone());
                all + &line + "\n"
            })
        });
        let json = dir.0.join("out.json");
        let job = launch(&file, &json);
        let started = rx.iter().any(|line| line.contains("the run started"));
        std::thread::sleep(Duration::from_secs(1));
        let Some(victim) = rank_pid(&file, 1).filter(|_| started) else {
            // Stops the job (and fails) before failing here, so nothing is left running.
            let _ = wait_bounded(job, Duration::from_secs(1));
            panic!("the run never started, or rank 1 is not running: {}", said.join().unwrap());
        };
        // SAFETY: kill(2) on a process of this test's job, found by its command line.
        assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
        let out = wait_bounded(job, LIMIT);
        let hub_out = wait_bounded(hub.0.take().unwrap(), Duration::from_secs(30));
        let (stdout, hub_said) = (String::from_utf8_lossy(&out.stdout), said.join().unwrap());
        launched(&out);
        assert_eq!(stdout.matches("smallbank on ucx").count(), 1, "{stdout}");
        let hub_stdout = String::from_utf8_lossy(&hub_out.stdout);
        assert!(hub_out.status.success(), "{hub_stdout}\n{hub_said}");
        assert!(hub_stdout.contains("nodes [1] died"), "{hub_stdout}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["lost_nodes"], serde_json::json!([1]), "{v}");
        assert_eq!(v["checker"]["serializable"], true, "{v}");
        assert_eq!(v["invariant_ok"], true, "{v}");
        assert!(v["committed"].as_u64().unwrap() > 100, "{v}");
        assert_eq!(etcd.keys_under("/hytra/"), Ok(0), "the hub left its keys in etcd");
    }

    /// Under `mpirun --enable-recovery` the other ranks live on when one dies, and the
    /// job ends well.
    #[test]
    fn mpirun_with_a_hub_outlives_a_killed_rank() {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        a_hub_outlives_a_killed_rank(
            "pmix-hub",
            |file, json| {
                let json = ["--json", json.to_str().unwrap()];
                mpirun_with(&["--enable-recovery"], 4, file, &[], &json)
            },
            |out| {
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "{}\n{stderr}", String::from_utf8_lossy(&out.stdout));
                assert!(!stderr.contains("--enable-recovery"), "no warning with it: {stderr}");
            },
        );
    }

    /// Every process of a bad job sees the same problem before waiting for anyone, so the
    /// job ends at once with exit 2 and the reason.
    fn refused(job: Child, reason: &str) {
        let out = wait_bounded(job, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(reason), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    #[test]
    fn a_job_of_another_size_than_the_file_is_refused() {
        let dir = Scratch::new("size");
        let file = cluster_file(&dir.0, "sm", 3);
        refused(mpirun(2, &file, &[], &[]), "the PMIx job has 2 processes but");
    }

    #[test]
    fn a_missing_libpmix_is_a_clear_error() {
        let dir = Scratch::new("nolib");
        let file = cluster_file(&dir.0, "sm", 2);
        let env = [("HYTRA_PMIX_LIB", "/nonexistent/libpmix.so.2")];
        refused(mpirun(2, &file, &env, &[]), "cannot load /nonexistent/libpmix.so.2");
    }

    /// A one-node Slurm cluster on 127.0.0.1 while it lives: MUNGE's `munged`,
    /// `slurmctld` and `slurmd` as children of the test, their key, configuration, state,
    /// logs and temporary files (`TmpFS`) in a scratch directory. The node says it has 8 CPUs (`config_overrides`
    /// lets slurmd say more than the host has), so that four tasks fit on two cores; the
    /// daemons and `srun` bind the addresses their names resolve to (`NoInAddrAny`), which
    /// [`slurm_unusable`] requires to be loopback ones.
    struct LocalSlurm {
        conf: PathBuf,
        /// `munged`, `slurmctld`, `slurmd`: stopped in the reverse order.
        daemons: Vec<Child>,
        /// Removed after the daemons stopped (fields drop after `drop`).
        dir: Scratch,
    }

    /// The programs of Slurm and MUNGE the tests run.
    const SLURM_PROGRAMS: [&str; 8] =
        ["munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo", "squeue", "scancel"];

    /// `name` on the `PATH` or in the system directories daemons are installed to.
    fn program(name: &str) -> Option<PathBuf> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    }

    /// Why a one-node Slurm cannot run here, if it cannot: a program missing; not root
    /// (the daemons run as `SlurmUser=root`); or a host name that resolves to other than
    /// loopback addresses, since `srun` and the daemons bind the addresses their names
    /// resolve to (`NoInAddrAny`) and the tests stay on 127.0.0.1.
    fn slurm_unusable() -> Option<String> {
        use std::net::ToSocketAddrs;
        let missing: Vec<&str> =
            SLURM_PROGRAMS.into_iter().filter(|p| program(p).is_none()).collect();
        if !missing.is_empty() {
            return Some(format!("no {missing:?} (Debian: slurmd slurmctld slurm-client munge)"));
        }
        // SAFETY: geteuid(2) only reads the process's credentials.
        if unsafe { libc::geteuid() } != 0 {
            return Some("not root: the one-node Slurm runs its daemons as root".into());
        }
        let host = host_name();
        let loopback = (host.as_str(), 0)
            .to_socket_addrs()
            .is_ok_and(|addrs| addrs.map(|a| a.ip().is_loopback()).min() == Some(true));
        (!loopback)
            .then(|| format!("the host name {host} does not resolve to loopback addresses only"))
    }

    /// This host's name, short (slurmctld runs only where it is the controller's).
    fn host_name() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        host.trim().split('.').next().unwrap_or_default().to_string()
    }

    /// A TCP port of 127.0.0.1 that was free a moment ago.
    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// Polls `done` every 50 ms for at most `limit`.
    fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
        let started = Instant::now();
        while !done() {
            if started.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// The configuration of a [`LocalSlurm`] whose files are in `dir`, authenticated by
    /// the munged listening at `socket`, on two ports of 127.0.0.1 free a moment ago.
    fn slurm_conf(dir: &Path, socket: &Path) -> String {
        let host = host_name();
        format!(
            "ClusterName=hytra\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld}\n\
             SlurmdPort={slurmd}\n\
             CommunicationParameters=NoInAddrAny\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={socket}\n\
             CredType=cred/munge\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             StateSaveLocation={state}\n\
             SlurmdSpoolDir={spool}\n\
             TmpFS={tmp}\n\
             SlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\n\
             SlurmdLogFile={d}/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\n\
             SlurmdParameters=config_overrides\n\
             MpiDefault=none\n\
             ReturnToService=2\n\
             NodeName=hytra NodeHostname={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN\n\
             PartitionName=hytra Nodes=hytra Default=YES MaxTime=10 State=UP OverSubscribe=YES\n",
            ctld = free_port(),
            slurmd = free_port(),
            socket = socket.display(),
            state = dir.join("state").display(),
            spool = dir.join("spool").display(),
            tmp = dir.join("tmp").display(),
            d = dir.display(),
        )
    }

    impl LocalSlurm {
        /// Starts the daemons and waits (at most 30 s) until the node takes jobs. `None`
        /// when a program is missing, unless `HYTRA_REQUIRE_SLURM=1`.
        fn start(name: &str) -> Option<LocalSlurm> {
            if let Some(why) = slurm_unusable() {
                let required = std::env::var("HYTRA_REQUIRE_SLURM").as_deref() == Ok("1");
                assert!(!required, "HYTRA_REQUIRE_SLURM=1 but {why}");
                eprintln!("{why}: not run");
                return None;
            }
            let dir = Scratch::new(name);
            let base = dir.0.clone();
            let at = |f: &str| base.join(f);
            for d in ["state", "spool", "tmp"] {
                std::fs::create_dir_all(at(d)).unwrap();
            }
            let ok = Command::new(program("mungekey").unwrap())
                .args(["--create", "--keyfile"])
                .arg(at("munge.key"))
                .status()
                .unwrap();
            assert!(ok.success(), "mungekey failed");
            let socket = at("munge.sock");
            let mut slurm = LocalSlurm { conf: at("slurm.conf"), daemons: Vec::new(), dir };
            // `--force`: munged runs as root in a container.
            let munged = Command::new(program("munged").unwrap())
                .args(["--foreground", "--force"])
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--key-file={}", at("munge.key").display()))
                .arg(format!("--log-file={}", at("munged.log").display()))
                .arg(format!("--pid-file={}", at("munged.pid").display()))
                .arg(format!("--seed-file={}", at("munged.seed").display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            slurm.daemons.push(munged);
            assert!(within(Duration::from_secs(10), || socket.exists()), "munged never started");
            std::fs::write(&slurm.conf, slurm_conf(&base, &socket)).unwrap();
            for (daemon, args) in [("slurmctld", &["-D"][..]), ("slurmd", &["-D", "-N", "hytra"])] {
                let child = Command::new(program(daemon).unwrap())
                    .args(args)
                    .env("SLURM_CONF", &slurm.conf)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                slurm.daemons.push(child);
            }
            let idle = within(Duration::from_secs(30), || {
                let out = slurm.command("sinfo").args(["-h", "-o", "%T"]).output().unwrap();
                String::from_utf8_lossy(&out.stdout).trim() == "idle"
            });
            let log = |f: &str| std::fs::read_to_string(at(f)).unwrap_or_default();
            assert!(
                idle,
                "the node never took jobs: {}{}",
                log("slurmctld.log"),
                log("slurmd.log")
            );
            Some(slurm)
        }

        /// A Slurm client program of this cluster.
        fn command(&self, name: &str) -> Command {
            let mut c = Command::new(program(name).unwrap());
            c.env("SLURM_CONF", &self.conf);
            c
        }

        /// The slurmstepd processes of this cluster: those that hold its slurmd's log open
        /// (they log there; their environment and working directory are not ours to
        /// tell by).
        fn step_daemons(&self) -> Vec<libc::pid_t> {
            let log = self.dir.0.join("slurmd.log");
            let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
            procs
                .flatten()
                .filter_map(|e| {
                    let pid = e.file_name().to_string_lossy().parse::<libc::pid_t>().ok()?;
                    let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
                    if comm.trim() != "slurmstepd" {
                        return None;
                    }
                    let mut fds = std::fs::read_dir(e.path().join("fd")).ok()?.flatten();
                    fds.any(|fd| std::fs::read_link(fd.path()).is_ok_and(|to| to == log))
                        .then_some(pid)
                })
                .collect()
        }

        /// `srun --mpi=pmix -n n hytra node --config file [extra]`, UCX's TCP held to the
        /// loopback device.
        fn srun(&self, n: u16, file: &Path, extra: &[&str]) -> Child {
            let mut c = self.command("srun");
            c.args(["--mpi=pmix", "-n", &n.to_string()]).env("UCX_NET_DEVICES", "lo");
            c.arg(env!("CARGO_BIN_EXE_hytra")).args(["node", "--config"]).arg(file).args(extra);
            c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
        }
    }

    impl Drop for LocalSlurm {
        fn drop(&mut self) {
            // A job left by a failed assertion is cancelled before its node goes.
            let _ = self.command("scancel").args(["--partition", "hytra"]).status();
            let _ = within(Duration::from_secs(10), || {
                let out = self.command("squeue").args(["-h", "-o", "%i"]).output();
                out.is_ok_and(|o| o.stdout.is_empty())
            });
            // A step's slurmstepd may outlive its job briefly.
            if !within(Duration::from_secs(10), || self.step_daemons().is_empty()) {
                for pid in self.step_daemons() {
                    // SAFETY: kill(2) on a slurmstepd of this test's Slurm, found by the
                    // log of its slurmd, which it holds open.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            while let Some(mut d) = self.daemons.pop() {
                // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
                unsafe { libc::kill(d.id() as libc::pid_t, libc::SIGTERM) };
                if !within(Duration::from_secs(10), || d.try_wait().is_ok_and(|s| s.is_some())) {
                    let _ = d.kill();
                    let _ = d.wait();
                }
            }
        }
    }

    fn srun_runs_three_ranks(transports: &str) {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(slurm) = LocalSlurm::start(&format!("slurm-{transports}")) else { return };
        let dir = Scratch::new(&format!("srun-{transports}"));
        let file = cluster_file(&dir.0, transports, 3);
        let json = dir.0.join("out.json");
        let job = slurm.srun(3, &file, &["--json", json.to_str().unwrap()]);
        three_ranks_ran_smallbank(&wait_bounded(job, LIMIT), &json);
    }

    #[test]
    fn srun_runs_three_ranks_over_shared_memory() {
        srun_runs_three_ranks("sm");
    }

    #[test]
    fn srun_runs_three_ranks_over_tcp() {
        srun_runs_three_ranks("tcp");
    }

    /// Slurm's default (`KillOnBadExit=0`) lets the other tasks of a step live on when
    /// one dies; `srun` then exits as the dead task did, and says which task died.
    #[test]
    fn srun_with_a_hub_outlives_a_killed_rank() {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(slurm) = LocalSlurm::start("slurm-hub") else { return };
        a_hub_outlives_a_killed_rank(
            "srun-hub",
            |file, json| slurm.srun(4, file, &["--json", json.to_str().unwrap()]),
            |out| {
                let stderr = String::from_utf8_lossy(&out.stderr);
                // 128 + SIGKILL, from the dead task.
                assert_eq!(out.status.code(), Some(137), "{stderr}");
                assert!(stderr.contains("task 1: Killed"), "{stderr}");
                assert!(
                    !stderr.contains("Exited with exit code"),
                    "no other task failed: {stderr}"
                );
            },
        );
    }

    #[test]
    fn srun_job_of_another_size_than_the_file_is_refused() {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(slurm) = LocalSlurm::start("slurm-size") else { return };
        let dir = Scratch::new("srun-size");
        let file = cluster_file(&dir.0, "sm", 3);
        refused(slurm.srun(2, &file, &[]), "the PMIx job has 2 processes but");
    }
}

/// Stands for the tests of this file in a build without the `pmix` feature, so that
/// the test output says they were not built.
#[cfg(not(feature = "pmix"))]
#[test]
#[ignore = "the PMIx bootstrap is not in this build: install libucx-dev, libpmix-dev and openmpi-bin and run `cargo test --features pmix`"]
fn not_built() {}
