//! Batch normalization, plain and synchronised across replicas (Keras's
//! `BatchNormalization(synchronized=...)`, PyTorch's `BatchNorm` and `SyncBatchNorm`).

use std::sync::Arc;

use mirra_autograd::{LinearMap, Tape, Var};
use mirra_tensor::init::Initializer;
use mirra_tensor::{DType, Tensor};

use crate::{Autocast, ForwardCtx, Layer, NnError, ParamSpec, Result, Role};

/// Normalises each channel (the last axis) by the batch's mean and variance while
/// training, and by moving averages of them in inference, then scales by `gamma` and
/// shifts by `beta` (trainable, ones and zeros); `moving_mean` and `moving_variance`
/// (zeros and ones) are non-trainable state, `moving = momentum · moving + (1 − momentum)
/// · batch` after each training pass. Momentum 0.99 and epsilon 1e-3, as Keras's.
///
/// The batch variance is `E[x²] − E[x]²` (biased, as Keras's), from one sum of `x` and one
/// of `x²` per channel. [`BatchNormalization::synchronized`] sums those two, and the
/// example count, across the replicas of a mirrored strategy in the forward pass (one
/// all-reduce of `2C + 1` values per layer) and the gradients of the sums in the backward
/// pass: N replicas at global batch B then normalise exactly as one device at batch B,
/// also when replicas have unequal or no examples. Without it each replica normalises by
/// its own batch and the moving statistics are averaged across replicas after each step.
#[derive(Clone, Debug)]
pub struct BatchNormalization {
    momentum: f64,
    epsilon: f64,
    synchronized: bool,
    channels: usize,
}

impl Default for BatchNormalization {
    fn default() -> BatchNormalization {
        BatchNormalization::new()
    }
}

impl BatchNormalization {
    /// Batch normalization over the last axis with Keras's defaults.
    pub fn new() -> BatchNormalization {
        BatchNormalization {
            momentum: 0.99,
            epsilon: 1e-3,
            synchronized: false,
            channels: 0,
        }
    }

    /// Statistics summed across the replicas of a mirrored strategy (Keras's
    /// `SyncBatchNormalization`); the same as plain batch norm outside a strategy.
    pub fn synchronized(mut self) -> BatchNormalization {
        self.synchronized = true;
        self
    }

    /// With another momentum of the moving statistics.
    pub fn momentum(mut self, momentum: f64) -> BatchNormalization {
        self.momentum = momentum;
        self
    }

    /// With another epsilon, added to the variance.
    pub fn epsilon(mut self, epsilon: f64) -> BatchNormalization {
        self.epsilon = epsilon;
        self
    }

    /// The moving statistics after a batch of these statistics.
    fn moving(&self, mean: &Tensor, var: &Tensor, ctx: &ForwardCtx<'_>) -> Result<Vec<Tensor>> {
        let m = self.momentum;
        let update = |moving: &Tensor, batch: &Tensor| -> Result<Tensor> {
            Ok(moving.scale(m)?.add(&batch.scale(1.0 - m)?)?)
        };
        Ok(vec![
            update(&ctx.state[0], mean)?,
            update(&ctx.state[1], var)?,
        ])
    }

    /// The cross-replica sum, for a synchronised layer under a strategy.
    fn sync_sum<'a>(&self, ctx: &ForwardCtx<'a>) -> Option<&'a Arc<dyn LinearMap>> {
        ctx.cross_replica.filter(|_| self.synchronized)
    }
}

/// The mean and biased variance per channel from `totals`, `[Σx, Σx², count]` (`2C + 1`
/// values). One function for a replica with examples (variables whose gradients reach
/// `x`) and one without (constants): replicas given the same sums store bitwise the same
/// moving statistics.
fn batch_stats<'t>(totals: &Var<'t>, c: usize) -> Result<(Var<'t>, Var<'t>)> {
    let n = totals.value().narrow(0, 2 * c, 1)?.to_dtype(DType::F64)?;
    let inv = 1.0 / n.to_vec::<f64>()?[0].max(1.0);
    let mean = totals.narrow(0, 0, c)?.scale(inv)?;
    let var = totals
        .narrow(0, c, c)?
        .scale(inv)?
        .sub(&mean.square()?)?
        .relu()?;
    Ok((mean, var))
}

/// `[0; 2C + 1]`: the sums of a replica without examples, or their gradient.
fn no_sums(like: &Tensor) -> Result<Tensor> {
    let zeros = like.zeros_like()?;
    Ok(Tensor::concat(
        &[&zeros, &zeros, &zeros.narrow(0, 0, 1)?],
        0,
    )?)
}

