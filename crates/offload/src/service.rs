//! A memcached-like get service over one server node's hash table, with three ways to
//! get a value:
//!
//! - [`GetMode::Offload`]: one SEND to a recycled verb program on the server's NIC; the
//!   program READs the candidate buckets into its response WQEs, CASes each into a WRITE
//!   if its key matches, and WRITEs a completion word; the server CPU takes no part.
//!   Buckets are searched in one queue one after the other ([`Search::Sequential`]) or
//!   on two queues at once ([`Search::Parallel`]).
//! - [`GetMode::OneSided`]: READ both buckets, then READ the item (two round trips).
//! - [`GetMode::TwoSided`]: a one-way RPC; a server coroutine looks the key up and
//!   WRITEs the item and the completion word (the server CPU serves every get).
//!
//! Every mode answers into the same client slot: a completion word the client waits on,
//! and a buffer that receives the item (absent: the buffer's key word stays 0).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use hytra_fabric::wq::{field, Sge, WqId, WqOpcode, Wqe};
use hytra_fabric::{
    Backend, BackendError, Endpoint, LocalAddr, NodeId, OpFlags, Qp, Region, RegionSpec, Rkey,
    WorkRequest, WorkerId, WriteSrc,
};
use hytra_rt::{Co, RpcType, Worker};

use crate::hash::{key_word, lookup, read_item, HashTable, TableLayout, BUCKET_BYTES, ITEM_HEADER};
use crate::program::{Program, ProgramError, Q};

/// RPC type of a two-sided get.
pub const GET_RPC: RpcType = RpcType(40);
/// RPC type of a background writer's put.
pub const PUT_RPC: RpcType = RpcType(41);

/// How a client gets.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub enum GetMode {
    /// Answered by the server's NIC.
    Offload,
    /// READs by the client.
    OneSided,
    /// RPC to the server's CPU.
    TwoSided,
}

/// How the offload searches the two candidate buckets.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub enum Search {
    /// One queue, one bucket after the other.
    Sequential,
    /// Two queues, both buckets at once.
    Parallel,
}

/// What a get service looks like.
#[derive(Copy, Clone, Debug)]
pub struct KvConfig {
    /// The node holding the table (its worker 0 serves two-sided gets and puts).
    pub server: NodeId,
    /// Buckets of the table.
    pub buckets: u64,
    /// Bytes for items.
    pub item_bytes: u64,
    /// Largest value a get can return.
    pub value_max: u32,
    /// Client slots per client worker (each has its own offload program).
    pub slots_per_worker: u32,
    /// Bucket search of the offload.
    pub search: Search,
    /// CPU time of the server per two-sided get lookup and per put, ns (modelled on the
    /// simulator; real backends spend what they spend).
    pub server_op_ns: u64,
}

/// Per client slot: where its answers land and which program serves it.
#[derive(Copy, Clone, Debug)]
struct SlotInfo {
    /// The completion word, then the item buffer.
    base: u64,
    /// Region of the client worker's slots.
    key: Rkey,
    /// Queue the client triggers.
    trigger: WqId,
}

/// Everything clients and the server need, fixed at setup.
#[derive(Clone, Debug)]
pub struct KvService {
    cfg: KvConfig,
    table: TableLayout,
    /// Region of client slots on every client node (watched by the client's worker).
    slots_key: Rkey,
    /// Per client worker (by worker index in the cluster), its slots.
    slots: Vec<Vec<SlotInfo>>,
    /// The server's offload queues that start the programs (rung once at start).
    starters: Vec<WqId>,
    /// Queues of all programs, for inspection.
    queues: Vec<WqId>,
}

/// A two-sided get waiting for a server coroutine: caller, [key, seq, slot offset].
type GetRequest = (WorkerId, [u64; 3]);

/// A coroutine waiting for a word: region, offset, wanted value, waker.
type WordWait = (Region, u64, u64, Waker);

/// Bytes of a slot's completion word.
const SLOT_HEADER: u64 = 8;

