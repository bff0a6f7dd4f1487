//! `cargo xtask bench`'s mixed precision rows (issue 17): the CNN at batch [`BATCH`] under
//! each dtype policy, trained as `mirra train --model cnn --precision P` trains it, with
//! the activation memory of one training forward pass: the rise of the process's live
//! host buffers over it (`mirra::device::live_bytes`), which is what the tape keeps for
//! backward (the output, a few KiB, included). PyTorch eager beside it, in f32 and under
//! `torch.autocast(bfloat16)`, its activation memory the storages its autograd graph
//! saves (`saved_tensors_hooks`; the weights it saves included, under a MiB here).
//!
//! Targets: bf16 activation memory at most 0.7 of f32's; bf16 training at least PyTorch's
//! autocast and at least 1.5x mirra's own f32. The last two need 16-bit units: on a CPU
//! without AVX-512 BF16 or AMX mirra converts 16-bit products to f32 and back, and the
//! report names the path.

use std::path::Path;

use mirra::autograd::Tape;
use mirra::data::Mnist;
use mirra::device::live_bytes;
use mirra::nn::{Examples, Policy};
use mirra::tensor::set_num_threads;
use serde_json::{json, Value};

use crate::json::{at_least, at_most, num, opt};
use crate::table::{cell, mark};
use crate::timing::Plan;
use crate::{bf16_matmul, mnist_train, torch_train};

/// The batch of the rows.
pub const BATCH: usize = 256;
/// Activation memory under bf16 over f32's, at most.
pub const TARGET_ACTIVATION_RATIO: f64 = 0.7;
/// bf16 training over mirra's f32, at least.
pub const TARGET_OVER_F32: f64 = 1.5;

/// The rows, or why a part is missing.
pub fn section(
    mnist: &Mnist,
    torch_dir: &Path,
    threads: usize,
    epochs: usize,
    matmul_plan: (Plan, usize),
    no_torch: bool,
) -> Value {
    let matmul = bf16_matmul::compare(threads, matmul_plan.0, matmul_plan.1, no_torch);
    set_num_threads(threads);
    let data = match mirra::recipe::train_pipeline(
        &mnist.train,
        mirra::recipe::Examples::InMemory,
        BATCH,
        mnist_train::SEED,
    ) {
        Ok(d) => d,
        Err(e) => return json!({ "unavailable": e.to_string() }),
    };
    let mut rows = serde_json::Map::new();
    let mut errors = Vec::new();
    // Each policy's model, its activation memory and its warm-up epoch.
    let mut runs = Vec::new();
    for policy in Policy::ALL {
        println!("precision: cnn under {policy}, {threads} threads (warm-up)");
        match Run::start(policy, &data) {
            Ok(run) => runs.push(run),
            Err(e) => errors.push(format!("{policy}: {e}")),
        }
    }
    // Then rounds of one epoch of each in turn, so that the machine's drift reaches
    // every policy alike: the ratios are the medians of each round's.
    for round in 0..epochs.saturating_sub(1).max(1) {
        for run in runs.iter_mut() {
            println!("precision: cnn under {}, round {}", run.policy, round + 1);
            if let Err(e) = run.epoch(&data) {
                errors.push(format!("{}: {e}", run.policy));
            }
        }
    }
    for run in &runs {
        rows.insert(run.policy.name().into(), run.row());
    }
    let per_round = |policy: Policy| -> Vec<f64> {
        runs.iter()
            .find(|r| r.policy == policy)
            .map_or_else(Vec::new, |r| r.rates.clone())
    };
    let mut torch = serde_json::Map::new();
    let mut torch_unavailable = no_torch.then(|| "skipped (--no-torch)".to_string());
    for autocast in ["float32", "bfloat16"] {
        if torch_unavailable.is_some() {
            break;
        }
        println!("precision: PyTorch cnn, autocast {autocast}");
        let seed = mnist_train::SEED;
        let got = torch_train::measure_autocast(
            "cnn",
            torch_dir,
            threads,
            epochs,
            seed,
            &[BATCH],
            "cpu",
            autocast,
        );
        match got {
            Ok(v) => {
                let r = &v["results"][BATCH.to_string()];
                torch.insert(
                    autocast.into(),
                    json!({
                        "samples_per_sec": r["samples_per_sec"],
                        "saved_for_backward_bytes": r["saved_for_backward_bytes"],
                    }),
                );
            }
            Err(e) => torch_unavailable = Some(e),
        }
    }
    let get = |row: Option<&Value>, key: &str| row.and_then(|r| r[key].as_f64());
    let f32_row = rows.get("float32");
    let bf16_row = rows.get("mixed_bfloat16");
    let activation_ratio = get(bf16_row, "activation_bytes")
        .zip(get(f32_row, "activation_bytes"))
        .map(|(a, b)| a / b);
    let over_f32 = median(
        per_round(Policy::MixedBfloat16)
            .iter()
            .zip(per_round(Policy::Float32))
            .map(|(a, b)| a / b)
            .collect(),
    );
    let over_torch = get(bf16_row, "samples_per_sec")
        .zip(get(torch.get("bfloat16"), "samples_per_sec"))
        .map(|(a, b)| a / b);
    json!({
        "what": "the MNIST CNN at batch 256 under each dtype policy (mirra train --model cnn \
                 --precision P), the bundled data through the pipeline; after a warm-up \
                 epoch, rounds of one epoch of each policy in turn, samples/s the median \
                 of the rounds and bf16_over_f32 the median of each round's ratio; \
                 activation memory: the rise of live host buffers over one training \
                 forward pass",
        "batch": BATCH,
        "threads": threads,
        "epochs": epochs,
        "bf16_matmul_path": mirra::tensor::bf16_matmul_path(),
        "matmul_bf16": matmul,
        "mirra": rows,
        "torch": torch,
        "torch_unavailable": torch_unavailable,
        "bf16_activation_over_f32": opt(activation_ratio, 3),
        "bf16_over_f32": opt(over_f32, 3),
        "bf16_over_torch_autocast": opt(over_torch, 3),
        "errors": errors,
        "targets": {
            "activation_memory": at_most(TARGET_ACTIVATION_RATIO, activation_ratio, 3),
            "bf16_over_f32": at_least(TARGET_OVER_F32, over_f32, 3),
            "bf16_over_torch": at_least(1.0, over_torch, 3),
        },
    })
}

