//! Layers of several inputs, for skip connections: `Add` (residual blocks) and
//! `Concatenate` (U-Net), as Keras's; called through the functional API
//! ([`Graph::merge`](crate::Graph::merge)).

use mirra_autograd::Var;

use crate::{ForwardCtx, Layer, NnError, ParamSpec, Result};

fn config(layer: &str, msg: String) -> NnError {
    NnError::Config {
        layer: layer.into(),
        msg,
    }
}

fn at_least_two(layer: &str, inputs: &[Vec<usize>]) -> Result<()> {
    if inputs.len() < 2 {
        return Err(config(
            layer,
            format!(
                "merges two or more inputs, was given {} (call it with Graph::merge)",
                inputs.len()
            ),
        ));
    }
    Ok(())
}

fn one_input(layer: &str) -> NnError {
    config(
        layer,
        "merges two or more inputs (call it with Graph::merge)".into(),
    )
}

/// The element-wise sum of its inputs, which must have one shape (Keras's `Add`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Add;

impl Layer for Add {
    fn kind(&self) -> &'static str {
        "add"
    }

    fn build(&mut self, _: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        Err(one_input("add"))
    }

    fn build_inputs(&mut self, inputs: &[Vec<usize>]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        at_least_two("add", inputs)?;
        if let Some(other) = inputs.iter().find(|s| **s != inputs[0]) {
            return Err(config(
                "add",
                format!(
                    "inputs of shapes {:?} and {other:?}: they must match",
                    inputs[0]
                ),
            ));
        }
        Ok((vec![], inputs[0].clone()))
    }

    fn forward<'t>(&self, _: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        Err(one_input("add"))
    }

    fn forward_inputs<'t>(
        &self,
        xs: &[Var<'t>],
        _: &[Var<'t>],
        _: &mut ForwardCtx<'_>,
    ) -> Result<Var<'t>> {
        Ok(Var::add_n(&xs.iter().collect::<Vec<_>>())?)
    }
}

/// Its inputs joined along one axis (Keras's `Concatenate`, by default the last: the
/// channels); the other dimensions must match.
#[derive(Clone, Copy, Debug)]
pub struct Concatenate {
    /// The axis of an example (without the batch dimension); negative counts from the end.
    axis: isize,
    /// `axis` made non-negative by [`Layer::build_inputs`].
    resolved: usize,
}

impl Default for Concatenate {
    fn default() -> Concatenate {
        Concatenate::new(-1)
    }
}

impl Concatenate {
    /// Join along `axis` of each example (without the batch dimension; -1: the last).
    pub fn new(axis: isize) -> Concatenate {
        Concatenate { axis, resolved: 0 }
    }
}

impl Layer for Concatenate {
    fn kind(&self) -> &'static str {
        "concatenate"
    }

    fn build(&mut self, _: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        Err(one_input("concatenate"))
    }

    fn build_inputs(&mut self, inputs: &[Vec<usize>]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
        at_least_two("concatenate", inputs)?;
        let rank = inputs[0].len() as isize;
        let axis = if self.axis < 0 {
            self.axis + rank
        } else {
            self.axis
        };
        if !(0..rank).contains(&axis) {
            return Err(config(
                "concatenate",
                format!("axis {} of inputs {:?}", self.axis, inputs[0]),
            ));
        }
        let axis = axis as usize;
        let mut out = inputs[0].clone();
        for other in &inputs[1..] {
            let mismatch = other.len() != out.len()
                || other
                    .iter()
                    .zip(&out)
                    .enumerate()
                    .any(|(i, (a, b))| i != axis && a != b);
            if mismatch {
                return Err(config(
                    "concatenate",
                    format!(
                        "inputs of shapes {:?} and {other:?} differ outside axis {}",
                        inputs[0], self.axis
                    ),
                ));
            }
            out[axis] += other[axis];
        }
        self.resolved = axis;
        Ok((vec![], out))
    }

    fn forward<'t>(&self, _: &Var<'t>, _: &[Var<'t>], _: &mut ForwardCtx<'_>) -> Result<Var<'t>> {
        Err(one_input("concatenate"))
    }

    fn forward_inputs<'t>(
        &self,
        xs: &[Var<'t>],
        _: &[Var<'t>],
        _: &mut ForwardCtx<'_>,
    ) -> Result<Var<'t>> {
        let refs: Vec<&Var<'t>> = xs.iter().collect();
        Ok(Var::concat(&refs, self.resolved as isize + 1)?)
    }
}
