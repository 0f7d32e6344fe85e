//! The per-worker executor: a fixed set of task slots and a ready bitmap.
//!
//! Each slot gets one `Waker` when its task is spawned; waking sets the slot's bit.
//! Completions and replies wake tasks through those wakers, so the data path allocates
//! nothing. Each step makes one pass over the ready tasks in a fixed order, which keeps
//! the simulator deterministic: the tasks spawned to go first (the engine's own, short
//! ones), then the rest in slot order. A pass may stop early (the worker's step budget);
//! the next one resumes the rest where it stopped, so none waits behind more than one
//! round of the others. Not for: deciding what a task waits on (see `ops.rs`, `rpc.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::constants::TASKS_MAX;

const WORDS: usize = TASKS_MAX / 64;

/// Which task slots are ready to run. Atomic only because `Waker` must be `Send + Sync`;
/// it is used by one thread.
#[derive(Default)]
pub(crate) struct ReadySet {
    words: [AtomicU64; WORDS],
}

impl ReadySet {
    fn set(&self, slot: usize) {
        self.words[slot / 64].fetch_or(1 << (slot % 64), Ordering::Relaxed);
    }

    pub(crate) fn any(&self) -> bool {
        self.words.iter().any(|w| w.load(Ordering::Relaxed) != 0)
    }

    /// Takes (clears and returns) the ready bits of `word`.
    fn take(&self, word: usize) -> u64 {
        // A plain load first: most words are empty in most steps, and the swap is a
        // locked instruction. A bit set after the load waits for the next step's pass.
        if self.words[word].load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.words[word].swap(0, Ordering::Relaxed)
    }

    /// Marks the slots of `bits` in `word` ready again (a pass that stopped early).
    fn put_back(&self, word: usize, bits: u64) {
        self.words[word].fetch_or(bits, Ordering::Relaxed);
    }
}

struct SlotWaker {
    ready: Arc<ReadySet>,
    slot: usize,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.ready.set(self.slot);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.set(self.slot);
    }
}

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// Task slots of one worker.
pub(crate) struct Executor {
    ready: Arc<ReadySet>,
    tasks: Vec<Option<Task>>,
    wakers: Vec<Waker>,
    /// Slots whose tasks go first in every pass.
    first: [u64; WORDS],
    /// Where the next pass starts among the other tasks: the slot after the last one
    /// polled when a pass stopped early with tasks still ready; 0 otherwise.
    cursor: usize,
    live: usize,
}

impl Executor {
    pub(crate) fn new() -> Executor {
        Executor {
            ready: Arc::new(ReadySet::default()),
            tasks: Vec::new(),
            wakers: Vec::new(),
            first: [0; WORDS],
            cursor: 0,
            live: 0,
        }
    }

    pub(crate) fn ready(&self) -> &Arc<ReadySet> {
        &self.ready
    }

    /// Adds a task; it runs at the next step. Panics beyond `TASKS_MAX`.
    pub(crate) fn spawn(&mut self, task: Task) {
        self.spawn_as(task, Order::Slot);
    }

