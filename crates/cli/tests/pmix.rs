//! `hytra node` under Open MPI's `mpirun`, whose PMIx server tells each process its
//! rank and carries the addresses and results: SmallBank on three processes over UCX
//! shared memory and TCP, checked serializable with its invariants; and the bad inputs
//! of a launched job (a job size other than the file's node count, a libpmix that
//! cannot be loaded) stop every process with exit 2. Built only with the `pmix` feature;
//! needs `mpirun` (Debian: apt-get install -y openmpi-bin).

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
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-np", &n.to_string()]);
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

    fn three_ranks_run_smallbank(transports: &str) {
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
