//! `hytra cluster` and `hytra node`: SmallBank on three processes over UCX (shared
//! memory and TCP on 127.0.0.1), TPC-C on three processes over shared memory, refused
//! nodes, a node killed mid-run (`hytra node`: the others stop; `hytra cluster --kill`:
//! they survive it); `hytra io` on two processes, and its requester
//! killed mid-run; `hytra swarm --backend processes`, its seeds passing and a stop
//! leaving nothing behind. Built only with the `ucx` feature.

#[cfg(feature = "ucx")]
mod common;

#[cfg(feature = "ucx")]
mod with_ucx {
    use super::common::{scratch, Scratch};
    use hytra_txn::config_store::etcd::LocalEtcd;
    use std::net::TcpListener;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Output, Stdio};
    use std::time::{Duration, Instant};

    fn hytra() -> Command {
        Command::new(env!("CARGO_BIN_EXE_hytra"))
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// A three-node SmallBank cluster file.
    fn cluster_file(
        name: &str,
        token: &str,
        transports: &str,
        seconds: f64,
        timeout_s: u64,
    ) -> Scratch {
        let smallbank = ("smallbank", &["--accounts-per-worker", "2000", "--check"][..]);
        workload_file(name, token, transports, seconds, timeout_s, smallbank)
    }

    /// A three-node cluster file running `workload` with `bench_args`.
    fn workload_file(
        name: &str,
        token: &str,
        transports: &str,
        seconds: f64,
        timeout_s: u64,
        (workload, bench_args): (&str, &[&str]),
    ) -> Scratch {
        let port = free_port();
        let bench_args: Vec<String> = bench_args.iter().map(|a| format!("{a:?}")).collect();
        let mut text = format!(
            "token = \"{token}\"\ntransports = \"{transports}\"\nworkload = \"{workload}\"\n\
         workers = 1\ncoroutines = 4\nreplication = 3\nseconds = {seconds}\n\
         timeout_s = {timeout_s}\nbench_args = [{}]\n",
            bench_args.join(", ")
        );
        for i in 0..3 {
            text += &format!("[[nodes]]\nhost = \"127.0.0.1\"\nport = {}\n", port + i);
        }
        let path = scratch(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Waits for a child at most `limit`, killing it after that.
    fn wait_bounded(mut c: Child, limit: Duration) -> Output {
        let started = Instant::now();
        while c.try_wait().unwrap().is_none() {
            if started.elapsed() > limit {
                c.kill().unwrap();
                panic!("process still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_with_output().unwrap()
    }

    /// Runs `hytra cluster` on `file` (JSON report to `json`) for at most `limit`.
    fn run_cluster(file: &Path, json: &Path, limit: Duration) -> Output {
        let c = hytra()
            .args(["cluster", "--config"])
            .arg(file)
            .arg("--json")
            .arg(json)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_bounded(c, limit)
    }

    /// Starts `hytra node --id id` of `file`, its errors piped.
    fn node(file: &Path, id: u16) -> Child {
        hytra()
            .args(["node", "--config"])
            .arg(file)
            .args(["--id", &id.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn json_of(path: &Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// Runs `hytra cluster` on `file` for at most `limit` and checks that it succeeded,
    /// serializable, with the workload's invariant holding and more than `committed_min`
    /// commits; returns its output and JSON report.
    fn run_checked(
        file: &Path,
        limit: Duration,
        committed_min: u64,
    ) -> (String, serde_json::Value) {
        let json = file.with_extension("json");
        let out = run_cluster(file, &json, limit);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let v = json_of(&json);
        assert_eq!(v["checker"]["serializable"], true, "{v}");
        assert_eq!(v["invariant_ok"], true, "{v}");
        assert!(v["committed"].as_u64().unwrap() > committed_min, "{v}");
        (stdout, v)
    }

    fn three_processes_run_smallbank_correctly(transports: &str) {
        let file = cluster_file(&format!("ok-{transports}.toml"), "t0k", transports, 0.5, 30);
        let (stdout, v) = run_checked(&file, Duration::from_secs(120), 100);
        assert!(stdout.contains("smallbank on ucx"), "{stdout}");
        assert_eq!(v["nodes"], 3);
        // The file names no design: DrTM+H, with every phase on RPCs where only TCP joins
        // the nodes (and passive ACK either way).
        assert_eq!(v["design"], "drtmh", "{v}");
        let c = &v["config"];
        let phases = [&c["exec"], &c["lock"], &c["validate"], &c["log"], &c["commit"]];
        assert_eq!(c["passive_ack"], true, "{c}");
        if transports == "tcp" {
            let two = ["two-sided", "at-execution", "two-sided", "two-sided", "two-sided"];
            assert_eq!(phases, two, "{c}");
            assert_eq!(c["cache_bytes"], 0, "{c}");
        } else {
            assert_eq!(
                phases,
                ["hybrid", "one-sided", "one-sided", "one-sided", "one-sided"],
                "{c}"
            );
            // Every node backs up every partition (3 copies on 3 nodes), so each location
            // cache starts with every remote record's address, learned from its own replicas.
            assert_eq!(v["location_cache"]["misses"], 0, "{}", v["location_cache"]);
            assert!(v["location_cache"]["hits"].as_u64().unwrap() > 100, "{}", v["location_cache"]);
        }
    }

    #[test]
    fn three_processes_over_shared_memory() {
        three_processes_run_smallbank_correctly("sm");
    }

    #[test]
    fn three_processes_over_tcp() {
        three_processes_run_smallbank_correctly("tcp");
    }

    /// Threads that sleep on UCX's events when idle lose nothing: YCSB with ten
    /// operations per transaction (their reads sent together) over TCP, serializable, every
    /// update counted, and the nodes did sleep and were woken by what arrived.
    #[test]
    fn three_processes_waiting_on_events_over_tcp() {
        let ycsb = ("ycsb", &["--ops-per-txn", "10", "--zipf-theta", "0.6", "--check"][..]);
        let file = workload_file("event.toml", "t0k", "tcp", 0.5, 60, ycsb);
        let text = std::fs::read_to_string(&file)
            .unwrap()
            .replace("workers = 1\n", "workers = 1\nwait = \"event\"\n");
        std::fs::write(&file, text).unwrap();
        let (stdout, v) = run_checked(&file, Duration::from_secs(120), 50);
        assert!(stdout.contains("(tcp, wait event)"), "{stdout}");
        assert_eq!(v["ucx"]["wait"], "event", "{v}");
        let (sleeps, wakeups) = (
            v["ucx"]["event_sleeps"].as_u64().unwrap(),
            v["ucx"]["event_wakeups"].as_u64().unwrap(),
        );
        assert!(sleeps > 0 && wakeups > 0, "{}", v["ucx"]);
    }

    /// TPC-C's tables are sized for every row its inserts could add; node 0 checks the
    /// cluster from the replicas the others send it, which must carry only what was written.
    #[test]
    fn three_processes_run_tpcc_correctly() {
        let tpcc = ("tpcc", &["--customers", "30", "--check"][..]);
        let file = workload_file("tpcc.toml", "t0k", "sm", 0.3, 60, tpcc);
        let (stdout, _) = run_checked(&file, Duration::from_secs(180), 50);
        assert!(stdout.contains("replicas equal their primaries: true"), "{stdout}");
    }

    #[test]
    fn a_node_with_a_wrong_token_is_refused() {
        let good = cluster_file("token-good.toml", "right", "sm", 0.2, 4);
        let text = std::fs::read_to_string(&good).unwrap().replace("\"right\"", "\"wrong\"");
        let bad = scratch("token-bad.toml");
        std::fs::write(&bad, text).unwrap();
        let root = node(&good, 0);
        let intruder = node(&bad, 1);
        let refused = wait_bounded(intruder, Duration::from_secs(30));
        let msg = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success());
        assert!(msg.contains("wrong cluster token"), "{msg}");
        // Node 0 gives up on the missing nodes after the file's timeout.
        let root = wait_bounded(root, Duration::from_secs(30));
        let msg = String::from_utf8_lossy(&root.stderr);
        assert!(!root.status.success());
        assert!(msg.contains("did not join"), "{msg}");
    }

    #[test]
    fn killing_a_node_stops_the_others_with_an_error() {
        let file = cluster_file("kill.toml", "k", "sm", 60.0, 30);
        // A store in the file does not help nodes that meet through node 0: node 0 says so.
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, format!("store = \"etcd://127.0.0.1:1\"\n{text}")).unwrap();
        let spawn = |id: u16| node(&file, id);
        let (n0, n1, mut n2) = (spawn(0), spawn(1), spawn(2));
        std::thread::sleep(Duration::from_secs(2));
        n2.kill().unwrap();
        n2.wait().unwrap();
        for (id, c) in [(0, n0), (1, n1)] {
            let out = wait_bounded(c, Duration::from_secs(20));
            let msg = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "node {id} succeeded without node 2");
            assert!(msg.contains("closed its connection"), "node {id}: {msg}");
            assert_eq!(msg.contains("the file's store is not used"), id == 0, "node {id}: {msg}");
        }
    }

    /// Clusters that lose a node run one at a time, their threads sleeping on UCX's
    /// events: processes polling on two cores beside other clusters starve each other's
    /// lease renewals.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A four-node SmallBank cluster loses node `victim` to SIGKILL mid-run: the others
    /// remove it (leases of a second), go on, and check the whole history, the dead
    /// node's part from its journal; nothing acknowledged is lost.
    fn a_killed_node_is_survived(
        transports: &str,
        design: Option<&str>,
        victim: u16,
        etcd: Option<&LocalEtcd>,
    ) {
        let kill = format!("{victim}@1.0");
        let picked = a_killed_node_is_survived_with(transports, design, &kill, etcd);
        assert_eq!(picked, victim);
    }

    /// [`a_killed_node_is_survived`] with `--kill KILL`; returns the node killed. `design`:
    /// the file's, or none (the default for its transports).
    fn a_killed_node_is_survived_with(
        transports: &str,
        design: Option<&str>,
        kill: &str,
        etcd: Option<&LocalEtcd>,
    ) -> u16 {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let name = format!("survive-{transports}-{}.toml", kill.replace('@', "-at-"));
        let smallbank =
            ("smallbank", &["--accounts-per-worker", "2000", "--check", "--lease-ms", "1000"][..]);
        let file = workload_file(&name, "k", transports, 4.0, 30, smallbank);
        let port = free_port();
        let store = etcd.map_or(String::new(), |e| format!("store = \"etcd://{}\"\n", e.client));
        let own = design.map_or(String::new(), |d| format!("design = \"{d}\"\n"));
        let text = std::fs::read_to_string(&file)
            .unwrap()
            .replace("workers = 1\n", &format!("workers = 1\nwait = \"event\"\n{store}{own}"))
            + &format!("[[nodes]]\nhost = \"127.0.0.1\"\nport = {port}\n");
        std::fs::write(&file, text).unwrap();
        let json = file.with_extension("json");
        let c = hytra()
            .args(["cluster", "--kill", kill, "--config"])
            .arg(&file)
            .arg("--json")
            .arg(&json)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let journals = std::env::temp_dir().join(format!("hytra-cluster-{}", c.id()));
        let out = wait_bounded(c, Duration::from_secs(120));
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let victim: u16 = stderr
            .split("killed node ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no node killed: {stderr}"));
        if kill.starts_with("random") {
            assert!(stderr.contains(&format!("picked node {victim} at")), "{stderr}");
        }
        assert!(stdout.contains("lost nodes"), "{stdout}");
        let v = json_of(&json);
        assert_eq!(v["design"], design.unwrap_or("drtmh"), "{v}");
        assert_eq!(v["lost_nodes"], serde_json::json!([victim]), "{v}");
        assert_eq!(v["checker"]["serializable"], true, "{v}");
        assert_eq!(v["invariant_ok"], true, "{v}");
        assert!(v["committed"].as_u64().unwrap() > 100, "{v}");
        // The partitions that lost a copy got it back on the survivors.
        assert_eq!(v["replicated"], true, "{v}");
        assert_eq!(v["still_copying"], serde_json::json!([]), "{v}");
        assert!(!journals.exists(), "the launcher left {} behind", journals.display());
        if let Some(e) = etcd {
            assert_eq!(e.keys_under("/hytra/"), Ok(0), "the launcher left its keys in etcd");
        }
        victim
    }

    /// Node 0, the first configuration manager, dies: node 1 takes over and commits the
    /// new configuration to the launcher's store. Over shared memory nothing fails the
    /// survivors' requests to the dead process; they end only because the engine fences
    /// it off (the UCX backend then cuts every endpoint to it).
    #[test]
    fn a_cluster_survives_the_death_of_node_0_over_shared_memory() {
        a_killed_node_is_survived("sm", None, 0, None);
    }

    /// The same with the configurations committed to etcd (started here on 127.0.0.1):
    /// node 1 moves the cluster on by an etcd transaction.
    #[test]
    fn a_cluster_survives_the_death_of_node_0_with_its_configurations_in_etcd() {
        let Some(etcd) = LocalEtcd::start("cluster-kill").unwrap() else {
            eprintln!("no etcd binary (Debian: etcd-server): not run");
            return;
        };
        a_killed_node_is_survived("tcp", None, 0, Some(&etcd));
    }

    /// With `fasst`, so that its protocol (RPCs without passive ACK) meets a dead node too;
    /// the other kills over TCP run the default, `drtmh` on RPCs.
    #[test]
    fn a_cluster_survives_the_death_of_a_node_over_tcp() {
        a_killed_node_is_survived("tcp", Some("fasst"), 2, None);
    }

    /// `--kill random` draws its victim (and the time) from the benchmark's seed and
    /// names it before the run; the survivors carry on as for a chosen one.
    #[test]
    fn a_cluster_survives_the_death_of_a_random_node() {
        a_killed_node_is_survived_with("tcp", None, "random", None);
    }

    /// Processes a test started, killed and reaped when dropped (after a failed assertion
    /// too), and a directory of theirs, removed.
    struct Started {
        procs: Vec<Child>,
        dir: Option<PathBuf>,
    }

    impl Drop for Started {
        fn drop(&mut self) {
            for c in &mut self.procs {
                let _ = c.kill();
                let _ = c.wait();
            }
            if let Some(d) = &self.dir {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }

    /// Starts `hytra hub` on `file`; its messages as they come (the run's start times a
    /// kill), and all of them once it has exited.
    fn start_hub(
        file: &Path,
    ) -> (Child, std::sync::mpsc::Receiver<String>, std::thread::JoinHandle<String>) {
        use std::io::BufRead;
        let mut hub = hytra()
            .args(["hub", "--config"])
            .arg(file)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = std::io::BufReader::new(hub.stderr.take().unwrap());
        let said = std::thread::spawn(move || {
            let mut all = String::new();
            for line in lines.lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                all += &line;
                all.push('\n');
            }
            all
        });
        (hub, rx, said)
    }

    /// Four nodes started by hand (`hytra node --id`, as on four hosts) meet through
    /// `hytra hub`, started after them, their configurations in etcd (started here on
    /// 127.0.0.1); a second hub for the same file is refused without harm. Node 0, the
    /// first configuration manager, dies by SIGKILL mid-run: the others remove it, go on,
    /// and node 1, the lowest survivor, reports the whole history checked, node 0's part
    /// read from the file's journal directory; the hub says who died and leaves no keys.
    #[test]
    fn hand_started_nodes_outlive_a_dead_one_through_a_hub() {
        let Some(etcd) = LocalEtcd::start("hub-kill").unwrap() else {
            eprintln!("no etcd binary (Debian: etcd-server): not run");
            return;
        };
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let smallbank =
            ("smallbank", &["--accounts-per-worker", "2000", "--check", "--lease-ms", "1000"][..]);
        let file = workload_file("hub.toml", "h", "tcp", 4.0, 30, smallbank);
        let journal = scratch("hub-journal");
        let text = std::fs::read_to_string(&file).unwrap().replace(
            "workers = 1\n",
            &format!(
                "workers = 1\nwait = \"event\"\nhub = \"127.0.0.1:{}\"\nstore = \"etcd://{}\"\n\
                 journal = \"{}\"\n",
                free_port(),
                etcd.client,
                journal.display()
            ),
        ) + &format!("[[nodes]]\nhost = \"127.0.0.1\"\nport = {}\n", free_port());
        std::fs::write(&file, text).unwrap();
        let json = file.with_extension("json");
        // Killed and reaped, and the journals removed, however the test ends. The nodes
        // start first and wait for the hub.
        let mut started = Started { procs: Vec::new(), dir: Some(journal.to_path_buf()) };
        for id in 0..4u16 {
            started.procs.push(
                hytra()
                    .args(["node", "--config"])
                    .arg(&file)
                    .args(["--id", &id.to_string(), "--json"])
                    .arg(&json)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
        }
        std::thread::sleep(Duration::from_millis(500));
        let (hub, rx, said) = start_hub(&file);
        started.procs.insert(0, hub);
        let deadline = Instant::now() + Duration::from_secs(90);
        while !rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| panic!("the run never started ({e})"))
            .contains("the run started")
        {}
        // A second hub for the same file is refused without touching the run's keys.
        let second = hytra().args(["hub", "--config"]).arg(&file).output().unwrap();
        let msg = String::from_utf8_lossy(&second.stderr);
        assert_eq!(second.status.code(), Some(1), "{msg}");
        assert!(msg.contains("cannot listen"), "{msg}");
        std::thread::sleep(Duration::from_secs(1));
        // Node 0, the first configuration manager, dies.
        let mut victim = started.procs.remove(1);
        victim.kill().unwrap();
        victim.wait().unwrap();
        let mut outs = Vec::new();
        while started.procs.len() > 1 {
            outs.push(wait_bounded(started.procs.remove(1), Duration::from_secs(120)));
        }
        let hub_out = wait_bounded(started.procs.remove(0), Duration::from_secs(30));
        let hub_said = said.join().unwrap();
        for (id, out) in (1..).zip(&outs) {
            assert!(
                out.status.success(),
                "node {id}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let report = String::from_utf8_lossy(&outs[0].stdout);
        assert!(report.contains("lost nodes"), "node 1 reports: {report}");
        let hub_stdout = String::from_utf8_lossy(&hub_out.stdout);
        assert!(hub_out.status.success(), "{hub_stdout}\n{hub_said}");
        assert!(hub_stdout.contains("nodes [0] died"), "{hub_stdout}");
        let v = json_of(&json);
        assert_eq!(v["lost_nodes"], serde_json::json!([0]), "{v}");
        assert_eq!(v["checker"]["serializable"], true, "{v}");
        assert_eq!(v["invariant_ok"], true, "{v}");
        assert!(v["committed"].as_u64().unwrap() > 100, "{v}");
        assert_eq!(v["replicated"], true, "{v}");
        assert_eq!(etcd.keys_under("/hytra/"), Ok(0), "the hub left its keys in etcd");
    }

    /// Every bad `--kill` is refused before any node starts, in one line with exit 2: a
    /// node the file lacks, a time outside the run, no time, and a benchmark that could
    /// not outlive the death (no `--check`, or two copies).
    #[test]
    fn bad_kills_are_refused_before_anything_starts() {
        let file = cluster_file("kill-bad.toml", "k", "tcp", 2.0, 5);
        let text = std::fs::read_to_string(&file).unwrap();
        let unchecked = scratch("kill-unchecked.toml");
        std::fs::write(&unchecked, text.replace(", \"--check\"", "")).unwrap();
        let two = scratch("kill-two.toml");
        std::fs::write(&two, text.replace("replication = 3", "replication = 2")).unwrap();
        for (kill, file, says) in [
            ("5@1s", &file, "there is no node 5"),
            ("1@3s", &file, "the time must lie in the run"),
            ("1@0", &file, "the time must lie in the run"),
            ("1", &file, "expected NODE@WHEN"),
            ("1@1s", &unchecked, "add \"--check\""),
            ("1@1s", &two, "recovery needs two"),
        ] {
            let started = Instant::now();
            let out =
                hytra().args(["cluster", "--kill", kill, "--config"]).arg(file).output().unwrap();
            let msg = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "--kill {kill}: {msg}");
            assert!(msg.contains(says), "--kill {kill}: {msg}");
            assert_eq!(msg.lines().count(), 1, "one line: {msg}");
            assert!(started.elapsed() < Duration::from_secs(5), "--kill {kill} waited");
        }
    }

    /// What a hub needs is checked before anything waits: a file without `hub` for
    /// `hytra hub`, a file with one for `hytra cluster` (which runs its own), and a
    /// benchmark that could not outlive a node (no `--check`) are refused at once,
    /// with exit 2.
    #[test]
    fn hub_files_are_refused_where_they_cannot_work() {
        let plain = cluster_file("no-hub.toml", "h", "tcp", 1.0, 5);
        let with_hub = |name: &str, check: bool| {
            let text = std::fs::read_to_string(&plain).unwrap().replace(
                "workers = 1\n",
                &format!(
                    "workers = 1\nhub = \"127.0.0.1:{}\"\nstore = \"etcd://127.0.0.1:1\"\njournal = \"{}\"\n",
                    free_port(),
                    scratch("never").display()
                ),
            );
            let text = if check { text } else { text.replace(", \"--check\"", "") };
            let path = scratch(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let hub = with_hub("hub-ok.toml", true);
        let unchecked = with_hub("hub-unchecked.toml", false);
        for (args, file, says) in [
            (&["hub"][..], &plain, "names no hub"),
            (&["cluster"][..], &hub, "hytra cluster runs its own"),
            (&["hub"][..], &unchecked, "add \"--check\""),
        ] {
            let started = Instant::now();
            let c = hytra()
                .args(args)
                .arg("--config")
                .arg(file)
                .stderr(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let out = wait_bounded(c, Duration::from_secs(30));
            let msg = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {msg}");
            assert!(msg.contains(says), "{args:?}: {msg}");
            assert_eq!(msg.lines().count(), 1, "one line: {msg}");
            assert!(started.elapsed() < Duration::from_secs(5), "{args:?} waited");
        }
        assert!(!scratch("never").exists(), "nothing was set up");
    }

    /// A two-node `hytra io` cluster file: node 0 reads node 1's file (a 4 MiB file of the
    /// test's, so that a killed process leaves no generated file behind).
    fn io_file(name: &str, transports: &str, seconds: f64) -> (Scratch, Scratch) {
        let data = scratch(&format!("{name}.dat"));
        std::fs::write(&data, (0..4u32 << 20).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
            .unwrap();
        let port = free_port();
        let mut text = format!(
            "token = \"io\"\ntransports = \"{transports}\"\nworkload = \"io\"\nworkers = 2\n\
         seconds = {seconds}\ntimeout_s = 30\n\
         bench_args = [\"--modes\", \"remote\", \"--engines\", \"pool\", \"--sizes\", \"4096\", \
         \"--depths\", \"8\", \"--file\", \"{}\", \"--warmup\", \"0.1\", \"--buffered\"]\n",
            data.display()
        );
        for i in 0..2 {
            text += &format!("[[nodes]]\nhost = \"127.0.0.1\"\nport = {}\n", port + i);
        }
        let path = scratch(name);
        std::fs::write(&path, text).unwrap();
        (path, data)
    }

    #[test]
    fn two_processes_read_a_file_over_shared_memory() {
        let (file, data) = io_file("io.toml", "sm", 0.5);
        let json = scratch("io.json");
        let out = run_cluster(&file, &json, Duration::from_secs(60));
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{msg}");
        let v = json_of(&json);
        assert_eq!(v["processes"], 2);
        let run = &v["runs"][0];
        assert_eq!(run["mode"], "Remote");
        assert_eq!(run["errors"], 0, "{run}");
        assert!(run["reads"].as_u64().unwrap() > 100, "{run}");
        assert!(run["iops"].as_f64().unwrap() > 0.0, "{run}");
        std::fs::remove_file(data).unwrap();
    }

    /// `--design auto` picks by trials within one process: a cluster file asking for it
    /// is refused by the launcher before any node starts, once, with exit 2.
    #[test]
    fn a_cluster_file_cannot_ask_for_design_auto() {
        let file = cluster_file("auto.toml", "t", "sm", 0.2, 20);
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, format!("design = \"auto\"\n{text}")).unwrap();
        let out = wait_bounded(
            hytra()
                .args(["cluster", "--config"])
                .arg(&file)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
            Duration::from_secs(60),
        );
        let msg = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{msg}");
        assert_eq!(
            msg.matches("--design auto runs its trials within one process").count(),
            1,
            "{msg}"
        );
    }

    #[test]
    fn an_io_cluster_asks_for_one_point() {
        let (file, data) = io_file("io-many.toml", "sm", 0.5);
        let text = std::fs::read_to_string(&file).unwrap().replace("\"4096\"", "\"512,4096\"");
        std::fs::write(&file, text).unwrap();
        let out = hytra().args(["cluster", "--config"]).arg(&file).output().unwrap();
        let msg = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{msg}");
        assert!(msg.contains("one point"), "{msg}");
        std::fs::remove_file(data).unwrap();
    }

    /// `hytra swarm --backend processes` over seeds that kill a node and seeds that do
    /// not: every seed passes every oracle, and no process or file of theirs is left.
    #[test]
    fn a_swarm_of_processes_passes_its_seeds() {
        use hytra_lab::swarm_processes::draw;
        let planted = hytra()
            .args(["swarm", "--backend", "processes", "--plant", "skip-version-bump"])
            .output()
            .unwrap();
        let msg = String::from_utf8_lossy(&planted.stderr);
        assert_eq!((planted.status.code(), msg.lines().count()), (Some(2), 1), "{msg}");
        assert!(msg.contains("not with --backend processes"), "{msg}");
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The first two seeds from 1 with SmallBank or YCSB (the quickest), one killed and
        // one not.
        let quick = |s: &u64| matches!(draw(*s).workload, "smallbank" | "ycsb");
        let killed = (1..).filter(quick).find(|&s| draw(s).kill.is_some()).unwrap();
        let whole = (1..).filter(quick).find(|&s| draw(s).kill.is_none()).unwrap();
        for seed in [killed, whole] {
            let json = scratch(&format!("swarm-processes-{seed}.json"));
            let seed_arg = seed.to_string();
            let (child, _clear) =
                swarm_of_processes(&["--seed", &seed_arg, "--json", json.to_str().unwrap()]);
            let pid = child.id();
            let out = wait_bounded(child, Duration::from_secs(120));
            no_swarm_leftovers(pid);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            assert!(stdout.contains("ok: every oracle passed"), "{stdout}");
            let row: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            assert_eq!(row["passed"], true, "{row}");
            assert!(row["commits"].as_u64().unwrap() > 0, "{row}");
            let kill = draw(seed).kill.map(|k| format!("kill node {}", k.node));
            let said = row["configuration"].as_str().unwrap();
            assert!(said.contains(kill.as_deref().unwrap_or("no kill")), "{said}");
        }
    }

    /// A swarm of processes stopped by SIGINT mid-seed stops that seed's processes, keeps
    /// none of its files, reports what ran, and ends as SIGINT ends a process.
    #[test]
    fn a_stopped_swarm_of_processes_leaves_nothing_running() {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (child, _clear) = swarm_of_processes(&["--seeds", "5", "--keep-going"]);
        let pid = child.id();
        let ours = format!("hytra-swarm-{pid}-");
        // Mid-seed: once its nodes run.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) && processes_with(&ours).is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let running = processes_with(&ours);
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) }, 0);
        let out = wait_bounded(child, Duration::from_secs(30));
        no_swarm_leftovers(pid);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!running.is_empty(), "no node ever ran: {stderr}");
        assert_eq!(out.status.code(), Some(128 + 2), "{stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("swarm: "), "{stderr}");
    }

    /// Stops the node processes the swarm of processes `pid` left running and removes its
    /// seeds' directories and the launcher's journals; returns what it found.
    fn clear_swarm_leftovers(pid: u32) -> (Vec<u32>, Vec<PathBuf>) {
        let (seeds, journals) = (format!("hytra-swarm-{pid}-"), format!("hytra-cluster-{pid}"));
        let nodes = processes_with(&seeds);
        for &p in &nodes {
            // SAFETY: kill(2) on a node process of this test's swarm, found by its command
            // line (the cluster file in the seed's directory).
            unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
        }
        let tmp = std::fs::read_dir(std::env::temp_dir()).unwrap();
        let left: Vec<PathBuf> = tmp
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                name.starts_with(&seeds) || name == journals
            })
            .collect();
        for d in &left {
            let _ = std::fs::remove_dir_all(d);
        }
        (nodes, left)
    }

    /// Asserts that the swarm of processes `pid` (which has ended) left no node running
    /// and neither a seed's directory nor the launcher's journals.
    fn no_swarm_leftovers(pid: u32) {
        let (nodes, left) = clear_swarm_leftovers(pid);
        assert_eq!(nodes, Vec::<u32>::new(), "nodes left running");
        assert!(left.is_empty(), "{left:?} left behind");
    }

    /// `hytra swarm --backend processes ARGS` started, UCX's TCP held to the loopback
    /// device, with what clears its leftovers when dropped.
    fn swarm_of_processes(args: &[&str]) -> (Child, SwarmLeftovers) {
        let child = hytra()
            .args(["swarm", "--backend", "processes"])
            .args(args)
            .env("UCX_NET_DEVICES", "lo")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let clear = SwarmLeftovers(child.id());
        (child, clear)
    }

    /// Clears what the swarm of processes it names left when dropped: after a failed
    /// assertion or a timeout too.
    struct SwarmLeftovers(u32);

    impl Drop for SwarmLeftovers {
        fn drop(&mut self) {
            clear_swarm_leftovers(self.0);
        }
    }

    /// The processes whose command line holds `text`.
    fn processes_with(text: &str) -> Vec<u32> {
        let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
        procs
            .flatten()
            .filter_map(|e| {
                let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                String::from_utf8_lossy(&cmd).contains(text).then_some(pid)
            })
            .collect()
    }

    #[test]
    fn killing_the_requester_stops_the_owner_with_an_error() {
        let (file, data) = io_file("io-kill.toml", "sm", 60.0);
        let spawn = |id: u16| node(&file, id);
        let (mut requester, owner) = (spawn(0), spawn(1));
        std::thread::sleep(Duration::from_secs(2));
        requester.kill().unwrap();
        requester.wait().unwrap();
        let out = wait_bounded(owner, Duration::from_secs(20));
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the owner succeeded without its requester");
        assert!(msg.contains("closed its connection"), "{msg}");
        std::fs::remove_file(data).unwrap();
    }
}

/// Stands for the tests of this file in a build without the `ucx` feature, so that
/// the test output says they were not built.
#[cfg(not(feature = "ucx"))]
#[test]
#[ignore = "the ucx backend is not in this build: install libucx-dev and run `cargo test --features ucx`"]
fn not_built() {}
