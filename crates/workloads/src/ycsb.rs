//! YCSB: the core workloads A-F of the Yahoo! Cloud Serving Benchmark as transactions
//! of `ops_per_txn` operations each, on one table of records with `fields` fields,
//! keys drawn uniform, zipfian (scrambled, as YCSB does) or latest.
//!
//! Mixes (YCSB's core workloads): A 50% read / 50% update, B 95/5, C read only, D 95%
//! read of recent keys / 5% insert, E 95% short scan / 5% insert, F 50% read / 50%
//! read-modify-write. A scan reads a run of consecutive keys (keys are numbered densely:
//! a range needs no ordered index). Every record's first word counts the updates it
//! received, so the oracle can check that the database holds exactly the committed
//! updates and inserts.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use hytra_fabric::rng::Rng;
use hytra_fabric::{ClusterShape, Endpoint};
use hytra_rt::Worker;
use hytra_store::{Fill, IndexLayout, Partitioner, StoreError, TableId, TableSpec};
use hytra_txn::{Abort, Engine, Intent, Txn, TxnCtx, WorkerTxn};

use crate::bench::{check_replicas, spawn_clients, ClientPlan, InvariantReport, Workload};
use crate::tally::{run_counted, Counts, Tallies, Tally};

/// The table.
pub const USERTABLE: TableId = TableId(0);

/// Operation names, in type-id order (a transaction's type is its first operation's).
pub const TYPES: [&str; 5] = ["read", "update", "insert", "scan", "read_modify_write"];
const READ: u8 = 0;
const UPDATE: u8 = 1;
const INSERT: u8 = 2;
const SCAN: u8 = 3;
const RMW: u8 = 4;

/// A core workload's operation mix.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mix {
    /// 50% read, 50% update.
    A,
    /// 95% read, 5% update.
    B,
    /// Read only.
    C,
    /// 95% read (latest keys), 5% insert.
    D,
    /// 95% scan, 5% insert.
    E,
    /// 50% read, 50% read-modify-write.
    F,
}

impl Mix {
    /// Every core workload.
    pub const ALL: [Mix; 6] = [Mix::A, Mix::B, Mix::C, Mix::D, Mix::E, Mix::F];

    /// The workload's letter.
    pub fn name(self) -> &'static str {
        match self {
            Mix::A => "a",
            Mix::B => "b",
            Mix::C => "c",
            Mix::D => "d",
            Mix::E => "e",
            Mix::F => "f",
        }
    }

    /// Parses `a`..`f`.
    pub fn parse(s: &str) -> Option<Mix> {
        match s.to_ascii_lowercase().as_str() {
            "a" => Some(Mix::A),
            "b" => Some(Mix::B),
            "c" => Some(Mix::C),
            "d" => Some(Mix::D),
            "e" => Some(Mix::E),
            "f" => Some(Mix::F),
            _ => None,
        }
    }

    fn draw(self, rng: &mut Rng) -> u8 {
        let r = rng.below(100);
        match self {
            Mix::A => [READ, UPDATE][usize::from(r >= 50)],
            Mix::B => [READ, UPDATE][usize::from(r >= 95)],
            Mix::C => READ,
            Mix::D => [READ, INSERT][usize::from(r >= 95)],
            Mix::E => [SCAN, INSERT][usize::from(r >= 95)],
            Mix::F => [READ, RMW][usize::from(r >= 50)],
        }
    }
}

/// How keys are chosen.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum KeyDist {
    /// Every key alike.
    Uniform,
    /// Zipfian with constant θ (YCSB's default 0.99), popular keys scattered by hashing.
    Zipfian(f64),
}

/// YCSB's parameters.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct YcsbParams {
    /// Operation mix.
    pub mix: Mix,
    /// Records loaded per worker thread.
    pub records_per_worker: u64,
    /// Fields per record (after the update counter).
    pub fields: u16,
    /// Bytes per field (a multiple of 8).
    pub field_bytes: u16,
    /// Operations per transaction.
    pub ops_per_txn: u16,
    /// Key distribution.
    pub dist: KeyDist,
    /// Longest scan (workload E), in records.
    pub scan_max: u16,
    /// Inserts a worker can make during the run (room in the table).
    pub inserts_max_per_worker: u64,
}

impl YcsbParams {
    /// Workload `mix` with YCSB's defaults: zipfian 0.99, 10 fields of 96 bytes (a record
    /// of about 1 KB), one operation per transaction, scans of up to 100 records.
    pub fn core(mix: Mix) -> YcsbParams {
        YcsbParams {
            mix,
            records_per_worker: 100_000,
            fields: 10,
            field_bytes: 96,
            ops_per_txn: 1,
            dist: KeyDist::Zipfian(0.99),
            scan_max: 100,
            inserts_max_per_worker: 100_000,
        }
    }

