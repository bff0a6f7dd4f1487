use std::fmt;
use std::str::FromStr;

use mirra_autograd::Var;

use crate::{ForwardCtx, Layer, NnError, ParamSpec, Result};

/// A layer's activation function, by Keras's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activation {
    /// The identity (`"linear"`).
    #[default]
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// The logistic sigmoid.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// Exact GELU.
    Gelu,
    /// Softmax over the last axis.
    Softmax,
}

impl Activation {
    /// Apply to a variable.
    pub fn apply<'t>(self, x: &Var<'t>) -> Result<Var<'t>> {
        Ok(match self {
            Activation::Linear => x.clone(),
            Activation::Relu => x.relu()?,
            Activation::Sigmoid => x.sigmoid()?,
            Activation::Tanh => x.tanh()?,
            Activation::Gelu => x.gelu()?,
            Activation::Softmax => x.softmax(-1)?,
        })
    }

    /// Keras's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Activation::Linear => "linear",
            Activation::Relu => "relu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
            Activation::Gelu => "gelu",
            Activation::Softmax => "softmax",
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Activation {
    type Err = NnError;
    fn from_str(s: &str) -> Result<Activation> {
        [
            Activation::Linear,
            Activation::Relu,
            Activation::Sigmoid,
            Activation::Tanh,
            Activation::Gelu,
            Activation::Softmax,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
        .ok_or_else(|| NnError::Config {
            layer: "activation".into(),
            msg: format!("unknown activation '{s}' (linear, relu, sigmoid, tanh, gelu, softmax)"),
        })
    }
}

/// An activation on its own, as Keras's `Activation` layer (a residual block's relu after
/// its `Add`).
impl Layer for Activation {
    fn kind(&self) -> &'static str {
        "activation"
    }

    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        Ok((vec![], input.to_vec()))
    }

    fn forward<'t>(&self, x: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        self.apply(x)
    }

    fn forward_logits<'t>(
        &self,
        x: &Var<'t>,
        _: &[Var<'t>],
        _: &mut ForwardCtx<'_>,
    ) -> Result<Option<Var<'t>>> {
        Ok((*self == Activation::Softmax).then(|| x.clone()))
    }
}
