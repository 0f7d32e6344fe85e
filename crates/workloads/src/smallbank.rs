//! SmallBank (H-Store): a bank with a savings and a checking account per customer and
//! six transactions, the network-intensive workload of DrTM+H §5.
//!
//! Mix: SendPayment 25%, Balance, DepositChecking, TransactSaving, Amalgamate and
//! WriteCheck 15% each. `accounts_per_worker` customers per worker thread of the
//! cluster; 90% of accesses go to a hot set of 4% of the customers, spread over every
//! partition (no locality: a customer's partition is `id % nodes`).
//!
//! Oracle: the money in all accounts equals the initial money plus the deposits and
//! minus the withdrawals of committed transactions; every backup equals its primary;
//! plus the serializability check of the recorded history.

use std::rc::Rc;

use hytra_fabric::rng::Rng;
use hytra_fabric::{ClusterShape, Endpoint};
use hytra_rt::Worker;
use hytra_store::{Fill, IndexLayout, Partitioner, StoreError, TableId, TableSpec};
use hytra_txn::{Abort, AbortReason, Engine, Txn, TxnCtx, WorkerTxn};

use crate::bench::{check_replicas, spawn_clients, ClientPlan, InvariantReport, Workload};
use crate::tally::{run_counted, Tallies, Tally};

/// Savings balances.
pub const SAVINGS: TableId = TableId(0);
/// Checking balances.
pub const CHECKING: TableId = TableId(1);
/// Balances start uniform in `BALANCE_MIN..BALANCE_MAX` (cents), and transactions move
/// fixed amounts: the parameters of the H-Store SmallBank as OLTP-Bench runs it.
pub const BALANCE_MIN: i64 = 1_000_000;
/// Upper end of the initial balances.
pub const BALANCE_MAX: i64 = 5_000_000;
/// DepositChecking deposits 1.30.
pub const DEPOSIT_AMOUNT: i64 = 130;
/// TransactSaving withdraws 20.20.
pub const SAVING_AMOUNT: i64 = 2_020;
/// WriteCheck and SendPayment move 5.00.
pub const CHECK_AMOUNT: i64 = 500;
/// Percentage of customers in the hot set.
pub const HOT_PERCENT: u64 = 4;
/// Percentage of accesses that go to the hot set.
pub const HOT_ACCESS_PERCENT: u64 = 90;

/// Why SmallBank's own aborts grow with the length of a run, for reports: Amalgamate
/// moves all of one customer's money into another's checking account, and the hot
/// accounts (90% of accesses) are emptied again and again, so Send-Payment and
/// Transact-Saving find ever more accounts without the funds.
pub const WORKLOAD_ABORTS: &str = "SmallBank's own aborts (insufficient funds) grow with run length: Amalgamate empties accounts, the hot ones most, and later payments from them fail";

/// Transaction types, in report order.
pub const TYPES: [&str; 6] =
    ["send_payment", "balance", "deposit_checking", "transact_saving", "amalgamate", "write_check"];
const SEND_PAYMENT: u8 = 0;
const BALANCE: u8 = 1;
const DEPOSIT_CHECKING: u8 = 2;
const TRANSACT_SAVING: u8 = 3;
const AMALGAMATE: u8 = 4;
const WRITE_CHECK: u8 = 5;

/// SmallBank's parameters.
#[derive(Copy, Clone, Debug)]
pub struct SmallBank {
    /// Customers per worker thread of the cluster.
    pub accounts_per_worker: u64,
}

impl SmallBank {
    /// The paper's scale: 100 000 accounts per worker thread (DrTM+H §5).
    pub fn paper() -> SmallBank {
        SmallBank { accounts_per_worker: 100_000 }
    }

    fn accounts(&self, shape: ClusterShape) -> u64 {
        self.accounts_per_worker * shape.workers_total() as u64
    }
}

