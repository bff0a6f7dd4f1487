//! Peak resident memory of a real training run: `target/release/mirra train --epochs 1`,
//! built first, its peak RSS read from the kernel's accounting of the reaped child
//! (`wait4`), so neither the build nor any other child of xtask is counted.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The arguments of the measured run.
pub const TRAIN_ARGS: [&str; 3] = ["train", "--epochs", "1"];
/// The measured run with 4 replicas (`cargo xtask bench-mirrored`).
pub const TRAIN_ARGS_4_REPLICAS: [&str; 7] = [
    "train",
    "--epochs",
    "1",
    "--replicas",
    "4",
    "--batch-size",
    "256",
];

/// A run that is still going after this long is killed and reported as a failure.
const DEADLINE: Duration = Duration::from_secs(300);

/// What one measured run gave.
#[derive(Debug)]
pub struct Run {
    /// Peak resident set size, MiB.
    pub peak_mib: f64,
    /// Wall-clock seconds of the run.
    pub wall_s: f64,
    /// The binary that ran.
    pub binary: PathBuf,
    /// Where its stdout and stderr went.
    pub log: PathBuf,
}

/// Builds the `mirra` binary in release mode (`cargo build --release -p mirra`).
fn build(root: &Path) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!("peak RSS: building the CLI (cargo build --release -p mirra)");
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "mirra"])
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`cargo build --release -p mirra` failed ({status})"
        ))
    }
}

/// Builds the CLI, runs one epoch of `mirra train` from the workspace root, and returns
/// its peak RSS; `Err` says why there is no figure.
pub fn measure(root: &Path, target: &Path, log: &Path) -> Result<Run, String> {
    measure_args(root, target, log, &TRAIN_ARGS)
}

/// Peak RSS of `target/release/mirra` run with `args`.
pub fn measure_args(root: &Path, target: &Path, log: &Path, args: &[&str]) -> Result<Run, String> {
    if !root.join("crates/mirra/Cargo.toml").is_file() {
        return Err("crates/mirra (the `mirra` CLI) does not exist yet".into());
    }
    build(root)?;
    let binary = target
        .join("release")
        .join(format!("mirra{}", std::env::consts::EXE_SUFFIX));
    if !binary.is_file() {
        return Err(format!("{} was not built", binary.display()));
    }
    println!(
        "peak RSS: running `{} {}` (log: {})",
        binary.display(),
        args.join(" "),
        log.display()
    );
    let out = File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot reopen {}: {e}", log.display()))?;
    let start = Instant::now();
    let child = Command::new(&binary)
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let (ok, peak_mib) = wait_peak_rss(child)?;
    let wall_s = start.elapsed().as_secs_f64();
    if !ok {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let last = text.lines().rev().find(|l| !l.trim().is_empty());
        return Err(format!(
            "`mirra {}` failed: {}",
            args.join(" "),
            last.unwrap_or("(no output)").trim()
        ));
    }
    Ok(Run {
        peak_mib,
        wall_s,
        binary,
        log: log.to_owned(),
    })
}

/// Waits for `child` (killing it after [`DEADLINE`]) and returns whether it succeeded and
/// its peak RSS in MiB, from the rusage of this one child.
#[cfg(unix)]
fn wait_peak_rss(mut child: std::process::Child) -> Result<(bool, f64), String> {
    let pid = child.id() as libc::pid_t;
    let start = Instant::now();
    let mut killed = false;
    let (status, usage) = loop {
        let mut status: libc::c_int = 0;
        // SAFETY: rusage is a plain C struct of integers, for which all-zero is valid.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let flags = if killed { 0 } else { libc::WNOHANG };
        // SAFETY: `pid` is our own unreaped child; both pointers are to live locals.
        let r = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        if r == pid {
            break (status, usage);
        }
        if r == -1 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("wait4 failed: {e}"));
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            killed = true;
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    if killed {
        return Err(format!(
            "`mirra train` still ran after {DEADLINE:?}: killed"
        ));
    }
    // Linux reports ru_maxrss in KiB, macOS in bytes.
    let bytes_per_unit = if cfg!(target_os = "macos") {
        1.0
    } else {
        1024.0
    };
    let peak_mib = usage.ru_maxrss as f64 * bytes_per_unit / (1024.0 * 1024.0);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((ok, peak_mib))
}

#[cfg(not(unix))]
fn wait_peak_rss(mut child: std::process::Child) -> Result<(bool, f64), String> {
    let _ = child.wait();
    Err("peak RSS is measured on Unix only".into())
}
