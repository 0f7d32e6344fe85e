//! `hytra offload`: NIC-offloaded gets (RedN) against one-sided and two-sided gets on the
//! simulator's cx5 NIC model.

use hytra_lab::cmd::offload::{plan, OffloadArgs};
use hytra_lab::cmd::BackendKind;
use hytra_lab::offload::{scenarios, OffloadReport, OffloadRun, OFFLOAD_SCHEMA};
use hytra_lab::span::Span;
use hytra_offload::bench::{self, Outcome, Scenario};

use crate::table::{open_output, write_json, Table};
use crate::CliError;

fn row(t: &mut Table, what: &str, s: &Scenario, o: &Outcome) {
    t.row(vec![
        what.to_string(),
        s.path.name().to_string(),
        s.value_bytes.to_string(),
        s.list.map_or("-".to_string(), |l| format!("{}/{}", l.range, l.len)),
        o.gets.to_string(),
        // Marked when lengthened from --duration to hold enough gets (hytra_rt::window).
        match o.extended_from_ns {
            Some(_) => format!("{}*", o.window_ns / 1000),
            None => (o.window_ns / 1000).to_string(),
        },
        format!("{:.2}", o.mean_ns as f64 / 1e3),
        format!("{:.2}", o.p50_ns as f64 / 1e3),
        format!("{:.2}", o.p99_ns as f64 / 1e3),
        format!("{:.0}", o.gets_per_sec / 1e3),
        o.timeouts.to_string(),
        o.wrong.to_string(),
        o.gets_after_pause.to_string(),
    ]);
}

/// Runs the scenarios and prints one table.
pub fn run(a: OffloadArgs) -> Result<(), CliError> {
    let plan = plan(&a)?;
    let max = Span::from_ns(BackendKind::Sim.window_max_ns());
    let out = a.json.as_deref().map(open_output).transpose()?;
    let runs = scenarios(&plan);
    let mut t = Table::new(&[
        "scenario",
        "path",
        "value B",
        "list range",
        "gets",
        "window µs",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "K gets/s",
        "timeouts",
        "wrong",
        "after pause",
    ]);
    let mut measured = Vec::new();
    let mut extended = 0;
    for (k, (what, s)) in runs.iter().enumerate() {
        let o = bench::run_settled(s, max.ns()).map_err(|e| CliError::Run(e.into()))?;
        // Progress, as `micro` gives it: the whole run takes seconds.
        eprintln!(
            "[{}/{}] {what} {} {} B: p50 {:.2} µs over {}",
            k + 1,
            runs.len(),
            s.path.name(),
            s.value_bytes,
            o.p50_ns as f64 / 1e3,
            Span::from_ns(o.window_ns)
        );
        extended += usize::from(o.extended_from_ns.is_some());
        row(&mut t, what, s, &o);
        let (scenario, path) = (what.clone(), s.path.name().to_string());
        measured.push(OffloadRun { scenario, path, params: s.clone(), outcome: o });
    }
    print!("{}", t.render());
    if extended > 0 {
        println!(
            "\n* window lengthened from {} (--duration) for {extended} of {} scenarios, to hold {} gets and twice the p99 latency",
            a.duration,
            runs.len(),
            hytra_rt::window::SETTLED_OPS_MIN
        );
    }
    let mut ifs = Table::new(&["if chains", "ifs per chain", "elapsed µs", "M ifs/s"]);
    let mut json_ifs = Vec::new();
    for &chains in &a.if_chains {
        let r = bench::if_rate(chains, 200, a.seed).map_err(|e| CliError::Run(e.into()))?;
        ifs.row(vec![
            chains.to_string(),
            r.ifs_per_chain.to_string(),
            format!("{:.2}", r.elapsed_ns as f64 / 1e3),
            format!("{:.3}", r.ifs_per_sec / 1e6),
        ]);
        json_ifs.push(r);
    }
    println!();
    print!("{}", ifs.render());
    if let (Some(file), Some(path)) = (out, a.json.as_deref()) {
        let report = OffloadReport {
            schema: OFFLOAD_SCHEMA,
            profile: "cx5".into(),
            runs: measured,
            if_rate: json_ifs,
        };
        write_json(file, path, &report)?;
    }
    Ok(())
}
