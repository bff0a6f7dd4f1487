//! PyTorch training the same MNIST models on the same data the same way, in a `python3`
//! subprocess, for comparison with mirra's training in the same run.
//!
//! The same model (the MLP: Flatten -> Linear 784x128 -> ReLU -> Linear 128x64 -> ReLU ->
//! Linear 64x10; the CNN: Conv2d 1->32 3x3 -> ReLU -> MaxPool 2 -> Conv2d 32->64 3x3 ->
//! ReLU -> MaxPool 2 -> Flatten -> Linear 1600x128 -> ReLU -> Linear 128x10, PyTorch's
//! channels-first layout; cross-entropy on the logits, Adam 1e-3 with its default foreach
//! path), the same
//! MNIST files read from the same folder (the full set when its training files are there,
//! else the test set split 8,000 / 2,000 as mirra splits it), pixels as f32 / 255, a new
//! permutation of the training set per epoch, batches gathered from it, one loss read per
//! step (as mirra's `train_step` returns it), eager mode. Epoch 1 warms up; samples/s is
//! the training examples of the later epochs over their wall time. Threads:
//! `torch.set_num_threads(n)`, one inter-op thread.
//!
//! On a CUDA device (`device` "cuda:N") the model lives there and each batch is gathered
//! on the host and copied over, as mirra's pipeline does; TF32 is off (mirra's default).
//! The peak device memory of each batch size's training is `max_memory_allocated` from a
//! reset taken before the model is made, less cuBLAS's workspaces (which PyTorch takes
//! from its caching allocator, one per handle: the backward's thread has its own, and
//! mirra's allocator never sees them), measured as what stays allocated once the model,
//! optimizer and last batch are freed. (One small matmul's workspace, subtracted instead,
//! left the backward's 32 MiB in PyTorch's peak on the first H200 run.)

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// The script: argv = data_dir threads epochs seed batch[,batch...] device [model
/// [autocast]]; prints one JSON line. `autocast` (`bfloat16`, `float16`) trains under
/// `torch.autocast` in that dtype and also reports the bytes the autograd graph saves for
/// backward in one training forward pass (`saved_tensors_hooks`, storages counted once).
const SCRIPT: &str = r#"
import gzip, json, os, sys, time
data_dir, threads, epochs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
batches = [int(b) for b in sys.argv[5].split(",")]
device = sys.argv[6]
model_name = sys.argv[7] if len(sys.argv) > 7 else "mlp"
autocast = sys.argv[8] if len(sys.argv) > 8 else "float32"
try:
    import torch
    from torch import nn
except Exception as e:
    print(json.dumps({"error": "torch does not import: %s" % e}), flush=True)
    sys.exit(0)
torch.set_num_threads(threads)
try:
    torch.set_num_interop_threads(1)
except RuntimeError:
    pass

def find(name):
    dotted = name.replace("-idx", ".idx", 1)
    for n in (name, name + ".gz", dotted, dotted + ".gz"):
        p = os.path.join(data_dir, n)
        if os.path.isfile(p):
            return p
    return None

def idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=4 + 4 * ndim).reshape(dims)

train_images, train_labels = find("train-images-idx3-ubyte"), find("train-labels-idx1-ubyte")
if train_images and train_labels:
    images, labels = idx(train_images), idx(train_labels)
    source = "full"
else:
    images, labels = idx(find("t10k-images-idx3-ubyte")), idx(find("t10k-labels-idx1-ubyte"))
    n_train = len(images) * 4 // 5
    images, labels = images[:n_train], labels[:n_train]
    source = "test set split"
x = images.to(torch.float32) / 255.0
y = labels.to(torch.int64)
n = len(x)
dev = torch.device(device)
cuda = dev.type == "cuda"
workspace = 0
if cuda:
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}), flush=True)
        sys.exit(0)
    torch.backends.cuda.matmul.allow_tf32 = False
class Block(nn.Module):
    # A basic block as mirra's resnet20 builds it: two 3x3 convolutions with batch norm,
    # a 1x1 projection shortcut with batch norm where the shape changes.
    def __init__(self, cin, cout, stride):
        super().__init__()
        bn = lambda c: nn.BatchNorm2d(c, eps=1e-3, momentum=0.01)
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), bn(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), bn(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), bn(cout))
    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(h)) + self.short(x))

