//! TPC-C (revision 5.11): the five transactions with the standard mix, or New-Order alone
//! with every transaction distributed (DrTM+H's TPC-C/no), one warehouse per worker,
//! full row layouts, and the consistency conditions 1-4 of clause 3.3.2 as the oracle.
//!
//! - `schema`: tables, keys, row layouts
//! - `load`: population (clause 4.3.3), NURand, the customer name index
//! - `txns`: the transactions

pub mod load;
pub mod schema;
pub mod txns;

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use hytra_fabric::rng::Rng;
use hytra_fabric::{ClusterShape, Endpoint};
use hytra_rt::Worker;
use hytra_store::{Catalog, StoreError, TableSpec};
use hytra_txn::{Engine, TxnCtx, WorkerTxn};

use crate::bench::{check_replicas, spawn_clients, ClientPlan, InvariantReport, Workload};
use crate::tally::{run_counted, Tallies, Tally};
use load::{initial_history, load_warehouse, Items, NameIndex, NameIndexBuilder, NuRand};
use schema::*;
use txns::{draw, Effect, Env, Mix, Scratch};

pub use txns::Mix as TpccMix;

/// Transaction type names, in type-id order.
pub const TYPES: [&str; 5] = ["new_order", "payment", "order_status", "delivery", "stock_level"];

/// TPC-C's parameters.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TpccParams {
    /// Which transactions run.
    pub mix: Mix,
    /// Percentage of New-Order lines supplied by another warehouse (1 in the
    /// specification; in the New-Order-only mix, at least one line per transaction is
    /// remote whatever this says).
    pub remote_item_pct: u64,
    /// Warehouses each worker is home to (each coroutine serves one of them).
    pub warehouses_per_worker: u64,
    /// Customers per district (3000 in the specification).
    pub customers: u64,
    /// Items (100 000 in the specification).
    pub items: u64,
    /// Orders a district can take during the run, beyond its initial ones.
    pub new_orders_max: u64,
    /// Seed of the initial data.
    pub seed: u64,
}

impl TpccParams {
    /// The specification's scale and mix.
    pub fn standard(seed: u64) -> TpccParams {
        TpccParams {
            mix: Mix::Standard,
            remote_item_pct: 1,
            warehouses_per_worker: 1,
            customers: 3000,
            items: 100_000,
            new_orders_max: 100_000,
            seed,
        }
    }

    /// DrTM+H's TPC-C/no: New-Order only, always distributed.
    pub fn new_order_only(seed: u64) -> TpccParams {
        TpccParams { mix: Mix::NewOrderOnly, ..TpccParams::standard(seed) }
    }
}

/// The TPC-C workload.
pub struct TpcC {
    /// Its parameters.
    pub params: TpccParams,
    /// What the last load built (a workload may be run, and so loaded, several times).
    built: Mutex<Option<Arc<Built>>>,
}

impl std::fmt::Debug for TpcC {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpcC").field("params", &self.params).finish_non_exhaustive()
    }
}

/// What loading builds besides the tables.
struct Built {
    items: Arc<Items>,
    /// Per partition, its customer name index.
    names: Vec<Arc<NameIndex>>,
    /// Per node, the partitions it holds a replica of (primary or backup).
    held: Vec<Vec<bool>>,
    nu: NuRand,
}

/// What one worker's clients committed (warm-up included) and left in doubt, for the
/// oracle.
pub type TpccReport = Tally<Effect>;

impl TpcC {
    /// The workload with `params` (nothing is built until it is loaded).
    pub fn new(params: TpccParams) -> TpcC {
        TpcC { params, built: Mutex::new(None) }
    }

    /// The sizes for a cluster of `shape`.
    pub fn scale(&self, shape: ClusterShape) -> Scale {
        self.scale_for(u64::from(shape.workers_per_node) * self.params.warehouses_per_worker)
    }

    fn scale_for(&self, warehouses_per_node: u64) -> Scale {
        let orders = self.params.customers + self.params.new_orders_max + 1;
        // Every Payment inserts a history row: as many as New-Orders, give or take.
        let history = initial_history_rows(self.params.customers)
            + self.params.new_orders_max * DISTRICTS * 2;
        Scale {
            warehouses_per_node,
            customers: self.params.customers,
            items: self.params.items,
            orders,
            history,
        }
    }

    fn built(&self) -> Arc<Built> {
        let built = self.built.lock().expect("no loader panicked");
        built.clone().expect("the database is loaded before clients start")
    }
}

