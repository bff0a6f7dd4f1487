//! Callbacks: hooks into `fit` at the boundaries of training, epochs and steps, as
//! Keras's. The progress bar and the per-epoch lines are one of them.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::console::{print_line, Printed};
pub use crate::model::{Callback, Control, TrainInfo};
use crate::{Logs, Model, Result};

/// A progress bar per epoch with the running loss and metrics (on a terminal), then one
/// line per epoch in Keras's style:
/// `Epoch 3/5 - 0.41s - loss: 0.2113 - accuracy: 0.9392 - val_loss: ... - 19500 samples/s`.
///
/// The lines go to standard output through [`print_line`](crate::console::print_line): a
/// failure to write them does not stop training, but a closed pipe (the reader of
/// `mirra train | head -1` is gone) stops it after the epoch whose line could not be
/// shown, once every callback has seen the epoch's end (so its checkpoints are saved).
#[derive(Debug, Default)]
pub struct ProgbarLogger {
    info: TrainInfo,
    bar: Option<ProgressBar>,
    started: Option<Instant>,
    /// Lines printed so far (kept for tests and for callers that show them elsewhere).
    pub lines: Vec<String>,
    quiet: bool,
}

impl ProgbarLogger {
    /// A logger that prints to standard output (the bar goes to standard error, and only
    /// when it is a terminal).
    pub fn new() -> ProgbarLogger {
        ProgbarLogger::default()
    }

    /// A logger that only collects its lines.
    pub fn quiet() -> ProgbarLogger {
        ProgbarLogger {
            quiet: true,
            ..ProgbarLogger::default()
        }
    }
}

/// `name: value` pairs joined Keras's way; samples/s as a whole number at the end.
fn format_logs(logs: &Logs) -> String {
    let mut parts = vec![];
    let mut rate = None;
    for (name, value) in logs.iter() {
        match name {
            "samples_per_sec" => rate = Some(value),
            "lr" | "learning_rate" => {}
            _ => parts.push(format!("{name}: {value:.4}")),
        }
    }
    if let Some(r) = rate {
        parts.push(format!("{r:.0} samples/s"));
    }
    parts.join(" - ")
}

impl Callback for ProgbarLogger {
    fn on_train_begin(&mut self, info: &TrainInfo, _model: &mut Model) -> Result<()> {
        self.info = info.clone();
        Ok(())
    }

    fn on_epoch_begin(&mut self, _epoch: usize, _model: &mut Model) -> Result<()> {
        self.started = Some(Instant::now());
        if !self.quiet && std::io::stderr().is_terminal() {
            let bar = match self.info.steps_per_epoch {
                Some(n) => ProgressBar::new(n as u64),
                None => ProgressBar::no_length(),
            };
            bar.set_draw_target(ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{pos:>5}/{len:5} [{bar:30}] {elapsed} {msg}")
                .expect("valid template")
                .progress_chars("=> ");
            bar.set_style(style);
            self.bar = Some(bar);
        }
        Ok(())
    }

    fn on_train_batch_end(&mut self, step: usize, logs: &Logs, _model: &mut Model) -> Result<()> {
        if let Some(bar) = &self.bar {
            bar.set_position(step as u64 + 1);
            // Formatting every step would cost more than a small step: refresh sometimes.
            if step.is_multiple_of(16) {
                bar.set_message(format_logs(logs));
            }
        }
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, logs: &Logs, _model: &mut Model) -> Result<Control> {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let secs = self.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        let line = format!(
            "Epoch {}/{} - {secs:.2}s - {}",
            epoch + 1,
            self.info.epochs,
            format_logs(logs)
        );
        let printed = match self.quiet {
            true => Printed::Shown,
            false => print_line(&line),
        };
        self.lines.push(line);
        Ok(match printed {
            Printed::Closed => Control::Stop,
            Printed::Shown | Printed::Failed => Control::Continue,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_lines_follow_keras() {
        let mut p = ProgbarLogger::quiet();
        let mut model = crate::testutil::tiny_model(1);
        p.on_train_begin(
            &TrainInfo {
                epochs: 5,
                ..TrainInfo::default()
            },
            &mut model,
        )
        .unwrap();
        p.on_epoch_begin(2, &mut model).unwrap();
        let mut logs = Logs::new();
        for (n, v) in [
            ("loss", 0.21134),
            ("accuracy", 0.9392),
            ("val_loss", 0.179),
            ("samples_per_sec", 19500.4),
        ] {
            logs.set(n, v);
        }
        p.on_epoch_end(2, &logs, &mut model).unwrap();
        let line = &p.lines[0];
        assert!(line.starts_with("Epoch 3/5 - "), "{line}");
        assert!(
            line.ends_with(
                "s - loss: 0.2113 - accuracy: 0.9392 - val_loss: 0.1790 - 19500 samples/s"
            ),
            "{line}"
        );
    }
}
