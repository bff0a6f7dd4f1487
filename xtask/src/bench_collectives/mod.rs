//! `cargo xtask bench-collectives`: nccl-tests' table for mirra's CPU collectives.
//!
//! For each backend and world size, one group of rank threads times all-reduce over the
//! full size sweep (4 KiB to 256 MiB of f32, doubling) and reduce-scatter, all-gather and
//! broadcast over a coarse one (4 KiB, 1 MiB, 64 MiB); see [`ranks`](crate::ranks) for
//! how an iteration is timed and checked, and [`nccl`](crate::nccl) for the columns.
//!
//! This machine's memcpy bandwidth (256 MiB f32, bytes counted once, 1 and 2 threads) is
//! measured before and after the collectives, and the median of all repeats is the
//! physical limit that the all-reduce targets are measured against.
//!
//! Everything lands in `target/bench/collectives.json` (written atomically). A group that
//! fails (a collective returns an error) is reported and skipped; the command then ends
//! with exit status 1, as it does when any result is wrong.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mirra_collectives::{Config, BACKENDS, MAX_WORLD_SIZE};
use serde_json::{json, Map, Value};

use crate::json::{num, opt, save};
use crate::machine::{self, CpuSnapshot};
use crate::nccl::{self, size_label, Op, Row};
use crate::paths::bench_file;
use crate::ranks::{Group, Job};
use crate::table::mark;
use crate::timing::{median, Plan, Samples};
use crate::{flags, memcpy, Failure};

/// The flags of `cargo xtask bench-collectives`, for the usage message.
pub const FLAGS_HELP: &str =
    "  --quick            a smoke subset: 2 and 4 ranks, up to 1 MiB, few iterations
  --backends a,b     backends to run (default: all of them, in mirra_collectives::BACKENDS)
  --world-sizes 2,4  world sizes (default: 2,4,8)
  --max-bytes N      largest message, e.g. 64M (default: 256M; --quick: 1M)
  --out FILE         where to write the JSON (default: target/bench/collectives.json)
";

/// The smallest message.
pub const MIN_BYTES: usize = 4 << 10;
/// The largest message of the default sweep.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;
/// The sweep of reduce-scatter, all-gather and broadcast.
pub const COARSE_BYTES: [usize; 3] = [4 << 10, 1 << 20, 64 << 20];
/// The size of the memcpy measurement.
pub const MEMCPY_BYTES: usize = 256 << 20;
/// The default world sizes.
pub const WORLD_SIZES: [usize; 3] = [2, 4, 8];

/// The all-reduce size of the bandwidth targets.
pub const TARGET_BYTES: usize = 64 << 20;
/// Best backend's busbw / memcpy (1 thread) at 64 MiB: (world size, at least).
pub const TARGET_BUSBW_RATIOS: [(usize, f64); 2] = [(2, 0.9), (4, 0.8)];
/// `tree` beats `ring` below this many bytes.
pub const TREE_BELOW_BYTES: usize = 64 << 10;
/// A 4 KiB all-reduce at 4 ranks in less than this many microseconds.
pub const TARGET_SMALL_US: f64 = 50.0;
pub const TARGET_SMALL_BYTES: usize = 4 << 10;
pub const TARGET_SMALL_RANKS: usize = 4;

#[derive(Debug)]
struct Options {
    quick: bool,
    backends: Vec<String>,
    world_sizes: Vec<usize>,
    max_bytes: usize,
    out: Option<PathBuf>,
}

fn list(flag: &str, v: &str) -> Result<Vec<String>, Failure> {
    let items: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if items.is_empty() {
        return Err(Failure::usage(format!(
            "xtask bench-collectives: {flag} needs a comma-separated list"
        )));
    }
    Ok(items)
}

