//! Stochastic gradient descent with optional (Nesterov) momentum, in Keras 3's form.
//!
//! The momentum buffer holds a displacement in parameter units (`−lr·g` summed with
//! decay), as Keras keeps it, rather than PyTorch's sum of raw gradients. The two agree
//! exactly for a constant learning rate; under a schedule, Keras's form lets past steps
//! keep the rate they were taken with, while PyTorch's rescales the whole buffer when the
//! rate changes. Matching Keras keeps mirra's numbers comparable with TensorFlow runs.

use mirra_tensor::{FloatElement, Tensor, TensorError};

use crate::cuda::{cuda_error, DeviceUpdate};
use crate::hyperparams::{check_non_negative, check_unit};
#[cfg(test)]
use crate::optimizer::Optimizer;
use crate::optimizer::{cast, next_slot, Core, Rule};
use crate::{LearningRateSchedule, Result};

const NAME: &str = "sgd";

/// Gradient descent with optional momentum, Nesterov momentum and decoupled weight
/// decay; matches Keras 3's `keras.optimizers.SGD`.
///
/// With learning rate `lr` (from the schedule, at the current iteration), momentum `μ`
/// and weight decay `wd`, each element of a parameter `p` with gradient `g` is updated:
///
/// ```text
/// p ← p · (1 − lr·wd)                 decoupled weight decay (Keras 3: applied first)
/// μ = 0:        p ← p − lr·g
/// μ > 0:        m ← μ·m − lr·g        (m starts at 0; state slot "momentum")
///     plain:    p ← p + m
///     nesterov: p ← p + μ·m − lr·g
/// ```
///
/// PyTorch's `torch.optim.SGD` writes momentum as `b ← μ·b + g; p ← p − lr·b` (Nesterov:
/// `p ← p − lr·(g + μ·b)`): with `m = −lr·b` this is the same update for a constant
/// learning rate, and differs once the rate changes between steps. PyTorch's
/// `weight_decay` is an L2 term added to the gradient (`g ← g + wd·p`) rather than
/// decoupled; without momentum both give `p ← p − lr·(g + wd·p)` up to rounding.
///
/// Defaults (Keras): momentum 0, no Nesterov, no weight decay; [`Sgd::default`] uses
/// Keras's learning rate 0.01. Momentum must lie in `[0, 1]`; Nesterov without momentum
/// is plain SGD, as in Keras.
#[derive(Clone, Debug)]
pub struct Sgd {
    core: Core,
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
}

