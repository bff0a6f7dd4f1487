//! RMSprop (Hinton's lecture 6e), optionally centered and with momentum, in Keras 3's form.
//!
//! Keras adds epsilon *inside* the square root and keeps the momentum buffer in parameter
//! units (it accumulates `lr·g/sqrt(·)`); PyTorch adds epsilon outside the root and
//! accumulates `g/(sqrt(·) + ε)`, multiplying by the rate at the end. mirra follows Keras
//! (and its defaults: rho 0.9, epsilon 1e-7), so runs compare with TensorFlow's.

use mirra_tensor::{FloatElement, Tensor, TensorError};

use crate::cuda::{cuda_error, DeviceUpdate};
use crate::hyperparams::{check_non_negative, check_positive, check_unit, check_unit_open};
#[cfg(test)]
use crate::optimizer::Optimizer;
use crate::optimizer::{cast, next_slot, Core, Rule};
use crate::{LearningRateSchedule, Result};

const NAME: &str = "rmsprop";

/// RMSprop; matches Keras 3's `keras.optimizers.RMSprop`.
///
/// With learning rate `lr` (from the schedule at the current iteration), decay `ρ`,
/// momentum `μ`, weight decay `wd`, and every state starting at zero, each element of a
/// parameter `p` with gradient `g` is updated:
///
/// ```text
/// p ← p·(1 − lr·wd)                          decoupled weight decay (Keras 3)
/// v ← ρ·v + (1 − ρ)·g²                       state slot "velocity"
/// centered:  a ← ρ·a + (1 − ρ)·g             state slot "average_gradient"
///            d = v − a² + ε
/// otherwise: d = v + ε
/// Δ = lr·g / sqrt(d)
/// μ > 0:     b ← μ·b + Δ;  p ← p − b         state slot "momentum"
/// μ = 0:     p ← p − Δ
/// ```
///
/// PyTorch's `torch.optim.RMSprop` (`alpha` is ρ) divides by `sqrt(v − a²) + ε` instead
/// and keeps `b ← μ·b + g/(…)`, `p ← p − lr·b`; for a constant rate only epsilon's
/// placement differs. Its defaults differ too (ρ 0.99, ε 1e-8).
///
/// Defaults (Keras): ρ 0.9, μ 0, ε 1e-7, not centered, no weight decay;
/// [`RmsProp::default`] uses Keras's learning rate 0.001. ρ must lie in `[0, 1)`, μ in
/// `[0, 1]`, ε finite and `> 0`, the weight decay finite and `>= 0`.
#[derive(Clone, Debug)]
pub struct RmsProp {
    core: Core,
    rho: f64,
    momentum: f64,
    epsilon: f64,
    centered: bool,
    weight_decay: f64,
}

impl RmsProp {
    /// RMSprop with a constant learning rate and Keras's defaults.
    pub fn new(learning_rate: f64) -> RmsProp {
        RmsProp {
            core: Core::new(NAME, learning_rate),
            rho: 0.9,
            momentum: 0.0,
            epsilon: 1e-7,
            centered: false,
            weight_decay: 0.0,
        }
    }

    /// Set ρ, the decay of the squared-gradient average (in `[0, 1)`).
    pub fn rho(mut self, rho: f64) -> RmsProp {
        self.rho = rho;
        self
    }

    /// Set the momentum `μ` (in `[0, 1]`).
    pub fn momentum(mut self, momentum: f64) -> RmsProp {
        self.momentum = momentum;
        self
    }

    /// Set ε (finite, `> 0`), added inside the square root.
    pub fn epsilon(mut self, epsilon: f64) -> RmsProp {
        self.epsilon = epsilon;
        self
    }

    /// Normalise by the estimated variance of the gradient rather than its second moment.
    pub fn centered(mut self, centered: bool) -> RmsProp {
        self.centered = centered;
        self
    }

    /// Set the decoupled weight decay (finite, `>= 0`).
    pub fn weight_decay(mut self, weight_decay: f64) -> RmsProp {
        self.weight_decay = weight_decay;
        self
    }

    /// Take the learning rate from a schedule instead of a constant.
    pub fn with_schedule(mut self, schedule: Box<dyn LearningRateSchedule>) -> RmsProp {
        self.core.set_schedule(schedule);
        self
    }
}

impl Default for RmsProp {
    /// Keras's defaults: learning rate 0.001.
    fn default() -> RmsProp {
        RmsProp::new(1e-3)
    }
}

/// The step's scalars (see [`RmsProp`]).
#[derive(Clone, Copy)]
pub(crate) struct Coeffs<A> {
    lr: A,
    rho: A,
    one_minus_rho: A,
    momentum: A,
    epsilon: A,
    decay: A,
    /// Whether the `average_gradient` slot exists.
    centered: bool,
}

