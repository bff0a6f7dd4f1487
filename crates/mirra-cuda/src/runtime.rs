//! One CUDA device as mirra uses it: its context, the stream mirra's work is queued on,
//! its caching allocator and its kernels ([`Runtime`], one per device per process, made
//! on first use); and the device buffers that hold tensors' memory there
//! ([`DeviceBuffer`]).
//!
//! Every copy and kernel of a device is queued on its runtime's stream, in program order,
//! so one buffer's uses are ordered without events. A download waits for the stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{result, CudaContext, CudaStream};

use crate::allocator::{Block, CachingAllocator, DriverMemory, MemoryStats};
use crate::error::Context;
use crate::kernels::Kernels;
use crate::library::{self, Library};
use crate::{devices, CudaError, Result};

/// Launches mirra kernel `name` (`<kernel>_<dtype>`) on a [`Runtime`]'s stream (or, with
/// `on stream`, on another stream of its device): `grid n` (or just `n`) is a grid-stride
/// launch over `n` elements ([`Kernels::grid`]), `per_line n` one block per line of `n`
/// lines ([`Kernels::per_line`]); the closure's block pushes the kernel's arguments in the
/// order and types of its source (`kernels/*.cu`). Evaluates to `mirra_cuda::Result<()>`.
///
/// The launch is `unsafe` underneath: the caller's arguments must be the kernel's
/// parameters, pointers to device memory of the sizes the kernel indexes.
///
/// [`Kernels::grid`]: crate::kernels::Kernels::grid
/// [`Kernels::per_line`]: crate::kernels::Kernels::per_line
#[macro_export]
macro_rules! launch {
    ($rt:expr, on $stream:expr, $name:expr, $n:expr, |$l:ident| $push:block) => {
        $crate::launch!(@on $rt, $stream, $name, grid $n, |$l| $push)
    };
    ($rt:expr, $name:expr, $n:expr, |$l:ident| $push:block) => {
        $crate::launch!($rt, $name, grid $n, |$l| $push)
    };
    ($rt:expr, $name:expr, $how:ident $n:expr, |$l:ident| $push:block) => {{
        let rt: &$crate::runtime::Runtime = &$rt;
        $crate::launch!(@on rt, rt.stream(), $name, $how $n, |$l| $push)
    }};
    (@on $rt:expr, $stream:expr, $name:expr, $how:ident $n:expr, |$l:ident| $push:block) => {{
        #[allow(unused_imports)]
        use $crate::cudarc::driver::PushKernelArg as _;
        let rt: &$crate::runtime::Runtime = &$rt;
        let stream: &$crate::cudarc::driver::CudaStream = &$stream;
        (|| -> $crate::Result<()> {
            let kernels = rt.kernels()?;
            let f = kernels.function(&$name)?;
            let cfg = kernels.$how($n);
            let mut $l = stream.launch_builder(&f);
            $push
            // SAFETY: the macro's contract: the caller pushes the kernel's parameters in its
            // order and types, pointers to device buffers of the sizes the kernel indexes.
            unsafe { $l.launch(cfg) }
                .map(|_| ())
                .map_err(|source| $crate::CudaError::Driver { op: "cuLaunchKernel", source })
        })()
    }};
}

/// A device's context, stream, allocator and kernels.
pub struct Runtime {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    allocator: CachingAllocator<DriverMemory>,
    kernels: OnceLock<Kernels>,
    blas: OnceLock<CudaBlas>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Runtime(cuda:{})", self.ordinal)
    }
}

/// The runtime of device `ordinal`, made on first use (an error when there is no driver
/// or no such device).
pub fn runtime(ordinal: usize) -> Result<Arc<Runtime>> {
    static RUNTIMES: OnceLock<Mutex<HashMap<usize, Arc<Runtime>>>> = OnceLock::new();
    let mut map = RUNTIMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(rt) = map.get(&ordinal) {
        return Ok(rt.clone());
    }
    devices::check_device(ordinal)?;
    let ctx = CudaContext::new(ordinal).op("cuDevicePrimaryCtxRetain")?;
    let stream = ctx.new_stream().op("cuStreamCreate")?;
    let rt = Arc::new(Runtime {
        ordinal,
        allocator: CachingAllocator::new(DriverMemory::new(ctx.clone())),
        ctx,
        stream,
        kernels: OnceLock::new(),
        blas: OnceLock::new(),
    });
    map.insert(ordinal, rt.clone());
    Ok(rt)
}

