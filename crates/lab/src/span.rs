//! Lengths of time on the command line: one syntax for every subcommand's `--duration`,
//! `--crash NODE@WHEN` and `--kill NODE@WHEN`. A number with a unit (`ns`, `us` or `µs`,
//! `ms`, `s`, `min`), or a bare number of seconds, the SI unit (so `--seconds 0.002`, the
//! older spelling of `--duration 2ms`, means what it always did).
//!
//! Not for: which lengths a command accepts (each command checks its own range, where it
//! knows its backend); the checks here return the message a command prints.

use std::fmt;
use std::str::FromStr;

/// The largest warm-up, as a fraction of the measured window.
const WARMUP_MAX: f64 = 10.0;

/// The warm-up before a window of `measure_ns`, as `fraction` of it (rounded to the
/// nanosecond, the same in every command).
pub fn warmup_ns(measure_ns: u64, fraction: f64) -> u64 {
    (measure_ns as f64 * fraction).round() as u64
}

/// `--warmup`, the same everywhere: a fraction of `--duration`, run before it and not
/// measured.
pub fn check_warmup(fraction: f64) -> Result<(), String> {
    if !(0.0..WARMUP_MAX).contains(&fraction) {
        return Err(format!(
            "--warmup {fraction}: a fraction of --duration, at least 0 and below {WARMUP_MAX}"
        ));
    }
    Ok(())
}

/// The shortest window a benchmark that lengthens its window measures from: shorter than
/// any request's latency, a window holds nothing to judge by.
const WINDOW_MIN_NS: u64 = 1_000;

/// A measured window (`--duration` of micro, io and offload), at least a microsecond and
/// at most `max` (the backend's); `on` names the backend where the limit is its own.
pub fn check_window(d: Span, max: Span, on: &str) -> Result<(), String> {
    let min = Span::from_ns(WINDOW_MIN_NS);
    if d < min || d > max {
        return Err(format!("--duration {d}: expected {min} to {max}{on}"));
    }
    Ok(())
}

/// A length of time as given on the command line, whole nanoseconds, more than zero.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct Span(u64);

/// Units accepted after the number, and nanoseconds in each; longest names first, so
/// that `ms` is not read as `s` after a stray `m`.
const UNITS: [(&str, f64); 6] =
    [("min", 60e9), ("ns", 1.0), ("us", 1e3), ("µs", 1e3), ("ms", 1e6), ("s", 1e9)];

/// The longest span anything accepts: a day. Each command's own limit is far below; this
/// one only keeps the arithmetic in `u64` nanoseconds exact.
const SPAN_MAX_NS: f64 = 86_400e9;

impl Span {
    /// A span of `ns` nanoseconds (more than zero).
    pub fn from_ns(ns: u64) -> Span {
        assert!(ns > 0, "a span is longer than nothing");
        Span(ns)
    }

    /// Nanoseconds.
    pub fn ns(self) -> u64 {
        self.0
    }

    /// Seconds, as the reports print them.
    pub fn secs(self) -> f64 {
        self.0 as f64 / 1e9
    }
}

impl FromStr for Span {
    type Err = String;

    fn from_str(s: &str) -> Result<Span, String> {
        let t = s.trim();
        let (number, per) = UNITS
            .iter()
            .find_map(|&(u, per)| t.strip_suffix(u).map(|n| (n.trim_end(), per)))
            .unwrap_or((t, 1e9));
        let value: f64 = number.parse().map_err(|_| {
            format!("'{s}' is not a length of time: a number and a unit, such as 2ms, 60us or 1.5s")
        })?;
        let ns = value * per;
        if !(ns.is_finite() && ns >= 1.0) {
            return Err(format!("'{s}': a length of time is at least 1ns"));
        }
        if ns > SPAN_MAX_NS {
            return Err(format!("'{s}': at most a day"));
        }
        Ok(Span(ns.round() as u64))
    }
}

impl fmt::Display for Span {
    /// The largest unit that keeps the number at one or more, without a trailing `.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0 as f64;
        let (value, unit) = match self.0 {
            n if n >= 1_000_000_000 => (ns / 1e9, "s"),
            n if n >= 1_000_000 => (ns / 1e6, "ms"),
            n if n >= 1_000 => (ns / 1e3, "µs"),
            _ => (ns, "ns"),
        };
        // Every nanosecond shown (an error never rounds the value it refuses), then
        // trailing zeros dropped: 2.5ms, 60µs, 1.0000001s.
        let digits = match unit {
            "s" => 9,
            "ms" => 6,
            "µs" => 3,
            _ => 0,
        };
        let text = format!("{value:.digits$}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        write!(f, "{text}{unit}")
    }
}

/// `NODE@WHEN` (`--crash`, `--kill`): a node and a span from the start of the run; the
/// error says which half is wrong.
pub fn node_at(spec: &str) -> Result<(u16, Span), String> {
    let Some((n, t)) = spec.split_once('@') else {
        return Err("expected NODE@WHEN, such as 3@20ms".into());
    };
    let node = n.trim().parse().map_err(|_| format!("'{n}' is not a node number"))?;
    let number = t.trim().trim_end_matches(|c: char| c.is_alphabetic() || c == 'µ');
    if number.trim().parse::<f64>().is_ok_and(|x| x == 0.0) {
        return Err("WHEN is counted from the start and must come after it".into());
    }
    Ok((node, t.parse()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds() {
        let ns = |s: &str| s.parse::<Span>().map(Span::ns);
        assert_eq!(ns("2ms"), Ok(2_000_000));
        assert_eq!(ns("60us"), Ok(60_000));
        assert_eq!(ns("60µs"), Ok(60_000));
        assert_eq!(ns("60 us"), Ok(60_000));
        assert_eq!(ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(ns("0.002"), Ok(2_000_000), "a bare number is seconds");
        assert_eq!(ns("500ns"), Ok(500));
        assert_eq!(ns("2min"), Ok(120_000_000_000));
        assert_eq!(ns("1e-3"), Ok(1_000_000));
    }

    #[test]
    fn nonsense_is_refused_with_the_form_expected() {
        for bad in ["", "ms", "2 hours", "-1ms", "0", "0s", "0.1ns", "NaN", "inf", "2d", "1e30"] {
            let e = bad.parse::<Span>().expect_err(bad);
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn display_reads_back_as_the_same_span() {
        for ns in [1, 999, 1_000, 60_000, 2_500_000, 1_234_000_000, 20_000_000_000] {
            let s = Span::from_ns(ns);
            assert_eq!(s.to_string().parse::<Span>(), Ok(s), "{s}");
        }
        assert_eq!(Span::from_ns(60_000).to_string(), "60µs");
        assert_eq!(Span::from_ns(2_500_000).to_string(), "2.5ms");
        assert_eq!(Span::from_ns(1_000_000_100).to_string(), "1.0000001s");
        assert_eq!(Span::from_ns(999).to_string(), "999ns");
    }

    #[test]
    fn node_at_takes_units_or_seconds() {
        assert_eq!(node_at("3@20ms"), Ok((3, Span::from_ns(20_000_000))));
        assert_eq!(node_at("0@0.02"), Ok((0, Span::from_ns(20_000_000))));
        assert!(node_at("x@1s").unwrap_err().contains("'x' is not a node"));
        assert!(node_at("3").unwrap_err().contains("NODE@WHEN"));
        for zero in ["1@0", "1@0ms", "1@0 s", "1@0.0us"] {
            assert!(node_at(zero).unwrap_err().contains("after"), "{zero}");
        }
        assert!(node_at("1@soon").unwrap_err().contains("not a length of time"));
    }
}
