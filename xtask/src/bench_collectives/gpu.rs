//! `cargo xtask bench-collectives --device cuda`: nccl-tests' table for the GPU backends,
//! with the device copy rate measured in the same run and, for the CUDA ring, the traffic
//! bound it implies.
//!
//! `cuda-ring` runs every world size with all its ranks on `cuda:0` (how a one-GPU machine
//! measures it); NCCL runs one rank per GPU, so `nccl-ring` and `nccl-tree` run the world
//! sizes the machine has GPUs for, and only the one `NCCL_ALGO` names (NCCL reads it once
//! per process; run the command again with the other).
//!
//! The traffic bound: with every rank on one device, the ranks share its memory, and a
//! ring step reads and writes each chunk more than once. [`cuda_ring_traffic`] states the
//! bytes the schedule reads plus writes per rank (an all-reduce: `5 (n - 1) / n` times
//! the buffer; a copy reads and writes its length, a reduction reads two and writes one);
//! the device copy, timed here on buffers of the largest size, moves bytes read plus
//! written at rate `C`; so no schedule can finish before `sum of traffic / C`, and algbw
//! cannot pass `bytes x C / sum of traffic`. Target: at least 0.6 of that bound at 256 MiB
//! for 2, 4 and 8 ranks. A ratio above 1.0 would mean the bound is wrong, and is reported.

use std::time::Instant;

use mirra::device::Device;
use mirra_collectives::{cuda_ring_traffic, Collective, Config, DEVICE_BACKENDS};
use serde_json::{json, Value};

use super::{sizes, sweep, Options};
use crate::json::{at_least, num, opt, save};
use crate::machine;
use crate::nccl::{size_label, Op, Row};
use crate::paths::bench_file;
use crate::ranks::Group;
use crate::Failure;

/// The traffic-bound target: algbw over the bound at [`TARGET_BYTES`].
pub const TARGET_OVER_BOUND: f64 = 0.6;
/// The message size of the target.
pub const TARGET_BYTES: usize = 256 << 20;
/// The world sizes of the target.
pub const TARGET_WORLDS: [usize; 3] = [2, 4, 8];

fn collective(op: Op) -> Collective {
    match op {
        Op::AllReduce => Collective::AllReduce,
        Op::ReduceScatter => Collective::ReduceScatter,
        Op::AllGather => Collective::AllGather,
        Op::Broadcast => Collective::Broadcast,
    }
}

/// The CUDA ring's bound on algbw (GB/s) for a row of `op` at `n` ranks, `count` f32
/// elements per rank, `bytes` nccl-tests bytes, all ranks on one device whose copy moves
/// `copy_gbs` read plus written.
pub fn traffic_bound(op: Op, n: usize, count: usize, bytes: usize, copy_gbs: f64) -> f64 {
    let total: usize = cuda_ring_traffic(collective(op), n, count, 4).iter().sum();
    if total == 0 {
        return f64::INFINITY;
    }
    bytes as f64 * copy_gbs / total as f64
}

/// The device copy of `bytes`: bytes read plus written per second (GB/s), timed on the
/// device with events over 20 copies after 3 unmeasured ones.
fn device_copy_gbs(ordinal: usize, bytes: usize) -> Result<f64, String> {
    let rt = mirra_cuda::runtime::runtime(ordinal).map_err(|e| e.to_string())?;
    let src = rt.alloc(bytes).map_err(|e| e.to_string())?;
    let mut dst = rt.alloc(bytes).map_err(|e| e.to_string())?;
    let e = |x: mirra_cuda::CudaError| x.to_string();
    for _ in 0..3 {
        dst.copy_from(&src).map_err(e)?;
    }
    let iters = 20;
    let start = rt.record_event(true).map_err(e)?;
    for _ in 0..iters {
        dst.copy_from(&src).map_err(e)?;
    }
    let end = rt.record_event(true).map_err(e)?;
    let t = end.elapsed_since(&start).map_err(e)?.as_secs_f64();
    Ok(2.0 * bytes as f64 * iters as f64 / t / 1e9)
}

