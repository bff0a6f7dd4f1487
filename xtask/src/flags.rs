//! What the commands' flag parsers share: values that follow a flag, and lists of counts.

use crate::Failure;

/// The value after `flag`, or a usage error naming the command and the flag.
pub fn value(
    cmd: &str,
    flag: &str,
    it: &mut std::slice::Iter<'_, String>,
) -> Result<String, Failure> {
    it.next()
        .cloned()
        .ok_or_else(|| Failure::usage(format!("xtask {cmd}: {flag} needs a value")))
}

/// A comma-separated list of whole numbers of at least 1 (`1,2,4`), or a usage error.
pub fn counts(cmd: &str, flag: &str, v: &str) -> Result<Vec<usize>, Failure> {
    v.split(',')
        .map(|p| p.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<Vec<_>>>()
        .filter(|list| !list.is_empty())
        .ok_or_else(|| {
            Failure::usage(format!(
                "xtask {cmd}: {flag} takes whole numbers of at least 1 like 1,2,4, got `{v}`"
            ))
        })
}

/// Owned arguments from string literals (tests of the commands' parsers).
#[cfg(test)]
pub fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|a| a.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_missing_values() {
        assert_eq!(counts("x", "--replicas", "1, 2,4").unwrap(), vec![1, 2, 4]);
        for bad in ["", "0", "1,,2", "a", "-1"] {
            let e = counts("x", "--replicas", bad).unwrap_err();
            assert_eq!(e.code, 2, "{bad}");
        }
        let args = ["--out".to_string()];
        let mut it = args.iter();
        it.next();
        let e = value("report", "--out", &mut it).unwrap_err();
        assert_eq!(e.message, "xtask report: --out needs a value");
    }
}
