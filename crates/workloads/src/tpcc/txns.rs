//! The five TPC-C transactions (clause 2.4-2.8): their inputs, drawn as the
//! specification says, and their bodies on the engine's transaction API.

use std::sync::{Arc, OnceLock};

use hytra_fabric::rng::Rng;
use hytra_fabric::{Endpoint, NodeId, WorkerId};
use hytra_rt::RpcType;
use hytra_store::NodeStore;
use hytra_txn::{Abort, AbortReason, Membership, Rec, Txn};

use super::load::{nurand, uniform, Items, NameIndex, NuRand};
use super::schema::*;
use crate::tally::Counts;

/// New-Order.
pub const NEW_ORDER_TX: u8 = 0;
/// Payment.
pub const PAYMENT_TX: u8 = 1;
/// Order-Status.
pub const ORDER_STATUS_TX: u8 = 2;
/// Delivery.
pub const DELIVERY_TX: u8 = 3;
/// Stock-Level.
pub const STOCK_LEVEL_TX: u8 = 4;

/// The RPC that looks a customer up by last name in another node's index.
pub const NAME_LOOKUP: RpcType = RpcType(hytra_txn::wire::WORKLOAD_TYPES_FIRST);

/// What every transaction of one client needs to know about the database.
pub struct Env {
    /// Sizes.
    pub scale: Scale,
    /// NURand constants.
    pub nu: NuRand,
    /// Warehouses in the cluster (one per worker).
    pub warehouses: u64,
    /// Nodes in the cluster.
    pub nodes: u64,
    /// The items.
    pub items: Arc<Items>,
    /// The customer name indexes of the partitions this node holds.
    pub names: Arc<NodeNames>,
    /// This client's node.
    pub node: u64,
    /// This client's worker index on its node (the peer it asks on other nodes).
    pub index: u16,
}

impl Env {
    /// The node that holds warehouse `w`.
    pub fn node_of(&self, w: u64) -> u64 {
        w / self.scale.warehouses_per_node
    }

    /// A warehouse other than `home`, on another node if `other_node` (and there is one).
    pub fn other_warehouse(&self, rng: &mut Rng, home: u64, other_node: bool) -> u64 {
        if self.warehouses == 1 {
            return home;
        }
        if other_node && self.nodes > 1 {
            let wpn = self.scale.warehouses_per_node;
            let node = (self.node_of(home) + 1 + rng.below(self.nodes - 1)) % self.nodes;
            return node * wpn + rng.below(wpn);
        }
        let w = rng.below(self.warehouses - 1);
        if w >= home {
            w + 1
        } else {
            w
        }
    }
}

/// One order line of a New-Order.
#[derive(Copy, Clone, Debug, Default)]
pub struct LineInput {
    /// `ol_i_id` (0: an unused id, which rolls the transaction back).
    pub item: u64,
    /// `ol_supply_w_id`.
    pub supply_w: u64,
    /// `ol_quantity`.
    pub quantity: u64,
}

/// A customer chosen by id or by last name.
#[derive(Copy, Clone, Debug)]
pub enum Who {
    /// By `c_id`.
    Id(u64),
    /// By the number of `c_last`.
    Name(u16),
}

/// The inputs of one transaction, drawn before its first attempt (retries reuse them).
#[derive(Clone, Debug)]
pub enum Input {
    /// New-Order.
    NewOrder {
        /// District.
        d: u64,
        /// Customer.
        c: u64,
        /// Lines (`ol_cnt` of them).
        lines: Vec<LineInput>,
    },
    /// Payment.
    Payment {
        /// District.
        d: u64,
        /// The customer's warehouse and district.
        c_w: u64,
        /// The customer's district.
        c_d: u64,
        /// The customer.
        who: Who,
        /// `h_amount` in cents.
        amount: u64,
    },
    /// Order-Status.
    OrderStatus {
        /// District.
        d: u64,
        /// The customer.
        who: Who,
    },
    /// Delivery.
    Delivery {
        /// `o_carrier_id`.
        carrier: u64,
    },
    /// Stock-Level.
    StockLevel {
        /// District (fixed per terminal).
        d: u64,
        /// Quantity threshold.
        threshold: u64,
    },
}

