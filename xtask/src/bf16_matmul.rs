//! bf16 matmul at [`SIZE`]: mirra's `Tensor::matmul` (this CPU's native bf16 kernel, or
//! the f32 conversion where it has none) against PyTorch's `torch.mm` on the same threads
//! (oneDNN: AMX where the CPU has it), in alternating rounds so that a slow phase of a
//! noisy machine hits both alike; mirra's own f32 matmul at the same size beside them.
//!
//! Targets (issue 17): at least PyTorch's in the same run; not done below 0.6x.

use std::ffi::OsString;

use mirra::tensor::init::{rng, Initializer};
use mirra::tensor::{set_num_threads, DType, Device, Tensor};
use serde_json::{json, Value};

use crate::json::{at_least, num, opt};
use crate::timing::{measure, median, Plan};
use crate::torch_train::run_script;

/// The side of the square matrices.
pub const SIZE: usize = 1024;
/// mirra over PyTorch, at least (the issue's goal).
pub const TARGET: f64 = 1.0;
/// mirra over PyTorch below which the point is not done.
pub const FLOOR: f64 = 0.6;

/// PyTorch's median seconds per `a @ b` of two n x n matrices of `dtype`, after warm-up.
const SCRIPT: &str = r#"
import json, sys, time
try:
    import torch
except Exception as e:
    print(json.dumps({"error": f"torch does not import: {e}"})); sys.exit(0)
n, threads, repeats, min_s = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(1)
a = (torch.rand(n, n, generator=g) * 2 - 1).bfloat16()
b = (torch.rand(n, n, generator=g) * 2 - 1).bfloat16()
for _ in range(3):
    a @ b
calls = 1
while True:
    t = time.perf_counter()
    for _ in range(calls):
        a @ b
    if time.perf_counter() - t >= min_s:
        break
    calls *= 2
per_call = []
for _ in range(repeats):
    t = time.perf_counter()
    for _ in range(calls):
        a @ b
    per_call.append((time.perf_counter() - t) / calls)
per_call.sort()
print(json.dumps({"torch": torch.__version__, "median_s": per_call[len(per_call) // 2]}))
"#;

fn gflops(seconds: f64) -> f64 {
    2.0 * (SIZE as f64).powi(3) / seconds / 1e9
}

fn matrix(dtype: DType, seed: u64) -> mirra::tensor::Result<Tensor> {
    Initializer::Uniform {
        low: -1.0,
        high: 1.0,
    }
    .init(&[SIZE, SIZE], DType::F32, Device::Cpu, &mut rng(seed))?
    .to_dtype(dtype)
}

/// mirra's median seconds per product in `dtype`.
fn mirra_seconds(dtype: DType, plan: Plan) -> Result<f64, String> {
    let (a, b) = (
        matrix(dtype, 1).map_err(|e| e.to_string())?,
        matrix(dtype, 2).map_err(|e| e.to_string())?,
    );
    let s = measure(plan, || {
        std::hint::black_box(a.matmul(&b)?);
        Ok::<_, mirra::tensor::TensorError>(())
    })
    .map_err(|e| e.to_string())?;
    Ok(s.median())
}

/// The comparison's JSON: GFLOP/s of each side, their ratio and the target.
pub fn compare(threads: usize, plan: Plan, rounds: usize, no_torch: bool) -> Value {
    set_num_threads(threads);
    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut torch_unavailable = no_torch.then(|| "skipped (--no-torch)".to_string());
    let mut torch_version = Value::Null;
    let mut errors = Vec::new();
    for _ in 0..rounds.max(1) {
        println!("precision: bf16 matmul at {SIZE}, mirra then PyTorch, {threads} threads");
        let mine = match mirra_seconds(DType::BF16, plan) {
            Ok(s) => s,
            Err(e) => {
                errors.push(e);
                break;
            }
        };
        ours.push(mine);
        if torch_unavailable.is_some() {
            continue;
        }
        let args: Vec<OsString> = vec![
            SIZE.to_string().into(),
            threads.to_string().into(),
            plan.repeats.to_string().into(),
            plan.min_repeat.as_secs_f64().to_string().into(),
        ];
        match run_script(SCRIPT, &args, Some(threads)) {
            Ok(v) => {
                torch_version = v["torch"].clone();
                if let Some(s) = v["median_s"].as_f64() {
                    theirs.push(s);
                    ratios.push(s / mine);
                }
            }
            Err(e) => torch_unavailable = Some(e),
        }
    }
    let f32_seconds = mirra_seconds(DType::F32, plan)
        .map_err(|e| errors.push(e))
        .ok();
    let med = |xs: &[f64]| (!xs.is_empty()).then(|| median(xs));
    let (ours_s, theirs_s, ratio) = (med(&ours), med(&theirs), med(&ratios));
    json!({
        "what": "bf16 matmul of two 1024 x 1024 matrices: mirra's Tensor::matmul against \
                 PyTorch's a @ b on the same threads, alternating rounds; ratio: the median \
                 of each round's PyTorch time over mirra's",
        "size": SIZE,
        "threads": threads,
        "bf16_matmul_path": mirra::tensor::bf16_matmul_path(),
        "mirra_bf16_gflops": opt(ours_s.map(gflops), 1),
        "mirra_f32_gflops": opt(f32_seconds.map(gflops), 1),
        "torch_bf16_gflops": opt(theirs_s.map(gflops), 1),
        "torch": torch_version,
        "torch_unavailable": torch_unavailable,
        "rounds": ours.len(),
        "round_ratios": ratios.iter().map(|r| num(*r, 3)).collect::<Vec<_>>(),
        "mirra_over_torch": opt(ratio, 3),
        "errors": errors,
        "targets": {
            "goal": at_least(TARGET, ratio, 3),
            "floor": at_least(FLOOR, ratio, 3),
        },
    })
}