fn parse(args: &[String]) -> Result<Options, Failure> {
    let mut quick = false;
    let mut backends = None;
    let mut world_sizes = None;
    let mut max_bytes = None;
    let mut out = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| flags::value("bench-collectives", flag, &mut it);
        match arg.as_str() {
            "--quick" => quick = true,
            "--backends" => {
                let names = list("--backends", &value("--backends")?)?;
                if let Some(bad) = names.iter().find(|b| !BACKENDS.contains(&b.as_str())) {
                    return Err(Failure::usage(format!(
                        "xtask bench-collectives: unknown backend `{bad}` (known: {})",
                        BACKENDS.join(", ")
                    )));
                }
                backends = Some(names);
            }
            "--world-sizes" => {
                let mut sizes = Vec::new();
                for s in list("--world-sizes", &value("--world-sizes")?)? {
                    let n = s
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_WORLD_SIZE).contains(n))
                        .ok_or_else(|| {
                            Failure::usage(format!(
                                "xtask bench-collectives: a world size is 1 to \
                                 {MAX_WORLD_SIZE}, got `{s}`"
                            ))
                        })?;
                    if !sizes.contains(&n) {
                        sizes.push(n);
                    }
                }
                world_sizes = Some(sizes);
            }
            "--max-bytes" => {
                let v = value("--max-bytes")?;
                let n = nccl::parse_bytes(&v)
                    .filter(|&n| n >= MIN_BYTES)
                    .ok_or_else(|| {
                        Failure::usage(format!(
                            "xtask bench-collectives: --max-bytes takes a size of at least \
                             {MIN_BYTES} (as 4096, 64K, 256M), got `{v}`"
                        ))
                    })?;
                max_bytes = Some(n);
            }
            "--out" => out = Some(PathBuf::from(value("--out")?)),
            other => {
                return Err(Failure::usage(format!(
                    "xtask bench-collectives: unknown flag `{other}`\n\nflags:\n{FLAGS_HELP}"
                )))
            }
        }
    }
    Ok(Options {
        quick,
        backends: backends.unwrap_or_else(|| BACKENDS.iter().map(|s| s.to_string()).collect()),
        world_sizes: world_sizes.unwrap_or_else(|| {
            if quick {
                vec![2, 4]
            } else {
                WORLD_SIZES.to_vec()
            }
        }),
        max_bytes: max_bytes.unwrap_or(if quick { 1 << 20 } else { DEFAULT_MAX_BYTES }),
        out,
    })
}

/// The message sizes of `op`: all-reduce doubles from 4 KiB (quadruples with `quick`) up
/// to `max`; the others take [`COARSE_BYTES`] (with `quick`, those up to 1 MiB) up to `max`.
fn sizes(op: Op, max: usize, quick: bool) -> Vec<usize> {
    if op == Op::AllReduce {
        let step = if quick { 4 } else { 2 };
        std::iter::successors(Some(MIN_BYTES), |&b| b.checked_mul(step))
            .take_while(|&b| b <= max)
            .collect()
    } else {
        let cap = if quick { max.min(1 << 20) } else { max };
        COARSE_BYTES.into_iter().filter(|&b| b <= cap).collect()
    }
}

/// Warm-up and timed iterations of a `bytes` message: about 512 MiB of messages and
/// 0.75 s of timed iterations (predicted from the previous size, when there is one),
/// between 3 and 200 timed iterations.
fn iterations(bytes: usize, predicted_s: Option<f64>, quick: bool) -> (usize, usize) {
    let (budget_bytes, budget_s, min, max) = if quick {
        (64usize << 20, 0.1, 3, 20)
    } else {
        (512usize << 20, 0.75, 3, 200)
    };
    let mut iters = budget_bytes / bytes.max(1);
    if let Some(t) = predicted_s.filter(|t| *t > 0.0) {
        iters = iters.min((budget_s / t) as usize);
    }
    let iters = iters.clamp(min, max);
    let warmup = if quick { 1 } else { (iters / 10).clamp(1, 10) };
    (warmup, iters)
}

/// The row of `op` at `bytes` for a backend and world size.
fn find<'a>(rows: &'a [Row], backend: &str, n: usize, op: Op, bytes: usize) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.backend == backend && r.world_size == n && r.op == op && r.bytes == bytes)
}

