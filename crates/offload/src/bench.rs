//! The `hytra offload` scenarios: get latency and throughput of offloaded, one-sided and
//! two-sided gets on the simulator (`cx5`), under background writers that keep the
//! server CPU busy, and with the server's CPUs stopped mid-run.
//!
//! Node 0 is the server (worker 0 serves RPCs), node 1 holds the get clients, node 2 (if
//! there are writers) the background writers. Every answer is checked against the CPU
//! lookup of the same table: a wrong answer is counted, never hidden.
//!
//! With [`Scenario::list`], the keys live in linked lists instead of a hash table, and a
//! get names a list and a key at a random position below the scenario's range.

use std::cell::RefCell;
use std::rc::Rc;

use hytra_fabric::rng::Rng;
use hytra_fabric::sim::faults::{NodeFault, NodeFaultKind};
use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::{
    Backend, BackendError, ClusterShape, LocalAddr, NodeId, Qp, RemoteAddr, RunLimits, WorkRequest,
    WorkerId,
};
use hytra_rt::hist::Histogram;
use hytra_rt::{run_workers_with, RtConfig};

use crate::hash::{HashTable, ITEM_HEADER};
use crate::list::ListStore;
use crate::service::{GetMode, GetResult, KvConfig, KvService, Search, Structure, PUT_RPC};

/// How a scenario's clients get.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub enum Path {
    /// Offloaded to the server's NIC (in a list: the loop without `break`; the search
    /// must be sequential).
    Offload(Search),
    /// Offloaded list traversal whose loop ends at the match (lists only).
    OffloadBreak,
    /// Two READ round trips.
    OneSided,
    /// RPC to the server CPU.
    TwoSided,
    /// One READ of the item at a known address: the one-round-trip ideal.
    Read,
}

impl Path {
    /// Short name for tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Path::Offload(Search::Sequential) => "offload",
            Path::Offload(Search::Parallel) => "offload-par",
            Path::OffloadBreak => "offload+break",
            Path::OneSided => "one-sided",
            Path::TwoSided => "two-sided",
            Path::Read => "read",
        }
    }
}

/// One scenario.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Scenario {
    /// How clients get.
    pub path: Path,
    /// Value bytes of every item (a multiple of 8).
    pub value_bytes: u32,
    /// Keys in the table (1..=keys).
    pub keys: u64,
    /// Put every key in its second candidate bucket (the worst case of a lookup).
    pub second_bucket: bool,
    /// Client workers, and outstanding gets (slots) per worker.
    pub clients: u16,
    /// Outstanding gets per client worker.
    pub depth: u32,
    /// Background writers (each keeps one put outstanding to the server CPU).
    pub writers: u16,
    /// Measured time, virtual ns.
    pub duration_ns: u64,
    /// Stop the server node's CPUs (not its NIC) at this time.
    pub pause_server_at_ns: Option<u64>,
    /// One get in this many asks for an absent key (0: never).
    pub absent_one_in: u64,
    /// Keys in linked lists instead of a hash table.
    pub list: Option<ListShape>,
    /// Seed.
    pub seed: u64,
}

/// Lists of a list scenario: keys `1..=keys` in lists of `len` nodes, in order.
#[derive(Copy, Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub struct ListShape {
    /// Nodes per list (also the iterations of the offloaded loop).
    pub len: u32,
    /// A get asks for the key at a uniform position below this (RedN's "range").
    pub range: u32,
}

impl Scenario {
    /// A latency scenario: one client, one get at a time.
    pub fn latency(path: Path, value_bytes: u32) -> Scenario {
        Scenario {
            path,
            value_bytes,
            keys: 256,
            second_bucket: false,
            clients: 1,
            depth: 1,
            writers: 0,
            duration_ns: 2_000_000,
            pause_server_at_ns: None,
            absent_one_in: 0,
            list: None,
            seed: 1,
        }
    }

    /// A list latency scenario: one client, 64 B values, lists of `len` nodes, keys at
    /// positions below `range`.
    pub fn list_latency(path: Path, len: u32, range: u32) -> Scenario {
        let mut s = Scenario::latency(path, 64);
        s.list = Some(ListShape { len, range });
        s.keys = u64::from(len) * 32;
        s
    }
}

