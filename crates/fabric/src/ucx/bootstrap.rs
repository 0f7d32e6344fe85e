//! The TCP bootstrap of a cluster spread over processes: an [`Exchange`] in which node 0
//! listens and every other node connects to it (a star), presenting the cluster's token
//! and its node id. Node 0 refuses a wrong token, an id out of range and an id that is
//! already taken, with a message the refused node prints.
//!
//! Wire format: frames of a little-endian u32 length and that many bytes. During a run
//! the connections carry control messages instead: `P` (node 0 to members: report), the
//! member's answer `R` with its [`Quiescence`] (done as one byte, then datagrams sent and
//! received as little-endian u64), and `S` (node 0 to members: the run is over, stop).
//! Node 0 asks while it is done itself and decides by [`Waves`]. A closed connection is
//! a vanished process and ends the run with an error on every survivor.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::exchange::{Exchange, Quiescence, Waves};
use crate::endpoint::BackendError;

pub(super) const MAGIC: &[u8; 8] = b"HYTRA-B1";
pub(super) const ACCEPTED: u8 = b'A';
pub(super) const REFUSED: u8 = b'R';
pub(super) const PROBE: u8 = b'P';
const REPORT: u8 = b'R';
pub(super) const STOP: u8 = b'S';
/// Bytes of a report: the tag, done, sent, received.
const REPORT_BYTES: usize = 18;
/// Largest frame accepted (results with replica images of a large node).
const FRAME_MAX: usize = 4 << 30;

pub(super) fn err(msg: impl Into<String>) -> BackendError {
    BackendError::Cluster(msg.into())
}

/// Where this process stands in the star.
enum Role {
    /// Node 0: a connection per other node, by node id (index 0 unused), with what
    /// arrived on it and is not yet parsed; the reports of the wave under way, if any.
    Root {
        peers: Vec<Option<TcpStream>>,
        inboxes: Vec<Vec<u8>>,
        wave: Option<Vec<Option<Quiescence>>>,
        waves: Waves,
    },
    /// Any other node: the connection to node 0 (or to the hub).
    Member { root: TcpStream, inbox: Vec<u8>, hub: Option<HubMember> },
}

/// A member of a star around a [`super::hub::Hub`] rather than node 0: it reports its
/// datagrams by node (so the hub can end a run whose node died), and its gather hears
/// back whether it is the survivor that got everyone's results.
#[derive(Clone, Copy, Debug)]
struct HubMember {
    nodes: u16,
}

/// The TCP bootstrap of one process (one node) of a cluster.
pub struct TcpExchange {
    me: u16,
    role: Role,
    timeout: Duration,
    stopped: bool,
    nonblocking: bool,
}

impl TcpExchange {
    /// Joins the cluster as node `me` of `nodes`: node 0 listens on `root` and waits for
    /// the others; the others connect to `root` (retrying until it listens). Everything
    /// must happen within `timeout`, which also bounds every later exchange.
    pub fn join(
        me: u16,
        nodes: u16,
        root: SocketAddr,
        token: &str,
        timeout: Duration,
    ) -> Result<TcpExchange, BackendError> {
        if me >= nodes {
            return Err(err(format!("node id {me} is outside a cluster of {nodes} nodes")));
        }
        let role = if me == 0 {
            Self::accept_all(nodes, root, token, timeout)?
        } else {
            Self::connect(me, nodes, (root, "node 0"), token, timeout)?
        };
        Ok(TcpExchange { me, role, timeout, stopped: false, nonblocking: false })
    }

    /// Joins the cluster as node `me` of `nodes` through the hub at `hub` (run by the
    /// launcher, `hytra cluster`, or by `hytra hub`): every node, node 0 included, is a member. The run
    /// survives the death of any of them; the results go to the lowest survivor.
    pub fn join_hub(
        me: u16,
        nodes: u16,
        hub: SocketAddr,
        token: &str,
        timeout: Duration,
    ) -> Result<TcpExchange, BackendError> {
        if me >= nodes {
            return Err(err(format!("node id {me} is outside a cluster of {nodes} nodes")));
        }
        let mut role = Self::connect(me, nodes, (hub, "the hub"), token, timeout)?;
        if let Role::Member { hub, .. } = &mut role {
            *hub = Some(HubMember { nodes });
        }
        Ok(TcpExchange { me, role, timeout, stopped: false, nonblocking: false })
    }

