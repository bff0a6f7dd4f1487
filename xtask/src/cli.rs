//! Flags of the commands, parsed by clap: one error line (exit status 2) for a bad flag.

use clap::Parser;

use crate::Failure;

/// Parses `args` (the command's flags, without the command's name) into `T`.
///
/// `Ok(None)` when the user asked for `--help` (clap printed it); a usage [`Failure`]
/// carrying clap's message for anything clap refuses.
pub fn parse<T: Parser>(name: &str, args: &[String]) -> Result<Option<T>, Failure> {
    match T::try_parse_from(std::iter::once(name.to_string()).chain(args.iter().cloned())) {
        Ok(t) => Ok(Some(t)),
        Err(e) if !e.use_stderr() => {
            // --help and --version: clap's text on stdout, success.
            let _ = e.print();
            Ok(None)
        }
        Err(e) => Err(Failure::usage(
            e.render().to_string().trim_end().to_string(),
        )),
    }
}

/// Owned arguments from string literals (tests of the commands' flags).
#[cfg(test)]
pub fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|a| a.to_string()).collect()
}
