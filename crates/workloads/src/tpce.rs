//! TPC-E's Customer-Position, the distributed read-only transaction of DrTM+H §5.5: a
//! customer, their accounts, each account's holdings, and the last-trade price of every
//! security held, read and validated. Tables follow TPC-E's ratios, scaled: 1 to 10
//! accounts per customer (5 on average), up to 10 holdings per account, 685 securities
//! per 1000 customers. A customer's rows live on one node; last-trade rows are spread
//! over all nodes, so the prices are remote reads.
//!
//! A share of the transactions (a Market-Feed-like writer) moves prices, so that the
//! read-only transactions' validation has something to catch. The oracle: the sum of
//! prices equals the loaded sum plus the committed moves, and holdings are unchanged.

use std::rc::Rc;

use hytra_fabric::rng::Rng;
use hytra_fabric::{ClusterShape, Endpoint};
use hytra_rt::Worker;
use hytra_store::{Fill, IndexLayout, Partitioner, StoreError, TableId, TableSpec};
use hytra_txn::{Abort, Engine, Rec, Txn, TxnCtx, WorkerTxn};

use crate::bench::{check_replicas, spawn_clients, ClientPlan, InvariantReport, Workload};
use crate::tally::{run_counted, Tallies, Tally};

/// Customer: accounts, tier, then name/tax id words.
pub const CUSTOMER: TableId = TableId(0);
/// Customer account: holdings, balance.
pub const ACCOUNT: TableId = TableId(1);
/// Holding summary: symbol, quantity.
pub const HOLDING: TableId = TableId(2);
/// Last trade: price (in hundredths), open price, volume.
pub const LAST_TRADE: TableId = TableId(3);

/// Transaction names, in type-id order.
pub const TYPES: [&str; 2] = ["customer_position", "market_feed"];
const CP: u8 = 0;
const MF: u8 = 1;

const ACCOUNTS_MAX: u64 = 10;
const HOLDINGS_MAX: u64 = 10;

/// Parameters.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TpceParams {
    /// Customers per worker thread.
    pub customers_per_worker: u64,
    /// Percentage of transactions that move prices (the rest are Customer-Position).
    pub market_feed_pct: u64,
    /// Seed of the initial data.
    pub seed: u64,
}

impl TpceParams {
    /// 1000 customers per worker, 10% price moves.
    pub fn standard(seed: u64) -> TpceParams {
        TpceParams { customers_per_worker: 1000, market_feed_pct: 10, seed }
    }
}

/// The workload.
#[derive(Debug)]
pub struct Tpce {
    /// Its parameters.
    pub params: TpceParams,
    /// Sum of prices and of quantities after the last load.
    loaded: std::sync::Mutex<(u64, u64)>,
}

impl Tpce {
    /// The workload with `params`.
    pub fn new(params: TpceParams) -> Tpce {
        Tpce { params, loaded: std::sync::Mutex::new((0, 0)) }
    }

    fn customers(&self, shape: ClusterShape) -> u64 {
        self.params.customers_per_worker * shape.workers_total() as u64
    }

    fn securities(&self, shape: ClusterShape) -> u64 {
        (self.customers(shape) * 685 / 1000).max(1)
    }
}

fn account_key(c: u64, k: u64) -> u64 {
    c * ACCOUNTS_MAX + k
}

fn holding_key(account: u64, j: u64) -> u64 {
    account * HOLDINGS_MAX + j
}

/// A worker's client state.
pub struct ClientState {
    customers: u64,
    securities: u64,
    mf_pct: u64,
    tally: Rc<Tallies<u64>>,
}

/// What a worker's clients committed (and left in doubt): the sum of the price moves.
pub type TpceReport = Tally<u64>;

