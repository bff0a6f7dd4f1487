use std::fmt;

use mirra_cuda::runtime::DeviceBuffer;

use crate::{pool, DType, Device, DeviceError, Element, Result};

/// A contiguous run of elements of one [`DType`] on one [`Device`].
///
/// Host memory is held as 8-byte words (so every element type is aligned) and comes from
/// a process-wide recycling pool; dropping a buffer hands its memory back to that pool.
/// Device memory comes from the device's caching allocator (`mirra_cuda::allocator`).
/// Reading a device buffer as a host slice is an error naming the device, never a silent
/// copy: [`Buffer::to_device`] copies explicitly.
pub struct Buffer {
    storage: Storage,
    len: usize,
    dtype: DType,
    device: Device,
}

/// Where a buffer's bytes are.
enum Storage {
    Host(Vec<u64>),
    Cuda(DeviceBuffer),
}

impl Buffer {
    /// A buffer of `len` elements whose contents are unspecified (recycled memory). Use it
    /// for outputs that a kernel overwrites completely.
    pub fn alloc(dtype: DType, len: usize, device: Device) -> Result<Buffer> {
        let bytes = len * dtype.size_in_bytes();
        let storage = match device {
            Device::Cpu => Storage::Host(pool::take(bytes.div_ceil(8))),
            Device::Cuda(d) => {
                Storage::Cuda(mirra_cuda::runtime::runtime(d.ordinal())?.alloc(bytes)?)
            }
        };
        Ok(Buffer {
            storage,
            len,
            dtype,
            device,
        })
    }

    /// A buffer of `len` zero elements.
    pub fn zeros(dtype: DType, len: usize, device: Device) -> Result<Buffer> {
        let mut b = Buffer::alloc(dtype, len, device)?;
        match &mut b.storage {
            Storage::Host(words) => words.fill(0),
            Storage::Cuda(d) => d.fill_zero()?,
        }
        Ok(b)
    }

