//! Finishing an attempt: logging, write-back and unlock, or release on abort; the
//! worker's background task; statistics and history.
//!
//! Once every lock is held and the read set validated, the transaction will commit: it
//! is committed when every backup of every partition it writes acknowledged its log
//! (DrTM+H Fig. 1), so logging and write-back are retried until they get through rather
//! than aborted. With passive ACK the write-back's acknowledgement is collected later,
//! off the critical path: unsignaled inline WRITEs, a staged WRITE whose ticket the next
//! commit collects, or an RPC whose reply the background task awaits (and resends on a
//! timeout).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use hytra_check::{Access as HAccess, Key as HKey, TxnRecord};
use hytra_fabric::constants::INLINE_MAX;
use hytra_fabric::{Endpoint, LocalAddr, NodeId, OpFlags, RemoteAddr, WorkRequest, WriteSrc};
use hytra_rt::{CallTicket, Co, OpTicket, RpcError};
use hytra_store::layout::{self, checksum, ABSENT, LOCK_WORD, VERSION_WORD};

use crate::config::{PlantedFault, Primitive};
use crate::engine::{call_reliably, PendingAck, WorkerTxn};
use crate::log::{LOGGED_DELETE, SKIP};
use crate::outcome::{Abort, AbortReason, Outcome};
use crate::txn::{Locked, Txn, TxnCtx};
use crate::wire::{self, CommitReq, RecordReq, DELETE, SYNC};

impl<E: Endpoint> Txn<'_, E> {
    /// Validates, logs and commits. Read-only transactions validate their reads (one
    /// record: nothing to validate) and commit without logs.
    pub async fn commit(self) -> Outcome {
        let ctx = self.ctx;
        let t0 = ctx.co.now_ns();
        ctx.phase_ns[0] = t0 - ctx.attempt_start;
        let writes = ctx.acc.iter().any(|a| a.write);
        if !writes {
            if ctx.acc.len() > 1 {
                if let Err(Abort(r)) = ctx.validate_reads().await {
                    return ctx.aborted(r).await;
                }
            }
            let t1 = ctx.co.now_ns();
            ctx.phase_ns[1] = t1 - t0;
            ctx.committed(t1);
            return Outcome::Committed;
        }
        if let Err(Abort(r)) = ctx.lock_writes().await {
            return ctx.aborted(r).await;
        }
        if let Err(Abort(r)) = ctx.validate_reads().await {
            return ctx.aborted(r).await;
        }
        let t1 = ctx.co.now_ns();
        ctx.phase_ns[1] = t1 - t0;
        if ctx.node.cfg.planted(PlantedFault::CommitBeforeLogged) {
            ctx.write_back().await;
            ctx.committed(ctx.co.now_ns());
            ctx.log().await;
            ctx.reclaim_lazily();
            return Outcome::Committed;
        }
        ctx.log().await;
        let t2 = ctx.co.now_ns();
        ctx.phase_ns[2] = t2 - t1;
        ctx.write_back().await;
        let t3 = ctx.co.now_ns();
        ctx.phase_ns[3] = t3 - t2;
        ctx.committed(t3);
        ctx.reclaim_lazily();
        Outcome::Committed
    }

    /// Aborts: releases every lock taken.
    pub async fn abort(self, reason: AbortReason) -> Outcome {
        self.ctx.aborted(reason).await
    }
}

impl<E: Endpoint> TxnCtx<E> {
    /// The version word a write installs.
    fn new_version(&self, i: usize) -> u64 {
        let a = &self.acc[i];
        let bump = if self.node.cfg.planted(PlantedFault::SkipVersionBump) { 0 } else { 1 };
        let n = layout::version_number(a.lock_version) + bump;
        if a.absent_after() {
            n | ABSENT
        } else {
            n
        }
    }

