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
    /// The raw state (sums that accumulate, such as `total` and `count`), so that
    /// replicas can add up their states.
    fn state(&self) -> Vec<f64>;
    /// Add another accumulator's raw state (from another replica); an error when it is
    /// not one of this metric's.
    fn merge_state(&mut self, other: &[f64]) -> Result<()>;
}

fn merge_into(what: &'static str, ours: &mut [f64], theirs: &[f64]) -> Result<()> {
    if ours.len() != theirs.len() {
        return Err(NnError::InputMismatch {
            what,
            expected: format!("a state of {} sums", ours.len()),
            got: format!("{}", theirs.len()),
        });
    }
    for (a, b) in ours.iter_mut().zip(theirs) {
        *a += b;
    }
    Ok(())
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

    fn state(&self) -> Vec<f64> {
        vec![self.mean.total, self.mean.count]
    }

    fn merge_state(&mut self, other: &[f64]) -> Result<()> {
        let mut ours = [self.mean.total, self.mean.count];
        merge_into("accuracy state", &mut ours, other)?;
        [self.mean.total, self.mean.count] = ours;
        Ok(())
    }
}

/// Keras's `sparse_categorical_accuracy` under its own name.
pub fn sparse_categorical_accuracy() -> Accuracy {
    Accuracy::named("sparse_categorical_accuracy")
}

/// Which overlap score an [`Overlap`] metric averages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverlapScore {
    /// Intersection over union, `|P ∩ T| / |P ∪ T|` (Keras's `MeanIoU`).
    Iou,
    /// The Dice coefficient, `2 |P ∩ T| / (|P| + |T|)`.
    Dice,
}

/// Per-class overlap of predicted and true segmentation masks, accumulated over every pixel
/// seen since the last reset, averaged over the classes (Keras's `MeanIoU`, and the Dice
/// coefficient): with integer labels `[batch, ...]` and class scores `[batch, ...,
/// classes]`. Classes in `ignore` (the background) are left out of the mean, and so is a
/// class neither predicted nor present (its score is undefined). Per-class values:
/// [`Overlap::per_class`].
#[derive(Clone, Debug)]
pub struct Overlap {
    name: String,
    score: OverlapScore,
    ignore: Vec<usize>,
    /// Per class: pixels predicted and true, predicted, true.
    counts: Vec<[f64; 3]>,
}

impl Overlap {
    /// The mean IoU over `classes` classes but those in `ignore` (`mean_iou` in logs).
    pub fn mean_iou(classes: usize, ignore: &[usize]) -> Overlap {
        Overlap::new("mean_iou", OverlapScore::Iou, classes, ignore)
    }

    /// The mean Dice coefficient over `classes` classes but those in `ignore` (`dice`).
    pub fn dice(classes: usize, ignore: &[usize]) -> Overlap {
        Overlap::new("dice", OverlapScore::Dice, classes, ignore)
    }

    fn new(name: &str, score: OverlapScore, classes: usize, ignore: &[usize]) -> Overlap {
        Overlap {
            name: name.into(),
            score,
            ignore: ignore.to_vec(),
            counts: vec![[0.0; 3]; classes],
        }
    }

    /// Each class's score (`None` for a class neither predicted nor present).
    pub fn per_class(&self) -> Vec<Option<f64>> {
        self.counts
            .iter()
            .map(|&[both, pred, truth]| {
                let union = pred + truth - both;
                (union > 0.0).then(|| match self.score {
                    OverlapScore::Iou => both / union,
                    OverlapScore::Dice => 2.0 * both / (pred + truth),
                })
            })
            .collect()
    }
}

impl Metric for Overlap {
    fn name(&self) -> &str {
        &self.name
    }

