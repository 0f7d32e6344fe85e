//! What UCP chose for an endpoint, read after it connected: the transport of each lane,
//! which lanes carry RMA and atomics. From that, not from the `UCX_TLS` string, come the
//! fabric's promises ([`crate::Caps`]: are atomics coherent with the CPU's, do one-sided
//! operations bypass the target) and how each endpoint keeps its operations in order
//! (R1). UCX 1.13 has no query of an endpoint's transports, so this parses the text of
//! `ucp_ep_print_info` (what `ucx_info -e` prints). Not for: calling UCP.

/// Transports that execute atomics with the CPU's own atomic instructions: the same
/// process (`self`) or a shared-memory mapping (UCT's `UCT_IFACE_FLAG_ATOMIC_CPU`).
const CPU_ATOMICS: [&str; 5] = ["self", "posix", "sysv", "xpmem", "mm"];
/// Transports that complete RMA and atomics inside the call, as CPU copies and atomics on
/// mapped memory or system calls: an operation that returned is done at the target.
const SYNCHRONOUS: [&str; 6] = ["self", "posix", "sysv", "xpmem", "cma", "knem"];

/// Ordering modes of an endpoint; the numbers are the shim's `HX_ORDER_*`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// Shared memory: operations complete in the call; fence behind one in flight.
    Sync = 0,
    /// RMA and atomics on one network lane, which executes in order at the target except
    /// that a WRITE or atomic may pass an earlier READ or atomic: fenced there.
    Queue = 1,
    /// RMA and atomics on different lanes: a flush between operations of the two kinds.
    Lanes = 2,
    /// Every operation waits until the previous ones are complete at the target (forced
    /// for tests; never chosen from lanes).
    Flush = 3,
    /// RMA travels as active messages on one lane that the target's CPU executes in
    /// arrival order, except that it copies a READ's data out when it sends the reply,
    /// which may wait behind a full socket while later requests run (UCP's software RMA):
    /// a WRITE or atomic behind a READ still in flight waits for it.
    Emulated = 4,
}

/// Where an endpoint's atomics execute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Atomics {
    /// With the CPU's atomics: a shared mapping or the same process (`transport`).
    Cpu(String),
    /// In a NIC (`transport/device`): not atomic with respect to CPU atomics (M6).
    Device(String),
    /// No atomic lane: UCP sends an active message and the target's CPU executes it.
    Emulated,
}

/// One lane of an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lane {
    pub(crate) index: usize,
    pub(crate) transport: String,
    pub(crate) device: String,
    /// Its priority among the atomic lanes (`amo#N`), if it is one.
    pub(crate) amo: Option<usize>,
    /// It carries active messages (and with them every emulated operation).
    pub(crate) am: bool,
}

/// The lanes of one endpoint and which of them carry RMA (`put[N]`/`get[N]` lines).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EpLanes {
    pub(crate) lanes: Vec<Lane>,
    pub(crate) rma: Vec<usize>,
}

