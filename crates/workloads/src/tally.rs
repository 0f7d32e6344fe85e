//! What a worker's clients committed, as a workload counts it for its invariant, and the
//! transactions a crash left in doubt.
//!
//! A coordinator that dies between its commit point and the end of its commit never
//! learns whether recovery committed its transaction; neither do its clients' counts.
//! Each client therefore keeps, from the moment its body finishes until the outcome is
//! known, the attempt and what it would add; the invariant adds the attempts recovery
//! committed ([`hytra_txn::Engine::verdict`]). Not for: the checker's history (the engine
//! keeps that, doubts included).

use std::cell::{Cell, RefCell};
use std::fmt::Debug;
use std::rc::Rc;

use hytra_fabric::rng::Rng;
use hytra_fabric::Endpoint;
use hytra_txn::{Abort, Engine, Txn, TxnCtx};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::bench::run_body;

/// What one committed transaction adds to a workload's expectations: counts that add up.
pub trait Counts:
    Copy + Default + PartialEq + Debug + Serialize + DeserializeOwned + 'static
{
    /// The sum of two counts.
    fn plus(self, other: Self) -> Self;
}

impl Counts for u64 {
    fn plus(self, other: u64) -> u64 {
        self + other
    }
}

impl Counts for i64 {
    fn plus(self, other: i64) -> i64 {
        self + other
    }
}

/// What one worker's clients committed: the counts of the transactions whose outcome they
/// learnt, and the attempts whose outcome their node never learnt (it crashed or left the
/// cluster while they committed) with what each adds if recovery committed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(bound = "C: Counts")]
pub struct Tally<C> {
    /// Counts of the transactions known to have committed.
    pub committed: C,
    /// (attempt, what it adds) of the attempts in doubt.
    #[serde(default)]
    pub in_doubt: Vec<(u64, C)>,
}

impl<C: Counts> Tally<C> {
    /// Every worker's committed counts, plus those of the attempts in doubt that
    /// recovery committed: what the database must show.
    pub fn total(tallies: &[Tally<C>], engine: &Engine) -> C {
        let known = tallies.iter().fold(C::default(), |a, t| a.plus(t.committed));
        let decided =
            tallies.iter().flat_map(|t| &t.in_doubt).filter(|&&(id, _)| engine.verdict(id));
        decided.fold(known, |a, &(_, c)| a.plus(c))
    }
}

/// A worker's running tally, shared by its clients (one thread).
pub struct Tallies<C: Counts> {
    committed: Cell<C>,
    /// Per coroutine, the attempt past its commit point and what it adds.
    committing: RefCell<Vec<Option<(u64, C)>>>,
}

impl<C: Counts> Tallies<C> {
    /// A tally for `coroutines` clients.
    pub fn new(coroutines: u16) -> Rc<Tallies<C>> {
        Rc::new(Tallies {
            committed: Cell::new(C::default()),
            committing: RefCell::new(vec![None; usize::from(coroutines)]),
        })
    }

    /// The tally so far, the attempts in doubt included.
    pub fn report(&self) -> Tally<C> {
        let in_doubt = self.committing.borrow().iter().flatten().copied().collect();
        Tally { committed: self.committed.get(), in_doubt }
    }
}

/// Runs one transaction as [`run_body`] does, counting what its body returns into
/// `tallies` if it commits, and keeping it in doubt while it commits: returns the counts
/// of the committed attempt, `None` if it did not commit (or its node left the cluster
/// before it learnt the outcome).
pub async fn run_counted<E, C, F>(
    ctx: &mut TxnCtx<E>,
    rng: &mut Rng,
    ty: u8,
    retries_max: u32,
    tallies: &Tallies<C>,
    mut body: F,
) -> Option<C>
where
    E: Endpoint,
    C: Counts,
    F: AsyncFnMut(&mut Txn<'_, E>) -> Result<C, Abort>,
{
    let co = usize::from(ctx.index());
    assert!(co < tallies.committing.borrow().len(), "a tally for every client");
    let committed = run_body(ctx, rng, ty, retries_max, async |t| {
        let c = body(t).await?;
        // From here the attempt commits: should its node die before it learns the
        // outcome, the run's end asks recovery.
        tallies.committing.borrow_mut()[co] = Some((t.id(), c));
        t.journal_report(|| serde_json::to_vec(&tallies.report()).expect("a tally serializes"));
        Ok(c)
    })
    .await;
    if ctx.halted() && committed.is_none() {
        // Left the cluster: the last attempt's fate is recovery's to tell.
        return None;
    }
    tallies.committing.borrow_mut()[co] = None;
    if let Some(c) = committed {
        tallies.committed.set(tallies.committed.get().plus(c));
    }
    ctx.journal_report(|| serde_json::to_vec(&tallies.report()).expect("a tally serializes"));
    committed
}
