//! Keras's `EarlyStopping`: stop when a monitored quantity stops improving.

use mirra_tensor::Tensor;

use crate::callbacks::{Callback, Control, TrainInfo};
use crate::monitor::{monitored, Mode};
use crate::{Logs, Model, Result, TrainError};

/// Stops `fit` once `monitor` has not improved for `patience` epochs, with Keras 3's rules:
///
/// - an epoch improves when its value beats the best so far by more than `min_delta`
///   (lower for [`Mode::Min`], higher for [`Mode::Max`]; [`Mode::Auto`] infers it from the
///   name, see [`Mode::infer`]); the first monitored epoch always improves;
/// - the count of epochs without improvement restarts on an improvement that also beats
///   the `baseline`, when one is set;
/// - training stops at the end of an epoch (never the first) that leaves `patience` epochs
///   without such an improvement;
/// - with `restore_best_weights`, the weights of the best epoch are put back when training
///   ends (after a stop or not), through [`Model::set_weights`];
/// - epochs before `start_from_epoch` (0-based) are not monitored.
///
/// A monitor missing from the epoch's logs is an error (Keras only warns).
#[derive(Debug)]
pub struct EarlyStopping {
    monitor: String,
    patience: usize,
    min_delta: f64,
    mode: Mode,
    baseline: Option<f64>,
    restore_best_weights: bool,
    start_from_epoch: usize,
    // State of one `fit`.
    direction: Mode,
    wait: usize,
    best: f64,
    best_epoch: Option<usize>,
    best_weights: Option<Vec<Tensor>>,
    stopped_epoch: Option<usize>,
}

impl Default for EarlyStopping {
    /// Keras's defaults: monitor `val_loss`, patience 0.
    fn default() -> Self {
        EarlyStopping::new("val_loss")
    }
}

impl EarlyStopping {
    /// Early stopping on `monitor` (a log name such as `val_loss` or `val_accuracy`) with
    /// patience 0, min_delta 0, [`Mode::Auto`], no baseline, no restore.
    pub fn new(monitor: impl Into<String>) -> EarlyStopping {
        EarlyStopping {
            monitor: monitor.into(),
            patience: 0,
            min_delta: 0.0,
            mode: Mode::Auto,
            baseline: None,
            restore_best_weights: false,
            start_from_epoch: 0,
            direction: Mode::Min,
            wait: 0,
            best: f64::INFINITY,
            best_epoch: None,
            best_weights: None,
            stopped_epoch: None,
        }
    }

    /// Epochs without improvement after which training stops.
    pub fn patience(mut self, patience: usize) -> Self {
        self.patience = patience;
        self
    }

    /// The least change that counts as an improvement (its absolute value, as Keras).
    pub fn min_delta(mut self, min_delta: f64) -> Self {
        self.min_delta = min_delta.abs();
        self
    }

    /// Whether lower or higher is better.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// A value the monitor must beat for an improvement to restart the patience count.
    pub fn baseline(mut self, baseline: f64) -> Self {
        self.baseline = Some(baseline);
        self
    }

    /// Put back the best epoch's weights when training ends.
    pub fn restore_best_weights(mut self, restore: bool) -> Self {
        self.restore_best_weights = restore;
        self
    }

    /// The first (0-based) epoch to monitor, for a warm-up.
    pub fn start_from_epoch(mut self, epoch: usize) -> Self {
        self.start_from_epoch = epoch;
        self
    }

    /// The (0-based) epoch after which this callback stopped the last `fit`, if it did.
    pub fn stopped_epoch(&self) -> Option<usize> {
        self.stopped_epoch
    }

    /// The (0-based) epoch with the best value in the last `fit`.
    pub fn best_epoch(&self) -> Option<usize> {
        self.best_epoch
    }
}

impl Callback for EarlyStopping {
    fn on_train_begin(&mut self, _info: &TrainInfo, _model: &mut Model) -> Result<()> {
        if !self.min_delta.is_finite() {
            return Err(TrainError::Invalid(format!(
                "EarlyStopping: min_delta must be a finite number, not {}",
                self.min_delta
            )));
        }
        self.direction = self.mode.infer(&self.monitor).ok_or_else(|| {
            TrainError::Invalid(format!(
                "EarlyStopping: cannot tell whether `{}` should be minimised or maximised; \
                 set the mode to Mode::Min or Mode::Max",
                self.monitor
            ))
        })?;
        self.wait = 0;
        self.best = self.direction.worst();
        self.best_epoch = None;
        self.best_weights = None;
        self.stopped_epoch = None;
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, model: &mut Model) -> Result<Control> {
        let current = monitored("EarlyStopping", &self.monitor, logs)?;
        if epoch < self.start_from_epoch {
            return Ok(Control::Continue);
        }
        let snapshot = |model: &Model| model.get_weights().into_iter().map(|(_, t)| t).collect();
        if self.restore_best_weights && self.best_weights.is_none() {
            // Until an epoch improves, the first monitored one is the best there is.
            self.best_weights = Some(snapshot(model));
            self.best_epoch = Some(epoch);
        }
        self.wait += 1;
        if self.direction.improves(current, self.best, self.min_delta) {
            self.best = current;
            self.best_epoch = Some(epoch);
            if self.restore_best_weights {
                self.best_weights = Some(snapshot(model));
            }
            let beats_baseline = self
                .baseline
                .is_none_or(|b| self.direction.improves(current, b, self.min_delta));
            if beats_baseline {
                self.wait = 0;
            }
            return Ok(Control::Continue);
        }
        if self.wait >= self.patience && epoch > 0 {
            self.stopped_epoch = Some(epoch);
            return Ok(Control::Stop);
        }
        Ok(Control::Continue)
    }

