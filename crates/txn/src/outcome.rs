//! What a transaction attempt ends with.

/// Why an attempt aborted.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum AbortReason {
    /// A record it needed was locked by another transaction.
    Conflict,
    /// A record it read changed before it could commit.
    Validation,
    /// An RPC got no reply in time (lost datagram, slow or dead peer).
    Timeout,
    /// A one-sided request failed (target unreachable).
    Unreachable,
    /// A record stayed torn by concurrent writes.
    Torn,
    /// The workload's own logic decided to abort (e.g. insufficient funds).
    User,
    /// A store limit (partition or scratch space) was hit.
    Full,
    /// The cluster's configuration changed during the attempt (a node failed, a
    /// partition moved): it ran against a placement no longer in force.
    Reconfigured,
}

impl AbortReason {
    /// Every reason, for reports.
    pub const ALL: [AbortReason; 8] = [
        AbortReason::Conflict,
        AbortReason::Validation,
        AbortReason::Timeout,
        AbortReason::Unreachable,
        AbortReason::Torn,
        AbortReason::User,
        AbortReason::Full,
        AbortReason::Reconfigured,
    ];

    /// Whether running the same transaction again may succeed.
    pub fn retryable(self) -> bool {
        !matches!(self, AbortReason::User | AbortReason::Full)
    }

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            AbortReason::Conflict => "conflict",
            AbortReason::Validation => "validation",
            AbortReason::Timeout => "timeout",
            AbortReason::Unreachable => "unreachable",
            AbortReason::Torn => "torn",
            AbortReason::User => "user",
            AbortReason::Full => "full",
            AbortReason::Reconfigured => "reconfigured",
        }
    }

    pub(crate) fn index(self) -> usize {
        self.index_pub()
    }

    /// Position in [`AbortReason::ALL`] (and in `TxnStats::aborts`).
    pub fn index_pub(self) -> usize {
        AbortReason::ALL.iter().position(|r| *r == self).expect("listed")
    }
}

/// The end of a transaction attempt. An abort is an outcome, not an error.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// Its writes are durable on every replica's log and visible at the primaries.
    Committed,
    /// Nothing it wrote is visible; every lock it took is released.
    Aborted(AbortReason),
    /// This node left the cluster (it was removed, or the run cannot go on) while the
    /// transaction was logging: recovery decided its fate elsewhere, and the run's end
    /// learns it ([`crate::Engine::verdict`]). The client stops.
    Unknown,
}

/// Carries an abort out of a transaction body with `?`.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Abort(pub AbortReason);
