//! TPC-C's tables as records: keys, partitioning, and the word layout of every row.
//!
//! Every warehouse-scoped table is range-partitioned by warehouse, and warehouse `w` is
//! home to worker `w` of the cluster (one warehouse per worker), so it lives on that
//! worker's node. Keys number each table's rows densely within a warehouse (the store's
//! sequential index), with ids 1-based as in the specification:
//!
//! | table | key |
//! |---|---|
//! | warehouse | `w` |
//! | district, delivery head | `w * 10 + (d - 1)` (the "district key" `dk`) |
//! | customer, customer's last order | `dk * customers_per_district + (c - 1)` |
//! | history | `w * history_per_warehouse + n` (n: the warehouse's own counter) |
//! | order, new-order | `dk * orders_per_district + o` |
//! | order-line | `order key * 16 + ol` |
//! | stock | `w * items + (i - 1)` |
//!
//! Items are read-only and the same on every node, so each node keeps them outside the
//! store (see `Items`). Two tables stand in for the ordered indexes the specification's
//! transactions scan: the delivery head (per district, the oldest undelivered order) and
//! the customer's last order (for Order-Status); both are updated transactionally.
//!
//! Money is in cents, rates (tax, discount) in hundredths of a percent, strings packed
//! eight bytes to a word.

use hytra_store::{Fill, IndexLayout, Partitioner, TableId, TableSpec};

/// Warehouse.
pub const WAREHOUSE: TableId = TableId(0);
/// District.
pub const DISTRICT: TableId = TableId(1);
/// Customer.
pub const CUSTOMER: TableId = TableId(2);
/// History.
pub const HISTORY: TableId = TableId(3);
/// New-order queue.
pub const NEW_ORDER: TableId = TableId(4);
/// Orders.
pub const ORDER: TableId = TableId(5);
/// Order lines.
pub const ORDER_LINE: TableId = TableId(6);
/// Stock.
pub const STOCK: TableId = TableId(7);
/// Per customer: the id of its most recent order.
pub const CUSTOMER_LAST_ORDER: TableId = TableId(8);
/// Per district: the oldest order not yet delivered.
pub const DELIVERY_HEAD: TableId = TableId(9);

/// Districts per warehouse.
pub const DISTRICTS: u64 = 10;
/// Order lines per order, at most (key stride per order: 16).
pub const LINES_MAX: u64 = 15;
const LINE_STRIDE: u64 = 16;

/// Field offsets (words) of a warehouse row.
pub mod w {
    /// `w_name` (10 bytes).
    pub const NAME: usize = 0;
    /// `w_street_1`, `w_street_2`, `w_city` (20 bytes each), `w_state` (2), `w_zip` (9).
    pub const ADDRESS: usize = 2;
    /// `w_tax`.
    pub const TAX: usize = 14;
    /// `w_ytd`.
    pub const YTD: usize = 15;
    /// Words.
    pub const WORDS: u16 = 16;
}

/// Field offsets (words) of a district row.
pub mod d {
    /// `d_name` (10 bytes).
    pub const NAME: usize = 0;
    /// Address, as for a warehouse.
    pub const ADDRESS: usize = 2;
    /// `d_tax`.
    pub const TAX: usize = 14;
    /// `d_ytd`.
    pub const YTD: usize = 15;
    /// `d_next_o_id`.
    pub const NEXT_O_ID: usize = 16;
    /// Words.
    pub const WORDS: u16 = 17;
}

