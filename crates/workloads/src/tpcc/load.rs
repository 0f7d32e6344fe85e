//! Populating a TPC-C database as the specification describes (clause 4.3.3), scaled by
//! [`Scale`], and the random input rules the transactions share (NURand, last names,
//! random strings).

use std::collections::HashMap;

use hytra_fabric::rng::Rng;
use hytra_store::StoreError;
use hytra_txn::Engine;

use super::schema::*;

/// The constants of NURand (clause 2.1.6): one per field kind, chosen at load time; the
/// run uses a `C` for last names that differs from the load's by an allowed delta.
#[derive(Copy, Clone, Debug)]
pub struct NuRand {
    /// C for customer last names at load time.
    pub c_last_load: u64,
    /// C for customer last names while running.
    pub c_last_run: u64,
    /// C for customer ids.
    pub c_id: u64,
    /// C for item ids.
    pub i_id: u64,
}

impl NuRand {
    /// Constants drawn from `seed`.
    pub fn new(seed: u64) -> NuRand {
        let mut rng = Rng::derive(seed, 0x7C_0001);
        let c_last_load = rng.below(256);
        // |C_run - C_load| in 65..=119, but not 96 or 112 (clause 2.1.6.1).
        let c_last_run = loop {
            let c = rng.below(256);
            let delta = c.abs_diff(c_last_load);
            if (65..=119).contains(&delta) && delta != 96 && delta != 112 {
                break c;
            }
        };
        NuRand { c_last_load, c_last_run, c_id: rng.below(1024), i_id: rng.below(8192) }
    }
}

/// `NURand(A, x, y)` with constant `c`.
pub fn nurand(rng: &mut Rng, a: u64, c: u64, x: u64, y: u64) -> u64 {
    (((rng.below(a + 1) | (x + rng.below(y - x + 1))) + c) % (y - x + 1)) + x
}

/// A uniformly random integer in `lo..=hi`.
pub fn uniform(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    lo + rng.below(hi - lo + 1)
}

const SYLLABLES: [&str; 10] =
    ["BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"];

/// The customer last name numbered `n` (0..=999), from three syllables.
pub fn last_name(n: u64) -> Vec<u8> {
    let n = n as usize;
    [SYLLABLES[n / 100], SYLLABLES[n / 10 % 10], SYLLABLES[n % 10]].concat().into_bytes()
}

/// A random alphanumeric string of `lo..=hi` bytes.
pub fn astring(rng: &mut Rng, lo: usize, hi: usize) -> Vec<u8> {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let len = uniform(rng, lo as u64, hi as u64) as usize;
    (0..len).map(|_| CHARS[rng.below(CHARS.len() as u64) as usize]).collect()
}

fn nstring(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| b'0' + rng.below(10) as u8).collect()
}

fn zip(rng: &mut Rng) -> Vec<u8> {
    let mut z = nstring(rng, 4);
    z.extend_from_slice(b"11111");
    z
}

/// A data field of `lo..=hi` bytes that contains "ORIGINAL" one time in ten.
fn data_field(rng: &mut Rng, lo: usize, hi: usize) -> Vec<u8> {
    let mut d = astring(rng, lo, hi);
    if rng.below(10) == 0 {
        let at = rng.below((d.len() - 8) as u64 + 1) as usize;
        d[at..at + 8].copy_from_slice(b"ORIGINAL");
    }
    d
}

/// Street 1, street 2, city, state and zip, packed from `words[at]` on (14 words).
fn address(rng: &mut Rng, words: &mut [u64], at: usize) {
    put_str(&mut words[at..at + 3], &astring(rng, 10, 20));
    put_str(&mut words[at + 3..at + 6], &astring(rng, 10, 20));
    put_str(&mut words[at + 6..at + 9], &astring(rng, 10, 20));
    put_str(&mut words[at + 9..at + 10], &astring(rng, 2, 2));
    put_str(&mut words[at + 10..at + 12], &zip(rng));
}

/// The ITEM table: read-only, the same on every node, kept outside the store.
#[derive(Clone, Debug)]
pub struct Items {
    /// `i_price` in cents, by `i_id - 1`.
    pub price: Vec<u32>,
    /// `i_im_id`.
    pub im_id: Vec<u32>,
    /// `i_name` (24 bytes).
    pub name: Vec<[u8; 24]>,
    /// Whether `i_data` contains "ORIGINAL" (all New-Order needs of its 50 bytes).
    pub original: Vec<bool>,
}

