//! The GPU probe: what a lent GPU machine has, and whether mirra's way of calling it works.
//!
//! `cargo xtask gpu-probe` runs it first in the GPU bundle (`ci/gpu-check.sh`), so that a
//! session with a few minutes on a GPU learns something whatever it works on. Each step is
//! independent where it can be: it is timed, logged the moment it ends, and a failure (or a
//! panic inside a library) is recorded and the next step goes on; steps that need what a
//! failed step would have made are skipped with the reason.
//!
//! Steps: the libraries (driver, cuBLAS, NVRTC, NCCL); a context on the device; a round trip
//! of 1 GiB host -> device -> host (pageable and pinned) and a device-to-device copy, every
//! byte checked; a cuBLAS f32 and a bf16 matrix product, sampled entries checked against the
//! host; an NVRTC-compiled kernel over 64M elements, every element checked; a one-rank NCCL
//! all-reduce. Each measured rate is reported beside it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    sys as drv, CudaContext, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use half::bf16;

use crate::error::Context;
use crate::library::{self, Library};
use crate::{CudaError, Result};

/// Sizes of the probe's work.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// The device to probe.
    pub ordinal: usize,
    /// Bytes of the host <-> device round trip and the device copy.
    pub copy_bytes: usize,
    /// Order of the square f32 matrix product.
    pub gemm_f32: usize,
    /// Order of the square bf16 matrix product.
    pub gemm_bf16: usize,
    /// Elements of the NVRTC kernel's arrays and of the NCCL all-reduce.
    pub kernel_elems: usize,
    /// Timed repetitions of each device-side measurement (after one warm-up).
    pub iters: usize,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            ordinal: 0,
            copy_bytes: 1 << 30,
            gemm_f32: 4096,
            gemm_bf16: 8192,
            kernel_elems: 64 << 20,
            iters: 10,
        }
    }
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// It ran and its results were checked.
    Ok,
    /// It failed: the detail says how.
    Failed,
    /// It could not run: the detail says which earlier failure stopped it.
    Skipped,
}

impl Status {
    /// `ok`, `FAILED` or `skipped`, as the log prints it.
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "FAILED",
            Status::Skipped => "skipped",
        }
    }
}

/// One step of the probe.
#[derive(Clone, Debug)]
pub struct Step {
    /// What the step does, in a few words.
    pub name: String,
    /// How it ended.
    pub status: Status,
    /// What it found, or why it failed.
    pub detail: String,
    /// Measured figures: name (with its unit) and value.
    pub figures: Vec<(String, f64)>,
    /// Wall-clock seconds the step took.
    pub seconds: f64,
}

/// Everything the probe found.
#[derive(Clone, Debug, Default)]
pub struct Probe {
    /// The steps, in the order they ran.
    pub steps: Vec<Step>,
    /// True when no driver library was found (nothing else could run).
    pub no_driver: bool,
}

impl Probe {
    /// True when every step ran and passed its checks.
    pub fn all_ok(&self) -> bool {
        !self.steps.is_empty() && self.steps.iter().all(|s| s.status == Status::Ok)
    }
}

/// What a successful step reports.
struct Found {
    detail: String,
    figures: Vec<(String, f64)>,
}

impl Found {
    fn new(detail: impl Into<String>) -> Found {
        Found {
            detail: detail.into(),
            figures: Vec::new(),
        }
    }

    fn figure(mut self, name: impl Into<String>, value: f64) -> Found {
        self.figures.push((name.into(), value));
        self
    }
}

/// Runs one step under a timer, turning an error or a panic into a failed step.
fn run_step(name: String, f: impl FnOnce() -> Result<Found>) -> Step {
    let start = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(f));
    let seconds = start.elapsed().as_secs_f64();
    let (status, detail, figures) = match outcome {
        Ok(Ok(found)) => (Status::Ok, found.detail, found.figures),
        Ok(Err(e)) => (Status::Failed, e.to_string(), Vec::new()),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            (Status::Failed, format!("panicked: {msg}"), Vec::new())
        }
    };
    Step {
        name,
        status,
        detail,
        figures,
        seconds,
    }
}

fn skipped(name: String, why: &str) -> Step {
    Step {
        name,
        status: Status::Skipped,
        detail: why.to_string(),
        figures: Vec::new(),
        seconds: 0.0,
    }
}

