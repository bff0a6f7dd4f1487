//! Writing event files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use crate::proto::{event, summary, Event, Summary};
use crate::{record, Result, TensorBoardError};

/// The format version in the first event of every file (TensorFlow's `brain.Event:2`).
pub const FILE_VERSION: &str = "brain.Event:2";

/// Files created by this process so far: the last part of their names, so that two
/// writers started in the same second in the same directory get different files.
static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Names tried before giving up when every one is taken.
const MAX_NAME_TRIES: usize = 1000;

/// Appends events to a new event file in a log directory, as TensorFlow's
/// `tf.summary.create_file_writer` does.
///
/// The file is named `events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter>`
/// and starts with the [`FILE_VERSION`] event. Writes are buffered: [`flush`] makes
/// them visible to a running TensorBoard; dropping the writer flushes too (ignoring
/// errors: call [`flush`] to see them).
///
/// [`flush`]: SummaryWriter::flush
#[derive(Debug)]
pub struct SummaryWriter {
    path: PathBuf,
    file: BufWriter<File>,
    /// Scratch for one encoded event and its framing, reused across events.
    scratch: Vec<u8>,
    framed: Vec<u8>,
}

impl SummaryWriter {
    /// Creates `log_dir` (and its parents) if needed and a new event file in it, and
    /// writes the file-version event.
    pub fn new(log_dir: impl AsRef<Path>) -> Result<SummaryWriter> {
        let dir = log_dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| TensorBoardError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let (path, file) = create_event_file(dir)?;
        let mut writer = SummaryWriter {
            path,
            file: BufWriter::new(file),
            scratch: vec![],
            framed: vec![],
        };
        writer.write_event(&Event {
            wall_time: wall_time(),
            step: 0,
            what: Some(event::What::FileVersion(FILE_VERSION.to_string())),
        })?;
        writer.flush()?;
        Ok(writer)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a scalar `value` named `tag` at `step` (one event, stamped now).
    pub fn add_scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<()> {
        let summary = Summary {
            value: vec![summary::Value {
                tag: tag.to_string(),
                simple_value: Some(value),
            }],
        };
        self.write_event(&Event {
            wall_time: wall_time(),
            step,
            what: Some(event::What::Summary(summary)),
        })
    }

    /// Appends any event.
    pub fn write_event(&mut self, event: &Event) -> Result<()> {
        self.scratch.clear();
        event
            .encode(&mut self.scratch)
            .expect("a Vec grows to fit any message");
        self.framed.clear();
        record::encode(&self.scratch, &mut self.framed);
        self.file.write_all(&self.framed).map_err(|e| self.io(e))
    }

    /// Writes the buffered events to the file.
    pub fn flush(&mut self) -> Result<()> {
        self.file.flush().map_err(|e| self.io(e))
    }

    fn io(&self, source: std::io::Error) -> TensorBoardError {
        TensorBoardError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

impl Drop for SummaryWriter {
    fn drop(&mut self) {
        let _ = self.file.flush();
    }
}

/// Seconds since the Unix epoch (0 on a clock set before it).
fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `events.out.tfevents.<secs>.<host>.<pid>.<counter>`, the seconds zero-padded to ten
/// digits as TensorFlow's `EventsWriter` does.
fn file_name(secs: u64, host: &str, pid: u32, counter: u64) -> String {
    format!("events.out.tfevents.{secs:010}.{host}.{pid}.{counter}")
}

/// The machine's name, from `gethostname(2)`, else `/proc/sys/kernel/hostname`, else
/// `localhost`; path separators replaced so that it stays one file-name component.
fn hostname() -> String {
    let mut name = gethostname::gethostname().to_string_lossy().into_owned();
    if name.trim().is_empty() {
        name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    }
    let name = name.trim();
    if name.is_empty() {
        "localhost".to_string()
    } else {
        name.replace(['/', '\\'], "_")
    }
}

/// A new, empty event file in `dir` (never an existing one).
fn create_event_file(dir: &Path) -> Result<(PathBuf, File)> {
    let secs = wall_time() as u64;
    let host = hostname();
    let pid = std::process::id();
    let mut tries = 0;
    loop {
        let counter = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(file_name(secs, &host, pid, counter));
        match File::options().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < MAX_NAME_TRIES => {
                tries += 1;
            }
            Err(source) => return Err(TensorBoardError::Io { path, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_follow_tensorflow() {
        assert_eq!(
            file_name(1_700_000_000, "node7", 4242, 3),
            "events.out.tfevents.1700000000.node7.4242.3"
        );
        assert_eq!(
            file_name(12, "h", 1, 0),
            "events.out.tfevents.0000000012.h.1.0"
        );
    }

    #[test]
    fn a_new_writer_names_its_file_after_this_host_and_process() {
        let dir = tempfile::tempdir().unwrap();
        let w = SummaryWriter::new(dir.path().join("a/b")).unwrap();
        let name = w.path().file_name().unwrap().to_str().unwrap().to_string();
        let parts: Vec<&str> = name
            .strip_prefix("events.out.tfevents.")
            .unwrap_or_else(|| panic!("{name}"))
            .split('.')
            .collect();
        let secs: u64 = parts[0].parse().unwrap();
        assert!(secs.abs_diff(wall_time() as u64) < 60, "{name}");
        assert_eq!(parts[parts.len() - 2], std::process::id().to_string());
        let host = parts[1..parts.len() - 2].join(".");
        assert_eq!(host, hostname());
        assert!(!host.is_empty());
        assert_eq!(w.path().parent().unwrap(), dir.path().join("a/b"));
    }

    #[test]
    fn two_writers_in_one_directory_get_two_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = SummaryWriter::new(dir.path()).unwrap();
        let b = SummaryWriter::new(dir.path()).unwrap();
        assert_ne!(a.path(), b.path());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn an_unwritable_directory_names_itself() {
        let err = SummaryWriter::new("/proc/no-such/logs").unwrap_err();
        assert!(
            matches!(err, TensorBoardError::Io { .. }) && err.to_string().contains("/proc/no-such"),
            "{err}"
        );
    }
}