    fn accept_all(
        nodes: u16,
        addr: SocketAddr,
        token: &str,
        timeout: Duration,
    ) -> Result<Role, BackendError> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| err(format!("node 0 cannot listen on {addr}: {e}")))?;
        listener.set_nonblocking(true).map_err(|e| err(format!("listener: {e}")))?;
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Option<TcpStream>> = (0..nodes).map(|_| None).collect();
        let mut joined = 1;
        while joined < nodes {
            match listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false).map_err(|e| err(format!("socket: {e}")))?;
                    s.set_read_timeout(Some(Duration::from_secs(10)))
                        .map_err(|e| err(format!("socket: {e}")))?;
                    s.set_nodelay(true).ok();
                    match read_hello(&mut s) {
                        Ok((id, their_nodes, their_token)) => {
                            let refusal = refusal(
                                (id, their_nodes, &their_token),
                                ("node 0", token, 1..nodes),
                                |id| peers[usize::from(id)].is_some(),
                            );
                            match refusal {
                                Some(why) => {
                                    eprintln!("bootstrap: refused a node from {from}: {why}");
                                    let _ = write_reply(&mut s, REFUSED, why.as_bytes());
                                }
                                None => {
                                    write_reply(&mut s, ACCEPTED, &[])
                                        .map_err(|e| err(format!("node {id}: {e}")))?;
                                    s.set_read_timeout(Some(timeout))
                                        .map_err(|e| err(format!("socket: {e}")))?;
                                    peers[usize::from(id)] = Some(s);
                                    joined += 1;
                                }
                            }
                        }
                        Err(e) => eprintln!("bootstrap: ignored a connection from {from}: {e}"),
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        let missing: Vec<u16> =
                            (1..nodes).filter(|&i| peers[usize::from(i)].is_none()).collect();
                        return Err(err(format!(
                            "nodes {missing:?} did not join within {} s",
                            timeout.as_secs()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(err(format!("accept on {addr}: {e}"))),
            }
        }
        let inboxes = vec![Vec::new(); usize::from(nodes)];
        Ok(Role::Root { peers, inboxes, wave: None, waves: Waves::default() })
    }

    fn connect(
        me: u16,
        nodes: u16,
        (root, peer): (SocketAddr, &str),
        token: &str,
        timeout: Duration,
    ) -> Result<Role, BackendError> {
        let deadline = Instant::now() + timeout;
        let mut s = loop {
            match TcpStream::connect_timeout(&root, Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => {
                    return Err(err(format!(
                        "{peer} at {root} did not answer within {} s: {e}",
                        timeout.as_secs()
                    )))
                }
            }
        };
        s.set_nodelay(true).ok();
        s.set_read_timeout(Some(timeout)).map_err(|e| err(format!("socket: {e}")))?;
        let mut hello = Vec::new();
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&me.to_le_bytes());
        hello.extend_from_slice(&nodes.to_le_bytes());
        hello.extend_from_slice(token.as_bytes());
        write_frame(&mut s, &hello).map_err(|e| err(format!("{peer} at {root}: {e}")))?;
        let reply = read_frame(&mut s).map_err(|e| err(format!("{peer} at {root}: {e}")))?;
        match reply.split_first() {
            Some((&ACCEPTED, _)) => Ok(Role::Member { root: s, inbox: Vec::new(), hub: None }),
            Some((&REFUSED, why)) => {
                Err(err(format!("{peer} refused node {me}: {}", String::from_utf8_lossy(why))))
            }
            _ => Err(err(format!("{peer} at {root} answered something else than a bootstrap"))),
        }
    }

    fn blocking(&mut self) -> Result<(), BackendError> {
        if self.nonblocking {
            for s in self.streams() {
                s.set_nonblocking(false).map_err(|e| err(format!("socket: {e}")))?;
            }
            self.nonblocking = false;
        }
        Ok(())
    }

    fn streams(&mut self) -> Vec<&mut TcpStream> {
        match &mut self.role {
            Role::Root { peers, .. } => peers.iter_mut().flatten().collect(),
            Role::Member { root, .. } => vec![root],
        }
    }

    fn lost(&self, who: u16, e: &std::io::Error) -> BackendError {
        let what = if e.kind() == ErrorKind::UnexpectedEof {
            "closed its connection (it stopped or died)".to_string()
        } else if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            format!("did not answer within {} s", self.timeout.as_secs())
        } else {
            e.to_string()
        };
        match self.role {
            Role::Member { hub: Some(_), .. } => err(format!("the hub {what}")),
            _ => err(format!("node {who} {what}")),
        }
    }
}

