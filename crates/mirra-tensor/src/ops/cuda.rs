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

use mirra_cuda::kernels::{BinaryKernel, Broadcast, ReduceKernel, UnaryKernel, WindowGeometry};
use mirra_cuda::runtime::{DeviceBuffer, Gemm, GemmType, Runtime};
use mirra_cuda::CudaError;
use mirra_device::{Buffer, DType, Device, DeviceError};

use crate::{Result, Shape, Tensor, TensorError, MAX_RANK};

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

/// The device memory of `t`'s buffer; an error for a tensor that is not on a device.
fn device_memory<'t>(op: &'static str, t: &'t Tensor) -> Result<&'t DeviceBuffer> {
    t.buffer()
        .device_memory()
        .ok_or(TensorError::Device(DeviceError::NotOnDevice {
            op,
            device: t.device(),
        }))
}

/// The runtime of the device `t` lives on.
fn runtime(op: &'static str, t: &Tensor) -> Result<Arc<Runtime>> {
    Ok(device_memory(op, t)?.runtime().clone())
}

/// The device address of `t`'s first element (its buffer's plus the layout's offset).
fn address(op: &'static str, t: &Tensor) -> Result<u64> {
    let base = device_memory(op, t)?.ptr();
    Ok(base + (t.layout().offset() * t.dtype().size_in_bytes()) as u64)
}

/// An error unless both operands are on one device.
fn same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device() == b.device() {
        return Ok(());
    }
    Err(TensorError::Device(DeviceError::DeviceMismatch {
        op,
        lhs: a.device(),
        rhs: b.device(),
    }))
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

