//! TATP (Telecom Application Transaction Processing, IBM 2009), the benchmark FaRM and
//! FaSST report: 80% reads over subscribers and their access, facility and
//! call-forwarding rows, with the specification's population and its non-uniform choice
//! of subscriber.
//!
//! Every row of a subscriber lives in its partition (keys group a subscriber's rows, the
//! range partitioner keeps groups together). A lookup of a subscriber by number goes
//! through the `sub_nbr` table, as the schema's secondary index. Transactions that find
//! no row (a missing facility, an existing forwarding to insert) end as the
//! specification's "unsuccessful" ones: aborted by the workload, not retried.
//!
//! The oracle: call-forwarding rows equal the loaded ones plus committed inserts minus
//! committed deletes, and every forwarding row has its special-facility row.

use std::rc::Rc;

use hytra_fabric::rng::Rng;
use hytra_fabric::{ClusterShape, Endpoint};
use hytra_rt::Worker;
use hytra_store::{Fill, IndexLayout, Partitioner, StoreError, TableId, TableSpec};
use hytra_txn::{Abort, AbortReason, Engine, Txn, TxnCtx, WorkerTxn};

use crate::bench::{check_replicas, spawn_clients, ClientPlan, InvariantReport, Workload};
use crate::tally::{run_counted, Counts, Tallies, Tally};

/// Subscriber.
pub const SUBSCRIBER: TableId = TableId(0);
/// Access info (up to 4 per subscriber).
pub const ACCESS_INFO: TableId = TableId(1);
/// Special facility (up to 4 per subscriber).
pub const SPECIAL_FACILITY: TableId = TableId(2);
/// Call forwarding (up to 3 per special facility).
pub const CALL_FORWARDING: TableId = TableId(3);
/// Subscriber number to subscriber id.
pub const SUB_NBR: TableId = TableId(4);

/// Transaction names, in type-id order.
pub const TYPES: [&str; 7] = [
    "get_subscriber_data",
    "get_new_destination",
    "get_access_data",
    "update_subscriber_data",
    "update_location",
    "insert_call_forwarding",
    "delete_call_forwarding",
];

const SUB_WORDS: u16 = 8;
const AI_WORDS: u16 = 2;
const SF_WORDS: u16 = 2;
const CF_WORDS: u16 = 3;

/// Subscriber row (words): `sub_nbr` (15 digits), bits 1-10, hex 1-10 (4 bits each),
/// byte2 1-10 (two words), `msc_location`, `vlr_location`.
mod sub {
    pub const BITS: usize = 2;
    pub const VLR_LOCATION: usize = 7;
}

/// Special facility row: `is_active | error_cntrl << 8 | data_a << 16`, `data_b`.
mod sf {
    pub const FLAGS: usize = 0;
}

/// Call forwarding row: `end_time`, `numberx` (two words).
mod cf {
    pub const END_TIME: usize = 0;
}

/// TATP's parameters.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TatpParams {
    /// Subscribers per worker thread.
    pub subscribers_per_worker: u64,
    /// Choose subscribers uniformly instead of the specification's non-uniform way.
    pub uniform: bool,
    /// Seed of the initial data.
    pub seed: u64,
}

impl TatpParams {
    /// 100 000 subscribers per worker, non-uniform choice.
    pub fn standard(seed: u64) -> TatpParams {
        TatpParams { subscribers_per_worker: 100_000, uniform: false, seed }
    }
}

/// The TATP workload.
#[derive(Debug)]
pub struct Tatp {
    /// Its parameters.
    pub params: TatpParams,
    /// Call-forwarding rows the last load created.
    loaded_cf: std::sync::atomic::AtomicU64,
}

impl Tatp {
    /// The workload with `params`.
    pub fn new(params: TatpParams) -> Tatp {
        Tatp { params, loaded_cf: std::sync::atomic::AtomicU64::new(0) }
    }
}

fn sub_key(s: u64) -> u64 {
    s - 1
}

fn ai_key(s: u64, ty: u64) -> u64 {
    (s - 1) * 4 + ty - 1
}

fn sf_key(s: u64, ty: u64) -> u64 {
    (s - 1) * 4 + ty - 1
}

fn cf_key(s: u64, sf_type: u64, start: u64) -> u64 {
    sf_key(s, sf_type) * 3 + start / 8
}

