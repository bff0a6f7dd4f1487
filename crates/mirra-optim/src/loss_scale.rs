//! Dynamic loss scaling (Keras's `LossScaleOptimizer`, PyTorch's `GradScaler`): float16
//! gradients underflow below 6e-8, so the loss is multiplied by a large scale before
//! backward and the gradients divided by it before the update. The scale starts at 2^15,
//! doubles after 2,000 steps in a row with finite gradients, and halves when a step's
//! gradients hold an inf or a NaN, which step is then skipped (no parameter, slot or
//! iteration changes).
//!
//! Under a mirrored strategy the decision needs no communication of its own: it is made
//! from the all-reduced gradients, which every replica holds bitwise the same (an inf or
//! a NaN on one replica makes the sum non-finite on all of them), so every replica skips
//! the same steps and keeps the same scale.

use mirra_tensor::{DType, Device, Tensor};

use crate::{OptimError, Optimizer, Result};

/// Keras's initial scale, 2^15.
pub const INITIAL_LOSS_SCALE: f64 = 32768.0;
/// Finite steps in a row after which the scale doubles, as in Keras and PyTorch.
pub const GROWTH_INTERVAL: u64 = 2000;

/// Another optimizer behind dynamic loss scaling (see the module docs).
#[derive(Debug)]
pub struct LossScaleOptimizer {
    inner: Box<dyn Optimizer>,
    scale: f64,
    growth_interval: u64,
    /// Finite steps since the scale last changed.
    good_steps: u64,
    /// Steps skipped for non-finite gradients, in all.
    skipped: u64,
}

impl LossScaleOptimizer {
    /// `inner` behind a scale of [`INITIAL_LOSS_SCALE`] doubling every
    /// [`GROWTH_INTERVAL`] finite steps.
    pub fn new(inner: Box<dyn Optimizer>) -> LossScaleOptimizer {
        LossScaleOptimizer {
            inner,
            scale: INITIAL_LOSS_SCALE,
            growth_interval: GROWTH_INTERVAL,
            good_steps: 0,
            skipped: 0,
        }
    }

    /// Another initial scale (positive and finite, checked by the next step).
    pub fn initial_scale(mut self, scale: f64) -> LossScaleOptimizer {
        self.scale = scale;
        self
    }

    /// Another growth interval (at least 1, checked by the next step).
    pub fn growth_interval(mut self, steps: u64) -> LossScaleOptimizer {
        self.growth_interval = steps;
        self
    }

    /// The optimizer that applies the unscaled gradients.
    pub fn inner(&self) -> &dyn Optimizer {
        self.inner.as_ref()
    }

    /// Steps skipped so far for non-finite gradients.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }
}

/// `grads` times `inv`, and whether every result is finite: on the host, a scan of each;
/// on a CUDA device, one flag in device memory set by every gradient's kernel and read
/// once (the step's one wait for the device; issue 17's "flag on the device").
fn unscale_and_check(grads: &[Tensor], inv: f64) -> Result<(Vec<Tensor>, bool)> {
    if grads.iter().any(|g| !g.device().is_cpu()) {
        return Ok(crate::cuda::unscale_and_check(grads, inv)?);
    }
    let unscaled = grads
        .iter()
        .map(|g| g.scale(inv))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut finite = true;
    for g in &unscaled {
        if g.first_non_finite()?.is_some() {
            finite = false;
            break;
        }
    }
    Ok((unscaled, finite))
}

/// State keys of the scale and its count of finite steps, beside the inner optimizer's.
const SCALE_KEY: &str = "loss_scale";
const GOOD_STEPS_KEY: &str = "loss_scale/good_steps";

