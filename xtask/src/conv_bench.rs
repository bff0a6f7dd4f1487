//! Convolution forward + backward GFLOP/s for the layer shapes of the CLI's models, mirra
//! and PyTorch eager (oneDNN) in the same run, with the same threads (a section of
//! `cargo xtask bench`).
//!
//! One step is what training does with a convolution: the forward pass, then the
//! gradients of the input and of the kernel (the bias is left out: a sum, not a
//! convolution). FLOPs counted: `3 · 2 · N · OH · OW · KH · KW · C_in · C_out` (and `OD ·
//! KD` in 3D), the same count for both, whatever algorithm each uses. Each shape in f32
//! and in bf16 (input and kernel held in bf16, as a `mixed_bfloat16` layer computes;
//! PyTorch's tensors in `torch.bfloat16` likewise). The 3D shapes (the 3D U-Net's first
//! level) run PyTorch in channels-last (`channels_last_3d`): its default layout's backward
//! pass is 3x slower there, and the comparison is against PyTorch at its best.

use std::ffi::OsString;
use std::time::Duration;

use mirra::autograd::Tape;
use mirra::tensor::init::{rng, Initializer};
use mirra::tensor::{set_conv_algorithm, ConvAlgorithm, DType, Device, Padding, Tensor, Window};
use serde_json::{json, Value};

use crate::json::{num, opt};
use crate::timing::{measure, Plan};
use crate::torch_train::run_script;

/// One convolution: input `[batch, spatial.., c_in]`, a kernel of `k` along each spatial
/// dimension, stride, padding.
pub struct ConvShape {
    pub name: &'static str,
    pub batch: usize,
    pub spatial: &'static [usize],
    pub c_in: usize,
    pub c_out: usize,
    pub k: usize,
    pub stride: usize,
    pub same: bool,
}

/// The CNN's two convolutions and three of ResNet-20's, at batch 128, and two of the 3D
/// U-Net's first level (8 filters over 32x56x56 volumes), at batch 2.
pub const SHAPES: [ConvShape; 7] = [
    ConvShape {
        name: "cnn conv1 28x28 1->32 3x3",
        batch: 128,
        spatial: &[28, 28],
        c_in: 1,
        c_out: 32,
        k: 3,
        stride: 1,
        same: false,
    },
    ConvShape {
        name: "cnn conv2 13x13 32->64 3x3",
        batch: 128,
        spatial: &[13, 13],
        c_in: 32,
        c_out: 64,
        k: 3,
        stride: 1,
        same: false,
    },
    ConvShape {
        name: "resnet20 28x28 16->16 3x3",
        batch: 128,
        spatial: &[28, 28],
        c_in: 16,
        c_out: 16,
        k: 3,
        stride: 1,
        same: true,
    },
    ConvShape {
        name: "resnet20 14x14 32->32 3x3",
        batch: 128,
        spatial: &[14, 14],
        c_in: 32,
        c_out: 32,
        k: 3,
        stride: 1,
        same: true,
    },
    ConvShape {
        name: "resnet20 7x7 64->64 3x3",
        batch: 128,
        spatial: &[7, 7],
        c_in: 64,
        c_out: 64,
        k: 3,
        stride: 1,
        same: true,
    },
    ConvShape {
        name: "unet3d 32x56x56 8->8 3x3x3",
        batch: 2,
        spatial: &[32, 56, 56],
        c_in: 8,
        c_out: 8,
        k: 3,
        stride: 1,
        same: true,
    },
    ConvShape {
        name: "unet3d 32x56x56 24->8 3x3x3",
        batch: 2,
        spatial: &[32, 56, 56],
        c_in: 24,
        c_out: 8,
        k: 3,
        stride: 1,
        same: true,
    },
];

impl ConvShape {
    fn window(&self) -> Result<Window, String> {
        let padding = if self.same {
            Padding::Same
        } else {
            Padding::Valid
        };
        let each = |v: usize| vec![v; self.spatial.len()];
        Window::new(
            self.spatial,
            &each(self.k),
            &each(self.stride),
            &each(1),
            padding,
        )
    }

    /// Floating-point operations of one forward + backward step.
    fn flops(&self, window: &Window) -> f64 {
        6.0 * (self.batch * window.positions() * window.taps() * self.c_in * self.c_out) as f64
    }

    /// The input's dimensions, channels last.
    fn input_dims(&self) -> Vec<usize> {
        [&[self.batch], self.spatial, &[self.c_in]].concat()
    }

    /// The kernel's dimensions.
    fn kernel_dims(&self) -> Vec<usize> {
        let mut dims = vec![self.k; self.spatial.len()];
        dims.extend([self.c_in, self.c_out]);
        dims
    }
}

/// The dtypes of the rows, as mirra and PyTorch name them.
const DTYPES: [(DType, &str); 2] = [(DType::F32, "float32"), (DType::BF16, "bfloat16")];