    /// A buffer on `device` holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T], device: Device) -> Result<Buffer> {
        let mut b = Buffer::alloc(T::DTYPE, data.len(), device)?;
        match &mut b.storage {
            Storage::Host(_) => b.as_mut_slice::<T>()?.copy_from_slice(data),
            Storage::Cuda(d) => d.upload(bytemuck::cast_slice(data))?,
        }
        Ok(b)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Size of the contents in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }

    /// The device memory, for a buffer on a CUDA device (what CUDA kernels read and write).
    pub fn device_memory(&self) -> Option<&DeviceBuffer> {
        match &self.storage {
            Storage::Host(_) => None,
            Storage::Cuda(d) => Some(d),
        }
    }

    /// The device memory, mutably.
    pub fn device_memory_mut(&mut self) -> Option<&mut DeviceBuffer> {
        match &mut self.storage {
            Storage::Host(_) => None,
            Storage::Cuda(d) => Some(d),
        }
    }

    fn not_on_host(&self, op: &'static str) -> DeviceError {
        DeviceError::NotOnHost {
            op,
            device: self.device,
        }
    }

    /// The raw bytes; an error for a buffer on a device.
    pub fn as_bytes(&self) -> Result<&[u8]> {
        let n = self.size_in_bytes();
        match &self.storage {
            Storage::Host(words) => Ok(&bytemuck::cast_slice(words)[..n]),
            Storage::Cuda(_) => Err(self.not_on_host("read the bytes of a buffer")),
        }
    }

    /// The raw bytes, mutably; an error for a buffer on a device.
    pub fn as_bytes_mut(&mut self) -> Result<&mut [u8]> {
        let n = self.size_in_bytes();
        let err = self.not_on_host("write the bytes of a buffer");
        match &mut self.storage {
            Storage::Host(words) => Ok(&mut bytemuck::cast_slice_mut(words)[..n]),
            Storage::Cuda(_) => Err(err),
        }
    }

    /// The elements as `T`; an error when `T` is not the buffer's dtype or the buffer is
    /// on a device.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check::<T>()?;
        Ok(bytemuck::cast_slice(self.as_bytes()?))
    }

    /// The elements as `T`, mutably; an error when `T` is not the buffer's dtype or the
    /// buffer is on a device.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check::<T>()?;
        Ok(bytemuck::cast_slice_mut(self.as_bytes_mut()?))
    }

    /// Copy the contents of `src` (same device, dtype and length) into this buffer.
    pub fn copy_from(&mut self, src: &Buffer) -> Result<()> {
        self.check_same_kind("copy_from", src)?;
        if self.len != src.len {
            return Err(DeviceError::LengthMismatch {
                op: "copy_from",
                lhs: self.len,
                rhs: src.len,
            });
        }
        match (&mut self.storage, &src.storage) {
            (Storage::Cuda(d), Storage::Cuda(s)) => Ok(d.copy_from(s)?),
            _ => {
                self.as_bytes_mut()?.copy_from_slice(src.as_bytes()?);
                Ok(())
            }
        }
    }

    /// Copy `len` elements of `src` from element `src_at` into this buffer at element
    /// `at` (same device and dtype; on a CUDA device, in its stream's order): a gradient
    /// into its place in a flat bucket.
    pub fn copy_range_from(
        &mut self,
        at: usize,
        src: &Buffer,
        src_at: usize,
        len: usize,
    ) -> Result<()> {
        const OP: &str = "copy_range_from";
        self.check_same_kind(OP, src)?;
        for (start, buf_len) in [(at, self.len), (src_at, src.len)] {
            if start.checked_add(len).is_none_or(|end| end > buf_len) {
                return Err(DeviceError::OutOfRange {
                    op: OP,
                    start,
                    end: start.saturating_add(len),
                    len: buf_len,
                });
            }
        }
        let size = self.dtype.size_in_bytes();
        match (&mut self.storage, &src.storage) {
            (Storage::Cuda(d), Storage::Cuda(s)) => Ok(d.copy_rows_from(
                at * size,
                len * size,
                s,
                src_at * size,
                len * size,
                len * size,
                1,
            )?),
            _ => {
                let from = &src.as_bytes()?[src_at * size..(src_at + len) * size];
                self.as_bytes_mut()?[at * size..(at + len) * size].copy_from_slice(from);
                Ok(())
            }
        }
    }

    /// A copy of this buffer on `device` (host to device, device to host, or within one
    /// place): the explicit copy that reading another device's memory needs.
    pub fn to_device(&self, device: Device) -> Result<Buffer> {
        let mut out = Buffer::alloc(self.dtype, self.len, device)?;
        match (&mut out.storage, &self.storage) {
            (Storage::Host(_), Storage::Host(_)) => out.copy_from(self)?,
            (Storage::Cuda(d), Storage::Host(_)) => d.upload(self.as_bytes()?)?,
            (Storage::Host(_), Storage::Cuda(s)) => {
                let n = self.size_in_bytes();
                let Storage::Host(words) = &mut out.storage else {
                    unreachable!()
                };
                s.download(&mut bytemuck::cast_slice_mut(words)[..n])?;
            }
            (Storage::Cuda(d), Storage::Cuda(s)) if self.device == device => d.copy_from(s)?,
            // Between two devices: through the host.
            (Storage::Cuda(_), Storage::Cuda(_)) => {
                out = self.to_device(Device::Cpu)?.to_device(device)?;
            }
        }
        Ok(out)
    }

    /// An error unless `src` is on this buffer's device and of its dtype.
    fn check_same_kind(&self, op: &'static str, src: &Buffer) -> Result<()> {
        if self.device != src.device {
            return Err(DeviceError::DeviceMismatch {
                op,
                lhs: self.device,
                rhs: src.device,
            });
        }
        if self.dtype != src.dtype {
            return Err(DeviceError::DTypeMismatch {
                actual: self.dtype,
                requested: src.dtype,
            });
        }
        Ok(())
    }

    fn check<T: Element>(&self) -> Result<()> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(DeviceError::DTypeMismatch {
                actual: self.dtype,
                requested: T::DTYPE,
            })
        }
    }
}

