//! `cargo xtask bench --device cuda:N`: issue 14's GPU figures, each beside what it is held
//! against, measured in the same run on the same GPU.
//!
//! - `memory`: element-wise kernels (`add`: two arrays read, one written; `relu`: one
//!   read, one written) and the fused Adam update (parameter, gradient and both moments
//!   read; parameter and moments written) over 64M f32, as bytes read plus written per
//!   second, against the device copy (`cuMemcpyDtoD`) counted the same way in the same run.
//!   Target: at least 0.8 of the copy. PyTorch's same ops beside (its Adam on its default
//!   foreach path, counted with the same seven arrays).
//! - `matmul`: `Tensor::matmul` in bf16 at 8192 and f32 at 4096 (TF32 off, then on)
//!   against cuBLAS called directly (`Runtime::gemm`, no tensor layer) on the same operands.
//!   Target: bf16 within 10% of cuBLAS. PyTorch's `torch.mm` beside.
//! - `mlp`: the MNIST MLP trained as `mirra train` trains it ([`mlp`]: the recipe's pipeline,
//!   each batch converted on the host and copied over; epoch 1 warms up) at batch 256 and
//!   4096, against PyTorch eager training it the same way on the same GPU
//!   ([`torch_mlp`]); at 4096 also against mirra on this machine's CPU with 2 threads.
//!   Targets: at least PyTorch's samples/s at both batch sizes, at least 5x the CPU at
//!   4096, and peak device memory (our allocator's peak of bytes in use, against PyTorch's
//!   `max_memory_allocated`, cuBLAS's workspace excluded on both) no more than PyTorch's.
//!
//! Timing: wall time of `iters` calls between two synchronizations of the stream, the
//! median of 5 such repeats, after 2 calls of warm-up, each figure in alternating repeats
//! with the one it is divided by (the copy; cuBLAS direct); at 64M elements one call moves
//! 0.5 to 1.8 GB, so launch and host overheads are below a percent. What a user's program pays
//! per call (allocating the result from the cache, dispatch) is inside the timing.
//!
//! Everything lands in `target/bench/gpu.json` (or `--out`), and the table, in markdown,
//! on stdout and beside the JSON (`.md`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use mirra::data::Mnist;
use mirra::optim::{Adam, Optimizer};
use mirra::tensor::init::{rng, Initializer};
use mirra::tensor::{set_num_threads, DType, Device, Tensor};
use mirra_cuda::runtime::{runtime, set_allow_tf32, Gemm, GemmType, Runtime};
use serde_json::{json, Map, Value};

use crate::json::{at_least, at_most, num, opt, save, write_bytes_atomic};
use crate::timing::median;
use crate::{machine, mnist_train, torch_train, Failure};

/// Elements of the memory-bound kernels (64M f32: 256 MiB an array).
const ELEMENTS: usize = 64 << 20;
/// The element-wise kernels' and Adam's rate over the device copy's.
pub const TARGET_VS_COPY: f64 = 0.8;
/// bf16 matmul through `Tensor::matmul` over cuBLAS called directly.
pub const TARGET_MATMUL_VS_CUBLAS: f64 = 0.9;
/// MLP batch sizes.
pub const BATCHES: [usize; 2] = [256, 4096];
/// The GPU's MLP samples/s over mirra's on this machine's CPU with [`CPU_THREADS`], at
/// batch 4096.
pub const TARGET_VS_CPU: f64 = 5.0;
/// Threads of the CPU side of [`TARGET_VS_CPU`].
pub const CPU_THREADS: usize = 2;
/// Timed repeats per figure.
const REPEATS: usize = 5;

/// What the command was asked for.
pub struct GpuBench {
    /// The device's ordinal.
    pub ordinal: usize,
    /// Smaller sizes and fewer epochs: a smoke test, not a measurement.
    pub quick: bool,
    /// Leave PyTorch out.
    pub no_torch: bool,
    /// Where the JSON goes.
    pub out: PathBuf,
}

