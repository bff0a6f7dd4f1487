use crate::{DType, Device};

/// Errors of device and buffer handling.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// CUDA could not be used: no driver, no such device, or a failed call.
    #[error(transparent)]
    Cuda(#[from] mirra_cuda::CudaError),
    /// An operation that has no CUDA implementation yet was asked of a CUDA buffer.
    #[error("{op} on {device}: device buffers are not implemented yet (CPU only for now)")]
    NotOnDevice {
        /// The operation.
        op: &'static str,
        /// The device.
        device: Device,
    },
    /// A host view (a slice) of a buffer that lives on a device.
    #[error(
        "{op}: the buffer is on {device}, not in host memory; copy it to the host first \
         (to_device(Device::Cpu))"
    )]
    NotOnHost {
        /// The operation that needed host memory.
        op: &'static str,
        /// The device the buffer is on.
        device: Device,
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
    /// A range that does not lie inside its buffer.
    #[error("{op}: elements {start}..{end} of a buffer of {len}")]
    OutOfRange {
        /// The operation.
        op: &'static str,
        /// The range's first element.
        start: usize,
        /// One past its last.
        end: usize,
        /// The buffer's length.
        len: usize,
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