impl Clone for Buffer {
    /// A copy in the same place. A device buffer is copied on its device; should the device
    /// have no memory left for it, this panics as a host `Vec`'s clone aborts (use
    /// [`Buffer::to_device`] to handle the error).
    fn clone(&self) -> Self {
        let storage = match &self.storage {
            Storage::Host(words) => {
                let mut copy = pool::take(words.len());
                copy.copy_from_slice(words);
                Storage::Host(copy)
            }
            Storage::Cuda(d) => Storage::Cuda(
                d.try_clone()
                    .unwrap_or_else(|e| panic!("copying a buffer on {}: {e}", self.device)),
            ),
        };
        Buffer {
            storage,
            len: self.len,
            dtype: self.dtype,
            device: self.device,
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Storage::Host(words) = &mut self.storage {
            pool::give(std::mem::take(words));
        }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Buffer({} x {} on {})",
            self.len, self.dtype, self.device
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn typed_views_round_trip_every_dtype() {
        let b = Buffer::from_slice(&[1.0f64, -2.0, 3.5], Device::Cpu).unwrap();
        assert_eq!(b.as_slice::<f64>().unwrap(), &[1.0, -2.0, 3.5]);
        let h = [
            bf16::from_f32(1.0),
            bf16::from_f32(2.0),
            bf16::from_f32(-0.5),
        ];
        let b = Buffer::from_slice(&h, Device::Cpu).unwrap();
        assert_eq!(b.size_in_bytes(), 6);
        assert_eq!(b.as_slice::<bf16>().unwrap(), &h);
        let b = Buffer::from_slice(&[7u8, 8, 9], Device::Cpu).unwrap();
        assert_eq!(b.clone().as_slice::<u8>().unwrap(), &[7, 8, 9]);
        let c = b.to_device(Device::Cpu).unwrap();
        assert_eq!(c.as_slice::<u8>().unwrap(), &[7, 8, 9]);
    }

    #[test]
    fn without_a_gpu_a_cuda_buffer_cannot_be_made() {
        // No Device::Cuda exists without a driver and a device: Device::cuda says why.
        if mirra_cuda::device_count().is_err() {
            let e = Device::cuda(0).unwrap_err().to_string();
            assert!(e.starts_with("no CUDA driver found"), "{e}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn device_buffers_round_trip_and_refuse_host_views() {
        let gpu = Device::cuda(0).unwrap();
        let data: Vec<f32> = (0..10_001).map(|i| i as f32 * 0.5 - 7.0).collect();
        let b = Buffer::from_slice(&data, gpu).unwrap();
        let e = b.as_slice::<f32>().unwrap_err().to_string();
        assert!(e.contains("cuda:0"), "{e}");
        let z = Buffer::zeros(DType::F32, 3, gpu)
            .unwrap()
            .to_device(Device::Cpu)
            .unwrap();
        assert_eq!(z.as_slice::<f32>().unwrap(), &[0.0; 3]);
        let mut copy = Buffer::alloc(DType::F32, data.len(), gpu).unwrap();
        copy.copy_from(&b.clone()).unwrap();
        let back = copy.to_device(Device::Cpu).unwrap();
        assert_eq!(back.as_slice::<f32>().unwrap(), &data[..]);
        let e = copy.copy_from(&back).unwrap_err().to_string();
        assert!(e.contains("different devices"), "{e}");
    }

    /// Ranges copied between two buffers on `device`, read back through the host; ranges
    /// outside a buffer and buffers of other dtypes or devices are errors.
    fn range_copies_on(device: Device) {
        let src =
            Buffer::from_slice(&(0..10).map(|i| i as f32).collect::<Vec<_>>(), device).unwrap();
        let mut dst = Buffer::zeros(DType::F32, 8, device).unwrap();
        dst.copy_range_from(2, &src, 5, 4).unwrap();
        dst.copy_range_from(0, &src, 9, 1).unwrap();
        dst.copy_range_from(7, &src, 0, 0).unwrap();
        let back = dst.to_device(Device::Cpu).unwrap();
        assert_eq!(
            back.as_slice::<f32>().unwrap(),
            &[9.0, 0.0, 5.0, 6.0, 7.0, 8.0, 0.0, 0.0]
        );
        let e = dst.copy_range_from(5, &src, 0, 4).unwrap_err().to_string();
        assert_eq!(e, "copy_range_from: elements 5..9 of a buffer of 8");
        let e = dst.copy_range_from(0, &src, 8, 3).unwrap_err().to_string();
        assert_eq!(e, "copy_range_from: elements 8..11 of a buffer of 10");
        let ints = Buffer::zeros(DType::I32, 4, device).unwrap();
        assert!(dst.copy_range_from(0, &ints, 0, 1).is_err());
        if !device.is_cpu() {
            let host = Buffer::zeros(DType::F32, 4, Device::Cpu).unwrap();
            let e = dst.copy_range_from(0, &host, 0, 1).unwrap_err().to_string();
            assert!(e.contains("different devices"), "{e}");
        }
    }

    #[test]
    fn ranges_copy_between_host_buffers() {
        range_copies_on(Device::Cpu);
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn ranges_copy_between_device_buffers() {
        range_copies_on(Device::cuda(0).unwrap());
    }

    #[test]
    fn wrong_typed_view_is_an_error() {
        let b = Buffer::zeros(DType::F32, 4, Device::Cpu).unwrap();
        let err = b.as_slice::<i64>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "buffer holds f32 elements, but i64 was requested"
        );
    }

    #[test]
    fn zeros_are_zero_even_from_recycled_memory() {
        let mut b = Buffer::alloc(DType::F32, 16, Device::Cpu).unwrap();
        b.as_mut_slice::<f32>().unwrap().fill(3.0);
        drop(b);
        let z = Buffer::zeros(DType::F32, 16, Device::Cpu).unwrap();
        assert!(z.as_slice::<f32>().unwrap().iter().all(|&x| x == 0.0));
    }
}
