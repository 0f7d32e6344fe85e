//! The loop of a thread that runs several workers in real time, shared by the `local` and
//! `ucx` backends: step each program in turn, count the ones that finished, and give the
//! core away when none had work (by yielding, or by the backend's own way of resting
//! until something arrives). Not for: deciding when a run stops (each backend checks its
//! own conditions when [`Stepper::round`] says so).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::endpoint::{Program, Step};

/// Rounds between two yields of a thread that always has work. When a machine runs more
/// busy threads than it has cores (several processes of a cluster on one host), the
/// scheduler would otherwise let a thread keep its core for a whole time slice, while
/// the peers that wait on a descheduled one (a backup's log acknowledgement, an RPC's
/// reply) make no progress; on two cores that halved TPC-C across three processes.
/// With a free core, the yield returns at once: one system call per 64 rounds.
const BUSY_YIELD_ROUNDS: u64 = 64;

/// Rounds between two checks of the stop conditions.
const CHECK_EVERY_ROUNDS: u64 = 64;

/// Round-robin stepping of one thread's programs.
pub(crate) struct Stepper {
    done: Vec<bool>,
    /// Whether each program is stepped (node faults of the threads backend hold some).
    run: Vec<Run>,
    rounds: u64,
    /// Rounds in a row, up to this one, in which no program made progress.
    idle_rounds: u64,
}

/// What a thread's rest is told: when to be back, and how long it has been idle.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) struct Rest {
    /// The earliest time (on the run's clock) a program asked to be woken at, if any.
    pub(crate) wake_at: Option<u64>,
    /// Rounds in a row without progress, this one included: 1 on the first idle round
    /// after work.
    pub(crate) idle_rounds: u64,
}

/// Whether a program is stepped.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Run {
    Stepped,
    /// Not stepped for now (its node is paused).
    Held,
    /// Never stepped again (its node crashed); it counts as done.
    Halted,
}

impl Stepper {
    /// A stepper for `programs` programs.
    pub(crate) fn new(programs: usize) -> Stepper {
        Stepper {
            done: vec![false; programs],
            run: vec![Run::Stepped; programs],
            rounds: 0,
            idle_rounds: 0,
        }
    }

    /// Stops stepping program `i` while `held`, or steps it again; a halted program
    /// stays halted.
    pub(crate) fn hold(&mut self, i: usize, held: bool) {
        if self.run[i] != Run::Halted {
            self.run[i] = if held { Run::Held } else { Run::Stepped };
        }
    }

