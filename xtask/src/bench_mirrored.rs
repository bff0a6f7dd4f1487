//! `cargo xtask bench-mirrored`: training throughput of the MNIST MLP under the mirrored
//! strategy, against one replica, for every collective backend.
//!
//! For 1, 2 and 4 CPU replicas (the machine's cores shared among them) and each backend,
//! at a fixed global batch of 256 and at 64 per replica: samples/s (median of repeats of
//! back-to-back training steps on synthetic MNIST-shaped batches) and the share of step
//! time spent waiting for gradient all-reduces that backward did not hide, on the step's
//! critical path (`exposed_comm_fraction`: what the replica that finished backward last
//! still waited), and apart from it the load imbalance (`imbalance_fraction`: how much
//! longer the others waited, for that replica rather than for the network). The reference is the same MLP on one device without a
//! strategy, with all cores (`baseline`). Peak RSS of `mirra train --replicas 4` comes
//! from a real run of the CLI. Results go to a table and `target/bench/mirrored.json`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirra::collectives::BACKENDS;
use mirra::strategy::{MirroredStrategy, StrategyConfig};
use mirra::tensor::set_num_threads;
use mirra::train::CommStats;
use serde_json::{json, Value};

use crate::json::{num, save};
use crate::paths::{bench_file, target_dir, workspace_root};
use crate::timing::{measure, Plan};
use crate::{flags, machine, mlp, rss, Failure};

/// The flags of `cargo xtask bench-mirrored`, for the usage message.
pub const FLAGS_HELP: &str =
    "  --quick          fewer, shorter repeats (a smoke test, not a measurement)
  --replicas 1,2,4 replica counts (default: 1,2,4)
  --backends a,b   collective backends (default: all)
  --no-rss         skip the peak-RSS run of `mirra train --replicas 4`
  --out FILE       where to write the JSON (default: target/bench/mirrored.json)
";

/// The fixed global batch.
pub const GLOBAL_BATCH: usize = 256;
/// The per-replica batch of the weak-scaling rows.
pub const PER_REPLICA_BATCH: usize = 64;

/// Targets (2-core machine): 2 replicas at 256 reach this share of the baseline...
pub const TARGET_2_OF_BASELINE: f64 = 0.9;
/// ... and this many samples/s; 4 replicas at 256 this many.
pub const TARGET_2_SAMPLES: f64 = 130_000.0;
pub const TARGET_4_SAMPLES: f64 = 80_000.0;
/// Exposed communication at 2 replicas, at most this share of step time.
pub const TARGET_EXPOSED_2: f64 = 0.10;
/// Peak RSS with 4 replicas, MB.
pub const TARGET_RSS_4_MB: f64 = 100.0;