/// Parses `ucp_ep_print_info`'s text. Lines look like
/// `#   lane[1]:  2:posix/memory.0 md[2]  -> md[2]/posix/sysdev[255] amo#1 am` and
/// `#   put[1]: 0..<short>..4294967296..<bcopy>..(inf)`.
pub(crate) fn parse(text: &str) -> Result<EpLanes, String> {
    let mut ep = EpLanes::default();
    for line in text.lines().take(1000) {
        let line = line.trim_start_matches('#').trim();
        if let Some(rest) = line.strip_prefix("lane[") {
            let (index, rest) =
                rest.split_once("]:").ok_or_else(|| format!("lane line: {line}"))?;
            let index: usize = index.parse().map_err(|_| format!("lane number: {line}"))?;
            let rest = rest.trim();
            if rest.starts_with("cm ") {
                continue; // a connection manager's lane carries no data
            }
            let first = rest.split_whitespace().next().unwrap_or("");
            let name = first.split_once(':').map_or(first, |(_, n)| n);
            let (transport, device) =
                name.split_once('/').ok_or_else(|| format!("lane transport: {line}"))?;
            let tags = rest.split_once("->").map_or("", |(_, t)| t);
            let amo = tags
                .split_whitespace()
                .find_map(|t| t.strip_prefix("amo#"))
                .map(|n| n.parse().map_err(|_| format!("amo lane: {line}")))
                .transpose()?;
            let am = tags.split_whitespace().any(|t| t == "am");
            let device = device.rsplit_once('.').map_or(device, |(d, _)| d);
            ep.lanes.push(Lane {
                index,
                transport: transport.to_string(),
                device: device.to_string(),
                amo,
                am,
            });
        } else if let Some(rest) = line.strip_prefix("put[").or_else(|| line.strip_prefix("get[")) {
            let (n, _) = rest.split_once(']').ok_or_else(|| format!("rma line: {line}"))?;
            let n: usize = n.parse().map_err(|_| format!("rma lane: {line}"))?;
            if !ep.rma.contains(&n) {
                ep.rma.push(n);
            }
        }
    }
    if ep.lanes.is_empty() {
        return Err("no lanes in UCP's description of the endpoint".into());
    }
    if let Some(&n) = ep.rma.iter().find(|&&n| ep.lane(n).is_none()) {
        return Err(format!("RMA on lane {n}, which is not listed"));
    }
    Ok(ep)
}

impl EpLanes {
    fn lane(&self, index: usize) -> Option<&Lane> {
        self.lanes.iter().find(|l| l.index == index)
    }

    /// The atomic lane of highest priority (`amo#0`), which UCP uses for any region
    /// whose key it can reach.
    fn amo_lane(&self) -> Option<&Lane> {
        self.lanes.iter().filter(|l| l.amo.is_some()).min_by_key(|l| l.amo)
    }

    fn am_lane(&self) -> Option<&Lane> {
        self.lanes.iter().find(|l| l.am)
    }

    /// The lane RMA takes: the first RMA lane, else (emulated) the active-message lane.
    fn rma_lane(&self) -> Option<&Lane> {
        self.rma.first().and_then(|&n| self.lane(n)).or_else(|| self.am_lane())
    }

    /// Where this endpoint's atomics execute.
    pub(crate) fn atomics(&self) -> Atomics {
        match self.amo_lane() {
            None => Atomics::Emulated,
            Some(l) if CPU_ATOMICS.contains(&l.transport.as_str()) => {
                Atomics::Cpu(l.transport.clone())
            }
            Some(l) => Atomics::Device(format!("{}/{}", l.transport, l.device)),
        }
    }

    /// Whether RMA and atomics reach the target's memory without its CPU (no emulation
    /// through active messages, which the target executes when it progresses).
    pub(crate) fn bypasses_target(&self) -> bool {
        !self.rma.is_empty() && self.amo_lane().is_some()
    }

    /// How this endpoint keeps its operations in order.
    pub(crate) fn order(&self) -> Order {
        let (Some(rma), Some(amo)) = (self.rma_lane(), self.amo_lane().or(self.am_lane())) else {
            // Nothing to order on: an endpoint without lanes for either kind fails its
            // operations anyway.
            return Order::Lanes;
        };
        let sync = |l: &Lane| SYNCHRONOUS.contains(&l.transport.as_str());
        if self.bypasses_target() && sync(rma) && sync(amo) {
            Order::Sync
        } else if self.rma.is_empty() {
            // READs are emulated: ordered behind flushes, and the strictest order when
            // the atomics do not share the active-message lane.
            if rma.index == amo.index {
                Order::Emulated
            } else {
                Order::Flush
            }
        } else if rma.index == amo.index {
            Order::Queue
        } else {
            Order::Lanes
        }
    }

