//! Semantics of the verb-program constructs on the simulated cx5 NIC, on small inputs:
//! both branches of an `if`, what a managed queue fetches and when, prefetch staleness
//! of an unmanaged queue, recycled rounds and their bound, an unrolled search with and
//! without `break`, and programs refused before anything is posted.

use std::sync::Arc;

use hytra_fabric::sim::profile::NicProfile;
use hytra_fabric::sim::{SimCluster, SimConfig};
use hytra_fabric::wq::{field, header, Sge, WqCounters, WqId, WqOpcode, Wqe, ID_MAX};
use hytra_fabric::{
    Backend, ClusterShape, Endpoint, LocalAddr, NodeId, Region, RegionSpec, Rkey, RunLimits,
};
use hytra_offload::program::{Installed, Program, ProgramError, Q};
use hytra_rt::{run_workers_with, RtConfig};

const SERVER: NodeId = NodeId(0);
const CODE_CHUNK: u64 = 16 * 1024;
/// Word offsets in the data region.
const INPUT: u64 = 0;
const MARKER: u64 = 8;
const RESULT: u64 = 16;
const COUNTER: u64 = 24;
const ARRAY: u64 = 64;

/// A WRITE of the marker word into the result word.
fn write_marker(dkey: Rkey) -> Wqe {
    let marker = LocalAddr { rkey: dkey, offset: MARKER };
    Wqe::Write { local: Sge { addr: marker, len: 8 }, remote_key: dkey, remote: RESULT }
}

/// An FAA of 1 on the counter word.
fn count(dkey: Rkey) -> Wqe {
    let at = LocalAddr { rkey: dkey, offset: COUNTER };
    Wqe::Faa { local: Sge { addr: at, len: 0 }, remote_key: dkey, remote: COUNTER, add: 1 }
}

/// A two-node cx5 cluster with a data region and a code area on node 0.
struct Rig {
    sim: SimCluster,
    data: Region,
    dkey: Rkey,
    code_key: Rkey,
    programs: u64,
    next_wq: u32,
}

impl Rig {
    fn new() -> Rig {
        let shape = ClusterShape { nodes: 2, workers_per_node: 1, lanes_per_peer: 1 };
        let mut cfg = SimConfig::new(shape, 7);
        cfg.profile = NicProfile::cx5();
        let mut sim = SimCluster::new(cfg).unwrap();
        let dkey = sim.register(SERVER, RegionSpec::new(4096)).unwrap();
        let code_key = sim.register(SERVER, RegionSpec::new(8 * CODE_CHUNK)).unwrap();
        let data = sim.region(SERVER, dkey).unwrap();
        data.store(MARKER, 0xBEEF);
        Rig { sim, data, dkey, code_key, programs: 0, next_wq: 0 }
    }

    fn at(&self, offset: u64) -> LocalAddr {
        LocalAddr { rkey: self.dkey, offset }
    }

    fn build(
        &self,
        emit: impl Fn(&mut Program) -> Result<(), ProgramError>,
    ) -> Result<Installed, ProgramError> {
        let code = LocalAddr { rkey: self.code_key, offset: self.programs * CODE_CHUNK };
        Program::build(SERVER, code, CODE_CHUNK, WqId(self.next_wq), emit)
    }

    /// Builds, creates the queues and writes the program.
    fn install(&mut self, emit: impl Fn(&mut Program) -> Result<(), ProgramError>) -> Installed {
        let installed = self.build(emit).expect("a well-formed program");
        for spec in installed.specs() {
            assert_eq!(self.sim.create_wq(SERVER, spec).unwrap(), WqId(self.next_wq));
            self.next_wq += 1;
        }
        installed.write(&self.sim.region(SERVER, self.code_key).unwrap());
        self.programs += 1;
        installed
    }

    /// Rings the doorbells of `start` (in order), then sends `messages` from node 1, one
    /// every 20 us, and runs until everything is quiet.
    fn run(&mut self, start: &[WqId], messages: &[(WqId, u64)]) {
        let (start, messages) = (Arc::new(start.to_vec()), Arc::new(messages.to_vec()));
        let end = 20_000 * (messages.len() as u64 + 2);
        run_workers_with(
            &mut self.sim,
            RtConfig::default(),
            RunLimits { time_limit_ns: end + 100_000 },
            |w| {
                let co = w.co();
                if co.me().node == SERVER {
                    co.with_ep(|ep| {
                        for &q in start.iter() {
                            ep.wq_doorbell(q).unwrap();
                        }
                    });
                } else {
                    let messages = messages.clone();
                    w.spawn(move |co| async move {
                        for (i, &(q, word)) in messages.iter().enumerate() {
                            co.sleep_until(20_000 * (i as u64 + 1)).await;
                            co.with_ep(|ep| ep.trigger(SERVER, q, &word.to_le_bytes())).unwrap();
                        }
                        // The run lasts while a worker does: let the NIC finish.
                        co.sleep_until(end).await;
                    });
                }
            },
            |_, _| (),
        )
        .unwrap();
    }

