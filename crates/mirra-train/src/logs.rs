//! Logs (named scalars of a step or an epoch) and the History of a fit.

use std::path::Path;

use crate::fsutil::write_atomic;
use crate::Result;

/// Named values in the order they were added, as Keras's `logs` dict.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Logs {
    entries: Vec<(String, f64)>,
}

impl Logs {
    /// Empty logs.
    pub fn new() -> Logs {
        Logs::default()
    }

    /// Set `name` to `value` (replacing an earlier value).
    pub fn set(&mut self, name: &str, value: f64) {
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 = value,
            None => self.entries.push((name.to_string(), value)),
        }
    }

    /// Remove `name` if present.
    pub fn remove(&mut self, name: &str) {
        self.entries.retain(|(n, _)| n != name);
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.entries.iter().find(|(n, _)| n == name).map(|e| e.1)
    }

    /// All entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), *v))
    }
}

/// Every epoch's logs, one list per metric, as Keras's `History.history`, with the
/// epochs' numbers as Keras's `History.epoch`. Every list has one value per epoch: a
/// metric an epoch did not log is NaN there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// `(metric, values per epoch)` in first-seen order.
    pub history: Vec<(String, Vec<f64>)>,
    /// The epochs recorded (0-based).
    pub epochs: Vec<usize>,
}

/// The key of the epochs' numbers in [`History::to_json`].
pub const EPOCH_KEY: &str = "epoch";

impl History {
    /// Record one epoch's logs.
    pub fn push(&mut self, epoch: usize, logs: &Logs) {
        let before = self.epochs.len();
        self.epochs.push(epoch);
        for (name, value) in logs.iter() {
            match self.history.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => v.push(value),
                None => {
                    let mut v = vec![f64::NAN; before];
                    v.push(value);
                    self.history.push((name.to_string(), v));
                }
            }
        }
        for (_, v) in &mut self.history {
            v.resize(before + 1, f64::NAN);
        }
    }

    /// Forget the epochs numbered `epoch` and later (a fit that starts at `epoch` rewrites
    /// them).
    pub fn truncate_from(&mut self, epoch: usize) {
        let keep = self.epochs.iter().take_while(|&&e| e < epoch).count();
        self.epochs.truncate(keep);
        for (_, v) in &mut self.history {
            v.truncate(keep);
        }
    }

    /// True when no epoch is recorded.
    pub fn is_empty(&self) -> bool {
        self.epochs.is_empty()
    }

    /// The values of `name`, one per epoch.
    pub fn get(&self, name: &str) -> Option<&[f64]> {
        self.history
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The history as a JSON object of lists: the epochs' numbers under `epoch`, then one
    /// list per metric (`{"epoch": [0, 1], "loss": [..], "accuracy": [..], ..}`); NaN and
    /// infinities, which JSON lacks, are `null`.
    pub fn to_json(&self) -> serde_json::Value {
        let epochs = (
            EPOCH_KEY.to_string(),
            serde_json::Value::from(self.epochs.clone()),
        );
        let metrics = self
            .history
            .iter()
            .map(|(n, v)| (n.clone(), serde_json::Value::from(v.clone())));
        serde_json::Value::Object(std::iter::once(epochs).chain(metrics).collect())
    }

    /// Write [`History::to_json`] to `path` atomically (see
    /// [`write_atomic`](crate::fsutil::write_atomic)).
    pub fn save_json(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.to_json()).expect("JSON of numbers");
        write_atomic(path, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_collects_one_list_per_metric() {
        let mut h = History::default();
        for (e, l) in [(0, 0.5), (1, 0.25)] {
            let mut logs = Logs::new();
            logs.set("loss", l);
            logs.set("accuracy", 1.0 - l);
            h.push(e, &logs);
        }
        assert_eq!(h.get("loss").unwrap(), &[0.5, 0.25]);
        assert_eq!(h.to_json()["accuracy"], serde_json::json!([0.5, 0.75]));
        assert_eq!(h.to_json()["epoch"], serde_json::json!([0, 1]));
    }

    #[test]
    fn every_list_has_one_value_per_epoch_and_a_resumed_fit_cuts_the_rest() {
        let mut h = History::default();
        let logs = |entries: &[(&str, f64)]| {
            let mut l = Logs::new();
            for (n, v) in entries {
                l.set(n, *v);
            }
            l
        };
        h.push(0, &logs(&[("loss", 1.0)]));
        h.push(1, &logs(&[("loss", 0.5), ("val_loss", 0.6)]));
        h.push(2, &logs(&[("val_loss", 0.4)]));
        let json = h.to_json();
        assert_eq!(json["loss"], serde_json::json!([1.0, 0.5, null]));
        assert_eq!(json["val_loss"], serde_json::json!([null, 0.6, 0.4]));
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["epoch", "loss", "val_loss"]);
        h.truncate_from(1);
        assert_eq!(h.epochs, [0]);
        assert_eq!(h.get("loss").unwrap(), &[1.0]);
        assert_eq!(h.get("val_loss").unwrap().len(), 1);
        h.truncate_from(0);
        assert!(h.is_empty());
    }
}
