//! hytra's store layer (not built yet): per node and table, a cluster-chained hash index
//! and records in registered memory, traversable by the local CPU and by remote one-sided
//! READs; one lock word and one version per record shared by every access path; the
//! location cache of remote record addresses; sharding with a primary and R-1 backups
//! per partition. It sits on `hytra-fabric` and `hytra-rt` (see docs/ARCHITECTURE.md).