    /// Adds a task polled in the given order. Panics beyond `TASKS_MAX`.
    pub(crate) fn spawn_as(&mut self, task: Task, order: Order) {
        let slot = match self.tasks.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                assert!(self.tasks.len() < TASKS_MAX, "more than {TASKS_MAX} tasks on one worker");
                let slot = self.tasks.len();
                self.tasks.push(None);
                self.wakers
                    .push(Waker::from(Arc::new(SlotWaker { ready: self.ready.clone(), slot })));
                slot
            }
        };
        self.tasks[slot] = Some(task);
        let bit = 1 << (slot % 64);
        match order {
            Order::Slot => self.first[slot / 64] &= !bit,
            Order::First => self.first[slot / 64] |= bit,
        }
        self.live += 1;
        self.ready.set(slot);
    }

    /// Tasks not yet finished.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Polls the ready tasks: those spawned [`Order::First`], then the others from the
    /// cursor on, wrapping around; `before_poll` runs before each (the simulator charges
    /// a context switch there). After each poll of the others, `stop` says whether the
    /// step has run long enough: if so and tasks are still ready, the pass ends there and
    /// the cursor moves to the following slot. Each word of the ready set is read once,
    /// when the pass first reaches it (a task woken in a word already read waits for the
    /// next pass), so while the first tasks hold the lowest slots and no pass stops, every
    /// pass polls exactly as one in plain slot order. Returns how many tasks were polled.
    pub(crate) fn run_ready(
        &mut self,
        mut before_poll: impl FnMut(),
        mut stop: impl FnMut() -> bool,
    ) -> usize {
        let mut polled = 0;
        // Per word, what was read of it and is not yet polled.
        let mut read: [Option<u64>; WORDS] = [None; WORDS];
        for (word, r) in read.iter_mut().enumerate() {
            let first = self.first[word];
            if first != 0 {
                let bits = self.ready.take(word);
                polled += self.poll_word(word, bits & first, &mut before_poll);
                *r = Some(bits & !first);
            }
        }
        let start = self.cursor;
        self.cursor = 0;
        // From the cursor to the end, then from the first slot up to the cursor.
        for (lo, hi) in [(start, TASKS_MAX), (0, start)] {
            for word in lo / 64..hi.div_ceil(64) {
                let span = span_mask(word, lo, hi);
                let mut bits = match &mut read[word] {
                    Some(rest) => std::mem::replace(rest, *rest & !span) & span,
                    None => {
                        let bits = self.ready.take(word);
                        // Bits of this word outside the span: the wrap-around's turn.
                        read[word] = Some(bits & !span);
                        bits & span
                    }
                };
                while bits != 0 {
                    let slot = word * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    polled += self.poll_word(word, 1 << (slot % 64), &mut before_poll);
                    let left =
                        bits != 0 || read.iter().flatten().any(|&r| r != 0) || self.ready.any();
                    if left && stop() {
                        self.ready.put_back(word, bits);
                        for (w, r) in read.iter().enumerate() {
                            if let Some(r) = *r {
                                self.ready.put_back(w, r);
                            }
                        }
                        self.cursor = (slot + 1) % TASKS_MAX;
                        return polled;
                    }
                }
            }
        }
        debug_assert!(read.iter().flatten().all(|&r| r == 0), "a pass left read tasks unpolled");
        polled
    }

    /// Polls the tasks of `bits` in `word`, in slot order; returns how many there were.
    fn poll_word(&mut self, word: usize, mut bits: u64, before_poll: &mut impl FnMut()) -> usize {
        let mut polled = 0;
        while bits != 0 {
            let slot = word * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let Some(task) = self.tasks.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            before_poll();
            polled += 1;
            let mut cx = Context::from_waker(&self.wakers[slot]);
            if task.as_mut().poll(&mut cx).is_ready() {
                self.tasks[slot] = None;
                self.live -= 1;
            }
        }
        polled
    }
}

/// Where a task stands in a worker's pass over its ready tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// In slot order; after a pass stopped early, the next resumes where it stopped.
    Slot,
    /// Before the others in every pass, and never put off by a pass that stops early:
    /// for short tasks, some of which keep time (lease renewals). A task woken while its
    /// pass runs waits for the next.
    First,
}

/// The bits of `word` whose slots lie in `lo..hi`.
fn span_mask(word: usize, lo: usize, hi: usize) -> u64 {
    let (base, end) = (word * 64, word * 64 + 64);
    let (from, to) = (lo.max(base) - base, hi.min(end).saturating_sub(base));
    if from >= to {
        return 0;
    }
    let upper = if to == 64 { u64::MAX } else { (1u64 << to) - 1 };
    upper & !((1u64 << from) - 1)
}

/// A future that yields once: the task is rescheduled for the next step.
pub struct YieldNow {
    yielded: bool,
}

