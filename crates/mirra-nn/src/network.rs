use std::ops::Range;
use std::sync::Arc;

use mirra_autograd::{LinearMap, Tape, Var};
use mirra_tensor::init::{rng, Rng};
use mirra_tensor::{DType, Device, Tensor};

use crate::graph::{Graph, Symbol};
use crate::policy::{self, Policy};
use crate::{Examples, ForwardCtx, Layer, NnError, Result, Role};

/// A model: layers, what each is applied to, and every variable they own.
///
/// Built two ways, as in Keras: [`Network::new`] (also spelt [`Sequential::new`]) stacks
/// layers, each applied to the previous one's output; [`Network::functional`] takes a
/// [`Graph`] of layers called on symbolic values, for skip connections (residual blocks,
/// U-Net). After [`Network::build`] the model owns its variables in two flat lists, each
/// with stable names (`dense/kernel`, `dense_1/kernel`, `batch_normalization/moving_mean`,
/// ...) in layer order: the trainable weights ([`Network::params`]), which the optimizer
/// updates, and the non-trainable state ([`Network::state`], batch norm's moving
/// statistics), which training forward passes update. [`Network::weights`] is both, the
/// trainable ones first (what checkpoints save).
///
/// Cloning shares the buffers (an optimizer copies a shared buffer before updating it, so
/// the clones stay independent).
#[derive(Clone, Debug)]
pub struct Network {
    nodes: Vec<Node>,
    names: Vec<String>,
    params: Vec<Tensor>,
    state_names: Vec<String>,
    state: Vec<Tensor>,
    roles: Vec<Role>,
    /// Per value (0: the input, `i + 1`: node `i`'s output): whether it depends on a
    /// trainable weight, so that a training pass records it for gradients.
    needs_grad: Vec<bool>,
    input: Vec<usize>,
    output: Vec<usize>,
    dtype: DType,
    /// Where the variables live (the host until [`Network::to_device`]).
    device: Device,
    built: bool,
    /// The variable scope ([`crate::scope`]) the variables were created in.
    scope: Option<u64>,
    /// The sum across the replicas of a mirrored strategy, for layers that synchronise
    /// statistics (set by the strategy on each replica's copy).
    cross_replica: Option<Arc<dyn LinearMap>>,
    /// The dtype policy of layers without one of their own ([`crate::policy`]).
    policy: Policy,
}

/// New values of layers' state: each layer's range in [`Network::state`] and its values
/// (empty: unchanged).
type StateUpdates = Vec<(Range<usize>, Vec<Tensor>)>;

/// Store a pass's state `updates` in `state` (a layer updates its whole state or none).
fn apply_updates(state: &mut [Tensor], updates: StateUpdates) {
    for (range, values) in updates {
        if !values.is_empty() {
            debug_assert_eq!(range.len(), values.len(), "a layer's whole state");
            for (slot, v) in state[range].iter_mut().zip(values) {
                *slot = v;
            }
        }
    }
}

/// Keras's name for a network of stacked layers: `Sequential::new(layers)`.
pub type Sequential = Network;

/// One layer of a network and the values it is applied to.
#[derive(Clone, Debug)]
struct Node {
    layer: Box<dyn Layer>,
    /// Value ids: 0 is the network's input, `i + 1` node `i`'s output; all below this
    /// node's own.
    inputs: Vec<usize>,
    /// This layer's trainable weights in [`Network::params`].
    params: Range<usize>,
    /// This layer's state in [`Network::state`].
    state: Range<usize>,
    /// The layer's own dtype policy, if it has one (else the network's).
    policy: Option<Policy>,
}

/// The result of a forward pass: the model's output and, when the last layer ends in a
/// softmax, the logits before it.
#[derive(Debug)]
pub struct ModelOutput<'t> {
    /// The model's output (probabilities for a softmax classifier).
    pub output: Var<'t>,
    /// The last layer's input to its softmax, if it has one.
    pub logits: Option<Var<'t>>,
}

impl Network {
    /// A network of these layers, each applied to the previous one's output (Keras's
    /// `Sequential`); not yet built.
    pub fn new(layers: Vec<Box<dyn Layer>>) -> Network {
        let nodes = layers
            .into_iter()
            .enumerate()
            .map(|(i, layer)| Node::new(layer, vec![i]))
            .collect();
        Network::from_nodes(nodes)
    }

