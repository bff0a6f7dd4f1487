//! ResNet-50 training throughput on synthetic ImageNet-shaped batches (224x224x3, 1000
//! classes), as `mirra train --model resnet50` trains it, beside PyTorch eager on the same
//! network (torchvision's v1.5 layout written out, channels first, BatchNorm2d with
//! Keras's momentum and epsilon) with the same batch, threads and optimizer (Adam 1e-3,
//! cross-entropy on the logits). One warm-up step, then `steps` timed steps on one batch:
//! images/s is what a step costs, whatever the pixels show.

use std::ffi::OsString;
use std::time::Instant;

use mirra::data::{pixels_to_unit_f32, synthetic_images};
use mirra::models::{input_shape, resnet50, Options, SYNTHETIC_CLASSES};
use mirra::nn::loss::SparseCategoricalCrossentropy;
use mirra::optim::Adam;
use mirra::train::Model;
use serde_json::{json, Value};

use crate::json::{num, opt};
use crate::torch_train::run_script;

/// Seconds of each of `steps` training steps of mirra's ResNet-50 at `batch`, after one
/// warm-up step.
fn mirra_step_seconds(batch: usize, steps: usize) -> Result<Vec<f64>, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let image = input_shape("resnet50");
    let data = synthetic_images(batch, &image, SYNTHETIC_CLASSES, 1).map_err(|e| err(&e))?;
    let batch_tensors = pixels_to_unit_f32(vec![data.pixels, data.labels]).map_err(|e| err(&e))?;
    let mut net = resnet50(Options::default());
    net.build(&image, 1).map_err(|e| err(&e))?;
    let mut model = Model::compile(
        net,
        Box::new(Adam::new(1e-3)),
        Box::new(SparseCategoricalCrossentropy::default()),
        vec![],
        1,
    );
    let (x, y) = (&batch_tensors[0], &batch_tensors[1]);
    let mut seconds = Vec::with_capacity(steps);
    for step in 0..=steps {
        let t = Instant::now();
        let loss = model.train_step(x.clone(), y).map_err(|e| err(&e))?.loss;
        if !loss.is_finite() {
            return Err(format!("step {step}: loss {loss}"));
        }
        if step > 0 {
            seconds.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(seconds)
}

const SCRIPT: &str = r#"
import json, sys, time
try:
    import torch
    from torch import nn
except Exception as e:
    print(json.dumps({"error": "torch does not import: %s" % e}), flush=True)
    sys.exit(0)
threads, batch, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(1)
bn = lambda c: nn.BatchNorm2d(c, eps=1e-3, momentum=0.01)
class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), bn(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), bn(width), nn.ReLU(),
            nn.Conv2d(width, 4 * width, 1, bias=False), bn(4 * width))
        self.short = nn.Sequential()
        if stride != 1 or cin != 4 * width:
            self.short = nn.Sequential(nn.Conv2d(cin, 4 * width, 1, stride, bias=False), bn(4 * width))
    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))
layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), bn(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
cin = 64
for stage, (blocks, width) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)]):
    for b in range(blocks):
        layers.append(Bottleneck(cin, width, 2 if stage > 0 and b == 0 else 1))
        cin = 4 * width
layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
model = nn.Sequential(*layers)
params = sum(p.numel() for p in model.parameters())
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
x = torch.rand(batch, 3, 224, 224)
y = torch.randint(0, 1000, (batch,))
seconds = []
for step in range(steps + 1):
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    loss.item()
    if step > 0:
        seconds.append(time.perf_counter() - t)
print(json.dumps({"torch_version": torch.__version__, "params": params, "seconds": seconds,
                  "peak_rss_bytes": peak_rss_bytes()}), flush=True)
"#;

/// The section: images/s of mirra and PyTorch at `batch`, `steps` timed steps each.
pub fn section(threads: usize, batch: usize, steps: usize, no_torch: bool) -> Value {
    mirra::tensor::set_num_threads(threads);
    println!("resnet50: mirra, batch {batch}, {steps} timed steps, {threads} threads");
    let ours = mirra_step_seconds(batch, steps);
    let torch = if no_torch {
        Err("skipped (--no-torch)".to_string())
    } else {
        println!("resnet50: PyTorch");
        let args: Vec<OsString> = vec![
            threads.to_string().into(),
            batch.to_string().into(),
            steps.to_string().into(),
        ];
        run_script(SCRIPT, &args, Some(threads)).and_then(|v| match v["seconds"].as_array() {
            Some(a) => Ok((a.iter().filter_map(Value::as_f64).collect::<Vec<f64>>(), v)),
            None => Err(v["error"].as_str().unwrap_or("no figures").to_string()),
        })
    };
    let rate =
        |s: &[f64]| (!s.is_empty()).then(|| (batch * s.len()) as f64 / s.iter().sum::<f64>());
    let mirra_rate = ours.as_ref().ok().and_then(|s| rate(s));
    let torch_rate = torch.as_ref().ok().and_then(|(s, _)| rate(s));
    json!({
        "what": "ResNet-50 (25,557,032 parameters) training steps on one synthetic batch of \
                 224x224x3 images (1000 classes), Adam 1e-3, after one warm-up step; PyTorch \
                 eager the same network (channels first) the same way",
        "threads": threads,
        "batch": batch,
        "timed_steps": steps,
        "mirra_step_seconds": ours.as_ref().map(|s| s.iter().map(|x| num(*x, 3)).collect::<Vec<_>>()).ok(),
        "mirra_images_per_sec": opt(mirra_rate, 2),
        "torch_images_per_sec": opt(torch_rate, 2),
        "mirra_over_torch": opt(mirra_rate.zip(torch_rate).map(|(a, b)| a / b), 3),
        "torch_params": torch.as_ref().ok().map(|(_, v)| v["params"].clone()),
        "torch_version": torch.as_ref().ok().map(|(_, v)| v["torch_version"].clone()),
        "torch_peak_rss_mib": torch.as_ref().ok().and_then(|(_, v)| v["peak_rss_bytes"].as_f64()).map(|b| num(b / (1 << 20) as f64, 0)),
        "error": ours.err(),
        "torch_unavailable": torch.err(),
    })
}

/// Prints the section as a table.
pub fn print(c: &Value) {
    use crate::table::cell;
    println!();
    println!(
        "{:<30} {:>10} {:>10} {:>8}",
        format!("resnet50 batch {} (images/s)", c["batch"]),
        "mirra",
        "PyTorch",
        "ours/pt"
    );
    println!(
        "{:<30} {:>10} {:>10} {:>8}",
        "  synthetic 224x224x3",
        cell(&c["mirra_images_per_sec"], 2),
        cell(&c["torch_images_per_sec"], 2),
        cell(&c["mirra_over_torch"], 2),
    );
}
