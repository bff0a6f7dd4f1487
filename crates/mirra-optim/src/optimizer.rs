//! The [`Optimizer`] trait and the bookkeeping every optimizer shares.
//!
//! The concrete optimizers differ only in their hyperparameters, the names of their
//! per-parameter state tensors ("slots") and their element-wise kernel: that is all a
//! [`Rule`] says. Everything else, which is where the subtle bugs live (input checks, lazy
//! state creation, the learning rate of a step, the loop over the parameters with its
//! dtype dispatch, checkpoint export and import), is written once here, in [`Core`] and in
//! the one implementation of [`Optimizer`] for every [`Rule`].

use std::fmt;
use std::sync::Arc;

use mirra_tensor::{DType, Device, Element, FloatElement, Tensor, TensorError};

use crate::cuda::DeviceUpdate;
use crate::schedule::{Constant, LearningRateSchedule};
use crate::{OptimError, Result};

/// A gradient-descent optimizer over a fixed, ordered list of parameters.
///
/// The caller hands [`Optimizer::step`] the parameters and their gradients as parallel
/// slices, in the same order at every step; the optimizer keeps its per-parameter state by
/// position. Implementations are `Send` so a training loop can move them to a worker
/// thread, and `Debug` so models holding a `Box<dyn Optimizer>` can derive it.
///
/// This crate implements it for [`Sgd`](crate::Sgd), [`Adam`](crate::Adam),
/// [`AdamW`](crate::AdamW) and [`RmsProp`](crate::RmsProp).
pub trait Optimizer: Send + fmt::Debug {
    /// Apply one update in place: `params[i]` is updated from `grads[i]` and the state
    /// of parameter `i`, then the iteration count is incremented.
    ///
    /// Everything is checked before any parameter is written: the two slices have the same
    /// length, each gradient has its parameter's shape, dtype and device, the dtypes are
    /// floats, the hyperparameters and this step's learning rate are valid and the state
    /// (if any) fits the parameters. An error names the optimizer and the parameter index,
    /// and leaves parameters, state and iteration count unchanged.
    fn step(&mut self, params: &mut [Tensor], grads: &[Tensor]) -> Result<()>;

    /// The learning rate the next step will use: the schedule evaluated at
    /// [`Optimizer::iterations`].
    fn learning_rate(&self) -> f64;

    /// Replace the learning rate (and any schedule) by the constant `lr`, as a
    /// `LearningRateScheduler` callback does at the start of an epoch. An invalid value
    /// (negative, infinite, NaN) is reported by the next [`Optimizer::step`].
    fn set_learning_rate(&mut self, lr: f64);

    /// The number of updates applied so far (Keras's `optimizer.iterations`).
    fn iterations(&self) -> u64;

    /// The optimizer's state, named for a checkpoint: `"iterations"` (a scalar i64), then
    /// for each parameter `i` in order its slots `"{i}/{slot}"` (for example `"0/m"`,
    /// `"0/v"`). Before the first step there are no slots yet.
    ///
    /// The tensors share their buffers with the optimizer (a cheap clone); the next step
    /// copies a buffer that is still shared before updating it, so an exported state is
    /// never changed afterwards.
    fn state(&self) -> Vec<(String, Tensor)>;

    /// Restore a state exported by [`Optimizer::state`] of an optimizer of the same kind
    /// and configuration. Every entry is checked before anything changes: `"iterations"`
    /// must be present, every slot of every parameter up to the highest index must be
    /// present exactly once, and no other entry may appear. Shapes are checked against the
    /// parameters at the next step; state of another float dtype is converted then.
    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()>;

    /// An independent copy with the same configuration and state (one per replica of a
    /// mirrored model).
    fn box_clone(&self) -> Box<dyn Optimizer>;

    /// What the loss is multiplied by before backward (and the gradients divided by
    /// before the update) behind a [`LossScaleOptimizer`](crate::LossScaleOptimizer);
    /// `None` for an optimizer without loss scaling.
    fn loss_scale(&self) -> Option<f64> {
        None
    }

    /// The optimizer's name (`"sgd"`, `"adam"`, `"adamw"`, `"rmsprop"`).
    fn name(&self) -> &'static str;