    /// The network from `graph`'s input to `output` (Keras's functional
    /// `Model(inputs, outputs)`); layers whose results `output` does not depend on are
    /// left out. Not yet built.
    pub fn functional(graph: Graph, output: Symbol) -> Result<Network> {
        let config = |msg: String| NnError::Config {
            layer: "functional model".into(),
            msg,
        };
        let n = graph.nodes.len();
        if output.0 == 0 {
            return Err(config("its output is its input: it has no layers".into()));
        }
        if output.0 > n {
            return Err(config(format!(
                "its output is symbol {} of a graph of {n} layers (a symbol of another graph?)",
                output.0
            )));
        }
        for (i, (layer, inputs)) in graph.nodes.iter().enumerate() {
            if inputs.is_empty() || inputs.iter().any(|s| s.0 > i) {
                return Err(config(format!(
                    "layer {i} ({}) is called on {inputs:?}: a layer takes at least one \
                     symbol of its own graph",
                    layer.kind()
                )));
            }
        }
        // The values the output depends on, and their new ids.
        let mut used = vec![false; n + 1];
        used[output.0] = true;
        for v in (1..=n).rev() {
            if used[v] {
                for s in &graph.nodes[v - 1].1 {
                    used[s.0] = true;
                }
            }
        }
        let mut renumbered = vec![0; n + 1];
        let mut nodes = Vec::new();
        for (i, (layer, inputs)) in graph.nodes.into_iter().enumerate() {
            if used[i + 1] {
                let inputs = inputs.iter().map(|s| renumbered[s.0]).collect();
                nodes.push(Node::new(layer, inputs));
                renumbered[i + 1] = nodes.len();
            }
        }
        Ok(Network::from_nodes(nodes))
    }

    fn from_nodes(nodes: Vec<Node>) -> Network {
        Network {
            nodes,
            names: vec![],
            params: vec![],
            state_names: vec![],
            state: vec![],
            roles: vec![],
            needs_grad: vec![],
            input: vec![],
            output: vec![],
            dtype: DType::F32,
            device: Device::Cpu,
            built: false,
            scope: None,
            cross_replica: None,
            policy: Policy::Float32,
        }
    }

    /// The dtype policy of the layers that have none of their own (Keras's
    /// `mixed_precision.set_global_policy` for this model): variables keep their dtype,
    /// matrix products and convolutions compute in the policy's ([`crate::policy`]).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// The network's dtype policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Layer `index`'s own dtype policy (in call order, as [`Network::layer_kinds`] lists
    /// them; Keras's `dtype=` of one layer), e.g. `float32` for a layer that must not
    /// compute in 16 bits.
    pub fn set_layer_policy(&mut self, index: usize, policy: Policy) -> Result<()> {
        let count = self.nodes.len();
        let node = self.nodes.get_mut(index).ok_or_else(|| NnError::Config {
            layer: format!("layer {index}"),
            msg: format!("the network has {count} layers"),
        })?;
        node.policy = Some(policy);
        Ok(())
    }

