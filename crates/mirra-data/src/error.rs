//! The one error type of the crate. File errors name the path; pipeline errors name the
//! operation; each says what was expected and what was found.

use std::path::PathBuf;

use mirra_tensor::TensorError;

/// Errors of reading data and of running a [`Dataset`](crate::Dataset) pipeline.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file that does not exist.
    #[error("file not found: {}", path.display())]
    NotFound {
        /// The path looked for.
        path: PathBuf,
    },
    /// Any other failure to read a file.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file that starts like gzip (`1f 8b`) but does not decompress.
    #[error("{}: corrupt gzip data: {source}", path.display())]
    Gzip {
        /// The file.
        path: PathBuf,
        /// The decoder's error.
        source: std::io::Error,
    },
    /// A file shorter than the IDX header it announces.
    #[error(
        "{}: truncated IDX header: needs {expected} bytes, the file has {actual}",
        path.display()
    )]
    TruncatedHeader {
        /// The file.
        path: PathBuf,
        /// Bytes the header needs.
        expected: usize,
        /// Bytes (after decompression) the file has.
        actual: usize,
    },
    /// The first two bytes of an IDX file are not zero.
    #[error(
        "{}: bad IDX magic number 0x{magic:08x} (expected 0x0000TTRR: two zero bytes, \
         the type code, the rank)",
        path.display()
    )]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first four bytes, big-endian.
        magic: u32,
    },
    /// An IDX type code this crate does not read.
    #[error(
        "{}: unsupported IDX element type 0x{code:02x} (supported: 0x08 u8, 0x09 i8, \
         0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64)",
        path.display()
    )]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// The type code (third byte of the magic number).
        code: u8,
    },
    /// An IDX rank outside what a tensor can hold, or not the rank the reader expects.
    #[error("{}: IDX rank {actual}, expected {expected}", path.display())]
    WrongRank {
        /// The file.
        path: PathBuf,
        /// What the reader accepts (`"1 to 6"`, `"3"`).
        expected: String,
        /// The rank in the file.
        actual: usize,
    },
    /// IDX data whose length does not match the product of the dimensions.
    #[error(
        "{}: dimensions {dims:?} need {expected} data bytes, the file has {actual} \
         ({})",
        path.display(),
        if actual < expected { "truncated" } else { "trailing bytes" }
    )]
    LengthMismatch {
        /// The file.
        path: PathBuf,
        /// The dimensions in the header.
        dims: Vec<usize>,
        /// Data bytes the dimensions need.
        expected: u128,
        /// Data bytes after the header.
        actual: u128,
    },
    /// IDX data that goes on after the size its header declares (found in a gzip
    /// stream, which is not inflated further to count the excess).
    #[error(
        "{}: dimensions {dims:?} need {expected} data bytes, but the data goes on after \
         them (trailing bytes)",
        path.display()
    )]
    TrailingData {
        /// The file.
        path: PathBuf,
        /// The dimensions in the header.
        dims: Vec<usize>,
        /// Data bytes the dimensions need.
        expected: u128,
    },
    /// An IDX header that declares more bytes than its file can hold, refused before
    /// anything is allocated or inflated.
    #[error(
        "{}: dimensions {dims:?} declare {declared} bytes, more than the {limit} this file \
         can hold ({reason})",
        path.display()
    )]
    DeclaredTooLarge {
        /// The file.
        path: PathBuf,
        /// The dimensions in the header.
        dims: Vec<usize>,
        /// Bytes the header declares (itself and the data).
        declared: u128,
        /// The most the file can hold.
        limit: u128,
        /// Why that is the most.
        reason: &'static str,
    },
    /// A file whose contents are well-formed but not what the reader needs (dtype, shape,
    /// value range).
    #[error("{}: expected {expected}, found {actual}", path.display())]
    Unexpected {
        /// The file.
        path: PathBuf,
        /// What the reader needs.
        expected: String,
        /// What the file holds.
        actual: String,
    },
    /// An image file and a label file with different numbers of examples.
    #[error(
        "{} holds {images} images but {} holds {labels} labels",
        images_path.display(),
        labels_path.display()
    )]
    CountMismatch {
        /// The image file.
        images_path: PathBuf,
        /// Number of images.
        images: usize,
        /// The label file.
        labels_path: PathBuf,
        /// Number of labels.
        labels: usize,
    },
    /// A data set directory without the files it needs.
    #[error(
        "{}: missing {} (each may also end in .gz, or use a dot before idx, as in \
         t10k-images.idx3-ubyte)",
        dir.display(),
        missing.join(", ")
    )]
    MissingFiles {
        /// The directory.
        dir: PathBuf,
        /// The names of the files not found.
        missing: Vec<String>,
    },
    /// A dataset argument that must be positive but is zero.
    #[error("{op}: {what} must be at least 1, got 0")]
    ZeroArgument {
        /// The operation (`batch`, `shuffle`).
        op: &'static str,
        /// The argument.
        what: &'static str,
    },
    /// Tensors that cannot be sliced together, or elements that cannot be batched
    /// together.
    #[error("{op}: {msg}")]
    Incompatible {
        /// The operation (`from_tensor_slices`, `batch`).
        op: &'static str,
        /// What does not fit.
        msg: String,
    },
    /// The prefetch thread could not be started.
    #[error("prefetch: cannot start the background thread: {source}")]
    Thread {
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The prefetch thread panicked (in a `map` function, say).
    #[error("prefetch: the background thread panicked: {msg}")]
    ProducerPanicked {
        /// The panic message.
        msg: String,
    },
    /// A file whose contents are not what its format says (a `.npy` header, a `.npz`
    /// archive, an image), or a folder laid out otherwise than expected.
    #[error("{}: {msg}", path.display())]
    Format {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// An error from a tensor operation (boxed: tensor errors are large, and every
    /// `Result` of this crate would carry their size).
    #[error(transparent)]
    Tensor(Box<TensorError>),
}

impl From<TensorError> for DataError {
    fn from(e: TensorError) -> DataError {
        DataError::Tensor(Box::new(e))
    }
}
