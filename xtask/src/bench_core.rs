//! `cargo xtask bench`: the core speed and memory figures of the CPU path, each beside a
//! reference measured in the same run.
//!
//! - `matmul`: mirra's f32 `Tensor::matmul` against numpy's at 256, 512 and 1024, same
//!   threads, alternating rounds (see [`compare`](crate::compare)).
//! - `mlp`: the MNIST MLP trained as `mirra train` trains it ([`mlp`](crate::mlp): the
//!   recipe's pipeline over real data, epoch 1 a warm-up, later epochs timed) at batch 64
//!   and 256, with N threads and with 1, and PyTorch eager doing the same
//!   ([`torch_mlp`](crate::torch_mlp)) in alternating rounds. Targets: at least 1.6x
//!   PyTorch at batch 256 and 1.5x at 64 with the same threads; N threads not slower than
//!   one; no buffer allocations in a warmed-up step.
//! - `cli`: `mirra train` itself at batch 256: the samples/s its epoch lines print for the
//!   timed epochs, beside the in-process figure. The benchmark measures what the program
//!   costs only if the two agree.
//! - `subnormal`: the step once the model has memorised its data, subnormals flushed and
//!   not ([`subnormal`](crate::subnormal)).
//! - `peak_rss`: peak RSS of the default `mirra train` and of one epoch of the full MNIST
//!   ([`rss`](crate::rss)).
//!
//! Everything lands in `target/bench/core.json` (written atomically) and a table on
//! stdout. A missing part (no Python, no torch, no full MNIST) is `null` with the reason
//! next to it; it never fails the whole run.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use mirra::data::Mnist;
use serde_json::{json, Map, Value};

use crate::json::{at_least, at_most, num, opt, save};
use crate::paths::{bench_file, target_dir, workspace_root};
use crate::table::{cell, mark};
use crate::timing::{median, Plan};
use crate::Failure;
use crate::{
    bench_gpu, cli, compare, machine, mnist_train, precision, rss, subnormal, torch_train,
};
use crate::{conv_bench, resnet50_bench};

/// Square matmul sizes.
pub const SIZES: [usize; 3] = [256, 512, 1024];
/// MLP batch sizes.
pub const BATCHES: [usize; 2] = [64, 256];
/// mirra's f32 matmul at 1024 against numpy's.
pub const TARGET_RATIO_1024: f64 = 0.9;
/// mirra's MLP training over PyTorch eager's, per batch size.
pub const TARGET_VS_TORCH: [(usize, f64); 2] = [(64, 1.5), (256, 1.6)];
/// Buffer allocations per warmed-up step.
pub const TARGET_ALLOCS_PER_STEP: f64 = 0.0;
/// The CNN's batch size (issue 16's row).
pub const CNN_BATCH: usize = 128;
/// mirra's CNN training over PyTorch eager's (issue 16: ahead of PyTorch in the same run).
pub const TARGET_CNN_VS_TORCH: f64 = 1.0;
/// How far the benchmark's samples/s and `mirra train`'s may differ before the report
/// says they disagree (noise between two runs of a shared machine is 10-20%).
const AGREEMENT: f64 = 0.25;

/// `cargo xtask bench` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask bench",
    about = "Core figures beside their references: matmul vs numpy, MLP training vs PyTorch, \
             mirra train itself, subnormals, peak RSS -> target/bench/core.json"
)]
struct Args {
    /// Kernel and BLAS threads (default: the machine's cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// Fewer, shorter repeats (a smoke test, not a measurement).
    #[arg(long)]
    quick: bool,
    /// MNIST folder for the MLP (default: the bundled test set, split 8,000 / 2,000).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Alternating rounds of mirra and PyTorch (default 2; 1 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=20))]
    rounds: Option<u64>,
    /// Skip the matmul comparison.
    #[arg(long)]
    no_matmul: bool,
    /// Skip numpy in the matmul comparison.
    #[arg(long)]
    no_numpy: bool,
    /// Skip the MLP training (and PyTorch and the `mirra train` cross-check).
    #[arg(long)]
    no_mlp: bool,
    /// Skip the CNN training (and PyTorch's).
    #[arg(long)]
    no_cnn: bool,
    /// Skip the ResNet-20 training (and PyTorch's).
    #[arg(long)]
    no_resnet20: bool,
    /// Skip the convolution GFLOP/s (and PyTorch's).
    #[arg(long)]
    no_conv: bool,
    /// Skip the ResNet-50 throughput on synthetic batches (and PyTorch's).
    #[arg(long)]
    no_resnet50: bool,
    /// Skip the CNN under each dtype policy (and PyTorch's autocast).
    #[arg(long)]
    no_precision: bool,
    /// Skip PyTorch in the MLP comparison.
    #[arg(long)]
    no_torch: bool,
    /// Skip the subnormal measurement.
    #[arg(long)]
    no_subnormal: bool,
    /// Skip the peak-RSS runs of `mirra train`.
    #[arg(long)]
    no_rss: bool,
    /// Where to write the JSON (default: target/bench/core.json; gpu.json with a CUDA
    /// --device).
    #[arg(long)]
    out: Option<PathBuf>,
    /// `cpu` (these figures), or `cuda:N`: the GPU's figures instead (kernels against the
    /// device copy, matmul against cuBLAS, MLP training against PyTorch on that GPU and
    /// against the CPU), see `bench_gpu`.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: BenchDevice,
}

