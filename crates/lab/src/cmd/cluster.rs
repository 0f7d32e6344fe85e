//! A cluster file's command, and `hytra cluster --kill`: the `hytra bench` or `hytra io`
//! options a cluster file stands for, parsed as the command line's are, and whether a
//! benchmark can outlive a dead node.

use std::path::Path;
use std::time::Duration;

use crate::cluster_file::{self, ClusterFile, FileDesign};
use crate::cmd::bench::BenchArgs;
use crate::cmd::io::IoArgs;
use crate::cmd::{parse, usage, Usage};
use crate::launch::Kill;
use crate::span::Span;

/// Reads and checks a cluster file; every message names the file.
pub fn read_file(path: &Path) -> Result<ClusterFile, Usage> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Usage(format!("cannot read {}: {e}", path.display())))?;
    cluster_file::parse(&text).map_err(|e| Usage(format!("{}: {e}", path.display())))
}

/// What a cluster file runs.
#[derive(Debug)]
pub enum Job {
    /// `hytra bench`, with these options.
    Bench(Box<BenchArgs>),
    /// `hytra io` (the file's workload `io`), with these options.
    Io(Box<IoArgs>),
}

/// The command `f` runs, with its JSON report to `json`.
pub fn job(f: &ClusterFile, json: Option<&Path>) -> Result<Job, Usage> {
    match f.workload.as_str() {
        "io" => io_args(f, json).map(|a| Job::Io(Box::new(a))),
        _ => bench_args(f, json).map(|a| Job::Bench(Box::new(a))),
    }
}

/// The `hytra io` arguments of a cluster file whose workload is `io`.
fn io_args(f: &ClusterFile, json: Option<&Path>) -> Result<IoArgs, Usage> {
    let connections = ("connections", f.workers.to_string());
    parse_args("io", f, json, vec![connections]).map(|(a, _)| a)
}

/// The `hytra bench` options of [`FileDesign::DrtmhTwoSided`]: every phase on RPCs, and
/// no location cache, which two-sided execution never reads: `fasst`'s configuration,
/// with the preset's passive ACK, which ran SmallBank over TCP at a median 1.12x
/// `fasst`'s rate and YCSB at 1.10x (docs/PERFORMANCE.md §38).
const TWO_SIDED_PHASES: [(&str, &str); 5] = [
    ("exec", "two-sided"),
    ("lock", "at-execution"),
    ("validate", "two-sided"),
    ("log", "two-sided"),
    ("commit", "two-sided"),
];
/// And the location cache it leaves out.
const NO_CACHE: (&str, &str) = ("cache-mib", "0");

/// Whether a file's further options name `option` (`--option value` or `--option=value`).
fn names(bench_args: &[String], option: &str) -> bool {
    bench_args.iter().any(|a| {
        a.strip_prefix("--").map(|n| n.split_once('=').map_or(n, |(k, _)| k)) == Some(option)
    })
}

/// The `hytra bench` arguments a cluster file stands for.
fn bench_args(f: &ClusterFile, json: Option<&Path>) -> Result<BenchArgs, Usage> {
    let design = f.design();
    let mut own = vec![
        ("workload", f.workload.clone()),
        ("design", design.name().to_string()),
        ("nodes", f.node_count().to_string()),
        ("workers", f.workers.to_string()),
    ];
    // A file whose options choose any phase chooses them all: the default's phases mixed
    // with its own could make a combination nobody asked for (locks at execution under
    // one-sided reads, which is refused), so it gets the preset's for the others.
    if design == FileDesign::DrtmhTwoSided
        && !TWO_SIDED_PHASES.iter().any(|(o, _)| names(&f.bench_args, o))
    {
        own.extend(TWO_SIDED_PHASES.iter().map(|&(k, v)| (k, v.to_string())));
        if !names(&f.bench_args, NO_CACHE.0) {
            own.push((NO_CACHE.0, NO_CACHE.1.to_string()));
        }
    }
    own.extend(f.wait.map(|w| ("wait", w.name().to_string())));
    own.extend(f.coroutines.map(|c| ("coroutines", c.to_string())));
    own.extend(f.replication.map(|r| ("replication", r.to_string())));
    parse_args("bench", f, json, own).map(|(a, m)| BenchArgs::given_in(a, &m))
}

