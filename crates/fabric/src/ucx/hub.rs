//! The hub of a cluster of processes on one machine: `hytra cluster` runs it, and every
//! node, node 0 included, joins it as a member of the TCP bootstrap (see
//! [`super::bootstrap`] for the frames). Unlike a star around node 0, the hub is not a
//! node, so it outlives any of them: a member whose connection closes during the run is
//! dead, the run's end is judged on the survivors' datagrams alone
//! ([`Waves::observe_live`]), and the results go to the lowest survivor.
//!
//! The hub follows a benchmark run's exchanges in order: two all-gathers (addresses, then
//! what the fabric promises; the run starts after the second), the waves that end the
//! run, an all-gather (the barrier before the fabric's teardown), and one gather of the
//! results.
//! A member that dies before the run started fails the run.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::bootstrap::{
    decode_report, err, pack, pull, read_hello, read_u64_frame, refusal, report_bytes, send_small,
    unexpected, write_reply, write_u64_frame, ACCEPTED, PROBE, REFUSED, STOP,
};
use super::exchange::{Quiescence, Waves};
use crate::endpoint::BackendError;

/// Pause between two looks at the members during a run.
const POLL: Duration = Duration::from_micros(500);

/// The hub's listening socket, bound before the nodes start so they can be told where.
pub struct Hub {
    listener: TcpListener,
    nodes: u16,
    token: String,
    timeout: Duration,
}

/// How a run went, seen from the hub.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HubOutcome {
    /// Nodes whose process vanished during the run, in the order the hub noticed.
    pub dead: Vec<u16>,
}

/// One member's connection, while it lives.
struct Member {
    stream: Option<TcpStream>,
    inbox: Vec<u8>,
}

impl Hub {
    /// Listens on `addr` (port 0 picks a free one) for the `nodes` members of a cluster
    /// with `token`; `timeout` bounds joining and every blocking exchange.
    pub fn bind(
        addr: SocketAddr,
        nodes: u16,
        token: &str,
        timeout: Duration,
    ) -> Result<Hub, BackendError> {
        if nodes == 0 {
            return Err(err("a hub needs at least one node"));
        }
        let listener = TcpListener::bind(addr)
            .map_err(|e| err(format!("the hub cannot listen on {addr}: {e}")))?;
        Ok(Hub { listener, nodes, token: token.to_string(), timeout })
    }

    /// Where the members connect.
    pub fn addr(&self) -> Result<SocketAddr, BackendError> {
        self.listener.local_addr().map_err(|e| err(format!("the hub's address: {e}")))
    }

    /// Serves one benchmark run to its end. `started` is called once the run starts (so
    /// that faults can be timed from it); `stop` is polled and ends the hub early with an
    /// error when it says so.
    pub fn serve(
        self,
        started: impl FnOnce(Instant),
        stop: impl Fn() -> bool,
    ) -> Result<HubOutcome, BackendError> {
        let mut members = self.accept_all(&stop)?;
        let mut out = HubOutcome::default();
        // The addresses, then the fabric's promises: nobody may die before the run.
        for _ in 0..2 {
            self.relay(&mut members, &mut out, false)?;
            if !out.dead.is_empty() {
                return Err(err(format!("node {} died before the run started", out.dead[0])));
            }
        }
        started(Instant::now());
        self.waves(&mut members, &mut out, &stop)?;
        self.relay(&mut members, &mut out, true)?;
        self.gather(&mut members, &mut out)?;
        Ok(out)
    }

