//! Counters of a transaction worker.

use hytra_rt::hist::Histogram;

use crate::outcome::AbortReason;

/// Transaction types a workload may distinguish in reports.
pub const TXN_TYPES_MAX: usize = 16;

/// Phases of a read-write transaction, in order.
pub const PHASES: [&str; 4] = ["execution", "validation", "logging", "commit"];

/// What one worker counted (inside its measurement window).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TxnStats {
    /// Committed transactions.
    pub commits: u64,
    /// Aborted attempts by reason (retries included).
    pub aborts: [u64; AbortReason::ALL.len()],
    /// Transactions abandoned after too many attempts.
    pub gave_up: u64,
    /// Per type: (commits, aborted attempts).
    pub per_type: [(u64, u64); TXN_TYPES_MAX],
    /// Latency of committed transactions, first attempt to commit.
    pub latency: Histogram,
    /// Time of committed transactions' last attempt spent in each phase (sums).
    pub phase_ns: [u64; 4],
    /// One-sided reads that found a record torn and read again.
    pub torn_reads: u64,
    /// Reads of records that a location-cache entry pointed to wrongly.
    pub stale_cache: u64,
    /// Remote reads that found their record in the location cache.
    pub cache_hits: u64,
    /// Remote reads that did not (only counted when a cache is in use).
    pub cache_misses: u64,
}

impl Default for TxnStats {
    fn default() -> Self {
        TxnStats {
            commits: 0,
            aborts: [0; AbortReason::ALL.len()],
            gave_up: 0,
            per_type: [(0, 0); TXN_TYPES_MAX],
            latency: Histogram::new(),
            phase_ns: [0; 4],
            torn_reads: 0,
            stale_cache: 0,
            cache_hits: 0,
            cache_misses: 0,
        }
    }
}

impl TxnStats {
    /// Adds another worker's counters.
    pub fn merge(&mut self, o: &TxnStats) {
        self.commits += o.commits;
        for (a, b) in self.aborts.iter_mut().zip(o.aborts) {
            *a += b;
        }
        self.gave_up += o.gave_up;
        for (a, b) in self.per_type.iter_mut().zip(o.per_type) {
            a.0 += b.0;
            a.1 += b.1;
        }
        self.latency.merge(&o.latency);
        for (a, b) in self.phase_ns.iter_mut().zip(o.phase_ns) {
            *a += b;
        }
        self.torn_reads += o.torn_reads;
        self.stale_cache += o.stale_cache;
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
    }

    /// Aborted attempts of every reason.
    pub fn aborts_total(&self) -> u64 {
        self.aborts.iter().sum()
    }

    /// Attempts aborted by concurrency control (conflicts, failed validation, lost
    /// messages...) over all attempts: the workload's own aborts excluded.
    pub fn cc_abort_rate(&self) -> f64 {
        let user = self.aborts[AbortReason::User.index()];
        let a = self.aborts_total() - user;
        if a + self.commits == 0 {
            0.0
        } else {
            a as f64 / (a + self.commits + user) as f64
        }
    }

    /// Aborted attempts over all attempts.
    pub fn abort_rate(&self) -> f64 {
        let a = self.aborts_total();
        if a + self.commits == 0 {
            0.0
        } else {
            a as f64 / (a + self.commits) as f64
        }
    }
}
