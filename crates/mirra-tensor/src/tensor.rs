use std::fmt;
use std::sync::Arc;

use mirra_cuda::runtime::DeviceBuffer;
use mirra_device::{Buffer, DType, Device, DeviceError, Element};

use crate::cast;
use crate::dispatch::with_any;
use crate::layout::for_each_row;
use crate::{Layout, Result, Shape, TensorError};

/// An n-dimensional array: a reference-counted [`Buffer`] and a [`Layout`] over it.
///
/// Cloning is cheap (the buffer is shared). Tensors are values: operations return new
/// tensors, and [`Tensor::data_mut`] copies the buffer first when it is shared, so a
/// write is never seen through another tensor.
#[derive(Clone)]
pub struct Tensor {
    buffer: Arc<Buffer>,
    layout: Layout,
}

impl Tensor {
    /// A contiguous tensor over a whole buffer; an error when the sizes disagree.
    pub fn from_buffer(buffer: Buffer, shape: &[usize]) -> Result<Tensor> {
        let shape = Shape::new(shape)?;
        if shape.elem_count() != buffer.len() {
            return Err(TensorError::Invalid {
                op: "from_buffer",
                msg: format!("buffer holds {} elements", buffer.len()),
                shape,
            });
        }
        Ok(Tensor {
            buffer: Arc::new(buffer),
            layout: Layout::contiguous(shape),
        })
    }