async fn client<E: Endpoint>(
    mut ctx: TxnCtx<E>,
    mut rng: Rng,
    plan: ClientPlan,
    st: Rc<ClientState>,
) {
    let mut scratch = Scratch::default();
    let mut moves = Vec::new();
    while plan.running(&ctx) {
        let ty = if rng.below(100) < st.mf_pct { MF } else { CP };
        let customer = rng.below(st.customers);
        moves.clear();
        if ty == MF {
            // A feed of 5-20 ticker updates, each a small rise.
            for _ in 0..5 + rng.below(16) {
                moves.push((rng.below(st.securities), 1 + rng.below(100)));
            }
            moves.sort_unstable();
            moves.dedup_by_key(|m| m.0);
        }
        run_counted(&mut ctx, &mut rng, ty, plan.retries_max, &st.tally, async |t| {
            if ty == CP {
                customer_position(t, customer, &mut scratch).await.map(|_| 0)
            } else {
                market_feed(t, &moves).await
            }
        })
        .await;
    }
}

/// Buffers a client reuses across Customer-Positions.
#[derive(Default)]
struct Scratch {
    keys: Vec<(TableId, u64)>,
    recs: Vec<Rec>,
    /// (symbol, quantity) of each holding.
    holdings: Vec<(u64, u64)>,
}

/// Frame 1 of Customer-Position: the customer's total assets.
async fn customer_position<E: Endpoint>(
    t: &mut Txn<'_, E>,
    c: u64,
    scratch: &mut Scratch,
) -> Result<u64, Abort> {
    let Scratch { keys, recs, holdings } = scratch;
    let cr = t.read(CUSTOMER, c).await?;
    let accounts = t.get(cr)[0];
    keys.clear();
    keys.extend((0..accounts).map(|k| (ACCOUNT, account_key(c, k))));
    t.read_all(keys, false, recs).await?;
    let counts: Vec<u64> = recs.iter().map(|&r| t.get(r)[0]).collect();
    keys.clear();
    for (k, n) in counts.into_iter().enumerate() {
        keys.extend((0..n).map(|j| (HOLDING, holding_key(account_key(c, k as u64), j))));
    }
    t.read_all(keys, false, recs).await?;
    holdings.clear();
    holdings.extend(recs.iter().map(|&r| (t.get(r)[0], t.get(r)[1])));
    // The prices, on every node: one read each, all at once.
    keys.clear();
    keys.extend(holdings.iter().map(|&(symbol, _)| (LAST_TRADE, symbol)));
    t.read_all(keys, false, recs).await?;
    let assets = holdings.iter().zip(recs.iter()).map(|(&(_, qty), &r)| qty * t.get(r)[0]).sum();
    Ok(assets)
}

/// Raises the last-trade prices of `moves`; returns the sum of the rises.
async fn market_feed<E: Endpoint>(t: &mut Txn<'_, E>, moves: &[(u64, u64)]) -> Result<u64, Abort> {
    let mut total = 0;
    for &(symbol, rise) in moves {
        let r = t.read_for_update(LAST_TRADE, symbol).await?;
        let row = t.update(r);
        row[0] += rise;
        row[2] += 100;
        total += rise;
    }
    Ok(total)
}

impl Workload for Tpce {
    type State = Rc<ClientState>;
    type Report = TpceReport;

    fn name(&self) -> &'static str {
        "tpce-cp"
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn validate(&self, _shape: ClusterShape) -> Result<(), String> {
        if self.params.customers_per_worker == 0 {
            return Err("tpce-cp: at least one customer per worker is needed".into());
        }
        if self.params.market_feed_pct > 100 {
            return Err(format!(
                "tpce-cp: the market-feed percentage must be in 0..=100, not {}",
                self.params.market_feed_pct
            ));
        }
        Ok(())
    }

