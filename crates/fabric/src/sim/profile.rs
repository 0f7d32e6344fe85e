//! NIC profiles: the model of an RNIC and its host, with the source of every number.
//!
//! A profile is calibrated ONLY from primitive-level figures (raw verb rates and
//! latencies) in the papers this project implements. End-to-end transaction results are
//! outcomes to compare against and must never be used to tune a profile.
//!
//! The model (see `nic.rs` for how it is applied): every request occupies the posting
//! NIC's engine for `req_*` and the target NIC's engine for `resp_*`; atomics also occupy
//! the target's atomic unit; bytes occupy the links; the rest is fixed latency.
//! In the paper's symmetric benchmark every machine both issues and serves requests, so
//! the per-machine peak rate `R` of a verb satisfies `R * (req + resp) = 1`: that is how
//! the engine costs below are derived from the published rates.

/// Per-verb cost on one NIC engine, in nanoseconds of occupancy.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct VerbCosts {
    /// One-sided READ.
    pub read_ns: f64,
    /// One-sided WRITE.
    pub write_ns: f64,
    /// CAS and FAA.
    pub atomic_ns: f64,
    /// Datagram SEND (on the sender) or RECV (on the receiver).
    pub datagram_ns: f64,
}

/// Host-side CPU costs charged to a worker's virtual clock by the fabric.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct HostCosts {
    /// Ringing a doorbell (one MMIO write), once per batch of requests.
    pub doorbell_ns: f64,
    /// Building one work request.
    pub wqe_ns: f64,
    /// One call to poll the completion queue, found empty or not.
    pub poll_ns: f64,
    /// Reaping one completion entry.
    pub cqe_ns: f64,
    /// Receiving one datagram (its completion plus re-posting the receive buffer).
    pub recv_ns: f64,
    /// Copying payload bytes (inline WRITEs, datagrams), per KiB.
    pub copy_ns_per_kib: f64,
    /// Moving the bytes of a one-sided request that is not inline, per KiB, on the
    /// posting CPU: 0 for a NIC, which moves them by DMA; where there is none, the
    /// poster's own copy.
    pub rma_copy_ns_per_kib: f64,
    /// How long a worker with nothing to do gives its core away before it polls again;
    /// what arrives meanwhile (a completion, a datagram, a timer) waits for the end of
    /// the rest. 0 for a worker that spins on its queues, as an RDMA worker does.
    pub rest_ns: f64,
    /// From a datagram written into the receiver's memory to the receiver's poll being
    /// able to take it. 0 for an RNIC, whose completion stage covers it; for threads that
    /// share memory, the trip of the message's cache lines to the receiver's core.
    pub recv_latency_ns: f64,
}

/// The model of one machine's RNIC(s) and host.
#[derive(Clone, Debug, PartialEq)]
pub struct NicProfile {
    /// Name used on the command line.
    pub name: &'static str,
    /// Engine occupancy on the NIC that posts a request.
    pub req: VerbCosts,
    /// Engine occupancy on the NIC that serves a one-sided request or receives a datagram.
    pub resp: VerbCosts,
    /// Occupancy of the target's atomic unit per CAS/FAA (atomics are serialised there).
    pub atomic_unit_ns: f64,
    /// Link bandwidth of one machine per direction, bytes per nanosecond (GB/s). A
    /// WRITE's payload takes effect at its target line by line at this rate, as it
    /// streams in.
    pub link_bytes_per_ns: f64,
    /// Host bus (PCIe) bandwidth of one NIC, bytes per nanosecond: the rate at which a
    /// READ's lines are read at its target.
    pub dma_bytes_per_ns: f64,
    /// Transport header bytes of an RC packet (request, response or ACK).
    pub rc_header_bytes: u32,
    /// Transport header bytes of a UD datagram (includes the global route header).
    pub ud_header_bytes: u32,
    /// One-way wire and switch latency.
    pub wire_ns: f64,
    /// From the doorbell to the NIC holding the work request.
    pub doorbell_latency_ns: f64,
    /// Extra DMA read of a non-inline WRITE or SEND payload before it leaves.
    pub payload_fetch_ns: f64,
    /// DMA read at the target for READ and atomics (a non-posted PCIe read).
    pub target_read_ns: f64,
    /// DMA write at the target for WRITE and datagrams (posted PCIe write).
    pub target_write_ns: f64,
    /// From a response reaching the posting NIC to its completion being visible in host
    /// memory (data placement plus CQE write).
    pub completion_ns: f64,
    /// Queue-pair contexts one machine's NIC(s) cache.
    pub qp_cache_entries: u32,
    /// Associativity of that cache.
    pub qp_cache_ways: u32,
    /// Engine occupancy of fetching a missing queue-pair context.
    pub qp_miss_ns: f64,
    /// Latency of fetching a missing queue-pair context.
    pub qp_miss_latency_ns: f64,
    /// Time after which an RC request to an unreachable target completes in error
    /// (transport retries exhausted).
    pub rc_timeout_ns: f64,
    /// Whether NIC atomics are atomic with respect to CPU atomics.
    pub atomics_coherent: bool,
    /// Host CPU costs.
    pub host: HostCosts,
    /// Costs of verb programs (work queues in memory, WAIT/ENABLE); `None` for NICs whose
    /// figures we do not have.
    pub offload: Option<OffloadCosts>,
}