/// Field offsets (words) of a customer row.
pub mod c {
    /// `c_first` (16 bytes).
    pub const FIRST: usize = 0;
    /// `c_middle` (2).
    pub const MIDDLE: usize = 2;
    /// `c_last` (16).
    pub const LAST: usize = 3;
    /// Street 1, street 2, city (20 each), state (2), zip (9).
    pub const ADDRESS: usize = 5;
    /// `c_phone` (16).
    pub const PHONE: usize = 17;
    /// `c_since`.
    pub const SINCE: usize = 19;
    /// `c_credit` ("GC" or "BC").
    pub const CREDIT: usize = 20;
    /// `c_credit_lim`.
    pub const CREDIT_LIM: usize = 21;
    /// `c_discount`.
    pub const DISCOUNT: usize = 22;
    /// `c_balance`.
    pub const BALANCE: usize = 23;
    /// `c_ytd_payment`.
    pub const YTD_PAYMENT: usize = 24;
    /// `c_payment_cnt`.
    pub const PAYMENT_CNT: usize = 25;
    /// `c_delivery_cnt`.
    pub const DELIVERY_CNT: usize = 26;
    /// `c_data` (500 bytes).
    pub const DATA: usize = 27;
    /// Bytes of `c_data`.
    pub const DATA_BYTES: usize = 500;
    /// Words.
    pub const WORDS: u16 = 90;
}

/// Field offsets (words) of a history row.
pub mod h {
    /// `h_c_id`, `h_c_d_id`, `h_c_w_id`, `h_d_id`, `h_w_id`.
    pub const IDS: usize = 0;
    /// `h_date`.
    pub const DATE: usize = 5;
    /// `h_amount`.
    pub const AMOUNT: usize = 6;
    /// `h_data` (24 bytes).
    pub const DATA: usize = 7;
    /// Words.
    pub const WORDS: u16 = 10;
}

/// Field offsets (words) of an order row.
pub mod o {
    /// `o_c_id`.
    pub const C_ID: usize = 0;
    /// `o_entry_d`.
    pub const ENTRY_D: usize = 1;
    /// `o_carrier_id` (0: none yet).
    pub const CARRIER_ID: usize = 2;
    /// `o_ol_cnt`.
    pub const OL_CNT: usize = 3;
    /// `o_all_local`.
    pub const ALL_LOCAL: usize = 4;
    /// Words.
    pub const WORDS: u16 = 5;
}

/// Field offsets (words) of an order-line row.
pub mod ol {
    /// `ol_i_id`.
    pub const I_ID: usize = 0;
    /// `ol_supply_w_id`.
    pub const SUPPLY_W_ID: usize = 1;
    /// `ol_delivery_d` (0: not delivered).
    pub const DELIVERY_D: usize = 2;
    /// `ol_quantity`.
    pub const QUANTITY: usize = 3;
    /// `ol_amount`.
    pub const AMOUNT: usize = 4;
    /// `ol_dist_info` (24 bytes).
    pub const DIST_INFO: usize = 5;
    /// Words.
    pub const WORDS: u16 = 8;
}

/// Field offsets (words) of a stock row.
pub mod s {
    /// `s_quantity`.
    pub const QUANTITY: usize = 0;
    /// `s_dist_01` .. `s_dist_10` (24 bytes each, three words apart).
    pub const DIST: usize = 1;
    /// `s_ytd`.
    pub const YTD: usize = 31;
    /// `s_order_cnt`.
    pub const ORDER_CNT: usize = 32;
    /// `s_remote_cnt`.
    pub const REMOTE_CNT: usize = 33;
    /// `s_data` (50 bytes).
    pub const DATA: usize = 34;
    /// Words.
    pub const WORDS: u16 = 41;
}

/// The sizes a TPC-C database is built with.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Scale {
    /// Warehouses per node (one per worker).
    pub warehouses_per_node: u64,
    /// Customers per district (3000 in the specification).
    pub customers: u64,
    /// Items (100 000 in the specification).
    pub items: u64,
    /// Order ids a district can reach: the initial orders plus room for the run's.
    pub orders: u64,
    /// History rows a warehouse can hold: the initial ones plus room for the run's.
    pub history: u64,
}

impl Scale {
    /// District key.
    pub fn dk(w: u64, d: u64) -> u64 {
        debug_assert!((1..=DISTRICTS).contains(&d));
        w * DISTRICTS + d - 1
    }

