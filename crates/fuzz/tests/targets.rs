//! A short run of every fuzz target (fixed seeds: the same executions every time), and
//! checks that the runner catches what it must: a panic, an allocation over the bound.

use hytra_fuzz::alloc::{self, CountingAlloc};
use hytra_fuzz::{execute, fuzz, targets, Problem, Target, ALLOC_BYTES_MAX};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Executions per target in a test run.
const EXECS: u64 = 50_000;

fn short_run(name: &str) {
    assert!(alloc::installed());
    let t = targets::find(name).unwrap_or_else(|| panic!("no target {name}"));
    if let Err(failure) = fuzz(&t, 1, EXECS) {
        panic!("{failure}");
    }
}

macro_rules! short_runs {
    ($($test:ident: $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                short_run($name);
            }
        )*

        #[test]
        fn every_target_has_a_short_run() {
            let tested = [$($name),*];
            for t in targets::all() {
                assert!(tested.contains(&t.name), "target {} has no test", t.name);
            }
        }
    };
}

short_runs! {
    rpc_frames: "rpc-frames",
    txn_record_req: "txn-record-req",
    txn_record_reply: "txn-record-reply",
    txn_commit_req: "txn-commit-req",
    txn_log_msg: "txn-log-msg",
    txn_reclaim: "txn-reclaim",
    txn_log_apply: "txn-log-apply",
    replica_image: "replica-image",
    io_read_req: "io-read-req",
    io_done: "io-done",
    io_trace: "io-trace",
    offload_words: "offload-words",
    offload_answer: "offload-answer",
    wqe: "wqe",
    results_part: "results-part",
    cluster_file: "cluster-file",
}

fn no_seeds() -> Vec<Vec<u8>> {
    vec![vec![1, 2, 3]]
}

#[test]
fn a_panic_fails_the_run_with_what_replays_it() {
    let t = Target {
        name: "panics-on-0xff",
        about: "test",
        seeds: no_seeds,
        run: |b| assert!(!b.contains(&0xff), "found 0xff"),
    };
    let failure = fuzz(&t, 3, 100_000).expect_err("0xff is an interesting byte");
    assert!(matches!(&failure.problem, Problem::Panic(m) if m.contains("found 0xff")));
    assert!(failure.input.contains(&0xff));
    assert!(fuzz(&t, 3, failure.index).is_ok(), "the executions before it pass");
    let again = fuzz(&t, 3, failure.index + 1).unwrap_err();
    assert_eq!(again, failure, "the run replays");
    let text = failure.to_string();
    assert!(text.contains("--target panics-on-0xff --input ") && text.contains("--seed 3"));
}

#[test]
fn an_allocation_over_the_bound_fails_the_run() {
    let t = Target {
        name: "trusts-a-length",
        about: "test",
        seeds: no_seeds,
        run: |b| {
            let n = u64::from_le_bytes(b.get(..8).map_or([0; 8], |w| w.try_into().unwrap()));
            if n < 1 << 31 {
                std::hint::black_box(Vec::<u8>::with_capacity(n as usize));
            }
        },
    };
    let big = (ALLOC_BYTES_MAX + 1).to_le_bytes();
    assert!(
        matches!(execute(&t, &big, 0), Err(Problem::Alloc(u)) if u.largest_bytes > ALLOC_BYTES_MAX)
    );
    assert!(execute(&t, &[0; 8], 0).is_ok());
}