/// What one worker's clients did, for the oracle: money added (deposits) minus money
/// taken (withdrawals, checks) by committed transactions, and by those in doubt.
pub type SmallBankReport = Tally<i64>;

/// Picks a customer: 90% from the hot 4%, else from the rest.
fn pick(rng: &mut Rng, accounts: u64) -> u64 {
    let hot = (accounts * HOT_PERCENT / 100).max(1);
    if rng.below(100) < HOT_ACCESS_PERCENT || hot == accounts {
        rng.below(hot)
    } else {
        hot + rng.below(accounts - hot)
    }
}

fn pick_two(rng: &mut Rng, accounts: u64) -> (u64, u64) {
    let a = pick(rng, accounts);
    loop {
        let b = pick(rng, accounts);
        if b != a {
            return (a, b);
        }
    }
}

/// Inputs of one transaction.
#[derive(Copy, Clone, Debug)]
struct Input {
    a: u64,
    b: u64,
    amount: i64,
}

/// The initial balance of account `key` in `table`: a deterministic function of both,
/// so the loader needs no state and the oracle can recompute the initial total.
pub fn initial_balance(table: TableId, key: u64) -> i64 {
    let mut x = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(table.0) << 61;
    let h = hytra_fabric::rng::splitmix64(&mut x);
    BALANCE_MIN + (h % (BALANCE_MAX - BALANCE_MIN) as u64) as i64
}

fn amount(ty: u8) -> i64 {
    match ty {
        DEPOSIT_CHECKING => DEPOSIT_AMOUNT,
        TRANSACT_SAVING => SAVING_AMOUNT,
        _ => CHECK_AMOUNT,
    }
}

fn get(t: &Txn<'_, impl Endpoint>, r: hytra_txn::Rec) -> i64 {
    t.get(r)[0] as i64
}

fn set(t: &mut Txn<'_, impl Endpoint>, r: hytra_txn::Rec, v: i64) {
    t.update(r)[0] = v as u64;
}

/// Runs the body of one transaction; returns the money it adds to the bank if it
/// commits.
async fn body<E: Endpoint>(t: &mut Txn<'_, E>, ty: u8, i: Input) -> Result<i64, Abort> {
    match ty {
        SEND_PAYMENT => {
            let [from, to] = t.read_many([(CHECKING, i.a), (CHECKING, i.b)], true).await?;
            let balance = get(t, from);
            if balance < i.amount {
                return Err(Abort(AbortReason::User));
            }
            set(t, from, balance - i.amount);
            let b = get(t, to);
            set(t, to, b + i.amount);
            Ok(0)
        }
        BALANCE => {
            let [s, c] = t.read_many([(SAVINGS, i.a), (CHECKING, i.a)], false).await?;
            let _total = get(t, s) + get(t, c);
            Ok(0)
        }
        DEPOSIT_CHECKING => {
            let c = t.read_for_update(CHECKING, i.a).await?;
            let b = get(t, c);
            set(t, c, b + i.amount);
            Ok(i.amount)
        }
        TRANSACT_SAVING => {
            let s = t.read_for_update(SAVINGS, i.a).await?;
            let b = get(t, s);
            if b < i.amount {
                return Err(Abort(AbortReason::User));
            }
            set(t, s, b - i.amount);
            Ok(-i.amount)
        }
        AMALGAMATE => {
            let [s1, c1, c2] =
                t.read_many([(SAVINGS, i.a), (CHECKING, i.a), (CHECKING, i.b)], true).await?;
            let total = get(t, s1) + get(t, c1);
            set(t, s1, 0);
            set(t, c1, 0);
            let b = get(t, c2);
            set(t, c2, b + total);
            Ok(0)
        }
        WRITE_CHECK => {
            let [s, c] = t.read_many([(SAVINGS, i.a), (CHECKING, i.a)], false).await?;
            let total = get(t, s) + get(t, c);
            // Overdrawing costs a penalty of one.
            let charge = if total < i.amount { i.amount + 1 } else { i.amount };
            let b = get(t, c);
            set(t, c, b - charge);
            Ok(-charge)
        }
        _ => unreachable!("six transaction types"),
    }
}

