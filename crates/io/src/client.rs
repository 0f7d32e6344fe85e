//! The requester side: reads of remote files into this worker's registered slots.
//!
//! A read takes a slot of the worker's buffer area, sends `READ` naming the slot, and
//! waits for `DONE`; the owner has WRITten the bytes into the slot by then (or they came
//! inside `DONE` and the handler copied them there). A read that times out keeps its
//! slot until its late `DONE` arrives, so a late WRITE can never land in a slot that
//! another read is using.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use hytra_fabric::{Endpoint, NodeId, Region, Rkey, WorkerId};
use hytra_rt::{Co, RpcError, Worker};
use thiserror::Error;

use crate::engine::put_padded;
use crate::export::FileId;
use crate::service::IoLayout;
use crate::wire::{self, decode_done, ReadReq, ReadStatus};

/// Why a read or lookup failed.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum IoError {
    /// The owner refused or failed the read.
    #[error("read refused by the owner: {0:?}")]
    Refused(ReadStatus),
    /// No `DONE` within the timeout.
    #[error("no answer within {0} ns")]
    Timeout(u64),
    /// The request could not be sent.
    #[error("request not sent: {0}")]
    Send(#[from] RpcError),
    /// The owner exports no file of that name.
    #[error("no exported file named '{0}'")]
    NoSuchFile(String),
    /// Longer than the slots of this client.
    #[error("read of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Asked for.
        len: u32,
        /// Slot size.
        max: u32,
    },
}

/// How a requesting worker behaves.
#[derive(Copy, Clone, Debug)]
pub struct ClientConfig {
    /// The buffer layout (the same on every node).
    pub layout: IoLayout,
    /// Key of the buffer region.
    pub rkey: Rkey,
    /// How long a read waits for `DONE`.
    pub timeout_ns: u64,
}

/// Counters of one requesting worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientStats {
    /// Reads that returned data.
    pub completed: u64,
    /// Reads the owner refused or failed.
    pub refused: u64,
    /// Reads that timed out.
    pub timeouts: u64,
    /// `DONE`s that arrived after their read timed out.
    pub late: u64,
}

struct Waiting {
    slot: u16,
    waker: Option<Waker>,
    outcome: Option<(ReadStatus, u32)>,
    abandoned: bool,
}

struct ClientState {
    free: Vec<u16>,
    pending: HashMap<u64, Waiting>,
    next_req: u64,
    stats: ClientStats,
}

/// A worker's client of remote I/O services. Cheap to clone; lives on its worker.
pub struct IoClient<E> {
    co: Co<E>,
    st: Rc<RefCell<ClientState>>,
    cfg: ClientConfig,
}

impl<E> Clone for IoClient<E> {
    fn clone(&self) -> Self {
        IoClient { co: self.co.clone(), st: self.st.clone(), cfg: self.cfg }
    }
}

