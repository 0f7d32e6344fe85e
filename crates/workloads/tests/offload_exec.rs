//! The `offload` execution strategy end to end: cache misses answered by the primary's
//! NIC keep SmallBank and TPC-C serializable and consistent on both backends that run
//! verb programs; records inserted during a run are filed in the NIC index; lookups
//! that time out fall back to RPC and their slots come back; a NIC without verb
//! programs is refused before the run.

use hytra_fabric::local::{LocalCluster, LocalConfig};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::ClusterShape;
use hytra_rt::RtConfig;
use hytra_txn::{Design, EngineError, ExecStrategy, OffloadError, TxnConfig};
use hytra_workloads::bench::{run, BenchError, BenchParams, BenchResult};
use hytra_workloads::smallbank::SmallBank;
use hytra_workloads::tpcc::{TpcC, TpccMix, TpccParams};

fn shape() -> ClusterShape {
    ClusterShape { nodes: 3, workers_per_node: 2, lanes_per_peer: 1 }
}

fn params(seed: u64) -> BenchParams {
    BenchParams {
        coroutines: 4,
        warmup_ns: 20_000,
        measure_ns: 300_000,
        seed,
        check: true,
        rt: RtConfig { rpc_timeout_ns: 500_000, ..RtConfig::default() },
        drain_ns: 200_000_000,
        // Cold caches: every first read of a remote record is a miss.
        warm_cache: false,
        timeline_ns: 0,
    }
}

fn offload(cache_bytes: u64) -> TxnConfig {
    TxnConfig { exec: ExecStrategy::Offload, cache_bytes, ..TxnConfig::preset(Design::DrtmH) }
}

fn cx5(seed: u64) -> SimCluster {
    let mut cfg = SimConfig::new(shape(), seed);
    cfg.profile = NicProfile::cx5();
    SimCluster::new(cfg).unwrap()
}

fn assert_correct<R>(r: &BenchResult<R>, what: &str) {
    let c = r.checker.as_ref().expect("checked");
    assert!(c.serializable(), "{what}: {:?}", &c.violations[..c.violations.len().min(3)]);
    assert!(r.invariant.ok, "{what}: {:#?}", r.invariant.details);
    assert!(r.stats.commits > 50, "{what}: only {} commits", r.stats.commits);
    assert!(
        r.invariant.details.iter().any(|d| d.starts_with("nic index:")),
        "{what}: the NIC index was not checked: {:?}",
        r.invariant.details
    );
    let s = &r.stats;
    assert!(s.nic_found > 0, "{what}: no lookup was answered by a NIC: {s:?}");
    assert_eq!(s.stale_cache, 0, "{what}: a lookup's answer is checked like a READ");
    assert!(s.nic_found + s.nic_fallbacks + s.nic_timeouts <= s.nic_lookups, "{what}: {s:?}");
}

#[test]
fn offloaded_lookups_keep_smallbank_correct_on_the_simulator() {
    // With a location cache (misses only) and without one (every remote read).
    for cache_bytes in [64 << 20, 0] {
        let bank = SmallBank { accounts_per_worker: 50 };
        let r = run(&mut cx5(1), &bank, offload(cache_bytes), params(1)).unwrap();
        assert_correct(&r, &format!("cache {cache_bytes}"));
        let s = &r.stats;
        // Every miss is a lookup, or an RPC when the slot at that node is taken.
        assert_eq!(s.nic_lookups + s.nic_busy, s.cache_misses, "{s:?}");
        if cache_bytes == 0 {
            assert_eq!(s.cache_hits, 0);
            assert!(s.nic_lookups > 200, "{s:?}");
        }
    }
}

#[test]
fn offloaded_lookups_keep_smallbank_correct_on_threads() {
    let mut b = LocalCluster::new(LocalConfig::new(shape())).unwrap();
    let p = BenchParams {
        warmup_ns: 5_000_000,
        measure_ns: 50_000_000,
        rt: RtConfig { rpc_timeout_ns: 2_000_000_000, ..RtConfig::default() },
        drain_ns: 30_000_000_000,
        ..params(2)
    };
    let r = run(&mut b, &SmallBank { accounts_per_worker: 50 }, offload(0), p).unwrap();
    assert_correct(&r, "local");
}

#[test]
fn records_inserted_by_tpcc_are_filed_and_found() {
    let w = TpcC::new(TpccParams {
        mix: TpccMix::Standard,
        remote_item_pct: 30,
        customers: 60,
        items: 500,
        new_orders_max: 3000,
        ..TpccParams::standard(5)
    });
    let r =
        run(&mut cx5(3), &w, offload(0), BenchParams { measure_ns: 400_000, ..params(3) }).unwrap();
    // The invariant includes the index check: every primary record, the orders and
    // order lines inserted during the run too, is found under its tag.
    assert_correct(&r, "tpcc");
}

