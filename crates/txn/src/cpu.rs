//! The CPU terms the engine charges in the simulator (indices 8..48; see
//! [`hytra_fabric::cpu`]).
//!
//! Where no CPU profile gives them, they cost what the engine assumed before it had a
//! measurement: 100 ns to start an attempt (bookkeeping of the access set) and 20 ns to
//! handle one record in any phase (copying, building a request, checking a header); the
//! papers give no CPU figure below whole phases. `hytra calibrate` measures them.

use hytra_fabric::cpu::CpuTerm;

use crate::config::{LockStrategy, Primitive, TxnConfig};
use crate::stats::TXN_TYPES_MAX;

const ATTEMPT_NS: u64 = 100;
const RECORD_NS: u64 = 20;

/// Starting an attempt of a transaction of workload type `ty`, with the workload's own
/// logic for it: one term per type, so that a profile can cost each.
pub const ATTEMPT: [CpuTerm; TXN_TYPES_MAX] = [
    CpuTerm::new(8, "txn.attempt.0", ATTEMPT_NS),
    CpuTerm::new(9, "txn.attempt.1", ATTEMPT_NS),
    CpuTerm::new(10, "txn.attempt.2", ATTEMPT_NS),
    CpuTerm::new(11, "txn.attempt.3", ATTEMPT_NS),
    CpuTerm::new(12, "txn.attempt.4", ATTEMPT_NS),
    CpuTerm::new(13, "txn.attempt.5", ATTEMPT_NS),
    CpuTerm::new(14, "txn.attempt.6", ATTEMPT_NS),
    CpuTerm::new(15, "txn.attempt.7", ATTEMPT_NS),
    CpuTerm::new(16, "txn.attempt.8", ATTEMPT_NS),
    CpuTerm::new(17, "txn.attempt.9", ATTEMPT_NS),
    CpuTerm::new(18, "txn.attempt.10", ATTEMPT_NS),
    CpuTerm::new(19, "txn.attempt.11", ATTEMPT_NS),
    CpuTerm::new(20, "txn.attempt.12", ATTEMPT_NS),
    CpuTerm::new(21, "txn.attempt.13", ATTEMPT_NS),
    CpuTerm::new(22, "txn.attempt.14", ATTEMPT_NS),
    CpuTerm::new(23, "txn.attempt.15", ATTEMPT_NS),
];

/// How a coordinator reaches one record in a phase.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Its own node's memory.
    Local,
    /// One-sided verbs.
    OneSided,
    /// An RPC to the record's primary.
    Rpc,
}

impl Path {
    pub(crate) fn of(local: bool, one_sided: bool) -> Path {
        match (local, one_sided) {
            (true, _) => Path::Local,
            (false, true) => Path::OneSided,
            (false, false) => Path::Rpc,
        }
    }
}

const fn rec(index: u16, name: &'static str) -> CpuTerm {
    CpuTerm::new(index, name, RECORD_NS)
}

/// One record read in the execution phase, by path.
pub const EXEC: [CpuTerm; 3] =
    [rec(24, "txn.exec.local"), rec(25, "txn.exec.one-sided"), rec(26, "txn.exec.rpc")];
/// One record locked, by path.
pub const LOCK: [CpuTerm; 3] =
    [rec(27, "txn.lock.local"), rec(28, "txn.lock.one-sided"), rec(29, "txn.lock.rpc")];
/// One record validated, by path.
pub const VALIDATE: [CpuTerm; 3] =
    [rec(30, "txn.validate.local"), rec(31, "txn.validate.one-sided"), rec(32, "txn.validate.rpc")];
/// One record written into the logs of its backups, by primitive.
pub const LOG: [CpuTerm; 2] = [rec(33, "txn.log.one-sided"), rec(34, "txn.log.rpc")];
/// One record written back and unlocked, by path.
pub const COMMIT: [CpuTerm; 3] =
    [rec(35, "txn.commit.local"), rec(36, "txn.commit.one-sided"), rec(37, "txn.commit.rpc")];
/// Serving one READ RPC.
pub const SERVE_READ: CpuTerm = rec(38, "txn.serve.read");
/// Serving one LOCK RPC.
pub const SERVE_LOCK: CpuTerm = rec(39, "txn.serve.lock");
/// Serving one VALIDATE RPC.
pub const SERVE_VALIDATE: CpuTerm = rec(40, "txn.serve.validate");
/// Serving one write-back (COMMIT) RPC.
pub const SERVE_COMMIT: CpuTerm = rec(41, "txn.serve.commit");
/// Serving one UNLOCK RPC.
pub const SERVE_UNLOCK: CpuTerm = rec(42, "txn.serve.unlock");
/// One record of a log entry appended by RPC.
pub const SERVE_LOG: CpuTerm = rec(43, "txn.serve.log");
/// One logged record applied to a backup when its log is reclaimed.
pub const APPLY_LOG: CpuTerm = rec(44, "txn.apply-log");
/// One record copied to a new backup.
pub const RESYNC: CpuTerm = rec(45, "txn.resync");
/// One record a recovery applies.
pub const RECOVER: CpuTerm = rec(46, "txn.recover");

/// Every term of the engine.
pub fn terms() -> impl Iterator<Item = CpuTerm> {
    ATTEMPT.into_iter().chain(EXEC).chain(LOCK).chain(VALIDATE).chain(LOG).chain(COMMIT).chain([
        SERVE_READ,
        SERVE_LOCK,
        SERVE_VALIDATE,
        SERVE_COMMIT,
        SERVE_UNLOCK,
        SERVE_LOG,
        APPLY_LOG,
        RESYNC,
        RECOVER,
    ])
}

fn by_path(terms: &[CpuTerm; 3], path: Path) -> CpuTerm {
    terms[match path {
        Path::Local => 0,
        Path::OneSided => 1,
        Path::Rpc => 2,
    }]
}

/// The term of one record read in the execution phase, by the path it takes (known only
/// once the location cache was asked).
pub(crate) fn exec_term(path: Path) -> CpuTerm {
    by_path(&EXEC, path)
}

impl TxnConfig {
    /// The term of one record locked; `local`: by the CPU's atomics.
    pub(crate) fn lock_term(&self, local: bool) -> CpuTerm {
        by_path(&LOCK, Path::of(local, self.lock == LockStrategy::OneSided))
    }

    /// The term of one record validated.
    pub(crate) fn validate_term(&self, local: bool) -> CpuTerm {
        by_path(&VALIDATE, Path::of(local, self.validate == Primitive::OneSided))
    }

    /// The term of one record logged.
    pub(crate) fn log_term(&self) -> CpuTerm {
        LOG[usize::from(self.log != Primitive::OneSided)]
    }

    /// The term of one record written back.
    pub(crate) fn commit_term(&self, local: bool) -> CpuTerm {
        by_path(&COMMIT, Path::of(local, self.commit == Primitive::OneSided))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_terms_are_in_its_range_with_distinct_indices_and_names() {
        let all: Vec<CpuTerm> = terms().collect();
        for (i, a) in all.iter().enumerate() {
            assert!((8..48).contains(&a.index()), "{} at {}", a.name(), a.index());
            for b in &all[i + 1..] {
                assert_ne!(a.index(), b.index(), "{} and {}", a.name(), b.name());
                assert_ne!(a.name(), b.name());
            }
        }
    }
}
