//! The input pipeline: reading data sets from disk and feeding them to training in
//! shuffled batches.
//!
//! * [`read_idx`] reads IDX files (the MNIST format), raw or gzipped, into a [`Tensor`],
//!   never reading, inflating or allocating more than the header declares (and the
//!   stored bytes can hold); [`read_idx_bytes`] reads them from memory.
//! * [`Mnist`] loads MNIST: the test set embedded in the library ([`Mnist::bundled`]),
//!   split 8,000 / 2,000, or a directory's files, the full 60,000 / 10,000 when all four
//!   are there. Images stay `u8` as stored; [`pixels_to_unit_f32`] converts each batch to
//!   `f32` in `[0, 1]` as the pipeline forms it.
//! * [`Dataset`] is a small `tf.data`: slices of tensors, shuffled, batched, mapped,
//!   cached, repeated, taken and prefetched on a background thread. The common pipeline
//!   (slices, shuffle, batch) works on row indices and gathers each batch in one pass, so
//!   batching is never the bottleneck of a training step.
//!
//! Every failure is a [`DataError`] that names the file or the operation and says what
//! is wrong; no bad input makes this crate panic.
//!
//! [`Tensor`]: mirra_tensor::Tensor

mod arrays;
mod augment;
mod dataset;
mod error;
mod idx;
mod image_folder;
mod mnist;
mod segmentation;
mod synthetic;

pub use arrays::{load_arrays, read_npy, read_npy_bytes, read_npz};
pub use augment::Augment;
pub use dataset::{Dataset, DatasetIter};
pub use error::DataError;
pub use idx::{read_idx, read_idx_bytes, MAX_DEFLATE_RATIO};
pub use image_folder::ImageFolder;
pub use mnist::{bundled_files, pixels_to_unit_f32, Mnist, MnistSource, Split};
pub use segmentation::{digit_canvases, digit_volumes, Canvases, CANVAS, CLASSES, VOLUME_DEPTH};
pub use synthetic::synthetic_images;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, DataError>;
