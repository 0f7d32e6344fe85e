//! Workloads by name, with their sizing: what `hytra bench --workload` names and what the
//! swarm draws. A [`WorkloadSpec`] is plain data (it can be printed, compared and sent);
//! [`WorkloadSpec::with`] builds the workload it describes and hands it, with its concrete
//! type, to a [`WorkloadVisitor`]. Not for: running it (see `run.rs`).

use hytra_fabric::ClusterShape;
use hytra_store::Catalog;
use hytra_workloads::bench::Workload;
use hytra_workloads::smallbank::SmallBank;
use hytra_workloads::tatp::{Tatp, TatpParams};
use hytra_workloads::tpcc::{TpcC, TpccMix, TpccParams, TYPES as TPCC_TYPES};
use hytra_workloads::tpce::{Tpce, TpceParams};
use hytra_workloads::ycsb::{KeyDist, Mix as YcsbMix, Ycsb, YcsbParams};

/// The names `--workload` takes.
pub const WORKLOADS: [&str; 6] = ["smallbank", "tpcc", "tpcc-no", "tpce-cp", "tatp", "ycsb"];

/// A workload and its size.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadSpec {
    /// SmallBank.
    SmallBank {
        /// Accounts per worker thread.
        accounts_per_worker: u64,
    },
    /// TPC-C: the standard mix, one transaction type, or New-Order only (TPC-C/no).
    Tpcc {
        /// Which transactions run.
        mix: TpccMix,
        /// Warehouses per worker thread.
        warehouses_per_worker: u64,
        /// Customers per district.
        customers: u64,
        /// Items.
        items: u64,
        /// Percentage of New-Order lines supplied by another warehouse.
        remote_item_pct: u64,
    },
    /// TPC-E's Customer-Position with price moves.
    TpceCp {
        /// Customers per worker thread.
        customers_per_worker: u64,
        /// Percentage of price-moving transactions.
        market_feed_pct: u64,
    },
    /// TATP.
    Tatp {
        /// Subscribers per worker thread.
        subscribers_per_worker: u64,
        /// Uniform choice of subscribers instead of the specification's skew.
        uniform: bool,
    },
    /// YCSB core workloads A-F.
    Ycsb {
        /// Which core workload.
        mix: YcsbMix,
        /// Records per worker thread.
        records_per_worker: u64,
        /// Fields per record.
        fields: u16,
        /// Bytes per field (a multiple of 8).
        field_bytes: u16,
        /// Operations per transaction.
        ops_per_txn: u16,
        /// Key distribution.
        dist: KeyDist,
    },
}

/// Receives a workload with its concrete type.
pub trait WorkloadVisitor {
    /// What the visit returns.
    type Out;
    /// Does something with `w`.
    fn visit<W: Workload>(self, w: &W) -> Self::Out;
}

/// Orders a TPC-C district can take, or inserts a YCSB worker can make, per second of
/// run: far more than any reaches (room that is never used costs no memory).
const TPCC_ORDERS_PER_S: f64 = 50_000.0;
const YCSB_INSERTS_PER_S: f64 = 200_000.0;

impl WorkloadSpec {
    /// The name as `hytra bench --workload` (and `--ycsb-mix`, `--tpcc-only`) spell it.
    pub fn name(&self) -> String {
        match self {
            WorkloadSpec::SmallBank { .. } => "smallbank".into(),
            WorkloadSpec::Tpcc { mix: TpccMix::Standard, .. } => "tpcc".into(),
            WorkloadSpec::Tpcc { mix: TpccMix::NewOrderOnly, .. } => "tpcc-no".into(),
            WorkloadSpec::Tpcc { mix: TpccMix::Only(ty), .. } => {
                format!("tpcc/{}", TPCC_TYPES.get(usize::from(*ty)).unwrap_or(&"?"))
            }
            WorkloadSpec::TpceCp { .. } => "tpce-cp".into(),
            WorkloadSpec::Tatp { .. } => "tatp".into(),
            WorkloadSpec::Ycsb { mix, .. } => format!("ycsb-{}", mix.name()),
        }
    }

