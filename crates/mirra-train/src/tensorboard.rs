//! The TensorBoard callback: per-epoch scalars in event files, laid out as Keras's.

use std::path::{Path, PathBuf};

use mirra_tensorboard::SummaryWriter;

use crate::callbacks::{Callback, Control, TrainInfo};
use crate::{Logs, Model, Result};

/// Writes every epoch's logs as TensorBoard scalars, as Keras's
/// `keras.callbacks.TensorBoard(log_dir)` does; view them with
/// `tensorboard --logdir <log_dir>`.
///
/// Two runs, each a directory with its own event file (a new one per `fit`):
///
/// | log entry | run | tag |
/// |---|---|---|
/// | `loss`, `accuracy`, any other metric `m` | `log_dir/train/` | `epoch_loss`, `epoch_accuracy`, `epoch_m` |
/// | `val_loss`, `val_accuracy`, any `val_m` | `log_dir/validation/` | `epoch_loss`, `epoch_accuracy`, `epoch_m` |
/// | `samples_per_sec` | `log_dir/train/` | `epoch_samples_per_sec` |
/// | the model's learning rate at the end of the epoch ([`Model::learning_rate`]) | `log_dir/train/` | `epoch_learning_rate` |
///
/// The validation run holds the same tags as the training run, so TensorBoard draws both
/// on one chart per metric. `lr`/`learning_rate` entries of the logs (set by a schedule
/// callback) are not written twice: the model's rate is. The step is the 0-based epoch
/// number, as in Keras, so a resumed `fit` (a non-zero `initial_epoch`) continues the
/// curves. The validation directory is only created when the logs have `val_` entries.
/// Values are stored as `f32` (TensorBoard's `simple_value`). The files are flushed after
/// every epoch, so a running TensorBoard sees each epoch as it ends.
#[derive(Debug)]
pub struct TensorBoard {
    log_dir: PathBuf,
    train: Option<SummaryWriter>,
    validation: Option<SummaryWriter>,
}

/// The prefix Keras puts before every per-epoch tag.
const EPOCH_PREFIX: &str = "epoch_";

/// The tag of the optimizer's learning rate.
const LEARNING_RATE_TAG: &str = "epoch_learning_rate";

impl TensorBoard {
    /// A callback writing to `log_dir/train/` and `log_dir/validation/` (created when
    /// training starts).
    pub fn new(log_dir: impl Into<PathBuf>) -> TensorBoard {
        TensorBoard {
            log_dir: log_dir.into(),
            train: None,
            validation: None,
        }
    }

    /// The log directory.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// The training run's event file, once training has started.
    pub fn train_file(&self) -> Option<&Path> {
        self.train.as_ref().map(SummaryWriter::path)
    }

    /// The validation run's event file, once an epoch with validation has ended.
    pub fn validation_file(&self) -> Option<&Path> {
        self.validation.as_ref().map(SummaryWriter::path)
    }

    fn writer(slot: &mut Option<SummaryWriter>, dir: PathBuf) -> Result<&mut SummaryWriter> {
        match slot {
            Some(w) => Ok(w),
            None => Ok(slot.insert(SummaryWriter::new(dir)?)),
        }
    }
}

impl Callback for TensorBoard {
    fn on_train_begin(&mut self, _info: &TrainInfo, _model: &mut Model) -> Result<()> {
        // A new pair of files per fit, as Keras does.
        self.validation = None;
        self.train = Some(SummaryWriter::new(self.log_dir.join("train"))?);
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, model: &mut Model) -> Result<Control> {
        let step = i64::try_from(epoch).unwrap_or(i64::MAX);
        let train = Self::writer(&mut self.train, self.log_dir.join("train"))?;
        for (name, value) in logs.iter() {
            if name.starts_with("val_") || matches!(name, "lr" | "learning_rate") {
                continue;
            }
            train.add_scalar(&format!("{EPOCH_PREFIX}{name}"), value as f32, step)?;
        }
        train.add_scalar(LEARNING_RATE_TAG, model.learning_rate() as f32, step)?;
        train.flush()?;
        let mut val = logs
            .iter()
            .filter_map(|(n, v)| n.strip_prefix("val_").map(|m| (m, v)))
            .peekable();
        if val.peek().is_some() {
            let w = Self::writer(&mut self.validation, self.log_dir.join("validation"))?;
            for (name, value) in val {
                w.add_scalar(&format!("{EPOCH_PREFIX}{name}"), value as f32, step)?;
            }
            w.flush()?;
        }
        Ok(Control::Continue)
    }

