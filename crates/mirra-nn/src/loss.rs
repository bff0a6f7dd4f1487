//! Losses, as Keras defines them. Each computes per-example losses; its [`Reduction`]
//! turns them into the scalar that is differentiated.

use std::fmt;

use mirra_autograd::Var;
use mirra_tensor::Tensor;

use crate::{ModelOutput, NnError, Result};

/// How per-example losses become one scalar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean over the batch (Keras's default `sum_over_batch_size`).
    #[default]
    SumOverBatchSize,
    /// The sum over the batch. A distributed step divides it by the global batch size
    /// itself, so that every replica's share adds up to the single-device mean.
    Sum,
}

/// Keras clips probabilities to `[EPSILON, 1 - EPSILON]` before taking logarithms.
const EPSILON: f64 = 1e-7;

/// A loss function.
pub trait Loss: Send + Sync + fmt::Debug {
    /// Keras's name (`sparse_categorical_crossentropy`, ...).
    fn name(&self) -> &'static str;

    /// The loss of each example, shape `[batch]`.
    fn per_example<'t>(&self, out: &ModelOutput<'t>, y_true: &Tensor) -> Result<Var<'t>>;

    /// The scalar loss under `reduction`.
    fn compute<'t>(
        &self,
        out: &ModelOutput<'t>,
        y_true: &Tensor,
        reduction: Reduction,
    ) -> Result<Var<'t>> {
        let per = self.per_example(out, y_true)?;
        Ok(match reduction {
            Reduction::SumOverBatchSize => per.mean(&[], false)?,
            Reduction::Sum => per.sum(&[], false)?,
        })
    }
}

fn batch_check(what: &'static str, out: &Var<'_>, y_true: &Tensor) -> Result<()> {
    let batch = out.shape().first().copied();
    if y_true.dims().first().copied() != batch {
        return Err(NnError::InputMismatch {
            what,
            expected: format!("labels for a batch of {}", batch.unwrap_or(0)),
            got: format!("labels of shape {}", y_true.shape()),
        });
    }
    Ok(())
}

/// Log-probabilities over the last axis: from the logits when the model (or the flag)
/// provides them, else from clipped probabilities.
fn log_probs<'t>(out: &ModelOutput<'t>, from_logits: bool) -> Result<Var<'t>> {
    if from_logits {
        return Ok(out.output.log_softmax(-1)?);
    }
    if let Some(logits) = &out.logits {
        return Ok(logits.log_softmax(-1)?);
    }
    let p = &out.output;
    let lo = p.tape().constant(p.value().full_like(EPSILON)?);
    let hi = p.tape().constant(p.value().full_like(1.0 - EPSILON)?);
    // clip(p) = min(max(p, lo), hi), differentiable where p is inside the range.
    let clipped = clip(p, &lo, &hi)?;
    Ok(clipped.log()?)
}

fn clip<'t>(p: &Var<'t>, lo: &Var<'t>, hi: &Var<'t>) -> Result<Var<'t>> {
    // max(p, lo) = p + relu(lo - p) and min(q, hi) = q - relu(q - hi).
    let q = p.add(&lo.sub(p)?.relu()?)?;
    Ok(q.sub(&q.sub(hi)?.relu()?)?)
}

/// Cross-entropy for integer class labels (`[batch]`, any integer dtype).
#[derive(Clone, Copy, Debug, Default)]
pub struct SparseCategoricalCrossentropy {
    /// True when the model's output is logits rather than probabilities.
    pub from_logits: bool,
}

impl Loss for SparseCategoricalCrossentropy {
    fn name(&self) -> &'static str {
        "sparse_categorical_crossentropy"
    }

    fn per_example<'t>(&self, out: &ModelOutput<'t>, y_true: &Tensor) -> Result<Var<'t>> {
        batch_check(self.name(), &out.output, y_true)?;
        let out_dims = out.output.shape().to_vec();
        // Labels `[batch, ...]` for outputs `[batch, ..., classes]`: one class per example,
        // or per pixel (segmentation), whose losses each example averages.
        if y_true.dtype().is_float() || out_dims.len() != y_true.rank() + 1 {
            return Err(NnError::InputMismatch {
                what: "sparse_categorical_crossentropy labels",
                expected: format!(
                    "integer class ids of shape {:?}",
                    &out_dims[..out_dims.len().saturating_sub(1)]
                ),
                got: format!("{} of shape {}", y_true.dtype(), y_true.shape()),
            });
        }
        let logp = log_probs(out, self.from_logits)?;
        let mut dims = y_true.dims().to_vec();
        dims.push(1);
        let index = y_true.to_dtype(mirra_tensor::DType::I64)?.reshape(&dims)?;
        let nll = logp.gather(-1, &index)?.neg()?;
        let batch = y_true.dims()[0];
        Ok(if y_true.rank() == 1 {
            nll.reshape(&[batch])?
        } else {
            nll.reshape(&[batch, usize::MAX])?.mean(&[1], false)?
        })
    }
}

/// Cross-entropy for one-hot (or soft) label distributions `[batch, classes]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CategoricalCrossentropy {
    /// True when the model's output is logits rather than probabilities.
    pub from_logits: bool,
}

