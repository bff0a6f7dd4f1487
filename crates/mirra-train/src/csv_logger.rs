//! Keras's `CSVLogger`: one row of logs per epoch in a CSV file.

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::callbacks::{Callback, Control, TrainInfo};
use crate::{Logs, Model, Result, TrainError};

/// Writes each epoch's logs to a CSV file as Keras's `CSVLogger`: a header `epoch,<keys>`
/// with the keys of the first epoch's logs sorted by name, then one row per epoch with
/// the 0-based epoch number. A key an epoch lacks is written `NA`; values are written in
/// the shortest form that reads back exactly. Each row is flushed as soon as it is
/// written, so the file can be followed while training runs.
///
/// Without `append` the file is replaced when training begins. With `append` (for a
/// resumed run) rows are added to an existing file, keeping its header and columns; the
/// header is only written when the file is new or empty.
#[derive(Debug)]
pub struct CsvLogger {
    path: PathBuf,
    separator: char,
    append: bool,
    file: Option<File>,
    keys: Option<Vec<String>>,
}

impl CsvLogger {
    /// A logger writing to `path`, with `,` as separator, replacing the file.
    pub fn new(path: impl Into<PathBuf>) -> CsvLogger {
        CsvLogger {
            path: path.into(),
            separator: ',',
            append: false,
            file: None,
            keys: None,
        }
    }

    /// The field separator.
    pub fn separator(mut self, separator: char) -> Self {
        self.separator = separator;
        self
    }

    /// Add to an existing file instead of replacing it.
    pub fn append(mut self, append: bool) -> Self {
        self.append = append;
        self
    }

    /// The columns of an existing file's header (without `epoch`), if it has one.
    fn existing_keys(&self) -> Result<Option<Vec<String>>> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(&self.path)(e)),
        };
        let mut header = String::new();
        BufReader::new(file)
            .read_line(&mut header)
            .map_err(io_error(&self.path))?;
        let header = header.trim_end_matches(['\r', '\n']);
        if header.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            header
                .split(self.separator)
                .skip(1)
                .map(str::to_string)
                .collect(),
        ))
    }

    /// One CSV line of `fields`, quoting those that need it.
    fn line<'a>(&self, fields: impl Iterator<Item = Cow<'a, str>>) -> String {
        let sep = self.separator.to_string();
        let quoted: Vec<String> = fields
            .map(|f| {
                if f.contains(self.separator) || f.contains(['"', '\n', '\r']) {
                    format!("\"{}\"", f.replace('"', "\"\""))
                } else {
                    f.into_owned()
                }
            })
            .collect();
        quoted.join(&sep) + "\n"
    }
}

impl Callback for CsvLogger {
    fn on_train_begin(&mut self, _info: &TrainInfo, _model: &mut Model) -> Result<()> {
        self.keys = if self.append {
            self.existing_keys()?
        } else {
            None
        };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_error(&self.path))?;
        }
        let mut options = OpenOptions::new();
        if self.append {
            options.append(true).create(true);
        } else {
            options.write(true).create(true).truncate(true);
        }
        self.file = Some(options.open(&self.path).map_err(io_error(&self.path))?);
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, _model: &mut Model) -> Result<Control> {
        let mut text = String::new();
        let keys = match &self.keys {
            Some(k) => k.clone(),
            None => {
                let mut keys: Vec<String> = logs.iter().map(|(n, _)| n.to_string()).collect();
                keys.sort();
                let header = std::iter::once(Cow::Borrowed("epoch"))
                    .chain(keys.iter().map(|k| Cow::Borrowed(k.as_str())));
                text += &self.line(header);
                self.keys = Some(keys.clone());
                keys
            }
        };
        let values = keys.iter().map(|k| match logs.get(k) {
            Some(v) => Cow::Owned(v.to_string()),
            None => Cow::Borrowed("NA"),
        });
        text += &self.line(std::iter::once(Cow::Owned(epoch.to_string())).chain(values));
        let io = io_error(&self.path);
        let file = self.file.as_mut().ok_or_else(|| {
            TrainError::Invalid("CsvLogger: on_epoch_end before on_train_begin".into())
        })?;
        // One write per epoch: a crash leaves whole rows.
        file.write_all(text.as_bytes()).map_err(&io)?;
        file.flush().map_err(io)?;
        Ok(Control::Continue)
    }

    fn on_train_end(&mut self, _logs: &Logs, _model: &mut Model) -> Result<()> {
        self.file = None;
        Ok(())
    }
}

/// The error of an I/O failure on `path`.
fn io_error(path: &Path) -> impl Fn(std::io::Error) -> TrainError + '_ {
    |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `logger` over epochs `first..` with the given logs, as `fit` would.
    fn run(logger: &mut CsvLogger, first: usize, epochs: &[&[(&str, f64)]]) {
        let mut model = crate::testutil::tiny_model(1);
        logger
            .on_train_begin(&TrainInfo::default(), &mut model)
            .unwrap();
        for (i, entries) in epochs.iter().enumerate() {
            let mut logs = Logs::new();
            for (n, v) in *entries {
                logs.set(n, *v);
            }
            logger.on_epoch_end(first + i, &logs, &mut model).unwrap();
        }
        logger.on_train_end(&Logs::new(), &mut model).unwrap();
    }

    #[test]
    fn writes_a_sorted_header_and_a_row_per_epoch_and_appends_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.csv");
        let mut logger = CsvLogger::new(&path);
        run(
            &mut logger,
            0,
            &[
                &[("loss", 0.5), ("accuracy", 0.75), ("val_loss", 0.625)],
                &[("loss", 0.25), ("accuracy", 0.875)],
            ],
        );
        let first = "epoch,accuracy,loss,val_loss\n0,0.75,0.5,0.625\n1,0.875,0.25,NA\n";
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        // A resumed run keeps the file's columns, whatever order its logs come in.
        let mut logger = CsvLogger::new(&path).append(true);
        run(&mut logger, 2, &[&[("val_loss", 0.5), ("loss", 0.125)]]);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{first}2,NA,0.125,0.5\n")
        );
        // Without append the file starts over.
        let mut logger = CsvLogger::new(&path).separator(';');
        run(&mut logger, 0, &[&[("a;b", 1.0)]]);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "epoch;\"a;b\"\n0;1\n"
        );
    }

    #[test]
    fn append_to_a_new_file_writes_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/log.csv");
        let mut logger = CsvLogger::new(&path).append(true);
        run(&mut logger, 0, &[&[("loss", 1.0)]]);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "epoch,loss\n0,1\n");
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_it() {
        let mut model = crate::testutil::tiny_model(1);
        let mut logger = CsvLogger::new("/proc/nope/log.csv");
        let err = logger
            .on_train_begin(&TrainInfo::default(), &mut model)
            .unwrap_err();
        assert!(err.to_string().contains("/proc/nope/log.csv"), "{err}");
    }
}
