use mirra_device::{DType, DeviceError};

use crate::Shape;

/// Errors of tensor operations. Each names the operation and the shapes or dtypes involved.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// Two operands whose shapes do not fit the operation.
    #[error("{op}: shapes {lhs} and {rhs} do not match")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// Shape of the first operand.
        lhs: Shape,
        /// Shape of the second operand.
        rhs: Shape,
    },
    /// Two operands of different dtypes.
    #[error("{op}: dtypes {lhs} and {rhs} differ")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// Dtype of the first operand.
        lhs: DType,
        /// Dtype of the second operand.
        rhs: DType,
    },
    /// An operation that does not support this dtype.
    #[error("{op}: dtype {dtype} is not supported")]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
    },
    /// An axis outside the tensor's rank.
    #[error("{op}: axis {axis} out of range for shape {shape}")]
    AxisOutOfRange {
        /// The operation.
        op: &'static str,
        /// The axis given.
        axis: isize,
        /// The tensor's shape.
        shape: Shape,
    },
    /// Any other invalid argument, with a sentence saying what is wrong.
    #[error("{op}: {msg} (shape {shape})")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        msg: String,
        /// The shape of the tensor involved.
        shape: Shape,
    },
    /// An error from the device layer.
    #[error(transparent)]
    Device(#[from] DeviceError),
}
