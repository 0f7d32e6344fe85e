//! RPC handlers: what a primary does for READ, LOCK, VALIDATE, COMMIT and UNLOCK, and
//! what a backup does for LOG and RECLAIM. They run inline in the worker's event loop,
//! touch only this node's store and log region, and are idempotent, because a request
//! can arrive twice (docs/INVARIANTS.md P2). A request about a record is served only by
//! its partition's primary under the configuration in force, and only if it was sent
//! under that configuration's epoch; while the node recovers (or its lease ran out) it
//! serves none: recovery relies on nothing of an older epoch changing memory once the
//! node quiesced (docs/INVARIANTS.md F2).

use std::rc::Rc;
use std::sync::Arc;

use hytra_fabric::Endpoint;
use hytra_rt::{HandlerCtx, Worker};
use hytra_store::{Owner, Replica, StoreError, TableId};

use crate::engine::NodeEngine;
use crate::log::{apply, put};
use crate::membership::View;
use crate::wire::{
    self, CommitReq, RecordReply, RecordReq, Status, CREATE, DELETE, LOCK_IT, NO_LOCK, SYNC,
    WANT_OFFSET,
};

/// What every handler of a worker needs: its node's engine and its view of the
/// configuration.
struct Serve {
    node: Arc<NodeEngine>,
    view: Rc<View>,
}

/// Registers every handler of the engine on a worker of `node`.
pub(crate) fn register<E: Endpoint + 'static>(
    w: &mut Worker<E>,
    node: &Arc<NodeEngine>,
    view: &Rc<View>,
) {
    let serve = Rc::new(Serve { node: node.clone(), view: view.clone() });
    let s = serve.clone();
    let mut buf = Vec::new();
    w.handle(wire::READ, Box::new(move |ctx, req| read(&s, ctx, req, &mut buf)));
    let s = serve.clone();
    w.handle(wire::LOCK, Box::new(move |ctx, req| lock(&s, ctx, req)));
    let s = serve.clone();
    w.handle(wire::VALIDATE, Box::new(move |ctx, req| validate(&s, ctx, req)));
    let s = serve.clone();
    let mut buf = Vec::new();
    w.handle(wire::COMMIT, Box::new(move |ctx, req| commit(&s, ctx, req, &mut buf)));
    let s = serve.clone();
    w.handle(wire::UNLOCK, Box::new(move |ctx, req| unlock(&s, ctx, req)));
    let n = node.clone();
    let mut buf = Vec::new();
    w.handle(wire::LOG, Box::new(move |ctx, req| log(&n, ctx, req, &mut buf)));
    let n = node.clone();
    let mut buf = Vec::new();
    w.handle(wire::RECLAIM, Box::new(move |ctx, req| reclaim(&n, ctx, req, &mut buf)));
}

fn answer(status: Status, reply: &mut Vec<u8>) {
    RecordReply { status, lock: 0, version: 0, offset: 0 }.encode(reply);
}

impl Serve {
    /// This node's replica of `key`'s partition of `table`, if this node is its primary
    /// under the configuration in force and the request was sent under that
    /// configuration's epoch: else why not (`Refused`: a request that names no record of
    /// this node; `Stale`: another epoch).
    fn primary(&self, table: u16, key: u64, epoch: u32, now: u64) -> Result<&Replica, Status> {
        let c = self.node.catalog.as_ref();
        if usize::from(table) >= c.tables().count() || key > hytra_store::layout::KEY_MAX {
            return Err(Status::Refused);
        }
        let t = TableId(table);
        let p = c.partition(t, key);
        let config = self.view.get();
        if config.epoch as u32 != epoch || !self.node.recovery.open(now) {
            return Err(Status::Stale);
        }
        if config.primary(p) != self.node.node {
            return Err(Status::Refused);
        }
        Ok(self.node.store.replica(t, p))
    }
}

