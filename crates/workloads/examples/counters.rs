//! A new workload in one file: what it takes to benchmark your own transactions.
//!
//! Every worker's clients pick two counters, anywhere in the cluster, and increment
//! both in one transaction; one transaction in four only reads four counters. The
//! invariant: the counters sum to twice the committed increments (counted with
//! `run_counted`, which also keeps the attempts a crash leaves to recovery). The run
//! checks the history for serializability and prints what the engine measured.
//!
//! ```text
//! cargo run --release --example counters -- [design] [seed]
//! ```

use std::rc::Rc;

use hytra_fabric::rng::Rng;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{ClusterShape, Endpoint};
use hytra_rt::{RtConfig, Worker};
use hytra_store::{Fill, IndexLayout, Partitioner, StoreError, TableId, TableSpec};
use hytra_txn::{Design, Engine, TxnConfig, TxnCtx, WorkerTxn};
use hytra_workloads::bench::{
    run, spawn_clients, BenchParams, ClientPlan, InvariantReport, Workload,
};
use hytra_workloads::tally::{run_counted, Tallies, Tally};

const COUNTERS: TableId = TableId(0);
const INCREMENT: u8 = 0;
const READ_FOUR: u8 = 1;

struct Counters {
    /// Counters in the whole cluster.
    keys: u64,
}

async fn client<E: Endpoint>(
    mut ctx: TxnCtx<E>,
    mut rng: Rng,
    keys: u64,
    plan: ClientPlan,
    increments: Rc<Tallies<u64>>,
) {
    while plan.running(&ctx) {
        let ty = if rng.below(4) == 0 { READ_FOUR } else { INCREMENT };
        let picks = [rng.below(keys), rng.below(keys), rng.below(keys), rng.below(keys)];
        // The body runs once per attempt (retries back off and rerun it); what it
        // returns, the increments it makes, counts only if the transaction commits.
        run_counted(&mut ctx, &mut rng, ty, plan.retries_max, &increments, async |t| {
            if ty == READ_FOUR {
                // Issued together: their round trips overlap.
                let recs = t.read_many(picks.map(|k| (COUNTERS, k)), false).await?;
                let _sum: u64 = recs.iter().map(|&r| t.get(r)[0]).sum();
                return Ok(0);
            }
            if picks[0] == picks[1] {
                return Ok(0);
            }
            let pair = [(COUNTERS, picks[0]), (COUNTERS, picks[1])];
            for r in t.read_many(pair, true).await? {
                t.update(r)[0] += 1;
            }
            Ok(1)
        })
        .await;
    }
}

impl Workload for Counters {
    type State = Rc<Tallies<u64>>;
    type Report = Tally<u64>;

    fn name(&self) -> &'static str {
        "counters"
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &["increment", "read_four"]
    }

    fn validate(&self, _shape: ClusterShape) -> Result<(), String> {
        if self.keys < 2 {
            return Err("counters needs at least two keys".into());
        }
        Ok(())
    }

    fn tables(&self, shape: ClusterShape) -> Vec<TableSpec> {
        vec![TableSpec {
            id: COUNTERS,
            name: "counters".into(),
            payload_words: 1,
            capacity: self.keys.div_ceil(u64::from(shape.nodes)) + 16,
            partitioner: Partitioner::Modulo,
            index: IndexLayout::Sequential,
            fill: Fill::Dense,
        }]
    }

    fn load(&self, engine: &Engine, _shape: ClusterShape) -> Result<(), StoreError> {
        (0..self.keys).try_for_each(|key| engine.load(COUNTERS, key, &[0]))
    }

    fn spawn<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        wt: &Rc<WorkerTxn>,
        plan: ClientPlan,
    ) -> Rc<Tallies<u64>> {
        let increments = Tallies::new(plan.coroutines);
        let keys = self.keys;
        spawn_clients(w, wt, plan, |ctx, rng| client(ctx, rng, keys, plan, increments.clone()));
        increments
    }

    fn report(&self, state: Rc<Tallies<u64>>) -> Tally<u64> {
        state.report()
    }

    fn check(&self, engine: &Engine, reports: &[Tally<u64>]) -> InvariantReport {
        let expected = 2 * Tally::total(reports, engine);
        let mut total = 0;
        // Every partition's primary, wherever the configuration in force put it.
        for primary in engine.primaries(COUNTERS) {
            for (off, key) in primary.records() {
                let mut v = [0];
                primary.read(off, key, &mut v).expect("no writer after the run");
                total += v[0];
            }
        }
        InvariantReport {
            ok: total == expected,
            details: vec![format!("counters sum to {total}, expected {expected}")],
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let design = args.next().unwrap_or_else(|| "drtmh".into());
    let design = Design::parse(&design).ok_or(format!("unknown design '{design}'"))?;
    let seed = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1);

    let shape = ClusterShape { nodes: 4, workers_per_node: 4, lanes_per_peer: 1 };
    let mut cluster = SimCluster::new(SimConfig::new(shape, seed))?;
    let params = BenchParams {
        coroutines: 8,
        warmup_ns: 100_000,
        measure_ns: 1_000_000,
        seed,
        check: true,
        rt: RtConfig::default(),
        drain_ns: 100_000_000,
        warm_cache: true,
        timeline_ns: 0,
    };
    let workload = Counters { keys: 10_000 };
    let r = run(&mut cluster, &workload, TxnConfig::preset(design), params)?;

    let s = &r.stats;
    let checker = r.checker.as_ref().expect("checked");
    println!("design        {}", design.name());
    println!("throughput    {:.0} txn/s (virtual time)", s.commits as f64 / 1e-3);
    println!("abort rate    {:.2}%", s.abort_rate() * 100.0);
    println!(
        "latency       p50 {:.1} us, p99 {:.1} us",
        s.latency.quantile(0.5) as f64 / 1e3,
        s.latency.quantile(0.99) as f64 / 1e3
    );
    println!("serializable  {} ({} transactions)", checker.serializable(), checker.txns);
    println!("invariant     {} ({})", r.invariant.ok, r.invariant.details.join("; "));
    if !checker.serializable() || !r.invariant.ok {
        return Err("correctness check failed".into());
    }
    Ok(())
}
