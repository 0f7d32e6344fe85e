//! Offloaded, one-sided and two-sided gets return exactly what the CPU lookup returns.

use hytra_offload::bench::{run, Path, Scenario};
use hytra_offload::service::Search;

fn check(path: Path, value_bytes: u32, second_bucket: bool, depth: u32) {
    let mut s = Scenario::latency(path, value_bytes);
    s.second_bucket = second_bucket;
    s.depth = depth;
    s.absent_one_in = 4;
    s.duration_ns = 300_000;
    let o = run(&s).unwrap();
    assert!(o.gets > 20, "{path:?}: only {} gets: {o:?}", o.gets);
    assert_eq!(o.wrong, 0, "{path:?}: wrong answers");
    assert_eq!(o.timeouts, 0, "{path:?} second={second_bucket}: timeouts {o:?}");
    assert!(o.absent > 0 && o.absent < o.gets, "{path:?}: absent {} of {}", o.absent, o.gets);
}

#[test]
fn every_path_answers_like_the_cpu() {
    for path in [
        Path::Offload(Search::Sequential),
        Path::Offload(Search::Parallel),
        Path::OneSided,
        Path::TwoSided,
    ] {
        for second in [false, true] {
            check(path, 64, second, 2);
        }
    }
}

fn check_list(path: Path, len: u32, depth: u32) {
    let mut s = Scenario::list_latency(path, len, len);
    s.depth = depth;
    s.absent_one_in = 4;
    s.duration_ns = 400_000;
    let o = run(&s).unwrap();
    assert!(o.gets > 10, "{path:?} len {len}: only {} gets: {o:?}", o.gets);
    assert_eq!(o.wrong, 0, "{path:?} len {len}: wrong answers");
    assert_eq!(o.timeouts, 0, "{path:?} len {len}: timeouts {o:?}");
    assert!(o.absent > 0 && o.absent < o.gets, "{path:?}: absent {} of {}", o.absent, o.gets);
}

#[test]
fn every_list_path_answers_like_the_cpu() {
    for path in
        [Path::Offload(Search::Sequential), Path::OffloadBreak, Path::OneSided, Path::TwoSided]
    {
        for len in [1, 3, 8] {
            check_list(path, len, 2);
        }
    }
}
