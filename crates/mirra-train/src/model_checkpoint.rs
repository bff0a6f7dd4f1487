//! Keras's `ModelCheckpoint`: a checkpoint at the end of every epoch, or of every epoch
//! that improves a monitored quantity.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::callbacks::{Callback, Control, TrainInfo};
use crate::checkpoint::{CheckpointMeta, DataPosition};
use crate::monitor::{monitored, Mode};
use crate::{Logs, Model, Result, TrainError};

/// Saves a [`Checkpoint`](crate::Checkpoint) (weights, optimizer state, generator, epoch
/// and step, data position, the epoch's logs) with [`Model::save_checkpoint`] at the end
/// of each epoch, atomically, as Keras's `ModelCheckpoint(filepath)` does.
///
/// The path may hold fields in Python's `str.format` style, filled at each save:
/// `{epoch}` (1-based, as Keras) and any log entry (`{val_loss}`), optionally formatted as
/// `{epoch:02d}` (zero-padded width) or `{val_loss:.4f}` (fixed precision); `{{` and `}}`
/// are literal braces. Example: `ckpt/weights-{epoch:02d}-{val_loss:.2f}.safetensors`.
///
/// With `save_best_only`, only epochs whose `monitor` (default `val_loss`) beats the best
/// value so far, or the `initial_value_threshold`, are saved; [`Mode::Auto`] falls back to
/// [`Mode::Min`] for a name it cannot place, as Keras's `ModelCheckpoint` does. A monitor
/// missing from the logs is an error (Keras only warns).
#[derive(Debug)]
pub struct ModelCheckpoint {
    path: PathBuf,
    pattern: String,
    /// The pattern's pieces; `None` for a path without fields.
    pieces: Option<Vec<Piece>>,
    monitor: String,
    mode: Mode,
    save_best_only: bool,
    initial_value_threshold: Option<f64>,
    data_seed: Option<u64>,
    extra: BTreeMap<String, String>,
    // State of one `fit`.
    direction: Mode,
    best: f64,
    last_saved: Option<PathBuf>,
}

impl ModelCheckpoint {
    /// A checkpoint at `path` (a pattern, see above) after every epoch; an error when the
    /// pattern's braces or formats are malformed.
    pub fn new(path: impl Into<PathBuf>) -> Result<ModelCheckpoint> {
        let path = path.into();
        let pattern = path.to_string_lossy().into_owned();
        // A path without braces is used as it is (even when it is not UTF-8).
        let pieces = if pattern.contains(['{', '}']) {
            let pieces = parse_pattern(&pattern).map_err(|msg| {
                TrainError::Invalid(format!("ModelCheckpoint path `{pattern}`: {msg}"))
            })?;
            Some(pieces)
        } else {
            None
        };
        Ok(ModelCheckpoint {
            path,
            pattern,
            pieces,
            monitor: "val_loss".into(),
            mode: Mode::Auto,
            save_best_only: false,
            initial_value_threshold: None,
            data_seed: None,
            extra: BTreeMap::new(),
            direction: Mode::Min,
            best: f64::INFINITY,
            last_saved: None,
        })
    }

    /// The quantity `save_best_only` compares (default `val_loss`).
    pub fn monitor(mut self, monitor: impl Into<String>) -> Self {
        self.monitor = monitor.into();
        self
    }

    /// Whether lower or higher values of the monitor are better.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Save only epochs that improve the monitor.
    pub fn save_best_only(mut self, save_best_only: bool) -> Self {
        self.save_best_only = save_best_only;
        self
    }

    /// The value the first saved epoch must beat (for example the best of the run being
    /// resumed); without it the first epoch is always saved.
    pub fn initial_value_threshold(mut self, value: f64) -> Self {
        self.initial_value_threshold = Some(value);
        self
    }

    /// Record the training data's shuffle seed in the checkpoints' [`DataPosition`].
    pub fn data_seed(mut self, seed: u64) -> Self {
        self.data_seed = Some(seed);
        self
    }