/// How a NIC fetches and orders entries of verb programs (RedN §5.1).
#[derive(Clone, Debug, PartialEq)]
pub struct OffloadCosts {
    /// From the doorbell reaching the NIC to the first entry of an idle queue issuing.
    pub first_fetch_ns: f64,
    /// Between consecutive prefetched entries of an unmanaged queue (WQ order).
    pub wq_order_ns: f64,
    /// From the completion a WAIT holds on to the next entry issuing (completion order).
    pub completion_order_ns: f64,
    /// From an ENABLE (or a managed queue running out of fetched entries) to the first
    /// entry of the next fetch of a managed queue issuing (doorbell order).
    pub doorbell_order_ns: f64,
    /// Occupancy, per fetch, of the NIC's one unit that fetches managed entries.
    pub managed_fetch_unit_ns: f64,
}

impl OffloadCosts {
    /// ConnectX-5 (RedN §5.1, Fig. 8 and Table 3).
    pub fn cx5() -> OffloadCosts {
        // Fig. 8: one NOOP takes 1.21 us from post to completion; each further entry adds
        // 0.17 us in WQ order, 0.19 us in completion order, 0.54 us in doorbell order.
        // The doorbell (350 ns) and completion (250 ns) stages of the profile are part of
        // the 1.21 us, so the first fetch and issue take the remaining 610 ns.
        let base = NicProfile::cx4();
        let first = 1210.0 - base.doorbell_latency_ns - base.completion_ns;
        OffloadCosts {
            first_fetch_ns: first,
            wq_order_ns: 170.0,
            completion_order_ns: 190.0,
            doorbell_order_ns: 540.0,
            // Fig. 8 measures doorbell order as the NIC fetching entries "one-by-one",
            // with no latency hiding; we take that fetch to hold the NIC's one fetch unit
            // for all of its 0.54 us, so fetches of different queues do not overlap.
            // Table 3's construct rates (0.7 M `if`/s) are an outcome to compare with,
            // not an input (`hytra offload` measures ours).
            managed_fetch_unit_ns: 540.0,
        }
    }
}

/// The host costs of [`NicProfile::local`], fitted to `hytra micro --backend local`.
const LOCAL_FIT: HostCosts = HostCosts {
    doorbell_ns: 0.0,
    wqe_ns: 26.0,
    poll_ns: 5.0,
    cqe_ns: 13.0,
    recv_ns: 70.0,
    copy_ns_per_kib: 120.0,
    rma_copy_ns_per_kib: 65.0,
    rest_ns: 800.0,
    recv_latency_ns: 150.0,
};

/// Machine clock of the paper's testbed (Intel Xeon E5-2650 v4, 2.2 GHz; DrTM+H §4.1),
/// used to turn cycle counts into nanoseconds.
pub const TESTBED_GHZ: f64 = 2.2;