    /// Writes the redo log to every backup of every partition written; returns once all
    /// acknowledged it (the transaction is then committed).
    async fn log(&mut self) {
        if self.node.cfg.replication <= 1 {
            return;
        }
        for b in &mut self.builders {
            b.clear();
        }
        for i in 0..self.acc.len() {
            let a = self.acc[i];
            if !a.write {
                continue;
            }
            let version = self.new_version(i);
            let flags = if a.absent_after() { LOGGED_DELETE } else { 0 };
            let payload = &self.payload[a.at as usize..a.at as usize + usize::from(a.len)];
            let hint = a.off.unwrap_or(0);
            for b in self.config.placement.backups(a.partition) {
                self.builders[usize::from(b.0)].record(
                    self.owner.0,
                    a.table,
                    a.key,
                    version,
                    flags,
                    hint,
                    payload,
                );
            }
            self.co.charge(self.node.cfg.costs.record_ns);
        }
        // Execution and validation have landed every request that used scratch: logging
        // stages its entries there from the start.
        self.scratch_used = 0;
        let mut flights = std::mem::take(&mut self.log_flights);
        let mut builders = std::mem::take(&mut self.builders);
        for (n, b) in builders.iter_mut().enumerate() {
            if b.is_empty() {
                continue;
            }
            let node = NodeId(n as u16);
            for entry in b.finish() {
                let f = self.send_entry(node, entry, &mut flights).await;
                flights.push(f);
                if !self.node.cfg.outstanding {
                    self.land_logs(&mut flights).await;
                }
            }
        }
        self.builders = builders;
        self.land_logs(&mut flights).await;
        self.log_flights = flights;
    }

    /// Reserves ring space at `node` (waiting for credit if needed) and sends one entry.
    async fn send_entry(
        &mut self,
        node: NodeId,
        entry: &[u64],
        flights: &mut Vec<LogFlight>,
    ) -> LogFlight {
        let len = entry.len() as u64 * 8;
        let ring = self.node.log.ring_bytes;
        let mut waited = false;
        let (skip, at, start) = loop {
            let reserved = self.wt.rings.borrow_mut()[usize::from(node.0)].reserve(len, ring);
            if let Some(r) = reserved {
                break r;
            }
            if waited {
                // Other coroutines' entries are still in flight: give them a step.
                self.co.yield_now().await;
            }
            // No credit: let our own entries land, have the backup apply what is
            // committed, and learn its head.
            self.land_logs(flights).await;
            self.sync_reclaim(node).await;
            waited = true;
        };
        match self.node.cfg.log {
            Primitive::OneSided => {
                // The ring space is reserved: the entry must go out, so a full staging
                // area or send queue is waited out, never turned into an abort.
                let ring_at = self.node.log.ring_offset(self.wt.me_idx);
                let rkey = self.node.log.rkey;
                let qp = self.qp(node);
                let src = loop {
                    if let Ok(src) = self.scratch(len) {
                        break src;
                    }
                    // Staging holds entries still on their way; once they landed, it is
                    // free (execution and validation are over: nothing else uses it).
                    self.land_logs(flights).await;
                    self.scratch_used = 0;
                };
                self.scratch_region.write_words(src.offset, entry);
                let body = WorkRequest::Write {
                    remote: RemoteAddr { node, rkey, offset: ring_at + at },
                    src: WriteSrc::Local { addr: src, len: len as u32 },
                };
                if let Some(pos) = skip {
                    let skip_word = SKIP.to_le_bytes();
                    let skip = WorkRequest::Write {
                        remote: RemoteAddr { node, rkey, offset: ring_at + pos },
                        src: WriteSrc::Bytes(&skip_word),
                    };
                    // The skip word is inline; the entry is fetched from scratch.
                    self.post(|co| co.issue_unsignaled(qp, &[skip], OpFlags::INLINE)).await;
                }
                let t = self.post(|co| co.issue(qp, &[body])).await;
                LogFlight { node, start, op: Some(t), call: None, req: Vec::new() }
            }
            Primitive::TwoSided => {
                let mut req = self.wt.take_buffer();
                wire::encode_log(start, entry, &mut req);
                let call = self.send_call(self.wt.ring_owner(node), wire::LOG, &req).await;
                LogFlight { node, start, op: None, call: Some(call), req }
            }
        }
    }

