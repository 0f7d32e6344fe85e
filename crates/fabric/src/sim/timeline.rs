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
//!
//! The ring of buckets grows (doubling) when a booking reaches past it, up to
//! `MAX_SLOTS`. Beyond that, bookings are kept exactly, as disjoint intervals of time
//! (`far`), and handed to the buckets as they enter the ring: even an overload of many
//! milliseconds never delivers more than the resource's capacity, and one job booked
//! far ahead (a response behind a long queue elsewhere) takes only its own time, not
//! all the time up to it.

use std::collections::BTreeMap;

use crate::sim::core::Ps;

/// Bucket length: 8 ns, the order of one small request's engine time.
const GRAIN: Ps = 8_000;

/// Initial ring: 4096 x 8 ns = 33 us of backlog.
const MIN_SLOTS: u64 = 1 << 12;

/// Largest ring: 2^20 x 8 ns = 8.4 ms of backlog (8 MiB of slots), far beyond any
/// queue a benchmark in steady state builds.
const MAX_SLOTS: u64 = 1 << 20;

/// One bucket's slot in the ring: its used capacity and its skip pointer side by side,
/// since every booking reads both and one cache line then serves it.
#[derive(Clone, Copy, Default)]
struct Slot {
    used: u32,
    /// How many buckets onwards one may have capacity left (0: this one): full buckets
    /// point onwards, so a long backlog is skipped in near-constant time (union-find
    /// with path compression; pointers only ever point forward). Relative, so that a
    /// clean slot stays right for whichever bucket it stands for next.
    skip: u32,
}

/// Capacity used per bucket, in a ring indexed by bucket number.
///
/// A slot is clean when its capacity is unused and it points at itself (`used` 0, `skip`
/// 0): then it stands for any bucket number as well as for another, so recycling it costs
/// nothing. Only the slots of buckets in `[base, dirty_end)` may be otherwise, and only
/// they are reset when time passes them: a resource idle for most of a run (most of a
/// small cluster's links and engines) is not swept bucket by bucket.
pub(crate) struct Timeline {
    /// Buckets in the ring (a power of two).
    slots: u64,
    /// The buckets' slots, bucket `b` at `b % slots`.
    ring: Vec<Slot>,
    /// Bucket number of the oldest live bucket.
    base: u64,
    /// One past the last bucket whose slot may not be clean (at most the horizon).
    dirty_end: u64,
    /// Time booked beyond the ring's horizon: start -> end, disjoint, none touching
    /// another, all at or after the horizon. One interval per job booked out there at
    /// most, so bounded by the jobs in flight.
    far: BTreeMap<Ps, Ps>,
}

const _: () = assert!(GRAIN <= u32::MAX as Ps);
// A skip points at most to the horizon, so it spans at most one ring.
const _: () = assert!(MAX_SLOTS <= u32::MAX as u64);

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            slots: MIN_SLOTS,
            ring: vec![Slot::default(); MIN_SLOTS as usize],
            base: 0,
            dirty_end: 0,
            far: BTreeMap::new(),
        }
    }
}

impl Timeline {
    /// The ring slot of bucket `b` (the ring's length is a power of two, so a mask: a
    /// division here cost more than the rest of a booking).
    fn slot(&self, b: u64) -> usize {
        debug_assert!(self.slots.is_power_of_two());
        (b & (self.slots - 1)) as usize
    }

