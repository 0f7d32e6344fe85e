//! How the processes of a UCX cluster meet: an [`Exchange`] moves small blobs (worker
//! addresses, remote keys, results) between them and decides together when a run ends.
//! [`Solo`] is the exchange of a cluster that lives in one process; the TCP bootstrap
//! of `hytra node` implements the same trait across processes.

use crate::endpoint::BackendError;
use crate::ids::{ClusterShape, NodeId};

use super::endpoint::WorkerSet;
use super::RegionSlot;

/// The processes of one cluster, seen from one of them.
pub trait Exchange: Send {
    /// Sends `mine` to every process and returns every process's blob (this one's
    /// included), in process order. Also a barrier: returns once all have called it.
    fn allgather(&mut self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, BackendError>;
    /// Sends `mine` to the first process, which gets every blob in process order;
    /// the others get `None`.
    fn gather(&mut self, mine: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, BackendError>;
    /// Called about every half millisecond during a run with this process's state; true
    /// once the run is over everywhere (see [`Waves`]). An error (a peer process
    /// vanished) ends the run.
    fn poll_done(&mut self, local: Quiescence) -> Result<bool, BackendError>;
}

/// What a process says of itself when asked whether a run is over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quiescence {
    /// Every worker here is done, and everything they posted is complete at its target.
    pub done: bool,
    /// Datagrams this process's workers sent.
    pub sent: u64,
    /// Datagrams they handed to their programs or dropped.
    pub received: u64,
    /// The same by peer node: (sent to it, received or dropped from it). Empty where the
    /// exchange does not need it; a hub that lost a process judges by these.
    pub by_node: Vec<(u64, u64)>,
}

/// When a run is over: done workers still answer requests, so a datagram in flight (a
/// request, a one-way message) would be lost if its target stopped first. The run ends
/// once two snapshots of every process in a row (each taken after the previous one was
/// complete) find every process done, as many datagrams received as sent, and the same
/// totals: then nothing was in flight between them, and done workers send nothing
/// unprompted. Datagrams are counted sent before they can arrive.
#[derive(Clone, Debug, Default)]
pub struct Waves {
    last: Option<(u64, u64)>,
}

impl Waves {
    /// Takes one complete snapshot (`parts`, one per process); true if the run is over.
    pub fn observe(&mut self, parts: impl IntoIterator<Item = Quiescence>) -> bool {
        let (mut done, mut sent, mut received) = (true, 0, 0);
        for q in parts {
            done &= q.done;
            sent += q.sent;
            received += q.received;
        }
        let quiet = (done && sent == received).then_some((sent, received));
        let over = quiet.is_some() && quiet == self.last;
        self.last = quiet;
        over
    }

