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
    let mut models = Vec::new();
    let mut failed = 0;
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
