//! hytra's transaction layer (not built yet): OCC with primary-backup replication, each
//! phase (execution, validation, logging, commit) one-sided, two-sided or hybrid, and the
//! design presets drtmh, fasst, farm and drtmr. It sits on `hytra-store`
//! (see docs/ARCHITECTURE.md).