/// Where `cargo xtask bench` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BenchDevice {
    Cpu,
    Cuda(usize),
}

/// `cpu` or `cuda:N`.
fn parse_device(s: &str) -> Result<BenchDevice, String> {
    if s == "cpu" {
        return Ok(BenchDevice::Cpu);
    }
    s.strip_prefix("cuda:")
        .and_then(|n| n.parse().ok())
        .map(BenchDevice::Cuda)
        .ok_or_else(|| format!("`{s}` is not a device: `cpu` or `cuda:N`"))
}

/// Timing plan of the matmul comparison and its rounds.
fn matmul_plan(quick: bool) -> (Plan, usize) {
    if quick {
        let p = Plan {
            warm_up: Duration::from_millis(50),
            repeats: 3,
            min_repeat: Duration::from_millis(20),
        };
        return (p, 1);
    }
    let p = Plan {
        warm_up: Duration::from_millis(200),
        repeats: 3,
        min_repeat: Duration::from_millis(100),
    };
    (p, 4)
}

/// The run-to-run noise of two settings measured in one run: the wider relative spread
/// (`(max - min) / median`) of their rounds; `None` with fewer than two rounds of each.
fn rounds_noise(a: &[f64], b: &[f64]) -> Option<f64> {
    let spread = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        (hi - lo) / median(v)
    };
    (a.len() > 1 && b.len() > 1).then(|| spread(a).max(spread(b)))
}

/// "2 threads are not slower than 1" against the run's own noise: the rounds of one
/// setting spread by several percent on these VMs, so two equal settings would fail a
/// bare `>=` half the time. Slower means a ratio below 1 by more than the noise
/// ([`rounds_noise`]).
fn not_slower(ratio: f64, noise: f64) -> bool {
    ratio >= 1.0 - noise
}