/// A launch of one of mirra's kernels ([`mirra_cuda::launch!`]), its error as a
/// [`TensorError`].
macro_rules! launch {
    ($($t:tt)*) => {
        mirra_cuda::launch!($($t)*).map_err(cuda)
    };
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
    same_device(op, a, b)?;
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

/// Reduces the axes `mask` marks (kept as size-1 dimensions) with `code`: each run of
/// adjacent marked axes is one reduction over the tensor viewed as `[outer, n, inner]`,
/// accumulated in the dtype's accumulation type and rounded once. Runs that are not
/// adjacent are reduced one after the other, so 16-bit results can round once per run
/// where the CPU rounds once in all.
pub(crate) fn reduce(
    op: &'static str,
    code: ReduceKernel,
    x: &Tensor,
    mask: &[bool; MAX_RANK],
) -> Result<Tensor> {
    let sfx = float_suffix(op, x.dtype())?;
    let mut t = x.contiguous()?;
    let rank = t.rank();
    let mut d = 0;
    while d < rank {
        if !mask[d] {
            d += 1;
            continue;
        }
        let start = d;
        while d < rank && mask[d] {
            d += 1;
        }
        let dims = t.dims().to_vec();
        let outer: usize = dims[..start].iter().product();
        let n: usize = dims[start..d].iter().product();
        let inner: usize = dims[d..].iter().product();
        let mut out_dims = dims.clone();
        out_dims[start..d].fill(1);
        let rt = runtime(op, &t)?;
        let out = Buffer::alloc(t.dtype(), outer * inner, t.device())?;
        let (code, xp, yp) = (code as i32, address(op, &t)?, buffer_address(&out));
        let (o, n, i) = (outer as u64, n as u64, inner as u64);
        if inner == 1 {
            launch!(rt, format!("reduce_rows_{sfx}"), per_line outer, |l| {
                l.arg(&code).arg(&xp).arg(&yp).arg(&o).arg(&n);
            })?;
        } else {
            launch!(rt, format!("reduce_strided_{sfx}"), outer * inner, |l| {
                l.arg(&code).arg(&xp).arg(&yp).arg(&o).arg(&n).arg(&i);
            })?;
        }
        t = Tensor::from_buffer(out, &out_dims)?;
    }
    Ok(t)
}

/// Softmax (log-softmax with `log`) over the middle axis of `x` viewed as
/// `[outer, n, inner]`: one block per line.
pub(crate) fn softmax(
    x: &Tensor,
    outer: usize,
    n: usize,
    inner: usize,
    log: bool,
) -> Result<Tensor> {
    let op = if log { "log_softmax" } else { "softmax" };
    let sfx = float_suffix(op, x.dtype())?;
    let x = x.contiguous()?;
    let rt = runtime(op, &x)?;
    let out = Buffer::alloc(x.dtype(), x.elem_count(), x.device())?;
    let (xp, yp) = (address(op, &x)?, buffer_address(&out));
    let (o, len, i, log) = (outer as u64, n as u64, inner as u64, i32::from(log));
    launch!(rt, format!("softmax_{sfx}"), per_line outer * inner, |l| {
        l.arg(&xp).arg(&yp).arg(&o).arg(&len).arg(&i).arg(&log);
    })?;
    Tensor::from_buffer(out, x.dims())
}

/// How a matrix operand's last two dimensions (`rows x cols`) lie in memory for cuBLAS:
/// `(transposed, leading dimension)`, or `None` when neither row- nor column-major.
fn matrix_layout(t: &Tensor, rows: usize, cols: usize) -> Option<(bool, usize)> {
    let r = t.rank();
    let (s_row, s_col) = (t.layout().strides()[r - 2], t.layout().strides()[r - 1]);
    if s_col == 1 && s_row >= cols.max(1) {
        Some((false, s_row))
    } else if s_row == 1 && s_col >= rows.max(1) {
        Some((true, s_col))
    } else {
        None
    }
}

/// The element stride between consecutive matrices of `t` over a broadcast `batch`: 0 when
/// `t` has no batch (or only size-1 batch dims); the stride of its last batch dimension when
/// its batch dims are exactly `batch` and evenly spaced; otherwise `None`.
fn batch_stride(t: &Tensor, batch: &Shape) -> Option<usize> {
    let r = t.rank();
    let dims = &t.dims()[..r - 2];
    if dims.iter().all(|&d| d == 1) {
        return Some(0);
    }
    if dims != &batch[..] {
        return None;
    }
    let strides = &t.layout().strides()[..r - 2];
    let last = *strides.last()?;
    let mut want = last;
    for d in (0..dims.len()).rev() {
        if dims[d] > 1 && strides[d] != want {
            return None;
        }
        want *= dims[d];
    }
    Some(last)
}

/// The matrix product of two tensors on one CUDA device (`[.., m, k] x [.., k, n]`, batch
/// dims broadcast) through cuBLAS; transposed views are read as they are, other strided
/// operands are copied first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    a: &Tensor,
    b: &Tensor,
    batch: &Shape,
    m: usize,
    k: usize,
    n: usize,
    out_dims: &[usize],
) -> Result<Tensor> {
    let op = "matmul";
    same_device(op, a, b)?;
    let dtype = match a.dtype() {
        DType::F32 => GemmType::F32,
        DType::F64 => GemmType::F64,
        DType::F16 => GemmType::F16,
        DType::BF16 => GemmType::Bf16,
        dtype => return Err(TensorError::UnsupportedDType { op, dtype }),
    };
    // An operand cuBLAS cannot read as it lies is copied to a contiguous one.
    let readable = |t: &Tensor, rows: usize, cols: usize| -> Result<(Tensor, bool, usize, usize)> {
        let fits = |t: &Tensor| matrix_layout(t, rows, cols).zip(batch_stride(t, batch));
        let t = match fits(t) {
            Some(_) => t.clone(),
            None => t.copy()?,
        };
        let ((transposed, ld), stride) = fits(&t).ok_or_else(|| TensorError::Invalid {
            op,
            msg: "a batch broadcast cuBLAS cannot read (expand the operand first)".into(),
            shape: *t.shape(),
        })?;
        Ok((t, transposed, ld, stride))
    };
    let (a, a_transposed, lda, stride_a) = readable(a, m, k)?;
    let (b, b_transposed, ldb, stride_b) = readable(b, k, n)?;
    let rt = runtime(op, &a)?;
    let count = batch.elem_count();
    let out = Buffer::alloc(a.dtype(), count * m * n, a.device())?;
    if count * m * n > 0 {
        let g = Gemm {
            dtype,
            m,
            n,
            k,
            batch: count,
            a_transposed,
            lda,
            stride_a,
            b_transposed,
            ldb,
            stride_b,
        };
        if k == 0 {
            // cuBLAS leaves C untouched for k = 0 with beta 0 in some versions: zero it.
            let mut out = out;
            out.device_memory_mut()
                .ok_or(TensorError::Device(DeviceError::NotOnDevice {
                    op,
                    device: a.device(),
                }))?
                .fill_zero()
                .map_err(cuda)?;
            return Tensor::from_buffer(out, out_dims);
        }
        // SAFETY: a and b hold the matrices g describes (layouts checked above), the
        // output holds count x m x n elements, all of a's dtype on this device.
        unsafe { rt.gemm(&g, address(op, &a)?, address(op, &b)?, buffer_address(&out)) }
            .map_err(cuda)?;
    }
    Tensor::from_buffer(out, out_dims)
}