/// The specification's non-uniform subscriber id over `1..=p` (clause 4.1: an OR of a
/// random value in `0..=a` and one in `1..=p`, where `a` grows with `p`).
fn subscriber(rng: &mut Rng, p: u64, uniform: bool) -> u64 {
    if uniform {
        return 1 + rng.below(p);
    }
    let a = match p {
        0..=1_000_000 => 65_535,
        1_000_001..=10_000_000 => 1_048_575,
        _ => 2_097_151,
    };
    ((rng.below(a + 1) | (1 + rng.below(p))) % p) + 1
}

/// Distinct random values of `1..=4`, between one and four of them.
fn some_types(rng: &mut Rng) -> Vec<u64> {
    let n = 1 + rng.below(4) as usize;
    let mut all = [1u64, 2, 3, 4];
    for i in (1..4).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        all.swap(i, j);
    }
    let mut v = all[..n].to_vec();
    v.sort_unstable();
    v
}

/// A worker's client state.
pub struct ClientState {
    subscribers: u64,
    uniform: bool,
    tally: Rc<Tallies<TatpCounts>>,
}

/// What a transaction adds to the oracle's expectations.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TatpCounts {
    /// Call forwardings inserted.
    pub cf_inserted: u64,
    /// Call forwardings deleted.
    pub cf_deleted: u64,
}

impl Counts for TatpCounts {
    fn plus(self, o: TatpCounts) -> TatpCounts {
        TatpCounts {
            cf_inserted: self.cf_inserted + o.cf_inserted,
            cf_deleted: self.cf_deleted + o.cf_deleted,
        }
    }
}

/// What a worker's clients committed (and left in doubt).
pub type TatpReport = Tally<TatpCounts>;

/// Inputs of one transaction.
#[derive(Copy, Clone, Debug)]
struct Input {
    s: u64,
    ty: u64,
    start: u64,
    end: u64,
    value: u64,
}

async fn client<E: Endpoint>(
    mut ctx: TxnCtx<E>,
    mut rng: Rng,
    plan: ClientPlan,
    st: Rc<ClientState>,
) {
    while plan.running(&ctx) {
        let roll = rng.below(100);
        let kind: u8 = match roll {
            0..35 => 0,
            35..45 => 1,
            45..80 => 2,
            80..82 => 3,
            82..96 => 4,
            96..98 => 5,
            _ => 6,
        };
        let input = Input {
            s: subscriber(&mut rng, st.subscribers, st.uniform),
            ty: 1 + rng.below(4),
            start: 8 * rng.below(3),
            end: 1 + rng.below(24),
            value: rng.next_u64(),
        };
        run_counted(&mut ctx, &mut rng, kind, plan.retries_max, &st.tally, async |t| {
            body(t, kind, input).await
        })
        .await;
    }
}

/// The specification's unsuccessful outcome: the row it needs is not there.
fn missing() -> Abort {
    Abort(AbortReason::User)
}

