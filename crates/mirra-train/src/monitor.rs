//! The monitored quantity of [`EarlyStopping`](crate::EarlyStopping) and
//! [`ModelCheckpoint`](crate::ModelCheckpoint): its name, whether lower or higher is better,
//! and its value in an epoch's logs.

use crate::{Logs, Result, TrainError};

/// Whether the monitored quantity should go down or up (Keras's `mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Inferred from the name as Keras does: see [`Mode::infer`].
    #[default]
    Auto,
    /// Lower is better.
    Min,
    /// Higher is better.
    Max,
}

/// Names (without `val_`) of metrics that improve upwards, matched as substrings; `acc`
/// and `fmeasure` are Keras's own rule, the others the metrics Keras marks as going up.
const UPWARD: &[&str] = &[
    "acc",
    "auc",
    "precision",
    "recall",
    "fmeasure",
    "f1",
    "fbeta",
    "iou",
];
/// Names (without `val_`) of quantities that improve downwards, matched as substrings.
const DOWNWARD: &[&str] = &["loss", "error", "crossentropy", "hinge", "divergence"];

impl Mode {
    /// The direction of `monitor`: this mode if it is not [`Mode::Auto`]; otherwise, with
    /// any `val_` prefix removed, [`Mode::Max`] for accuracies, AUC, precision, recall and
    /// F-scores (Keras's `"acc" in monitor` rule and its metrics' directions),
    /// [`Mode::Min`] for losses and errors, and `None` for a name that says neither.
    pub fn infer(self, monitor: &str) -> Option<Mode> {
        if self != Mode::Auto {
            return Some(self);
        }
        let name = monitor.strip_prefix("val_").unwrap_or(monitor);
        if name == "loss" {
            Some(Mode::Min)
        } else if UPWARD.iter().any(|k| name.contains(k)) {
            Some(Mode::Max)
        } else if DOWNWARD.iter().any(|k| name.contains(k)) {
            Some(Mode::Min)
        } else {
            None
        }
    }

    /// The value a first epoch always beats: +inf when minimising, -inf when maximising.
    pub(crate) fn worst(self) -> f64 {
        if self == Mode::Max {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        }
    }

    /// Whether `current` beats `reference` by more than `min_delta` (>= 0) in this
    /// direction ([`Mode::Auto`] counts as [`Mode::Min`]). NaN never improves.
    pub(crate) fn improves(self, current: f64, reference: f64, min_delta: f64) -> bool {
        if self == Mode::Max {
            current - min_delta > reference
        } else {
            current + min_delta < reference
        }
    }
}

/// The value of `monitor` in `logs`, or an error from `who` listing what the logs hold.
/// (Keras only warns, and the callback then silently does nothing; a misspelt monitor or a
/// `val_` one without validation data is better reported.)
pub(crate) fn monitored(who: &str, monitor: &str, logs: &Logs) -> Result<f64> {
    logs.get(monitor).ok_or_else(|| {
        let held: Vec<&str> = logs.iter().map(|(n, _)| n).collect();
        let hint = if monitor.starts_with("val_") {
            " (is there validation data?)"
        } else {
            ""
        };
        TrainError::Invalid(format!(
            "{who}: monitor `{monitor}` is not in the epoch's logs{hint}; they hold: {}",
            held.join(", ")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_mode_follows_the_name_as_keras_does() {
        for (name, mode) in [
            ("loss", Some(Mode::Min)),
            ("val_loss", Some(Mode::Min)),
            ("val_mean_squared_error", Some(Mode::Min)),
            ("accuracy", Some(Mode::Max)),
            ("val_sparse_categorical_accuracy", Some(Mode::Max)),
            ("val_auc", Some(Mode::Max)),
            ("samples_per_sec", None),
        ] {
            assert_eq!(Mode::Auto.infer(name), mode, "{name}");
        }
        assert_eq!(Mode::Max.infer("loss"), Some(Mode::Max));
    }

    #[test]
    fn improvement_needs_more_than_min_delta_and_nan_never_improves() {
        assert!(Mode::Min.improves(0.5, 0.7, 0.1));
        assert!(!Mode::Min.improves(0.65, 0.7, 0.1));
        assert!(Mode::Max.improves(0.9, 0.7, 0.1));
        assert!(!Mode::Max.improves(0.75, 0.7, 0.1));
        assert!(Mode::Min.improves(1e9, Mode::Min.worst(), 0.0));
        assert!(!Mode::Min.improves(f64::NAN, Mode::Min.worst(), 0.0));
        assert!(!Mode::Max.improves(f64::NAN, Mode::Max.worst(), 0.0));
    }

    #[test]
    fn a_missing_monitor_lists_what_the_logs_hold() {
        let mut logs = Logs::new();
        logs.set("loss", 0.5);
        let err = monitored("EarlyStopping", "val_loss", &logs).unwrap_err();
        assert_eq!(
            err.to_string(),
            "EarlyStopping: monitor `val_loss` is not in the epoch's logs \
             (is there validation data?); they hold: loss"
        );
        assert_eq!(monitored("EarlyStopping", "loss", &logs).unwrap(), 0.5);
    }
}
