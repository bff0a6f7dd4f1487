//! `cargo xtask scaling` without `--topology`: scaling measured on the devices at hand.
//!
//! For 1, 2, 4 and 8 CPU replicas (threads sharing this machine's cores) and every
//! collective backend, the mirrored training step of the MNIST MLP at 64 samples per
//! replica (weak scaling, as data-parallel scaling is reported): step time, samples/s,
//! scaling efficiency `samples/s(N) / (N x samples/s(1))` and the exposed communication
//! per step; the collective benchmark (a quick `bench-collectives` sweep); and the MLP's
//! per-layer backward timings on this machine, the profile the scaling model uses for
//! "the model at hand". Everything lands in `target/bench/scaling-measured.json`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use mirra::autograd::Tape;
use mirra::collectives::BACKENDS;
use mirra::nn::loss::SparseCategoricalCrossentropy;
use mirra::nn::{Loss, Reduction};
use mirra::strategy::{MirroredStrategy, StrategyConfig};
use mirra::tensor::init::rng;
use mirra::tensor::{num_threads, set_num_threads};
use mirra_scaling::profile::LayerProfile;
use mirra_scaling::ModelProfile;
use serde_json::{json, Value};

use crate::bench_mirrored::{plan, throughput};
use crate::json::{num, save};
use crate::paths::{bench_file, target_dir, workspace_root};
use crate::timing::median;
use crate::{bench_collectives, flags, machine, mlp, Failure};

/// Samples per replica of the measured rows.
pub const PER_REPLICA_BATCH: usize = 64;
/// Replica counts measured by default (8 threads on this 2-core machine: oversubscribed,
/// which is the point of measuring it).
pub const REPLICAS: [usize; 4] = [1, 2, 4, 8];

/// The flags of the measured mode, for the usage message.
pub const FLAGS_HELP: &str = "  (measured mode, without --topology)
  --quick            fewer, shorter repeats and a small collectives sweep
  --replicas 1,2,4   replica counts (default: 1,2,4,8)
  --out FILE         where to write the JSON (default: target/bench/scaling-measured.json)
";

/// The MLP's profile on this machine: forward time and each layer's backward time (from
/// the moments backward hands out each gradient), medians over `reps` steps.
pub fn mlp_profile(batch: usize, reps: usize) -> Result<ModelProfile, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut net = mirra::models::mlp();
    net.build(&[28, 28], 42).map_err(|e| err(&e))?;
    let names: Vec<String> = net
        .param_names()
        .iter()
        .map(|n| n.split('/').next().unwrap_or(n).to_string())
        .collect();
    let mut layers: Vec<String> = names.clone();
    layers.dedup();
    let params: Vec<usize> = layers
        .iter()
        .map(|l| {
            names
                .iter()
                .zip(net.params())
                .filter(|(n, _)| *n == l)
                .map(|(_, p)| p.elem_count())
                .sum()
        })
        .collect();
    let data = mlp::synthetic_batches(batch)?;
    let (x, y) = &data[0];
    let loss_fn = SparseCategoricalCrossentropy::default();
    let tape = Tape::new();
    let mut g = rng(1);
    let mut forward = vec![];
    let mut backward: Vec<Vec<f64>> = vec![vec![]; layers.len()];
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let out = net
            .forward(&tape, x.clone(), true, &mut g)
            .map_err(|e| err(&e))?;
        let loss = loss_fn
            .compute(&out, y, Reduction::SumOverBatchSize)
            .map_err(|e| err(&e))?;
        let t1 = Instant::now();
        let mut ready = vec![];
        tape.backward_with(&loss, |key, _| {
            ready.push((key, Instant::now()));
            Ok(())
        })
        .map_err(|e| err(&e))?;
        drop((out, loss));
        tape.clear();
        forward.push((t1 - t0).as_secs_f64());
        let mut per_layer = vec![0.0; layers.len()];
        let mut last = t1;
        for (key, at) in ready {
            let layer = layers.iter().position(|l| *l == names[key]).unwrap_or(0);
            per_layer[layer] += (at - last).as_secs_f64();
            last = at;
        }
        for (acc, t) in backward.iter_mut().zip(per_layer) {
            acc.push(t);
        }
    }
    let layer_profiles = layers
        .iter()
        .zip(&params)
        .zip(&backward)
        .map(|((name, &params), times)| LayerProfile {
            name: name.clone(),
            params,
            backward_s: median(times),
        })
        .collect();
    ModelProfile::from_measured(
        "mnist-mlp",
        batch,
        median(&forward),
        layer_profiles,
        4,
        format!(
            "measured here: {} ({} threads), median of {reps} steps",
            machine::cpu_model().unwrap_or_else(|| "this CPU".into()),
            num_threads()
        ),
    )
    .map_err(|e| e.to_string())
}

