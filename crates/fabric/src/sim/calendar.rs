//! The simulator's event queue: a calendar of short buckets in front of a heap.
//!
//! Almost every event is scheduled a few nanoseconds to a few microseconds ahead (a
//! worker's next step, a request's arrival, a line of a transfer), and at the paper's
//! cluster size thousands are pending at once. A single binary heap over all of them
//! costs a dozen cache-missing levels per pop. Here time is cut into buckets of
//! `2^SHIFT` ps; the buckets within `RING` of the current one are unsorted lists, only
//! the current bucket is a heap (a few dozen events), and the rare event beyond the
//! ring (timers, leases) waits in a far heap until its bucket comes up.
//!
//! The order is exactly the binary heap's, (time, sequence), whatever the bucket width:
//! buckets are taken in time order, and inside one the heap orders by both keys. So a
//! run replays bit for bit against the same seed, as before.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::sim::core::{Ps, Timed};

/// Bucket width: 2^13 ps = 8.2 ns, about one small request's NIC time; at the paper's
/// cluster size a bucket holds a few dozen events.
const SHIFT: u32 = 13;
/// Buckets in the ring: 1024 x 8.2 ns = 8.4 us ahead, beyond any network round trip.
const RING: u64 = 1 << 10;
const WORDS: usize = (RING / 64) as usize;

/// Events ordered by (time, sequence). Times pushed must not be before the last popped.
pub(super) struct EventQueue {
    /// Bucket number of `current`.
    bucket: u64,
    /// Events of bucket `bucket`, as a heap.
    current: BinaryHeap<Reverse<Timed<u32>>>,
    /// Events of the next `RING - 1` buckets, unsorted, at `bucket % RING`.
    ring: Vec<Vec<Timed<u32>>>,
    /// Which ring slots hold events.
    occupied: [u64; WORDS],
    /// Events in the ring.
    in_ring: usize,
    /// Events beyond the ring.
    far: BinaryHeap<Reverse<Timed<u32>>>,
    /// Time of the last event popped (pushes before it are a bug).
    last: Ps,
}

impl EventQueue {
    pub(super) fn new() -> EventQueue {
        EventQueue {
            bucket: 0,
            current: BinaryHeap::new(),
            ring: (0..RING).map(|_| Vec::new()).collect(),
            occupied: [0; WORDS],
            in_ring: 0,
            far: BinaryHeap::new(),
            last: 0,
        }
    }

    pub(super) fn push(&mut self, t: Timed<u32>) {
        assert!(t.at >= self.last, "event at {} ps queued behind time {} ps", t.at, self.last);
        let b = t.at >> SHIFT;
        if b <= self.bucket {
            // Also an event due in the current bucket's past part: it is still not before
            // the last popped, and the heap puts it in order.
            self.current.push(Reverse(t));
        } else if b < self.bucket + RING {
            let slot = (b % RING) as usize;
            self.ring[slot].push(t);
            self.occupied[slot / 64] |= 1 << (slot % 64);
            self.in_ring += 1;
        } else {
            self.far.push(Reverse(t));
        }
    }

    /// Time of the next event, if any.
    pub(super) fn peek_at(&mut self) -> Option<Ps> {
        if self.current.is_empty() {
            self.refill();
        }
        self.current.peek().map(|Reverse(t)| t.at)
    }

    /// Whether an event is due at or before `at`, without moving the calendar on as a
    /// peek at an empty current bucket does (it would jump to the next occupied bucket,
    /// and every event pushed before that bucket would then go to the current heap).
    pub(super) fn any_due_by(&self, at: Ps) -> bool {
        if self.current.peek().is_some_and(|Reverse(t)| t.at <= at) {
            return true;
        }
        // Every event of a bucket up to `bucket` is in `current`; the ring holds the
        // next `RING - 1` buckets, the far heap only later ones.
        let b = at >> SHIFT;
        if b <= self.bucket {
            return false;
        }
        if b >= self.bucket + RING {
            return self.in_ring > 0 || self.far.peek().is_some_and(|Reverse(t)| t.at <= at);
        }
        match self.next_occupied() {
            Some(x) if x < b => true,
            Some(x) if x == b => self.ring[(x % RING) as usize].iter().any(|t| t.at <= at),
            _ => false,
        }
    }

    /// Time has moved to `at` by an event run without the queue (`Core::run_next_in_line`):
    /// what is pushed from now on must not be before it, as after a pop.
    pub(super) fn passed(&mut self, at: Ps) {
        debug_assert!(at >= self.last, "time runs forward");
        self.last = at;
    }

    pub(super) fn pop(&mut self) -> Option<Timed<u32>> {
        if self.current.is_empty() {
            self.refill();
        }
        let Reverse(t) = self.current.pop()?;
        debug_assert!(t.at >= self.last);
        self.last = t.at;
        Some(t)
    }

