use std::fmt;

use crate::{DeviceError, Result};

/// Where a buffer lives and where kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory; kernels run on the calling thread (matmul may use the rayon pool).
    Cpu,
    /// A CUDA device by ordinal. Only constructible through [`Device::cuda`], which fails
    /// in builds without CUDA support.
    Cuda(usize),
}

impl Device {
    /// The CUDA device `ordinal`; an error in a build without CUDA support.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Err(DeviceError::NotCompiledWithCuda { ordinal })
    }

    /// True for [`Device::Cpu`].
    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_without_support_is_an_error_naming_the_device() {
        let err = Device::cuda(3).unwrap_err();
        assert!(err.to_string().contains("cuda:3"), "{err}");
    }
}