    /// The kind of each layer, in call order.
    pub fn layer_kinds(&self) -> Vec<&'static str> {
        self.nodes.iter().map(|n| n.layer.kind()).collect()
    }

    /// Create the variables for inputs of shape `input` (without the batch dimension),
    /// initialised from `seed`, in f32.
    pub fn build(&mut self, input: &[usize], seed: u64) -> Result<()> {
        self.build_with(input, DType::F32, &mut rng(seed))
    }

    /// Create the variables in `dtype` from a caller's generator, on the model's device
    /// (drawn on the host and copied there, so a model starts from the same weights on
    /// every device).
    pub fn build_with(&mut self, input: &[usize], dtype: DType, rng: &mut Rng) -> Result<()> {
        let mut counts = std::collections::HashMap::<&str, usize>::new();
        let (mut names, mut params) = (vec![], vec![]);
        let (mut state_names, mut state, mut roles) = (vec![], vec![], vec![]);
        let mut shapes = vec![input.to_vec()];
        let mut needs_grad = vec![false];
        for node in &mut self.nodes {
            let layer = &mut node.layer;
            let n = counts.entry(layer.kind()).or_default();
            let layer_name = if *n == 0 {
                layer.kind().to_string()
            } else {
                format!("{}_{}", layer.kind(), n)
            };
            *n += 1;
            let inputs: Vec<Vec<usize>> = node.inputs.iter().map(|&v| shapes[v].clone()).collect();
            let (specs, out) = layer.build_inputs(&inputs).map_err(|e| match e {
                NnError::Config { msg, .. } => NnError::Config {
                    layer: layer_name.clone(),
                    msg,
                },
                e => e,
            })?;
            let (p0, s0) = (params.len(), state.len());
            for spec in specs {
                let value = spec.init.init(&spec.dims, dtype, Device::Cpu, rng)?;
                let name = format!("{layer_name}/{}", spec.name);
                if spec.role == Role::Trainable {
                    params.push(value);
                    names.push(name);
                } else {
                    state.push(value);
                    state_names.push(name);
                    roles.push(spec.role);
                }
            }
            (node.params, node.state) = (p0..params.len(), s0..state.len());
            needs_grad.push(!node.params.is_empty() || node.inputs.iter().any(|&v| needs_grad[v]));
            shapes.push(out);
        }
        let to_device = |ts: Vec<Tensor>| {
            ts.into_iter()
                .map(|p| p.to_device(self.device))
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        (self.params, self.state) = (to_device(params)?, to_device(state)?);
        (self.names, self.state_names, self.roles) = (names, state_names, roles);
        self.needs_grad = needs_grad;
        self.output = shapes.pop().expect("the input's shape at least");
        (self.input, self.dtype, self.built) = (input.to_vec(), dtype, true);
        self.scope = crate::scope::current();
        Ok(())
    }

    /// The device the variables live on, and that inputs are copied to.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Move the variables to `device` (a copy of each; built or not, later variables are
    /// created there). Inputs given on the host are copied to it at every forward pass.
    pub fn to_device(&mut self, device: Device) -> Result<()> {
        let moved = |ts: &[Tensor]| {
            ts.iter()
                .map(|p| p.to_device(device))
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        (self.params, self.state) = (moved(&self.params)?, moved(&self.state)?);
        self.device = device;
        Ok(())
    }

    /// The variable scope ([`crate::scope`]) the variables were created in: a
    /// distribution strategy's id, or `None` for a model built outside every scope.
    pub fn variable_scope(&self) -> Option<u64> {
        self.scope
    }

    /// Give the layers that synchronise statistics across replicas (synchronised batch
    /// norm) the strategy's cross-replica sum, on this replica's copy; `None`: the
    /// network's own batch alone.
    pub fn set_cross_replica(&mut self, sum: Option<Arc<dyn LinearMap>>) {
        self.cross_replica = sum;
    }

    /// The trainable weights, in their stable order.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The trainable weights, mutably (for an optimizer's in-place update).
    pub fn params_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    /// The trainable weights' names, parallel to [`Network::params`].
    pub fn param_names(&self) -> &[String] {
        &self.names
    }

    /// The non-trainable state (moving statistics), in its stable order.
    pub fn state(&self) -> &[Tensor] {
        &self.state
    }

    /// The state, mutably (for averaging it across replicas).
    pub fn state_mut(&mut self) -> &mut [Tensor] {
        &mut self.state
    }

    /// The state's names, parallel to [`Network::state`].
    pub fn state_names(&self) -> &[String] {
        &self.state_names
    }

    /// Who updates each state variable, parallel to [`Network::state`].
    pub fn state_roles(&self) -> &[Role] {
        &self.roles
    }

    /// Every variable: the trainable weights, then the state (Keras's `model.weights`,
    /// what a checkpoint saves).
    pub fn weights(&self) -> Vec<Tensor> {
        self.params.iter().chain(&self.state).cloned().collect()
    }

    /// Every variable, mutably, in the order of [`Network::weights`] (for a broadcast).
    pub fn weights_mut(&mut self) -> impl Iterator<Item = &mut Tensor> {
        self.params.iter_mut().chain(self.state.iter_mut())
    }

    /// The names of [`Network::weights`].
    pub fn weight_names(&self) -> Vec<String> {
        self.names
            .iter()
            .chain(&self.state_names)
            .cloned()
            .collect()
    }

    /// Total number of scalar trainable weights.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(Tensor::elem_count).sum()
    }

    /// The input shape (without the batch dimension).
    pub fn input_shape(&self) -> &[usize] {
        &self.input
    }

    /// The output shape (without the batch dimension).
    pub fn output_shape(&self) -> &[usize] {
        &self.output
    }

    /// The dtype of the variables, and of the model's output (and logits).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Replace every trainable weight (shapes and dtypes must match), e.g. from another
    /// replica; a tensor on another device is copied to the model's.
    pub fn set_params(&mut self, params: Vec<Tensor>) -> Result<()> {
        self.params = self.checked(params, &self.params, &self.names)?;
        Ok(())
    }

    /// Replace every variable, in the order of [`Network::weights`] (from a checkpoint).
    pub fn set_weights(&mut self, mut weights: Vec<Tensor>) -> Result<()> {
        let n = self.params.len();
        if weights.len() != n + self.state.len() {
            return Err(NnError::InputMismatch {
                what: "set_weights",
                expected: format!(
                    "{} tensors ({n} trainable, {} state)",
                    n + self.state.len(),
                    self.state.len()
                ),
                got: format!("{}", weights.len()),
            });
        }
        let state = weights.split_off(n);
        let params = self.checked(weights, &self.params, &self.names)?;
        let state = self.checked(state, &self.state, &self.state_names)?;
        (self.params, self.state) = (params, state);
        Ok(())
    }

    /// `new` on this model's device, after checking it against `old` (count, shapes and
    /// dtypes).
    fn checked(&self, new: Vec<Tensor>, old: &[Tensor], names: &[String]) -> Result<Vec<Tensor>> {
        if new.len() != old.len() {
            return Err(NnError::InputMismatch {
                what: "set_params",
                expected: format!("{} tensors", old.len()),
                got: format!("{}", new.len()),
            });
        }
        for ((new, old), name) in new.iter().zip(old).zip(names) {
            if new.shape() != old.shape() || new.dtype() != old.dtype() {
                return Err(NnError::InputMismatch {
                    what: "set_params",
                    expected: format!("{name} of shape {} {}", old.shape(), old.dtype()),
                    got: format!("shape {} {}", new.shape(), new.dtype()),
                });
            }
        }
        Ok(new
            .into_iter()
            .map(|p| p.to_device(self.device))
            .collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Run the model on a batch `x` (`[batch, ..input_shape]`), recording on `tape`.
    /// Parameter `i` is recorded under key `i`, so gradients line up with
    /// [`Network::params`]. A training pass updates the state (batch norm's moving
    /// statistics), as a Keras model called with `training=True` does.
    pub fn forward<'t>(
        &mut self,
        tape: &'t Tape,
        x: Tensor,
        training: bool,
        examples: Examples,
    ) -> Result<ModelOutput<'t>> {
        let (out, updates) = self.run(tape, x, training, examples, true)?;
        self.apply(updates);
        Ok(out)
    }

    /// [`forward`](Network::forward) on a shared network: several threads may run it at
    /// once, each on its own tape (a deterministic replica's micro-batches). Returns the
    /// output and the state the pass leaves (batch norm's moving statistics, updated as
    /// [`forward`](Network::forward) would store them), for the caller to store with
    /// [`state_mut`](Network::state_mut).
    pub fn forward_shared<'t>(
        &self,
        tape: &'t Tape,
        x: Tensor,
        training: bool,
        examples: Examples,
    ) -> Result<(ModelOutput<'t>, Vec<Tensor>)> {
        let (out, updates) = self.run(tape, x, training, examples, true)?;
        let mut state = self.state.clone();
        apply_updates(&mut state, updates);
        Ok((out, state))
    }

    /// Run the model for inference (no dropout, moving statistics, no parameters tracked
    /// for gradients).
    pub fn forward_inference<'t>(&self, tape: &'t Tape, x: Tensor) -> Result<ModelOutput<'t>> {
        Ok(self.run(tape, x, false, Examples::default(), false)?.0)
    }

    /// The model's output for a batch (inference: nothing is kept for gradients).
    pub fn predict(&self, x: Tensor) -> Result<Tensor> {
        let tape = Tape::new();
        let out = self.forward_inference(&tape, x)?;
        Ok(out.output.value().clone())
    }

    /// A training step's forward and backward passes on a replica of a mirrored strategy
    /// that has no examples (the last batch was smaller than the replica count): the
    /// layers that sum statistics across replicas take part with zeros, in the order a
    /// training pass and its backward pass would, and update their state as the other
    /// replicas do. Nothing happens outside a strategy.
    pub fn step_without_examples(&mut self) -> Result<()> {
        let Some(sum) = self.cross_replica.clone() else {
            return Ok(());
        };
        let mut updates = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let mut ctx = self.ctx(node, i, true, Examples::default(), Some(&sum));
            node.layer.forward_without_examples(&mut ctx)?;
            updates.push((node.state.clone(), ctx.new_state));
        }
        self.apply(updates);
        for (i, node) in self.nodes.iter().enumerate().rev() {
            if node.inputs.iter().any(|&v| self.needs_grad[v]) {
                let mut ctx = self.ctx(node, i, true, Examples::default(), Some(&sum));
                node.layer.backward_without_examples(&mut ctx)?;
            }
        }
        Ok(())
    }

    fn ctx<'a>(
        &'a self,
        node: &Node,
        layer: usize,
        training: bool,
        examples: Examples,
        cross_replica: Option<&'a Arc<dyn LinearMap>>,
    ) -> ForwardCtx<'a> {
        ForwardCtx {
            training,
            examples,
            layer,
            dtype: self.dtype,
            state: &self.state[node.state.clone()],
            new_state: Vec::new(),
            cross_replica,
        }
    }

    /// Store the new state values layers gave (an empty list: unchanged).
    fn apply(&mut self, updates: StateUpdates) {
        apply_updates(&mut self.state, updates);
    }

    fn run<'t>(
        &self,
        tape: &'t Tape,
        x: Tensor,
        training: bool,
        examples: Examples,
        track: bool,
    ) -> Result<(ModelOutput<'t>, StateUpdates)> {
        if !self.built {
            return Err(NnError::NotBuilt);
        }
        if x.rank() != self.input.len() + 1 || x.dims()[1..] != self.input[..] {
            return Err(NnError::InputMismatch {
                what: "model input",
                expected: format!("[batch, {}]", join(&self.input)),
                got: format!("{}", x.shape()),
            });
        }
        // Converted where it is, then copied: a host batch of bytes becomes floats on the
        // host, and crosses to the device once.
        let x = x.to_dtype(self.dtype)?.to_device(self.device)?;
        let params: Vec<Var<'t>> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if track {
                    tape.param(p.clone(), i)
                } else {
                    tape.constant(p.clone())
                }
            })
            .collect();
        let sum = self.cross_replica.as_ref().filter(|_| training);
        let mut values = vec![tape.constant(x)];
        let mut updates = Vec::new();
        let last = self.nodes.len().saturating_sub(1);
        for (i, node) in self.nodes.iter().enumerate() {
            let xs: Vec<Var<'t>> = node.inputs.iter().map(|&v| values[v].clone()).collect();
            let p = &params[node.params.clone()];
            // The dtype this layer computes in: its inputs and weights cast to it.
            let dtypes: Vec<DType> = xs.iter().map(|x| x.value().dtype()).collect();
            let policy = node.policy.unwrap_or(self.policy);
            let dtype = policy::compute_dtype(policy, node.layer.autocast(), &dtypes, self.dtype);
            let cast_params;
            let (xs, p) = if dtypes.iter().all(|&d| d == dtype)
                && p.iter().all(|v| v.value().dtype() == dtype)
            {
                (xs, p)
            } else {
                cast_params = policy::cast_all(p, dtype)?;
                (policy::cast_all(&xs, dtype)?, &cast_params[..])
            };
            let mut ctx = self.ctx(node, i, training, examples, sum);
            if i == last {
                if let Some(logits) = node.layer.forward_logits(&xs[0], p, &mut ctx)? {
                    // The softmax and the loss in the variables' dtype.
                    let logits = logits.to_dtype(self.dtype)?;
                    let output = logits.softmax(-1)?;
                    updates.push((node.state.clone(), ctx.new_state));
                    let out = ModelOutput {
                        output,
                        logits: Some(logits),
                    };
                    return Ok((out, updates));
                }
            }
            let h = node.layer.forward_inputs(&xs, p, &mut ctx)?;
            updates.push((node.state.clone(), ctx.new_state));
            values.push(h);
        }
        // The output in the variables' dtype, whatever the last layer computed in.
        let output = values
            .pop()
            .expect("the input at least")
            .to_dtype(self.dtype)?;
        Ok((
            ModelOutput {
                output,
                logits: None,
            },
            updates,
        ))
    }
}