#[derive(Debug)]
struct Options {
    quick: bool,
    replicas: Vec<usize>,
    backends: Vec<String>,
    rss: bool,
    out: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Options, Failure> {
    let mut o = Options {
        quick: false,
        replicas: vec![1, 2, 4],
        backends: BACKENDS.iter().map(|s| s.to_string()).collect(),
        rss: true,
        out: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| flags::value("bench-mirrored", flag, &mut it);
        match arg.as_str() {
            "--quick" => o.quick = true,
            "--no-rss" => o.rss = false,
            "--out" => o.out = Some(PathBuf::from(value("--out")?)),
            "--replicas" => {
                o.replicas = flags::counts("bench-mirrored", "--replicas", &value("--replicas")?)?;
            }
            "--backends" => {
                let v = value("--backends")?;
                let names: Vec<String> = v.split(',').map(|p| p.trim().to_string()).collect();
                if let Some(bad) = names.iter().find(|n| !BACKENDS.contains(&n.as_str())) {
                    return Err(Failure::usage(format!(
                        "xtask bench-mirrored: unknown backend `{bad}` (known: {})",
                        BACKENDS.join(", ")
                    )));
                }
                o.backends = names;
            }
            other => {
                return Err(Failure::usage(format!(
                    "xtask bench-mirrored: unknown flag `{other}`\n\nflags:\n{FLAGS_HELP}"
                )))
            }
        }
    }
    Ok(o)
}

/// One measured configuration.
struct Row {
    replicas: usize,
    collective: String,
    global_batch: usize,
    samples_per_sec: f64,
    exposed: f64,
    imbalance: f64,
}

pub(crate) fn plan(quick: bool) -> Plan {
    if quick {
        Plan {
            warm_up: Duration::from_millis(100),
            repeats: 3,
            min_repeat: Duration::from_millis(100),
        }
    } else {
        Plan {
            warm_up: Duration::from_millis(500),
            repeats: 7,
            min_repeat: Duration::from_millis(400),
        }
    }
}

/// Samples/s of training steps at `global_batch`, and where the distributed steps' time
/// went (zero without a strategy).
pub(crate) fn throughput(
    strategy: Option<Arc<MirroredStrategy>>,
    global_batch: usize,
    plan: Plan,
) -> Result<(f64, CommStats), String> {
    let mut model = mlp::compile(strategy)?;
    let data = mlp::synthetic_batches(global_batch)?;
    let mut i = 0usize;
    let mut step = || -> Result<(), String> {
        let (x, y) = &data[i % data.len()];
        i += 1;
        model.train_step(x.clone(), y).map_err(|e| e.to_string())?;
        Ok(())
    };
    let samples = measure(plan, &mut step)?;
    let stats = model.comm_stats().unwrap_or_default();
    Ok((global_batch as f64 / samples.median(), stats))
}

pub fn run(args: &[String]) -> Result<(), Failure> {
    let o = parse(args)?;
    let started = Instant::now();
    let root = workspace_root();
    let target = target_dir(&root);
    let out_path = bench_file(o.out.as_deref(), "mirrored.json");
    let cores = machine::cores();
    let plan = plan(o.quick);
    let before = machine::CpuSnapshot::now();
    set_num_threads(cores);
    let (baseline, _) = throughput(None, GLOBAL_BATCH, plan).map_err(Failure::run)?;
    println!(
        "# mirra mirrored-strategy benchmark: MNIST MLP, {cores} cores; baseline (one device, \
         no strategy, {cores} threads) at batch {GLOBAL_BATCH}: {baseline:.0} samples/s"
    );
    println!(
        "# {:>8} {:>14} {:>12} {:>14} {:>12} {:>9} {:>10}",
        "replicas", "collective", "global_batch", "samples/s", "x baseline", "exposed", "imbalance"
    );
    let mut rows = vec![];
    for &replicas in &o.replicas {
        for backend in &o.backends {
            let config = StrategyConfig::cpu(replicas).with_collective(backend);
            let strategy = Arc::new(
                MirroredStrategy::new(config)
                    .map_err(|e| Failure::run(format!("xtask bench-mirrored: {e}")))?,
            );
            let mut batches = vec![GLOBAL_BATCH];
            if PER_REPLICA_BATCH * replicas != GLOBAL_BATCH {
                batches.push(PER_REPLICA_BATCH * replicas);
            }
            for global_batch in batches {
                let (samples_per_sec, stats) =
                    throughput(Some(Arc::clone(&strategy)), global_batch, plan)
                        .map_err(Failure::run)?;
                let (exposed, imbalance) = (stats.exposed_fraction(), stats.imbalance_fraction());
                println!(
                    "  {replicas:>8} {backend:>14} {global_batch:>12} {samples_per_sec:>14.0} {:>12.3} {:>8.1}% {:>9.1}%",
                    samples_per_sec / baseline,
                    100.0 * exposed,
                    100.0 * imbalance
                );
                rows.push(Row {
                    replicas,
                    collective: backend.clone(),
                    global_batch,
                    samples_per_sec,
                    exposed,
                    imbalance,
                });
            }
        }
    }
    let others = before
        .zip(machine::CpuSnapshot::now())
        .and_then(|(a, b)| a.others_share(&b));
    let rss4 = if o.rss {
        let log = target.join("bench").join("mirrored-rss.log");
        match rss::measure_args(&root, &target, &log, &rss::TRAIN_ARGS_4_REPLICAS) {
            Ok(run) => Some(run.peak_mib * 1.048_576),
            Err(e) => {
                println!("# peak RSS with 4 replicas: not measured ({e})");
                None
            }
        }
    } else {
        None
    };

    let best = |replicas: usize| {
        rows.iter()
            .filter(|r| r.replicas == replicas && r.global_batch == GLOBAL_BATCH)
            .max_by(|a, b| a.samples_per_sec.total_cmp(&b.samples_per_sec))
    };
    println!("#\n# targets (global batch {GLOBAL_BATCH}, best collective)");
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    if let Some(r) = best(2) {
        let ratio = r.samples_per_sec / baseline;
        println!(
            "#   2 replicas >= {TARGET_2_OF_BASELINE}x baseline and >= {TARGET_2_SAMPLES:.0} samples/s: \
             {ratio:.3}x, {:.0} samples/s ({})  {}",
            r.samples_per_sec,
            r.collective,
            verdict(ratio >= TARGET_2_OF_BASELINE && r.samples_per_sec >= TARGET_2_SAMPLES)
        );
        let exposed = rows
            .iter()
            .filter(|x| x.replicas == 2 && x.global_batch == GLOBAL_BATCH)
            .map(|x| x.exposed)
            .fold(f64::INFINITY, f64::min);
        println!(
            "#   exposed communication at 2 replicas < {:.0}%: {:.1}% (best collective)  {}",
            100.0 * TARGET_EXPOSED_2,
            100.0 * exposed,
            verdict(exposed < TARGET_EXPOSED_2)
        );
    }
    if let Some(r) = best(4) {
        println!(
            "#   4 replicas >= {TARGET_4_SAMPLES:.0} samples/s: {:.0} ({})  {}",
            r.samples_per_sec,
            r.collective,
            verdict(r.samples_per_sec >= TARGET_4_SAMPLES)
        );
    }
    if let Some(mb) = rss4 {
        println!(
            "#   peak RSS of `mirra train --replicas 4` < {TARGET_RSS_4_MB} MB: {mb:.1} MB  {}",
            verdict(mb < TARGET_RSS_4_MB)
        );
    }
    if let Some(share) = others {
        println!(
            "#   other processes used {:.0}% of the CPUs meanwhile",
            100.0 * share
        );
    }

    let report = json!({
        "machine": machine::facts(),
        "quick": o.quick,
        "model": "mnist-mlp",
        "baseline_samples_per_sec": num(baseline, 1),
        "rows": rows.iter().map(|r| json!({
            "replicas": r.replicas,
            "collective": r.collective,
            "global_batch": r.global_batch,
            "samples_per_sec": num(r.samples_per_sec, 1),
            "exposed_comm_fraction": num(r.exposed, 4),
            "imbalance_fraction": num(r.imbalance, 4),
        })).collect::<Vec<Value>>(),
        "peak_rss_4_replicas_mb": rss4.map(|x| num(x, 1)),
        "other_processes_cpu_share": others.map(|x| num(x, 3)),
    });
    save(&out_path, &report, Some(started))?;
    Ok(())
}
