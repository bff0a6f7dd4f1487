//! The fused updates on a CUDA device: one launch per parameter of the optimizer's kernel
//! in `mirra-cuda/kernels/optim.cu` (`sgd_<dtype>`, `adam_<dtype>`, `rmsprop_<dtype>`,
//! clipping's `scale_in_place_<dtype>` and loss scaling's `unscale_check_<dtype>`), whose
//! formulas and order of operations are
//! this crate's CPU kernels'. Each [`Rule`](crate::optimizer::Rule) pushes its own
//! scalars; what every launch shares (the device addresses of the parameter, its gradient
//! and its slots, the element count, the dtype's kernel suffix) is gathered here.

use std::sync::Arc;

use mirra_cuda::runtime::Runtime;
use mirra_device::DeviceError;
use mirra_tensor::{Tensor, TensorError};

/// A CUDA error as a tensor error.
pub(crate) fn cuda_error(e: mirra_cuda::CudaError) -> TensorError {
    TensorError::Device(DeviceError::Cuda(e))
}

/// One parameter's update on its device, ready to launch.
pub(crate) struct DeviceUpdate<'s> {
    /// The device's runtime (whose stream runs the update).
    pub(crate) rt: Arc<Runtime>,
    /// The parameter's address (written in place).
    pub(crate) p: u64,
    /// The gradient's address.
    pub(crate) g: u64,
    /// The element count.
    pub(crate) n: u64,
    /// The kernel's dtype suffix (`f32`, `bf16`, ...).
    dtype: &'static str,
    /// The gradient, kept alive until the launch is queued.
    _grad: Tensor,
    slots: std::slice::IterMut<'s, Tensor>,
}

impl<'s> DeviceUpdate<'s> {
    /// The update of `p` (on a CUDA device) from `g` (same shape, dtype and device, checked
    /// by the caller) and its slots in the rule's order. The parameter and every slot are
    /// made unshared first (an exported state or weight snapshot keeps its values).
    pub(crate) fn new(
        p: &mut Tensor,
        g: &Tensor,
        slots: &'s mut [Tensor],
    ) -> Result<DeviceUpdate<'s>, TensorError> {
        let grad = g.contiguous()?;
        let memory = p.device_memory_mut()?;
        Ok(DeviceUpdate {
            rt: memory.runtime().clone(),
            p: memory.ptr(),
            g: grad.device_ptr()?,
            n: p.elem_count() as u64,
            dtype: p.dtype().as_str(),
            _grad: grad,
            slots: slots.iter_mut(),
        })
    }

    /// The address of the next slot (in the rule's slot order), 0 (the kernel's null) when
    /// the configuration keeps no such slot.
    pub(crate) fn next_slot(&mut self) -> Result<u64, TensorError> {
        match self.slots.next() {
            Some(t) => Ok(t.device_memory_mut()?.ptr()),
            None => Ok(0),
        }
    }

    /// The name of `kernel` for this parameter's dtype.
    pub(crate) fn kernel(&self, kernel: &str) -> String {
        format!("{kernel}_{}", self.dtype)
    }

    /// The element count as a launch size.
    pub(crate) fn len(&self) -> usize {
        self.n as usize
    }
}

/// `g *= scale` on its device, in the accumulation type (clipping's rescale).
pub(crate) fn scale_in_place(g: &mut Tensor, scale: f64) -> Result<(), TensorError> {
    let dtype = g.dtype().as_str();
    let n = g.elem_count();
    let memory = g.device_memory_mut()?;
    let (rt, x, len) = (memory.runtime().clone(), memory.ptr(), n as u64);
    mirra_cuda::launch!(rt, format!("scale_in_place_{dtype}"), n, |l| {
        l.arg(&x).arg(&len).arg(&scale);
    })
    .map_err(cuda_error)
}

/// The sum of squares of a float tensor on its device, in f64: each block's partial sum
/// (`sum_squares_partial_<dtype>`), added on the host in block order (deterministic for
/// a given device).
pub(crate) fn sum_of_squares(t: &Tensor) -> Result<f64, TensorError> {
    let t = t.contiguous()?;
    let n = t.elem_count();
    if n == 0 {
        return Ok(0.0);
    }
    let Some(rt) = t.buffer().device_memory().map(|m| m.runtime().clone()) else {
        return Err(TensorError::Device(DeviceError::NotOnDevice {
            op: "sum_of_squares",
            device: t.device(),
        }));
    };
    let blocks = rt.kernels().map_err(cuda_error)?.grid(n).grid_dim.0 as usize;
    let partials = Tensor::zeros(&[blocks], mirra_tensor::DType::F64, t.device())?;
    let (x, len, out) = (t.device_ptr()?, n as u64, partials.device_ptr()?);
    let dtype = t.dtype().as_str();
    mirra_cuda::launch!(rt, format!("sum_squares_partial_{dtype}"), n, |l| {
        l.arg(&x).arg(&len).arg(&out);
    })
    .map_err(cuda_error)?;
    Ok(partials.to_vec::<f64>()?.iter().sum())
}

/// `grads` divided by the loss scale (`times inv`) on their device, each into a copy of
/// its own, and whether every result is finite: one `unscale_check_<dtype>` launch per
/// gradient, all setting one flag in device memory, which the host reads once (one wait
/// for the device a step, not one per gradient, and no gradient copied to the host).
pub(crate) fn unscale_and_check(
    grads: &[Tensor],
    inv: f64,
) -> Result<(Vec<Tensor>, bool), TensorError> {
    let Some(first) = grads.first() else {
        return Ok((Vec::new(), true));
    };
    let device = first.device();
    let flag = Tensor::zeros(&[1], mirra_tensor::DType::I32, device)?;
    let flag_ptr = flag.device_ptr()?;
    let mut unscaled = Vec::with_capacity(grads.len());
    for g in grads {
        if g.device() != device {
            return Err(TensorError::Device(DeviceError::NotOnDevice {
                op: "unscale_check",
                device: g.device(),
            }));
        }
        let mut out = g.copy()?;
        let n = out.elem_count();
        let dtype = out.dtype().as_str();
        let memory = out.device_memory_mut()?;
        let (rt, x, len) = (memory.runtime().clone(), memory.ptr(), n as u64);
        mirra_cuda::launch!(rt, format!("unscale_check_{dtype}"), n, |l| {
            l.arg(&x).arg(&len).arg(&inv).arg(&flag_ptr);
        })
        .map_err(cuda_error)?;
        unscaled.push(out);
    }
    let finite = flag.to_vec::<i32>()?[0] == 0;
    Ok((unscaled, finite))
}
