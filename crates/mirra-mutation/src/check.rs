//! The property: every damaged file gives one error line naming the file, or exactly the
//! contents it holds; within a time bound, without a panic, and allocating at most what
//! it declares plus a slack.

use std::cell::Cell;
use std::fmt::{Debug, Display};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestError, TestRunner};

use crate::alloc::{is_installed, peak_during};
use crate::mutate::{apply, mutations};

/// The environment variable that sets the number of cases (see [`cases_from_env`]).
pub const CASES_VAR: &str = "MIRRA_MUTATION_CASES";

/// The cases for a test's files: `defaults` (one count per file), or, when
/// `MIRRA_MUTATION_CASES=N` is set, `N` cases in all shared in the same proportions (at
/// least 1 each). An error names a value that is not a positive whole number.
pub fn cases_from_env(defaults: &[u32]) -> Result<Vec<u32>, String> {
    scaled_cases(defaults, std::env::var(CASES_VAR).ok().as_deref())
}

/// [`cases_from_env`] with the variable's value given.
fn scaled_cases(defaults: &[u32], value: Option<&str>) -> Result<Vec<u32>, String> {
    let Some(v) = value else {
        return Ok(defaults.to_vec());
    };
    let total = match v.trim().parse::<u64>() {
        Ok(n) if n > 0 => n,
        _ => {
            return Err(format!(
                "{CASES_VAR}={v:?}: expected a positive whole number"
            ))
        }
    };
    let sum: u64 = defaults.iter().map(|&d| u64::from(d)).sum::<u64>().max(1);
    Ok(defaults
        .iter()
        .map(|&d| (total * u64::from(d) / sum).clamp(1, u64::from(u32::MAX)) as u32)
        .collect())
}

/// How a run of [`check_reader`] goes.
#[derive(Clone, Debug)]
pub struct Config {
    /// Damaged files tried.
    pub cases: u32,
    /// The longest one read may take; a read still running then is reported as a hang.
    pub time_limit: Duration,
    /// Bytes a read may allocate beyond what its file declares.
    pub alloc_slack: u64,
    /// How many simpler variants of a failing case proptest tries.
    pub max_shrink_iters: u32,
}

impl Config {
    /// `cases` cases, 10 s per read (no reader here needs a tenth of it), 1 MiB of slack.
    pub fn new(cases: u32) -> Config {
        Config {
            cases,
            time_limit: Duration::from_secs(10),
            alloc_slack: 1 << 20,
            max_shrink_iters: 256,
        }
    }
}

/// What reading one damaged file must give, as an oracle independent of the reader
/// works it out from the damaged bytes.
#[derive(Clone, Debug)]
pub struct Expectation<T> {
    /// `Some(contents)`: the read must succeed with exactly these contents; `None`: the
    /// file is not valid and the read must fail.
    pub contents: Option<T>,
    /// The size the file declares, capped by what its stored bytes can hold: the read
    /// may allocate this much, plus [`Config::alloc_slack`].
    pub declared_bytes: u64,
}

/// What the cases of a passing [`check_reader`] gave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Reads that succeeded, with the expected contents.
    pub read: u32,
    /// Reads that failed with one line naming the file.
    pub refused: u32,
    /// The most bytes one read allocated.
    pub max_alloc: u64,
}

/// What one read on its own thread gave: its result (the error as text) and its peak
/// allocation.
type Outcome<T> = (Result<T, String>, u64);