    /// One line for messages: `lane: transport/device [tags]`, lanes separated by `;`.
    pub(crate) fn describe(&self) -> String {
        let lanes: Vec<String> = self
            .lanes
            .iter()
            .map(|l| {
                let mut tags = Vec::new();
                if self.rma.contains(&l.index) {
                    tags.push("rma".to_string());
                }
                if let Some(n) = l.amo {
                    tags.push(format!("amo#{n}"));
                }
                if l.am {
                    tags.push("am".into());
                }
                format!("{}/{} [{}]", l.transport, l.device, tags.join(" "))
            })
            .collect();
        lanes.join("; ")
    }
}

/// Whether a transport list (`UCX_TLS` syntax, `None`: UCX's choice) may select an RDMA
/// transport. Only a hint, for asking UCX for device atomics up front; the verdict comes
/// from the lanes.
pub(crate) fn may_use_rdma(tls: Option<&str>) -> bool {
    const NOT_RDMA: [&str; 11] =
        ["sm", "shm", "posix", "sysv", "mm", "cma", "knem", "xpmem", "self", "tcp", "sockcm"];
    match tls.map(str::trim) {
        None => true,
        Some(t) if t.starts_with('^') => true,
        Some(t) => t.split(',').map(str::trim).any(|n| !n.is_empty() && !NOT_RDMA.contains(&n)),
    }
}

/// What one process found on all its endpoints, and what the cluster promises once every
/// process's verdict is in ([`Verdict::merge`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Some endpoint executes atomics in a NIC: which, and to whom.
    pub(crate) device: Option<String>,
    /// Some endpoint executes atomics with a CPU (shared memory, emulation): which.
    pub(crate) cpu: Option<String>,
    /// Every endpoint reaches its target's memory without the target's CPU.
    pub(crate) bypass: bool,
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict { device: None, cpu: None, bypass: true }
    }
}

/// What the cluster's fabric promises, from every process's [`Verdict`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Promises {
    pub(crate) atomics_coherent: bool,
    pub(crate) one_sided_bypasses_target: bool,
}

impl Verdict {
    /// Adds the endpoint `ep` to `to` (a name for messages).
    pub(crate) fn add(&mut self, to: &str, ep: &EpLanes) {
        match ep.atomics() {
            Atomics::Device(d) => {
                self.device.get_or_insert_with(|| format!("{d} (to {to})"));
            }
            Atomics::Cpu(t) => {
                self.cpu.get_or_insert_with(|| format!("{t} (to {to})"));
            }
            Atomics::Emulated => {
                self.cpu.get_or_insert_with(|| {
                    format!("the target's CPU, no atomic lane (to {to}: {})", ep.describe())
                });
            }
        }
        self.bypass &= ep.bypasses_target();
    }

    /// The verdict as bytes, for the other processes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![u8::from(self.bypass)];
        for s in [&self.device, &self.cpu] {
            match s {
                None => out.push(0),
                Some(s) => {
                    out.push(1);
                    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
            }
        }
        out
    }

    /// A verdict another process encoded.
    pub(crate) fn decode(b: &[u8]) -> Result<Verdict, String> {
        let bad = || "a peer's transport verdict does not decode".to_string();
        let (&bypass, mut rest) = b.split_first().ok_or_else(bad)?;
        let mut strings = [None, None];
        for s in &mut strings {
            let (&flag, r) = rest.split_first().ok_or_else(bad)?;
            rest = r;
            if flag == 1 {
                let (len, r) = rest.split_first_chunk::<4>().ok_or_else(bad)?;
                let len = u32::from_le_bytes(*len) as usize;
                let text = r.get(..len).ok_or_else(bad)?;
                *s = Some(String::from_utf8_lossy(text).into_owned());
                rest = &r[len..];
            }
        }
        let [device, cpu] = strings;
        Ok(Verdict { device, cpu, bypass: bypass != 0 })
    }