/// What a scenario measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Outcome {
    /// Gets answered (found or absent).
    pub gets: u64,
    /// Of them, absent keys.
    pub absent: u64,
    /// Gets with no answer before their deadline.
    pub timeouts: u64,
    /// Answers that differ from the CPU lookup (must be 0).
    pub wrong: u64,
    /// Gets answered after the server's CPUs stopped.
    pub gets_after_pause: u64,
    /// Puts the writers completed.
    pub puts: u64,
    /// Mean get latency, ns.
    pub mean_ns: u64,
    /// Median get latency, ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// Gets per second of virtual time.
    pub gets_per_sec: f64,
    /// Work-queue entries the server's NIC executed for offloaded gets.
    pub nic_entries: u64,
    /// The window measured, virtual ns (longer than the scenario asked for when
    /// [`run_settled`] had to lengthen it).
    pub window_ns: u64,
    /// The window the scenario asked for, when [`run_settled`] lengthened it.
    pub extended_from_ns: Option<u64>,
}

/// Why a scenario could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The simulated cluster could not be set up or run.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Even the longest window allowed was too short for its gets
    /// ([`hytra_rt::window::settled`]).
    #[error(
        "the window is too short to measure: {gets} gets answered in {window_ns} ns (at least {min} and a window of twice the p99 latency, {p99_ns} ns, are needed); give a longer window",
        min = hytra_rt::window::SETTLED_OPS_MIN
    )]
    Unsettled {
        /// Gets answered in the last window tried.
        gets: u64,
        /// That window, virtual ns.
        window_ns: u64,
        /// Its p99 latency.
        p99_ns: u64,
    },
}

/// [`run`] over a window long enough for it: when a run's gets do not settle its window
/// ([`hytra_rt::window::settled`]), runs it again with the window (and the server's pause,
/// if any) lengthened ([`hytra_rt::window::extend`]), up to a window of `window_max_ns`;
/// then refuses it. A settled first run is returned as it is.
pub fn run_settled(s: &Scenario, window_max_ns: u64) -> Result<Outcome, ScenarioError> {
    use hytra_rt::window;
    let asked = s.duration_ns;
    let measured = window::until_settled(asked, window_max_ns, |w| {
        let s2 = Scenario {
            duration_ns: w,
            // The pause stays at the same share of the window.
            pause_server_at_ns: s.pause_server_at_ns.map(|at| window::scaled(at, asked, w)),
            ..s.clone()
        };
        let o = run(&s2)?;
        let held = window::Held { ops: o.gets, window_ns: o.window_ns, p99_ns: o.p99_ns };
        Ok::<_, ScenarioError>((o, held))
    })?;
    match measured {
        Ok((mut o, reruns)) => {
            o.extended_from_ns = (reruns > 0).then_some(asked);
            Ok(o)
        }
        Err(h) => {
            Err(ScenarioError::Unsettled { gets: h.ops, window_ns: h.window_ns, p99_ns: h.p99_ns })
        }
    }
}

/// The value stored under `key`: its bytes repeated.
pub fn value_of(key: u64, len: u32) -> Vec<u8> {
    key.to_le_bytes().iter().cycle().take(len as usize).copied().collect()
}

/// The largest value a get fetches: the item, header included, is one READ.
pub const VALUE_MAX: u32 = (hytra_fabric::constants::TRANSFER_MAX - ITEM_HEADER) as u32;

/// Refuses values no get can fetch, and a scenario without keys or clients.
fn check_values(s: &Scenario) -> Result<(), BackendError> {
    if s.value_bytes == 0 || s.value_bytes % 8 != 0 || s.keys == 0 || s.clients == 0 {
        return Err(BackendError::Config(format!(
            "value size {} must be a positive multiple of 8, with keys and clients",
            s.value_bytes
        )));
    }
    if s.value_bytes > VALUE_MAX {
        return Err(BackendError::Config(format!(
            "value size {} B: at most {VALUE_MAX} B (an item and its header are one READ)",
            s.value_bytes
        )));
    }
    Ok(())
}