    /// Check the hyperparameters without stepping (a `compile` can call it to fail
    /// early). [`Optimizer::step`] runs the same checks.
    fn validate(&self) -> Result<()> {
        Ok(())
    }
}

/// What one optimizer adds to the bookkeeping every optimizer shares: the checks of its
/// hyperparameters, the slots its configuration keeps, the scalars of a step and the
/// element-wise kernel. [`Optimizer`] is implemented once for every `Rule`, below.
pub(crate) trait Rule: Clone + Send + fmt::Debug + 'static {
    /// The step's scalars, computed in f64 by [`Rule::coeffs`]; [`Rule::update`] rounds
    /// them to the accumulation type once per parameter.
    type Coeffs: Copy;

    /// The shared bookkeeping.
    fn core(&self) -> &Core;

    /// The shared bookkeeping, mutably.
    fn core_mut(&mut self) -> &mut Core;

    /// The slots this configuration keeps per parameter, in the order [`Rule::update`]
    /// takes them.
    fn slot_names(&self) -> &'static [&'static str];

    /// Checks the hyperparameters (see [`Optimizer::validate`]).
    fn check_hyperparameters(&self) -> Result<()>;

    /// The scalars of the next step, whose learning rate is `lr`.
    fn coeffs(&self, lr: f64) -> Self::Coeffs;

    /// Updates one parameter `p` in place from its gradient `g` (contiguous, of `p`'s
    /// length) and its slots, taken with [`next_slot`] in [`Rule::slot_names`] order.
    fn update<T: FloatElement>(
        p: &mut [T],
        g: &[T],
        slots: &mut std::slice::IterMut<'_, Tensor>,
        c: Self::Coeffs,
    ) -> std::result::Result<(), TensorError>;

    /// Updates one parameter on a CUDA device with the rule's fused kernel
    /// (`mirra-cuda/kernels/optim.cu`), the same formula as [`Rule::update`]; the slots are
    /// taken with [`DeviceUpdate::next_slot`] in [`Rule::slot_names`] order.
    fn update_on_device(
        u: &mut DeviceUpdate<'_>,
        c: Self::Coeffs,
    ) -> std::result::Result<(), TensorError>;
}

impl<R: Rule> Optimizer for R {
    fn step(&mut self, params: &mut [Tensor], grads: &[Tensor]) -> Result<()> {
        self.check_hyperparameters()?;
        let slot_names = self.slot_names();
        let lr = self.core_mut().begin_step(params, grads, slot_names)?;
        let coeffs = self.coeffs(lr);
        let core = self.core_mut();
        let name = core.name;
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            let slots = core.slots_mut(i);
            if p.device().is_cpu() {
                with_float!(name, i, p.dtype(), T => {
                    update_param::<R, T>(p, g, slots, coeffs).map_err(at(name, i))
                })?;
            } else {
                if !p.dtype().is_float() {
                    return Err(OptimError::UnsupportedDType {
                        op: name,
                        index: i,
                        dtype: p.dtype(),
                    });
                }
                DeviceUpdate::new(p, g, slots)
                    .and_then(|mut u| R::update_on_device(&mut u, coeffs))
                    .map_err(at(name, i))?;
            }
        }
        core.end_step();
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.core().learning_rate()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.core_mut().set_learning_rate(lr);
    }

    fn iterations(&self) -> u64 {
        self.core().iterations()
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.core().state(self.slot_names())
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let slot_names = self.slot_names();
        self.core_mut().load_state(state, slot_names)
    }

    fn box_clone(&self) -> Box<dyn Optimizer> {
        Box::new(self.clone())
    }

    fn name(&self) -> &'static str {
        self.core().name
    }

    fn validate(&self) -> Result<()> {
        self.check_hyperparameters()
    }
}

/// One parameter's update by `R`'s kernel, as element type `T`.
fn update_param<R: Rule, T: FloatElement>(
    p: &mut Tensor,
    g: &Tensor,
    slots: &mut [Tensor],
    c: R::Coeffs,
) -> std::result::Result<(), TensorError> {
    let g = g.contiguous()?;
    let g = g.as_slice::<T>()?;
    R::update::<T>(p.data_mut::<T>()?, g, &mut slots.iter_mut(), c)
}

