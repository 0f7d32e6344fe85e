//! The dependency graph of a history and the search for cycles.
//!
//! For each key, version `v` is installed by exactly one transaction, `writer(v)`. Edges:
//! `ww`: writer(v) -> writer(v+1); `wr`: writer(v) -> every reader of v; `rw`
//! (anti-dependency): every reader of v -> writer(v+1). A transaction that reads v and
//! installs v+1 gets no edge to itself. The history is serializable iff the graph has no
//! cycle and the versions themselves are sane (no version installed twice, no version
//! read that nobody installed, no gap in a key's chain).

use std::collections::BTreeMap;

use crate::history::{History, Key, TxnId};

/// Kind of dependency.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum EdgeKind {
    /// Write then overwrite.
    Ww,
    /// Write then read.
    Wr,
    /// Read then overwrite (anti-dependency).
    Rw,
}

/// A dependency between two transactions through a key.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Edge {
    /// Earlier transaction.
    pub from: TxnId,
    /// Later transaction.
    pub to: TxnId,
    /// Why.
    pub kind: EdgeKind,
    /// Through which record.
    pub key: Key,
}

/// A cycle of dependencies: no serial order satisfies all of them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Cycle {
    /// The edges, each one's `to` being the next one's `from`, the last one's `to` the
    /// first one's `from`.
    pub edges: Vec<Edge>,
}

/// Something that makes a history not serializable (or not well formed).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Violation {
    /// Two committed transactions installed the same version of a key (a lost update).
    DuplicateVersion {
        /// Record.
        key: Key,
        /// Version installed twice.
        version: u64,
        /// The two writers.
        writers: (TxnId, TxnId),
    },
    /// A transaction read a version that no committed transaction installed (a dirty or
    /// torn read).
    UnknownVersion {
        /// Record.
        key: Key,
        /// Version read.
        version: u64,
        /// Reader.
        reader: TxnId,
    },
    /// A key's versions skip a number: a commit did not bump the version by one.
    VersionGap {
        /// Record.
        key: Key,
        /// The version whose predecessor nobody installed.
        version: u64,
        /// Its writer.
        writer: TxnId,
    },
    /// A transaction read a version whose contents differ from what its writer
    /// installed (or, for a version nobody in the history wrote, from what another
    /// reader of it saw): a torn or corrupted read.
    ContentMismatch {
        /// Record.
        key: Key,
        /// Version read.
        version: u64,
        /// Reader.
        reader: TxnId,
    },
    /// A dependency cycle.
    Cycle(Cycle),
}

/// What the checker found.
#[derive(Clone, Debug)]
pub struct Report {
    /// Transactions checked.
    pub txns: usize,
    /// Dependency edges built.
    pub edges: usize,
    /// Problems; empty iff the history is serializable.
    pub violations: Vec<Violation>,
}

