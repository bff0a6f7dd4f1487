//! Training: Keras's `compile`/`fit`/`evaluate`/`predict`, callbacks and History.
//!
//! `fit` runs the epoch loop over a [`Dataset`](mirra_data::Dataset): a training step per
//! batch (forward on a reused tape, backward, optimizer update in place), running means of
//! the loss and metrics, validation after each epoch, and the callbacks around it all.

pub mod callbacks;
pub mod checkpoint;
pub mod console;
mod csv_logger;
mod early_stopping;
mod error;
pub mod fsutil;
mod history_file;
mod logs;
mod lr_scheduler;
mod model;
mod model_checkpoint;
mod monitor;
mod replicas;
mod rng_state;
mod tensorboard;
#[cfg(test)]
pub(crate) mod testutil;

pub use callbacks::{Callback, Control, ProgbarLogger, TrainInfo};
pub use checkpoint::{Checkpoint, CheckpointMeta, DataPosition, RngState};
pub use csv_logger::CsvLogger;
pub use early_stopping::EarlyStopping;
pub use error::TrainError;
pub use history_file::HistoryFile;
pub use logs::{History, Logs};
pub use lr_scheduler::LearningRateScheduler;
pub use model::{FitConfig, Model, StepOutput};
pub use model_checkpoint::ModelCheckpoint;
pub use monitor::Mode;
pub use replicas::CommStats;
pub use tensorboard::TensorBoard;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;