/// The state every optimizer keeps besides its hyperparameters.
/// Cloning shares the schedule (it is immutable) and the slot buffers (the next step
/// copies a shared buffer before updating it), so a clone is an independent optimizer.
#[derive(Clone, Debug)]
pub(crate) struct Core {
    /// The optimizer's name, used in every error.
    pub(crate) name: &'static str,
    schedule: Arc<dyn LearningRateSchedule>,
    iterations: u64,
    /// Per parameter, its slot tensors in the order of the optimizer's slot names. Empty
    /// until the first step or a load.
    slots: Vec<Vec<Tensor>>,
}

impl Core {
    /// Bookkeeping for a new optimizer with a constant rate.
    pub(crate) fn new(name: &'static str, lr: f64) -> Core {
        Core {
            name,
            schedule: Arc::new(Constant(lr)),
            iterations: 0,
            slots: Vec::new(),
        }
    }

    /// Replace the schedule.
    pub(crate) fn set_schedule(&mut self, schedule: Box<dyn LearningRateSchedule>) {
        self.schedule = Arc::from(schedule);
    }

    /// The rate of the next step.
    fn learning_rate(&self) -> f64 {
        self.schedule.lr(self.iterations)
    }

    /// Replace the schedule by a constant.
    fn set_learning_rate(&mut self, lr: f64) {
        self.schedule = Arc::new(Constant(lr));
    }

    /// Updates applied so far.
    pub(crate) fn iterations(&self) -> u64 {
        self.iterations
    }

