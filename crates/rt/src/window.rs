//! When a measured window means something.
//!
//! A rate is completions over a window. A window shorter than the latency of what it
//! measures counts only the requests that happened to finish early, so it reports a rate
//! near zero and percentiles that are too low; a window with a handful of completions
//! reports noise. Every benchmark that turns a window into a rate (`micro`, `io`,
//! `offload`) judges it by the same rule, and lengthens it or refuses it, never prints it.

/// Completions a window must hold (all nodes) before its rate and percentiles are
/// reported.
pub const SETTLED_OPS_MIN: u64 = 1000;

/// How many times a benchmark measures a point again over a longer window before it
/// refuses the point.
pub const RERUNS_MAX: u32 = 6;

/// Whether a window of `window_ns` that completed `ops` requests with a 99th-percentile
/// latency of `p99_ns` settled: enough completions, and a window at least twice that
/// latency.
pub fn settled(ops: u64, window_ns: u64, p99_ns: u64) -> bool {
    ops >= SETTLED_OPS_MIN && window_ns >= p99_ns.saturating_mul(2)
}

/// The window to measure again over after `reruns` windows that did not settle, the last
/// of `window_ns` with `ops` completions and a p99 latency of `p99_ns`: the window times
/// the smallest power of two (at least 2) that should settle it, judging by what this one
/// held (completions grow with the window), capped at `window_max_ns`. `None`: refuse
/// the point (after [`RERUNS_MAX`] reruns, or when the window already was the longest).
pub fn extend(
    window_ns: u64,
    ops: u64,
    p99_ns: u64,
    reruns: u32,
    window_max_ns: u64,
) -> Option<u64> {
    if reruns >= RERUNS_MAX || window_ns >= window_max_ns {
        return None;
    }
    let for_ops = match ops {
        0 => 0,
        n => window_ns.saturating_mul(SETTLED_OPS_MIN.div_ceil(n)),
    };
    let need = for_ops.max(p99_ns.saturating_mul(2));
    let mut next = window_ns.saturating_mul(2);
    // Bounded: each turn doubles, and a u64 holds 64 doublings.
    while next < need && next < window_max_ns {
        next = next.saturating_mul(2);
    }
    Some(next.min(window_max_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_settles_only_with_enough_completions_and_twice_the_latency() {
        assert!(settled(SETTLED_OPS_MIN, 200, 100));
        assert!(!settled(SETTLED_OPS_MIN - 1, 200, 100), "too few completions");
        assert!(!settled(SETTLED_OPS_MIN, 199, 100), "shorter than twice the p99");
        assert!(settled(u64::MAX, u64::MAX, u64::MAX / 2));
    }

    #[test]
    fn extension_jumps_to_a_window_that_should_settle_within_the_bounds() {
        // Nothing completed: double.
        assert_eq!(extend(10, 0, 0, 0, 1000), Some(20));
        // 100 completions of the 1000 needed: 10x, rounded up to a power of two.
        assert_eq!(extend(10, 100, 0, 0, 1000), Some(160));
        // The latency asks for more than the completions do.
        assert_eq!(extend(10, 5000, 40, 0, 1000), Some(80));
        // Enough of both, but judged unsettled anyway: at least double.
        assert_eq!(extend(10, 5000, 1, 0, 1000), Some(20));
        // Capped at the longest window, then refused there.
        assert_eq!(extend(10, 1, 0, 0, 1000), Some(1000));
        assert_eq!(extend(1000, 1, 0, 0, 1000), None);
        assert_eq!(extend(10, 100, 0, RERUNS_MAX, u64::MAX), None, "measured again enough");
        assert_eq!(extend(u64::MAX / 2, 1, 0, 0, u64::MAX), Some(u64::MAX), "saturates");
    }
}
