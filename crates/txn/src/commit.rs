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
//!
//! Under a reconfiguration (see `recover.rs`) an attempt of the old epoch is frozen: it
//! posts nothing more. One frozen while logging learns its fate from recovery's
//! decision; one frozen while writing back is committed, and recovery finishes its
//! write-back from the logs. A log entry is resolved for its backup to apply only once
//! the write-back it logs has landed (L7): until then recovery must still find it.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use hytra_check::{Access as HAccess, Key as HKey, TxnRecord};
use hytra_fabric::constants::INLINE_MAX;
use hytra_fabric::{
    Endpoint, LocalAddr, NodeId, OpFlags, Qp, RemoteAddr, WorkRequest, WorkerId, WriteSrc,
};
use hytra_rt::{CallTicket, Co, OpTicket, RpcError, RpcType};
use hytra_store::layout::{self, checksum, ABSENT, LOCK_WORD, VERSION_WORD};

use crate::config::{PlantedFault, Primitive, ProtocolPoint};
use crate::engine::{crash_point, PendingAck, WorkerTxn};
use crate::log::{place, skip_word, EntryBuilder, LOGGED_DELETE, WRITTEN_PARTITIONS_MAX};
use crate::outcome::{Abort, AbortReason, Outcome};
use crate::stats::Phase;
use crate::txn::{Frozen, Locked, Txn, TxnCtx};
use crate::wire::{self, CommitReq, RecordReq, DELETE, MALFORMED, REFUSED, SYNC};

/// How logging ended.
enum Logged {
    /// Every backup acknowledged every entry: the transaction is committed.
    Committed,
    /// A reconfiguration froze the attempt while logging: recovery decides.
    Frozen,
}