impl Items {
    /// Generates `n` items.
    pub fn generate(n: u64, seed: u64) -> Items {
        let mut rng = Rng::derive(seed, 0x7C_0002);
        let n = n as usize;
        let mut items = Items {
            price: Vec::with_capacity(n),
            im_id: Vec::with_capacity(n),
            name: Vec::with_capacity(n),
            original: Vec::with_capacity(n),
        };
        for _ in 0..n {
            items.im_id.push(uniform(&mut rng, 1, 10_000) as u32);
            let mut name = [0u8; 24];
            let s = astring(&mut rng, 14, 24);
            name[..s.len()].copy_from_slice(&s);
            items.name.push(name);
            items.price.push(uniform(&mut rng, 100, 10_000) as u32);
            items.original.push(data_field(&mut rng, 26, 50).windows(8).any(|w| w == b"ORIGINAL"));
        }
        items
    }

    /// Items.
    pub fn len(&self) -> u64 {
        self.price.len() as u64
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.price.is_empty()
    }
}

/// Customers of one node by (district key, last name), each list sorted by first name:
/// the index Payment and Order-Status use to find a customer by last name. Last names
/// never change and customers are never added, so it is built once, at load time.
#[derive(Default, Debug)]
pub struct NameIndex {
    by_name: HashMap<(u64, u16), Vec<u32>>,
}

impl NameIndex {
    /// The index of one partition's customers built from their rows (`key`, payload), as
    /// a replica holds them: what a node that became the primary of a partition it was
    /// given after a failure (re-replication) derives from the rows it copied. The
    /// same index as the one built while loading those rows.
    pub fn from_rows<'a>(
        customers: u64,
        rows: impl Iterator<Item = (u64, &'a [u64])>,
    ) -> NameIndex {
        let numbers: HashMap<Vec<u8>, u16> =
            (0..1000u16).map(|n| (last_name(n.into()), n)).collect();
        let mut b = NameIndexBuilder::default();
        for (key, row) in rows {
            let last = get_str(&row[c::LAST..c::LAST + 2], 16);
            // A row whose last name is none of the 1000 was not loaded as a customer.
            let Some(&name) = numbers.get(&last) else { continue };
            let first = get_str(&row[c::FIRST..c::FIRST + 2], 16);
            b.add(key / customers, name, &first, key % customers + 1);
        }
        b.build()
    }

    /// The customer a by-name selection picks (clause 2.5.2.2: the one at position
    /// ceil(n / 2) of those with that last name, sorted by first name), if any.
    pub fn pick(&self, dk: u64, last: u16) -> Option<u64> {
        let ids = self.by_name.get(&(dk, last))?;
        Some(u64::from(ids[(ids.len() - 1) / 2]))
    }
}

/// A customer as the name index sorts them: first name, then id.
type NamedCustomer = ([u8; 16], u32);

/// Builds a [`NameIndex`]: entries are added as customers are loaded.
#[derive(Default)]
pub struct NameIndexBuilder {
    entries: HashMap<(u64, u16), Vec<NamedCustomer>>,
}

impl NameIndexBuilder {
    fn add(&mut self, dk: u64, last: u16, first: &[u8], c: u64) {
        let mut f = [0u8; 16];
        f[..first.len()].copy_from_slice(first);
        self.entries.entry((dk, last)).or_default().push((f, c as u32));
    }

    /// The finished index.
    pub fn build(self) -> NameIndex {
        let by_name = self
            .entries
            .into_iter()
            .map(|(k, mut v)| {
                v.sort();
                (k, v.into_iter().map(|(_, c)| c).collect())
            })
            .collect();
        NameIndex { by_name }
    }
}

/// The last-name number of customer `c` of a district (clause 4.3.3.1: the first 1000
/// customers take every name once, the rest a NURand choice).
fn customer_name_number(rng: &mut Rng, nu: &NuRand, c: u64, customers: u64) -> u64 {
    if c <= 1000 {
        c - 1
    } else {
        nurand(rng, 255, nu.c_last_load, 0, 999.min(customers - 1))
    }
}