/// Which transactions run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mix {
    /// The specification's mix: New-Order 45%, Payment 43%, the others 4% each.
    Standard,
    /// New-Order only, every one distributed (DrTM+H's TPC-C/no).
    NewOrderOnly,
    /// One transaction type alone (by type id), as the standard mix draws its inputs.
    Only(u8),
}

/// Draws the next transaction of a client whose home is `home`.
#[allow(clippy::too_many_arguments)]
pub fn draw(
    rng: &mut Rng,
    env: &Env,
    mix: Mix,
    remote_item_pct: u64,
    home: u64,
    terminal_d: u64,
) -> (u8, Input) {
    let roll = match mix {
        Mix::Standard => rng.below(100),
        Mix::NewOrderOnly => 0,
        Mix::Only(ty) => [0, 45, 88, 92, 96][usize::from(ty.min(4))],
    };
    let customers = env.scale.customers;
    let customer = |rng: &mut Rng| nurand(rng, 1023, env.nu.c_id, 1, customers);
    let who = |rng: &mut Rng| {
        if rng.below(100) < 60 {
            Who::Name(nurand(rng, 255, env.nu.c_last_run, 0, 999.min(customers - 1)) as u16)
        } else {
            Who::Id(customer(rng))
        }
    };
    match roll {
        0..45 => {
            let d = uniform(rng, 1, DISTRICTS);
            let c = customer(rng);
            let n = uniform(rng, 5, LINES_MAX) as usize;
            let rollback = mix != Mix::NewOrderOnly && rng.below(100) == 0;
            let mut lines: Vec<LineInput> = (0..n)
                .map(|_| {
                    let item = nurand(rng, 8191, env.nu.i_id, 1, env.scale.items);
                    let remote = rng.below(100) < remote_item_pct;
                    let supply_w = if remote {
                        env.other_warehouse(rng, home, mix == Mix::NewOrderOnly)
                    } else {
                        home
                    };
                    LineInput { item, supply_w, quantity: uniform(rng, 1, 10) }
                })
                .collect();
            if mix == Mix::NewOrderOnly && lines.iter().all(|l| l.supply_w == home) {
                // Every TPC-C/no transaction is distributed: one line at least is
                // supplied by a warehouse on another node.
                let i = rng.below(n as u64) as usize;
                lines[i].supply_w = env.other_warehouse(rng, home, true);
            }
            if rollback {
                lines[n - 1].item = 0;
            }
            (NEW_ORDER_TX, Input::NewOrder { d, c, lines })
        }
        45..88 => {
            let d = uniform(rng, 1, DISTRICTS);
            let (c_w, c_d) = if rng.below(100) < 85 {
                (home, d)
            } else {
                (env.other_warehouse(rng, home, false), uniform(rng, 1, DISTRICTS))
            };
            let amount = uniform(rng, 100, 500_000);
            (PAYMENT_TX, Input::Payment { d, c_w, c_d, who: who(rng), amount })
        }
        88..92 => {
            let d = uniform(rng, 1, DISTRICTS);
            (ORDER_STATUS_TX, Input::OrderStatus { d, who: who(rng) })
        }
        92..96 => (DELIVERY_TX, Input::Delivery { carrier: uniform(rng, 1, 10) }),
        _ => (STOCK_LEVEL_TX, Input::StockLevel { d: terminal_d, threshold: uniform(rng, 10, 20) }),
    }
}

/// What a committed transaction adds to the oracle's expectations.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Effect {
    /// Orders created.
    pub new_orders: u64,
    /// Money paid (cents).
    pub paid: u64,
    /// History rows inserted.
    pub history: u64,
}

impl Counts for Effect {
    fn plus(self, o: Effect) -> Effect {
        Effect {
            new_orders: self.new_orders + o.new_orders,
            paid: self.paid + o.paid,
            history: self.history + o.history,
        }
    }
}

/// Per-attempt scratch of a client (reused across transactions).
#[derive(Default)]
pub struct Scratch {
    keys: Vec<(hytra_store::TableId, u64)>,
    recs: Vec<Rec>,
    recs2: Vec<Rec>,
    items: Vec<u64>,
}

fn money(v: u64) -> i64 {
    v as i64
}