/// Tries `config.cases` damaged copies of `original`, each written to a file named
/// `file_name` in a temporary directory and read there by `read` on a thread of its own;
/// `expect` says what each read must give. `Err` describes the first failing case (after
/// proptest has simplified it): a panic, a read over the time limit, an allocation over
/// the bound, contents other than expected, an error on a valid file, success on a
/// damaged one, or an error that is not one line naming the file.
pub fn check_reader<T, E>(
    config: &Config,
    file_name: &str,
    original: &[u8],
    read: fn(&Path) -> Result<T, E>,
    expect: impl Fn(&[u8]) -> Expectation<T>,
) -> Result<Stats, String>
where
    T: PartialEq + Debug + Send + 'static,
    E: Display + 'static,
{
    if !is_installed() {
        return Err("CountingAlloc is not this binary's global allocator: \
                    allocations cannot be bounded"
            .into());
    }
    let dir = tempfile::tempdir().map_err(|e| format!("cannot make a temporary directory: {e}"))?;
    let path = dir.path().join(file_name);
    let stats = Cell::new(Stats::default());
    let mut runner = TestRunner::new(RunnerConfig {
        cases: config.cases,
        max_shrink_iters: config.max_shrink_iters,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let result = runner.run(&mutations(original.len()), |ms| {
        let bytes = apply(original, &ms);
        let expected = expect(&bytes);
        // A new file each time: rewriting one in place makes ext4 flush it (auto_da_alloc),
        // 30 times slower.
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, &bytes)
            .map_err(|e| TestCaseError::fail(format!("cannot write {}: {e}", path.display())))?;
        let (got, alloc) = read_on_thread(read, &path, config.time_limit)?;
        let bound = expected.declared_bytes.saturating_add(config.alloc_slack);
        if alloc > bound {
            return Err(TestCaseError::fail(format!(
                "the read allocated {alloc} bytes, more than the {} the file declares + {} \
                 ({})",
                expected.declared_bytes,
                config.alloc_slack,
                outcome(&got)
            )));
        }
        let mut s = stats.get();
        s.max_alloc = s.max_alloc.max(alloc);
        match (got, expected.contents) {
            (Ok(v), Some(want)) if v == want => s.read += 1,
            (Ok(v), Some(want)) => {
                return Err(TestCaseError::fail(format!(
                    "read {} instead of {}",
                    short(&v),
                    short(&want)
                )))
            }
            (Ok(v), None) => {
                return Err(TestCaseError::fail(format!(
                    "a damaged file was read without error: {}",
                    short(&v)
                )))
            }
            (Err(e), Some(_)) => {
                return Err(TestCaseError::fail(format!(
                    "a valid file was refused: {e}"
                )))
            }
            (Err(e), None) => {
                check_message(&e, &path).map_err(TestCaseError::fail)?;
                s.refused += 1;
            }
        }
        stats.set(s);
        Ok(())
    });
    match result {
        Ok(()) => Ok(stats.get()),
        Err(TestError::Fail(why, ms)) => Err(format!(
            "{file_name}: {why}\n  mutations (after shrinking): {ms:?}"
        )),
        Err(TestError::Abort(why)) => Err(format!("{file_name}: aborted: {why}")),
    }
}

/// `read(path)` on a thread of its own, with its peak allocation; a failure when it
/// panics or is still running after `limit` (the thread is then left to itself).
fn read_on_thread<T, E>(
    read: fn(&Path) -> Result<T, E>,
    path: &Path,
    limit: Duration,
) -> Result<Outcome<T>, TestCaseError>
where
    T: Send + 'static,
    E: Display + 'static,
{
    let (tx, rx) = mpsc::channel::<Outcome<T>>();
    let owned: PathBuf = path.to_owned();
    let handle = std::thread::Builder::new()
        .name("mutation-read".into())
        .spawn(move || {
            let (got, alloc) = peak_during(|| read(&owned).map_err(|e| e.to_string()));
            let _ = tx.send((got, alloc));
        })
        .map_err(|e| TestCaseError::fail(format!("cannot start a thread: {e}")))?;
    match rx.recv_timeout(limit) {
        Ok(outcome) => {
            let _ = handle.join();
            Ok(outcome)
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Err(TestCaseError::fail(format!(
            "the read still ran after {limit:?} (a hang?)"
        ))),
        // The thread ended without sending: it panicked (the panic hook has printed
        // the message above).
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let _ = handle.join();
            Err(TestCaseError::fail(
                "the read panicked (its message is printed above)",
            ))
        }
    }
}

/// An error must be one non-empty line that names the file.
fn check_message(e: &str, path: &Path) -> Result<(), String> {
    let name = path.display().to_string();
    if e.trim().is_empty() || e.contains('\n') {
        Err(format!("the error is not one line: {e:?}"))
    } else if !e.contains(&name) {
        Err(format!("the error does not name the file {name}: {e}"))
    } else {
        Ok(())
    }
}

/// The outcome, for a message.
fn outcome<T: Debug>(got: &Result<T, String>) -> String {
    match got {
        Ok(v) => format!("it read {}", short(v)),
        Err(e) => format!("it failed: {e}"),
    }
}

/// At most 200 characters of `v`'s debug form.
fn short<T: Debug>(v: &T) -> String {
    let s = format!("{v:?}");
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_sets_the_total_shared_as_the_defaults_are() {
        assert_eq!(scaled_cases(&[300, 100], None), Ok(vec![300, 100]));
        assert_eq!(
            scaled_cases(&[300, 100], Some("40000")),
            Ok(vec![30000, 10000])
        );
        assert_eq!(scaled_cases(&[3000, 1], Some("100")), Ok(vec![99, 1]));
        for bad in ["0", "-5", "many", ""] {
            let e = scaled_cases(&[1], Some(bad)).unwrap_err();
            assert!(e.starts_with("MIRRA_MUTATION_CASES="), "{e}");
        }
    }
}
