//! Metrics accumulated over an epoch, as Keras's stateful metrics.

use std::fmt;

use mirra_tensor::{DType, Tensor};

use crate::{NnError, Result};

/// A metric accumulated over batches and read at the end of an epoch.
pub trait Metric: Send + fmt::Debug {
    /// The name in logs and history (`accuracy`).
    fn name(&self) -> &str;
    /// Add one batch of labels and predictions.
    fn update(&mut self, y_true: &Tensor, y_pred: &Tensor) -> Result<()>;
    /// The value over everything added since the last reset.
    fn result(&self) -> f64;
    /// Start over.
    fn reset(&mut self);
    /// The raw state (`total`, `count`), so that replicas can sum their states.
    fn state(&self) -> (f64, f64);
    /// Add another accumulator's raw state (from another replica).
    fn merge_state(&mut self, total: f64, count: f64);
}

/// A running weighted mean (Keras's `Mean`), used for the loss.
#[derive(Clone, Debug, Default)]
pub struct Mean {
    name: String,
    total: f64,
    count: f64,
}

impl Mean {
    /// A mean called `name`.
    pub fn new(name: &str) -> Mean {
        Mean {
            name: name.into(),
            total: 0.0,
            count: 0.0,
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Add `value` with `weight` (e.g. a batch mean with the batch size).
    pub fn add(&mut self, value: f64, weight: f64) {
        self.total += value * weight;
        self.count += weight;
    }

    /// The mean so far (0 before anything is added).
    pub fn value(&self) -> f64 {
        if self.count == 0.0 {
            0.0
        } else {
            self.total / self.count
        }
    }

    /// Start over.
    pub fn clear(&mut self) {
        self.total = 0.0;
        self.count = 0.0;
    }
}

/// Predicted class ids from `y_pred`: the argmax over its last axis when it has one more
/// dimension than the labels (scores), else the values themselves.
fn predicted_classes(y_true: &Tensor, y_pred: &Tensor) -> Result<Vec<i64>> {
    let pred = if y_pred.rank() == y_true.rank() + 1 {
        y_pred.argmax(-1, false)?
    } else {
        y_pred.clone()
    };
    if pred.shape() != y_true.shape() {
        return Err(NnError::InputMismatch {
            what: "accuracy",
            expected: format!("predictions for labels of shape {}", y_true.shape()),
            got: format!("predictions of shape {}", y_pred.shape()),
        });
    }
    Ok(pred.to_dtype(DType::I64)?.to_vec::<i64>()?)
}

/// The share of examples whose predicted class equals the label. With integer labels and
/// class scores this is Keras's `sparse_categorical_accuracy` (what Keras's
/// `"accuracy"` becomes with a sparse cross-entropy loss); with one-hot labels of the
/// predictions' shape, the argmax of both is compared (`categorical_accuracy`).
#[derive(Clone, Debug)]
pub struct Accuracy {
    name: String,
    mean: Mean,
}

impl Accuracy {
    /// Accuracy named `accuracy`.
    pub fn new() -> Accuracy {
        Accuracy::named("accuracy")
    }

    /// Accuracy under another name (`sparse_categorical_accuracy`).
    pub fn named(name: &str) -> Accuracy {
        Accuracy {
            name: name.into(),
            mean: Mean::new(name),
        }
    }
}

impl Default for Accuracy {
    fn default() -> Self {
        Accuracy::new()
    }
}

impl Metric for Accuracy {
    fn name(&self) -> &str {
        &self.name
    }

    fn update(&mut self, y_true: &Tensor, y_pred: &Tensor) -> Result<()> {
        let labels =
            if y_true.dtype().is_float() && y_true.shape() == y_pred.shape() && y_true.rank() > 1 {
                y_true.argmax(-1, false)?
            } else {
                y_true.clone()
            };
        let pred = predicted_classes(&labels, y_pred)?;
        let truth = labels.to_dtype(DType::I64)?.to_vec::<i64>()?;
        let hits = pred.iter().zip(&truth).filter(|(p, t)| p == t).count();
        if !truth.is_empty() {
            self.mean
                .add(hits as f64 / truth.len() as f64, truth.len() as f64);
        }
        Ok(())
    }

    fn result(&self) -> f64 {
        self.mean.value()
    }

    fn reset(&mut self) {
        self.mean.clear();
    }

    fn state(&self) -> (f64, f64) {
        (self.mean.total, self.mean.count)
    }

    fn merge_state(&mut self, total: f64, count: f64) {
        self.mean.total += total;
        self.mean.count += count;
    }
}

/// Keras's `sparse_categorical_accuracy` under its own name.
pub fn sparse_categorical_accuracy() -> Accuracy {
    Accuracy::named("sparse_categorical_accuracy")
}