/// Runs the GPU benchmark, prints its table and writes the report.
pub fn run(b: &GpuBench) -> Result<(), Failure> {
    let started = Instant::now();
    let device = Device::cuda(b.ordinal).map_err(|e| Failure::usage(format!("--device: {e}")))?;
    let rt = runtime(b.ordinal).map_err(|e| Failure::usage(format!("--device: {e}")))?;
    let elements = if b.quick { ELEMENTS / 16 } else { ELEMENTS };
    let epochs = if b.quick { 2 } else { 6 };
    let mut report = Map::new();
    report.insert("schema".into(), json!("mirra-bench-gpu/1"));
    report.insert(
        "command".into(),
        json!(format!("cargo xtask bench --device cuda:{}", b.ordinal)),
    );
    report.insert("machine".into(), machine::facts());
    report.insert("device".into(), json!(device.to_string()));
    report.insert("quick".into(), json!(b.quick));

    let torch = if b.no_torch {
        Err("skipped (--no-torch)".to_string())
    } else {
        println!("bench: PyTorch kernels on cuda:{}", b.ordinal);
        torch_kernels(b.ordinal, elements)
    };

    println!("bench: memory-bound kernels over {elements} f32");
    let memory = memory_section(&rt, device, elements, torch.as_ref().ok());
    report.insert("memory".into(), memory);
    println!("bench: matmul");
    let matmul = matmul_section(&rt, device, b.quick, torch.as_ref().ok());
    report.insert("matmul".into(), matmul);
    println!("bench: MLP training");
    let torch_mlp = if b.no_torch {
        Err("skipped (--no-torch)".to_string())
    } else {
        let dev = format!("cuda:{}", b.ordinal);
        let dir = b
            .out
            .parent()
            .unwrap_or(Path::new("."))
            .join("mnist-bundled");
        bundled_mnist(&dir).map_err(Failure::run)?;
        torch_train::measure(
            &dir,
            machine::cores(),
            epochs,
            mnist_train::SEED,
            &BATCHES,
            &dev,
        )
    };
    let mlp = mlp_section(&rt, device, epochs, torch_mlp.as_ref().ok());
    report.insert("mlp".into(), mlp);
    report.insert(
        "torch".into(),
        match (&torch, &torch_mlp) {
            (Ok(k), Ok(m)) => json!({ "version": k["torch"], "device": k["device"],
                                      "cublas_workspace_bytes": m["cublas_workspace_bytes"] }),
            (Err(e), _) | (_, Err(e)) => json!({ "unavailable": e }),
        },
    );
    report.insert("elapsed_s".into(), num(started.elapsed().as_secs_f64(), 1));
    let report = Value::Object(report);
    let table = markdown(&report);
    println!("\n{table}");
    save(&b.out, &report, Some(started))?;
    let md = b.out.with_extension("md");
    write_bytes_atomic(&md, table.as_bytes())
        .map_err(|e| Failure::run(format!("cannot write {}: {e}", md.display())))?;
    Ok(())
}

/// Seconds per call of `f` and of `g`: the median over [`REPEATS`] of `iters` calls between
/// two synchronizations of the stream, after 2 calls of each as warm-up, `f` and `g`
/// alternating (`f` first in even repeats, `g` in odd): a GPU's clocks drift with its
/// temperature and power over seconds, so two figures to be divided are measured in the
/// same stretch.
fn per_call_pair(
    rt: &Runtime,
    iters: usize,
    mut f: impl FnMut() -> Result<(), String>,
    mut g: impl FnMut() -> Result<(), String>,
) -> Result<(f64, f64), String> {
    let sync = || rt.synchronize().map_err(|e| e.to_string());
    let time = |h: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
        let t = Instant::now();
        for _ in 0..iters {
            h()?;
        }
        sync()?;
        Ok(t.elapsed().as_secs_f64() / iters as f64)
    };
    for _ in 0..2 {
        f()?;
        g()?;
    }
    sync()?;
    let (mut fs, mut gs) = (Vec::new(), Vec::new());
    for r in 0..REPEATS {
        if r % 2 == 0 {
            fs.push(time(&mut f)?);
            gs.push(time(&mut g)?);
        } else {
            gs.push(time(&mut g)?);
            fs.push(time(&mut f)?);
        }
    }
    Ok((median(&fs), median(&gs)))
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One row of a section: mirra's figure, PyTorch's, and a target against a reference.
fn row(mirra: Result<f64, String>, torch: Option<f64>, digits: i32) -> Value {
    match mirra {
        Ok(m) => json!({ "mirra": num(m, digits), "torch": opt(torch, digits),
                         "mirra_over_torch": opt(torch.map(|t| m / t), 3) }),
        Err(e) => json!({ "mirra": null, "error": e, "torch": opt(torch, digits) }),
    }
}

