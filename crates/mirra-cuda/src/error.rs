//! One error type for every CUDA library, naming the call that failed.

use cudarc::{cublas::result::CublasError, driver::DriverError, nvrtc::CompileError};

/// What went wrong in a CUDA call, or before one could be made.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The driver library (`libcuda.so`) is not on this machine.
    #[error("no CUDA driver found (looked for {searched})")]
    NoDriver {
        /// The file names that were tried, comma-separated.
        searched: String,
    },
    /// Another library (cuBLAS, NVRTC, NCCL) is not on this machine.
    #[error(
        "{library} not found (looked for {searched}); add the folder that holds it to \
         LD_LIBRARY_PATH{hint}"
    )]
    LibraryMissing {
        /// The library's name as users know it.
        library: &'static str,
        /// The file names that were tried, comma-separated.
        searched: String,
        /// What else may help (empty or starting with "; ").
        hint: &'static str,
    },
    /// The driver found no device with this ordinal.
    #[error("no CUDA device cuda:{ordinal} (this machine has {count})")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// A driver API call failed.
    #[error("CUDA driver: {op} failed: {source}")]
    Driver {
        /// The call, in words.
        op: &'static str,
        /// The driver's error code.
        source: DriverError,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS: {op} failed: {source}")]
    Cublas {
        /// The call, in words.
        op: &'static str,
        /// cuBLAS's status.
        source: CublasError,
    },
    /// NVRTC could not compile a kernel.
    #[error("NVRTC: {op} failed: {message}")]
    Nvrtc {
        /// The call, in words.
        op: &'static str,
        /// NVRTC's status and, for a compile error, its log.
        message: String,
    },
    /// An NCCL call failed.
    #[error("NCCL: {op} failed: {code}")]
    Nccl {
        /// The call, in words.
        op: &'static str,
        /// NCCL's result code, by name.
        code: String,
    },
    /// The device has too little free memory, even after the caching allocator released
    /// every cached block.
    #[error(
        "CUDA device out of memory: {bytes} bytes requested with {in_use} bytes in use by \
         mirra (a smaller batch, or another process on the device?)"
    )]
    OutOfMemory {
        /// The request's size class.
        bytes: usize,
        /// Bytes mirra's allocator had handed out.
        in_use: usize,
    },
    /// What this build of mirra cannot do on this device, or a kernel it does not have.
    #[error("{what}")]
    Unsupported {
        /// What, in words.
        what: String,
    },
    /// A result computed on the device differs from the host's.
    #[error("{what}: {detail}")]
    WrongResult {
        /// What was checked.
        what: &'static str,
        /// Where and by how much it differs.
        detail: String,
    },
}

/// Results of this crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// `map_err` helpers that name the call.
pub(crate) trait Context<T> {
    /// Wraps the library error with the call's name.
    fn op(self, op: &'static str) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, DriverError> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|source| CudaError::Driver { op, source })
    }
}

impl<T> Context<T> for std::result::Result<T, CublasError> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|source| CudaError::Cublas { op, source })
    }
}

impl<T> Context<T> for std::result::Result<T, CompileError> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|e| CudaError::Nvrtc {
            op,
            message: match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            },
        })
    }
}

impl<T> Context<T> for std::result::Result<T, cudarc::nccl::result::NcclError> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|e| CudaError::Nccl {
            op,
            code: format!("{:?}", e.0),
        })
    }
}