impl KvService {
    /// Registers the table on the server, slots on every other node, and builds one
    /// offload program per client slot (on backends with verb programs; elsewhere only
    /// the one- and two-sided paths work). Fills the table with `fill`.
    pub fn setup<B: Backend>(
        backend: &mut B,
        cfg: KvConfig,
        fill: impl FnOnce(&mut HashTable) -> Result<(), crate::hash::TableError>,
    ) -> Result<KvService, BackendError> {
        let shape = backend.shape();
        let bad = |m: String| BackendError::Config(m);
        if cfg.value_max == 0 || cfg.value_max % 8 != 0 {
            return Err(bad(format!(
                "value_max {} must be a positive multiple of 8",
                cfg.value_max
            )));
        }
        let table = TableLayout { rkey: Rkey(0), buckets: cfg.buckets, item_bytes: cfg.item_bytes };
        let table_key = backend.register(cfg.server, RegionSpec::new(table.region_bytes()))?;
        let table = TableLayout { rkey: table_key, ..table };
        if backend.hosts(cfg.server) {
            let region = backend.region(cfg.server, table_key).expect("registered");
            let mut t = HashTable::new(table, region);
            fill(&mut t).map_err(|e| bad(format!("filling the table: {e}")))?;
        }
        let slot_bytes = SLOT_HEADER + ITEM_HEADER + u64::from(cfg.value_max);
        let mut slots_key = None;
        for n in 0..shape.nodes {
            let node = NodeId(n);
            if node == cfg.server {
                continue;
            }
            // One region per worker, watched by it, so an answer steps the worker that
            // waits for it; keys are dense, so worker i's is the first plus i.
            for i in 0..shape.workers_per_node {
                let len_bytes = (u64::from(cfg.slots_per_worker) * slot_bytes).max(8);
                let k = backend.register(node, RegionSpec { len_bytes, watcher: Some(i) })?;
                if i == 0 {
                    assert!(slots_key.is_none_or(|p| p == k), "slot regions have one key");
                    slots_key = Some(k);
                }
            }
        }
        let slots_key = slots_key.ok_or_else(|| bad("a get service needs a client node".into()))?;
        // Programs: one code region on the server, one program per client slot.
        let mut slots = vec![Vec::new(); shape.workers_total()];
        let mut starters = Vec::new();
        let mut queues = Vec::new();
        let clients: Vec<WorkerId> = shape.workers().filter(|w| w.node != cfg.server).collect();
        let code_per_program = 16 * 1024;
        let n_programs = clients.len() as u64 * u64::from(cfg.slots_per_worker);
        let code_key = backend
            .register(cfg.server, RegionSpec::new((n_programs * code_per_program).max(8)))?;
        let mut next_wq = 0u32;
        // Backends without a NIC model refuse the first queue; then only the one- and
        // two-sided paths exist.
        let mut supported = true;
        for (ci, w) in clients.iter().enumerate() {
            let widx = shape.worker_index(*w);
            for s in 0..cfg.slots_per_worker {
                let k = ci as u64 * u64::from(cfg.slots_per_worker) + u64::from(s);
                let base = u64::from(s) * slot_bytes;
                let code = LocalAddr { rkey: code_key, offset: k * code_per_program };
                let key = Rkey(slots_key.0 + u32::from(w.index));
                let client_slot = LocalAddr { rkey: key, offset: base };
                let mut trigger = WqId(u32::MAX);
                if supported {
                    let installed =
                        Program::build(cfg.server, code, code_per_program, WqId(next_wq), |p| {
                            hash_get_program(p, cfg, table, w.node, client_slot)
                        })
                        .map_err(|e| bad(format!("offload program: {e}")))?;
                    for spec in installed.specs() {
                        match backend.create_wq(cfg.server, spec) {
                            Ok(id) => {
                                assert_eq!(id, WqId(next_wq), "queue ids are dense");
                                queues.push(id);
                                next_wq += 1;
                            }
                            Err(_) if next_wq == 0 => {
                                supported = false;
                                break;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    if supported {
                        if backend.hosts(cfg.server) {
                            installed.write(&backend.region(cfg.server, code_key).expect("code"));
                        }
                        trigger = installed.wq(Q(0));
                        starters.push(trigger);
                    }
                }
                slots[widx].push(SlotInfo { base, key, trigger });
            }
        }
        Ok(KvService { cfg, table, slots_key, slots, starters, queues })
    }

    /// The table's layout.
    pub fn table(&self) -> TableLayout {
        self.table
    }

    /// Whether offloaded gets are available (the backend runs verb programs).
    pub fn offload_available(&self) -> bool {
        !self.starters.is_empty()
    }

    /// Work queues of the offload programs on the server.
    pub fn queues(&self) -> &[WqId] {
        &self.queues
    }

    /// Sets the server worker up: starts the offload programs (one doorbell each) and
    /// serves two-sided gets and puts with `servers` coroutines until `end_ns`.
    pub fn serve<E: Endpoint + 'static>(&self, w: &mut Worker<E>, servers: u32, end_ns: u64) {
        let starters = self.starters.clone();
        let co = w.co();
        co.with_ep(|ep| {
            for q in starters {
                ep.wq_doorbell(q).expect("offload queue of this node");
            }
        });
        let queue: Rc<RefCell<VecDeque<GetRequest>>> = Rc::default();
        let (q2, cfg, table) = (queue.clone(), self.cfg, self.table);
        w.handle(
            GET_RPC,
            Box::new(move |ctx, payload| {
                if let Some(req) = decode_words::<3>(payload) {
                    q2.borrow_mut().push_back((ctx.src, req));
                }
            }),
        );
        w.handle(
            PUT_RPC,
            Box::new(move |ctx, payload| {
                // A put rewrites an existing item's value in place (same length), which
                // is the CPU work the background writers load the server with.
                ctx.ep.charge_cpu(cfg.server_op_ns);
                if let Some([key]) = decode_words::<1>(&payload[..payload.len().min(8)]) {
                    if let Some(region) = ctx.ep.region(table.rkey) {
                        put_in_place(region, table, key, &payload[8..]);
                    }
                }
            }),
        );
        let slots_key = self.slots_key;
        for _ in 0..servers {
            let q = queue.clone();
            w.spawn(move |co| async move {
                while co.now_ns() < end_ns {
                    let Some((src, [key, seq, base])) = q.borrow_mut().pop_front() else {
                        co.yield_now().await;
                        continue;
                    };
                    co.charge(cfg.server_op_ns);
                    let region = Rkey(slots_key.0 + u32::from(src.index));
                    serve_get(&co, table, region, src.node, key, seq, base).await;
                }
            });
        }
    }

    /// A client handle for slot `slot` of this worker.
    pub fn client<E: Endpoint + 'static>(&self, co: &Co<E>, waits: &Waits, slot: u32) -> Client {
        let me = co.shape().worker_index(co.me());
        let info = self.slots[me][slot as usize];
        let region = co.region(info.key).expect("slot region on client nodes");
        Client {
            svc: self.clone(),
            info,
            region,
            waits: waits.clone(),
            seq: 0,
            server: WorkerId { node: self.cfg.server, index: 0 },
        }
    }
}

fn decode_words<const N: usize>(b: &[u8]) -> Option<[u64; N]> {
    if b.len() != N * 8 {
        return None;
    }
    let mut out = [0u64; N];
    for (i, c) in b.chunks_exact(8).enumerate() {
        out[i] = u64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    Some(out)
}

fn put_in_place(region: &Region, table: TableLayout, key: u64, value: &[u8]) {
    for b in table.candidates(key) {
        let mut w = [0u64; 3];
        region.read_words(table.bucket(b), &mut w);
        if w[0] == key_word(key) {
            let item = Sge::from_words(w[1], w[2]);
            let len = region.load(item.addr.offset + 8) as usize;
            let n = value.len().min(len) / 8 * 8;
            if n > 0 {
                region.write_bytes(item.addr.offset + ITEM_HEADER, &value[..n]);
            }
            return;
        }
    }
}

async fn serve_get<E: Endpoint + 'static>(
    co: &Co<E>,
    table: TableLayout,
    slots_key: Rkey,
    client: NodeId,
    key: u64,
    seq: u64,
    base: u64,
) {
    let region = co.region(table.rkey).expect("table on the server");
    let mut item = None;
    for b in table.candidates(key) {
        let mut w = [0u64; 3];
        region.read_words(table.bucket(b), &mut w);
        if w[0] == key_word(key) {
            item = Some(Sge::from_words(w[1], w[2]));
        }
    }
    let remote = |off: u64| hytra_fabric::RemoteAddr { node: client, rkey: slots_key, offset: off };
    let seq_bytes = seq.to_le_bytes();
    let done = WorkRequest::Write { remote: remote(base), src: WriteSrc::Bytes(&seq_bytes) };
    if let Some(sge) = item {
        let data = WorkRequest::Write {
            remote: remote(base + SLOT_HEADER),
            src: WriteSrc::Local { addr: sge.addr, len: sge.len },
        };
        // The connection runs in order: the completion word lands after the item.
        if co.issue_unsignaled(Qp::to(client), &[data], OpFlags::NONE).is_err() {
            return;
        }
    }
    let ticket = co.issue_with(Qp::to(client), &[done], OpFlags::INLINE);
    // A failed answer is a lost answer: the client times out.
    if let Ok(t) = ticket {
        let _ = co.wait(t).await;
    }
}

/// Words of the offload request, in scatter order.
const REQUEST_WORDS: usize = 7;

/// Emits the recycled hash-get program of one client slot, in three kinds of queue
/// (RedN §5.2, Fig. 9, with recycling):
///
/// - control `K` (recycled, holds the RECV): WAIT for the request, ENABLE the lookup
///   queue(s), the FAAs that advance K's own counts, WAIT for the lookups' CASes, ENABLE
///   the response queue, then the FAAs on the lookups' WAIT counts and K's next round;
/// - lookup `W` (or `W1` and `W2` for [`Search::Parallel`]): per bucket a READ of the
///   bucket into a response entry's header and item scatter/gather entry, a WAIT for it,
///   and a CAS that turns the response into a WRITE if the bucket holds the key;
/// - response `R` (connected to the client): the two response entries, then a WRITE of
///   the request's sequence number into the client's completion word.
///
/// Each ENABLE comes after the verbs that rewrote what it enables completed (doorbell
/// order): the lookups after the RECV scattered the request into them, the responses
/// after the CASes.
fn hash_get_program(
    p: &mut Program,
    cfg: KvConfig,
    table: TableLayout,
    client: NodeId,
    slot: LocalAddr,
) -> Result<(), ProgramError> {
    let server = cfg.server;
    let parallel = cfg.search == Search::Parallel;
    // Two RECVs: the next request may arrive before this round re-posts its RECV.
    let k = p.queue(server, true, 2);
    let w1 = p.queue(server, true, 0);
    let w2 = if parallel { p.queue(server, true, 0) } else { w1 };
    let r = p.queue(client, true, 0);
    let answer = Wqe::Write {
        local: Sge { addr: slot, len: 0 },
        remote_key: slot.rkey,
        remote: slot.offset + SLOT_HEADER,
    };
    // A READ of a bucket fills a response's header (key word, NOOP) and its local
    // scatter/gather entry (the item).
    let resp1 = p.body(r, answer);
    let resp2 = p.body(r, answer);
    // The request's sequence number, scattered by the RECV into the LOCAL_ADDR field of
    // a NOOP of K that only serves as storage; R's last WRITE sends it back.
    let seq_word = p.reserve(k);
    p.set(seq_word, Wqe::Noop, false, 0)?;
    let seq_at = p.field(seq_word, field::LOCAL_ADDR);
    p.push(
        r,
        Wqe::Write {
            local: Sge { addr: seq_at, len: 8 },
            remote_key: slot.rkey,
            remote: slot.offset,
        },
        false,
    );
    let lookup = |p: &mut Program, w: Q, resp: crate::program::Wr| -> Result<_, ProgramError> {
        let dest = p.field(resp, field::HEADER);
        let read = p.push(
            w,
            Wqe::Read { local: Sge { addr: dest, len: 24 }, remote_key: table.rkey, remote: 0 },
            true,
        );
        p.wait_all(w, w);
        let cas = p.cas_header(w, resp)?;
        Ok((read, cas))
    };
    let (read1, cas1) = lookup(p, w1, resp1)?;
    let (read2, cas2) = lookup(p, w2, resp2)?;
    p.begin_round(k)?;
    let kq = p.wq(k);
    p.push(k, Wqe::Wait { target: kq, count: 1, recv: true }, false);
    p.enable_all(k, w1);
    if parallel {
        p.enable_all(k, w2);
    }
    // K's own FAAs run while the lookups do.
    p.advance_here(k)?;
    p.wait_all(k, w1);
    if parallel {
        p.wait_all(k, w2);
    }
    p.enable_all(k, r);
    p.end_round(k)?;
    let sge = |addr: LocalAddr, words: u32| Sge { addr, len: words * 8 };
    p.post_recv(
        k,
        &[
            sge(p.field(cas1, field::OPERAND_A), 2),
            sge(p.field(cas2, field::OPERAND_A), 2),
            sge(p.field(read1, field::REMOTE_ADDR), 1),
            sge(p.field(read2, field::REMOTE_ADDR), 1),
            sge(seq_at, 1),
        ],
    )?;
    Ok(())
}

/// Outcome of one get.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum GetResult {
    /// The value.
    Found(Vec<u8>),
    /// The key is not in the table.
    Absent,
    /// No answer before the deadline.
    TimedOut,
}

