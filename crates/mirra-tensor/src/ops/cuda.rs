//! The tensor ops on a CUDA device: each launches one of mirra's kernels
//! (`mirra_cuda::kernels`) on the device's runtime stream, reading its operands through
//! their layouts (strides and offset, broadcast strides 0), writing a new contiguous
//! tensor. The families with CUDA kernels here: element-wise unary and binary maps (with
//! broadcasting), the affine map, contiguous copies and float casts. An op without a CUDA
//! path gives an error naming the device (a host view of device memory is refused), never
//! a silent copy.
//!
//! The op families above call into this module with the kernel's op code: the mapping
//! from their ops to the codes lives beside each op (an exhaustive match).

use std::sync::Arc;

use mirra_cuda::cudarc::driver::PushKernelArg;
use mirra_cuda::kernels::{BinaryKernel, Broadcast, UnaryKernel};
use mirra_cuda::runtime::Runtime;
use mirra_cuda::CudaError;
use mirra_device::{Buffer, DType, DeviceError};

use crate::{Result, Shape, Tensor, TensorError};

/// The `_<dtype>` suffix of a kernel's name.
fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 => "u8",
    }
}

fn float_suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
    if dtype.is_float() {
        Ok(suffix(dtype))
    } else {
        Err(TensorError::UnsupportedDType { op, dtype })
    }
}

fn cuda(e: CudaError) -> TensorError {
    TensorError::Device(DeviceError::Cuda(e))
}

/// The runtime of the device `t` lives on.
fn runtime(op: &'static str, t: &Tensor) -> Result<Arc<Runtime>> {
    t.buffer()
        .device_memory()
        .map(|m| m.runtime().clone())
        .ok_or(TensorError::Device(DeviceError::NotOnDevice {
            op,
            device: t.device(),
        }))
}

/// The device address of `t`'s first element (its buffer's plus the layout's offset).
fn address(op: &'static str, t: &Tensor) -> Result<u64> {
    let m = t
        .buffer()
        .device_memory()
        .ok_or(TensorError::Device(DeviceError::NotOnDevice {
            op,
            device: t.device(),
        }))?;
    Ok(m.ptr() + (t.layout().offset() * t.dtype().size_in_bytes()) as u64)
}

/// The device address of a buffer's first element.
fn buffer_address(b: &Buffer) -> u64 {
    b.device_memory().map_or(0, |m| m.ptr())
}

/// The operands' element strides seen through a broadcast to `shape`, as the kernels'
/// [`Broadcast`] (the right operand's strides from `b`, when there is one).
fn broadcast(shape: &Shape, a: &Tensor, b: Option<&Tensor>) -> Broadcast {
    let mut s = Broadcast {
        rank: shape.rank() as u64,
        ..Broadcast::default()
    };
    let (sa, sb) = (
        a.layout().broadcast_strides(shape),
        b.map(|b| b.layout().broadcast_strides(shape)),
    );
    for d in 0..shape.rank() {
        s.dims[d] = shape[d] as u64;
        s.a_strides[d] = sa[d] as u64;
        s.b_strides[d] = sb.map_or(0, |sb| sb[d] as u64);
    }
    s
}

/// A launch of kernel `name` over `n` elements on `rt`'s stream; `push` adds its arguments.
macro_rules! launch {
    ($rt:expr, $name:expr, $n:expr, |$l:ident| $push:block) => {{
        let rt: &Runtime = &$rt;
        let kernels = rt.kernels().map_err(cuda)?;
        let f = kernels.function(&$name).map_err(cuda)?;
        let cfg = kernels.grid($n);
        let mut $l = rt.stream().launch_builder(&f);
        $push
        // SAFETY: every caller passes the kernel's parameters in its order and types
        // (kernels/*.cu), pointers to device buffers of the sizes the kernel indexes.
        unsafe { $l.launch(cfg) }
            .map(|_| ())
            .map_err(|source| cuda(CudaError::Driver { op: "cuLaunchKernel", source }))
    }};
}

