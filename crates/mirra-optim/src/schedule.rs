//! Learning-rate schedules: the rate as a function of the number of updates applied.
//!
//! A schedule is evaluated by the optimizer at every step with its iteration count, as
//! Keras's `LearningRateSchedule`s are: step 0 is the first update. Schedules are pure
//! functions of the step, so a run restored from a checkpoint (which restores the
//! iteration count) continues on the same curve. Constructors reject arguments that would
//! divide by zero or give a negative rate; a rate that is still invalid at some step (a
//! user-defined schedule returning NaN, say) is reported by the optimizer's `step`.

use std::fmt;

use crate::hyperparams::{check_non_negative, check_range};
use crate::{OptimError, Result};

/// A learning rate that depends on the number of updates applied so far.
pub trait LearningRateSchedule: Send + Sync + fmt::Debug {
    /// The rate for the update made after `step` updates (0 for the first update).
    fn lr(&self, step: u64) -> f64;
}

/// The same rate at every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Constant(pub f64);

impl LearningRateSchedule for Constant {
    fn lr(&self, _step: u64) -> f64 {
        self.0
    }
}

/// Multiply the rate by `gamma` every `every` steps:
/// `lr(step) = initial · gamma^⌊step / every⌋`.
///
/// PyTorch's `StepLR(step_size=every, gamma)` (stepped per update) and Keras's
/// `ExponentialDecay(initial, decay_steps=every, decay_rate=gamma, staircase=True)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepDecay {
    initial: f64,
    every: u64,
    gamma: f64,
}

impl StepDecay {
    /// The schedule; an error unless `initial_lr` and `gamma` are finite and `>= 0` and
    /// `every > 0`.
    pub fn new(initial_lr: f64, every: u64, gamma: f64) -> Result<StepDecay> {
        const OP: &str = "step_decay";
        check_non_negative(OP, "initial_lr", initial_lr)?;
        check_non_negative(OP, "gamma", gamma)?;
        if every == 0 {
            return Err(OptimError::InvalidHyperparameter {
                op: OP,
                name: "every",
                value: 0.0,
                expected: "at least 1 step",
            });
        }
        Ok(StepDecay {
            initial: initial_lr,
            every,
            gamma,
        })
    }
}

impl LearningRateSchedule for StepDecay {
    fn lr(&self, step: u64) -> f64 {
        self.initial * self.gamma.powf((step / self.every) as f64)
    }
}

/// Cosine decay from `initial` to `alpha · initial` over `decay_steps`, then constant;
/// Keras 3's `CosineDecay(initial, decay_steps, alpha)` (Loshchilov & Hutter's SGDR
/// without restarts):
///
/// ```text
/// s = min(step, decay_steps)
/// lr(step) = initial · ((1 − alpha) · ½(1 + cos(π · s / decay_steps)) + alpha)
/// ```
///
/// Keras's `warmup_target` / `warmup_steps` arguments are [`LinearWarmup`] around this.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineDecay {
    initial: f64,
    decay_steps: u64,
    alpha: f64,
}

impl CosineDecay {
    /// The schedule; an error unless `initial_lr` is finite and `>= 0`, `decay_steps > 0`
    /// and `alpha` (the final rate as a fraction of the initial one) lies in `[0, 1]`.
    pub fn new(initial_lr: f64, decay_steps: u64, alpha: f64) -> Result<CosineDecay> {
        const OP: &str = "cosine_decay";
        check_non_negative(OP, "initial_lr", initial_lr)?;
        check_range(OP, "alpha", alpha, (0.0, 1.0, true), "a value in [0, 1]")?;
        if decay_steps == 0 {
            return Err(OptimError::InvalidHyperparameter {
                op: OP,
                name: "decay_steps",
                value: 0.0,
                expected: "at least 1 step",
            });
        }
        Ok(CosineDecay {
            initial: initial_lr,
            decay_steps,
            alpha,
        })
    }
}

impl LearningRateSchedule for CosineDecay {
    fn lr(&self, step: u64) -> f64 {
        let fraction = step.min(self.decay_steps) as f64 / self.decay_steps as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * fraction).cos());
        self.initial * ((1.0 - self.alpha) * cosine + self.alpha)
    }
}

/// A linear ramp over the first `warmup_steps` steps, then the wrapped schedule, started
/// afresh:
///
/// ```text
/// step < warmup_steps:  lr(step) = start + (inner(0) − start) · step / warmup_steps
/// otherwise:            lr(step) = inner(step − warmup_steps)
/// ```
///
/// The ramp ends at the wrapped schedule's first value, so the rate is continuous, and the
/// wrapped schedule sees its own step count from 0 (a cosine decay lasts its full
/// `decay_steps` after the warmup). With `start` 0 (the default) this is the gradual
/// warmup of Goyal et al. (2017); `LinearWarmup::new(CosineDecay::new(target, d, a), w)
/// .start_lr(initial)` is Keras 3's `CosineDecay(initial, d, a, warmup_target=target,
/// warmup_steps=w)`. Zero warmup steps is the wrapped schedule itself.
#[derive(Debug)]
pub struct LinearWarmup {
    inner: Box<dyn LearningRateSchedule>,
    warmup_steps: u64,
    start: f64,
}

impl LinearWarmup {
    /// Warm up from 0 to `inner`'s first rate over `warmup_steps` steps.
    pub fn new(inner: Box<dyn LearningRateSchedule>, warmup_steps: u64) -> LinearWarmup {
        LinearWarmup {
            inner,
            warmup_steps,
            start: 0.0,
        }
    }