    /// The name with the sizes, on one line.
    pub fn describe(&self) -> String {
        let sizes = match *self {
            WorkloadSpec::SmallBank { accounts_per_worker } => {
                format!("{accounts_per_worker} accounts/worker")
            }
            WorkloadSpec::Tpcc {
                warehouses_per_worker, customers, items, remote_item_pct, ..
            } => {
                format!(
                    "{warehouses_per_worker} warehouses/worker, {customers} customers, {items} items, {remote_item_pct}% remote"
                )
            }
            WorkloadSpec::TpceCp { customers_per_worker, market_feed_pct } => {
                format!("{customers_per_worker} customers/worker, {market_feed_pct}% market feed")
            }
            WorkloadSpec::Tatp { subscribers_per_worker, uniform } => format!(
                "{subscribers_per_worker} subscribers/worker, {}",
                if uniform { "uniform" } else { "skewed" }
            ),
            WorkloadSpec::Ycsb {
                records_per_worker,
                fields,
                field_bytes,
                ops_per_txn,
                dist,
                ..
            } => {
                let dist = match dist {
                    KeyDist::Uniform => "uniform".to_string(),
                    KeyDist::Zipfian(t) => format!("zipf {t}"),
                };
                format!(
                    "{records_per_worker} records/worker of {fields}x{field_bytes} B, {ops_per_txn} ops/txn, {dist}"
                )
            }
        };
        format!("{} ({sizes})", self.name())
    }

    /// Builds the workload for a run of `span_s` seconds (warm-up included; tables that
    /// grow get room for it) whose data is drawn from `seed`, and hands it to `v`.
    pub fn with<V: WorkloadVisitor>(&self, span_s: f64, seed: u64, v: V) -> V::Out {
        assert!(span_s.is_finite() && span_s > 0.0, "a run of {span_s} s");
        match *self {
            WorkloadSpec::SmallBank { accounts_per_worker } => {
                v.visit(&SmallBank { accounts_per_worker })
            }
            WorkloadSpec::Tpcc {
                mix,
                warehouses_per_worker,
                customers,
                items,
                remote_item_pct,
            } => v.visit(&TpcC::new(TpccParams {
                mix,
                remote_item_pct,
                warehouses_per_worker,
                customers,
                items,
                new_orders_max: (span_s * TPCC_ORDERS_PER_S) as u64 + 1_000,
                seed,
            })),
            WorkloadSpec::TpceCp { customers_per_worker, market_feed_pct } => {
                v.visit(&Tpce::new(TpceParams { customers_per_worker, market_feed_pct, seed }))
            }
            WorkloadSpec::Tatp { subscribers_per_worker, uniform } => {
                v.visit(&Tatp::new(TatpParams { subscribers_per_worker, uniform, seed }))
            }
            WorkloadSpec::Ycsb {
                mix,
                records_per_worker,
                fields,
                field_bytes,
                ops_per_txn,
                dist,
            } => v.visit(&Ycsb::new(YcsbParams {
                mix,
                records_per_worker,
                fields,
                field_bytes,
                ops_per_txn,
                dist,
                inserts_max_per_worker: (span_s * YCSB_INSERTS_PER_S) as u64 + 1_000,
                ..YcsbParams::core(mix)
            })),
        }
    }
}

impl WorkloadSpec {
    /// The workload's name as it calls itself ([`Workload::name`]) and its transaction
    /// types.
    pub fn types(&self) -> (&'static str, &'static [&'static str]) {
        struct Types;
        impl WorkloadVisitor for Types {
            type Out = (&'static str, &'static [&'static str]);
            fn visit<W: Workload>(self, w: &W) -> Self::Out {
                (w.name(), w.txn_types())
            }
        }
        self.with(1.0, 0, Types)
    }
}

/// Bytes of one partition's regions (one copy of one node's share), sized for every
/// row the run may insert: the most a new backup copies after a failure.
pub fn partition_bytes(
    workload: &WorkloadSpec,
    span_s: f64,
    seed: u64,
    shape: ClusterShape,
    replication: u16,
) -> u64 {
    struct Bytes(ClusterShape, u16);
    impl WorkloadVisitor for Bytes {
        type Out = u64;
        fn visit<W: Workload>(self, w: &W) -> u64 {
            let Ok(catalog) = Catalog::new(w.tables(self.0), self.0.nodes, self.1) else {
                return 0;
            };
            catalog.regions().filter(|&(_, p, _, _)| p == 0).map(|(_, _, bytes, _)| bytes).sum()
        }
    }
    workload.with(span_s, seed, Bytes(shape, replication))
}

/// What is said of a workload name that is not one of [`WORKLOADS`].
pub fn unknown_workload(name: &str) -> String {
    format!("unknown workload '{name}' (expected one of {})", WORKLOADS.join(", "))
}