    /// Checks the inputs, makes sure the state exists and fits, and returns this step's
    /// learning rate. Nothing a caller can see changes unless it succeeds.
    fn begin_step(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
        slot_names: &[&str],
    ) -> Result<f64> {
        let lr = self.learning_rate();
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(OptimError::InvalidLearningRate {
                op: self.name,
                iteration: self.iterations,
                lr,
            });
        }
        check_inputs(self.name, params, grads)?;
        self.ensure_slots(params, slot_names)?;
        Ok(lr)
    }

    /// The slots of parameter `index` (empty for an optimizer without state).
    fn slots_mut(&mut self, index: usize) -> &mut [Tensor] {
        match self.slots.get_mut(index) {
            Some(s) => s,
            None => &mut [],
        }
    }

    /// Count a completed step.
    fn end_step(&mut self) {
        self.iterations += 1;
    }

    /// Creates the slots as zeros on first use; afterwards checks they fit the parameters
    /// and converts state loaded in another float dtype to the parameter's state dtype.
    fn ensure_slots(&mut self, params: &[Tensor], slot_names: &[&str]) -> Result<()> {
        if slot_names.is_empty() {
            return Ok(());
        }
        if self.slots.is_empty() {
            self.slots = params
                .iter()
                .map(|p| {
                    let dtype = state_dtype(p.dtype());
                    slot_names
                        .iter()
                        .map(|_| Tensor::zeros(p.shape(), dtype, p.device()))
                        .collect::<std::result::Result<Vec<_>, _>>()
                })
                .collect::<std::result::Result<_, _>>()?;
            return Ok(());
        }
        let op = self.name;
        let mismatch = |msg: String| OptimError::StateMismatch { op, msg };
        if self.slots.len() != params.len() {
            return Err(mismatch(format!(
                "the state holds {} parameters but {} were given",
                self.slots.len(),
                params.len()
            )));
        }
        for (i, (p, slots)) in params.iter().zip(&self.slots).enumerate() {
            if slots.len() != slot_names.len() {
                return Err(mismatch(format!(
                    "parameter {i} has {} state tensors, expected {} ({})",
                    slots.len(),
                    slot_names.len(),
                    slot_names.join(", ")
                )));
            }
            for (name, t) in slot_names.iter().zip(slots) {
                if t.shape() != p.shape() {
                    return Err(mismatch(format!(
                        "state `{i}/{name}` has shape {} but parameter {i} has shape {}",
                        t.shape(),
                        p.shape()
                    )));
                }
            }
        }
        // State loaded elsewhere (a checkpoint read on the host, a run on another device)
        // moves to its parameter's device, and converts to its state dtype there.
        for (i, (p, slots)) in params.iter().zip(&mut self.slots).enumerate() {
            let want = state_dtype(p.dtype());
            for t in slots.iter_mut() {
                if t.device() != p.device() {
                    *t = t.to_device(p.device()).map_err(at(op, i))?;
                }
                if t.dtype() != want {
                    *t = t.to_dtype(want).map_err(at(op, i))?;
                }
            }
        }
        Ok(())
    }

    /// The named state (see [`Optimizer::state`]).
    fn state(&self, slot_names: &[&str]) -> Vec<(String, Tensor)> {
        let iterations = i64::try_from(self.iterations).unwrap_or(i64::MAX);
        let iterations =
            Tensor::scalar(iterations, Device::Cpu).expect("a host scalar allocation cannot fail");
        let mut out = vec![("iterations".to_string(), iterations)];
        for (i, slots) in self.slots.iter().enumerate() {
            for (name, t) in slot_names.iter().zip(slots) {
                out.push((format!("{i}/{name}"), t.clone()));
            }
        }
        out
    }

    /// Restore a named state (see [`Optimizer::load_state`]).
    fn load_state(&mut self, state: &[(String, Tensor)], slot_names: &[&str]) -> Result<()> {
        let op = self.name;
        let bad = |key: &str, msg: String| OptimError::BadState {
            op,
            key: key.to_string(),
            msg,
        };
        let mut iterations = None;
        let mut slots: Vec<Vec<Option<Tensor>>> = Vec::new();
        for (key, t) in state {
            if key == "iterations" {
                if iterations.is_some() {
                    return Err(bad(key, "it appears twice".into()));
                }
                iterations = Some(parse_iterations(t).map_err(|msg| bad(key, msg))?);
                continue;
            }
            let Some((index, name)) = key.split_once('/') else {
                return Err(bad(
                    key,
                    "expected `iterations` or `<parameter index>/<slot>`".into(),
                ));
            };
            let index: usize = index
                .parse()
                .map_err(|_| bad(key, format!("`{index}` is not a parameter index")))?;
            let Some(k) = slot_names.iter().position(|n| *n == name) else {
                let msg = if slot_names.is_empty() {
                    "this optimizer keeps no per-parameter state".to_string()
                } else {
                    format!(
                        "unknown slot `{name}` (this optimizer's slots: {})",
                        slot_names.join(", ")
                    )
                };
                return Err(bad(key, msg));
            };
            if !t.dtype().is_float() {
                return Err(bad(key, format!("dtype {} is not a float type", t.dtype())));
            }
            // Each parameter needs every slot, so a valid index is below the entry count;
            // checking it first keeps a corrupt index from allocating a huge table.
            if index >= state.len() {
                return Err(bad(
                    key,
                    format!(
                        "parameter index {index} but only {} entries given",
                        state.len()
                    ),
                ));
            }
            if slots.len() <= index {
                slots.resize(index + 1, vec![None; slot_names.len()]);
            }
            if slots[index][k].replace(t.clone()).is_some() {
                return Err(bad(key, "it appears twice".into()));
            }
        }
        let iterations = iterations.ok_or_else(|| bad("iterations", "it is missing".into()))?;
        for (i, s) in slots.iter().enumerate() {
            for (name, t) in slot_names.iter().zip(s) {
                if t.is_none() {
                    return Err(bad(
                        &format!("{i}/{name}"),
                        "it is missing (every parameter up to the highest index needs every slot)"
                            .into(),
                    ));
                }
            }
        }
        self.iterations = iterations;
        self.slots = slots
            .into_iter()
            .map(|s| s.into_iter().flatten().collect())
            .collect();
        Ok(())
    }
}

/// Reads a saved iteration count: one element holding a non-negative integer.
fn parse_iterations(t: &Tensor) -> std::result::Result<u64, String> {
    let v = t
        .to_dtype(DType::F64)
        .and_then(|t| t.to_scalar::<f64>())
        .map_err(|e| e.to_string())?;
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64 {
        Ok(v as u64)
    } else {
        Err(format!("{v} is not an iteration count"))
    }
}

