use std::cell::RefCell;

use mirra_tensor::{Shape, Tensor};

use crate::backward::{input_grads, Grad};
use crate::op::{Node, Op, NONE};
use crate::{AutogradError, Result};

/// A record of operations on one thread. Not `Sync`: each replica thread has its own.
///
/// Reuse one tape across steps with [`Tape::clear`]; it keeps its capacity, so a warmed
/// up step records without allocating.
#[derive(Debug, Default)]
pub struct Tape {
    nodes: RefCell<Vec<Node>>,
}

/// Gradients by parameter key, as returned by [`Tape::backward`].
#[derive(Debug, Default, Clone)]
pub struct Gradients {
    grads: Vec<Option<Tensor>>,
}

impl Gradients {
    /// The gradient of the parameter with `key`, if the loss depends on it.
    pub fn get(&self, key: usize) -> Option<&Tensor> {
        self.grads.get(key).and_then(Option::as_ref)
    }

    /// Take the gradient of `key` out.
    pub fn take(&mut self, key: usize) -> Option<Tensor> {
        self.grads.get_mut(key).and_then(Option::take)
    }

    /// Number of key slots (the largest key seen plus one).
    pub fn len(&self) -> usize {
        self.grads.len()
    }

    /// True when no gradient was computed.
    pub fn is_empty(&self) -> bool {
        self.grads.iter().all(Option::is_none)
    }
}

impl Tape {
    /// An empty tape.
    pub fn new() -> Tape {
        Tape::default()
    }

    /// Forget every recorded operation, keeping the capacity.
    pub fn clear(&self) {
        self.nodes.borrow_mut().clear();
    }

