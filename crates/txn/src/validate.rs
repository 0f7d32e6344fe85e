//! The validation phase: lock the write set, then check that the read set is unchanged.
//!
//! Locks are taken by the configured strategy: a NIC CAS with a READ of the version
//! behind it in the same doorbell on the same connection (so one round trip; the CAS's
//! old value lands in scratch), or an RPC whose handler uses a CPU CAS. Local records are
//! locked by the CPU unless the design locks with the NIC on a fabric whose atomics are
//! not coherent with the CPU's; then they go through the NIC too, by loopback (M6).
//! Read-set validation starts only once every lock is held.

use hytra_fabric::{Endpoint, LocalAddr, RemoteAddr, WorkRequest};
use hytra_rt::{CallTicket, OpTicket, RpcError};
use hytra_store::layout::{self, LOCK_WORD};
use hytra_store::Owner;

use crate::config::{PlantedFault, Primitive};
use crate::outcome::{Abort, AbortReason};

/// Times a lock CAS that found a lock of an earlier epoch swaps it out before giving up.
const STALE_TAKEOVERS_MAX: usize = 3;
use crate::txn::{op_error_abort, rpc_abort, Frozen, Locked, TxnCtx, RPC_RESENDS_MAX};
use crate::wire::{self, RecordReply, RecordReq, Status, CREATE, NO_LOCK};

/// A lock or validation request in flight.
pub(crate) enum Flight {
    /// CAS (old value at `buf`) then READ of lock and version (at `buf + 8`), of the
    /// lock word at `remote`, expecting `compare` there (0, or a stale lock: L6).
    Cas { ticket: OpTicket, buf: u64, remote: RemoteAddr, compare: u64 },
    /// READ of lock and version at `buf`.
    Read(OpTicket, u64),
    /// LOCK or VALIDATE RPC.
    Call(CallTicket),
}