/// Why a root (`who`, of a cluster with `token` whose joining ids are `ids`) refuses the
/// hello (id, nodes, token) of a node, if it does; `taken` says whether an id joined
/// already.
pub(super) fn refusal(
    (id, nodes, token): (u16, u16, &str),
    (who, own_token, ids): (&str, &str, std::ops::Range<u16>),
    taken: impl Fn(u16) -> bool,
) -> Option<String> {
    let own_nodes = ids.end;
    if token != own_token {
        Some("wrong cluster token".to_string())
    } else if nodes != own_nodes {
        Some(format!("cluster size differs: {who} has {own_nodes} nodes, you said {nodes}"))
    } else if !ids.contains(&id) {
        Some(format!("node id {id} is not in {}..{}", ids.start, ids.end))
    } else if taken(id) {
        Some(format!("node id {id} is already taken"))
    } else {
        None
    }
}

pub(super) fn read_hello(s: &mut TcpStream) -> Result<(u16, u16, String), String> {
    let f = read_frame(s).map_err(|e| e.to_string())?;
    if f.len() < 12 || &f[..8] != MAGIC {
        return Err("not a hytra bootstrap".into());
    }
    let id = u16::from_le_bytes([f[8], f[9]]);
    let nodes = u16::from_le_bytes([f[10], f[11]]);
    Ok((id, nodes, String::from_utf8_lossy(&f[12..]).into_owned()))
}

pub(super) fn write_reply(s: &mut TcpStream, kind: u8, msg: &[u8]) -> std::io::Result<()> {
    let mut f = vec![kind];
    f.extend_from_slice(msg);
    write_frame(s, &f)
}

pub(super) fn write_frame(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(data.len())
        .map_err(|_| std::io::Error::new(ErrorKind::InvalidInput, "frame too large"))?;
    s.write_all(&len.to_le_bytes())?;
    s.write_all(data)
}