/// The memory-bound kernels against the device copy.
fn memory_section(rt: &Arc<Runtime>, device: Device, n: usize, torch: Option<&Value>) -> Value {
    let iters = 20;
    let gbs = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
    let arrays = |k: usize| k * 4 * n;
    let full = |v: f64| Tensor::full(&[n], v, DType::F32, device).map_err(err);
    // Each kernel is timed in alternating repeats with the copy (see `per_call_pair`); the
    // copy's figure is the median over all of them.
    let src = full(1.0);
    let mut dst = src
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|s| rt.alloc(s.buffer().size_in_bytes()).map_err(err));
    let mut copies = Vec::new();
    let mut beside_copy = |kernel: &mut dyn FnMut() -> Result<(), String>, bytes: usize| {
        let (src, dst) = (
            src.as_ref().map_err(Clone::clone)?,
            dst.as_mut().map_err(|e| e.clone())?,
        );
        let s = src.buffer().device_memory().ok_or("not on the device")?;
        let (t, c) = per_call_pair(rt, iters, kernel, || dst.copy_from(s).map_err(err))?;
        copies.push(gbs(2 * s.len_bytes(), c));
        Ok::<f64, String>(gbs(bytes, t))
    };
    let add = (|| {
        let (x, y) = (full(1.0)?, full(2.0)?);
        beside_copy(&mut || x.add(&y).map(drop).map_err(err), arrays(3))
    })();
    let relu = (|| {
        let x = full(-1.0)?;
        beside_copy(&mut || x.relu().map(drop).map_err(err), arrays(2))
    })();
    let adam = (|| {
        let mut opt = Adam::new(1e-3);
        let mut p = vec![full(0.5)?];
        let g = vec![full(0.01)?];
        beside_copy(&mut || opt.step(&mut p, &g).map_err(err), arrays(7))
    })();
    let copy = if copies.is_empty() {
        Err("the copy was not measured".to_string())
    } else {
        Ok(median(&copies))
    };
    let t = |k: &str| torch.and_then(|v| v["figures"][k].as_f64());
    let copy_rate = copy.as_ref().ok().copied();
    let mut targets = Map::new();
    let mut rows = Map::new();
    for (name, r, tk) in [
        ("add", add, "add_gbs"),
        ("relu", relu, "relu_gbs"),
        ("adam", adam, "adam_gbs"),
    ] {
        let ratio = r.as_ref().ok().zip(copy_rate).map(|(m, c)| m / c);
        targets.insert(
            format!("{name}_vs_copy"),
            at_least(TARGET_VS_COPY, ratio, 3),
        );
        let mut v = row(r, t(tk), 1);
        v["mirra_over_copy"] = opt(ratio, 3);
        v["torch_over_torch_copy"] = opt(t(tk).zip(t("copy_gbs")).map(|(a, c)| a / c), 3);
        rows.insert(name.into(), v);
    }
    rows.insert("copy".into(), row(copy, t("copy_gbs"), 1));
    json!({
        "what": "bytes read plus written per second (GB/s) over f32 arrays, the device copy \
                 (cuMemcpyDtoD) counted the same way; Adam: 4 arrays read, 3 written",
        "elements": n,
        "gbs": rows,
        "targets": targets,
    })
}