/// Checks that the gradients fit the parameters (length, then per index: float dtype,
/// same dtype, shape and device).
fn check_inputs(op: &'static str, params: &[Tensor], grads: &[Tensor]) -> Result<()> {
    if params.len() != grads.len() {
        return Err(OptimError::LengthMismatch {
            op,
            params: params.len(),
            grads: grads.len(),
        });
    }
    for (index, (p, g)) in params.iter().zip(grads).enumerate() {
        if !p.dtype().is_float() {
            return Err(OptimError::UnsupportedDType {
                op,
                index,
                dtype: p.dtype(),
            });
        }
        if p.dtype() != g.dtype() {
            return Err(OptimError::DTypeMismatch {
                op,
                index,
                param: p.dtype(),
                grad: g.dtype(),
            });
        }
        if p.shape() != g.shape() {
            return Err(OptimError::ShapeMismatch {
                op,
                index,
                param: *p.shape(),
                grad: *g.shape(),
            });
        }
        if p.device() != g.device() {
            return Err(OptimError::DeviceMismatch {
                op,
                index,
                param: p.device(),
                grad: g.device(),
            });
        }
    }
    Ok(())
}

/// The dtype optimizer state is kept in for parameters of `dtype`: the accumulation type,
/// f64 for f64 and f32 for every other float.
pub(crate) fn state_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// Wraps a tensor error with the optimizer and parameter it happened for.
pub(crate) fn at(op: &'static str, index: usize) -> impl Fn(TensorError) -> OptimError {
    move |source| OptimError::ParamTensor { op, index, source }
}

/// `x` in the accumulation type `A` (hyperparameters are computed in f64, then rounded
/// once per step).
#[inline]
pub(crate) fn cast<A: Element>(x: f64) -> A {
    <A as Element>::from_f64(x)
}

/// The next slot of a parameter as a mutable slice of `A`, or an empty slice when the
/// optimizer has no such slot in its configuration.
pub(crate) fn next_slot<'a, A: Element>(
    slots: &mut std::slice::IterMut<'a, Tensor>,
) -> std::result::Result<&'a mut [A], TensorError> {
    match slots.next() {
        Some(t) => t.data_mut::<A>(),
        None => Ok(&mut []),
    }
}

/// [`mirra_tensor::match_float_dtype!`] whose non-float case is an
/// [`OptimError::UnsupportedDType`] naming `$op` and tensor `$index`. `$body` must evaluate
/// to a `Result<_, OptimError>`.
macro_rules! with_float {
    ($op:expr, $index:expr, $dtype:expr, $T:ident => $body:expr) => {
        mirra_tensor::match_float_dtype!($dtype, $T => $body, other => {
            Err($crate::OptimError::UnsupportedDType {
                op: $op,
                index: $index,
                dtype: other,
            })
        })
    };
}

pub(crate) use with_float;

#[cfg(test)]
mod tests {
    use mirra_tensor::FloatElement;

    use super::*;

    fn acc_dtype<T: FloatElement>() -> DType {
        <T::Acc as Element>::DTYPE
    }

    #[test]
    fn state_dtype_is_the_accumulation_type() {
        assert_eq!(state_dtype(DType::F32), acc_dtype::<f32>());
        assert_eq!(state_dtype(DType::F64), acc_dtype::<f64>());
        assert_eq!(state_dtype(DType::F16), acc_dtype::<half::f16>());
        assert_eq!(state_dtype(DType::BF16), acc_dtype::<half::bf16>());
    }

    #[test]
    fn iteration_counts_must_be_non_negative_integers() {
        let t = |v: f64| Tensor::scalar(v, Device::Cpu).unwrap();
        assert_eq!(parse_iterations(&t(7.0)), Ok(7));
        assert!(parse_iterations(&t(-1.0)).is_err());
        assert!(parse_iterations(&t(1.5)).is_err());
        assert!(parse_iterations(&t(f64::NAN)).is_err());
        let two = Tensor::from_slice(&[1i64, 2], &[2], Device::Cpu).unwrap();
        assert!(parse_iterations(&two).is_err());
    }

