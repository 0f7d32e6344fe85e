//! Bugs that whole runs exposed, each kept as the run that showed it: the last staged
//! write-backs of a coroutine were never collected; transactions reading more than a
//! coroutine's scratch could never commit (and, one read at a time, still could not);
//! a big transaction on a lossy network could
//! never commit either, because one lost datagram ended it.

use hytra_fabric::sim::faults::FaultConfig;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_rt::RtConfig;
use hytra_txn::{AbortReason, Design, TxnConfig};
use hytra_workloads::bench::{run, BenchParams, BenchResult};
use hytra_workloads::ycsb::{KeyDist, Mix, Ycsb, YcsbParams};

fn params(seed: u64) -> BenchParams {
    BenchParams {
        coroutines: 8,
        warmup_ns: 0,
        measure_ns: 1_000_000,
        seed,
        check: true,
        rt: RtConfig::default(),
        drain_ns: 1_000_000_000,
        warm_cache: true,
        timeline_ns: 0,
    }
}

fn ycsb(mix: Mix, records_per_worker: u64, ops_per_txn: u16) -> Ycsb {
    Ycsb::new(YcsbParams {
        records_per_worker,
        ops_per_txn,
        dist: KeyDist::Zipfian(0.6),
        ..YcsbParams::core(mix)
    })
}

fn sim(
    shape: ClusterShape,
    w: &Ycsb,
    cfg: TxnConfig,
    faults: FaultConfig,
) -> BenchResult<<Ycsb as hytra_workloads::bench::Workload>::Report> {
    let mut c = SimConfig::new(shape, 3);
    c.faults = faults;
    run(&mut SimCluster::new(c).unwrap(), w, cfg, params(3)).unwrap()
}

fn assert_correct<R>(r: &BenchResult<R>, what: &str) {
    let c = r.checker.as_ref().expect("checked");
    assert!(c.serializable(), "{what}: {:?}", &c.violations[..c.violations.len().min(3)]);
    assert!(r.invariant.ok, "{what}: {:?}", r.invariant.details);
}

#[test]
fn staged_write_backs_are_collected_when_their_coroutine_ends() {
    // Records of 10 x 96 bytes are too large to inline: their write-backs are staged, and
    // with passive ACK the next commit collects the tickets. The last commit of every
    // coroutine has no next one; its tickets leaked (R5), which the invariant now counts.
    let shape = ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 };
    let cfg = TxnConfig::preset(Design::DrtmH);
    assert!(cfg.passive_ack);
    let r = sim(shape, &ycsb(Mix::A, 2000, 2), cfg, FaultConfig::none());
    assert_correct(&r, "drtmh, passive ACK");
    assert!(r.stats.commits > 100);
    let leaks = r.invariant.details.iter().find(|d| d.starts_with("tickets and calls"));
    assert_eq!(leaks.map(String::as_str), Some("tickets and calls never collected: 0"));
}

#[test]
fn transactions_larger_than_the_scratch_commit() {
    // Ten scans of up to 100 records of 10 x 96 bytes: about a megabyte of READs per
    // transaction, twenty times a coroutine's scratch. They used to abort as "full" at
    // every attempt and give up; now the scratch is reused once the reads in flight land.
    // Without outstanding requests every read lands before the next starts, and the
    // scratch was still never reused: nothing committed (swarm seed 7154).
    let shape = ClusterShape { nodes: 3, workers_per_node: 1, lanes_per_peer: 1 };
    for design in [Design::Farm, Design::DrtmR, Design::DrtmH] {
        for outstanding in [true, false] {
            let cfg = TxnConfig { replication: 1, outstanding, ..TxnConfig::preset(design) };
            let r = sim(shape, &ycsb(Mix::E, 300, 10), cfg, FaultConfig::none());
            let what = format!("{design:?}, outstanding {outstanding}");
            assert_correct(&r, &what);
            assert!(r.stats.commits > 0, "{what}: nothing committed");
            assert_eq!(r.stats.aborts[AbortReason::Full.index_pub()], 0, "{what}");
        }
    }
}

#[test]
fn big_transactions_commit_on_a_lossy_network() {
    // FaSST reads every record by RPC: a scan transaction makes hundreds of calls, and
    // with 5% of datagrams lost, delayed or reordered almost every attempt lost one and
    // aborted. The calls of an attempt are sent again instead.
    let shape = ClusterShape { nodes: 3, workers_per_node: 1, lanes_per_peer: 1 };
    let cfg = TxnConfig { replication: 1, ..TxnConfig::preset(Design::Fasst) };
    let mut c = SimConfig::new(shape, 3);
    c.faults = FaultConfig::lossy(50_000);
    // A scan transaction takes about a millisecond here: a window of several.
    let params = BenchParams { measure_ns: 5_000_000, ..params(3) };
    let r = run(&mut SimCluster::new(c).unwrap(), &ycsb(Mix::E, 300, 4), cfg, params).unwrap();
    assert_correct(&r, "fasst, lossy");
    assert!(r.stats.rpc_resends > 0, "the faults must strike");
    assert!(r.stats.commits > 0, "nothing committed");
}
