//! Standard output for progress lines, whose failures do not stop training.
//!
//! `println!` panics when standard output fails: a closed pipe (`mirra train | head -1`)
//! or a full disk would kill a run before its first checkpoint. Lines go through
//! [`print_line`] instead, which reports what happened: a closed pipe ([`Printed::Closed`],
//! remembered for the rest of the process: the reader is gone, so the run should end
//! cleanly, [`ProgbarLogger`](crate::ProgbarLogger) stops it after the epoch's callbacks)
//! or another failure ([`Printed::Failed`], warned about once on standard error; training
//! goes on).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// What is known of standard output.
#[derive(Debug)]
struct OutputState {
    /// Set once it has been found closed.
    closed: AtomicBool,
    /// Set once a failure other than a closed pipe has been reported.
    warned: AtomicBool,
    /// Where that report goes.
    report: fn(&str),
}

static STDOUT: OutputState = OutputState::new(warn);

/// What became of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Printed {
    /// Written.
    Shown,
    /// Standard output is a pipe whose reader is gone: nobody reads this line or the
    /// next ones.
    Closed,
    /// Writing failed otherwise (a full disk, an I/O error): the line is lost.
    Failed,
}

impl OutputState {
    const fn new(report: fn(&str)) -> OutputState {
        OutputState {
            closed: AtomicBool::new(false),
            warned: AtomicBool::new(false),
            report,
        }
    }

    /// Write with `write` unless the output is known to be closed, and record what
    /// the result means for the lines to come.
    fn print(&self, write: impl FnOnce() -> std::io::Result<()>) -> Printed {
        if self.closed.load(Ordering::Relaxed) {
            return Printed::Closed;
        }
        match write() {
            Ok(()) => Printed::Shown,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed.store(true, Ordering::Relaxed);
                Printed::Closed
            }
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    (self.report)(&format!(
                        "warning: cannot write to standard output ({e}); training goes on \
                         without its progress lines"
                    ));
                }
                Printed::Failed
            }
        }
    }
}

/// Print `line` and a newline to standard output (flushed), without panicking.
pub fn print_line(line: &str) -> Printed {
    if SILENCED.load(Ordering::Relaxed) {
        return Printed::Shown;
    }
    STDOUT.print(|| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").and_then(|()| out.flush())
    })
}

/// Set by [`silence`].
static SILENCED: AtomicBool = AtomicBool::new(false);

/// Drop every later line of this process (reported as shown): the other processes of an
/// MPI job, whose lines would repeat rank 0's. Warnings still go to standard error.
pub fn silence() {
    SILENCED.store(true, Ordering::Relaxed);
}

/// True once standard output has been found closed (see [`Printed::Closed`]).
pub fn stdout_closed() -> bool {
    STDOUT.closed.load(Ordering::Relaxed)
}

/// `text` with its control characters (newlines, escapes, NUL) escaped as Rust writes
/// them (`\n`, `\u{1b}`): a message quoting a string from a file stays one line and
/// cannot drive the terminal.
pub fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    out
}

/// Print `line` and a newline to standard error, ignoring failure (there is nowhere
/// left to report it).
pub fn warn(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn one_line_escapes_control_characters_only() {
        assert_eq!(
            one_line("format `a\nb\u{1b}[2J` isn't \"ok\"\t"),
            "format `a\\nb\\u{1b}[2J` isn't \"ok\"\\t"
        );
    }

    #[test]
    fn a_broken_pipe_is_remembered_and_other_failures_are_not() {
        static REPORTS: AtomicUsize = AtomicUsize::new(0);
        let state = OutputState::new(|line| {
            assert!(line.contains("No space left on device"), "{line}");
            REPORTS.fetch_add(1, Ordering::Relaxed);
        });
        let full = || Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(state.print(full), Printed::Failed);
        assert_eq!(state.print(full), Printed::Failed);
        // Reported once.
        assert_eq!(REPORTS.load(Ordering::Relaxed), 1);
        assert_eq!(state.print(|| Ok(())), Printed::Shown);
        let pipe = || Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(state.print(pipe), Printed::Closed);
        // Nothing more is written once closed.
        assert_eq!(
            state.print(|| panic!("written after the pipe closed")),
            Printed::Closed
        );
        assert!(!stdout_closed());
    }
}
