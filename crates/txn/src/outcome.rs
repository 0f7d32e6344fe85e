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

    /// The cause class a report counts this reason under.
    pub fn class(self) -> AbortClass {
        match self {
            AbortReason::Conflict | AbortReason::Validation | AbortReason::Torn => {
                AbortClass::Contention
            }
            AbortReason::Timeout | AbortReason::Unreachable | AbortReason::Reconfigured => {
                AbortClass::Fault
            }
            AbortReason::User => AbortClass::Workload,
            AbortReason::Full => AbortClass::Capacity,
        }
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

/// Why aborts happened, as a report groups them: only [`AbortClass::Contention`] is the
/// price of concurrency control; the others have causes a reader must not mistake for it.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum AbortClass {
    /// Concurrency control: a lock held by another transaction, a read that changed
    /// before commit, a record torn by concurrent writes.
    Contention,
    /// Lost or late messages, an unreachable peer, a reconfiguration.
    Fault,
    /// The workload's own logic (insufficient funds, an invalid item).
    Workload,
    /// A store limit: a table or partition with no room for an insert, or scratch space.
    Capacity,
}

impl AbortClass {
    /// Every class, in report order.
    pub const ALL: [AbortClass; 4] =
        [AbortClass::Contention, AbortClass::Fault, AbortClass::Workload, AbortClass::Capacity];

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            AbortClass::Contention => "concurrency control",
            AbortClass::Fault => "faults",
            AbortClass::Workload => "the workload's own",
            AbortClass::Capacity => "store full",
        }
    }

    /// Key in JSON reports.
    pub fn key(self) -> &'static str {
        match self {
            AbortClass::Contention => "contention",
            AbortClass::Fault => "fault",
            AbortClass::Workload => "workload",
            AbortClass::Capacity => "capacity",
        }
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