/// busbw / memcpy of the 64 MiB all-reduce, per backend and world size.
fn busbw_ratios(rows: &[Row], backends: &[String], world_sizes: &[usize], memcpy: f64) -> Value {
    let mut out = Map::new();
    for b in backends {
        let per_n: Map<String, Value> = world_sizes
            .iter()
            .map(|&n| {
                let ratio = find(rows, b, n, Op::AllReduce, TARGET_BYTES)
                    .map(|r| r.bandwidths().1 / memcpy);
                (n.to_string(), opt(ratio, 3))
            })
            .collect();
        out.insert(b.clone(), Value::Object(per_n));
    }
    Value::Object(out)
}

/// The targets, from the rows and the 1-thread memcpy bandwidth.
fn targets(rows: &[Row], memcpy: f64) -> Value {
    let mut t = Map::new();
    for (n, min) in TARGET_BUSBW_RATIOS {
        let best = rows
            .iter()
            .filter(|r| r.op == Op::AllReduce && r.world_size == n && r.bytes == TARGET_BYTES)
            .max_by(|a, b| a.bandwidths().1.total_cmp(&b.bandwidths().1));
        let ratio = best.map(|r| r.bandwidths().1 / memcpy);
        t.insert(
            format!("all_reduce_64MiB_busbw_vs_memcpy_{n}_ranks"),
            json!({
                "min": min,
                "measured": opt(ratio, 3),
                "best_backend": best.map(|r| r.backend.clone()),
                "busbw_gbs": opt(best.map(|r| r.bandwidths().1), 3),
                "memcpy_gbs": num(memcpy, 3),
                "met": ratio.map(|r| r >= min),
            }),
        );
    }

    let mut cases = Vec::new();
    let mut beaten = 0;
    for tree in rows
        .iter()
        .filter(|r| r.backend == "tree" && r.op == Op::AllReduce && r.bytes < TREE_BELOW_BYTES)
    {
        if let Some(ring) = find(rows, "ring", tree.world_size, Op::AllReduce, tree.bytes) {
            let wins = tree.seconds < ring.seconds;
            beaten += usize::from(wins);
            cases.push(json!({
                "world_size": tree.world_size,
                "bytes": tree.bytes,
                "tree_us": num(tree.seconds * 1e6, 2),
                "ring_us": num(ring.seconds * 1e6, 2),
                "tree_over_ring": num(tree.seconds / ring.seconds, 3),
                "met": wins,
            }));
        }
    }
    let of = cases.len();
    t.insert(
        "tree_beats_ring_below_64KiB".into(),
        json!({
            "sizes_met": beaten,
            "sizes": of,
            "cases": cases,
            "met": (of > 0).then_some(beaten == of),
        }),
    );

    let small: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.op == Op::AllReduce
                && r.world_size == TARGET_SMALL_RANKS
                && r.bytes == TARGET_SMALL_BYTES
        })
        .collect();
    let best = small.iter().min_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let by_backend: Map<String, Value> = small
        .iter()
        .map(|r| (r.backend.clone(), num(r.seconds * 1e6, 2)))
        .collect();
    t.insert(
        "all_reduce_4KiB_4_ranks_us".into(),
        json!({
            "max_exclusive": TARGET_SMALL_US,
            "measured": opt(best.map(|r| r.seconds * 1e6), 2),
            "best_backend": best.map(|r| r.backend.clone()),
            "by_backend": by_backend,
            "met": best.map(|r| r.seconds * 1e6 < TARGET_SMALL_US),
        }),
    );
    Value::Object(t)
}