impl NicProfile {
    /// ConnectX-4, the paper's main testbed: 16 machines, each with two 100 Gb/s
    /// ConnectX-4 MCX455A InfiniBand NICs (DrTM+H §4.1). Rates are per machine.
    pub fn cx4() -> NicProfile {
        // Per-machine peak rates of the symmetric raw-verb benchmark, 64 B payloads
        // (DrTM+H §3.1 and §4.2, Fig. 5a): WRITE 130 M/s, READ 86.9 M/s ("about 86.9M per
        // machine", §4.2), ATOMIC 48 M/s, UD SEND/RECV RPC 79 M/s.
        // Engine time per WRITE, both ends: 7.69 ns; per READ: 11.51 ns.
        let write_total = 1e3 / 130.0;
        let read_total = 1e3 / 86.9;
        // An RPC is two datagrams and each machine both calls and serves, so per RPC a
        // machine sends two and receives two datagrams: 2 * (send + recv) = 1 / 79 M,
        // 6.33 ns per SEND+RECV pair.
        let datagram_total = 1e3 / 79.0 / 2.0;
        // How the total splits between the two ends is not published; the posting side
        // gets a fixed 4 ns (WQE fetch and packetisation) and the target the rest, which
        // puts READ's extra cost (a non-posted DMA read) on the target where it happens.
        let req_ns = 4.0;
        NicProfile {
            name: "cx4",
            req: VerbCosts {
                read_ns: req_ns,
                write_ns: req_ns,
                atomic_ns: req_ns,
                datagram_ns: datagram_total / 2.0,
            },
            resp: VerbCosts {
                read_ns: read_total - req_ns,
                write_ns: write_total - req_ns,
                // The engine work of an atomic is a READ's; its rate limit is the unit.
                atomic_ns: read_total - req_ns,
                datagram_ns: datagram_total / 2.0,
            },
            // ATOMIC peaks at 48 M/s per machine (DrTM+H §4.2).
            atomic_unit_ns: 1e3 / 48.0,
            // Two 100 Gb/s ports per machine (§4.1) at 64b/66b line coding.
            link_bytes_per_ns: 2.0 * 100.0 / 8.0 * 64.0 / 66.0,
            // Each ConnectX-4 (MCX455A) sits on PCIe 3.0 x16: 15.75 GB/s.
            dma_bytes_per_ns: 15.75,
            // InfiniBand framing: LRH 8 + BTH 12 + RETH/AETH up to 16 + ICRC 4 + VCRC 2.
            rc_header_bytes: 42,
            // UD inside one subnet: LRH 8 + BTH 12 + DETH 8 + ICRC 4 + VCRC 2 (no GRH).
            ud_header_bytes: 34,
            // Latency: DrTM+H §3-§4 gives no per-verb latency beyond "several
            // microseconds" (§3.2). The only primitive-level latencies in the papers are
            // RedN's ConnectX-5 figures (RedN §5.1, Fig. 7: WRITE 1.6 us, READ and
            // atomics 1.8 us, network share 0.25 us), and DrTM+H §7 calls CX4 and CX5
            // the same generation. The stages below add up to those figures.
            wire_ns: 250.0,
            doorbell_latency_ns: 350.0,
            payload_fetch_ns: 200.0,
            target_read_ns: 450.0,
            target_write_ns: 250.0,
            completion_ns: 250.0,
            // The 16-node setting (24 workers x 16 peers, both ends: ~770 contexts per
            // machine) shows no slowdown, while 5 connections per peer per worker
            // (~3800 contexts, "exceeded the total number of QPs that can be cached",
            // DrTM+H §4.2) does. Two NICs of 512 cached contexts sit between the two.
            qp_cache_entries: 1024,
            qp_cache_ways: 8,
            // Fig. 5b: with the 80-node setting, small READs slow until they no longer
            // beat two-sided RPCs at 64 B (§4.2). The miss cost is set so that 64 B
            // READs, with both ends' contexts missing about 70% of the time, fall to
            // roughly 0.85x of their 16-node rate, below the 79 M/s RPC rate.
            qp_miss_ns: 1.5,
            qp_miss_latency_ns: 500.0,
            // The transport retries for milliseconds on real hardware; 0.5 ms keeps
            // failure tests short while staying far above any healthy round trip.
            rc_timeout_ns: 500_000.0,
            // "ATOMIC cannot correctly work with CPU's atomic operations" (§5.2).
            atomics_coherent: false,
            host: HostCosts {
                // "MMIO is costly which usually requires hundreds of cycles" (§3.2):
                // 200 cycles at the testbed's 2.2 GHz.
                doorbell_ns: 200.0 / TESTBED_GHZ,
                // The papers give no figure for building a work request, reaping a
                // completion or re-posting a receive; these are assumptions of a few
                // tens of cycles each (stores to a cached ring; a CQE read that misses
                // the cache once), kept small so that the NIC, not the host, is the
                // bottleneck of the raw-verb benchmark, as the paper reports.
                wqe_ns: 15.0,
                poll_ns: 8.0,
                cqe_ns: 20.0,
                recv_ns: 40.0,
                // memcpy at roughly 25 GB/s.
                copy_ns_per_kib: 40.0,
                // The NIC moves a request's bytes by DMA.
                rma_copy_ns_per_kib: 0.0,
                // Workers spin on their completion queues (the poll cost above).
                rest_ns: 0.0,
                recv_latency_ns: 0.0,
            },
            // RedN's verb-program figures were measured on ConnectX-5 only.
            offload: None,
        }
    }