    /// Waits for every log entry in flight; resends two-sided ones that time out.
    async fn land_logs(&mut self, flights: &mut Vec<LogFlight>) {
        for mut f in flights.drain(..) {
            if let Some(t) = f.op.take() {
                if let Err(e) = self.co.wait(t).await {
                    panic!("log write to backup {} failed ({e}); recovery from backup failures is not implemented", f.node);
                }
            }
            while let Some(t) = f.call.take() {
                match self.co.reply(t, wire::decode_word).await {
                    Ok(Some(head)) => {
                        self.wt.rings.borrow_mut()[usize::from(f.node.0)].learn_head(head)
                    }
                    Ok(None) => panic!("malformed LOG reply"),
                    Err(RpcError::TimedOut) => {
                        let dest = self.wt.ring_owner(f.node);
                        f.call = Some(self.send_call(dest, wire::LOG, &f.req).await)
                    }
                    Err(e) => panic!("LOG to {} failed: {e}", f.node),
                }
            }
            self.wt.rings.borrow_mut()[usize::from(f.node.0)].acknowledged(f.start);
            self.wt.give_buffer(std::mem::take(&mut f.req));
        }
    }

    /// Waits for the reply to a request that must get through, sending it again after
    /// every timeout (its handler is idempotent), then recycles its buffer.
    async fn settle(&mut self, mut req: PendingAck) {
        loop {
            let t = match req.call.take() {
                Some(t) => t,
                None => self.send_call(req.dest, req.ty, &req.bytes).await,
            };
            match self.co.reply(t, wire::decode_word).await {
                Ok(_) => break,
                Err(RpcError::TimedOut) => {}
                Err(e) => panic!("request to {} failed: {e}", req.dest),
            }
        }
        self.wt.give_buffer(req.bytes);
    }

    /// Has the backup apply everything committed in our ring and learns its head.
    async fn sync_reclaim(&mut self, node: NodeId) {
        let up_to = self.wt.rings.borrow()[usize::from(node.0)].committed_to();
        wire::encode_reclaim(SYNC, up_to, &mut self.req);
        let req = std::mem::take(&mut self.req);
        let head = call_reliably(&self.co, self.wt.ring_owner(node), wire::RECLAIM, &req).await;
        self.req = req;
        let head = head.unwrap_or_else(|e| panic!("reclaim at {node} failed: {e}"));
        let mut rings = self.wt.rings.borrow_mut();
        rings[usize::from(node.0)].learn_head(head);
        rings[usize::from(node.0)].reclaim_sent =
            rings[usize::from(node.0)].reclaim_sent.max(up_to);
    }

    /// Tells backups lazily (one-way, passive) how far our logs are committed.
    fn reclaim_lazily(&mut self) {
        let threshold = self.node.cfg.reclaim_after_bytes;
        let nodes = self.co.shape().nodes;
        for n in 0..nodes {
            let up_to = {
                let rings = self.wt.rings.borrow();
                let r = &rings[usize::from(n)];
                let up_to = r.committed_to();
                if up_to - r.reclaim_sent < threshold {
                    continue;
                }
                up_to
            };
            wire::encode_reclaim(0, up_to, &mut self.req);
            // A lost reclaim is harmless: the next one covers it, and the final flush is
            // reliable.
            if self.co.send_oneway(self.wt.ring_owner(NodeId(n)), wire::RECLAIM, &self.req).is_ok()
            {
                self.wt.rings.borrow_mut()[usize::from(n)].reclaim_sent = up_to;
            }
        }
    }

