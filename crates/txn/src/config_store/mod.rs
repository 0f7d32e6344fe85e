//! Where the cluster's configuration is committed: a store with compare-and-set on the
//! configuration's revision, so that of two configuration managers that each believe
//! they lead, exactly one moves the cluster to the next revision (FaRM commits its
//! configurations to ZooKeeper the same way). The engine only ever asks it two things:
//! what is stored, and "replace revision `r` with this one". The store knows nothing of
//! epochs; in the code below, its "epoch" is that revision number. Not for: agreement
//! among the nodes themselves (the store is the one arbiter; nodes never vote).
//!
//! [`MemoryStore`] is the store of a cluster in one process (the simulator, threads); a
//! cluster of processes on one machine uses the one its launcher holds and serves over
//! TCP ([`serve`], reached through [`TcpStore`]); hosts that share nothing use etcd
//! ([`etcd::EtcdStore`]). All behind the same trait.
//!
//! Wire format of [`serve`]: frames of a little-endian u32 length and that many bytes.
//! Requests: `G` (get), or `C` with the expected epoch, the new epoch (u64 each) and the
//! bytes. Answers: `N` (nothing stored), `V` with the epoch and bytes (what is stored),
//! `D` (stored), or `L` with the epoch and bytes (lost: what is stored instead).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;

pub mod etcd;

/// Why the store could not answer.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreFailure {
    /// The store is out of reach or failed; the caller may try again later.
    #[error("configuration store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something that does not read as what hytra stored there.
    #[error("configuration store answered something unreadable: {0}")]
    Malformed(String),
}

/// The outcome of a compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas {
    /// Stored: the new configuration is committed.
    Done,
    /// Another configuration was stored first: this one (epoch, bytes) is in force.
    Lost(u64, Vec<u8>),
}

/// A store of one encoded configuration, replaced by compare-and-set on its number (the
/// configuration's revision, called its epoch here).
pub trait ConfigStore: Send + Sync {
    /// The stored configuration (epoch, bytes), if any.
    fn get(&self) -> Result<Option<(u64, Vec<u8>)>, StoreFailure>;

    /// Stores `bytes` as epoch `epoch` if the stored epoch is `expected` (or nothing is
    /// stored and `expected` is 0).
    fn cas(&self, expected: u64, epoch: u64, bytes: &[u8]) -> Result<Cas, StoreFailure>;
}

/// A store in this process's memory.
#[derive(Default)]
pub struct MemoryStore {
    value: Mutex<Option<(u64, Vec<u8>)>>,
}

impl ConfigStore for MemoryStore {
    fn get(&self) -> Result<Option<(u64, Vec<u8>)>, StoreFailure> {
        Ok(self.value.lock().expect("no store user panicked").clone())
    }

    fn cas(&self, expected: u64, epoch: u64, bytes: &[u8]) -> Result<Cas, StoreFailure> {
        assert!(epoch > expected, "epoch {epoch} does not follow {expected}");
        let mut value = self.value.lock().expect("no store user panicked");
        let current = value.as_ref().map_or(0, |(e, _)| *e);
        if current != expected {
            let (e, b) = value.clone().expect("a stored configuration");
            return Ok(Cas::Lost(e, b));
        }
        *value = Some((epoch, bytes.to_vec()));
        Ok(Cas::Done)
    }
}

/// Largest configuration a [`TcpStore`] moves (a placement of thousands of partitions
/// is a few tens of KiB).
const FRAME_MAX: usize = 16 << 20;

/// How long one request to a [`TcpStore`] may take before the store counts as
/// unavailable (the manager retries later).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn write_frame(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(data.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut f = Vec::with_capacity(4 + data.len());
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(data);
    s.write_all(&f)
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_MAX {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "frame too large"));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

fn epoch_and_bytes(tag: u8, epoch: u64, bytes: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + bytes.len());
    f.push(tag);
    f.extend_from_slice(&epoch.to_le_bytes());
    f.extend_from_slice(bytes);
    f
}

fn split_epoch(b: &[u8]) -> Option<(u64, Vec<u8>)> {
    let epoch = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    Some((epoch, b[8..].to_vec()))
}

/// Answers one request to the store; `None` for a malformed one.
fn answer(store: &MemoryStore, req: &[u8]) -> Option<Vec<u8>> {
    match req.split_first()? {
        (b'G', []) => Some(match store.get().ok()? {
            None => vec![b'N'],
            Some((e, b)) => epoch_and_bytes(b'V', e, &b),
        }),
        (b'C', rest) => {
            let expected = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
            let (epoch, bytes) = split_epoch(rest.get(8..)?)?;
            if epoch <= expected {
                return None;
            }
            Some(match store.cas(expected, epoch, &bytes).ok()? {
                Cas::Done => vec![b'D'],
                Cas::Lost(e, b) => epoch_and_bytes(b'L', e, &b),
            })
        }
        _ => None,
    }
}