    fn counters(&self, q: WqId) -> WqCounters {
        self.sim.wq_counters(SERVER, q).unwrap()
    }

    fn assert_no_errors(&self, prog: &Installed) {
        for i in 0..prog.specs().len() {
            assert_eq!(self.counters(prog.wq(Q(i))).error, None, "queue {i}");
        }
    }
}

/// `if (input == y) WRITE marker`: a READ brings the input into the body's id field, the
/// `if` CASes the body into a WRITE and only then ENABLEs its queue. With
/// `enable_early`, the body's queue is ENABLEd before the CAS instead.
fn if_program(
    dkey: Rkey,
    y: u64,
    enable_early: bool,
) -> impl Fn(&mut Program) -> Result<(), ProgramError> {
    move |p: &mut Program| {
        let ctl = p.queue(SERVER, false, 0);
        let body_q = p.queue(SERVER, true, 0);
        let body = p.body(body_q, write_marker(dkey));
        let dest = p.field(body, field::HEADER);
        let read = Wqe::Read { local: Sge { addr: dest, len: 8 }, remote_key: dkey, remote: INPUT };
        p.push(ctl, read, true);
        p.wait_all(ctl, ctl);
        if enable_early {
            p.enable_all(ctl, body_q);
        }
        p.if_eq(ctl, body, y, WqOpcode::Write, false)
    }
}

#[test]
fn an_if_runs_its_body_only_when_the_operands_are_equal() {
    for (x, y, taken) in [(5, 5, true), (5, 6, false), (ID_MAX, ID_MAX, true), (0, 1, false)] {
        let mut rig = Rig::new();
        rig.data.store(INPUT, header(WqOpcode::Noop, 0, x));
        let prog = rig.install(if_program(rig.dkey, y, false));
        rig.run(&[prog.wq(Q(0))], &[]);
        let want = if taken { 0xBEEF } else { 0 };
        assert_eq!(rig.data.load(RESULT), want, "x={x} y={y}");
        let body = rig.counters(prog.wq(Q(1)));
        assert_eq!((body.executed, body.error), (1, None), "the body ran once, as NOOP or WRITE");
        rig.assert_no_errors(&prog);
    }
}

#[test]
fn a_managed_queue_runs_what_it_fetched_when_enabled() {
    // ENABLEd before the CAS, the body is fetched as a NOOP and stays one even though
    // memory holds a WRITE by the time it runs.
    let mut rig = Rig::new();
    rig.data.store(INPUT, header(WqOpcode::Noop, 0, 5));
    let prog = rig.install(if_program(rig.dkey, 5, true));
    rig.run(&[prog.wq(Q(0))], &[]);
    assert_eq!(rig.data.load(RESULT), 0, "the stale NOOP ran");
    let body_header = prog.field(hytra_offload::program::Wr { q: Q(1), index: 0 }, field::HEADER);
    let code = rig.sim.region(SERVER, body_header.rkey).unwrap();
    assert_eq!(
        code.load(body_header.offset) & 0xFF,
        WqOpcode::Write as u64,
        "memory was rewritten"
    );
}

#[test]
fn an_unmanaged_queue_runs_the_entries_it_prefetched() {
    // U waits for the CAS that rewrites its second entry into a WRITE, but it copied
    // that entry at the doorbell.
    let mut rig = Rig::new();
    let write = write_marker(rig.dkey);
    let prog = rig.install(move |p| {
        let u = p.queue(SERVER, false, 0);
        let ctl = p.queue(SERVER, false, 0);
        let ctl_wq = p.wq(ctl);
        p.push(u, Wqe::Wait { target: ctl_wq, count: 1, recv: false }, false);
        let e = p.body(u, write);
        let at = p.field(e, field::HEADER);
        let (compare, swap) = (header(WqOpcode::Noop, 0, 0), header(WqOpcode::Write, 0, 0));
        let cas = Wqe::Cas {
            local: Sge { addr: at, len: 0 },
            remote_key: at.rkey,
            remote: at.offset,
            compare,
            swap,
        };
        p.push(ctl, cas, true);
        Ok(())
    });
    rig.run(&[prog.wq(Q(0)), prog.wq(Q(1))], &[]);
    assert_eq!(rig.data.load(RESULT), 0);
    assert_eq!(rig.counters(prog.wq(Q(0))).executed, 2, "the WAIT released and the NOOP ran");
}

