//! Adam, AMSGrad and AdamW, in Keras 3's form.
//!
//! Keras folds both bias corrections into the step size and adds epsilon to the square
//! root of the *uncorrected* second moment ("epsilon hat" in Kingma & Ba, section 2);
//! PyTorch corrects the moments and adds epsilon to `sqrt(v̂)`. The two differ only in the
//! effective epsilon, by a factor `sqrt(1 − β₂ᵗ)`: negligible once `t` is large or when
//! `sqrt(v)` dwarfs epsilon. mirra follows Keras, whose defaults (epsilon 1e-7) it uses.
//! AdamW is the same update with decoupled weight decay on by default.

use mirra_tensor::{FloatElement, Tensor, TensorError};

use crate::cuda::{cuda_error, DeviceUpdate};
use crate::hyperparams::{check_non_negative, check_positive, check_unit_open};
#[cfg(test)]
use crate::optimizer::Optimizer;
use crate::optimizer::{cast, next_slot, Core, Rule};
use crate::{LearningRateSchedule, Result};

/// Adam (Kingma & Ba, 2015), optionally AMSGrad (Reddi et al., 2018) and decoupled weight
/// decay; matches Keras 3's `keras.optimizers.Adam`.
///
/// With learning rate `lr` (from the schedule at the current iteration), `t` the number of
/// this update (1 for the first), weight decay `wd`, and `m`, `v` (and `v̂`) starting at
/// zero, each element of a parameter `p` with gradient `g` is updated:
///
/// ```text
/// α ← lr · sqrt(1 − β₂ᵗ) / (1 − β₁ᵗ)
/// m ← m + (g − m)·(1 − β₁)             state slot "m"
/// v ← v + (g² − v)·(1 − β₂)            state slot "v"
/// v̂ ← max(v̂, v)                        AMSGrad only, state slot "vhat"
/// p ← p·(1 − lr·wd) − α·m / (sqrt(v) + ε)      (sqrt(v̂) with AMSGrad)
/// ```
///
/// PyTorch's `torch.optim.Adam` computes `p ← p − lr·m̂ / (sqrt(v̂) + ε)` with
/// `m̂ = m / (1 − β₁ᵗ)`, `v̂ = v / (1 − β₂ᵗ)`: the same update with epsilon scaled by
/// `sqrt(1 − β₂ᵗ)` (to match PyTorch exactly, use PyTorch's ε times that factor; they
/// coincide as `t` grows). PyTorch's Adam `weight_decay` is an L2 term added to the
/// gradient; the decoupled decay here is Keras 3's (and PyTorch's AdamW's), applied before
/// the Adam step.
///
/// Defaults (Keras): β₁ 0.9, β₂ 0.999, ε 1e-7, no AMSGrad, no weight decay;
/// [`Adam::default`] uses Keras's learning rate 0.001. The betas must lie in `[0, 1)`,
/// ε must be finite and `> 0`, the weight decay finite and `>= 0`; they are checked at
/// each step (and by [`Optimizer::validate`](crate::Optimizer::validate)).
#[derive(Clone, Debug)]
pub struct Adam {
    core: Core,
    beta1: f64,
    beta2: f64,
    epsilon: f64,
    amsgrad: bool,
    weight_decay: f64,
}

impl Adam {
    /// Adam with a constant learning rate and Keras's defaults.
    pub fn new(learning_rate: f64) -> Adam {
        Adam::named("adam", learning_rate, 0.0)
    }

    fn named(name: &'static str, learning_rate: f64, weight_decay: f64) -> Adam {
        Adam {
            core: Core::new(name, learning_rate),
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-7,
            amsgrad: false,
            weight_decay,
        }
    }

    /// Set β₁, the decay of the first moment (in `[0, 1)`).
    pub fn beta1(mut self, beta1: f64) -> Adam {
        self.beta1 = beta1;
        self
    }

    /// Set β₂, the decay of the second moment (in `[0, 1)`).
    pub fn beta2(mut self, beta2: f64) -> Adam {
        self.beta2 = beta2;
        self
    }

