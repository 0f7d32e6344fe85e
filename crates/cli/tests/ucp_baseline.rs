//! `hytra micro --ucp-baseline`: the minimal UCP program next to the `ucx` backend. With
//! the `ucx` feature, a short run writes the extra columns to JSON and bad shapes are
//! refused; without it, the flag says how to get it.

use std::process::{Command, Output};

fn hytra(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hytra")).args(args).output().expect("hytra runs")
}

/// The command line fails with exit code 2 and one line on standard error containing
/// every one of `words`.
fn assert_usage_error(args: &[&str], words: &[&str]) {
    let out = hytra(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: not one line: {stderr}");
    for w in words {
        assert!(stderr.contains(w), "{args:?}: no '{w}' in: {stderr}");
    }
}

#[cfg(not(feature = "ucx"))]
#[test]
fn without_the_ucx_feature_the_flag_says_how_to_get_it() {
    assert_usage_error(
        &["micro", "--ucp-baseline"],
        &["--ucp-baseline", "libucx-dev", "--features ucx"],
    );
}

#[cfg(feature = "ucx")]
mod ucx {
    use super::{assert_usage_error, hytra};

    #[test]
    fn shapes_it_cannot_match_are_refused() {
        assert_usage_error(&["micro", "--ucp-baseline"], &["--backend ucx"]);
        assert_usage_error(
            &["micro", "--backend", "ucx", "--ucp-baseline", "--nodes", "3"],
            &["--nodes 2", "got 3"],
        );
        assert_usage_error(
            &["micro", "--backend", "ucx", "--ucp-baseline", "--lanes", "2"],
            &["--lanes 1"],
        );
        assert_usage_error(
            &["micro", "--backend", "ucx", "--ucp-baseline", "--multi-object", "4"],
            &["--multi-object"],
        );
    }

    #[test]
    fn a_short_run_writes_the_baseline_columns() {
        let dir = std::env::temp_dir().join(format!("hytra-ucp-baseline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("micro.json");
        let json_arg = json.to_str().unwrap();
        let out = hytra(&[
            "micro",
            "--backend",
            "ucx",
            "--transports",
            "sm",
            "--ucp-baseline",
            "--primitives",
            "read,wrpc",
            "--payloads",
            "64",
            "--nodes",
            "2",
            "--workers",
            "1",
            "--coroutines",
            "2",
            "--duration",
            "20ms",
            "--warmup",
            "0.25",
            "--json",
            json_arg,
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("UCP Mops/s") && stdout.contains("UCP/hytra"), "{stdout}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["transports"], "sm", "{v}");
        // 2 coroutines x batch 8 x 1 worker.
        assert_eq!(v["ucp_baseline"]["outstanding_per_node"], 16, "{v}");
        let rows = v["results"].as_array().unwrap();
        let read = rows.iter().find(|r| r["primitive"] == "read").expect("a read row");
        let minimal = &read["ucp_minimal"];
        assert_eq!(minimal["op"], "get", "{read}");
        assert_eq!(minimal["outstanding"], 16, "{read}");
        assert!(minimal["ops"].as_u64().unwrap() > 0, "{read}");
        assert!(minimal["ops_per_sec"].as_f64().unwrap() > 0.0, "{read}");
        assert!(minimal["op_p50_us"].as_f64().is_some(), "{read}");
        let ratio = read["ucp_minimal_ratio"].as_f64().expect("a ratio");
        let expect =
            minimal["ops_per_sec"].as_f64().unwrap() / read["ops_per_sec"].as_f64().unwrap();
        assert!((ratio - expect).abs() < 1e-9 * expect.max(1.0), "{read}");
        let wrpc = rows.iter().find(|r| r["primitive"] == "wrpc").expect("a wrpc row");
        assert!(wrpc["ucp_minimal"].is_null() && wrpc["ucp_minimal_ratio"].is_null(), "{wrpc}");
        assert!(wrpc["ucp_minimal_note"].as_str().unwrap().contains("no UCP baseline"), "{wrpc}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
