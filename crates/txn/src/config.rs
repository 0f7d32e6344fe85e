//! How transactions run: a strategy per phase, the optimisation switches, and the design
//! presets of DrTM+H Table 4. Everything is chosen at run time.

use thiserror::Error;

/// How the execution phase (and the read phase of read-only transactions) reaches a
/// remote record.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum ExecStrategy {
    /// One-sided: READ the index bucket(s), then READ the record (FaRM, no cache).
    OneSided,
    /// One-sided with the location cache: one READ on a hit, a traversal on a miss that
    /// fills the cache (DrTM+R).
    OneSidedCached,
    /// An RPC to the primary (FaSST).
    TwoSided,
    /// One READ on a cache hit; on a miss an RPC that also returns the record's address
    /// and fills the cache (DrTM+H §6.1).
    Hybrid,
    /// One READ on a cache hit (if there is a cache); on a miss one request that the
    /// primary's NIC answers with the record and its address, by a verb program (RedN);
    /// the RPC of `Hybrid` where the NIC does not find it. Needs a NIC that runs verb
    /// programs.
    Offload,
}

impl ExecStrategy {
    /// Whether execution looks records up in the location cache first (if the
    /// configuration gives it one: see [`TxnConfig::has_cache`]).
    pub fn reads_cache(self) -> bool {
        match self {
            ExecStrategy::OneSidedCached | ExecStrategy::Hybrid | ExecStrategy::Offload => true,
            ExecStrategy::OneSided | ExecStrategy::TwoSided => false,
        }
    }

    /// Whether execution cannot run without a location cache: `Offload` reads one only
    /// if it is there, and falls back to its verb program without.
    pub fn needs_cache(self) -> bool {
        match self {
            ExecStrategy::OneSidedCached | ExecStrategy::Hybrid => true,
            ExecStrategy::Offload | ExecStrategy::OneSided | ExecStrategy::TwoSided => false,
        }
    }
}

/// How the write set is locked.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum LockStrategy {
    /// CAS, with a READ of the version behind it in the same doorbell (DrTM+R, DrTM+H).
    OneSided,
    /// An RPC to the primary, which locks with a CPU CAS (FaRM).
    TwoSided,
    /// Lock while executing, by the read RPC of a record read for update (FaSST).
    AtExecution,
}

/// How the read set is validated, and how logs and commits are sent.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Primitive {
    /// One-sided verbs.
    OneSided,
    /// RPC.
    TwoSided,
}

/// A named preset.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Design {
    /// Hybrid: the best primitive per phase (DrTM+H).
    DrtmH,
    /// All two-sided, lock at execution (FaSST).
    Fasst,
    /// One-sided execution without cache, RPC lock + READ validation, one-sided log, RPC
    /// commit (FaRM).
    Farm,
    /// All one-sided with the location cache, CAS lock (DrTM+R without HTM).
    DrtmR,
}

impl Design {
    /// Every preset.
    pub const ALL: [Design; 4] = [Design::DrtmH, Design::Fasst, Design::Farm, Design::DrtmR];

    /// Name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Design::DrtmH => "drtmh",
            Design::Fasst => "fasst",
            Design::Farm => "farm",
            Design::DrtmR => "drtmr",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Design> {
        Design::ALL.into_iter().find(|d| d.name() == s)
    }
}

/// Gives a choice enum its command-line names: `ALL`, `name` and `parse`.
macro_rules! named_choices {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every choice.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// Name on the command line and in reports.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            /// Parses a name.
            pub fn parse(s: &str) -> Option<$ty> {
                $ty::ALL.iter().copied().find(|c| c.name() == s)
            }

            /// The names, for error messages.
            pub fn names() -> String {
                $ty::ALL.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
            }
        }
    };
}

named_choices!(ExecStrategy {
    OneSided => "one-sided",
    OneSidedCached => "one-sided-cached",
    TwoSided => "two-sided",
    Hybrid => "hybrid",
    Offload => "offload",
});
named_choices!(LockStrategy {
    OneSided => "one-sided",
    TwoSided => "two-sided",
    AtExecution => "at-execution",
});
named_choices!(Primitive { OneSided => "one-sided", TwoSided => "two-sided" });