    /// ConnectX-5, one 100 Gb/s InfiniBand NIC of one port per machine (DrTM+H Table 5),
    /// the NIC of RedN's testbed. DrTM+H §7 calls CX5 the same generation as CX4 and
    /// finds the same results on it; its rates and latencies come from RedN §5.1.
    pub fn cx5() -> NicProfile {
        // RedN Table 3: one ConnectX-5 port executes 65 M READs, 63 M WRITEs and 8.4 M
        // CAS per second. Those are rates of one port issuing to another, where the
        // serving end is the bottleneck: with the requester's fixed 4 ns (the cx4
        // convention), the target engine takes the rest of 1/R. In the symmetric
        // benchmark a machine then does 1 / (4 ns + 1/R) of each.
        let req_ns = 4.0;
        let read = 1e3 / 65.0;
        let write = 1e3 / 63.0;
        let base = NicProfile::cx4();
        NicProfile {
            name: "cx5",
            req: VerbCosts {
                read_ns: req_ns,
                write_ns: req_ns,
                atomic_ns: req_ns,
                datagram_ns: req_ns,
            },
            resp: VerbCosts {
                read_ns: read,
                write_ns: write,
                atomic_ns: read,
                // No published SEND/RECV rate for CX5: a datagram costs what a WRITE of
                // the same bytes does (an assumption).
                datagram_ns: write,
            },
            // RedN Table 3: CAS 8.4 M/s per port ("8x lower than regular verbs").
            atomic_unit_ns: 1e3 / 8.4,
            // One 100 Gb/s port (DrTM+H Table 5).
            link_bytes_per_ns: 100.0 / 8.0 * 64.0 / 66.0,
            // One NIC: half of cx4's two (DrTM+H §7: "the same generation").
            qp_cache_entries: 512,
            // RedN §5.1.1's latencies (WRITE 1.6 us, READ and atomics 1.8 us, network
            // 0.25 us) are what cx4's latency stages were built from: kept as they are.
            offload: Some(OffloadCosts::cx5()),
            ..base
        }
    }

