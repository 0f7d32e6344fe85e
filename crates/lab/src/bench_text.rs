//! `hytra bench`'s report as text: the lines the command prints, from the same
//! [`BenchReport`] its JSON is, so that a program that runs benchmarks through this
//! library can print what the command prints. Not for: what the report holds (see
//! `bench.rs`).

use std::fmt::{self, Write};

use hytra_fabric::NodeId;
use hytra_txn::{AbortClass, AbortReason, Phase};

use crate::bench::{BenchReport, CrashesReport, TypeCounts};
use crate::span::Span;
use crate::table::{rate, Table};

/// The checker's and the invariant's verdicts.
fn verdicts(o: &mut String, r: &BenchReport) -> fmt::Result {
    let c = &r.checker;
    match c.serializable {
        Some(true) => writeln!(
            o,
            "checker      serializable ({} transactions, {} dependencies)",
            c.transactions.unwrap_or(0),
            c.dependencies.unwrap_or(0)
        )?,
        Some(false) => {
            writeln!(o, "checker      NOT serializable: [{}]", c.first_violations.join(", "))?
        }
        None => writeln!(o, "checker      not run (use --check)")?,
    }
    writeln!(
        o,
        "invariant    {} ({})",
        if r.invariant_ok { "ok" } else { "VIOLATED" },
        r.invariant.join("; ")
    )
}

/// What the report's first line says the fabric was.
fn fabric_label(r: &BenchReport) -> String {
    match (&r.sim, &r.ucx) {
        (Some(sim), _) => sim.profile.clone(),
        (None, Some(ucx)) => format!("{}, wait {}", ucx.transports, ucx.wait),
        (None, None) => "threads".into(),
    }
}

impl BenchReport {
    /// The report as `hytra bench` prints it: a blank line, then its lines; `types` in
    /// the workload's order, `lease_ns` the lease its crashes were detected by.
    pub fn text(&self, types: &[&str], lease_ns: u64) -> String {
        let mut o = String::new();
        report(&mut o, self, types, lease_ns).expect("a String takes every write");
        o
    }
}