/// The devices of `backend`'s `n` ranks on a machine with `gpus` GPUs, or why it cannot
/// run there.
fn devices(backend: &str, n: usize, gpus: usize) -> Result<Vec<Device>, String> {
    let cuda = |i| Device::cuda(i).map_err(|e| e.to_string());
    if backend == "cuda-ring" {
        return (0..n).map(|_| cuda(0)).collect();
    }
    if n > gpus {
        return Err(format!(
            "{backend} runs one rank per GPU: {n} ranks need {n} GPUs, this machine has {gpus}"
        ));
    }
    (0..n).map(cuda).collect()
}

/// The backends to run by default: the CUDA ring, and the NCCL backend whose algorithm the
/// process environment pins (none when NCCL_ALGO is unset).
pub fn default_backends(nccl_algo: Option<&str>) -> Vec<String> {
    let mut b = vec!["cuda-ring".to_string()];
    match nccl_algo.map(|a| a.trim().to_ascii_lowercase()) {
        Some(a) if a == "ring" => b.push("nccl-ring".into()),
        Some(a) if a == "tree" => b.push("nccl-tree".into()),
        _ => {}
    }
    b
}

/// Runs the GPU table (see the module documentation).
pub fn run(o: &Options, args: &[String], started: Instant) -> Result<(), Failure> {
    let out_path = bench_file(o.out.as_deref(), "collectives-gpu.json");
    let gpus = mirra_cuda::device_count()
        .map_err(|e| Failure::usage(format!("xtask bench-collectives --device cuda: {e}")))?;
    if gpus == 0 {
        return Err(Failure::usage(
            "xtask bench-collectives --device cuda: the driver reports no CUDA device",
        ));
    }
    for b in &o.backends {
        if !DEVICE_BACKENDS.contains(&b.as_str()) {
            return Err(Failure::usage(format!(
                "xtask bench-collectives --device cuda: `{b}` is a CPU backend (GPU backends: {})",
                DEVICE_BACKENDS.join(", ")
            )));
        }
    }
    let facts = machine::facts();
    let config = Config::default();
    let largest = sizes(Op::AllReduce, o.max_bytes, o.quick)
        .last()
        .copied()
        .unwrap_or(o.max_bytes);
    let copy = device_copy_gbs(0, largest);
    println!(
        "# mirra GPU collectives: backends {}, world sizes {:?}, {gpus} GPU(s); device copy of \
         {}: {}",
        o.backends.join(","),
        o.world_sizes,
        size_label(largest),
        match &copy {
            Ok(c) => format!("{c:.1} GB/s read plus written"),
            Err(e) => format!("not measured ({e})"),
        }
    );
    let copy_gbs = copy.as_ref().ok().copied();
    let mut rows: Vec<Row> = Vec::new();
    let mut bounds: Vec<Value> = Vec::new();
    let mut errors: Vec<Value> = Vec::new();
    let mut skipped: Vec<Value> = Vec::new();
    for backend in &o.backends {
        for &n in &o.world_sizes {
            let group = match devices(backend, n, gpus)
                .and_then(|d| Group::spawn_on(backend, &d, config.clone()))
            {
                Ok(g) => g,
                Err(e) => {
                    println!("# {backend}, {n} ranks: not run: {e}");
                    skipped.push(json!({"backend": backend, "world_size": n, "why": e}));
                    continue;
                }
            };
            let mut bound_of = |row: &Row| {
                let Some(c) = copy_gbs.filter(|_| backend == "cuda-ring") else {
                    return;
                };
                let (op, n, count, bytes) = (row.op, row.world_size, row.count, row.bytes);
                let bound = traffic_bound(op, n, count, bytes, c);
                let over = row.bandwidths().0 / bound;
                bounds.push(json!({
                    "world_size": n,
                    "op": op.name(),
                    "bytes": bytes,
                    "traffic_per_rank_bytes": cuda_ring_traffic(collective(op), n, count, 4),
                    "bound_algbw_gbs": num(bound, 3),
                    "algbw_over_bound": num(over, 3),
                }));
                if bytes == largest {
                    println!(
                        "#   traffic bound {bound:.1} GB/s algbw: {over:.2} of it{}",
                        if over > 1.0 {
                            " (above the bound: the bound is wrong)"
                        } else {
                            ""
                        }
                    );
                }
            };
            sweep(
                &group,
                backend,
                n,
                o,
                &|_, _| None,
                &mut rows,
                &mut errors,
                &mut bound_of,
            );
        }
    }
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let target = |n: usize| {
        bounds
            .iter()
            .find(|b| b["world_size"] == n && b["op"] == "all_reduce" && b["bytes"] == TARGET_BYTES)
            .and_then(|b| b["algbw_over_bound"].as_f64())
    };
    let targets: serde_json::Map<String, Value> = TARGET_WORLDS
        .iter()
        .map(|&n| {
            let mut t = at_least(TARGET_OVER_BOUND, target(n), 3);
            t["what"] = json!(format!(
                "cuda-ring all_reduce of 256 MiB at {n} ranks on one GPU: algbw over the traffic bound"
            ));
            (format!("cuda_ring_{n}_ranks_vs_traffic_bound"), t)
        })
        .collect();
    for (name, t) in &targets {
        println!(
            "# target {name}: {} (>= {TARGET_OVER_BOUND}): {}",
            t["measured"],
            match t["met"].as_bool() {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "not measured",
            }
        );
    }
    let report = json!({
        "schema": "mirra-bench-collectives-gpu/1",
        "command": format!("cargo xtask bench-collectives {}", args.join(" ")).trim_end(),
        "machine": facts,
        "gpus": gpus,
        "nccl_algo": std::env::var("NCCL_ALGO").ok(),
        "device_copy_gbs": opt(copy_gbs, 3),
        "device_copy_bytes": largest,
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "traffic_bounds": bounds,
        "targets": targets,
        "wrong": wrong,
        "errors": errors,
        "not_run": skipped,
        "plan": {
            "timing": "per iteration: inputs written on the host and copied to each rank's \
                       device (the copy waited for), the group's barrier, then the collective, \
                       timed on every rank's thread from the call to its completion; the slowest \
                       rank's time; median over the timed iterations",
            "check": "every iteration, warm-up included: the result copied to the host and \
                      compared with the closed form (#wrong)",
            "bound": "see xtask/src/bench_collectives/gpu.rs",
        },
    });
    save(&out_path, &report, Some(started))?;
    if !errors.is_empty() || wrong > 0 {
        return Err(Failure::run(format!(
            "xtask bench-collectives --device cuda: {} failed group(s), {wrong} wrong element(s)",
            errors.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_of_an_all_reduce_is_the_copy_rate_over_five_times_n_minus_one() {
        // All n ranks on one device: n x 5 (n - 1) / n x bytes of traffic in all.
        for n in [2usize, 4, 8] {
            let bytes = 256usize << 20;
            let b = traffic_bound(Op::AllReduce, n, bytes / 4, bytes, 4000.0);
            let want = 4000.0 / (5.0 * (n as f64 - 1.0));
            assert!((b - want).abs() < 1e-9 * want, "n={n}: {b} vs {want}");
        }
        // A broadcast at 4 ranks: 3 copies of the buffer, each read and written.
        let b = traffic_bound(Op::Broadcast, 4, 1 << 20, 4 << 20, 3000.0);
        assert!((b - 500.0).abs() < 1e-6, "{b}");
    }

    #[test]
    fn nccl_runs_only_the_algorithm_the_environment_pins() {
        assert_eq!(default_backends(None), ["cuda-ring"]);
        assert_eq!(default_backends(Some("Tree")), ["cuda-ring", "nccl-tree"]);
        assert_eq!(default_backends(Some("ring")), ["cuda-ring", "nccl-ring"]);
        assert_eq!(default_backends(Some("Tree,Ring")), ["cuda-ring"]);
    }
}
