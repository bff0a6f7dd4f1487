use mirra_tensor::{Shape, TensorError};

/// Errors of recording and differentiating.
#[derive(Debug, thiserror::Error)]
pub enum AutogradError {
    /// A tensor operation failed while recording or differentiating.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// `backward` was called on a non-scalar without an explicit output gradient.
    #[error("backward: the loss must be a scalar, got shape {shape}")]
    NonScalarLoss {
        /// The shape of the value given.
        shape: Shape,
    },
    /// Two variables from different tapes were combined.
    #[error("{op}: variables come from different tapes")]
    ForeignTape {
        /// The operation.
        op: &'static str,
    },
    /// A gradient-ready callback failed; backward stopped there.
    #[error("gradient hook failed for parameter {key}: {message}")]
    Hook {
        /// The parameter whose gradient was being handed out.
        key: usize,
        /// What the hook reported.
        message: String,
    },
    /// A caller's linear map ([`Var::linear_map`](crate::Var::linear_map)) failed.
    #[error("linear map: {message}")]
    Map {
        /// What the map reported.
        message: String,
    },
}
