//! Mutations: how the fuzzer turns a valid input into a near-valid one. Every choice is
//! drawn from the caller's seeded [`Rng`], so a run replays exactly.
//!
//! Decoders fail at their edges: a length one past what is left, a count of
//! `u64::MAX`, a field that is 0, a truncated tail. So besides random bit flips, bytes
//! and words are set to such values, including values derived from the input's own
//! length, and inputs are cut, extended and spliced with each other. Not for: choosing
//! which input to mutate (see `runner`).

use hytra_fabric::rng::Rng;

/// Mutations stacked on one input, at most.
pub const STACK_MAX: u64 = 4;

/// Bytes an extension appends, at most.
const EXTEND_MAX: u64 = 64;

/// Interesting byte values: the edges of signed and unsigned bytes and small counts.
const BYTES: [u8; 10] = [0, 1, 2, 7, 8, 16, 0x7f, 0x80, 0xfe, 0xff];

/// Interesting word values that do not depend on the input.
const WORDS: [u64; 12] =
    [0, 1, 2, 8, 0x7f, 0xff, 0xffff, u32::MAX as u64, 1 << 32, i64::MAX as u64, 1 << 63, u64::MAX];

/// Applies one to [`STACK_MAX`] mutations to `input`, possibly splicing in parts of
/// `corpus`, and keeps it at most `len_max` bytes long.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>], len_max: usize) {
    for _ in 0..1 + rng.below(STACK_MAX) {
        mutate_once(rng, input, corpus);
        input.truncate(len_max);
    }
}

fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    let len = input.len() as u64;
    match rng.below(9) {
        // Flip one bit.
        0 if len > 0 => {
            let at = rng.below(len) as usize;
            input[at] ^= 1 << rng.below(8);
        }
        // Set a byte to an interesting value, or to the input's length.
        1 if len > 0 => {
            let at = rng.below(len) as usize;
            let pick = rng.below(BYTES.len() as u64 + 1) as usize;
            input[at] = BYTES.get(pick).copied().unwrap_or(len as u8);
        }
        // Set a little-endian word (of 2, 4 or 8 bytes) to an interesting value;
        // aligned half of the time, as most formats here are made of words.
        2 if len > 0 => {
            let width = [2, 4, 8][rng.below(3) as usize];
            let mut at = rng.below(len) as usize;
            if rng.below(2) == 0 {
                at -= at % width;
            }
            let value = interesting_word(rng, len);
            let bytes = value.to_le_bytes();
            let n = width.min(input.len() - at);
            input[at..at + n].copy_from_slice(&bytes[..n]);
        }
        // Add or subtract a small amount to a word: off-by-one lengths and counts.
        3 if len >= 8 => {
            let at = rng.below(len - 7) as usize;
            let at = if rng.below(2) == 0 { at - at % 8 } else { at };
            let word = u64::from_le_bytes(input[at..at + 8].try_into().expect("8 bytes"));
            let delta = 1 + rng.below(16);
            let word =
                if rng.below(2) == 0 { word.wrapping_add(delta) } else { word.wrapping_sub(delta) };
            input[at..at + 8].copy_from_slice(&word.to_le_bytes());
        }
        // Truncate, or cut a chunk out of the middle.
        4 if len > 0 => {
            let at = rng.below(len + 1) as usize;
            if rng.below(2) == 0 {
                input.truncate(at);
            } else {
                let n = rng.below(len - at as u64 + 1) as usize;
                input.drain(at..at + n);
            }
        }
        // Extend with random bytes, or with zeros.
        5 => {
            let n = 1 + rng.below(EXTEND_MAX);
            let zeros = rng.below(2) == 0;
            for _ in 0..n {
                input.push(if zeros { 0 } else { rng.next_u64() as u8 });
            }
        }
        // Duplicate a chunk of the input at another place.
        6 if len > 0 => {
            let (from, n) = chunk(rng, len);
            let to = rng.below(len + 1) as usize;
            let copy = input[from..from + n].to_vec();
            input.splice(to..to, copy);
        }
        // Splice: keep a prefix of the input, continue with a suffix of a corpus input.
        7 if !corpus.is_empty() => {
            let other = &corpus[rng.below(corpus.len() as u64) as usize];
            let keep = rng.below(len + 1) as usize;
            let from = rng.below(other.len() as u64 + 1) as usize;
            input.truncate(keep);
            input.extend_from_slice(&other[from..]);
        }
        // Overwrite a chunk with a chunk of a corpus input, in place.
        8 if !corpus.is_empty() && len > 0 => {
            let other = &corpus[rng.below(corpus.len() as u64) as usize];
            if other.is_empty() {
                return;
            }
            let (from, n) = chunk(rng, other.len() as u64);
            let to = rng.below(len) as usize;
            let n = n.min(input.len() - to);
            input[to..to + n].copy_from_slice(&other[from..from + n]);
        }
        // A choice that needs a longer input (or a corpus): a random byte instead.
        _ => {
            if len > 0 {
                let at = rng.below(len) as usize;
                input[at] = rng.next_u64() as u8;
            } else {
                input.push(rng.next_u64() as u8);
            }
        }
    }
}

/// A chunk of an input of `len` bytes (`len` > 0): start and length, mostly short.
fn chunk(rng: &mut Rng, len: u64) -> (usize, usize) {
    let from = rng.below(len);
    let cap = if rng.below(4) == 0 { len } else { 16 };
    let n = 1 + rng.below((len - from).min(cap));
    (from as usize, n as usize)
}

/// An interesting word: a fixed edge value, or one near the input's length (in bytes
/// and in words), which is what a length field that trusts its input gets wrong.
fn interesting_word(rng: &mut Rng, len: u64) -> u64 {
    let near_len = [len, len.wrapping_sub(8), len + 8, len / 8, len / 8 + 1, len * 8];
    let pick = rng.below((WORDS.len() + near_len.len()) as u64) as usize;
    match WORDS.get(pick) {
        Some(&w) => w,
        None => near_len[pick - WORDS.len()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_mutations() {
        let corpus = vec![vec![1u8; 40], (0..100).collect::<Vec<u8>>()];
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..1000)
                .map(|i| {
                    let mut input = corpus[i % 2].clone();
                    mutate(&mut rng, &mut input, &corpus, 256);
                    input
                })
                .collect::<Vec<_>>()
        };
        let (a, b) = (run(7), run(7));
        assert_eq!(a, b);
        assert_ne!(a, run(8), "another seed, other mutations");
        assert!(a.iter().all(|m| m.len() <= 256));
        assert!(a.iter().any(|m| m.len() < 40) && a.iter().any(|m| m.len() > 100));
    }

    #[test]
    fn an_empty_input_grows() {
        let mut rng = Rng::new(1);
        let mut input = Vec::new();
        for _ in 0..100 {
            mutate(&mut rng, &mut input, &[], 64);
        }
        assert!(!input.is_empty());
    }
}