    /// As [`Waves::observe`], counting only datagrams between nodes that are `live` (by
    /// node id): the reports of processes that died are missing, and what the survivors
    /// sent them or got from them before they died is never answered. Each report must
    /// count by node.
    pub fn observe_live(&mut self, parts: &[Quiescence], live: &[bool]) -> bool {
        let (mut done, mut sent, mut received) = (true, 0, 0);
        for q in parts {
            assert_eq!(q.by_node.len(), live.len(), "a report counts datagrams by node");
            done &= q.done;
            for (&(s, r), &l) in q.by_node.iter().zip(live) {
                if l {
                    sent += s;
                    received += r;
                }
            }
        }
        let quiet = (done && sent == received).then_some((sent, received));
        let over = quiet.is_some() && quiet == self.last;
        self.last = quiet;
        over
    }
}

/// The exchange of a cluster whose every node is in this process.
#[derive(Clone, Debug, Default)]
pub struct Solo {
    waves: Waves,
}

impl Exchange for Solo {
    fn allgather(&mut self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, BackendError> {
        Ok(vec![mine])
    }
    fn gather(&mut self, mine: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, BackendError> {
        Ok(Some(vec![mine]))
    }
    fn poll_done(&mut self, local: Quiescence) -> Result<bool, BackendError> {
        Ok(self.waves.observe([local]))
    }
}

/// A region of some node as its peers reach it.
#[derive(Clone, Debug)]
pub(crate) struct RemoteRegion {
    pub(crate) base: u64,
    pub(crate) len: u64,
    pub(crate) packed_rkey: Vec<u8>,
}

/// What every process announced: worker addresses by dense worker index, regions by
/// node.
pub(crate) struct Peers {
    pub(crate) addresses: Vec<Vec<u8>>,
    pub(crate) regions: Vec<Vec<RemoteRegion>>,
}

struct Writer(Vec<u8>);

impl Writer {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(u32::try_from(b.len()).expect("blob part fits u32"));
        self.0.extend_from_slice(b);
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], BackendError> {
        if self.0.len() < n {
            return Err(BackendError::Config("truncated address exchange".into()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, BackendError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, BackendError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, BackendError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

/// This process's announcement: for each hosted node, its workers' addresses and its
/// regions' base addresses, sizes and packed keys.
pub(crate) fn encode_local(
    shape: ClusterShape,
    workers: &WorkerSet,
    regions: &[Vec<RegionSlot>],
) -> Vec<u8> {
    let mut w = Writer(Vec::new());
    let hosted: Vec<u16> = (0..shape.nodes).filter(|&n| workers.hosts_node(NodeId(n))).collect();
    w.u32(hosted.len() as u32);
    for n in hosted {
        w.u32(u32::from(n));
        for i in 0..shape.workers_per_node {
            let idx = usize::from(n) * usize::from(shape.workers_per_node) + usize::from(i);
            w.bytes(workers.address(idx));
        }
        let list = &regions[usize::from(n)];
        w.u32(list.len() as u32);
        for r in list {
            let RegionSlot::Hosted(h) = r else {
                unreachable!("a hosted node's regions are hosted")
            };
            w.u64(h.base);
            w.u64(h.region.len_bytes());
            w.bytes(&h.packed_rkey);
        }
    }
    w.0
}

/// Every process's announcement put together, checked against what this process
/// registered (all processes must register the same regions in the same order).
pub(crate) fn decode_all(
    shape: ClusterShape,
    blobs: &[Vec<u8>],
    own: &[Vec<RegionSlot>],
) -> Result<Peers, BackendError> {
    let mut addresses: Vec<Option<Vec<u8>>> = vec![None; shape.workers_total()];
    let mut regions: Vec<Option<Vec<RemoteRegion>>> = vec![None; usize::from(shape.nodes)];
    for blob in blobs {
        let mut r = Reader(blob);
        for _ in 0..r.u32()? {
            let n = r.u32()?;
            let node = u16::try_from(n)
                .ok()
                .filter(|&n| n < shape.nodes)
                .ok_or_else(|| BackendError::Config(format!("a peer announced node {n}")))?;
            if regions[usize::from(node)].is_some() {
                return Err(BackendError::Config(format!("node {node} is hosted twice")));
            }
            for i in 0..shape.workers_per_node {
                let idx = usize::from(node) * usize::from(shape.workers_per_node) + usize::from(i);
                addresses[idx] = Some(r.bytes()?);
            }
            let count = r.u32()? as usize;
            let mine = &own[usize::from(node)];
            if count != mine.len() {
                return Err(BackendError::Config(format!(
                    "node {node} registered {count} regions, this process expected {}",
                    mine.len()
                )));
            }
            let mut list = Vec::with_capacity(count);
            for (k, slot) in mine.iter().enumerate() {
                let (base, len, packed_rkey) = (r.u64()?, r.u64()?, r.bytes()?);
                if len != slot.region().len_bytes() {
                    return Err(BackendError::Config(format!(
                        "region {k} of node {node} has {len} bytes there and {} here",
                        slot.region().len_bytes()
                    )));
                }
                list.push(RemoteRegion { base, len, packed_rkey });
            }
            regions[usize::from(node)] = Some(list);
        }
    }
    let missing: Vec<u16> =
        (0..shape.nodes).filter(|&n| regions[usize::from(n)].is_none()).collect();
    if !missing.is_empty() {
        return Err(BackendError::Config(format!("no process hosts nodes {missing:?}")));
    }
    Ok(Peers {
        addresses: addresses.into_iter().map(|a| a.expect("every node's workers")).collect(),
        regions: regions.into_iter().map(|r| r.expect("checked above")).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(done: bool, sent: u64, received: u64) -> Quiescence {
        Quiescence { done, sent, received, by_node: Vec::new() }
    }

    #[test]
    fn a_run_ends_only_after_two_equal_quiet_snapshots() {
        let mut w = Waves::default();
        // One quiet snapshot is not enough: a datagram may have been counted on neither
        // side of it.
        assert!(!w.observe([q(true, 5, 2), q(true, 1, 4)]));
        assert!(w.observe([q(true, 5, 2), q(true, 1, 4)]));
        let mut w = Waves::default();
        // In flight: sent but not yet received.
        assert!(!w.observe([q(true, 6, 2), q(true, 1, 4)]));
        assert!(!w.observe([q(true, 6, 2), q(true, 1, 4)]));
        // Received and answered between two snapshots: the totals moved.
        assert!(!w.observe([q(true, 6, 2), q(true, 2, 5)]));
        assert!(!w.observe([q(true, 6, 3), q(true, 2, 5)]));
        assert!(w.observe([q(true, 6, 3), q(true, 2, 5)]));
        let mut w = Waves::default();
        // A process that is not done stops nothing, balanced or not.
        assert!(!w.observe([q(false, 1, 1), q(true, 0, 0)]));
        assert!(!w.observe([q(false, 1, 1), q(true, 0, 0)]));
        assert!(!w.observe([q(true, 1, 1), q(true, 0, 0)]));
        assert!(w.observe([q(true, 1, 1), q(true, 0, 0)]));
    }
}