/// Runs a scenario on a fresh `cx5` simulated cluster.
#[allow(
    clippy::too_many_lines,
    reason = "longer than the limit before the limit was set; split it when it next changes"
)]
pub fn run(s: &Scenario) -> Result<Outcome, BackendError> {
    check_values(s)?;
    let bad = |m: &str| Err(BackendError::Config(m.into()));
    match (s.path, s.list) {
        (Path::OffloadBreak, None) => return bad("offload+break traverses lists"),
        (Path::Offload(Search::Parallel), Some(_)) => return bad("a list has no parallel search"),
        (_, Some(l)) if l.len == 0 || l.range == 0 || l.range > l.len => {
            return bad("a list scenario needs 0 < range <= len")
        }
        (_, Some(l)) if s.keys % u64::from(l.len) != 0 => {
            return bad("list scenario keys must fill whole lists")
        }
        _ => {}
    }
    let nodes = if s.writers > 0 { 3 } else { 2 };
    let per_node = s.clients.max(s.writers).max(1);
    let shape = ClusterShape { nodes, workers_per_node: per_node, lanes_per_peer: 1 };
    let mut cfg = SimConfig::new(shape, s.seed);
    cfg.profile = NicProfile::cx5();
    if let Some(at) = s.pause_server_at_ns {
        cfg.faults.node_faults.push(NodeFault {
            node: NodeId(0),
            at_ns: at,
            // Longer than any run: the CPUs never come back.
            kind: NodeFaultKind::Pause { for_ns: 1_000_000_000_000 },
        });
    }
    let mut sim = SimCluster::new(cfg)?;
    let search = match s.path {
        Path::Offload(search) => search,
        _ => Search::Sequential,
    };
    let item = u64::from(s.value_bytes) + ITEM_HEADER;
    let writer_keys = if s.writers > 0 { 64 } else { 0 };
    let structure = match s.list {
        None => Structure::Hash { buckets: (s.keys + writer_keys) * 4, search },
        Some(l) => Structure::List {
            nodes: s.keys + writer_keys + 1,
            max_len: l.len,
            brk: s.path == Path::OffloadBreak,
        },
    };
    let kv = KvConfig {
        server: NodeId(0),
        structure,
        item_bytes: (s.keys + writer_keys) * item.max(64),
        value_max: s.value_bytes,
        slots_per_worker: s.depth,
        server_op_ns: 1_000,
    };
    // Per key (1-based), its item's offset; per list, its head.
    let mut items = Vec::new();
    let mut heads = Vec::new();
    let svc = match s.list {
        None => KvService::setup(&mut sim, kv, |t: &mut HashTable| {
            for k in 1..=s.keys + writer_keys {
                let which = s.second_bucket.then_some(1);
                t.insert_in(k, &value_of(k, s.value_bytes), which)?;
            }
            for k in 1..=s.keys {
                items.push(t.item_of(k).expect("inserted"));
            }
            Ok(())
        })?,
        Some(l) => KvService::setup_list(&mut sim, kv, |store: &mut ListStore| {
            let len = u64::from(l.len);
            for first in (1..=s.keys).step_by(len as usize) {
                let list: Vec<_> =
                    (first..first + len).map(|k| (k, value_of(k, s.value_bytes))).collect();
                let head = store.push_list(&list)?;
                for pos in 0..l.len as usize {
                    items.push(store.item_at(head, pos).expect("stored"));
                }
                heads.push(head);
            }
            Ok(())
        })?,
    };
    if matches!(s.path, Path::Offload(_) | Path::OffloadBreak) && !svc.offload_available() {
        return Err(BackendError::Config("this backend cannot run verb programs".into()));
    }
    let table_key = svc.data_key();
    let end_ns = s.duration_ns;
    let limit = end_ns + 2_000_000;
    // Latencies, counts, and the sum of the latencies (for the mean).
    type Rec = (Histogram, Outcome, u64);
    let results: Vec<Rec> = run_workers_with(
        &mut sim,
        RtConfig::default(),
        RunLimits { time_limit_ns: limit },
        |w| {
            let me = w.co().me();
            let out: Rc<RefCell<Rec>> = Rc::default();
            match me.node.0 {
                // Serve past the end so that gets started before it are answered.
                0 if me.index == 0 => svc.serve(w, 4, end_ns + 1_000_000),
                1 if me.index < s.clients => {
                    let waits = hytra_rt::Waits::default();
                    w.poll_with(waits.poller());
                    for slot in 0..s.depth {
                        let (svc, waits, out, items, heads) =
                            (svc.clone(), waits.clone(), out.clone(), items.clone(), heads.clone());
                        let s = s.clone();
                        w.spawn(move |co| async move {
                            let mut client = svc.client(&co, &waits, slot);
                            let stream = u64::from(me.index) << 32 | u64::from(slot);
                            let mut rng = Rng::derive(s.seed, stream);
                            let scratch = client.slot_buffer();
                            let region = co.region(scratch.rkey).expect("slots");
                            while co.now_ns() < end_ns {
                                let absent = s.absent_one_in > 0 && rng.below(s.absent_one_in) == 0;
                                let (key, head) = pick_key(&s, &heads, &mut rng, absent);
                                let t0 = co.now_ns();
                                let mode = match s.path {
                                    Path::Offload(_) | Path::OffloadBreak => GetMode::Offload,
                                    Path::OneSided => GetMode::OneSided,
                                    _ => GetMode::TwoSided,
                                };
                                let r = match (s.path, head) {
                                    (Path::Read, _) => {
                                        read_item_once(
                                            &co,
                                            &region,
                                            table_key,
                                            &items,
                                            key,
                                            scratch,
                                            s.value_bytes,
                                        )
                                        .await
                                    }
                                    (_, None) => client.get(&co, mode, key, 200_000).await,
                                    (_, Some(head)) => {
                                        client.get_in_list(&co, mode, head, key, 200_000).await
                                    }
                                };
                                let t1 = co.now_ns();
                                let answered = !matches!(r, GetResult::TimedOut);
                                let mut o = out.borrow_mut();
                                let want =
                                    if absent { None } else { Some(value_of(key, s.value_bytes)) };
                                match r {
                                    GetResult::TimedOut => o.1.timeouts += 1,
                                    GetResult::Found(v) => {
                                        o.1.wrong += u64::from(want.as_deref() != Some(&v[..]));
                                        o.1.gets += 1;
                                        o.0.record(t1 - t0);
                                        o.2 += t1 - t0;
                                    }
                                    GetResult::Absent => {
                                        o.1.wrong += u64::from(want.is_some());
                                        o.1.gets += 1;
                                        o.1.absent += 1;
                                        o.0.record(t1 - t0);
                                        o.2 += t1 - t0;
                                    }
                                }
                                if s.pause_server_at_ns.is_some_and(|p| t0 >= p) && answered {
                                    o.1.gets_after_pause += 1;
                                }
                            }
                        });
                    }
                }
                2 if me.index < s.writers => {
                    let out = out.clone();
                    let value = vec![0xAB; 64];
                    let seed = s.seed;
                    let keys = s.keys;
                    w.spawn(move |co| async move {
                        let mut rng = Rng::derive(seed, 0x5717 + u64::from(me.index));
                        let server = WorkerId { node: NodeId(0), index: 0 };
                        while co.now_ns() < end_ns {
                            let key = keys + 1 + rng.below(writer_keys);
                            let mut msg = key.to_le_bytes().to_vec();
                            msg.extend_from_slice(&value);
                            let Ok(t) = co.call(server, PUT_RPC, &msg) else {
                                co.yield_now().await;
                                continue;
                            };
                            if co.reply(t, |_| ()).await.is_ok() {
                                out.borrow_mut().1.puts += 1;
                            }
                        }
                    });
                }
                _ => {}
            }
            out
        },
        |_w, out| Rc::try_unwrap(out).map(RefCell::into_inner).unwrap_or_default(),
    )?
    .0;
    let mut hist = Histogram::new();
    let mut o = Outcome::default();
    for (h, r, _) in &results {
        hist.merge(h);
        o.gets += r.gets;
        o.absent += r.absent;
        o.timeouts += r.timeouts;
        o.wrong += r.wrong;
        o.gets_after_pause += r.gets_after_pause;
        o.puts += r.puts;
    }
    let sum: u64 = results.iter().map(|r| r.2).sum();
    o.mean_ns = sum.checked_div(o.gets).unwrap_or(0);
    o.p50_ns = hist.quantile(0.5);
    o.p99_ns = hist.quantile(0.99);
    o.gets_per_sec = o.gets as f64 / (end_ns as f64 / 1e9);
    o.window_ns = end_ns;
    o.nic_entries = svc
        .queues()
        .iter()
        .filter_map(|q| sim.wq_counters(NodeId(0), *q))
        .map(|c| c.executed)
        .sum();
    Ok(o)
}

