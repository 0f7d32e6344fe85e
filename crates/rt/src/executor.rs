//! The per-worker executor: a fixed set of task slots and a ready bitmap.
//!
//! Each slot gets one `Waker` when its task is spawned; waking sets the slot's bit.
//! Completions and replies wake tasks through those wakers, so the data path allocates
//! nothing. Tasks run in slot order, one pass per step, which keeps the simulator
//! deterministic. Not for: deciding what a task waits on (see `ops.rs`, `rpc.rs`).

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

    fn take(&self, word: usize) -> u64 {
        // A plain load first: most words are empty in most steps, and the swap is a
        // locked instruction. A bit set after the load waits for the next step's pass.
        if self.words[word].load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.words[word].swap(0, Ordering::Relaxed)
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
    live: usize,
}

impl Executor {
    pub(crate) fn new() -> Executor {
        Executor {
            ready: Arc::new(ReadySet::default()),
            tasks: Vec::new(),
            wakers: Vec::new(),
            live: 0,
        }
    }

    pub(crate) fn ready(&self) -> &Arc<ReadySet> {
        &self.ready
    }

    /// Adds a task; it runs at the next step. Panics beyond `TASKS_MAX`.
    pub(crate) fn spawn(&mut self, task: Task) {
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
        self.live += 1;
        self.ready.set(slot);
    }

    /// Tasks not yet finished.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Polls every task that was ready when the pass began, in slot order; `before_poll`
    /// runs before each (the simulator charges a context switch there). Returns how many
    /// tasks were polled.
    pub(crate) fn run_ready(&mut self, mut before_poll: impl FnMut()) -> usize {
        let mut polled = 0;
        for word in 0..WORDS {
            let mut bits = self.ready.take(word);
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
        }
        polled
    }
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
        assert_eq!(ex.run_ready(|| {}), 3);
        assert_eq!(*log.borrow(), vec![0, 1, 2]);
        assert!(ex.ready().any(), "yielded tasks are ready again");
        assert_eq!(ex.run_ready(|| {}), 3);
        assert_eq!(*log.borrow(), vec![0, 1, 2, 10, 11, 12]);
        assert_eq!(ex.live(), 0);
        assert!(!ex.ready().any());
    }

    #[test]
    fn finished_slots_are_reused() {
        let mut ex = Executor::new();
        let n = Rc::new(Cell::new(0));
        for _ in 0..2 * TASKS_MAX {
            let n2 = n.clone();
            ex.spawn(Box::pin(async move { n2.set(n2.get() + 1) }));
            ex.run_ready(|| {});
        }
        assert_eq!(n.get(), 2 * TASKS_MAX);
        assert_eq!(ex.live(), 0);
    }
}