/// A tensor of `dims` in `dtype`, uniform in [-1, 1) from `seed`.
fn uniform(dims: &[usize], dtype: DType, seed: u64) -> Result<Tensor, String> {
    Initializer::Uniform {
        low: -1.0,
        high: 1.0,
    }
    .init(dims, DType::F32, Device::Cpu, &mut rng(seed))
    .and_then(|t| t.to_dtype(dtype))
    .map_err(|e| e.to_string())
}

/// `shape`'s window, input and kernel in `dtype`.
fn operands(shape: &ConvShape, dtype: DType) -> Result<(Window, Tensor, Tensor), String> {
    Ok((
        shape.window()?,
        uniform(&shape.input_dims(), dtype, 1)?,
        uniform(&shape.kernel_dims(), dtype, 2)?,
    ))
}

/// Seconds of each pass of `shape` in `dtype` alone (forward, input gradient, kernel
/// gradient, as the tape calls them), for where a step's time goes.
fn mirra_pass_seconds(shape: &ConvShape, dtype: DType, plan: Plan) -> Result<[f64; 3], String> {
    let err = |e: mirra::tensor::TensorError| e.to_string();
    let (window, x, kernel) = operands(shape, dtype)?;
    let (y, saved) = x.conv(&kernel, &window).map_err(err)?;
    let dy = uniform(y.dims(), dtype, 3)?;
    let forward = measure(plan, || x.conv(&kernel, &window).map(drop))
        .map_err(err)?
        .median();
    let input = measure(plan, || dy.conv_input_grad(&kernel, &window).map(drop))
        .map_err(err)?
        .median();
    let weights = measure(plan, || x.conv_kernel_grad(&dy, &window, &saved).map(drop))
        .map_err(err)?
        .median();
    Ok([forward, input, weights])
}

/// Seconds of one forward + backward step of `shape` in `dtype` in mirra, as `Conv2D`
/// computes it.
fn mirra_step_seconds(shape: &ConvShape, dtype: DType, plan: Plan) -> Result<(f64, f64), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let (window, x, kernel) = operands(shape, dtype)?;
    let tape = Tape::new();
    let step = || -> Result<(), String> {
        let xv = tape.param(x.clone(), 0);
        let kv = tape.param(kernel.clone(), 1);
        let y = xv
            .conv(&kv, &window)
            .and_then(|y| y.sum(&[], false))
            .map_err(|e| err(&e))?;
        let grads = tape.backward(&y).map_err(|e| err(&e))?;
        drop(grads);
        tape.clear();
        Ok(())
    };
    let samples = measure(plan, step)?;
    Ok((samples.median(), shape.flops(&window)))
}

const SCRIPT: &str = r#"
import json, sys, time
try:
    import torch
except Exception as e:
    print(json.dumps({"error": "torch does not import: %s" % e}), flush=True)
    sys.exit(0)