/// `Tensor::matmul` against cuBLAS on the same operands.
fn matmul_section(rt: &Arc<Runtime>, device: Device, quick: bool, torch: Option<&Value>) -> Value {
    let (big, small) = if quick { (2048, 1024) } else { (8192, 4096) };
    let cases = [
        (
            "bf16",
            DType::BF16,
            GemmType::Bf16,
            big,
            false,
            "gemm_bf16_tflops",
        ),
        (
            "f32",
            DType::F32,
            GemmType::F32,
            small,
            false,
            "gemm_f32_tflops",
        ),
        (
            "tf32",
            DType::F32,
            GemmType::F32,
            small,
            true,
            "gemm_tf32_tflops",
        ),
    ];
    let mut rows = Map::new();
    let mut targets = Map::new();
    for (name, dtype, gemm_type, n, tf32, tk) in cases {
        set_allow_tf32(tf32);
        let measured = (|| -> Result<(f64, f64), String> {
            let random = |seed| -> Result<Tensor, String> {
                Initializer::Uniform {
                    low: -1.0,
                    high: 1.0,
                }
                .init(&[n, n], DType::F32, Device::Cpu, &mut rng(seed))
                .and_then(|t| t.to_dtype(dtype))
                .and_then(|t| t.to_device(device))
                .map_err(err)
            };
            let (a, b) = (random(1)?, random(2)?);
            let flops = 2.0 * (n as f64).powi(3);
            let iters = if quick { 5 } else { 20 };
            let ptr = |t: &Tensor| {
                t.buffer()
                    .device_memory()
                    .map(|d| d.ptr())
                    .ok_or("not on the device")
            };
            let (pa, pb) = (ptr(&a)?, ptr(&b)?);
            let c = rt.alloc(n * n * dtype.size_in_bytes()).map_err(err)?;
            let g = Gemm {
                dtype: gemm_type,
                m: n,
                n,
                k: n,
                batch: 1,
                a_transposed: false,
                lda: n,
                stride_a: 0,
                b_transposed: false,
                ldb: n,
                stride_b: 0,
            };
            let (ours, direct) = per_call_pair(
                rt,
                iters,
                || a.matmul(&b).map(drop).map_err(err),
                // SAFETY: a and b are n x n tensors of `dtype` on this device, contiguous
                // from their buffers' start; c holds n x n elements.
                || unsafe { rt.gemm(&g, pa, pb, c.ptr()) }.map_err(err),
            )?;
            Ok((flops / ours / 1e12, flops / direct / 1e12))
        })();
        set_allow_tf32(false);
        let torch_t = torch.and_then(|v| v["figures"][tk].as_f64());
        let (ours, cublas) = match measured {
            Ok((o, c)) => (Ok(o), Some(c)),
            Err(e) => (Err(e), None),
        };
        let ratio = ours.as_ref().ok().zip(cublas).map(|(o, c)| o / c);
        let mut v = row(ours, torch_t, 1);
        v["size"] = json!(n);
        v["cublas_direct"] = opt(cublas, 1);
        v["mirra_over_cublas"] = opt(ratio, 3);
        if name == "bf16" {
            targets.insert(
                "bf16_vs_cublas".into(),
                at_least(TARGET_MATMUL_VS_CUBLAS, ratio, 3),
            );
        }
        rows.insert(name.into(), v);
    }
    json!({
        "what": "TFLOP/s of one n x n x n product (2 n^3 flops); cuBLAS direct: \
                 cublasGemmStridedBatchedEx on the same operands without the tensor layer",
        "tflops": rows,
        "targets": targets,
    })
}

