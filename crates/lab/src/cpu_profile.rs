//! CPU profiles: what each kind of CPU work of hytra's own code costs on some machine,
//! for the simulator's cost model ([`hytra_fabric::cpu`]).
//!
//! A profile is a TOML file. Its `[terms]` give every term of the runtime and the engine
//! in nanoseconds; its `[attempt.<workload>]` tables give, per transaction type, what
//! starting an attempt costs (the engine's bookkeeping and the workload's own logic).
//! `hytra calibrate` writes one for the machine it runs on. Built in:
//!
//! - `host`: the calibration of the machine hytra is developed on (an AMD EPYC at
//!   2.6 GHz, 2 cores), checked in as `profiles/host.toml`;
//! - `paper`: the paper's testbed (Intel Xeon E5-2650 v4 at 2.2 GHz, DrTM+H §4.1),
//!   derived from `host` by the ratio of the two clocks, 2.6 / 2.2: a published figure of
//!   each CPU, which assumes they do the same work per cycle;
//! - `assumed`: the costs the code assumed before anything was measured (100 ns per
//!   attempt, 20 ns per record, 10/20/15 ns per step/switch/dispatch).
//!
//! The NIC's host costs (doorbell, work request, completion) are not here: they stay
//! with the NIC profile, as primitive-level figures of the NIC and its driver.

use std::collections::BTreeMap;
use std::path::Path;

use hytra_fabric::cpu::{CpuTable, CpuTerm};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The built-in profiles `--cpu-profile` names.
pub const CPU_PROFILES: [&str; 3] = ["paper", "host", "assumed"];

/// The clock of the machine `profiles/host.toml` was measured on, GHz.
pub const HOST_GHZ: f64 = 2.6;
/// The clock of the paper's testbed (Intel Xeon E5-2650 v4; DrTM+H §4.1), GHz.
pub const PAPER_GHZ: f64 = 2.2;

/// Largest cost a term may have, ns: far above any step's work, to catch unit mistakes.
pub const TERM_NS_MAX: f64 = 1_000_000.0;

const HOST_TOML: &str = include_str!("../profiles/host.toml");

/// A CPU profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuProfile {
    /// Name, for the line that describes a run.
    pub name: String,
    /// Where the numbers come from.
    pub source: String,
    /// Cost of each runtime and engine term but the attempts, ns, by term name.
    pub terms: BTreeMap<String, f64>,
    /// Cost of starting an attempt, ns, by workload and transaction type.
    pub attempt: BTreeMap<String, BTreeMap<String, f64>>,
    /// How well the costs fit the measurements they came from (informative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<FitReport>,
}

/// How a calibration's fit went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitReport {
    /// Steps measured.
    pub steps: u64,
    /// Distinct mixes of terms among them.
    pub mixes: u64,
    /// Share of the steps' variance (medians by mix, weighted by steps) the fit explains.
    pub r2: f64,
    /// Median relative error of a mix's predicted time, weighted by steps.
    pub median_rel_error: f64,
    /// Predicted over measured total time of all steps.
    pub total_ratio: f64,
    /// Terms no calibration run charged: they keep their assumed cost.
    pub unmeasured: Vec<String>,
}

/// Why a profile is refused.
#[derive(Debug, Error)]
pub enum ProfileError {
    /// The file cannot be read.
    #[error("CPU profile {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not TOML, or not a profile.
    #[error("CPU profile {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What the parser said (with the line).
        message: String,
    },
    /// A profile that parses but cannot be used.
    #[error("CPU profile {path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// The terms a profile must give in `[terms]`: the runtime's and the engine's, but the
/// attempts (which `[attempt.*]` give).
pub fn fixed_terms() -> impl Iterator<Item = CpuTerm> {
    hytra_rt::config::CPU_TERMS
        .into_iter()
        .chain(hytra_txn::cpu::terms().filter(|t| !hytra_txn::cpu::ATTEMPT.contains(t)))
}