fn report(o: &mut String, r: &BenchReport, types: &[&str], lease_ns: u64) -> fmt::Result {
    let clock = if r.sim.is_some() { "virtual" } else { "wall" };
    writeln!(
        o,
        "\n{} on {} ({}): {} nodes x {} workers x {} coroutines, design {}, replication {}, {} measured ({clock})",
        r.workload, r.backend, fabric_label(r), r.nodes, r.workers, r.coroutines, r.design, r.replication,
        Span::from_ns((r.seconds * 1e9).round() as u64)
    )?;
    let on = |b: bool| if b { "on" } else { "off" };
    let c = &r.config;
    writeln!(
        o,
        "phases use   execution {}, lock {}, validation {}, log {}, commit {}; passive ACK {}, outstanding requests {}\n",
        c.exec, c.lock, c.validate, c.log, c.commit, on(c.passive_ack), on(c.outstanding)
    )?;
    let workers = f64::from(r.nodes) * f64::from(r.workers);
    writeln!(
        o,
        "throughput   {} txn/s ({} txn/s per worker)",
        rate(r.throughput_tps),
        rate(r.throughput_tps / workers)
    )?;
    let class_rate = |c: AbortClass| r.abort_rate_by_class.get(c.key()).copied().unwrap_or(0.0);
    let classes: Vec<String> = AbortClass::ALL
        .iter()
        .filter(|c| class_rate(**c) > 0.0)
        .map(|c| format!("{:.2}% {}", class_rate(*c) * 100.0, c.name()))
        .collect();
    writeln!(
        o,
        "abort rate   {:.2}% of attempts{}{}; {} gave up after {} attempts",
        r.abort_rate * 100.0,
        if classes.is_empty() { "" } else { ": " },
        classes.join(", "),
        r.gave_up,
        c.retries_max
    )?;
    let l = &r.latency_us;
    writeln!(o, "latency      p50 {:.1} µs   p90 {:.1} µs   p99 {:.1} µs", l.p50, l.p90, l.p99)?;
    let ph = &r.phases_us;
    let means = [ph.execution, ph.validation, ph.logging, ph.commit];
    writeln!(
        o,
        "phases       {} (mean per committed transaction, µs)",
        Phase::ALL
            .iter()
            .zip(means)
            .map(|(p, v)| format!("{} {v:.2}", p.name()))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    let reasons: Vec<String> = AbortReason::ALL
        .iter()
        .filter_map(|a| {
            r.aborts.get(a.name()).filter(|&&n| n > 0).map(|n| format!("{} {n}", a.name()))
        })
        .collect();
    if !reasons.is_empty() {
        writeln!(o, "aborts       {}", reasons.join(", "))?;
    }
    if r.stuck_lock_waits > 0 {
        writeln!(
            o,
            "             {} retries waited for a lock that one attempt held across {} of theirs",
            r.stuck_lock_waits,
            hytra_txn::STUCK_LOCK_REPEATS + 1
        )?;
    }
    if r.workload == "smallbank" && class_rate(AbortClass::Workload) > 0.0 {
        writeln!(o, "             {}", hytra_workloads::smallbank::WORKLOAD_ABORTS)?;
    }
    let n = &r.nic_lookups;
    if n.sent + n.slot_busy > 0 {
        writeln!(
        o,
            "nic lookups  {} sent: {} found the record, {} fell back to RPC, {} timed out; {} cache misses went by RPC (slot busy)",
            n.sent, n.found, n.fell_back, n.timed_out, n.slot_busy
        )?;
    }
    let mut t = Table::new(&["type", "commits", "aborts"]);
    for name in types {
        let k = r.per_type.get(*name).copied().unwrap_or(TypeCounts { commits: 0, aborts: 0 });
        t.row(vec![name.to_string(), k.commits.to_string(), k.aborts.to_string()]);
    }
    writeln!(o, "\n{}\n", t.render())?;
    verdicts(o, r)?;
    after(o, r, lease_ns)
}

/// The report's lines after the verdicts: the simulation's speed, `--design auto`'s
/// trials, and what recovery did.
fn after(o: &mut String, r: &BenchReport, lease_ns: u64) -> fmt::Result {
    if let (Some(sim), Some(hash)) = (&r.sim, &r.trace_hash) {
        writeln!(
        o,
            "simulation   {:.2} s of wall time: {:.0} transactions and {:.2} M events per wall-second; trace hash {hash}",
            sim.run_wall_s,
            sim.txn_per_wall_s,
            sim.events_per_wall_s / 1e6,
        )?;
    }
    if let Some(auto) = &r.design_auto {
        let each: Vec<String> = auto
            .trials
            .iter()
            .map(|t| format!("{} {}", t.candidate, rate(t.throughput_tps)))
            .collect();
        writeln!(o, "design auto  chose {} (trials, txn/s: {})", auto.chose, each.join(", "))?;
    }
    if let Some(crashes) = &r.crashes {
        recovery(o, crashes, lease_ns)?;
    }
    if let Some(lost) = &r.lost_nodes {
        writeln!(
        o,
            "lost nodes   {lost:?} died during the run: the survivors removed them, went on, and checked their part from their journals"
        )?;
        let copying = r.still_copying.as_deref().unwrap_or(&[]);
        match (r.replicated == Some(true), copying.is_empty()) {
            (true, true) => {
                writeln!(o, "             re-replicated: every partition's copies whole again")?
            }
            (_, false) => still_copying(o, copying.iter().map(|&[p, n]| (p, n)))?,
            (false, true) => {}
        }
    }
    Ok(())
}

/// Each crash and how long recovery took.
fn recovery(o: &mut String, crashes: &CrashesReport, lease_ns: u64) -> fmt::Result {
    let ms = |t: Option<f64>| match t {
        Some(ms) => format!("+{ms:.2} ms"),
        None => "not within the run".to_string(),
    };
    for c in &crashes.each {
        writeln!(
        o,
            "crash        node {} at {:.3} ms (lease {} ms): detected {}, new configuration {}, every partition active {}",
            c.node,
            c.at_s * 1e3,
            lease_ns as f64 / 1e6,
            ms(c.detected_ms),
            ms(c.configured_ms),
            ms(c.active_ms)
        )?;
        writeln!(
            o,
            "             survivors back to {:.0}% of their {:.0} txn/s before the crash: {}{}",
            c.recovered_share * 100.0,
            c.survivors_tps_before,
            ms(c.recovered_ms),
            if c.recovered_ms.is_some() {
                format!(" ({:.0} txn/s from then on)", c.survivors_tps_after)
            } else {
                String::new()
            }
        )?;
        if c.replicated_ms.is_some() {
            writeln!(
                o,
                "             re-replicated: every partition's copies whole again {}",
                ms(c.replicated_ms)
            )?;
        }
        if let Some(at) = c.restart_s {
            writeln!(
                o,
                "             restarted at {:.3} ms, wiped: a member again {}",
                at * 1e3,
                ms(c.rejoined_ms)
            )?;
        }
    }
    if !crashes.still_copying.is_empty() {
        still_copying(o, crashes.still_copying.iter().map(|c| (c.partition, c.node)))?;
    }
    Ok(())
}

/// The backups still copying their partitions when the run ended: (partition, node).
fn still_copying(o: &mut String, each: impl Iterator<Item = (u16, u16)>) -> fmt::Result {
    let list: Vec<String> = each.map(|(p, n)| format!("partition {p} on {}", NodeId(n))).collect();
    writeln!(o, "             still copying at the end of the run: {}", list.join(", "))
}

#[cfg(test)]
mod tests {
    use crate::judge::tests::{report, spec};

    /// The text holds every line a reader looks for, with the numbers of the report it
    /// renders, and one row per transaction type in the order given.
    #[test]
    fn the_text_shows_the_reports_numbers() {
        let r = report(&spec(300_000));
        let types = ["balance", "send_payment"];
        let text = r.text(&types, 5_000_000);
        for line in ["throughput ", "abort rate ", "latency      p50 ", "phases       execution "] {
            assert!(text.contains(line), "{line}: {text}");
        }
        assert!(text.contains("3 nodes x 1 workers x 4 coroutines, design drtmh"), "{text}");
        assert!(text.contains("300µs measured (virtual)"), "{text}");
        let checked = format!("serializable ({} transactions", r.checker.transactions.unwrap());
        assert!(text.contains(&checked), "{text}");
        assert!(text.contains("invariant    ok"), "{text}");
        assert!(text.contains(r.trace_hash.as_deref().unwrap()), "{text}");
        let rows: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| types.contains(w))
            .collect();
        assert_eq!(rows, types, "one row per type, in order");
        assert!(!text.contains("crash "), "no crash, no recovery line");
    }
}
