//! Options whose value is one of a fixed set: clap lists the set in `--help` and refuses
//! anything else with its one-line error and exit 2, before any work, the same way for
//! every such option.
//!
//! Not for: the sets themselves, which belong to the library that acts on them (a
//! design to `txn`, a YCSB mix to `workloads`); this only names them to clap.

use clap::builder::{PossibleValuesParser, TypedValueParser};

/// A feature switched `on` or `off`.
#[derive(Copy, Clone, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Switch {
    /// The feature is used.
    On,
    /// The feature is not used.
    Off,
}

impl Switch {
    /// Whether the feature is on.
    pub fn on(self) -> bool {
        self == Switch::On
    }
}

/// `--switch on|off` as given, or `default` when not given.
pub fn on_or(s: Option<Switch>, default: bool) -> bool {
    s.map_or(default, Switch::on)
}

/// A parser for a value of a library's enum, by the names its `name` gives every member
/// of `all`.
pub fn named<T>(all: &'static [T], name: fn(T) -> &'static str) -> impl TypedValueParser<Value = T>
where
    T: Copy + Send + Sync + 'static,
{
    // Exactly the listed names pass, or (with the argument's `ignore_case`) one of them
    // in other case.
    PossibleValuesParser::new(all.iter().map(|&t| name(t))).map(move |s: String| {
        *all.iter()
            .find(|&&t| name(t).eq_ignore_ascii_case(&s))
            .expect("clap passes only the listed names")
    })
}