/// Tables sized for the rows a long run may insert cost memory only where rows land; the
/// NIC index, whose entries land at random across arrays sized alike, must too (base
/// pages: with huge pages, the load alone made every array resident).
#[test]
fn the_nic_index_costs_the_pages_its_entries_touch() {
    let w = TpcC::new(TpccParams {
        mix: TpccMix::Standard,
        customers: 30,
        items: 100,
        // Room for 1.6 M order lines per district: 3.2 GB of index arrays per node.
        new_orders_max: 100_000,
        ..TpccParams::standard(1)
    });
    let r =
        run(&mut cx5(5), &w, offload(0), BenchParams { measure_ns: 50_000, ..params(5) }).unwrap();
    assert!(r.invariant.ok, "{:#?}", r.invariant.details);
    let line = r.invariant.details.iter().find(|d| d.starts_with("nic index:")).expect("checked");
    if line.ends_with(" bytes mapped") {
        return; // this host cannot tell what is resident
    }
    let (resident, mapped) = line
        .rsplit_once("), ")
        .and_then(|(_, m)| m.strip_suffix(" bytes resident"))
        .and_then(|m| m.split_once(" of "))
        .and_then(|(r, m)| Some((r.parse::<u64>().ok()?, m.parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("no memory in {line}"));
    assert!(mapped > 8 << 30, "{line}");
    assert!(resident < mapped / 16, "{line}");
}

#[test]
fn late_answers_fall_back_to_rpc_and_free_their_slot() {
    // A timeout shorter than an offloaded lookup (about 6 us on cx5): every lookup is
    // late. Reads go by RPC; each slot is used again once its answer has arrived.
    let p = BenchParams {
        rt: RtConfig { rpc_timeout_ns: 4_000, ..RtConfig::default() },
        measure_ns: 1_000_000,
        ..params(4)
    };
    let r = run(&mut cx5(4), &SmallBank { accounts_per_worker: 50 }, offload(0), p).unwrap();
    let s = &r.stats;
    assert!(s.nic_timeouts > 0, "{s:?}");
    // More lookups than slots (2 per coroutine and other node): late slots were reused.
    let slots = u64::from(shape().nodes) * u64::from(shape().workers_per_node) * 4 * 2 * 2;
    assert!(s.nic_lookups > 4 * slots, "{s:?}");
    let c = r.checker.as_ref().expect("checked");
    assert!(c.serializable() && r.invariant.ok, "{:?}", r.invariant.details);
}

#[test]
fn a_nic_without_verb_programs_is_refused() {
    // cx4 models no verb programs.
    let mut b = SimCluster::new(SimConfig::new(shape(), 1)).unwrap();
    let Err(err) = run(&mut b, &SmallBank { accounts_per_worker: 50 }, offload(0), params(1))
    else {
        panic!("a cx4 NIC was given lookup programs")
    };
    match err {
        BenchError::Engine(EngineError::Offload(e @ OffloadError::NoVerbPrograms { .. })) => {
            assert!(e.to_string().contains("cx5"), "{e}")
        }
        other => panic!("wrong error: {other}"),
    }
}

#[test]
fn an_engine_given_no_lookup_programs_refuses_the_offload_strategy() {
    // The engine knows the lookups' layout only; the programs come from its caller.
    use hytra_store::{Catalog, Fill, IndexLayout, Partitioner, TableId, TableSpec};
    use hytra_txn::Engine;
    let table = TableSpec {
        id: TableId(0),
        name: "t".into(),
        payload_words: 1,
        capacity: 64,
        partitioner: Partitioner::Modulo,
        index: IndexLayout::Hashed,
        fill: Fill::Dense,
    };
    let catalog = || Catalog::new(vec![table.clone()], 3, 3).unwrap();
    let mut b = cx5(1);
    let Err(err) = Engine::setup(&mut b, catalog(), offload(1 << 20), 1) else {
        panic!("the offload strategy was set up without programs")
    };
    match err {
        EngineError::Offload(OffloadError::NoPrograms) => {}
        other => panic!("wrong error: {other}"),
    }
    // Given them, the same engine is set up.
    let programs: &dyn hytra_offload::lookup::LookupPrograms = &hytra_offload::lookup::Redn;
    let store = std::sync::Arc::new(hytra_txn::config_store::MemoryStore::default());
    let mut b = cx5(1);
    Engine::setup_with_store(&mut b, catalog(), offload(1 << 20), 1, store, Some(programs))
        .expect("set up with RedN's programs");
}