impl<E: Endpoint> TxnCtx<E> {
    /// Locks every record of the write set; checks read-for-update records unchanged.
    pub(crate) async fn lock_writes(&mut self) -> Result<(), Abort> {
        // Execution's reads all landed: its scratch is free.
        self.scratch_used = 0;
        let mut flights = std::mem::take(&mut self.flights);
        let mut result = Ok(());
        for i in 0..self.acc.len() {
            let a = self.acc[i];
            if !a.write || matches!(a.locked, Locked::Cpu | Locked::Nic | Locked::Rpc) {
                continue;
            }
            let started = match self.start_lock(i).await {
                Err(Abort(AbortReason::Full)) if self.scratch_used > 0 => {
                    // Perhaps only the scratch is full: land what is in flight (its
                    // scratch is then free; with one request out at a time all of it
                    // landed already) and try again.
                    result = self.land(&mut flights, true).await;
                    if result.is_err() {
                        break;
                    }
                    self.scratch_used = 0;
                    self.start_lock(i).await
                }
                started => started,
            };
            match started {
                Ok(Some(f)) => flights.push((i, f)),
                Ok(None) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            if flights.len() >= self.in_flight_max() {
                result = result.and(self.land(&mut flights, true).await);
                if result.is_err() {
                    break;
                }
            }
        }
        let landed = self.land(&mut flights, true).await;
        self.flights = flights;
        result.and(landed)
    }

    /// Checks that every record read but not written is unlocked and unchanged.
    pub(crate) async fn validate_reads(&mut self) -> Result<(), Abort> {
        if self.node.cfg.planted(PlantedFault::SkipReadValidation) {
            return Ok(());
        }
        let mut flights = std::mem::take(&mut self.flights);
        let mut result = Ok(());
        for i in 0..self.acc.len() {
            let a = self.acc[i];
            if a.write {
                continue;
            }
            let started = match self.start_validate(i).await {
                Err(Abort(AbortReason::Full)) if self.scratch_used > 0 => {
                    // The scratch is full: land what is in flight (its scratch is then
                    // free; with one request out at a time all of it landed already)
                    // and try again.
                    result = self.land(&mut flights, false).await;
                    if result.is_err() {
                        break;
                    }
                    self.scratch_used = 0;
                    self.start_validate(i).await
                }
                started => started,
            };
            match started {
                Ok(Some(f)) => flights.push((i, f)),
                Ok(None) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            if flights.len() >= self.in_flight_max() {
                result = result.and(self.land(&mut flights, false).await);
                if result.is_err() {
                    break;
                }
            }
        }
        let landed = self.land(&mut flights, false).await;
        self.flights = flights;
        result.and(landed)
    }

    async fn start_lock(&mut self, i: usize) -> Result<Option<Flight>, Abort> {
        let a = self.acc[i];
        let local = a.node == self.co.me().node;
        let nic = self.node.cfg.nic_locks() && !(local && self.wt.coherent);
        // A local lock the CPU's atomics cannot take goes through the NIC, as a remote one.
        self.co.charge_term(self.node.cfg.lock_term(local && !nic), 1);
        if local && !nic {
            self.hold().await?;
            let node = self.node.clone();
            let replica = node.store.replica(a.table, a.partition);
            // A write whose record was never inserted (an insert, or a key read as
            // absent) locks a record created absent, as the remote paths do.
            let off = match a.off {
                Some(off) => Ok(off),
                None => self.node.insert_primary(a.table, a.key),
            };
            let Ok(off) = off else { return Err(Abort(AbortReason::Full)) };
            self.acc[i].off = Some(off);
            if !(a.insert && self.node.cfg.planted(PlantedFault::SkipInsertLock)) {
                self.lock_cpu(replica, off)?;
            }
            let version = replica.header(off).version;
            self.acc[i].locked = Locked::Cpu;
            self.check_locked_version(i, version)?;
            return Ok(None);
        }
        if !nic {
            let t = self.send_rpc(i, true).await?;
            self.acc[i].locked = Locked::Unknown;
            return Ok(Some(Flight::Call(t)));
        }
        if a.off.is_none() {
            self.acc[i].off = Some(self.create_for_nic_lock(i).await?);
        }
        let off = self.acc[i].off.expect("resolved above");
        let cas_buf = self.scratch(24)?;
        let remote = RemoteAddr { node: a.node, rkey: self.rkey(&a), offset: off + LOCK_WORD * 8 };
        // The planted fault "locks" an insert with a CAS that changes nothing.
        let swap = match a.insert && self.node.cfg.planted(PlantedFault::SkipInsertLock) {
            true => 0,
            false => self.owner.0,
        };
        let wrs = [
            WorkRequest::Cas { remote, local: cas_buf, compare: 0, swap },
            WorkRequest::Read {
                remote,
                local: LocalAddr { offset: cas_buf.offset + 8, ..cas_buf },
                len: 16,
            },
        ];
        let qp = self.qp(a.node);
        // The locks of several records on one node share a doorbell; `land` rings it.
        let ticket = self.post(|co| co.issue_deferred(qp, &wrs)).await?;
        Ok(Some(Flight::Cas { ticket, buf: cas_buf.offset, remote, compare: 0 }))
    }

    /// The offset of a record to lock by NIC that the execution phase did not learn
    /// (an insert, or a read that found it absent): created by the primary's CPU.
    async fn create_for_nic_lock(&mut self, i: usize) -> Result<u64, Abort> {
        let a = self.acc[i];
        if a.node == self.co.me().node {
            self.hold().await?;
            return self.node.insert_primary(a.table, a.key).map_err(|_| Abort(AbortReason::Full));
        }
        let epoch = self.epoch();
        RecordReq { table: a.table.0, flags: CREATE | NO_LOCK, epoch, key: a.key, owner: 0 }
            .encode(&mut self.req);
        let t = self.send_call(self.peer(a.node), wire::LOCK, &self.req).await?;
        let mut tmp = std::mem::take(&mut self.tmp);
        let reply = self.co.reply(t, |r| RecordReply::decode(r, &mut tmp)).await;
        self.tmp = tmp;
        let reply = reply.map_err(rpc_abort)?.expect("a well-formed LOCK reply");
        match reply.status {
            Status::Ok => Ok(reply.offset),
            Status::Full => Err(Abort(AbortReason::Full)),
            Status::Stale => Err(Abort(AbortReason::Reconfigured)),
            s => panic!("create-only LOCK answered {s:?}"),
        }
    }

    async fn start_validate(&mut self, i: usize) -> Result<Option<Flight>, Abort> {
        let a = self.acc[i];
        let read = a.read_version.expect("a read record has a read version");
        let local = a.node == self.co.me().node;
        self.co.charge_term(self.node.cfg.validate_term(local), 1);
        if local {
            self.hold().await?;
            let replica = self.replica(&a);
            let (lock, version) = match a.off.or_else(|| replica.lookup(a.key)) {
                Some(off) => {
                    let h = replica.header(off);
                    (h.lock, h.version)
                }
                None => (0, layout::ABSENT),
            };
            return self.check_unchanged(lock, version, read).map(|()| None);
        }
        match (self.node.cfg.validate, a.off) {
            (Primitive::OneSided, Some(off)) => {
                let buf = self.scratch(16)?;
                let remote =
                    RemoteAddr { node: a.node, rkey: self.rkey(&a), offset: off + LOCK_WORD * 8 };
                let qp = self.qp(a.node);
                let wr = WorkRequest::Read { remote, local: buf, len: 16 };
                let t = self.post(|co| co.issue_deferred(qp, &[wr])).await?;
                Ok(Some(Flight::Read(t, buf.offset)))
            }
            // Two-sided validation, and reads that found the key absent (one-sided
            // verbs cannot check that a key is still absent in one READ).
            _ => Ok(Some(Flight::Call(self.send_rpc(i, false).await?))),
        }
    }

    /// Waits for every flight; `locking` says whether they are lock requests. Returns the
    /// first failure once all have landed (so that every lock's state is known).
    async fn land(
        &mut self,
        flights: &mut Vec<(usize, Flight)>,
        locking: bool,
    ) -> Result<(), Abort> {
        let mut result = Ok(());
        self.co.ring_doorbells();
        for (i, f) in flights.drain(..) {
            let r = self.land_one(i, f, locking).await;
            result = result.and(r);
        }
        result
    }

    async fn land_one(&mut self, i: usize, f: Flight, locking: bool) -> Result<(), Abort> {
        match f {
            Flight::Cas { mut ticket, buf, remote, mut compare } => {
                // A lock left from an earlier epoch is free (L6): swap it out, a bounded
                // number of times (only recovery, which runs no transactions, leaves one).
                for _ in 0..STALE_TAKEOVERS_MAX {
                    self.co.wait(ticket).await.map_err(op_error_abort)?;
                    let old = self.scratch_region.load(buf);
                    if old == compare {
                        self.acc[i].locked = Locked::Nic;
                        let version = self.scratch_region.load(buf + 16);
                        return self.check_locked_version(i, version);
                    }
                    if Owner(old).holds_in(self.owner) {
                        return Err(self.blocked(AbortReason::Conflict, old));
                    }
                    if self.frozen() {
                        return Err(Abort(AbortReason::Conflict));
                    }
                    compare = old;
                    let local = LocalAddr { rkey: self.scratch.rkey, offset: buf };
                    let wrs = [
                        WorkRequest::Cas { remote, local, compare, swap: self.owner.0 },
                        WorkRequest::Read {
                            remote,
                            local: LocalAddr { offset: buf + 8, ..local },
                            len: 16,
                        },
                    ];
                    let qp = self.qp(remote.node);
                    ticket = self.post(|co| co.issue(qp, &wrs)).await?;
                }
                self.co.wait(ticket).await.map_err(op_error_abort)?;
                Err(Abort(AbortReason::Conflict))
            }
            Flight::Read(t, buf) => {
                self.co.wait(t).await.map_err(op_error_abort)?;
                let (lock, version) =
                    (self.scratch_region.load(buf), self.scratch_region.load(buf + 8));
                self.check_unchanged(lock, version, self.acc[i].read_version.expect("read"))
            }
            Flight::Call(mut t) => {
                let mut tmp = std::mem::take(&mut self.tmp);
                let reply = loop {
                    let reply = self.co.reply(t, |r| RecordReply::decode(r, &mut tmp)).await;
                    match reply {
                        // LOCK and VALIDATE are idempotent for one attempt (its owner
                        // locks again harmlessly): a lost datagram costs a resend, not
                        // the transaction. An unanswered LOCK stays `Unknown`.
                        Err(RpcError::TimedOut) if self.acc[i].resends < RPC_RESENDS_MAX => {
                            self.acc[i].resends += 1;
                            self.wt.stats.borrow_mut().rpc_resends += 1;
                            t = self.send_rpc(i, locking).await?;
                        }
                        reply => break reply,
                    }
                };
                self.tmp = tmp;
                let reply = reply.map_err(rpc_abort)?.expect("a well-formed reply");
                if locking {
                    self.on_lock_reply(i, &reply)
                } else {
                    let read = self.acc[i].read_version.expect("read");
                    match reply.status {
                        Status::Ok | Status::Absent => {
                            self.check_unchanged(reply.lock, reply.version, read)
                        }
                        Status::Stale => Err(Abort(AbortReason::Reconfigured)),
                        s => panic!("VALIDATE answered {s:?}"),
                    }
                }
            }
        }
    }

    /// Sends access `i`'s LOCK (`locking`) or VALIDATE call. LOCK creates the record if
    /// it does not exist: a key read as absent is locked as an absent record.
    async fn send_rpc(&mut self, i: usize, locking: bool) -> Result<CallTicket, Frozen> {
        let a = self.acc[i];
        let (ty, flags, owner) = match locking {
            true => {
                let skip = a.insert && self.node.cfg.planted(PlantedFault::SkipInsertLock);
                (wire::LOCK, if skip { CREATE | NO_LOCK } else { CREATE }, self.owner.0)
            }
            false => (wire::VALIDATE, 0, 0),
        };
        RecordReq { table: a.table.0, flags, epoch: self.epoch(), key: a.key, owner }
            .encode(&mut self.req);
        self.send_call(self.peer(a.node), ty, &self.req).await
    }

    fn on_lock_reply(&mut self, i: usize, reply: &RecordReply) -> Result<(), Abort> {
        match reply.status {
            Status::Ok => {
                let a = &mut self.acc[i];
                (a.locked, a.off) = (Locked::Rpc, Some(reply.offset));
                self.check_locked_version(i, reply.version)
            }
            Status::Locked => {
                self.acc[i].locked = Locked::No;
                Err(self.blocked(AbortReason::Conflict, reply.lock))
            }
            Status::Absent => {
                self.acc[i].locked = Locked::No;
                Err(Abort(AbortReason::Validation))
            }
            Status::Full => {
                self.acc[i].locked = Locked::No;
                Err(Abort(AbortReason::Full))
            }
            Status::Stale => {
                // This request was refused before it locked anything, but a send of it
                // that timed out earlier may have locked the record: the abort must
                // then release it.
                if self.acc[i].resends == 0 {
                    self.acc[i].locked = Locked::No;
                }
                Err(Abort(AbortReason::Reconfigured))
            }
            s => panic!("LOCK answered {s:?}"),
        }
    }

    /// After locking record `i` at `version`: the version it was read at must still be
    /// current (exactly: an absent record that was inserted and deleted since is not the
    /// absence that was read); a blind insert must find no value.
    fn check_locked_version(&mut self, i: usize, version: u64) -> Result<(), Abort> {
        let a = &mut self.acc[i];
        a.lock_version = version;
        let ok = match (a.read_version, a.insert) {
            (Some(read), _) => read == version,
            (None, true) => !layout::is_present(version),
            (None, false) => unreachable!("writes are read for update first"),
        };
        if ok {
            Ok(())
        } else {
            Err(Abort(AbortReason::Validation))
        }
    }

    /// A record read at `read` is unchanged iff it is not locked (a lock of an earlier
    /// epoch is no lock: L6) and its version is still `read`.
    fn check_unchanged(&mut self, lock: u64, version: u64, read: u64) -> Result<(), Abort> {
        if lock != 0 && Owner(lock).holds_in(self.owner) {
            return Err(self.blocked(AbortReason::Validation, lock));
        }
        if version != read {
            return Err(Abort(AbortReason::Validation));
        }
        Ok(())
    }
}