/// Runs the benchmark, prints the table and writes the report.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(a) = cli::parse::<Args>("xtask bench", args)? else {
        return Ok(());
    };
    if let BenchDevice::Cuda(ordinal) = a.device {
        return bench_gpu::run(&bench_gpu::GpuBench {
            ordinal,
            quick: a.quick,
            no_torch: a.no_torch,
            out: bench_file(a.out.as_deref(), "gpu.json"),
        });
    }
    let started = Instant::now();
    let threads = a.threads.map_or_else(machine::cores, |t| t as usize);
    let quick = a.quick;
    let rounds = a.rounds.map_or(if quick { 1 } else { 2 }, |r| r as usize);
    let epochs = if quick { 2 } else { 3 };
    let root = workspace_root();
    let target = target_dir(&root);
    let out_path = bench_file(a.out.as_deref(), "core.json");
    let mut report = Map::new();
    let mut put = |k: &str, v: Value| {
        report.insert(k.to_string(), v);
    };
    put("schema", json!("mirra-bench-core/2"));
    put("command", json!("cargo xtask bench"));
    put("machine", machine::facts());
    put("threads", json!(threads));
    put("quick", json!(quick));

    // Matmul against numpy.
    let (plan, matmul_rounds) = matmul_plan(quick);
    let comparison = if a.no_matmul {
        compare::Comparison::skipped("skipped (--no-matmul)")
    } else {
        compare::run(&SIZES, threads, plan, matmul_rounds, !a.no_numpy)?
    };
    let ratio_1024 = comparison.ratio(1024);
    put(
        "matmul",
        json!({
            "gflops": comparison.gflops_json(&SIZES),
            "timing": comparison.timing_json(&SIZES),
            "others_cpu_share": opt(comparison.others_share, 3),
            "numpy": comparison.numpy_info.clone(),
            "numpy_unavailable": comparison.numpy_reason.clone(),
            "target": {
                "min_ratio_1024": TARGET_RATIO_1024,
                "measured": opt(ratio_1024, 3),
                "met": ratio_1024.map(|r| r >= TARGET_RATIO_1024),
                "machine_was_quiet": comparison.quiet(),
            },
        }),
    );

    // The MLP as users train it, PyTorch beside it, and `mirra train` itself.
    if a.no_mlp {
        put("mlp", json!({ "unavailable": "skipped (--no-mlp)" }));
    } else {
        let mlp = mlp_section(&a, threads, rounds, epochs);
        put("mlp", mlp);
        put("cli", cli_section(&root, &target, &a, threads, epochs));
    }
    put(
        "conv",
        if a.no_conv {
            json!({ "unavailable": "skipped (--no-conv)" })
        } else {
            conv_bench::section(threads, quick, a.no_torch)
        },
    );
    for conv in &CONV_MODELS {
        let skipped = if conv.name == "cnn" {
            a.no_cnn
        } else {
            a.no_resnet20
        };
        put(
            conv.name,
            if skipped {
                json!({ "unavailable": format!("skipped (--no-{})", conv.name) })
            } else {
                // ResNet-20's epochs are long (one warm-up and one timed epoch do).
                let epochs = epochs.min(conv.max_epochs);
                conv_section(conv, &a, threads, rounds, epochs)
            },
        );
    }

    put(
        "resnet50",
        if a.no_resnet50 {
            json!({ "unavailable": "skipped (--no-resnet50)" })
        } else {
            // A step of batch 16 takes seconds on two cores: a few steps tell the rate.
            let (batch, steps) = if quick { (4, 1) } else { (16, 3) };
            resnet50_bench::section(threads, batch, steps, a.no_torch)
        },
    );

    put(
        "precision",
        if a.no_precision {
            json!({ "unavailable": "skipped (--no-precision)" })
        } else {
            let mnist = match &a.data {
                Some(dir) => Mnist::load(dir),
                None => Mnist::bundled(),
            };
            let torch_dir = a
                .data
                .clone()
                .unwrap_or_else(|| workspace_root().join("data").join("mnist"));
            match mnist {
                Ok(m) => precision::section(
                    &m,
                    &torch_dir,
                    threads,
                    // A warm-up, then rounds of an epoch of each policy in turn.
                    if quick { 2 } else { 4 },
                    matmul_plan(quick),
                    a.no_torch,
                ),
                Err(e) => json!({ "unavailable": format!("cannot load MNIST: {e}") }),
            }
        },
    );

    put(
        "subnormal",
        if a.no_subnormal {
            json!({ "unavailable": "skipped (--no-subnormal)" })
        } else {
            println!("subnormal: memorising 1,024 examples with and without flush-to-zero");
            subnormal::report()
        },
    );

    put(
        "peak_rss",
        if a.no_rss {
            json!({ "unavailable": "skipped (--no-rss)" })
        } else {
            let dir = out_path
                .parent()
                .map_or_else(|| target.join("bench"), PathBuf::from);
            let _ = std::fs::create_dir_all(&dir);
            rss::peaks_json(&rss::measure_peaks(&root, &target, &dir))
        },
    );
    put("elapsed_s", num(started.elapsed().as_secs_f64(), 1));

    let report = Value::Object(report);
    print_table(&report);
    save(&out_path, &report, None)?;
    Ok(())
}