    /// Writes back every write and unlocks it.
    async fn write_back(&mut self) {
        let pa = self.node.cfg.passive_ack;
        // The staging area of the previous commit is reused: its WRITEs must be done.
        for t in std::mem::take(&mut self.staged) {
            self.co.wait(t).await.unwrap_or_else(|e| panic!("staged write-back failed: {e}"));
        }
        let mut staging_used = 0;
        // Tickets of this commit's one-sided write-backs.
        let mut waits = std::mem::take(&mut self.waits);
        let mut calls = Vec::new();
        for i in 0..self.acc.len() {
            let a = self.acc[i];
            if !a.write {
                continue;
            }
            self.co.charge(self.node.cfg.costs.record_ns);
            let version = self.new_version(i);
            let payload_range = a.at as usize..a.at as usize + usize::from(a.len);
            if a.node == self.co.me().node {
                let node = self.node.clone();
                let replica = node.store.replica(a.table, a.partition);
                let off = a.off.expect("a local record is locked at its offset");
                let early = self.node.cfg.planted(PlantedFault::UnlockBeforeWriteBack);
                if !early {
                    replica.write_back(off, version, a.key, &self.payload[payload_range.clone()]);
                }
                match a.locked {
                    Locked::Nic if !self.wt.coherent => self.unlock_by_nic(i).await,
                    _ => replica.unlock(off),
                }
                if early {
                    // Let other coroutines run between the unlock and the write-back.
                    self.co.yield_now().await;
                    replica.write_back(off, version, a.key, &self.payload[payload_range]);
                }
                continue;
            }
            match (self.node.cfg.commit, a.locked) {
                (Primitive::OneSided, Locked::Nic | Locked::Rpc) if a.off.is_some() => {
                    let t =
                        self.write_back_one_sided(i, version, &mut staging_used, &mut waits).await;
                    waits.extend(t);
                }
                _ => {
                    let flags = if a.absent_after() { DELETE } else { 0 };
                    let c = CommitReq {
                        table: a.table.0,
                        flags,
                        epoch: self.epoch(),
                        key: a.key,
                        owner: self.owner.0,
                        version: version & !ABSENT,
                    };
                    let mut bytes = self.wt.take_buffer();
                    c.encode(&self.payload[payload_range], &mut bytes);
                    let dest = self.peer(a.node);
                    // Sent now in any case (the write-back is what releases the lock);
                    // with no call slot free it is sent when it is settled.
                    let call = self.co.call(dest, wire::COMMIT, &bytes).ok();
                    let req = PendingAck { dest, ty: wire::COMMIT, bytes, call };
                    if pa {
                        self.wt.push_ack(req);
                    } else if self.node.cfg.outstanding {
                        calls.push(req);
                    } else {
                        self.settle(req).await;
                    }
                }
            }
        }
        self.co.ring_doorbells();
        if pa {
            // Passive ACK: the next commit collects them before it reuses the staging.
            self.staged.append(&mut waits);
        }
        self.wait_write_backs(&mut waits).await;
        self.waits = waits;
        for req in calls {
            self.settle(req).await;
        }
    }

    /// Posts the WRITE of a record's new version and payload and the WRITE that unlocks
    /// it, in one doorbell on one connection (FIFO: the unlock lands last). Small records
    /// go inline; with passive ACK they are not even signaled. Returns the ticket to
    /// collect, if any.
    /// Waits for write-back tickets (their WRITEs read the staging area).
    async fn wait_write_backs(&self, tickets: &mut Vec<OpTicket>) {
        for t in tickets.drain(..) {
            self.co.wait(t).await.unwrap_or_else(|e| panic!("write-back failed: {e}"));
        }
    }

    async fn write_back_one_sided(
        &mut self,
        i: usize,
        version: u64,
        staging_used: &mut u64,
        issued: &mut Vec<OpTicket>,
    ) -> Option<OpTicket> {
        let a = self.acc[i];
        let off = a.off.expect("locked at a known offset");
        let rkey = self.rkey(&a);
        let payload = &self.payload[a.at as usize..a.at as usize + usize::from(a.len)];
        self.words.clear();
        self.words.extend_from_slice(&[version, a.key, checksum(version, a.key, payload)]);
        self.words.extend_from_slice(payload);
        let body_at = RemoteAddr { node: a.node, rkey, offset: off + VERSION_WORD * 8 };
        let lock_at = RemoteAddr { node: a.node, rkey, offset: off + LOCK_WORD * 8 };
        let qp = self.qp(a.node);
        let body_bytes = self.words.len() * 8;
        let zero = 0u64.to_le_bytes();
        if self.node.cfg.inline && body_bytes <= INLINE_MAX {
            let mut bytes = [0u8; INLINE_MAX];
            for (chunk, w) in bytes.chunks_exact_mut(8).zip(&self.words) {
                chunk.copy_from_slice(&w.to_le_bytes());
            }
            let mut wrs = [
                WorkRequest::Write { remote: body_at, src: WriteSrc::Bytes(&bytes[..body_bytes]) },
                WorkRequest::Write { remote: lock_at, src: WriteSrc::Bytes(&zero) },
            ];
            if self.node.cfg.planted(PlantedFault::UnlockBeforeWriteBack) {
                wrs.swap(0, 1);
            }
            if self.node.cfg.passive_ack {
                self.post(|co| co.issue_unsignaled_deferred(qp, &wrs, OpFlags::INLINE)).await;
                return None;
            }
            return Some(self.post(|co| co.issue_with(qp, &wrs, OpFlags::INLINE)).await);
        }
        // Staged: the payload, then a zero word for the unlock, in registered memory that
        // stays untouched until the WRITEs complete (M5). A write set larger than the
        // staging area waits for the write-backs already issued, then reuses it.
        let (base, room) = self.staging();
        let need = body_bytes as u64 + 8;
        assert!(need <= room, "one record of {body_bytes} bytes exceeds the staging area");
        if *staging_used + need > room {
            self.wait_write_backs(issued).await;
            *staging_used = 0;
        }
        let src = LocalAddr { offset: base.offset + *staging_used, ..base };
        *staging_used += need;
        self.scratch_region.write_words(src.offset, &self.words);
        self.scratch_region.store(src.offset + body_bytes as u64, 0);
        let mut wrs = [
            WorkRequest::Write {
                remote: body_at,
                src: WriteSrc::Local { addr: src, len: body_bytes as u32 },
            },
            WorkRequest::Write {
                remote: lock_at,
                src: WriteSrc::Local {
                    addr: LocalAddr { offset: src.offset + body_bytes as u64, ..src },
                    len: 8,
                },
            },
        ];
        if self.node.cfg.planted(PlantedFault::UnlockBeforeWriteBack) {
            wrs.swap(0, 1);
        }
        Some(self.post(|co| co.issue(qp, &wrs)).await)
    }