    /// Customer key (and key of its last-order row).
    pub fn customer(&self, w: u64, d: u64, c: u64) -> u64 {
        debug_assert!((1..=self.customers).contains(&c));
        Self::dk(w, d) * self.customers + c - 1
    }

    /// Order key (and key of its new-order row).
    pub fn order(&self, w: u64, d: u64, o: u64) -> u64 {
        debug_assert!(o > 0 && o < self.orders, "order id {o} out of range");
        Self::dk(w, d) * self.orders + o
    }

    /// Order-line key.
    pub fn line(&self, order_key: u64, number: u64) -> u64 {
        debug_assert!((1..=LINES_MAX).contains(&number));
        order_key * LINE_STRIDE + number
    }

    /// Stock key.
    pub fn stock(&self, w: u64, i: u64) -> u64 {
        debug_assert!((1..=self.items).contains(&i));
        w * self.items + i - 1
    }

    /// History key.
    pub fn history(&self, w: u64, n: u64) -> u64 {
        debug_assert!(n < self.history);
        w * self.history + n
    }

    /// (warehouse, district, order id) of an order key.
    pub fn order_parts(&self, key: u64) -> (u64, u64, u64) {
        let dk = key / self.orders;
        (dk / DISTRICTS, dk % DISTRICTS + 1, key % self.orders)
    }

    /// The order key of an order-line key.
    pub fn line_order(&self, key: u64) -> u64 {
        key / LINE_STRIDE
    }

    /// Keys per warehouse of every table, in table-id order.
    fn keys_per_warehouse(&self) -> [u64; 10] {
        [
            1,
            DISTRICTS,
            DISTRICTS * self.customers,
            self.history,
            DISTRICTS * self.orders,
            DISTRICTS * self.orders,
            DISTRICTS * self.orders * LINE_STRIDE,
            self.items,
            DISTRICTS * self.customers,
            DISTRICTS,
        ]
    }

    /// The tables, each partitioned by warehouse.
    pub fn tables(&self) -> Vec<TableSpec> {
        let names = [
            "warehouse",
            "district",
            "customer",
            "history",
            "new_order",
            "order",
            "order_line",
            "stock",
            "customer_last_order",
            "delivery_head",
        ];
        let words =
            [w::WORDS, d::WORDS, c::WORDS, h::WORDS, 1, o::WORDS, ol::WORDS, s::WORDS, 1, 1];
        let per_w = self.keys_per_warehouse();
        // Tables sized for the rows a run inserts hold their loaded rows in islands at
        // the start of each district's key range.
        let loaded = self.loaded_rows();
        let fill: [Fill; 10] = std::array::from_fn(|i| match loaded[i] * 2 < per_w[i] {
            true => Fill::Sparse,
            false => Fill::Dense,
        });
        (0..10)
            .map(|i| {
                // Capacity covers every key (order lines use 5-15 of every 16): with the
                // sequential index, key positions map to buckets one to one, and only
                // the rows a run creates touch memory.
                TableSpec {
                    id: TableId(i as u16),
                    name: names[i].into(),
                    payload_words: words[i],
                    capacity: per_w[i] * self.warehouses_per_node,
                    partitioner: Partitioner::Range {
                        keys_per_partition: per_w[i] * self.warehouses_per_node,
                    },
                    index: IndexLayout::Sequential,
                    fill: fill[i],
                }
            })
            .collect()
    }

    /// Rows a warehouse holds once loaded, per table (what loading touches).
    pub fn loaded_rows(&self) -> [u64; 10] {
        let orders = DISTRICTS * self.customers;
        [
            1,
            DISTRICTS,
            orders,
            orders,
            orders * 9 / 30,
            orders,
            orders * 10,
            self.items,
            orders,
            DISTRICTS,
        ]
    }
}