/// `index` as i64 on `device` (a host index tensor of any integer dtype is converted and
/// uploaded; one on the device must be i64 already).
fn device_index(op: &'static str, index: &Tensor, device: Device) -> Result<Tensor> {
    if index.device() == device && index.dtype() == DType::I64 {
        return index.contiguous();
    }
    if !index.device().is_cpu() {
        return Err(TensorError::UnsupportedDType {
            op,
            dtype: index.dtype(),
        });
    }
    let host = match index.dtype() {
        DType::I64 => index.contiguous()?,
        DType::I32 | DType::U8 => index.to_dtype(DType::I64)?,
        dtype => return Err(TensorError::UnsupportedDType { op, dtype }),
    };
    host.to_device(device)
}

/// An error of `op` on a tensor of `shape` saying `msg`, when a kernel set its flag (one
/// i32 on the device, zeroed before the launch).
fn refuse_if_raised(op: &'static str, flag: &Buffer, msg: &str, shape: &Shape) -> Result<()> {
    if flag.to_device(Device::Cpu)?.as_slice::<i32>()?[0] == 0 {
        return Ok(());
    }
    Err(TensorError::Invalid {
        op,
        msg: msg.into(),
        shape: *shape,
    })
}

/// Reads the kernel's bad-index flag: an error when an index was outside `0..n`.
fn check_flag(op: &'static str, flag: &Buffer, n: usize, shape: &Shape) -> Result<()> {
    refuse_if_raised(op, flag, &format!("an index out of range 0..{n}"), shape)
}

/// `gather` along the middle axis of `x` viewed as `[outer, n, inner]`, `index` as
/// `[outer, k, inner]` (float `x`).
pub(crate) fn gather(x: &Tensor, ax: usize, index: &Tensor) -> Result<Tensor> {
    let op = "gather";
    let sfx = float_suffix(op, x.dtype())?;
    let x = x.contiguous()?;
    let index = device_index(op, index, x.device())?;
    let rt = runtime(op, &x)?;
    let (outer, n, inner) = split3(x.dims(), ax);
    let k = index.dims()[ax];
    let out = Buffer::alloc(x.dtype(), index.elem_count(), x.device())?;
    let flag = Buffer::zeros(DType::I32, 1, x.device())?;
    let (xp, ip, yp, fp) = (
        address(op, &x)?,
        address(op, &index)?,
        buffer_address(&out),
        buffer_address(&flag),
    );
    let (o, nn, kk, i) = (outer as u64, n as u64, k as u64, inner as u64);
    launch!(rt, format!("gather_{sfx}"), index.elem_count(), |l| {
        l.arg(&xp)
            .arg(&ip)
            .arg(&yp)
            .arg(&o)
            .arg(&nn)
            .arg(&kk)
            .arg(&i)
            .arg(&fp);
    })?;
    check_flag(op, &flag, n, x.shape())?;
    Tensor::from_buffer(out, index.dims())
}

/// `scatter_add` of `g` (shaped as `index`) along `ax` into `target`, a new zero tensor on
/// `g`'s device (written in place: nobody else holds it).
pub(crate) fn scatter_add(g: &Tensor, ax: usize, index: &Tensor, target: Tensor) -> Result<Tensor> {
    let op = "scatter_add";
    let sfx = float_suffix(op, g.dtype())?;
    let g = g.contiguous()?;
    let index = device_index(op, index, g.device())?;
    let rt = runtime(op, &g)?;
    let (outer, n, inner) = split3(target.dims(), ax);
    let k = index.dims()[ax];
    let flag = Buffer::zeros(DType::I32, 1, g.device())?;
    let (gp, ip, yp, fp) = (
        address(op, &g)?,
        address(op, &index)?,
        address(op, &target)?,
        buffer_address(&flag),
    );
    let (o, nn, kk, i) = (outer as u64, n as u64, k as u64, inner as u64);
    launch!(rt, format!("scatter_add_{sfx}"), outer * inner, |l| {
        l.arg(&gp)
            .arg(&ip)
            .arg(&yp)
            .arg(&o)
            .arg(&nn)
            .arg(&kk)
            .arg(&i)
            .arg(&fp);
    })?;
    check_flag(op, &flag, n, g.shape())?;
    Ok(target)
}