/// MLP training on the GPU against PyTorch on the GPU and mirra on the CPU.
fn mlp_section(rt: &Arc<Runtime>, device: Device, epochs: usize, torch: Option<&Value>) -> Value {
    let mnist = match Mnist::bundled() {
        Ok(m) => m,
        Err(e) => return json!({ "unavailable": format!("cannot load MNIST: {e}") }),
    };
    let mut rows = Map::new();
    let mut targets = Map::new();
    for batch in BATCHES {
        println!("mlp: batch {batch} on {device}");
        let gpu = (|| -> Result<(mnist_train::Epochs, f64, f64), String> {
            set_num_threads(machine::cores());
            let mut model = mnist_train::compile(None)?;
            // What this training holds, not what the sections before it left cached.
            rt.empty_cache().map_err(err)?;
            rt.reset_peak_memory();
            model.to_device(device).map_err(err)?;
            let data = mirra::recipe::train_pipeline(
                &mnist.train,
                mirra::recipe::Examples::InMemory,
                batch,
                mnist_train::SEED,
            )
            .map_err(err)?;
            let e = mnist_train::train_epochs(&mut model, &data, epochs, 1)?;
            rt.synchronize().map_err(err)?;
            let m = rt.memory_stats();
            Ok((e, m.peak_in_use as f64, m.peak_reserved as f64))
        })();
        let cpu = (batch == 4096).then(|| {
            println!("mlp: batch {batch} on the CPU, {CPU_THREADS} threads");
            let r =
                mnist_train::measure(&mnist, batch, CPU_THREADS, epochs).map(|e| e.samples_per_sec);
            set_num_threads(machine::cores());
            r
        });
        let t = torch.and_then(|v| torch_train::samples_per_sec(v, batch));
        let t_peak = torch.and_then(|v| torch_train::peak_device_bytes(v, batch));
        let (rate, peak, held, loss) = match &gpu {
            Ok((e, p, h)) => (Ok(e.samples_per_sec), Some(*p), Some(*h), Some(e.last_loss)),
            Err(e) => (Err(e.clone()), None, None, None),
        };
        let mib = |b: Option<f64>| opt(b.map(|b| b / (1 << 20) as f64), 2);
        let m = rate.as_ref().ok().copied();
        let cpu_rate = cpu.as_ref().and_then(|r| r.as_ref().ok().copied());
        let mut v = row(rate, t, 0);
        v["last_epoch_loss"] = opt(loss, 4);
        v["peak_device_mib"] = mib(peak);
        v["torch_peak_device_mib"] = mib(t_peak);
        // What each allocator held from the device (ours: its size classes; PyTorch's: its
        // segments, cuBLAS's workspaces among them): reported, not a target.
        v["peak_reserved_mib"] = mib(held);
        v["torch_peak_reserved_mib"] =
            mib(torch.and_then(|v| torch_train::peak_reserved_bytes(v, batch)));
        if let Some(c) = &cpu {
            v["cpu_2_threads"] = match c {
                Ok(c) => num(*c, 0),
                Err(e) => json!({ "error": e }),
            };
            let r = m.zip(cpu_rate).map(|(m, c)| m / c);
            v["gpu_over_cpu"] = opt(r, 2);
            targets.insert(
                format!("vs_cpu_batch_{batch}"),
                at_least(TARGET_VS_CPU, r, 2),
            );
        }
        let r = m.zip(t).map(|(m, t)| m / t);
        targets.insert(format!("vs_torch_batch_{batch}"), at_least(1.0, r, 3));
        let r = peak.zip(t_peak).map(|(p, t)| p / t);
        targets.insert(
            format!("peak_memory_vs_torch_batch_{batch}"),
            at_most(1.0, r, 3),
        );
        rows.insert(batch.to_string(), v);
    }
    json!({
        "what": "samples/s of the MNIST MLP trained as `mirra train` trains it (bundled data, \
                 8,000 examples, epoch 1 warms up); PyTorch eager the same way on the same GPU; \
                 peak device memory of bytes in use, cuBLAS's workspace excluded",
        "epochs": epochs,
        "batches": rows,
        "targets": targets,
    })
}

/// The bundled MNIST files written into `dir` for PyTorch to read (the bundle carries no
/// data folder; mirra reads the same bytes from inside its library). Beside the report and
/// rewritten each run, not a new temporary folder per run.
fn bundled_mnist(dir: &Path) -> Result<(), String> {
    for (name, bytes) in mirra::data::bundled_files() {
        write_bytes_atomic(&dir.join(name), bytes)
            .map_err(|e| format!("cannot write {}: {e}", dir.join(name).display()))?;
    }
    Ok(())
}

/// PyTorch's figures for the memory-bound kernels and the matmuls, timed the same way.
const TORCH_KERNELS: &str = r#"
import json, sys, time
ordinal, n, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
try:
    import torch
except Exception as e:
    print(json.dumps({"error": "torch does not import: %s" % e}), flush=True)
    sys.exit(0)
if not torch.cuda.is_available():
    print(json.dumps({"error": "torch sees no CUDA device"}), flush=True)
    sys.exit(0)