fn read<E: Endpoint>(
    serve: &Serve,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    payload: &mut Vec<u64>,
) {
    ctx.ep.charge(crate::cpu::SERVE_READ, 1);
    let Some(r) = RecordReq::decode(req) else { return answer(Status::Refused, ctx.reply) };
    let replica = match serve.primary(r.table, r.key, r.epoch, ctx.ep.now_ns()) {
        Ok(replica) => replica,
        Err(status) => return answer(status, ctx.reply),
    };
    let Some(off) = replica.lookup(r.key) else {
        let absent = hytra_store::layout::ABSENT;
        return RecordReply { status: Status::Absent, lock: 0, version: absent, offset: 0 }
            .encode(ctx.reply);
    };
    if r.flags & LOCK_IT != 0 {
        if let Err(holder) = replica.try_lock(off, Owner(r.owner)) {
            return RecordReply { status: Status::Locked, lock: holder, version: 0, offset: 0 }
                .encode(ctx.reply);
        }
    }
    payload.resize(replica.payload_words(), 0);
    let status = match replica.read(off, r.key, payload) {
        Ok(s) => s,
        Err(_) => {
            if r.flags & LOCK_IT != 0 {
                replica.unlock_if(off, Owner(r.owner));
            }
            // Who holds the torn record: a writer that died mid-write-back holds it
            // until recovery mends it, and the reader waits for that (T4).
            let lock = replica.header(off).lock;
            return RecordReply { status: Status::Torn, lock, version: 0, offset: 0 }
                .encode(ctx.reply);
        }
    };
    let offset = if r.flags & WANT_OFFSET != 0 { off } else { 0 };
    RecordReply { status: Status::Ok, lock: status.lock, version: status.version, offset }
        .encode(ctx.reply);
    wire::Out(ctx.reply).words(payload);
}

fn lock<E: Endpoint>(serve: &Serve, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    let node = &serve.node;
    ctx.ep.charge(crate::cpu::SERVE_LOCK, 1);
    let Some(r) = RecordReq::decode(req) else { return answer(Status::Refused, ctx.reply) };
    let replica = match serve.primary(r.table, r.key, r.epoch, ctx.ep.now_ns()) {
        Ok(replica) => replica,
        Err(status) => return answer(status, ctx.reply),
    };
    // A design that locks by NIC on a fabric whose atomics are not coherent with the
    // CPU's must never see a CPU CAS on a lock word (M6, T8): only NO_LOCK requests are
    // served.
    if r.flags & NO_LOCK == 0 && node.cfg.nic_locks() && !ctx.ep.caps().atomics_coherent {
        return answer(Status::Refused, ctx.reply);
    }
    let found = if r.flags & CREATE != 0 {
        node.insert_primary(TableId(r.table), r.key).map(Some)
    } else {
        Ok(replica.lookup(r.key))
    };
    let off = match found {
        Ok(Some(off)) => off,
        Ok(None) => {
            return RecordReply { status: Status::Absent, lock: 0, version: 0, offset: 0 }
                .encode(ctx.reply)
        }
        Err(StoreError::Full(_) | StoreError::IndexFull(_)) => {
            return RecordReply { status: Status::Full, lock: 0, version: 0, offset: 0 }
                .encode(ctx.reply)
        }
        Err(StoreError::Torn | StoreError::ImageMismatch(..) | StoreError::PayloadSize(..)) => {
            unreachable!("lookups and inserts neither tear nor restore images")
        }
    };
    if r.flags & NO_LOCK != 0 {
        let h = replica.header(off);
        return RecordReply { status: Status::Ok, lock: h.lock, version: h.version, offset: off }
            .encode(ctx.reply);
    }
    // A refused lock reports its holder as the attempt found it (the waiter's backoff
    // tells holders apart, `TxnCtx::await_stuck_lock`), not whoever holds it a moment
    // later.
    let (status, lock) = match replica.try_lock(off, Owner(r.owner)) {
        Ok(()) => (Status::Ok, r.owner),
        Err(holder) => (Status::Locked, holder),
    };
    let h = replica.header(off);
    RecordReply { status, lock, version: h.version, offset: off }.encode(ctx.reply);
}

fn validate<E: Endpoint>(serve: &Serve, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    ctx.ep.charge(crate::cpu::SERVE_VALIDATE, 1);
    let Some(r) = RecordReq::decode(req) else { return answer(Status::Refused, ctx.reply) };
    let replica = match serve.primary(r.table, r.key, r.epoch, ctx.ep.now_ns()) {
        Ok(replica) => replica,
        Err(status) => return answer(status, ctx.reply),
    };
    match replica.lookup(r.key) {
        None => {
            let absent = hytra_store::layout::ABSENT;
            RecordReply { status: Status::Absent, lock: 0, version: absent, offset: 0 }
                .encode(ctx.reply);
        }
        Some(off) => {
            let h = replica.header(off);
            RecordReply { status: Status::Ok, lock: h.lock, version: h.version, offset: off }
                .encode(ctx.reply);
        }
    }
}

