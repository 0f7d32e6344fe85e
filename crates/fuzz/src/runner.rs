//! Running a target: its seeds first, then mutations of them, each execution under
//! `catch_unwind` and the counting allocator; the first panic or allocation over the
//! bound ends the run with a [`Failure`] that says how to replay it.
//!
//! A run is a pure function of the target, the seed and the number of executions: the
//! corpus is the target's seeds (never grown), and every choice comes from one
//! [`Rng`] of the seed. A hang cannot be caught on the thread that hangs: [`STARTED`]
//! and [`RUNNING`] let a watchdog thread (the binary's) see it, and [`input_at`] rebuilds
//! the stuck input. Not for: what a target checks (see `targets`).

use std::any::Any;
use std::cell::RefCell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use hytra_fabric::rng::Rng;

use crate::alloc::{self, Usage};
use crate::mutate::mutate;
use crate::{Target, ALLOC_BYTES_MAX};

/// Bytes a mutated input may grow to: a few times the largest seed, so that lengths
/// and counts past the end can be exercised, and at least this many.
pub const INPUT_LEN_MIN: usize = 4096;

/// How much longer than its largest seed a mutated input may grow.
pub const INPUT_GROWTH: usize = 4;

/// Why an execution failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The target panicked (a decoder, or a check of a decoded value).
    Panic(String),
    /// The execution allocated more than [`ALLOC_BYTES_MAX`] in one allocation or at once.
    Alloc(Usage),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Panic(msg) => write!(f, "panicked: {msg}"),
            Problem::Alloc(u) => write!(
                f,
                "allocated too much: largest allocation {} bytes, peak live {} bytes (bound {ALLOC_BYTES_MAX})",
                u.largest_bytes, u.peak_live_bytes
            ),
        }
    }
}

/// A failed execution of a run, with what replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The target's name.
    pub target: &'static str,
    /// The run's seed.
    pub seed: u64,
    /// Which execution failed (0-based; the seeds come first).
    pub index: u64,
    /// Its input.
    pub input: Vec<u8>,
    /// What went wrong.
    pub problem: Problem,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "FAIL: target {}, seed {}, execution {}: {}",
            self.target, self.seed, self.index, self.problem
        )?;
        writeln!(f, "input ({} bytes): {}", self.input.len(), to_hex(&self.input))?;
        writeln!(
            f,
            "replay the input: hytra-fuzz --target {} --input {}",
            self.target,
            to_hex(&self.input)
        )?;
        write!(
            f,
            "replay the run:   hytra-fuzz --target {} --seed {} --execs {}",
            self.target,
            self.seed,
            self.index + 1
        )
    }
}

/// What a run that found nothing did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Executions.
    pub execs: u64,
    /// Of them, the target's seeds (run unmutated first).
    pub seeds: u64,
    /// The largest single allocation of any execution.
    pub largest_bytes: u64,
    /// The highest peak of live bytes of any execution.
    pub peak_live_bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// The inputs of a run, in order: a pure function of the target's seeds and the run's
/// seed (mutations never depend on what an execution did), so any one can be rebuilt.
struct Inputs {
    corpus: Vec<Vec<u8>>,
    len_max: usize,
    rng: Rng,
    next: u64,
}

impl Inputs {
    fn new(target: &Target, seed: u64) -> Inputs {
        let corpus = (target.seeds)();
        assert!(!corpus.is_empty(), "target {} has no seeds", target.name);
        let len_max = corpus.iter().map(Vec::len).max().unwrap_or(0) * INPUT_GROWTH;
        Inputs { corpus, len_max: len_max.max(INPUT_LEN_MIN), rng: Rng::new(seed), next: 0 }
    }

    /// Puts the next input into `input`; returns its index.
    fn next_into(&mut self, input: &mut Vec<u8>) -> u64 {
        let index = self.next;
        self.next += 1;
        input.clear();
        match self.corpus.get(index as usize) {
            Some(s) => input.extend_from_slice(s),
            None => {
                let from = self.rng.below(self.corpus.len() as u64) as usize;
                input.extend_from_slice(&self.corpus[from]);
                mutate(&mut self.rng, input, &self.corpus, self.len_max);
            }
        }
        index
    }
}