    /// Set ε (finite, `> 0`), added to `sqrt(v)` in Keras's placement.
    pub fn epsilon(mut self, epsilon: f64) -> Adam {
        self.epsilon = epsilon;
        self
    }

    /// Use the AMSGrad variant (keeps the running maximum of `v`).
    pub fn amsgrad(mut self, amsgrad: bool) -> Adam {
        self.amsgrad = amsgrad;
        self
    }

    /// Set the decoupled weight decay `wd` (finite, `>= 0`): `p ← p·(1 − lr·wd)` before
    /// each update.
    pub fn weight_decay(mut self, weight_decay: f64) -> Adam {
        self.weight_decay = weight_decay;
        self
    }

    /// Take the learning rate from a schedule instead of a constant.
    pub fn with_schedule(mut self, schedule: Box<dyn LearningRateSchedule>) -> Adam {
        self.core.set_schedule(schedule);
        self
    }
}

impl Default for Adam {
    /// Keras's defaults: learning rate 0.001.
    fn default() -> Adam {
        Adam::new(1e-3)
    }
}

/// The step's scalars (see [`Adam`]).
#[derive(Clone, Copy)]
pub(crate) struct Coeffs<A> {
    alpha: A,
    one_minus_beta1: A,
    one_minus_beta2: A,
    epsilon: A,
    decay: A,
}

impl Coeffs<f64> {
    fn to_acc<A: mirra_tensor::Element>(self) -> Coeffs<A> {
        Coeffs {
            alpha: cast(self.alpha),
            one_minus_beta1: cast(self.one_minus_beta1),
            one_minus_beta2: cast(self.one_minus_beta2),
            epsilon: cast(self.epsilon),
            decay: cast(self.decay),
        }
    }
}

/// The fused update over one parameter.
fn kernel<T: FloatElement>(
    p: &mut [T],
    g: &[T],
    m: &mut [T::Acc],
    v: &mut [T::Acc],
    vhat: &mut [T::Acc],
    c: Coeffs<T::Acc>,
) {
    mirra_tensor::vectorize(
        #[inline(always)]
        || {
            debug_assert!(p.len() == g.len() && p.len() == m.len() && p.len() == v.len());
            let it = p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut());
            if vhat.is_empty() {
                for (((p, &g), m), v) in it {
                    element(p, g, m, v, None, &c);
                }
            } else {
                debug_assert_eq!(vhat.len(), g.len());
                for ((((p, &g), m), v), vhat) in it.zip(vhat.iter_mut()) {
                    element(p, g, m, v, Some(vhat), &c);
                }
            }
        },
    )
}

/// The update of one element (see [`Adam`] for the formula).
#[inline(always)]
fn element<T: FloatElement>(
    p: &mut T,
    g: T,
    m: &mut T::Acc,
    v: &mut T::Acc,
    vhat: Option<&mut T::Acc>,
    c: &Coeffs<T::Acc>,
) {
    use num_traits::Float;
    let g = g.to_acc();
    *m = *m + (g - *m) * c.one_minus_beta1;
    *v = *v + (g * g - *v) * c.one_minus_beta2;
    let second = match vhat {
        Some(h) => {
            *h = Float::max(*h, *v);
            *h
        }
        None => *v,
    };
    let decayed = p.to_acc() * c.decay;
    *p = T::from_acc(decayed - *m * c.alpha / (Float::sqrt(second) + c.epsilon));
}

impl Rule for Adam {
    type Coeffs = Coeffs<f64>;

    fn core(&self) -> &Core {
        &self.core
    }

    fn core_mut(&mut self) -> &mut Core {
        &mut self.core
    }