impl Sgd {
    /// SGD with a constant learning rate and no momentum.
    pub fn new(learning_rate: f64) -> Sgd {
        Sgd {
            core: Core::new(NAME, learning_rate),
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// Set the momentum `μ` (in `[0, 1]`, checked at the first step).
    pub fn momentum(mut self, momentum: f64) -> Sgd {
        self.momentum = momentum;
        self
    }

    /// Use Nesterov momentum.
    pub fn nesterov(mut self, nesterov: bool) -> Sgd {
        self.nesterov = nesterov;
        self
    }

    /// Set the decoupled weight decay `wd` (finite, `>= 0`).
    pub fn weight_decay(mut self, weight_decay: f64) -> Sgd {
        self.weight_decay = weight_decay;
        self
    }

    /// Take the learning rate from a schedule instead of a constant.
    pub fn with_schedule(mut self, schedule: Box<dyn LearningRateSchedule>) -> Sgd {
        self.core.set_schedule(schedule);
        self
    }
}

impl Default for Sgd {
    /// Keras's defaults: learning rate 0.01, no momentum.
    fn default() -> Sgd {
        Sgd::new(0.01)
    }
}

/// The step's scalars (see [`Sgd`]).
#[derive(Clone, Copy)]
pub(crate) struct Coeffs<A> {
    lr: A,
    mu: A,
    decay: A,
    nesterov: bool,
}

impl Coeffs<f64> {
    fn to_acc<A: mirra_tensor::Element>(self) -> Coeffs<A> {
        Coeffs {
            lr: cast(self.lr),
            mu: cast(self.mu),
            decay: cast(self.decay),
            nesterov: self.nesterov,
        }
    }
}

/// The fused element-wise update (see [`Sgd`] for the formula).
fn kernel<T: FloatElement>(p: &mut [T], g: &[T], m: &mut [T::Acc], c: Coeffs<T::Acc>) {
    mirra_tensor::vectorize(
        #[inline(always)]
        || {
            debug_assert_eq!(p.len(), g.len());
            if m.is_empty() {
                for (p, &g) in p.iter_mut().zip(g) {
                    *p = T::from_acc(p.to_acc() * c.decay - c.lr * g.to_acc());
                }
                return;
            }
            debug_assert_eq!(p.len(), m.len());
            for ((p, &g), m) in p.iter_mut().zip(g).zip(m.iter_mut()) {
                let g = g.to_acc();
                *m = c.mu * *m - c.lr * g;
                let delta = if c.nesterov { c.mu * *m - c.lr * g } else { *m };
                *p = T::from_acc(p.to_acc() * c.decay + delta);
            }
        },
    )
}

impl Rule for Sgd {
    type Coeffs = Coeffs<f64>;

    fn core(&self) -> &Core {
        &self.core
    }

    fn core_mut(&mut self) -> &mut Core {
        &mut self.core
    }

    fn slot_names(&self) -> &'static [&'static str] {
        if self.momentum > 0.0 {
            &["momentum"]
        } else {
            &[]
        }
    }

    fn check_hyperparameters(&self) -> Result<()> {
        check_unit(NAME, "momentum", self.momentum)?;
        check_non_negative(NAME, "weight_decay", self.weight_decay)
    }

    fn coeffs(&self, lr: f64) -> Coeffs<f64> {
        Coeffs {
            lr,
            mu: self.momentum,
            decay: 1.0 - lr * self.weight_decay,
            nesterov: self.nesterov,
        }
    }

    /// An empty momentum slot means no momentum.
    fn update<T: FloatElement>(
        p: &mut [T],
        g: &[T],
        slots: &mut std::slice::IterMut<'_, Tensor>,
        c: Coeffs<f64>,
    ) -> std::result::Result<(), TensorError> {
        let m = next_slot::<T::Acc>(slots)?;
        kernel::<T>(p, g, m, c.to_acc());
        Ok(())
    }

    fn update_on_device(
        u: &mut DeviceUpdate<'_>,
        c: Coeffs<f64>,
    ) -> std::result::Result<(), TensorError> {
        let m = u.next_slot()?;
        let nesterov = i32::from(c.nesterov);
        mirra_cuda::launch!(u.rt, u.kernel("sgd"), u.len(), |l| {
            l.arg(&u.p)
                .arg(&u.g)
                .arg(&m)
                .arg(&u.n)
                .arg(&c.lr)
                .arg(&c.mu)
                .arg(&c.decay)
                .arg(&nesterov);
        })
        .map_err(cuda_error)
    }
}

#[cfg(test)]
mod tests {
    use mirra_tensor::{DType, Device};

    use super::*;
    use crate::testutil::{assert_close, t32, values};

    /// Runs `opt` over the gradient sequence and returns the parameter after each step.
    fn run(opt: &mut dyn Optimizer, p0: &[f32], grads: &[&[f32]]) -> Vec<Vec<f64>> {
        let mut params = vec![t32(p0)];
        grads
            .iter()
            .map(|g| {
                opt.step(&mut params, &[t32(g)]).unwrap();
                values(&params[0])
            })
            .collect()
    }

    const GRADS: [&[f32]; 3] = [&[1.0, -2.0], &[0.5, 0.5], &[-1.0, 0.0]];

    #[test]
    fn plain_sgd_by_hand() {
        // lr 0.1: p ← p − 0.1·g with g = [0.5, 1.0] twice, from [1, −2]:
        // [0.95, −2.1], then [0.9, −2.2].
        let got = run(
            &mut Sgd::new(0.1),
            &[1.0, -2.0],
            &[&[0.5, 1.0], &[0.5, 1.0]],
        );
        assert_close(&got[0], &[0.95, -2.1], 1e-6);
        assert_close(&got[1], &[0.9, -2.2], 1e-6);
    }

    #[test]
    fn momentum_by_hand() {
        // lr 0.1, μ 0.9, p0 = [1, 2], m ← 0.9·m − 0.1·g, p ← p + m:
        // 1: m = [−0.1, 0.2]                                  p = [0.9, 2.2]
        // 2: m = [−0.09 − 0.05, 0.18 − 0.05] = [−0.14, 0.13]   p = [0.76, 2.33]
        // 3: m = [−0.126 + 0.1, 0.117] = [−0.026, 0.117]       p = [0.734, 2.447]
        let got = run(&mut Sgd::new(0.1).momentum(0.9), &[1.0, 2.0], &GRADS);
        assert_close(&got[0], &[0.9, 2.2], 1e-6);
        assert_close(&got[1], &[0.76, 2.33], 1e-6);
        assert_close(&got[2], &[0.734, 2.447], 1e-6);
    }