/// The workloads a profile must give attempt costs for, with their transaction types.
pub fn attempt_workloads() -> [(&'static str, &'static [&'static str]); 5] {
    [
        ("smallbank", &hytra_workloads::smallbank::TYPES),
        ("tpcc", &hytra_workloads::tpcc::TYPES),
        ("tpce-cp", &hytra_workloads::tpce::TYPES),
        ("tatp", &hytra_workloads::tatp::TYPES),
        ("ycsb", &hytra_workloads::ycsb::TYPES),
    ]
}

/// The table of attempt costs a workload's runs use: TPC-C/no is TPC-C's New-Order.
pub fn attempt_family(workload: &str) -> &str {
    match workload {
        "tpcc-no" => "tpcc",
        w => w,
    }
}

impl CpuProfile {
    /// A built-in profile by name, or a profile file.
    pub fn load(name_or_path: &str) -> Result<CpuProfile, ProfileError> {
        match name_or_path {
            "host" => CpuProfile::parse(HOST_TOML, "host"),
            "paper" => {
                let host = CpuProfile::parse(HOST_TOML, "host")?;
                Ok(host.scaled(
                    "paper",
                    HOST_GHZ / PAPER_GHZ,
                    &format!(
                        "host x {HOST_GHZ}/{PAPER_GHZ}: the paper's Xeon E5-2650 v4 at {PAPER_GHZ} GHz \
                         against the host's {HOST_GHZ} GHz, taken to do the same work per cycle"
                    ),
                ))
            }
            "assumed" => Ok(CpuProfile::assumed()),
            path => {
                let text = std::fs::read_to_string(Path::new(path))
                    .map_err(|source| ProfileError::Read { path: path.into(), source })?;
                // Named by its file, so that the line describing a run says which costs
                // it used (a calibration names every profile it writes `host`).
                Ok(CpuProfile { name: path.into(), ..CpuProfile::parse(&text, path)? })
            }
        }
    }

    /// Parses and checks a profile; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<CpuProfile, ProfileError> {
        let p: CpuProfile = toml::from_str(text)
            .map_err(|e| ProfileError::Parse { path: path.into(), message: one_line(&e) })?;
        p.validate().map_err(|message| ProfileError::Invalid { path: path.into(), message })?;
        Ok(p)
    }

    /// The profile of the costs assumed before any measurement.
    pub fn assumed() -> CpuProfile {
        let ns = |t: CpuTerm| t.assumed_ps() as f64 / 1000.0;
        let attempt = attempt_workloads()
            .into_iter()
            .map(|(w, types)| {
                let costs = types
                    .iter()
                    .enumerate()
                    .map(|(i, ty)| (ty.to_string(), ns(hytra_txn::cpu::ATTEMPT[i])))
                    .collect();
                (w.to_string(), costs)
            })
            .collect();
        CpuProfile {
            name: "assumed".into(),
            source: "the costs assumed in the code before any measurement".into(),
            terms: fixed_terms().map(|t| (t.name().to_string(), ns(t))).collect(),
            attempt,
            fit: None,
        }
    }

    /// Every cost times `factor`, renamed.
    pub fn scaled(&self, name: &str, factor: f64, source: &str) -> CpuProfile {
        assert!(factor.is_finite() && factor > 0.0, "scaling a profile by {factor}");
        let mut p = self.clone();
        p.name = name.into();
        p.source = source.into();
        p.terms.values_mut().for_each(|v| *v *= factor);
        p.attempt.values_mut().flat_map(|m| m.values_mut()).for_each(|v| *v *= factor);
        p
    }

    /// Every term and every workload's every type present, nothing unknown, every cost
    /// finite and in `0..=TERM_NS_MAX`.
    pub fn validate(&self) -> Result<(), String> {
        let check = |what: &str, v: f64| {
            if v.is_finite() && (0.0..=TERM_NS_MAX).contains(&v) {
                Ok(())
            } else {
                Err(format!("{what} = {v}: a cost must be in 0..={TERM_NS_MAX} ns"))
            }
        };
        let known: Vec<&str> = fixed_terms().map(|t| t.name()).collect();
        for t in &known {
            let v = self.terms.get(*t).ok_or_else(|| format!("[terms] lacks \"{t}\""))?;
            check(t, *v)?;
        }
        if let Some(k) = self.terms.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!("[terms] has unknown term \"{k}\" (known: {})", known.join(", ")));
        }
        let workloads = attempt_workloads();
        for (w, types) in workloads {
            let costs = self.attempt.get(w).ok_or_else(|| format!("lacks [attempt.{w}]"))?;
            for ty in types {
                let v = costs.get(*ty).ok_or_else(|| format!("[attempt.{w}] lacks {ty}"))?;
                check(&format!("attempt.{w}.{ty}"), *v)?;
            }
            if let Some(k) = costs.keys().find(|k| !types.contains(&k.as_str())) {
                return Err(format!(
                    "[attempt.{w}] has unknown type {k} (known: {})",
                    types.join(", ")
                ));
            }
        }
        if let Some(w) = self.attempt.keys().find(|w| !workloads.iter().any(|(n, _)| n == w)) {
            return Err(format!("unknown workload [attempt.{w}]"));
        }
        Ok(())
    }

    /// The simulator's table for runs of `workload` (as [`Workload::name`] gives it) whose
    /// transaction types are `types`.
    ///
    /// [`Workload::name`]: hytra_workloads::bench::Workload::name
    pub fn table(&self, workload: &str, types: &[&str]) -> CpuTable {
        let mut t = CpuTable::named(self.name.clone());
        let ps = |ns: f64| (ns * 1000.0).round() as u64;
        for term in fixed_terms() {
            t.set(term, ps(self.terms[term.name()]));
        }
        let costs = self.attempt.get(attempt_family(workload));
        for (i, ty) in types.iter().enumerate() {
            // A workload a profile does not know (a micro-benchmark) keeps the assumed cost.
            if let Some(v) = costs.and_then(|c| c.get(*ty)) {
                t.set(hytra_txn::cpu::ATTEMPT[i], ps(*v));
            }
        }
        t
    }

    /// The profile as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a CPU profile serialises")
    }
}