    fn update(&mut self, y_true: &Tensor, y_pred: &Tensor) -> Result<()> {
        let pred = predicted_classes(y_true, y_pred)?;
        let truth = y_true.to_dtype(DType::I64)?.to_vec::<i64>()?;
        let classes = self.counts.len() as i64;
        for (&p, &t) in pred.iter().zip(&truth) {
            if !(0..classes).contains(&t) || !(0..classes).contains(&p) {
                return Err(NnError::InputMismatch {
                    what: "overlap metric",
                    expected: format!("classes in 0..{classes}"),
                    got: format!("class {}", if (0..classes).contains(&t) { p } else { t }),
                });
            }
            self.counts[p as usize][1] += 1.0;
            self.counts[t as usize][2] += 1.0;
            if p == t {
                self.counts[t as usize][0] += 1.0;
            }
        }
        Ok(())
    }

    fn result(&self) -> f64 {
        let scores: Vec<f64> = self
            .per_class()
            .into_iter()
            .enumerate()
            .filter(|(c, _)| !self.ignore.contains(c))
            .filter_map(|(_, s)| s)
            .collect();
        if scores.is_empty() {
            0.0
        } else {
            scores.iter().sum::<f64>() / scores.len() as f64
        }
    }

    fn reset(&mut self) {
        self.counts.fill([0.0; 3]);
    }

    fn state(&self) -> Vec<f64> {
        self.counts.iter().flatten().copied().collect()
    }

    fn merge_state(&mut self, other: &[f64]) -> Result<()> {
        let mut ours = self.state();
        merge_into("overlap state", &mut ours, other)?;
        for (slot, c) in self.counts.iter_mut().zip(ours.chunks_exact(3)) {
            *slot = [c[0], c[1], c[2]];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use mirra_tensor::Device;

    use super::*;

    #[test]
    fn iou_and_dice_of_known_masks_leave_out_the_background_and_absent_classes() {
        // Truth 1 1 2 2 0 0, prediction 1 2 2 2 0 0 (as scores over 4 classes; class 3
        // appears in neither).
        let truth = Tensor::from_vec(vec![1i64, 1, 2, 2, 0, 0], &[1, 6], Device::Cpu).unwrap();
        let pred: Vec<f32> = [1, 2, 2, 2, 0, 0]
            .iter()
            .flat_map(|&c| (0..4).map(move |k| if k == c { 1.0 } else { 0.0 }))
            .collect();
        let pred = Tensor::from_vec(pred, &[1, 6, 4], Device::Cpu).unwrap();
        let mut iou = Overlap::mean_iou(4, &[0]);
        let mut dice = Overlap::dice(4, &[0]);
        iou.update(&truth, &pred).unwrap();
        dice.update(&truth, &pred).unwrap();
        // Class 1: both 1, pred 1, truth 2: IoU 1/2, Dice 2/3. Class 2: both 2, pred 3,
        // truth 2: IoU 2/3, Dice 4/5. (The background: IoU 1.)
        assert!((iou.result() - (0.5 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
        assert!((dice.result() - (2.0 / 3.0 + 0.8) / 2.0).abs() < 1e-12);
        assert_eq!(iou.per_class()[3], None);
        // The background counted would change it (a check that it is left out).
        let mut all = Overlap::mean_iou(4, &[]);
        all.update(&truth, &pred).unwrap();
        assert!((all.result() - iou.result()).abs() > 1e-3);
        // Two halves merged equal the whole.
        let mut a = Overlap::dice(4, &[0]);
        let mut b = Overlap::dice(4, &[0]);
        a.update(
            &truth.narrow(1, 0, 3).unwrap(),
            &pred.narrow(1, 0, 3).unwrap(),
        )
        .unwrap();
        b.update(
            &truth.narrow(1, 3, 3).unwrap(),
            &pred.narrow(1, 3, 3).unwrap(),
        )
        .unwrap();
        a.merge_state(&b.state()).unwrap();
        assert_eq!(a.result(), dice.result());
        assert!(a.merge_state(&[1.0]).is_err());
        // A label outside the classes is an error naming it.
        let bad = Tensor::from_vec(vec![7i64, 1, 2, 2, 0, 0], &[1, 6], Device::Cpu).unwrap();
        let e = iou.update(&bad, &pred).unwrap_err().to_string();
        assert!(e.contains("class 7"), "{e}");
    }
}
