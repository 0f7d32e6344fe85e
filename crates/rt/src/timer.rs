//! Timers: wake a coroutine once the worker's clock passes a deadline.
//!
//! The worker expires due timers every step and, when idle, asks its backend to step it
//! again at the earliest deadline, so a sleeping coroutine costs nothing in between (the
//! simulator jumps virtual time to it). Entries are never cancelled: a waker that fires
//! after its future has finished only causes one spurious poll.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::task::Waker;

/// One pending wake-up. Ordered by deadline, then by registration order, so that equal
/// deadlines fire in a fixed order (the simulator must replay bit for bit).
struct Entry {
    deadline_ns: u64,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline_ns, self.seq) == (other.deadline_ns, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline_ns, self.seq).cmp(&(other.deadline_ns, other.seq))
    }
}

/// The pending wake-ups of one worker.
#[derive(Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

impl Timers {
    /// Wakes `waker` once the clock reaches `deadline_ns`.
    pub(crate) fn add(&mut self, deadline_ns: u64, waker: Waker) {
        self.seq += 1;
        self.heap.push(Reverse(Entry { deadline_ns, seq: self.seq, waker }));
    }

    /// Wakes every timer due at `now_ns`.
    pub(crate) fn expire(&mut self, now_ns: u64) {
        while self.heap.peek().is_some_and(|e| e.0.deadline_ns <= now_ns) {
            let Reverse(e) = self.heap.pop().expect("peeked");
            e.waker.wake();
        }
    }

    /// The earliest pending deadline.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|e| e.0.deadline_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn fires_due_timers_only_in_deadline_order() {
        let a = Arc::new(Count(AtomicUsize::new(0)));
        let b = Arc::new(Count(AtomicUsize::new(0)));
        let mut t = Timers::default();
        t.add(200, Waker::from(b.clone()));
        t.add(100, Waker::from(a.clone()));
        assert_eq!(t.next_deadline(), Some(100));
        t.expire(99);
        assert_eq!(a.0.load(Ordering::Relaxed), 0);
        t.expire(150);
        assert_eq!((a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed)), (1, 0));
        assert_eq!(t.next_deadline(), Some(200));
        t.expire(200);
        assert_eq!(b.0.load(Ordering::Relaxed), 1);
        assert_eq!(t.next_deadline(), None);
    }
}