/// A bug planted on purpose, so that a test (or `hytra swarm --plant`) can prove that
/// the oracles catch its class. Never set outside tests and such runs.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum PlantedFault {
    /// Skip validation of the read set: write skew and lost updates get through.
    SkipReadValidation,
    /// Commit without bumping the version: later readers cannot see the change.
    SkipVersionBump,
    /// Release a record's lock before its write-back lands (the unlock WRITE goes first
    /// on the connection; a local record is unlocked before it is written).
    UnlockBeforeWriteBack,
    /// Take a one-sided READ of a record whose checksum does not verify as whole.
    AcceptTornRead,
    /// Report the commit (and write back) before every backup acknowledged the log.
    CommitBeforeLogged,
    /// Insert without locking the new record: read its lock and version instead of
    /// taking the lock.
    SkipInsertLock,
}

named_choices!(PlantedFault {
    SkipReadValidation => "skip-read-validation",
    SkipVersionBump => "skip-version-bump",
    UnlockBeforeWriteBack => "unlock-before-write-back",
    AcceptTornRead => "accept-torn-read",
    CommitBeforeLogged => "commit-before-logged",
    SkipInsertLock => "skip-insert-lock",
});

/// A point of the protocol where a node may be crashed on purpose (the swarm's fault
/// injection; see [`CrashPoint`]).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum ProtocolPoint {
    /// A coordinator landed its first log entry of a transaction that logs to several
    /// backups, and has posted none of the others: some backups hold the transaction,
    /// others never will.
    LoggedPartly,
    /// A coordinator, past its commit point, wrote back (and unlocked) the first record
    /// of a transaction that writes several: the others stay locked at their old
    /// versions.
    WrittenBackPartly,
    /// A configuration manager committed a new configuration to the store and installed
    /// it, before any round of its recovery ran.
    Reconfiguring,
}

named_choices!(ProtocolPoint {
    LoggedPartly => "logged-partly",
    WrittenBackPartly => "written-back-partly",
    Reconfiguring => "reconfiguring",
});

/// Crash `node` the first time one of its coroutines reaches `point` between `from_ns`
/// and `until_ns` of its clock (on a backend that can crash a node from inside: the
/// simulator). The bound lets a run know when the crash is over at the latest.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct CrashPoint {
    /// The node to crash.
    pub node: hytra_fabric::NodeId,
    /// Where.
    pub point: ProtocolPoint,
    /// Not before this time of the node's clock (ns from the run's start).
    pub from_ns: u64,
    /// Nor after this one: a point first reached later crashes nothing.
    pub until_ns: u64,
}

/// Everything that decides how transactions run.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct TxnConfig {
    /// The preset this was built from (for reports).
    pub design: Design,
    /// Execution / read phase.
    pub exec: ExecStrategy,
    /// Locking.
    pub lock: LockStrategy,
    /// Read-set validation (and the validation of read-only transactions).
    pub validate: Primitive,
    /// Logging to backups.
    pub log: Primitive,
    /// Write-back and unlock.
    pub commit: Primitive,
    /// Passive ACK for the commit phase: its acknowledgement is collected off the
    /// critical path.
    pub passive_ack: bool,
    /// Outstanding requests: reads of one transaction in parallel (speculative parallel
    /// reads), and the locks, validations and logs of a phase in parallel.
    pub outstanding: bool,
    /// Inline small WRITEs (commit write-backs).
    pub inline: bool,
    /// Bytes of each node's location cache (0: none).
    pub cache_bytes: u64,
    /// Copies of every partition (primary included).
    pub replication: u16,
    /// Attempts of one transaction before giving up.
    pub retries_max: u32,
    /// Bytes of each log ring (one per coordinator worker and backup node). A ring
    /// should hold several transactions' logs (a TPC-C Delivery logs ~25 KB), or
    /// coordinators wait for synchronous reclaims.
    pub log_ring_bytes: u64,
    /// Send a lazy reclaim to a backup after this many bytes of its log are committed.
    pub reclaim_after_bytes: u64,
    /// A bug planted on purpose (tests only; `None` in every real run).
    pub planted: Option<PlantedFault>,
    /// A crash at a point of the protocol (the swarm's; `None` in every real run).
    pub crash_point: Option<CrashPoint>,
    /// Leases and the configuration store; `None`: what suits the backend
    /// ([`crate::RecoveryParams::simulated`] on virtual time, else
    /// [`crate::RecoveryParams::real`]).
    pub recovery: Option<crate::recover::RecoveryParams>,
}

/// Why a configuration is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A combination that cannot work.
    #[error("{0}")]
    Invalid(String),
    /// An execution strategy that finds remote records through the location cache, with
    /// no memory for one.
    #[error("execution {} finds remote records through the location cache, which has no memory", .0.name())]
    NoCache(ExecStrategy),
    /// Locking at execution with an execution strategy other than the two-sided read RPC
    /// it rides on.
    #[error("locking at execution rides on the two-sided read RPC, and execution is {}", .0.name())]
    LockAtExecution(ExecStrategy),
}

