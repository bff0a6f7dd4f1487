//! Training: Keras's `compile`/`fit`/`evaluate`/`predict`, callbacks and History.
//!
//! `fit` runs the epoch loop over a [`Dataset`](mirra_data::Dataset): a training step per
//! batch (forward on a reused tape, backward, optimizer update in place), running means of
//! the loss and metrics, validation after each epoch, and the callbacks around it all.

pub mod callbacks;
mod error;
pub mod fsutil;
mod logs;
mod model;
#[cfg(test)]
pub(crate) mod testutil;

pub use callbacks::{Callback, Control, ProgbarLogger, TrainInfo};
pub use error::TrainError;
pub use logs::{History, Logs};
pub use model::{FitConfig, Model, StepOutput};

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;