    /// Record `key = value` in every checkpoint ([`CheckpointMeta::extra`]).
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra.insert(key.into(), value.into());
        self
    }

    /// The best monitored value seen (or the threshold), with `save_best_only`.
    pub fn best(&self) -> Option<f64> {
        (self.save_best_only && self.best.is_finite()).then_some(self.best)
    }

    /// The file written last.
    pub fn last_saved(&self) -> Option<&std::path::Path> {
        self.last_saved.as_deref()
    }

    /// The path of the checkpoint of (0-based) `epoch` with `logs`.
    fn path(&self, epoch: usize, logs: &Logs) -> Result<PathBuf> {
        let Some(pieces) = &self.pieces else {
            return Ok(self.path.clone());
        };
        let mut out = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => out += t,
                Piece::Field { name, spec } => {
                    let value = if name == "epoch" {
                        Value::Int(epoch as i128 + 1)
                    } else {
                        match logs.get(name) {
                            Some(v) => Value::Float(v),
                            None => {
                                let held: Vec<&str> = logs.iter().map(|(n, _)| n).collect();
                                return Err(TrainError::Invalid(format!(
                                    "ModelCheckpoint path `{}`: `{{{name}}}` is neither `epoch` \
                                     nor in the epoch's logs ({})",
                                    self.pattern,
                                    held.join(", ")
                                )));
                            }
                        }
                    };
                    out += &spec.format(value).map_err(|msg| {
                        TrainError::Invalid(format!(
                            "ModelCheckpoint path `{}`: `{{{name}}}`: {msg}",
                            self.pattern
                        ))
                    })?;
                }
            }
        }
        Ok(PathBuf::from(out))
    }
}

impl Callback for ModelCheckpoint {
    fn on_train_begin(&mut self, _info: &TrainInfo, _model: &mut Model) -> Result<()> {
        self.direction = self.mode.infer(&self.monitor).unwrap_or(Mode::Min);
        self.best = self
            .initial_value_threshold
            .unwrap_or(self.direction.worst());
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, model: &mut Model) -> Result<Control> {
        if self.save_best_only {
            let current = monitored("ModelCheckpoint", &self.monitor, logs)?;
            if !self.direction.improves(current, self.best, 0.0) {
                return Ok(Control::Continue);
            }
            self.best = current;
        }
        let path = self.path(epoch, logs)?;
        let meta = CheckpointMeta {
            epoch: epoch + 1,
            data: DataPosition {
                seed: self.data_seed,
                epoch: epoch as u64 + 1,
                batch: 0,
            },
            logs: logs.clone(),
            extra: self.extra.clone(),
        };
        model.save_checkpoint(&path, &meta)?;
        self.last_saved = Some(path);
        Ok(Control::Continue)
    }
}

/// A part of a path pattern.
#[derive(Clone, Debug, PartialEq)]
enum Piece {
    /// Literal text.
    Text(String),
    /// `{name}` or `{name:spec}`.
    Field {
        /// `epoch` or a log entry.
        name: String,
        /// How to format it.
        spec: Spec,
    },
}

/// A value to format.
#[derive(Clone, Copy, Debug)]
enum Value {
    Int(i128),
    Float(f64),
}

impl Value {
    fn as_f64(self) -> f64 {
        match self {
            Value::Int(v) => v as f64,
            Value::Float(v) => v,
        }
    }
}

/// A Python format spec, the subset `[0][width][.precision][d|f]`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Spec {
    zero: bool,
    width: usize,
    precision: Option<usize>,
    kind: Option<char>,
}

impl Spec {
    fn parse(spec: &str) -> std::result::Result<Spec, String> {
        let unsupported =
            || format!("unsupported format `{spec}` (supported: `0Nd`, `Nd`, `.Nf`, `0N.Nf`)");
        let mut s = Spec::default();
        let mut rest = spec;
        if let Some(r) = rest.strip_prefix('0') {
            s.zero = true;
            rest = r;
        }
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            s.width = rest[..digits].parse().map_err(|_| unsupported())?;
            rest = &rest[digits..];
        }
        if let Some(r) = rest.strip_prefix('.') {
            let digits = r.len() - r.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits == 0 {
                return Err(unsupported());
            }
            s.precision = Some(r[..digits].parse().map_err(|_| unsupported())?);
            rest = &r[digits..];
        }
        match rest {
            "" => {}
            "d" if s.precision.is_none() => s.kind = Some('d'),
            "f" => s.kind = Some('f'),
            _ => return Err(unsupported()),
        }
        Ok(s)
    }

    fn format(&self, value: Value) -> std::result::Result<String, String> {
        let w = self.width;
        let int = |v: i128| match self.zero {
            true => format!("{v:0w$}"),
            false => format!("{v:w$}"),
        };
        let float = |v: f64, p: Option<usize>| match (self.zero, p) {
            (true, Some(p)) => format!("{v:0w$.p$}"),
            (false, Some(p)) => format!("{v:w$.p$}"),
            (true, None) => format!("{v:0w$}"),
            (false, None) => format!("{v:w$}"),
        };
        match (self.kind, value) {
            (Some('f'), v) => Ok(float(v.as_f64(), Some(self.precision.unwrap_or(6)))),
            (_, Value::Int(v)) => Ok(int(v)),
            (None, Value::Float(v)) => Ok(float(v, self.precision)),
            // Python formats whole floats with `d` too.
            (_, Value::Float(v)) if v.fract() == 0.0 && v.abs() < 1e18 => Ok(int(v as i128)),
            (_, Value::Float(v)) => Err(format!("`d` formats whole numbers, not {v}")),
        }
    }
}

