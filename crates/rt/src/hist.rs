//! A log-linear latency histogram: fixed memory, constant-time record, mergeable.
//!
//! Values (nanoseconds) are bucketed by their power of two and the next `SUB_BITS` bits,
//! so every bucket spans at most 1/64 of its values (1.6% relative error). Histograms of
//! different workers and nodes merge by adding counts, which is how cluster-wide
//! percentiles are computed (never by averaging per-node percentiles).

const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// Counts of values by bucket.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    max: u64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram").field("total", &self.total).field("max", &self.max).finish()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // >= SUB_BITS
    let shift = exp - SUB_BITS;
    let sub = (v >> shift) as usize - SUB; // 0..SUB
    (shift as usize + 1) * SUB + sub
}

/// Smallest value of a bucket.
fn bucket_low(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let shift = (b / SUB - 1) as u32;
    ((SUB + b % SUB) as u64) << shift
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Histogram {
        Histogram { counts: vec![0; BUCKETS].into_boxed_slice(), total: 0, max: 0 }
    }

    /// Records one value.
    pub fn record(&mut self, v: u64) {
        self.counts[bucket(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Largest value recorded.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0.0..=1.0): the midpoint of the bucket holding it, or 0
    /// if empty.
    pub fn quantile(&self, q: f64) -> u64 {
        assert!((0.0..=1.0).contains(&q), "quantile {q} outside 0..=1");
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = (bucket_low(b), bucket_low(b + 1));
                return (lo + (hi - lo) / 2).min(self.max);
            }
        }
        self.max
    }

    /// Non-empty buckets as (lowest value, count), for exporting a histogram.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(b, &c)| (bucket_low(b), c))
    }

    /// Adds `count` values at `value` (the inverse of [`Histogram::buckets`]).
    pub fn record_n(&mut self, value: u64, count: u64) {
        self.counts[bucket(value)] += count;
        self.total += count;
        self.max = self.max.max(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        for v in [0, 1, 63, 64, 65, 127, 128, 1000, 123_456, u64::MAX / 3] {
            let b = bucket(v);
            assert!(bucket_low(b) <= v && v < bucket_low(b + 1).max(bucket_low(b) + 1), "{v}");
            let width = bucket_low(b + 1) - bucket_low(b);
            assert!(width * 64 <= v.max(64), "bucket of {v} too wide: {width}");
        }
    }

    #[test]
    fn quantiles_within_two_percent_and_merge_adds() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        for v in 1..=10_000u64 {
            if v % 2 == 0 {
                a.record(v)
            } else {
                b.record(v)
            }
        }
        a.merge(&b);
        assert_eq!(a.count(), 10_000);
        for (q, want) in [(0.5, 5_000.0), (0.9, 9_000.0), (0.99, 9_900.0)] {
            let got = a.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.02, "q{q}: {got} vs {want}");
        }
        assert_eq!(a.quantile(1.0), 10_000);
        let mut c = Histogram::new();
        for (v, n) in a.buckets() {
            c.record_n(v, n);
        }
        assert_eq!(c.count(), a.count());
        assert!((c.quantile(0.5) as f64 - 5000.0).abs() < 100.0);
    }
}