#[derive(Debug)]
struct Options {
    quick: bool,
    replicas: Vec<usize>,
    out: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Options, Failure> {
    let mut o = Options {
        quick: false,
        replicas: REPLICAS.to_vec(),
        out: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| flags::value("scaling", flag, &mut it);
        match arg.as_str() {
            "--quick" => o.quick = true,
            "--out" => o.out = Some(PathBuf::from(value("--out")?)),
            "--replicas" => {
                o.replicas = flags::counts("scaling", "--replicas", &value("--replicas")?)?;
                if !o.replicas.contains(&1) {
                    o.replicas.insert(0, 1);
                }
            }
            other => {
                return Err(Failure::usage(format!(
                    "xtask scaling: unknown flag `{other}` (measured mode)\n\nflags:\n{FLAGS_HELP}"
                )))
            }
        }
    }
    Ok(o)
}

/// The measured mode.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let o = parse(args)?;
    let started = Instant::now();
    let root = workspace_root();
    let target = target_dir(&root);
    let out_path = bench_file(o.out.as_deref(), "scaling-measured.json");
    let cores = machine::cores();
    let plan = plan(o.quick);
    set_num_threads(cores);
    let profile =
        mlp_profile(PER_REPLICA_BATCH, if o.quick { 10 } else { 50 }).map_err(Failure::run)?;
    println!(
        "# measured scaling: MNIST MLP, {PER_REPLICA_BATCH} samples per replica, {cores} cores shared by the replicas"
    );
    println!(
        "# profile ({}): forward {:.1} us, backward {}",
        profile.source,
        profile.forward_s * 1e6,
        profile
            .layers
            .iter()
            .map(|l| format!("{} {:.1} us", l.name, l.backward_s * 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "# {:>8} {:>14} {:>10} {:>12} {:>10} {:>12} {:>9}",
        "replicas", "collective", "step (ms)", "samples/s", "efficiency", "exposed (ms)", "exposed"
    );
    let mut rows = vec![];
    let mut single: Option<f64> = None;
    for &replicas in &o.replicas {
        // One replica: the collective is never used; measure it once.
        let backends: Vec<&str> = if replicas == 1 {
            vec![BACKENDS[0]]
        } else {
            BACKENDS.to_vec()
        };
        for backend in backends {
            let config = StrategyConfig::cpu(replicas).with_collective(backend);
            let strategy = Arc::new(
                MirroredStrategy::new(config)
                    .map_err(|e| Failure::run(format!("xtask scaling: {e}")))?,
            );
            let batch = PER_REPLICA_BATCH * replicas;
            let (sps, stats) = throughput(Some(strategy), batch, plan).map_err(Failure::run)?;
            let exposed = stats.exposed_fraction();
            let base = *single.get_or_insert(sps);
            let step_s = batch as f64 / sps;
            let efficiency = sps / (replicas as f64 * base);
            println!(
                "  {replicas:>8} {backend:>14} {:>10.3} {sps:>12.0} {efficiency:>10.3} {:>12.3} {:>8.1}%",
                step_s * 1e3,
                exposed * step_s * 1e3,
                100.0 * exposed
            );
            rows.push(json!({
                "replicas": replicas,
                "collective": if replicas == 1 { "none" } else { backend },
                "global_batch": batch,
                "step_ms": num(step_s * 1e3, 4),
                "samples_per_sec": num(sps, 1),
                "efficiency": num(efficiency, 4),
                "exposed_comm_ms": num(exposed * step_s * 1e3, 4),
                "exposed_comm_fraction": num(exposed, 4),
                "imbalance_fraction": num(stats.imbalance_fraction(), 4),
            }));
        }
    }
    // The collective benchmark, small: the report's bandwidth ratios come from it.
    let collectives_path = target.join("bench").join("collectives.json");
    let mut bench_args: Vec<String> = vec!["--max-bytes".into(), "16M".into()];
    if o.quick {
        bench_args.push("--quick".into());
    }
    bench_args.extend(["--out".into(), collectives_path.display().to_string()]);
    println!(
        "#\n# collective benchmark: cargo xtask bench-collectives {}",
        bench_args.join(" ")
    );
    bench_collectives::run(&bench_args)?;

    let report = json!({
        "machine": machine::facts(),
        "quick": o.quick,
        "model": "mnist-mlp",
        "per_replica_batch": PER_REPLICA_BATCH,
        "rows": rows,
        "profile": profile_json(&profile),
        "collectives": collectives_path.display().to_string(),
    });
    save(&out_path, &report, Some(started))?;
    Ok(())
}

/// A profile as JSON.
pub fn profile_json(p: &ModelProfile) -> Value {
    json!({
        "name": p.name,
        "batch": p.batch,
        "forward_s": p.forward_s,
        "bytes_per_param": p.bytes_per_param,
        "source": p.source,
        "layers": p.layers.iter().map(|l| json!({
            "name": l.name, "params": l.params, "backward_s": l.backward_s,
        })).collect::<Vec<Value>>(),
    })
}
