//! mirra's matmul against numpy's: rounds of (mirra, numpy) at each size in turn, so
//! that a slow phase of a noisy machine hits both alike.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::json::{num, opt};
use crate::timing::{Plan, Samples};
use crate::{machine, matmul, numpy, Failure};

/// Above this share of the CPUs taken by other processes, the figures are flagged.
pub const NOISY_SHARE: f64 = 0.1;

/// What the comparison measured.
#[derive(Debug, Default)]
pub struct Comparison {
    ours: BTreeMap<usize, Samples>,
    theirs: BTreeMap<usize, Samples>,
    /// numpy's median over mirra's, per size and round (robust to slow drifts).
    paired: BTreeMap<usize, Vec<f64>>,
    /// numpy's version and BLAS facts, or null.
    pub numpy_info: Value,
    /// Why there are no numpy figures.
    pub numpy_reason: Option<String>,
    /// The share of the CPUs other processes used meanwhile.
    pub others_share: Option<f64>,
}

fn merge(into: &mut BTreeMap<usize, Samples>, n: usize, s: Samples) {
    match into.get_mut(&n) {
        Some(all) => all.extend(&s),
        None => {
            into.insert(n, s);
        }
    }
}

fn gflops(n: usize, seconds: f64) -> f64 {
    matmul::flops(n) / seconds / 1e9
}

fn spread(s: &Samples) -> Value {
    json!({
        "median_ms": num(s.median() * 1e3, 4),
        "min_ms": num(s.min() * 1e3, 4),
        "max_ms": num(s.max() * 1e3, 4),
        "repeats": s.per_call.len(),
        "calls_per_repeat": s.calls,
    })
}

/// Runs `rounds` rounds over `sizes`; numpy joins when `with_numpy` and it can be made
/// ready (else its reason is recorded). Only a failure of mirra's own matmul is an error.
pub fn run(
    sizes: &[usize],
    threads: usize,
    plan: Plan,
    rounds: usize,
    with_numpy: bool,
) -> Result<Comparison, Failure> {
    let mut c = Comparison::default();
    let mut python = None;
    if with_numpy {
        // Installing numpy may take a while: before any timing.
        match numpy::prepare() {
            Ok(version) => python = Some(version),
            Err(e) => c.numpy_reason = Some(e),
        }
    } else {
        c.numpy_reason = Some("skipped (--no-numpy)".into());
    }
    let cpu_before = machine::CpuSnapshot::now();
    let mut session = None;
    if python.is_some() {
        match numpy::Session::start(threads) {
            Ok(s) => session = Some(s),
            Err(e) => c.numpy_reason = Some(e),
        }
    }
    if let Some(e) = &c.numpy_reason {
        println!("numpy: unavailable: {e}");
    }
    for round in 1..=rounds {
        println!(
            "matmul: round {round}/{rounds}: mirra{} at {sizes:?}",
            if session.is_some() { " and numpy" } else { "" }
        );
        for &n in sizes {
            let s = matmul::time_square(n, threads, plan)
                .map_err(|e| Failure::run(format!("mirra matmul {n}: {e}")))?;
            let ours_median = s.median();
            merge(&mut c.ours, n, s);
            let Some(np) = session.as_mut() else {
                continue;
            };
            match np.time(n, plan) {
                Ok(s) => {
                    c.paired
                        .entry(n)
                        .or_default()
                        .push(s.median() / ours_median);
                    merge(&mut c.theirs, n, s);
                }
                Err(e) => {
                    println!("numpy: {e}");
                    c.numpy_reason = Some(e);
                    c.theirs.clear();
                    c.paired.clear();
                    session = None;
                }
            }
        }
    }
    // Reap the numpy process before the second snapshot, so its CPU time counts as ours.
    if let Some(s) = session.take() {
        c.numpy_info = s.info.clone();
        if let Some(obj) = c.numpy_info.as_object_mut() {
            obj.insert("python".into(), json!(python));
            obj.insert("unset_env".into(), numpy::unset_env_record());
        }
    }
    c.others_share = cpu_before
        .zip(machine::CpuSnapshot::now())
        .and_then(|(a, b)| a.others_share(&b));
    if let Some(share) = c.others_share.filter(|&x| x > NOISY_SHARE) {
        println!(
            "warning: other processes used {:.0}% of the CPUs during the matmul runs: the \
             figures are unreliable (numpy's most: OpenBLAS threads spin-wait and collapse \
             when a core is taken); rerun on a quiet machine",
            share * 100.0
        );
    }
    Ok(c)
}

impl Comparison {
    /// No figures, for `reason`.
    pub fn skipped(reason: &str) -> Comparison {
        Comparison {
            numpy_reason: Some(reason.to_owned()),
            ..Default::default()
        }
    }

    /// mirra's GFLOP/s over numpy's at size `n` (medians).
    pub fn ratio(&self, n: usize) -> Option<f64> {
        let ours = self.ours.get(&n)?.median();
        let theirs = self.theirs.get(&n)?.median();
        Some(theirs / ours)
    }

    /// Whether other processes left the machine quiet enough to trust the figures.
    pub fn quiet(&self) -> Option<bool> {
        self.others_share.map(|x| x <= NOISY_SHARE)
    }

    /// `{"256": {"mirra", "numpy", "ratio"}, ...}` in GFLOP/s (medians).
    pub fn gflops_json(&self, sizes: &[usize]) -> Value {
        let mut m = Map::new();
        for &n in sizes {
            let ours = self.ours.get(&n).map(|s| gflops(n, s.median()));
            let theirs = self.theirs.get(&n).map(|s| gflops(n, s.median()));
            m.insert(
                n.to_string(),
                json!({
                    "mirra": opt(ours, 2),
                    "numpy": opt(theirs, 2),
                    "ratio": opt(self.ratio(n), 3),
                }),
            );
        }
        Value::Object(m)
    }

    /// Per size: the spread of each side, the per-round ratios and the best-repeat
    /// figures (less sensitive to other processes than the medians).
    pub fn timing_json(&self, sizes: &[usize]) -> Value {
        let mut m = Map::new();
        for &n in sizes {
            let best_ours = self.ours.get(&n).map(|s| gflops(n, s.min()));
            let best_theirs = self.theirs.get(&n).map(|s| gflops(n, s.min()));
            let rounds: Vec<Value> = self
                .paired
                .get(&n)
                .map(|r| r.iter().map(|&x| num(x, 3)).collect())
                .unwrap_or_default();
            m.insert(
                n.to_string(),
                json!({
                    "mirra": self.ours.get(&n).map_or(Value::Null, spread),
                    "numpy": self.theirs.get(&n).map_or(Value::Null, spread),
                    "ratio_per_round": rounds,
                    "best_gflops": {
                        "mirra": opt(best_ours, 2),
                        "numpy": opt(best_theirs, 2),
                        "ratio": opt(best_ours.zip(best_theirs).map(|(a, b)| a / b), 3),
                    },
                }),
            );
        }
        Value::Object(m)
    }
}