/// Runs the probe, handing each step to `log` as soon as it ends.
pub fn run(cfg: &ProbeConfig, log: &mut dyn FnMut(&Step)) -> Probe {
    let mut probe = Probe::default();
    let mut record = |probe: &mut Probe, step: Step| {
        log(&step);
        probe.steps.push(step);
    };

    let libs = run_step("libraries".into(), libraries);
    let driver_ok = library::present(Library::Driver);
    record(&mut probe, libs);
    if !driver_ok {
        probe.no_driver = true;
        return probe;
    }

    let mut device = None;
    let step = run_step(format!("context on cuda:{}", cfg.ordinal), || {
        let (ctx, found) = open_device(cfg.ordinal)?;
        device = Some(ctx);
        Ok(found)
    });
    record(&mut probe, step);

    let gpu_steps: [(String, GpuStep); 6] = [
        (
            format!("copy {} host<->device, device copy", mib(cfg.copy_bytes)),
            copies,
        ),
        (
            format!("cuBLAS f32 gemm {0}x{0}x{0}", cfg.gemm_f32),
            gemm_f32,
        ),
        (
            format!("cuBLAS bf16 gemm {0}x{0}x{0}", cfg.gemm_bf16),
            gemm_bf16,
        ),
        (
            format!("NVRTC kernel axpy over {}M f32", cfg.kernel_elems >> 20),
            nvrtc_kernel,
        ),
        (
            format!("NCCL all-reduce, 1 rank, {}M f32", cfg.kernel_elems >> 20),
            nccl_all_reduce,
        ),
        ("libraries loaded from".into(), loaded_paths),
    ];
    for (name, step) in gpu_steps {
        let step = match &device {
            Some(ctx) => run_step(name, || step(ctx, cfg)),
            None => skipped(name, "no context (see the context step)"),
        };
        record(&mut probe, step);
    }
    probe
}

type GpuStep = fn(&Arc<CudaContext>, &ProbeConfig) -> Result<Found>;

fn mib(bytes: usize) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// Which libraries load; fails only when the driver is missing.
fn libraries() -> Result<Found> {
    library::ensure(Library::Driver)?;
    let mut parts = Vec::new();
    for lib in Library::ALL {
        parts.push(match library::ensure(lib) {
            Ok(()) => format!("{}: present", lib.name()),
            Err(e) => format!("MISSING {e}"),
        });
    }
    let mut version = 0;
    // SAFETY: the driver library is present (checked above); the call writes one int.
    unsafe { drv::cuDriverGetVersion(&mut version) }
        .result()
        .op("cuDriverGetVersion")?;
    parts.push(format!(
        "driver API {}.{}",
        version / 1000,
        (version % 1000) / 10
    ));
    Ok(Found::new(parts.join("; ")).figure("driver_api_version", version as f64))
}