/// `dims` as `[outer, dims[ax], inner]`.
fn split3(dims: &[usize], ax: usize) -> (usize, usize, usize) {
    (
        dims[..ax].iter().product(),
        dims[ax],
        dims[ax + 1..].iter().product(),
    )
}

/// The index of the largest element along the middle axis of `x` viewed as `[outer, n,
/// inner]`, as i64 of shape `x`'s with that axis 1 (float `x`).
pub(crate) fn argmax(x: &Tensor, ax: usize) -> Result<Tensor> {
    let op = "argmax";
    let sfx = float_suffix(op, x.dtype())?;
    let x = x.contiguous()?;
    let rt = runtime(op, &x)?;
    let (outer, n, inner) = split3(x.dims(), ax);
    let out = Buffer::alloc(DType::I64, outer * inner, x.device())?;
    let (xp, yp) = (address(op, &x)?, buffer_address(&out));
    let (o, nn, i) = (outer as u64, n as u64, inner as u64);
    launch!(rt, format!("argmax_{sfx}"), outer * inner, |l| {
        l.arg(&xp).arg(&yp).arg(&o).arg(&nn).arg(&i);
    })?;
    let mut dims = x.dims().to_vec();
    dims[ax] = 1;
    Tensor::from_buffer(out, &dims)
}

/// The entries `rows` (each checked `< x.dims()[0]` by the caller) of dimension 0 of `x`,
/// any dtype.
pub(crate) fn index_select(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let op = "index_select";
    let x = x.contiguous()?;
    let rt = runtime(op, &x)?;
    let n = x.dims()[0];
    let row = x.elem_count() / n.max(1);
    let index: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let index = Tensor::from_vec(index, &[rows.len()], x.device())?;
    let out = Buffer::alloc(x.dtype(), rows.len() * row, x.device())?;
    let flag = Buffer::zeros(DType::I32, 1, x.device())?;
    let (xp, ip, yp, fp) = (
        address(op, &x)?,
        address(op, &index)?,
        buffer_address(&out),
        buffer_address(&flag),
    );
    let (count, rw, nn) = (rows.len() as u64, row as u64, n as u64);
    let name = format!("index_select_{}", suffix(x.dtype()));
    launch!(rt, name, rows.len() * row, |l| {
        l.arg(&xp)
            .arg(&ip)
            .arg(&yp)
            .arg(&count)
            .arg(&rw)
            .arg(&nn)
            .arg(&fp);
    })?;
    check_flag(op, &flag, n, x.shape())?;
    let mut dims = x.dims().to_vec();
    dims[0] = rows.len();
    Tensor::from_buffer(out, &dims)
}

/// One-hot rows of `depth` (a new last dimension, float `dtype`) for the class ids of `x`
/// (an i64 tensor on the device, or host integers, uploaded).
pub(crate) fn one_hot(x: &Tensor, depth: usize, dtype: DType, device: Device) -> Result<Tensor> {
    let op = "one_hot";
    let sfx = float_suffix(op, dtype)?;
    let out = Buffer::zeros(dtype, x.elem_count() * depth, device)?;
    let index = device_index(op, x, device)?;
    let rt = runtime(op, &index)?;
    let flag = Buffer::zeros(DType::I32, 1, device)?;
    let (ip, yp, fp) = (
        address(op, &index)?,
        buffer_address(&out),
        buffer_address(&flag),
    );
    let (count, d) = (x.elem_count() as u64, depth as u64);
    launch!(rt, format!("one_hot_{sfx}"), x.elem_count(), |l| {
        l.arg(&ip).arg(&yp).arg(&count).arg(&d).arg(&fp);
    })?;
    check_flag(op, &flag, depth, x.shape())?;
    let mut dims = x.dims().to_vec();
    dims.push(depth);
    Tensor::from_buffer(out, &dims)
}