    fn accept_all(&self, stop: &impl Fn() -> bool) -> Result<Vec<Member>, BackendError> {
        self.listener.set_nonblocking(true).map_err(|e| err(format!("listener: {e}")))?;
        let deadline = Instant::now() + self.timeout;
        let mut members: Vec<Member> =
            (0..self.nodes).map(|_| Member { stream: None, inbox: Vec::new() }).collect();
        let mut joined = 0;
        while joined < self.nodes {
            if stop() {
                return Err(err("the hub was stopped while the nodes joined"));
            }
            match self.listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false).map_err(|e| err(format!("socket: {e}")))?;
                    s.set_read_timeout(Some(Duration::from_secs(10)))
                        .map_err(|e| err(format!("socket: {e}")))?;
                    s.set_nodelay(true).ok();
                    let (id, nodes, token) = match read_hello(&mut s) {
                        Ok(h) => h,
                        Err(e) => {
                            eprintln!("hub: ignored a connection from {from}: {e}");
                            continue;
                        }
                    };
                    let refusal = refusal(
                        (id, nodes, &token),
                        ("the hub", &self.token, 0..self.nodes),
                        |id| members[usize::from(id)].stream.is_some(),
                    );
                    if let Some(why) = refusal {
                        eprintln!("hub: refused a node from {from}: {why}");
                        let _ = write_reply(&mut s, REFUSED, why.as_bytes());
                        continue;
                    }
                    write_reply(&mut s, ACCEPTED, &[])
                        .map_err(|e| err(format!("node {id}: {e}")))?;
                    s.set_read_timeout(Some(self.timeout))
                        .map_err(|e| err(format!("socket: {e}")))?;
                    members[usize::from(id)].stream = Some(s);
                    joined += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        let missing: Vec<usize> =
                            (0..members.len()).filter(|&i| members[i].stream.is_none()).collect();
                        return Err(err(format!(
                            "nodes {missing:?} did not join the hub within {} s",
                            self.timeout.as_secs()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(err(format!("accept: {e}"))),
            }
        }
        Ok(members)
    }

    /// One all-gather: a frame from every live member, then all of them packed, in node
    /// order, back to each. With `tolerant`, a member that cannot be reached is dead;
    /// otherwise that ends the hub with an error.
    fn relay(
        &self,
        members: &mut [Member],
        out: &mut HubOutcome,
        tolerant: bool,
    ) -> Result<(), BackendError> {
        let mut all = Vec::new();
        for id in 0..members.len() {
            let Some(s) = members[id].stream.as_mut() else { continue };
            s.set_nonblocking(false).map_err(|e| err(format!("socket: {e}")))?;
            match read_u64_frame(s) {
                Ok(b) => all.push(b),
                Err(_) if tolerant => dies(members, out, id),
                Err(e) => return Err(err(format!("node {id}: {e}"))),
            }
        }
        let packed = pack(&all);
        for id in 0..members.len() {
            let Some(s) = members[id].stream.as_mut() else { continue };
            if let Err(e) = write_u64_frame(s, &packed) {
                if !tolerant {
                    return Err(err(format!("node {id}: {e}")));
                }
                dies(members, out, id);
            }
        }
        Ok(())
    }

    /// The run: probe every live member in waves until [`Waves::observe_live`] says the
    /// survivors are done and nothing is in flight between them; then stop them.
    fn waves(
        &self,
        members: &mut [Member],
        out: &mut HubOutcome,
        stop: &impl Fn() -> bool,
    ) -> Result<(), BackendError> {
        let report = report_bytes(self.nodes);
        let mut waves = Waves::default();
        let mut wave: Option<Vec<Option<Quiescence>>> = None;
        for m in members.iter_mut() {
            if let Some(s) = &m.stream {
                s.set_nonblocking(true).map_err(|e| err(format!("socket: {e}")))?;
            }
        }
        loop {
            if stop() {
                return Err(err("the hub was stopped during the run"));
            }
            for id in 0..members.len() {
                let Some(s) = members[id].stream.as_mut() else { continue };
                let inbox = &mut members[id].inbox;
                if pull(s, inbox).is_err() {
                    dies(members, out, id);
                    continue;
                }
                while inbox.len() >= report {
                    let q = decode_report(&inbox[..report])
                        .ok_or_else(|| err(format!("node {id}: {}", unexpected(inbox[0]))))?;
                    inbox.drain(..report);
                    match wave.as_mut() {
                        Some(w) => w[id] = Some(q),
                        None => return Err(err(format!("node {id} reported unasked"))),
                    }
                }
            }
            if out.dead.len() == members.len() {
                return Err(err("every node died"));
            }
            let live: Vec<bool> = members.iter().map(|m| m.stream.is_some()).collect();
            if let Some(w) = &wave {
                if live.iter().zip(w).all(|(&l, r)| !l || r.is_some()) {
                    let parts: Vec<Quiescence> = w
                        .iter()
                        .zip(&live)
                        .filter(|(_, &l)| l)
                        .filter_map(|(r, _)| r.clone())
                        .collect();
                    wave = None;
                    if waves.observe_live(&parts, &live) {
                        for id in 0..members.len() {
                            if let Some(s) = members[id].stream.as_mut() {
                                if send_small(s, &[STOP]).is_err() {
                                    dies(members, out, id);
                                }
                            }
                        }
                        return Ok(());
                    }
                }
            }
            if wave.is_none() {
                for id in 0..members.len() {
                    if let Some(s) = members[id].stream.as_mut() {
                        if send_small(s, &[PROBE]).is_err() {
                            dies(members, out, id);
                        }
                    }
                }
                wave = Some(vec![None; members.len()]);
            }
            std::thread::sleep(POLL);
        }
    }

    /// The results: a frame from every survivor; all of them go to the lowest one, and the
    /// others hear that they are not it.
    fn gather(&self, members: &mut [Member], out: &mut HubOutcome) -> Result<(), BackendError> {
        let mut all = Vec::new();
        for id in 0..members.len() {
            let Some(s) = members[id].stream.as_mut() else { continue };
            s.set_nonblocking(false).map_err(|e| err(format!("socket: {e}")))?;
            match read_u64_frame(s) {
                Ok(b) => all.push((id, b)),
                Err(_) => dies(members, out, id),
            }
        }
        let live: Vec<(usize, Vec<u8>)> =
            all.into_iter().filter(|(id, _)| members[*id].stream.is_some()).collect();
        let Some(&(reporter, _)) = live.first() else { return Err(err("every node died")) };
        let mut full = vec![1u8];
        full.extend_from_slice(&pack(&live.into_iter().map(|(_, b)| b).collect::<Vec<_>>()));
        for id in 0..members.len() {
            let Some(s) = members[id].stream.as_mut() else { continue };
            let reply: &[u8] = if id == reporter { &full } else { &[0] };
            if let Err(e) = write_u64_frame(s, reply) {
                if id == reporter {
                    return Err(err(format!("the results could not reach node {id}: {e}")));
                }
                dies(members, out, id);
            }
        }
        Ok(())
    }
}

/// Marks member `id` dead (its process vanished or stopped answering): it takes no part
/// in anything from now on.
fn dies(members: &mut [Member], out: &mut HubOutcome, id: usize) {
    if members[id].stream.take().is_some() {
        out.dead.push(id as u16);
    }
}
