//! What the commands' tables share: a number cell of a JSON report and a target's verdict.

use serde_json::Value;

/// `v` with `digits` decimals, or `-` when it is not a number.
pub fn cell(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// `ok`, `MISSED` or `n/a` for a target's `met` (true, false, null).
pub fn mark(met: &Value) -> &'static str {
    match met.as_bool() {
        Some(true) => "ok",
        Some(false) => "MISSED",
        None => "n/a",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cells_and_marks() {
        assert_eq!(cell(&json!(1.23456), 2), "1.23");
        assert_eq!(cell(&Value::Null, 2), "-");
        assert_eq!(mark(&json!(true)), "ok");
        assert_eq!(mark(&json!(false)), "MISSED");
        assert_eq!(mark(&Value::Null), "n/a");
    }
}