/// A client slot: issues one get at a time.
pub struct Client {
    svc: KvService,
    info: SlotInfo,
    region: Region,
    waits: Waits,
    seq: u64,
    server: WorkerId,
}

impl Client {
    /// Gets `key` with `mode`, waiting at most `timeout_ns`.
    pub async fn get<E: Endpoint + 'static>(
        &mut self,
        co: &Co<E>,
        mode: GetMode,
        key: u64,
        timeout_ns: u64,
    ) -> GetResult {
        self.seq += 1;
        let seq = self.seq;
        let base = self.info.base;
        let buf = base + SLOT_HEADER;
        // A stale item from an earlier get must not look like this one's answer.
        self.region.store(buf, 0);
        let deadline = co.now_ns() + timeout_ns;
        let table = self.svc.table;
        let server = self.svc.cfg.server;
        match mode {
            GetMode::Offload => {
                assert!(self.svc.offload_available(), "offload needs a backend with verb programs");
                let [b1, b2] = table.candidates(key).map(|b| table.bucket(b));
                let kw = key_word(key);
                let swap = kw | WqOpcode::Write as u64;
                let msg: [u64; REQUEST_WORDS] = [kw, swap, kw, swap, b1, b2, seq];
                let bytes: Vec<u8> = msg.iter().flat_map(|w| w.to_le_bytes()).collect();
                let trigger = self.info.trigger;
                if co.with_ep(|ep| ep.trigger(server, trigger, &bytes)).is_err() {
                    return GetResult::TimedOut;
                }
            }
            GetMode::TwoSided => {
                let req = [key, seq, base];
                let bytes: Vec<u8> = req.iter().flat_map(|w| w.to_le_bytes()).collect();
                if co.send_oneway(self.server, GET_RPC, &bytes).is_err() {
                    return GetResult::TimedOut;
                }
            }
            GetMode::OneSided => return self.get_one_sided(co, key, deadline).await,
        }
        // Both answer with the item, then the sequence number in the completion word.
        if !self.waits.wait(co, &self.region, base, seq, deadline).await {
            return GetResult::TimedOut;
        }
        self.answer(key)
    }

    /// This slot's item buffer (in the client worker's slot region).
    pub fn slot_buffer(&self) -> LocalAddr {
        LocalAddr { rkey: self.info.key, offset: self.info.base + SLOT_HEADER }
    }

    fn answer(&self, key: u64) -> GetResult {
        let buf = self.info.base + SLOT_HEADER;
        if self.region.load(buf) == key_word(key) {
            GetResult::Found(read_item(&self.region, buf))
        } else {
            GetResult::Absent
        }
    }

    async fn get_one_sided<E: Endpoint + 'static>(
        &mut self,
        co: &Co<E>,
        key: u64,
        deadline: u64,
    ) -> GetResult {
        let table = self.svc.table;
        let server = self.svc.cfg.server;
        let base = self.info.base;
        let local = |off: u64| LocalAddr { rkey: self.info.key, offset: off };
        let remote =
            |off: u64| hytra_fabric::RemoteAddr { node: server, rkey: table.rkey, offset: off };
        // Round trip 1: both candidate buckets (into the item buffer, as scratch).
        let [b1, b2] = table.candidates(key).map(|b| table.bucket(b));
        let scratch = base + SLOT_HEADER;
        let reads = [
            WorkRequest::Read {
                remote: remote(b1),
                local: local(scratch),
                len: BUCKET_BYTES as u32,
            },
            WorkRequest::Read {
                remote: remote(b2),
                local: local(scratch + BUCKET_BYTES),
                len: BUCKET_BYTES as u32,
            },
        ];
        let Ok(t) = co.issue(Qp::to(server), &reads) else { return GetResult::TimedOut };
        if co.wait(t).await.is_err() || co.now_ns() > deadline {
            return GetResult::TimedOut;
        }
        let mut found = None;
        for k in 0..2 {
            let mut w = [0u64; 3];
            self.region.read_words(scratch + k * BUCKET_BYTES, &mut w);
            if w[0] == key_word(key) {
                found = Some(Sge::from_words(w[1], w[2]));
            }
        }
        let Some(item) = found else { return GetResult::Absent };
        // Round trip 2: the item.
        let read = WorkRequest::Read {
            remote: remote(item.addr.offset),
            local: local(scratch),
            len: item.len,
        };
        let Ok(t) = co.issue(Qp::to(server), &[read]) else { return GetResult::TimedOut };
        if co.wait(t).await.is_err() {
            return GetResult::TimedOut;
        }
        self.answer(key)
    }
}