    /// What the cluster promises; an error if some atomics would execute in a NIC and
    /// others with a CPU, so that one lock word could see both (M6).
    pub(crate) fn merge(all: &[Verdict]) -> Result<Promises, String> {
        let device = all.iter().find_map(|v| v.device.clone());
        let cpu = all.iter().find_map(|v| v.cpu.clone());
        if let (Some(d), Some(c)) = (&device, &cpu) {
            return Err(format!(
                "UCX executes some atomics in a NIC ({d}) and others with a CPU ({c}), so a lock word would see both, which are not atomic together (docs/INVARIANTS.md M6): set UCX_ATOMIC_MODE=device and give every process a transport of that NIC"
            ));
        }
        Ok(Promises {
            atomics_coherent: device.is_none(),
            one_sided_bypasses_target: all.iter().all(|v| v.bypass),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from UCX 1.13.1 on this project's machines: two workers of one process
    /// over `sm,self`.
    const SM: &str = "#
# UCP endpoint
#
#               peer: <no debug data>
#                 lane[0]:  1:sysv/memory.0 md[1]           -> md[1]/sysv/sysdev[255] amo#0 am am_bw#0
#                 lane[1]:  2:posix/memory.0 md[2]          -> md[2]/posix/sysdev[255] amo#1
#                 lane[2]:  3:cma/memory.0 md[3]            -> md[3]/cma/sysdev[255] rma_bw#0
#
#                 am_send: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..(inf)
#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)
#                  get[0]: 0..<bcopy>..(inf)
#                  put[1]: 0..<short>..4294967296..<bcopy>..(inf)
#                  get[1]: 0..<bcopy>..(inf)
#
#                  rma_bw: mds rndv_rkey_size 9
#
";

    /// The same over `tcp,self` with `UCX_NET_DEVICES=lo`: no RMA or atomic lane.
    const TCP: &str = "#
# UCP endpoint
#
#               peer: <no debug data>
#                 lane[0]:  1:tcp/lo.0 md[1]                -> md[1]/tcp/sysdev[255] rma_bw#0 am am_bw#0 wireup
#
#                 am_send: 0..<egr/short>..8185..<egr/zcopy>..20553..<rndv>..(inf)
#
#                  rma_bw: mds [1] rndv_rkey_size 10
#
";

    /// A worker to itself over `sm,self`.
    const SELF: &str = "#
#                 lane[0]:  0:self/memory0.0 md[0]          -> md[0]/self/sysdev[255] amo#0 am am_bw#0
#                 lane[1]:  1:sysv/memory.0 md[1]           -> md[1]/sysv/sysdev[255]
#                 lane[2]:  2:posix/memory.0 md[2]          -> md[2]/posix/sysdev[255]
#                 lane[3]:  3:cma/memory.0 md[3]            -> md[3]/cma/sysdev[255] rma_bw#0
#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)
#                  get[0]: 0..<bcopy>..(inf)
#                  put[1]: 0..<short>..4294967296..<bcopy>..(inf)
#                  put[2]: 0..<short>..4294967296..<bcopy>..(inf)
";

    /// Made in the same format for a ConnectX host in device atomic mode: one RC lane
    /// carries everything.
    const RC: &str = "#
#                 lane[0]:  5:rc_mlx5/mlx5_0:1.0 md[3]      -> md[3]/ib/sysdev[255] rma_bw#0 amo#0 am am_bw#0 wireup
#                  put[0]: 0..<short>..220..<bcopy>..8256..<zcopy>..(inf)
#                  get[0]: 0..<bcopy>..8256..<zcopy>..(inf)
";

    /// Two HCAs, RMA on the first and atomics on the second.
    const TWO_HCAS: &str = "#
#                 lane[0]:  5:rc_mlx5/mlx5_0:1.0 md[3]      -> md[3]/ib/sysdev[255] rma_bw#0 am am_bw#0 wireup
#                 lane[1]:  6:rc_mlx5/mlx5_1:1.0 md[4]      -> md[4]/ib/sysdev[255] rma_bw#1 amo#0
#                  put[0]: 0..<short>..220..<bcopy>..8256..<zcopy>..(inf)
#                  get[0]: 0..<bcopy>..8256..<zcopy>..(inf)
";

    #[test]
    fn shared_memory_uses_cpu_atomics_and_completes_in_the_call() {
        let ep = parse(SM).unwrap();
        assert_eq!(ep.lanes.len(), 3);
        assert_eq!(ep.rma, vec![0, 1]);
        assert_eq!(ep.atomics(), Atomics::Cpu("sysv".into()));
        assert!(ep.bypasses_target());
        assert_eq!(ep.order(), Order::Sync);
        let me = parse(SELF).unwrap();
        assert_eq!((me.atomics(), me.order()), (Atomics::Cpu("self".into()), Order::Sync));
    }

    #[test]
    fn tcp_emulates_everything_on_one_ordered_lane() {
        let ep = parse(TCP).unwrap();
        assert_eq!(ep.atomics(), Atomics::Emulated);
        assert!(!ep.bypasses_target());
        assert_eq!(ep.order(), Order::Emulated, "a READ's data is copied when it is answered");
        assert!(ep.describe().contains("tcp/lo [am]"), "{}", ep.describe());
    }

    #[test]
    fn rdma_lanes_mean_device_atomics_and_fences_or_flushes() {
        let rc = parse(RC).unwrap();
        assert_eq!(rc.atomics(), Atomics::Device("rc_mlx5/mlx5_0:1".into()));
        assert!(rc.bypasses_target());
        assert_eq!(rc.order(), Order::Queue);
        let two = parse(TWO_HCAS).unwrap();
        assert_eq!(two.atomics(), Atomics::Device("rc_mlx5/mlx5_1:1".into()));
        assert_eq!(two.order(), Order::Lanes, "CAS then READ would take two queue pairs");
    }

    #[test]
    fn garbage_is_an_error_not_a_guess() {
        assert!(parse("").is_err());
        assert!(parse("# lane[x]: 1:sysv/memory.0").is_err());
        assert!(parse("# lane[0]: 1:sysv/memory.0 -> x\n# put[3]: 0..(inf)").is_err());
    }

    #[test]
    fn a_cluster_that_mixes_nic_and_cpu_atomics_is_refused() {
        let mut nic = Verdict::default();
        nic.add("node 1", &parse(RC).unwrap());
        let mut shm = Verdict::default();
        shm.add("node 0", &parse(SELF).unwrap());
        let round = |v: &Verdict| Verdict::decode(&v.encode()).unwrap();
        assert_eq!(round(&nic), nic);
        assert_eq!(round(&shm), shm);
        let p = Verdict::merge(&[round(&nic), round(&nic)]).unwrap();
        assert!(!p.atomics_coherent && p.one_sided_bypasses_target);
        let p = Verdict::merge(&[shm.clone()]).unwrap();
        assert!(p.atomics_coherent && p.one_sided_bypasses_target);
        let e = Verdict::merge(&[nic, shm]).unwrap_err();
        assert!(e.contains("rc_mlx5/mlx5_0:1") && e.contains("self"), "{e}");
        let mut tcp = Verdict::default();
        tcp.add("node 2", &parse(TCP).unwrap());
        let p = Verdict::merge(&[tcp]).unwrap();
        assert!(p.atomics_coherent && !p.one_sided_bypasses_target);
        assert!(Verdict::decode(&[1, 1, 9, 0]).is_err());
    }

    #[test]
    fn negated_and_unknown_transport_lists_may_use_rdma() {
        assert!(may_use_rdma(None));
        assert!(may_use_rdma(Some("^sm")));
        assert!(may_use_rdma(Some("rc,sm")));
        assert!(may_use_rdma(Some("dc_x")));
        assert!(!may_use_rdma(Some("sm,self")));
        assert!(!may_use_rdma(Some("tcp")));
    }
}