/// Samples/s of mirra (N threads and 1) and PyTorch per batch, over alternating rounds.
fn mlp_section(a: &Args, threads: usize, rounds: usize, epochs: usize) -> Value {
    let data_dir = a.data.clone();
    let mnist = match &data_dir {
        Some(dir) => Mnist::load(dir),
        None => Mnist::bundled(),
    };
    let mnist = match mnist {
        Ok(m) => m,
        Err(e) => return json!({ "unavailable": format!("cannot load MNIST: {e}") }),
    };
    // PyTorch reads the same files: the bundled ones from the repository's data folder.
    let torch_dir = data_dir.unwrap_or_else(|| workspace_root().join("data").join("mnist"));
    let mut ours: Vec<Vec<f64>> = vec![Vec::new(); BATCHES.len()];
    let mut ours_1: Vec<Vec<f64>> = vec![Vec::new(); BATCHES.len()];
    let mut theirs: Vec<Vec<f64>> = vec![Vec::new(); BATCHES.len()];
    let mut last: Vec<Option<mnist_train::Epochs>> = vec![None; BATCHES.len()];
    let mut torch_info = Value::Null;
    let mut torch_reason: Option<String> = a.no_torch.then(|| "skipped (--no-torch)".into());
    let mut errors = Vec::new();
    let others_before = machine::CpuSnapshot::now();
    for round in 0..rounds {
        for (i, &b) in BATCHES.iter().enumerate() {
            println!(
                "mlp: round {}/{rounds}, batch {b}: mirra, {threads} threads",
                round + 1
            );
            match mnist_train::measure(&mnist, b, threads, epochs) {
                Ok(e) => {
                    ours[i].push(e.samples_per_sec);
                    last[i] = Some(e);
                }
                Err(e) => errors.push(format!("mirra batch {b}: {e}")),
            }
            if threads > 1 {
                println!(
                    "mlp: round {}/{rounds}, batch {b}: mirra, 1 thread",
                    round + 1
                );
                match mnist_train::measure(&mnist, b, 1, epochs) {
                    Ok(e) => ours_1[i].push(e.samples_per_sec),
                    Err(e) => errors.push(format!("mirra batch {b}, 1 thread: {e}")),
                }
            }
        }
        if torch_reason.is_none() {
            println!(
                "mlp: round {}/{rounds}: PyTorch, {threads} threads",
                round + 1
            );
            match torch_train::measure(
                &torch_dir,
                threads,
                epochs,
                mnist_train::SEED,
                &BATCHES,
                "cpu",
            ) {
                Ok(v) => {
                    for (i, &b) in BATCHES.iter().enumerate() {
                        if let Some(s) = torch_train::samples_per_sec(&v, b) {
                            theirs[i].push(s);
                        }
                    }
                    torch_info = json!({
                        "torch_version": v["torch_version"],
                        "threads": v["threads"],
                        "train_examples": v["train_examples"],
                        "source": v["source"],
                    });
                }
                Err(e) => {
                    println!("mlp: PyTorch unavailable: {e}");
                    torch_reason = Some(e);
                }
            }
        }
    }
    let others =
        others_before.and_then(|b| machine::CpuSnapshot::now().and_then(|a| b.others_share(&a)));
    let med = |v: &Vec<f64>| (!v.is_empty()).then(|| median(v));
    let mut per_batch = Map::new();
    let mut targets = Map::new();
    for (i, &b) in BATCHES.iter().enumerate() {
        let (m, m1, t) = (med(&ours[i]), med(&ours_1[i]), med(&theirs[i]));
        let vs_torch = m.zip(t).map(|(m, t)| m / t);
        let want = TARGET_VS_TORCH
            .iter()
            .find(|(bb, _)| *bb == b)
            .map(|(_, r)| *r);
        per_batch.insert(
            b.to_string(),
            json!({
                "mirra_samples_per_sec": opt(m, 0),
                "mirra_samples_per_sec_rounds": ours[i].iter().map(|x| num(*x, 0)).collect::<Vec<_>>(),
                "mirra_1_thread_samples_per_sec": opt(m1, 0),
                "mirra_1_thread_samples_per_sec_rounds": ours_1[i].iter().map(|x| num(*x, 0)).collect::<Vec<_>>(),
                "torch_samples_per_sec": opt(t, 0),
                "torch_samples_per_sec_rounds": theirs[i].iter().map(|x| num(*x, 0)).collect::<Vec<_>>(),
                "mirra_over_torch": opt(vs_torch, 3),
                "threads_over_1_thread": opt(m.zip(m1).map(|(m, m1)| m / m1), 3),
                "timed_steps_per_round": last[i].map(|e| e.steps),
                "last_epoch_loss": opt(last[i].map(|e| e.last_loss), 4),
                "buffer_allocations_per_step": opt(last[i].map(|e| e.allocations_per_step), 2),
                "buffer_requests_per_step": opt(last[i].map(|e| e.buffer_requests_per_step), 1),
            }),
        );
        if let Some(want) = want {
            targets.insert(format!("vs_torch_batch_{b}"), at_least(want, vs_torch, 3));
        }
        let noise = rounds_noise(&ours[i], &ours_1[i]);
        targets.insert(
            format!("threads_not_slower_batch_{b}"),
            json!({
                "min": opt(noise.map(|n| 1.0 - n), 3),
                "noise": opt(noise, 3),
                "measured": opt(m.zip(m1).map(|(m, m1)| m / m1), 3),
                "met": m.zip(m1).zip(noise).map(|((m, m1), n)| not_slower(m / m1, n)),
            }),
        );
    }
    let max_allocs = last
        .iter()
        .flatten()
        .map(|e| e.allocations_per_step)
        .reduce(f64::max);
    targets.insert(
        "buffer_allocations_per_step".into(),
        at_most(TARGET_ALLOCS_PER_STEP, max_allocs, 2),
    );
    json!({
        "what": "the MNIST MLP trained as `mirra train` trains it: the recipe's pipeline \
                 (shuffled, batched, u8 -> f32 per batch, prefetched), Adam 1e-3; epoch 1 \
                 warms up, later epochs timed whole; PyTorch eager the same way",
        "train_examples": mnist.train.len(),
        "epochs": epochs,
        "rounds": rounds,
        "statistic": "median over rounds",
        "batches": Value::Object(per_batch),
        "torch": torch_info,
        "torch_unavailable": torch_reason,
        "others_cpu_share": opt(others, 3),
        "errors": errors,
        "targets": Value::Object(targets),
    })
}

