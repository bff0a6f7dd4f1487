//! The output paths of `mirra train`, checked before anything is trained.
//!
//! A path that cannot be written is a usage error (exit 2) naming the flag and the path,
//! found at once rather than after the training it was to record: `--history` (the file,
//! or the directory it would be created in), `--trace` (likewise), `--logdir`, and
//! `--checkpoint-dir`, which is
//! created if needed, locked for the run (an advisory `flock`, released when the process
//! ends, even by SIGKILL: two runs would mix their files, and a restart after a crash is
//! not refused), and rid of the temporary files a save killed before its rename left. The
//! temporary files a killed run left beside `--history` and `--trace` go too (those of
//! writers that no longer exist: these files are not under the lock).

use mirra::train::console::print_line;
use mirra::train::fsutil::{
    check_writable, ensure_writable_dir, remove_dead_temporaries_of, remove_stale_temporaries,
    DirLock,
};
use mirra::train::TrainError;

use crate::{Failure, TrainArgs};

/// What the run holds while it writes its outputs.
#[derive(Debug)]
pub struct Outputs {
    /// The lock of `--checkpoint-dir`, released when the run ends.
    _checkpoint_lock: Option<DirLock>,
}

/// A usage error naming `flag`.
fn usage(flag: &'static str) -> impl Fn(TrainError) -> Failure {
    move |e| Failure::Usage(format!("{flag}: {e}"))
}

/// Check every output path of `args`; create, lock and clean `--checkpoint-dir`.
pub fn prepare(args: &TrainArgs) -> Result<Outputs, Failure> {
    for (flag, path) in [("--history", &args.history), ("--trace", &args.trace)] {
        let Some(path) = path else { continue };
        check_writable(path).map_err(usage(flag))?;
        // A run killed while replacing the file left its temporary file beside it.
        let removed = remove_dead_temporaries_of(path).map_err(usage(flag))?;
        report_removed(&removed, path.parent().unwrap_or(path));
    }
    if let Some(dir) = &args.logdir {
        ensure_writable_dir(dir).map_err(usage("--logdir"))?;
    }
    let Some(dir) = &args.checkpoint_dir else {
        return Ok(Outputs {
            _checkpoint_lock: None,
        });
    };
    ensure_writable_dir(dir).map_err(usage("--checkpoint-dir"))?;
    let lock = DirLock::acquire(dir).map_err(usage("--checkpoint-dir"))?;
    // Under the lock no other run writes here: every temporary file is a dead one's.
    let removed = remove_stale_temporaries(dir).map_err(usage("--checkpoint-dir"))?;
    report_removed(&removed, dir);
    Ok(Outputs {
        _checkpoint_lock: Some(lock),
    })
}

/// One line naming the temporary files removed from `dir`, if any.
fn report_removed(removed: &[std::path::PathBuf], dir: &std::path::Path) {
    if removed.is_empty() {
        return;
    }
    let names: Vec<String> = removed
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    print_line(&format!(
        "Removed {} temporary file{} left in {} by a save that was killed: {}",
        removed.len(),
        if removed.len() == 1 { "" } else { "s" },
        dir.display(),
        names.join(", ")
    ));
}
