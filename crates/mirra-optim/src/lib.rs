//! Optimizers, learning-rate schedules and gradient clipping.
//!
//! An [`Optimizer`] knows nothing of layers or names. The model hands it its parameters and
//! their gradients as two parallel slices, in the same order at every step (the stable
//! parameter order of a built model), and the optimizer keeps its per-parameter state
//! (Adam's `m` and `v`, a momentum buffer, ...) by position. That makes the optimizer
//! independent of the model crate and lets every replica of a mirrored model, which holds
//! its parameters in the same order, run the same update on the same reduced gradients.
//!
//! Updates are in place and fused: one loop per parameter reads the gradient and the
//! state and writes the parameter, with no allocation once the state exists (it is created
//! lazily, as zeros, at the first step). Each optimizer has one kernel, generic over
//! [`FloatElement`](mirra_tensor::FloatElement), that serves f32, f64, f16 and bf16
//! parameters; arithmetic runs in the element's accumulation type and the state is kept in
//! it too (f32 for 16-bit and f32 parameters, f64 for f64 ones).
//!
//! The update rules follow Keras 3 (the defaults too), and each optimizer's documentation
//! writes out its formula and says where PyTorch differs:
//!
//! | optimizer | state per parameter | matches |
//! |---|---|---|
//! | [`Sgd`] | `momentum` (when momentum > 0) | Keras 3 `SGD`; PyTorch for a constant rate without weight decay |
//! | [`Adam`] | `m`, `v` (+ `vhat` with AMSGrad) | Keras 3 `Adam`; PyTorch up to epsilon's placement |
//! | [`AdamW`] | as Adam | Keras 3 `AdamW` (weight decay 0.004); PyTorch `AdamW` up to epsilon's placement |
//! | [`RmsProp`] | `velocity` (+ `average_gradient`, `momentum`) | Keras 3 `RMSprop` |
//!
//! Learning rates come from a [`LearningRateSchedule`] evaluated at the number of updates
//! applied so far ([`Constant`], [`StepDecay`], [`CosineDecay`], [`LinearWarmup`]);
//! [`scale_lr`] is the linear scaling rule for large global batches. [`clip_by_global_norm`]
//! rescales gradients as `tf.clip_by_global_norm` does.
//!
//! State is exported by name for checkpoints (`"iterations"`, `"0/m"`, `"0/v"`, ...) with
//! [`Optimizer::state`] and restored with [`Optimizer::load_state`]; a restored optimizer
//! continues bit for bit where the saved one left off.
//!
//! ```
//! use mirra_optim::{Adam, Optimizer};
//! use mirra_tensor::{Device, Tensor};
//!
//! let mut params = vec![Tensor::from_slice(&[1.0f32, 2.0], &[2], Device::Cpu)?];
//! let grads = vec![Tensor::from_slice(&[0.5f32, -0.5], &[2], Device::Cpu)?];
//! let mut adam = Adam::new(0.1).beta1(0.8);
//! adam.step(&mut params, &grads)?;
//! assert_eq!(adam.iterations(), 1);
//! // Adam's first step moves each coordinate by about lr against its gradient's sign.
//! let p = params[0].to_vec::<f32>()?;
//! assert!((p[0] - 0.9).abs() < 1e-5 && (p[1] - 2.1).abs() < 1e-5);
//! # Ok::<(), mirra_optim::OptimError>(())
//! ```

mod adam;
mod clip;
mod cuda;
mod error;
mod hyperparams;
mod loss_scale;
mod optimizer;
mod rmsprop;
mod schedule;
mod sgd;
#[cfg(test)]
mod testutil;

pub use adam::{Adam, AdamW};
pub use clip::{clip_by_global_norm, global_norm};
pub use error::OptimError;
pub use loss_scale::{LossScaleOptimizer, GROWTH_INTERVAL, INITIAL_LOSS_SCALE};
pub use optimizer::Optimizer;
pub use rmsprop::RmsProp;
pub use schedule::{
    scale_lr, Constant, CosineDecay, LearningRateSchedule, LinearWarmup, StepDecay,
};
pub use sgd::Sgd;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, OptimError>;