    fn words(&self) -> u16 {
        1 + self.fields * (self.field_bytes / 8)
    }
}

/// The YCSB workload.
#[derive(Debug)]
pub struct Ycsb {
    /// Its parameters.
    pub params: YcsbParams,
    /// Records the last load put in the table.
    loaded: std::sync::atomic::AtomicU64,
}

impl Ycsb {
    /// The workload with `params`.
    pub fn new(params: YcsbParams) -> Ycsb {
        Ycsb { params, loaded: std::sync::atomic::AtomicU64::new(0) }
    }
}

/// Zipfian choice over `0..n` (Gray et al., "Quickly generating billion-record synthetic
/// databases", as YCSB implements it).
#[derive(Debug)]
pub struct Zipfian {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// The distribution over `0..n` with constant `theta` in (0, 1).
    pub fn new(n: u64, theta: f64) -> Zipfian {
        assert!(n >= 1 && theta > 0.0 && theta < 1.0, "zipfian over {n} items with θ {theta}");
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2.min(n));
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipfian { n, theta, alpha, zetan, eta }
    }

    /// The next rank (0: the most popular).
    pub fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n - 1);
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }
}

/// Scatters rank `r` over `0..n` (YCSB's scrambled zipfian: the popular keys are not
/// neighbours).
fn scramble(r: u64, n: u64) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for b in r.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h % n
}

/// Shared by a worker's clients.
pub struct ClientState {
    /// Records loaded in the cluster.
    loaded: u64,
    zipf: Option<Arc<Zipfian>>,
    /// This worker's inserts so far, and its dense index.
    inserted: Cell<u64>,
    me: u64,
    workers: u64,
    tally: Rc<Tallies<YcsbCounts>>,
}

impl ClientState {
    fn key(&self, rng: &mut Rng, latest: bool) -> u64 {
        match (&self.zipf, latest) {
            (Some(z), true) => {
                // Recent keys first: the insert frontier as this worker sees it (every
                // worker inserts at about the same pace; a key not inserted yet reads as
                // absent).
                let frontier = self.loaded + self.workers * self.inserted.get();
                frontier - 1 - z.next(rng).min(frontier - 1)
            }
            (Some(z), false) => scramble(z.next(rng), self.loaded),
            (None, _) => rng.below(self.loaded),
        }
    }

    /// A fresh key for this worker's next insert.
    fn next_insert(&self) -> u64 {
        let i = self.inserted.get();
        self.inserted.set(i + 1);
        self.loaded + self.me + self.workers * i
    }
}

/// What a transaction adds to the oracle's expectations.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct YcsbCounts {
    /// Updates and read-modify-writes.
    pub updates: u64,
    /// Inserts.
    pub inserts: u64,
}

impl Counts for YcsbCounts {
    fn plus(self, o: YcsbCounts) -> YcsbCounts {
        YcsbCounts { updates: self.updates + o.updates, inserts: self.inserts + o.inserts }
    }
}

/// What a worker's clients committed (and left in doubt).
pub type YcsbReport = Tally<YcsbCounts>;

/// One operation of a transaction, drawn before its first attempt.
#[derive(Copy, Clone, Debug)]
struct Op {
    kind: u8,
    key: u64,
    /// Field an update writes, or the length of a scan.
    arg: u64,
}

async fn client<E: Endpoint>(
    mut ctx: TxnCtx<E>,
    mut rng: Rng,
    p: YcsbParams,
    plan: ClientPlan,
    st: Rc<ClientState>,
) {
    let mut ops: Vec<Op> = Vec::with_capacity(usize::from(p.ops_per_txn));
    let mut keys = Vec::new();
    let mut batch = Vec::new();
    let mut recs = Vec::new();
    let mut value = vec![0u64; usize::from(p.words())];
    while plan.running(&ctx) {
        ops.clear();
        for _ in 0..p.ops_per_txn {
            let kind = p.mix.draw(&mut rng);
            let (key, arg) = match kind {
                INSERT => (st.next_insert(), 0),
                SCAN => {
                    let len = 1 + rng.below(u64::from(p.scan_max));
                    let start = st.key(&mut rng, false).min(st.loaded.saturating_sub(len));
                    (start, len)
                }
                _ => (st.key(&mut rng, p.mix == Mix::D), rng.below(u64::from(p.fields))),
            };
            ops.push(Op { kind, key, arg });
        }
        if ops
            .iter()
            .any(|o| o.kind == INSERT && o.key >= st.loaded + st.workers * p.inserts_max_per_worker)
        {
            // The table's room for inserts is used up: the run was sized for less.
            continue;
        }
        let ty = ops[0].kind;
        run_counted(&mut ctx, &mut rng, ty, plan.retries_max, &st.tally, async |t| {
            body(t, &p, &ops, &mut keys, &mut batch, &mut recs, &mut value).await
        })
        .await;
    }
}

