use std::fmt;

use crate::{DeviceError, Result};

/// Where a buffer lives and where kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory; kernels run on the calling thread (matmul may use the rayon pool).
    Cpu,
    /// A CUDA device that exists: only [`Device::cuda`] makes one, after asking the driver.
    Cuda(CudaDevice),
}

/// A CUDA device the driver reported. Its field is private: no code can name a CUDA
/// device that does not exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaDevice {
    ordinal: usize,
}

impl CudaDevice {
    /// The driver's ordinal of the device.
    pub fn ordinal(self) -> usize {
        self.ordinal
    }
}

impl Device {
    /// The CUDA device `ordinal`, when the driver reports it; otherwise the error that says
    /// why not (`no CUDA driver found`, or how many devices there are).
    pub fn cuda(ordinal: usize) -> Result<Device> {
        mirra_cuda::check_device(ordinal)
            .map(|()| Device::Cuda(CudaDevice { ordinal }))
            .map_err(DeviceError::from)
    }

    /// True for [`Device::Cpu`].
    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// The CUDA ordinal, for a CUDA device.
    pub fn cuda_ordinal(&self) -> Option<usize> {
        match self {
            Device::Cpu => None,
            Device::Cuda(d) => Some(d.ordinal),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(d) => write!(f, "cuda:{}", d.ordinal),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cuda_device_exists_or_is_an_error_saying_why() {
        match mirra_cuda::device_count() {
            Err(_) => {
                let err = Device::cuda(0).unwrap_err().to_string();
                assert!(err.starts_with("no CUDA driver found"), "{err}");
            }
            Ok(count) => {
                let err = Device::cuda(count).unwrap_err().to_string();
                assert!(err.contains(&format!("cuda:{count}")), "{err}");
                if count > 0 {
                    let d = Device::cuda(0).unwrap();
                    assert_eq!(
                        (d.to_string(), d.cuda_ordinal()),
                        ("cuda:0".into(), Some(0))
                    );
                }
            }
        }
        assert_eq!(Device::Cpu.cuda_ordinal(), None);
    }
}
