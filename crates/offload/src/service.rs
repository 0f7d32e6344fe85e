//! A memcached-like get service over one server node's hash table or linked lists
//! ([`Structure`]), with three ways to get a value:
//!
//! - [`GetMode::Offload`]: one SEND to a recycled verb program on the server's NIC; the
//!   server CPU takes no part. For a hash table the program READs the candidate buckets
//!   into its response WQEs, CASes each into a WRITE if its key matches, and WRITEs a
//!   completion word; buckets are searched in one queue one after the other
//!   ([`Search::Sequential`]) or on two queues at once ([`Search::Parallel`]). For a list
//!   it runs an unrolled loop, one iteration per node: READ the node into a response
//!   WQE, copy its next pointer into the next iteration's READ, CAS the response into a
//!   WRITE if the key matches; with `break` a match ends the loop.
//! - [`GetMode::OneSided`]: READ both buckets, then the item (two round trips); in a
//!   list, READ node after node, then the item.
//! - [`GetMode::TwoSided`]: a one-way RPC; a server coroutine looks the key up and
//!   WRITEs the item and the completion word (the server CPU serves every get).
//!
//! Every mode answers into the same client slot: a completion word the client waits on,
//! and a buffer that receives the item (absent: the buffer's key word stays 0). A list
//! get with `break` ends with the item when the key is found, so its client also stops
//! waiting when the item's key word arrives.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use hytra_fabric::wq::{field, header, Sge, WqId, WqOpcode, Wqe};
use hytra_fabric::{
    Backend, BackendError, Endpoint, LocalAddr, NodeId, OpFlags, Qp, Region, RegionSpec, Rkey,
    WorkRequest, WorkerId, WriteSrc,
};
use hytra_rt::{Co, RpcType, Waits, Worker};

use crate::hash::{key_word, lookup, read_item, HashTable, TableLayout, BUCKET_BYTES, ITEM_HEADER};
use crate::list::{node_key_word, ListLayout, ListStore, NODE_BYTES, NULL};
pub use crate::lookup::Search;
use crate::lookup::{lookup_program, request, Answer};
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

/// What the service stores, and how the offload searches it.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub enum Structure {
    /// A two-choice hash table.
    Hash {
        /// Buckets of the table.
        buckets: u64,
        /// Bucket search of the offload.
        search: Search,
    },
    /// Linked lists: a get names a list by its head and reads at most `max_len` nodes.
    List {
        /// Nodes of the list area (the null node included).
        nodes: u64,
        /// Iterations of the offload's unrolled loop (1..=13: a RECV scatters the key
        /// into every iteration's CAS, and scatters at most 15 entries).
        max_len: u32,
        /// Whether a match ends the loop (each iteration then costs a second fetch).
        brk: bool,
    },
}

