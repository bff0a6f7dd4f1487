//! The human-readable table of a core benchmark report, printed from its JSON, so that a
//! saved `core.json` prints the same way.

use serde_json::Value;

use crate::bench_core::{BATCHES, SIZES, TARGET_ALLOCS_PER_STEP, TARGET_RATIO_1024, TARGET_RSS_MB};

fn cell(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// `ok`, `MISSED` or `n/a` for a target's `met` (true, false, null).
pub(crate) fn mark(met: &Value) -> &'static str {
    match met.as_bool() {
        Some(true) => "ok",
        Some(false) => "MISSED",
        None => "n/a",
    }
}

/// Prints the report `r` of `cargo xtask bench`.
pub fn print_core(r: &Value) {
    let t = &r["targets"];
    println!();
    println!(
        "{:<22} {:>12} {:>12} {:>10}   target",
        "matmul f32 (GFLOP/s)", "mirra", "numpy", "ours/np"
    );
    for n in SIZES {
        let m = &r["matmul_gflops"][n.to_string()];
        let target = if n == 1024 {
            let busy = t["matmul_ratio_1024"]["machine_was_quiet"] == Value::Bool(false);
            format!(
                ">= {TARGET_RATIO_1024:.2}  {}{}",
                mark(&t["matmul_ratio_1024"]["met"]),
                if busy {
                    " (machine busy: unreliable)"
                } else {
                    ""
                }
            )
        } else {
            String::new()
        };
        println!(
            "{:<22} {:>12} {:>12} {:>10}   {target}",
            format!("  {n}x{n}x{n}"),
            cell(&m["mirra"], 1),
            cell(&m["numpy"], 1),
            cell(&m["ratio"], 3),
        );
    }
    if let Some(share) = r["matmul_others_cpu_share"].as_f64() {
        println!(
            "  other processes used {:.0}% of the CPUs meanwhile",
            share * 100.0
        );
    }
    if let Some(why) = r["numpy_unavailable"].as_str() {
        println!("  numpy: none ({why})");
    } else if let Some(blas) = r["numpy"]["blas"].as_array().and_then(|a| a.first()) {
        println!(
            "  numpy {} with {} {} ({} kernel), {} thread(s)",
            r["numpy"]["numpy_version"].as_str().unwrap_or("?"),
            blas["internal_api"].as_str().unwrap_or("?"),
            blas["version"].as_str().unwrap_or("?"),
            blas["architecture"].as_str().unwrap_or("?"),
            blas["num_threads"]
        );
    }
    println!();
    println!(
        "{:<22} {:>12} {:>12} {:>12} {:>10}   target",
        "MLP train step", "samples/s", "(1 thread)", "allocs/step", "buffers"
    );
    for b in BATCHES {
        let b = b.to_string();
        println!(
            "{:<22} {:>12} {:>12} {:>12} {:>10}   allocs <= {TARGET_ALLOCS_PER_STEP}  {}",
            format!("  batch {b}"),
            cell(&r["mlp_samples_per_sec"][&b], 0),
            cell(&r["mlp_samples_per_sec_1_thread"][&b], 0),
            cell(&r["buffer_allocations_per_step"][&b], 2),
            cell(&r["buffer_requests_per_step"][&b], 0),
            mark(&t["buffer_allocations_per_step"]["met"]),
        );
    }
    if let Some(why) = r["mlp_unavailable"].as_str() {
        println!("  MLP: none ({why})");
    }
    println!();
    println!(
        "{:<35} {:>10}   < {TARGET_RSS_MB} MiB  {}",
        "peak RSS, mirra train --epochs 1",
        r["peak_rss_mb"]
            .as_f64()
            .map_or_else(|| "-".into(), |x| format!("{x:.1} MiB")),
        mark(&t["peak_rss_mb"]["met"])
    );
    if let Some(why) = r["peak_rss"]["unavailable"].as_str() {
        println!("  peak RSS: none ({why})");
    }
    println!();
}