/// One attempt; returns the updates and inserts it makes.
async fn body<E: Endpoint>(
    t: &mut Txn<'_, E>,
    p: &YcsbParams,
    ops: &[Op],
    keys: &mut Vec<(TableId, u64)>,
    batch: &mut Vec<(TableId, u64, Intent)>,
    recs: &mut Vec<hytra_txn::Rec>,
    value: &mut [u64],
) -> Result<YcsbCounts, Abort> {
    let field_words = usize::from(p.field_bytes / 8);
    prefetch(t, ops, batch, recs).await?;
    let (mut updates, mut inserts) = (0, 0);
    for op in ops {
        match op.kind {
            READ => {
                t.read(USERTABLE, op.key).await?;
            }
            SCAN => {
                keys.clear();
                keys.extend((op.key..op.key + op.arg).map(|k| (USERTABLE, k)));
                t.read_all(keys, false, recs).await?;
            }
            UPDATE | RMW => {
                let r = t.read_for_update(USERTABLE, op.key).await?;
                if !t.exists(r) {
                    continue;
                }
                let rec = t.update(r);
                rec[0] += 1;
                let at = 1 + op.arg as usize * field_words;
                // A new value for one field (a read-modify-write derives it from the old).
                let seed = if op.kind == RMW { rec[at] } else { op.key };
                for (i, w) in rec[at..at + field_words].iter_mut().enumerate() {
                    *w = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i as u64 + 1);
                }
                updates += 1;
            }
            INSERT => {
                value.fill(op.key);
                value[0] = 0;
                t.insert(USERTABLE, op.key, value)?;
                inserts += 1;
            }
            _ => unreachable!("five operations"),
        }
    }
    Ok(YcsbCounts { updates, inserts })
}

/// Reads every existing record the operations touch in one batch (those to update for
/// update), so that a transaction's reads travel in parallel rather than one round trip
/// per operation; the operations then find them read already (a record named twice is
/// fetched once). Keys the transaction inserts are left to the operations, which meet
/// them in order.
async fn prefetch<E: Endpoint>(
    t: &mut Txn<'_, E>,
    ops: &[Op],
    keys: &mut Vec<(TableId, u64, Intent)>,
    recs: &mut Vec<hytra_txn::Rec>,
) -> Result<(), Abort> {
    keys.clear();
    for op in ops {
        match op.kind {
            UPDATE | RMW => keys.push((USERTABLE, op.key, Intent::Update)),
            READ => keys.push((USERTABLE, op.key, Intent::Read)),
            SCAN => keys.extend((op.key..op.key + op.arg).map(|k| (USERTABLE, k, Intent::Read))),
            _ => {}
        }
    }
    keys.retain(|&(_, k, _)| !ops.iter().any(|o| o.kind == INSERT && o.key == k));
    if keys.is_empty() {
        return Ok(());
    }
    t.read_batch(keys, recs).await
}

impl Workload for Ycsb {
    type State = Rc<ClientState>;
    type Report = YcsbReport;

    fn name(&self) -> &'static str {
        "ycsb"
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn validate(&self, shape: ClusterShape) -> Result<(), String> {
        let p = &self.params;
        if p.records_per_worker == 0 || p.ops_per_txn == 0 || p.fields == 0 {
            return Err(
                "ycsb: records, fields and operations per transaction must be positive".into()
            );
        }
        if p.field_bytes == 0 || p.field_bytes % 8 != 0 {
            return Err(format!(
                "ycsb: field size {} is not a positive multiple of 8",
                p.field_bytes
            ));
        }
        if p.words() > hytra_store::layout::PAYLOAD_WORDS_MAX {
            return Err(format!(
                "ycsb: {} fields of {} bytes exceed a record's {} bytes",
                p.fields,
                p.field_bytes,
                (hytra_store::layout::PAYLOAD_WORDS_MAX - 1) * 8
            ));
        }
        if let KeyDist::Zipfian(theta) = p.dist {
            if !(theta > 0.0 && theta < 1.0) {
                return Err(format!("ycsb: zipfian θ must be in (0, 1), not {theta}"));
            }
        }
        if p.mix == Mix::E
            && (p.scan_max == 0
                || u64::from(p.scan_max) > p.records_per_worker * shape.workers_total() as u64)
        {
            return Err(format!("ycsb: scan length {} does not fit the table", p.scan_max));
        }
        Ok(())
    }

