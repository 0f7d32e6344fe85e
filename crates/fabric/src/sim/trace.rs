//! The trace hash: a running digest of every simulated event, so that two runs can be
//! compared for bit-for-bit equality without storing their traces.

/// 64-bit digest of a sequence of words (FNV-1a over words, finished with a mix).
#[derive(Clone, Debug)]
pub(crate) struct TraceHash {
    h: u64,
}

impl TraceHash {
    pub(crate) fn new() -> Self {
        TraceHash { h: 0xCBF2_9CE4_8422_2325 }
    }

    pub(crate) fn add(&mut self, word: u64) {
        self.h = (self.h ^ word).wrapping_mul(0x0000_0100_0000_01B3);
    }

    pub(crate) fn finish(&self) -> u64 {
        let mut x = self.h;
        crate::rng::splitmix64(&mut x)
    }
}
