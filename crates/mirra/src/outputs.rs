//! The output paths of `mirra train`, checked before anything is trained.
//!
//! A path that cannot be written is a usage error (exit 2) naming the flag and the path,
//! found at once rather than after the training it was to record: `--history` (the file,
//! or the directory it would be created in), `--trace` (likewise), `--logdir`, and
//! `--checkpoint-dir`, which is
//! created if needed, locked for the run (an advisory `flock`, released when the process
//! ends, even by SIGKILL: two runs would mix their files, and a restart after a crash is
//! not refused), and rid of the temporary files a save killed before its rename left.

use mirra::train::console::print_line;
use mirra::train::fsutil::{
    check_writable, ensure_writable_dir, remove_stale_temporaries, DirLock,
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
    if let Some(path) = &args.history {
        check_writable(path).map_err(usage("--history"))?;
    }
    if let Some(path) = &args.trace {
        check_writable(path).map_err(usage("--trace"))?;
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
    if !removed.is_empty() {
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
    Ok(Outputs {
        _checkpoint_lock: Some(lock),
    })
}
