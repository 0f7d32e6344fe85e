//! The NIC's cache of queue-pair contexts: set-associative with LRU replacement.
//!
//! RNICs keep connection state in on-chip SRAM and fetch it over PCIe on a miss; with
//! thousands of connections the misses dominate small-payload one-sided verbs (DrTM+H
//! §4.2). Datagram endpoints use one context per worker and are not modelled here.

/// Deterministic set-associative LRU cache of connection ids.
#[derive(Debug)]
pub(crate) struct QpCache {
    sets: u32,
    ways: u32,
    /// `tag + 1` per slot; 0 marks an empty slot.
    tags: Vec<u64>,
    /// Last use of each slot, for LRU within a set.
    stamps: Vec<u64>,
    tick: u64,
}

impl QpCache {
    pub(crate) fn new(entries: u32, ways: u32) -> QpCache {
        assert!(ways > 0 && entries % ways == 0, "cache geometry {entries}/{ways}");
        let sets = entries / ways;
        QpCache {
            sets,
            ways,
            tags: vec![0; entries as usize],
            stamps: vec![0; entries as usize],
            tick: 0,
        }
    }

    /// Looks `qp` up, inserting it on a miss; returns whether it was a hit.
    pub(crate) fn touch(&mut self, qp: u64) -> bool {
        self.tick += 1;
        // Fibonacci hashing spreads consecutive ids over the sets.
        let set = ((qp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % u64::from(self.sets)) as usize;
        let base = set * self.ways as usize;
        let slots = base..base + self.ways as usize;
        let tag = qp + 1;
        if let Some(i) = slots.clone().find(|&i| self.tags[i] == tag) {
            self.stamps[i] = self.tick;
            return true;
        }
        let victim = slots.min_by_key(|&i| self.stamps[i]).expect("ways > 0");
        self.tags[victim] = tag;
        self.stamps[victim] = self.tick;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_set_within_capacity_always_hits_after_warmup() {
        let mut c = QpCache::new(64, 8);
        for round in 0..3 {
            for qp in 0..32 {
                let hit = c.touch(qp);
                assert_eq!(hit, round > 0, "qp {qp} round {round}");
            }
        }
    }

    #[test]
    fn working_set_far_beyond_capacity_mostly_misses() {
        let mut c = QpCache::new(64, 8);
        let mut rng = crate::rng::Rng::new(1);
        let hits = (0..10_000).filter(|_| c.touch(rng.below(640))).count();
        // Uniform access over 10x the capacity hits about 10% of the time.
        assert!((500..1_600).contains(&hits), "hits {hits}");
    }
}
