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
use hytra_rt::constants::COROUTINES_MAX;
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
        t.journal_tally(|line| Event::Committing { co, id: t.id(), counts: c }.encode(line));
        Ok(c)
    })
    .await;
    if ctx.halted() && committed.is_none() {
        // Left the cluster: the last attempt's fate is recovery's to tell.
        return None;
    }
    let was_committing = tallies.committing.borrow_mut()[co].take().is_some();
    debug_assert!(was_committing || committed.is_none(), "a commit passed its commit point");
    if let Some(c) = committed {
        tallies.committed.set(tallies.committed.get().plus(c));
    }
    if was_committing {
        let settled = Event::<C>::Settled { co, committed: committed.is_some() };
        ctx.journal_tally(|line| settled.encode(line));
    }
    committed
}

/// A client's tally event, one line of its worker's journal: what the journal's reader
/// ([`TallyReader`]) folds back into the worker's [`Tally`]. Events rather than the whole
/// tally, since every transaction journals two of them: a tally lists every client's
/// attempt in doubt.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Event<C> {
    /// Coroutine `co`'s attempt `id` passed its commit point and adds `counts` if it
    /// commits; an earlier attempt of `co` still listed did not commit (an attempt that
    /// validates no more is retried from its body).
    Committing { co: usize, id: u64, counts: C },
    /// The outcome of coroutine `co`'s attempt past its commit point became known.
    Settled { co: usize, committed: bool },
}

impl<C: Counts> Event<C> {
    /// Appends `c co id counts` (counts as JSON) or `s co 0|1` to `line`.
    fn encode(self, line: &mut Vec<u8>) {
        use std::io::Write;
        let written = match self {
            Event::Committing { co, id, counts } => write!(line, "c {co} {id} ")
                .map(|()| serde_json::to_writer(&mut *line, &counts).expect("counts serialize")),
            Event::Settled { co, committed } => write!(line, "s {co} {}", u8::from(committed)),
        };
        written.expect("a Vec takes every write");
    }

    fn decode(line: &[u8]) -> Result<Event<C>, String> {
        let text = std::str::from_utf8(line).map_err(|_| "not UTF-8".to_string())?;
        let mut fields = text.splitn(4, ' ');
        let kind = fields.next().unwrap_or_default();
        let co: usize = number(fields.next(), "coroutine")?;
        if co >= usize::from(COROUTINES_MAX) {
            return Err(format!("coroutine {co} is past the limit of {COROUTINES_MAX}"));
        }
        match kind {
            "c" => {
                let id = number(fields.next(), "attempt")?;
                let counts = fields.next().ok_or("no counts")?;
                let counts = serde_json::from_str(counts).map_err(|e| format!("counts: {e}"))?;
                Ok(Event::Committing { co, id, counts })
            }
            "s" => match fields.next() {
                Some("0") if fields.next().is_none() => Ok(Event::Settled { co, committed: false }),
                Some("1") if fields.next().is_none() => Ok(Event::Settled { co, committed: true }),
                _ => Err("an outcome is 0 or 1".to_string()),
            },
            _ => Err(format!("no tally event {kind:?}")),
        }
    }
}

fn number<T: std::str::FromStr>(field: Option<&str>, what: &str) -> Result<T, String> {
    let field = field.ok_or_else(|| format!("no {what}"))?;
    field.parse().map_err(|_| format!("{what} {field:?} is not a number"))
}

/// Rebuilds a worker's [`Tally`] from the tally events of its journal, in the order they
/// were journaled: what its clients had counted when the journal ends.
#[derive(Debug)]
pub struct TallyReader<C> {
    committed: C,
    committing: Vec<Option<(u64, C)>>,
}

impl<C: Counts> Default for TallyReader<C> {
    fn default() -> Self {
        TallyReader { committed: C::default(), committing: Vec::new() }
    }
}

