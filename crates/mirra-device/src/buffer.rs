use std::fmt;

use crate::{pool, DType, Device, DeviceError, Element, Result};

/// A contiguous run of elements of one [`DType`] on one [`Device`].
///
/// Host memory is held as 8-byte words (so every element type is aligned) and comes from
/// a per-thread recycling pool; dropping a buffer hands its memory back to that pool.
pub struct Buffer {
    words: Vec<u64>,
    len: usize,
    dtype: DType,
    device: Device,
}

impl Buffer {
    /// A buffer of `len` elements whose contents are unspecified (recycled memory). Use it
    /// for outputs that a kernel overwrites completely.
    pub fn alloc(dtype: DType, len: usize, device: Device) -> Result<Buffer> {
        check_device(device)?;
        let words = (len * dtype.size_in_bytes()).div_ceil(8);
        Ok(Buffer {
            words: pool::take(words),
            len,
            dtype,
            device,
        })
    }

    /// A buffer of `len` zero elements.
    pub fn zeros(dtype: DType, len: usize, device: Device) -> Result<Buffer> {
        let mut b = Buffer::alloc(dtype, len, device)?;
        b.words.fill(0);
        Ok(b)
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T], device: Device) -> Result<Buffer> {
        let mut b = Buffer::alloc(T::DTYPE, data.len(), device)?;
        b.as_mut_slice::<T>()?.copy_from_slice(data);
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

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.size_in_bytes()]
    }

    /// The raw bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let n = self.size_in_bytes();
        &mut bytemuck::cast_slice_mut(&mut self.words)[..n]
    }

    /// The elements as `T`; an error when `T` is not the buffer's dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check::<T>()?;
        Ok(bytemuck::cast_slice(self.as_bytes()))
    }

    /// The elements as `T`, mutably; an error when `T` is not the buffer's dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check::<T>()?;
        Ok(bytemuck::cast_slice_mut(self.as_bytes_mut()))
    }

    /// Copy the contents of `src` (same dtype and length) into this buffer.
    pub fn copy_from(&mut self, src: &Buffer) -> Result<()> {
        if self.device != src.device {
            return Err(DeviceError::DeviceMismatch {
                op: "copy_from",
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
        if self.len != src.len {
            return Err(DeviceError::LengthMismatch {
                op: "copy_from",
                lhs: self.len,
                rhs: src.len,
            });
        }
        self.as_bytes_mut().copy_from_slice(src.as_bytes());
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

fn check_device(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        device @ Device::Cuda(_) => Err(DeviceError::NotOnDevice {
            op: "allocate a buffer",
            device,
        }),
    }
}

impl Clone for Buffer {
    fn clone(&self) -> Self {
        let mut words = pool::take(self.words.len());
        words.copy_from_slice(&self.words);
        Buffer {
            words,
            len: self.len,
            dtype: self.dtype,
            device: self.device,
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        pool::give(std::mem::take(&mut self.words));
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
