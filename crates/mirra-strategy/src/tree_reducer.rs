//! [`TreeReducer`]: deterministic mode's gradient sum, in the fixed tree of
//! [`micro_batches`](crate::MicroBatches), across replicas.
//!
//! Each micro-batch's gradients (and the step's scalars beside them, such as its loss) are
//! laid out in one flat tensor, a leaf of the tree. A replica sums its own subtrees; one
//! all-gather gives every replica every replica's subtrees (each sends as many slots as the
//! replica that owns the most, unused slots zero and never read); every replica then sums
//! the top of the tree from them by node, in the same order, so all of them hold the bits
//! one replica summing every micro-batch alone would. The cost against the bucketed
//! all-reduce: nothing overlaps backward, and each replica receives every replica's
//! subtrees (`replicas × slots` gradients' bytes) instead of a ring's two passes.

use std::collections::HashMap;

use mirra_collectives::Communicator;
use mirra_device::{trace, DType, Device};
use mirra_tensor::Tensor;

use crate::micro_batches::{tree_sum, MicroBatches, Node};
use crate::{Result, StrategyError};

/// The gradients and scalars of a step, summed in the tree.
#[derive(Debug)]
pub struct TreeSum {
    /// One per parameter, in parameter order, in the parameters' shapes.
    pub grads: Vec<Tensor>,
    /// The scalars each leaf carried, summed the same way.
    pub scalars: Vec<f64>,
}

/// Sums micro-batch gradients in the fixed tree across replicas (one per replica).
#[derive(Debug)]
pub struct TreeReducer {
    dims: Vec<Vec<usize>>,
    /// Elements of the gradients together.
    grad_len: usize,
    scalars: usize,
    dtype: DType,
}

impl TreeReducer {
    /// A reducer for gradients of `params` (host tensors of one float dtype) and
    /// `scalars` scalars per leaf.
    pub fn new(params: &[Tensor], scalars: usize) -> Result<TreeReducer> {
        let dtype = params.first().map_or(DType::F32, Tensor::dtype);
        for p in params {
            if p.dtype() != dtype || !dtype.is_float() {
                return Err(StrategyError::Invalid(format!(
                    "deterministic mode sums gradients of one float dtype; the parameters \
                     are {dtype} and {}",
                    p.dtype()
                )));
            }
            if p.device() != Device::Cpu {
                return Err(StrategyError::Invalid(format!(
                    "deterministic mode runs on host replicas, not on {} (cuBLAS picks its \
                     kernels by shape)",
                    p.device()
                )));
            }
        }
        Ok(TreeReducer {
            dims: params.iter().map(|p| p.dims().to_vec()).collect(),
            grad_len: params.iter().map(Tensor::elem_count).sum(),
            scalars,
            dtype,
        })
    }

    fn leaf_len(&self) -> usize {
        self.grad_len + self.scalars
    }

    /// One micro-batch's leaf: its gradients in parameter order (`None`: a parameter its
    /// loss does not reach, zero) and its scalars, flat.
    pub fn leaf(&self, grads: Vec<Option<Tensor>>, scalars: &[f64]) -> Result<Tensor> {
        if grads.len() != self.dims.len() || scalars.len() != self.scalars {
            return Err(StrategyError::Invalid(format!(
                "deterministic leaf: {} gradients and {} scalars, the reducer holds {} and {}",
                grads.len(),
                scalars.len(),
                self.dims.len(),
                self.scalars
            )));
        }
        let mut parts = Vec::with_capacity(grads.len() + 1);
        for (key, (g, dims)) in grads.into_iter().zip(&self.dims).enumerate() {
            let n = dims.iter().product();
            let flat = match g {
                Some(g) if g.dims() == dims.as_slice() => g.to_dtype(self.dtype)?.reshape(&[n])?,
                Some(g) => {
                    return Err(StrategyError::Invalid(format!(
                        "gradient of parameter {key} has shape {:?}, the parameter {dims:?}",
                        g.dims()
                    )))
                }
                None => Tensor::zeros(&[n], self.dtype, Device::Cpu)?,
            };
            parts.push(flat);
        }
        parts.push(
            Tensor::from_vec(scalars.to_vec(), &[self.scalars], Device::Cpu)?
                .to_dtype(self.dtype)?,
        );
        let refs: Vec<&Tensor> = parts.iter().collect();
        Ok(Tensor::concat(&refs, 0)?)
    }

