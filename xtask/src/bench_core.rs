//! `cargo xtask bench`: the core speed figures of the foundation, in one run.
//!
//! - `matmul_gflops`: mirra's f32 `Tensor::matmul` against numpy's at 256, 512 and 1024,
//!   same thread count, in alternating rounds (see [`compare`](crate::compare)); medians.
//! - `mlp_samples_per_sec` and `buffer_allocations_per_step`: the MNIST MLP's training
//!   step at batch 64 and 256.
//! - `peak_rss_mb`: peak RSS of `mirra train --epochs 1`.
//!
//! Everything lands in `target/bench/core.json` (written atomically) and a table on
//! stdout. A missing part (no Python, no CLI) is `null` with the reason next to it; it
//! never fails the whole run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::json::{num, opt, save};
use crate::paths::{bench_file, target_dir, workspace_root};
use crate::timing::Plan;
use crate::{compare, flags, machine, mlp, rss, table, Failure};

/// The flags of `cargo xtask bench`, for the usage message.
pub const FLAGS_HELP: &str =
    "  --threads N   kernel and BLAS threads (default: the machine's cores)
  --quick       fewer, shorter repeats (a smoke test, not a measurement)
  --no-matmul   skip the matmul comparison
  --no-numpy    skip numpy in the matmul comparison
  --no-mlp      skip the MLP training throughput
  --no-rss      skip the peak-RSS run of `mirra train --epochs 1`
  --out FILE    where to write the JSON (default: target/bench/core.json)
";

/// Square matmul sizes.
pub const SIZES: [usize; 3] = [256, 512, 1024];
/// MLP batch sizes.
pub const BATCHES: [usize; 2] = [64, 256];

/// The targets the figures are compared against.
pub const TARGET_RATIO_1024: f64 = 0.9;
pub const TARGET_RSS_MB: f64 = 100.0;
pub const TARGET_ALLOCS_PER_STEP: f64 = 0.0;

#[derive(Debug)]
struct Options {
    threads: usize,
    quick: bool,
    matmul: bool,
    numpy: bool,
    mlp: bool,
    rss: bool,
    out: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Options, Failure> {
    let mut o = Options {
        threads: machine::cores(),
        quick: false,
        matmul: true,
        numpy: true,
        mlp: true,
        rss: true,
        out: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| flags::value("bench", flag, &mut it);
        match arg.as_str() {
            "--threads" => {
                let v = value("--threads")?;
                o.threads = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    Failure::usage(format!(
                        "xtask bench: --threads must be a positive integer, got `{v}`"
                    ))
                })?;
            }
            "--quick" => o.quick = true,
            "--no-matmul" => o.matmul = false,
            "--no-numpy" => o.numpy = false,
            "--no-mlp" => o.mlp = false,
            "--no-rss" => o.rss = false,
            "--out" => o.out = Some(PathBuf::from(value("--out")?)),
            other => {
                return Err(Failure::usage(format!(
                    "xtask bench: unknown flag `{other}`\n\nflags:\n{FLAGS_HELP}"
                )))
            }
        }
    }
    Ok(o)
}

/// Timing plans: (matmul, rounds of matmul, MLP).
fn plans(quick: bool) -> (Plan, usize, Plan) {
    if quick {
        let p = Plan {
            warm_up: Duration::from_millis(50),
            repeats: 3,
            min_repeat: Duration::from_millis(20),
        };
        return (p, 1, p);
    }
    let matmul = Plan {
        warm_up: Duration::from_millis(200),
        repeats: 3,
        min_repeat: Duration::from_millis(100),
    };
    let mlp = Plan {
        warm_up: Duration::from_millis(500),
        repeats: 5,
        min_repeat: Duration::from_millis(200),
    };
    (matmul, 4, mlp)
}

/// `{"64": f(t), "256": ...}` over the measured batch sizes.
fn per_batch(m: &BTreeMap<usize, mlp::Throughput>, f: impl Fn(&mlp::Throughput) -> Value) -> Value {
    Value::Object(m.iter().map(|(b, t)| (b.to_string(), f(t))).collect())
}

