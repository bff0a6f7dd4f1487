use std::path::PathBuf;

/// Errors of writing or reading event files.
#[derive(Debug, thiserror::Error)]
pub enum TensorBoardError {
    /// A file or directory could not be created, written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file ends inside a record (a writer still running, or a crash mid-write).
    #[error("{path}: truncated record at byte {offset}: {needed} bytes needed, {left} left")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Where the record starts.
        offset: u64,
        /// Bytes the record needs from `offset` on.
        needed: u64,
        /// Bytes left in the file from `offset` on.
        left: u64,
    },
    /// A record's stored checksum does not match its bytes.
    #[error(
        "{path}: corrupt record at byte {offset}: masked CRC32C of the {part} is \
         {found:#010x}, stored {stored:#010x}"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the record starts.
        offset: u64,
        /// `"length"` or `"data"`.
        part: &'static str,
        /// The checksum stored in the file.
        stored: u32,
        /// The checksum of the bytes read.
        found: u32,
    },
    /// A record's data is not an `Event` protobuf.
    #[error("{path}: record at byte {offset} is not an Event: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// Where the record starts.
        offset: u64,
        /// The cause.
        source: prost::DecodeError,
    },
}