impl Report {
    /// Whether the history is serializable.
    pub fn serializable(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Most violations of the version checks reported (a broken engine produces millions).
const VIOLATIONS_MAX: usize = 16;

#[derive(Default)]
struct KeyVersions {
    /// version -> (writer (dense transaction index), digest installed).
    writers: BTreeMap<u64, (usize, u64)>,
    /// (version, reader, digest read).
    readers: Vec<(u64, usize, u64)>,
}

/// Checks a history.
pub fn check(history: &History) -> Report {
    let ids: Vec<TxnId> = history.txns.iter().map(|t| TxnId(t.id)).collect();
    let mut keys: BTreeMap<Key, KeyVersions> = BTreeMap::new();
    let mut violations = Vec::new();
    for (i, t) in history.txns.iter().enumerate() {
        for w in &t.writes {
            let kv = keys.entry(w.key).or_default();
            if let Some(&(other, _)) = kv.writers.get(&w.version) {
                if violations.len() < VIOLATIONS_MAX {
                    violations.push(Violation::DuplicateVersion {
                        key: w.key,
                        version: w.version,
                        writers: (ids[other], ids[i]),
                    });
                }
                continue;
            }
            kv.writers.insert(w.version, (i, w.digest));
        }
        for r in &t.reads {
            keys.entry(r.key).or_default().readers.push((r.version, i, r.digest));
        }
    }
    for (key, kv) in &mut keys {
        check_contents(*key, kv, &ids, &mut violations);
    }
    let mut adj: Vec<Vec<(usize, EdgeKind, Key)>> = vec![Vec::new(); ids.len()];
    let mut edges = 0;
    let mut add = |from: usize, to: usize, kind: EdgeKind, key: Key| {
        if from != to {
            adj[from].push((to, kind, key));
            edges += 1;
        }
    };
    for (key, kv) in &keys {
        for (&v, &(w, _)) in &kv.writers {
            if v > 1 && !kv.writers.contains_key(&(v - 1)) && violations.len() < VIOLATIONS_MAX {
                violations.push(Violation::VersionGap { key: *key, version: v, writer: ids[w] });
            }
            if let Some(&(next, _)) = kv.writers.get(&(v + 1)) {
                add(w, next, EdgeKind::Ww, *key);
            }
        }
        for &(v, r, _) in &kv.readers {
            match kv.writers.get(&v) {
                Some(&(w, _)) => add(w, r, EdgeKind::Wr, *key),
                None if v > 0 && violations.len() < VIOLATIONS_MAX => {
                    violations.push(Violation::UnknownVersion {
                        key: *key,
                        version: v,
                        reader: ids[r],
                    });
                }
                None => {}
            }
            if let Some(&(next, _)) = kv.writers.get(&(v + 1)) {
                add(r, next, EdgeKind::Rw, *key);
            }
        }
    }
    if let Some(cycle) = find_cycle(&adj, &ids) {
        violations.push(Violation::Cycle(cycle));
    }
    Report { txns: ids.len(), edges, violations }
}

/// Checks that every read of a version saw the contents its writer installed; for a
/// version no recorded transaction wrote (the loaded one), that its readers agree. Digests
/// of 0 are not compared. Sorts the key's readers by version.
fn check_contents(key: Key, kv: &mut KeyVersions, ids: &[TxnId], violations: &mut Vec<Violation>) {
    kv.readers.sort_unstable_by_key(|&(v, r, _)| (v, r));
    let mut reference: Option<(u64, u64)> = None;
    for &(v, r, digest) in &kv.readers {
        if digest == 0 {
            continue;
        }
        let expect = match kv.writers.get(&v) {
            Some(&(_, installed)) => installed,
            None => match reference {
                Some((rv, d)) if rv == v => d,
                _ => {
                    reference = Some((v, digest));
                    digest
                }
            },
        };
        if expect != 0 && digest != expect && violations.len() < VIOLATIONS_MAX {
            violations.push(Violation::ContentMismatch { key, version: v, reader: ids[r] });
        }
    }
}

/// Finds one cycle by iterative depth-first search (histories can be millions deep).
fn find_cycle(adj: &[Vec<(usize, EdgeKind, Key)>], ids: &[TxnId]) -> Option<Cycle> {
    #[derive(Copy, Clone, PartialEq)]
    enum Color {
        White,
        Gray,
        Black,
    }
    let mut color = vec![Color::White; adj.len()];
    // Stack of (node, next edge to explore); `via[n]` is the edge used to reach n.
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let mut via: Vec<Option<(usize, EdgeKind, Key)>> = vec![None; adj.len()];
    for root in 0..adj.len() {
        if color[root] != Color::White {
            continue;
        }
        color[root] = Color::Gray;
        stack.push((root, 0));
        while let Some(&mut (n, ref mut next)) = stack.last_mut() {
            if *next == adj[n].len() {
                color[n] = Color::Black;
                stack.pop();
                continue;
            }
            let (m, kind, key) = adj[n][*next];
            *next += 1;
            match color[m] {
                Color::White => {
                    color[m] = Color::Gray;
                    via[m] = Some((n, kind, key));
                    stack.push((m, 0));
                }
                Color::Gray => {
                    // Back edge n -> m closes a cycle m -> ... -> n -> m along the stack.
                    let mut edges = vec![Edge { from: ids[n], to: ids[m], kind, key }];
                    let mut cur = n;
                    while cur != m {
                        let (prev, k, key) =
                            via[cur].expect("every gray node but the root has a parent");
                        edges.push(Edge { from: ids[prev], to: ids[cur], kind: k, key });
                        cur = prev;
                    }
                    edges.reverse();
                    return Some(Cycle { edges });
                }
                Color::Black => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Access, TxnRecord};

    const X: Key = Key { table: 0, key: 1 };
    const Y: Key = Key { table: 0, key: 2 };

    fn txn(id: u64, reads: &[(Key, u64)], writes: &[(Key, u64)]) -> TxnRecord {
        let acc = |l: &[(Key, u64)]| {
            l.iter().map(|&(key, version)| Access { key, version, digest: 0 }).collect()
        };
        TxnRecord { id, reads: acc(reads), writes: acc(writes) }
    }

    fn history(txns: Vec<TxnRecord>) -> History {
        History { txns }
    }

    fn cycle_kinds(r: &Report) -> Vec<EdgeKind> {
        match r.violations.iter().find_map(|v| match v {
            Violation::Cycle(c) => Some(c),
            _ => None,
        }) {
            Some(c) => c.edges.iter().map(|e| e.kind).collect(),
            None => Vec::new(),
        }
    }

    #[test]
    fn a_serial_chain_passes() {
        let h = history(vec![
            txn(1, &[(X, 0)], &[(X, 1)]),
            txn(2, &[(X, 1)], &[(X, 2), (Y, 1)]),
            txn(3, &[(Y, 1), (X, 2)], &[]),
            txn(4, &[(X, 0)], &[]), // reads the loaded value: serialisable before 1
        ]);
        let r = check(&h);
        assert!(r.serializable(), "{:?}", r.violations);
        assert_eq!(r.txns, 4);
        assert!(r.edges >= 5);
    }

    #[test]
    fn lost_update_is_a_duplicate_version() {
        // Both read x0 and both installed x1.
        let h = history(vec![txn(1, &[(X, 0)], &[(X, 1)]), txn(2, &[(X, 0)], &[(X, 1)])]);
        let r = check(&h);
        assert!(matches!(r.violations[0], Violation::DuplicateVersion { version: 1, .. }));
    }

    #[test]
    fn lost_update_with_bumped_versions_is_a_cycle() {
        // Both read x0; T1 installed x1, T2 installed x2 over it without seeing it.
        let h = history(vec![txn(1, &[(X, 0)], &[(X, 1)]), txn(2, &[(X, 0)], &[(X, 2)])]);
        let r = check(&h);
        assert!(!r.serializable());
        let mut kinds = cycle_kinds(&r);
        kinds.sort_by_key(|k| *k as u8);
        assert_eq!(kinds, vec![EdgeKind::Ww, EdgeKind::Rw]);
    }

    #[test]
    fn write_skew_is_an_anti_dependency_cycle() {
        let h = history(vec![
            txn(1, &[(X, 0), (Y, 0)], &[(X, 1)]),
            txn(2, &[(X, 0), (Y, 0)], &[(Y, 1)]),
        ]);
        let r = check(&h);
        assert_eq!(cycle_kinds(&r), vec![EdgeKind::Rw, EdgeKind::Rw]);
    }

    #[test]
    fn g1c_is_a_write_read_cycle() {
        // Each reads what the other wrote.
        let h = history(vec![txn(1, &[(Y, 1)], &[(X, 1)]), txn(2, &[(X, 1)], &[(Y, 1)])]);
        let r = check(&h);
        assert_eq!(cycle_kinds(&r), vec![EdgeKind::Wr, EdgeKind::Wr]);
        let Violation::Cycle(c) = &r.violations[0] else { panic!() };
        assert_eq!(c.edges[0].to, c.edges[1].from);
        assert_eq!(c.edges[1].to, c.edges[0].from);
    }

    #[test]
    fn dirty_reads_and_skipped_bumps_are_reported() {
        let h =
            history(vec![txn(1, &[(X, 3)], &[]), txn(2, &[], &[(Y, 1)]), txn(3, &[], &[(Y, 3)])]);
        let r = check(&h);
        assert!(r
            .violations
            .iter()
            .any(|v| matches!(v, Violation::UnknownVersion { version: 3, .. })));
        assert!(r.violations.iter().any(|v| matches!(v, Violation::VersionGap { version: 3, .. })));
    }

    #[test]
    fn a_read_of_other_contents_than_were_installed_is_reported() {
        let acc = |key, version, digest| Access { key, version, digest };
        let t = |id, reads, writes| TxnRecord { id, reads, writes };
        let h = history(vec![
            t(1, vec![acc(X, 0, 7)], vec![acc(X, 1, 11)]),
            t(2, vec![acc(X, 1, 11), acc(Y, 0, 5)], vec![]),
            // A torn read of x1, and a read of the loaded y0 that disagrees with T2's.
            t(3, vec![acc(X, 1, 12), acc(Y, 0, 6)], vec![]),
            // Digests of 0 are not compared.
            t(4, vec![acc(X, 1, 0)], vec![]),
        ]);
        let r = check(&h);
        let mismatches: Vec<_> = r
            .violations
            .iter()
            .filter_map(|v| match v {
                Violation::ContentMismatch { key, reader, .. } => Some((*key, *reader)),
                _ => None,
            })
            .collect();
        assert_eq!(mismatches, vec![(X, TxnId(3)), (Y, TxnId(3))]);
    }

    #[test]
    fn long_histories_do_not_overflow_the_stack() {
        let n = 200_000u64;
        let txns = (1..=n).map(|i| txn(i, &[(X, i - 1)], &[(X, i)])).collect();
        assert!(check(&history(txns)).serializable());
    }
}
