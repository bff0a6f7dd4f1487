use std::fmt;

use mirra_autograd::Var;
use mirra_tensor::init::{Initializer, Rng};
use mirra_tensor::DType;

use crate::Result;

/// A parameter a layer asks for when it is built: its short name (`kernel`), shape and
/// initialiser.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// The name within the layer (`kernel`, `bias`).
    pub name: &'static str,
    /// The shape.
    pub dims: Vec<usize>,
    /// How to fill it.
    pub init: Initializer,
}

/// What a forward pass needs besides inputs and parameters.
#[derive(Debug)]
pub struct ForwardCtx<'a> {
    /// True while training (dropout active).
    pub training: bool,
    /// Randomness for training-time layers (dropout masks).
    pub rng: &'a mut Rng,
    /// The dtype of the model's parameters.
    pub dtype: DType,
}

/// A building block of a [`Sequential`](crate::Sequential) model.
pub trait Layer: Send + Sync + fmt::Debug {
    /// The kind, from which the model derives unique names (`dense`, `dense_1`, ...).
    fn kind(&self) -> &'static str;

    /// Parameters needed for inputs of shape `input` (without the batch dimension), and
    /// the output shape (without the batch dimension).
    fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)>;

    /// Apply the layer to a batch; `params` are this layer's parameters in the order
    /// [`Layer::build`] gave them.
    fn forward<'t>(
        &self,
        x: &Var<'t>,
        params: &[Var<'t>],
        ctx: &mut ForwardCtx<'_>,
    ) -> Result<Var<'t>>;

    /// For a layer that ends in a softmax, its input (the logits): a model uses them to
    /// compute cross-entropy stably, as Keras does. `None` for every other layer.
    fn forward_logits<'t>(
        &self,
        _x: &Var<'t>,
        _params: &[Var<'t>],
        _ctx: &mut ForwardCtx<'_>,
    ) -> Result<Option<Var<'t>>> {
        Ok(None)
    }
}
