//! `mirra launch -np N [--max-restarts M] -- train ...`: `mirra train` on N processes
//! under `mpirun`, each a worker of a multi-worker strategy, and the job started again
//! from its last checkpoint when it fails (a process killed, a worker that stopped
//! answering: OpenMPI ends the whole job, so the job restarts, not a process). Each
//! restart is logged with its cause, taken from what mpirun and the workers printed.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use mirra::train::console::{one_line, warn};

use crate::Failure;

/// Flags of `mirra launch`.
#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// The processes (workers) of the job, mpirun's `-np` (spelled `-np N` or `--np N`).
    #[arg(long = "np", short = 'n', value_name = "N", value_parser = crate::positive)]
    pub np: usize,
    /// Start the job again up to M times when it fails, each time with --resume: the
    /// train command needs --checkpoint-dir.
    #[arg(long, value_name = "M", default_value_t = 0)]
    pub max_restarts: usize,
    /// Let mpirun start more processes than the machine has cores (mpirun's
    /// --oversubscribe).
    #[arg(long)]
    pub oversubscribe: bool,
    /// The mpirun to call.
    #[arg(long, value_name = "PATH", default_value = "mpirun")]
    pub mpirun: PathBuf,
    /// What every process runs: `train` and its flags, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The command line with mpirun's spelling `-np N` of `mirra launch` turned into clap's
/// `--np N` (clap has no long flags with one dash); everything after `--` is left alone.
pub fn mpirun_spelling(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.collect();
    if args.get(1).is_some_and(|a| a == "launch") {
        let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
        for a in &mut args[2..end] {
            if a == "-np" {
                *a = "--np".into();
            }
        }
    }
    args
}

/// How one attempt of the job ended.
enum Ended {
    Done,
    /// A usage error (exit status 2): starting again would fail the same way.
    Usage,
    /// A failure, with its cause.
    Failed(String),
}

pub fn run(args: LaunchArgs) -> Result<(), Failure> {
    if args.command.first().map(String::as_str) != Some("train") {
        return Err(Failure::Usage(format!(
            "mirra launch runs `train` on every process (`mirra launch -np N -- train ...`), \
             not {:?}",
            args.command.first().map_or("nothing", String::as_str)
        )));
    }
    let has = |flag: &str| args.command.iter().any(|a| a == flag);
    if args.max_restarts > 0 && !has("--checkpoint-dir") {
        return Err(Failure::Usage(
            "--max-restarts needs the train command's --checkpoint-dir DIR: a restart resumes \
             from the last checkpoint"
                .into(),
        ));
    }
    if has("--max-restarts") {
        return Err(Failure::Usage(
            "--max-restarts belongs to mirra launch under mpirun (`mirra launch -np N \
             --max-restarts M -- train ...`), not to the train command"
                .into(),
        ));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Run(format!("cannot find the mirra executable: {e}")))?;
    let mut command = args.command.clone();
    for restart in 0..=args.max_restarts {
        if restart > 0 && !command.iter().any(|a| a == "--resume") {
            command.push("--resume".into());
        }
        match attempt(&args, &exe, &command)? {
            Ended::Done => return Ok(()),
            Ended::Usage => {
                return Err(Failure::Usage(
                    "the train command was refused (its error is above)".into(),
                ))
            }
            Ended::Failed(cause) if restart < args.max_restarts => warn(&format!(
                "mirra launch: the job failed ({}); restart {} of {} from the last checkpoint",
                one_line(&cause),
                restart + 1,
                args.max_restarts
            )),
            Ended::Failed(cause) => {
                return Err(Failure::Run(format!(
                    "the job failed ({cause}){}",
                    match args.max_restarts {
                        0 => String::new(),
                        n => format!(" after {n} restart{}", if n == 1 { "" } else { "s" }),
                    }
                )))
            }
        }
    }
    unreachable!("the last attempt returns")
}

/// One run of the job: mpirun's standard error passed through line by line, and kept
/// to name the cause of a failure.
fn attempt(args: &LaunchArgs, exe: &std::path::Path, command: &[String]) -> Result<Ended, Failure> {
    let mut mpirun = Command::new(&args.mpirun);
    if is_root() {
        mpirun.arg("--allow-run-as-root");
    }
    if args.oversubscribe {
        mpirun.arg("--oversubscribe");
    }
    mpirun
        .args(["-np", &args.np.to_string()])
        .arg(exe)
        .args(command)
        .stderr(Stdio::piped());
    let mut child = mpirun.spawn().map_err(|e| {
        Failure::Usage(format!(
            "cannot run {} ({e}): install OpenMPI (ci/install-mpi.sh) or name it with --mpirun",
            args.mpirun.display()
        ))
    })?;
    let mut causes = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        let mut ours = std::io::stderr();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(ours, "{line}");
            if is_cause(&line) {
                causes.push(line.trim().to_string());
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| Failure::Run(format!("waiting for mpirun: {e}")))?;
    Ok(match status.code() {
        Some(0) => Ended::Done,
        Some(2) => Ended::Usage,
        code => Ended::Failed(match causes.first() {
            Some(cause) => cause.clone(),
            None => match code {
                Some(c) => format!("mpirun exited with status {c}"),
                None => "mpirun was killed by a signal".into(),
            },
        }),
    })
}

/// A line that says why a job failed: a worker's error, a deadline, or mpirun naming a
/// process that died.
fn is_cause(line: &str) -> bool {
    let l = line.trim();
    l.starts_with("error: ")
        || l.starts_with("mirra: ")
        || (l.contains("rank") && (l.contains("exited on signal") || l.contains("exited with")))
        || l.contains("process rank")
}

/// True when this process runs as root (mpirun then needs --allow-run-as-root): the
/// owner of `/proc/self` is the process's user.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpirun_s_np_is_spelled_for_clap_before_the_command_only() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            mpirun_spelling(
                args(&["mirra", "launch", "-np", "2", "--", "train", "-np"]).into_iter()
            ),
            args(&["mirra", "launch", "--np", "2", "--", "train", "-np"])
        );
        assert_eq!(
            mpirun_spelling(args(&["mirra", "train", "-np"]).into_iter()),
            args(&["mirra", "train", "-np"])
        );
    }

    #[test]
    fn causes_are_errors_deadlines_and_lost_ranks() {
        assert!(is_cause("error: an injected fault"));
        assert!(is_cause(
            "mirra: all_gather: rank 0 timed out after 2s waiting for rank(s) [1]; ending the MPI job"
        ));
        assert!(is_cause(
            "mpirun noticed that process rank 1 with PID 0 on node x exited on signal 9 (Killed)."
        ));
        assert!(!is_cause("Epoch 1/5 - loss: 0.3"));
    }
}
