//! The loop of a thread that runs several workers in real time, shared by the `local` and
//! `ucx` backends: step each program in turn, count the ones that finished, and give the
//! core away when none had work. Not for: deciding when a run stops (each backend checks
//! its own conditions when [`Stepper::round`] says so).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::endpoint::{Program, Step};

/// Idle rounds a thread spins before it yields its core to other threads.
const IDLE_SPINS_MAX: u32 = 64;

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

    /// Steps every program once; `on_idle(i)` runs after program `i` reports no work.
    /// Programs that became done are added to `done_total`. When none was busy, spins or
    /// (after a while) yields: on two cores, a thread that only spins would hold the core
    /// a descheduled peer needs to answer. Returns true when the caller should check
    /// whether to stop.
    pub(crate) fn round<P: Program>(
        &mut self,
        programs: &mut [P],
        done_total: &AtomicUsize,
        mut on_idle: impl FnMut(usize),
    ) -> bool {
        let mut busy = false;
        for (i, p) in programs.iter_mut().enumerate() {
            if p.step() == Step::Busy {
                busy = true;
            } else {
                on_idle(i);
            }
            if !self.done[i] && p.is_done() {
                self.done[i] = true;
                done_total.fetch_add(1, Ordering::AcqRel);
            }
        }
        if busy {
            self.idle_rounds = 0;
        } else {
            self.idle_rounds += 1;
            if self.idle_rounds > IDLE_SPINS_MAX {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.rounds += 1;
        self.rounds % CHECK_EVERY_ROUNDS == 0
    }
}