/// Runs the benchmark, prints the table and writes the report.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let o = parse(args)?;
    let started = Instant::now();
    let root = workspace_root();
    let target = target_dir(&root);
    let out_path = bench_file(o.out.as_deref(), "core.json");
    let (matmul_plan, rounds, mlp_plan) = plans(o.quick);
    let facts = machine::facts();
    println!(
        "mirra core benchmarks: {} thread(s) on {} ({} cores), {}",
        o.threads,
        facts["cpu_model"].as_str().unwrap_or("unknown CPU"),
        facts["cores"],
        facts["date_utc"].as_str().unwrap_or("")
    );
    if cfg!(debug_assertions) {
        println!("warning: xtask was built without optimisations; use `cargo xtask bench`");
    }
    let mut report = Map::new();
    let mut put = |k: &str, v: Value| {
        report.insert(k.to_owned(), v);
    };
    put("schema", json!("mirra-bench-core/1"));
    put("command", json!("cargo xtask bench"));
    put("machine", facts);
    put("threads", json!(o.threads));
    put("quick", json!(o.quick));

    // Matmul against numpy.
    let comparison = if o.matmul {
        compare::run(&SIZES, o.threads, matmul_plan, rounds, o.numpy)?
    } else {
        compare::Comparison::skipped("skipped (--no-matmul)")
    };
    let ratio_1024 = comparison.ratio(1024);
    put("matmul_gflops", comparison.gflops_json(&SIZES));
    put("matmul_timing", comparison.timing_json(&SIZES));
    put("matmul_others_cpu_share", opt(comparison.others_share, 3));
    put("numpy", comparison.numpy_info.clone());
    if let Some(r) = &comparison.numpy_reason {
        put("numpy_unavailable", json!(r));
    }

    // The MLP's training step.
    let mlp = if o.mlp {
        println!("mlp: training steps at batch {BATCHES:?}");
        mlp::measure(&BATCHES, o.threads, mlp_plan)
    } else {
        Err("skipped (--no-mlp)".into())
    };
    let mut max_allocs = None;
    match &mlp {
        Ok(m) => {
            put(
                "mlp_samples_per_sec",
                per_batch(m, |t| num(t.samples_per_sec, 1)),
            );
            put(
                "buffer_allocations_per_step",
                per_batch(m, |t| num(t.allocations_per_step, 2)),
            );
            put(
                "buffer_requests_per_step",
                per_batch(m, |t| num(t.buffer_requests_per_step, 2)),
            );
            max_allocs = m.values().map(|t| t.allocations_per_step).reduce(f64::max);
        }
        Err(e) => {
            println!("mlp: unavailable: {e}");
            put("mlp_samples_per_sec", Value::Null);
            put("buffer_allocations_per_step", Value::Null);
            put("mlp_unavailable", json!(e));
        }
    }

    // The same on one thread: what the parallel kernels gain (or lose) at these sizes.
    if o.mlp && o.threads > 1 {
        println!("mlp: the same on 1 thread, for comparison");
        let single = mlp::measure(&BATCHES, 1, mlp_plan);
        put(
            "mlp_samples_per_sec_1_thread",
            single.map_or(Value::Null, |m| {
                per_batch(&m, |t| num(t.samples_per_sec, 1))
            }),
        );
    }

    // Step time once the model has learned its data, subnormals flushed and not.
    if std::env::var_os("MIRRA_BENCH_SUBNORMAL").is_some() {
        println!("subnormal: training to convergence with and without flush-to-zero");
        let r = crate::subnormal::report();
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
        put("subnormal", r);
    }

    // Peak RSS of a real training run.
    let log = out_path.with_file_name("mirra-train.log");
    let rss_run = if o.rss {
        if let Some(dir) = log.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        rss::measure(&root, &target, &log)
    } else {
        Err("skipped (--no-rss)".into())
    };
    let peak = rss_run.as_ref().ok().map(|r| r.peak_mib);
    put("peak_rss_mb", opt(peak, 1));
    put(
        "peak_rss",
        match &rss_run {
            Ok(r) => json!({
                "unit": "MiB (ru_maxrss of the child)",
                "command": format!("{} {}", r.binary.display(), rss::TRAIN_ARGS.join(" ")),
                "wall_s": num(r.wall_s, 2),
                "log": r.log.display().to_string(),
            }),
            Err(e) => {
                println!("peak RSS: unavailable: {e}");
                json!({ "unavailable": e })
            }
        },
    );

    put(
        "targets",
        json!({
            "matmul_ratio_1024": {
                "min": TARGET_RATIO_1024,
                "measured": opt(ratio_1024, 3),
                "met": ratio_1024.map(|r| r >= TARGET_RATIO_1024),
                "machine_was_quiet": comparison.quiet(),
            },
            "peak_rss_mb": {
                "max_exclusive": TARGET_RSS_MB,
                "measured": opt(peak, 1),
                "met": peak.map(|p| p < TARGET_RSS_MB),
            },
            "buffer_allocations_per_step": {
                "max": TARGET_ALLOCS_PER_STEP,
                "measured": opt(max_allocs, 2),
                "met": max_allocs.map(|a| a <= TARGET_ALLOCS_PER_STEP),
            },
        }),
    );
    put(
        "plan",
        json!({
            "matmul_rounds": rounds,
            "matmul_warm_up_s": matmul_plan.warm_up.as_secs_f64(),
            "matmul_repeats_per_round": matmul_plan.repeats,
            "matmul_min_repeat_s": matmul_plan.min_repeat.as_secs_f64(),
            "mlp_warm_up_s": mlp_plan.warm_up.as_secs_f64(),
            "mlp_repeats": mlp_plan.repeats,
            "mlp_min_repeat_s": mlp_plan.min_repeat.as_secs_f64(),
            "statistic": "median over all repeats",
        }),
    );
    put("elapsed_s", num(started.elapsed().as_secs_f64(), 1));

    let report = Value::Object(report);
    table::print_core(&report);
    save(&out_path, &report, None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::flags::args;

    #[test]
    fn flags_parse_and_unknown_flags_are_usage_errors() {
        let o = parse(&args(&["--threads", "3", "--quick", "--no-numpy"])).unwrap();
        assert_eq!((o.threads, o.quick, o.numpy, o.mlp), (3, true, false, true));
        assert_eq!(parse(&args(&["--bogus"])).unwrap_err().code, 2);
        assert_eq!(parse(&args(&["--threads", "0"])).unwrap_err().code, 2);
        assert_eq!(parse(&args(&["--threads"])).unwrap_err().code, 2);
    }
}