/// Parses the options of `hytra <command>` that a cluster file stands for: the backend
/// and transports, `own` (the command's own settings from the file), the measured
/// seconds, the JSON output, then the file's further options.
fn parse_args<T: clap::Args + clap::FromArgMatches>(
    command: &str,
    f: &ClusterFile,
    json: Option<&Path>,
    own: Vec<(&str, String)>,
) -> Result<(T, clap::ArgMatches), Usage> {
    let mut argv: Vec<String> = vec![command.into()];
    let mut push = |k: &str, v: String| {
        argv.push(format!("--{k}"));
        argv.push(v);
    };
    push("backend", "ucx".into());
    push("transports", f.transports.clone());
    for (k, v) in own {
        push(k, v);
    }
    if let Some(s) = f.seconds {
        // Bare seconds, which --duration reads as such.
        push("duration", s.to_string());
    }
    if let Some(j) = json {
        push("json", j.display().to_string());
    }
    argv.extend(f.bench_args.iter().cloned());
    parse::<T>(&argv).map_err(|e| Usage(format!("cluster file: {e}")))
}

/// Stream of `--kill random`'s draw from the benchmark's seed.
const KILL_STREAM: u64 = 0x4B_1110;

/// `--kill NODE@WHEN` or `--kill random[@WHEN]`, checked against the file and its
/// benchmark.
pub fn parse_kill(spec: &str, f: &ClusterFile, args: &BenchArgs) -> Result<Kill, Usage> {
    let nodes = f.nodes.len();
    let seconds = args.duration.map_or(5.0, Span::secs);
    // The draw is made whatever the spec, so that `random` and `random@S` pick the
    // same node.
    let mut rng = hytra_fabric::rng::Rng::derive(args.seed, KILL_STREAM);
    let drawn_at = seconds * (0.25 + 0.35 * rng.below(1_000) as f64 / 1_000.0);
    let drawn_node = rng.below(nodes as u64) as u16;
    let (node, at) = match spec.split_once('@') {
        Some((node, at)) => (node, at.to_string()),
        None if spec == "random" => (spec, format!("{drawn_at:.3}")),
        None => {
            return usage(format!(
                "--kill '{spec}': expected NODE@WHEN, such as 2@1.5s, or random[@WHEN]"
            ))
        }
    };
    let node: u16 = match node {
        "random" => drawn_node,
        n => match n.parse() {
            Ok(n) if usize::from(n) < nodes => n,
            _ => {
                return usage(format!(
                    "--kill '{spec}': there is no node {n} (nodes are 0 to {})",
                    nodes - 1
                ))
            }
        },
    };
    let after = match at.parse::<Span>().map(Span::secs) {
        Ok(t) if t < seconds => Duration::from_secs_f64(t),
        _ => {
            return usage(format!(
                "--kill '{spec}': the time must lie in the run, after 0 and before its {seconds} s"
            ))
        }
    };
    survivable("--kill", args)?;
    Ok(Kill { node, after })
}