/// The gradient of softmax's (log-softmax's with `log`) input from its output `y` and the
/// output's gradient `g` along the middle axis of `[outer, n, inner]`: one fused pass per
/// line instead of the four ops the CPU composes.
pub(crate) fn softmax_backward(y: &Tensor, g: &Tensor, ax: usize, log: bool) -> Result<Tensor> {
    let op = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    let sfx = float_suffix(op, y.dtype())?;
    same_device(op, y, g)?;
    let (y, g) = (y.contiguous()?, g.contiguous()?);
    let rt = runtime(op, &y)?;
    let (outer, n, inner) = split3(y.dims(), ax);
    let out = Buffer::alloc(y.dtype(), y.elem_count(), y.device())?;
    let (yp, gp, dp) = (address(op, &y)?, address(op, &g)?, buffer_address(&out));
    let (o, nn, i, log) = (outer as u64, n as u64, inner as u64, i32::from(log));
    launch!(rt, format!("softmax_backward_{sfx}"), per_line outer * inner, |l| {
        l.arg(&yp).arg(&gp).arg(&dp).arg(&o).arg(&nn).arg(&i).arg(&log);
    })?;
    Tensor::from_buffer(out, y.dims())
}

/// A tensor of `shape` on a CUDA device with every element `value`: a fill kernel for
/// floats, a host tensor uploaded for integers.
pub(crate) fn full(shape: &Shape, value: f64, dtype: DType, device: Device) -> Result<Tensor> {
    if !dtype.is_float() {
        return Tensor::full(shape, value, dtype, Device::Cpu)?.to_device(device);
    }
    let out = Buffer::alloc(dtype, shape.elem_count(), device)?;
    let Some(memory) = out.device_memory() else {
        return Err(TensorError::Device(DeviceError::NotOnDevice {
            op: "full",
            device,
        }));
    };
    let rt = memory.runtime().clone();
    let (yp, n) = (buffer_address(&out), shape.elem_count() as u64);
    launch!(
        rt,
        format!("fill_{}", suffix(dtype)),
        shape.elem_count(),
        |l| {
            l.arg(&yp).arg(&n).arg(&value);
        }
    )?;
    Tensor::from_buffer(out, shape)
}

/// `parts` (checked by the caller: one dtype, dims equal but along `ax`) joined along `ax`
/// into a tensor of `shape`: each part's `[outer, len * inner]` rows copied into place.
pub(crate) fn concat(parts: &[&Tensor], ax: usize, shape: &Shape) -> Result<Tensor> {
    let op = "concat";
    let first = parts[0];
    let size = first.dtype().size_in_bytes();
    let (outer, total, inner) = split3(&shape[..], ax);
    let mut out = Buffer::alloc(first.dtype(), shape.elem_count(), first.device())?;
    let mut col = 0;
    for part in parts {
        same_device(op, first, part)?;
        let part = part.contiguous()?;
        let len = part.dims()[ax];
        let src = device_memory(op, &part)?;
        let dst = out
            .device_memory_mut()
            .ok_or(TensorError::Device(DeviceError::NotOnDevice {
                op,
                device: first.device(),
            }))?;
        let width = len * inner * size;
        dst.copy_rows_from(
            col * inner * size,
            total * inner * size,
            src,
            part.layout().offset() * size,
            width,
            width,
            outer,
        )
        .map_err(cuda)?;
        col += len;
    }
    Tensor::from_buffer(out, shape)
}

/// A window kernel that maps `x` (float, on its device) to a new tensor of `dims`, one
/// thread per output element: `im2col` (the patches of window `w` over `[n, d1, .., dk,
/// c]`, `[n, o1, .., ok, taps * c]`, zeros in the padding) or `col2im` (its adjoint: patch
/// values summed back into an input, element by element in the CPU's order).
pub(crate) fn window_map(
    op: &'static str,
    x: &Tensor,
    w: WindowGeometry,
    dims: &[usize],
) -> Result<Tensor> {
    let sfx = float_suffix(op, x.dtype())?;
    let x = x.contiguous()?;
    let rt = runtime(op, &x)?;
    let count = dims.iter().product();
    let out = Buffer::alloc(x.dtype(), count, x.device())?;
    let (xp, yp) = (address(op, &x)?, buffer_address(&out));
    launch!(rt, format!("{op}_{sfx}"), count, |l| {
        l.arg(&xp).arg(&yp).arg(&w);
    })?;
    Tensor::from_buffer(out, dims)
}