/// One attempt; returns the call forwardings it inserts and deletes.
async fn body<E: Endpoint>(t: &mut Txn<'_, E>, kind: u8, i: Input) -> Result<TatpCounts, Abort> {
    match kind {
        0 => {
            t.read(SUBSCRIBER, sub_key(i.s)).await?;
            Ok(TatpCounts::default())
        }
        1 => {
            // GET_NEW_DESTINATION: an active facility and a forwarding covering the time.
            let f = t.read(SPECIAL_FACILITY, sf_key(i.s, i.ty)).await?;
            if !t.exists(f) || t.get(f)[sf::FLAGS] & 1 == 0 {
                return Err(missing());
            }
            let keys = [0u64, 8, 16].map(|start| (CALL_FORWARDING, cf_key(i.s, i.ty, start)));
            let fwd = t.read_many(keys, false).await?;
            let found = [0u64, 8, 16].iter().zip(fwd).any(|(&start, r)| {
                t.exists(r) && start <= i.start && i.end < t.get(r)[cf::END_TIME]
            });
            if found {
                Ok(TatpCounts::default())
            } else {
                Err(missing())
            }
        }
        2 => {
            let a = t.read(ACCESS_INFO, ai_key(i.s, i.ty)).await?;
            if t.exists(a) {
                Ok(TatpCounts::default())
            } else {
                Err(missing())
            }
        }
        3 => {
            // UPDATE_SUBSCRIBER_DATA: bit_1 of the subscriber, data_a of a facility.
            let [s, f] = t
                .read_many(
                    [(SUBSCRIBER, sub_key(i.s)), (SPECIAL_FACILITY, sf_key(i.s, i.ty))],
                    true,
                )
                .await?;
            if !t.exists(f) {
                return Err(missing());
            }
            t.update(s)[sub::BITS] = (t.get(s)[sub::BITS] & !1) | (i.value & 1);
            let flags = t.get(f)[sf::FLAGS];
            t.update(f)[sf::FLAGS] = (flags & 0xFFFF) | ((i.value >> 8) & 0xFF) << 16;
            Ok(TatpCounts::default())
        }
        4 => {
            // UPDATE_LOCATION, by subscriber number.
            let s = lookup(t, i.s).await?;
            let r = t.read_for_update(SUBSCRIBER, sub_key(s)).await?;
            t.update(r)[sub::VLR_LOCATION] = i.value & 0xFFFF_FFFF;
            Ok(TatpCounts::default())
        }
        5 => {
            // INSERT_CALL_FORWARDING: the facility must exist and the forwarding not.
            let s = lookup(t, i.s).await?;
            let keys = [1u64, 2, 3, 4].map(|ty| (SPECIAL_FACILITY, sf_key(s, ty)));
            let facilities = t.read_many(keys, false).await?;
            if !t.exists(facilities[i.ty as usize - 1]) {
                return Err(missing());
            }
            let c = t.read(CALL_FORWARDING, cf_key(s, i.ty, i.start)).await?;
            if t.exists(c) {
                return Err(missing());
            }
            // An absent record read earlier is created by the insert (the lock phase
            // checks it is still absent).
            t.insert_over(c, &[i.start + i.end.clamp(1, 8), i.value, i.value >> 8])?;
            Ok(TatpCounts { cf_inserted: 1, cf_deleted: 0 })
        }
        _ => {
            // DELETE_CALL_FORWARDING.
            let s = lookup(t, i.s).await?;
            let c = t.read(CALL_FORWARDING, cf_key(s, i.ty, i.start)).await?;
            if !t.exists(c) {
                return Err(missing());
            }
            t.delete(c);
            Ok(TatpCounts { cf_inserted: 0, cf_deleted: 1 })
        }
    }
}

/// The subscriber id of a subscriber number, through the `sub_nbr` table.
async fn lookup<E: Endpoint>(t: &mut Txn<'_, E>, sub_nbr: u64) -> Result<u64, Abort> {
    let r = t.read(SUB_NBR, sub_nbr - 1).await?;
    if !t.exists(r) {
        return Err(missing());
    }
    Ok(t.get(r)[0])
}

impl Workload for Tatp {
    type State = Rc<ClientState>;
    type Report = TatpReport;

    fn name(&self) -> &'static str {
        "tatp"
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn validate(&self, _shape: ClusterShape) -> Result<(), String> {
        if self.params.subscribers_per_worker == 0 {
            return Err("tatp: at least one subscriber per worker is needed".into());
        }
        Ok(())
    }

    fn tables(&self, shape: ClusterShape) -> Vec<TableSpec> {
        let subs = self.params.subscribers_per_worker * shape.workers_total() as u64;
        let per_node = subs.div_ceil(u64::from(shape.nodes)) + 1;
        let spec = |id: TableId, name: &str, words: u16, group: u64| TableSpec {
            id,
            name: name.into(),
            payload_words: words,
            capacity: per_node * group,
            // A subscriber's rows are `group` consecutive keys: one partition holds them.
            partitioner: Partitioner::Range { keys_per_partition: group },
            index: IndexLayout::Sequential,
            fill: Fill::Dense,
        };
        vec![
            spec(SUBSCRIBER, "subscriber", SUB_WORDS, 1),
            spec(ACCESS_INFO, "access_info", AI_WORDS, 4),
            spec(SPECIAL_FACILITY, "special_facility", SF_WORDS, 4),
            spec(CALL_FORWARDING, "call_forwarding", CF_WORDS, 12),
            spec(SUB_NBR, "sub_nbr", 1, 1),
        ]
    }

