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

/// A building block of a [`Sequential`](crate::Sequential) model. Layers hold their
/// configuration only (the model owns the parameters), so they are cheap to clone; any
/// `Clone` layer gets [`LayerClone`] for free.
pub trait Layer: Send + Sync + fmt::Debug + LayerClone {
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

/// Cloning of boxed layers (one copy of the model per replica). Implemented for every
/// `Layer + Clone`.
pub trait LayerClone {
    /// A boxed copy of this layer.
    fn clone_box(&self) -> Box<dyn Layer>;
}

impl<T: Layer + Clone + 'static> LayerClone for T {
    fn clone_box(&self) -> Box<dyn Layer> {
        Box::new(self.clone())
    }
}

impl Clone for Box<dyn Layer> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}