dev = torch.device("cuda", ordinal)
def per_call(f, iters):
    f(); f(); torch.cuda.synchronize(dev)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            f()
        torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t) / iters)
    times.sort()
    return times[len(times) // 2]
fig = {}
x = torch.full((n,), 1.0, device=dev); y = torch.full((n,), 2.0, device=dev)
d = torch.empty_like(x)
fig["copy_gbs"] = 2 * 4 * n / per_call(lambda: d.copy_(x), 20) / 1e9
fig["add_gbs"] = 3 * 4 * n / per_call(lambda: torch.add(x, y), 20) / 1e9
fig["relu_gbs"] = 2 * 4 * n / per_call(lambda: torch.relu(x), 20) / 1e9
p = torch.full((n,), 0.5, device=dev, requires_grad=True)
p.grad = torch.full((n,), 0.01, device=dev)
opt = torch.optim.Adam([p], lr=1e-3)
fig["adam_gbs"] = 7 * 4 * n / per_call(opt.step, 20) / 1e9
del x, y, d, p, opt
big, small = (8192, 4096) if n >= (64 << 20) else (2048, 1024)
for key, dtype, size, tf32 in [("gemm_bf16_tflops", torch.bfloat16, big, False),
                               ("gemm_f32_tflops", torch.float32, small, False),
                               ("gemm_tf32_tflops", torch.float32, small, True)]:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = (torch.rand(size, size, device=dev) * 2 - 1).to(dtype)
    b = (torch.rand(size, size, device=dev) * 2 - 1).to(dtype)
    fig[key] = 2 * size ** 3 / per_call(lambda: torch.mm(a, b), 20 if n >= (64 << 20) else 5) / 1e12
    del a, b
print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(dev),
                  "figures": fig}), flush=True)
"#;

/// Runs [`TORCH_KERNELS`] in `python3`: its JSON, or why there is none.
fn torch_kernels(ordinal: usize, n: usize) -> Result<Value, String> {
    let args = [ordinal, n, REPEATS].map(|a| a.to_string().into());
    torch_train::run_script(TORCH_KERNELS, &args, None)
}

