//! TensorBoard event files, written and read without TensorFlow.
//!
//! An event file is a sequence of TFRecords, each holding one serialized `Event`
//! protobuf (see [`proto`]). The first event names the format (`brain.Event:2`); the
//! others carry summaries, here scalars (`simple_value`), which TensorBoard plots
//! against their step.
//!
//! - [`SummaryWriter`] creates `events.out.tfevents.<secs>.<host>.<pid>.<n>` in a log
//!   directory and appends scalars to it.
//! - [`read_events`] and [`read_scalars`] read a file back, checking every record's two
//!   checksums; [`event_files`] lists the event files of a directory.
//! - [`record`] is the TFRecord framing itself (length, masked CRC32C, data, masked
//!   CRC32C).

mod error;
pub mod proto;
mod reader;
pub mod record;
mod writer;

pub use error::TensorBoardError;
pub use proto::Event;
pub use reader::{event_files, read_events, read_scalars, Scalar};
pub use writer::{SummaryWriter, FILE_VERSION};

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, TensorBoardError>;