impl<E: Endpoint + 'static> IoClient<E> {
    /// Makes `w` a requester (registers its `DONE` handler).
    pub fn install(w: &mut Worker<E>, cfg: ClientConfig) -> IoClient<E> {
        let st = Rc::new(RefCell::new(ClientState {
            free: (0..cfg.layout.client_slots).rev().collect(),
            pending: HashMap::new(),
            next_req: 1,
            stats: ClientStats::default(),
        }));
        let me = w.co().me();
        let handler_st = st.clone();
        let mut pad = Vec::new();
        w.handle(
            wire::DONE,
            Box::new(move |ctx, bytes| {
                let Some((id, status, len, data)) = decode_done(bytes) else { return };
                let mut s = handler_st.borrow_mut();
                let Some(wt) = s.pending.get_mut(&id) else { return };
                if wt.abandoned {
                    let slot = wt.slot;
                    s.pending.remove(&id);
                    s.free.push(slot);
                    s.stats.late += 1;
                    return;
                }
                if status == ReadStatus::Ok && !data.is_empty() {
                    if data.len() != len as usize || len > cfg.layout.max_len {
                        wt.outcome = Some((ReadStatus::Malformed, 0));
                    } else {
                        let region = ctx.ep.region(cfg.rkey).expect("the I/O region is registered");
                        put_padded(
                            region,
                            cfg.layout.client_slot(me.index, wt.slot),
                            data,
                            &mut pad,
                        );
                        wt.outcome = Some((status, len));
                    }
                } else {
                    wt.outcome = Some((status, len));
                }
                if let Some(w) = wt.waker.take() {
                    w.wake();
                }
            }),
        );
        IoClient { co: w.co(), st, cfg }
    }

    /// Counters so far.
    pub fn stats(&self) -> ClientStats {
        self.st.borrow().stats.clone()
    }

    /// The serving worker of `node` this worker talks to (its connection).
    fn server(&self, node: NodeId) -> WorkerId {
        let me = self.co.me();
        WorkerId { node, index: me.index % self.co.shape().workers_per_node }
    }

    /// The id and size of the file `node` exports as `name`.
    pub async fn lookup(&self, node: NodeId, name: &str) -> Result<(FileId, u64), IoError> {
        let t = self.co.call_waiting(self.server(node), wire::LOOKUP, name.as_bytes()).await?;
        let r = self
            .co
            .reply(t, |b| match b {
                [0, rest @ ..] if rest.len() == 12 => Some((
                    FileId(u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"))),
                    u64::from_le_bytes(rest[4..].try_into().expect("8 bytes")),
                )),
                _ => None,
            })
            .await?;
        r.ok_or_else(|| IoError::NoSuchFile(name.to_string()))
    }

    /// Reads `len` bytes of `file` on `node` at `offset` and returns them.
    pub async fn read(
        &self,
        node: NodeId,
        file: FileId,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, IoError> {
        self.read_with(node, file, offset, len, |region, at, len| {
            let mut v = vec![0u8; (len as usize).div_ceil(8) * 8];
            region.read_bytes(at, &mut v);
            v.truncate(len as usize);
            v
        })
        .await
    }

    /// Reads into this worker's slot and hands `(region, offset, len)` of the bytes to
    /// `f` before the slot is reused (benchmarks pass a closure that looks at nothing).
    pub async fn read_with<R>(
        &self,
        node: NodeId,
        file: FileId,
        offset: u64,
        len: u32,
        f: impl FnOnce(&Region, u64, u32) -> R,
    ) -> Result<R, IoError> {
        if len > self.cfg.layout.max_len {
            return Err(IoError::TooLarge { len, max: self.cfg.layout.max_len });
        }
        let slot = loop {
            if let Some(s) = self.st.borrow_mut().free.pop() {
                break s;
            }
            self.co.yield_now().await;
        };
        let me = self.co.me();
        let req_id = {
            let mut s = self.st.borrow_mut();
            let id = s.next_req;
            s.next_req += 1;
            s.pending.insert(id, Waiting { slot, waker: None, outcome: None, abandoned: false });
            id
        };
        let at = self.cfg.layout.client_slot(me.index, slot);
        let req = ReadReq { req_id, file, offset, len, dst_rkey: self.cfg.rkey, dst_offset: at };
        let mut msg = Vec::with_capacity(wire::READ_REQ_LEN);
        req.encode(&mut msg);
        if let Err(e) = self.co.send_oneway(self.server(node), wire::READ, &msg) {
            let mut s = self.st.borrow_mut();
            s.pending.remove(&req_id);
            s.free.push(slot);
            return Err(e.into());
        }
        let deadline = self.co.now_ns() + self.cfg.timeout_ns;
        let outcome = WaitDone { client: self, req_id, deadline, armed: false }.await;
        let mut s = self.st.borrow_mut();
        match outcome {
            None => {
                s.stats.timeouts += 1;
                s.pending.get_mut(&req_id).expect("pending until answered").abandoned = true;
                Err(IoError::Timeout(self.cfg.timeout_ns))
            }
            Some((status, got)) => {
                s.pending.remove(&req_id);
                if status != ReadStatus::Ok || got != len {
                    s.free.push(slot);
                    s.stats.refused += 1;
                    let status =
                        if status == ReadStatus::Ok { ReadStatus::Malformed } else { status };
                    return Err(IoError::Refused(status));
                }
                s.stats.completed += 1;
                drop(s);
                let region = self.co.region(self.cfg.rkey).expect("the I/O region is registered");
                let r = f(&region, at, len);
                self.st.borrow_mut().free.push(slot);
                Ok(r)
            }
        }
    }

    /// Tells `node`'s serving worker that this worker is done with it.
    pub fn bye(&self, node: NodeId) -> Result<(), IoError> {
        self.co.send_oneway(self.server(node), wire::BYE, &[]).map_err(IoError::from)
    }
}

/// Waits for the `DONE` of `req_id`; `None` at the deadline.
struct WaitDone<'a, E> {
    client: &'a IoClient<E>,
    req_id: u64,
    deadline: u64,
    armed: bool,
}

impl<E: Endpoint> Future for WaitDone<'_, E> {
    type Output = Option<(ReadStatus, u32)>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut s = this.client.st.borrow_mut();
        let w = s.pending.get_mut(&this.req_id).expect("pending until answered");
        if let Some(o) = w.outcome {
            return Poll::Ready(Some(o));
        }
        if this.client.co.now_ns() >= this.deadline {
            return Poll::Ready(None);
        }
        w.waker = Some(cx.waker().clone());
        if !this.armed {
            this.armed = true;
            this.client.co.wake_at(this.deadline, cx.waker());
        }
        Poll::Pending
    }
}