impl Optimizer for LossScaleOptimizer {
    fn step(&mut self, params: &mut [Tensor], grads: &[Tensor]) -> Result<()> {
        self.validate()?;
        let (unscaled, finite) = unscale_and_check(grads, 1.0 / self.scale)?;
        if !finite {
            // Skipped: the scale halves, nothing else changes.
            self.scale /= 2.0;
            self.good_steps = 0;
            self.skipped += 1;
            return Ok(());
        }
        self.inner.step(params, &unscaled)?;
        self.good_steps += 1;
        if self.good_steps >= self.growth_interval {
            self.scale *= 2.0;
            self.good_steps = 0;
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.inner.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.inner.set_learning_rate(lr);
    }

    fn iterations(&self) -> u64 {
        self.inner.iterations()
    }

    fn loss_scale(&self) -> Option<f64> {
        Some(self.scale)
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut state = self.inner.state();
        let scalar = |t: mirra_tensor::Result<Tensor>| t.expect("a host scalar");
        state.push((
            SCALE_KEY.into(),
            scalar(Tensor::scalar(self.scale, Device::Cpu)),
        ));
        state.push((
            GOOD_STEPS_KEY.into(),
            scalar(Tensor::scalar(self.good_steps as i64, Device::Cpu)),
        ));
        state
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let bad = |key: &str, msg: String| OptimError::BadState {
            op: "loss scaling",
            key: key.into(),
            msg,
        };
        let read = |key: &str, dtype: DType| -> Result<Tensor> {
            let (_, t) = state
                .iter()
                .find(|(k, _)| k == key)
                .ok_or_else(|| bad(key, "missing from a loss-scaled optimizer's state".into()))?;
            if t.elem_count() != 1 {
                return Err(bad(
                    key,
                    format!("expected a scalar, got shape {}", t.shape()),
                ));
            }
            Ok(t.to_dtype(dtype)?)
        };
        let scale = read(SCALE_KEY, DType::F64)?.to_scalar::<f64>()?;
        let good = read(GOOD_STEPS_KEY, DType::I64)?.to_scalar::<i64>()?;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(bad(
                SCALE_KEY,
                format!("{scale}: must be positive and finite"),
            ));
        }
        if good < 0 {
            return Err(bad(GOOD_STEPS_KEY, format!("{good}: must not be negative")));
        }
        let rest: Vec<(String, Tensor)> = state
            .iter()
            .filter(|(k, _)| k != SCALE_KEY && k != GOOD_STEPS_KEY)
            .cloned()
            .collect();
        self.inner.load_state(&rest)?;
        self.scale = scale;
        self.good_steps = good as u64;
        Ok(())
    }

    fn box_clone(&self) -> Box<dyn Optimizer> {
        Box::new(LossScaleOptimizer {
            inner: self.inner.box_clone(),
            scale: self.scale,
            growth_interval: self.growth_interval,
            good_steps: self.good_steps,
            skipped: self.skipped,
        })
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn validate(&self) -> Result<()> {
        let invalid = |name, value, expected| OptimError::InvalidHyperparameter {
            op: "loss scaling",
            name,
            value,
            expected,
        };
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(invalid("scale", self.scale, "a positive finite number"));
        }
        if self.growth_interval == 0 {
            return Err(invalid("growth_interval", 0.0, "at least 1"));
        }
        self.inner.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Adam, Sgd};

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_slice(v, &[v.len()], Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }

    #[test]
    fn finite_steps_apply_the_unscaled_gradient_and_the_scale_grows() {
        let mut opt = LossScaleOptimizer::new(Box::new(Sgd::new(0.5))).growth_interval(3);
        assert_eq!(opt.loss_scale().unwrap(), INITIAL_LOSS_SCALE);
        let mut p = [t(&[1.0, 2.0])];
        for step in 1..=3 {
            // What backward of the scaled loss gives: the true gradient times the scale.
            let g = t(&[0.25, -1.0]).scale(opt.loss_scale().unwrap()).unwrap();
            opt.step(&mut p, &[g]).unwrap();
            assert_eq!(opt.iterations(), step);
        }
        // Three plain SGD steps of 0.5 x (0.25, -1).
        assert_eq!(values(&p[0]), [1.0 - 3.0 * 0.125, 2.0 + 3.0 * 0.5]);
        assert_eq!(opt.loss_scale().unwrap(), 2.0 * INITIAL_LOSS_SCALE);
        assert_eq!(opt.skipped_steps(), 0);
    }

