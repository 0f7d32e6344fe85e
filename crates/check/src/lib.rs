//! hytra's checker: does a recorded history of committed transactions have a serial
//! equivalent? It depends on nothing but the history format, so any engine (or a
//! hand-written anomaly) can be checked.
//!
//! - `history`: the format: per committed transaction, the versions it read and the
//!   versions it installed
//! - `graph`: the dependency graph (ww, wr, rw edges) and cycle search
//!
//! The model: every committed write of a key installs the next version of that key
//! (versions of a key are 1, 2, 3, ... in commit order; 0 is the loaded value). Then a
//! history is (conflict-)serializable iff its dependency graph is acyclic (Adya's G1c
//! and G2 anomalies are cycles with and without anti-dependency edges).

mod graph;
mod history;

pub use graph::{check, Cycle, Edge, EdgeKind, Report, Violation};
pub use history::{Access, History, Key, TxnId, TxnRecord};