impl Loss for CategoricalCrossentropy {
    fn name(&self) -> &'static str {
        "categorical_crossentropy"
    }

    fn per_example<'t>(&self, out: &ModelOutput<'t>, y_true: &Tensor) -> Result<Var<'t>> {
        batch_check(self.name(), &out.output, y_true)?;
        if y_true.shape() != out.output.shape() {
            return Err(NnError::InputMismatch {
                what: "categorical_crossentropy labels",
                expected: format!("shape {}", out.output.shape()),
                got: format!("shape {}", y_true.shape()),
            });
        }
        let logp = log_probs(out, self.from_logits)?;
        let y = logp.tape().constant(y_true.to_dtype(logp.value().dtype())?);
        Ok(logp.mul(&y)?.sum(&[-1], false)?.neg()?)
    }
}

/// Mean squared error over the last axis.
#[derive(Clone, Copy, Debug, Default)]
pub struct MeanSquaredError;

impl Loss for MeanSquaredError {
    fn name(&self) -> &'static str {
        "mean_squared_error"
    }

    fn per_example<'t>(&self, out: &ModelOutput<'t>, y_true: &Tensor) -> Result<Var<'t>> {
        batch_check(self.name(), &out.output, y_true)?;
        let p = &out.output;
        let y = p.tape().constant(y_true.to_dtype(p.value().dtype())?);
        let d = p.sub(&y)?.square()?;
        if d.shape().rank() <= 1 {
            return Ok(d);
        }
        Ok(d.mean(&[-1], false)?)
    }
}

/// Cross-entropy plus soft Dice for segmentation (nnU-Net's loss): per example, the pixel
/// cross-entropy ([`SparseCategoricalCrossentropy`], averaged over the pixels) plus
/// `1 - ` the mean over the scored classes of the soft Dice
/// `(2 Σ p y + s) / (Σ p + Σ y + s)`, with `p` the predicted probabilities of a class,
/// `y` its one-hot truth, sums over the example's pixels, and `s` smoothing (1) so that a
/// class absent from the example and predicted nowhere scores 1.
///
/// Cross-entropy alone weighs every pixel alike, so a background of nine pixels in ten
/// dominates it; the Dice term weighs each class by its own extent. (On `mirra train
/// --model unet` it did not help: a validation Dice of 0.8107 after the 20-epoch recipe,
/// against 0.8183 with cross-entropy alone, 2026-12-06; the U-Net's limit there is
/// telling digits apart, not finding them. The CLI keeps cross-entropy.)
#[derive(Clone, Debug)]
pub struct DiceCrossentropy {
    /// The classes of the output's last axis.
    pub classes: usize,
    /// Classes left out of the Dice mean (the background).
    pub ignore: Vec<usize>,
    /// The smoothing `s`.
    pub smooth: f64,
}

impl DiceCrossentropy {
    /// Over `classes`, the Dice term leaving out `ignore`, smoothing 1.
    pub fn new(classes: usize, ignore: &[usize]) -> DiceCrossentropy {
        DiceCrossentropy {
            classes,
            ignore: ignore.to_vec(),
            smooth: 1.0,
        }
    }
}

impl Loss for DiceCrossentropy {
    fn name(&self) -> &'static str {
        "dice_crossentropy"
    }

    fn per_example<'t>(&self, out: &ModelOutput<'t>, y_true: &Tensor) -> Result<Var<'t>> {
        let ce = SparseCategoricalCrossentropy::default().per_example(out, y_true)?;
        let p = &out.output;
        let dims = p.shape().to_vec();
        let c = self.classes;
        if dims.last() != Some(&c) || self.ignore.iter().any(|&i| i >= c) {
            return Err(NnError::InputMismatch {
                what: "dice_crossentropy",
                expected: format!("outputs of {c} classes (ignoring classes below {c})"),
                got: format!("outputs of shape {:?}, ignoring {:?}", dims, self.ignore),
            });
        }
        let batch = dims[0];
        let pixels = dims[1..dims.len() - 1].iter().product::<usize>();
        // The one-hot truth, built on the host (labels are integers checked by `ce`).
        let labels = y_true
            .to_dtype(mirra_tensor::DType::I64)?
            .to_device(mirra_tensor::Device::Cpu)?
            .to_vec::<i64>()?;
        let mut onehot = vec![0f32; labels.len() * c];
        for (i, &l) in labels.iter().enumerate() {
            if let Some(slot) = usize::try_from(l).ok().filter(|&l| l < c) {
                onehot[i * c + slot] = 1.0;
            }
        }
        let y = Tensor::from_vec(onehot, &[batch, pixels, c], mirra_tensor::Device::Cpu)?
            .to_device(p.value().device())?
            .to_dtype(p.value().dtype())?;
        let p = p.reshape(&[batch, pixels, c])?;
        let y = p.tape().constant(y);
        let s = self.smooth;
        let intersection = p.mul(&y)?.sum(&[1], false)?.affine(2.0, s)?;
        let sizes = p
            .sum(&[1], false)?
            .add(&y.sum(&[1], false)?)?
            .affine(1.0, s)?;
        let dice = intersection.div(&sizes)?;
        // The scored classes' mean: a mask of the kept ones, divided by their count.
        let kept: Vec<f32> = (0..c)
            .map(|k| if self.ignore.contains(&k) { 0.0 } else { 1.0 })
            .collect();
        let count = kept.iter().sum::<f32>().max(1.0) as f64;
        let mask = Tensor::from_vec(kept, &[1, c], mirra_tensor::Device::Cpu)?
            .to_device(p.value().device())?
            .to_dtype(p.value().dtype())?;
        let mask = p.tape().constant(mask.broadcast_to(&[batch, c])?);
        let mean_dice = dice.mul(&mask)?.sum(&[1], false)?.scale(1.0 / count)?;
        Ok(ce.add(&mean_dice.affine(-1.0, 1.0)?)?)
    }
}
