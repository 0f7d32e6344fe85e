//! Runtime configuration: the optimisation switches of DrTM+H §3.2 and the CPU costs the
//! runtime charges in the simulator.

use hytra_fabric::cpu::CpuTerm;

/// One event-loop iteration (polling bookkeeping, branch on empty queues). Assumed a few
/// tens of cycles where no CPU profile says otherwise; the papers give no figure.
pub const STEP: CpuTerm = CpuTerm::new(0, "rt.step", 10);
/// Resuming one coroutine: "about 20 ns" for a Boost coroutine switch (DrTM+H §4.1).
pub const SWITCH: CpuTerm = CpuTerm::new(1, "rt.switch", 20);
/// Parsing one RPC frame and dispatching it to its handler or waiting coroutine. Assumed
/// (a header decode and a table lookup).
pub const DISPATCH: CpuTerm = CpuTerm::new(2, "rt.dispatch", 15);

/// The runtime's CPU terms (indices 0..8 are the runtime's; see [`hytra_fabric::cpu`]).
pub const CPU_TERMS: [CpuTerm; 3] = [STEP, SWITCH, DISPATCH];

/// How a worker's runtime behaves.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RtConfig {
    /// Doorbell batching (DB): the requests of one batch, and the datagrams one step
    /// sends, share a doorbell.
    pub doorbell_batching: bool,
    /// RPC frames to one destination produced in one step share a datagram (requires
    /// doorbell batching; replies then ride with requests, as in paper Fig. 4).
    pub rpc_coalescing: bool,
    /// How long a call waits for its reply before failing with a timeout.
    pub rpc_timeout_ns: u64,
}

impl Default for RtConfig {
    fn default() -> Self {
        RtConfig { doorbell_batching: true, rpc_coalescing: true, rpc_timeout_ns: 1_000_000 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_terms_are_in_its_range_with_distinct_indices() {
        for (i, a) in CPU_TERMS.iter().enumerate() {
            assert!(a.index() < 8, "{} at {}", a.name(), a.index());
            assert!(CPU_TERMS[i + 1..]
                .iter()
                .all(|b| b.index() != a.index() && b.name() != a.name()));
        }
    }
}