    /// Releases every lock the attempt holds (or may hold), counts the abort.
    pub(crate) async fn aborted(&mut self, reason: AbortReason) -> Outcome {
        for i in 0..self.acc.len() {
            let a = self.acc[i];
            match a.locked {
                Locked::No => {}
                Locked::Cpu => self.replica(&a).unlock(a.off.expect("locked at an offset")),
                Locked::Nic if a.node == self.co.me().node && self.wt.coherent => {
                    self.replica(&a).unlock(a.off.expect("offset"))
                }
                Locked::Nic => self.unlock_by_nic(i).await,
                Locked::Rpc | Locked::Unknown => {
                    let epoch = self.epoch();
                    RecordReq {
                        table: a.table.0,
                        flags: 0,
                        epoch,
                        key: a.key,
                        owner: self.owner.0,
                    }
                    .encode(&mut self.req);
                    let req = std::mem::take(&mut self.req);
                    call_reliably(&self.co, self.peer(a.node), wire::UNLOCK, &req)
                        .await
                        .unwrap_or_else(|e| panic!("unlock failed: {e}"));
                    self.req = req;
                }
            }
            self.acc[i].locked = Locked::No;
        }
        self.co.ring_doorbells();
        if self.in_window(self.co.now_ns()) {
            let mut s = self.wt.stats.borrow_mut();
            s.aborts[reason.index()] += 1;
            s.per_type[usize::from(self.ty)].1 += 1;
        }
        Outcome::Aborted(reason)
    }

    /// Releases a NIC-held lock with a WRITE of 0 through the fabric (by loopback for a
    /// local record): on a fabric whose atomics are not coherent with the CPU's, the CPU
    /// never changes a word the NIC locks (M6). Unsignaled: nothing waits for it.
    async fn unlock_by_nic(&mut self, i: usize) {
        let a = self.acc[i];
        let rkey = self.rkey(&a);
        let remote = RemoteAddr {
            node: a.node,
            rkey,
            offset: a.off.expect("locked at an offset") + LOCK_WORD * 8,
        };
        let zero = 0u64.to_le_bytes();
        let wr = WorkRequest::Write { remote, src: WriteSrc::Bytes(&zero) };
        // Unlocks of several records on one node share a doorbell; the caller rings it.
        let qp = self.qp(a.node);
        self.post(|co| co.issue_unsignaled_deferred(qp, &[wr], OpFlags::INLINE)).await;
    }

    fn in_window(&self, now: u64) -> bool {
        let (start, end) = self.wt.window.get();
        (start..end).contains(&now)
    }