/// Runs one attempt of `input` at home warehouse `home`. `history_key` is the key a
/// Payment inserts its history row under.
pub async fn run<E: Endpoint>(
    t: &mut Txn<'_, E>,
    env: &Env,
    home: u64,
    input: &Input,
    history_key: u64,
    sc: &mut Scratch,
) -> Result<Effect, Abort> {
    match input {
        Input::NewOrder { d, c, lines } => new_order(t, env, home, *d, *c, lines, sc).await,
        Input::Payment { d, c_w, c_d, who, amount } => {
            payment(t, env, home, *d, *c_w, *c_d, *who, *amount, history_key).await
        }
        Input::OrderStatus { d, who } => order_status(t, env, home, *d, *who, sc).await,
        Input::Delivery { carrier } => delivery(t, env, home, *carrier, sc).await,
        Input::StockLevel { d, threshold } => stock_level(t, env, home, *d, *threshold, sc).await,
    }
}

async fn new_order<E: Endpoint>(
    t: &mut Txn<'_, E>,
    env: &Env,
    w: u64,
    d: u64,
    c: u64,
    lines: &[LineInput],
    sc: &mut Scratch,
) -> Result<Effect, Abort> {
    let scale = &env.scale;
    // Every item must exist (an unused id rolls the transaction back, clause 2.4.2.3).
    if lines.iter().any(|l| l.item == 0 || l.item > env.items.len()) {
        return Err(Abort(AbortReason::User));
    }
    // The stock rows (remote ones among them) first, all at once: their reads overlap.
    // The district, which every New-Order of the district updates, comes last and is
    // local, so the time between reading and locking it, when a concurrent New-Order
    // would invalidate it, stays short.
    sc.keys.clear();
    sc.keys.extend(lines.iter().map(|l| (STOCK, scale.stock(l.supply_w, l.item))));
    t.read_all(&sc.keys, true, &mut sc.recs).await?;
    let [wr, cr] =
        t.read_many([(WAREHOUSE, w), (CUSTOMER, scale.customer(w, d, c))], false).await?;
    let dr = t.read_for_update(DISTRICT, Scale::dk(w, d)).await?;
    let w_tax = t.get(wr)[w::TAX];
    let c_discount = t.get(cr)[c::DISCOUNT];
    let d_tax = t.get(dr)[d::TAX];
    let o = t.get(dr)[d::NEXT_O_ID];
    if o >= scale.orders {
        // The run outlasted the order capacity it was sized for.
        return Err(Abort(AbortReason::Full));
    }
    t.update(dr)[d::NEXT_O_ID] = o + 1;
    let okey = scale.order(w, d, o);
    let all_local = lines.iter().all(|l| l.supply_w == w);
    let now = t.ctx().co().now_ns();
    t.insert(ORDER, okey, &[c, now, 0, lines.len() as u64, u64::from(all_local)])?;
    t.insert(NEW_ORDER, okey, &[1])?;
    t.write(CUSTOMER_LAST_ORDER, scale.customer(w, d, c), &[o]).await?;
    let mut total = 0u64;
    for (n, (l, &sr)) in lines.iter().zip(&sc.recs).enumerate() {
        let i = (l.item - 1) as usize;
        let price = u64::from(env.items.price[i]);
        let stock = t.update(sr);
        let q = stock[s::QUANTITY];
        stock[s::QUANTITY] =
            if q >= l.quantity + 10 { q - l.quantity } else { q + 91 - l.quantity };
        stock[s::YTD] += l.quantity;
        stock[s::ORDER_CNT] += 1;
        if l.supply_w != w {
            stock[s::REMOTE_CNT] += 1;
        }
        let dist_at = s::DIST + 3 * (d as usize - 1);
        let mut dist = [0u64; 3];
        dist.copy_from_slice(&stock[dist_at..dist_at + 3]);
        let amount = l.quantity * price;
        total += amount;
        let mut line = [0u64; ol::WORDS as usize];
        line[ol::I_ID] = l.item;
        line[ol::SUPPLY_W_ID] = l.supply_w;
        line[ol::QUANTITY] = l.quantity;
        line[ol::AMOUNT] = amount;
        line[ol::DIST_INFO..ol::DIST_INFO + 3].copy_from_slice(&dist);
        t.insert(ORDER_LINE, scale.line(okey, n as u64 + 1), &line)?;
    }
    // The terminal's total (clause 2.4.2.2); computed as the specification does, shown
    // to nobody.
    let _total = total * (10_000 - c_discount) / 10_000 * (10_000 + w_tax + d_tax) / 10_000;
    Ok(Effect { new_orders: 1, ..Effect::default() })
}