    fn load(&self, engine: &Engine, shape: ClusterShape) -> Result<(), StoreError> {
        let subs = self.params.subscribers_per_worker * shape.workers_total() as u64;
        let mut rng = Rng::derive(self.params.seed, 0x7A_7000);
        let mut cf_rows = 0;
        for s in 1..=subs {
            let mut row = [0u64; SUB_WORDS as usize];
            row[0] = s; // sub_nbr: the id, zero-padded to 15 digits
            row[sub::BITS] = rng.below(1 << 10);
            row[3] = rng.below(1 << 40); // hex_1..hex_10
            row[4] = rng.next_u64(); // byte2_1..byte2_8
            row[5] = rng.below(1 << 16); // byte2_9..byte2_10
            row[6] = 1 + rng.below(u64::from(u32::MAX)); // msc_location
            row[sub::VLR_LOCATION] = 1 + rng.below(u64::from(u32::MAX));
            engine.load(SUBSCRIBER, sub_key(s), &row)?;
            engine.load(SUB_NBR, s - 1, &[s])?;
            for ty in some_types(&mut rng) {
                engine.load(ACCESS_INFO, ai_key(s, ty), &[rng.below(1 << 16), rng.next_u64()])?;
            }
            for ty in some_types(&mut rng) {
                // is_active: 85% of facilities.
                let active = u64::from(rng.below(100) < 85);
                let flags = active | rng.below(256) << 8 | rng.below(256) << 16;
                engine.load(SPECIAL_FACILITY, sf_key(s, ty), &[flags, rng.next_u64()])?;
                for start in [0u64, 8, 16] {
                    if rng.below(2) == 0 {
                        let end = start + 1 + rng.below(8);
                        engine.load(
                            CALL_FORWARDING,
                            cf_key(s, ty, start),
                            &[end, rng.next_u64(), 0],
                        )?;
                        cf_rows += 1;
                    }
                }
            }
        }
        self.loaded_cf.store(cf_rows, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn spawn<E: Endpoint + 'static>(
        &self,
        w: &mut Worker<E>,
        wt: &Rc<WorkerTxn>,
        plan: ClientPlan,
    ) -> Rc<ClientState> {
        let st = Rc::new(ClientState {
            subscribers: self.params.subscribers_per_worker * w.co().shape().workers_total() as u64,
            uniform: self.params.uniform,
            tally: Tallies::new(plan.coroutines),
        });
        spawn_clients(w, wt, plan, |ctx, rng| client(ctx, rng, plan, st.clone()));
        st
    }

    fn report(&self, st: Rc<ClientState>) -> TatpReport {
        st.tally.report()
    }

    fn check(&self, engine: &Engine, reports: &[TatpReport]) -> InvariantReport {
        let TatpCounts { cf_inserted: inserted, cf_deleted: deleted } =
            Tally::total(reports, engine);
        let loaded = self.loaded_cf.load(std::sync::atomic::Ordering::Relaxed);
        let present = |table: TableId, key: u64| {
            let replica = engine.primary_of(table, key);
            replica
                .lookup(key)
                .is_some_and(|off| hytra_store::layout::is_present(replica.header(off).version))
        };
        let (mut rows, mut orphans) = (0u64, 0u64);
        for primary in engine.primaries(CALL_FORWARDING) {
            for (off, key) in primary.records() {
                if hytra_store::layout::is_present(primary.header(off).version) {
                    rows += 1;
                    if !present(SPECIAL_FACILITY, key / 3) {
                        orphans += 1;
                    }
                }
            }
        }
        let expected = loaded + inserted - deleted;
        let mut details = vec![format!(
            "call forwardings: {rows}, expected {expected} ({loaded} loaded + {inserted} inserted - {deleted} deleted); {orphans} without their facility"
        )];
        let (replicas_ok, more) = check_replicas(engine);
        details.extend(more);
        InvariantReport { ok: rows == expected && orphans == 0 && replicas_ok, details }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_group_a_subscribers_rows() {
        // With the range partitioner over groups, every row of subscriber s falls in
        // partition (s - 1) % nodes.
        for s in 1..50u64 {
            assert_eq!(sf_key(s, 4) / 4, s - 1);
            assert_eq!(cf_key(s, 4, 16) / 12, s - 1);
            assert_eq!(cf_key(s, 2, 8) / 3, sf_key(s, 2));
        }
    }

    #[test]
    fn subscriber_choice_stays_in_range() {
        let mut rng = Rng::new(3);
        for _ in 0..10_000 {
            assert!((1..=1000).contains(&subscriber(&mut rng, 1000, false)));
        }
    }
}
