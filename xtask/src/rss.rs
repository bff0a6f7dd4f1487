//! Peak resident memory of a real training run: `target/release/mirra train --epochs 1`,
//! built first, its peak read from the run's own last line (`Peak memory: host X MiB`,
//! the kernel's `VmHWM` of its address space), which a user sees too.
//!
//! Not from `wait4`'s `ru_maxrss`: on Linux a child's starts at the high-water mark of
//! the address space it replaced at `exec`, its parent's, so after xtask had loaded the
//! full MNIST for the MLP benchmark both runs read 102.7 MiB, xtask's own peak, while
//! mirra's `VmHWM` was a fraction of it. `ru_maxrss` is still recorded beside, to show it.
//!
//! [`measure_peaks`] measures the two runs issue 13 sets targets for: the default run
//! (the embedded test set, under 40 MiB) and one epoch on the full MNIST from
//! [`FULL_MNIST_DIR`] (under 100 MiB), which is outside the repository: without it that
//! figure is reported missing, never replaced by another run.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::json::num;

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

/// The full MNIST (the four standard files), relative to the workspace root: the shared
/// data folder beside the checkout, not part of the repository.
pub const FULL_MNIST_DIR: &str = "../shared/data/mnist";
/// One epoch on the full MNIST.
pub const TRAIN_ARGS_FULL_MNIST: [&str; 5] = ["train", "--epochs", "1", "--data", FULL_MNIST_DIR];
/// What the full-MNIST run prints when it really trains on the 60,000 training images.
const FULL_MNIST_MARK: &str = "on 60000 samples";

/// Peak RSS targets, MiB (issue 13): the default run, and one epoch on the full MNIST.
pub const TARGET_DEFAULT_MIB: f64 = 40.0;
pub const TARGET_FULL_MNIST_MIB: f64 = 100.0;

/// A run that is still going after this long is killed and reported as a failure.
const DEADLINE: Duration = Duration::from_secs(300);

/// What one measured run gave.
#[derive(Debug)]
pub struct Run {
    /// Peak resident set size, MiB (the run's own `VmHWM`).
    pub peak_mib: f64,
    /// `wait4`'s `ru_maxrss` of the child, MiB: includes the parent's peak on Linux.
    pub ru_maxrss_mib: f64,
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

/// One measured run of [`measure_peaks`] and its target.
#[derive(Debug)]
pub struct Peak {
    /// What was run, for the table and the JSON (`default`, `full_mnist`).
    pub name: &'static str,
    /// The `mirra` arguments.
    pub args: &'static [&'static str],
    /// The target: peak RSS below this many MiB.
    pub target_mib: f64,
    /// The run, or why there is none (`missing: ...` without the full MNIST).
    pub run: Result<Run, String>,
}

impl Peak {
    /// Whether the run met its target; `None` without a run.
    pub fn met(&self) -> Option<bool> {
        self.run.as_ref().ok().map(|r| r.peak_mib < self.target_mib)
    }
}

/// Builds the CLI once and measures the peak RSS of the default `mirra train --epochs 1`
/// and of one epoch on the full MNIST (from [`FULL_MNIST_DIR`]; reported missing when that
/// folder lacks the training files), logs in `log_dir`. This is what `cargo xtask bench`
/// reports; [`peaks_json`] and [`print_peaks`] render it.
pub fn measure_peaks(root: &Path, target: &Path, log_dir: &Path) -> Vec<Peak> {
    let binary = mirra_binary(root, target);
    let run = |name: &'static str, args: &'static [&'static str]| {
        let log = log_dir.join(format!("mirra-train-{name}.log"));
        std::fs::create_dir_all(log_dir)
            .map_err(|e| format!("cannot create {}: {e}", log_dir.display()))?;
        run_measured(root, binary.as_ref().map_err(Clone::clone)?, &log, args)
    };
    let full = root.join(FULL_MNIST_DIR);
    let full_run = match missing_full_mnist(&full) {
        Some(why) => Err(format!("missing: {why}")),
        None => run("full_mnist", &TRAIN_ARGS_FULL_MNIST).and_then(|r| {
            // The figure is the full set's only if the run trained on it.
            let log = std::fs::read_to_string(&r.log).unwrap_or_default();
            if log.contains(FULL_MNIST_MARK) {
                Ok(r)
            } else {
                Err(format!(
                    "the run did not train on the full MNIST (no \"{FULL_MNIST_MARK}\" in {})",
                    r.log.display()
                ))
            }
        }),
    };
    vec![
        Peak {
            name: "default",
            args: &TRAIN_ARGS,
            target_mib: TARGET_DEFAULT_MIB,
            run: run("default", &TRAIN_ARGS),
        },
        Peak {
            name: "full_mnist",
            args: &TRAIN_ARGS_FULL_MNIST,
            target_mib: TARGET_FULL_MNIST_MIB,
            run: full_run,
        },
    ]
}