/// One client coroutine: transactions back to back until the plan's end.
async fn client<E: Endpoint>(
    mut ctx: TxnCtx<E>,
    mut rng: Rng,
    accounts: u64,
    plan: ClientPlan,
    tally: Rc<Tallies<i64>>,
) {
    while plan.running(&ctx) {
        let roll = rng.below(100);
        let ty = match roll {
            0..25 => SEND_PAYMENT,
            25..40 => BALANCE,
            40..55 => DEPOSIT_CHECKING,
            55..70 => TRANSACT_SAVING,
            70..85 => AMALGAMATE,
            _ => WRITE_CHECK,
        };
        let (a, b) = pick_two(&mut rng, accounts);
        let input = Input { a, b, amount: amount(ty) };
        run_counted(&mut ctx, &mut rng, ty, plan.retries_max, &tally, async |t| {
            body(t, ty, input).await
        })
        .await;
    }
}

impl Workload for SmallBank {
    type State = Rc<Tallies<i64>>;
    type Report = SmallBankReport;

    fn name(&self) -> &'static str {
        "smallbank"
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn validate(&self, shape: ClusterShape) -> Result<(), String> {
        if self.accounts_per_worker == 0 || self.accounts(shape) < 2 {
            return Err(format!(
                "smallbank needs at least 2 accounts (got {} per worker)",
                self.accounts_per_worker
            ));
        }
        Ok(())
    }

    fn tables(&self, shape: ClusterShape) -> Vec<TableSpec> {
        // Each partition holds its share plus headroom for an uneven modulo split.
        let per_partition = self.accounts(shape).div_ceil(u64::from(shape.nodes)) + 16;
        [(SAVINGS, "savings"), (CHECKING, "checking")]
            .into_iter()
            .map(|(id, name)| TableSpec {
                id,
                name: name.into(),
                payload_words: 1,
                capacity: per_partition,
                partitioner: Partitioner::Modulo,
                // Accounts are numbered densely: loading fills the index in order.
                index: IndexLayout::Sequential,
                fill: Fill::Dense,
            })
            .collect()
    }

    fn load(&self, engine: &Engine, shape: ClusterShape) -> Result<(), StoreError> {
        for key in 0..self.accounts(shape) {
            for table in [SAVINGS, CHECKING] {
                engine.load(table, key, &[initial_balance(table, key) as u64])?;
            }
        }
        Ok(())
    }

    fn spawn<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        wt: &Rc<WorkerTxn>,
        plan: ClientPlan,
    ) -> Rc<Tallies<i64>> {
        let tally = Tallies::new(plan.coroutines);
        let accounts = self.accounts(w.co().shape());
        spawn_clients(w, wt, plan, |ctx, rng| client(ctx, rng, accounts, plan, tally.clone()));
        tally
    }

    fn report(&self, state: Rc<Tallies<i64>>) -> SmallBankReport {
        state.report()
    }

    fn check(&self, engine: &Engine, reports: &[SmallBankReport]) -> InvariantReport {
        let mut expected = Tally::total(reports, engine);
        let mut total = 0i64;
        for table in [SAVINGS, CHECKING] {
            for primary in engine.primaries(table) {
                let mut p = [0u64];
                for (off, key) in primary.records() {
                    expected += initial_balance(table, key);
                    primary.read(off, key, &mut p).expect("no writer runs after the benchmark");
                    total += p[0] as i64;
                }
            }
        }
        let money_ok = total == expected;
        let mut details = vec![format!("money: {total} in accounts, {expected} expected")];
        let (replicas_ok, more) = check_replicas(engine);
        details.extend(more);
        InvariantReport { ok: money_ok && replicas_ok, details }
    }
}