/// What a get service looks like.
#[derive(Copy, Clone, Debug)]
pub struct KvConfig {
    /// The node holding the data (its worker 0 serves two-sided gets and puts).
    pub server: NodeId,
    /// Hash table or lists.
    pub structure: Structure,
    /// Bytes for items.
    pub item_bytes: u64,
    /// Largest value a get can return.
    pub value_max: u32,
    /// Client slots per client worker (each has its own offload program).
    pub slots_per_worker: u32,
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

/// Where the data lives.
#[derive(Copy, Clone, Debug)]
enum Data {
    Hash(TableLayout),
    List(ListLayout),
}

impl Data {
    fn rkey(self) -> Rkey {
        match self {
            Data::Hash(t) => t.rkey,
            Data::List(l) => l.rkey,
        }
    }
}

/// Everything clients and the server need, fixed at setup.
#[derive(Clone, Debug)]
pub struct KvService {
    cfg: KvConfig,
    data: Data,
    /// Region of client slots on every client node (watched by the client's worker).
    slots_key: Rkey,
    /// Per client worker (by worker index in the cluster), its slots.
    slots: Vec<Vec<SlotInfo>>,
    /// The server's offload queues that start the programs (rung once at start).
    starters: Vec<WqId>,
    /// Queues of all programs, for inspection.
    queues: Vec<WqId>,
}

/// A two-sided get waiting for a server coroutine: caller, [key, seq, slot offset, list
/// head].
type GetRequest = (WorkerId, [u64; 4]);

/// Bytes of a slot's completion word.
const SLOT_HEADER: u64 = 8;

impl KvService {
    /// A service over a hash table ([`Structure::Hash`]): registers the table on the
    /// server, slots on every other node, and builds one offload program per client slot
    /// (on backends with verb programs; elsewhere only the one- and two-sided paths
    /// work). Fills the table with `fill`.
    pub fn setup<B: Backend>(
        backend: &mut B,
        cfg: KvConfig,
        fill: impl FnOnce(&mut HashTable) -> Result<(), crate::hash::TableError>,
    ) -> Result<KvService, BackendError> {
        let Structure::Hash { buckets, .. } = cfg.structure else {
            return Err(BackendError::Config("KvService::setup builds a hash table".into()));
        };
        let table = TableLayout { rkey: Rkey(0), buckets, item_bytes: cfg.item_bytes };
        Self::setup_with(backend, cfg, table.region_bytes(), |rkey, region| {
            let table = TableLayout { rkey, ..table };
            if let Some(region) = region {
                let mut t = HashTable::new(table, region);
                fill(&mut t).map_err(|e| format!("filling the table: {e}"))?;
            }
            Ok(Data::Hash(table))
        })
    }

    /// A service over linked lists ([`Structure::List`]), like [`KvService::setup`];
    /// `fill` stores the lists (and keeps their heads).
    pub fn setup_list<B: Backend>(
        backend: &mut B,
        cfg: KvConfig,
        fill: impl FnOnce(&mut ListStore) -> Result<(), crate::list::ListError>,
    ) -> Result<KvService, BackendError> {
        let Structure::List { nodes, max_len, .. } = cfg.structure else {
            return Err(BackendError::Config("KvService::setup_list builds lists".into()));
        };
        if !(1..=LIST_LEN_MAX).contains(&max_len) {
            return Err(BackendError::Config(format!(
                "a list get reads 1..={LIST_LEN_MAX} nodes, not {max_len}"
            )));
        }
        let lists = ListLayout { rkey: Rkey(0), nodes: nodes.max(1), item_bytes: cfg.item_bytes };
        Self::setup_with(backend, cfg, lists.region_bytes(), |rkey, region| {
            let lists = ListLayout { rkey, ..lists };
            if let Some(region) = region {
                let mut s = ListStore::new(lists, region);
                fill(&mut s).map_err(|e| format!("filling the lists: {e}"))?;
            }
            Ok(Data::List(lists))
        })
    }

