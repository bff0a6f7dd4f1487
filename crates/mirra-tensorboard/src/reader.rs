//! Reading event files back (for tests and tools; TensorBoard reads them itself).

use std::path::{Path, PathBuf};

use prost::Message;

use crate::{record, Event, Result, TensorBoardError};

/// One scalar of an event file.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    /// Its name.
    pub tag: String,
    /// Its step.
    pub step: i64,
    /// Its value.
    pub value: f32,
    /// When it was written (seconds since the Unix epoch).
    pub wall_time: f64,
}

/// Every event of the file at `path`, in order, after checking every record's two
/// checksums. A file that ends inside a record is an error
/// ([`TensorBoardError::Truncated`]), as is a checksum mismatch
/// ([`TensorBoardError::Corrupt`]) or a record that is not an `Event`.
pub fn read_events(path: impl AsRef<Path>) -> Result<Vec<Event>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| TensorBoardError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    record::decode_all(&bytes, path)?
        .into_iter()
        .map(|r| {
            Event::decode(r.data).map_err(|source| TensorBoardError::Decode {
                path: path.to_path_buf(),
                offset: r.offset,
                source,
            })
        })
        .collect()
}

/// The scalars of the file at `path`, in the order they were written (see
/// [`read_events`] for the errors).
pub fn read_scalars(path: impl AsRef<Path>) -> Result<Vec<Scalar>> {
    let events = read_events(path)?;
    Ok(events
        .iter()
        .flat_map(|e| {
            e.scalars().map(|(tag, value)| Scalar {
                tag: tag.to_string(),
                step: e.step,
                value,
                wall_time: e.wall_time,
            })
        })
        .collect())
}

/// The event files in `dir` (names containing `tfevents`, as TensorBoard looks for),
/// sorted by name, hence by creation time.
pub fn event_files(dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
    let dir = dir.as_ref();
    let io = |source| TensorBoardError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let is_events = entry.file_name().to_string_lossy().contains("tfevents");
        if is_events && entry.file_type().map_err(io)?.is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}
