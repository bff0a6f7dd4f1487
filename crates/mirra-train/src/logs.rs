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

/// Every epoch's logs, one list per metric, as Keras's `History.history`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// `(metric, values per epoch)` in first-seen order.
    pub history: Vec<(String, Vec<f64>)>,
    /// The epochs recorded (0-based).
    pub epochs: Vec<usize>,
}

impl History {
    /// Record one epoch's logs.
    pub fn push(&mut self, epoch: usize, logs: &Logs) {
        self.epochs.push(epoch);
        for (name, value) in logs.iter() {
            match self.history.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => v.push(value),
                None => self.history.push((name.to_string(), vec![value])),
            }
        }
    }

    /// The values of `name`, one per epoch.
    pub fn get(&self, name: &str) -> Option<&[f64]> {
        self.history
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The history as a JSON object of lists (`{"loss": [..], "accuracy": [..], ..}`).
    pub fn to_json(&self) -> serde_json::Value {
        let map = self
            .history
            .iter()
            .map(|(n, v)| (n.clone(), serde_json::Value::from(v.clone())))
            .collect::<serde_json::Map<_, _>>();
        serde_json::Value::Object(map)
    }

    /// Write [`History::to_json`] to `path` atomically.
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
    }
}