/// The report as one markdown table: each figure, what it is held against, the target.
pub fn markdown(r: &Value) -> String {
    use crate::table::{cell, mark};
    let mut s = format!(
        "### GPU benchmark ({}, PyTorch {})\n\n| part | figure | mirra | reference | ratio | target |\n|---|---|---|---|---|---|\n",
        r["device"].as_str().unwrap_or("?"),
        r["torch"]["version"].as_str().unwrap_or("unavailable")
    );
    let mem = &r["memory"];
    let copy = &mem["gbs"]["copy"];
    s += &format!(
        "| memory | device copy, GB/s (PyTorch's copy beside) | {} | {} | {} | |\n",
        cell(&copy["mirra"], 1),
        cell(&copy["torch"], 1),
        cell(&copy["mirra_over_torch"], 3)
    );
    for k in ["add", "relu", "adam"] {
        let v = &mem["gbs"][k];
        let t = &mem["targets"][format!("{k}_vs_copy")];
        s += &format!(
            "| memory | {k}, GB/s vs mirra's copy (PyTorch {} GB/s, {} of its copy) | {} | {} | {} | >= {TARGET_VS_COPY} {} |\n",
            cell(&v["torch"], 1),
            cell(&v["torch_over_torch_copy"], 2),
            cell(&v["mirra"], 1),
            cell(&copy["mirra"], 1),
            cell(&v["mirra_over_copy"], 3),
            mark(&t["met"])
        );
    }
    for k in ["bf16", "f32", "tf32"] {
        let v = &r["matmul"]["tflops"][k];
        let target = if k == "bf16" {
            format!(
                ">= {TARGET_MATMUL_VS_CUBLAS} {}",
                mark(&r["matmul"]["targets"]["bf16_vs_cublas"]["met"])
            )
        } else {
            String::new()
        };
        s += &format!(
            "| matmul | {k} {}, TFLOP/s vs cuBLAS direct (PyTorch {}) | {} | {} | {} | {target} |\n",
            v["size"],
            cell(&v["torch"], 1),
            cell(&v["mirra"], 1),
            cell(&v["cublas_direct"], 1),
            cell(&v["mirra_over_cublas"], 3)
        );
    }
    let mlp = &r["mlp"];
    for b in BATCHES {
        let v = &mlp["batches"][b.to_string()];
        let t = &mlp["targets"];
        s += &format!(
            "| mlp | batch {b}, samples/s vs PyTorch | {} | {} | {} | >= 1 {} |\n",
            cell(&v["mirra"], 0),
            cell(&v["torch"], 0),
            cell(&v["mirra_over_torch"], 3),
            mark(&t[format!("vs_torch_batch_{b}")]["met"])
        );
        if !v["cpu_2_threads"].is_null() {
            s += &format!(
                "| mlp | batch {b}, samples/s vs mirra on the CPU, {CPU_THREADS} threads | {} | {} | {} | >= {TARGET_VS_CPU} {} |\n",
                cell(&v["mirra"], 0),
                cell(&v["cpu_2_threads"], 0),
                cell(&v["gpu_over_cpu"], 2),
                mark(&t[format!("vs_cpu_batch_{b}")]["met"])
            );
        }
        s += &format!(
            "| mlp | batch {b}, peak device MiB in use vs PyTorch (held: {} vs {}) | {} | {} | {} | <= 1 {} |\n",
            cell(&v["peak_reserved_mib"], 2),
            cell(&v["torch_peak_reserved_mib"], 2),
            cell(&v["peak_device_mib"], 2),
            cell(&v["torch_peak_device_mib"], 2),
            cell(&t[format!("peak_memory_vs_torch_batch_{b}")]["measured"], 3),
            mark(&t[format!("peak_memory_vs_torch_batch_{b}")]["met"])
        );
    }
    if let Some(e) = r["torch"]["unavailable"].as_str() {
        s += &format!("\nPyTorch: {e}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_error_or_silence_is_an_error_and_its_json_a_value() {
        let ok =
            torch_train::last_json_line(b"noise\n{\"figures\": {\"copy_gbs\": 1.5}}\n", b"", "0");
        assert_eq!(ok.unwrap()["figures"]["copy_gbs"], 1.5);
        let e =
            torch_train::last_json_line(b"{\"error\": \"torch sees no CUDA device\"}\n", b"", "0");
        assert_eq!(e.unwrap_err(), "torch sees no CUDA device");
        let e = torch_train::last_json_line(b"", b"Traceback\nNameError: x\n", "exit status: 1")
            .unwrap_err();
        assert!(
            e.contains("NameError: x") && e.contains("exit status: 1"),
            "{e}"
        );
    }

    #[test]
    fn the_table_marks_each_target_met_missed_or_not_measured() {
        let r = json!({
            "device": "cuda:0",
            "torch": { "version": "2.11" },
            "memory": {
                "gbs": { "copy": { "mirra": 4000.0, "torch": 4100.0 },
                         "add": { "mirra": 3600.0, "mirra_over_copy": 0.9 },
                         "adam": { "mirra": 2000.0, "mirra_over_copy": 0.5 } },
                "targets": { "add_vs_copy": { "met": true }, "adam_vs_copy": { "met": false } }
            },
            "matmul": { "tflops": {}, "targets": {} },
            "mlp": { "batches": {}, "targets": {} }
        });
        let t = markdown(&r);
        let line = |k: &str| t.lines().find(|l| l.contains(k)).unwrap().to_string();
        assert!(line("| add,").ends_with(">= 0.8 ok |"), "{t}");
        assert!(line("| adam,").ends_with(">= 0.8 MISSED |"), "{t}");
        assert!(line("| relu,").ends_with(">= 0.8 n/a |"), "{t}");
        assert!(line("bf16").contains("n/a"), "{t}");
    }

    #[test]
    fn without_a_driver_the_gpu_bench_is_one_usage_error() {
        if mirra_cuda::device_count().is_ok() {
            return; // a GPU here: the bundle's run measures it
        }
        let b = GpuBench {
            ordinal: 0,
            quick: true,
            no_torch: true,
            out: std::env::temp_dir().join("mirra-bench-gpu-test.json"),
        };
        let f = run(&b).unwrap_err();
        assert_eq!(f.code, 2);
        assert!(
            f.message.starts_with("--device: no CUDA driver found"),
            "{}",
            f.message
        );
    }
}