    fn on_train_end(&mut self, _logs: &Logs, model: &mut Model) -> Result<()> {
        if let Some(weights) = self.best_weights.take() {
            model.set_weights(weights)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tiny_data, tiny_model};
    use crate::FitConfig;

    /// Runs `es` over epochs whose monitored values are `values`, as `fit` would, and
    /// returns the epochs it ran.
    fn run(es: &mut EarlyStopping, monitor: &str, values: &[f64]) -> usize {
        let mut model = tiny_model(1);
        es.on_train_begin(&TrainInfo::default(), &mut model)
            .unwrap();
        for (epoch, v) in values.iter().enumerate() {
            let mut logs = Logs::new();
            logs.set(monitor, *v);
            if es.on_epoch_end(epoch, &logs, &mut model).unwrap() == Control::Stop {
                return epoch + 1;
            }
        }
        values.len()
    }

    #[test]
    fn stops_after_patience_epochs_without_improvement() {
        let losses = [1.0, 0.8, 0.9, 0.85, 0.7];
        let mut es = EarlyStopping::new("val_loss").patience(2);
        assert_eq!(run(&mut es, "val_loss", &losses), 4);
        assert_eq!((es.stopped_epoch(), es.best_epoch()), (Some(3), Some(1)));
        // Patience 0 never stops after the first epoch, then at the first non-improvement.
        let mut es = EarlyStopping::new("val_loss");
        assert_eq!(run(&mut es, "val_loss", &losses), 3);
    }

    #[test]
    fn min_delta_mode_and_baseline_follow_keras() {
        // Improvements smaller than min_delta do not count.
        let mut es = EarlyStopping::new("loss").patience(1).min_delta(-0.1);
        assert_eq!(run(&mut es, "loss", &[1.0, 0.95, 0.5]), 2);
        // Accuracy goes up: Auto infers Max.
        let mut es = EarlyStopping::new("val_accuracy").patience(1);
        assert_eq!(run(&mut es, "val_accuracy", &[0.5, 0.6, 0.7, 0.65]), 4);
        // An explicit mode overrides the name.
        let mut es = EarlyStopping::new("val_accuracy")
            .patience(1)
            .mode(Mode::Min);
        assert_eq!(run(&mut es, "val_accuracy", &[0.5, 0.6, 0.7]), 2);
        // Improvements that miss the baseline do not restart the count, but still return
        // before the stop check (Keras 3); the first non-improvement then stops.
        let mut es = EarlyStopping::new("loss").patience(2).baseline(0.1);
        assert_eq!(run(&mut es, "loss", &[1.0, 0.9, 0.8, 0.85, 0.7]), 4);
        let mut es = EarlyStopping::new("loss").patience(2);
        assert_eq!(run(&mut es, "loss", &[1.0, 0.9, 0.8, 0.85, 0.7]), 5);
    }

    #[test]
    fn unusable_settings_and_missing_monitors_are_errors() {
        let mut model = tiny_model(1);
        let info = TrainInfo::default();
        let err = EarlyStopping::new("samples_per_sec")
            .on_train_begin(&info, &mut model)
            .unwrap_err();
        assert!(err.to_string().contains("set the mode"), "{err}");
        let mut es = EarlyStopping::new("loss").min_delta(f64::NAN);
        assert!(es.on_train_begin(&info, &mut model).is_err());
        let mut es = EarlyStopping::default();
        es.on_train_begin(&info, &mut model).unwrap();
        let err = es.on_epoch_end(0, &Logs::new(), &mut model).unwrap_err();
        assert!(err.to_string().contains("`val_loss`"), "{err}");
    }

    #[test]
    fn fit_stops_early_and_restores_the_best_epochs_weights() {
        use std::sync::{Arc, Mutex};
        /// Every epoch's weights.
        #[derive(Debug, Default)]
        struct Record(Arc<Mutex<Vec<Vec<Tensor>>>>);
        impl Callback for Record {
            fn on_epoch_end(&mut self, _: usize, _: &Logs, model: &mut Model) -> Result<Control> {
                let weights = model.get_weights().into_iter().map(|(_, t)| t).collect();
                self.0.lock().unwrap().push(weights);
                Ok(Control::Continue)
            }
        }
        let mut model = tiny_model(2);
        let data = tiny_data(48, 16, 3);
        let record = Record::default();
        let recorded = record.0.clone();
        // The loss falls, so "higher is better" soon runs out of patience.
        let es = EarlyStopping::new("loss")
            .mode(Mode::Max)
            .patience(2)
            .restore_best_weights(true);
        let mut callbacks: Vec<Box<dyn Callback>> = vec![Box::new(record), Box::new(es)];
        let config = FitConfig {
            epochs: 30,
            initial_epoch: 0,
        };
        let history = model.fit(&data, None, &config, &mut callbacks).unwrap();
        let losses = history.get("loss").unwrap();
        assert!(losses.len() < 30, "did not stop: {losses:?}");
        // The first epoch with the highest loss is the best.
        let best = (0..losses.len())
            .rev()
            .max_by(|&a, &b| losses[a].total_cmp(&losses[b]))
            .unwrap();
        assert!(best + 2 < losses.len(), "{losses:?}");
        let values = |ts: &[Tensor]| -> Vec<Vec<f32>> {
            ts.iter().map(|t| t.to_vec::<f32>().unwrap()).collect()
        };
        let restored: Vec<Tensor> = model.get_weights().into_iter().map(|(_, t)| t).collect();
        let recorded = recorded.lock().unwrap();
        assert_eq!(values(&restored), values(&recorded[best]));
        assert_ne!(values(&restored), values(&recorded[losses.len() - 1]));
    }
}