/// `op` applied to every element of `x` (a float tensor on a CUDA device).
pub(crate) fn unary(op: &'static str, code: UnaryKernel, x: &Tensor) -> Result<Tensor> {
    let sfx = float_suffix(op, x.dtype())?;
    let x = x.contiguous()?;
    let rt = runtime(op, &x)?;
    let n = x.elem_count();
    let out = Buffer::alloc(x.dtype(), n, x.device())?;
    let (code, xp, yp, len) = (
        code as i32,
        address(op, &x)?,
        buffer_address(&out),
        n as u64,
    );
    launch!(rt, format!("unary_{sfx}"), n, |l| {
        l.arg(&code).arg(&xp).arg(&yp).arg(&len);
    })?;
    Tensor::from_buffer(out, x.dims())
}

/// `op` of `a` and `b` broadcast to `shape` (both float tensors of one dtype on one CUDA
/// device).
pub(crate) fn binary(
    op: &'static str,
    code: BinaryKernel,
    a: &Tensor,
    b: &Tensor,
    shape: &Shape,
) -> Result<Tensor> {
    let sfx = float_suffix(op, a.dtype())?;
    if a.device() != b.device() {
        return Err(TensorError::Device(DeviceError::DeviceMismatch {
            op,
            lhs: a.device(),
            rhs: b.device(),
        }));
    }
    let rt = runtime(op, a)?;
    let n = shape.elem_count();
    let out = Buffer::alloc(a.dtype(), n, a.device())?;
    let (code, ap, bp, yp, len) = (
        code as i32,
        address(op, a)?,
        address(op, b)?,
        buffer_address(&out),
        n as u64,
    );
    if a.shape() == shape && b.shape() == shape && a.is_contiguous() && b.is_contiguous() {
        launch!(rt, format!("binary_{sfx}"), n, |l| {
            l.arg(&code).arg(&ap).arg(&bp).arg(&yp).arg(&len);
        })?;
    } else {
        let s = broadcast(shape, a, Some(b));
        launch!(rt, format!("binary_broadcast_{sfx}"), n, |l| {
            l.arg(&code).arg(&ap).arg(&bp).arg(&yp).arg(&len).arg(&s);
        })?;
    }
    Tensor::from_buffer(out, shape)
}

/// `x * mul + add` (in the accumulation type, two roundings, as on the CPU).
pub(crate) fn affine(x: &Tensor, mul: f64, add: f64) -> Result<Tensor> {
    let sfx = float_suffix("affine", x.dtype())?;
    let x = x.contiguous()?;
    let rt = runtime("affine", &x)?;
    let n = x.elem_count();
    let out = Buffer::alloc(x.dtype(), n, x.device())?;
    let (xp, yp, len) = (address("affine", &x)?, buffer_address(&out), n as u64);
    launch!(rt, format!("affine_{sfx}"), n, |l| {
        l.arg(&xp).arg(&yp).arg(&len).arg(&mul).arg(&add);
    })?;
    Tensor::from_buffer(out, x.dims())
}

impl Tensor {
    /// A contiguous copy of a tensor on a CUDA device, read through its layout.
    pub(crate) fn cuda_copy(&self) -> Result<Tensor> {
        let rt = runtime("copy", self)?;
        let shape = *self.shape();
        let n = shape.elem_count();
        let out = Buffer::alloc(self.dtype(), n, self.device())?;
        let (xp, yp, len) = (address("copy", self)?, buffer_address(&out), n as u64);
        let s = broadcast(&shape, self, None);
        launch!(
            rt,
            format!("copy_strided_{}", suffix(self.dtype())),
            n,
            |l| {
                l.arg(&xp).arg(&yp).arg(&len).arg(&s);
            }
        )?;
        Tensor::from_buffer(out, &shape)
    }

    /// The elements of a float tensor on a CUDA device converted to another float dtype.
    pub(crate) fn cuda_to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let from = float_suffix("to_dtype", self.dtype())?;
        let to = float_suffix("to_dtype", dtype)?;
        let x = self.contiguous()?;
        let rt = runtime("to_dtype", &x)?;
        let n = x.elem_count();
        let out = Buffer::alloc(dtype, n, x.device())?;
        let (xp, yp, len) = (address("to_dtype", &x)?, buffer_address(&out), n as u64);
        launch!(rt, format!("cast_{from}_{to}"), n, |l| {
            l.arg(&xp).arg(&yp).arg(&len);
        })?;
        Tensor::from_buffer(out, x.dims())
    }
}