/// The customer `who` of district `(cw, cd)`: by id, or by last name through the
/// index at the primary of the district's partition in the attempt's configuration (an
/// RPC if that is not this node).
async fn find_customer<E: Endpoint>(
    t: &Txn<'_, E>,
    env: &Env,
    cw: u64,
    cd: u64,
    who: Who,
) -> Result<u64, Abort> {
    let name = match who {
        Who::Id(c) => return Ok(c),
        Who::Name(n) => n,
    };
    let dk = Scale::dk(cw, cd);
    let node = u64::from(t.primary_of(WAREHOUSE, cw).0);
    if node == env.node {
        let index = env.names.get(env.node_of(cw) as u16);
        let index = index.expect("a primary holds a replica of its partition's name index");
        return index.pick(dk, name).ok_or(Abort(AbortReason::User));
    }
    let mut req = [0u8; 10];
    req[..8].copy_from_slice(&dk.to_le_bytes());
    req[8..].copy_from_slice(&name.to_le_bytes());
    let co = t.ctx().co();
    let dest = WorkerId { node: hytra_fabric::NodeId(node as u16), index: env.index };
    let ticket =
        co.call_waiting(dest, NAME_LOOKUP, &req).await.map_err(|_| Abort(AbortReason::Timeout))?;
    let reply = co.reply(ticket, |r| r.try_into().ok().map(u64::from_le_bytes)).await;
    match reply {
        Ok(Some(NOT_HELD)) => panic!("{dest} holds no replica of warehouse {cw}'s name index"),
        Ok(Some(0)) => Err(Abort(AbortReason::User)),
        Ok(Some(c)) => Ok(c),
        Ok(None) => panic!("malformed name lookup reply"),
        Err(_) => Err(Abort(AbortReason::Timeout)),
    }
}

/// A [`NAME_LOOKUP`] answer: this node holds no replica of the district's partition
/// (routing sends lookups to primaries only, so this is a bug).
pub const NOT_HELD: u64 = u64::MAX;

/// One node's customer name indexes, per partition (the warehouses of one node at load).
/// Names never change, so every replica of an index is the same: those of the partitions
/// the node held from the start were built while loading; one of a partition it became
/// the primary of after a failure is built from its customer rows when first asked.
pub struct NodeNames {
    node: NodeId,
    store: Arc<NodeStore>,
    membership: Arc<Membership>,
    customers: u64,
    indexes: Vec<OnceLock<Arc<NameIndex>>>,
}

impl NodeNames {
    /// The indexes of `node`, starting with those built at load (`loaded`, per
    /// partition); `customers` per district.
    pub fn new(
        node: NodeId,
        store: Arc<NodeStore>,
        membership: Arc<Membership>,
        customers: u64,
        loaded: impl Iterator<Item = Option<Arc<NameIndex>>>,
    ) -> NodeNames {
        let indexes = loaded
            .map(|i| {
                let cell = OnceLock::new();
                if let Some(i) = i {
                    let _ = cell.set(i);
                }
                cell
            })
            .collect();
        NodeNames { node, store, membership, customers, indexes }
    }

    /// Partition `p`'s index, if this node holds one or is the partition's primary (whose
    /// replica holds every customer row).
    pub fn get(&self, p: u16) -> Option<Arc<NameIndex>> {
        let cell = self.indexes.get(usize::from(p))?;
        if let Some(i) = cell.get() {
            return Some(i.clone());
        }
        if self.membership.current().primary(p) != self.node {
            return None;
        }
        let replica = self.store.replica(CUSTOMER, p);
        let mut rows = Vec::new();
        for (off, key) in replica.records() {
            let mut row = vec![0u64; replica.payload_words()];
            // Names never change: any whole version of the row will do.
            let Ok(snap) = replica.read(off, key, &mut row) else { continue };
            if hytra_store::layout::is_present(snap.version) {
                rows.push((key, row));
            }
        }
        let built = NameIndex::from_rows(self.customers, rows.iter().map(|(k, r)| (*k, &r[..])));
        Some(cell.get_or_init(|| Arc::new(built)).clone())
    }
}