    fn advance(&mut self, now: Ps) {
        let bucket = now / GRAIN;
        if bucket <= self.base {
            return;
        }
        let slots = self.slots;
        if self.far.is_empty() {
            // Nothing beyond the horizon enters with the recycled slots: only those not
            // clean need resetting (they lie within one ring, so each once).
            for b in self.base..bucket.min(self.dirty_end) {
                let slot = self.slot(b);
                self.ring[slot] = Slot::default();
            }
            self.base = bucket;
            return;
        }
        // Each recycled slot becomes bucket `b + slots`. Capacity booked beyond the
        // horizon in it is taken, or a bucket entering the horizon would offer the same
        // time twice and the resource would exceed its capacity.
        let from = self.base.max(bucket.saturating_sub(slots));
        for b in from..bucket {
            let slot = self.slot(b);
            let taken = self.enter(b + slots);
            self.ring[slot] = Slot { used: taken as u32, skip: u32::from(taken == GRAIN) };
        }
        self.base = bucket;
        // Every slot may have taken far time (a rare overload): all count as not clean.
        self.dirty_end = bucket + slots;
    }

    /// Doubles the ring. Skips are relative to their bucket, whose number is absolute, so
    /// each bucket that is not clean only moves to its slot in the larger ring; the new
    /// slots start clean, but for time booked beyond the old horizon.
    fn grow(&mut self) {
        let (old, new) = (self.slots, self.slots * 2);
        debug_assert!(new <= MAX_SLOTS);
        let mut ring = vec![Slot::default(); new as usize];
        let (old_mask, new_mask) = (old - 1, new - 1);
        for b in self.base..self.dirty_end {
            ring[(b & new_mask) as usize] = self.ring[(b & old_mask) as usize];
        }
        for b in self.base + old..self.base + new {
            let taken = self.enter(b);
            if taken > 0 {
                ring[(b & new_mask) as usize] =
                    Slot { used: taken as u32, skip: u32::from(taken == GRAIN) };
                self.dirty_end = b + 1;
            }
        }
        self.slots = new;
        self.ring = ring;
    }

    /// Bucket `b` enters the ring: returns the time booked in it beyond the horizon,
    /// and forgets every far booking before its end (buckets enter in order, and those
    /// skipped by a jump of time are past).
    fn enter(&mut self, b: u64) -> Ps {
        let (lo, hi) = (b * GRAIN, (b + 1) * GRAIN);
        let mut taken = 0;
        while let Some((&start, &end)) = self.far.first_key_value() {
            if start >= hi {
                break;
            }
            taken += end.min(hi) - start.max(lo).min(end.min(hi));
            self.far.remove(&start);
            if end > hi {
                self.far.insert(hi, end);
                break;
            }
        }
        debug_assert!(taken <= GRAIN);
        taken
    }

    /// Books `dur` beyond the horizon, from `at` on, in the first free time (in pieces
    /// around earlier far bookings); returns when the last piece ends.
    fn book_far(&mut self, mut at: Ps, mut dur: Ps) -> Ps {
        debug_assert!(at >= (self.base + self.slots) * GRAIN, "far bookings are past the ring");
        loop {
            // Out of any interval covering `at`.
            if let Some((_, &end)) = self.far.range(..=at).next_back() {
                if end > at {
                    at = end;
                    continue;
                }
            }
            let gap_end = self.far.range(at..).next().map_or(Ps::MAX, |(&s, _)| s);
            let take = dur.min(gap_end - at);
            self.insert_far(at, at + take);
            dur -= take;
            if dur == 0 {
                return at + take;
            }
            at = gap_end;
        }
    }