/// The key of a get, and the head of its list in a list scenario: an absent key is one
/// no list holds.
fn pick_key(s: &Scenario, heads: &[u64], rng: &mut Rng, absent: bool) -> (u64, Option<u64>) {
    let far = s.keys + 1_000 + rng.below(1 << 20);
    match s.list {
        None => (if absent { far } else { 1 + rng.below(s.keys) }, None),
        Some(l) => {
            let list = rng.below(heads.len() as u64);
            let pos = rng.below(u64::from(l.range));
            let key = if absent { far } else { 1 + list * u64::from(l.len) + pos };
            (key, Some(heads[list as usize]))
        }
    }
}

/// One READ of the item at its known address (the one-round-trip ideal).
async fn read_item_once<E: hytra_fabric::Endpoint + 'static>(
    co: &hytra_rt::Co<E>,
    region: &hytra_fabric::Region,
    table: hytra_fabric::Rkey,
    items: &[u64],
    key: u64,
    scratch: LocalAddr,
    value_bytes: u32,
) -> GetResult {
    let Some(&offset) = items.get(key as usize - 1) else { return GetResult::Absent };
    let len = value_bytes + ITEM_HEADER as u32;
    let read = WorkRequest::Read {
        remote: RemoteAddr { node: NodeId(0), rkey: table, offset },
        local: scratch,
        len,
    };
    let Ok(t) = co.issue(Qp::to(NodeId(0)), &[read]) else { return GetResult::TimedOut };
    if co.wait(t).await.is_err() {
        return GetResult::TimedOut;
    }
    GetResult::Found(crate::hash::read_item(region, scratch.offset))
}

