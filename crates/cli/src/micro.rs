//! `hytra micro`: the raw-primitive benchmark (DrTM+H §4.2, Fig. 5) on the simulator, on
//! threads or over UCX; with `--ucp-baseline`, each UCX point next to a minimal UCP
//! program doing the same operation (what hytra's layers cost). The options and their
//! checks are `hytra_lab::cmd::micro`'s.

use hytra_fabric::local::LocalConfig;
use hytra_lab::cmd::micro::{plan, MicroArgs};
use hytra_lab::micro::{
    matrix_text, multi_report, ratio_text, run_matrix, Measured, MicroPlan, MULTI_COLUMNS,
};
use hytra_lab::span::Span;
use hytra_workloads::micro::SETTLED_OPS_MIN;

use crate::table::{mops, open_output, us, write_json, Table};
use crate::CliError;

/// What to add to a progress line when the window of `m` was extended.
fn extension_note(m: &Measured) -> String {
    if m.point.window_ns > m.asked_ns {
        format!(
            " (window extended from {} to {}: the shorter one held fewer than {SETTLED_OPS_MIN} completions or less than twice the p99 latency)",
            Span::from_ns(m.asked_ns),
            Span::from_ns(m.point.window_ns)
        )
    } else {
        String::new()
    }
}

/// `hytra micro --multi-object N`: transactions per second per machine at each step.
fn run_multi(args: &MicroArgs, plan: &MicroPlan, objects: u16) -> Result<(), CliError> {
    let out = args.json.as_deref().map(open_output).transpose()?;
    let payload = plan.payloads[0];
    let cells = hytra_lab::micro::run_multi(plan, objects, &mut |c| {
        if let Some(m) = &c.measured {
            eprintln!(
                "{:<8} {:<5} {:<9}: {} M txn/s per node{}",
                c.step,
                c.op,
                c.primitive.name(),
                mops(c.txn_per_sec),
                extension_note(m)
            );
        }
    })
    .map_err(|e| CliError::Run(e.into()))?;
    let mut t =
        Table::new(&["step", "read 1-sided", "read 2-sided", "write 1-sided", "write 2-sided"]);
    for row in cells.chunks(MULTI_COLUMNS.len()) {
        let mut line = vec![row[0].step.to_string()];
        line.extend(row.iter().map(|c| match c.measured {
            Some(_) => mops(c.txn_per_sec),
            None => "-".into(),
        }));
        t.row(line);
    }
    println!(
        "
multi-object transactions of {objects} x {payload} B, M txn/s per machine\n\n{}",
        t.render()
    );
    if let (Some(file), Some(path)) = (out, args.json.as_deref()) {
        let report = multi_report(plan, objects, &cells);
        write_json(file, path, &report)?;
    }
    Ok(())
}

/// Runs `hytra micro`.
pub fn run(args: MicroArgs) -> Result<(), CliError> {
    let plan = plan(&args)?;
    if let Some(objects) = args.multi_object {
        return run_multi(&args, &plan, objects);
    }
    let out = args.json.as_deref().map(open_output).transpose()?;
    let atomics: Vec<&str> =
        plan.primitives.iter().filter(|p| p.is_atomic()).map(|p| p.name()).collect();
    if args.payloads.is_some() && !atomics.is_empty() && !plan.payloads.contains(&8) {
        let verb =
            if atomics.len() == 1 { "operates on 8 B and is" } else { "operate on 8 B and are" };
        eprintln!("note: {} {verb} measured at 8 B only", atomics.join(" and "));
    }
    let sim = plan.backend.is_sim();
    if let Some(cfg) = plan.backend.sim_config(plan.shape, plan.params.seed) {
        eprintln!("{}", cfg.describe());
    }
    let run = run_matrix(&plan, args.self_check, &mut |i, n, m| {
        eprintln!(
            "[{}/{n}] {:<5} {:>4} B lanes={}: {} Mops/s per node, p50 {} µs{}",
            i + 1,
            m.point.primitive.name(),
            m.point.payload,
            m.point.lanes,
            mops(m.point.ops_per_sec),
            us(m.point.p50_ns),
            extension_note(m)
        );
        if let Some(b) = &m.baseline {
            eprintln!(
                "      minimal UCP {}: {} Mops/s per node, op p50 {} µs; UCP/hytra {}",
                b.op,
                mops(b.ops_per_sec),
                us(b.p50_ns),
                ratio_text(b.ratio(m.point.ops_per_sec))
            );
        }
    })
    .map_err(|e| {
        let argv: Vec<String> = std::env::args().skip(1).collect();
        CliError::Run(anyhow::anyhow!("{e}: {} (replay: hytra {})", e.cause, argv.join(" ")))
    })?;
    print!("{}", matrix_text(&plan, &run.results));
    let threads = LocalConfig { threads: plan.backend.threads(), ..LocalConfig::new(plan.shape) }
        .thread_count();
    let cores = if sim {
        None
    } else {
        Some(threads.min(std::thread::available_parallelism().map_or(1, |n| n.get())))
    };
    if args.self_check {
        println!("\nself-check: every point ran twice with identical trace hashes");
    }
    let (events, verbs, wall_s, trace) = (run.events, run.verbs, run.wall_s, run.trace);
    if sim {
        println!(
            "\nsimulated {events} events ({verbs} verbs) in {wall_s:.2} s of wall time: {:.2} M events/s, {:.2} M verbs/s; trace hash {trace:#018x}",
            events as f64 / wall_s / 1e6,
            verbs as f64 / wall_s / 1e6
        );
    } else {
        println!(
            "\n{} threads on {} cores; per-core rates divide the cluster total by the cores",
            threads,
            cores.unwrap_or(1)
        );
    }
    if let (Some(file), Some(path)) = (out, args.json.as_deref()) {
        let report = run.report(&plan, threads, cores.unwrap_or(1));
        write_json(file, path, &report)?;
    }
    Ok(())
}
