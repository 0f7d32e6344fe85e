//! Terms of the simulator's CPU cost model.
//!
//! Each layer above the fabric names the kinds of CPU work it does (an event-loop step,
//! a coroutine switch, a record handled in a phase, an RPC served) as [`CpuTerm`]s and
//! charges them with [`Endpoint::charge`](crate::Endpoint::charge). The simulator turns a
//! charge into virtual time through a [`CpuTable`] (a CPU profile), so that what a kind of
//! work costs is a number one can measure and replace, not a constant in the code that
//! does the work. Real backends ignore charges: the work takes its real time.
//!
//! Terms are identified by a small index. Each crate owns a range of indices, so that no
//! layer needs to know the terms of the layers above it:
//!
//! | range | owner |
//! |---|---|
//! | 0..8 | `hytra-rt` (the runtime) |
//! | 8..48 | `hytra-txn` (the transaction engine) |
//! | 48..64 | free |

/// Number of term indices.
pub const CPU_TERMS_MAX: usize = 64;

/// One kind of CPU work, with what it is assumed to cost when no profile says otherwise.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CpuTerm {
    index: u16,
    name: &'static str,
    assumed_ps: u64,
}

impl CpuTerm {
    /// A term at `index` (in its crate's range), named `name` in profiles, costing
    /// `assumed_ns` when the profile in force does not give it.
    pub const fn new(index: u16, name: &'static str, assumed_ns: u64) -> CpuTerm {
        assert!((index as usize) < CPU_TERMS_MAX, "CPU term index out of range");
        CpuTerm { index, name, assumed_ps: assumed_ns * 1000 }
    }

    /// The index in a [`CpuTable`].
    pub const fn index(self) -> usize {
        self.index as usize
    }

    /// The name in CPU profiles.
    pub const fn name(self) -> &'static str {
        self.name
    }

    /// The assumed cost, in picoseconds.
    pub const fn assumed_ps(self) -> u64 {
        self.assumed_ps
    }
}

/// What each term costs, in picoseconds; a term it does not set costs its assumed value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTable {
    ps: Vec<Option<u64>>,
    name: String,
}

impl CpuTable {
    /// The table that sets nothing: every term costs its assumed value.
    pub fn assumed() -> CpuTable {
        CpuTable::named("assumed")
    }

    /// An empty table named `name`, to be filled with [`CpuTable::set`].
    pub fn named(name: impl Into<String>) -> CpuTable {
        CpuTable { ps: vec![None; CPU_TERMS_MAX], name: name.into() }
    }

    /// Sets what `term` costs.
    pub fn set(&mut self, term: CpuTerm, ps: u64) {
        self.ps[term.index()] = Some(ps);
    }

    /// What `term` costs, in picoseconds.
    pub fn ps(&self, term: CpuTerm) -> u64 {
        self.ps.get(term.index()).copied().flatten().unwrap_or(term.assumed_ps)
    }

    /// The profile's name (for the line that describes a run).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// What one worker's steps cost when the simulator measured them
/// ([`CpuMode::Measured`](crate::sim::CpuMode::Measured)): for each distinct mix of terms a
/// step charged, the time each such step took. A calibration fits the terms' costs to
/// these.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuSamples {
    /// Mix of terms (index, count; sorted by index) → measured step times, ns.
    pub by_mix: std::collections::BTreeMap<Vec<(u16, u32)>, Vec<f64>>,
    /// Steps measured in all.
    pub steps: u64,
    /// Steps not kept because a mix already had [`SAMPLES_PER_MIX_MAX`] of them, or
    /// there were already [`MIXES_MAX`] mixes.
    pub dropped: u64,
}

/// Samples kept per mix of terms: enough for a stable median.
pub const SAMPLES_PER_MIX_MAX: usize = 2048;
/// Distinct mixes kept; a run that charges more kinds of step than this is cut off.
pub const MIXES_MAX: usize = 20_000;

impl CpuSamples {
    /// Adds one step.
    pub fn add(&mut self, mix: &[(u16, u32)], ns: f64) {
        self.steps += 1;
        if let Some(v) = self.by_mix.get_mut(mix) {
            if v.len() < SAMPLES_PER_MIX_MAX {
                v.push(ns);
                return;
            }
        } else if self.by_mix.len() < MIXES_MAX {
            self.by_mix.insert(mix.to_vec(), vec![ns]);
            return;
        }
        self.dropped += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: CpuTerm = CpuTerm::new(3, "a", 7);

    #[test]
    fn a_table_gives_what_it_sets_and_the_assumed_cost_otherwise() {
        let mut t = CpuTable::named("x");
        assert_eq!(t.ps(A), 7000);
        t.set(A, 1234);
        assert_eq!(t.ps(A), 1234);
        assert_eq!(CpuTable::assumed().ps(A), 7000);
    }

    #[test]
    fn samples_are_kept_by_mix_up_to_their_limits() {
        let mut s = CpuSamples::default();
        for i in 0..SAMPLES_PER_MIX_MAX + 5 {
            s.add(&[(1, 2)], i as f64);
        }
        s.add(&[(1, 1), (3, 1)], 1.0);
        assert_eq!(s.steps, SAMPLES_PER_MIX_MAX as u64 + 6);
        assert_eq!(s.dropped, 5);
        assert_eq!(s.by_mix.len(), 2);
        assert_eq!(s.by_mix[&vec![(1, 2)]].len(), SAMPLES_PER_MIX_MAX);
    }
}