    #[allow(
        clippy::too_many_lines,
        reason = "longer than the limit before the limit was set; split it when it next changes"
    )]
    fn setup_with<B: Backend>(
        backend: &mut B,
        cfg: KvConfig,
        data_bytes: u64,
        init: impl FnOnce(Rkey, Option<Region>) -> Result<Data, String>,
    ) -> Result<KvService, BackendError> {
        let shape = backend.shape();
        let bad = |m: String| BackendError::Config(m);
        if cfg.value_max == 0 || cfg.value_max % 8 != 0 {
            return Err(bad(format!(
                "value_max {} must be a positive multiple of 8",
                cfg.value_max
            )));
        }
        let data_key = backend.register(cfg.server, RegionSpec::new(data_bytes))?;
        let region = backend.hosts(cfg.server).then(|| backend.region(cfg.server, data_key));
        let data = init(data_key, region.map(|r| r.expect("registered"))).map_err(bad)?;
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
                let k = backend.register(
                    node,
                    RegionSpec { watcher: Some(i), ..RegionSpec::new(len_bytes) },
                )?;
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
                    let installed = Program::build(
                        cfg.server,
                        code,
                        code_per_program,
                        WqId(next_wq),
                        |p| match (data, cfg.structure) {
                            (Data::Hash(table), Structure::Hash { search, .. }) => {
                                let answer = Answer {
                                    rkey: key,
                                    done: base,
                                    item: base + SLOT_HEADER,
                                    entries: None,
                                };
                                lookup_program(p, cfg.server, search, table.rkey, w.node, answer)
                            }
                            (Data::List(lists), Structure::List { max_len, brk, .. }) => {
                                let (n, node) = (max_len as usize, w.node);
                                list_get_program(p, cfg.server, lists, n, brk, node, client_slot)
                            }
                            _ => unreachable!("the data matches the structure"),
                        },
                    )
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
        Ok(KvService { cfg, data, slots_key, slots, starters, queues })
    }

    /// The region holding the table or lists on the server.
    pub fn data_key(&self) -> Rkey {
        self.data.rkey()
    }

    /// What the service stores.
    pub fn structure(&self) -> Structure {
        self.cfg.structure
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
        let (q2, cfg, data) = (queue.clone(), self.cfg, self.data);
        w.handle(
            GET_RPC,
            Box::new(move |ctx, payload| {
                if let Some(req) = decode_words::<4>(payload) {
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
                if let (Some([key]), Data::Hash(table)) =
                    (decode_words::<1>(&payload[..payload.len().min(8)]), data)
                {
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
                    let Some((src, [key, seq, base, head])) = q.borrow_mut().pop_front() else {
                        co.yield_now().await;
                        continue;
                    };
                    co.charge(cfg.server_op_ns);
                    let region = Rkey(slots_key.0 + u32::from(src.index));
                    let item = find_item(&co, cfg.structure, data, key, head);
                    serve_get(&co, item, region, src.node, seq, base).await;
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

/// Decodes the `N` little-endian words of a request the server CPU receives (`N` = 4
/// for a two-sided get: key, sequence number, answer slot, list head; 1 for the key
/// that starts a put); `None` unless `b` holds exactly `N` words.
pub fn decode_words<const N: usize>(b: &[u8]) -> Option<[u64; N]> {
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

/// Where the server CPU finds `key`'s item (in the list at `head` for lists).
fn find_item<E: Endpoint + 'static>(
    co: &Co<E>,
    structure: Structure,
    data: Data,
    key: u64,
    head: u64,
) -> Option<Sge> {
    let region = co.region(data.rkey()).expect("data on the server");
    match (data, structure) {
        (Data::Hash(table), _) => table.candidates(key).into_iter().find_map(|b| {
            let mut w = [0u64; 3];
            region.read_words(table.bucket(b), &mut w);
            (w[0] == key_word(key)).then(|| Sge::from_words(w[1], w[2]))
        }),
        (Data::List(lists), Structure::List { max_len, .. }) => {
            let mut node = head;
            for _ in 0..max_len {
                // A head from the wire is checked like any remote address would be.
                if node == NULL || node % NODE_BYTES != 0 || node >= lists.nodes * NODE_BYTES {
                    return None;
                }
                let mut w = [0u64; 4];
                region.read_words(node, &mut w);
                if w[1] == node_key_word(key) {
                    return Some(Sge::from_words(w[2], w[3]));
                }
                node = w[0];
            }
            None
        }
        (Data::List(_), Structure::Hash { .. }) => unreachable!("the data matches the structure"),
    }
}

async fn serve_get<E: Endpoint + 'static>(
    co: &Co<E>,
    item: Option<Sge>,
    slots_key: Rkey,
    client: NodeId,
    seq: u64,
    base: u64,
) {
    let remote = |off: u64| hytra_fabric::RemoteAddr { node: client, rkey: slots_key, offset: off };
    // The slot came over the network: one whose item would lie past 2^64 gets no answer
    // (the client times out, as after a lost one); any other the fabric checks.
    let Some(item_at) = base.checked_add(SLOT_HEADER) else { return };
    let seq_bytes = seq.to_le_bytes();
    let done = WorkRequest::Write { remote: remote(base), src: WriteSrc::Bytes(&seq_bytes) };
    if let Some(sge) = item {
        let data = WorkRequest::Write {
            remote: remote(item_at),
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

/// Longest list an offloaded get traverses: the RECV scatters the head, the sequence
/// number and one CAS operand pair per iteration, at most 15 entries.
pub const LIST_LEN_MAX: u32 = 13;

/// Emits the recycled list-get program of one client slot: an unrolled loop of `n`
/// iterations (RedN §5.3, Fig. 12), one per node. Iteration `j`:
///
/// - READ the node (next pointer, key word, item scatter/gather entry) into the word
///   before response `j` and its first three words: the response now sends the item,
///   under a header that is an ENABLE carrying the node's key;
/// - WAIT for it, WRITE (copy) the next pointer into iteration `j + 1`'s READ, and CAS
///   response `j`'s header from ENABLE-with-the-client's-key to WRITE;
/// - without `break`: WAIT for both and ENABLE iteration `j + 1` of the same queue; the
///   responses and a WRITE of the sequence number run after the last iteration, in one
///   response queue. An unmatched response runs as an ENABLE of its own queue up to 0
///   (a no-op).
/// - with `break`: each iteration has its own loopback queue and response queue; the
///   iteration ENABLEs its response, which when unmatched is the ENABLE of the next
///   iteration, and when matched sends the item instead, so the loop stops there. The
///   last response queue also WRITEs the sequence number (absent key). Iterations after
///   the first may not run in a round, so they advance their own counts
///   ([`Program::begin_run`]).
///
/// A control queue `K` holds the RECV and starts iteration 0 (recycled round).
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
fn list_get_program(
    p: &mut Program,
    server: NodeId,
    lists: ListLayout,
    n: usize,
    brk: bool,
    client: NodeId,
    slot: LocalAddr,
) -> Result<(), ProgramError> {
    assert!(n >= 1, "checked at setup");
    let k = p.queue(server, true, 2);
    let answer = Wqe::Write {
        local: Sge { addr: slot, len: 0 },
        remote_key: slot.rkey,
        remote: slot.offset + SLOT_HEADER,
    };
    // Per iteration its loopback queue and its response queue (shared without break).
    let (ws, gs): (Vec<Q>, Vec<Q>) = if brk {
        (0..n).map(|_| (p.queue(server, true, 0), p.queue(client, true, 0))).unzip()
    } else {
        let (w, r) = (p.queue(server, true, 0), p.queue(client, true, 0));
        (vec![w; n], vec![r; n])
    };
    let seq_word = p.reserve(k);
    p.set(seq_word, Wqe::Noop, false, 0)?;
    let seq_at = p.field(seq_word, field::LOCAL_ADDR);
    let resps: Vec<_> = gs.iter().map(|&g| p.body(g, answer)).collect();
    for (j, &resp) in resps.iter().enumerate() {
        // Unmatched, a response is an ENABLE: of the next iteration with `break` (its
        // count is patched below), else of its own queue up to 0, which does nothing.
        let target = if brk && j + 1 < n { ws[j + 1] } else { gs[j] };
        let target = u64::from(p.wq(target).0);
        p.patch(resp, field::OPERAND_B, target);
    }
    let last_g = gs[n - 1];
    p.push(
        last_g,
        Wqe::Write {
            local: Sge { addr: seq_at, len: 8 },
            remote_key: slot.rkey,
            remote: slot.offset,
        },
        false,
    );
    let mut reads = Vec::with_capacity(n);
    let mut cas = Vec::with_capacity(n);
    let mut copy_prev: Option<crate::program::Wr> = None;
    let mut gate_prev: Option<crate::program::Wr> = None;
    for j in 0..n {
        let w = ws[j];
        if brk && j > 0 {
            p.begin_run(w)?;
        }
        let read = p.push(
            w,
            Wqe::Read {
                local: Sge { addr: p.word_before(resps[j]), len: NODE_BYTES as u32 },
                remote_key: lists.rkey,
                remote: NULL,
            },
            true,
        );
        if let Some(copy) = copy_prev.take() {
            p.patch(copy, field::REMOTE_ADDR, p.field(read, field::REMOTE_ADDR).offset);
        }
        let read_done = p.completions(w);
        if brk && j > 0 {
            // The FAAs run while the READ is in flight.
            p.advance_here(w)?;
        }
        // Completions count in issue order: the READ is done once this many arrived.
        p.push(w, Wqe::Wait { target: p.wq(w), count: read_done, recv: false }, false);
        if j + 1 < n {
            let next_word = p.word_before(resps[j]);
            let copy = p.push(
                w,
                Wqe::Write {
                    local: Sge { addr: next_word, len: 8 },
                    remote_key: next_word.rkey,
                    remote: 0,
                },
                true,
            );
            copy_prev = Some(copy);
        }
        let copy_done = p.completions(w);
        cas.push(p.cas_header(w, resps[j])?);
        reads.push(read);
        if brk {
            p.wait_all(w, w);
            p.enable_all(w, gs[j]);
            if j > 0 {
                let prev = resps[j - 1];
                p.patch(prev, field::OPERAND_A, p.len(w));
                p.end_run(w, &[prev])?;
            }
        } else if j + 1 < n {
            // The next iteration needs the copied pointer, not the CAS (the responses run
            // after K waited for every CAS).
            p.push(w, Wqe::Wait { target: p.wq(w), count: copy_done, recv: false }, false);
            // The gate lets the next iteration run, up to and including its own gate; the
            // count is patched once that exists.
            let gate = p.push(w, Wqe::Enable { target: p.wq(w), count: 0 }, false);
            if let Some(prev) = gate_prev.replace(gate) {
                p.patch(prev, field::OPERAND_A, p.len(w));
            }
        } else if let Some(prev) = gate_prev.take() {
            p.patch(prev, field::OPERAND_A, p.len(w));
        }
    }
    p.begin_round(k)?;
    let kq = p.wq(k);
    p.push(k, Wqe::Wait { target: kq, count: 1, recv: true }, false);
    let w0 = ws[0];
    // Iteration 0: up to its gate without `break` (the gate lets iteration 1 run).
    let first_len = if !brk && n > 1 { reads[1].index } else { p.len(w0) };
    p.push(k, Wqe::Enable { target: p.wq(w0), count: first_len }, false);
    p.advance_here(k)?;
    // With `break` only iteration 0 surely runs in a round (the others advance their own
    // counts) and the responses go out as the iterations end; without, the responses go
    // out once every iteration is done.
    p.wait_all(k, w0);
    if !brk {
        p.enable_all(k, gs[0]);
    }
    p.end_round(k)?;
    let sge = |addr: LocalAddr, words: u32| Sge { addr, len: words * 8 };
    let mut scatter = vec![sge(p.field(reads[0], field::REMOTE_ADDR), 1)];
    scatter.extend(cas.iter().map(|&c| sge(p.field(c, field::OPERAND_A), 2)));
    scatter.push(sge(seq_at, 1));
    p.post_recv(k, &scatter)
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
    /// Gets `key` from the hash table with `mode`, waiting at most `timeout_ns`.
    pub async fn get<E: Endpoint + 'static>(
        &mut self,
        co: &Co<E>,
        mode: GetMode,
        key: u64,
        timeout_ns: u64,
    ) -> GetResult {
        let Data::Hash(table) = self.svc.data else {
            panic!("Client::get on a list service: use get_in_list")
        };
        let seq = self.begin();
        let deadline = co.now_ns() + timeout_ns;
        let sent = match mode {
            GetMode::Offload => self.trigger(co, &request(table.index(), key, seq)),
            GetMode::TwoSided => self.rpc(co, key, seq, 0),
            GetMode::OneSided => return self.get_one_sided(co, table, key, deadline).await,
        };
        if !sent {
            return GetResult::TimedOut;
        }
        // Both answer with the item, then the sequence number in the completion word.
        self.answer(co, key, seq, false, deadline).await
    }

    /// Gets `key` from the list whose head node is at `head` with `mode`, waiting at most
    /// `timeout_ns`.
    pub async fn get_in_list<E: Endpoint + 'static>(
        &mut self,
        co: &Co<E>,
        mode: GetMode,
        head: u64,
        key: u64,
        timeout_ns: u64,
    ) -> GetResult {
        let Structure::List { max_len, brk, .. } = self.svc.cfg.structure else {
            panic!("Client::get_in_list on a hash-table service: use get")
        };
        let seq = self.begin();
        let deadline = co.now_ns() + timeout_ns;
        let sent = match mode {
            GetMode::Offload => {
                let (kw, swap) = (node_key_word(key), header(WqOpcode::Write, 0, key));
                let mut msg = vec![head];
                for _ in 0..max_len {
                    msg.extend([kw, swap]);
                }
                msg.push(seq);
                self.trigger(co, &msg)
            }
            GetMode::TwoSided => self.rpc(co, key, seq, head),
            GetMode::OneSided => {
                return self.list_one_sided(co, head, key, max_len, deadline).await;
            }
        };
        if !sent {
            return GetResult::TimedOut;
        }
        // With `break`, a found item is the last thing the NIC sends.
        let item_ends = mode == GetMode::Offload && brk;
        self.answer(co, key, seq, item_ends, deadline).await
    }

    /// This slot's item buffer (in the client worker's slot region).
    pub fn slot_buffer(&self) -> LocalAddr {
        LocalAddr { rkey: self.info.key, offset: self.info.base + SLOT_HEADER }
    }

    /// Starts a get: the next sequence number, and an item buffer that holds no answer.
    fn begin(&mut self) -> u64 {
        self.seq += 1;
        // A stale item from an earlier get must not look like this one's answer.
        self.region.store(self.info.base + SLOT_HEADER, 0);
        self.seq
    }

    fn trigger<E: Endpoint + 'static>(&self, co: &Co<E>, words: &[u64]) -> bool {
        assert!(self.svc.offload_available(), "offload needs a backend with verb programs");
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let (server, trigger) = (self.svc.cfg.server, self.info.trigger);
        co.with_ep(|ep| ep.trigger(server, trigger, &bytes)).is_ok()
    }

    fn rpc<E: Endpoint + 'static>(&self, co: &Co<E>, key: u64, seq: u64, head: u64) -> bool {
        let req = [key, seq, self.info.base, head];
        let bytes: Vec<u8> = req.iter().flat_map(|w| w.to_le_bytes()).collect();
        co.send_oneway(self.server, GET_RPC, &bytes).is_ok()
    }

    /// Waits for the completion word (or, with `item_ends`, the item's key word) and
    /// reads the answer.
    async fn answer<E: Endpoint + 'static>(
        &self,
        co: &Co<E>,
        key: u64,
        seq: u64,
        item_ends: bool,
        deadline: u64,
    ) -> GetResult {
        let base = self.info.base;
        let item = if item_ends { (base + SLOT_HEADER, key_word(key)) } else { (base, seq) };
        if !self.waits.wait_any(co, &self.region, [(base, seq), item], deadline).await {
            return GetResult::TimedOut;
        }
        self.found(key)
    }

    fn found(&self, key: u64) -> GetResult {
        let buf = self.info.base + SLOT_HEADER;
        if self.region.load(buf) == key_word(key) {
            GetResult::Found(read_item(&self.region, buf))
        } else {
            GetResult::Absent
        }
    }

    fn local(&self, off: u64) -> LocalAddr {
        LocalAddr { rkey: self.info.key, offset: off }
    }

    fn remote(&self, off: u64) -> hytra_fabric::RemoteAddr {
        let rkey = self.svc.data.rkey();
        hytra_fabric::RemoteAddr { node: self.svc.cfg.server, rkey, offset: off }
    }

    /// READs the item `sge` names into the item buffer.
    async fn read_found<E: Endpoint + 'static>(
        &self,
        co: &Co<E>,
        key: u64,
        item: Sge,
        deadline: u64,
    ) -> GetResult {
        let read = WorkRequest::Read {
            remote: self.remote(item.addr.offset),
            local: self.local(self.info.base + SLOT_HEADER),
            len: item.len,
        };
        let server = self.svc.cfg.server;
        let Ok(t) = co.issue(Qp::to(server), &[read]) else { return GetResult::TimedOut };
        if co.wait(t).await.is_err() || co.now_ns() > deadline {
            return GetResult::TimedOut;
        }
        self.found(key)
    }

    async fn get_one_sided<E: Endpoint + 'static>(
        &self,
        co: &Co<E>,
        table: TableLayout,
        key: u64,
        deadline: u64,
    ) -> GetResult {
        let server = self.svc.cfg.server;
        // Round trip 1: both candidate buckets (into the item buffer, as scratch).
        let [b1, b2] = table.candidates(key).map(|b| table.bucket(b));
        let scratch = self.info.base + SLOT_HEADER;
        let read = |b: u64, at: u64| WorkRequest::Read {
            remote: self.remote(b),
            local: self.local(at),
            len: BUCKET_BYTES as u32,
        };
        let reads = [read(b1, scratch), read(b2, scratch + BUCKET_BYTES)];
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
        self.read_found(co, key, item, deadline).await
    }

    /// READs node after node (one round trip each), then the item.
    async fn list_one_sided<E: Endpoint + 'static>(
        &self,
        co: &Co<E>,
        head: u64,
        key: u64,
        max_len: u32,
        deadline: u64,
    ) -> GetResult {
        let server = self.svc.cfg.server;
        let scratch = self.info.base + SLOT_HEADER;
        let mut node = head;
        for _ in 0..max_len {
            if node == NULL {
                break;
            }
            let read = WorkRequest::Read {
                remote: self.remote(node),
                local: self.local(scratch),
                len: NODE_BYTES as u32,
            };
            let Ok(t) = co.issue(Qp::to(server), &[read]) else { return GetResult::TimedOut };
            if co.wait(t).await.is_err() || co.now_ns() > deadline {
                return GetResult::TimedOut;
            }
            let mut w = [0u64; 4];
            self.region.read_words(scratch, &mut w);
            if w[1] == node_key_word(key) {
                return self.read_found(co, key, Sge::from_words(w[2], w[3]), deadline).await;
            }
            node = w[0];
        }
        self.region.store(scratch, 0);
        GetResult::Absent
    }
}

/// The CPU lookup on the server's hash table, for checks after a run.
pub fn cpu_get<B: Backend>(backend: &B, svc: &KvService, key: u64) -> Option<Vec<u8>> {
    let Data::Hash(table) = svc.data else { return None };
    let region = backend.region(svc.cfg.server, table.rkey)?;
    lookup(&region, table, key)
}

/// The CPU traversal of the server's list at `head`, for checks after a run.
pub fn cpu_get_in_list<B: Backend>(
    backend: &B,
    svc: &KvService,
    head: u64,
    key: u64,
) -> Option<Vec<u8>> {
    let (Data::List(lists), Structure::List { max_len, .. }) = (svc.data, svc.cfg.structure) else {
        return None;
    };
    let region = backend.region(svc.cfg.server, lists.rkey)?;
    crate::list::lookup(&region, head, key, max_len as usize)
}