    fn tables(&self, shape: ClusterShape) -> Vec<TableSpec> {
        let per_node = self.customers(shape).div_ceil(u64::from(shape.nodes)) + 1;
        let grouped = |id, name: &str, words, group| TableSpec {
            id,
            name: name.into(),
            payload_words: words,
            capacity: per_node * group,
            // A customer's accounts and holdings stay with the customer.
            partitioner: Partitioner::Range { keys_per_partition: group },
            index: IndexLayout::Sequential,
            fill: Fill::Dense,
        };
        vec![
            grouped(CUSTOMER, "customer", 6, 1),
            grouped(ACCOUNT, "customer_account", 3, ACCOUNTS_MAX),
            grouped(HOLDING, "holding_summary", 2, ACCOUNTS_MAX * HOLDINGS_MAX),
            TableSpec {
                id: LAST_TRADE,
                name: "last_trade".into(),
                payload_words: 3,
                capacity: self.securities(shape).div_ceil(u64::from(shape.nodes)) + 1,
                partitioner: Partitioner::Modulo,
                index: IndexLayout::Sequential,
                fill: Fill::Dense,
            },
        ]
    }

    fn load(&self, engine: &Engine, shape: ClusterShape) -> Result<(), StoreError> {
        let mut rng = Rng::derive(self.params.seed, 0x7E_0001);
        let securities = self.securities(shape);
        let mut price_sum = 0;
        for s in 0..securities {
            let price = 1_000 + rng.below(99_000);
            price_sum += price;
            engine.load(LAST_TRADE, s, &[price, price, 0])?;
        }
        let mut qty_sum = 0;
        for c in 0..self.customers(shape) {
            let accounts = 1 + rng.below(ACCOUNTS_MAX);
            engine.load(CUSTOMER, c, &[accounts, 1 + rng.below(3), rng.next_u64(), 0, 0, 0])?;
            for k in 0..accounts {
                let n = 1 + rng.below(HOLDINGS_MAX);
                let account = account_key(c, k);
                engine.load(ACCOUNT, account, &[n, rng.below(1 << 30), 0])?;
                for j in 0..n {
                    let qty = 100 * (1 + rng.below(50));
                    qty_sum += qty;
                    engine.load(HOLDING, holding_key(account, j), &[rng.below(securities), qty])?;
                }
            }
        }
        *self.loaded.lock().expect("no loader panicked") = (price_sum, qty_sum);
        Ok(())
    }

    fn spawn<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        wt: &Rc<WorkerTxn>,
        plan: ClientPlan,
    ) -> Rc<ClientState> {
        let shape = w.co().shape();
        let st = Rc::new(ClientState {
            customers: self.customers(shape),
            securities: self.securities(shape),
            mf_pct: self.params.market_feed_pct,
            tally: Tallies::new(plan.coroutines),
        });
        spawn_clients(w, wt, plan, |ctx, rng| client(ctx, rng, plan, st.clone()));
        st
    }

    fn report(&self, st: Rc<ClientState>) -> TpceReport {
        st.tally.report()
    }

    fn check(&self, engine: &Engine, reports: &[TpceReport]) -> InvariantReport {
        let (prices0, qty0) = *self.loaded.lock().expect("no loader panicked");
        let moved = Tally::total(reports, engine);
        let sum = |table: TableId, word: usize| {
            let mut total = 0;
            let mut p = vec![0u64; usize::from(engine.catalog.spec(table).payload_words)];
            for primary in engine.primaries(table) {
                for (off, key) in primary.records() {
                    primary.read(off, key, &mut p).expect("no writer after the run");
                    total += p[word];
                }
            }
            total
        };
        let (prices, qty) = (sum(LAST_TRADE, 0), sum(HOLDING, 1));
        let mut details = vec![
            format!("prices: {prices}, expected {} ({prices0} + {moved} moved)", prices0 + moved),
            format!("holdings: {qty} shares, loaded {qty0}"),
        ];
        let (replicas_ok, more) = check_replicas(engine);
        details.extend(more);
        InvariantReport { ok: prices == prices0 + moved && qty == qty0 && replicas_ok, details }
    }
}