impl<C: Counts> TallyReader<C> {
    /// Folds in one event (a line's body as [`run_counted`] journaled it); an error says
    /// why the line does not parse or cannot follow the ones before it.
    pub fn read(&mut self, line: &[u8]) -> Result<(), String> {
        match Event::<C>::decode(line)? {
            Event::Committing { co, id, counts } => {
                if self.committing.len() <= co {
                    self.committing.resize(co + 1, None);
                }
                self.committing[co] = Some((id, counts));
            }
            Event::Settled { co, committed } => {
                let Some((_, counts)) = self.committing.get_mut(co).and_then(Option::take) else {
                    return Err(format!("coroutine {co} settles with no attempt committing"));
                };
                if committed {
                    self.committed = self.committed.plus(counts);
                }
            }
        }
        Ok(())
    }

    /// The tally the events add up to (nothing counted if there were none: the worker's
    /// clients never reached a commit point).
    pub fn tally(self) -> Tally<C> {
        Tally {
            committed: self.committed,
            in_doubt: self.committing.into_iter().flatten().collect(),
        }
    }
}

/// A workload's report: each is the [`Tally`] of its own counts, which is what lets the
/// journal of a killed process rebuild it ([`TallyReader`]).
pub trait TallyReport: Sized {
    /// What one transaction adds.
    type Counts: Counts;

    /// The report that is this tally.
    fn from_tally(tally: Tally<Self::Counts>) -> Self;
}

impl<C: Counts> TallyReport for Tally<C> {
    type Counts = C;

    fn from_tally(tally: Tally<C>) -> Self {
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(lines: &[&str]) -> Result<Tally<i64>, String> {
        let mut r = TallyReader::<i64>::default();
        for line in lines {
            r.read(line.as_bytes())?;
        }
        Ok(r.tally())
    }

    #[test]
    fn events_round_trip() {
        for e in [
            Event::Committing { co: 7, id: u64::MAX, counts: -12i64 },
            Event::Committing { co: 0, id: 0, counts: 0 },
            Event::Settled { co: usize::from(COROUTINES_MAX) - 1, committed: true },
            Event::Settled { co: 3, committed: false },
        ] {
            let mut line = Vec::new();
            e.encode(&mut line);
            assert_eq!(Event::decode(&line), Ok(e));
        }
        let counts = crate::ycsb::YcsbCounts { updates: 3, inserts: 1 };
        let ycsb = Event::Committing { co: 2, id: 9, counts };
        let mut line = b"kept ".to_vec();
        ycsb.encode(&mut line);
        assert_eq!(Event::decode(&line[5..]), Ok(ycsb), "appended to what the line held");
    }

    #[test]
    fn the_reader_rebuilds_what_the_clients_counted() {
        // Client 0 commits 5, then passes a commit point that does not validate and a
        // retry that commits 7; client 1 commits 2, then its node dies with 4 in doubt;
        // client 2's attempt aborts after its commit point.
        let lines = [
            "c 0 10 5",
            "c 1 11 2",
            "s 0 1",
            "c 0 12 6",
            "s 1 1",
            "c 0 13 7",
            "c 1 14 4",
            "s 0 1",
            "c 2 15 100",
            "s 2 0",
        ];
        let tally = read_all(&lines).unwrap();
        assert_eq!(tally, Tally { committed: 5 + 2 + 7, in_doubt: vec![(14, 4)] });
        assert_eq!(read_all(&[]), Ok(Tally::default()), "no events, nothing counted");
    }

    #[test]
    fn the_reader_refuses_what_a_journal_cannot_hold() {
        for (line, why) in [
            ("s 0 1", "settles with no attempt"),
            ("c 0 1", "no counts"),
            ("c 0 x 1", "attempt \"x\" is not a number"),
            ("c 99999 1 1", "past the limit"),
            ("c 0 1 {", "counts:"),
            ("s 0 2", "0 or 1"),
            ("s 0 1 1", "0 or 1"),
            ("x 0 1", "no tally event"),
            ("c", "no coroutine"),
        ] {
            let err = read_all(&[line]).unwrap_err();
            assert!(err.contains(why), "{line}: {err}");
        }
        // A settled attempt is settled once.
        let err = read_all(&["c 0 1 1", "s 0 1", "s 0 0"]).unwrap_err();
        assert!(err.contains("settles with no attempt"), "{err}");
    }
}