/// The median of `v` (`None` when empty).
fn median(v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| crate::timing::median(&v))
}

/// One policy's model under training, its activation bytes, and the samples/s of each
/// timed epoch.
struct Run {
    policy: Policy,
    model: mirra::train::Model,
    activation: usize,
    epochs: usize,
    rates: Vec<f64>,
    last_loss: f64,
}

impl Run {
    /// The model compiled under `policy`, the bytes one training forward pass keeps for
    /// backward, and one epoch of warm-up.
    fn start(policy: Policy, data: &mirra::data::Dataset) -> Result<Run, String> {
        let mut model = mnist_train::compile_model_as("cnn", None, policy)?;
        // One batch forward, its tape kept: the bytes it holds for backward.
        let mut batch = data
            .iter_epoch(0)
            .map_err(|e| e.to_string())?
            .next()
            .ok_or("no batch")?
            .map_err(|e| e.to_string())?;
        let (Some(_), Some(x)) = (batch.pop(), batch.pop()) else {
            return Err("a batch without images and labels".into());
        };
        let tape = Tape::new();
        let before = live_bytes();
        let out = model
            .net_mut()
            .forward(&tape, x, true, Examples::default())
            .map_err(|e| e.to_string())?;
        let activation = live_bytes().saturating_sub(before);
        drop(out);
        drop(tape);
        let warm_up = mnist_train::run_epoch(&mut model, data, 0)?;
        Ok(Run {
            policy,
            model,
            activation,
            epochs: 1,
            rates: Vec::new(),
            last_loss: warm_up.loss,
        })
    }

    /// One more timed epoch.
    fn epoch(&mut self, data: &mirra::data::Dataset) -> Result<(), String> {
        let e = mnist_train::run_epoch(&mut self.model, data, self.epochs)?;
        self.epochs += 1;
        self.rates.push(e.samples as f64 / e.seconds);
        self.last_loss = e.loss;
        Ok(())
    }

    /// The row: the median samples/s of the timed epochs, each round's, the activation
    /// bytes and the last epoch's loss.
    fn row(&self) -> Value {
        json!({
            "samples_per_sec": opt(median(self.rates.clone()), 0),
            "samples_per_sec_per_round": self.rates.iter().map(|r| num(*r, 0)).collect::<Vec<_>>(),
            "activation_bytes": self.activation,
            "last_epoch_loss": num(self.last_loss, 4),
        })
    }
}

/// The rows as a table.
pub fn print_table(p: &Value) {
    println!();
    if let Some(why) = p["unavailable"].as_str() {
        println!("precision: none ({why})");
        return;
    }
    let mm = &p["matmul_bf16"];
    println!(
        "bf16 matmul at {} ({} threads)  mirra {} GFLOP/s (f32: {})  PyTorch {}  mirra/PyTorch {} (goal >= {}, floor {})  {}",
        bf16_matmul::SIZE,
        cell(&mm["threads"], 0),
        cell(&mm["mirra_bf16_gflops"], 1),
        cell(&mm["mirra_f32_gflops"], 1),
        cell(&mm["torch_bf16_gflops"], 1),
        cell(&mm["mirra_over_torch"], 3),
        bf16_matmul::TARGET,
        bf16_matmul::FLOOR,
        mark(&mm["targets"]["goal"]["met"]),
    );
    if let Some(why) = mm["torch_unavailable"].as_str() {
        println!("  torch unavailable: {why}");
    }
    println!(
        "cnn at batch {BATCH} by policy     samples/s   activation MiB   (bf16 products: {})",
        p["bf16_matmul_path"].as_str().unwrap_or("-")
    );
    let mib = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "-".into(), |b| format!("{:.1}", b / (1u64 << 20) as f64))
    };
    for policy in Policy::ALL {
        let row = &p["mirra"][policy.name()];
        println!(
            "  mirra {:<22} {:>11} {:>16}",
            policy.name(),
            cell(&row["samples_per_sec"], 0),
            mib(&row["activation_bytes"]),
        );
    }
    for autocast in ["float32", "bfloat16"] {
        let row = &p["torch"][autocast];
        println!(
            "  PyTorch autocast {:<11} {:>11} {:>16}",
            autocast,
            cell(&row["samples_per_sec"], 0),
            mib(&row["saved_for_backward_bytes"]),
        );
    }
    let t = &p["targets"];
    println!(
        "  bf16 activation / f32: {} (target <= {TARGET_ACTIVATION_RATIO})  {}",
        cell(&p["bf16_activation_over_f32"], 3),
        mark(&t["activation_memory"]["met"])
    );
    println!(
        "  bf16 / mirra f32: {} (target >= {TARGET_OVER_F32})  {};  bf16 / PyTorch autocast: {} (target >= 1)  {}",
        cell(&p["bf16_over_f32"], 3),
        mark(&t["bf16_over_f32"]["met"]),
        cell(&p["bf16_over_torch_autocast"], 3),
        mark(&t["bf16_over_torch"]["met"])
    );
    if let Some(why) = p["torch_unavailable"].as_str() {
        println!("  torch unavailable: {why}");
    }
}