fn commit<E: Endpoint>(
    serve: &Serve,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    payload: &mut Vec<u64>,
) {
    ctx.ep.charge(crate::cpu::SERVE_COMMIT, 1);
    let Some(c) = CommitReq::decode(req, payload) else { return wire::encode_word(0, ctx.reply) };
    // A write-back is the tail of a committed transaction: it is applied under a later
    // epoch too, as long as the lock is still its own (recovery has not resolved it).
    let epoch = serve.view.get().epoch as u32;
    let replica = match serve.primary(c.table, c.key, epoch, ctx.ep.now_ns()) {
        Ok(r) => r,
        Err(Status::Stale) => return wire::encode_word(wire::REFUSED, ctx.reply),
        Err(_) => return wire::encode_word(0, ctx.reply),
    };
    // A coordinator commits only records it locked, so they exist, with its table's
    // payload; a request that says otherwise did not come from one and changes nothing.
    let Some(off) = replica.lookup(c.key) else { return wire::encode_word(0, ctx.reply) };
    if payload.len() != replica.payload_words() {
        return wire::encode_word(0, ctx.reply);
    }
    // Only the lock holder writes; a duplicate of an applied commit finds the lock free
    // (or held by a later transaction) and changes nothing.
    if replica.header(off).lock == c.owner {
        let version =
            if c.flags & DELETE != 0 { c.version | hytra_store::layout::ABSENT } else { c.version };
        replica.write_back(off, version, c.key, payload);
        replica.unlock(off);
    }
    wire::encode_word(1, ctx.reply);
}

fn unlock<E: Endpoint>(serve: &Serve, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    ctx.ep.charge(crate::cpu::SERVE_UNLOCK, 1);
    if let Some(r) = RecordReq::decode(req) {
        // A release frees only the sender's own attempt's lock: harmless under any epoch,
        // so it is honoured under any.
        let epoch = serve.view.get().epoch as u32;
        match serve.primary(r.table, r.key, epoch, ctx.ep.now_ns()) {
            Ok(replica) => {
                if let Some(off) = replica.lookup(r.key) {
                    replica.unlock_if(off, Owner(r.owner));
                }
            }
            // Not serving now (recovering, or the lease ran out): the sender asks again.
            Err(Status::Stale) => return wire::encode_word(wire::REFUSED, ctx.reply),
            Err(_) => {}
        }
    }
    wire::encode_word(1, ctx.reply);
}

fn log<E: Endpoint>(
    node: &NodeEngine,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    entry: &mut Vec<u64>,
) {
    let malformed = |reply: &mut Vec<u8>| wire::encode_word(wire::MALFORMED, reply);
    let Some(start) = wire::decode_log(req, entry) else { return malformed(ctx.reply) };
    // Only entries of the epoch in force, and not while recovering: recovery reads the
    // rings once every member quiesced, and nothing may land behind its back.
    let Some((epoch, records)) = crate::log::entry_epoch(entry) else {
        return malformed(ctx.reply);
    };
    if epoch != node.membership.epoch() || !node.recovery.open(ctx.ep.now_ns()) {
        return wire::encode_word(wire::REFUSED, ctx.reply);
    }
    ctx.ep.charge(crate::cpu::SERVE_LOG, records.max(1) as u32);
    let c = ctx.ep.shape().worker_index(ctx.src);
    if put(&node.log_region, &node.log, c, start, entry).is_err() {
        return malformed(ctx.reply);
    }
    let head = node.log_region.load(node.log.head_offset(c));
    debug_assert!(head < wire::MALFORMED, "a ring head is a stream position, never a status");
    wire::encode_word(head, ctx.reply);
}

fn reclaim<E: Endpoint>(
    node: &NodeEngine,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    buf: &mut Vec<u64>,
) {
    let Some((flags, epoch, up_to)) = wire::decode_reclaim(req) else { return };
    if epoch != node.membership.epoch() as u32 || !node.recovery.open(ctx.ep.now_ns()) {
        // The ring's head may be about to move (recovery resolves it): the sender learns
        // it once the new configuration is active.
        if flags & SYNC != 0 {
            wire::encode_word(wire::REFUSED, ctx.reply);
        }
        return;
    }
    let c = ctx.ep.shape().worker_index(ctx.src);
    let applied = match apply(&node.store, &node.log_region, &node.log, c, up_to, buf) {
        Ok(a) => a,
        Err(e) => panic!("log ring of {} at {} is corrupt: {e:?}", ctx.src, node.node),
    };
    ctx.ep.charge(crate::cpu::APPLY_LOG, applied.records.max(1) as u32);
    if flags & SYNC != 0 {
        wire::encode_word(applied.head, ctx.reply);
    }
}