impl Coeffs<f64> {
    fn to_acc<A: mirra_tensor::Element>(self) -> Coeffs<A> {
        Coeffs {
            lr: cast(self.lr),
            rho: cast(self.rho),
            one_minus_rho: cast(self.one_minus_rho),
            momentum: cast(self.momentum),
            epsilon: cast(self.epsilon),
            decay: cast(self.decay),
            centered: self.centered,
        }
    }
}

/// One parameter's update, instantiated for each combination of the optional slots.
fn update_variant<T: FloatElement, const CENTERED: bool, const MOMENTUM: bool>(
    p: &mut [T],
    g: &[T],
    slots: &mut std::slice::IterMut<'_, Tensor>,
    c: Coeffs<f64>,
) -> std::result::Result<(), TensorError> {
    let v = next_slot::<T::Acc>(slots)?;
    let a = if CENTERED {
        next_slot::<T::Acc>(slots)?
    } else {
        &mut []
    };
    let b = if MOMENTUM {
        next_slot::<T::Acc>(slots)?
    } else {
        &mut []
    };
    kernel::<T, CENTERED, MOMENTUM>(p, g, v, a, b, c.to_acc());
    Ok(())
}

/// The fused update (see [`RmsProp`] for the formula). `a` and `b` are only read when
/// `CENTERED` and `MOMENTUM` say they exist.
fn kernel<T: FloatElement, const CENTERED: bool, const MOMENTUM: bool>(
    p: &mut [T],
    g: &[T],
    v: &mut [T::Acc],
    a: &mut [T::Acc],
    b: &mut [T::Acc],
    c: Coeffs<T::Acc>,
) {
    mirra_tensor::vectorize(
        #[inline(always)]
        || {
            use num_traits::Float;
            let n = p.len();
            // Re-slicing to one length up front lets the compiler drop the bounds checks.
            let (g, v) = (&g[..n], &mut v[..n]);
            let a = &mut a[..if CENTERED { n } else { 0 }];
            let b = &mut b[..if MOMENTUM { n } else { 0 }];
            for i in 0..n {
                let gi = g[i].to_acc();
                v[i] = c.rho * v[i] + c.one_minus_rho * gi * gi;
                let d = if CENTERED {
                    a[i] = c.rho * a[i] + c.one_minus_rho * gi;
                    v[i] - a[i] * a[i] + c.epsilon
                } else {
                    v[i] + c.epsilon
                };
                let delta = c.lr * gi / Float::sqrt(d);
                let delta = if MOMENTUM {
                    b[i] = c.momentum * b[i] + delta;
                    b[i]
                } else {
                    delta
                };
                p[i] = T::from_acc(p[i].to_acc() * c.decay - delta);
            }
        },
    )
}

impl Rule for RmsProp {
    type Coeffs = Coeffs<f64>;

    fn core(&self) -> &Core {
        &self.core
    }

    fn core_mut(&mut self) -> &mut Core {
        &mut self.core
    }