    fn on_train_end(&mut self, _logs: &Logs, _model: &mut Model) -> Result<()> {
        for w in [&mut self.train, &mut self.validation]
            .into_iter()
            .flatten()
        {
            w.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use mirra_tensorboard::{event_files, read_scalars};

    use super::*;
    use crate::testutil::{tiny_data, tiny_model};
    use crate::FitConfig;

    /// `tag -> [(step, value)]` of the one event file in `dir`.
    fn scalars_by_tag(dir: &Path) -> BTreeMap<String, Vec<(i64, f32)>> {
        let files = event_files(dir).unwrap();
        assert_eq!(files.len(), 1, "{files:?}");
        let mut by_tag = BTreeMap::<String, Vec<(i64, f32)>>::new();
        for s in read_scalars(&files[0]).unwrap() {
            by_tag.entry(s.tag).or_default().push((s.step, s.value));
        }
        by_tag
    }

    fn tags(map: &BTreeMap<String, Vec<(i64, f32)>>) -> Vec<&str> {
        map.keys().map(String::as_str).collect()
    }

    #[test]
    fn fit_writes_keras_runs_and_tags_one_value_per_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = tiny_model(5);
        let (train, val) = (tiny_data(48, 16, 6), tiny_data(24, 16, 7));
        let config = FitConfig {
            epochs: 3,
            initial_epoch: 0,
        };
        let mut callbacks: Vec<Box<dyn Callback>> =
            vec![Box::new(TensorBoard::new(dir.path().join("logs")))];
        let history = model
            .fit(&train, Some(&val), &config, &mut callbacks)
            .unwrap();

        let train_run = scalars_by_tag(&dir.path().join("logs/train"));
        assert_eq!(
            tags(&train_run),
            [
                "epoch_accuracy",
                "epoch_learning_rate",
                "epoch_loss",
                "epoch_samples_per_sec"
            ]
        );
        let val_run = scalars_by_tag(&dir.path().join("logs/validation"));
        assert_eq!(tags(&val_run), ["epoch_accuracy", "epoch_loss"]);

        // Each tag holds the History's values, at steps 0, 1, 2.
        let expect = |run: &BTreeMap<String, Vec<(i64, f32)>>, tag: &str, key: &str| {
            let want: Vec<(i64, f32)> = history
                .get(key)
                .unwrap()
                .iter()
                .enumerate()
                .map(|(e, v)| (e as i64, *v as f32))
                .collect();
            assert_eq!(run[tag], want, "{tag} vs History's {key}");
        };
        for (tag, key) in [
            ("epoch_loss", "loss"),
            ("epoch_accuracy", "accuracy"),
            ("epoch_samples_per_sec", "samples_per_sec"),
        ] {
            expect(&train_run, tag, key);
        }
        expect(&val_run, "epoch_loss", "val_loss");
        expect(&val_run, "epoch_accuracy", "val_accuracy");
        assert_eq!(
            train_run["epoch_learning_rate"],
            [(0, 0.01), (1, 0.01), (2, 0.01)]
        );
    }

    /// Sets the learning rate at each epoch's start, as a schedule would.
    #[derive(Debug)]
    struct Halve;

    impl Callback for Halve {
        fn on_epoch_begin(&mut self, epoch: usize, model: &mut Model) -> Result<()> {
            model.set_learning_rate(0.1 / f64::from(1u32 << epoch));
            Ok(())
        }
    }

    #[test]
    fn a_resumed_fit_continues_the_steps_with_the_models_learning_rate() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = tiny_model(8);
        let data = tiny_data(32, 16, 9);
        let config = FitConfig {
            epochs: 4,
            initial_epoch: 2,
        };
        let mut callbacks: Vec<Box<dyn Callback>> =
            vec![Box::new(Halve), Box::new(TensorBoard::new(dir.path()))];
        model.fit(&data, None, &config, &mut callbacks).unwrap();

        // No validation data: no validation run.
        assert!(!dir.path().join("validation").exists());
        let run = scalars_by_tag(&dir.path().join("train"));
        assert_eq!(
            tags(&run),
            [
                "epoch_accuracy",
                "epoch_learning_rate",
                "epoch_loss",
                "epoch_samples_per_sec"
            ]
        );
        assert_eq!(run["epoch_learning_rate"], [(2, 0.025), (3, 0.0125)]);
        let steps: Vec<i64> = run["epoch_loss"].iter().map(|p| p.0).collect();
        assert_eq!(steps, [2, 3]);
    }

    #[test]
    fn a_learning_rate_in_the_logs_is_not_written_twice() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = tiny_model(1);
        model.set_learning_rate(0.25);
        let mut tb = TensorBoard::new(dir.path());
        tb.on_train_begin(&TrainInfo::default(), &mut model)
            .unwrap();
        let mut logs = Logs::new();
        logs.set("loss", 0.5);
        logs.set("lr", 123.0);
        logs.set("learning_rate", 123.0);
        logs.set("val_loss", 0.75);
        assert_eq!(
            tb.on_epoch_end(0, &logs, &mut model).unwrap(),
            Control::Continue
        );
        tb.on_train_end(&logs, &mut model).unwrap();
        let run = scalars_by_tag(&dir.path().join("train"));
        assert_eq!(tags(&run), ["epoch_learning_rate", "epoch_loss"]);
        assert_eq!(run["epoch_learning_rate"], [(0, 0.25)]);
        let val = scalars_by_tag(&dir.path().join("validation"));
        assert_eq!(val["epoch_loss"], [(0, 0.75)]);
        assert_eq!(
            tb.validation_file().map(Path::parent),
            Some(Some(dir.path().join("validation").as_path()))
        );
    }

    #[test]
    fn an_unwritable_log_dir_fails_fit_with_its_path() {
        let mut model = tiny_model(1);
        let data = tiny_data(16, 16, 2);
        let mut callbacks: Vec<Box<dyn Callback>> =
            vec![Box::new(TensorBoard::new("/proc/no-such/logs"))];
        let err = model
            .fit(&data, None, &FitConfig::default(), &mut callbacks)
            .unwrap_err();
        assert!(
            err.to_string().contains("/proc/no-such/logs/train"),
            "{err}"
        );
    }
}