fn initial_history_rows(customers: u64) -> u64 {
    DISTRICTS * customers
}

/// One client coroutine.
#[allow(clippy::too_many_arguments)]
async fn client<E: Endpoint>(
    mut ctx: TxnCtx<E>,
    mut rng: Rng,
    env: Rc<Env>,
    home: u64,
    terminal_d: u64,
    mix: Mix,
    remote_item_pct: u64,
    plan: ClientPlan,
    state: Rc<ClientState>,
    tally: Rc<Tallies<Effect>>,
) {
    let mut sc = Scratch::default();
    while plan.running(&ctx) {
        let (ty, input) = draw(&mut rng, &env, mix, remote_item_pct, home, terminal_d);
        let history_key = if ty == txns::PAYMENT_TX {
            let n = state.history_next.get();
            state.history_next.set(n + 1);
            (n < env.scale.history).then(|| env.scale.history(home, n))
        } else {
            Some(0)
        };
        let Some(history_key) = history_key else {
            // Out of history rows for this run's sizing: stop issuing Payments.
            continue;
        };
        run_counted(&mut ctx, &mut rng, ty, plan.retries_max, &tally, async |t| {
            txns::run(t, &env, home, &input, history_key, &mut sc).await
        })
        .await;
    }
}

/// A worker's client state: what its clients committed.
pub struct WorkerState(Rc<Tallies<Effect>>);

/// The clients of one home warehouse: its history counter.
#[derive(Default)]
pub struct ClientState {
    history_next: Cell<u64>,
}

impl Workload for TpcC {
    type State = Rc<WorkerState>;
    type Report = TpccReport;

    fn name(&self) -> &'static str {
        match self.params.mix {
            Mix::Standard | Mix::Only(_) => "tpcc",
            Mix::NewOrderOnly => "tpcc-no",
        }
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn validate(&self, shape: ClusterShape) -> Result<(), String> {
        if self.params.warehouses_per_worker == 0 {
            return Err("tpcc: every worker needs at least one warehouse".into());
        }
        if self.params.customers == 0 || self.params.customers > 3000 {
            return Err(format!(
                "tpcc: customers per district must be in 1..=3000, not {}",
                self.params.customers
            ));
        }
        if self.params.items == 0 || self.params.items > 100_000 {
            return Err(format!("tpcc: items must be in 1..=100000, not {}", self.params.items));
        }
        if self.params.remote_item_pct > 100 {
            return Err(format!(
                "tpcc: the remote item percentage must be in 0..=100, not {}",
                self.params.remote_item_pct
            ));
        }
        if let Mix::Only(ty) = self.params.mix {
            if usize::from(ty) >= TYPES.len() {
                return Err(format!("tpcc: no transaction type {ty} (0..=4)"));
            }
        }
        if self.params.new_orders_max == 0 {
            return Err("tpcc: room for at least one new order per district is needed".into());
        }
        if self.params.mix == Mix::NewOrderOnly && shape.nodes < 2 {
            return Err(
                "tpcc-no: every transaction is distributed, so it needs 2 nodes or more".into()
            );
        }
        Ok(())
    }

    fn tables(&self, shape: ClusterShape) -> Vec<TableSpec> {
        self.scale(shape).tables()
    }

    fn store_bytes(&self, catalog: &Catalog, shape: ClusterShape) -> u64 {
        // Tables are sized for the keys a run may create, but only rows written touch
        // memory: count the loaded rows, with their share of the index.
        let scale = self.scale(shape);
        let rows = scale.loaded_rows();
        catalog
            .tables()
            .map(|t| {
                let record = (4 + u64::from(t.payload_words)) * 8 + 26;
                rows[usize::from(t.id.0)] * scale.warehouses_per_node * record
            })
            .sum::<u64>()
            * u64::from(catalog.replication())
    }

