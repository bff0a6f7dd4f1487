//! The History written to a JSON file as training goes.

use std::path::PathBuf;

use crate::callbacks::{Callback, Control, TrainInfo};
use crate::fsutil::{check_writable, is_stream};
use crate::{Logs, Model, Result};

/// Writes the model's [`History`](crate::History) ([`Model::history`]: every epoch so
/// far, those a resumed run's checkpoint restored included) as JSON
/// ([`History::to_json`](crate::History::to_json)) to a file after every epoch, atomically,
/// so that a run that fails or is killed keeps the epochs it finished.
///
/// The path is checked when training begins ([`check_writable`]), before the first epoch
/// rather than after the last. A path that is not a regular file (a pipe, `/dev/stdout`)
/// cannot be replaced: it gets the History once, when training ends. A `fit` that trains
/// no epoch (a resumed run with nothing left) writes the restored History, never an empty
/// one over a file that holds epochs.
#[derive(Debug)]
pub struct HistoryFile {
    path: PathBuf,
    written: bool,
}

impl HistoryFile {
    /// A callback writing to `path`.
    pub fn new(path: impl Into<PathBuf>) -> HistoryFile {
        HistoryFile {
            path: path.into(),
            written: false,
        }
    }

    fn write(&mut self, model: &Model) -> Result<()> {
        model.history().save_json(&self.path)?;
        self.written = true;
        Ok(())
    }
}

impl Callback for HistoryFile {
    fn on_train_begin(&mut self, _info: &TrainInfo, _model: &mut Model) -> Result<()> {
        self.written = false;
        check_writable(&self.path)
    }

    fn on_epoch_end(&mut self, _epoch: usize, _logs: &Logs, model: &mut Model) -> Result<Control> {
        if !is_stream(&self.path) {
            self.write(model)?;
        }
        Ok(Control::Continue)
    }

    fn on_train_end(&mut self, _logs: &Logs, model: &mut Model) -> Result<()> {
        let stream = is_stream(&self.path);
        if (stream || !self.written) && !model.history().is_empty() {
            self.write(model)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tiny_data, tiny_model};
    use crate::{Checkpoint, CheckpointMeta, FitConfig, ModelCheckpoint};

    fn json(path: &std::path::Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// A callback that fails at the end of epoch `at` (0-based), as a crash would.
    #[derive(Debug)]
    struct FailAt(usize);

    impl Callback for FailAt {
        fn on_epoch_end(&mut self, epoch: usize, _: &Logs, _: &mut Model) -> Result<Control> {
            match epoch == self.0 {
                true => Err(crate::TrainError::Invalid("crash".into())),
                false => Ok(Control::Continue),
            }
        }
    }

    #[test]
    fn every_epoch_is_written_as_it_ends_and_a_resume_continues_the_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        let ckpt = dir.path().join("last.safetensors");
        let data = tiny_data(16, 8, 1);
        let config = |epochs, initial_epoch| FitConfig {
            epochs,
            initial_epoch,
        };
        let mut model = tiny_model(1);
        let mut callbacks: Vec<Box<dyn Callback>> = vec![
            Box::new(ModelCheckpoint::new(&ckpt).unwrap()),
            Box::new(HistoryFile::new(&path)),
            Box::new(FailAt(2)),
        ];
        let err = model.fit(&data, None, &config(5, 0), &mut callbacks);
        assert!(err.is_err());
        // The failed run kept its finished epochs (the third one too: its end was
        // recorded before the failing callback ran).
        assert_eq!(json(&path)["epoch"], serde_json::json!([0, 1, 2]));

        // Resumed from the checkpoint of epoch 3 by a new process.
        let mut resumed = tiny_model(9);
        resumed.load_checkpoint(&ckpt).unwrap();
        let mut callbacks: Vec<Box<dyn Callback>> = vec![Box::new(HistoryFile::new(&path))];
        let this_fit = resumed
            .fit(&data, None, &config(5, 3), &mut callbacks)
            .unwrap();
        assert_eq!(this_fit.epochs, [3, 4]);
        let h = json(&path);
        assert_eq!(h["epoch"], serde_json::json!([0, 1, 2, 3, 4]));
        assert_eq!(h["loss"].as_array().unwrap().len(), 5);
        // As the failed run's model recorded them (through JSON text both, as serde_json
        // may read a float back one ulp off).
        let text = serde_json::to_string(&model.history().to_json()).unwrap();
        let failed_run: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            h["loss"].as_array().unwrap()[..3],
            failed_run["loss"].as_array().unwrap()[..]
        );

        // Nothing left to train: the file keeps every epoch.
        let mut again = tiny_model(9);
        let meta = CheckpointMeta {
            epoch: 5,
            ..CheckpointMeta::default()
        };
        resumed.save_checkpoint(&ckpt, &meta).unwrap();
        Checkpoint::read(&ckpt)
            .unwrap()
            .restore(&mut again)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut callbacks: Vec<Box<dyn Callback>> = vec![Box::new(HistoryFile::new(&path))];
        again
            .fit(&data, None, &config(5, 5), &mut callbacks)
            .unwrap();
        assert_eq!(json(&path), h);
    }

    #[test]
    fn an_unwritable_path_fails_before_the_first_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let mut model = tiny_model(1);
        let before = model.optimizer().iterations();
        let mut callbacks: Vec<Box<dyn Callback>> =
            vec![Box::new(HistoryFile::new(file.join("history.json")))];
        let config = FitConfig::default();
        let err = model
            .fit(&tiny_data(16, 8, 1), None, &config, &mut callbacks)
            .unwrap_err();
        assert!(err.to_string().contains("file/history.json"), "{err}");
        assert_eq!(model.optimizer().iterations(), before);
    }
}