/// Serves `store` to the nodes of a cluster on `listener` until `stop` is set: one
/// thread per connection, each answering its node's requests in order. A malformed
/// request closes its connection.
pub fn serve(listener: TcpListener, store: Arc<MemoryStore>, stop: Arc<AtomicBool>) {
    listener.set_nonblocking(true).expect("a listening socket can be made non-blocking");
    let mut threads = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let (store, stop) = (store.clone(), stop.clone());
                threads.push(std::thread::spawn(move || {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_nodelay(true);
                    // Wake up now and then to notice `stop`.
                    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
                    while !stop.load(Ordering::Acquire) {
                        let req = match read_frame(&mut s) {
                            Ok(r) => r,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) =>
                            {
                                continue
                            }
                            Err(_) => return,
                        };
                        let Some(reply) = answer(&store, &req) else { return };
                        if write_frame(&mut s, &reply).is_err() {
                            return;
                        }
                    }
                }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    for t in threads {
        let _ = t.join();
    }
}

/// The store a launcher holds ([`serve`]), reached over TCP: one connection, opened on
/// first use and again after a failure.
pub struct TcpStore {
    addr: SocketAddr,
    conn: Mutex<Option<TcpStream>>,
}

impl TcpStore {
    /// A store served at `addr`.
    pub fn new(addr: SocketAddr) -> TcpStore {
        TcpStore { addr, conn: Mutex::new(None) }
    }

    fn request(&self, req: &[u8]) -> Result<Vec<u8>, StoreFailure> {
        let failed = |e: std::io::Error| StoreFailure::Unavailable(format!("{}: {e}", self.addr));
        let mut conn = self.conn.lock().expect("no store user panicked");
        if conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, REQUEST_TIMEOUT).map_err(failed)?;
            s.set_nodelay(true).ok();
            s.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(failed)?;
            *conn = Some(s);
        }
        let s = conn.as_mut().expect("connected above");
        let reply = write_frame(s, req).and_then(|()| read_frame(s));
        if reply.is_err() {
            // A late answer must never be taken for the next request's.
            *conn = None;
        }
        reply.map_err(failed)
    }
}

impl ConfigStore for TcpStore {
    fn get(&self) -> Result<Option<(u64, Vec<u8>)>, StoreFailure> {
        let r = self.request(b"G")?;
        match r.split_first() {
            Some((b'N', [])) => Ok(None),
            Some((b'V', rest)) => split_epoch(rest)
                .map(Some)
                .ok_or_else(|| StoreFailure::Unavailable("a malformed answer".into())),
            _ => Err(StoreFailure::Unavailable("a malformed answer".into())),
        }
    }

    fn cas(&self, expected: u64, epoch: u64, bytes: &[u8]) -> Result<Cas, StoreFailure> {
        assert!(epoch > expected, "epoch {epoch} does not follow {expected}");
        let mut req = vec![b'C'];
        req.extend_from_slice(&expected.to_le_bytes());
        req.extend_from_slice(&epoch.to_le_bytes());
        req.extend_from_slice(bytes);
        let r = self.request(&req)?;
        match r.split_first() {
            Some((b'D', [])) => Ok(Cas::Done),
            Some((b'L', rest)) => split_epoch(rest)
                .map(|(e, b)| Cas::Lost(e, b))
                .ok_or_else(|| StoreFailure::Unavailable("a malformed answer".into())),
            _ => Err(StoreFailure::Unavailable("a malformed answer".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_store_compares_and_sets_for_every_client() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let server = {
            let stop = stop.clone();
            std::thread::spawn(move || serve(listener, Arc::new(MemoryStore::default()), stop))
        };
        let (a, b) = (TcpStore::new(addr), TcpStore::new(addr));
        assert_eq!(a.get(), Ok(None));
        assert_eq!(a.cas(0, 1, b"one"), Ok(Cas::Done));
        assert_eq!(b.cas(0, 1, b"other"), Ok(Cas::Lost(1, b"one".to_vec())));
        assert_eq!(b.cas(1, 2, b"two"), Ok(Cas::Done));
        assert_eq!(a.cas(1, 2, b"late"), Ok(Cas::Lost(2, b"two".to_vec())));
        assert_eq!(a.get(), Ok(Some((2, b"two".to_vec()))));
        stop.store(true, Ordering::Release);
        server.join().unwrap();
        assert!(matches!(a.get(), Err(StoreFailure::Unavailable(_))), "a stopped store");
    }

    #[test]
    fn only_the_expected_epoch_is_replaced() {
        let s = MemoryStore::default();
        assert_eq!(s.get(), Ok(None));
        assert_eq!(s.cas(0, 1, b"one"), Ok(Cas::Done));
        assert_eq!(s.cas(0, 2, b"two"), Ok(Cas::Lost(1, b"one".to_vec())));
        assert_eq!(s.cas(1, 2, b"two"), Ok(Cas::Done));
        assert_eq!(s.get(), Ok(Some((2, b"two".to_vec()))));
    }
}