/// A recycled control queue K that waits for a message per round and adds the
/// message's word to the counter: in a separate queue it ENABLEs after the RECV
/// (`doorbell_order`), or in K itself, fetched with the round before the message came.
fn adder(dkey: Rkey, doorbell_order: bool) -> impl Fn(&mut Program) -> Result<(), ProgramError> {
    move |p: &mut Program| {
        let k = p.queue(SERVER, true, 2);
        let w = if doorbell_order { p.queue(SERVER, true, 0) } else { k };
        let kq = p.wq(k);
        let w_add = doorbell_order.then(|| p.push(w, count(dkey), true));
        p.begin_round(k)?;
        p.push(k, Wqe::Wait { target: kq, count: 1, recv: true }, false);
        let add = match w_add {
            Some(add) => {
                p.enable_all(k, w);
                p.wait_all(k, w);
                add
            }
            None => p.push(k, count(dkey), true),
        };
        p.end_round(k)?;
        let at = p.field(add, field::OPERAND_A);
        p.post_recv(k, &[Sge { addr: at, len: 8 }])
    }
}

#[test]
fn a_recycled_round_runs_once_per_message_and_no_more() {
    let words = [3u64, 5, 7, 11, 13];
    for doorbell_order in [true, false] {
        let mut rig = Rig::new();
        let prog = rig.install(adder(rig.dkey, doorbell_order));
        let k = prog.wq(Q(0));
        let messages: Vec<_> = words.iter().map(|&w| (k, w)).collect();
        rig.run(&[k], &messages);
        let c = rig.counters(k);
        assert_eq!((c.recv_completions, c.rnr_drops, c.error), (5, 0, None));
        // Six rounds started; the sixth waits for a message that never comes.
        let round = u64::from(prog.specs()[0].slots);
        assert_eq!(c.executed, 5 * round + 1);
        let sum = if doorbell_order {
            words.iter().sum::<u64>()
        } else {
            // Each round adds what its fetch saw: the program's 1, then the message
            // before its own.
            1 + words[..4].iter().sum::<u64>()
        };
        assert_eq!(rig.data.load(COUNTER), sum, "doorbell order {doorbell_order}");
        rig.assert_no_errors(&prog);
    }
}

/// An unrolled search over `items` for `y`: iteration i READs item i into the id field
/// of gate i (an ENABLE of iteration i+1 on the gate queue), counts itself, and with
/// `brk` turns the gate into a NOOP when it holds `y`.
fn search(
    dkey: Rkey,
    items: usize,
    y: u64,
    brk: bool,
) -> impl Fn(&mut Program) -> Result<(), ProgramError> {
    move |p: &mut Program| {
        let start = p.queue(SERVER, false, 0);
        let l = p.queue(SERVER, true, 0);
        let g = p.queue(SERVER, true, 0);
        let gates: Vec<_> = (0..items).map(|_| p.reserve(g)).collect();
        let mut ends = Vec::new();
        for (i, &gate) in gates.iter().enumerate() {
            let dest = p.field(gate, field::HEADER);
            let remote = ARRAY + 8 * i as u64;
            p.push(
                l,
                Wqe::Read { local: Sge { addr: dest, len: 8 }, remote_key: dkey, remote },
                true,
            );
            p.wait_all(l, l);
            if brk {
                p.brk(l, gate, y)?;
                p.wait_all(l, l);
            }
            p.push(l, count(dkey), true);
            p.push(l, Wqe::Enable { target: p.wq(g), count: gate.index + 1 }, false);
            ends.push(p.len(l));
        }
        let lq = p.wq(l);
        for (i, &gate) in gates.iter().enumerate() {
            let next = ends.get(i + 1).copied().unwrap_or(ends[i]);
            p.set(gate, Wqe::Enable { target: lq, count: next }, false, 0)?;
        }
        p.push(start, Wqe::Enable { target: lq, count: ends[0] }, false);
        Ok(())
    }
}

#[test]
fn an_unrolled_search_stops_at_its_break() {
    let items = [3u64, 7, 9, 7, 2];
    for (y, brk, iterations) in
        [(9, true, 3), (7, true, 2), (3, true, 1), (42, true, 5), (9, false, 5)]
    {
        let mut rig = Rig::new();
        for (i, &v) in items.iter().enumerate() {
            rig.data.store(ARRAY + 8 * i as u64, header(WqOpcode::Enable, 0, v));
        }
        let prog = rig.install(search(rig.dkey, items.len(), y, brk));
        rig.run(&[prog.wq(Q(0))], &[]);
        assert_eq!(rig.data.load(COUNTER), iterations, "y={y} break={brk}");
        rig.assert_no_errors(&prog);
    }
}