/// A convolutional model of the bench: what `mirra train --model NAME` trains.
struct ConvModel {
    name: &'static str,
    what: &'static str,
    /// Epochs at most, the warm-up one included.
    max_epochs: usize,
    /// Also measure the peak resident memory of one epoch of `mirra train` (beside
    /// PyTorch's, both the process's own `VmHWM` at the same batch).
    cli_memory: bool,
}

const CONV_MODELS: [ConvModel; 2] = [
    ConvModel {
        name: "cnn",
        what: "the MNIST CNN (Conv2D 32 and 64 of 3x3 with 2x2 max pooling, Dense 128, 10) \
               trained as `mirra train --model cnn` trains it; PyTorch eager the same model \
               (channels first) the same way",
        max_epochs: usize::MAX,
        cli_memory: false,
    },
    ConvModel {
        name: "resnet20",
        what: "ResNet-20 (three stages of three residual blocks, batch norm, 272,186 \
               parameters) trained as `mirra train --model resnet20` trains it; PyTorch eager \
               the same network (channels first, BatchNorm2d with Keras's momentum and \
               epsilon) the same way",
        max_epochs: 2,
        cli_memory: true,
    },
];

/// A convolutional model at batch [`CNN_BATCH`], mirra then PyTorch in each of `rounds`
/// rounds, trained and timed as the MLP is; PyTorch's peak resident memory beside it.
fn conv_section(conv: &ConvModel, a: &Args, threads: usize, rounds: usize, epochs: usize) -> Value {
    let name = conv.name;
    let mnist = match &a.data {
        Some(dir) => Mnist::load(dir),
        None => Mnist::bundled(),
    };
    let mnist = match mnist {
        Ok(m) => m,
        Err(e) => return json!({ "unavailable": format!("cannot load MNIST: {e}") }),
    };
    let torch_dir = a
        .data
        .clone()
        .unwrap_or_else(|| workspace_root().join("data").join("mnist"));
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut last: Option<mnist_train::Epochs> = None;
    let mut torch_reason: Option<String> = a.no_torch.then(|| "skipped (--no-torch)".into());
    let mut torch_rss = None;
    let mut errors = Vec::new();
    for round in 0..rounds {
        println!(
            "{name}: round {}/{rounds}: mirra, {threads} threads",
            round + 1
        );
        match mnist_train::measure_model(name, &mnist, CNN_BATCH, threads, epochs) {
            Ok(e) => {
                ours.push(e.samples_per_sec);
                last = Some(e);
            }
            Err(e) => errors.push(format!("mirra: {e}")),
        }
        if torch_reason.is_none() {
            println!(
                "{name}: round {}/{rounds}: PyTorch, {threads} threads",
                round + 1
            );
            let seed = mnist_train::SEED;
            match torch_train::measure_model(
                name,
                &torch_dir,
                threads,
                epochs,
                seed,
                &[CNN_BATCH],
                "cpu",
            ) {
                Ok(v) => {
                    theirs.extend(torch_train::samples_per_sec(&v, CNN_BATCH));
                    torch_rss = v["peak_rss_bytes"].as_f64().or(torch_rss);
                }
                Err(e) => torch_reason = Some(e),
            }
        }
    }
    let med = |v: &Vec<f64>| (!v.is_empty()).then(|| median(v));
    let (m, t) = (med(&ours), med(&theirs));
    let ratio = m.zip(t).map(|(m, t)| m / t);
    let mut mirra_rss = None;
    if conv.cli_memory && !a.no_rss {
        let root = workspace_root();
        let target = target_dir(&root);
        let log = target.join("bench").join(format!("rss-{name}.log"));
        let batch = CNN_BATCH.to_string();
        let args = [
            "train",
            "--model",
            name,
            "--epochs",
            "1",
            "--batch-size",
            &batch,
        ];
        match rss::measure_args(&root, &target, &log, &args) {
            Ok(run) => mirra_rss = Some(run.peak_mib),
            Err(e) => errors.push(format!("mirra train peak RSS: {e}")),
        }
    }
    json!({
        "what": conv.what,
        "batch": CNN_BATCH,
        "threads": threads,
        "epochs": epochs,
        "rounds": rounds,
        "mirra_samples_per_sec": opt(m, 0),
        "mirra_samples_per_sec_rounds": ours.iter().map(|x| num(*x, 0)).collect::<Vec<_>>(),
        "torch_samples_per_sec": opt(t, 0),
        "torch_samples_per_sec_rounds": theirs.iter().map(|x| num(*x, 0)).collect::<Vec<_>>(),
        "mirra_over_torch": opt(ratio, 3),
        "last_epoch_loss": opt(last.map(|e| e.last_loss), 4),
        "buffer_allocations_per_step": opt(last.map(|e| e.allocations_per_step), 2),
        "mirra_train_peak_rss_mib": opt(mirra_rss, 1),
        "torch_peak_rss_mib": opt(torch_rss.map(|b| b / (1 << 20) as f64), 1),
        "torch_unavailable": torch_reason,
        "errors": errors,
        "targets": {
            "vs_torch": at_least(TARGET_CNN_VS_TORCH, ratio, 3),
            "buffer_allocations_per_step": at_most(
                TARGET_ALLOCS_PER_STEP,
                last.map(|e| e.allocations_per_step),
                2
            ),
        },
    })
}

