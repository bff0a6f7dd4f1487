//! Validation of hyperparameters: one error naming the optimizer, the hyperparameter, its
//! value and the range it must lie in. The lowest layer of the crate: the schedules and the
//! update rules both check their inputs with these.

use crate::{OptimError, Result};

/// Checks `lo <= value < hi` (or `<= hi` when `hi_inclusive`), naming the range in errors.
pub(crate) fn check_range(
    op: &'static str,
    name: &'static str,
    value: f64,
    (lo, hi, hi_inclusive): (f64, f64, bool),
    expected: &'static str,
) -> Result<()> {
    let ok = value >= lo
        && if hi_inclusive {
            value <= hi
        } else {
            value < hi
        };
    if ok {
        Ok(())
    } else {
        Err(OptimError::InvalidHyperparameter {
            op,
            name,
            value,
            expected,
        })
    }
}

/// `[0, 1)`: betas, rho.
pub(crate) fn check_unit_open(op: &'static str, name: &'static str, value: f64) -> Result<()> {
    check_range(op, name, value, (0.0, 1.0, false), "a value in [0, 1)")
}

/// `[0, 1]`: momentum.
pub(crate) fn check_unit(op: &'static str, name: &'static str, value: f64) -> Result<()> {
    check_range(op, name, value, (0.0, 1.0, true), "a value in [0, 1]")
}

/// A finite value `> 0`: epsilon.
pub(crate) fn check_positive(op: &'static str, name: &'static str, value: f64) -> Result<()> {
    if value > 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(OptimError::InvalidHyperparameter {
            op,
            name,
            value,
            expected: "a finite value > 0",
        })
    }
}

/// A finite value `>= 0`: weight decay.
pub(crate) fn check_non_negative(op: &'static str, name: &'static str, value: f64) -> Result<()> {
    check_range(
        op,
        name,
        value,
        (0.0, f64::INFINITY, false),
        "a finite value >= 0",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_reject_nan_and_bounds() {
        assert!(check_unit_open("t", "beta1", 0.0).is_ok());
        assert!(check_unit_open("t", "beta1", 1.0).is_err());
        assert!(check_unit_open("t", "beta1", f64::NAN).is_err());
        assert!(check_unit("t", "momentum", 1.0).is_ok());
        assert!(check_unit("t", "momentum", -0.1).is_err());
        assert!(check_positive("t", "epsilon", 0.0).is_err());
        assert!(check_positive("t", "epsilon", f64::INFINITY).is_err());
        assert!(check_non_negative("t", "weight_decay", 0.0).is_ok());
        assert!(check_non_negative("t", "weight_decay", f64::INFINITY).is_err());
        let err = check_unit_open("adam", "beta2", 1.5).unwrap_err();
        assert_eq!(
            err.to_string(),
            "adam: beta2 = 1.5 is invalid: expected a value in [0, 1)"
        );
    }
}