/// The pieces of a path pattern, or what is wrong with it.
fn parse_pattern(pattern: &str) -> std::result::Result<Vec<Piece>, String> {
    let mut pieces = vec![];
    let mut text = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '}' => return Err("a `}` without its `{` (write `}}` for a literal brace)".into()),
            '{' => {
                let mut field = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '}' {
                        closed = true;
                        break;
                    }
                    field.push(c);
                }
                let (name, spec) = field.split_once(':').unwrap_or((field.as_str(), ""));
                if !closed || name.is_empty() || field.contains('{') {
                    return Err(format!("malformed field `{{{field}`"));
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Field {
                    name: name.to_string(),
                    spec: Spec::parse(spec)?,
                });
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::tiny_model;
    use crate::Checkpoint;

    fn logs(entries: &[(&str, f64)]) -> Logs {
        let mut logs = Logs::new();
        for (n, v) in entries {
            logs.set(n, *v);
        }
        logs
    }

    #[test]
    fn paths_are_formatted_as_keras_formats_them() {
        let l = logs(&[("val_loss", 0.123456), ("loss", 2.0)]);
        for (pattern, want) in [
            ("w-{epoch:02d}-{val_loss:.2f}.st", "w-03-0.12.st"),
            ("w{epoch}.st", "w3.st"),
            ("{epoch:3d}|{val_loss}|{loss:d}", "  3|0.123456|2"),
            ("{epoch:.1f}-{val_loss:08.3f}", "3.0-0000.123"),
            ("{{epoch}}/last", "{epoch}/last"),
        ] {
            let path = ModelCheckpoint::new(pattern).unwrap().path(2, &l).unwrap();
            assert_eq!(path, PathBuf::from(want), "{pattern}");
        }
        for (pattern, needle) in [
            ("w{epoch", "malformed field `{epoch`"),
            ("w{}", "malformed field `{`"),
            ("w}", "a `}` without its `{`"),
            ("w{epoch:x}", "unsupported format `x`"),
            ("w{epoch:.2d}", "unsupported format `.2d`"),
        ] {
            let err = ModelCheckpoint::new(pattern).unwrap_err().to_string();
            assert!(err.contains(pattern) && err.contains(needle), "{err}");
        }
        let c = ModelCheckpoint::new("{val_acc}-{loss:d}").unwrap();
        let err = c.path(0, &l).unwrap_err().to_string();
        assert!(err.contains("`{val_acc}` is neither `epoch`"), "{err}");
        let c = ModelCheckpoint::new("{val_loss:d}").unwrap();
        let err = c.path(0, &l).unwrap_err().to_string();
        assert!(err.contains("`d` formats whole numbers"), "{err}");
    }

    #[test]
    fn save_best_only_saves_improvements_with_the_epoch_and_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = dir.path().join("best-{epoch}.safetensors");
        let mut model = tiny_model(1);
        let mut c = ModelCheckpoint::new(&pattern)
            .unwrap()
            .save_best_only(true)
            .initial_value_threshold(0.9)
            .data_seed(7)
            .metadata("run", "a");
        c.on_train_begin(&TrainInfo::default(), &mut model).unwrap();
        for (epoch, v) in [0.95, 0.5, 0.7, 0.4].into_iter().enumerate() {
            c.on_epoch_end(epoch, &logs(&[("val_loss", v)]), &mut model)
                .unwrap();
        }
        let saved = |e: usize| dir.path().join(format!("best-{e}.safetensors")).exists();
        assert_eq!(
            (1..=4).map(saved).collect::<Vec<_>>(),
            [false, true, false, true]
        );
        assert_eq!(c.best(), Some(0.4));
        let read = Checkpoint::read(c.last_saved().unwrap()).unwrap();
        let want = CheckpointMeta {
            epoch: 4,
            data: DataPosition {
                seed: Some(7),
                epoch: 4,
                batch: 0,
            },
            logs: logs(&[("val_loss", 0.4)]),
            extra: [("run".to_string(), "a".to_string())].into(),
        };
        assert_eq!(read.meta, want);
        // Accuracy is maximised.
        let mut c = ModelCheckpoint::new(dir.path().join("acc-{epoch}"))
            .unwrap()
            .monitor("val_accuracy")
            .save_best_only(true);
        c.on_train_begin(&TrainInfo::default(), &mut model).unwrap();
        for (epoch, v) in [0.5, 0.4].into_iter().enumerate() {
            c.on_epoch_end(epoch, &logs(&[("val_accuracy", v)]), &mut model)
                .unwrap();
        }
        assert!(dir.path().join("acc-1").exists() && !dir.path().join("acc-2").exists());
    }
}