impl YieldNow {
    pub(crate) fn new() -> Self {
        YieldNow { yielded: false }
    }
}

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[test]
    fn tasks_run_in_slot_order_and_finish() {
        let mut ex = Executor::new();
        let log = Rc::new(std::cell::RefCell::new(Vec::new()));
        for i in 0..3 {
            let log = log.clone();
            ex.spawn(Box::pin(async move {
                log.borrow_mut().push(i);
                YieldNow::new().await;
                log.borrow_mut().push(10 + i);
            }));
        }
        assert_eq!(ex.run_ready(|| {}, || false), 3);
        assert_eq!(*log.borrow(), vec![0, 1, 2]);
        assert!(ex.ready().any(), "yielded tasks are ready again");
        assert_eq!(ex.run_ready(|| {}, || false), 3);
        assert_eq!(*log.borrow(), vec![0, 1, 2, 10, 11, 12]);
        assert_eq!(ex.live(), 0);
        assert!(!ex.ready().any());
    }

    /// Whether a test task wakes itself at every poll (yields) or waits to be woken.
    #[derive(Clone, Copy)]
    enum Wakes {
        Itself,
        Never,
    }

    /// Spawns `n` tasks (the first `first` of them to go first) that log their index at
    /// every poll, forever, and wake themselves as `wakes` says.
    fn spawn_logging(
        ex: &mut Executor,
        n: usize,
        first: usize,
        wakes: Wakes,
    ) -> Rc<std::cell::RefCell<Vec<usize>>> {
        let log = Rc::new(std::cell::RefCell::new(Vec::new()));
        for i in 0..n {
            let log = log.clone();
            let task = std::future::poll_fn(move |cx| {
                log.borrow_mut().push(i);
                if let Wakes::Itself = wakes {
                    cx.waker().wake_by_ref();
                }
                std::task::Poll::<()>::Pending
            });
            let order = if i < first { Order::First } else { Order::Slot };
            ex.spawn_as(Box::pin(task), order);
        }
        log
    }

    /// Tasks that yield at every poll: ready again for the next pass.
    fn loggers(ex: &mut Executor, n: usize, first: usize) -> Rc<std::cell::RefCell<Vec<usize>>> {
        spawn_logging(ex, n, first, Wakes::Itself)
    }

    #[test]
    fn a_pass_stopped_early_resumes_after_the_first_tasks_where_it_stopped() {
        let mut ex = Executor::new();
        let log = loggers(&mut ex, 6, 1);
        // Stop after the third of the other tasks.
        let mut n = 0;
        let stop = || {
            n += 1;
            n >= 3
        };
        assert_eq!(ex.run_ready(|| {}, stop), 4);
        assert_eq!(*log.borrow(), vec![0, 1, 2, 3]);
        log.borrow_mut().clear();
        // The next pass: the first task, then 4 and 5, then around to 1, 2 and 3.
        assert_eq!(ex.run_ready(|| {}, || false), 6);
        assert_eq!(*log.borrow(), vec![0, 4, 5, 1, 2, 3]);
        log.borrow_mut().clear();
        // A pass that was not stopped leaves the next one in slot order.
        assert_eq!(ex.run_ready(|| {}, || false), 6);
        assert_eq!(*log.borrow(), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn passes_stopped_after_every_poll_still_reach_every_task() {
        let mut ex = Executor::new();
        let n = 130; // across three words of the ready set
        let log = loggers(&mut ex, n, 2);
        let mut passes = 0;
        while log.borrow().iter().collect::<std::collections::BTreeSet<_>>().len() < n {
            passes += 1;
            assert!(passes <= n, "some task was never polled: {:?}", log.borrow());
            ex.run_ready(|| {}, || true);
        }
        // Each pass polls the two first tasks and one other, the others in turn.
        assert_eq!(passes, n - 2);
        let log = log.borrow();
        for (k, pass) in log.chunks(3).enumerate() {
            assert_eq!(pass, &[0, 1, k + 2], "pass {k}");
        }
    }

    #[test]
    fn a_pass_stopped_at_the_last_slot_wraps_to_the_first() {
        let mut ex = Executor::new();
        let log = loggers(&mut ex, TASKS_MAX, 1);
        // Stop at slot 255: the next pass starts the others over at slot 1.
        let mut n = 0;
        let stop = || {
            n += 1;
            n == TASKS_MAX - 1
        };
        assert_eq!(ex.run_ready(|| {}, stop), TASKS_MAX);
        assert_eq!(ex.cursor, 0);
        log.borrow_mut().clear();
        let mut n = 0;
        let stop = || {
            n += 1;
            n == 2
        };
        assert_eq!(ex.run_ready(|| {}, stop), 3);
        assert_eq!(*log.borrow(), vec![0, 1, 2]);
    }

    #[test]
    fn a_task_woken_in_a_word_already_read_waits_for_the_next_pass() {
        let mut ex = Executor::new();
        let log = Rc::new(std::cell::RefCell::new(Vec::new()));
        // A task that logs itself and wakes `wakes` at every poll, and never ends.
        let mut waker_of = |order: Order, me: usize, wakes: &'static [usize]| {
            let (log, ready) = (log.clone(), ex.ready().clone());
            let task = std::future::poll_fn(move |_| {
                log.borrow_mut().push(me);
                wakes.iter().for_each(|&w| ready.set(w));
                std::task::Poll::<()>::Pending
            });
            ex.spawn_as(Box::pin(task), order);
        };
        waker_of(Order::First, 0, &[2]);
        waker_of(Order::Slot, 1, &[0, 64]);
        waker_of(Order::Slot, 2, &[]);
        for me in 3..64 {
            waker_of(Order::Slot, me, &[]);
        }
        waker_of(Order::Slot, 64, &[]);
        ex.run_ready(|| {}, || false); // every task's first poll
        for w in 0..WORDS {
            ex.ready.take(w);
        }
        log.borrow_mut().clear();
        ex.ready().set(1);
        // Slot 1 wakes 0, in the word this pass already read (the next pass polls it),
        // and 64, in a word it has not (this pass does).
        assert_eq!(ex.run_ready(|| {}, || false), 2);
        assert_eq!(*log.borrow(), vec![1, 64]);
        log.borrow_mut().clear();
        // The first task wakes 2, in its own word, read before it ran.
        assert_eq!(ex.run_ready(|| {}, || false), 1);
        assert_eq!(ex.run_ready(|| {}, || false), 1);
        assert_eq!(*log.borrow(), vec![0, 2]);
        assert!(!ex.ready().any());
    }

    /// Tasks that never wake themselves: ready only when a test sets them.
    fn sleepers(ex: &mut Executor, n: usize, first: usize) -> Rc<std::cell::RefCell<Vec<usize>>> {
        spawn_logging(ex, n, first, Wakes::Never)
    }

    #[test]
    fn a_stop_with_tasks_ready_only_in_words_not_yet_read_ends_the_pass() {
        let mut ex = Executor::new();
        let log = sleepers(&mut ex, 70, 0);
        ex.run_ready(|| {}, || false);
        log.borrow_mut().clear();
        // Only slots 3 and 66 are ready; 3 does not wake itself again.
        ex.ready().set(3);
        ex.ready().set(66);
        assert_eq!(ex.run_ready(|| {}, || true), 1);
        assert_eq!(*log.borrow(), vec![3]);
        assert_eq!(ex.cursor, 4);
        assert_eq!(ex.run_ready(|| {}, || false), 1);
        assert_eq!(*log.borrow(), vec![3, 66]);
    }

    #[test]
    fn a_stopped_pass_puts_back_what_it_read_and_did_not_poll() {
        // Stopped within word 0, and within word 1.
        for (stop_after, cursor) in [(5, 7), (70, 72)] {
            let mut ex = Executor::new();
            let log = sleepers(&mut ex, 130, 2);
            let mut n = 0;
            let stop = || {
                n += 1;
                n == stop_after
            };
            assert_eq!(ex.run_ready(|| {}, stop), 2 + stop_after);
            assert_eq!(ex.cursor, cursor);
            // Five tasks just below the cursor are woken again: the next pass reads them
            // with the cursor's word and keeps them for its wrap-around, but stops first.
            let again = cursor - 5..cursor;
            again.clone().for_each(|slot| ex.ready().set(slot));
            assert_eq!(ex.run_ready(|| {}, || true), 1);
            assert_eq!(ex.run_ready(|| {}, || false), 130 - 2 - stop_after - 1 + 5);
            let mut seen = log.borrow().clone();
            seen.sort_unstable();
            let mut want: Vec<usize> = (0..130).chain(again).collect();
            want.sort_unstable();
            assert_eq!(seen, want, "stopped at {stop_after}");
            assert!(!ex.ready().any());
        }
    }

    #[test]
    fn a_pass_stopped_with_nothing_left_ready_leaves_slot_order() {
        let mut ex = Executor::new();
        let log = Rc::new(std::cell::RefCell::new(Vec::new()));
        for i in 0..3 {
            let log = log.clone();
            ex.spawn(Box::pin(async move { log.borrow_mut().push(i) }));
        }
        let mut n = 0;
        let stop = || {
            n += 1;
            n >= 3
        };
        assert_eq!(ex.run_ready(|| {}, stop), 3, "nothing is left to put off");
        assert_eq!(*log.borrow(), vec![0, 1, 2]);
        assert_eq!(ex.cursor, 0);
    }

    #[test]
    fn span_masks_cover_exactly_their_slots() {
        for (lo, hi) in [(0, 256), (3, 256), (0, 3), (64, 128), (63, 65), (100, 100)] {
            for word in 0..WORDS {
                let m = span_mask(word, lo, hi);
                for bit in 0..64 {
                    let slot = word * 64 + bit;
                    assert_eq!(
                        m >> bit & 1 == 1,
                        (lo..hi).contains(&slot),
                        "{lo}..{hi} slot {slot}"
                    );
                }
            }
        }
    }

    #[test]
    fn finished_slots_are_reused() {
        let mut ex = Executor::new();
        let n = Rc::new(Cell::new(0));
        for _ in 0..2 * TASKS_MAX {
            let n2 = n.clone();
            ex.spawn(Box::pin(async move { n2.set(n2.get() + 1) }));
            ex.run_ready(|| {}, || false);
        }
        assert_eq!(n.get(), 2 * TASKS_MAX);
        assert_eq!(ex.live(), 0);
    }
}