    fn slot_names(&self) -> &'static [&'static str] {
        if self.amsgrad {
            &["m", "v", "vhat"]
        } else {
            &["m", "v"]
        }
    }

    fn check_hyperparameters(&self) -> Result<()> {
        let name = self.core.name;
        check_unit_open(name, "beta1", self.beta1)?;
        check_unit_open(name, "beta2", self.beta2)?;
        check_positive(name, "epsilon", self.epsilon)?;
        check_non_negative(name, "weight_decay", self.weight_decay)
    }

    fn coeffs(&self, lr: f64) -> Coeffs<f64> {
        // The update's number t, as a float: exact below 2^53 steps.
        let t = (self.core.iterations() + 1) as f64;
        Coeffs {
            alpha: lr * (1.0 - self.beta2.powf(t)).sqrt() / (1.0 - self.beta1.powf(t)),
            one_minus_beta1: 1.0 - self.beta1,
            one_minus_beta2: 1.0 - self.beta2,
            epsilon: self.epsilon,
            decay: 1.0 - lr * self.weight_decay,
        }
    }

    /// An empty `vhat` slot means plain Adam.
    fn update<T: FloatElement>(
        p: &mut [T],
        g: &[T],
        slots: &mut std::slice::IterMut<'_, Tensor>,
        c: Coeffs<f64>,
    ) -> std::result::Result<(), TensorError> {
        let m = next_slot::<T::Acc>(slots)?;
        let v = next_slot::<T::Acc>(slots)?;
        let vhat = next_slot::<T::Acc>(slots)?;
        kernel::<T>(p, g, m, v, vhat, c.to_acc());
        Ok(())
    }

    fn update_on_device(
        u: &mut DeviceUpdate<'_>,
        c: Coeffs<f64>,
    ) -> std::result::Result<(), TensorError> {
        let (m, v, vhat) = (u.next_slot()?, u.next_slot()?, u.next_slot()?);
        mirra_cuda::launch!(u.rt, u.kernel("adam"), u.len(), |l| {
            l.arg(&u.p)
                .arg(&u.g)
                .arg(&m)
                .arg(&v)
                .arg(&vhat)
                .arg(&u.n)
                .arg(&c.alpha)
                .arg(&c.one_minus_beta1)
                .arg(&c.one_minus_beta2)
                .arg(&c.epsilon)
                .arg(&c.decay);
        })
        .map_err(cuda_error)
    }
}

/// AdamW (Loshchilov & Hutter, 2019): [`Adam`] with decoupled weight decay on by default;
/// matches Keras 3's `keras.optimizers.AdamW`.
///
/// The update is exactly [`Adam`]'s, including the decay term `p ← p·(1 − lr·wd)` applied
/// before the Adam step (the decay is multiplied by the learning rate, as in Keras and
/// PyTorch, not by a separate schedule multiplier). The default weight decay is Keras's
/// 0.004; PyTorch's `torch.optim.AdamW` defaults to 0.01 (and ε 1e-8 in its placement,
/// see [`Adam`]): call `.weight_decay(0.01)` to match its defaults. State slots are
/// Adam's (`"m"`, `"v"`, `"vhat"`).
#[derive(Clone, Debug)]
pub struct AdamW {
    inner: Adam,
}

impl AdamW {
    /// Keras's default weight decay.
    pub const DEFAULT_WEIGHT_DECAY: f64 = 0.004;

    /// AdamW with a constant learning rate, Keras's defaults and weight decay 0.004.
    pub fn new(learning_rate: f64) -> AdamW {
        AdamW {
            inner: Adam::named("adamw", learning_rate, AdamW::DEFAULT_WEIGHT_DECAY),
        }
    }

    /// Set β₁ (in `[0, 1)`).
    pub fn beta1(self, beta1: f64) -> AdamW {
        AdamW {
            inner: self.inner.beta1(beta1),
        }
    }

    /// Set β₂ (in `[0, 1)`).
    pub fn beta2(self, beta2: f64) -> AdamW {
        AdamW {
            inner: self.inner.beta2(beta2),
        }
    }

    /// Set ε (finite, `> 0`).
    pub fn epsilon(self, epsilon: f64) -> AdamW {
        AdamW {
            inner: self.inner.epsilon(epsilon),
        }
    }

