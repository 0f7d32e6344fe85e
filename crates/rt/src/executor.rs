//! The per-worker executor: a fixed set of task slots and a ready bitmap.
//!
//! Each slot gets one `Waker` when its task is spawned; waking sets the slot's bit.
//! Completions and replies wake tasks through those wakers, so the data path allocates
//! nothing. Tasks run in slot order, one pass per step, which keeps the simulator
//! deterministic. A pass may stop early (the worker's step budget): the next one then
//! polls the tasks spawned to go first, and resumes the others where this one stopped, so
//! that no task waits behind more than one round of the rest. Not for: deciding what a
//! task waits on (see `ops.rs`, `rpc.rs`).

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

    /// Takes (clears and returns) the ready bits of `word` within `mask`.
    fn take(&self, word: usize, mask: u64) -> u64 {
        // A plain load first: most words are empty in most steps, and the swap is a
        // locked instruction. A bit set after the load waits for the next step's pass.
        if self.words[word].load(Ordering::Relaxed) & mask == 0 {
            return 0;
        }
        match mask {
            u64::MAX => self.words[word].swap(0, Ordering::Relaxed),
            _ => self.words[word].fetch_and(!mask, Ordering::Relaxed) & mask,
        }
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
    /// Slots whose tasks go first in a pass that resumes one stopped early.
    first: [u64; WORDS],
    /// Where the next pass resumes: the slot after the last one polled when a pass
    /// stopped early with tasks still ready; 0 (a pass in slot order) otherwise.
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

    /// Polls the ready tasks, in slot order; `before_poll` runs before each (the
    /// simulator charges a context switch there). After each poll, `stop` says whether
    /// the step has run long enough: if so and tasks are still ready, the pass ends there,
    /// and the next begins with the ready tasks spawned [`Order::First`], then resumes
    /// the others at the following slot, wrapping around. A pass that is never stopped
    /// is the plain slot-order pass. Returns how many tasks were polled.
    pub(crate) fn run_ready(
        &mut self,
        mut before_poll: impl FnMut(),
        mut stop: impl FnMut() -> bool,
    ) -> usize {
        let mut polled = 0;
        let start = self.cursor;
        self.cursor = 0;
        if start != 0 {
            for word in 0..WORDS {
                let bits = self.ready.take(word, self.first[word]);
                polled += self.poll_word(word, bits, &mut before_poll);
            }
        }
        // From the cursor to the end, then from the first slot up to the cursor; in a
        // resumed pass, the tasks that went first have had their turn.
        for (lo, hi) in [(start, TASKS_MAX), (0, start)] {
            for word in lo / 64..hi.div_ceil(64) {
                let had_turn = if start != 0 { self.first[word] } else { 0 };
                let mut bits = self.ready.take(word, span_mask(word, lo, hi) & !had_turn);
                while bits != 0 {
                    let slot = word * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    polled += self.poll_word(word, 1 << (slot % 64), &mut before_poll);
                    if stop() && (bits != 0 || self.ready.any()) {
                        self.ready.put_back(word, bits);
                        self.cursor = (slot + 1) % TASKS_MAX;
                        return polled;
                    }
                }
            }
        }
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
    /// Also before the others in a pass that resumes one stopped early: for tasks that
    /// must keep time (lease renewals), which then wait at most one step.
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

    /// Spawns `n` tasks (the first `first` of them to go first) that log their index
    /// and yield, forever.
    fn loggers(ex: &mut Executor, n: usize, first: usize) -> Rc<std::cell::RefCell<Vec<usize>>> {
        let log = Rc::new(std::cell::RefCell::new(Vec::new()));
        for i in 0..n {
            let log = log.clone();
            let order = if i < first { Order::First } else { Order::Slot };
            ex.spawn_as(
                Box::pin(async move {
                    loop {
                        log.borrow_mut().push(i);
                        YieldNow::new().await;
                    }
                }),
                order,
            );
        }
        log
    }

    #[test]
    fn a_pass_stopped_early_resumes_after_the_first_tasks_where_it_stopped() {
        let mut ex = Executor::new();
        let log = loggers(&mut ex, 6, 1);
        // Stop after the third poll of the pass.
        let mut n = 0;
        assert_eq!(
            ex.run_ready(
                || {},
                || {
                    n += 1;
                    n >= 3
                }
            ),
            3
        );
        assert_eq!(*log.borrow(), vec![0, 1, 2]);
        log.borrow_mut().clear();
        // The next pass: the first task, then 3, 4, 5, then around to 1 and 2; task 0's
        // own turn in slot order does not come twice.
        assert_eq!(ex.run_ready(|| {}, || false), 6);
        assert_eq!(*log.borrow(), vec![0, 3, 4, 5, 1, 2]);
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
        // The first pass polls task 0; each after it the two first tasks and one other.
        assert_eq!(passes, n - 1);
        let log = log.borrow();
        for pass in log[1..].chunks(3) {
            assert_eq!(&pass[..2], &[0, 1], "the first tasks lead every resumed pass");
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