/// Location cache size of the presets that use one: "a 300MB index cache on each
/// machine" (DrTM+H §5.1).
pub const CACHE_BYTES_DEFAULT: u64 = 300 << 20;

impl TxnConfig {
    /// Whether execution reads a location cache: its strategy reads one and it has
    /// memory for one (`Offload` runs without).
    pub fn has_cache(&self) -> bool {
        self.exec.reads_cache() && self.cache_bytes > 0
    }

    /// The preset of a design, with 3-way replication.
    pub fn preset(design: Design) -> TxnConfig {
        use ExecStrategy as E;
        use Primitive::{OneSided as I, TwoSided as II};
        let base = TxnConfig {
            design,
            exec: E::Hybrid,
            lock: LockStrategy::OneSided,
            validate: I,
            log: I,
            commit: I,
            passive_ack: true,
            outstanding: true,
            inline: true,
            cache_bytes: CACHE_BYTES_DEFAULT,
            replication: 3,
            retries_max: 64,
            log_ring_bytes: 128 << 10,
            reclaim_after_bytes: 4 << 10,
            planted: None,
            crash_point: None,
            recovery: None,
        };
        match design {
            Design::DrtmH => base,
            // Passive ACK is DrTM+H's own optimisation (§3.2); the emulations of earlier
            // systems run with every other optimisation on (§6.3) but not that one.
            Design::Fasst => TxnConfig {
                passive_ack: false,
                exec: E::TwoSided,
                lock: LockStrategy::AtExecution,
                validate: II,
                log: II,
                commit: II,
                cache_bytes: 0,
                ..base
            },
            Design::Farm => TxnConfig {
                passive_ack: false,
                exec: E::OneSided,
                lock: LockStrategy::TwoSided,
                validate: I,
                log: I,
                commit: II,
                cache_bytes: 0,
                ..base
            },
            Design::DrtmR => TxnConfig { passive_ack: false, exec: E::OneSidedCached, ..base },
        }
    }

    /// Checks the combination against the cluster and the fabric.
    pub fn check(&self, nodes: u16) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.replication == 0 || self.replication > nodes {
            return bad(format!(
                "replication factor {} is not in 1..={nodes} (the number of nodes)",
                self.replication
            ));
        }
        if self.exec.needs_cache() && self.cache_bytes == 0 {
            return Err(ConfigError::NoCache(self.exec));
        }
        if self.commit == Primitive::TwoSided && self.lock == LockStrategy::OneSided {
            // A NIC lock word must not be released by a CPU (the commit RPC's handler)
            // on fabrics whose atomics are not coherent with the CPU's (M6). The other
            // way is fine: a WRITE of zero releases a CPU lock (DMA is coherent).
            return bad("one-sided (NIC) locks need a one-sided commit to release them".into());
        }
        if self.lock == LockStrategy::AtExecution && self.exec != ExecStrategy::TwoSided {
            return Err(ConfigError::LockAtExecution(self.exec));
        }
        if let Some(c) = self.crash_point.filter(|c| c.node.0 >= nodes) {
            return bad(format!("crash point on {}, which is not a node (0..{nodes})", c.node));
        }
        if let Some(c) = self.crash_point.filter(|c| c.until_ns < c.from_ns) {
            return bad(format!(
                "crash point from {} ns until {} ns: an empty window",
                c.from_ns, c.until_ns
            ));
        }
        if self.retries_max == 0 || self.log_ring_bytes < 4096 || self.log_ring_bytes % 8 != 0 {
            return bad(
                "retries_max must be positive and log rings at least 4096 bytes (a multiple of 8)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Whether lock words are changed by the NIC (CAS through the fabric) rather than by
    /// CPUs. On fabrics whose atomics are not coherent with the CPU's, all lock changes
    /// must then go through the NIC, local records included (docs/INVARIANTS.md M6).
    pub fn nic_locks(&self) -> bool {
        self.lock == LockStrategy::OneSided
    }

    /// Whether `fault` is planted.
    pub fn planted(&self, fault: PlantedFault) -> bool {
        self.planted == Some(fault)
    }

    /// Whether `node` is to crash at `point`, reached at `now_ns` of its clock.
    pub fn crashes_at(
        &self,
        node: hytra_fabric::NodeId,
        point: ProtocolPoint,
        now_ns: u64,
    ) -> bool {
        self.crash_point.is_some_and(|c| {
            c.node == node && c.point == point && (c.from_ns..=c.until_ns).contains(&now_ns)
        })
    }
}