    /// Never steps program `i` again, and counts it in `done_total` as done if it was
    /// not: its node is gone, and the run must not wait for it.
    pub(crate) fn halt(&mut self, i: usize, done_total: &AtomicUsize) {
        self.run[i] = Run::Halted;
        if !self.done[i] {
            self.done[i] = true;
            done_total.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Steps every program once; `on_idle(i)` runs after program `i` reports no work
    /// left. Programs that became done are added to `done_total`. Then pauses as
    /// [`Stepper::pause`] says: a round without progress calls `rest` with the earliest
    /// time a program asked to be woken at (if any) and the idle rounds in a row, and
    /// `rest` gives the core away until then or until something arrives, or for less.
    /// Returns true when the caller should check whether to stop.
    pub(crate) fn round<P: Program>(
        &mut self,
        programs: &mut [P],
        done_total: &AtomicUsize,
        mut on_idle: impl FnMut(usize),
        rest: impl FnOnce(Rest),
    ) -> bool {
        let mut progressed = false;
        let mut wake_at: Option<u64> = None;
        for (i, p) in programs.iter_mut().enumerate() {
            if self.run[i] != Run::Stepped {
                continue;
            }
            match p.step() {
                Step::Busy => progressed = true,
                Step::Idle { progressed: worked, wake_at_ns } => {
                    progressed |= worked;
                    wake_at = match (wake_at, wake_at_ns) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    on_idle(i);
                }
            }
            if !self.done[i] && p.is_done() {
                self.done[i] = true;
                done_total.fetch_add(1, Ordering::AcqRel);
            }
        }
        match self.pause(progressed) {
            Pause::Keep => {}
            Pause::Yield => std::thread::yield_now(),
            Pause::Rest => rest(Rest { wake_at, idle_rounds: self.idle_rounds }),
        }
        self.rounds % CHECK_EVERY_ROUNDS == 0
    }

    /// Counts a round that made progress or not, and says what the thread does with its
    /// core: when some program made progress, keep it, but yield every
    /// [`BUSY_YIELD_ROUNDS`] rounds all the same; when none did, rest at once. A thread
    /// that spins without work holds the core that a descheduled peer needs to answer
    /// it: three processes on two cores over TCP ran SmallBank 1.8x faster resting at
    /// once than after 64 idle rounds (a round over TCP costs a system call, so 64 of
    /// them are about 100 µs), and with a core to spare resting costs nothing measurable
    /// (docs/PERFORMANCE.md §18).
    fn pause(&mut self, progressed: bool) -> Pause {
        self.rounds += 1;
        self.idle_rounds = if progressed { 0 } else { self.idle_rounds + 1 };
        if !progressed {
            Pause::Rest
        } else if self.rounds % BUSY_YIELD_ROUNDS == 0 {
            Pause::Yield
        } else {
            Pause::Keep
        }
    }
}

/// What a thread does with its core after a round.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Pause {
    /// Goes on at once.
    Keep,
    /// Offers the core to other threads first, then goes on.
    Yield,
    /// Nothing to do for a while: the backend's rest (a yield, or a sleep until an event).
    Rest,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ends every step idle, having done work or not.
    struct Idle {
        progressed: bool,
        wake_at_ns: Option<u64>,
    }

    impl Idle {
        fn new(progressed: bool) -> Idle {
            Idle { progressed, wake_at_ns: None }
        }
    }

    impl Program for Idle {
        fn step(&mut self) -> Step {
            Step::Idle { wake_at_ns: self.wake_at_ns, progressed: self.progressed }
        }

        fn is_done(&self) -> bool {
            false
        }
    }

    #[test]
    fn only_rounds_without_progress_rest() {
        let done = AtomicUsize::new(0);
        let mut programs = [Idle::new(true), Idle::new(false)];
        let mut s = Stepper::new(programs.len());
        let mut idled = 0;
        for _ in 0..100 {
            s.round(
                &mut programs,
                &done,
                |_| idled += 1,
                |_| panic!("rounds with work never rest"),
            );
        }
        // Both still count as out of work (the backend progresses their workers).
        assert_eq!(idled, 2 * 100);
        programs[0].progressed = false;
        let mut rests = 0;
        for _ in 0..100 {
            s.round(&mut programs, &done, |_| {}, |_| rests += 1);
        }
        assert_eq!(rests, 100);
        assert_eq!(done.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn busy_threads_yield_now_and_then_and_idle_ones_rest_at_once() {
        let mut s = Stepper::new(1);
        let busy: Vec<Pause> = (0..4 * BUSY_YIELD_ROUNDS).map(|_| s.pause(true)).collect();
        let yields: Vec<usize> = (0..busy.len()).filter(|&i| busy[i] == Pause::Yield).collect();
        let every = BUSY_YIELD_ROUNDS as usize;
        assert_eq!(yields, [every - 1, 2 * every - 1, 3 * every - 1, 4 * every - 1]);
        assert!(busy.iter().all(|&p| p != Pause::Rest));
        assert_eq!(s.pause(false), Pause::Rest);
        assert_eq!(s.pause(false), Pause::Rest);
        assert_eq!(s.pause(true), Pause::Keep);
    }

    #[test]
    fn a_resting_thread_is_told_the_earliest_wake_up_asked_for() {
        let done = AtomicUsize::new(0);
        let mut programs = [Idle::new(false), Idle::new(false), Idle::new(false)];
        programs[0].wake_at_ns = Some(900);
        programs[2].wake_at_ns = Some(300);
        let mut s = Stepper::new(programs.len());
        let mut told = Vec::new();
        for _ in 0..2 {
            s.round(&mut programs, &done, |_| {}, |r| told.push((r.wake_at, r.idle_rounds)));
        }
        assert_eq!(told, [(Some(300), 1), (Some(300), 2)]);
        for p in &mut programs {
            p.wake_at_ns = None;
        }
        s.round(&mut programs, &done, |_| {}, |r| told.push((r.wake_at, r.idle_rounds)));
        assert_eq!(told.last(), Some(&(None, 3)));
        // Work starts the count again.
        programs[1].progressed = true;
        s.round(&mut programs, &done, |_| {}, |_| panic!("a round with work never rests"));
        programs[1].progressed = false;
        s.round(&mut programs, &done, |_| {}, |r| told.push((r.wake_at, r.idle_rounds)));
        assert_eq!(told.last(), Some(&(None, 1)));
    }
}