    /// A tensor holding a copy of `data` with the given shape.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::from_buffer(Buffer::from_slice(data, device)?, shape).map_err(|e| match e {
            TensorError::Invalid { shape, .. } => TensorError::Invalid {
                op: "from_slice",
                msg: format!(
                    "{} values given for {} elements",
                    data.len(),
                    shape.elem_count()
                ),
                shape,
            },
            e => e,
        })
    }

    /// A tensor from a vector of values with the given shape.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::from_slice(&data, shape, device)
    }

    /// A rank-0 tensor holding `value`.
    pub fn scalar<T: Element>(value: T, device: Device) -> Result<Tensor> {
        Tensor::from_slice(&[value], &[], device)
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        let shape = Shape::new(shape)?;
        Tensor::from_buffer(Buffer::zeros(dtype, shape.elem_count(), device)?, &shape)
    }

    /// A tensor with every element `value` (converted to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = Shape::new(shape)?;
        if !device.is_cpu() {
            return Tensor::cuda_full(&shape, value, dtype, device);
        }
        let mut buf = Buffer::alloc(dtype, shape.elem_count(), device)?;
        with_any!(dtype, T => buf.as_mut_slice::<T>()?.fill(<T as Element>::from_f64(value)));
        Tensor::from_buffer(buf, &shape)
    }

    /// A tensor of ones.
    pub fn ones(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// A new tensor with this one's shape, every element `value`.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Tensor::full(self.shape(), value, self.dtype(), self.device())
    }

    /// A new tensor of zeros with this one's shape and dtype.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.dtype(), self.device())
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        self.layout.shape()
    }

    /// The dimensions (same as `shape()`, as a slice).
    pub fn dims(&self) -> &[usize] {
        self.layout.shape()
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().rank()
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape().elem_count()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.buffer.dtype()
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        self.buffer.device()
    }

    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// True when the elements are a row-major run of the buffer.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// True when both tensors view the same buffer.
    pub fn same_buffer(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.buffer, &other.buffer)
    }

    /// The underlying buffer (all of it, whatever part the layout views).
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// This tensor on `device`: the same tensor when it is there already, otherwise a copy
    /// of its buffer there, seen through the same layout (host to device, device to host).
    /// The one way to read a device tensor's elements: host views of device memory are
    /// errors, never silent copies.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if self.device() == device {
            return Ok(self.clone());
        }
        Ok(Tensor {
            buffer: Arc::new(self.buffer.to_device(device)?),
            layout: self.layout,
        })
    }

    /// A view of the same buffer with another layout.
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            buffer: self.buffer.clone(),
            layout,
        }
    }

    /// The elements of a contiguous tensor as a slice; an error for a strided view or
    /// another dtype (call [`Tensor::contiguous`] first).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if !self.is_contiguous() {
            return Err(TensorError::Invalid {
                op: "as_slice",
                msg: "tensor is a strided view; call contiguous() first".into(),
                shape: *self.shape(),
            });
        }
        let start = self.layout.offset();
        Ok(&self.buffer.as_slice::<T>()?[start..start + self.elem_count()])
    }

    /// The bytes of a contiguous tensor's elements, in row-major order; an error for a
    /// strided view.
    pub fn as_bytes(&self) -> Result<&[u8]> {
        if !self.is_contiguous() {
            return Err(TensorError::Invalid {
                op: "as_bytes",
                msg: "tensor is a strided view; call contiguous() first".into(),
                shape: *self.shape(),
            });
        }
        let size = self.dtype().size_in_bytes();
        let start = self.layout.offset() * size;
        Ok(&self.buffer.as_bytes()?[start..start + self.elem_count() * size])
    }

    /// The buffer itself when this tensor is its only owner and views all of it in order
    /// (no copy); otherwise the tensor, unchanged. Lets a caller hand a buffer out as a
    /// tensor and take it back for reuse once every view of it is gone.
    pub fn into_buffer(self) -> std::result::Result<Buffer, Tensor> {
        let whole = self.layout.offset() == 0 && self.elem_count() == self.buffer.len();
        if !(self.is_contiguous() && whole) {
            return Err(self);
        }
        let Tensor { buffer, layout } = self;
        Arc::try_unwrap(buffer).map_err(|buffer| Tensor { buffer, layout })
    }

    /// This tensor's buffer, mutably, when the tensor is its only owner (no other tensor
    /// or view shares it); `None` otherwise. For kernels that write in place only what
    /// nothing else can see.
    pub(crate) fn unshared_buffer_mut(&mut self) -> Option<&mut Buffer> {
        Arc::get_mut(&mut self.buffer)
    }

    /// The elements, mutably. Makes the tensor contiguous and its buffer unshared first
    /// (copying when needed), so the write is seen by this tensor alone.
    pub fn data_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        if T::DTYPE != self.dtype() {
            return Err(TensorError::DTypeMismatch {
                op: "data_mut",
                lhs: self.dtype(),
                rhs: T::DTYPE,
            });
        }
        let whole = self.layout.offset() == 0 && self.elem_count() == self.buffer.len();
        if !(self.is_contiguous() && whole) {
            *self = self.copy()?;
        }
        let buf = Arc::make_mut(&mut self.buffer);
        Ok(buf.as_mut_slice::<T>()?)
    }

    /// The memory of a tensor on a CUDA device, for a kernel that writes it in place. Makes
    /// the tensor contiguous and its buffer unshared first (copying on the device when
    /// needed), as [`Tensor::data_mut`] does on the host; an error for a host tensor.
    pub fn device_memory_mut(&mut self) -> Result<&mut DeviceBuffer> {
        let device = self.device();
        let not_on_device = TensorError::Device(DeviceError::NotOnDevice {
            op: "device_memory_mut",
            device,
        });
        if device.is_cpu() {
            return Err(not_on_device);
        }
        let whole = self.layout.offset() == 0 && self.elem_count() == self.buffer.len();
        if !(self.is_contiguous() && whole) || Arc::strong_count(&self.buffer) > 1 {
            *self = self.copy()?;
        }
        Arc::get_mut(&mut self.buffer)
            .and_then(Buffer::device_memory_mut)
            .ok_or(not_on_device)
    }

    /// The elements in row-major order, copied out (from a device: after everything queued
    /// before on its stream, as PyTorch's `tolist()`).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let host = self.to_device(Device::Cpu)?;
        Ok(host.contiguous()?.as_slice::<T>()?.to_vec())
    }

    /// The single element of a one-element tensor.
    pub fn to_scalar<T: Element>(&self) -> Result<T> {
        if self.elem_count() != 1 {
            return Err(TensorError::Invalid {
                op: "to_scalar",
                msg: "tensor does not hold exactly one element".into(),
                shape: *self.shape(),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// This tensor if it is contiguous, else a contiguous copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            Ok(self.clone())
        } else {
            self.copy()
        }
    }

    /// A contiguous copy with its own buffer.
    pub fn copy(&self) -> Result<Tensor> {
        if !self.device().is_cpu() {
            return self.cuda_copy();
        }
        let shape = *self.shape();
        let mut out = Buffer::alloc(self.dtype(), shape.elem_count(), self.device())?;
        with_any!(self.dtype(), T => {
            let src = self.buffer.as_slice::<T>()?;
            let dst = out.as_mut_slice::<T>()?;
            let strides = self.layout.broadcast_strides(&shape);
            let inner = *shape.last().unwrap_or(&1);
            let step = if shape.rank() == 0 { 0 } else { strides[shape.rank() - 1] };
            if !dst.is_empty() && strides[..shape.rank()].iter().all(|&s| s == 0) {
                // One element broadcast (the gradient of a sum): a fill.
                dst.fill(src[self.layout.offset()]);
            } else {
                let mut o = 0;
                for_each_row(&shape, [&strides], [self.layout.offset()], |[s]| {
                    let row = &mut dst[o..o + inner];
                    match step {
                        1 => row.copy_from_slice(&src[s..s + inner]),
                        0 => row.fill(src[s]),
                        _ => {
                            for (j, d) in row.iter_mut().enumerate() {
                                *d = src[s + j * step];
                            }
                        }
                    }
                    o += inner;
                });
            }
        });
        Tensor::from_buffer(out, &shape)
    }

    /// The elements converted to another dtype (a copy; floats round to nearest,
    /// floats to integers truncate toward zero).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        if !self.device().is_cpu() {
            return self.cuda_to_dtype(dtype);
        }
        // A transposed or permuted view of a whole buffer converts the buffer in order
        // and keeps the view: no strided gather (matrix products of 16-bit transposed
        // operands, which gemm then reads with their strides).
        let (src, view) = if self.layout.is_dense_permutation(self.buffer.len()) {
            let whole = self.buffer.len();
            (
                self.with_layout(Layout::contiguous(Shape::new(&[whole])?)),
                Some(self.layout),
            )
        } else {
            (self.contiguous()?, None)
        };
        let mut out = Buffer::alloc(dtype, src.elem_count(), self.device())?;
        use half::{bf16, f16};
        match (self.dtype(), dtype) {
            (DType::F32, DType::BF16) => {
                cast::from_f32(src.as_slice::<f32>()?, out.as_mut_slice::<bf16>()?);
            }
            (DType::F32, DType::F16) => {
                cast::from_f32(src.as_slice::<f32>()?, out.as_mut_slice::<f16>()?);
            }
            (DType::BF16, DType::F32) => {
                cast::to_f32(src.as_slice::<bf16>()?, out.as_mut_slice::<f32>()?);
            }
            (DType::F16, DType::F32) => {
                cast::to_f32(src.as_slice::<f16>()?, out.as_mut_slice::<f32>()?);
            }
            _ => self.convert_through_f64(&src, &mut out)?,
        }
        let converted = Tensor::from_buffer(out, src.dims())?;
        Ok(match view {
            Some(layout) => converted.with_layout(layout),
            None => converted,
        })
    }

    /// [`to_dtype`](Self::to_dtype)'s generic path: every pair of dtypes, one element at
    /// a time through f64.
    fn convert_through_f64(&self, src: &Tensor, out: &mut Buffer) -> Result<()> {
        let dtype = out.dtype();
        with_any!(self.dtype(), S => {
            let s = src.as_slice::<S>()?;
            with_any!(dtype, D => {
                for (d, &x) in out.as_mut_slice::<D>()?.iter_mut().zip(s) {
                    // Through the trait: `half` has inherent `from_f64`s that round wrongly.
                    *d = <D as Element>::from_f64(Element::to_f64(x));
                }
            });
        });
        Ok(())
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({} {} on {}",
            self.shape(),
            self.dtype(),
            self.device()
        )?;
        if self.elem_count() <= 16 {
            if let Ok(v) = self.to_dtype(DType::F64).and_then(|t| t.to_vec::<f64>()) {
                write!(f, ", {v:?}")?;
            }
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_slice_checks_the_element_count() {
        let err = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2], Device::Cpu).unwrap_err();
        assert_eq!(
            err.to_string(),
            "from_slice: 3 values given for 4 elements (shape [2, 2])"
        );
    }

    #[test]
    fn data_mut_never_writes_through_a_shared_buffer() {
        let a = Tensor::from_slice(&[1.0f32, 2.0], &[2], Device::Cpu).unwrap();
        let mut b = a.clone();
        b.data_mut::<f32>().unwrap()[0] = 9.0;
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![9.0, 2.0]);
    }

    #[test]
    fn dtype_conversion_round_trips_small_integers() {
        let a = Tensor::from_slice(&[1u8, 200, 3], &[3], Device::Cpu).unwrap();
        let f = a
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::I64)
            .unwrap();
        assert_eq!(f.to_vec::<i64>().unwrap(), vec![1, 200, 3]);
    }

    #[test]
    fn into_buffer_gives_back_an_unshared_whole_buffer_only() {
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], Device::Cpu).unwrap();
        let view = a.narrow(0, 1, 2).unwrap();
        assert_eq!(view.as_bytes().unwrap(), bytes_of(&[2.0f32, 3.0]));
        let a = a.into_buffer().expect_err("a view still shares it");
        let view = view.into_buffer().expect_err("a part is not the buffer");
        drop(view);
        let square = a.reshape(&[2, 2]).unwrap();
        drop(a);
        let b = square.into_buffer().unwrap();
        assert_eq!(b.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], Device::Cpu).unwrap();
        let strided = t.transpose(0, 1).unwrap();
        assert!(strided.as_bytes().is_err());
        assert!(strided.into_buffer().is_err());
    }

    /// Permuted views of a whole buffer convert in place of the view (same values as
    /// converting a contiguous copy, the view's strides kept); views that skip, repeat
    /// or start inside the buffer are copied first, as before.
    #[test]
    fn views_convert_to_the_values_of_their_contiguous_copies() {
        let data: Vec<f32> = (0..2 * 3 * 4).map(|v| v as f32 * 1.37 - 9.0).collect();
        let t = Tensor::from_slice(&data, &[2, 3, 4], Device::Cpu).unwrap();
        let views = [
            (t.transpose(1, 2).unwrap(), true),
            (t.permute(&[2, 0, 1]).unwrap(), true),
            (t.narrow(1, 1, 2).unwrap(), false),
            (t.narrow(0, 1, 1).unwrap().transpose(1, 2).unwrap(), false),
            (
                t.narrow(0, 0, 1).unwrap().broadcast_to(&[3, 3, 4]).unwrap(),
                false,
            ),
        ];
        for (v, dense) in views {
            assert_eq!(
                v.layout().is_dense_permutation(v.buffer().len()),
                dense,
                "{v:?}"
            );
            for dtype in [DType::BF16, DType::F16, DType::F64] {
                let got = v.to_dtype(dtype).unwrap();
                let want = v.contiguous().unwrap().to_dtype(dtype).unwrap();
                assert_eq!(got.dims(), v.dims());
                assert_eq!(got.is_contiguous(), !dense, "{v:?} {dtype:?}");
                let back = |x: &Tensor| x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                assert_eq!(back(&got), back(&want), "{v:?} {dtype:?}");
            }
        }
    }

    fn bytes_of(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }
}
