//! When a measured window means something.
//!
//! A rate is completions over a window. A window shorter than the latency of what it
//! measures counts only the requests that happened to finish early, so it reports a rate
//! near zero and percentiles that are too low; a window with a handful of completions
//! reports noise. Every benchmark that turns a window into a rate (`micro`, `io`,
//! `offload`) judges it by the same rule, and lengthens it or refuses it, never prints it.
//! `bench` judges by [`span_p99`] and at least one commit, with no floor on the commits
//! (TPC-C on a slow NIC holds a few hundred in its default window): it lengthens its
//! default window on sim, and refuses any other that falls short.

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
    ops >= SETTLED_OPS_MIN && span_p99(window_ns, p99_ns)
}

/// Whether a window of `window_ns` is at least twice the 99th-percentile latency
/// `p99_ns`: shorter, its slowest requests were cut off, and the rate with them.
pub fn span_p99(window_ns: u64, p99_ns: u64) -> bool {
    window_ns >= p99_ns.saturating_mul(2)
}

/// The window to measure again over after `reruns` windows that did not settle, the last
/// of `window_ns` with `ops` completions and a p99 latency of `p99_ns`: the window times
/// the smallest power of two (at least 2) that should settle it, judging by what this one
/// held (completions grow with the window), capped at `window_max_ns`; a window that held
/// nothing says nothing of what would settle, so it grows sixteen-fold, enough that
/// [`RERUNS_MAX`] reruns reach from 1 ns to a window that held requests. `None`: refuse
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
    // From at least 1 ns, so that an empty window grows too.
    let mut next = window_ns.max(1).saturating_mul(if ops == 0 { 16 } else { 2 });
    // Bounded: each turn doubles, and a u64 holds 64 doublings.
    while next < need && next < window_max_ns {
        next = next.saturating_mul(2);
    }
    Some(next.min(window_max_ns))
}

/// What a measured window held, to judge it by.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Held {
    /// Completions in the window (all nodes).
    pub ops: u64,
    /// The window, ns.
    pub window_ns: u64,
    /// The 99th-percentile latency of its completions, ns.
    pub p99_ns: u64,
}

impl Held {
    /// See [`settled`].
    pub fn settled(&self) -> bool {
        settled(self.ops, self.window_ns, self.p99_ns)
    }
}

/// Measures with `measure(window_ns)` over the window asked for, and again over longer
/// ones ([`extend`]) until what it held settles: `Ok(Ok((value, reruns)))`, or
/// `Ok(Err(held))` with what the last window held when no longer window is allowed. A
/// settled first measurement is returned as it is. Each measurement must start afresh
/// (a new cluster, so that a rerun replays from its seed).
#[allow(clippy::type_complexity, reason = "the two outcomes and the caller's own error")]
pub fn until_settled<T, E>(
    asked_ns: u64,
    window_max_ns: u64,
    mut measure: impl FnMut(u64) -> Result<(T, Held), E>,
) -> Result<Result<(T, u32), Held>, E> {
    let (mut window_ns, mut reruns) = (asked_ns, 0);
    loop {
        let (value, held) = measure(window_ns)?;
        if held.settled() {
            return Ok(Ok((value, reruns)));
        }
        match extend(window_ns, held.ops, held.p99_ns, reruns, window_max_ns) {
            Some(longer) => (window_ns, reruns) = (longer, reruns + 1),
            None => return Ok(Err(held)),
        }
    }
}

/// `ns` scaled as a window of `asked_ns` was lengthened to `window_ns` (a warm-up, or a
/// fault's time, keeps its share of the window).
pub fn scaled(ns: u64, asked_ns: u64, window_ns: u64) -> u64 {
    let v = u128::from(ns) * u128::from(window_ns) / u128::from(asked_ns.max(1));
    u64::try_from(v).unwrap_or(u64::MAX)
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
        // Nothing completed: sixteen-fold.
        assert_eq!(extend(10, 0, 0, 0, 1000), Some(160));
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
        assert_eq!(extend(0, 0, 8, 0, 1000), Some(16), "an empty window grows");
    }

    #[test]
    fn until_settled_measures_again_until_the_window_holds_enough() {
        // Completions grow with the window: 10 per ns, with a 5 ns p99.
        let held = |w: u64| Held { ops: w * 10, window_ns: w, p99_ns: 5 };
        let mut asked = Vec::new();
        let r = until_settled::<_, ()>(10, 1 << 20, |w| {
            asked.push(w);
            Ok((w, held(w)))
        });
        assert_eq!(r, Ok(Ok((160, 1))), "100 completions of 1000: one rerun, 16x");
        assert_eq!(asked, [10, 160]);
        // Capped at 100 ns, which holds just enough.
        let r = until_settled::<_, ()>(10, 100, |w| Ok((w, held(w))));
        assert_eq!(r, Ok(Ok((100, 1))));
        let r = until_settled::<_, ()>(10, 50, |w| Ok((w, held(w))));
        assert_eq!(r, Ok(Err(held(50))), "refused at the longest window");
        let r = until_settled::<u64, &str>(10, 100, |_| Err("no cluster"));
        assert_eq!(r, Err("no cluster"));
        assert_eq!(scaled(3, 10, 160), 48);
    }
}
