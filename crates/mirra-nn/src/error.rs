use mirra_autograd::AutogradError;
use mirra_tensor::TensorError;

/// Errors of building and running models.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// Differentiation failed.
    #[error(transparent)]
    Autograd(#[from] AutogradError),
    /// A layer's configuration is invalid.
    #[error("{layer}: {msg}")]
    Config {
        /// The layer or loss (its name or kind).
        layer: String,
        /// What is wrong.
        msg: String,
    },
    /// A sum across replicas (synchronised batch norm) failed.
    #[error("cross-replica sum: {0}")]
    CrossReplica(String),
    /// The model was used before [`Network::build`](crate::Network::build).
    #[error("model is not built: call build(input_shape, seed) first")]
    NotBuilt,
    /// Inputs that do not fit the model or loss.
    #[error("{what}: expected {expected}, got {got}")]
    InputMismatch {
        /// What was checked.
        what: &'static str,
        /// What was expected.
        expected: String,
        /// What was given.
        got: String,
    },
}