    /// ConnectX-3, two 40 Gb/s InfiniBand NICs of one port per machine (DrTM+H Table 5).
    pub fn cx3() -> NicProfile {
        // RedN Table 1: a ConnectX-3 port processes 15 M verbs per second (64 B
        // ib_write_bw; 2 processing units). Two NICs per machine: 30 M per machine, one
        // verb per 33 ns at the serving end, the requester's 4 ns included.
        let verb = 1e3 / 30.0;
        let req_ns = 4.0;
        let resp_ns = verb - req_ns;
        // No published atomic rate for CX3. RedN measures atomics 8x slower than
        // other verbs on CX5 (PCIe synchronisation), and DrTM+H §7 says CX3 atomics
        // "block RNIC operations": an atomic holds the engine for all of it.
        let atomic_ns = 8.0 * verb;
        let base = NicProfile::cx4();
        // No published datagram rate either: cx4's ratio of a SEND+RECV pair to a
        // WRITE (RPC 79 M/s against WRITE 130 M/s per machine) applied to CX3.
        let datagram_pair = verb * (1e3 / 79.0 / 2.0) / (1e3 / 130.0);
        NicProfile {
            name: "cx3",
            req: VerbCosts {
                read_ns: req_ns,
                write_ns: req_ns,
                atomic_ns: req_ns,
                datagram_ns: datagram_pair / 2.0,
            },
            resp: VerbCosts {
                read_ns: resp_ns,
                write_ns: resp_ns,
                atomic_ns,
                datagram_ns: datagram_pair / 2.0,
            },
            atomic_unit_ns: atomic_ns,
            // Two 40 Gb/s ports (Table 5), 64b/66b coding.
            link_bytes_per_ns: 2.0 * 40.0 / 8.0 * 64.0 / 66.0,
            // ConnectX-3 is a PCIe 3.0 x8 device: 7.88 GB/s.
            dma_bytes_per_ns: 7.88,
            // The older NIC caches fewer connection contexts (DrTM+H §4 attributes the
            // poor scalability of one-sided verbs reported on CX3 to them); the size is
            // an assumption: a quarter of cx4's.
            qp_cache_entries: 256,
            ..base
        }
    }

    /// ConnectX-4 over RoCE v2: two 100 Gb/s Ethernet NICs of one port per machine
    /// (DrTM+H Table 5). §7: "RoCE only uses a different link layer": the NIC model is
    /// cx4's; only framing differs.
    pub fn roce() -> NicProfile {
        NicProfile {
            name: "roce",
            // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + RETH/AETH up to 16 + ICRC 4 + FCS
            // 4, plus preamble and inter-frame gap 20.
            rc_header_bytes: 98,
            // The same with DETH 8 instead of RETH.
            ud_header_bytes: 90,
            ..NicProfile::cx4()
        }
    }

    /// The `local` backend on this project's 2-core test machine (AMD EPYC, 2.6 GHz): no
    /// NIC at all. A one-sided request is a copy (or CPU atomic) that the posting
    /// thread makes at the doorbell, complete at once; a datagram is a copy into the
    /// receiver's inbox, which it takes when it next polls; an idle thread yields its
    /// core. Every number below is fitted to `hytra micro --backend local` (2 nodes x 1
    /// worker; latency with 1 coroutine and batch 1 at 64 B, rates with 8 coroutines and
    /// batch 8 at 64 B and, for the per-KiB costs, up to 4000 B) run in the simulator
    /// with the `host` CPU profile for the runtime's own
    /// work (docs/PERFORMANCE.md §29): a primitive-level fit, never a transaction
    /// benchmark's. It exists to check the simulator against the real backend.
    pub fn local() -> NicProfile {
        // Nothing between the threads but the memory system: the engines, links and
        // latency stages of a NIC cost (next to) nothing. Positive costs are what
        // `validate` asks of an engine; 0.1 ns leaves it never the bottleneck.
        let free = VerbCosts { read_ns: 0.1, write_ns: 0.1, atomic_ns: 0.1, datagram_ns: 0.1 };
        NicProfile {
            name: "local",
            req: free,
            resp: free,
            atomic_unit_ns: 0.1,
            // The posting thread copies at the doorbell, so a request's bytes take no
            // time after it: its completion is there when the step that rang ends. The
            // copy's CPU time is the poster's, `rma_copy_ns_per_kib` below.
            link_bytes_per_ns: 1000.0,
            dma_bytes_per_ns: 1000.0,
            rc_header_bytes: 0,
            ud_header_bytes: 0,
            wire_ns: 0.0,
            doorbell_latency_ns: 0.0,
            payload_fetch_ns: 0.0,
            target_read_ns: 0.0,
            target_write_ns: 0.0,
            completion_ns: 0.0,
            // No connection contexts to cache: big enough for any cluster hytra runs.
            qp_cache_entries: 1 << 16,
            qp_cache_ways: 8,
            qp_miss_ns: 0.0,
            qp_miss_latency_ns: 0.0,
            // A request to a crashed node fails at once there; the cx4 figure keeps
            // failure timing comparable across profiles.
            rc_timeout_ns: 500_000.0,
            // One-sided requests are the CPU's own loads, stores and atomics.
            atomics_coherent: true,
            host: LOCAL_FIT,
            offload: None,
        }
    }