    /// Adds the free interval `[start, end)` to the far bookings, merged with the ones
    /// it touches.
    fn insert_far(&mut self, mut start: Ps, mut end: Ps) {
        if let Some((&s, &e)) = self.far.range(..=start).next_back() {
            if e == start {
                self.far.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.far.remove(&end) {
            end = e;
        }
        self.far.insert(start, end);
    }

    /// First bucket at or after `b` with capacity left (or past the horizon).
    fn first_open(&mut self, b: u64) -> u64 {
        let slots = self.slots;
        let horizon = self.base + slots;
        debug_assert!(b >= self.base, "bucket {b} is behind the ring's oldest, {}", self.base);
        let mut root = b;
        while root < horizon {
            let s = self.ring[self.slot(root)].skip;
            if s == 0 {
                break;
            }
            root += u64::from(s);
        }
        let mut x = b;
        while x < root {
            let slot = self.slot(x);
            let s = self.ring[slot].skip;
            debug_assert!(s > 0, "the chain to the root is the one just walked");
            self.ring[slot].skip = (root - x) as u32;
            x += u64::from(s);
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
            if b >= self.base + self.slots {
                if self.slots < MAX_SLOTS {
                    self.grow();
                    continue;
                }
                let end = self.book_far((b * GRAIN).max(at), remaining);
                return end.max(at + dur);
            }
            let index = self.slot(b);
            let slot = &mut self.ring[index];
            let used = Ps::from(slot.used);
            let take = (GRAIN - used).min(remaining);
            slot.used += take as u32;
            if used + take == GRAIN {
                slot.skip = 1;
            }
            self.dirty_end = self.dirty_end.max(b + 1);
            remaining -= take;
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
    fn a_backlog_past_the_ring_grows_it_and_stays_exact() {
        // Jobs of 100 buckets arrive every bucket: the backlog grows far past the
        // initial ring. Capacity must be conserved exactly (no time handed out twice,
        // none lost): the last job ends when all the work is done.
        let mut t = Timeline::default();
        let job = 100 * GRAIN;
        let jobs = 4 * MIN_SLOTS / 100;
        let mut last = 0;
        for k in 0..jobs {
            last = last.max(t.book(k * GRAIN, job, k * GRAIN));
        }
        assert_eq!(last, jobs * job);
        assert!(t.slots > MIN_SLOTS, "the ring grew");
        // A booking far ahead leaves the time before it to earlier work.
        let mut t = Timeline::default();
        let far = 3 * MIN_SLOTS * GRAIN;
        assert_eq!(t.book(far, GRAIN, 0), far + GRAIN);
        assert_eq!(t.book(0, GRAIN, 0), GRAIN);
    }

    #[test]
    fn time_past_the_ring_is_not_handed_out_twice() {
        // One job backs the resource up to twice the largest ring; the part past it is
        // booked beyond the horizon. Once time moves on and those buckets enter the
        // ring, a new job must still queue behind it.
        let mut t = Timeline::default();
        let horizon = MAX_SLOTS * GRAIN;
        assert_eq!(t.book(0, 2 * horizon, 0), 2 * horizon);
        assert_eq!(t.slots, MAX_SLOTS);
        let now = horizon + horizon / 2;
        assert_eq!(t.book(now, GRAIN, now), 2 * horizon + GRAIN);
    }

    #[test]
    fn a_lone_booking_far_ahead_takes_only_its_own_time() {
        // A job booked past the largest ring (a response behind a long queue elsewhere)
        // must not make the time before it look busy once that time enters the ring.
        let mut t = Timeline::default();
        let horizon = MAX_SLOTS * GRAIN;
        assert_eq!(t.book(3 * horizon, GRAIN, 0), 3 * horizon + GRAIN);
        assert_eq!(t.book(3 * horizon, GRAIN, 0), 3 * horizon + 2 * GRAIN, "queues behind it");
        assert_eq!(t.book(2 * horizon, GRAIN, 0), 2 * horizon + GRAIN, "earlier, so first");
        let now = horizon + horizon / 2;
        assert_eq!(t.book(now, GRAIN, now), now + GRAIN);
        // Those far jobs still hold their time once it is inside the ring.
        let now = 3 * horizon - GRAIN;
        assert_eq!(t.book(now, 3 * GRAIN, now), 3 * horizon + 4 * GRAIN);
    }

    #[test]
    fn a_far_job_fills_the_gaps_between_earlier_far_jobs() {
        let mut t = Timeline::default();
        let h = MAX_SLOTS * GRAIN;
        t.book(2 * h, GRAIN, 0);
        t.book(2 * h + 2 * GRAIN, GRAIN, 0);
        // Two grains of work from 2h: the one free grain between them, then after.
        assert_eq!(t.book(2 * h, 2 * GRAIN, 0), 2 * h + 4 * GRAIN);
        assert_eq!(t.far.len(), 1, "touching intervals merge");
    }

    /// The buckets' meaning without a ring: every bucket kept for ever, looked up by
    /// number. Within the largest ring's backlog, the timeline must book exactly so.
    #[derive(Default)]
    struct Unbounded(std::collections::HashMap<u64, Ps>);

    impl Unbounded {
        fn book(&mut self, at: Ps, dur: Ps) -> Ps {
            let (mut b, mut remaining) = (at / GRAIN, dur);
            if dur == 0 {
                return at;
            }
            loop {
                let used = self.0.entry(b).or_insert(0);
                let take = (GRAIN - *used).min(remaining);
                let start = *used;
                *used += take;
                remaining -= take;
                if remaining == 0 {
                    return (b * GRAIN + start + take).max(at + dur);
                }
                b += 1;
            }
        }
    }

    /// Random bookings (near and ahead, short and long, with time jumping past the
    /// ring now and then, so that slots are reused long after their last booking) end
    /// exactly when they would on buckets that are never recycled.
    #[test]
    fn bookings_match_buckets_that_are_never_recycled() {
        for seed in 0..20 {
            let mut rng = crate::rng::Rng::derive(seed, 7);
            let (mut t, mut reference) = (Timeline::default(), Unbounded::default());
            let mut now = 0;
            for round in 0..20_000 {
                now += match rng.below(20) {
                    0 => rng.below(3 * MIN_SLOTS * GRAIN),
                    1..=9 => 0,
                    _ => rng.below(4 * GRAIN),
                };
                let at = now
                    + match rng.below(4) {
                        0 => 0,
                        1 => rng.below(MIN_SLOTS * GRAIN),
                        _ => rng.below(64 * GRAIN),
                    };
                let dur = match rng.below(8) {
                    0 => 0,
                    1 => rng.below(200 * GRAIN),
                    _ => rng.below(2 * GRAIN),
                };
                assert_eq!(
                    t.book(at, dur, now),
                    reference.book(at, dur),
                    "seed {seed}, round {round}: {dur} ps at {at}, now {now}"
                );
            }
            assert!(t.far.is_empty(), "nothing past the largest ring");
        }
    }

    /// Far bookings that enter the ring (the slow path of `advance`) leave every slot
    /// counted as not clean; once they are past, the fast path resets those slots, and
    /// the time after them is whole again.
    #[test]
    fn slots_that_took_far_time_are_clean_again_once_passed() {
        let mut t = Timeline::default();
        let horizon = MAX_SLOTS * GRAIN;
        // Past the largest ring: booked far, then taken by the buckets as they enter.
        assert_eq!(t.book(0, 2 * horizon, 0), 2 * horizon);
        assert!(!t.far.is_empty());
        let now = horizon + horizon / 2;
        assert_eq!(t.book(now, GRAIN, now), 2 * horizon + GRAIN, "behind the long job");
        assert!(t.far.is_empty(), "every far booking has entered the ring");
        // Long after: every slot free, on the fast path, whatever it held.
        let later = 5 * horizon;
        for k in 0..4 * MIN_SLOTS {
            let at = later + k * GRAIN;
            assert_eq!(t.book(at, GRAIN, at), at + GRAIN, "bucket {k} after the jump");
        }
        assert!(t.ring.iter().all(|s| s.used == 0 || s.used == GRAIN as u32));
    }

    #[test]
    fn old_buckets_are_recycled() {
        let mut t = Timeline::default();
        t.book(0, GRAIN, 0);
        let later = MIN_SLOTS * GRAIN;
        assert_eq!(t.book(later, GRAIN, later), later + GRAIN, "bucket 0's slot is free again");
    }
}
