//! `cargo xtask accuracy-precision`: issue 17's accuracy check of mixed precision. The
//! MNIST MLP and `cnn` trained by `mirra train` (release build) on the full MNIST (60,000
//! training images, validated on the 10,000 test images) under each dtype policy, for
//! several seeds; `mixed_bfloat16` and `mixed_float16` must end, as a mean over the seeds,
//! within [`BAND`] of float32's validation accuracy. The check must be able to fail: the
//! same runs with bf16 products accumulated in bf16 (`mirra train
//! --ablate-bf16-accumulation`) are the wrong model it has to reject
//! (-> `target/bench/accuracy-precision.json`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clap::Parser;
use serde_json::json;

use crate::accuracy::{full_data_dir, last_value};
use crate::json::{num, save};
use crate::paths::{bench_file, target_dir, workspace_root};
use crate::{cli, machine, rss, Failure};

/// A 16-bit policy's mean validation accuracy may fall at most this far (0.3 points)
/// below float32's.
pub const BAND: f64 = 0.003;

/// One configuration trained for every seed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Run {
    Policy(&'static str),
    /// mixed_bfloat16 with bf16 accumulation.
    Ablation,
}

impl Run {
    fn name(self) -> &'static str {
        match self {
            Run::Policy(p) => p,
            Run::Ablation => "mixed_bfloat16, bf16 accumulation (ablation)",
        }
    }

    fn flags(self) -> Vec<&'static str> {
        match self {
            Run::Policy(p) => vec!["--precision", p],
            Run::Ablation => vec![
                "--precision",
                "mixed_bfloat16",
                "--ablate-bf16-accumulation",
            ],
        }
    }
}

/// The products whose accumulation the ablation changes, measured directly: shapes of
/// the weight gradients of the two models at batch 128 (`xᵀ·g`: the sum runs over the batch,
/// times the output positions for a convolution), with ReLU-like activations and
/// zero-mean gradients.
const PRODUCTS: [(&str, usize, usize, usize); 2] = [
    ("MLP dense 784->128 weight gradient", 784, 128, 128),
    (
        "cnn conv2 weight gradient (128 x 11 x 11 positions)",
        288,
        128 * 121,
        64,
    ),
];

/// A bf16 product with f32 accumulation must be within this relative error (Frobenius) of
/// the exact product of the same bf16 inputs: one bf16 rounding of the result, 2^-9, with
/// room.
const F32_ACCUMULATION_MAX: f64 = 1.0 / 256.0;

/// The relative error of `a·b` computed in bf16 with and without the ablation, against the
/// exact (f64) product of the same bf16 values: `(f32 accumulation, bf16 accumulation)`.
fn product_errors(m: usize, k: usize, n: usize) -> Result<(f64, f64), String> {
    use mirra::tensor::{set_bf16_accumulation_ablation, DType, Device, Tensor};
    let e = |e: mirra::tensor::TensorError| e.to_string();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    // Activations: half zeros (ReLU), the rest in (0, 1); gradients in (-1, 1).
    let a: Vec<f32> = (0..m * k)
        .map(|_| (uniform() * 2.0 - 1.0).max(0.0) as f32)
        .collect();
    let b: Vec<f32> = (0..k * n).map(|_| (uniform() * 2.0 - 1.0) as f32).collect();
    let bf = |v: &[f32], d: &[usize]| -> Result<Tensor, String> {
        Tensor::from_slice(v, d, Device::Cpu)
            .and_then(|t| t.to_dtype(DType::BF16))
            .map_err(e)
    };
    let (ta, tb) = (bf(&a, &[m, k])?, bf(&b, &[k, n])?);
    let exact = ta
        .to_dtype(DType::F64)
        .and_then(|x| x.matmul(&tb.to_dtype(DType::F64)?))
        .and_then(|x| x.to_vec::<f64>())
        .map_err(e)?;
    let error = |ablate: bool| -> Result<f64, String> {
        set_bf16_accumulation_ablation(ablate);
        let got = ta.matmul(&tb).and_then(|x| x.to_dtype(DType::F64));
        set_bf16_accumulation_ablation(false);
        let got = got.and_then(|x| x.to_vec::<f64>()).map_err(e)?;
        let (mut diff, mut norm) = (0.0, 0.0);
        for (g, x) in got.iter().zip(&exact) {
            diff += (g - x) * (g - x);
            norm += x * x;
        }
        Ok((diff / norm).sqrt())
    };
    Ok((error(false)?, error(true)?))
}

