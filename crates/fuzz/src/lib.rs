//! A small in-tree mutational fuzzer of every decoder that takes bytes from another node,
//! a file or a user, on stable Rust: seeded, so that a run replays exactly.
//!
//! - [`targets`]: what is fuzzed: each [`Target`] names a decoder, brings seed inputs made
//!   by the real encoders, and checks what consumes a decoded value
//! - [`mutate`]: bit flips, interesting bytes and words, truncation, extension,
//!   duplication and splicing, all drawn from a seeded [`Rng`](hytra_fabric::rng::Rng)
//! - [`runner`]: runs a target's seeds then mutations, each under `catch_unwind` and the
//!   counting allocator, and reports the first failure with the command that replays it
//! - [`alloc`]: the counting wrapper around the system allocator
//!
//! The property every target checks: no input makes a decoder (or what consumes its
//! result) panic or allocate more than [`ALLOC_BYTES_MAX`]; where an encoder exists,
//! decoding what it encoded gives the value back. The `hytra-fuzz` binary runs targets
//! for as long as asked; this crate's tests run every target briefly.

pub mod alloc;
pub mod mutate;
pub mod runner;
pub mod targets;

pub use runner::{execute, fuzz, Failure, Problem, Summary};

/// Bytes one execution may allocate, in one allocation or live at once: far above what
/// any valid input of the targets needs (their fixtures and inputs are kilobytes), and
/// far below what a length read from the input and trusted would ask for.
pub const ALLOC_BYTES_MAX: u64 = 64 << 20;

/// A decoder under test.
#[derive(Copy, Clone, Debug)]
pub struct Target {
    /// Name, as `hytra-fuzz --target` takes it.
    pub name: &'static str,
    /// What is decoded, in a few words.
    pub about: &'static str,
    /// Valid inputs made by the real encoders; mutations start from them.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Decodes one input and, where the decode succeeds, exercises what consumes the
    /// result; panics on a broken property.
    pub run: fn(&[u8]),
}
