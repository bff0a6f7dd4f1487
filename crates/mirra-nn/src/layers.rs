//! The layers: Dense, Flatten, Reshape, Dropout.

use mirra_autograd::Var;
use mirra_tensor::init::{bernoulli_rows, mix, Initializer};

use crate::{Activation, Autocast, ForwardCtx, Layer, NnError, ParamSpec, Result};

/// A fully connected layer, `activation(x · kernel + bias)`, as Keras's `Dense`: a
/// Glorot-uniform kernel of shape `[in, units]` and a zero bias.
#[derive(Clone, Debug)]
pub struct Dense {
    units: usize,
    activation: Activation,
    use_bias: bool,
    kernel_init: Initializer,
    bias_init: Initializer,
}

impl Dense {
    /// A dense layer of `units` outputs with the given activation.
    pub fn new(units: usize, activation: Activation) -> Dense {
        Dense {
            units,
            activation,
            use_bias: true,
            kernel_init: Initializer::GlorotUniform,
            bias_init: Initializer::Zeros,
        }
    }

    /// Without a bias.
    pub fn without_bias(mut self) -> Dense {
        self.use_bias = false;
        self
    }

    /// With another kernel initialiser.
    pub fn kernel_initializer(mut self, init: Initializer) -> Dense {
        self.kernel_init = init;
        self
    }

    /// With another bias initialiser.
    pub fn bias_initializer(mut self, init: Initializer) -> Dense {
        self.bias_init = init;
        self
    }

    /// The activation.
    pub fn activation(&self) -> Activation {
        self.activation
    }

    fn affine<'t>(&self, x: &Var<'t>, params: &[Var<'t>]) -> Result<Var<'t>> {
        let z = x.matmul(&params[0])?;
        Ok(if self.use_bias { z.add(&params[1])? } else { z })
    }
}

impl Layer for Dense {
    fn autocast(&self) -> Autocast {
        // A matrix product: the policy's 16-bit dtype.
        Autocast::Lower
    }

    fn kind(&self) -> &'static str {
        "dense"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        if self.units == 0 {
            return Err(NnError::Config {
                layer: "dense".into(),
                msg: "units must be positive".into(),
            });
        }
        let Some((&last, rest)) = input.split_last() else {
            return Err(NnError::Config {
                layer: "dense".into(),
                msg: "needs inputs with at least one dimension besides the batch".into(),
            });
        };
        let mut specs = vec![ParamSpec::trainable(
            "kernel",
            vec![last, self.units],
            self.kernel_init,
        )];
        if self.use_bias {
            specs.push(ParamSpec::trainable(
                "bias",
                vec![self.units],
                self.bias_init,
            ));
        }
        let mut out = rest.to_vec();
        out.push(self.units);
        Ok((specs, out))
    }

    fn forward<'t>(
        &self,
        x: &Var<'t>,
        params: &[Var<'t>],
        _: &mut ForwardCtx<'_>,
    ) -> Result<Var<'t>> {
        self.activation.apply(&self.affine(x, params)?)
    }

    fn forward_logits<'t>(
        &self,
        x: &Var<'t>,
        params: &[Var<'t>],
        _: &mut ForwardCtx<'_>,
    ) -> Result<Option<Var<'t>>> {
        match self.activation {
            Activation::Softmax => Ok(Some(self.affine(x, params)?)),
            _ => Ok(None),
        }
    }
}

/// Flattens everything but the batch dimension, as Keras's `Flatten`.
#[derive(Clone, Debug, Default)]
pub struct Flatten;

impl Layer for Flatten {
    fn kind(&self) -> &'static str {
        "flatten"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        Ok((vec![], vec![input.iter().product()]))
    }

    fn forward<'t>(&self, x: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        let batch = x.shape().first().copied().unwrap_or(1);
        Ok(x.reshape(&[batch, usize::MAX])?)
    }
}

/// Gives each example another shape with the same number of elements, as Keras's
/// `Reshape(target_shape)` (the batch dimension is kept).
#[derive(Clone, Debug)]
pub struct Reshape {
    target: Vec<usize>,
}

impl Reshape {
    /// Examples reshaped to `target` (without the batch dimension).
    pub fn new(target: &[usize]) -> Reshape {
        Reshape {
            target: target.to_vec(),
        }
    }
}

impl Layer for Reshape {
    fn kind(&self) -> &'static str {
        "reshape"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        let (have, want) = (
            input.iter().product::<usize>(),
            self.target.iter().product::<usize>(),
        );
        if have != want {
            return Err(NnError::Config {
                layer: "reshape".into(),
                msg: format!(
                    "inputs {input:?} have {have} elements, the target {:?} {want}",
                    self.target
                ),
            });
        }
        Ok((vec![], self.target.clone()))
    }

    fn forward<'t>(&self, x: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        let mut dims = vec![x.shape().first().copied().unwrap_or(1)];
        dims.extend(&self.target);
        Ok(x.reshape(&dims)?)
    }
}

/// Inverted dropout, as Keras's `Dropout`: while training, zeroes each element with
/// probability `rate` and scales the rest by `1 / (1 - rate)`; the identity otherwise.
/// Each example's mask is drawn from the step's key, the layer's position and the
/// example's index in the global batch ([`Examples`](crate::Examples)), so N replicas
/// drop what one device drops.
#[derive(Clone, Debug)]
pub struct Dropout {
    rate: f64,
}

impl Dropout {
    /// Dropout with the given rate in `[0, 1)`.
    pub fn new(rate: f64) -> Dropout {
        Dropout { rate }
    }
}

impl Layer for Dropout {
    fn kind(&self) -> &'static str {
        "dropout"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        if !(0.0..1.0).contains(&self.rate) {
            return Err(NnError::Config {
                layer: "dropout".into(),
                msg: format!("rate {} outside [0, 1)", self.rate),
            });
        }
        Ok((vec![], input.to_vec()))
    }

    fn forward<'t>(&self, x: &Var<'t>, _: &[Var<'t>], ctx: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        if !ctx.training || self.rate == 0.0 {
            return Ok(x.clone());
        }
        let keep = 1.0 - self.rate;
        let v = x.value();
        let key = mix(ctx.examples.step_key, ctx.layer as u64);
        let mask = bernoulli_rows(
            v.dims(),
            keep,
            v.dtype(),
            v.device(),
            key,
            ctx.examples.first,
        )?
        .scale(1.0 / keep)?;
        Ok(x.mask_mul(&mask)?)
    }
}