    /// Moves to the next bucket that holds events and makes it current.
    fn refill(&mut self) {
        debug_assert!(self.current.is_empty());
        let next = match self.next_occupied() {
            Some(b) => b,
            None => match self.far.peek() {
                Some(Reverse(t)) => t.at >> SHIFT,
                None => return,
            },
        };
        // Far events that the ring now covers move into it (or into the new current).
        let old_end = self.bucket + RING;
        self.bucket = next;
        let slot = (next % RING) as usize;
        if self.occupied[slot / 64] & (1 << (slot % 64)) != 0 {
            self.occupied[slot / 64] &= !(1 << (slot % 64));
            // Both lists keep their capacity: no allocation once the run is warm.
            let mut heap = std::mem::take(&mut self.current).into_vec();
            self.in_ring -= self.ring[slot].len();
            heap.extend(self.ring[slot].drain(..).map(Reverse));
            self.current = BinaryHeap::from(heap);
        }
        let new_end = self.bucket + RING;
        if new_end > old_end {
            while let Some(Reverse(t)) = self.far.peek() {
                if t.at >> SHIFT >= new_end {
                    break;
                }
                let Reverse(t) = self.far.pop().expect("peeked");
                self.push(t);
            }
        }
    }

    /// The first bucket after the current one whose ring slot holds events.
    fn next_occupied(&self) -> Option<u64> {
        if self.in_ring == 0 {
            return None;
        }
        let start = ((self.bucket + 1) % RING) as usize;
        // Scan the occupancy bits from `start` round the ring, a word at a time.
        for k in 0..=WORDS {
            let word = (start / 64 + k) % WORDS;
            let mut bits = self.occupied[word];
            if k == 0 {
                bits &= !0u64 << (start % 64);
            } else if k == WORDS {
                bits &= !(!0u64 << (start % 64));
            }
            if bits != 0 {
                let slot = (word * 64 + bits.trailing_zeros() as usize) as u64;
                let offset = (slot + RING - (self.bucket + 1) % RING) % RING;
                return Some(self.bucket + 1 + offset);
            }
        }
        unreachable!("{} events in the ring but no slot marked", self.in_ring)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.current.len() + self.in_ring + self.far.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Pops in exactly the order a binary heap over (time, sequence) would, for a mix of
    /// near, same-bucket, same-time and far events pushed while popping; and says an
    /// event is due by a time exactly when the heap holds one.
    #[test]
    fn the_order_is_the_binary_heaps() {
        for seed in 0..20 {
            let mut rng = Rng::derive(seed, 1);
            let mut q = EventQueue::new();
            let mut reference = BinaryHeap::new();
            let (mut seq, mut now) = (0u64, 0u64);
            let mut popped = 0;
            for round in 0..20_000u32 {
                let pushes = rng.below(3);
                for _ in 0..pushes {
                    seq += 1;
                    let ahead = match rng.below(10) {
                        0 => 0,
                        1 => rng.below(1 << SHIFT),
                        2 => rng.below(RING << SHIFT) * 4, // beyond the ring
                        3 => 10_000_000_000 + rng.below(1 << 30),
                        _ => rng.below(4 << 20),
                    };
                    let t = Timed { at: now + ahead, seq, item: round };
                    reference.push(Reverse(Timed { at: t.at, seq, item: round }));
                    q.push(t);
                }
                if rng.below(4) == 0 {
                    let at = now
                        + match rng.below(3) {
                            0 => rng.below(1 << SHIFT),
                            1 => rng.below(4 << SHIFT),
                            _ => rng.below(RING << SHIFT) * 2,
                        };
                    let due = reference.peek().is_some_and(|Reverse(t)| t.at <= at);
                    let said = q.any_due_by(at);
                    assert_eq!(said, due, "seed {seed} round {round}: due by {at}");
                }
                if rng.below(2) == 0 {
                    assert_eq!(q.len(), reference.len());
                    let got = q.pop().map(|t| (t.at, t.seq));
                    let want = reference.pop().map(|Reverse(t)| (t.at, t.seq));
                    assert_eq!(got, want, "seed {seed} round {round}");
                    if let Some((at, _)) = got {
                        now = at;
                        popped += 1;
                    }
                }
            }
            while let Some(Reverse(t)) = reference.pop() {
                assert_eq!(q.peek_at(), Some(t.at));
                assert_eq!(q.pop().map(|x| (x.at, x.seq)), Some((t.at, t.seq)));
            }
            assert!(q.pop().is_none() && q.len() == 0);
            assert!(popped > 1000);
        }
    }

    #[test]
    #[should_panic(expected = "queued behind")]
    fn an_event_in_the_past_is_refused() {
        let mut q = EventQueue::new();
        q.push(Timed { at: 5_000_000, seq: 1, item: 0 });
        q.pop();
        q.push(Timed { at: 4_000_000, seq: 2, item: 0 });
    }
}