    /// Start the ramp at `start` instead of 0.
    pub fn start_lr(mut self, start: f64) -> LinearWarmup {
        self.start = start;
        self
    }
}

impl LearningRateSchedule for LinearWarmup {
    fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            let fraction = step as f64 / self.warmup_steps as f64;
            self.start + (self.inner.lr(0) - self.start) * fraction
        } else {
            self.inner.lr(step - self.warmup_steps)
        }
    }
}

impl LearningRateSchedule for Box<dyn LearningRateSchedule> {
    fn lr(&self, step: u64) -> f64 {
        (**self).lr(step)
    }
}

/// The linear scaling rule of Goyal et al. (2017), "Accurate, Large Minibatch SGD:
/// Training ImageNet in 1 Hour": when the minibatch grows by a factor `k`, multiply the
/// learning rate by `k`. Returns `lr · global_batch / base_batch`, where `base_batch` is
/// the batch size `lr` was tuned for and `global_batch` the batch summed over all
/// replicas (per-replica batch × replica count).
///
/// The rule holds well with a gradual warmup ([`LinearWarmup`], the paper uses 5 epochs)
/// and breaks down for very large batches (beyond 8k images in the paper). A `base_batch`
/// of 0 gives an infinite or NaN rate, which the optimizer rejects at its next step.
pub fn scale_lr(lr: f64, global_batch: usize, base_batch: usize) -> f64 {
    lr * global_batch as f64 / base_batch as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Optimizer, Sgd};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn constant_and_step_decay() {
        assert_eq!(Constant(0.3).lr(12345), 0.3);
        let s = StepDecay::new(0.1, 10, 0.5).unwrap();
        // 0.1·0.5^⌊step/10⌋
        assert_eq!(s.lr(0), 0.1);
        assert_eq!(s.lr(9), 0.1);
        assert_eq!(s.lr(10), 0.05);
        assert_eq!(s.lr(25), 0.025);
        assert!(StepDecay::new(0.1, 0, 0.5).is_err());
        assert!(StepDecay::new(-0.1, 10, 0.5).is_err());
    }

    #[test]
    fn cosine_decay_matches_keras() {
        let s = CosineDecay::new(1.0, 100, 0.0).unwrap();
        assert_eq!(s.lr(0), 1.0);
        assert!(close(s.lr(50), 0.5)); // ½(1 + cos(π/2))
        assert!(close(s.lr(100), 0.0));
        assert!(close(s.lr(150), 0.0)); // held after decay_steps
        let s = CosineDecay::new(1.0, 100, 0.1).unwrap();
        // step 25: ½(1 + cos(π/4)) = 0.8535534; 0.9·0.8535534 + 0.1 = 0.8681981
        assert!((s.lr(25) - 0.8681981).abs() < 1e-7);
        assert!(close(s.lr(50), 0.55)); // 0.9·0.5 + 0.1
        assert!(close(s.lr(1000), 0.1));
        let err = CosineDecay::new(1.0, 0, 0.0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cosine_decay: decay_steps = 0 is invalid: expected at least 1 step"
        );
        assert!(CosineDecay::new(1.0, 10, 1.5).is_err());
    }

    #[test]
    fn warmup_then_cosine() {
        let cosine = CosineDecay::new(0.1, 100, 0.0).unwrap();
        let s = LinearWarmup::new(Box::new(cosine), 10);
        assert_eq!(s.lr(0), 0.0);
        assert!(close(s.lr(5), 0.05)); // 0.1·5/10
        assert!(close(s.lr(10), 0.1)); // cosine(0)
        assert!(close(s.lr(60), 0.05)); // cosine(50)
        assert!(close(s.lr(110), 0.0)); // cosine(100)
        let s = LinearWarmup::new(Box::new(cosine), 10).start_lr(0.01);
        assert!(close(s.lr(0), 0.01));
        assert!(close(s.lr(5), 0.055)); // 0.01 + 0.09·0.5
        let none = LinearWarmup::new(Box::new(cosine), 0);
        assert_eq!(none.lr(0), 0.1);
    }

    #[test]
    fn linear_scaling_rule() {
        // Goyal et al.: 0.1 per 256 images, 8192 images per step → 3.2.
        assert!(close(scale_lr(0.1, 8192, 256), 3.2));
        assert_eq!(scale_lr(0.001, 64, 64), 0.001);
    }

    #[test]
    fn optimizers_follow_their_schedule() {
        let mut opt = Sgd::new(1.0).with_schedule(Box::new(StepDecay::new(1.0, 2, 0.5).unwrap()));
        let mut p = vec![crate::testutil::t32(&[0.0])];
        let g = [crate::testutil::t32(&[1.0])];
        let mut rates = vec![];
        for _ in 0..5 {
            rates.push(opt.learning_rate());
            opt.step(&mut p, &g).unwrap();
        }
        assert_eq!(rates, [1.0, 1.0, 0.5, 0.5, 0.25]);
        // p = −(1 + 1 + 0.5 + 0.5 + 0.25)
        assert_eq!(crate::testutil::values(&p[0]), vec![-3.25]);
        opt.set_learning_rate(0.125);
        assert_eq!(opt.learning_rate(), 0.125);
        opt.set_learning_rate(-1.0);
        assert!(opt.step(&mut p, &g).is_err());
    }
}
