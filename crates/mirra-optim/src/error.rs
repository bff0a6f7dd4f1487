//! The crate's one error type.
//!
//! Every variant names who failed (`op`: the optimizer, schedule or function, as in
//! `"adam"` or `"clip_by_global_norm"`) and, where a parameter is involved, its position in
//! the parameter list, so a message read in a training log points at the culprit.

use mirra_tensor::{DType, Device, Shape, TensorError};

/// Errors of optimizers, schedules and clipping.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// A tensor operation failed with no parameter to blame.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A tensor operation failed while updating parameter `index`.
    #[error("{op}: parameter {index}: {source}")]
    ParamTensor {
        /// The optimizer or function.
        op: &'static str,
        /// Position of the parameter (or gradient) in the list.
        index: usize,
        /// The tensor error.
        source: TensorError,
    },
    /// A hyperparameter outside its valid range.
    #[error("{op}: {name} = {value} is invalid: expected {expected}")]
    InvalidHyperparameter {
        /// The optimizer, schedule or function.
        op: &'static str,
        /// The hyperparameter (`beta1`, `epsilon`, ...).
        name: &'static str,
        /// The value given.
        value: f64,
        /// The valid range, in words.
        expected: &'static str,
    },
    /// The learning rate for a step (from a schedule or `set_learning_rate`) is negative,
    /// infinite or NaN.
    #[error("{op}: learning rate {lr} for iteration {iteration} is invalid: expected a finite value >= 0")]
    InvalidLearningRate {
        /// The optimizer.
        op: &'static str,
        /// The iteration (number of updates applied so far) the rate was asked for.
        iteration: u64,
        /// The rate.
        lr: f64,
    },
    /// Parameter and gradient lists of different lengths.
    #[error("{op}: {params} parameters but {grads} gradients")]
    LengthMismatch {
        /// The optimizer.
        op: &'static str,
        /// Number of parameters.
        params: usize,
        /// Number of gradients.
        grads: usize,
    },
    /// A gradient whose shape differs from its parameter's.
    #[error("{op}: parameter {index} has shape {param} but its gradient has shape {grad}")]
    ShapeMismatch {
        /// The optimizer.
        op: &'static str,
        /// Position of the parameter.
        index: usize,
        /// The parameter's shape.
        param: Shape,
        /// The gradient's shape.
        grad: Shape,
    },
    /// A gradient whose dtype differs from its parameter's.
    #[error("{op}: parameter {index} has dtype {param} but its gradient has dtype {grad}")]
    DTypeMismatch {
        /// The optimizer.
        op: &'static str,
        /// Position of the parameter.
        index: usize,
        /// The parameter's dtype.
        param: DType,
        /// The gradient's dtype.
        grad: DType,
    },
    /// A gradient on another device than its parameter.
    #[error("{op}: parameter {index} is on {param} but its gradient is on {grad}")]
    DeviceMismatch {
        /// The optimizer.
        op: &'static str,
        /// Position of the parameter.
        index: usize,
        /// The parameter's device.
        param: Device,
        /// The gradient's device.
        grad: Device,
    },
    /// A non-float parameter or gradient.
    #[error("{op}: tensor {index} has dtype {dtype}; only f32, f64, f16 and bf16 are supported")]
    UnsupportedDType {
        /// The optimizer or function.
        op: &'static str,
        /// Position of the tensor in its list.
        index: usize,
        /// Its dtype.
        dtype: DType,
    },
    /// Optimizer state that does not fit the parameters it is applied to (their number
    /// or a shape changed since the state was created or loaded).
    #[error("{op}: optimizer state does not fit the parameters: {msg}")]
    StateMismatch {
        /// The optimizer.
        op: &'static str,
        /// What differs.
        msg: String,
    },
    /// A checkpoint entry that `load_state` cannot use.
    #[error("{op}: cannot load state entry `{key}`: {msg}")]
    BadState {
        /// The optimizer.
        op: &'static str,
        /// The entry's name (`"0/m"`, `"iterations"`, ...).
        key: String,
        /// What is wrong.
        msg: String,
    },
}
