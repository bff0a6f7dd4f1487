use mirra_autograd::{Tape, Var};
use mirra_tensor::init::{rng, Rng};
use mirra_tensor::{DType, Device, Tensor};

use crate::{ForwardCtx, Layer, NnError, Result};

/// A stack of layers applied in order, as Keras's `Sequential`.
///
/// After [`Sequential::build`], the model owns every parameter in one flat list, in
/// layer order, each with a stable name (`dense/kernel`, `dense_1/kernel`, ...).
///
/// Cloning shares the parameter buffers (an optimizer copies a shared buffer before
/// updating it, so the clones stay independent).
#[derive(Clone, Debug)]
pub struct Sequential {
    layers: Vec<Box<dyn Layer>>,
    names: Vec<String>,
    params: Vec<Tensor>,
    /// For each layer, the range of its parameters in `params`.
    ranges: Vec<std::ops::Range<usize>>,
    input: Vec<usize>,
    output: Vec<usize>,
    dtype: DType,
    /// Where the parameters live (the host until [`Sequential::to_device`]).
    device: Device,
    built: bool,
    /// The variable scope ([`crate::scope`]) the parameters were created in.
    scope: Option<u64>,
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

impl Sequential {
    /// A model of these layers (not yet built).
    pub fn new(layers: Vec<Box<dyn Layer>>) -> Sequential {
        Sequential {
            layers,
            names: vec![],
            params: vec![],
            ranges: vec![],
            input: vec![],
            output: vec![],
            dtype: DType::F32,
            device: Device::Cpu,
            built: false,
            scope: None,
        }
    }

    /// Create the parameters for inputs of shape `input` (without the batch dimension),
    /// initialised from `seed`, in f32.
    pub fn build(&mut self, input: &[usize], seed: u64) -> Result<()> {
        self.build_with(input, DType::F32, &mut rng(seed))
    }

    /// Create the parameters in `dtype` from a caller's generator, on the model's device
    /// (drawn on the host and copied there, so a model starts from the same weights on
    /// every device).
    pub fn build_with(&mut self, input: &[usize], dtype: DType, rng: &mut Rng) -> Result<()> {
        let mut counts = std::collections::HashMap::<&str, usize>::new();
        let (mut names, mut params, mut ranges) = (vec![], vec![], vec![]);
        let mut shape = input.to_vec();
        for layer in &mut self.layers {
            let n = counts.entry(layer.kind()).or_default();
            let layer_name = if *n == 0 {
                layer.kind().to_string()
            } else {
                format!("{}_{}", layer.kind(), n)
            };
            *n += 1;
            let (specs, out) = layer.build(&shape).map_err(|e| match e {
                NnError::Config { msg, .. } => NnError::Config {
                    layer: layer_name.clone(),
                    msg,
                },
                e => e,
            })?;
            let start = params.len();
            for spec in specs {
                params.push(spec.init.init(&spec.dims, dtype, Device::Cpu, rng)?);
                names.push(format!("{layer_name}/{}", spec.name));
            }
            ranges.push(start..params.len());
            shape = out;
        }
        let params = params
            .into_iter()
            .map(|p| p.to_device(self.device))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        (self.names, self.params, self.ranges) = (names, params, ranges);
        (self.input, self.output, self.dtype, self.built) = (input.to_vec(), shape, dtype, true);
        self.scope = crate::scope::current();
        Ok(())
    }

    /// The device the parameters live on, and that inputs are copied to.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Move the parameters to `device` (a copy of each; built or not, later parameters are
    /// created there). Inputs given on the host are copied to it at every forward pass.
    pub fn to_device(&mut self, device: Device) -> Result<()> {
        let params = self
            .params
            .iter()
            .map(|p| p.to_device(device))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        (self.params, self.device) = (params, device);
        Ok(())
    }

    /// The variable scope ([`crate::scope`]) the parameters were created in: a
    /// distribution strategy's id, or `None` for a model built outside every scope.
    pub fn variable_scope(&self) -> Option<u64> {
        self.scope
    }

    /// The parameters, in their stable order.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The parameters, mutably (for an optimizer's in-place update).
    pub fn params_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    /// The parameters' names, parallel to [`Sequential::params`].
    pub fn param_names(&self) -> &[String] {
        &self.names
    }

    /// Total number of scalar parameters.
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

    /// Replace every parameter (shapes and dtypes must match), e.g. from a checkpoint or
    /// another replica; a tensor on another device is copied to the model's.
    pub fn set_params(&mut self, params: Vec<Tensor>) -> Result<()> {
        if params.len() != self.params.len() {
            return Err(NnError::InputMismatch {
                what: "set_params",
                expected: format!("{} tensors", self.params.len()),
                got: format!("{}", params.len()),
            });
        }
        for ((new, old), name) in params.iter().zip(&self.params).zip(&self.names) {
            if new.shape() != old.shape() || new.dtype() != old.dtype() {
                return Err(NnError::InputMismatch {
                    what: "set_params",
                    expected: format!("{name} of shape {} {}", old.shape(), old.dtype()),
                    got: format!("shape {} {}", new.shape(), new.dtype()),
                });
            }
        }
        self.params = params
            .into_iter()
            .map(|p| p.to_device(self.device))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(())
    }

    /// Run the model on a batch `x` (`[batch, ..input_shape]`), recording on `tape`.
    /// Parameter `i` is recorded under key `i`, so gradients line up with
    /// [`Sequential::params`].
    pub fn forward<'t>(
        &self,
        tape: &'t Tape,
        x: Tensor,
        training: bool,
        rng: &mut Rng,
    ) -> Result<ModelOutput<'t>> {
        self.run(tape, x, training, rng, true)
    }

    /// Run the model for inference (no dropout, no parameters tracked for gradients).
    pub fn forward_inference<'t>(&self, tape: &'t Tape, x: Tensor) -> Result<ModelOutput<'t>> {
        self.run(tape, x, false, &mut rng(0), false)
    }

    /// The model's output for a batch (inference: nothing is kept for gradients).
    pub fn predict(&self, x: Tensor) -> Result<Tensor> {
        let tape = Tape::new();
        let out = self.run(&tape, x, false, &mut rng(0), false)?;
        Ok(out.output.value().clone())
    }

    fn run<'t>(
        &self,
        tape: &'t Tape,
        x: Tensor,
        training: bool,
        rng: &mut Rng,
        track: bool,
    ) -> Result<ModelOutput<'t>> {
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
        let mut ctx = ForwardCtx {
            training,
            rng,
            dtype: self.dtype,
        };
        let mut h = tape.constant(x);
        let last = self.layers.len().saturating_sub(1);
        for (i, (layer, range)) in self.layers.iter().zip(&self.ranges).enumerate() {
            let p = &params[range.clone()];
            if i == last {
                if let Some(logits) = layer.forward_logits(&h, p, &mut ctx)? {
                    let output = logits.softmax(-1)?;
                    return Ok(ModelOutput {
                        output,
                        logits: Some(logits),
                    });
                }
            }
            h = layer.forward(&h, p, &mut ctx)?;
        }
        Ok(ModelOutput {
            output: h,
            logits: None,
        })
    }
}

fn join(dims: &[usize]) -> String {
    dims.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