/// What the `if`-construct benchmark measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct IfRate {
    /// Independent chains (each a control queue and a body queue).
    pub chains: u32,
    /// `if` constructs per chain, unrolled.
    pub ifs_per_chain: u32,
    /// Virtual time from the doorbells to the last body's completion, ns.
    pub elapsed_ns: u64,
    /// Constructs per second over all chains.
    pub ifs_per_sec: f64,
}

/// Runs `chains` independent chains of `ifs` unrolled `if` constructs on one `cx5` NIC
/// (RedN Table 3 reports 0.7 M/s on ConnectX-5). Each `if` is RedN's construct: a CAS on
/// the body's header, a WAIT for it and an ENABLE of the body (doorbell order); every
/// condition holds, so every body runs as a WRITE.
pub fn if_rate(chains: u32, ifs: u32, seed: u64) -> Result<IfRate, BackendError> {
    use crate::program::{Program, Q};
    use hytra_fabric::wq::{Sge, WqId, WqOpcode, Wqe};
    use hytra_fabric::{Endpoint, RegionSpec};
    if chains == 0 || ifs == 0 {
        return Err(BackendError::Config("an if-rate run needs chains and constructs".into()));
    }
    let shape = ClusterShape { nodes: 1, workers_per_node: 1, lanes_per_peer: 1 };
    let mut cfg = SimConfig::new(shape, seed);
    cfg.profile = NicProfile::cx5();
    let mut sim = SimCluster::new(cfg)?;
    let node = NodeId(0);
    let data = sim.register(node, RegionSpec::new(64))?;
    let code_len = u64::from(ifs) * 4 * 64 + 4096;
    let code = sim.register(node, RegionSpec::new(code_len * u64::from(chains)))?;
    let mut starts = Vec::new();
    let mut bodies = Vec::new();
    for c in 0..chains {
        let at = LocalAddr { rkey: code, offset: u64::from(c) * code_len };
        let first = WqId(2 * c);
        let installed = Program::build(node, at, code_len, first, |p| {
            let ctl = p.queue(node, false, 0);
            let body_q = p.queue(node, true, 0);
            let word = LocalAddr { rkey: data, offset: 0 };
            let write =
                Wqe::Write { local: Sge { addr: word, len: 8 }, remote_key: data, remote: 8 };
            for _ in 0..ifs {
                let body = p.body(body_q, write);
                p.if_eq(ctl, body, 0, WqOpcode::Write, true)?;
            }
            Ok(())
        })
        .map_err(|e| BackendError::Config(format!("if-rate program: {e}")))?;
        for spec in installed.specs() {
            sim.create_wq(node, spec)?;
        }
        installed.write(&sim.region(node, code).expect("registered"));
        starts.push(installed.wq(Q(0)));
        bodies.push(installed.wq(Q(1)));
    }
    let limit = 1_000_000_000;
    let done: Vec<u64> = run_workers_with(
        &mut sim,
        RtConfig::default(),
        RunLimits { time_limit_ns: limit },
        |w| {
            let (starts, bodies) = (starts.clone(), bodies.clone());
            let out = Rc::new(RefCell::new(0u64));
            let o = out.clone();
            w.spawn(move |co| async move {
                co.with_ep(|ep| {
                    for &q in &starts {
                        ep.wq_doorbell(q).expect("queue of this node");
                    }
                });
                let finished = |ep: &mut hytra_fabric::sim::SimEndpoint| {
                    bodies.iter().all(|&q| {
                        ep.wq_counters(q).is_some_and(|c| c.completions == u64::from(ifs))
                    })
                };
                // Poll every 100 ns of virtual time: fine enough for runs of tens of us.
                while !co.with_ep(finished) && co.now_ns() < limit / 2 {
                    co.sleep_until(co.now_ns() + 100).await;
                }
                *o.borrow_mut() = co.now_ns();
            });
            out
        },
        |_, out| *out.borrow(),
    )?
    .0;
    let elapsed_ns = done[0];
    if elapsed_ns >= limit / 2 {
        return Err(BackendError::Config("if-rate chains did not finish".into()));
    }
    let total = f64::from(chains) * f64::from(ifs);
    Ok(IfRate {
        chains,
        ifs_per_chain: ifs,
        elapsed_ns,
        ifs_per_sec: total / (elapsed_ns as f64 / 1e9),
    })
}