impl Layer for BatchNormalization {
    fn autocast(&self) -> Autocast {
        // Sums of squares over the batch: f32's range and precision.
        Autocast::Float32
    }

    fn kind(&self) -> &'static str {
        "batch_normalization"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let config = |msg: String| NnError::Config {
            layer: "batch_normalization".into(),
            msg,
        };
        let Some(&c) = input.last() else {
            return Err(config("needs inputs with a channel axis".into()));
        };
        if !(0.0..=1.0).contains(&self.momentum) || self.epsilon.is_nan() || self.epsilon <= 0.0 {
            return Err(config(format!(
                "momentum {} must lie in [0, 1] and epsilon {} be positive",
                self.momentum, self.epsilon
            )));
        }
        self.channels = c;
        let role = if self.synchronized {
            Role::InSync
        } else {
            Role::ReplicaLocal
        };
        Ok((
            vec![
                ParamSpec::trainable("gamma", vec![c], Initializer::Ones),
                ParamSpec::trainable("beta", vec![c], Initializer::Zeros),
                ParamSpec::state("moving_mean", vec![c], Initializer::Zeros, role),
                ParamSpec::state("moving_variance", vec![c], Initializer::Ones, role),
            ],
            input.to_vec(),
        ))
    }

    fn forward<'t>(
        &self,
        x: &Var<'t>,
        params: &[Var<'t>],
        ctx: &mut ForwardCtx<'_>,
    ) -> Result<Var<'t>> {
        let (gamma, beta) = (&params[0], &params[1]);
        let c = self.channels;
        let tape = x.tape();
        // y = x · s + (β − μ s), s = γ / √(σ² + ε), as one per-channel affine map (as
        // PyTorch's CPU kernel computes it): from the moving statistics in inference, from
        // the batch's in training.
        if !ctx.training {
            let inv = tape.constant(ctx.state[1].affine(1.0, self.epsilon)?.powf(-0.5)?);
            let s = gamma.mul(&inv)?;
            let shift = beta.sub(&tape.constant(ctx.state[0].clone()).mul(&s)?)?;
            return Ok(x.channel_affine(&s, &shift)?);
        }
        let count = x.value().elem_count() / c.max(1);
        let count = Tensor::full(&[1], count as f64, x.value().dtype(), x.value().device())?;
        let local = Var::concat(&[&x.channel_moments()?, &tape.constant(count)], 0)?;
        let totals = match self.sync_sum(ctx) {
            Some(sum) => local.linear_map(sum.clone())?,
            None => local,
        };
        let (mean, var) = batch_stats(&totals, c)?;
        ctx.new_state = self.moving(mean.value(), var.value(), ctx)?;
        let s = gamma.mul(&var.affine(1.0, self.epsilon)?.powf(-0.5)?)?;
        let shift = beta.sub(&mean.mul(&s)?)?;
        Ok(x.channel_affine(&s, &shift)?)
    }

    fn forward_without_examples(&self, ctx: &mut ForwardCtx<'_>) -> Result<()> {
        if let Some(sum) = self.sync_sum(ctx) {
            let totals = sum
                .apply(&no_sums(&ctx.state[0])?)
                .map_err(NnError::CrossReplica)?;
            let tape = Tape::new();
            let (mean, var) = batch_stats(&tape.constant(totals), self.channels)?;
            ctx.new_state = self.moving(mean.value(), var.value(), ctx)?;
        }
        Ok(())
    }

    fn backward_without_examples(&self, ctx: &mut ForwardCtx<'_>) -> Result<()> {
        if let Some(sum) = self.sync_sum(ctx) {
            sum.adjoint(&no_sums(&ctx.state[0])?)
                .map_err(NnError::CrossReplica)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use mirra_autograd::{Tape, Var};
    use mirra_tensor::init::rng;
    use mirra_tensor::{DType, Device, Tensor};

    use crate::{Activation, BatchNormalization, Dense, Examples, Network};

    fn net() -> Network {
        let mut n = Network::new(vec![
            Box::new(Dense::new(3, Activation::Linear)),
            Box::new(BatchNormalization::new()),
        ]);
        n.build_with(&[2], DType::F64, &mut rng(3)).unwrap();
        n
    }

    fn input() -> Tensor {
        let x: Vec<f64> = (0..10).map(|i| ((i * 7 % 11) as f64 - 4.0) * 0.3).collect();
        Tensor::from_vec(x, &[5, 2], Device::Cpu).unwrap()
    }

    /// `sum(out · R)` of a training pass, for a fixed `R`.
    fn loss<'t>(net: &mut Network, tape: &'t Tape) -> Var<'t> {
        let out = net
            .forward(tape, input(), true, Examples::default())
            .unwrap()
            .output;
        let r: Vec<f64> = (0..15).map(|i| ((i * 5 % 7) as f64 - 3.0) / 3.0).collect();
        let r = tape.constant(Tensor::from_vec(r, &[5, 3], Device::Cpu).unwrap());
        out.mul(&r).unwrap().sum(&[], false).unwrap()
    }

    /// The gradients of a training pass (through the batch statistics, into the layer
    /// before) agree with central differences; a batch norm whose statistics were treated
    /// as constants would not (the gradient of `Σ (x − μ) / σ` is then not zero).
    #[test]
    fn training_gradients_match_finite_differences() {
        let mut model = net();
        let tape = Tape::new();
        let grads = tape.backward(&loss(&mut model, &tape)).unwrap();
        let params = net().params().to_vec();
        let h = 1e-6;
        for (i, p) in params.iter().enumerate() {
            let analytic = grads.get(i).unwrap().to_vec::<f64>().unwrap();
            let values = p.to_vec::<f64>().unwrap();
            for j in 0..values.len() {
                let at = |delta: f64| {
                    let mut v = values.clone();
                    v[j] += delta;
                    let mut ps = params.clone();
                    ps[i] = Tensor::from_vec(v, p.dims(), Device::Cpu).unwrap();
                    let mut m = net();
                    m.set_params(ps).unwrap();
                    let tape = Tape::new();
                    loss(&mut m, &tape).value().to_vec::<f64>().unwrap()[0]
                };
                let numeric = (at(h) - at(-h)) / (2.0 * h);
                assert!(
                    (analytic[j] - numeric).abs() <= 1e-6 + 1e-5 * numeric.abs(),
                    "{}[{j}]: analytic {} numeric {numeric}",
                    model.param_names()[i],
                    analytic[j]
                );
            }
        }
    }

    #[test]
    fn training_normalises_and_updates_the_moving_statistics() {
        let mut model = net();
        let tape = Tape::new();
        let out = model
            .forward(&tape, input(), true, Examples::default())
            .unwrap()
            .output;
        let y = out.value().to_vec::<f64>().unwrap();
        for c in 0..3 {
            let col: Vec<f64> = y.iter().skip(c).step_by(3).copied().collect();
            let mean = col.iter().sum::<f64>() / 5.0;
            let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 5.0;
            assert!(mean.abs() < 1e-12, "channel {c} mean {mean}");
            // Unit variance but for epsilon: var / (var + 1e-3) of the input's.
            assert!(var > 0.9 && var < 1.0, "channel {c} variance {var}");
        }
        let state = model.state();
        assert_eq!(
            model.state_names(),
            [
                "batch_normalization/moving_mean",
                "batch_normalization/moving_variance"
            ]
        );
        // moving = 0.99 · initial + 0.01 · batch: no longer the zeros and ones.
        assert!(state[0].to_vec::<f64>().unwrap().iter().any(|m| *m != 0.0));
        assert!(state[1].to_vec::<f64>().unwrap().iter().any(|v| *v != 1.0));
        // Inference does not change them.
        let before = model.state()[0].to_vec::<f64>().unwrap();
        model.predict(input()).unwrap();
        assert_eq!(model.state()[0].to_vec::<f64>().unwrap(), before);
    }

    /// With momentum 0 the moving statistics are the last batch's, so inference on that
    /// batch gives what training gave: the inference formula matches the training one
    /// (a swapped mean and variance, a missing epsilon or an unbiased variance would not).
    #[test]
    fn inference_with_the_last_batch_s_statistics_reproduces_training() {
        let mut model = Network::new(vec![
            Box::new(Dense::new(3, Activation::Linear)),
            Box::new(BatchNormalization::new().momentum(0.0)),
        ]);
        model.build_with(&[2], DType::F64, &mut rng(3)).unwrap();
        let tape = Tape::new();
        let trained = model
            .forward(&tape, input(), true, Examples::default())
            .unwrap();
        let trained = trained.output.value().to_vec::<f64>().unwrap();
        let inferred = model.predict(input()).unwrap().to_vec::<f64>().unwrap();
        for (a, b) in trained.iter().zip(&inferred) {
            assert!((a - b).abs() < 1e-12, "{trained:?} vs {inferred:?}");
        }
    }
}