impl<E: Endpoint> Txn<'_, E> {
    /// Validates, logs and commits. Read-only transactions validate their reads (one
    /// record: nothing to validate) and commit without logs.
    pub async fn commit(self) -> Outcome {
        let ctx = self.ctx;
        let t0 = ctx.co.now_ns();
        ctx.phase_ns[Phase::Execution] = t0 - ctx.attempt_start;
        let writes = ctx.acc.iter().any(|a| a.write);
        if !writes {
            if ctx.acc.len() > 1 {
                if let Err(Abort(r)) = ctx.validate_reads().await {
                    return ctx.aborted(r).await;
                }
            }
            let t1 = ctx.co.now_ns();
            ctx.phase_ns[Phase::Validation] = t1 - t0;
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
        ctx.phase_ns[Phase::Validation] = t1 - t0;
        if ctx.node.cfg.planted(PlantedFault::CommitBeforeLogged) {
            let landed = ctx.write_back().await;
            ctx.committed(ctx.co.now_ns());
            // The planted bug: the commit is reported whatever logging finds.
            if let Ok(Logged::Committed) = ctx.log().await {
                if landed.is_ok() {
                    ctx.resolve_logs();
                }
            }
            ctx.wt.take_doubt(ctx.owner.0);
            ctx.reclaim_lazily();
            return Outcome::Committed;
        }
        match ctx.log().await {
            Err(Abort(r)) => return ctx.aborted(r).await,
            Ok(Logged::Frozen) => return ctx.recovered().await,
            Ok(Logged::Committed) => {}
        }
        let t2 = ctx.co.now_ns();
        ctx.phase_ns[Phase::Logging] = t2 - t1;
        // Frozen on the way or not, the transaction is committed: recovery finishes a
        // write-back the attempt could not.
        let landed = ctx.write_back().await;
        let t3 = ctx.co.now_ns();
        ctx.phase_ns[Phase::Commit] = t3 - t2;
        ctx.committed(t3);
        if landed.is_ok() {
            ctx.resolve_logs();
        }
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

    /// Writes the redo log to every backup of every partition written; `Committed` once
    /// all acknowledged it. Refuses, before anything is sent, a log too large for a ring
    /// (`Full`) or an attempt already frozen (`Reconfigured`): the attempt then aborts
    /// like any other. `Frozen`: a reconfiguration stopped it half-way, and recovery
    /// decides whether it committed.
    #[allow(
        clippy::too_many_lines,
        reason = "longer than the limit before the limit was set; split it when it next changes"
    )]
    async fn log(&mut self) -> Result<Logged, Abort> {
        if self.node.cfg.replication <= 1 {
            return Ok(Logged::Committed);
        }
        let mut written = std::mem::take(&mut self.written);
        written.clear();
        written.extend(self.acc.iter().filter(|a| a.write).map(|a| a.partition));
        written.sort_unstable();
        written.dedup();
        if written.len() > WRITTEN_PARTITIONS_MAX {
            self.written = written;
            return Err(Abort(AbortReason::Full));
        }
        let (owner, epoch) = (self.owner.0, self.config.epoch);
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
                let builder = &mut self.builders[usize::from(b.0)];
                if builder.is_empty() {
                    builder.begin(owner, epoch, &written);
                }
                builder.record(a.table, a.key, version, flags, hint, payload);
            }
            self.co.charge_term(self.node.cfg.log_term(), 1);
        }
        self.written = written;
        let mut builders = std::mem::take(&mut self.builders);
        let mut starts = std::mem::take(&mut self.log_starts);
        starts.clear();
        let ring = self.node.log.ring_bytes;
        for (n, b) in builders.iter_mut().enumerate() {
            if b.is_empty() {
                continue;
            }
            let parts = b.finish();
            let bytes: usize = (0..parts).map(|i| b.entry_words(i) * 8).sum();
            // A log that could never find room in one ring (with a skip at the end).
            if bytes as u64 > ring / 2 {
                self.builders = builders;
                self.log_starts = starts;
                return Err(Abort(AbortReason::Full));
            }
            for i in 0..parts {
                starts.push((NodeId(n as u16), i as u16, 0, None));
            }
        }
        let reserved = self.reserve_logs(&builders, &mut starts).await;
        let tseq = match reserved {
            Ok(tseq) => tseq,
            Err(Frozen) => {
                self.builders = builders;
                self.log_starts = starts;
                return Err(Abort(AbortReason::Reconfigured));
            }
        };
        // From here on a crash of this node leaves the transaction to recovery: the
        // checker learns its fate from recovery's decision.
        if self.wt.records_history() {
            let record = self.record();
            self.wt.push_doubt(record);
        }
        // Execution and validation have landed every request that used scratch: logging
        // stages its entries there from the start.
        self.scratch_used = 0;
        let mut flights = std::mem::take(&mut self.log_flights);
        let mut result = Ok(());
        for (k, &(node, part, start, skip)) in starts.iter().enumerate() {
            let b = &mut builders[usize::from(node.0)];
            let len = b.entry_words(usize::from(part)) as u64 * 8;
            // The entry lies past the SKIP, if the ring wraps first.
            let position = place(start, len, ring).2 - len;
            let entry = b.stamped(usize::from(part), tseq, position);
            match self.send_entry(node, entry, start, skip, &mut flights).await {
                Ok(f) => flights.push(f),
                Err(f) => result = Err(f),
            }
            let point = ProtocolPoint::LoggedPartly;
            if k == 0
                && starts.len() > 1
                && result.is_ok()
                && self.node.cfg.crash_point.is_some()
                && self.node.cfg.crashes_at(self.co.me().node, point, self.co.now_ns())
            {
                // One entry landed, none of the others posted.
                result = self.land_logs(&mut flights).await;
                if result.is_ok() {
                    crash_point(&self.co, &self.node.cfg, point).await;
                }
            }
            if result.is_ok() && !self.node.cfg.outstanding {
                result = self.land_logs(&mut flights).await;
            }
            if result.is_err() {
                break;
            }
        }
        self.builders = builders;
        let landed = self.land_logs(&mut flights).await;
        self.log_flights = flights;
        self.log_starts = starts;
        match result.and(landed) {
            Ok(()) => Ok(Logged::Committed),
            Err(Frozen) => Ok(Logged::Frozen),
        }
    }

    /// Reserves ring room for every entry in `starts` (node, part) at once, in the order
    /// listed, waiting for credit as long as it takes, and fills in their stream
    /// positions and SKIP positions; returns the transaction's sequence number. All or
    /// nothing, with no wait in between: a coordinator's transactions then lie in every
    /// ring in the order of their sequence numbers, which recovery relies on (L5).
    /// `Frozen` (with nothing reserved) if the attempt may post no more.
    async fn reserve_logs(
        &mut self,
        builders: &[EntryBuilder],
        starts: &mut [(NodeId, u16, u64, Option<u64>)],
    ) -> Result<u64, Frozen> {
        let ring = self.node.log.ring_bytes;
        loop {
            self.hold().await?;
            // A ring a recovery resolved starts over where its backup's head is now.
            let stale =
                starts.iter().map(|s| s.0).find(|n| self.wt.rings.borrow()[usize::from(n.0)].stale);
            if let Some(node) = stale {
                self.sync_reclaim(node).await?;
                continue;
            }
            let mut short = None;
            {
                let mut rings = self.wt.rings.borrow_mut();
                for k in 0..starts.len() {
                    let (node, part, _, _) = starts[k];
                    let len = builders[usize::from(node.0)].entry_words(usize::from(part)) * 8;
                    match rings[usize::from(node.0)].reserve(len as u64, ring) {
                        Some((skip, _, start)) => {
                            starts[k].2 = start;
                            starts[k].3 = skip.map(|_| start);
                        }
                        None => {
                            // Undo this attempt's reservations, latest first.
                            for j in (0..k).rev() {
                                rings[usize::from(starts[j].0 .0)].unreserve(starts[j].2);
                            }
                            short = Some(node);
                            break;
                        }
                    }
                }
            }
            let Some(node) = short else {
                let tseq = self.wt.next_tseq.get() + 1;
                self.wt.next_tseq.set(tseq);
                return Ok(tseq);
            };
            // No credit at `node`: resolve what landed, have the backup apply what is
            // resolved and learn its head; if the room is still held by other
            // coroutines' transactions in flight, give them a step.
            force_landing(&self.co, &self.wt).await;
            let before = self.wt.rings.borrow()[usize::from(node.0)].head_known;
            self.sync_reclaim(node).await?;
            if self.wt.rings.borrow()[usize::from(node.0)].head_known == before {
                self.co.yield_now().await;
            }
        }
    }

    /// Sends one entry whose ring room is reserved at stream position `start` (with a
    /// SKIP word at stream position `skip` if the ring wraps first).
    async fn send_entry(
        &mut self,
        node: NodeId,
        entry: &[u64],
        start: u64,
        skip: Option<u64>,
        flights: &mut Vec<LogFlight>,
    ) -> Result<LogFlight, Frozen> {
        let len = entry.len() as u64 * 8;
        let ring = self.node.log.ring_bytes;
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
                    self.land_logs(flights).await?;
                    self.scratch_used = 0;
                };
                self.scratch_region.write_words(src.offset, entry);
                let (_, at, _) = place(start, len, ring);
                let body = WorkRequest::Write {
                    remote: RemoteAddr { node, rkey, offset: ring_at + at },
                    src: WriteSrc::Local { addr: src, len: len as u32 },
                };
                if let Some(pos) = skip {
                    let skip_word = skip_word(pos).to_le_bytes();
                    let skip = WorkRequest::Write {
                        remote: RemoteAddr { node, rkey, offset: ring_at + pos % ring },
                        src: WriteSrc::Bytes(&skip_word),
                    };
                    // The skip word is inline; the entry is fetched from scratch.
                    self.post(|co| co.issue_unsignaled(qp, &[skip], OpFlags::INLINE)).await?;
                }
                let t = self.post(|co| co.issue(qp, &[body])).await?;
                Ok(LogFlight { node, op: Some(t), call: None, req: Vec::new() })
            }
            Primitive::TwoSided => {
                let mut req = self.wt.take_buffer();
                wire::encode_log(start, entry, &mut req);
                match self.send_call(self.wt.ring_owner(node), wire::LOG, &req).await {
                    Ok(call) => Ok(LogFlight { node, op: None, call: Some(call), req }),
                    Err(f) => {
                        self.wt.give_buffer(req);
                        Err(f)
                    }
                }
            }
        }
    }

    /// Waits for every log entry in flight; resends two-sided ones that time out or
    /// that a backup refused while recovering. `Frozen` if a reconfiguration stopped
    /// the attempt on the way (every flight is still waited out: nothing is left in
    /// flight behind it). An entry that landed is not yet resolved for its backup:
    /// that waits for the write-back (L7).
    async fn land_logs(&mut self, flights: &mut Vec<LogFlight>) -> Result<(), Frozen> {
        let mut result = Ok(());
        for mut f in flights.drain(..) {
            if let Some(t) = f.op.take() {
                if self.co.wait(t).await.is_err() {
                    // The backup is gone, or fenced this node off: this configuration
                    // cannot log any more.
                    result = Err(Frozen);
                }
            }
            while let Some(t) = f.call.take() {
                match self.co.reply(t, wire::decode_word).await {
                    Ok(Some(REFUSED)) | Err(RpcError::TimedOut) if result.is_ok() => {
                        // Refused while the backup recovers, or lost: sent again when
                        // the attempt may post (never, if it is frozen by then).
                        self.pause().await;
                        let dest = self.wt.ring_owner(f.node);
                        match self.send_call(dest, wire::LOG, &f.req).await {
                            Ok(c) => f.call = Some(c),
                            Err(fz) => result = Err(fz),
                        }
                    }
                    Ok(Some(REFUSED)) | Err(_) => result = Err(Frozen),
                    Ok(Some(MALFORMED)) => {
                        panic!("{} could not place a log entry this coordinator built", f.node)
                    }
                    Ok(Some(head)) => {
                        self.wt.rings.borrow_mut()[usize::from(f.node.0)].learn_head(head)
                    }
                    Ok(None) => panic!("malformed LOG reply from {}", f.node),
                }
            }
            self.wt.give_buffer(std::mem::take(&mut f.req));
        }
        if result.is_err() {
            self.wait_frozen().await;
        }
        result
    }

    /// Sleeps a recovery poll interval.
    async fn pause(&self) {
        let poll = self.node.recovery.poll_ns();
        self.co.sleep_until(self.co.now_ns() + poll).await;
    }

    /// Waits until the attempt is frozen or the node's run is over: a request of it
    /// failed in a way only a reconfiguration resolves (its target died).
    async fn wait_frozen(&self) {
        while !self.frozen() && !self.node.recovery.ended() {
            self.pause().await;
        }
    }

    /// Calls `dest` until a reply comes that is not a refusal, for requests that must
    /// get through (unlocks, synchronous reclaims). `Frozen` once the attempt may send
    /// no more.
    async fn call_through(&self, dest: WorkerId, ty: RpcType, req: &[u8]) -> Result<u64, Frozen> {
        loop {
            let t = self.send_call(dest, ty, req).await?;
            match self.co.reply(t, wire::decode_word).await {
                Ok(Some(REFUSED)) => self.pause().await,
                Ok(Some(v)) => return Ok(v),
                Ok(None) => panic!("malformed reply from {dest}"),
                Err(RpcError::TimedOut) => {}
                Err(_) => {
                    self.wait_frozen().await;
                    return Err(Frozen);
                }
            }
        }
    }

    /// Waits for the reply to a two-sided write-back, sending it again after every
    /// timeout or refusal (its handler is idempotent), then recycles its buffer.
    async fn settle(&mut self, mut req: PendingAck) -> Result<(), Frozen> {
        let result = loop {
            let t = match req.call.take() {
                Some(t) => t,
                None => match self.send_call(req.dest, req.ty, &req.bytes).await {
                    Ok(t) => t,
                    Err(f) => break Err(f),
                },
            };
            match self.co.reply(t, wire::decode_word).await {
                Ok(Some(REFUSED)) => self.pause().await,
                Ok(_) => break Ok(()),
                Err(RpcError::TimedOut) => {}
                Err(_) => {
                    self.wait_frozen().await;
                    break Err(Frozen);
                }
            }
        };
        self.wt.give_buffer(req.bytes);
        result
    }

    /// Has the backup apply everything resolved in our ring and learns its head; for a
    /// ring a recovery resolved, learns where it starts over.
    async fn sync_reclaim(&mut self, node: NodeId) -> Result<(), Frozen> {
        let (stale, stale_epoch, up_to) = {
            let rings = self.wt.rings.borrow();
            let r = &rings[usize::from(node.0)];
            (r.stale, r.stale_epoch, if r.stale { 0 } else { r.committed_to() })
        };
        wire::encode_reclaim(SYNC, self.epoch(), up_to, &mut self.req);
        let req = std::mem::take(&mut self.req);
        let head = self.call_through(self.wt.ring_owner(node), wire::RECLAIM, &req).await;
        self.req = req;
        let head = head?;
        let mut rings = self.wt.rings.borrow_mut();
        let r = &mut rings[usize::from(node.0)];
        if stale {
            // Another coroutine may have started the ring over meanwhile (and reserved in
            // it): only the first to learn the head does. A later recovery may have made
            // it stale again while the answer was on its way: that head is from before it.
            r.resync_if(head, stale_epoch);
        } else {
            r.learn_head(head);
            r.reclaim_sent = r.reclaim_sent.max(up_to);
        }
        Ok(())
    }

    /// Tells backups lazily (one-way, passive) how far our logs are resolved.
    fn reclaim_lazily(&mut self) {
        resolve_landed(&self.co, &self.wt);
        if !self.node.recovery.open(self.co.step_time_ns()) {
            return;
        }
        let threshold = self.node.cfg.reclaim_after_bytes;
        let nodes = self.co.shape().nodes;
        let epoch = self.node.membership.epoch() as u32;
        for n in 0..nodes {
            let up_to = {
                let rings = self.wt.rings.borrow();
                let r = &rings[usize::from(n)];
                let up_to = r.committed_to();
                if r.stale || up_to - r.reclaim_sent < threshold {
                    continue;
                }
                up_to
            };
            wire::encode_reclaim(0, epoch, up_to, &mut self.req);
            // A lost reclaim is harmless: the next one covers it, and the final flush is
            // reliable.
            if self.co.send_oneway(self.wt.ring_owner(NodeId(n)), wire::RECLAIM, &self.req).is_ok()
            {
                self.wt.rings.borrow_mut()[usize::from(n)].reclaim_sent = up_to;
            }
        }
    }

    /// Resolves the attempt's log entries for their backups to apply (L7): at once if
    /// its write-backs all landed; with passive ACK once their connections and
    /// acknowledgements say so (see [`resolve_landed`]). Not for a frozen attempt: its
    /// rings were resolved by recovery.
    fn resolve_logs(&mut self) {
        if self.node.cfg.replication <= 1 || self.frozen() || self.log_starts.is_empty() {
            return;
        }
        let pa = self.node.cfg.passive_ack;
        if !pa || (self.landing.is_empty() && self.acks_mark.is_none()) {
            let mut rings = self.wt.rings.borrow_mut();
            for &(node, _, start, _) in &self.log_starts {
                rings[usize::from(node.0)].acknowledged(start);
            }
            return;
        }
        let mut u = self.wt.spare_unresolved();
        u.starts.extend(self.log_starts.iter().map(|&(node, _, start, _)| (node, start)));
        u.marks.extend(self.landing.iter().map(|&qp| (qp, self.co.qp_mark(qp))));
        u.acks = self.acks_mark.unwrap_or(0);
        self.wt.unresolved.borrow_mut().push_back(u);
    }

    /// Writes back every write and unlocks it. `Frozen`: a reconfiguration stopped it
    /// part-way (recovery finishes it from the logs).
    #[allow(
        clippy::too_many_lines,
        reason = "longer than the limit before the limit was set; split it when it next changes"
    )]
    async fn write_back(&mut self) -> Result<(), Frozen> {
        let pa = self.node.cfg.passive_ack;
        self.landing.clear();
        self.acks_mark = None;
        // The staging area of the previous commit is reused: its WRITEs must be done. One
        // that failed went to a node that died: its backups hold that transaction's log.
        for t in std::mem::take(&mut self.staged) {
            let _ = self.co.wait(t).await;
        }
        let mut staging_used = 0;
        // Tickets of this commit's one-sided write-backs.
        let mut waits = std::mem::take(&mut self.waits);
        let mut calls = Vec::new();
        let mut result = Ok(());
        let mut wrote_one = false;
        for i in 0..self.acc.len() {
            let a = self.acc[i];
            if !a.write {
                continue;
            }
            if std::mem::replace(&mut wrote_one, true) {
                // The records before this one are written back and unlocked (their
                // requests and calls handed to the fabric by `crash_point`), the others
                // not.
                crash_point(&self.co, &self.node.cfg, ProtocolPoint::WrittenBackPartly).await;
            }
            if let Err(f) = self.hold().await {
                result = Err(f);
                break;
            }
            let local = a.node == self.co.me().node;
            // A local record whose lock only the NIC may release is unlocked through it.
            let nic_unlock = matches!(a.locked, Locked::Nic) && !self.wt.coherent;
            self.co.charge_term(self.node.cfg.commit_term(local && !nic_unlock), 1);
            let version = self.new_version(i);
            let payload_range = a.at as usize..a.at as usize + usize::from(a.len);
            if local {
                let node = self.node.clone();
                let replica = node.store.replica(a.table, a.partition);
                let off = a.off.expect("a local record is locked at its offset");
                let early = self.node.cfg.planted(PlantedFault::UnlockBeforeWriteBack);
                if !early {
                    replica.write_back(off, version, a.key, &self.payload[payload_range.clone()]);
                }
                match a.locked {
                    Locked::Nic if !self.wt.coherent => {
                        // Frozen: the lock is of an epoch that is over (L6).
                        let _ = self.unlock_by_nic(i).await;
                    }
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
                    match self.write_back_one_sided(i, version, &mut staging_used, &mut waits).await
                    {
                        Ok(t) => waits.extend(t),
                        Err(f) => {
                            result = Err(f);
                            break;
                        }
                    }
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
                    // with no call slot or credit free it is sent when it is settled.
                    let call = self.co.call(dest, wire::COMMIT, &bytes).ok();
                    let epoch = self.config.epoch;
                    let req = PendingAck { dest, ty: wire::COMMIT, bytes, call, epoch };
                    if pa {
                        self.acks_mark = Some(self.wt.push_ack(req));
                    } else if self.node.cfg.outstanding {
                        calls.push(req);
                    } else if let Err(f) = self.settle(req).await {
                        result = Err(f);
                        break;
                    }
                }
            }
        }
        self.co.ring_doorbells();
        if pa {
            // Passive ACK: the next commit collects them before it reuses the staging.
            self.staged.append(&mut waits);
        }
        let landed = self.wait_write_backs(&mut waits).await;
        self.waits = waits;
        for req in calls {
            let settled = self.settle(req).await;
            result = result.and(settled);
        }
        result.and(landed)
    }

    /// Waits for write-back tickets (their WRITEs read the staging area). `Frozen` if one
    /// failed: its target died, and only recovery can finish the write-back.
    async fn wait_write_backs(&self, tickets: &mut Vec<OpTicket>) -> Result<(), Frozen> {
        let mut failed = false;
        for t in tickets.drain(..) {
            failed |= self.co.wait(t).await.is_err();
        }
        if failed {
            self.wait_frozen().await;
            return Err(Frozen);
        }
        Ok(())
    }

    /// Posts the WRITE of a record's new version and payload and the WRITE that unlocks
    /// it, in one doorbell on one connection (FIFO: the unlock lands last). Small records
    /// go inline; with passive ACK they are not even signaled. Returns the ticket to
    /// collect, if any.
    async fn write_back_one_sided(
        &mut self,
        i: usize,
        version: u64,
        staging_used: &mut u64,
        issued: &mut Vec<OpTicket>,
    ) -> Result<Option<OpTicket>, Frozen> {
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
        if !self.landing.contains(&qp) {
            self.landing.push(qp);
        }
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
                self.post(|co| co.issue_unsignaled_deferred(qp, &wrs, OpFlags::INLINE)).await?;
                return Ok(None);
            }
            return Ok(Some(self.post(|co| co.issue_with(qp, &wrs, OpFlags::INLINE)).await?));
        }
        // Staged: the payload, then a zero word for the unlock, in registered memory that
        // stays untouched until the WRITEs complete (M5). A write set larger than the
        // staging area waits for the write-backs already issued, then reuses it.
        let (base, room) = self.staging();
        let need = body_bytes as u64 + 8;
        assert!(need <= room, "one record of {body_bytes} bytes exceeds the staging area");
        if *staging_used + need > room {
            self.wait_write_backs(issued).await?;
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
        Ok(Some(self.post(|co| co.issue(qp, &wrs)).await?))
    }

    /// An attempt frozen while logging: waits for recovery's decision on it. Committed:
    /// recovery wrote it back. Aborted: nothing of it is visible, and its locks belong to
    /// an epoch that is over (L6). `Unknown` if this node left the cluster first.
    async fn recovered(&mut self) -> Outcome {
        let rec = self.node.recovery.clone();
        let (owner, epoch) = (self.owner.0, self.config.epoch);
        loop {
            match rec.verdict(owner, epoch) {
                Some(true) => {
                    let now = self.co.now_ns();
                    self.phase_ns[Phase::Logging] = now
                        - self.attempt_start
                        - self.phase_ns[Phase::Execution]
                        - self.phase_ns[Phase::Validation];
                    self.phase_ns[Phase::Commit] = 0;
                    self.committed(now);
                    return Outcome::Committed;
                }
                Some(false) => {
                    self.wt.take_doubt(owner);
                    return self.aborted(AbortReason::Reconfigured).await;
                }
                None if rec.ended() => {
                    // Its record stays in doubt: the run's end learns its fate from the
                    // nodes that decided it.
                    for a in self.acc.iter_mut() {
                        a.locked = Locked::No;
                    }
                    return Outcome::Unknown;
                }
                None => self.pause().await,
            }
        }
    }

    /// Releases every lock the attempt holds (or may hold), counts the abort. A frozen
    /// attempt releases nothing: it may post no more, and its locks are of an epoch that
    /// is over (L6).
    pub(crate) async fn aborted(&mut self, reason: AbortReason) -> Outcome {
        let mut frozen = false;
        for i in 0..self.acc.len() {
            let a = self.acc[i];
            // Looked at again for every record: a release of a remote lock waits for its
            // reply, and a newer configuration may be installed meanwhile.
            frozen |= self.frozen() || self.node.recovery.ended();
            if frozen {
                self.acc[i].locked = Locked::No;
                continue;
            }
            match a.locked {
                Locked::No => {}
                // Only this attempt's own lock: never one a later epoch took over (L6).
                Locked::Cpu => {
                    self.replica(&a).unlock_if(a.off.expect("locked at an offset"), self.owner);
                }
                Locked::Nic if a.node == self.co.me().node && self.wt.coherent => {
                    self.replica(&a).unlock_if(a.off.expect("offset"), self.owner);
                }
                Locked::Nic => frozen = self.unlock_by_nic(i).await.is_err(),
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
                    let dest = self.peer(a.node);
                    frozen = self.call_through(dest, wire::UNLOCK, &req).await.is_err();
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
    async fn unlock_by_nic(&mut self, i: usize) -> Result<(), Frozen> {
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
        self.post(|co| co.issue_unsignaled_deferred(qp, &[wr], OpFlags::INLINE)).await
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
            s.phase_ns.add(self.phase_ns);
        }
        if self.wt.records_history() {
            let record = match self.wt.take_doubt(self.owner.0) {
                Some(r) => {
                    // Its `D` line holds the record: name it (half the journal's bytes).
                    self.wt.journal(b'C', |line| {
                        use std::io::Write;
                        write!(line, "{}", r.id).expect("a Vec takes every write");
                    });
                    r
                }
                None => {
                    let r = self.record();
                    self.wt.journal(b'H', |line| {
                        serde_json::to_writer(line, &r).expect("records serialize");
                    });
                    r
                }
            };
            if let Some(h) = self.wt.history.borrow_mut().as_mut() {
                h.push(record);
            }
        }
    }

    /// The attempt as the checker sees it: what it read, and what it writes.
    fn record(&self) -> TxnRecord {
        let key = |a: &crate::txn::Access| HKey { table: a.table.0, key: a.key };
        // Sized exactly: a run with `--check` keeps every record until its end, and a
        // collected iterator that filters starts at four entries (SmallBank's records
        // hold one to three) and grows by reallocation, so about half of what the heap
        // grew by, a page fault per 4 KiB, held nothing.
        let mut reads =
            Vec::with_capacity(self.acc.iter().filter(|a| a.read_version.is_some()).count());
        reads.extend(self.acc.iter().filter_map(|a| {
            a.read_version.map(|v| HAccess {
                key: key(a),
                version: layout::version_number(v),
                digest: a.read_digest,
            })
        }));
        let mut writes = Vec::with_capacity(self.acc.iter().filter(|a| a.write).count());
        writes.extend((0..self.acc.len()).filter(|&i| self.acc[i].write).map(|i| {
            let (a, version) = (&self.acc[i], self.new_version(i));
            let payload = &self.payload[a.at as usize..][..usize::from(a.len)];
            let digest = match layout::is_present(version) {
                true => checksum(version, a.key, payload),
                false => 0,
            };
            HAccess { key: key(a), version: layout::version_number(version), digest }
        }));
        TxnRecord { id: self.owner.0, reads, writes }
    }
}

/// A log entry in flight.
pub(crate) struct LogFlight {
    node: NodeId,
    op: Option<OpTicket>,
    call: Option<CallTicket>,
    /// The LOG request, to resend on a timeout.
    req: Vec<u8>,
}

/// Resolves the log entries of passive-ACK commits whose write-backs landed: every
/// connection they used retired its requests up to the commit's mark (R3), and the
/// background task collected every acknowledgement up to its mark.
pub(crate) fn resolve_landed<E: Endpoint>(co: &Co<E>, wt: &WorkerTxn) {
    let mut unresolved = wt.unresolved.borrow_mut();
    if unresolved.is_empty() {
        return;
    }
    let acks_done = wt.acks_done.get();
    let mut rings = wt.rings.borrow_mut();
    let mut k = 0;
    while k < unresolved.len() {
        let u = &unresolved[k];
        let landed = u.acks <= acks_done && u.marks.iter().all(|&(qp, m)| co.qp_landed(qp, m));
        if !landed {
            k += 1;
            continue;
        }
        for &(node, start) in &u.starts {
            rings[usize::from(node.0)].acknowledged(start);
        }
        let u = unresolved.remove(k).expect("in range");
        wt.give_unresolved(u);
    }
}

/// Makes every connection an unresolved commit used retire what it carries: a signaled
/// READ behind the unsignaled write-backs (FIFO, R1), whose completion retires them.
async fn force_landing<E: Endpoint>(co: &Co<E>, wt: &WorkerTxn) {
    let mut qps: Vec<(Qp, u64)> = Vec::new();
    for u in wt.unresolved.borrow().iter() {
        for &(qp, m) in &u.marks {
            if !co.qp_landed(qp, m) && !qps.iter().any(|&(q, _)| q == qp) {
                qps.push((qp, m));
            }
        }
    }
    if qps.is_empty() {
        resolve_landed(co, wt);
        return;
    }
    // A failed READ retires nothing (R3): the entries stay unresolved until the recovery
    // that the failure brings (the target died, or suspicion removes one side) decides
    // them.
    crate::recover::land_connections(co, &wt.node, qps.into_iter().map(|(qp, _)| qp).collect())
        .await;
    resolve_landed(co, wt);
}

/// The worker's background task: collects passive acknowledgements of two-sided commits
/// (resending on timeouts and refusals) and, once every transaction coroutine has ended,
/// has every backup apply this worker's logs (a reliable final reclaim).
pub(crate) async fn background<E: Endpoint>(co: Co<E>, wt: Rc<WorkerTxn>) {
    let rec = wt.node.recovery.clone();
    let poll = rec.poll_ns();
    loop {
        loop {
            if rec.ended() {
                wt.node.recovery.flushed();
                return;
            }
            let epoch = wt.node.membership.epoch();
            // The borrow ends inside the block: nothing is held across an await.
            let next = {
                let mut acks = wt.acks.borrow_mut();
                let Some(ack) = acks.front_mut() else { break };
                if ack.epoch != epoch {
                    // Of a configuration that is over: recovery wrote it back.
                    Err(acks.pop_front().expect("the front"))
                } else {
                    Ok(match ack.call.take() {
                        Some(t) => Some(t),
                        None if rec.open(co.step_time_ns()) => {
                            co.call(ack.dest, ack.ty, &ack.bytes).ok()
                        }
                        None => None,
                    })
                }
            };
            let next = match next {
                Ok(next) => next,
                Err(over) => {
                    // A call still in flight is collected all the same (its answer, or its
                    // timeout if the target died), so that no call outlives the run (R5).
                    if let Some(t) = over.call {
                        let _ = co.reply(t, |_| ()).await;
                    }
                    wt.ack_done(over.bytes);
                    continue;
                }
            };
            let Some(t) = next else {
                // No call slot free right now, or recovery in progress: try again later.
                co.sleep_until(co.now_ns() + poll / 16).await;
                continue;
            };
            match co.reply(t, wire::decode_word).await {
                Ok(Some(REFUSED)) => co.sleep_until(co.now_ns() + poll).await,
                Ok(_) => {
                    let done = wt.acks.borrow_mut().pop_front().expect("the acknowledged request");
                    wt.ack_done(done.bytes);
                }
                Err(RpcError::TimedOut) => {} // resend on the next round
                // Its target died: a reconfiguration drops it.
                Err(_) => co.sleep_until(co.now_ns() + poll).await,
            }
        }
        resolve_landed(&co, &wt);
        if wt.active.get() == 0 {
            let orphans = std::mem::take(&mut *wt.orphans.borrow_mut());
            for t in orphans {
                // One that failed went to a node that died (see `write_back`).
                let _ = co.wait(t).await;
            }
            flush_logs(&co, &wt).await;
            wt.node.recovery.flushed();
            return;
        }
        Park { wt: &wt, parked: false }.await;
    }
}

/// Has every member's backup apply everything of this worker's logs, once its
/// transactions ended. Gives up if the node's run ends first.
async fn flush_logs<E: Endpoint>(co: &Co<E>, wt: &Rc<WorkerTxn>) {
    let rec = wt.node.recovery.clone();
    let poll = rec.poll_ns();
    let nodes = co.shape().nodes;
    let mut req = Vec::new();
    let mut n = 0;
    while n < nodes {
        if rec.ended() {
            return;
        }
        let cfg = wt.node.membership.current();
        if !cfg.is_member(NodeId(n)) {
            n += 1;
            continue;
        }
        if !rec.open(co.step_time_ns()) {
            co.sleep_until(co.now_ns() + poll).await;
            continue;
        }
        force_landing(co, wt).await;
        let (stale, stale_epoch, tail, up_to, head) = {
            let rings = wt.rings.borrow();
            let r = &rings[usize::from(n)];
            (r.stale, r.stale_epoch, r.tail, r.committed_to(), r.head_known)
        };
        if !stale {
            if tail != up_to {
                // A write-back whose connection failed never landed: only the recovery
                // that follows (the failed peer, or this node, is removed) decides its
                // entries, and marks the ring stale.
                co.sleep_until(co.now_ns() + poll).await;
                continue;
            }
            if tail == 0 || head >= tail {
                n += 1;
                continue;
            }
        }
        let up_to = if stale { 0 } else { up_to };
        wire::encode_reclaim(SYNC, cfg.epoch as u32, up_to, &mut req);
        let t = match co.call(wt.ring_owner(NodeId(n)), wire::RECLAIM, &req) {
            Ok(t) => t,
            Err(_) => {
                co.yield_now().await;
                continue;
            }
        };
        match co.reply(t, wire::decode_word).await {
            Ok(Some(REFUSED)) => co.sleep_until(co.now_ns() + poll).await,
            Ok(Some(head)) => {
                let mut rings = wt.rings.borrow_mut();
                let r = &mut rings[usize::from(n)];
                if r.stale != stale || r.stale_epoch != stale_epoch {
                    continue; // a recovery came in between: once more
                }
                if stale {
                    r.resync(head);
                } else {
                    assert_eq!(head, up_to, "the backup applied everything");
                    r.learn_head(head);
                    n += 1;
                }
            }
            Ok(None) => panic!("malformed RECLAIM reply from n{n}"),
            Err(RpcError::TimedOut) => {}
            // A dead backup: the next configuration leaves it out.
            Err(_) => co.sleep_until(co.now_ns() + poll).await,
        }
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