    fn load(&self, engine: &Engine, shape: ClusterShape) -> Result<(), StoreError> {
        let scale = self.scale(shape);
        let nu = NuRand::new(self.params.seed);
        let mut names = Vec::with_capacity(usize::from(shape.nodes));
        for node in 0..u64::from(shape.nodes) {
            let mut builder = NameIndexBuilder::default();
            for wi in 0..scale.warehouses_per_node {
                let w = node * scale.warehouses_per_node + wi;
                // A name index is partition `node`'s: its warehouses must be.
                assert_eq!(u64::from(engine.catalog.partition(WAREHOUSE, w)), node);
                load_warehouse(engine, &scale, &nu, w, self.params.seed, &mut builder)?;
            }
            names.push(Arc::new(builder.build()));
        }
        // The indexes live with their partitions' replicas, as placed at the start.
        let placement = hytra_txn::Config::initial(shape.nodes, engine.catalog.replication());
        let mut held = vec![vec![false; usize::from(shape.nodes)]; usize::from(shape.nodes)];
        for (p, part) in placement.placement.parts().iter().enumerate() {
            for n in std::iter::once(part.primary).chain(part.backups.iter().map(|&(n, _)| n)) {
                held[usize::from(n.0)][p] = true;
            }
        }
        let items = Arc::new(Items::generate(self.params.items, self.params.seed));
        *self.built.lock().expect("no loader panicked") =
            Some(Arc::new(Built { items, names, held, nu }));
        Ok(())
    }

    fn spawn<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        wt: &Rc<WorkerTxn>,
        plan: ClientPlan,
    ) -> Rc<WorkerState> {
        let built = self.built();
        let co = w.co();
        let shape = co.shape();
        let me = co.me();
        let scale = self.scale(shape);
        let held = &built.held[usize::from(me.node.0)];
        let node_names = Arc::new(txns::NodeNames::new(
            me.node,
            wt.node.store.clone(),
            wt.node.membership.clone(),
            scale.customers,
            built.names.iter().zip(held).map(|(n, &h)| h.then(|| n.clone())),
        ));
        let (names, wpn) = (node_names.clone(), scale.warehouses_per_node);
        w.handle(
            txns::NAME_LOOKUP,
            Box::new(move |ctx, req| txns::serve_name_lookup(&names, wpn, req, ctx.reply)),
        );
        let wpw = self.params.warehouses_per_worker;
        let first_home = shape.worker_index(me) as u64 * wpw;
        let env = Rc::new(Env {
            scale,
            nu: built.nu,
            warehouses: shape.workers_total() as u64 * wpw,
            nodes: u64::from(shape.nodes),
            items: built.items.clone(),
            names: node_names,
            node: u64::from(me.node.0),
            index: me.index,
        });
        let states: Vec<Rc<ClientState>> = (0..wpw)
            .map(|_| {
                let s = Rc::new(ClientState::default());
                s.history_next.set(initial_history(&scale));
                s
            })
            .collect();
        let (mix, remote) = (self.params.mix, self.params.remote_item_pct);
        let tally = Tallies::new(plan.coroutines);
        let mut terminal = 0u64;
        spawn_clients(w, wt, plan, |ctx, rng| {
            // Terminals take the worker's warehouses in turn, and a district each.
            let (home, d) = (first_home + terminal % wpw, (terminal / wpw) % DISTRICTS + 1);
            let state = states[(terminal % wpw) as usize].clone();
            terminal += 1;
            client(ctx, rng, env.clone(), home, d, mix, remote, plan, state, tally.clone())
        });
        Rc::new(WorkerState(tally))
    }

    fn report(&self, state: Rc<WorkerState>) -> TpccReport {
        state.0.report()
    }

    fn check(&self, engine: &Engine, reports: &[TpccReport]) -> InvariantReport {
        let scale = self.scale_for(warehouses_per_node(engine));
        let mut details = Vec::new();
        let conditions = consistency(engine, &scale);
        let mut ok = conditions.iter().all(|(_, violations, _)| *violations == 0);
        for (name, violations, checked) in &conditions {
            details.push(format!("{name}: {violations} violations in {checked} checks"));
        }
        // What the clients committed must show in the database.
        let expect = Tally::total(reports, engine);
        let totals = totals(engine, &scale);
        let effects_ok = totals == expect;
        ok &= effects_ok;
        details.push(format!(
            "committed effects: {} new orders, {} cents paid, {} history rows; the database shows {}, {}, {}",
            expect.new_orders, expect.paid, expect.history, totals.new_orders, totals.paid, totals.history
        ));
        let (replicas_ok, more) = check_replicas(engine);
        details.extend(more);
        InvariantReport { ok: ok && replicas_ok, details }
    }
}

/// Warehouses per node, read off the catalog (the warehouse table's range size, one key
/// per warehouse).
fn warehouses_per_node(engine: &Engine) -> u64 {
    match engine.catalog.spec(WAREHOUSE).partitioner {
        hytra_store::Partitioner::Range { keys_per_partition } => keys_per_partition,
        hytra_store::Partitioner::Modulo => unreachable!("TPC-C partitions by warehouse"),
    }
}