/// Loads warehouse `w` (with its districts, customers, history, orders, new orders,
/// order lines, stock and the two helper tables) through [`Engine::load`], and its
/// customers into `names`.
pub fn load_warehouse(
    engine: &Engine,
    scale: &Scale,
    nu: &NuRand,
    w: u64,
    seed: u64,
    names: &mut NameIndexBuilder,
) -> Result<(), StoreError> {
    let mut rng = Rng::derive(seed, 0x7C_1000 + w);
    let mut words = vec![0u64; usize::from(c::WORDS)];

    // Warehouse: w_ytd = 300 000.00, the sum of its districts' d_ytd.
    words.fill(0);
    put_str(&mut words[w::NAME..w::NAME + 2], &astring(&mut rng, 6, 10));
    address(&mut rng, &mut words, w::ADDRESS);
    words[w::TAX] = uniform(&mut rng, 0, 2000);
    words[w::YTD] = 30_000_000;
    engine.load(WAREHOUSE, w, &words[..usize::from(w::WORDS)])?;

    // Stock.
    for i in 1..=scale.items {
        words[..usize::from(s::WORDS)].fill(0);
        words[s::QUANTITY] = uniform(&mut rng, 10, 100);
        for k in 0..10 {
            put_str(&mut words[s::DIST + 3 * k..s::DIST + 3 * k + 3], &astring(&mut rng, 24, 24));
        }
        put_str(&mut words[s::DATA..s::DATA + 7], &data_field(&mut rng, 26, 50));
        engine.load(STOCK, scale.stock(w, i), &words[..usize::from(s::WORDS)])?;
    }

    let customers = scale.customers;
    let undelivered = customers * 3 / 10;
    let first_new = customers - undelivered + 1;
    let mut history = 0;
    for d in 1..=DISTRICTS {
        let dk = Scale::dk(w, d);
        words[..usize::from(d::WORDS)].fill(0);
        put_str(&mut words[d::NAME..d::NAME + 2], &astring(&mut rng, 6, 10));
        address(&mut rng, &mut words, d::ADDRESS);
        words[d::TAX] = uniform(&mut rng, 0, 2000);
        words[d::YTD] = 3_000_000;
        words[d::NEXT_O_ID] = customers + 1;
        engine.load(DISTRICT, dk, &words[..usize::from(d::WORDS)])?;
        engine.load(DELIVERY_HEAD, dk, &[first_new])?;

        for cid in 1..=customers {
            words.fill(0);
            let first = astring(&mut rng, 8, 16);
            put_str(&mut words[c::FIRST..c::FIRST + 2], &first);
            put_str(&mut words[c::MIDDLE..c::MIDDLE + 1], b"OE");
            let name = customer_name_number(&mut rng, nu, cid, customers);
            put_str(&mut words[c::LAST..c::LAST + 2], &last_name(name));
            names.add(dk, name as u16, &first, cid);
            address(&mut rng, &mut words, c::ADDRESS);
            put_str(&mut words[c::PHONE..c::PHONE + 2], &nstring(&mut rng, 16));
            words[c::SINCE] = 0;
            let credit: &[u8] = if rng.below(10) == 0 { b"BC" } else { b"GC" };
            put_str(&mut words[c::CREDIT..c::CREDIT + 1], credit);
            words[c::CREDIT_LIM] = 5_000_000;
            words[c::DISCOUNT] = uniform(&mut rng, 0, 5000);
            words[c::BALANCE] = (-1000i64) as u64;
            words[c::YTD_PAYMENT] = 1000;
            words[c::PAYMENT_CNT] = 1;
            words[c::DELIVERY_CNT] = 0;
            let data = astring(&mut rng, 300, c::DATA_BYTES);
            put_str(&mut words[c::DATA..c::DATA + words_for(c::DATA_BYTES)], &data);
            engine.load(CUSTOMER, scale.customer(w, d, cid), &words)?;

            let mut hist = [0u64; h::WORDS as usize];
            hist[h::IDS..h::IDS + 5].copy_from_slice(&[cid, d, w, d, w]);
            hist[h::AMOUNT] = 1000;
            put_str(&mut hist[h::DATA..h::DATA + 3], &astring(&mut rng, 12, 24));
            engine.load(HISTORY, scale.history(w, history), &hist)?;
            history += 1;
        }

        // Orders 1..=customers, one per customer in a random permutation.
        let mut perm: Vec<u64> = (1..=customers).collect();
        for i in (1..perm.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            perm.swap(i, j);
        }
        for oid in 1..=customers {
            let cid = perm[oid as usize - 1];
            let delivered = oid < first_new;
            let ol_cnt = uniform(&mut rng, 5, LINES_MAX);
            let okey = scale.order(w, d, oid);
            let carrier = if delivered { uniform(&mut rng, 1, 10) } else { 0 };
            engine.load(ORDER, okey, &[cid, 0, carrier, ol_cnt, 1])?;
            engine.load(CUSTOMER_LAST_ORDER, scale.customer(w, d, cid), &[oid])?;
            if !delivered {
                engine.load(NEW_ORDER, okey, &[1])?;
            }
            for n in 1..=ol_cnt {
                let mut line = [0u64; ol::WORDS as usize];
                line[ol::I_ID] = uniform(&mut rng, 1, scale.items);
                line[ol::SUPPLY_W_ID] = w;
                line[ol::DELIVERY_D] = 0;
                line[ol::QUANTITY] = 5;
                line[ol::AMOUNT] = if delivered { 0 } else { uniform(&mut rng, 1, 999_999) };
                put_str(&mut line[ol::DIST_INFO..ol::DIST_INFO + 3], &astring(&mut rng, 24, 24));
                engine.load(ORDER_LINE, scale.line(okey, n), &line)?;
            }
        }
    }
    Ok(())
}