    #[test]
    fn nesterov_by_hand() {
        // Same m as above; p ← p + 0.9·m − 0.1·g:
        // 1: p += [−0.09 − 0.1, 0.18 + 0.2] = [−0.19, 0.38]        p = [0.81, 2.38]
        // 2: p += [−0.126 − 0.05, 0.117 − 0.05] = [−0.176, 0.067]  p = [0.634, 2.447]
        // 3: p += [−0.0234 + 0.1, 0.1053] = [0.0766, 0.1053]       p = [0.7106, 2.5523]
        let mut opt = Sgd::new(0.1).momentum(0.9).nesterov(true);
        let got = run(&mut opt, &[1.0, 2.0], &GRADS);
        assert_close(&got[0], &[0.81, 2.38], 1e-6);
        assert_close(&got[1], &[0.634, 2.447], 1e-6);
        assert_close(&got[2], &[0.7106, 2.5523], 1e-6);
    }

    #[test]
    fn weight_decay_by_hand() {
        // lr 0.1, wd 0.5: p ← p·(1 − 0.05) − 0.1·g, g = 1, p0 = 2:
        // 1: 1.9 − 0.1 = 1.8;  2: 1.71 − 0.1 = 1.61
        let got = run(
            &mut Sgd::new(0.1).weight_decay(0.5),
            &[2.0],
            &[&[1.0], &[1.0]],
        );
        assert_close(&got[0], &[1.8], 1e-6);
        assert_close(&got[1], &[1.61], 1e-6);
        // With μ 0.9: m = −0.1, p = 1.9 − 0.1 = 1.8; m = −0.09 − 0.1 = −0.19,
        // p = 1.71 − 0.19 = 1.52.
        let mut opt = Sgd::new(0.1).momentum(0.9).weight_decay(0.5);
        let got = run(&mut opt, &[2.0], &[&[1.0], &[1.0]]);
        assert_close(&got[0], &[1.8], 1e-6);
        assert_close(&got[1], &[1.52], 1e-6);
    }

    #[test]
    fn matches_pytorch_momentum_for_a_constant_rate() {
        // PyTorch: b ← μ·b + g; p ← p − lr·b (Nesterov: p ← p − lr·(g + μ·b)).
        for nesterov in [false, true] {
            let (lr, mu) = (0.05, 0.8);
            let mut opt = Sgd::new(lr).momentum(mu).nesterov(nesterov);
            let mut params = vec![Tensor::from_slice(&[0.3f64, -1.2], &[2], Device::Cpu).unwrap()];
            let (mut p, mut b) = ([0.3f64, -1.2], [0.0f64; 2]);
            for k in 0..10 {
                let g = [(k as f64 * 0.7).sin(), (k as f64).cos() - 0.2];
                let gt = Tensor::from_slice(&g, &[2], Device::Cpu).unwrap();
                opt.step(&mut params, &[gt]).unwrap();
                for j in 0..2 {
                    b[j] = mu * b[j] + g[j];
                    p[j] -= lr * if nesterov { g[j] + mu * b[j] } else { b[j] };
                }
            }
            assert_close(&values(&params[0]), &p, 1e-12);
        }
    }

    #[test]
    fn state_uses_the_accumulation_dtype() {
        let mut opt = Sgd::new(0.1).momentum(0.5);
        let mut params = vec![t32(&[1.0]).to_dtype(DType::BF16).unwrap()];
        let grads = vec![t32(&[1.0]).to_dtype(DType::BF16).unwrap()];
        opt.step(&mut params, &grads).unwrap();
        let state = opt.state();
        assert_eq!(state[1].0, "0/momentum");
        assert_eq!(state[1].1.dtype(), DType::F32);
        assert_eq!(params[0].dtype(), DType::BF16);
        assert_close(&values(&params[0]), &[0.9], 1e-2);
    }

    #[test]
    fn invalid_momentum_is_an_error_not_a_panic() {
        let mut opt = Sgd::new(0.1).momentum(-0.5);
        let mut params = vec![t32(&[1.0])];
        let err = opt.step(&mut params, &[t32(&[1.0])]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sgd: momentum = -0.5 is invalid: expected a value in [0, 1]"
        );
        assert_eq!(values(&params[0]), vec![1.0]);
        assert_eq!(opt.iterations(), 0);
        let err = Sgd::new(-0.1)
            .step(&mut params, &[t32(&[1.0])])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "sgd: learning rate -0.1 for iteration 0 is invalid: expected a finite value >= 0"
        );
    }
}
