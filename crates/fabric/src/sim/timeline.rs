//! A resource's capacity over time (a NIC engine, an atomic unit, a link direction), so
//! that work can be booked at any future time without blocking work that comes earlier.
//!
//! The simulator books some resources ahead of the current event (a READ's response on
//! the requester's link is known when the request executes). A single "free from" time
//! would make every earlier user queue behind such a booking. Instead, time is cut into
//! buckets of `GRAIN`; each bucket has `GRAIN` of capacity, and a job takes capacity from
//! the bucket of its ready time onwards. Capacity is conserved exactly, so throughput
//! limits are exact whatever the booking order; a job's end time is exact to within one
//! bucket. Buckets behind the current event time are recycled.

use crate::sim::core::Ps;

/// Bucket length: 8 ns, the order of one small request's engine time.
const GRAIN: Ps = 8_000;

/// Buckets ahead of the current time: 32768 x 8 ns = 262 us of backlog. Beyond that, a
/// job queues after everything (a FIFO tail), which only matters under gross overload.
const SLOTS: u64 = 1 << 15;

/// Capacity used per bucket, in a ring indexed by bucket number.
pub(crate) struct Timeline {
    used: Vec<u32>,
    /// Per bucket, a bucket number at or after it that may have capacity left: full
    /// buckets point onwards, so a long backlog is skipped in near-constant time
    /// (union-find with path compression; pointers only ever point forward).
    next: Vec<u64>,
    /// Bucket number of the oldest live bucket.
    base: u64,
    /// End of the FIFO tail beyond the horizon.
    tail_free: Ps,
}

const _: () = assert!(GRAIN <= u32::MAX as Ps);

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            used: vec![0; SLOTS as usize],
            next: (0..SLOTS).collect(),
            base: 0,
            tail_free: 0,
        }
    }
}

impl Timeline {
    fn advance(&mut self, now: Ps) {
        let bucket = now / GRAIN;
        if bucket <= self.base {
            return;
        }
        // Each recycled slot becomes bucket `b + SLOTS`, empty and pointing at itself.
        let from = self.base.max(bucket.saturating_sub(SLOTS));
        for b in from..bucket {
            let slot = (b % SLOTS) as usize;
            self.used[slot] = 0;
            self.next[slot] = b + SLOTS;
        }
        self.base = bucket;
    }

    /// First bucket at or after `b` with capacity left (or past the horizon).
    fn first_open(&mut self, b: u64) -> u64 {
        let horizon = self.base + SLOTS;
        let mut root = b;
        while root < horizon {
            let n = self.next[(root % SLOTS) as usize];
            if n == root {
                break;
            }
            root = n;
        }
        let mut x = b;
        while x < root {
            let slot = (x % SLOTS) as usize;
            let n = self.next[slot];
            self.next[slot] = root;
            x = n;
        }
        root
    }

    /// Books `dur` of capacity from `at` on; returns when the job is done. `now` is the
    /// current event time (nothing is booked before it).
    pub(crate) fn book(&mut self, at: Ps, dur: Ps, now: Ps) -> Ps {
        debug_assert!(at >= now, "booking in the past");
        self.advance(now);
        if dur == 0 {
            return at;
        }
        let mut b = at / GRAIN;
        let mut remaining = dur;
        loop {
            b = self.first_open(b);
            if b >= self.base + SLOTS {
                let start = (b * GRAIN).max(self.tail_free);
                self.tail_free = start + remaining;
                return self.tail_free.max(at + dur);
            }
            let slot = &mut self.used[(b % SLOTS) as usize];
            let used = Ps::from(*slot);
            let take = (GRAIN - used).min(remaining);
            *slot += take as u32;
            remaining -= take;
            if used + take == GRAIN {
                self.next[(b % SLOTS) as usize] = b + 1;
            }
            if remaining == 0 {
                return (b * GRAIN + used + take).max(at + dur);
            }
            b += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_to_back_jobs_queue() {
        let mut t = Timeline::default();
        assert_eq!(t.book(0, 3_000, 0), 3_000);
        assert_eq!(t.book(0, 3_000, 0), 6_000);
        assert_eq!(t.book(0, 3_000, 0), 9_000, "spills into the next bucket");
        assert_eq!(t.book(100_000, 3_000, 0), 103_000, "an idle resource starts at once");
    }

    #[test]
    fn a_future_booking_does_not_block_earlier_work() {
        let mut t = Timeline::default();
        assert_eq!(t.book(1_000_000, 5_000, 0), 1_005_000);
        assert_eq!(t.book(0, 5_000, 0), 5_000);
    }

    #[test]
    fn capacity_is_conserved_in_any_order() {
        // 1000 jobs of 4 ns booked in scrambled order end by 4 us: no capacity is lost.
        let mut t = Timeline::default();
        let mut ends = Vec::new();
        for k in 0..1000u64 {
            let at = (k * 7919) % 1000 * 10;
            ends.push(t.book(at, 4_000, 0));
        }
        let last = *ends.iter().max().unwrap();
        assert!(last <= 4_000_000 + GRAIN, "last job ended at {last}");
    }

    #[test]
    fn old_buckets_are_recycled() {
        let mut t = Timeline::default();
        t.book(0, GRAIN, 0);
        let later = SLOTS * GRAIN;
        assert_eq!(t.book(later, GRAIN, later), later + GRAIN, "bucket 0's slot is free again");
    }
}