/// Every present row of `table` on every primary, with its payload.
fn rows(engine: &Engine, table: hytra_store::TableId, mut f: impl FnMut(u64, &[u64])) {
    let words = usize::from(engine.catalog.spec(table).payload_words);
    let mut p = vec![0u64; words];
    for primary in engine.primaries(table) {
        for (off, key) in primary.records() {
            let snap = primary.read(off, key, &mut p).expect("no writer after the run");
            if hytra_store::layout::is_present(snap.version) {
                f(key, &p);
            }
        }
    }
}

/// Consistency conditions 1-4 (clause 3.3.2.1-4): (name, violations, checks).
fn consistency(engine: &Engine, scale: &Scale) -> Vec<(&'static str, u64, u64)> {
    let mut w_ytd = HashMap::new();
    rows(engine, WAREHOUSE, |k, p| {
        w_ytd.insert(k, p[w::YTD]);
    });
    let mut d_ytd_sum: HashMap<u64, u64> = HashMap::new();
    let mut next_o: HashMap<u64, u64> = HashMap::new();
    rows(engine, DISTRICT, |k, p| {
        *d_ytd_sum.entry(k / DISTRICTS).or_default() += p[d::YTD];
        next_o.insert(k, p[d::NEXT_O_ID]);
    });
    // Per district: max order id, new-order (min, max, count), sum of ol_cnt, lines.
    let mut max_o: HashMap<u64, u64> = HashMap::new();
    let mut ol_cnt: HashMap<u64, u64> = HashMap::new();
    rows(engine, ORDER, |k, p| {
        let (wh, dd, o) = scale.order_parts(k);
        let dk = Scale::dk(wh, dd);
        let m = max_o.entry(dk).or_default();
        *m = (*m).max(o);
        *ol_cnt.entry(dk).or_default() += p[o::OL_CNT];
    });
    let mut no: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    rows(engine, NEW_ORDER, |k, _| {
        let (wh, dd, o) = scale.order_parts(k);
        let e = no.entry(Scale::dk(wh, dd)).or_insert((u64::MAX, 0, 0));
        *e = (e.0.min(o), e.1.max(o), e.2 + 1);
    });
    let mut lines: HashMap<u64, u64> = HashMap::new();
    rows(engine, ORDER_LINE, |k, _| {
        let (wh, dd, _) = scale.order_parts(scale.line_order(k));
        *lines.entry(Scale::dk(wh, dd)).or_default() += 1;
    });

    let mut c1 = (0, 0);
    for (wh, ytd) in &w_ytd {
        c1.1 += 1;
        if d_ytd_sum.get(wh) != Some(ytd) {
            c1.0 += 1;
        }
    }
    let (mut c2, mut c3, mut c4) = ((0, 0), (0, 0), (0, 0));
    for (dk, next) in &next_o {
        c2.1 += 1;
        let max = max_o.get(dk).copied().unwrap_or(0);
        let no_max = no.get(dk).map(|e| e.1);
        if next - 1 != max || no_max.is_some_and(|m| m != max) {
            c2.0 += 1;
        }
        if let Some(&(min, max, count)) = no.get(dk) {
            c3.1 += 1;
            if max - min + 1 != count {
                c3.0 += 1;
            }
        }
        c4.1 += 1;
        if ol_cnt.get(dk).copied().unwrap_or(0) != lines.get(dk).copied().unwrap_or(0) {
            c4.0 += 1;
        }
    }
    vec![
        ("condition 1 (W_YTD = sum of D_YTD)", c1.0, c1.1),
        ("condition 2 (D_NEXT_O_ID - 1 = max O_ID = max NO_O_ID)", c2.0, c2.1),
        ("condition 3 (new orders contiguous)", c3.0, c3.1),
        ("condition 4 (sum O_OL_CNT = order lines)", c4.0, c4.1),
    ]
}

/// What the database shows of committed work: orders beyond the initial ones, money
/// paid beyond the initial W_YTD, history rows beyond the initial ones.
fn totals(engine: &Engine, scale: &Scale) -> Effect {
    let mut t = Effect::default();
    rows(engine, DISTRICT, |_, p| t.new_orders += p[d::NEXT_O_ID] - (scale.customers + 1));
    rows(engine, WAREHOUSE, |_, p| t.paid += p[w::YTD] - 30_000_000);
    let mut history = 0;
    rows(engine, HISTORY, |_, _| history += 1);
    let warehouses = engine.nodes.len() as u64 * scale.warehouses_per_node;
    t.history = history - warehouses * initial_history_rows(scale.customers);
    t
}