    /// The step's sum over every replica's micro-batches: replica `comm.rank()` of `plan`
    /// computes its micro-batches' leaves with `leaf(i)` (global micro-batch index, in
    /// increasing order), sums its subtrees, and takes part in one all-gather.
    pub fn reduce<E: From<StrategyError>>(
        &self,
        comm: &dyn Communicator,
        plan: &MicroBatches,
        mut leaf: impl FnMut(usize) -> std::result::Result<Tensor, E>,
    ) -> std::result::Result<TreeSum, E> {
        self.reduce_inner(comm, plan, &mut leaf)
    }

    fn reduce_inner<E: From<StrategyError>>(
        &self,
        comm: &dyn Communicator,
        plan: &MicroBatches,
        leaf: &mut impl FnMut(usize) -> std::result::Result<Tensor, E>,
    ) -> std::result::Result<TreeSum, E> {
        if comm.world_size() != plan.replicas() {
            return Err(StrategyError::Invalid(format!(
                "deterministic micro-batches planned for {} replicas, the group has {}",
                plan.replicas(),
                comm.world_size()
            ))
            .into());
        }
        let (rank, world) = (comm.rank(), comm.world_size());
        let count = plan.count();
        let mut add = |a: Tensor, b: Tensor| -> std::result::Result<Tensor, E> {
            Ok(a.add(&b).map_err(StrategyError::from)?)
        };
        let strategy = |e: StrategyError| -> E { e.into() };
        let tensor = |e: mirra_tensor::TensorError| -> E { StrategyError::from(e).into() };
        let mut own = Vec::new();
        for node in plan.subtrees(rank) {
            let mut leaves = |n: Node| -> std::result::Result<Option<Tensor>, E> {
                if n.size > 1 {
                    return Ok(None);
                }
                let t = leaf(n.first)?;
                if t.dims() != [self.leaf_len()] {
                    return Err(strategy(StrategyError::Invalid(format!(
                        "deterministic leaf of micro-batch {} has shape {:?}, not [{}]",
                        n.first,
                        t.dims(),
                        self.leaf_len()
                    ))));
                }
                Ok(Some(t))
            };
            own.push((node, tree_sum(node, count, &mut leaves, &mut add)?));
        }
        let mut parts: HashMap<Node, Tensor> = HashMap::new();
        if world == 1 {
            parts.extend(own);
        } else {
            let _span = trace::span("comm", "all-gather the tree's subtrees");
            let slots = plan.max_subtrees();
            let len = self.leaf_len();
            let mut send = Vec::with_capacity(slots);
            for (_, t) in &own {
                send.push(t.clone());
            }
            if own.len() < slots {
                let pad = Tensor::zeros(&[(slots - own.len()) * len], self.dtype, Device::Cpu);
                send.push(pad.map_err(tensor)?);
            }
            let refs: Vec<&Tensor> = send.iter().collect();
            let send = unshared(Tensor::concat(&refs, 0).map_err(tensor)?).map_err(strategy)?;
            let all = Tensor::zeros(&[world * slots * len], self.dtype, Device::Cpu);
            let mut all = unshared(all.map_err(tensor)?).map_err(strategy)?;
            comm.all_gather(&send, &mut all)
                .map_err(|e| strategy(e.into()))?;
            let all = Tensor::from_buffer(all, &[world * slots * len]).map_err(tensor)?;
            for r in 0..world {
                for (j, node) in plan.subtrees(r).into_iter().enumerate() {
                    let part = all.narrow(0, (r * slots + j) * len, len).map_err(tensor)?;
                    parts.insert(node, part);
                }
            }
        }
        let mut known = |n: Node| Ok(parts.remove(&n));
        let total = tree_sum(plan.root(), count, &mut known, &mut add)?;
        self.split(&total).map_err(strategy)
    }