/// `cargo xtask accuracy-precision` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask accuracy-precision",
    about = "The MLP and cnn on the full MNIST under float32, mixed_bfloat16 and \
             mixed_float16 (mirra train, release), several seeds, with the bf16-accumulation \
             ablation -> target/bench/accuracy-precision.json"
)]
struct Args {
    /// The full MNIST folder (default: ../shared/data/mnist beside the checkout).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Models (comma-separated): mlp, cnn.
    #[arg(long, value_delimiter = ',', default_values_t = ["mlp".to_string(), "cnn".to_string()])]
    models: Vec<String>,
    /// Seeds (comma-separated); the figures are their means.
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 2, 3])]
    seeds: Vec<u64>,
    /// Epochs of the MLP.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    mlp_epochs: u64,
    /// Epochs of the cnn.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    cnn_epochs: u64,
    /// Global batch size.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=65536))]
    batch_size: u64,
    /// Leave out the ablation (the check is then not shown able to fail).
    #[arg(long)]
    no_ablation: bool,
    /// Where to write the JSON (default: target/bench/accuracy-precision.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The verdict on one configuration against float32: `(met, text)`; `met` says whether
/// its mean lies within the band, which an ablation must not.
fn verdict(run: Run, mean: Option<f64>, f32_mean: Option<f64>) -> (Option<bool>, String) {
    let (Some(m), Some(f)) = (mean, f32_mean) else {
        return (None, "no figure".into());
    };
    let within = m >= f - BAND;
    let delta = format!("{:+.2} points", (m - f) * 100.0);
    match run {
        Run::Policy("float32") => (Some(true), "the reference".into()),
        Run::Policy(_) => (
            Some(within),
            format!(
                "{delta} (at most {:.1} below): {}",
                BAND * 100.0,
                if within { "met" } else { "MISSED" }
            ),
        ),
        Run::Ablation => (
            Some(!within),
            format!(
                "{delta}: {}",
                if within {
                    "NOT rejected: the band cannot tell f32 accumulation from bf16"
                } else {
                    "rejected, as it must be"
                }
            ),
        ),
    }
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(a) = cli::parse::<Args>("xtask accuracy-precision", args)? else {
        return Ok(());
    };
    if let Some(m) = a
        .models
        .iter()
        .find(|m| !["mlp", "cnn"].contains(&m.as_str()))
    {
        return Err(Failure::usage(format!(
            "--models: '{m}' is not one of mlp, cnn"
        )));
    }
    if a.seeds.is_empty() {
        return Err(Failure::usage("--seeds: give at least one seed"));
    }
    let started = Instant::now();
    let root = workspace_root();
    let target = target_dir(&root);
    let out = bench_file(a.out.as_deref(), "accuracy-precision.json");
    let data = full_data_dir(a.data.as_deref(), &root).map_err(Failure::run)?;
    let binary = rss::mirra_binary(&root, &target).map_err(Failure::run)?;
    let dir = out
        .parent()
        .map_or_else(|| target.join("bench"), Path::to_path_buf);
    let _ = std::fs::create_dir_all(&dir);
    let mut runs = vec![
        Run::Policy("float32"),
        Run::Policy("mixed_bfloat16"),
        Run::Policy("mixed_float16"),
    ];
    if !a.no_ablation {
        runs.push(Run::Ablation);
    }
    let mut failed = 0;
    // First the products themselves: f32 accumulation within one bf16 rounding of exact,
    // and the ablation visibly worse, or the ablation does not ablate anything.
    println!("bf16 products against their exact values (relative Frobenius error):");
    let mut products = Vec::new();
    for (what, m, k, n) in PRODUCTS {
        let (f32_acc, bf16_acc) = product_errors(m, k, n).map_err(Failure::run)?;
        let met = f32_acc <= F32_ACCUMULATION_MAX && bf16_acc >= 4.0 * f32_acc;
        if !met {
            failed += 1;
        }
        println!(
            "  {what} ({m} x {k} x {n}): f32 accumulation {f32_acc:.2e} (at most {:.2e}), \
             bf16 accumulation {bf16_acc:.2e} ({:.0}x): {}",
            F32_ACCUMULATION_MAX,
            bf16_acc / f32_acc,
            if met { "ok" } else { "FAILED" }
        );
        products.push(json!({
            "product": what, "m": m, "k": k, "n": n,
            "f32_accumulation_error": f32_acc,
            "bf16_accumulation_error": bf16_acc,
            "target": format!("f32 accumulation <= {F32_ACCUMULATION_MAX:.2e}; bf16 accumulation >= 4x it"),
            "met": met,
        }));
    }
    let mut models = Vec::new();
    for model in &a.models {
        let epochs = if model == "mlp" {
            a.mlp_epochs
        } else {
            a.cnn_epochs
        };
        println!(
            "{model} on the full MNIST: {epochs} epochs at batch {}, seeds {:?}",
            a.batch_size, a.seeds
        );
        let mut rows = Vec::new();
        let mut f32_mean = None;
        for &run in &runs {
            let mut values = Vec::new();
            let mut seconds = Vec::new();
            let mut errors = Vec::new();
            for &seed in &a.seeds {
                let history = dir.join(format!(
                    "accuracy-precision-{model}-{}-{seed}.json",
                    match run {
                        Run::Policy(p) => p,
                        Run::Ablation => "ablation",
                    }
                ));
                let t = Instant::now();
                let status = Command::new(&binary)
                    .args(["train", "--model", model, "--epochs", &epochs.to_string()])
                    .args(["--batch-size", &a.batch_size.to_string()])
                    .args(["--seed", &seed.to_string()])
                    .args(run.flags())
                    .arg("--data")
                    .arg(&data)
                    .arg("--history")
                    .arg(&history)
                    .stdout(std::process::Stdio::null())
                    .status()
                    .map_err(|e| Failure::run(format!("cannot run {}: {e}", binary.display())))?;
                seconds.push(t.elapsed().as_secs_f64());
                let got = if status.success() {
                    last_value(&history, "val_accuracy")
                } else {
                    Err(format!("mirra train exited with {status}"))
                };
                match got {
                    Ok(v) => values.push(v),
                    Err(e) => errors.push(format!("seed {seed}: {e}")),
                }
                println!(
                    "  {:<45} seed {seed}: {} ({:.0} s)",
                    run.name(),
                    values
                        .last()
                        .filter(|_| errors.is_empty())
                        .map_or_else(|| "failed".into(), |v| format!("{v:.4}")),
                    seconds.last().unwrap()
                );
            }
            let m = if errors.is_empty() {
                mean(&values)
            } else {
                None
            };
            if run == Run::Policy("float32") {
                f32_mean = m;
            }
            let (met, text) = verdict(run, m, f32_mean);
            if met != Some(true) {
                failed += 1;
            }
            println!(
                "  {:<45} mean {}: {text}",
                run.name(),
                m.map_or_else(|| "-".into(), |m| format!("{m:.4}"))
            );
            rows.push(json!({
                "run": run.name(),
                "flags": run.flags(),
                "val_accuracy": values.iter().map(|v| num(*v, 4)).collect::<Vec<_>>(),
                "mean": m.map(|m| num(m, 4)),
                "delta_points": m.zip(f32_mean).map(|(m, f)| num((m - f) * 100.0, 2)),
                "seconds": seconds.iter().map(|s| num(*s, 1)).collect::<Vec<_>>(),
                "errors": errors,
                "met": met,
                "verdict": text,
            }));
        }
        models.push(json!({
            "model": model,
            "epochs": epochs,
            "batch_size": a.batch_size,
            "seeds": a.seeds,
            "rows": rows,
        }));
    }
    let report = json!({
        "schema": "mirra-accuracy-precision/1",
        "command": format!("cargo xtask accuracy-precision {}", args.join(" ")).trim_end(),
        "machine": machine::facts(),
        "bf16_matmul_path": mirra::tensor::bf16_matmul_path(),
        "band_points": BAND * 100.0,
        "products": products,
        "models": models,
        "failed": failed,
    });
    save(&out, &report, Some(started))?;
    if failed > 0 {
        println!("{failed} check(s) failed (see above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdicts: a policy inside the band meets it, one below misses it; an ablation
    /// inside the band is reported as not rejected, which is a failed check.
    #[test]
    fn policies_must_lie_within_the_band_and_the_ablation_outside() {
        let f = Some(0.98);
        let bf16 = Run::Policy("mixed_bfloat16");
        assert_eq!(verdict(bf16, Some(0.978), f).0, Some(true));
        assert_eq!(verdict(bf16, Some(0.976), f).0, Some(false));
        assert_eq!(verdict(bf16, Some(0.99), f).0, Some(true));
        assert_eq!(verdict(Run::Ablation, Some(0.95), f).0, Some(true));
        let (met, text) = verdict(Run::Ablation, Some(0.979), f);
        assert_eq!(met, Some(false));
        assert!(text.contains("NOT rejected"), "{text}");
        assert_eq!(verdict(bf16, None, f).0, None);
        assert_eq!(mean(&[0.5, 1.0]), Some(0.75));
        assert_eq!(mean(&[]), None);
    }
}
