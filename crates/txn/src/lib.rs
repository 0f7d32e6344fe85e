//! hytra's transaction engine: optimistic concurrency control with primary-backup
//! replication (DrTM+H Fig. 1), every phase one-sided, two-sided or hybrid.
//!
//! - `config`: per-phase strategies, optimisation switches, the design presets
//!   (`drtmh`, `fasst`, `farm`, `drtmr`)
//! - `engine`: setting the engine up on a backend; per-node and per-worker state
//! - `membership`: the configuration (epoch, members, placement) and each node's view
//! - `config_store`: where configurations are committed (compare-and-set on the revision)
//! - `recover`: leases, the configuration manager's reconfiguration, recovery
//! - `resync`: re-replication: new backups after a failure, copied in the background
//! - `suspect`: members whose connections broke while leases held, and whom to remove
//! - `txn`: the transaction API ([`TxnCtx`], [`Txn`]) and the execution phase
//! - `offload`: the `offload` execution strategy's NIC index and lookup programs
//! - `validate`: locking the write set and validating the read set
//! - `commit`: logging, write-back, abort, the background task, history
//! - `log`: log rings on backups, entries, lazy application
//! - `handlers`: what primaries and backups do for the engine's RPCs
//! - `wire`: RPC message formats
//! - `outcome`, `stats`: what an attempt ends with; counters
//!
//! Writing a transaction:
//!
//! ```ignore
//! let mut t = ctx.begin(TYPE);
//! let body = async {
//!     let r = t.read_for_update(ACCOUNTS, 42).await?;
//!     let balance = t.get(r)[0];
//!     if balance < 10 {
//!         return Err(Abort(AbortReason::User));
//!     }
//!     t.update(r)[0] = balance - 10;
//!     Ok(())
//! };
//! let result = body.await;
//! match t.finish(result).await {
//!     Outcome::Committed => {}
//!     // Before `ctx.retry()`: `ctx.await_reconfiguration()` after `Unreachable`, and
//!     // `ctx.await_stuck_lock()` after contention (as `hytra_workloads::bench::run_txn`).
//!     Outcome::Aborted(reason) if reason.retryable() => { /* ctx.retry() and run again */ }
//!     Outcome::Aborted(_) => {}
//! }
//! ```
//!
//! Protocol rules the code relies on are in docs/INVARIANTS.md (S1-S5, L1-L4, T1-T6).

mod commit;
pub mod config;
pub mod config_store;
pub mod cpu;
mod engine;
mod handlers;
pub mod log;
pub mod membership;
mod offload;
mod outcome;
pub mod recover;
pub mod resync;
mod stats;
pub mod suspect;
mod txn;
mod validate;
pub mod wire;

pub use config::{
    ConfigError, CrashPoint, Design, ExecStrategy, LockStrategy, PlantedFault, Primitive,
    ProtocolPoint, TxnConfig, CACHE_BYTES_DEFAULT,
};
pub use engine::{Engine, EngineError, NodeEngine, OffloadError, WorkerTxn, SCRATCH_CO_BYTES};
pub use membership::{Config, Membership};
pub use offload::NicLookups;
pub use outcome::{Abort, AbortClass, AbortReason, Outcome};
pub use recover::{RecoveryEvent, RecoveryParams, RecoveryStep};
pub use resync::Rereplication;
pub use stats::{Phase, PhaseNs, TxnStats, TIMELINE_BUCKETS_MAX, TXN_TYPES_MAX};
pub use txn::{Intent, Rec, Txn, TxnCtx, STUCK_LOCK_REPEATS};
