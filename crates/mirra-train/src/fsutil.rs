//! Output files: atomic replacement of regular files, writes through to anything else,
//! checks that a path can be written before a run starts, and the advisory lock of a
//! run's directory.
//!
//! A regular file is replaced atomically: its new contents go to a temporary file in the
//! same directory (`.{name}.tmp{pid}`), which is flushed to disk and renamed over it, so a
//! crash leaves the old file or the new one, never half of one. Anything else (a pipe, a
//! terminal, `/dev/null`) cannot be replaced without destroying it: it is written to in
//! place. A symbolic link to a regular file stays a link; its target is replaced.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::{Result, TrainError};

/// The marker between a file's name and the writer's process id in the name of its
/// temporary file.
const TEMPORARY_MARKER: &str = ".tmp";

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What an output path names now.
enum Target {
    /// Nothing yet: it will be created (atomically) at `path`.
    Absent,
    /// A regular file (`path` with symbolic links resolved): replaced atomically.
    Regular(PathBuf),
    /// Anything else that is not a directory: written through.
    Stream,
}

fn target(path: &Path) -> std::io::Result<Target> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "it is a directory",
        )),
        Ok(m) if m.is_file() => Ok(Target::Regular(std::fs::canonicalize(path)?)),
        Ok(_) => Ok(Target::Stream),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Target::Absent),
        Err(e) => Err(e),
    }
}

/// True when `path` names something that is written through rather than replaced: a
/// pipe, a terminal, a device (anything but a regular file, a directory or nothing).
pub fn is_stream(path: &Path) -> bool {
    matches!(target(path), Ok(Target::Stream))
}

/// The directory a file at `path` lives in (`.` for a bare name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The temporary file next to `path` that this process writes before renaming.
fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent_dir(path).join(format!(".{name}{TEMPORARY_MARKER}{}", std::process::id()))
}

/// Write `bytes` to `path`: a regular file (or a new one) is replaced atomically, through
/// a temporary file in the same directory that is flushed to disk and then renamed over
/// it; a pipe, terminal or device is written to in place.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = io_error(path);
    let file = match target(path).map_err(&io)? {
        Target::Stream => {
            let mut f = OpenOptions::new().write(true).open(path).map_err(&io)?;
            return f.write_all(bytes).and_then(|()| f.flush()).map_err(io);
        }
        Target::Regular(resolved) => resolved,
        Target::Absent => path.to_path_buf(),
    };
    let dir = parent_dir(&file);
    std::fs::create_dir_all(dir).map_err(&io)?;
    let tmp = temporary(&file);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &file)?;
        // Make the rename itself durable.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// An error unless [`write_atomic`] can write `path`: checked before a run starts, so that
/// a bad output path fails at once instead of after the training it was to record.
/// Creates the missing directories above `path` and touches nothing that exists: a
/// regular file is opened for writing (not truncated) and a probe file is created and
/// removed beside it; a pipe or device is opened for writing without waiting for a reader.
pub fn check_writable(path: &Path) -> Result<()> {
    let io = io_error(path);
    let file = match target(path).map_err(&io)? {
        Target::Stream => {
            return match OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
            {
                Ok(_) => Ok(()),
                // A pipe whose reader has not opened it yet.
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(()),
                Err(e) => Err(io(e)),
            };
        }
        Target::Regular(resolved) => {
            OpenOptions::new()
                .write(true)
                .open(&resolved)
                .map_err(&io)?;
            resolved
        }
        Target::Absent => path.to_path_buf(),
    };
    std::fs::create_dir_all(parent_dir(&file)).map_err(&io)?;
    check_can_create_in(parent_dir(&file)).map_err(io)
}

/// An error unless a file can be created (and removed) in `dir`.
fn check_can_create_in(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".probe{TEMPORARY_MARKER}{}", std::process::id()));
    File::create(&probe)?;
    std::fs::remove_file(&probe)
}

