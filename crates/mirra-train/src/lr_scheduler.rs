//! Keras's `LearningRateScheduler`: a function of the epoch and the current rate sets the
//! rate at the start of each epoch.

use crate::callbacks::Callback;
use crate::{Logs, Model, Result, TrainError};

/// The schedule: `(0-based epoch, current learning rate) -> learning rate`.
type Schedule = dyn Fn(usize, f64) -> f64 + Send;

/// Sets the learning rate at the start of every epoch to `schedule(epoch, current_rate)`
/// (0-based epoch, as Keras's), and adds the rate to the epoch's logs as `learning_rate`.
///
/// The rate is set through [`Model::set_learning_rate`], which replaces any schedule of
/// the optimizer by that constant, as assigning `optimizer.learning_rate` does in Keras.
/// A schedule that returns a negative, infinite or NaN rate stops `fit` with an error.
pub struct LearningRateScheduler {
    schedule: Box<Schedule>,
}

impl std::fmt::Debug for LearningRateScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearningRateScheduler")
            .finish_non_exhaustive()
    }
}

impl LearningRateScheduler {
    /// A scheduler calling `schedule(epoch, current_rate)` before every epoch, for
    /// example `|epoch, lr| if epoch < 10 { lr } else { lr * 0.9 }`.
    pub fn new(schedule: impl Fn(usize, f64) -> f64 + Send + 'static) -> LearningRateScheduler {
        LearningRateScheduler {
            schedule: Box::new(schedule),
        }
    }
}

impl Callback for LearningRateScheduler {
    fn on_epoch_begin(&mut self, epoch: usize, model: &mut Model) -> Result<()> {
        let lr = (self.schedule)(epoch, model.learning_rate());
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(TrainError::Invalid(format!(
                "LearningRateScheduler: the schedule returned {lr} for epoch {}; a learning \
                 rate must be a finite number >= 0",
                epoch + 1
            )));
        }
        model.set_learning_rate(lr);
        Ok(())
    }

    fn on_epoch_logs(&mut self, _epoch: usize, logs: &mut Logs, model: &mut Model) -> Result<()> {
        logs.set("learning_rate", model.learning_rate());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tiny_data, tiny_model};
    use crate::FitConfig;

    #[test]
    fn the_schedule_sets_each_epochs_rate_and_the_history_records_it() {
        let mut model = tiny_model(1);
        let data = tiny_data(32, 16, 2);
        let halve_after_first = |epoch: usize, lr: f64| if epoch == 0 { lr } else { lr / 2.0 };
        let mut callbacks: Vec<Box<dyn Callback>> =
            vec![Box::new(LearningRateScheduler::new(halve_after_first))];
        let config = FitConfig {
            epochs: 3,
            initial_epoch: 0,
        };
        let history = model.fit(&data, None, &config, &mut callbacks).unwrap();
        assert_eq!(
            history.get("learning_rate").unwrap(),
            &[0.01, 0.005, 0.0025]
        );
        assert_eq!(model.learning_rate(), 0.0025);
    }

    #[test]
    fn a_nan_rate_is_an_error_naming_the_epoch() {
        let mut model = tiny_model(1);
        let mut s = LearningRateScheduler::new(|epoch, lr| if epoch == 2 { f64::NAN } else { lr });
        s.on_epoch_begin(1, &mut model).unwrap();
        let err = s.on_epoch_begin(2, &mut model).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("LearningRateScheduler: the schedule returned NaN for epoch 3"),
            "{err}"
        );
    }
}