    /// The summed leaf as gradients in their parameters' shapes and scalars.
    fn split(&self, total: &Tensor) -> Result<TreeSum> {
        let mut grads = Vec::with_capacity(self.dims.len());
        let mut offset = 0;
        for dims in &self.dims {
            let n: usize = dims.iter().product();
            grads.push(total.narrow(0, offset, n)?.reshape(dims)?);
            offset += n;
        }
        let scalars = total
            .narrow(0, self.grad_len, self.scalars)?
            .to_dtype(DType::F64)?
            .to_vec::<f64>()?;
        Ok(TreeSum { grads, scalars })
    }
}

/// A fresh tensor's buffer.
fn unshared(t: Tensor) -> Result<mirra_device::Buffer> {
    t.into_buffer()
        .map_err(|_| StrategyError::Invalid("a fresh tensor is unshared".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirra_collectives::cpu_group;

    /// Leaves of three micro-batches whose sum depends on the association.
    fn leaf(reducer: &TreeReducer, i: usize) -> Tensor {
        let g = [1e8f32, 1.0, -1e8, 1.0, 3.0][i % 5] * (1 + i % 3) as f32;
        let w = Tensor::from_vec(vec![g, -g, g * 0.5, 1.0], &[2, 2], Device::Cpu).unwrap();
        reducer
            .leaf(vec![Some(w), None], &[i as f64 + 0.25])
            .unwrap()
    }

    fn params() -> Vec<Tensor> {
        vec![
            Tensor::zeros(&[2, 2], DType::F32, Device::Cpu).unwrap(),
            Tensor::zeros(&[3], DType::F32, Device::Cpu).unwrap(),
        ]
    }

    /// The sum of 13 micro-batches as `world` replicas of a `backend` group hold it.
    fn sum_on(world: usize, backend: &str) -> Vec<(Vec<f32>, Vec<f32>, Vec<f64>)> {
        let plan = MicroBatches::new(2, 26, world).unwrap();
        let comms = cpu_group(backend, world, mirra_collectives::Config::default()).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    s.spawn(move || {
                        let reducer = TreeReducer::new(&params(), 1).unwrap();
                        let mut asked = Vec::new();
                        let sum = reducer
                            .reduce(comm.as_ref(), &plan, |i| {
                                asked.push(i);
                                Ok::<_, StrategyError>(leaf(&reducer, i))
                            })
                            .unwrap();
                        assert_eq!(asked, plan.owned(comm.rank()).collect::<Vec<_>>());
                        (
                            sum.grads[0].to_vec::<f32>().unwrap(),
                            sum.grads[1].to_vec::<f32>().unwrap(),
                            sum.scalars,
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_replica_count_and_backend_sums_one_replicas_bits() {
        let one = sum_on(1, "ring").remove(0);
        assert_eq!(one.1, vec![0.0; 3]);
        assert_eq!(one.2, vec![(0..13).map(|i| i as f64 + 0.25).sum::<f64>()]);
        for backend in mirra_collectives::BACKENDS {
            for world in 2..=8 {
                for got in sum_on(world, backend) {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got.0),
                        bits(&one.0),
                        "{backend} with {world} replicas"
                    );
                    assert_eq!(got.2, one.2);
                }
            }
        }
    }

    #[test]
    fn a_gradient_of_the_wrong_shape_is_named() {
        let reducer = TreeReducer::new(&params(), 0).unwrap();
        let wrong = Tensor::zeros(&[4], DType::F32, Device::Cpu).unwrap();
        let err = reducer.leaf(vec![Some(wrong), None], &[]).unwrap_err();
        assert!(
            err.to_string().contains("parameter 0 has shape [4]"),
            "{err}"
        );
    }
}