pub(super) fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_MAX {
        return Err(std::io::Error::new(ErrorKind::InvalidData, "frame too large"));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

impl Exchange for TcpExchange {
    fn allgather(&mut self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, BackendError> {
        self.blocking()?;
        self.stopped = false;
        match &mut self.role {
            Role::Root { inboxes, wave, waves, .. } => {
                inboxes.iter_mut().for_each(Vec::clear);
                *wave = None;
                *waves = Waves::default();
            }
            Role::Member { inbox, .. } => inbox.clear(),
        }
        if let Role::Member { root, hub: Some(_), .. } = &mut self.role {
            // A hub's member does not get the gather's answer, only everyone's blobs.
            let me = self.me;
            write_u64_frame(root, &mine)
                .map_err(|e| err(format!("node {me} cannot reach the hub: {e}")))?;
            let packed = read_u64_frame(root);
            let packed = packed.map_err(|e| err(format!("node {me} lost the hub: {e}")))?;
            return unpack(&packed);
        }
        match self.gather(mine)? {
            Some(all) => {
                let packed = pack(&all);
                let Role::Root { peers, .. } = &mut self.role else { unreachable!() };
                for (id, s) in peers.iter_mut().enumerate() {
                    if let Some(s) = s {
                        write_u64_frame(s, &packed).map_err(|e| err(format!("node {id}: {e}")))?;
                    }
                }
                Ok(all)
            }
            None => {
                let Role::Member { root, .. } = &mut self.role else { unreachable!() };
                let packed = read_u64_frame(root);
                let packed = packed.map_err(|e| self.lost(0, &e))?;
                unpack(&packed)
            }
        }
    }

    fn gather(&mut self, mine: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, BackendError> {
        self.blocking()?;
        let me = self.me;
        match &mut self.role {
            Role::Root { peers, .. } => {
                let mut all = vec![mine];
                let mut failure = None;
                for (id, s) in peers.iter_mut().enumerate() {
                    if let Some(s) = s {
                        match read_u64_frame(s) {
                            Ok(b) => all.push(b),
                            Err(e) => {
                                failure = Some((id as u16, e));
                                break;
                            }
                        }
                    }
                }
                if let Some((id, e)) = failure {
                    return Err(self.lost(id, &e));
                }
                Ok(Some(all))
            }
            Role::Member { root, hub: None, .. } => {
                write_u64_frame(root, &mine)
                    .map_err(|e| err(format!("node {me} cannot reach node 0: {e}")))?;
                Ok(None)
            }
            Role::Member { root, hub: Some(_), .. } => {
                write_u64_frame(root, &mine)
                    .map_err(|e| err(format!("node {me} cannot reach the hub: {e}")))?;
                let reply = read_u64_frame(root)
                    .map_err(|e| err(format!("node {me} lost the hub: {e}")))?;
                match reply.split_first() {
                    Some((&0, [])) => Ok(None),
                    Some((&1, packed)) => unpack(packed).map(Some),
                    _ => Err(err("the hub answered a gather with something else")),
                }
            }
        }
    }

    fn poll_done(&mut self, local: Quiescence) -> Result<bool, BackendError> {
        if self.stopped {
            return Ok(true);
        }
        if !self.nonblocking {
            for s in self.streams() {
                s.set_nonblocking(true).map_err(|e| err(format!("socket: {e}")))?;
            }
            self.nonblocking = true;
        }
        let polled = match &mut self.role {
            Role::Member { root, inbox, hub } => member_poll(root, inbox, local, *hub),
            Role::Root { peers, inboxes, wave, waves } => {
                root_poll(peers, inboxes, wave, waves, local)
            }
        };
        match polled {
            Ok(stop) => {
                self.stopped = stop;
                Ok(stop)
            }
            Err((id, e)) => Err(self.lost(id, &e)),
        }
    }
}

/// A member's turn: answer node 0's (or the hub's) probes with `local`, and learn
/// whether to stop.
fn member_poll(
    root: &mut TcpStream,
    inbox: &mut Vec<u8>,
    local: Quiescence,
    hub: Option<HubMember>,
) -> Result<bool, (u16, std::io::Error)> {
    pull(root, inbox).map_err(|e| (0, e))?;
    let mut stop = false;
    for b in std::mem::take(inbox) {
        match b {
            STOP => stop = true,
            PROBE if hub.is_some() => {
                let nodes = hub.map_or(0, |h| usize::from(h.nodes));
                assert_eq!(local.by_node.len(), nodes, "a hub's member counts by node");
                send_small(root, &encode_report(&local)).map_err(|e| (0, e))?;
            }
            PROBE => {
                let mut r = [0u8; REPORT_BYTES];
                r[0] = REPORT;
                r[1] = u8::from(local.done);
                r[2..10].copy_from_slice(&local.sent.to_le_bytes());
                r[10..].copy_from_slice(&local.received.to_le_bytes());
                send_small(root, &r).map_err(|e| (0, e))?;
            }
            other => return Err((0, unexpected(other))),
        }
    }
    Ok(stop)
}

/// Node 0's turn: collect the wave's reports; once all are in, judge it with this
/// process's `local` state, then stop everyone or (while done here) start the next wave.
fn root_poll(
    peers: &mut [Option<TcpStream>],
    inboxes: &mut [Vec<u8>],
    wave: &mut Option<Vec<Option<Quiescence>>>,
    waves: &mut Waves,
    local: Quiescence,
) -> Result<bool, (u16, std::io::Error)> {
    for (id, s) in peers.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        let inbox = &mut inboxes[id];
        pull(s, inbox).map_err(|e| (id as u16, e))?;
        while inbox.len() >= REPORT_BYTES {
            let r: [u8; REPORT_BYTES] = inbox[..REPORT_BYTES].try_into().expect("a report");
            inbox.drain(..REPORT_BYTES);
            let slot = wave.as_mut().map(|w| &mut w[id]);
            match (r[0], slot) {
                (REPORT, Some(slot)) => {
                    *slot = Some(Quiescence {
                        done: r[1] != 0,
                        sent: u64::from_le_bytes(r[2..10].try_into().expect("8 bytes")),
                        received: u64::from_le_bytes(r[10..].try_into().expect("8 bytes")),
                        by_node: Vec::new(),
                    })
                }
                (other, _) => return Err((id as u16, unexpected(other))),
            }
        }
        if inbox.first().is_some_and(|&b| b != REPORT) {
            return Err((id as u16, unexpected(inbox[0])));
        }
    }
    if let Some(w) = wave {
        let answered = peers.iter().zip(w.iter()).all(|(p, r)| p.is_none() || r.is_some());
        if !answered {
            return Ok(false);
        }
        let over = waves.observe(std::iter::once(local.clone()).chain(w.iter().flatten().cloned()));
        *wave = None;
        if over {
            for (id, s) in peers.iter_mut().enumerate() {
                if let Some(s) = s {
                    send_small(s, &[STOP]).map_err(|e| (id as u16, e))?;
                }
            }
            return Ok(true);
        }
    }
    if local.done {
        for (id, s) in peers.iter_mut().enumerate() {
            if let Some(s) = s {
                send_small(s, &[PROBE]).map_err(|e| (id as u16, e))?;
            }
        }
        *wave = Some(vec![None; peers.len()]);
    }
    Ok(false)
}

/// A member's report to the hub: the tag, done, then (sent, received) per node.
pub(super) fn encode_report(q: &Quiescence) -> Vec<u8> {
    let mut r = Vec::with_capacity(2 + 16 * q.by_node.len());
    r.push(REPORT);
    r.push(u8::from(q.done));
    for &(s, g) in &q.by_node {
        r.extend_from_slice(&s.to_le_bytes());
        r.extend_from_slice(&g.to_le_bytes());
    }
    r
}

/// Bytes of a member's report to the hub of a cluster of `nodes`.
pub(super) fn report_bytes(nodes: u16) -> usize {
    2 + 16 * usize::from(nodes)
}

/// Reads a report [`encode_report`] wrote (exactly [`report_bytes`] long).
pub(super) fn decode_report(r: &[u8]) -> Option<Quiescence> {
    if r.len() < 2 || r[0] != REPORT || (r.len() - 2) % 16 != 0 {
        return None;
    }
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let by_node: Vec<(u64, u64)> =
        r[2..].chunks_exact(16).map(|c| (word(&c[..8]), word(&c[8..]))).collect();
    let sent = by_node.iter().map(|p| p.0).sum();
    let received = by_node.iter().map(|p| p.1).sum();
    Some(Quiescence { done: r[1] != 0, sent, received, by_node })
}

/// Blobs as one frame: each as its u64 length, then its bytes.
pub(super) fn pack(all: &[Vec<u8>]) -> Vec<u8> {
    let mut packed = Vec::new();
    for b in all {
        packed.extend_from_slice(&(b.len() as u64).to_le_bytes());
        packed.extend_from_slice(b);
    }
    packed
}

/// Reads what [`pack`] wrote.
fn unpack(packed: &[u8]) -> Result<Vec<Vec<u8>>, BackendError> {
    let mut all = Vec::new();
    let mut rest = packed;
    while !rest.is_empty() {
        if rest.len() < 8 {
            return Err(err("a truncated exchange"));
        }
        let n = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes")) as usize;
        if rest.len() - 8 < n {
            return Err(err("a truncated exchange"));
        }
        all.push(rest[8..8 + n].to_vec());
        rest = &rest[8 + n..];
    }
    Ok(all)
}

/// Appends whatever `s` (non-blocking) has to `inbox`; a closed connection is an error.
pub(super) fn pull(s: &mut TcpStream, inbox: &mut Vec<u8>) -> std::io::Result<()> {
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => inbox.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes a control message to a non-blocking socket. At most one message per direction
/// is ever unanswered, so it always fits the socket's empty buffer; a short write would
/// mean the peer stopped reading.
pub(super) fn send_small(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    let full = std::io::Error::new(ErrorKind::WriteZero, "a control message did not fit");
    match s.write(msg) {
        Ok(n) if n == msg.len() => Ok(()),
        Ok(_) => Err(full),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Err(full),
        Err(e) => Err(e),
    }
}

pub(super) fn unexpected(b: u8) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, format!("unexpected control byte {b:#04x}"))
}

pub(super) fn write_u64_frame(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    s.write_all(&(data.len() as u64).to_le_bytes())?;
    s.write_all(data)
}

pub(super) fn read_u64_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    s.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len) as usize;
    if len > FRAME_MAX {
        return Err(std::io::Error::new(ErrorKind::InvalidData, "frame too large"));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    #[test]
    fn three_nodes_exchange_and_stop_together() {
        let root = free_port();
        let t = Duration::from_secs(10);
        let handles: Vec<_> = (0..3u16)
            .map(|me| {
                std::thread::spawn(move || {
                    let mut x = TcpExchange::join(me, 3, root, "secret", t).unwrap();
                    let all = x.allgather(vec![me as u8; usize::from(me) + 1]).unwrap();
                    assert_eq!(all, vec![vec![0], vec![1, 1], vec![2, 2, 2]]);
                    let started = Instant::now();
                    let after = |ms| started.elapsed() > Duration::from_millis(ms);
                    // Node 1 finishes after 30 ms, having sent node 2 a datagram that node
                    // 2 (done from the start) takes only after 60 ms: nobody may stop
                    // before both.
                    loop {
                        let local = match me {
                            0 => Quiescence {
                                done: true,
                                sent: 4,
                                received: 4,
                                ..Default::default()
                            },
                            1 => Quiescence { done: after(30), sent: 1, ..Default::default() },
                            _ => Quiescence {
                                done: true,
                                received: u64::from(after(60)),
                                ..Default::default()
                            },
                        };
                        if x.poll_done(local).unwrap() {
                            assert!(after(60), "node {me} stopped with a datagram in flight");
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let g = x.gather(vec![me as u8]).unwrap();
                    assert_eq!(g.is_some(), me == 0);
                    if let Some(g) = g {
                        assert_eq!(g, vec![vec![0], vec![1], vec![2]]);
                    }
                    x.allgather(Vec::new()).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn wrong_token_and_duplicate_ids_are_refused() {
        let root = free_port();
        let t = Duration::from_secs(5);
        let r = std::thread::spawn(move || TcpExchange::join(0, 2, root, "right", t).map(|_| ()));
        let bad = TcpExchange::join(1, 2, root, "wrong", t).err().expect("refused");
        assert!(bad.to_string().contains("wrong cluster token"), "{bad}");
        let ok = TcpExchange::join(1, 2, root, "right", t).expect("accepted");
        r.join().unwrap().unwrap();
        drop(ok);

        let root = free_port();
        let r = std::thread::spawn(move || TcpExchange::join(0, 3, root, "k", t).map(|_| ()));
        let first = TcpExchange::join(1, 3, root, "k", t).expect("accepted");
        let dup = TcpExchange::join(1, 3, root, "k", t).err().expect("refused");
        assert!(dup.to_string().contains("already taken"), "{dup}");
        let _third = TcpExchange::join(2, 3, root, "k", t).expect("accepted");
        r.join().unwrap().unwrap();
        drop(first);
    }

    #[test]
    fn a_vanished_peer_is_an_error_not_a_hang() {
        let root = free_port();
        let t = Duration::from_secs(5);
        let member = std::thread::spawn(move || {
            let x = TcpExchange::join(1, 2, root, "k", t).unwrap();
            drop(x);
        });
        let mut x = TcpExchange::join(0, 2, root, "k", t).unwrap();
        member.join().unwrap();
        let started = Instant::now();
        let e = loop {
            match x.poll_done(Quiescence { done: true, ..Default::default() }) {
                Err(e) => break e,
                Ok(stop) => assert!(!stop, "stopped without the member"),
            }
            assert!(started.elapsed() < Duration::from_secs(5), "no error");
        };
        assert!(e.to_string().contains("node 1 closed"), "{e}");
    }

    #[test]
    fn a_node_that_never_comes_times_out() {
        let root = free_port();
        let e = TcpExchange::join(0, 2, root, "k", Duration::from_millis(200)).err().unwrap();
        assert!(e.to_string().contains("did not join"), "{e}");
        let e =
            TcpExchange::join(1, 2, free_port(), "k", Duration::from_millis(200)).err().unwrap();
        assert!(e.to_string().contains("did not answer"), "{e}");
    }
}