fn cell(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// The summary after the tables: memcpy, the 64 MiB ratios and the targets, as lines.
fn summary(report: &Value) -> Vec<String> {
    let mut l = Vec::new();
    let m = &report["memcpy"];
    l.push("#".into());
    l.push(format!(
        "# memcpy {} f32 (bytes counted once): 1 thread {} GB/s, 2 threads {} GB/s \
         (median of {} repeats each)",
        size_label(m["bytes"].as_u64().unwrap_or(0) as usize),
        cell(&report["memcpy_gbs"], 2),
        cell(&report["memcpy_gbs_2threads"], 2),
        m["gbs_1thread"].as_array().map_or(0, Vec::len),
    ));
    l.push(
        "#   the physical limit of a shared-memory all-reduce's busbw; ratios below are \
         to 1 thread"
            .into(),
    );
    let ratios = report["busbw_vs_memcpy_64MiB"].as_object();
    let sizes: Vec<String> = report["world_sizes"]
        .as_array()
        .map(|a| a.iter().map(|n| n.to_string()).collect())
        .unwrap_or_default();
    if let Some(ratios) = ratios {
        l.push("#".into());
        l.push("# all_reduce 64MiB f32, busbw / memcpy (1 thread):".into());
        let mut head = format!("#   {:<14}", "backend");
        for n in &sizes {
            head.push_str(&format!(" {:>9}", format!("{n} ranks")));
        }
        l.push(head);
        for (b, per_n) in ratios {
            let mut line = format!("#   {b:<14}");
            for n in &sizes {
                line.push_str(&format!(" {:>9}", cell(&per_n[n], 3)));
            }
            l.push(line);
        }
    }
    let t = &report["targets"];
    l.push("#".into());
    l.push("# targets".into());
    for (n, min) in TARGET_BUSBW_RATIOS {
        let x = &t[format!("all_reduce_64MiB_busbw_vs_memcpy_{n}_ranks")];
        l.push(format!(
            "#   64 MiB all-reduce at {n} ranks, best busbw / memcpy >= {min:.2}: {} \
             ({}, busbw {} GB/s)  {}",
            cell(&x["measured"], 3),
            x["best_backend"].as_str().unwrap_or("not measured"),
            cell(&x["busbw_gbs"], 2),
            mark(&x["met"]),
        ));
    }
    let x = &t["tree_beats_ring_below_64KiB"];
    l.push(format!(
        "#   tree faster than ring below 64 KiB: {} of {} sizes  {}",
        x["sizes_met"],
        x["sizes"],
        mark(&x["met"]),
    ));
    for c in x["cases"].as_array().into_iter().flatten() {
        l.push(format!(
            "#     {} ranks {:>6}: tree {:>9} us, ring {:>9} us, tree/ring {}",
            c["world_size"],
            size_label(c["bytes"].as_u64().unwrap_or(0) as usize),
            cell(&c["tree_us"], 2),
            cell(&c["ring_us"], 2),
            cell(&c["tree_over_ring"], 3),
        ));
    }
    let x = &t["all_reduce_4KiB_4_ranks_us"];
    let others: Vec<String> = x["by_backend"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(b, us)| format!("{b} {}", cell(us, 2)))
                .collect()
        })
        .unwrap_or_default();
    l.push(format!(
        "#   4 KiB all-reduce at 4 ranks < {TARGET_SMALL_US:.0} us: {} us ({})  {}{}",
        cell(&x["measured"], 2),
        x["best_backend"].as_str().unwrap_or("not measured"),
        mark(&x["met"]),
        if others.is_empty() {
            String::new()
        } else {
            format!("  [{}]", others.join(", "))
        }
    ));
    if let Some(share) = report["others_cpu_share"].as_f64() {
        l.push(format!(
            "#   other processes used {:.0}% of the CPUs meanwhile",
            share * 100.0
        ));
    }
    l
}