#[test]
fn malformed_programs_are_refused_before_posting() {
    let rig = Rig::new();
    let write = write_marker(rig.dkey);
    let refuse =
        |emit: &dyn Fn(&mut Program) -> Result<(), ProgramError>| rig.build(emit).unwrap_err();
    // An operand that does not fit the id field.
    let e = refuse(&|p| {
        let (ctl, b) = (p.queue(SERVER, false, 0), p.queue(SERVER, true, 0));
        let body = p.body(b, write);
        p.if_eq(ctl, body, ID_MAX + 1, WqOpcode::Write, false)
    });
    assert_eq!(e, ProgramError::OperandTooLarge(ID_MAX + 1));
    // A body the NIC could prefetch before the CAS rewrites it.
    let e = refuse(&|p| {
        let (ctl, b) = (p.queue(SERVER, false, 0), p.queue(SERVER, false, 0));
        let body = p.body(b, write);
        p.if_eq(ctl, body, 1, WqOpcode::Write, false)
    });
    assert!(matches!(e, ProgramError::NotManaged(_)), "{e:?}");
    // A WAIT for completions the program never produces.
    let e = refuse(&|p| {
        let q = p.queue(SERVER, false, 0);
        let wq = p.wq(q);
        p.push(q, Wqe::Wait { target: wq, count: 3, recv: false }, false);
        Ok(())
    });
    assert!(matches!(e, ProgramError::WaitNeverSatisfied(_, 3, 0)), "{e:?}");
    // More scatter entries than a RECV has.
    let e = refuse(&|p| {
        let q = p.queue(SERVER, true, 1);
        let sge = Sge { addr: rig.at(0), len: 8 };
        p.post_recv(q, &[sge; 16])
    });
    assert_eq!(e, ProgramError::TooManyScatters(16));
    // An entry reserved and never written.
    let e = refuse(&|p| {
        let q = p.queue(SERVER, false, 0);
        p.reserve(q);
        Ok(())
    });
    assert!(matches!(e, ProgramError::Unset(_)), "{e:?}");
    // A round that never ends.
    let e = refuse(&|p| {
        let q = p.queue(SERVER, true, 0);
        p.begin_round(q)
    });
    assert!(matches!(e, ProgramError::Round(0, _)), "{e:?}");
    // A round that rewrites a member's counts before that member has run.
    let e = refuse(&|p| {
        let (k, w) = (p.queue(SERVER, true, 0), p.queue(SERVER, true, 0));
        p.push(w, write, true);
        p.wait_all(w, w);
        p.begin_round(k)?;
        p.enable_all(k, w);
        p.end_round(k)
    });
    assert!(matches!(e, ProgramError::Round(0, _)), "{e:?}");
    // A run that did not reserve the FAAs that advance it.
    let e = refuse(&|p| {
        let w = p.queue(SERVER, true, 0);
        p.begin_run(w)?;
        p.push(w, write, true);
        p.wait_all(w, w);
        p.end_run(w, &[])
    });
    assert!(matches!(e, ProgramError::Round(0, m) if m.contains("advance_here")), "{e:?}");
    // A run advanced through an entry that does not enable it.
    let e = refuse(&|p| {
        let (k, w) = (p.queue(SERVER, true, 0), p.queue(SERVER, true, 0));
        let not_an_enable = p.push(k, write, false);
        p.begin_run(w)?;
        p.push(w, write, true);
        p.advance_here(w)?;
        p.end_run(w, &[not_an_enable])
    });
    assert!(matches!(e, ProgramError::Round(1, m) if m.contains("enabled_by")), "{e:?}");
    // A run queue as a member of a round (the round would advance it a second time).
    let e = refuse(&|p| {
        let (k, w) = (p.queue(SERVER, true, 0), p.queue(SERVER, true, 0));
        p.begin_run(w)?;
        p.push(w, write, true);
        p.advance_here(w)?;
        p.begin_round(k)?;
        let enable = p.enable_all(k, w);
        p.wait_all(k, w);
        p.end_run(w, &[enable])?;
        p.end_round(k)
    });
    assert!(matches!(e, ProgramError::Round(0, m) if m.contains("run queue")), "{e:?}");
    // A program larger than its code area.
    let e = refuse(&|p| {
        let q = p.queue(SERVER, false, 0);
        for _ in 0..CODE_CHUNK / 64 {
            p.push(q, Wqe::Noop, false);
        }
        Ok(())
    });
    assert!(matches!(e, ProgramError::CodeAreaTooSmall(..)), "{e:?}");
}