/// Serves [`NAME_LOOKUP`] from this node's indexes (`names`; a partition is
/// `warehouses_per_node` warehouses): the customer id, 0 if none, [`NOT_HELD`] if this
/// node holds no replica of the district.
pub fn serve_name_lookup(
    names: &NodeNames,
    warehouses_per_node: u64,
    req: &[u8],
    reply: &mut Vec<u8>,
) {
    let c = (req.len() == 10)
        .then(|| {
            let dk = u64::from_le_bytes(req[..8].try_into().expect("8 bytes"));
            let name = u16::from_le_bytes(req[8..].try_into().expect("2 bytes"));
            let partition = dk / DISTRICTS / warehouses_per_node.max(1);
            match u16::try_from(partition).ok().and_then(|p| names.get(p)) {
                Some(index) => index.pick(dk, name).or(Some(0)),
                None => Some(NOT_HELD),
            }
        })
        .flatten()
        .unwrap_or(0);
    reply.extend_from_slice(&c.to_le_bytes());
}

#[allow(clippy::too_many_arguments)]
async fn payment<E: Endpoint>(
    t: &mut Txn<'_, E>,
    env: &Env,
    w: u64,
    d: u64,
    cw: u64,
    cd: u64,
    who: Who,
    amount: u64,
    history_key: u64,
) -> Result<Effect, Abort> {
    let scale = &env.scale;
    let cid = find_customer(t, env, cw, cd, who).await?;
    // The customer (perhaps remote) first; the warehouse and district, which every
    // Payment of the warehouse updates, last (see New-Order).
    let cr = t.read_for_update(CUSTOMER, scale.customer(cw, cd, cid)).await?;
    let [wr, dr] = t.read_many([(WAREHOUSE, w), (DISTRICT, Scale::dk(w, d))], true).await?;
    t.update(wr)[w::YTD] += amount;
    t.update(dr)[d::YTD] += amount;
    let mut names = [0u64; 3];
    names[..2].copy_from_slice(&t.get(wr)[w::NAME..w::NAME + 2]);
    let d_name = get_str(&t.get(dr)[d::NAME..d::NAME + 2], 10);
    let cust = t.update(cr);
    cust[c::BALANCE] = (money(cust[c::BALANCE]) - amount as i64) as u64;
    cust[c::YTD_PAYMENT] += amount;
    cust[c::PAYMENT_CNT] += 1;
    if get_str(&cust[c::CREDIT..c::CREDIT + 1], 2) == b"BC" {
        // Bad credit: the payment is prepended to c_data (clause 2.5.2.2).
        let data_words = c::DATA..c::DATA + words_for(c::DATA_BYTES);
        let mut data = format!("{cid} {cd} {cw} {d} {w} {amount}|").into_bytes();
        data.extend(get_str(&cust[data_words.clone()], c::DATA_BYTES));
        data.truncate(c::DATA_BYTES);
        put_str(&mut cust[data_words], &data);
    }
    let mut h_data = get_str(&names[..2], 10);
    h_data.extend_from_slice(b"    ");
    h_data.extend(d_name);
    let mut hist = [0u64; h::WORDS as usize];
    hist[h::IDS..h::IDS + 5].copy_from_slice(&[cid, cd, cw, d, w]);
    hist[h::DATE] = t.ctx().co().now_ns();
    hist[h::AMOUNT] = amount;
    put_str(&mut hist[h::DATA..h::DATA + 3], &h_data);
    t.insert(HISTORY, history_key, &hist)?;
    Ok(Effect { paid: amount, history: 1, ..Effect::default() })
}