    #[test]
    fn a_non_finite_gradient_skips_the_step_and_halves_the_scale() {
        let mut opt = LossScaleOptimizer::new(Box::new(Adam::new(0.1))).growth_interval(2);
        let mut p = [t(&[1.0, 2.0]), t(&[3.0])];
        opt.step(&mut p, &[t(&[1.0, 1.0]), t(&[1.0])]).unwrap();
        let (before, state) = (p.clone().map(|x| values(&x)), opt.state());
        for bad in [f32::INFINITY, f32::NAN, f32::NEG_INFINITY] {
            let scale = opt.loss_scale().unwrap();
            opt.step(&mut p, &[t(&[1.0, 1.0]), t(&[bad])]).unwrap();
            assert_eq!(opt.loss_scale().unwrap(), scale / 2.0, "{bad}");
        }
        assert_eq!(p.clone().map(|x| values(&x)), before);
        assert_eq!(opt.iterations(), 1);
        assert_eq!(opt.skipped_steps(), 3);
        // Adam's slots untouched (the scale's own entries aside).
        let inner = |s: &[(String, Tensor)]| -> Vec<(String, Vec<f64>)> {
            s.iter()
                .filter(|(k, _)| !k.starts_with("loss_scale"))
                .map(|(k, v)| (k.clone(), v.to_dtype(DType::F64).unwrap().to_vec().unwrap()))
                .collect()
        };
        assert_eq!(inner(&opt.state()), inner(&state));
        // A good step after the skips counts from zero towards the next growth.
        let scale = opt.loss_scale().unwrap();
        opt.step(&mut p, &[t(&[1.0, 1.0]), t(&[1.0])]).unwrap();
        assert_eq!(opt.loss_scale().unwrap(), scale);
        opt.step(&mut p, &[t(&[1.0, 1.0]), t(&[1.0])]).unwrap();
        assert_eq!(opt.loss_scale().unwrap(), 2.0 * scale);
    }

    #[test]
    fn the_scale_and_its_count_travel_with_the_state() {
        let mut opt = LossScaleOptimizer::new(Box::new(Adam::new(0.1))).growth_interval(5);
        let mut p = [t(&[1.0])];
        opt.step(&mut p, &[t(&[f32::INFINITY])]).unwrap();
        opt.step(&mut p, &[t(&[1.0])]).unwrap();
        let state = opt.state();
        let mut other = LossScaleOptimizer::new(Box::new(Adam::new(0.1))).growth_interval(5);
        other.load_state(&state).unwrap();
        assert_eq!(other.loss_scale().unwrap(), INITIAL_LOSS_SCALE / 2.0);
        // Four more finite steps reach the interval of five in both.
        let mut q = p.clone();
        for _ in 0..4 {
            opt.step(&mut p, &[t(&[1.0])]).unwrap();
            other.step(&mut q, &[t(&[1.0])]).unwrap();
        }
        assert_eq!(other.loss_scale().unwrap(), INITIAL_LOSS_SCALE);
        assert_eq!(opt.loss_scale().unwrap(), other.loss_scale().unwrap());
        assert_eq!(values(&p[0]), values(&q[0]));

        // A plain optimizer's state lacks the scale: refused, naming the entry.
        let e = other.load_state(&Adam::new(0.1).state()).unwrap_err();
        assert!(e.to_string().contains("`loss_scale`"), "{e}");
        let mut bad = state.clone();
        let at = bad.iter().position(|(k, _)| k == "loss_scale").unwrap();
        bad[at].1 = Tensor::scalar(0.0f64, Device::Cpu).unwrap();
        assert!(other.load_state(&bad).is_err());
    }

    #[test]
    fn invalid_settings_are_errors_before_anything_changes() {
        let mut p = [t(&[1.0])];
        for opt in [
            LossScaleOptimizer::new(Box::new(Sgd::new(0.1))).initial_scale(0.0),
            LossScaleOptimizer::new(Box::new(Sgd::new(0.1))).initial_scale(f64::INFINITY),
            LossScaleOptimizer::new(Box::new(Sgd::new(0.1))).growth_interval(0),
        ] {
            let mut opt = opt;
            assert!(opt.step(&mut p, &[t(&[1.0])]).is_err());
            assert_eq!(values(&p[0]), [1.0]);
        }
    }
}