    fn slot_names(&self) -> &'static [&'static str] {
        match (self.centered, self.momentum > 0.0) {
            (false, false) => &["velocity"],
            (true, false) => &["velocity", "average_gradient"],
            (false, true) => &["velocity", "momentum"],
            (true, true) => &["velocity", "average_gradient", "momentum"],
        }
    }

    fn check_hyperparameters(&self) -> Result<()> {
        check_unit_open(NAME, "rho", self.rho)?;
        check_unit(NAME, "momentum", self.momentum)?;
        check_positive(NAME, "epsilon", self.epsilon)?;
        check_non_negative(NAME, "weight_decay", self.weight_decay)
    }

    fn coeffs(&self, lr: f64) -> Coeffs<f64> {
        Coeffs {
            lr,
            rho: self.rho,
            one_minus_rho: 1.0 - self.rho,
            momentum: self.momentum,
            epsilon: self.epsilon,
            decay: 1.0 - lr * self.weight_decay,
            centered: self.centered,
        }
    }

    /// Picks the [`update_variant`] for the slots this configuration keeps.
    fn update<T: FloatElement>(
        p: &mut [T],
        g: &[T],
        s: &mut std::slice::IterMut<'_, Tensor>,
        c: Coeffs<f64>,
    ) -> std::result::Result<(), TensorError> {
        match (c.centered, c.momentum > 0.0) {
            (false, false) => update_variant::<T, false, false>(p, g, s, c),
            (true, false) => update_variant::<T, true, false>(p, g, s, c),
            (false, true) => update_variant::<T, false, true>(p, g, s, c),
            (true, true) => update_variant::<T, true, true>(p, g, s, c),
        }
    }

    /// The kernel takes a null address for a slot the configuration does not keep.
    fn update_on_device(
        u: &mut DeviceUpdate<'_>,
        c: Coeffs<f64>,
    ) -> std::result::Result<(), TensorError> {
        let v = u.next_slot()?;
        let a = if c.centered { u.next_slot()? } else { 0 };
        let b = if c.momentum > 0.0 { u.next_slot()? } else { 0 };
        mirra_cuda::launch!(u.rt, u.kernel("rmsprop"), u.len(), |l| {
            l.arg(&u.p)
                .arg(&u.g)
                .arg(&v)
                .arg(&a)
                .arg(&b)
                .arg(&u.n)
                .arg(&c.lr)
                .arg(&c.rho)
                .arg(&c.one_minus_rho)
                .arg(&c.epsilon)
                .arg(&c.momentum)
                .arg(&c.decay);
        })
        .map_err(cuda_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, t32, values};

    fn run(opt: &mut dyn Optimizer, p0: &[f32], grads: &[&[f32]]) -> Vec<f64> {
        let mut params = vec![t32(p0)];
        grads
            .iter()
            .flat_map(|g| {
                opt.step(&mut params, &[t32(g)]).unwrap();
                values(&params[0])
            })
            .collect()
    }

    /// lr 0.1, ρ 0.5 and a large ε 0.1 so that its placement shows; g = 1, 0.5, −1.
    fn small() -> RmsProp {
        RmsProp::new(0.1).rho(0.5).epsilon(0.1)
    }
    const GRADS: [&[f32]; 3] = [&[1.0], &[0.5], &[-1.0]];

    #[test]
    fn plain_by_hand() {
        // 1: v = 0.5·1 = 0.5;                  Δ = 0.1·1/sqrt(0.6) = 0.1290994;    p = 0.8709006
        // 2: v = 0.25 + 0.5·0.25 = 0.375;      Δ = 0.1·0.5/sqrt(0.475) = 0.0725476; p = 0.7983529
        // 3: v = 0.1875 + 0.5·1 = 0.6875;      Δ = −0.1/sqrt(0.7875) = −0.1126872;  p = 0.9110402
        let got = run(&mut small(), &[1.0], &GRADS);
        assert_close(&got, &[0.8709006, 0.7983529, 0.9110402], 1e-6);
    }

    #[test]
    fn centered_by_hand() {
        // 1: v = 0.5, a = 0.5, d = 0.5 − 0.25 + 0.1 = 0.35;    Δ = 0.1/sqrt(0.35) = 0.1690309
        //    p = 0.8309691
        // 2: v = 0.375, a = 0.25 + 0.25 = 0.5, d = 0.375 − 0.25 + 0.1 = 0.225
        //    Δ = 0.05/sqrt(0.225) = 0.1054093;                   p = 0.7255599
        // 3: v = 0.6875, a = 0.25 − 0.5 = −0.25, d = 0.6875 − 0.0625 + 0.1 = 0.725
        //    Δ = −0.1/sqrt(0.725) = −0.1174440;                  p = 0.8430039
        let got = run(&mut small().centered(true), &[1.0], &GRADS);
        assert_close(&got, &[0.8309691, 0.7255599, 0.8430039], 1e-6);
    }

    #[test]
    fn momentum_by_hand() {
        // μ 0.5, Δ as in the plain case: b = 0.1290994;                       p = 0.8709006
        // b = 0.0645497 + 0.0725476 = 0.1370973;                             p = 0.7338032
        // b = 0.0685487 − 0.1126872 = −0.0441386;                            p = 0.7779418
        let got = run(&mut small().momentum(0.5), &[1.0], &GRADS);
        assert_close(&got, &[0.8709006, 0.7338032, 0.7779418], 1e-6);
        // Centered with momentum, Δ as in the centered case:
        // b = 0.1690309, p = 0.8309691; b = 0.0845154 + 0.1054093 = 0.1899247, p = 0.6410445;
        // b = 0.0949623 − 0.1174440 = −0.0224817, p = 0.6635262
        let got = run(&mut small().momentum(0.5).centered(true), &[1.0], &GRADS);
        assert_close(&got, &[0.8309691, 0.6410445, 0.6635262], 1e-6);
    }

    #[test]
    fn weight_decay_by_hand() {
        // wd 0.5: p ← 0.95·p − Δ from p0 = 2: 1.9 − 0.1290994 = 1.7709006;
        // 1.7709006·0.95 − 0.0725476 = 1.6098079
        let got = run(&mut small().weight_decay(0.5), &[2.0], &GRADS[..2]);
        assert_close(&got, &[1.7709006, 1.6098079], 1e-6);
    }

    #[test]
    fn slots_follow_the_configuration() {
        let mut opt = small().momentum(0.5).centered(true);
        let mut params = vec![t32(&[1.0, 2.0])];
        opt.step(&mut params, &[t32(&[1.0, 1.0])]).unwrap();
        let names: Vec<_> = opt.state().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "iterations",
                "0/velocity",
                "0/average_gradient",
                "0/momentum"
            ]
        );
        assert_eq!(RmsProp::default().slot_names(), ["velocity"]);
        let err = RmsProp::new(0.1).rho(1.0).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "rmsprop: rho = 1 is invalid: expected a value in [0, 1)"
        );
    }
}