threads, shapes, dtype = int(sys.argv[1]), json.loads(sys.argv[2]), getattr(torch, sys.argv[3])
torch.set_num_threads(threads)
out = []
for s in shapes:
    rank = len(s["spatial"])
    x = torch.rand(s["batch"], s["c_in"], *s["spatial"]).to(dtype)
    w = torch.rand(s["c_out"], s["c_in"], *([s["k"]] * rank)).to(dtype)
    conv = torch.nn.functional.conv2d
    if rank == 3:
        conv = torch.nn.functional.conv3d
        x = x.to(memory_format=torch.channels_last_3d)
        w = w.to(memory_format=torch.channels_last_3d)
    x.requires_grad_()
    w.requires_grad_()
    pad = "same" if s["same"] else 0
    def step():
        y = conv(x, w, stride=s["stride"], padding=pad)
        y.sum().backward()
        x.grad = None
        w.grad = None
    t0 = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - t0 < 0.5:
        step(); n += 1
    per = (time.perf_counter() - t0) / n
    calls = max(1, int(0.3 / per))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            step()
        times.append((time.perf_counter() - t) / calls)
    times.sort()
    out.append(times[len(times) // 2])
print(json.dumps({"torch_version": torch.__version__, "seconds": out}), flush=True)
"#;

/// The section: per shape and dtype, mirra's and PyTorch's GFLOP/s and their ratio.
pub fn section(threads: usize, quick: bool, no_torch: bool) -> Value {
    mirra::tensor::set_num_threads(threads);
    let plan = Plan {
        warm_up: Duration::from_millis(if quick { 100 } else { 500 }),
        repeats: if quick { 3 } else { 5 },
        min_repeat: Duration::from_millis(if quick { 100 } else { 300 }),
    };
    let mut rows = Vec::new();
    let mut torch_unavailable = None;
    for (dtype, name) in DTYPES {
        let mut ours = Vec::new();
        let mut patches = Vec::new();
        let mut passes = Vec::new();
        for s in &SHAPES {
            println!("conv: {} {name} (mirra)", s.name);
            ours.push(mirra_step_seconds(s, dtype, plan));
            passes.push(mirra_pass_seconds(s, dtype, plan));
            // The same step with every convolution through its patches: what the choice
            // of algorithm is worth, in the same run.
            set_conv_algorithm(ConvAlgorithm::Im2col);
            patches.push(mirra_step_seconds(s, dtype, plan));
            set_conv_algorithm(ConvAlgorithm::Auto);
        }
        let torch = if no_torch {
            Err("skipped (--no-torch)".to_string())
        } else {
            println!("conv: PyTorch {name}");
            let shapes: Vec<Value> = SHAPES
                .iter()
                .map(|s| {
                    json!({"batch": s.batch, "spatial": s.spatial, "c_in": s.c_in,
                           "c_out": s.c_out, "k": s.k, "stride": s.stride, "same": s.same})
                })
                .collect();
            let args: Vec<OsString> = vec![
                threads.to_string().into(),
                Value::Array(shapes).to_string().into(),
                name.into(),
            ];
            run_script(SCRIPT, &args, Some(threads)).and_then(|v| match v["seconds"].as_array() {
                Some(a) => Ok(a.iter().filter_map(Value::as_f64).collect::<Vec<f64>>()),
                None => Err(v["error"].as_str().unwrap_or("no figures").to_string()),
            })
        };
        for (i, ((s, m), p)) in SHAPES.iter().zip(&ours).zip(&patches).enumerate() {
            // Each pass's GFLOP/s: a third of the step's operations.
            let pass_gflops = match (&passes[i], m) {
                (Ok(t), Ok((_, f))) => json!({
                    "forward": num(f / 3.0 / t[0] / 1e9, 1),
                    "input_grad": num(f / 3.0 / t[1] / 1e9, 1),
                    "kernel_grad": num(f / 3.0 / t[2] / 1e9, 1),
                }),
                _ => Value::Null,
            };
            let ours = m.as_ref().ok().map(|(t, f)| f / t / 1e9);
            let im2col = p.as_ref().ok().map(|(t, f)| f / t / 1e9);
            let theirs = match (&torch, m) {
                (Ok(t), Ok((_, f))) => t.get(i).map(|t| f / t / 1e9),
                _ => None,
            };
            rows.push(json!({
                "shape": s.name,
                "dtype": name,
                "mirra_gflops": opt(ours, 1),
                "mirra_im2col_gflops": opt(im2col, 1),
                "mirra_pass_gflops": pass_gflops,
                "torch_gflops": opt(theirs, 1),
                "mirra_over_torch": opt(ours.zip(theirs).map(|(a, b)| a / b), 3),
                "error": m.as_ref().err(),
            }));
        }
        if let Err(e) = torch {
            torch_unavailable.get_or_insert(e);
        }
    }
    json!({
        "what": "one convolution's forward pass and its input and kernel gradients, batch 128 \
                 (2D) or 2 (3D, PyTorch in channels_last_3d), in f32 and in bf16 (operands \
                 held in bf16, f32 sums), GFLOP/s counted as 6 N OH OW KH KW Cin Cout (and \
                 OD KD) for both; mirra as Conv2D or Conv3D computes it (the algorithm it \
                 picks), and through its patches (im2col) for comparison; \
                 mirra_pass_gflops: each pass timed alone, a third of those operations",
        "threads": threads,
        "bf16_path": mirra::tensor::bf16_matmul_path(),
        "rows": rows,
        "torch_unavailable": torch_unavailable,
        "flops_per_step": SHAPES.iter().map(|s| s.window().map(|w| num(s.flops(&w), 0)).unwrap_or(Value::Null)).collect::<Vec<_>>(),
    })
}

/// Prints the section as a table.
pub fn print(c: &Value) {
    use crate::table::cell;
    println!();
    println!(
        "{:<30} {:>9} {:>10} {:>10} {:>10} {:>8}   mirra fwd/dx/dk",
        "conv fwd+bwd (GFLOP/s)", "dtype", "mirra", "im2col", "PyTorch", "ours/pt"
    );
    for r in c["rows"].as_array().into_iter().flatten() {
        let p = &r["mirra_pass_gflops"];
        let passes = format!(
            "{}/{}/{}",
            cell(&p["forward"], 0),
            cell(&p["input_grad"], 0),
            cell(&p["kernel_grad"], 0)
        );
        println!(
            "{:<30} {:>9} {:>10} {:>10} {:>10} {:>8}   {}",
            format!("  {}", r["shape"].as_str().unwrap_or("")),
            r["dtype"].as_str().unwrap_or(""),
            cell(&r["mirra_gflops"], 1),
            cell(&r["mirra_im2col_gflops"], 1),
            cell(&r["torch_gflops"], 1),
            cell(&r["mirra_over_torch"], 2),
            passes,
        );
    }
    if let Some(why) = c["torch_unavailable"].as_str() {
        println!("  torch unavailable: {why}");
    }
}