async fn order_status<E: Endpoint>(
    t: &mut Txn<'_, E>,
    env: &Env,
    w: u64,
    d: u64,
    who: Who,
    sc: &mut Scratch,
) -> Result<Effect, Abort> {
    let scale = &env.scale;
    let cid = find_customer(t, env, w, d, who).await?;
    let ckey = scale.customer(w, d, cid);
    let [_cr, lo] = t.read_many([(CUSTOMER, ckey), (CUSTOMER_LAST_ORDER, ckey)], false).await?;
    let o = t.get(lo)[0];
    let okey = scale.order(w, d, o);
    let or = t.read(ORDER, okey).await?;
    let n = t.get(or)[o::OL_CNT];
    sc.keys.clear();
    sc.keys.extend((1..=n).map(|k| (ORDER_LINE, scale.line(okey, k))));
    t.read_all(&sc.keys, false, &mut sc.recs).await?;
    Ok(Effect::default())
}

async fn delivery<E: Endpoint>(
    t: &mut Txn<'_, E>,
    env: &Env,
    w: u64,
    carrier: u64,
    sc: &mut Scratch,
) -> Result<Effect, Abort> {
    let scale = &env.scale;
    let now = t.ctx().co().now_ns();
    for d in 1..=DISTRICTS {
        let head = t.read_for_update(DELIVERY_HEAD, Scale::dk(w, d)).await?;
        let o = t.get(head)[0];
        if o >= scale.orders {
            continue;
        }
        let okey = scale.order(w, d, o);
        let no = t.read(NEW_ORDER, okey).await?;
        if !t.exists(no) {
            // Nothing to deliver in this district (clause 2.7.4.2: skipped).
            continue;
        }
        t.delete(no);
        t.update(head)[0] = o + 1;
        let or = t.read_for_update(ORDER, okey).await?;
        let order = t.update(or);
        order[o::CARRIER_ID] = carrier;
        let (cid, n) = (order[o::C_ID], order[o::OL_CNT]);
        sc.keys.clear();
        sc.keys.extend((1..=n).map(|k| (ORDER_LINE, scale.line(okey, k))));
        t.read_all(&sc.keys, true, &mut sc.recs2).await?;
        let mut sum = 0;
        for &lr in &sc.recs2 {
            let line = t.update(lr);
            line[ol::DELIVERY_D] = now;
            sum += line[ol::AMOUNT];
        }
        let cr = t.read_for_update(CUSTOMER, scale.customer(w, d, cid)).await?;
        let cust = t.update(cr);
        cust[c::BALANCE] = (money(cust[c::BALANCE]) + sum as i64) as u64;
        cust[c::DELIVERY_CNT] += 1;
    }
    Ok(Effect::default())
}

async fn stock_level<E: Endpoint>(
    t: &mut Txn<'_, E>,
    env: &Env,
    w: u64,
    d: u64,
    threshold: u64,
    sc: &mut Scratch,
) -> Result<Effect, Abort> {
    let scale = &env.scale;
    let dr = t.read(DISTRICT, Scale::dk(w, d)).await?;
    let next = t.get(dr)[d::NEXT_O_ID];
    let first = next.saturating_sub(20).max(1);
    // The last 20 orders, then their lines, then the distinct items' stock.
    sc.keys.clear();
    sc.keys.extend((first..next).map(|o| (ORDER, scale.order(w, d, o))));
    t.read_all(&sc.keys, false, &mut sc.recs).await?;
    let mut lines = std::mem::take(&mut sc.keys);
    lines.clear();
    for (o, &or) in (first..next).zip(&sc.recs) {
        if t.exists(or) {
            let okey = scale.order(w, d, o);
            lines.extend((1..=t.get(or)[o::OL_CNT]).map(|k| (ORDER_LINE, scale.line(okey, k))));
        }
    }
    t.read_all(&lines, false, &mut sc.recs2).await?;
    sc.items.clear();
    sc.items.extend(sc.recs2.iter().filter(|&&r| t.exists(r)).map(|&r| t.get(r)[ol::I_ID]));
    sc.items.sort_unstable();
    sc.items.dedup();
    lines.clear();
    lines.extend(sc.items.iter().map(|&i| (STOCK, scale.stock(w, i))));
    t.read_all(&lines, false, &mut sc.recs).await?;
    let _low = sc.recs.iter().filter(|&&r| t.get(r)[s::QUANTITY] < threshold).count();
    sc.keys = lines;
    Ok(Effect::default())
}
