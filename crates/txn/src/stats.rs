//! Counters of a transaction worker.

use hytra_rt::hist::Histogram;

use crate::outcome::{AbortClass, AbortReason};

/// Transaction types a workload may distinguish in reports.
pub const TXN_TYPES_MAX: usize = 16;

/// Intervals a commit timeline holds at most; commits after the last are not counted
/// in it.
pub const TIMELINE_BUCKETS_MAX: usize = 1 << 16;

/// The phases of a read-write transaction, in the order they run.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Phase {
    /// Reads (and, for some designs, locks) the records the transaction names.
    Execution,
    /// Locks the write set and checks that the records read are unchanged.
    Validation,
    /// Writes the log entries at every backup.
    Logging,
    /// Writes the records back at the primaries and unlocks them.
    Commit,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 4] =
        [Phase::Execution, Phase::Validation, Phase::Logging, Phase::Commit];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Execution => "execution",
            Phase::Validation => "validation",
            Phase::Logging => "logging",
            Phase::Commit => "commit",
        }
    }
}

/// Nanoseconds per phase (a sum over transactions, or one attempt's).
#[derive(Copy, Clone, Default, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct PhaseNs(pub [u64; 4]);

impl PhaseNs {
    /// Adds `other`'s time to this one's, phase by phase.
    pub fn add(&mut self, other: PhaseNs) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// Each phase's time, as `f`, in phase order.
    pub fn map<T>(self, f: impl FnMut(u64) -> T) -> [T; 4] {
        self.0.map(f)
    }
}

impl std::ops::Index<Phase> for PhaseNs {
    type Output = u64;
    fn index(&self, p: Phase) -> &u64 {
        &self.0[p as usize]
    }
}

impl std::ops::IndexMut<Phase> for PhaseNs {
    fn index_mut(&mut self, p: Phase) -> &mut u64 {
        &mut self.0[p as usize]
    }
}

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
    pub phase_ns: PhaseNs,
    /// One-sided reads that found a record torn and read again.
    pub torn_reads: u64,
    /// Reads of records that a location-cache entry pointed to wrongly.
    pub stale_cache: u64,
    /// Remote reads that found their record in the location cache. This counter and
    /// the ones below it count the whole run, warm-up and drain included.
    pub cache_hits: u64,
    /// Remote reads that did not (only counted when a cache is in use).
    pub cache_misses: u64,
    /// Lookups sent to a primary's NIC (offload strategy).
    pub nic_lookups: u64,
    /// Of those, answered with the record.
    pub nic_found: u64,
    /// Of those, answered without it (absent, or not in the NIC's index): read by RPC.
    pub nic_fallbacks: u64,
    /// Lookups not answered within the RPC timeout (read by RPC instead).
    pub nic_timeouts: u64,
    /// Cache misses read by RPC because the coroutine's lookup slot at the node was
    /// taken (parallel reads of one transaction at one node).
    pub nic_busy: u64,
    /// Calls sent again after a timeout (READ, LOCK, VALIDATE of an access).
    pub rpc_resends: u64,
    /// Waits before a retry because the same attempt of another transaction kept a lock
    /// the transaction needed across its blocked attempts (a holder whose node died
    /// keeps it until recovery removes the node).
    #[serde(default)]
    pub stuck_lock_waits: u64,
    /// Commits of the whole run (warm-up included) by interval of the worker's timeline
    /// width: entry `i` counts those in `[i * width, (i + 1) * width)`. Empty unless a
    /// width was set.
    pub timeline: Vec<u64>,
}

impl Default for TxnStats {
    fn default() -> Self {
        TxnStats {
            commits: 0,
            aborts: [0; AbortReason::ALL.len()],
            gave_up: 0,
            per_type: [(0, 0); TXN_TYPES_MAX],
            latency: Histogram::new(),
            phase_ns: PhaseNs::default(),
            torn_reads: 0,
            stale_cache: 0,
            cache_hits: 0,
            cache_misses: 0,
            nic_lookups: 0,
            nic_found: 0,
            nic_fallbacks: 0,
            nic_busy: 0,
            nic_timeouts: 0,
            rpc_resends: 0,
            stuck_lock_waits: 0,
            timeline: Vec::new(),
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
        self.phase_ns.add(o.phase_ns);
        self.torn_reads += o.torn_reads;
        self.stale_cache += o.stale_cache;
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.nic_lookups += o.nic_lookups;
        self.nic_found += o.nic_found;
        self.nic_fallbacks += o.nic_fallbacks;
        self.nic_busy += o.nic_busy;
        self.nic_timeouts += o.nic_timeouts;
        self.rpc_resends += o.rpc_resends;
        self.stuck_lock_waits += o.stuck_lock_waits;
        if self.timeline.len() < o.timeline.len() {
            self.timeline.resize(o.timeline.len(), 0);
        }
        for (a, b) in self.timeline.iter_mut().zip(&o.timeline) {
            *a += b;
        }
    }

    /// Counts a commit at `now_ns` in a timeline of intervals of `width_ns` (0: none).
    pub(crate) fn count_in_timeline(&mut self, now_ns: u64, width_ns: u64) {
        if width_ns == 0 {
            return;
        }
        let i = usize::try_from(now_ns / width_ns).unwrap_or(usize::MAX);
        if i >= TIMELINE_BUCKETS_MAX {
            return;
        }
        if self.timeline.len() <= i {
            self.timeline.resize(i + 1, 0);
        }
        self.timeline[i] += 1;
    }

    /// Aborted attempts of every reason.
    pub fn aborts_total(&self) -> u64 {
        self.aborts.iter().sum()
    }

    /// Attempts aborted for reasons of `class` over all attempts.
    pub fn abort_rate_of(&self, class: AbortClass) -> f64 {
        let of: u64 = AbortReason::ALL
            .iter()
            .filter(|r| r.class() == class)
            .map(|r| self.aborts[r.index()])
            .sum();
        let attempts = self.aborts_total() + self.commits;
        if attempts == 0 {
            0.0
        } else {
            of as f64 / attempts as f64
        }
    }

    /// Attempts aborted by concurrency control (conflicts, failed validation, torn
    /// records) over all attempts: faults, the workload's own aborts and full stores
    /// excluded.
    pub fn cc_abort_rate(&self) -> f64 {
        self.abort_rate_of(AbortClass::Contention)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_abort_is_counted_under_one_class() {
        let mut s = TxnStats { commits: 900, ..TxnStats::default() };
        for (i, r) in AbortReason::ALL.iter().enumerate() {
            s.aborts[r.index()] = 10 * (i as u64 + 1);
        }
        let sum: f64 = AbortClass::ALL.iter().map(|c| s.abort_rate_of(*c)).sum();
        assert!((sum - s.abort_rate()).abs() < 1e-12, "{sum} vs {}", s.abort_rate());
        // Conflict, validation and torn only: not the faults, the workload or a full store.
        let contention = [AbortReason::Conflict, AbortReason::Validation, AbortReason::Torn];
        let cc: u64 = contention.iter().map(|r| s.aborts[r.index()]).sum();
        let attempts = s.commits + s.aborts_total();
        assert!((s.cc_abort_rate() - cc as f64 / attempts as f64).abs() < 1e-12);
        assert_eq!(TxnStats::default().abort_rate_of(AbortClass::Capacity), 0.0);
    }
}