/// Create `dir` (and its parents) unless it exists, and check that files can be created
/// in it. The error names `dir`.
pub fn ensure_writable_dir(dir: &Path) -> Result<()> {
    let io = io_error(dir);
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "it exists and is not a directory",
            )))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(&io)?
        }
        Err(e) => return Err(io(e)),
    }
    check_can_create_in(dir).map_err(io)
}

/// Remove the temporary files that writers killed before their rename left in `dir`
/// (`.{name}.tmp{pid}`), and return their paths. Only safe while no other process writes
/// to `dir`: call it while holding its [`DirLock`].
pub fn remove_stale_temporaries(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(io_error(dir))?;
    remove_files_named(dir, entries, is_temporary_name)
}

/// Remove the regular files among `entries` (of `dir`) whose names `matches`, and return
/// their paths, sorted.
fn remove_files_named(
    dir: &Path,
    entries: std::fs::ReadDir,
    matches: impl Fn(&str) -> bool,
) -> Result<Vec<PathBuf>> {
    let io = io_error(dir);
    let mut removed = vec![];
    for entry in entries {
        let entry = entry.map_err(&io)?;
        let name = entry.file_name();
        if !name.to_str().is_some_and(&matches) || !entry.file_type().map_err(&io)?.is_file() {
            continue;
        }
        let path = entry.path();
        std::fs::remove_file(&path).map_err(io_error(&path))?;
        removed.push(path);
    }
    removed.sort();
    Ok(removed)
}

/// Remove the temporary files that writers of the one file `path` left beside it when they
/// were killed before their rename (`.{name}.tmp{pid}` whose process no longer exists), and
/// return their paths. For an output file outside a locked directory (`--history`,
/// `--trace`): a live writer's temporary file, this process's included, is left alone.
pub fn remove_dead_temporaries_of(path: &Path) -> Result<Vec<PathBuf>> {
    let file = match target(path).map_err(io_error(path))? {
        Target::Stream => return Ok(vec![]),
        Target::Regular(resolved) => resolved,
        Target::Absent => path.to_path_buf(),
    };
    let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
        return Ok(vec![]);
    };
    let prefix = format!(".{name}{TEMPORARY_MARKER}");
    let dir = parent_dir(&file);
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // The directory does not exist yet: nothing was left in it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(io_error(dir)(e)),
    };
    // A writer's pid that names no process: its temporary file is stale.
    remove_files_named(dir, entries, |n| {
        n.strip_prefix(&prefix)
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| !process_exists(pid))
    })
}