impl Runtime {
    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every copy and kernel of this device is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The allocator's counters (bytes in use and held, their peaks).
    pub fn memory_stats(&self) -> MemoryStats {
        self.allocator.stats()
    }

    /// Start the allocator's peaks again from now.
    pub fn reset_peak_memory(&self) {
        self.allocator.reset_peaks()
    }

    /// Give the allocator's cached blocks back to the device (PyTorch's `empty_cache`),
    /// after the work queued on the stream has run (a cached block may still be read by it).
    pub fn empty_cache(&self) -> Result<()> {
        self.synchronize()?;
        self.allocator.empty_cache();
        Ok(())
    }

    /// mirra's kernels on this device (loaded module by module on first use).
    pub fn kernels(&self) -> Result<&Kernels> {
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let k = Kernels::new(self.ctx.clone())?;
        Ok(self.kernels.get_or_init(|| k))
    }

    /// cuBLAS on this device's stream (created on first use; an error naming the library
    /// when it is not installed).
    fn blas(&self) -> Result<&CudaBlas> {
        if let Some(b) = self.blas.get() {
            return Ok(b);
        }
        library::ensure(Library::Cublas)?;
        let b = CudaBlas::new(self.stream.clone()).map_err(|source| CudaError::Cublas {
            op: "cublasCreate",
            source,
        })?;
        Ok(self.blas.get_or_init(|| b))
    }

    /// `c = a x b` for each of `g.batch` row-major matrices (see [`Gemm`]), through
    /// `cublasGemmStridedBatchedEx` on this device's stream. f32 runs in TF32 when
    /// [`set_allow_tf32`] allowed it; f16 and bf16 accumulate in f32; f64 in f64.
    ///
    /// # Safety
    /// `a`, `b` and `c` are device addresses on this device holding the elements `g`
    /// describes, of `g.dtype`.
    pub unsafe fn gemm(&self, g: &Gemm, a: u64, b: u64, c: u64) -> Result<()> {
        use blas_sys::{cublasComputeType_t as C, cudaDataType as D};
        let blas = self.blas()?;
        self.bind()?;
        let (data, compute) = match g.dtype {
            GemmType::F32 if allow_tf32() => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_TF32),
            GemmType::F32 => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
            GemmType::F64 => (D::CUDA_R_64F, C::CUBLAS_COMPUTE_64F),
            GemmType::F16 => (D::CUDA_R_16F, C::CUBLAS_COMPUTE_32F),
            GemmType::Bf16 => (D::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F),
        };
        let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
        let (alpha, beta): (*const std::ffi::c_void, *const std::ffi::c_void) =
            if g.dtype == GemmType::F64 {
                (
                    (&one64 as *const f64).cast(),
                    (&zero64 as *const f64).cast(),
                )
            } else {
                (
                    (&one32 as *const f32).cast(),
                    (&zero32 as *const f32).cast(),
                )
            };
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let int = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| CudaError::Unsupported {
                what: format!("matmul: {what} {v} is beyond cuBLAS's 32-bit sizes"),
            })
        };
        // Row-major C = A B is column-major C^T = B^T A^T: cuBLAS multiplies B by A.
        // SAFETY: the caller's addresses hold the matrices `g` describes; alpha and beta
        // are host scalars of the compute type, alive for the call.
        unsafe {
            blas::gemm_strided_batched_ex(
                *blas.handle(),
                op(g.b_transposed),
                op(g.a_transposed),
                int(g.n, "n")?,
                int(g.m, "m")?,
                int(g.k, "k")?,
                alpha,
                b as *const std::ffi::c_void,
                data,
                int(g.ldb, "ldb")?,
                g.stride_b as i64,
                a as *const std::ffi::c_void,
                data,
                int(g.lda, "lda")?,
                g.stride_a as i64,
                beta,
                c as *mut std::ffi::c_void,
                data,
                int(g.n, "ldc")?,
                (g.m * g.n) as i64,
                int(g.batch, "batch")?,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|source| CudaError::Cublas {
            op: "cublasGemmStridedBatchedEx",
            source,
        })
    }

    /// Wait until everything queued on the stream has run.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().op("cuStreamSynchronize")
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().op("cuCtxSetCurrent")
    }

    /// `bytes` of device memory, contents unspecified.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        let block = self
            .allocator
            .alloc(bytes, self.stream.cu_stream() as u64)?;
        Ok(DeviceBuffer {
            block,
            bytes,
            rt: self.clone(),
        })
    }
}