/// The input of execution `index` of the run of `target` from `seed`, rebuilt without
/// running anything (for a watchdog that found an execution stuck).
pub fn input_at(target: &Target, seed: u64, index: u64) -> Vec<u8> {
    let mut inputs = Inputs::new(target, seed);
    let mut input = Vec::new();
    while inputs.next_into(&mut input) < index {}
    input
}

/// Executions started by this process so far: a watchdog on another thread that sees
/// it unchanged for long knows an execution is stuck.
pub static STARTED: AtomicU64 = AtomicU64::new(0);

/// The index of the execution running now.
pub static RUNNING: AtomicU64 = AtomicU64::new(0);

/// Runs `target` for `execs` executions from `seed`: the seeds unmutated, then
/// mutations of them. Stops at the first failure.
pub fn fuzz(target: &Target, seed: u64, execs: u64) -> Result<Summary, Failure> {
    let started = Instant::now();
    let mut inputs = Inputs::new(target, seed);
    let mut summary = Summary { seeds: inputs.corpus.len() as u64, ..Summary::default() };
    let mut input = Vec::with_capacity(inputs.len_max);
    for _ in 0..execs {
        let index = inputs.next_into(&mut input);
        RUNNING.store(index, Ordering::Relaxed);
        STARTED.fetch_add(1, Ordering::Relaxed);
        let usage = execute(target, &input, index).map_err(|problem| Failure {
            target: target.name,
            seed,
            index,
            input: input.clone(),
            problem,
        })?;
        summary.execs += 1;
        summary.largest_bytes = summary.largest_bytes.max(usage.largest_bytes);
        summary.peak_live_bytes = summary.peak_live_bytes.max(usage.peak_live_bytes);
    }
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Runs `target` once on `input` (execution `index`, for reports).
pub fn execute(target: &Target, input: &[u8], index: u64) -> Result<Usage, Problem> {
    quiet_panics();
    PANIC.with_borrow_mut(|p| p.quiet = true);
    let (caught, usage) =
        alloc::measure(input, index, || catch_unwind(AssertUnwindSafe(|| (target.run)(input))));
    let message = PANIC.with_borrow_mut(|p| {
        p.quiet = false;
        p.message.take()
    });
    if let Err(payload) = caught {
        return Err(Problem::Panic(message.unwrap_or_else(|| payload_text(payload.as_ref()))));
    }
    if usage.largest_bytes > ALLOC_BYTES_MAX || usage.peak_live_bytes > ALLOC_BYTES_MAX {
        return Err(Problem::Alloc(usage));
    }
    Ok(usage)
}

/// This thread's panic state: whether panics are expected (an execution runs), and the
/// message and place of the last one.
#[derive(Default)]
struct PanicState {
    quiet: bool,
    message: Option<String>,
}

thread_local! {
    static PANIC: RefCell<PanicState> = RefCell::new(PanicState::default());
}

/// Installs, once, a panic hook that records the panics of executions instead of
/// printing them (a run may meet many before it stops), and leaves every other panic
/// to the hook that was there.
fn quiet_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let quiet = PANIC.try_with(|p| p.borrow().quiet).unwrap_or(false);
            if !quiet {
                return previous(info);
            }
            let place = info.location().map(|l| format!(" at {l}")).unwrap_or_default();
            let text = format!("{}{place}", payload_text(info.payload()));
            let _ = PANIC.try_with(|p| p.borrow_mut().message = Some(text));
        }));
    });
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".into(),
    }
}

/// Lowercase hex, two digits a byte.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a string is not hex.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not hex: {0}")]
pub struct HexError(String);

/// Reads what [`to_hex`] writes (either case; spaces and newlines are skipped).
pub fn from_hex(text: &str) -> Result<Vec<u8>, HexError> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if digits.len() % 2 != 0 {
        return Err(HexError("an odd number of digits".into()));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let s = std::str::from_utf8(pair).map_err(|_| HexError("not ASCII".into()))?;
            u8::from_str_radix(s, 16).map_err(|_| HexError(format!("'{s}'")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert_eq!(from_hex("0A ff\n10").unwrap(), vec![10, 255, 16]);
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
    }
}