    /// Use the AMSGrad variant.
    pub fn amsgrad(self, amsgrad: bool) -> AdamW {
        AdamW {
            inner: self.inner.amsgrad(amsgrad),
        }
    }

    /// Set the decoupled weight decay (finite, `>= 0`).
    pub fn weight_decay(self, weight_decay: f64) -> AdamW {
        AdamW {
            inner: self.inner.weight_decay(weight_decay),
        }
    }

    /// Take the learning rate from a schedule instead of a constant.
    pub fn with_schedule(self, schedule: Box<dyn LearningRateSchedule>) -> AdamW {
        AdamW {
            inner: self.inner.with_schedule(schedule),
        }
    }
}

impl Default for AdamW {
    /// Keras's defaults: learning rate 0.001, weight decay 0.004.
    fn default() -> AdamW {
        AdamW::new(1e-3)
    }
}

/// AdamW is its inner [`Adam`] under another name.
impl Rule for AdamW {
    type Coeffs = Coeffs<f64>;

    fn core(&self) -> &Core {
        self.inner.core()
    }

    fn core_mut(&mut self) -> &mut Core {
        self.inner.core_mut()
    }

    fn slot_names(&self) -> &'static [&'static str] {
        self.inner.slot_names()
    }

    fn check_hyperparameters(&self) -> Result<()> {
        self.inner.check_hyperparameters()
    }

    fn coeffs(&self, lr: f64) -> Coeffs<f64> {
        self.inner.coeffs(lr)
    }

    fn update<T: FloatElement>(
        p: &mut [T],
        g: &[T],
        slots: &mut std::slice::IterMut<'_, Tensor>,
        c: Coeffs<f64>,
    ) -> std::result::Result<(), TensorError> {
        Adam::update(p, g, slots, c)
    }

    fn update_on_device(
        u: &mut DeviceUpdate<'_>,
        c: Coeffs<f64>,
    ) -> std::result::Result<(), TensorError> {
        Adam::update_on_device(u, c)
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};
    use mirra_tensor::{DType, Device};

    use super::*;
    use crate::testutil::{assert_close, t32, values};
    use crate::{OptimError, Sgd};

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

    /// lr 0.1, β₁ 0.5, β₂ 0.75 and a large ε 0.1, so that epsilon's placement shows.
    fn small() -> Adam {
        Adam::new(0.1).beta1(0.5).beta2(0.75).epsilon(0.1)
    }

    #[test]
    fn adam_by_hand() {
        // p0 = [1, −1], g = [1, −0.5], [2, 0.5], [−1, 0].
        // t=1: α = 0.1·sqrt(1 − 0.75)/(1 − 0.5) = 0.1
        //   e0: m = 0.5, v = 0.25;    p = 1 − 0.1·0.5/(0.5 + 0.1) = 0.9166667
        //   e1: m = −0.25, v = 0.0625; p = −1 + 0.1·0.25/(0.25 + 0.1) = −0.9285714
        //   (PyTorch's placement would give 1 − 0.1·1/(1 + 0.1) = 0.9090909 for e0.)
        // t=2: α = 0.1·sqrt(1 − 0.5625)/(1 − 0.25) = 0.0881917
        //   e0: m = 0.5 + 1.5·0.5 = 1.25, v = 0.25 + 3.75·0.25 = 1.1875
        //       p = 0.9166667 − 0.0881917·1.25/(1.0897247 + 0.1) = 0.8240069
        //   e1: m = −0.25 + 0.75·0.5 = 0.125, v = 0.0625 + 0.1875·0.25 = 0.109375
        //       p = −0.9285714 − 0.0881917·0.125/(0.3307189 + 0.1) = −0.9541658
        // t=3: α = 0.1·sqrt(1 − 0.421875)/(1 − 0.125) = 0.0868966
        //   e0: m = 1.25 − 2.25·0.5 = 0.125, v = 1.1875 − 0.1875·0.25 = 1.140625
        //       p = 0.8240069 − 0.0868966·0.125/(1.0680005 + 0.1) = 0.8147072
        //   e1: m = 0.0625, v = 0.08203125
        //       p = −0.9541658 − 0.0868966·0.0625/(0.2864110 + 0.1) = −0.9682208
        let got = run(
            &mut small(),
            &[1.0, -1.0],
            &[&[1.0, -0.5], &[2.0, 0.5], &[-1.0, 0.0]],
        );
        assert_close(&got[0], &[0.9166667, -0.9285714], 1e-6);
        assert_close(&got[1], &[0.8240069, -0.9541658], 1e-6);
        assert_close(&got[2], &[0.8147072, -0.9682208], 1e-6);
    }

    #[test]
    fn amsgrad_by_hand() {
        // p0 = 1, g = 2 then 0.1.
        // t=1: m = 1, v = 1, v̂ = 1; p = 1 − 0.1·1/(1 + 0.1) = 0.9090909
        // t=2: m = 1 − 0.9·0.5 = 0.55, v = 1 − 0.99·0.25 = 0.7525, v̂ = max(1, 0.7525) = 1
        //      p = 0.9090909 − 0.0881917·0.55/(1 + 0.1) = 0.8649951
        //      (plain Adam: /(sqrt(0.7525) + 0.1) = 0.8589544)
        let got = run(&mut small().amsgrad(true), &[1.0], &[&[2.0], &[0.1]]);
        assert_close(&got[0], &[0.9090909], 1e-6);
        assert_close(&got[1], &[0.8649951], 1e-6);
        let got = run(&mut small(), &[1.0], &[&[2.0], &[0.1]]);
        assert_close(&got[1], &[0.8589544], 1e-6);
    }

    #[test]
    fn adamw_decoupled_decay_by_hand() {
        // wd 0.5, lr 0.1: p ← 0.95·p before the Adam step; p0 = 2, g = 1 twice.
        // t=1: m = 0.5, v = 0.25, α = 0.1;  p = 1.9 − 0.1·0.5/0.6 = 1.8166667
        // t=2: m = 0.75, v = 0.4375, α = 0.0881917
        //      p = 1.8166667·0.95 − 0.0881917·0.75/(0.6614378 + 0.1) = 1.6389664
        let mut opt = AdamW::new(0.1)
            .beta1(0.5)
            .beta2(0.75)
            .epsilon(0.1)
            .weight_decay(0.5);
        assert_eq!(opt.name(), "adamw");
        let got = run(&mut opt, &[2.0], &[&[1.0], &[1.0]]);
        assert_close(&got[0], &[1.8166667], 1e-6);
        assert_close(&got[1], &[1.6389664], 1e-6);
        // Adam with the same decay is the same optimizer.
        let got = run(&mut small().weight_decay(0.5), &[2.0], &[&[1.0], &[1.0]]);
        assert_close(&got[1], &[1.6389664], 1e-6);
    }

    #[test]
    fn defaults_are_keras() {
        let a = Adam::default();
        assert_eq!((a.beta1, a.beta2, a.epsilon), (0.9, 0.999, 1e-7));
        assert_eq!(a.learning_rate(), 1e-3);
        assert_eq!(AdamW::default().inner.weight_decay, 0.004);
    }

    #[test]
    fn minimises_a_parabola() {
        // f(x) = (x − 3)², f'(x) = 2(x − 3).
        let mut opt = Adam::new(0.1);
        let mut x = vec![Tensor::from_slice(&[0.0f32], &[1], Device::Cpu).unwrap()];
        for _ in 0..500 {
            let v = x[0].to_vec::<f32>().unwrap()[0];
            opt.step(&mut x, &[t32(&[2.0 * (v - 3.0)])]).unwrap();
        }
        let v = x[0].to_vec::<f32>().unwrap()[0];
        assert!((v - 3.0).abs() < 1e-2, "x = {v}");
    }

    #[test]
    fn sixteen_bit_parameters_follow_the_f32_run() {
        for dtype in [DType::F16, DType::BF16] {
            let p0 = [1.0f32, -0.5, 2.0, 0.25];
            let mut p32 = vec![t32(&p0)];
            let mut p16 = vec![t32(&p0).to_dtype(dtype).unwrap()];
            let (mut a32, mut a16) = (Adam::new(0.01), Adam::new(0.01));
            for k in 0..20 {
                // Gradients of a fixed sign per element, varying in size.
                let g: Vec<f32> = (0..4)
                    .map(|j| (1.0 + 0.5 * ((k + j) as f32 * 0.9).sin()) * [1.0, -1.0][j % 2])
                    .collect();
                a32.step(&mut p32, &[t32(&g)]).unwrap();
                a16.step(&mut p16, &[t32(&g).to_dtype(dtype).unwrap()])
                    .unwrap();
            }
            assert_eq!(p16[0].dtype(), dtype);
            let state = a16.state();
            assert!(state[1..].iter().all(|(_, t)| t.dtype() == DType::F32));
            let (got, want) = (values(&p16[0]), values(&p32[0]));
            // Moved from the start, and within a few 16-bit roundings of the f32 run.
            assert!(got
                .iter()
                .zip(&p0)
                .all(|(a, &b)| (a - b as f64).abs() > 0.05));
            let tol = if dtype == DType::F16 { 1e-2 } else { 5e-2 };
            assert_close(&got, &want, tol);
        }
        // Single updates too small for bf16 near 1 are lost, not corrupted.
        let mut p = vec![Tensor::from_slice(&[bf16::ONE], &[1], Device::Cpu).unwrap()];
        let g = Tensor::from_slice(&[bf16::ONE], &[1], Device::Cpu).unwrap();
        Adam::new(1e-4).step(&mut p, &[g]).unwrap();
        assert_eq!(p[0].to_vec::<bf16>().unwrap(), vec![bf16::ONE]);
        let mut p = vec![Tensor::from_slice(&[f16::ONE], &[1], Device::Cpu).unwrap()];
        let g = Tensor::from_slice(&[f16::ONE], &[1], Device::Cpu).unwrap();
        Adam::new(1e-2).step(&mut p, &[g]).unwrap();
        assert!((p[0].to_vec::<f16>().unwrap()[0].to_f32() - 0.99).abs() < 1e-3);
    }

    #[test]
    fn f64_parameters_keep_f64_state() {
        let mut p = vec![Tensor::from_slice(&[1.0f64], &[1], Device::Cpu).unwrap()];
        let g = Tensor::from_slice(&[0.5f64], &[1], Device::Cpu).unwrap();
        let mut opt = Adam::new(0.1);
        opt.step(&mut p, &[g]).unwrap();
        assert!(opt.state()[1..]
            .iter()
            .all(|(_, t)| t.dtype() == DType::F64));
        // First step: α·m/(sqrt(v) + ε) = 0.1·sqrt(0.001)/0.1·0.05/(sqrt(0.00025) + 1e-7).
        let want = 1.0 - 0.1 * 0.001f64.sqrt() / 0.1 * 0.05 / (0.00025f64.sqrt() + 1e-7);
        assert!((p[0].to_vec::<f64>().unwrap()[0] - want).abs() < 1e-15);
    }

    #[test]
    fn mismatches_name_the_parameter() {
        let mut opt = Adam::new(0.1);
        let mut params = vec![t32(&[1.0]), t32(&[1.0, 2.0])];
        let bad_dtype = [t32(&[1.0]), t32(&[1.0, 2.0]).to_dtype(DType::F64).unwrap()];
        let err = opt.step(&mut params, &bad_dtype).unwrap_err();
        assert!(matches!(err, OptimError::DTypeMismatch { index: 1, .. }));
        assert_eq!(
            err.to_string(),
            "adam: parameter 1 has dtype f32 but its gradient has dtype f64"
        );
        let bad_shape = [t32(&[1.0]), t32(&[1.0, 2.0, 3.0])];
        let err = opt.step(&mut params, &bad_shape).unwrap_err();
        assert_eq!(
            err.to_string(),
            "adam: parameter 1 has shape [2] but its gradient has shape [3]"
        );
        let err = opt.step(&mut params, &bad_shape[..1]).unwrap_err();
        assert_eq!(err.to_string(), "adam: 2 parameters but 1 gradients");
        let mut ints = vec![Tensor::from_slice(&[1i64], &[1], Device::Cpu).unwrap()];
        let int_grads = ints.clone();
        let err = opt.step(&mut ints, &int_grads).unwrap_err();
        assert_eq!(
            err.to_string(),
            "adam: tensor 0 has dtype i64; only f32, f64, f16 and bf16 are supported"
        );
        // Nothing moved, nothing counted.
        assert_eq!(opt.iterations(), 0);
        assert_eq!(values(&params[1]), vec![1.0, 2.0]);
        assert!(opt.state().len() == 1);
        // State, once created, pins the parameter list.
        opt.step(&mut params, &[t32(&[1.0]), t32(&[1.0, 1.0])])
            .unwrap();
        let mut fewer = vec![t32(&[1.0])];
        let err = opt.step(&mut fewer, &[t32(&[1.0])]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "adam: optimizer state does not fit the parameters: the state holds 2 parameters but 1 were given"
        );
    }

    #[test]
    fn invalid_hyperparameters_are_errors() {
        let mut params = vec![t32(&[1.0])];
        let grads = [t32(&[1.0])];
        for (opt, msg) in [
            (
                Adam::new(0.1).beta1(1.0),
                "adam: beta1 = 1 is invalid: expected a value in [0, 1)",
            ),
            (
                Adam::new(0.1).beta2(-0.1),
                "adam: beta2 = -0.1 is invalid: expected a value in [0, 1)",
            ),
            (
                Adam::new(0.1).epsilon(0.0),
                "adam: epsilon = 0 is invalid: expected a finite value > 0",
            ),
            (
                Adam::new(f64::NAN),
                "adam: learning rate NaN for iteration 0 is invalid: expected a finite value >= 0",
            ),
        ] {
            let mut opt = opt;
            assert_eq!(opt.step(&mut params, &grads).unwrap_err().to_string(), msg);
        }
        assert!(AdamW::new(0.1).weight_decay(-1.0).validate().is_err());
    }

    #[test]
    fn strided_gradients_and_shared_parameters_are_handled() {
        // A transposed gradient is read in the parameter's (row-major) order, and a
        // parameter whose buffer is shared is copied before the write.
        let mut opt = Sgd::new(1.0);
        let p = Tensor::from_slice(&[0.0f32; 4], &[2, 2], Device::Cpu).unwrap();
        let keep = p.clone();
        let mut params = vec![p];
        let g = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        opt.step(&mut params, &[g]).unwrap();
        assert_eq!(values(&params[0]), vec![-1.0, -3.0, -2.0, -4.0]);
        assert_eq!(values(&keep), vec![0.0; 4]);
    }

    proptest::proptest! {
        /// Whatever the gradient, Adam's first step moves each coordinate by lr against
        /// its gradient's sign (up to epsilon): α·|m|/sqrt(v) = lr at t = 1.
        #[test]
        fn first_step_moves_by_the_learning_rate(
            // |g| >= 0.1 keeps ε's share below 1e-7/(0.1·sqrt(0.001)) ≈ 3e-5.
            g in proptest::collection::vec(0.1f32..100.0, 1..16),
            negate in proptest::bool::ANY,
            lr in 1e-4f64..1.0,
        ) {
            let g: Vec<f32> = g.iter().map(|x| if negate { -x } else { *x }).collect();
            let mut p = vec![t32(&vec![0.0; g.len()])];
            Adam::new(lr).step(&mut p, &[t32(&g)]).unwrap();
            for (x, g) in values(&p[0]).iter().zip(&g) {
                proptest::prop_assert!((x + lr * g.signum() as f64).abs() <= 1e-4 * lr);
            }
        }
    }
}