/// The element type of a [`Runtime::gemm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum GemmType {
    F32,
    F64,
    F16,
    Bf16,
}

/// `batch` row-major products `C[m, n] = A[m, k] B[k, n]`, C contiguous. An operand is
/// stored row-major with leading dimension `ld` (`A[i, j]` at `i * lda + j`), or, when
/// `transposed`, is the transpose of such a matrix (`A[i, j]` at `j * lda + i`: a
/// transposed view, read without a copy). Consecutive matrices of the batch are `stride`
/// elements apart (0: one matrix for the whole batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Gemm {
    pub dtype: GemmType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a_transposed: bool,
    pub lda: usize,
    pub stride_a: usize,
    pub b_transposed: bool,
    pub ldb: usize,
    pub stride_b: usize,
}

static ALLOW_TF32: AtomicBool = AtomicBool::new(false);

/// Let f32 matrix products on CUDA devices run in TF32 (10-bit mantissa products, f32
/// accumulation): off by default, as PyTorch's `torch.backends.cuda.matmul.allow_tf32`.
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::Relaxed);
}

/// Whether f32 matrix products may run in TF32.
pub fn allow_tf32() -> bool {
    ALLOW_TF32.load(Ordering::Relaxed)
}

/// Memory on one device, from its runtime's allocator; dropping it returns the block to
/// the allocator's cache for the runtime's stream.
pub struct DeviceBuffer {
    block: Block<DriverMemory>,
    bytes: usize,
    rt: Arc<Runtime>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer({} B on cuda:{})",
            self.bytes, self.rt.ordinal
        )
    }
}