/// Whether a benchmark can outlive a dead node (`what` asks it to).
pub fn survivable(what: &str, args: &BenchArgs) -> Result<(), Usage> {
    if !args.check {
        return usage(format!(
            "{what}: the survivors check the dead node's part from its journal, which is kept with --check only: add \"--check\" to bench_args"
        ));
    }
    if args.replication < 3 {
        return usage(format!(
            "{what}: with replication {} a partition would keep {} copy; recovery needs two (a backup's log decides the transactions in doubt)",
            args.replication,
            args.replication.saturating_sub(1)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::bench::DesignPick;
    use hytra_txn::{Design, ExecStrategy, LockStrategy, Primitive};

    fn args(transports: &str, extra: &str) -> BenchArgs {
        let text = format!(
            "token = \"t\"\ntransports = \"{transports}\"\n{extra}\n\
             [[nodes]]\nhost = \"127.0.0.1\"\nport = 7000\n\
             [[nodes]]\nhost = \"127.0.0.1\"\nport = 7001\n"
        );
        let f = cluster_file::parse(&text).unwrap();
        match job(&f, None).unwrap() {
            Job::Bench(a) => *a,
            Job::Io(_) => panic!("a smallbank file runs hytra bench"),
        }
    }

    fn phases(a: &BenchArgs) -> [Option<String>; 5] {
        [
            a.exec.map(|e| e.name().to_string()),
            a.lock.map(|l| l.name().to_string()),
            a.validate.map(|p| p.name().to_string()),
            a.log.map(|p| p.name().to_string()),
            a.commit.map(|p| p.name().to_string()),
        ]
    }

    #[test]
    fn over_tcp_alone_the_default_runs_every_phase_on_rpcs() {
        let tcp = args("tcp", "");
        assert_eq!(tcp.design, DesignPick::Preset(Design::DrtmH));
        assert_eq!(tcp.exec, Some(ExecStrategy::TwoSided));
        assert_eq!(tcp.lock, Some(LockStrategy::AtExecution));
        let two = Some(Primitive::TwoSided);
        assert_eq!([tcp.validate, tcp.log, tcp.commit], [two; 3]);
        assert_eq!(tcp.passive_ack, None, "the preset's: on");
        assert_eq!(tcp.cache_mib, Some(0));
        for (name, value) in TWO_SIDED_PHASES {
            assert!(tcp.given.iter().any(|g| g == name), "--{name} {value} counts as given");
        }
        // Shared memory, or a design of the file's own: the preset's phases and cache.
        let sm = args("sm", "");
        assert_eq!(sm.design, DesignPick::Preset(Design::DrtmH));
        assert_eq!((phases(&sm), sm.cache_mib), ([None, None, None, None, None], None));
        let own = args("tcp", "design = \"farm\"");
        assert_eq!(own.design, DesignPick::Preset(Design::Farm));
        assert_eq!((phases(&own), own.cache_mib), ([None, None, None, None, None], None));
        // A cache the file asks for is its own (two-sided execution leaves it unread).
        let cached = args("tcp", "bench_args = [\"--cache-mib\", \"64\"]");
        assert_eq!((cached.exec, cached.cache_mib), (Some(ExecStrategy::TwoSided), Some(64)));
    }

    #[test]
    fn a_file_that_chooses_a_phase_chooses_them_all() {
        for extra in ["\"--log\", \"one-sided\"", "\"--exec=hybrid\""] {
            let a = args("tcp", &format!("bench_args = [{extra}]"));
            assert_eq!(a.design, DesignPick::Preset(Design::DrtmH), "{extra}");
            let set = phases(&a).iter().filter(|p| p.is_some()).count();
            assert_eq!(set, 1, "{extra}: only its own phase is set");
            assert_eq!(a.cache_mib, None, "{extra}: the preset's cache, which it may read");
        }
        // Other options leave the default's phases: without passive ACK, this is fasst.
        let a = args("tcp", "bench_args = [\"--passive-ack\", \"off\"]");
        assert_eq!(phases(&a).iter().filter(|p| p.is_some()).count(), 5);
        assert_eq!((a.exec, a.cache_mib), (Some(ExecStrategy::TwoSided), Some(0)));
        // An option's value is not an option.
        assert!(!names(&["--log".into(), "exec".into()], "exec"));
        assert!(names(&["--exec=two-sided".into()], "exec"));
        assert!(!names(&["--execute".into()], "exec"));
    }
}
