use std::path::PathBuf;

/// Errors of training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A model, loss or metric failed.
    #[error(transparent)]
    Nn(#[from] mirra_nn::NnError),
    /// The optimizer failed.
    #[error(transparent)]
    Optim(#[from] mirra_optim::OptimError),
    /// The input pipeline failed.
    #[error(transparent)]
    Data(#[from] mirra_data::DataError),
    /// Differentiation failed.
    #[error(transparent)]
    Autograd(#[from] mirra_autograd::AutogradError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] mirra_tensor::TensorError),
    /// The distribution strategy failed.
    #[error(transparent)]
    Strategy(#[from] mirra_strategy::StrategyError),
    /// A TensorBoard event file could not be written.
    #[error("TensorBoard: {0}")]
    TensorBoard(#[from] mirra_tensorboard::TensorBoardError),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// An argument out of its range.
    #[error("{0}")]
    Invalid(String),
    /// A checkpoint cannot be read, is not one, or does not fit the model.
    #[error("checkpoint {path}: {msg}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// The loss or a weight became NaN or infinite.
    #[error("{variable} is {value} after epoch {epoch}, step {step}: training diverged")]
    NonFinite {
        /// What: `the loss` or ``weight `dense_1/kernel` (element 7)``.
        variable: String,
        /// The value.
        value: f64,
        /// 1-based epoch.
        epoch: usize,
        /// 1-based step (batch) in the epoch.
        step: usize,
    },
    /// A dataset holds no example.
    #[error("the {0} data holds no example")]
    EmptyData(&'static str),
}