    /// Two parameters of `dtype`, deterministic gradients for step `k`.
    fn problem(dtype: DType) -> (Vec<Tensor>, impl Fn(usize) -> Vec<Tensor>) {
        let t = move |v: &[f32], shape: &[usize]| {
            Tensor::from_slice(v, shape, Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let params = vec![
            t(&[0.5, -1.0, 2.0, 0.0], &[2, 2]),
            t(&[1.0, 2.0, 3.0], &[3]),
        ];
        let grads = move |k: usize| {
            let g = |n: usize, j: usize| (((k * 7 + j * 3 + n) as f32) * 0.37).sin();
            vec![
                t(&(0..4).map(|j| g(0, j)).collect::<Vec<_>>(), &[2, 2]),
                t(&(0..3).map(|j| g(1, j)).collect::<Vec<_>>(), &[3]),
            ]
        };
        (params, grads)
    }

    fn bits(ts: &[Tensor]) -> Vec<Vec<u8>> {
        ts.iter()
            .map(|t| {
                t.contiguous()
                    .unwrap()
                    .buffer()
                    .as_bytes()
                    .unwrap()
                    .to_vec()
            })
            .collect()
    }

    fn round_trip(make: &dyn Fn() -> Box<dyn Optimizer>, dtype: DType) {
        let (mut pa, grads) = problem(dtype);
        let mut a = make();
        for k in 0..3 {
            a.step(&mut pa, &grads(k)).unwrap();
        }
        let saved = a.state();
        let saved_bits: Vec<Vec<u8>> =
            bits(&saved.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>());
        let mut b = make();
        b.load_state(&saved).unwrap();
        assert_eq!(b.iterations(), 3);
        assert_eq!(b.learning_rate(), a.learning_rate());
        let mut pb: Vec<Tensor> = pa.iter().map(|t| t.copy().unwrap()).collect();
        for k in 3..6 {
            a.step(&mut pa, &grads(k)).unwrap();
            b.step(&mut pb, &grads(k)).unwrap();
        }
        assert_eq!(bits(&pa), bits(&pb), "{} {dtype}", a.name());
        let (sa, sb) = (a.state(), b.state());
        let names = |s: &[(String, Tensor)]| s.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&sa), names(&sb));
        assert_eq!(
            bits(&sa.into_iter().map(|(_, t)| t).collect::<Vec<_>>()),
            bits(&sb.into_iter().map(|(_, t)| t).collect::<Vec<_>>())
        );
        // The exported state was not changed by the later steps.
        let after: Vec<Vec<u8>> = bits(&saved.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>());
        assert_eq!(saved_bits, after);
    }

    #[test]
    fn state_round_trips_bit_for_bit() {
        use crate::{Adam, AdamW, CosineDecay, LinearWarmup, RmsProp, Sgd};
        let makers: Vec<Box<dyn Fn() -> Box<dyn Optimizer>>> = vec![
            Box::new(|| Box::new(Sgd::new(0.1))),
            Box::new(|| {
                Box::new(
                    Sgd::new(0.1)
                        .momentum(0.9)
                        .nesterov(true)
                        .weight_decay(0.01),
                )
            }),
            Box::new(|| Box::new(Adam::new(0.01))),
            Box::new(|| Box::new(Adam::new(0.01).amsgrad(true))),
            Box::new(|| {
                let cosine = CosineDecay::new(0.01, 10, 0.1).unwrap();
                Box::new(
                    AdamW::new(0.0).with_schedule(Box::new(LinearWarmup::new(Box::new(cosine), 2))),
                )
            }),
            Box::new(|| Box::new(RmsProp::new(0.01).centered(true).momentum(0.5))),
        ];
        for make in &makers {
            for dtype in [DType::F32, DType::BF16, DType::F64] {
                round_trip(make.as_ref(), dtype);
            }
        }
    }