/// A context on the device, and what the device is.
fn open_device(ordinal: usize) -> Result<(Arc<CudaContext>, Found)> {
    let count = CudaContext::device_count().op("cuDeviceGetCount")? as usize;
    if ordinal >= count {
        return Err(CudaError::NoSuchDevice { ordinal, count });
    }
    let ctx = CudaContext::new(ordinal).op("cuCtxCreate / primary context")?;
    let name = ctx.name().op("cuDeviceGetName")?;
    let (major, minor) = ctx.compute_capability().op("cuDeviceGetAttribute")?;
    let total = ctx.total_mem().op("cuDeviceTotalMem")?;
    let (free, _) = ctx.mem_get_info().op("cuMemGetInfo")?;
    let sms = ctx
        .attribute(drv::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .op("cuDeviceGetAttribute")?;
    let found = Found::new(format!(
        "{count} device(s); cuda:{ordinal} = {name}, sm_{major}{minor}, {sms} SMs, \
         {:.1} GiB ({:.1} GiB free)",
        total as f64 / (1u64 << 30) as f64,
        free as f64 / (1u64 << 30) as f64
    ))
    .figure("devices", count as f64)
    .figure("compute_capability", major as f64 + minor as f64 / 10.0)
    .figure("memory_gib", total as f64 / (1u64 << 30) as f64);
    Ok((ctx, found))
}

/// A reproducible byte pattern that no off-by-one copy reproduces.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

/// The first index where `got` differs from the pattern, if any.
fn first_wrong(got: &[u8]) -> Option<usize> {
    got.iter().enumerate().position(|(i, &b)| b != pattern(i))
}

fn gbs(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Seconds per call of `f` on `stream`, timed with CUDA events over `iters` calls after one
/// warm-up call.
fn device_seconds(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    f()?;
    let flags = Some(drv::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx.new_event(flags).op("cuEventCreate")?;
    let end = ctx.new_event(flags).op("cuEventCreate")?;
    start.record(stream).op("cuEventRecord")?;
    for _ in 0..iters {
        f()?;
    }
    end.record(stream).op("cuEventRecord")?;
    let ms = start.elapsed_ms(&end).op("cuEventElapsedTime")?;
    Ok(ms as f64 / 1e3 / iters as f64)
}

/// Wall seconds of one host-side call that ends with the stream synchronised.
fn wall_seconds(stream: &Arc<CudaStream>, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    f()?;
    stream.synchronize().op("cuStreamSynchronize")?;
    Ok(start.elapsed().as_secs_f64())
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>> {
    stream.alloc_zeros::<T>(len).op("cuMemAlloc")
}

/// Host -> device -> host, pageable and pinned, and device -> device; every byte checked.
fn copies(ctx: &Arc<CudaContext>, cfg: &ProbeConfig) -> Result<Found> {
    let n = cfg.copy_bytes;
    let stream = ctx.default_stream();
    let host: Vec<u8> = (0..n).map(pattern).collect();
    let mut dev = zeros::<u8>(&stream, n)?;
    // Written before the copy, as PyTorch's destination is: a fresh zeroed allocation is
    // mapped page by page on first touch, inside the timed copy (1.5 GB/s instead of 18
    // on the first H200 run).
    let mut back = vec![0u8; n];
    back.fill(0x5a);

    let h2d = wall_seconds(&stream, || {
        stream.memcpy_htod(&host, &mut dev).op("cuMemcpyHtoD")
    })?;
    let d2h = wall_seconds(&stream, || {
        stream.memcpy_dtoh(&dev, &mut back).op("cuMemcpyDtoH")
    })?;
    if let Some(i) = first_wrong(&back) {
        return Err(CudaError::WrongResult {
            what: "pageable round trip",
            detail: format!("byte {i} came back as {} (sent {})", back[i], pattern(i)),
        });
    }
    drop(back);

    // Pinned (page-locked, not write-combined: the host reads it back).
    // SAFETY: the allocation is filled below before any byte of it is read.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(n, 0) }.op("cuMemHostAlloc")?;
    pinned
        .as_mut_slice()
        .op("cuEventSynchronize")?
        .copy_from_slice(&host);
    drop(host);
    let mut dev2 = zeros::<u8>(&stream, n)?;
    let pinned_h2d = wall_seconds(&stream, || {
        stream.memcpy_htod(&pinned, &mut dev2).op("cuMemcpyHtoD")
    })?;
    pinned.as_mut_slice().op("cuEventSynchronize")?.fill(0);
    let pinned_d2h = wall_seconds(&stream, || {
        stream.memcpy_dtoh(&dev2, &mut pinned).op("cuMemcpyDtoH")
    })?;
    if let Some(i) = first_wrong(pinned.as_slice().op("cuEventSynchronize")?) {
        return Err(CudaError::WrongResult {
            what: "pinned round trip",
            detail: format!("byte {i} differs"),
        });
    }
    drop(pinned);

    // Device -> device: the copy rate that element-wise kernels are held to, counting the
    // bytes read plus the bytes written.
    let d2d = device_seconds(ctx, &stream, cfg.iters, || {
        stream.memcpy_dtod(&dev, &mut dev2).op("cuMemcpyDtoD")
    })?;
    let mut check = vec![0u8; n];
    stream.memcpy_dtoh(&dev2, &mut check).op("cuMemcpyDtoH")?;
    if let Some(i) = first_wrong(&check) {
        return Err(CudaError::WrongResult {
            what: "device copy",
            detail: format!("byte {i} differs"),
        });
    }
    let found = Found::new(format!(
        "every byte checked; host->device {:.1} GB/s, device->host {:.1} GB/s (pageable); \
         {:.1} / {:.1} GB/s (pinned); device copy {:.0} GB/s (read + written)",
        gbs(n, h2d),
        gbs(n, d2h),
        gbs(n, pinned_h2d),
        gbs(n, pinned_d2h),
        gbs(2 * n, d2d)
    ))
    .figure("h2d_pageable_gbs", gbs(n, h2d))
    .figure("d2h_pageable_gbs", gbs(n, d2h))
    .figure("h2d_pinned_gbs", gbs(n, pinned_h2d))
    .figure("d2h_pinned_gbs", gbs(n, pinned_d2h))
    .figure("d2d_copy_gbs", gbs(2 * n, d2d));
    Ok(found)
}

/// Reproducible values in [-1, 1) (splitmix64), the same on host and device.
fn value(seed: u64, i: usize) -> f32 {
    let mut z = seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// A column-major square matrix product on cuBLAS, timed, with sampled entries checked:
/// each sampled `C[i, j]` against the host's f64 dot product `exact`, allowed
/// `result_ulp * |exact| + sum_tol * sum |products|`: the rounding of the stored result, plus
/// an accumulation error that grows with the terms. With inputs in [-1, 1) and f32
/// accumulation the second term is about 5e-8 of the sum; a 2e-6 allowance still fails
/// TF32 inputs (about 1e-5 here), a transposed operand or a wrong layout.
fn gemm_checked<T>(
    ctx: &Arc<CudaContext>,
    cfg: &ProbeConfig,
    n: usize,
    (result_ulp, sum_tol): (f64, f64),
    figure: &'static str,
    from_f32: fn(f32) -> T,
    to_f32: fn(T) -> f32,
) -> Result<Found>
where
    T: DeviceRepr + ValidAsZeroBits + Copy,
    CudaBlas: Gemm<T>,
{
    library::ensure(Library::Cublas)?;
    let stream = ctx.default_stream();
    let blas = CudaBlas::new(stream.clone()).op("cublasCreate")?;
    let a_host: Vec<T> = (0..n * n).map(|i| from_f32(value(1, i))).collect();
    let b_host: Vec<T> = (0..n * n).map(|i| from_f32(value(2, i))).collect();
    let a = stream.clone_htod(&a_host).op("cuMemcpyHtoD")?;
    let b = stream.clone_htod(&b_host).op("cuMemcpyHtoD")?;
    let mut c = zeros::<T>(&stream, n * n)?;
    let dim = n as i32;
    let gemm_cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: dim,
        n: dim,
        k: dim,
        alpha: from_f32(1.0),
        lda: dim,
        ldb: dim,
        beta: from_f32(0.0),
        ldc: dim,
    };
    let seconds = device_seconds(ctx, &stream, cfg.iters, || {
        // SAFETY: a, b and c hold n*n elements each, the sizes the config describes.
        unsafe { blas.gemm(gemm_cfg, &a, &b, &mut c) }.op("cublasGemmEx")
    })?;
    let c_host = stream.clone_dtoh(&c).op("cuMemcpyDtoH")?;
    let mut worst = 0.0f64;
    for s in 0..64 {
        let (i, j) = ((s * 7919) % n, (s * 104_729 + 13) % n);
        let (mut exact, mut magnitude) = (0.0f64, 0.0f64);
        for l in 0..n {
            let p = to_f32(a_host[i + l * n]) as f64 * to_f32(b_host[l + j * n]) as f64;
            exact += p;
            magnitude += p.abs();
        }
        let err = (to_f32(c_host[i + j * n]) as f64 - exact).abs();
        let allowed = result_ulp * exact.abs() + sum_tol * magnitude;
        worst = worst.max(err / allowed);
        if err > allowed {
            return Err(CudaError::WrongResult {
                what: "matrix product",
                detail: format!(
                    "C[{i},{j}] = {} but the host says {exact} (error {err:.2e}, allowed \
                     {allowed:.2e})",
                    to_f32(c_host[i + j * n])
                ),
            });
        }
    }
    let tflops = 2.0 * (n as f64).powi(3) / seconds / 1e12;
    Ok(Found::new(format!(
        "{tflops:.1} TFLOP/s ({:.3} ms); 64 sampled entries checked against the host, worst \
         at {:.0}% of its allowance",
        seconds * 1e3,
        worst * 100.0
    ))
    .figure(figure, tflops))
}

fn gemm_f32(ctx: &Arc<CudaContext>, cfg: &ProbeConfig) -> Result<Found> {
    // f32 inputs and accumulation (cuBLAS's default math mode: no TF32 unless
    // NVIDIA_TF32_OVERRIDE says so); the result is stored in f32 (2^-24).
    let tol = (2f64.powi(-23), 2e-6);
    gemm_checked::<f32>(ctx, cfg, cfg.gemm_f32, tol, "gemm_f32_tflops", |x| x, |x| x)
}

fn gemm_bf16(ctx: &Arc<CudaContext>, cfg: &ProbeConfig) -> Result<Found> {
    // The host's reference uses the same bf16 inputs; products are exact in f32 and summed
    // in f32, then the result is rounded to bf16 (8 significant bits: 2^-9, allowed 2^-8).
    let tol = (2f64.powi(-8), 2e-6);
    gemm_checked::<bf16>(
        ctx,
        cfg,
        cfg.gemm_bf16,
        tol,
        "gemm_bf16_tflops",
        bf16::from_f32,
        bf16::to_f32,
    )
}

/// The probe's kernel: CUDA C++ compiled at run time by NVRTC.
const AXPY_SRC: &str = r#"
extern "C" __global__ void axpy(float a, const float *x, float *y, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] = fmaf(a, x[i], y[i]);
    }
}
"#;

/// NVRTC's architecture option for a device, when it is one this build names.
fn nvrtc_arch(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

fn nvrtc_kernel(ctx: &Arc<CudaContext>, cfg: &ProbeConfig) -> Result<Found> {
    library::ensure(Library::Nvrtc)?;
    let (mut vmaj, mut vmin) = (0, 0);
    // SAFETY: NVRTC is present (checked above); the call writes two ints.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut vmaj, &mut vmin) };
    let (major, minor) = ctx.compute_capability().op("cuDeviceGetAttribute")?;
    let ptx = compile_ptx_with_opts(
        AXPY_SRC,
        CompileOptions {
            arch: nvrtc_arch(major, minor),
            ..Default::default()
        },
    )
    .op("nvrtcCompileProgram")?;
    let ptx_text = ptx.to_src();
    let isa = ptx_text
        .lines()
        .find_map(|l| l.trim().strip_prefix(".version "))
        .unwrap_or("?")
        .to_string();
    let module = ctx.load_module(ptx).map_err(|source| CudaError::Driver {
        op: "cuModuleLoadData (PTX from NVRTC; a driver older than NVRTC refuses its PTX)",
        source,
    })?;
    let f = module.load_function("axpy").op("cuModuleGetFunction")?;
    let n = cfg.kernel_elems;
    let stream = ctx.default_stream();
    let x_host: Vec<f32> = (0..n).map(|i| value(3, i)).collect();
    let y_host: Vec<f32> = (0..n).map(|i| value(4, i)).collect();
    let x = stream.clone_htod(&x_host).op("cuMemcpyHtoD")?;
    let mut y = stream.clone_htod(&y_host).op("cuMemcpyHtoD")?;
    let a = 0.5f32;
    let len = n as u64;
    let sms = ctx
        .attribute(drv::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .op("cuDeviceGetAttribute")? as u32;
    let launch = LaunchConfig {
        grid_dim: (sms * 8, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launches = 0usize;
    let seconds = device_seconds(ctx, &stream, cfg.iters, || {
        launches += 1;
        let mut args = stream.launch_builder(&f);
        args.arg(&a).arg(&x).arg(&mut y).arg(&len);
        // SAFETY: the kernel's signature is (float, const float*, float*, u64) and both
        // arrays hold `len` elements.
        unsafe { args.launch(launch) }.op("cuLaunchKernel")?;
        Ok(())
    })?;
    let got = stream.clone_dtoh(&y).op("cuMemcpyDtoH")?;
    for (i, (&g, (&xi, &yi))) in got.iter().zip(x_host.iter().zip(&y_host)).enumerate() {
        let mut want = yi;
        for _ in 0..launches {
            want = a.mul_add(xi, want);
        }
        if g.to_bits() != want.to_bits() {
            return Err(CudaError::WrongResult {
                what: "NVRTC axpy kernel",
                detail: format!("y[{i}] = {g} after {launches} launches, the host says {want}"),
            });
        }
    }
    // Three arrays' worth of traffic per launch: x read, y read and written.
    let rate = gbs(3 * 4 * n, seconds);
    Ok(Found::new(format!(
        "NVRTC {vmaj}.{vmin}, PTX ISA {isa} for {}; every element bitwise equal to the host's \
         fma; {rate:.0} GB/s (read + written)",
        nvrtc_arch(major, minor).unwrap_or("the default architecture")
    ))
    .figure("nvrtc_version", vmaj as f64 + vmin as f64 / 10.0)
    .figure("axpy_gbs", rate))
}

fn nccl_all_reduce(ctx: &Arc<CudaContext>, cfg: &ProbeConfig) -> Result<Found> {
    use cudarc::nccl::{Comm, ReduceOp};
    library::ensure(Library::Nccl)?;
    let version = cudarc::nccl::result::get_nccl_version().op("ncclGetVersion")?;
    let stream = ctx.default_stream();
    let comms = Comm::from_devices(vec![stream.clone()]).op("ncclCommInitAll")?;
    let n = cfg.kernel_elems;
    let host: Vec<f32> = (0..n).map(|i| value(5, i)).collect();
    let mut buf = stream.clone_htod(&host).op("cuMemcpyHtoD")?;
    let seconds = device_seconds(ctx, &stream, cfg.iters, || {
        comms[0]
            .all_reduce_in_place(&mut buf, &ReduceOp::Sum)
            .map(|_| ())
            .op("ncclAllReduce")
    })?;
    let got = stream.clone_dtoh(&buf).op("cuMemcpyDtoH")?;
    if let Some(i) = got
        .iter()
        .zip(&host)
        .position(|(g, h)| g.to_bits() != h.to_bits())
    {
        return Err(CudaError::WrongResult {
            what: "NCCL all-reduce over one rank",
            detail: format!("element {i} = {} but was {}", got[i], host[i]),
        });
    }
    let (major, minor, patch) = (version / 10000, (version % 10000) / 100, version % 100);
    Ok(Found::new(format!(
        "NCCL {major}.{minor}.{patch}; one rank's sum is its input, bitwise; {:.0} us per call",
        seconds * 1e6
    ))
    .figure("nccl_version", version as f64)
    .figure("all_reduce_1rank_us", seconds * 1e6))
}

/// Which files the dynamic loader picked for each library, after the steps used them.
fn loaded_paths(_: &Arc<CudaContext>, _: &ProbeConfig) -> Result<Found> {
    let parts: Vec<String> = Library::ALL
        .iter()
        .map(|&lib| {
            format!(
                "{}: {}",
                lib.name(),
                library::loaded_from(lib).unwrap_or_else(|| "not loaded".into())
            )
        })
        .collect();
    Ok(Found::new(parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_the_probe_says_so_and_stops() {
        let mut logged = Vec::new();
        let probe = run(&ProbeConfig::default(), &mut |s| {
            logged.push(s.name.clone())
        });
        if library::present(Library::Driver) {
            // A machine with a driver: the GPU test below covers it.
            assert!(!probe.no_driver);
            return;
        }
        assert!(probe.no_driver);
        assert_eq!(probe.steps.len(), 1, "{probe:?}");
        assert_eq!(logged, ["libraries"]);
        let step = &probe.steps[0];
        assert_eq!(step.status, Status::Failed);
        assert!(
            step.detail.starts_with("no CUDA driver found"),
            "{}",
            step.detail
        );
        assert!(!probe.all_ok());
    }

    #[test]
    fn a_panicking_step_is_a_failed_step_not_a_crash() {
        let step = run_step("boom".into(), || panic!("library went away"));
        assert_eq!(step.status, Status::Failed);
        assert_eq!(step.detail, "panicked: library went away");
        let step = run_step("fine".into(), || Ok(Found::new("x").figure("y", 1.0)));
        assert_eq!(step.status, Status::Ok);
        assert_eq!(step.figures, vec![("y".to_string(), 1.0)]);
    }

    #[test]
    fn the_copy_pattern_catches_shifted_and_truncated_copies() {
        let good: Vec<u8> = (0..4096).map(pattern).collect();
        assert_eq!(first_wrong(&good), None);
        let shifted: Vec<u8> = (1..4097).map(pattern).collect();
        assert_eq!(first_wrong(&shifted), Some(0));
        let mut zero_tail = good.clone();
        zero_tail[4000..].fill(0);
        assert!(first_wrong(&zero_tail).is_some());
    }

    #[test]
    fn values_are_spread_over_minus_one_to_one() {
        let v: Vec<f32> = (0..10_000).map(|i| value(7, i)).collect();
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.05, "{mean}");
        assert_ne!(value(1, 5), value(2, 5));
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn the_probe_passes_on_a_gpu() {
        let cfg = ProbeConfig {
            copy_bytes: 64 << 20,
            gemm_f32: 1024,
            gemm_bf16: 2048,
            kernel_elems: 1 << 22,
            iters: 2,
            ..ProbeConfig::default()
        };
        let probe = run(&cfg, &mut |_| {});
        for step in &probe.steps {
            assert_eq!(step.status, Status::Ok, "{}: {}", step.name, step.detail);
        }
        assert!(probe.all_ok());
    }
}