    fn tables(&self, shape: ClusterShape) -> Vec<TableSpec> {
        let p = &self.params;
        let workers = shape.workers_total() as u64;
        let keys = (p.records_per_worker + p.inserts_max_per_worker) * workers;
        vec![TableSpec {
            id: USERTABLE,
            name: "usertable".into(),
            payload_words: p.words(),
            capacity: keys.div_ceil(u64::from(shape.nodes)) + 16,
            partitioner: Partitioner::Modulo,
            index: IndexLayout::Sequential,
            fill: Fill::Dense,
        }]
    }

    fn store_bytes(&self, catalog: &hytra_store::Catalog, shape: ClusterShape) -> u64 {
        let p = &self.params;
        let rows = p.records_per_worker * u64::from(shape.workers_per_node);
        rows * ((4 + u64::from(p.words())) * 8 + 26) * u64::from(catalog.replication())
    }

    fn load(&self, engine: &Engine, shape: ClusterShape) -> Result<(), StoreError> {
        let p = &self.params;
        let mut value = vec![0u64; usize::from(p.words())];
        let n = p.records_per_worker * shape.workers_total() as u64;
        for key in 0..n {
            value.fill(key);
            value[0] = 0;
            engine.load(USERTABLE, key, &value)?;
        }
        self.loaded.store(n, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn spawn<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        wt: &Rc<WorkerTxn>,
        plan: ClientPlan,
    ) -> Rc<ClientState> {
        let p = self.params;
        let shape = w.co().shape();
        let loaded = p.records_per_worker * shape.workers_total() as u64;
        let zipf = match p.dist {
            KeyDist::Zipfian(theta) => Some(zipfian(loaded, theta)),
            KeyDist::Uniform => None,
        };
        let st = Rc::new(ClientState {
            loaded,
            zipf,
            inserted: Cell::new(0),
            me: shape.worker_index(w.co().me()) as u64,
            workers: shape.workers_total() as u64,
            tally: Tallies::new(plan.coroutines),
        });
        spawn_clients(w, wt, plan, |ctx, rng| client(ctx, rng, p, plan, st.clone()));
        st
    }

    fn report(&self, st: Rc<ClientState>) -> YcsbReport {
        st.tally.report()
    }

    fn check(&self, engine: &Engine, reports: &[YcsbReport]) -> InvariantReport {
        let p = &self.params;
        let YcsbCounts { updates: expect_updates, inserts: expect_inserts } =
            Tally::total(reports, engine);
        let loaded = self.loaded.load(std::sync::atomic::Ordering::Relaxed);
        let mut updates = 0u64;
        let mut rows = 0u64;
        let mut value = vec![0u64; usize::from(p.words())];
        for primary in engine.primaries(USERTABLE) {
            for (off, key) in primary.records() {
                let snap = primary.read(off, key, &mut value).expect("no writer after the run");
                if hytra_store::layout::is_present(snap.version) {
                    rows += 1;
                    updates += value[0];
                }
            }
        }
        let mut details = vec![format!(
            "updates counted in records: {updates}, committed: {expect_updates}; rows: {rows}, expected {loaded} loaded + {expect_inserts} inserted"
        )];
        let (replicas_ok, more) = check_replicas(engine);
        details.extend(more);
        let ok = updates == expect_updates && rows == loaded + expect_inserts && replicas_ok;
        InvariantReport { ok, details }
    }
}

/// The zipfian distribution over `n` keys: computing its constant is O(n), so one is
/// shared by every worker of a run (keyed by `n` and θ).
fn zipfian(n: u64, theta: f64) -> Arc<Zipfian> {
    use std::sync::Mutex;
    static CACHE: Mutex<Option<(u64, u64, Arc<Zipfian>)>> = Mutex::new(None);
    let mut c = CACHE.lock().expect("no panic while computing zeta");
    match &*c {
        Some((cn, ct, z)) if *cn == n && *ct == theta.to_bits() => z.clone(),
        _ => {
            let z = Arc::new(Zipfian::new(n, theta));
            *c = Some((n, theta.to_bits(), z.clone()));
            z
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipfian_favours_low_ranks_and_stays_in_range() {
        let z = Zipfian::new(1000, 0.99);
        let mut rng = Rng::new(1);
        let mut hits = [0u32; 1000];
        for _ in 0..100_000 {
            hits[z.next(&mut rng) as usize] += 1;
        }
        assert!(hits[0] > hits[10] && hits[10] > hits[500], "{:?}", &hits[..20]);
        // θ = 0.99 over 1000 items: the top 1% takes a large share (about 40%).
        let top: u32 = hits[..10].iter().sum();
        assert!(top > 30_000, "top 10 ranks got {top} of 100000");
    }

    #[test]
    fn scrambling_spreads_the_popular_ranks() {
        let keys: Vec<u64> = (0..10).map(|r| scramble(r, 1_000_000)).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 10, "distinct");
        assert!(keys.iter().any(|&k| k > 100_000), "not all near zero: {keys:?}");
    }
}