    #[test]
    fn load_state_rejects_what_does_not_fit() {
        use crate::{Adam, Sgd};
        let (mut params, grads) = problem(DType::F32);
        let mut sgd = Sgd::new(0.1).momentum(0.9);
        sgd.step(&mut params, &grads(0)).unwrap();
        let sgd_state = sgd.state();
        let mut adam = Adam::new(0.1);
        let err = adam.load_state(&sgd_state).unwrap_err();
        assert_eq!(
            err.to_string(),
            "adam: cannot load state entry `0/momentum`: unknown slot `momentum` (this optimizer's slots: m, v)"
        );
        let err = Sgd::new(0.1).load_state(&sgd_state).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sgd: cannot load state entry `0/momentum`: this optimizer keeps no per-parameter state"
        );
        let gap = [sgd_state[0].clone(), sgd_state[2].clone()];
        let err = Sgd::new(0.1).momentum(0.9).load_state(&gap).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sgd: cannot load state entry `0/momentum`: it is missing (every parameter up to the highest index needs every slot)"
        );
        // Fewer parameters than the model has loads, and the next step says so.
        let mut opt = Sgd::new(0.1).momentum(0.9);
        opt.load_state(&sgd_state[..2]).unwrap();
        let err = opt.step(&mut params, &grads(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sgd: optimizer state does not fit the parameters: the state holds 1 parameters but 2 were given"
        );
        let err = Sgd::new(0.1)
            .momentum(0.9)
            .load_state(&sgd_state[1..])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "sgd: cannot load state entry `iterations`: it is missing"
        );
        let mut dup = sgd_state.clone();
        dup.push(dup[1].clone());
        assert!(Sgd::new(0.1).momentum(0.9).load_state(&dup).is_err());
        let mut huge = sgd_state.clone();
        huge[1].0 = "99999999999/momentum".into();
        assert!(Sgd::new(0.1).momentum(0.9).load_state(&huge).is_err());
        // A failed load changes nothing.
        let mut opt = Sgd::new(0.1).momentum(0.9);
        assert!(opt.load_state(&dup).is_err());
        assert_eq!(opt.iterations(), 0);
        assert_eq!(opt.state().len(), 1);
        // Shapes are checked against the parameters at the next step.
        let mut opt = Sgd::new(0.1).momentum(0.9);
        let mut swapped = sgd_state.clone();
        swapped.swap(1, 2);
        swapped[1].0 = "0/momentum".into();
        swapped[2].0 = "1/momentum".into();
        opt.load_state(&swapped).unwrap();
        let err = opt.step(&mut params, &grads(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sgd: optimizer state does not fit the parameters: state `0/momentum` has shape [3] but parameter 0 has shape [2, 2]"
        );
    }

    #[test]
    fn state_of_another_precision_is_converted() {
        use crate::Adam;
        let (mut p32, grads) = problem(DType::F32);
        let mut a = Adam::new(0.01);
        a.step(&mut p32, &grads(0)).unwrap();
        let mut p64: Vec<Tensor> = p32
            .iter()
            .map(|t| t.to_dtype(DType::F64).unwrap())
            .collect();
        let g64: Vec<Tensor> = grads(1)
            .iter()
            .map(|t| t.to_dtype(DType::F64).unwrap())
            .collect();
        let mut b = Adam::new(0.01);
        b.load_state(&a.state()).unwrap();
        b.step(&mut p64, &g64).unwrap();
        a.step(&mut p32, &grads(1)).unwrap();
        assert!(b.state()[1..].iter().all(|(_, t)| t.dtype() == DType::F64));
        for (x, y) in p32.iter().zip(&p64) {
            let (x, y) = (x.to_dtype(DType::F64).unwrap(), y.clone());
            for (u, v) in x
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .zip(y.to_vec::<f64>().unwrap())
            {
                assert!((u - v).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn a_warmed_up_step_requests_no_buffer() {
        use crate::{Adam, RmsProp, Sgd};
        let opts: Vec<Box<dyn Optimizer>> = vec![
            Box::new(Sgd::new(0.1).momentum(0.9).nesterov(true)),
            Box::new(Adam::new(0.01).amsgrad(true).weight_decay(0.1)),
            Box::new(RmsProp::new(0.01).centered(true).momentum(0.5)),
        ];
        for mut opt in opts {
            for dtype in [DType::F32, DType::F16] {
                let (mut params, grads) = problem(dtype);
                let grads = grads(0);
                // The first step creates the state.
                opt.step(&mut params, &grads).unwrap();
                let before = mirra_device::pool_stats();
                for _ in 0..3 {
                    opt.step(&mut params, &grads).unwrap();
                }
                assert_eq!(mirra_device::pool_stats(), before, "{} {dtype}", opt.name());
                // A state without slots resets the optimizer for the next dtype.
                opt.load_state(&[(
                    "iterations".into(),
                    Tensor::scalar(0i64, Device::Cpu).unwrap(),
                )])
                .unwrap();
            }
        }
    }
}