/// The CPU lookup on the server's table, for checks after a run.
pub fn cpu_get<B: Backend>(backend: &B, svc: &KvService, key: u64) -> Option<Vec<u8>> {
    let region = backend.region(svc.cfg.server, svc.table.rkey)?;
    lookup(&region, svc.table, key)
}

/// Coroutines of one worker waiting for completion words in registered memory. Install
/// [`Waits::poller`] on the worker; the simulator steps the worker when an answer lands.
#[derive(Clone, Default)]
pub struct Waits {
    pending: Rc<RefCell<Vec<WordWait>>>,
}

impl Waits {
    /// The poller that wakes coroutines whose word reached its value.
    pub fn poller<E: Endpoint + 'static>(&self) -> hytra_rt::Poller<E> {
        let pending = self.pending.clone();
        Box::new(move |_co| {
            pending.borrow_mut().retain(|(r, at, want, w)| {
                if r.load(*at) == *want {
                    w.wake_by_ref();
                    false
                } else {
                    true
                }
            });
            false
        })
    }

    /// Waits until the word at `at` of `region` equals `want` or the clock passes
    /// `deadline_ns`; returns whether the word arrived.
    pub fn wait<'a, E: Endpoint + 'static>(
        &'a self,
        co: &'a Co<E>,
        region: &'a Region,
        at: u64,
        want: u64,
        deadline_ns: u64,
    ) -> impl Future<Output = bool> + 'a {
        WaitWord { waits: self, co, region, at, want, deadline_ns, armed: false }
    }
}

struct WaitWord<'a, E> {
    waits: &'a Waits,
    co: &'a Co<E>,
    region: &'a Region,
    at: u64,
    want: u64,
    deadline_ns: u64,
    armed: bool,
}

impl<E: Endpoint + 'static> Future for WaitWord<'_, E> {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let arrived = self.region.load(self.at) == self.want;
        if arrived || self.co.now_ns() >= self.deadline_ns {
            if self.armed {
                // Sequence numbers make (offset, value) unique among a worker's waits.
                let (at, want) = (self.at, self.want);
                self.waits.pending.borrow_mut().retain(|e| (e.1, e.2) != (at, want));
            }
            return Poll::Ready(arrived);
        }
        // Registered once: a coroutine's waker does not change while it awaits this.
        if !self.armed {
            self.armed = true;
            self.co.wake_at(self.deadline_ns, cx.waker());
            let entry = (self.region.clone(), self.at, self.want, cx.waker().clone());
            self.waits.pending.borrow_mut().push(entry);
        }
        Poll::Pending
    }
}
