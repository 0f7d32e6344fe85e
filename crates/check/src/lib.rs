//! hytra's checker (not built yet): records committed histories (read sets with the
//! versions read, write sets with the versions installed) and decides serializability by
//! finding cycles in the dependency graph. It depends on nothing but the history format
//! (see docs/ARCHITECTURE.md).
