//! Linked lists of key-value items laid out for the NIC: one READ of a node rewrites a
//! response WQE into "send this item" and leaves the next pointer where a loopback WRITE
//! can copy it into the next iteration's READ.
//!
//! Node (32 bytes): next node's offset, `key` as the id of an ENABLE header (see
//! [`node_key_word`]), the item's scatter/gather entry (offset; length | region key <<
//! 32). Items are those of [`crate::hash`]: key word, value length, value padded to 8.
//! Node 0 of the area is the null node: its key (0) matches no key and its next pointer
//! is itself, so a traversal that runs past a list's end keeps reading it.

use hytra_fabric::wq::{header, Sge, WqOpcode, ID_MAX};
use hytra_fabric::{LocalAddr, Region, Rkey};
use thiserror::Error;

use crate::hash::{item_bytes, read_item, write_item};

/// Bytes of a node.
pub const NODE_BYTES: u64 = 32;
/// Offset of the null node.
pub const NULL: u64 = 0;

/// Why a list could not be stored.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Error)]
pub enum ListError {
    /// Keys are 1..2^48.
    #[error("key {0:#x} is 0 or exceeds 48 bits")]
    BadKey(u64),
    /// No room for the nodes or items.
    #[error("list area full")]
    Full,
    /// A list needs at least one item.
    #[error("an empty list")]
    Empty,
    /// Keys of a list are distinct (a traversal without `break` answers every match).
    #[error("key {0:#x} twice in one list")]
    Duplicate(u64),
}

/// Where the lists live in their node's registered memory.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct ListLayout {
    /// Region.
    pub rkey: Rkey,
    /// Nodes the area holds (the null node included).
    pub nodes: u64,
    /// Bytes for items after the nodes.
    pub item_bytes: u64,
}

impl ListLayout {
    /// Bytes of region the lists need.
    pub fn region_bytes(&self) -> u64 {
        self.nodes * NODE_BYTES + self.item_bytes
    }
}

/// The key word of a list node: an ENABLE header whose id is the key. A CAS that finds it
/// in a response WQE turns that into a WRITE of the item; where it does not match, the
/// WQE runs as an ENABLE (of the next iteration, or a no-op).
pub fn node_key_word(key: u64) -> u64 {
    header(WqOpcode::Enable, 0, key)
}

/// The host's view of the lists: building them (setup time) and the CPU traversal.
pub struct ListStore {
    layout: ListLayout,
    region: Region,
    next_node: u64,
    next_item: u64,
}

impl ListStore {
    /// An empty store over a zeroed region; writes the null node.
    pub fn new(layout: ListLayout, region: Region) -> ListStore {
        assert!(region.len_bytes() >= layout.region_bytes(), "region too small for the lists");
        assert!(layout.nodes > 0, "the list area holds at least the null node");
        // The null node's item is an empty item under key 0.
        let null_item = Sge { addr: LocalAddr { rkey: layout.rkey, offset: NULL }, len: 16 };
        let [a, l] = null_item.words();
        region.write_words(NULL, &[NULL, node_key_word(0), a, l]);
        ListStore { layout, region, next_node: 1, next_item: layout.nodes * NODE_BYTES }
    }

    /// The layout.
    pub fn layout(&self) -> ListLayout {
        self.layout
    }

    /// Stores a list of `items` in order and returns the offset of its head node.
    pub fn push_list(&mut self, items: &[(u64, Vec<u8>)]) -> Result<u64, ListError> {
        if items.is_empty() {
            return Err(ListError::Empty);
        }
        if let Some(&(k, _)) = items.iter().find(|(k, _)| *k == 0 || *k > ID_MAX) {
            return Err(ListError::BadKey(k));
        }
        let mut keys: Vec<u64> = items.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
            return Err(ListError::Duplicate(w[0]));
        }
        let item_need: u64 = items.iter().map(|(_, v)| item_bytes(v.len())).sum();
        let item_end = self.layout.region_bytes();
        if self.next_node + items.len() as u64 > self.layout.nodes
            || self.next_item + item_need > item_end
        {
            return Err(ListError::Full);
        }
        let first = self.next_node;
        for (i, (key, value)) in items.iter().enumerate() {
            let node = (first + i as u64) * NODE_BYTES;
            let next = if i + 1 < items.len() { node + NODE_BYTES } else { NULL };
            let item = self.alloc_item(*key, value);
            let [a, l] = item.words();
            self.region.write_words(node, &[next, node_key_word(*key), a, l]);
        }
        self.next_node += items.len() as u64;
        Ok(first * NODE_BYTES)
    }

    fn alloc_item(&mut self, key: u64, value: &[u8]) -> Sge {
        let at = LocalAddr { rkey: self.layout.rkey, offset: self.next_item };
        self.next_item += item_bytes(value.len());
        write_item(&self.region, at, key, value)
    }

    /// Offset of the item of the node at `position` (0-based) of the list at `head`.
    pub fn item_at(&self, head: u64, position: usize) -> Option<u64> {
        let mut node = head;
        for _ in 0..position {
            node = self.region.load(node);
            if node == NULL {
                return None;
            }
        }
        (node != NULL).then(|| self.region.load(node + 16))
    }
}

/// The CPU traversal: the value of the first node with `key` among the first `max_nodes`
/// of the list at `head` (the offloaded traversal reads that many nodes at most).
pub fn lookup(region: &Region, head: u64, key: u64, max_nodes: usize) -> Option<Vec<u8>> {
    let mut node = head;
    for _ in 0..max_nodes {
        if node == NULL {
            return None;
        }
        let mut w = [0u64; 4];
        region.read_words(node, &mut w);
        if key != 0 && w[1] == node_key_word(key) {
            return Some(read_item(region, Sge::from_words(w[2], w[3]).addr.offset));
        }
        node = w[0];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_walked_in_order_and_bounded() {
        let layout = ListLayout { rkey: Rkey(0), nodes: 16, item_bytes: 4096 };
        let region = Region::zeroed(layout.region_bytes());
        let mut s = ListStore::new(layout, region.clone());
        let items: Vec<_> = (1..=5u64).map(|k| (k * 10, vec![k as u8; k as usize])).collect();
        let head = s.push_list(&items).unwrap();
        for (pos, (k, v)) in items.iter().enumerate() {
            assert_eq!(lookup(&region, head, *k, 8).as_deref(), Some(&v[..]));
            assert_eq!(lookup(&region, head, *k, pos), None, "beyond the bound");
            assert!(s.item_at(head, pos).is_some());
        }
        assert_eq!(s.item_at(head, 5), None);
        assert_eq!(lookup(&region, head, 7, 8), None);
        assert_eq!(lookup(&region, head, 0, 8), None, "the null node's key is no key");
        assert_eq!(s.push_list(&[]), Err(ListError::Empty));
        assert_eq!(s.push_list(&[(0, vec![])]), Err(ListError::BadKey(0)));
        assert_eq!(s.push_list(&[(3, vec![]), (3, vec![1])]), Err(ListError::Duplicate(3)));
        let many: Vec<_> = (1..=11u64).map(|k| (k, vec![])).collect();
        assert_eq!(s.push_list(&many), Err(ListError::Full));
    }
}
