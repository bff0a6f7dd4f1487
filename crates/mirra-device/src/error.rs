use crate::{DType, Device};

/// Errors of device and buffer handling.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A CUDA device was requested from a build without the `cuda` feature.
    #[error("device cuda:{ordinal} requested, but mirra was built without CUDA support")]
    NotCompiledWithCuda {
        /// The requested device ordinal.
        ordinal: usize,
    },
    /// A typed view asked for a different element type than the buffer holds.
    #[error("buffer holds {actual} elements, but {requested} was requested")]
    DTypeMismatch {
        /// The dtype of the buffer.
        actual: DType,
        /// The dtype the caller asked for.
        requested: DType,
    },
    /// Two buffers that must share a device do not.
    #[error("{op}: buffers on different devices ({lhs} and {rhs})")]
    DeviceMismatch {
        /// The operation that needed one device.
        op: &'static str,
        /// The first device.
        lhs: Device,
        /// The second device.
        rhs: Device,
    },
    /// A copy between buffers of different lengths.
    #[error("{op}: length mismatch ({lhs} vs {rhs} elements)")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// Elements on the left.
        lhs: usize,
        /// Elements on the right.
        rhs: usize,
    },
}