/// Runs the benchmark, prints the tables and writes the report.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let o = parse(args)?;
    let started = Instant::now();
    let out_path = bench_file(o.out.as_deref(), "collectives.json");
    let facts = machine::facts();
    let config = Config::default();
    println!(
        "# mirra collectives benchmark: backends {}, world sizes {:?}, all_reduce {} to {}",
        o.backends.join(","),
        o.world_sizes,
        size_label(MIN_BYTES),
        size_label(
            *sizes(Op::AllReduce, o.max_bytes, o.quick)
                .last()
                .unwrap_or(&0)
        ),
    );
    println!(
        "# {} ({} cores), {}; slice {} B, spin {} us, park after {} us, timeout {} s",
        facts["cpu_model"].as_str().unwrap_or("unknown CPU"),
        facts["cores"],
        facts["date_utc"].as_str().unwrap_or(""),
        config.slice_bytes,
        config.spin.as_micros(),
        config.park_after.as_micros(),
        config.timeout.as_secs_f64(),
    );
    if cfg!(debug_assertions) {
        println!("# warning: xtask was built without optimisations; use `cargo xtask`");
    }
    let cpu_start = CpuSnapshot::now();

    let memcpy_bytes = if o.quick { 32 << 20 } else { MEMCPY_BYTES };
    let memcpy_plan = Plan {
        warm_up: Duration::ZERO,
        repeats: if o.quick { 3 } else { 5 },
        min_repeat: Duration::ZERO,
    };
    let mut copy1 = memcpy::measure_gbs(memcpy_bytes, 1, memcpy_plan);
    let mut copy2 = memcpy::measure_gbs(memcpy_bytes, 2, memcpy_plan);
    println!(
        "# memcpy {} f32 (bytes counted once): 1 thread {:.2} GB/s, 2 threads {:.2} GB/s \
         (measured again at the end)",
        size_label(memcpy_bytes),
        copy1.median(),
        copy2.median()
    );

    let mut rows: Vec<Row> = Vec::new();
    let mut errors: Vec<Value> = Vec::new();
    for backend in &o.backends {
        for &n in &o.world_sizes {
            let group = match Group::spawn(backend, n, config.clone()) {
                Ok(g) => g,
                Err(e) => {
                    println!("# error: backend {backend}, {n} ranks: {e}");
                    errors.push(json!({"backend": backend, "world_size": n, "error": e}));
                    continue;
                }
            };
            'ops: for op in Op::ALL {
                println!("{}", nccl::header(op, backend, n));
                let first = rows.len();
                let mut previous: Option<(usize, f64)> = None;
                for bytes in sizes(op, o.max_bytes, o.quick) {
                    let (bytes, count) = op.shape(bytes, 4, n);
                    let predicted = previous.map(|(b, t)| t * bytes as f64 / b as f64);
                    let (warmup, iters) = iterations(bytes, predicted, o.quick);
                    let job = Job {
                        op,
                        count,
                        warmup,
                        iters,
                    };
                    match group.run(job) {
                        Ok(outcome) => {
                            let row = Row {
                                backend: backend.clone(),
                                world_size: n,
                                op,
                                dtype: "f32",
                                bytes,
                                count,
                                seconds: median(&outcome.seconds),
                                wrong: outcome.wrong,
                            };
                            println!("{}", row.line());
                            previous = Some((bytes, row.seconds));
                            rows.push(row);
                        }
                        Err(e) => {
                            println!("# error: {} {} bytes: {e}", op.name(), bytes);
                            errors.push(json!({
                                "backend": backend,
                                "world_size": n,
                                "op": op.name(),
                                "bytes": bytes,
                                "error": e,
                            }));
                            // The group is aborted: skip its remaining sizes and ops.
                            break 'ops;
                        }
                    }
                }
                if let Some(line) = nccl::avg_busbw_line(&rows[first..]) {
                    println!("{line}");
                }
            }
        }
    }

    copy1.extend(&memcpy::measure_gbs(memcpy_bytes, 1, memcpy_plan));
    copy2.extend(&memcpy::measure_gbs(memcpy_bytes, 2, memcpy_plan));
    let memcpy_gbs = copy1.median();
    let others_share = cpu_start
        .zip(CpuSnapshot::now())
        .and_then(|(a, b)| a.others_share(&b));

    let samples_json = |s: &Samples| Value::Array(s.per_call.iter().map(|&x| num(x, 3)).collect());
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let report = json!({
        "schema": "mirra-bench-collectives/1",
        "command": format!("cargo xtask bench-collectives {}", args.join(" ")).trim_end(),
        "machine": facts,
        "quick": o.quick,
        "memcpy_gbs": num(memcpy_gbs, 3),
        "memcpy_gbs_2threads": num(copy2.median(), 3),
        "memcpy": {
            "bytes": memcpy_bytes,
            "dtype": "f32",
            "bytes_counted": "once",
            "statistic": "median of the repeats, half measured before the collectives and \
                          half after",
            "gbs_1thread": samples_json(&copy1),
            "gbs_2threads": samples_json(&copy2),
        },
        "config": {
            "timeout_ms": config.timeout.as_millis() as u64,
            "slice_bytes": config.slice_bytes,
            "spin_us": config.spin.as_micros() as u64,
            "park_after_us": config.park_after.as_micros() as u64,
        },
        "backends": o.backends,
        "world_sizes": o.world_sizes,
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "busbw_vs_memcpy_64MiB": busbw_ratios(&rows, &o.backends, &o.world_sizes, memcpy_gbs),
        "targets": targets(&rows, memcpy_gbs),
        "wrong": wrong,
        "errors": errors,
        "others_cpu_share": opt(others_share, 3),
        "plan": {
            "timing": "per iteration: the group's barrier, then the collective, timed on every \
                       rank; the slowest rank's time; median over the timed iterations",
            "iterations": "about 512 MiB of messages and 0.75 s of timed iterations per size \
                           (from the previous size's time), 3 to 200, after 1 to 10 warm-up \
                           iterations",
            "check": "inputs are small integers (exact sums in any order); before the last \
                      iteration inputs are rewritten and outputs set to NaN; #wrong counts \
                      the elements of every rank that differ from the closed form",
            "bytes_and_count": "as nccl-tests: bytes of the whole vector, per-rank count",
            "all_reduce_bytes": sizes(Op::AllReduce, o.max_bytes, o.quick),
            "other_ops_bytes": sizes(Op::Broadcast, o.max_bytes, o.quick),
        },
        "elapsed_s": num(started.elapsed().as_secs_f64(), 1),
    });
    for line in summary(&report) {
        println!("{line}");
    }
    save(&out_path, &report, Some(started))?;
    if !errors.is_empty() || wrong > 0 {
        return Err(Failure::run(format!(
            "xtask bench-collectives: {} failed group(s), {wrong} wrong element(s)",
            errors.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::flags::args;

    #[test]
    fn flags_parse_and_bad_ones_are_usage_errors() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.backends, BACKENDS);
        assert_eq!(o.world_sizes, [2, 4, 8]);
        assert_eq!(o.max_bytes, 256 << 20);
        let o = parse(&args(&[
            "--backends",
            "tree,ring",
            "--world-sizes",
            "4,2,4",
            "--max-bytes",
            "64M",
        ]))
        .unwrap();
        assert_eq!(o.backends, ["tree", "ring"]);
        assert_eq!(o.world_sizes, [4, 2]);
        assert_eq!(o.max_bytes, 64 << 20);
        let q = parse(&args(&["--quick"])).unwrap();
        assert_eq!((q.world_sizes, q.max_bytes), (vec![2, 4], 1 << 20));
        for bad in [
            &["--backends", "nccl"][..],
            &["--backends", ""],
            &["--world-sizes", "0"],
            &["--world-sizes", "65"],
            &["--max-bytes", "100"],
            &["--max-bytes"],
            &["--bogus"],
        ] {
            assert_eq!(parse(&args(bad)).unwrap_err().code, 2, "{bad:?}");
        }
    }

    #[test]
    fn sweeps_span_4kib_to_the_maximum() {
        let ar = sizes(Op::AllReduce, DEFAULT_MAX_BYTES, false);
        assert_eq!(ar.len(), 17);
        assert_eq!((ar[0], ar[16]), (4096, 256 << 20));
        assert!(ar.contains(&TARGET_BYTES));
        assert_eq!(
            sizes(Op::ReduceScatter, DEFAULT_MAX_BYTES, false),
            COARSE_BYTES
        );
        assert_eq!(sizes(Op::AllGather, 1 << 20, false), [4096, 1 << 20]);
        assert_eq!(
            sizes(Op::AllReduce, 1 << 20, true),
            [4096, 16384, 65536, 262144, 1 << 20]
        );
        assert_eq!(sizes(Op::Broadcast, 256 << 20, true), [4096, 1 << 20]);
    }

    #[test]
    fn big_messages_get_fewer_iterations() {
        assert_eq!(iterations(4096, None, false), (10, 200));
        assert_eq!(iterations(64 << 20, None, false), (1, 8));
        assert_eq!(iterations(256 << 20, None, false), (1, 3));
        // A slow backend: the time budget wins.
        assert_eq!(iterations(64 << 20, Some(0.25), false), (1, 3));
        assert_eq!(iterations(1 << 20, Some(0.01), false), (7, 75));
        assert_eq!(iterations(4096, None, true), (1, 20));
    }

    fn row(backend: &str, n: usize, bytes: usize, us: f64) -> Row {
        Row {
            backend: backend.into(),
            world_size: n,
            op: Op::AllReduce,
            dtype: "f32",
            bytes,
            count: bytes / 4,
            seconds: us * 1e-6,
            wrong: 0,
        }
    }

    #[test]
    fn targets_from_rows() {
        // 64 MiB in 10 ms: algbw 6.71 GB/s; at 2 ranks busbw = algbw.
        let rows = vec![
            row("ring", 2, 64 << 20, 10_000.0),
            row("tree", 2, 64 << 20, 20_000.0),
            row("ring", 4, 64 << 20, 10_000.0),
            row("ring", 4, 4096, 40.0),
            row("tree", 4, 4096, 30.0),
            row("ring", 2, 4096, 5.0),
            row("tree", 2, 4096, 6.0),
            row("tree", 2, 65536, 1.0),
            row("ring", 2, 65536, 2.0),
        ];
        let memcpy = 7.0;
        let t = targets(&rows, memcpy);
        let two = &t["all_reduce_64MiB_busbw_vs_memcpy_2_ranks"];
        assert_eq!(two["best_backend"], "ring");
        assert_eq!(two["measured"], 0.959);
        assert_eq!(two["met"], true);
        let four = &t["all_reduce_64MiB_busbw_vs_memcpy_4_ranks"];
        assert_eq!(four["busbw_gbs"], 10.066);
        assert_eq!(four["met"], true);
        let tree = &t["tree_beats_ring_below_64KiB"];
        assert_eq!(
            (tree["sizes_met"].as_u64(), tree["sizes"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(tree["met"], false);
        let small = &t["all_reduce_4KiB_4_ranks_us"];
        assert_eq!(small["best_backend"], "tree");
        assert_eq!(small["measured"], 30.0);
        assert_eq!(small["met"], true);
        assert_eq!(small["by_backend"]["ring"], 40.0);

        let none = targets(&[], memcpy);
        assert_eq!(
            none["all_reduce_64MiB_busbw_vs_memcpy_2_ranks"]["met"],
            Value::Null
        );
        assert_eq!(none["tree_beats_ring_below_64KiB"]["met"], Value::Null);
        assert_eq!(none["all_reduce_4KiB_4_ranks_us"]["met"], Value::Null);

        let ratios = busbw_ratios(&rows, &["ring".into(), "tree".into()], &[2, 4, 8], memcpy);
        assert_eq!(ratios["ring"]["2"], 0.959);
        assert_eq!(ratios["tree"]["4"], Value::Null);

        let report = json!({
            "memcpy": {"bytes": 256 << 20, "gbs_1thread": [7.0, 7.0]},
            "memcpy_gbs": memcpy,
            "memcpy_gbs_2threads": 12.0,
            "world_sizes": [2, 4, 8],
            "busbw_vs_memcpy_64MiB": ratios,
            "targets": t,
        });
        let text = summary(&report).join("\n");
        assert!(
            text.contains("1 thread 7.00 GB/s, 2 threads 12.00 GB/s"),
            "{text}"
        );
        assert!(text.contains("best busbw / memcpy >= 0.90: 0.959 (ring, busbw 6.71 GB/s)  ok"));
        assert!(text.contains("below 64 KiB: 1 of 2 sizes  MISSED"));
        assert!(text.contains("< 50 us: 30.00 us (tree)  ok  [ring 40.00, tree 30.00]"));
    }
}
