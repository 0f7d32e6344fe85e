//! `hytra node` under Open MPI's `mpirun`, whose PMIx server tells each process its
//! rank and carries the addresses and results: SmallBank on three processes over UCX
//! shared memory and TCP, checked serializable with its invariants; and the bad inputs
//! of a launched job (a job size other than the file's node count, a libpmix that
//! cannot be loaded) stop every process with exit 2; and with a hub, a rank killed
//! mid-run is survived. Built only with the `pmix` feature; needs `mpirun` (Debian:
//! apt-get install -y openmpi-bin), and etcd for the hub (etcd-server).

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

    /// Waits for `c` at most `limit`; past it, stops the job (mpirun passes SIGTERM on to
    /// every process it started) and fails.
    fn wait_bounded(mut c: Child, limit: Duration) -> Output {
        let started = Instant::now();
        while c.try_wait().unwrap().is_none() {
            if started.elapsed() > limit {
                // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
                unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
                std::thread::sleep(Duration::from_secs(5));
                let _ = c.kill();
                let _ = c.wait();
                panic!("mpirun still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_with_output().unwrap()
    }

    /// Jobs that run a benchmark go one at a time: on two cores, beside another job's
    /// processes, their leases would lapse.
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
        let out = wait_bounded(job, Duration::from_secs(120));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        // Only rank 0 (node 0) prints the cluster's report.
        assert_eq!(stdout.matches("smallbank on ucx").count(), 1, "{stdout}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
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

    /// Under `mpirun --enable-recovery` (the other ranks live on when one dies), a file
    /// with a hub takes each process's place from PMIx and runs through `hytra hub`, the
    /// configurations in etcd (started here on 127.0.0.1): rank 1 dies by SIGKILL
    /// mid-run, the others remove it and carry on, and node 0 reports the whole history
    /// checked, node 1's part read from its journal.
    #[test]
    fn mpirun_with_a_hub_outlives_a_killed_rank() {
        use hytra_txn::config_store::etcd::LocalEtcd;
        use std::io::BufRead;
        let Some(etcd) = LocalEtcd::start("pmix-hub").unwrap() else {
            eprintln!("no etcd binary (Debian: etcd-server): not run");
            return;
        };
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = Scratch::new("hub");
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
        let job =
            mpirun_with(&["--enable-recovery"], 4, &file, &[], &["--json", json.to_str().unwrap()]);
        let started = rx.iter().any(|line| line.contains("the run started"));
        std::thread::sleep(Duration::from_secs(1));
        let Some(victim) = rank_pid(&file, 1).filter(|_| started) else {
            // Stops the job (and fails) before failing here, so nothing is left running.
            let _ = wait_bounded(job, Duration::from_secs(1));
            panic!("the run never started, or rank 1 is not running: {}", said.join().unwrap());
        };
        // SAFETY: kill(2) on a process of this test's job, found by its command line.
        assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
        let out = wait_bounded(job, Duration::from_secs(120));
        let hub_out = wait_bounded(hub.0.take().unwrap(), Duration::from_secs(30));
        let (stdout, hub_said) = (String::from_utf8_lossy(&out.stdout), said.join().unwrap());
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.matches("smallbank on ucx").count(), 1, "{stdout}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("--enable-recovery"), "no warning with it: {stderr}");
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
}

/// Stands for the tests of this file in a build without the `pmix` feature, so that
/// the test output says they were not built.
#[cfg(not(feature = "pmix"))]
#[test]
#[ignore = "the PMIx bootstrap is not in this build: install libucx-dev, libpmix-dev and openmpi-bin and run `cargo test --features pmix`"]
fn not_built() {}
