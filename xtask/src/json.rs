//! JSON output helpers: rounding for readable files and atomic writes.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

/// `x` rounded to `digits` decimals, as JSON; `null` when not finite.
pub fn num(x: f64, digits: i32) -> Value {
    if !x.is_finite() {
        return Value::Null;
    }
    let scale = 10f64.powi(digits);
    serde_json::Number::from_f64((x * scale).round() / scale).map_or(Value::Null, Value::Number)
}

/// An optional number rounded as [`num`]; `None` is `null`.
pub fn opt(x: Option<f64>, digits: i32) -> Value {
    x.map_or(Value::Null, |x| num(x, digits))
}

/// A target that `measured` must reach: `{min, measured (rounded to digits), met}`, `met`
/// null when nothing was measured.
pub fn at_least(min: f64, measured: Option<f64>, digits: i32) -> Value {
    json!({ "min": min, "measured": opt(measured, digits), "met": measured.map(|x| x >= min) })
}

/// A target that `measured` must not pass: `{max, measured, met}`, as [`at_least`].
pub fn at_most(max: f64, measured: Option<f64>, digits: i32) -> Value {
    json!({ "max": max, "measured": opt(measured, digits), "met": measured.map(|x| x <= max) })
}

/// Writes `value` (pretty-printed, with a final newline) to `path` atomically, as
/// [`write_bytes_atomic`].
pub fn write_atomic(path: &Path, value: &Value) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    write_bytes_atomic(path, &bytes)
}

/// [`write_atomic`] for a command: a failure names the file, success says where it went
/// and, with `started`, how long the command took.
pub fn save(
    path: &Path,
    value: &Value,
    started: Option<std::time::Instant>,
) -> Result<(), crate::Failure> {
    write_atomic(path, value)
        .map_err(|e| crate::Failure::run(format!("cannot write {}: {e}", path.display())))?;
    match started {
        Some(t) => println!(
            "# wrote {} in {:.0} s",
            path.display(),
            t.elapsed().as_secs_f64()
        ),
        None => println!("# wrote {}", path.display()),
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically: into a temporary file next to it, flushed to disk,
/// then renamed over `path`, so a reader never sees a half-written file. Creates the parent
/// directory.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_and_non_finite_is_null() {
        assert_eq!(num(1.23456, 2), serde_json::json!(1.23));
        assert_eq!(num(f64::NAN, 2), Value::Null);
        assert_eq!(opt(None, 2), Value::Null);
    }

    #[test]
    fn atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("xtask-json-{}", std::process::id()));
        let path = dir.join("core.json");
        write_atomic(&path, &serde_json::json!({"a": 1})).unwrap();
        write_atomic(&path, &serde_json::json!({"a": 2})).unwrap();
        let back: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back["a"], 2);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
