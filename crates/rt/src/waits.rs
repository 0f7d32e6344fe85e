//! Coroutines waiting for words in registered memory to reach a value: the completion
//! words a NIC writes when a verb program answers (a get offloaded to the NIC), which no
//! completion queue reports. A worker installs [`Waits::poller`], which wakes every
//! coroutine whose word arrived; each wait also ends at its deadline.
//!
//! Not for: completions of the verbs a worker posts itself (tickets, `ops.rs`) or RPC
//! replies (`rpc.rs`).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use hytra_fabric::{Endpoint, Region};

use crate::{Co, Poller};

/// A coroutine waiting for either of two words to reach a value: region, (offset, wanted
/// value) twice, waker.
type WordWait = (Region, [(u64, u64); 2], Waker);

/// Coroutines of one worker waiting for completion words in registered memory. Install
/// [`Waits::poller`] on the worker; the simulator steps the worker when an answer lands.
#[derive(Clone, Default)]
pub struct Waits {
    pending: Rc<RefCell<Vec<WordWait>>>,
}

impl Waits {
    /// The poller that wakes coroutines whose word reached its value.
    pub fn poller<E: Endpoint + 'static>(&self) -> Poller<E> {
        let pending = self.pending.clone();
        Box::new(move |_co| {
            pending.borrow_mut().retain(|(r, words, w)| {
                if arrived(r, words) {
                    w.wake_by_ref();
                    false
                } else {
                    true
                }
            });
            false
        })
    }

    /// Waits until the word at `at` of `region` equals `want` or the clock passes
    /// `deadline_ns`; returns whether the word arrived.
    pub fn wait<'a, E: Endpoint>(
        &'a self,
        co: &'a Co<E>,
        region: &'a Region,
        at: u64,
        want: u64,
        deadline_ns: u64,
    ) -> impl Future<Output = bool> + 'a {
        self.wait_any(co, region, [(at, want); 2], deadline_ns)
    }

    /// Waits until either word `(offset, value)` of `words` arrived in `region` or the
    /// clock passes `deadline_ns`; returns whether one arrived.
    pub fn wait_any<'a, E: Endpoint>(
        &'a self,
        co: &'a Co<E>,
        region: &'a Region,
        words: [(u64, u64); 2],
        deadline_ns: u64,
    ) -> impl Future<Output = bool> + 'a {
        WaitWord { waits: self, co, region, words, deadline_ns, armed: false }
    }
}

fn arrived(region: &Region, words: &[(u64, u64); 2]) -> bool {
    words.iter().any(|&(at, want)| region.load(at) == want)
}

struct WaitWord<'a, E> {
    waits: &'a Waits,
    co: &'a Co<E>,
    region: &'a Region,
    words: [(u64, u64); 2],
    deadline_ns: u64,
    armed: bool,
}

impl<E: Endpoint> Future for WaitWord<'_, E> {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let arrived = arrived(self.region, &self.words);
        if arrived || self.co.now_ns() >= self.deadline_ns {
            if self.armed {
                // Sequence numbers make a wait's first (offset, value) unique among a
                // worker's waits.
                let first = self.words[0];
                self.waits.pending.borrow_mut().retain(|e| e.1[0] != first);
            }
            return Poll::Ready(arrived);
        }
        // Registered once: a coroutine's waker does not change while it awaits this.
        if !self.armed {
            self.armed = true;
            self.co.wake_at(self.deadline_ns, cx.waker());
            let entry = (self.region.clone(), self.words, cx.waker().clone());
            self.waits.pending.borrow_mut().push(entry);
        }
        Poll::Pending
    }
}
