//! The CUDA devices this machine has.

use cudarc::driver::CudaContext;

use crate::error::Context;
use crate::library::{self, Library};
use crate::{CudaError, Result};

/// How many CUDA devices the driver sees; `Err(NoDriver)` without a driver.
pub fn device_count() -> Result<usize> {
    library::ensure(Library::Driver)?;
    // cuInit (once per process) happens inside.
    Ok(CudaContext::device_count().op("cuDeviceGetCount")? as usize)
}

/// `Ok` when device `ordinal` exists; otherwise the error that says why not (no driver, or
/// how many devices there are).
pub fn check_device(ordinal: usize) -> Result<()> {
    let count = device_count()?;
    if ordinal < count {
        Ok(())
    } else {
        Err(CudaError::NoSuchDevice { ordinal, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_that_does_not_exist_is_an_error_naming_it() {
        match device_count() {
            Err(e) => {
                assert!(e.to_string().starts_with("no CUDA driver found"), "{e}");
                assert!(check_device(0).is_err());
            }
            Ok(count) => {
                let e = check_device(count).unwrap_err().to_string();
                assert_eq!(
                    e,
                    format!("no CUDA device cuda:{count} (this machine has {count})")
                );
            }
        }
    }
}