    /// Counts a commit that finished at `now` and records it for the checker.
    fn committed(&mut self, now: u64) {
        self.wt.commits_total.set(self.wt.commits_total.get() + 1);
        self.wt.stats.borrow_mut().count_in_timeline(now, self.wt.timeline_ns.get());
        if self.in_window(now) {
            let mut s = self.wt.stats.borrow_mut();
            s.commits += 1;
            s.per_type[usize::from(self.ty)].0 += 1;
            s.latency.record(now - self.txn_start);
            for (sum, p) in s.phase_ns.iter_mut().zip(self.phase_ns) {
                *sum += p;
            }
        }
        let mut history = self.wt.history.borrow_mut();
        if let Some(h) = history.as_mut() {
            let key = |a: &crate::txn::Access| HKey { table: a.table.0, key: a.key };
            let reads = self
                .acc
                .iter()
                .filter_map(|a| {
                    a.read_version.map(|v| HAccess {
                        key: key(a),
                        version: layout::version_number(v),
                        digest: a.read_digest,
                    })
                })
                .collect();
            let writes = (0..self.acc.len())
                .filter(|&i| self.acc[i].write)
                .map(|i| {
                    let (a, version) = (&self.acc[i], self.new_version(i));
                    let payload = &self.payload[a.at as usize..][..usize::from(a.len)];
                    let digest = match layout::is_present(version) {
                        true => checksum(version, a.key, payload),
                        false => 0,
                    };
                    HAccess { key: key(a), version: layout::version_number(version), digest }
                })
                .collect();
            h.push(TxnRecord { id: self.owner.0, reads, writes });
        }
    }
}

/// A log entry in flight.
pub(crate) struct LogFlight {
    node: NodeId,
    start: u64,
    op: Option<OpTicket>,
    call: Option<CallTicket>,
    /// The LOG request, to resend on a timeout.
    req: Vec<u8>,
}

/// The worker's background task: collects passive acknowledgements of two-sided commits
/// (resending on timeouts) and, once every transaction coroutine has ended, has every
/// backup apply this worker's logs (a reliable final reclaim).
pub(crate) async fn background<E: Endpoint>(co: Co<E>, wt: Rc<WorkerTxn>) {
    loop {
        loop {
            // The borrow ends inside the block: nothing is held across an await.
            let next = {
                let mut acks = wt.acks.borrow_mut();
                let Some(ack) = acks.front_mut() else { break };
                match ack.call.take() {
                    Some(t) => Some(t),
                    None => co.call(ack.dest, ack.ty, &ack.bytes).ok(),
                }
            };
            let Some(t) = next else {
                // No call slot free right now: try again after a step.
                co.yield_now().await;
                continue;
            };
            match co.reply(t, wire::decode_word).await {
                Ok(_) => {
                    let done = wt.acks.borrow_mut().pop_front().expect("the acknowledged request");
                    wt.give_buffer(done.bytes);
                }
                Err(RpcError::TimedOut) => {} // resend on the next round
                Err(e) => panic!("passive acknowledgement failed: {e}"),
            }
        }
        if wt.active.get() == 0 {
            let orphans = std::mem::take(&mut *wt.orphans.borrow_mut());
            for t in orphans {
                co.wait(t).await.unwrap_or_else(|e| panic!("staged write-back failed: {e}"));
            }
            flush_logs(&co, &wt).await;
            return;
        }
        Park { wt: &wt, parked: false }.await;
    }
}

async fn flush_logs<E: Endpoint>(co: &Co<E>, wt: &Rc<WorkerTxn>) {
    let nodes = co.shape().nodes;
    let mut req = Vec::new();
    for n in 0..nodes {
        let (tail, up_to) = {
            let rings = wt.rings.borrow();
            let r = &rings[usize::from(n)];
            (r.tail, r.committed_to())
        };
        assert_eq!(tail, up_to, "every log entry is acknowledged once transactions end");
        if tail == 0 || wt.rings.borrow()[usize::from(n)].head_known >= tail {
            continue;
        }
        wire::encode_reclaim(SYNC, up_to, &mut req);
        let head = call_reliably(co, wt.ring_owner(NodeId(n)), wire::RECLAIM, &req).await;
        let head = head.unwrap_or_else(|e| panic!("final reclaim at n{n} failed: {e}"));
        assert_eq!(head, up_to, "the backup applied everything");
        wt.rings.borrow_mut()[usize::from(n)].learn_head(head);
    }
}

/// Parks the background task until new work is pushed or a coroutine ends.
struct Park<'a> {
    wt: &'a WorkerTxn,
    parked: bool,
}

impl Future for Park<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.parked {
            return Poll::Ready(());
        }
        self.parked = true;
        *self.wt.acker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}