fn one_line(e: &toml::de::Error) -> String {
    let what = e.message().lines().map(str::trim).collect::<Vec<_>>().join("; ");
    match e.span() {
        Some(_) => {
            let s = e.to_string();
            // The toml crate's own text starts with "TOML parse error at line L, column C".
            let at = s.lines().next().unwrap_or("").trim_start_matches("TOML parse error ");
            format!("{at}: {what}")
        }
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_profiles_load_and_cover_every_term() {
        for name in CPU_PROFILES {
            let p = CpuProfile::load(name).unwrap();
            p.validate().unwrap();
            let t = p.table("smallbank", &hytra_workloads::smallbank::TYPES);
            assert_eq!(t.name(), name);
        }
    }

    #[test]
    fn the_paper_profile_is_the_host_one_scaled_by_the_clocks() {
        let host = CpuProfile::load("host").unwrap();
        let paper = CpuProfile::load("paper").unwrap();
        let step = "rt.step";
        let ratio = paper.terms[step] / host.terms[step];
        assert!((ratio - HOST_GHZ / PAPER_GHZ).abs() < 1e-9, "{ratio}");
        let a = |p: &CpuProfile| p.attempt["tpcc"]["new_order"];
        assert!((a(&paper) / a(&host) - HOST_GHZ / PAPER_GHZ).abs() < 1e-9);
    }

    #[test]
    fn the_assumed_profile_gives_what_the_code_assumed() {
        let t = CpuProfile::assumed().table("tpcc-no", &hytra_workloads::tpcc::TYPES);
        assert_eq!(t, {
            let mut t = hytra_fabric::cpu::CpuTable::named("assumed");
            for term in fixed_terms().chain(hytra_txn::cpu::ATTEMPT.into_iter().take(5)) {
                t.set(term, term.assumed_ps());
            }
            t
        });
        assert_eq!(t.ps(hytra_rt::config::SWITCH), 20_000);
    }

    fn refused(text: &str) -> String {
        CpuProfile::parse(text, "f.toml").unwrap_err().to_string()
    }

    #[test]
    fn a_bad_profile_is_refused_with_what_is_wrong() {
        let good = CpuProfile::assumed().to_toml();
        assert!(CpuProfile::parse(&good, "f.toml").is_ok());
        let e = refused("garbage = [\n");
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = refused("name = \"x\"\nsource = 3\n");
        assert!(e.starts_with("CPU profile f.toml: at line 2"), "{e}");
        let e = refused(&good.replace("\"rt.switch\" = 20.0\n", ""));
        assert!(e.contains("[terms] lacks \"rt.switch\""), "{e}");
        let e = refused(&good.replace("\"rt.switch\" = 20.0", "\"rt.switch\" = -1.0"));
        assert!(e.contains("rt.switch = -1"), "{e}");
        let e = refused(&good.replace("amalgamate = 100.0", "amalgamate = nan"));
        assert!(e.contains("attempt.smallbank.amalgamate = NaN"), "{e}");
        let e = refused(&good.replace("\"rt.switch\"", "\"rt.swich\""));
        assert!(e.contains("lacks \"rt.switch\""), "{e}");
        let e = refused(&format!("{good}\n[attempt.tpcc-x]\nnew_order = 1.0\n"));
        assert!(e.contains("unknown workload [attempt.tpcc-x]"), "{e}");
        let e = refused(&format!("extra = 1\n{good}"));
        assert!(e.contains("unknown field"), "{e}");
        let e = refused(&format!("{good}\nextra = 1\n"));
        assert!(e.contains("[attempt.ycsb] has unknown type extra"), "{e}");
    }
}
