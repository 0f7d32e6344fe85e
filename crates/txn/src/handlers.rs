//! RPC handlers: what a primary does for READ, LOCK, VALIDATE, COMMIT and UNLOCK, and
//! what a backup does for LOG and RECLAIM. They run inline in the worker's event loop,
//! touch only this node's store and log region, and are idempotent, because a request
//! can arrive twice (docs/INVARIANTS.md P2).

use std::sync::Arc;

use hytra_fabric::Endpoint;
use hytra_rt::{HandlerCtx, Worker};
use hytra_store::layout::RECORD_HEADER_WORDS;
use hytra_store::{Owner, Replica, StoreError, TableId};

use crate::engine::NodeEngine;
use crate::log::{apply, put};
use crate::wire::{
    self, CommitReq, RecordReply, RecordReq, Status, CREATE, DELETE, LOCK_IT, NO_LOCK, SYNC,
    WANT_OFFSET,
};

/// Registers every handler of the engine on a worker of `node`.
pub(crate) fn register<E: Endpoint + 'static>(w: &mut Worker<E>, node: &Arc<NodeEngine>) {
    let n = node.clone();
    let mut buf = Vec::new();
    w.handle(wire::READ, Box::new(move |ctx, req| read(&n, ctx, req, &mut buf)));
    let n = node.clone();
    w.handle(wire::LOCK, Box::new(move |ctx, req| lock(&n, ctx, req)));
    let n = node.clone();
    w.handle(wire::VALIDATE, Box::new(move |ctx, req| validate(&n, ctx, req)));
    let n = node.clone();
    let mut buf = Vec::new();
    w.handle(wire::COMMIT, Box::new(move |ctx, req| commit(&n, ctx, req, &mut buf)));
    let n = node.clone();
    w.handle(wire::UNLOCK, Box::new(move |ctx, req| unlock(&n, ctx, req)));
    let n = node.clone();
    let mut buf = Vec::new();
    w.handle(wire::LOG, Box::new(move |ctx, req| log(&n, ctx, req, &mut buf)));
    let n = node.clone();
    let mut buf = Vec::new();
    w.handle(wire::RECLAIM, Box::new(move |ctx, req| reclaim(&n, ctx, req, &mut buf)));
}

fn refuse(reply: &mut Vec<u8>) {
    RecordReply { status: Status::Refused, lock: 0, version: 0, offset: 0 }.encode(reply);
}

/// The primary replica of `table` here, if `key` belongs to this node's partition.
fn primary(node: &NodeEngine, table: u16, key: u64) -> Option<&Replica> {
    let c = node.catalog.as_ref();
    if usize::from(table) >= c.tables().count() || key > hytra_store::layout::KEY_MAX {
        return None;
    }
    let t = TableId(table);
    (c.primary(c.partition(t, key)) == node.node).then(|| node.store.primary(t))
}

fn read<E: Endpoint>(
    node: &NodeEngine,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    payload: &mut Vec<u64>,
) {
    ctx.ep.charge_cpu(node.cfg.costs.record_ns);
    let Some(r) = RecordReq::decode(req) else { return refuse(ctx.reply) };
    let Some(replica) = primary(node, r.table, r.key) else { return refuse(ctx.reply) };
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
            return RecordReply { status: Status::Torn, lock: 0, version: 0, offset: 0 }
                .encode(ctx.reply);
        }
    };
    let offset = if r.flags & WANT_OFFSET != 0 { off } else { 0 };
    RecordReply { status: Status::Ok, lock: status.lock, version: status.version, offset }
        .encode(ctx.reply);
    wire::Out(ctx.reply).words(payload);
}

fn lock<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    ctx.ep.charge_cpu(node.cfg.costs.record_ns);
    let Some(r) = RecordReq::decode(req) else { return refuse(ctx.reply) };
    let Some(replica) = primary(node, r.table, r.key) else { return refuse(ctx.reply) };
    // A design that locks by NIC on a fabric whose atomics are not coherent with the
    // CPU's must never see a CPU CAS on a lock word (M6, T8): only NO_LOCK requests are
    // served.
    if r.flags & NO_LOCK == 0 && node.cfg.nic_locks() && !ctx.ep.caps().atomics_coherent {
        return refuse(ctx.reply);
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
    let status = match replica.try_lock(off, Owner(r.owner)) {
        Ok(()) => Status::Ok,
        Err(_) => Status::Locked,
    };
    let h = replica.header(off);
    RecordReply { status, lock: h.lock, version: h.version, offset: off }.encode(ctx.reply);
}

fn validate<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    ctx.ep.charge_cpu(node.cfg.costs.record_ns);
    let Some(r) = RecordReq::decode(req) else { return refuse(ctx.reply) };
    let Some(replica) = primary(node, r.table, r.key) else { return refuse(ctx.reply) };
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
    node: &NodeEngine,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    payload: &mut Vec<u64>,
) {
    ctx.ep.charge_cpu(node.cfg.costs.record_ns);
    let Some(c) = CommitReq::decode(req, payload) else { return wire::encode_word(0, ctx.reply) };
    let Some(replica) = primary(node, c.table, c.key) else {
        return wire::encode_word(0, ctx.reply);
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

fn unlock<E: Endpoint>(node: &NodeEngine, ctx: &mut HandlerCtx<'_, E>, req: &[u8]) {
    ctx.ep.charge_cpu(node.cfg.costs.record_ns);
    if let Some(r) = RecordReq::decode(req) {
        if let Some(off) =
            primary(node, r.table, r.key).and_then(|rep| rep.lookup(r.key).map(|o| (rep, o)))
        {
            off.0.unlock_if(off.1, Owner(r.owner));
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
    let Some(start) = wire::decode_log(req, entry) else { return wire::encode_word(0, ctx.reply) };
    ctx.ep.charge_cpu(node.cfg.costs.record_ns * (entry.len() as u64 / RECORD_HEADER_WORDS).max(1));
    let c = ctx.ep.shape().worker_index(ctx.src);
    if put(&node.log_region, &node.log, c, start, entry).is_err() {
        return wire::encode_word(0, ctx.reply);
    }
    wire::encode_word(node.log_region.load(node.log.head_offset(c)), ctx.reply);
}

fn reclaim<E: Endpoint>(
    node: &NodeEngine,
    ctx: &mut HandlerCtx<'_, E>,
    req: &[u8],
    buf: &mut Vec<u64>,
) {
    let Some((flags, up_to)) = wire::decode_reclaim(req) else { return };
    let c = ctx.ep.shape().worker_index(ctx.src);
    let before = node.log_region.load(node.log.head_offset(c));
    let head = match apply(&node.store, &node.log_region, &node.log, c, up_to, buf) {
        Ok(h) => h,
        Err(e) => panic!("log ring of {} at {} is corrupt: {e:?}", ctx.src, node.node),
    };
    let words = head.saturating_sub(before) / 8;
    ctx.ep.charge_cpu(node.cfg.costs.record_ns * (words / RECORD_HEADER_WORDS).max(1));
    if flags & SYNC != 0 {
        wire::encode_word(head, ctx.reply);
    }
}