/// Whether a process `pid` exists (this one included): `kill(pid, 0)` succeeds, or fails
/// only for want of permission.
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; kill only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// True for the names of [`write_atomic`]'s temporary files: `.`, a name, `.tmp`, digits.
fn is_temporary_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    match rest.rsplit_once(TEMPORARY_MARKER) {
        Some((stem, pid)) => {
            !stem.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// An exclusive advisory lock (`flock`) on a directory, held by one process at a time and
/// released when it is dropped or its holder dies, even by SIGKILL: a run restarted after
/// a crash is not refused.
#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
}

/// The lock file of a directory held by a [`DirLock`].
pub const LOCK_FILE: &str = ".mirra.lock";

impl DirLock {
    /// Take the lock of `dir` (which must exist), without waiting. The lock file records
    /// the holder's process id; when another process holds the lock the error names it.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let io = io_error(&path);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(&io)?;
        // SAFETY: flock on a file descriptor that `file` owns and keeps open.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => String::new(),
                    pid => format!(" (process {pid})"),
                };
                return Err(TrainError::Invalid(format!(
                    "{} is in use by another run{holder}: two runs in one directory would \
                     mix their files",
                    dir.display()
                )));
            }
            return Err(io(e));
        }
        let pid = std::process::id().to_string();
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(pid.as_bytes()))
            .map_err(&io)?;
        drop(io);
        Ok(DirLock { file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock; unlocking first makes it explicit.
        // SAFETY: flock on the descriptor `self.file` still owns.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;

    use super::*;

    #[test]
    fn writes_replace_the_file_and_leave_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/history.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let entries = std::fs::read_dir(p.parent().unwrap()).unwrap().count();
        assert_eq!(entries, 1);
    }

    #[test]
    fn an_unwritable_path_names_the_file() {
        let err = write_atomic(Path::new("/proc/nope/history.json"), b"x").unwrap_err();
        assert!(err.to_string().contains("/proc/nope/history.json"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let err = write_atomic(dir.path(), b"x").unwrap_err().to_string();
        assert!(err.contains("it is a directory"), "{err}");
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    /// A pipe stays a pipe and its reader gets the bytes (a rename would have replaced the
    /// pipe by a regular file and the reader would get nothing).
    #[test]
    fn a_pipe_is_written_through_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        // The reader opens first, without waiting for a writer.
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        assert!(is_stream(&fifo));
        check_writable(&fifo).unwrap();
        write_atomic(&fifo, b"{\"loss\": [1]}").unwrap();
        let mut got = String::new();
        reader.read_to_string(&mut got).unwrap();
        assert_eq!(got, "{\"loss\": [1]}");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_symbolic_link_stays_a_link_to_its_replaced_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.json");
        let link = dir.path().join("link.json");
        std::fs::write(&target, b"old").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
    }

    #[test]
    fn check_writable_changes_nothing_and_names_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("h.json");
        std::fs::write(&existing, b"keep").unwrap();
        check_writable(&existing).unwrap();
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep");
        let new = dir.path().join("a/b/h.json");
        check_writable(&new).unwrap();
        assert!(!new.exists() && new.parent().unwrap().is_dir());
        assert_eq!(std::fs::read_dir(new.parent().unwrap()).unwrap().count(), 0);
        // Under a regular file (what a root user cannot be kept from by permissions).
        let under_file = existing.join("h.json");
        let err = check_writable(&under_file).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("cannot write {}", under_file.display())),
            "{err}"
        );
        let err = check_writable(dir.path()).unwrap_err().to_string();
        assert!(err.contains("it is a directory"), "{err}");
        let err = ensure_writable_dir(&existing).unwrap_err().to_string();
        assert!(err.contains("exists and is not a directory"), "{err}");
        ensure_writable_dir(&dir.path().join("new/dir")).unwrap();
        assert!(dir.path().join("new/dir").is_dir());
    }

    #[test]
    fn stale_temporaries_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let keep = [
            "last.safetensors",
            ".tmp123",
            ".last.safetensors.tmp",
            ".x.tmp12a",
            "x.tmp123",
        ];
        let stale = [".last.safetensors.tmp4242", ".history.json.tmp7"];
        for name in keep.iter().chain(&stale) {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let removed = remove_stale_temporaries(dir.path()).unwrap();
        let mut want: Vec<PathBuf> = stale.iter().map(|n| dir.path().join(n)).collect();
        want.sort();
        assert_eq!(removed, want);
        for name in keep {
            assert!(dir.path().join(name).exists(), "{name}");
        }
    }

    #[test]
    fn dead_writers_temporaries_of_one_file_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        // A process that has exited and been reaped: its pid names no process.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let ours = std::process::id();
        let history = dir.path().join("history.json");
        let stale = format!(".history.json.tmp{dead}");
        let keep = [
            format!(".history.json.tmp{ours}"),
            format!(".other.json.tmp{dead}"),
            ".history.json.tmpx".to_string(),
            "history.json.tmp1".to_string(),
        ];
        for name in keep.iter().chain([&stale]) {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        assert_eq!(
            remove_dead_temporaries_of(&history).unwrap(),
            vec![dir.path().join(&stale)]
        );
        for name in &keep {
            assert!(dir.path().join(name).exists(), "{name}");
        }
        // A file in a directory that does not exist yet has nothing beside it.
        assert!(remove_dead_temporaries_of(&dir.path().join("new/h.json"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn the_lock_is_exclusive_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let pid = std::process::id().to_string();
        assert_eq!(std::fs::read_to_string(first.path()).unwrap(), pid);
        // flock locks belong to the open file description: a second open in this
        // process conflicts as another process's would.
        let err = DirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("is in use by another run") && err.contains(&pid),
            "{err}"
        );
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}
