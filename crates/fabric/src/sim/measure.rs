//! Measuring what programs' steps really cost ([`CpuMode::Measured`](super::CpuMode)).
//!
//! A step's time is read from the monotonic clock around it, less the time spent in the
//! simulator's own code during the step (posting into the NIC model, polling its queues),
//! which a real host does not run: what remains is the program's code. The clock is the
//! vDSO's (tens of nanoseconds per read, where a thread CPU clock is a system call of
//! several hundred); its own cost is measured once and taken off every reading. A step
//! that was descheduled reads long: a calibration takes medians, a measured run lives
//! with it.

use std::time::Instant;

use crate::cpu::{CpuSamples, CpuTable, CpuTerm, CPU_TERMS_MAX};

/// How the programs' own CPU work is charged.
#[derive(Debug)]
pub(crate) enum ProgramCpu {
    /// From a CPU profile.
    Model(CpuTable),
    /// From the clock.
    Measured(Box<MeasuredCpu>),
}

/// State of measured steps.
#[derive(Debug)]
pub(crate) struct MeasuredCpu {
    /// What one pair of clock readings costs, ns.
    overhead_ns: f64,
    /// Simulator time inside the current step, ns.
    excluded_ns: f64,
    /// Terms the current step charged, by index.
    counts: [u32; CPU_TERMS_MAX],
    touched: Vec<u16>,
    mix: Vec<(u16, u32)>,
    /// Every step so far that started at or after `from_ps`, by mix.
    pub(crate) samples: CpuSamples,
    /// Steps starting earlier (a warm-up) are charged but not kept.
    pub(crate) from_ps: u64,
}

/// Pairs of readings taken to find the clock's cost; the median is kept.
const OVERHEAD_PAIRS: usize = 2001;

impl MeasuredCpu {
    pub(crate) fn new() -> MeasuredCpu {
        let mut pairs: Vec<f64> = (0..OVERHEAD_PAIRS)
            .map(|_| {
                let t = Instant::now();
                t.elapsed().as_nanos() as f64
            })
            .collect();
        pairs.sort_by(f64::total_cmp);
        MeasuredCpu {
            overhead_ns: pairs[OVERHEAD_PAIRS / 2],
            excluded_ns: 0.0,
            counts: [0; CPU_TERMS_MAX],
            touched: Vec::new(),
            mix: Vec::new(),
            samples: CpuSamples::default(),
            from_ps: 0,
        }
    }

    pub(crate) fn count(&mut self, term: CpuTerm, count: u32) {
        if count == 0 {
            return;
        }
        let i = term.index();
        if self.counts[i] == 0 {
            self.touched.push(i as u16);
        }
        self.counts[i] = self.counts[i].saturating_add(count);
    }

    /// Adds simulator time read around one call of the simulator's code.
    pub(crate) fn exclude(&mut self, read_ns: f64) {
        // The reading covers about one clock read; the call's two reads cost two.
        self.excluded_ns += read_ns + self.overhead_ns;
    }

    /// Ends a step that started at `started_ps` of virtual time and whose reading was
    /// `read_ns`: records it (unless it started before `from_ps`) and returns the
    /// program's time, ns (unscaled).
    pub(crate) fn end_step(&mut self, started_ps: u64, read_ns: f64) -> f64 {
        let ns = (read_ns - self.overhead_ns - self.excluded_ns).max(0.0);
        self.excluded_ns = 0.0;
        self.touched.sort_unstable();
        self.mix.clear();
        for &i in &self.touched {
            self.mix.push((i, self.counts[usize::from(i)]));
            self.counts[usize::from(i)] = 0;
        }
        self.touched.clear();
        if started_ps >= self.from_ps {
            self.samples.add(&self.mix, ns);
        }
        ns
    }
}