/// Packs `s` into words, eight bytes each, little endian, zero padded.
pub fn put_str(dst: &mut [u64], s: &[u8]) {
    assert!(s.len() <= dst.len() * 8, "{} bytes do not fit {} words", s.len(), dst.len());
    for (i, w) in dst.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        let from = (i * 8).min(s.len());
        let to = (i * 8 + 8).min(s.len());
        b[..to - from].copy_from_slice(&s[from..to]);
        *w = u64::from_le_bytes(b);
    }
}

/// The bytes of `len` packed by [`put_str`] (up to the first zero byte).
pub fn get_str(src: &[u64], len: usize) -> Vec<u8> {
    let mut out: Vec<u8> = src.iter().flat_map(|w| w.to_le_bytes()).take(len).collect();
    if let Some(end) = out.iter().position(|&b| b == 0) {
        out.truncate(end);
    }
    out
}

/// Words a string field of `bytes` bytes takes.
pub const fn words_for(bytes: usize) -> usize {
    bytes.div_ceil(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip() {
        let mut w = [0u64; 3];
        put_str(&mut w, b"ORIGINAL-ish text");
        assert_eq!(get_str(&w, 24), b"ORIGINAL-ish text");
        put_str(&mut w, b"");
        assert_eq!(get_str(&w, 24), b"");
    }

    #[test]
    fn layouts_fit_and_do_not_overlap() {
        assert_eq!(c::DATA + words_for(c::DATA_BYTES), usize::from(c::WORDS));
        assert_eq!(s::DATA + words_for(50), usize::from(s::WORDS));
        assert_eq!(ol::DIST_INFO + words_for(24), usize::from(ol::WORDS));
        assert_eq!(h::DATA + words_for(24), usize::from(h::WORDS));
        assert_eq!(w::ADDRESS + 3 * words_for(20) + 1 + words_for(9), w::TAX);
    }

    #[test]
    fn tables_sized_for_inserts_are_sparse_and_loaded_ones_dense() {
        // As `TpcC` sizes a run: orders for 1000 New-Orders beyond the 300 loaded.
        let s = Scale {
            warehouses_per_node: 2,
            customers: 300,
            items: 1000,
            orders: 1301,
            history: 3000 + 20_000,
        };
        let fill: Vec<Fill> = s.tables().iter().map(|t| t.fill).collect();
        for t in [HISTORY, NEW_ORDER, ORDER, ORDER_LINE] {
            assert_eq!(fill[usize::from(t.0)], Fill::Sparse, "{t:?}");
        }
        for t in [WAREHOUSE, DISTRICT, CUSTOMER, STOCK] {
            assert_eq!(fill[usize::from(t.0)], Fill::Dense, "{t:?}");
        }
    }

    #[test]
    fn keys_stay_in_their_warehouse_partition() {
        let s =
            Scale { warehouses_per_node: 2, customers: 30, items: 100, orders: 50, history: 40 };
        let tables = s.tables();
        let part = |t: TableId, key: u64| match tables[usize::from(t.0)].partitioner {
            Partitioner::Range { keys_per_partition } => key / keys_per_partition,
            Partitioner::Modulo => unreachable!(),
        };
        for wh in 0..6u64 {
            let node = wh / 2;
            assert_eq!(part(WAREHOUSE, wh), node);
            assert_eq!(part(DISTRICT, Scale::dk(wh, 10)), node);
            assert_eq!(part(CUSTOMER, s.customer(wh, 10, 30)), node);
            assert_eq!(part(ORDER, s.order(wh, 10, 49)), node);
            assert_eq!(part(ORDER_LINE, s.line(s.order(wh, 10, 49), 15)), node);
            assert_eq!(part(STOCK, s.stock(wh, 100)), node);
            assert_eq!(part(HISTORY, s.history(wh, 39)), node);
            assert_eq!(s.order_parts(s.order(wh, 7, 33)), (wh, 7, 33));
        }
    }
}