impl DeviceBuffer {
    /// The size in bytes (the request, not the allocator's size class).
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.block.ptr()
    }

    /// The runtime of the device it lives on.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    fn check_len(&self, op: &'static str, bytes: usize) -> Result<()> {
        if bytes == self.bytes {
            Ok(())
        } else {
            Err(CudaError::Unsupported {
                what: format!("{op}: {bytes} bytes into a device buffer of {}", self.bytes),
            })
        }
    }

    /// Copy `src` (exactly this buffer's size) from the host, in stream order. Returns once
    /// `src` may be reused (the driver stages pageable memory).
    pub fn upload(&mut self, src: &[u8]) -> Result<()> {
        self.check_len("upload", src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.rt.bind()?;
        // SAFETY: the block holds at least `src.len()` bytes; the copy is queued on the
        // stream that orders every use of the block.
        unsafe { result::memcpy_htod_async(self.ptr(), src, self.rt.stream.cu_stream()) }
            .op("cuMemcpyHtoDAsync")
    }

    /// Copy the contents to the host (exactly this buffer's size), after everything queued
    /// before on the stream.
    pub fn download(&self, dst: &mut [u8]) -> Result<()> {
        self.check_len("download", dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.rt.bind()?;
        // SAFETY: `dst` holds the buffer's size; the stream is synchronized before `dst`
        // is read by the caller.
        unsafe { result::memcpy_dtoh_async(dst, self.ptr(), self.rt.stream.cu_stream()) }
            .op("cuMemcpyDtoHAsync")?;
        self.rt.synchronize()
    }

    /// Set every byte to 0, in stream order.
    pub fn fill_zero(&mut self) -> Result<()> {
        if self.bytes == 0 {
            return Ok(());
        }
        self.rt.bind()?;
        // SAFETY: the block holds `bytes`; queued on the buffer's stream.
        unsafe { result::memset_d8_async(self.ptr(), 0, self.bytes, self.rt.stream.cu_stream()) }
            .op("cuMemsetD8Async")
    }

    /// Copy `src` (same device, same size) into this buffer, in stream order.
    pub fn copy_from(&mut self, src: &DeviceBuffer) -> Result<()> {
        self.check_len("copy_from", src.bytes)?;
        if src.rt.ordinal != self.rt.ordinal {
            return Err(CudaError::Unsupported {
                what: format!(
                    "copy_from: cuda:{} to cuda:{} (copy through the host)",
                    src.rt.ordinal, self.rt.ordinal
                ),
            });
        }
        if self.bytes == 0 {
            return Ok(());
        }
        self.rt.bind()?;
        // SAFETY: both blocks hold `bytes` on this device; queued on its stream.
        unsafe {
            result::memcpy_dtod_async(
                self.ptr(),
                src.ptr(),
                self.bytes,
                self.rt.stream.cu_stream(),
            )
        }
        .op("cuMemcpyDtoDAsync")
    }

    /// Copy `rows` runs of `width` bytes from `src` into this buffer, in stream order: run
    /// `r` from byte `src_offset + r * src_pitch` of `src` to byte `dst_offset + r *
    /// dst_pitch` here (one `cuMemcpy2DAsync`: a concatenation's part into its place).
    /// An error when a run would leave either buffer.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_rows_from(
        &mut self,
        dst_offset: usize,
        dst_pitch: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        src_pitch: usize,
        width: usize,
        rows: usize,
    ) -> Result<()> {
        if rows == 0 || width == 0 {
            return Ok(());
        }
        let end = |offset: usize, pitch: usize| offset + (rows - 1) * pitch + width;
        if width > src_pitch.min(dst_pitch)
            || end(src_offset, src_pitch) > src.bytes
            || end(dst_offset, dst_pitch) > self.bytes
            || src.rt.ordinal != self.rt.ordinal
        {
            return Err(CudaError::Unsupported {
                what: format!(
                    "copy_rows_from: {rows} runs of {width} bytes (pitches {src_pitch} and \
                     {dst_pitch}, offsets {src_offset} and {dst_offset}) between buffers of \
                     {} B on cuda:{} and {} B on cuda:{}",
                    src.bytes, src.rt.ordinal, self.bytes, self.rt.ordinal
                ),
            });
        }
        self.rt.bind()?;
        if rows == 1 {
            // One run: a plain copy (no pitch limit).
            // SAFETY: the run lies inside both buffers (checked above); queued on the stream.
            return unsafe {
                result::memcpy_dtod_async(
                    self.ptr() + dst_offset as u64,
                    src.ptr() + src_offset as u64,
                    width,
                    self.rt.stream.cu_stream(),
                )
            }
            .op("cuMemcpyDtoDAsync");
        }
        use cudarc::driver::sys;
        let copy = sys::CUDA_MEMCPY2D_st {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src.ptr() + src_offset as u64,
            srcArray: std::ptr::null_mut(),
            srcPitch: src_pitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: self.ptr() + dst_offset as u64,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch,
            WidthInBytes: width,
            Height: rows,
        };
        // SAFETY: every run lies inside its buffer (checked above), both on this device;
        // queued on the stream that orders every use of the two blocks.
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, self.rt.stream.cu_stream()) }
            .result()
            .op("cuMemcpy2DAsync")
    }

    /// A new buffer on the same device with the same contents.
    pub fn try_clone(&self) -> Result<DeviceBuffer> {
        let mut b = self.rt.alloc(self.bytes)?;
        b.copy_from(self)?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_device_the_runtime_is_an_error_not_a_panic() {
        if devices::device_count().is_err() {
            let e = runtime(0).unwrap_err().to_string();
            assert!(e.starts_with("no CUDA driver found"), "{e}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn buffers_round_trip_and_copy_on_the_device() {
        let rt = runtime(0).unwrap();
        assert!(
            Arc::ptr_eq(&rt, &runtime(0).unwrap()),
            "one runtime per device"
        );
        let host: Vec<u8> = (0..100_003u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut a = rt.alloc(host.len()).unwrap();
        a.upload(&host).unwrap();
        let b = a.try_clone().unwrap();
        let mut back = vec![0u8; host.len()];
        b.download(&mut back).unwrap();
        assert_eq!(back, host);
        a.fill_zero().unwrap();
        a.download(&mut back).unwrap();
        assert!(back.iter().all(|&x| x == 0));
        let e = a.upload(&host[1..]).unwrap_err().to_string();
        assert!(
            e.contains("100002 bytes into a device buffer of 100003"),
            "{e}"
        );
        assert!(rt.memory_stats().in_use >= 2 * host.len());
    }
}