    /// Looks a profile up by name.
    pub fn by_name(name: &str) -> Option<NicProfile> {
        match name {
            "cx3" => Some(NicProfile::cx3()),
            "cx4" => Some(NicProfile::cx4()),
            "cx5" => Some(NicProfile::cx5()),
            "roce" => Some(NicProfile::roce()),
            "local" => Some(NicProfile::local()),
            _ => None,
        }
    }

    /// Names accepted by [`NicProfile::by_name`].
    pub const NAMES: &'static [&'static str] = &["cx3", "cx4", "cx5", "roce", "local"];

    /// The profiles of RDMA NICs (all but `local`), the ones the swarm draws from.
    pub const RNICS: &'static [&'static str] = &["cx3", "cx4", "cx5", "roce"];

    /// Checks that every number is usable (positive, finite, consistent).
    pub fn validate(&self) -> Result<(), String> {
        let costs = [
            self.req.read_ns,
            self.req.write_ns,
            self.req.atomic_ns,
            self.req.datagram_ns,
            self.resp.read_ns,
            self.resp.write_ns,
            self.resp.atomic_ns,
            self.resp.datagram_ns,
            self.atomic_unit_ns,
            self.link_bytes_per_ns,
            self.dma_bytes_per_ns,
        ];
        if costs.iter().any(|c| !c.is_finite() || *c <= 0.0) {
            return Err(format!("profile {}: engine costs must be positive", self.name));
        }
        if self.qp_cache_ways == 0 || self.qp_cache_entries % self.qp_cache_ways != 0 {
            return Err(format!(
                "profile {}: QP cache entries must be a multiple of ways",
                self.name
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cx4_engine_costs_reproduce_the_published_rates() {
        let p = NicProfile::cx4();
        p.validate().unwrap();
        let rate = |req: f64, resp: f64| 1e3 / (req + resp);
        assert!((rate(p.req.write_ns, p.resp.write_ns) - 130.0).abs() < 0.5);
        assert!((rate(p.req.read_ns, p.resp.read_ns) - 86.9).abs() < 0.5);
        assert!((1e3 / p.atomic_unit_ns - 48.0).abs() < 0.5);
        assert!((rate(p.req.datagram_ns, p.resp.datagram_ns) / 2.0 - 79.0).abs() < 0.5);
    }

    #[test]
    fn every_profile_is_valid_and_named() {
        for name in NicProfile::NAMES {
            let p = NicProfile::by_name(name).unwrap();
            p.validate().unwrap();
            assert_eq!(p.name, *name);
        }
        assert!(NicProfile::by_name("cx9").is_none());
    }

    #[test]
    fn cx5_reproduces_redn_one_port_rates() {
        // One port issuing to another: the serving end sets the rate.
        let p = NicProfile::cx5();
        assert!((1e3 / p.resp.read_ns - 65.0).abs() < 0.5);
        assert!((1e3 / p.resp.write_ns - 63.0).abs() < 0.5);
        assert!((1e3 / p.atomic_unit_ns - 8.4).abs() < 0.05);
    }

    #[test]
    fn cx3_reproduces_two_ports_of_redn_verb_rate_and_blocking_atomics() {
        let p = NicProfile::cx3();
        let rate = 1e3 / (p.req.write_ns + p.resp.write_ns);
        assert!((rate - 30.0).abs() < 0.5, "{rate}");
        assert!(p.resp.atomic_ns >= p.atomic_unit_ns, "an atomic holds the engine");
    }

    #[test]
    fn roce_differs_from_cx4_only_in_framing() {
        let (r, c) = (NicProfile::roce(), NicProfile::cx4());
        assert!(r.rc_header_bytes > c.rc_header_bytes && r.ud_header_bytes > c.ud_header_bytes);
        assert_eq!(
            NicProfile {
                name: "cx4",
                rc_header_bytes: c.rc_header_bytes,
                ud_header_bytes: c.ud_header_bytes,
                ..r
            },
            c
        );
    }
}
