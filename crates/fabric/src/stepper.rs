//! The loop of a thread that runs several workers in real time, shared by the `local` and
//! `ucx` backends: step each program in turn, count the ones that finished, and give the
//! core away when none had work. Not for: deciding when a run stops (each backend checks
//! its own conditions when [`Stepper::round`] says so).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::endpoint::{Program, Step};

/// Rounds without progress a thread spins before it yields its core to other threads.
const IDLE_SPINS_MAX: u32 = 64;

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
    idle_rounds: u32,
    rounds: u64,
}

impl Stepper {
    /// A stepper for `programs` programs.
    pub(crate) fn new(programs: usize) -> Stepper {
        Stepper { done: vec![false; programs], idle_rounds: 0, rounds: 0 }
    }

    /// Steps every program once; `on_idle(i)` runs after program `i` reports no work
    /// left. Programs that became done are added to `done_total`. Then pauses as
    /// [`Stepper::pause`] says. Returns true when the caller should check whether to
    /// stop.
    pub(crate) fn round<P: Program>(
        &mut self,
        programs: &mut [P],
        done_total: &AtomicUsize,
        mut on_idle: impl FnMut(usize),
    ) -> bool {
        let mut progressed = false;
        for (i, p) in programs.iter_mut().enumerate() {
            match p.step() {
                Step::Busy => progressed = true,
                Step::Idle { progressed: worked, .. } => {
                    progressed |= worked;
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
            Pause::Spin => std::hint::spin_loop(),
            Pause::Yield => std::thread::yield_now(),
        }
        self.rounds % CHECK_EVERY_ROUNDS == 0
    }

    /// Counts a round that made progress or not, and says what the thread does with its
    /// core: when no program made progress, spin, and after a while yield (a thread that
    /// only spins would hold the core a descheduled peer needs to answer); when some did,
    /// keep it, but yield every [`BUSY_YIELD_ROUNDS`] rounds all the same.
    fn pause(&mut self, progressed: bool) -> Pause {
        self.rounds += 1;
        if progressed {
            self.idle_rounds = 0;
            if self.rounds % BUSY_YIELD_ROUNDS == 0 {
                Pause::Yield
            } else {
                Pause::Keep
            }
        } else {
            self.idle_rounds += 1;
            if self.idle_rounds > IDLE_SPINS_MAX {
                Pause::Yield
            } else {
                Pause::Spin
            }
        }
    }
}

/// What a thread does with its core after a round.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Pause {
    /// Goes on at once.
    Keep,
    /// Goes on after a spin-loop hint.
    Spin,
    /// Offers the core to other threads first.
    Yield,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ends every step idle, having done work or not.
    struct Idle {
        progressed: bool,
    }

    impl Program for Idle {
        fn step(&mut self) -> Step {
            Step::Idle { wake_at_ns: None, progressed: self.progressed }
        }

        fn is_done(&self) -> bool {
            false
        }
    }

    #[test]
    fn only_rounds_without_progress_count_towards_yielding() {
        let done = AtomicUsize::new(0);
        let mut programs = [Idle { progressed: true }, Idle { progressed: false }];
        let mut s = Stepper::new(programs.len());
        let mut idled = 0;
        for _ in 0..3 * IDLE_SPINS_MAX {
            s.round(&mut programs, &done, |_| idled += 1);
        }
        // One program ended each step with work done: no round counted as idle.
        assert_eq!(s.idle_rounds, 0);
        // Both still count as out of work (the backend progresses their workers).
        assert_eq!(idled, 2 * 3 * IDLE_SPINS_MAX);
        programs[0].progressed = false;
        for _ in 0..3 * IDLE_SPINS_MAX {
            s.round(&mut programs, &done, |_| {});
        }
        assert_eq!(s.idle_rounds, 3 * IDLE_SPINS_MAX);
        assert_eq!(done.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn busy_threads_yield_now_and_then_idle_ones_after_spinning() {
        let mut s = Stepper::new(1);
        let busy: Vec<Pause> = (0..4 * BUSY_YIELD_ROUNDS).map(|_| s.pause(true)).collect();
        let yields: Vec<usize> = (0..busy.len()).filter(|&i| busy[i] == Pause::Yield).collect();
        let every = BUSY_YIELD_ROUNDS as usize;
        assert_eq!(yields, [every - 1, 2 * every - 1, 3 * every - 1, 4 * every - 1]);
        assert!(busy.iter().all(|&p| p != Pause::Spin));
        let idle: Vec<Pause> = (0..2 * IDLE_SPINS_MAX).map(|_| s.pause(false)).collect();
        let spins = IDLE_SPINS_MAX as usize;
        assert!(idle[..spins].iter().all(|&p| p == Pause::Spin));
        assert!(idle[spins..].iter().all(|&p| p == Pause::Yield));
        // Progress ends the idle spell: spinning starts over.
        assert_eq!(s.pause(true), Pause::Keep);
        assert_eq!(s.pause(false), Pause::Spin);
    }
}