impl Node {
    fn new(layer: Box<dyn Layer>, inputs: Vec<usize>) -> Node {
        Node {
            layer,
            inputs,
            params: 0..0,
            state: 0..0,
            policy: None,
        }
    }
}

fn join(dims: &[usize]) -> String {
    dims.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use mirra_tensor::{Device, Tensor};

    use crate::{Activation, Add, Concatenate, Dense, Graph, Network, NnError};

    fn x() -> Tensor {
        Tensor::from_vec(vec![1.0f32, -2.0, 0.5, 3.0, 0.0, 1.5], &[2, 3], Device::Cpu).unwrap()
    }

    #[test]
    fn a_residual_block_adds_its_input_and_its_names_are_stable() {
        let mut g = Graph::new();
        let input = g.input();
        let h = g.call(Dense::new(3, Activation::Linear), input);
        let y = g.merge(Add, &[h, input]);
        let mut net = Network::functional(g, y).unwrap();
        net.build(&[3], 4).unwrap();
        assert_eq!(net.param_names(), ["dense/kernel", "dense/bias"]);
        // The same dense layer alone, from the same seed, gives `h`.
        let mut alone = Network::new(vec![Box::new(Dense::new(3, Activation::Linear))]);
        alone.build(&[3], 4).unwrap();
        let h = alone.predict(x()).unwrap().to_vec::<f32>().unwrap();
        let y = net.predict(x()).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = h
            .iter()
            .zip(x().to_vec::<f32>().unwrap())
            .map(|(a, b)| a + b)
            .collect();
        assert_eq!(y, want);
    }

    #[test]
    fn concatenate_joins_channels_and_unused_branches_are_left_out() {
        let mut g = Graph::new();
        let input = g.input();
        let a = g.call(Dense::new(2, Activation::Relu), input);
        let b = g.call(Dense::new(5, Activation::Relu), input);
        let _unused = g.call(Dense::new(7, Activation::Relu), b);
        let y = g.merge(Concatenate::default(), &[a, b, input]);
        let mut net = Network::functional(g, y).unwrap();
        net.build(&[3], 1).unwrap();
        assert_eq!(net.output_shape(), [2 + 5 + 3]);
        assert_eq!(net.param_names().len(), 4, "{:?}", net.param_names());
        let out = net.predict(x()).unwrap();
        assert_eq!(out.dims(), [2, 10]);
        // The input comes last, unchanged.
        let row: Vec<f32> = out.to_vec::<f32>().unwrap()[7..10].to_vec();
        assert_eq!(row, [1.0, -2.0, 0.5]);
    }

    #[test]
    fn wrong_graphs_are_errors_that_name_the_layer() {
        let config = |r: Result<(), NnError>| match r {
            Err(NnError::Config { layer, msg }) => format!("{layer}: {msg}"),
            other => panic!("{other:?}"),
        };
        // Shapes that cannot be added.
        let mut g = Graph::new();
        let input = g.input();
        let a = g.call(Dense::new(2, Activation::Relu), input);
        let y = g.merge(Add, &[a, input]);
        let mut net = Network::functional(g, y).unwrap();
        let msg = config(net.build(&[3], 1));
        assert!(
            msg.starts_with("add: ") && msg.contains("[2] and [3]"),
            "{msg}"
        );
        // A merge layer called on one input.
        let mut g = Graph::new();
        let input = g.input();
        let y = g.call(Concatenate::default(), input);
        let msg = config(Network::functional(g, y).unwrap().build(&[3], 1));
        assert!(msg.contains("two or more inputs"), "{msg}");
        // A plain layer called on two.
        let mut g = Graph::new();
        let input = g.input();
        let y = g.merge(Dense::new(2, Activation::Relu), &[input, input]);
        let msg = config(Network::functional(g, y).unwrap().build(&[3], 1));
        assert!(msg.contains("takes one input, was given 2"), "{msg}");
        // An output that is the input, or a symbol of a larger graph.
        let g = Graph::new();
        let input = g.input();
        assert!(Network::functional(g, input).is_err());
        let mut big = Graph::new();
        let i = big.input();
        let far = big.call(Dense::new(1, Activation::Relu), i);
        let far = big.call(Dense::new(1, Activation::Relu), far);
        let mut small = Graph::new();
        let i = small.input();
        small.call(Dense::new(1, Activation::Relu), i);
        assert!(Network::functional(small, far).is_err());
    }
}
