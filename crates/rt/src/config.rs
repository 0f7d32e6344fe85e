//! Runtime configuration: the optimisation switches of DrTM+H §3.2 and the CPU costs the
//! runtime charges in the simulator.

/// CPU costs the runtime charges to the simulated worker clock (ignored by real
/// backends, where the work takes its real time).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RtCosts {
    /// One event-loop iteration (polling bookkeeping, branch on empty queues). An
    /// assumption of a few tens of cycles; the papers give no figure.
    pub step_ns: u64,
    /// Resuming one coroutine: "about 20 ns" for a Boost coroutine switch (DrTM+H §4.1).
    pub switch_ns: u64,
    /// Parsing one RPC frame and dispatching it to its handler or waiting coroutine. An
    /// assumption (a header decode and a table lookup).
    pub dispatch_ns: u64,
}

impl Default for RtCosts {
    fn default() -> Self {
        RtCosts { step_ns: 10, switch_ns: 20, dispatch_ns: 15 }
    }
}

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
    /// CPU costs charged in the simulator.
    pub costs: RtCosts,
}

impl Default for RtConfig {
    fn default() -> Self {
        RtConfig {
            doorbell_batching: true,
            rpc_coalescing: true,
            rpc_timeout_ns: 1_000_000,
            costs: RtCosts::default(),
        }
    }
}
