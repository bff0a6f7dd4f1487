//! `cargo xtask bench-workers`: multi-worker training on this machine (issue 18), as a
//! user runs it: `mirra train` (release, built with the `mpi` feature) in one process with
//! N replicas, and under `mpirun` as W workers of N / W replicas each, every configuration
//! of a model in one run, interleaved over rounds, the median of each (->
//! `target/bench/workers.json`). The figure is the History's training samples/s (the
//! epoch's, validation left out), so the benchmark and `mirra train` are one thing.
//!
//! The rows the issue asks for: the MLP and cnn at 2 workers x 1 replica against 1
//! process x 2 replicas; beside them, 4 replicas as 1 x 4, 2 x 2 (hierarchical: a local
//! group per worker, MPI between workers) and 4 x 1 (flat: every replica its own MPI
//! process). On a 2-core machine the 4-replica rows share cores.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use clap::Parser;
use serde_json::json;

use crate::accuracy::last_value;
use crate::json::{num, save};
use crate::paths::{bench_file, target_dir, workspace_root};
use crate::timing::median;
use crate::{cli, machine, Failure};

/// `cargo xtask bench-workers` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask bench-workers",
    about = "mirra train in one process and under mpirun as several workers (MLP, cnn): \
             samples/s -> target/bench/workers.json"
)]
struct Args {
    /// Models (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "mlp,cnn")]
    models: Vec<String>,
    /// Rounds: every configuration once per round, the median reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=50))]
    rounds: u64,
    /// Global batch.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(4..=65536))]
    batch_size: u64,
    /// The full MNIST folder the MLP trains on (default: ../shared/data/mnist beside the
    /// checkout; without it, the bundled split, whose MLP epoch takes 20 ms).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Where to write the JSON (default: target/bench/workers.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One way to run N replicas: `workers` processes (0: no mpirun) of `replicas` each.
#[derive(Clone, Copy, Debug)]
struct Layout {
    name: &'static str,
    workers: usize,
    replicas: usize,
    /// The row the layout is compared with.
    against: &'static str,
}

const LAYOUTS: [Layout; 5] = [
    Layout {
        name: "1 process x 2",
        workers: 0,
        replicas: 2,
        against: "1 process x 2",
    },
    Layout {
        name: "2 workers x 1",
        workers: 2,
        replicas: 1,
        against: "1 process x 2",
    },
    Layout {
        name: "1 process x 4",
        workers: 0,
        replicas: 4,
        against: "1 process x 4",
    },
    Layout {
        name: "2 workers x 2 (hierarchical)",
        workers: 2,
        replicas: 2,
        against: "1 process x 4",
    },
    Layout {
        name: "4 workers x 1 (flat)",
        workers: 4,
        replicas: 1,
        against: "1 process x 4",
    },
];

/// Epochs per run: the figure is the last one's (the first warms up).
fn epochs(model: &str) -> usize {
    if model == "mlp" {
        3
    } else {
        1
    }
}

/// `cargo build --release -p mirra --features mpi`, copied to `mirra-mpi` beside the
/// plain build (which the other benchmarks rebuild: only the link differs).
fn mpi_binary(root: &Path, target: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!("bench-workers: building the CLI (cargo build --release -p mirra --features mpi)");
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "mirra", "--features", "mpi"])
        .current_dir(root)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`cargo build --release -p mirra --features mpi` failed ({status}): OpenMPI and \
             libclang are needed (bash ci/install-mpi.sh)"
        ));
    }
    let built = target.join("release").join("mirra");
    let copy = target.join("release").join("mirra-mpi");
    std::fs::copy(&built, &copy).map_err(|e| format!("{}: {e}", copy.display()))?;
    Ok(copy)
}

/// One run's training samples/s (the last epoch's).
fn samples_per_sec(
    binary: &Path,
    model: &str,
    layout: Layout,
    batch: u64,
    data: Option<&Path>,
    history: &Path,
) -> Result<f64, String> {
    let mut cmd = if layout.workers == 0 {
        Command::new(binary)
    } else {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-np"])
            .arg(layout.workers.to_string())
            .arg(binary);
        c
    };
    cmd.args(["train", "--model", model, "--seed", "1"])
        .args(["--epochs", &epochs(model).to_string()])
        .args(["--batch-size", &batch.to_string()])
        .arg("--history")
        .arg(history)
        .args(
            data.map(|d| [std::ffi::OsStr::new("--data"), d.as_os_str()])
                .into_iter()
                .flatten(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if layout.replicas > 1 || layout.workers > 0 {
        cmd.args(["--replicas", &layout.replicas.to_string()]);
    }
    let status = cmd.status().map_err(|e| format!("cannot run: {e}"))?;
    if !status.success() {
        return Err(format!("{} {model}: exited with {status}", layout.name));
    }
    last_value(history, "samples_per_sec")
}

pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(a) = cli::parse::<Args>("xtask bench-workers", args)? else {
        return Ok(());
    };
    let started = Instant::now();
    let root = workspace_root();
    let target = target_dir(&root);
    let out = bench_file(a.out.as_deref(), "workers.json");
    let binary = mpi_binary(&root, &target).map_err(Failure::run)?;
    let dir = std::env::temp_dir().join(format!("mirra-bench-workers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Failure::run(e.to_string()))?;
    // The MLP on the full MNIST (60,000 images: 140 ms an epoch at 400k samples/s); the
    // cnn's bundled epoch already takes a second.
    let full = crate::accuracy::full_data_dir(a.data.as_deref(), &root).ok();
    let mut rows = Vec::new();
    for model in &a.models {
        let data = full.as_deref().filter(|_| model == "mlp");
        let mut figures = vec![Vec::new(); LAYOUTS.len()];
        for round in 0..a.rounds {
            for (i, layout) in LAYOUTS.iter().enumerate() {
                let history = dir.join(format!("{model}-{i}-{round}.json"));
                let sps = samples_per_sec(&binary, model, *layout, a.batch_size, data, &history)
                    .map_err(Failure::run)?;
                figures[i].push(sps);
            }
        }
        println!(
            "\n{model} on {}, global batch {}, {} epoch(s), median of {} rounds:",
            match data {
                Some(_) => "the full MNIST",
                None => "the bundled split",
            },
            a.batch_size,
            epochs(model),
            a.rounds
        );
        println!("| layout | samples/s | x its reference |");
        println!("|---|---|---|");
        let medians: Vec<f64> = figures.iter().map(|f| median(f)).collect();
        for (i, layout) in LAYOUTS.iter().enumerate() {
            let reference = LAYOUTS
                .iter()
                .position(|l| l.name == layout.against)
                .expect("a reference layout");
            let ratio = medians[i] / medians[reference];
            println!(
                "| {} | {:.0} | {ratio:.3} ({}) |",
                layout.name, medians[i], layout.against
            );
            rows.push(json!({
                "model": model,
                "data": if data.is_some() { "full MNIST" } else { "bundled split" },
                "layout": layout.name,
                "workers": layout.workers.max(1),
                "replicas_per_worker": layout.replicas,
                "samples_per_sec": num(medians[i], 1),
                "rounds": figures[i].iter().map(|x| num(*x, 1)).collect::<Vec<_>>(),
                "reference": layout.against,
                "ratio": num(ratio, 3),
            }));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let report = json!({
        "schema": "mirra-workers/1",
        "command": format!("cargo xtask bench-workers {}", args.join(" ")).trim_end(),
        "machine": machine::facts(),
        "rows": rows,
    });
    save(&out, &report, Some(started))?;
    Ok(())
}