/// `mirra train` itself at batch 256: the samples/s of its timed epochs' lines, beside the
/// in-process figure of the same configuration measured right after it.
fn cli_section(
    root: &std::path::Path,
    target: &std::path::Path,
    a: &Args,
    threads: usize,
    epochs: usize,
) -> Value {
    let batch = 256;
    let binary = match rss::mirra_binary(root, target) {
        Ok(b) => b,
        Err(e) => return json!({ "unavailable": e }),
    };
    let mut cmd = Command::new(&binary);
    cmd.args(["train", "--epochs", &epochs.to_string()])
        .args(["--batch-size", &batch.to_string()])
        .args(["--threads", &threads.to_string()])
        .args(["--seed", &mnist_train::SEED.to_string()]);
    if let Some(d) = &a.data {
        cmd.arg("--data").arg(d);
    }
    println!(
        "cli: {} train --epochs {epochs} --batch-size {batch} --threads {threads}",
        binary.display()
    );
    let out = match cmd.output() {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            return json!({ "unavailable": format!("mirra train failed ({}): {}", o.status,
                String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")) })
        }
        Err(e) => return json!({ "unavailable": format!("cannot run {}: {e}", binary.display()) }),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let per_epoch = epoch_samples_per_sec(&text);
    let timed: Vec<f64> = per_epoch.iter().skip(1).copied().collect();
    let program = (!timed.is_empty()).then(|| timed.iter().sum::<f64>() / timed.len() as f64);
    let mnist = match &a.data {
        Some(d) => Mnist::load(d),
        None => Mnist::bundled(),
    };
    let bench = mnist
        .map_err(|e| e.to_string())
        .and_then(|m| mnist_train::measure(&m, batch, threads, epochs))
        .map(|e| e.samples_per_sec);
    let ratio = program
        .zip(bench.as_ref().ok().copied())
        .map(|(p, b)| b / p);
    json!({
        "command": format!("mirra train --epochs {epochs} --batch-size {batch} --threads {threads} --seed {}", mnist_train::SEED),
        "epoch_samples_per_sec": per_epoch.iter().map(|x| num(*x, 0)).collect::<Vec<_>>(),
        "program_samples_per_sec": opt(program, 0),
        "bench_samples_per_sec": match &bench { Ok(b) => num(*b, 0), Err(_) => Value::Null },
        "bench_over_program": opt(ratio, 3),
        "agree_within": AGREEMENT,
        "agree": ratio.map(|r| (r - 1.0).abs() <= AGREEMENT),
    })
}

/// The samples/s at the end of each `Epoch k/n ... - N samples/s` line.
fn epoch_samples_per_sec(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter(|l| l.starts_with("Epoch "))
        .filter_map(|l| l.strip_suffix(" samples/s"))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The table of a saved report.
pub fn print_table(r: &Value) {
    let m = &r["matmul"];
    println!();
    println!(
        "{:<24} {:>12} {:>12} {:>10}   target",
        "matmul f32 (GFLOP/s)", "mirra", "numpy", "ours/np"
    );
    for n in SIZES {
        let g = &m["gflops"][n.to_string()];
        let target = if n == 1024 {
            format!(">= {TARGET_RATIO_1024:.2}  {}", mark(&m["target"]["met"]))
        } else {
            String::new()
        };
        println!(
            "{:<24} {:>12} {:>12} {:>10}   {target}",
            format!("  {n}x{n}x{n}"),
            cell(&g["mirra"], 1),
            cell(&g["numpy"], 1),
            cell(&g["ratio"], 3)
        );
    }
    let mlp = &r["mlp"];
    println!();
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>8}   target",
        "MLP training (samples/s)", "mirra", "1 thread", "PyTorch", "ours/pt"
    );
    for (b, want) in TARGET_VS_TORCH {
        let row = &mlp["batches"][b.to_string()];
        println!(
            "{:<24} {:>12} {:>12} {:>12} {:>8}   >= {want}  {}; threads / 1 thread {} >= 1 - \
             noise {}  {}",
            format!("  batch {b}"),
            cell(&row["mirra_samples_per_sec"], 0),
            cell(&row["mirra_1_thread_samples_per_sec"], 0),
            cell(&row["torch_samples_per_sec"], 0),
            cell(&row["mirra_over_torch"], 2),
            mark(&mlp["targets"][format!("vs_torch_batch_{b}")]["met"]),
            cell(&row["threads_over_1_thread"], 3),
            cell(
                &mlp["targets"][format!("threads_not_slower_batch_{b}")]["noise"],
                3
            ),
            mark(&mlp["targets"][format!("threads_not_slower_batch_{b}")]["met"]),
        );
    }
    println!(
        "  buffer allocations per warmed-up step: {} (target 0)  {}",
        cell(
            &mlp["targets"]["buffer_allocations_per_step"]["measured"],
            2
        ),
        mark(&mlp["targets"]["buffer_allocations_per_step"]["met"])
    );
    for key in ["unavailable", "torch_unavailable"] {
        if let Some(why) = mlp[key].as_str() {
            println!("  {}: {why}", key.replace('_', " "));
        }
    }
    let c = &r["cli"];
    if c.is_object() {
        println!(
            "  mirra train itself, batch 256: {} samples/s; the benchmark {} ({}x): {}",
            cell(&c["program_samples_per_sec"], 0),
            cell(&c["bench_samples_per_sec"], 0),
            cell(&c["bench_over_program"], 2),
            match c["agree"].as_bool() {
                Some(true) => "agree",
                Some(false) => "DISAGREE",
                None => "n/a",
            }
        );
    }
    if r["conv"]["rows"].is_array() {
        conv_bench::print(&r["conv"]);
    }
    if r["resnet50"]["batch"].is_number() {
        resnet50_bench::print(&r["resnet50"]);
    }
    for conv in &CONV_MODELS {
        let c = &r[conv.name];
        if !c.is_object() {
            continue;
        }
        println!();
        println!(
            "{:<24} {:>12} {:>12} {:>8}   target",
            format!("{} training (samples/s)", conv.name),
            "mirra",
            "PyTorch",
            "ours/pt"
        );
        println!(
            "{:<24} {:>12} {:>12} {:>8}   >= {TARGET_CNN_VS_TORCH}  {}",
            format!("  batch {CNN_BATCH}"),
            cell(&c["mirra_samples_per_sec"], 0),
            cell(&c["torch_samples_per_sec"], 0),
            cell(&c["mirra_over_torch"], 2),
            mark(&c["targets"]["vs_torch"]["met"]),
        );
        let allocs = &c["targets"]["buffer_allocations_per_step"];
        if allocs["measured"].is_number() {
            println!(
                "  buffer allocations per warmed-up step: {} (target 0)  {}",
                cell(&allocs["measured"], 2),
                mark(&allocs["met"])
            );
        }
        if c["mirra_train_peak_rss_mib"].is_number() || c["torch_peak_rss_mib"].is_number() {
            println!(
                "{:<24} {:>12} {:>12}",
                "  peak RSS (MiB)",
                cell(&c["mirra_train_peak_rss_mib"], 0),
                cell(&c["torch_peak_rss_mib"], 0),
            );
        }
        for key in ["unavailable", "torch_unavailable"] {
            if let Some(why) = c[key].as_str() {
                println!("  {}: {why}", key.replace('_', " "));
            }
        }
    }
    precision::print_table(&r["precision"]);
    let s = &r["subnormal"];
    println!();
    if s["flush_on"].is_object() {
        println!(
            "step once converged / epoch 2: {} with flush-to-zero (target <= {})  {}; {} without \
             ({}% of the optimizer state subnormal), which {} the check",
            cell(&s["flush_on"]["ratio"], 2),
            subnormal::TARGET_RATIO,
            mark(&s["target_met"]),
            cell(&s["flush_off"]["ratio"], 2),
            s["flush_off"]["subnormal_fraction_of_optimizer_state"]
                .as_f64()
                .map_or_else(|| "-".into(), |f| format!("{:.1}", f * 100.0)),
            match s["check_fails_without_flush"].as_bool() {
                Some(true) => "fails, as it must:",
                _ => "does not fail on this CPU:",
            }
        );
    } else if let Some(why) = s["unavailable"].as_str().or(s["error"].as_str()) {
        println!("subnormal: none ({why})");
    }
    println!();
    rss::print_peaks_json(&r["peak_rss"]);
    println!();
}

#[cfg(test)]
mod tests {
    #[test]
    fn threads_are_slower_only_beyond_the_runs_noise() {
        // Equal settings, 4% apart round to round: not slower.
        let (two, one) = ([100.0, 104.0, 101.0], [103.0, 99.0, 102.0]);
        let noise = super::rounds_noise(&two, &one).unwrap();
        assert!((noise - 0.04).abs() < 0.002, "{noise}");
        assert!(super::not_slower(101.0 / 102.0, noise));
        // 10% slower with the same noise: slower.
        let slow = [90.0, 93.6, 90.9];
        let noise = super::rounds_noise(&slow, &one).unwrap();
        assert!(!super::not_slower(90.9 / 102.0, noise));
        // One round of either: no noise figure, so no verdict.
        assert_eq!(super::rounds_noise(&[1.0], &one), None);
    }

    use super::*;
    use crate::cli::args;

    #[test]
    fn flags_parse_and_bad_flags_are_usage_errors() {
        let a = cli::parse::<Args>(
            "xtask bench",
            &args(&["--threads", "3", "--quick", "--no-numpy"]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (a.threads, a.quick, a.no_numpy, a.no_mlp),
            (Some(3), true, true, false)
        );
        for bad in [
            &["--bogus"][..],
            &["--threads", "0"],
            &["--threads"],
            &["--rounds", "0"],
        ] {
            assert_eq!(
                cli::parse::<Args>("xtask bench", &args(bad))
                    .unwrap_err()
                    .code,
                2,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn epoch_lines_give_their_samples_per_second() {
        let out = "Training mlp ...\nEpoch 1/3 - 0.22s - loss: 1.2961 - val_accuracy: 0.8830 - 45320 samples/s\n\
                   Epoch 2/3 - 0.32s - loss: 0.4213 - 28119 samples/s\nnot an epoch 5 samples/s\n";
        assert_eq!(epoch_samples_per_sec(out), vec![45320.0, 28119.0]);
    }
}