    /// Number of recorded nodes.
    pub fn len(&self) -> usize {
        self.nodes.borrow().len()
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record a node and return its id.
    pub(crate) fn push(&self, op: Op, inputs: [usize; 2], shape: Shape) -> usize {
        let mut nodes = self.nodes.borrow_mut();
        let id = nodes.len();
        for &i in inputs.iter().chain(op.variadic_inputs()) {
            if i != NONE && nodes[i].first_use == NONE {
                nodes[i].first_use = id;
            }
        }
        nodes.push(Node {
            op,
            inputs,
            shape,
            first_use: NONE,
        });
        id
    }

    /// Backward from node `root` (none: a value that depends on no parameter) seeded with
    /// `seed`; see [`Tape::backward_with`].
    pub(crate) fn backward_from(
        &self,
        root: Option<usize>,
        seed: Tensor,
        on_ready: &mut dyn FnMut(usize, &Tensor) -> std::result::Result<(), String>,
    ) -> Result<Gradients> {
        let nodes = self.nodes.borrow();
        let mut out = Gradients::default();
        let Some(root_id) = root else {
            return Ok(out);
        };
        let mut grads: Vec<Option<Tensor>> = vec![None; root_id + 1];
        grads[root_id] = Some(seed);
        let mut finish = |out: &mut Gradients, key: usize, g: Tensor| -> Result<()> {
            on_ready(key, &g).map_err(|message| AutogradError::Hook { key, message })?;
            if out.grads.len() <= key {
                out.grads.resize(key + 1, None);
            }
            out.grads[key] = Some(g);
            Ok(())
        };
        for id in (0..=root_id).rev() {
            let node = &nodes[id];
            let Some(g) = grads[id].take() else { continue };
            if let Op::Leaf { key } = node.op {
                // The root, or a parameter whose first consumer got no gradient (a branch the
                // loss does not depend on): its other contributions are all in by now.
                if let Some(key) = key {
                    finish(&mut out, key, g)?;
                }
                continue;
            }
            input_grads(&nodes, node, g, &mut |input, gi| {
                accumulate(&mut grads[input], gi)
            })?;
            // Parameters first used here have received every contribution: hand them out.
            for input in node.all_inputs() {
                let leaf = &nodes[input];
                if let (Op::Leaf { key: Some(key) }, true) = (&leaf.op, leaf.first_use == id) {
                    if let Some(g) = grads[input].take() {
                        finish(&mut out, *key, g)?;
                    }
                }
            }
        }
        Ok(out)
    }
}

fn accumulate(slot: &mut Option<Tensor>, g: Grad) -> Result<()> {
    *slot = Some(g.added_to(slot.take())?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use mirra_tensor::{DType, Device};

    use super::*;

    fn t(v: &[f64], dims: &[usize]) -> Tensor {
        Tensor::from_slice(v, dims, Device::Cpu).unwrap()
    }

    #[test]
    fn gradients_of_a_dense_layer_and_its_bias() {
        let tape = Tape::new();
        let x = tape.constant(t(&[1., 2., 3., 4.], &[2, 2]));
        let w = tape.param(t(&[1., 0., 0., 1.], &[2, 2]), 0);
        let b = tape.param(t(&[0.5, -0.5], &[2]), 1);
        let loss = x
            .matmul(&w)
            .unwrap()
            .add(&b)
            .unwrap()
            .sum(&[], false)
            .unwrap();
        let grads = tape.backward(&loss).unwrap();
        // d/dW sum(XW) = X^T 1 = column sums of X per row of W.
        assert_eq!(
            grads.get(0).unwrap().to_vec::<f64>().unwrap(),
            [4., 4., 6., 6.]
        );
        assert_eq!(grads.get(1).unwrap().to_vec::<f64>().unwrap(), [2., 2.]);
    }

    #[test]
    fn a_parameter_used_twice_is_reported_once_with_both_contributions() {
        let tape = Tape::new();
        let w = tape.param(t(&[3.0], &[1]), 7);
        let loss = w.mul(&w).unwrap().add(&w).unwrap().sum(&[], false).unwrap();
        let mut reported = vec![];
        let grads = tape
            .backward_with(&loss, |k, g| {
                reported.push((k, g.to_vec::<f64>().unwrap()));
                Ok(())
            })
            .unwrap();
        assert_eq!(reported, vec![(7, vec![7.0])]);
        assert_eq!(grads.get(7).unwrap().to_vec::<f64>().unwrap(), [7.0]);
    }

    #[test]
    fn later_layers_are_ready_first() {
        let tape = Tape::new();
        let x = tape.constant(t(&[1., 2.], &[1, 2]));
        let w1 = tape.param(t(&[1., 1., 1., 1.], &[2, 2]), 0);
        let w2 = tape.param(t(&[1., 1.], &[2, 1]), 1);
        let h = x.matmul(&w1).unwrap().relu().unwrap();
        let loss = h.matmul(&w2).unwrap().sum(&[], false).unwrap();
        let mut order = vec![];
        tape.backward_with(&loss, |k, _| {
            order.push(k);
            Ok(())
        })
        .unwrap();
        assert_eq!(order, [1, 0]);
    }

    #[test]
    fn a_cast_hands_its_gradient_back_in_the_source_dtype() {
        // An f64 weight used in f32 (as an f32 master weight is used in bf16): the product
        // rounds in f32, and the gradient arrives in f64, the weight's own dtype.
        let tape = Tape::new();
        let w = tape.param(t(&[1.0 + 1e-12, 3.0], &[2]), 0);
        let w32 = w.to_dtype(DType::F32).unwrap();
        assert_eq!(w32.value().dtype(), DType::F32);
        assert_eq!(w32.value().to_vec::<f32>().unwrap(), [1.0, 3.0]);
        let x = tape.constant(Tensor::from_slice(&[2.0f32, 0.5], &[2], Device::Cpu).unwrap());
        let loss = w32.mul(&x).unwrap().sum(&[], false).unwrap();
        let g = tape.backward(&loss).unwrap();
        let g = g.get(0).unwrap();
        assert_eq!(g.dtype(), DType::F64);
        assert_eq!(g.to_vec::<f64>().unwrap(), [2.0, 0.5]);
        // A cast to the dtype a variable has already records nothing.
        let before = tape.len();
        let same = w.to_dtype(DType::F64).unwrap();
        assert_eq!(tape.len(), before);
        assert_eq!(same.value().to_vec::<f64>().unwrap(), [1.0 + 1e-12, 3.0]);
    }

    #[test]
    fn a_non_scalar_loss_is_an_error() {
        let tape = Tape::new();
        let w = tape.param(t(&[1., 2.], &[2]), 0);
        let err = tape.backward(&w).unwrap_err();
        assert_eq!(
            err.to_string(),
            "backward: the loss must be a scalar, got shape [2]"
        );
    }
}