/// Max pooling of `x` over window `w` into values and i64 winners of `dims` (the flat
/// index into `x` of each output's largest tap, the first of equal maxima).
pub(crate) fn max_pool(x: &Tensor, w: WindowGeometry, dims: &[usize]) -> Result<(Tensor, Tensor)> {
    let op = "max_pool";
    let sfx = float_suffix(op, x.dtype())?;
    let x = x.contiguous()?;
    let rt = runtime(op, &x)?;
    let count = dims.iter().product();
    let values = Buffer::alloc(x.dtype(), count, x.device())?;
    let winners = Buffer::alloc(DType::I64, count, x.device())?;
    let flag = Buffer::zeros(DType::I32, 1, x.device())?;
    let (xp, vp, wp, fp) = (
        address(op, &x)?,
        buffer_address(&values),
        buffer_address(&winners),
        buffer_address(&flag),
    );
    launch!(rt, format!("max_pool_{sfx}"), count, |l| {
        l.arg(&xp).arg(&vp).arg(&wp).arg(&w).arg(&fp);
    })?;
    refuse_if_raised(
        op,
        &flag,
        "a window with no tap inside the input",
        x.shape(),
    )?;
    Ok((
        Tensor::from_buffer(values, dims)?,
        Tensor::from_buffer(winners, dims)?,
    ))
}

/// The gradient of [`max_pool`]: `g` added into its winners (`winners`, flat indices into
/// the input) in a new zero tensor of the input's `dims` (`[n, .., c]`), output position by
/// position in order, summed in the accumulation type. A winner outside its own image and
/// channel is an error.
pub(crate) fn max_pool_grad(g: &Tensor, winners: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let op = "max_pool_grad";
    let sfx = float_suffix(op, g.dtype())?;
    same_device(op, g, winners)?;
    let (g, winners) = (g.contiguous()?, winners.contiguous()?);
    let rt = runtime(op, &g)?;
    let (images, channels) = (dims[0], dims[dims.len() - 1]);
    if g.dims().last() != Some(&channels) {
        return Err(TensorError::Invalid {
            op,
            msg: format!("a gradient of {channels} channels, as the input {dims:?}"),
            shape: *g.shape(),
        });
    }
    let per_image = |count: usize| (count / (images * channels).max(1)) as u64;
    let count: usize = dims.iter().product();
    // The kernel reads positions alone: one spatial dim of each image's positions.
    let w = WindowGeometry {
        input: [per_image(count), 1, 1],
        output: [per_image(g.elem_count()), 1, 1],
        kernel: [1; 3],
        stride: [1; 3],
        dilation: [1; 3],
        pad: [0; 3],
        images: images as u64,
        channels: channels as u64,
    };
    let acc = if g.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let sums = Buffer::zeros(acc, count, g.device())?;
    let out = Buffer::alloc(g.dtype(), count, g.device())?;
    let flag = Buffer::zeros(DType::I32, 1, g.device())?;
    let (gp, ip, sp, yp, fp) = (
        address(op, &g)?,
        address(op, &winners)?,
        buffer_address(&sums),
        buffer_address(&out),
        buffer_address(&flag),
    );
    launch!(rt, format!("max_pool_grad_{sfx}"), images * channels, |l| {
        l.arg(&gp).arg(&ip).arg(&sp).arg(&yp).arg(&w).arg(&fp);
    })?;
    refuse_if_raised(
        op,
        &flag,
        "a winner outside its own image and channel",
        g.shape(),
    )?;
    Tensor::from_buffer(out, dims)
}

impl Tensor {
    /// A tensor of `shape` on a CUDA device, every element `value` (see [`full`]).
    pub(crate) fn cuda_full(
        shape: &Shape,
        value: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        full(shape, value, dtype, device)
    }

    /// The device address of this tensor's first element, for a kernel that reads it: an
    /// error for a host tensor or a strided view (call [`Tensor::contiguous`] first).
    pub fn device_ptr(&self) -> Result<u64> {
        if !self.is_contiguous() {
            return Err(TensorError::Invalid {
                op: "device_ptr",
                msg: "tensor is a strided view; call contiguous() first".into(),
                shape: *self.shape(),
            });
        }
        address("device_ptr", self)
    }
}