/// Why `dir` does not hold the full MNIST's training files, if it does not.
fn missing_full_mnist(dir: &Path) -> Option<String> {
    if !dir.is_dir() {
        return Some(format!("{} does not exist", dir.display()));
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let lacking: Vec<&str> = ["train-images", "train-labels"]
        .into_iter()
        .filter(|stem| !names.iter().any(|n| n.starts_with(stem)))
        .collect();
    (!lacking.is_empty()).then(|| format!("{} has no {} file", dir.display(), lacking.join(" or ")))
}

/// `{"default": {...}, "full_mnist": {...}}`: each run's peak (MiB), target, whether it
/// was met, command, wall time and log; or why it is unavailable.
pub fn peaks_json(peaks: &[Peak]) -> Value {
    Value::Object(
        peaks
            .iter()
            .map(|p| {
                let v = match &p.run {
                    Ok(r) => json!({
                        "peak_mib": num(r.peak_mib, 1),
                        "max_exclusive_mib": p.target_mib,
                        "met": p.met(),
                        "unit": "MiB (VmHWM of the run, its `Peak memory` line)",
                        "ru_maxrss_mib": num(r.ru_maxrss_mib, 1),
                        "command": format!("{} {}", r.binary.display(), p.args.join(" ")),
                        "wall_s": num(r.wall_s, 2),
                        "log": r.log.display().to_string(),
                    }),
                    Err(e) => json!({
                        "peak_mib": null,
                        "max_exclusive_mib": p.target_mib,
                        "met": null,
                        "unavailable": e,
                    }),
                };
                (p.name.to_string(), v)
            })
            .collect(),
    )
}

/// One table line per run of [`peaks_json`]'s report: peak, target, met.
pub fn print_peaks_json(peaks: &Value) {
    let Some(runs) = peaks.as_object() else {
        return;
    };
    if let Some(why) = peaks["unavailable"].as_str() {
        println!("peak RSS: none ({why})");
        return;
    }
    for (name, p) in runs {
        let label = format!("peak RSS, {name}");
        let target = p["max_exclusive_mib"].as_f64().unwrap_or(f64::NAN);
        match p["peak_mib"].as_f64() {
            Some(peak) => println!(
                "{label:<28} {peak:>8.1} MiB   < {target} MiB  {}   ({})",
                crate::table::mark(&p["met"]),
                p["command"].as_str().unwrap_or("")
            ),
            None => println!(
                "{label:<28} {:>8}       < {target} MiB  n/a   ({})",
                "-",
                p["unavailable"].as_str().unwrap_or("?")
            ),
        }
    }
}

/// Peak RSS of `target/release/mirra` run with `args`.
pub fn measure_args(root: &Path, target: &Path, log: &Path, args: &[&str]) -> Result<Run, String> {
    run_measured(root, &mirra_binary(root, target)?, log, args)
}

/// The release `mirra` binary, built now.
pub fn mirra_binary(root: &Path, target: &Path) -> Result<PathBuf, String> {
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
    Ok(binary)
}

/// Runs `binary` with `args` from `root`, output to `log`, and returns its peak RSS.
fn run_measured(root: &Path, binary: &Path, log: &Path, args: &[&str]) -> Result<Run, String> {
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
    let child = Command::new(binary)
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let (ok, ru_maxrss_mib) = wait_peak_rss(child)?;
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
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let peak_mib = reported_peak(&text).ok_or_else(|| {
        format!(
            "`mirra {}` printed no `Peak memory: host X MiB` line (see {})",
            args.join(" "),
            log.display()
        )
    })?;
    Ok(Run {
        peak_mib,
        ru_maxrss_mib,
        wall_s,
        binary: binary.to_owned(),
        log: log.to_owned(),
    })
}

/// The peak `mirra train` reports on its `Peak memory: host X MiB` line.
fn reported_peak(log: &str) -> Option<f64> {
    log.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Peak memory: host "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|mib| mib.parse().ok())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_the_runs_own_line() {
        let log = "Epoch 1/1 - 0.15s - loss: 0.7\nPeak memory: host 23.4 MiB (resident)\n";
        assert_eq!(reported_peak(log), Some(23.4));
        assert_eq!(reported_peak("Epoch 1/1 - loss: 0.7\n"), None);
    }
}