/// History rows a warehouse holds once loaded.
pub fn initial_history(scale: &Scale) -> u64 {
    DISTRICTS * scale.customers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nurand_stays_in_range_and_constants_obey_the_delta_rule() {
        for seed in 0..50 {
            let nu = NuRand::new(seed);
            let delta = nu.c_last_run.abs_diff(nu.c_last_load);
            assert!((65..=119).contains(&delta) && delta != 96 && delta != 112);
            let mut rng = Rng::new(seed);
            for _ in 0..1000 {
                let v = nurand(&mut rng, 1023, nu.c_id, 1, 3000);
                assert!((1..=3000).contains(&v));
            }
        }
    }

    #[test]
    fn last_names_follow_the_syllables() {
        assert_eq!(last_name(0), b"BARBARBAR");
        assert_eq!(last_name(371), b"PRICALLYOUGHT");
        assert_eq!(last_name(999), b"EINGEINGEING");
    }

    #[test]
    fn a_name_index_built_from_rows_is_the_loaded_one() {
        let customers = 40u64;
        let nu = NuRand::new(3);
        let mut rng = Rng::new(9);
        let mut loaded = NameIndexBuilder::default();
        let mut rows = Vec::new();
        for dk in [7u64, 8] {
            for cid in 1..=customers {
                let mut words = vec![0u64; usize::from(c::WORDS)];
                let first = astring(&mut rng, 8, 16);
                put_str(&mut words[c::FIRST..c::FIRST + 2], &first);
                let name = customer_name_number(&mut rng, &nu, cid, customers);
                put_str(&mut words[c::LAST..c::LAST + 2], &last_name(name));
                loaded.add(dk, name as u16, &first, cid);
                rows.push((dk * customers + cid - 1, words));
            }
        }
        let loaded = loaded.build();
        let rebuilt = NameIndex::from_rows(customers, rows.iter().map(|(k, w)| (*k, &w[..])));
        assert_eq!(rebuilt.by_name, loaded.by_name);
        assert!(!loaded.by_name.is_empty());
    }

    #[test]
    fn name_index_picks_the_middle_by_first_name() {
        let mut b = NameIndexBuilder::default();
        b.add(0, 5, b"Carol", 30);
        b.add(0, 5, b"Alice", 10);
        b.add(0, 5, b"Bob", 20);
        b.add(0, 5, b"Dave", 40);
        let idx = b.build();
        // Four customers: position ceil(4 / 2) = 2, the second by first name.
        assert_eq!(idx.pick(0, 5), Some(20));
        assert_eq!(idx.pick(0, 6), None);
    }
}