def resnet20():
    layers = [nn.Unflatten(1, (1, 28)), nn.Conv2d(1, 16, 3, 1, 1, bias=False),
              nn.BatchNorm2d(16, eps=1e-3, momentum=0.01), nn.ReLU()]
    cin = 16
    for stage, cout in enumerate([16, 32, 64]):
        for block in range(3):
            layers.append(Block(cin, cout, 2 if stage > 0 and block == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)

import contextlib
def precision():
    if autocast == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=dev.type, dtype=getattr(torch, autocast))

def saved_bytes(model, xb, yb):
    storages = {}
    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with precision():
            loss = loss_fn(model(xb), yb)
    del loss
    return sum(storages.values())

results = {}
for b in batches:
    torch.manual_seed(seed)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
    if model_name == "resnet20":
        model = resnet20().to(dev)
    elif model_name == "cnn":
        model = nn.Sequential(nn.Unflatten(1, (1, 28)), nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Linear(1600, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed)
    seconds = []
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=g)
        t0 = time.perf_counter()
        for i in range(0, n, b):
            idx_b = perm[i:i + b]
            xb, yb = x[idx_b].to(dev), y[idx_b].to(dev)
            opt.zero_grad(set_to_none=True)
            with precision():
                loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            last = loss.item()
        seconds.append(time.perf_counter() - t0)
    timed = seconds[1:]
    results[str(b)] = {"samples_per_sec": n * len(timed) / sum(timed), "epoch_seconds": seconds, "last_loss": last,
                       "saved_for_backward_bytes": saved_bytes(model, x[:b].to(dev), y[:b].to(dev))}
    del model, opt, xb, yb, loss
    if cuda:
        import gc
        gc.collect()
        torch.cuda.synchronize()
        left = torch.cuda.memory_allocated(dev)  # cuBLAS's workspaces: nothing else is alive
        workspace = max(workspace, left)
        results[str(b)]["peak_device_bytes"] = torch.cuda.max_memory_allocated(dev) - left
        results[str(b)]["cublas_workspace_bytes"] = left
        results[str(b)]["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
print(json.dumps({"torch_version": torch.__version__, "threads": torch.get_num_threads(), "model": model_name,
                  "autocast": autocast,
                  "peak_rss_bytes": peak_rss_bytes(),
                  "train_examples": n, "source": source, "device": device,
                  "cublas_workspace_bytes": workspace, "results": results}), flush=True)
"#;

/// PyTorch's samples/s per batch size on `device` ("cpu" or "cuda:N"), or why there are
/// none. `epochs` includes the warm-up epoch.
pub fn measure(
    data_dir: &Path,
    threads: usize,
    epochs: usize,
    seed: u64,
    batches: &[usize],
    device: &str,
) -> Result<Value, String> {
    measure_model("mlp", data_dir, threads, epochs, seed, batches, device)
}

/// [`measure`] for the model `name` (`mlp`, `cnn` or `resnet20`).
pub fn measure_model(
    name: &str,
    data_dir: &Path,
    threads: usize,
    epochs: usize,
    seed: u64,
    batches: &[usize],
    device: &str,
) -> Result<Value, String> {
    measure_autocast(
        name, data_dir, threads, epochs, seed, batches, device, "float32",
    )
}

/// [`measure_model`] under `torch.autocast` in `autocast` (`float32`: none, `bfloat16`,
/// `float16`), with the bytes saved for backward of one training forward pass.
#[allow(clippy::too_many_arguments)]
pub fn measure_autocast(
    name: &str,
    data_dir: &Path,
    threads: usize,
    epochs: usize,
    seed: u64,
    batches: &[usize],
    device: &str,
    autocast: &str,
) -> Result<Value, String> {
    let list: Vec<String> = batches.iter().map(usize::to_string).collect();
    let args = [
        data_dir.as_os_str().to_owned(),
        threads.to_string().into(),
        epochs.to_string().into(),
        seed.to_string().into(),
        list.join(",").into(),
        device.into(),
        name.into(),
        autocast.into(),
    ];
    run_script(SCRIPT, &args, Some(threads)).map_err(|e| format!("{e} (pip install torch)"))
}

/// Defined before every script [`run_script`] runs: `peak_rss_bytes()`, the process's own
/// peak resident memory (`VmHWM`), `None` where the kernel does not report it.
///
/// Not `ru_maxrss`: on Linux an exec'd process's starts at its parent's high-water mark, so
/// after xtask had trained ResNet-20 in-process PyTorch's "peak" read xtask's 1,268 MiB
/// (2026-12-05).
const PRELUDE: &str = r#"
def peak_rss_bytes():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
"#;

/// Runs `script` with `python3 -c` and `args` (with `threads`, as OpenMP's and MKL's thread
/// counts), [`PRELUDE`] defined: the last JSON line it printed ([`last_json_line`]).
pub fn run_script(
    script: &str,
    args: &[OsString],
    threads: Option<usize>,
) -> Result<Value, String> {
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(format!("{PRELUDE}{script}"))
        .args(args)
        .stdin(Stdio::null());
    if let Some(t) = threads {
        cmd.env("OMP_NUM_THREADS", t.to_string())
            .env("MKL_NUM_THREADS", t.to_string());
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    last_json_line(&out.stdout, &out.stderr, &out.status.to_string())
}

/// The last line of a script's `stdout` that is a JSON object, as a value; the object's
/// `error` as an error, and no such line as an error quoting `stderr`'s last line.
pub fn last_json_line(stdout: &[u8], stderr: &[u8], status: &str) -> Result<Value, String> {
    let text = String::from_utf8_lossy(stdout);
    let Some(line) = text.lines().rev().find(|l| l.starts_with('{')) else {
        let err = String::from_utf8_lossy(stderr);
        return Err(format!(
            "the PyTorch script printed no result ({status}): {}",
            err.lines().last().unwrap_or("")
        ));
    };
    let v: Value = serde_json::from_str(line).map_err(|e| format!("bad JSON from python: {e}"))?;
    match v.get("error").and_then(Value::as_str) {
        Some(e) => Err(e.to_string()),
        None => Ok(v),
    }
}

/// Samples/s at `batch` from [`measure`]'s JSON.
pub fn samples_per_sec(v: &Value, batch: usize) -> Option<f64> {
    v["results"][batch.to_string()]["samples_per_sec"].as_f64()
}

/// Peak device bytes at `batch` (cuBLAS's workspace excluded) from [`measure`]'s JSON on a
/// CUDA device.
pub fn peak_device_bytes(v: &Value, batch: usize) -> Option<f64> {
    v["results"][batch.to_string()]["peak_device_bytes"].as_f64()
}

/// Peak bytes PyTorch's allocator held from the device at `batch` (its segments, cuBLAS's
/// workspaces included) from [`measure`]'s JSON on a CUDA device.
pub fn peak_reserved_bytes(v: &Value, batch: usize) -> Option<f64> {
    v["results"][batch.to_string()]["peak_reserved_bytes"].as_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peak a script reports is its own: this process touches 256 MiB first, which an
    /// `ru_maxrss` read in the child would include.
    #[test]
    fn a_scripts_peak_is_its_own() {
        if !crate::numpy::can_import("json") {
            eprintln!("skipped: python3 is missing");
            return;
        }
        let held = vec![1u8; 256 << 20];
        let v = run_script(
            "import json\nprint(json.dumps({'peak': peak_rss_bytes()}))",
            &[],
            None,
        )
        .unwrap();
        assert_eq!(
            held.iter()
                .step_by(4096)
                .map(|&b| b as usize)
                .sum::<usize>(),
            65536
        );
        let peak = v["peak"].as_f64().expect("Linux reports VmHWM");
        assert!(peak > 1e6 && peak < (128 << 20) as f64, "{peak} bytes");
    }

    #[test]
    fn results_are_read_per_batch() {
        let v: Value = serde_json::from_str(
            r#"{"results": {"64": {"samples_per_sec": 55000.5}, "256": {"samples_per_sec": 180000}}}"#,
        )
        .unwrap();
        assert_eq!(samples_per_sec(&v, 64), Some(55000.5));
        assert_eq!(samples_per_sec(&v, 256), Some(180000.0));
        assert_eq!(samples_per_sec(&v, 128), None);
    }
}
