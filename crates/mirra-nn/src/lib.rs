//! Layers, losses, metrics and the [`Network`] model (stacked as Keras's `Sequential`, or
//! built with the functional API, [`Graph`]), in Keras's terms.
//!
//! A model owns its parameters as a flat list of tensors with stable names
//! (`dense/kernel`, `dense_1/bias`, ...), always in the same order: that order is how an
//! optimizer keeps its state and how replicas of a mirrored model line up. A forward pass
//! records on a caller's [`Tape`](mirra_autograd::Tape), so each thread has its own.

mod activation;
mod conv;
mod error;
mod graph;
mod layer;
mod layers;
pub mod loss;
mod merge;
pub mod metrics;
mod network;
mod normalization;
mod policy;
mod pooling;
pub mod scope;

pub use activation::Activation;
pub use conv::{Conv, Conv1D, Conv2D, Conv3D};
pub use error::NnError;
pub use graph::{Graph, Symbol};
pub use layer::{Examples, ForwardCtx, Layer, LayerClone, ParamSpec, Role};
pub use layers::{Dense, Dropout, Flatten, Reshape};
pub use loss::{
    CategoricalCrossentropy, DiceCrossentropy, Loss, MeanSquaredError, Reduction,
    SparseCategoricalCrossentropy,
};
pub use merge::{Add, Concatenate};
pub use metrics::{Accuracy, Mean, Metric, Overlap, OverlapScore};
pub use mirra_tensor::Padding;
pub use network::{ModelOutput, Network, Sequential};
pub use normalization::BatchNormalization;
pub use policy::{Autocast, Policy};
pub use pooling::{
    AveragePooling, AveragePooling1D, AveragePooling2D, AveragePooling3D, GlobalAveragePooling,
    GlobalAveragePooling1D, GlobalAveragePooling2D, GlobalAveragePooling3D, MaxPooling,
    MaxPooling1D, MaxPooling2D, MaxPooling3D, UpSampling, UpSampling1D, UpSampling2D, UpSampling3D,
};

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, NnError>;
