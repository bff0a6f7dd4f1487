//! Layers, losses, metrics and the [`Sequential`] model, in Keras's terms.
//!
//! A model owns its parameters as a flat list of tensors with stable names
//! (`dense/kernel`, `dense_1/bias`, ...), always in the same order: that order is how an
//! optimizer keeps its state and how replicas of a mirrored model line up. A forward pass
//! records on a caller's [`Tape`](mirra_autograd::Tape), so each thread has its own.

mod activation;
mod conv;
mod error;
mod layer;
mod layers;
pub mod loss;
pub mod metrics;
mod pooling;
pub mod scope;
mod sequential;

pub use activation::Activation;
pub use conv::Conv2D;
pub use error::NnError;
pub use layer::{ForwardCtx, Layer, LayerClone, ParamSpec};
pub use layers::{Dense, Dropout, Flatten, Reshape};
pub use loss::{
    CategoricalCrossentropy, Loss, MeanSquaredError, Reduction, SparseCategoricalCrossentropy,
};
pub use metrics::{Accuracy, Mean, Metric};
pub use mirra_tensor::Padding;
pub use pooling::{AveragePooling2D, GlobalAveragePooling2D, MaxPooling2D, UpSampling2D};
pub use sequential::{ModelOutput, Sequential};

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, NnError>;
