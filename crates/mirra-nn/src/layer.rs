use std::fmt;
use std::sync::Arc;

use mirra_autograd::{LinearMap, Var};
use mirra_tensor::init::Initializer;
use mirra_tensor::{DType, Tensor};

use crate::policy::Autocast;
use crate::{NnError, Result};

/// What a layer's variable is for, which decides who changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A weight the optimizer trains from its gradient.
    Trainable,
    /// Non-trainable state that a training forward pass updates from the replica's own
    /// batch (plain batch norm's moving statistics). Under a mirrored strategy every
    /// replica's value is averaged across replicas after each step, weighted by their
    /// examples, so the replicas stay bitwise identical (TensorFlow's mirrored variables
    /// with `MEAN` aggregation).
    ReplicaLocal,
    /// Non-trainable state that every replica updates identically, from values already
    /// summed across replicas (synchronised batch norm's moving statistics): nothing to
    /// average.
    InSync,
}

/// A variable a layer asks for when it is built: its short name (`kernel`), shape,
/// initialiser and role.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// The name within the layer (`kernel`, `bias`, `moving_mean`).
    pub name: &'static str,
    /// The shape.
    pub dims: Vec<usize>,
    /// How to fill it.
    pub init: Initializer,
    /// Trained, or state a forward pass updates.
    pub role: Role,
}

impl ParamSpec {
    /// A trainable weight.
    pub fn trainable(name: &'static str, dims: Vec<usize>, init: Initializer) -> ParamSpec {
        ParamSpec {
            name,
            dims,
            init,
            role: Role::Trainable,
        }
    }

    /// Non-trainable state with the given role ([`Role::ReplicaLocal`] or
    /// [`Role::InSync`]).
    pub fn state(name: &'static str, dims: Vec<usize>, init: Initializer, role: Role) -> ParamSpec {
        ParamSpec {
            name,
            dims,
            init,
            role,
        }
    }
}

/// Where a batch stands in its step, for randomness keyed by example (dropout masks):
/// an example gets the same mask whatever the replica count, because its key is the
/// step's and its index in the global batch, never its replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Examples {
    /// The step's key, the same on every replica (drawn once per step by the model's
    /// generator, which checkpoints save).
    pub step_key: u64,
    /// The index in the step's global batch of this batch's first example.
    pub first: usize,
}

/// What a forward pass needs besides inputs and parameters.
#[derive(Debug)]
pub struct ForwardCtx<'a> {
    /// True while training (dropout active, batch statistics used and moving ones
    /// updated).
    pub training: bool,
    /// The batch's place in its step, for dropout masks.
    pub examples: Examples,
    /// The layer's position in its network (so that two dropout layers draw different
    /// masks).
    pub layer: usize,
    /// The dtype of the model's parameters.
    pub dtype: DType,
    /// This layer's non-trainable state, in the order [`Layer::build`] asked for it.
    pub state: &'a [Tensor],
    /// New values for all of this layer's state, in the same order, when a training pass
    /// changes it (left empty otherwise).
    pub new_state: Vec<Tensor>,
    /// The sum across the replicas of a mirrored strategy (its own adjoint), for layers
    /// that synchronise statistics; `None` outside a strategy.
    pub cross_replica: Option<&'a Arc<dyn LinearMap>>,
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

    /// Parameters needed for any number of inputs (a merge layer's), and the output
    /// shape. Every other layer takes exactly one input: the default builds it with
    /// [`Layer::build`].
    fn build_inputs(&mut self, inputs: &[Vec<usize>]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        match inputs {
            [one] => self.build(one),
            _ => Err(NnError::Config {
                layer: self.kind().into(),
                msg: format!("takes one input, was given {}", inputs.len()),
            }),
        }
    }

    /// Apply the layer to any number of inputs (as many as it was built for); the
    /// default applies [`Layer::forward`] to the one input.
    fn forward_inputs<'t>(
        &self,
        xs: &[Var<'t>],
        params: &[Var<'t>],
        ctx: &mut ForwardCtx<'_>,
    ) -> Result<Var<'t>> {
        self.forward(&xs[0], params, ctx)
    }

    /// A training step's forward pass on a replica that has no examples (its share of a
    /// small last batch is empty): a layer that sums across replicas makes the same calls
    /// of [`ForwardCtx::cross_replica`] as a training forward pass, contributing zeros,
    /// and updates its state as the other replicas do. Nothing for other layers.
    fn forward_without_examples(&self, _ctx: &mut ForwardCtx<'_>) -> Result<()> {
        Ok(())
    }

    /// The backward pass of [`Layer::forward_without_examples`]: the adjoint calls of the
    /// cross-replica sums, with zero gradients (called in reverse layer order, only where
    /// the layer's input depends on a trainable weight, as the tape calls them).
    fn backward_without_examples(&self, _ctx: &mut ForwardCtx<'_>) -> Result<()> {
        Ok(())
    }

    /// The dtype this layer computes in under a mixed precision policy
    /// ([`crate::policy`]): the inputs' by default.
    fn autocast(&self) -> Autocast {
        Autocast::Follow
    }

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
