//! [`TreeReducer`]: deterministic mode's gradient sum, in the fixed tree of
//! [`micro_batches`](crate::MicroBatches), across replicas.
//!
//! Each micro-batch's gradients, with the step's scalars beside them (its loss), are a
//! [`Leaf`] of the tree: one tensor per parameter, added element by element, laid out flat
//! only on the wire. A replica sums its own subtrees (two halves at once on its kernel
//! pool); one all-gather gives every replica the subtrees it needs, each sending as many
//! slots as the replica that owns the most (slots it does not fill are never read); the
//! top of the tree is then summed by node, in the same order everywhere ([`sum_across`]),
//! so every replica holds the bits one replica summing every micro-batch alone would.
//! When two replicas own one half of the tree each, the top is one addition, and the
//! group's all-reduce carries it instead (IEEE addition is commutative: any backend's sum
//! of two buffers has its bits, which the collectives' conformance suite holds each
//! backend to): the default mode's bytes and copies, not an all-gather's.
//! The cost against the bucketed all-reduce: nothing overlaps backward, one addition of
//! the gradients per micro-batch (in place, [`Tensor::accumulate`]), and for large
//! gradients each replica receives its chunk of every other replica's subtrees
//! (`(replicas - 1) / replicas × slots` gradients' bytes, a ring's reduce-scatter), then
//! the other chunks of the sum.

use std::collections::HashMap;

use mirra_collectives::{Communicator, ReduceOp};
use mirra_device::{trace, Buffer, DType, Device};
use mirra_tensor::{Tensor, TensorError};

use crate::micro_batches::{tree_sum, Join, MicroBatches, Node, Sequential};
use crate::{Result, StrategyError};

/// The gradients and scalars of a step, summed in the tree.
#[derive(Debug)]
pub struct TreeSum {
    /// One per parameter, in parameter order, in the parameters' shapes.
    pub grads: Vec<Tensor>,
    /// The scalars each leaf carried, summed the same way.
    pub scalars: Vec<f64>,
}

/// One micro-batch's gradients (one tensor per parameter) and scalars (one tensor), or a
/// sum of them: a value of the tree. Sums are taken tensor by tensor, element by element,
/// so laying them out flat on the wire changes no bit.
#[derive(Clone, Debug)]
pub struct Leaf(Vec<Tensor>);

/// The two halves of a subtree at once on the calling thread's kernel pool.
struct KernelThreads;

impl Join for KernelThreads {
    fn join<RA: Send, RB: Send>(
        &self,
        split: (usize, usize),
        a: impl FnOnce() -> RA + Send,
        b: impl FnOnce() -> RB + Send,
    ) -> (RA, RB) {
        mirra_tensor::join(split, a, b)
    }
}

/// Sums micro-batch gradients in the fixed tree across replicas (one per replica).
#[derive(Debug)]
pub struct TreeReducer {
    dims: Vec<Vec<usize>>,
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
            scalars,
            dtype,
        })
    }

    /// One micro-batch's leaf: its gradients in parameter order (`None`: a parameter its
    /// loss does not reach, zero) and its scalars.
    pub fn leaf(&self, grads: Vec<Option<Tensor>>, scalars: &[f64]) -> Result<Leaf> {
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
            parts.push(match g {
                // A transposed weight gradient stays a view: sums of views with one
                // layout run over their buffers (`Tensor::binary`).
                Some(g) if g.dims() == dims.as_slice() => g.to_dtype(self.dtype)?,
                Some(g) => {
                    return Err(StrategyError::Invalid(format!(
                        "gradient of parameter {key} has shape {:?}, the parameter {dims:?}",
                        g.dims()
                    )))
                }
                None => Tensor::zeros(dims, self.dtype, Device::Cpu)?,
            });
        }
        let scalars = Tensor::from_vec(scalars.to_vec(), &[self.scalars], Device::Cpu)?;
        parts.push(scalars.to_dtype(self.dtype)?);
        Ok(Leaf(parts))
    }

    /// The step's sum over every replica's micro-batches: replica `comm.rank()` of `plan`
    /// computes its micro-batches' leaves with `leaf(i)` (global micro-batch index), two
    /// halves of a subtree at once on its kernel pool when it has `threads` kernel threads
    /// (each side with its share of the budget), sums its subtrees, and takes part in one
    /// all-gather.
    pub fn reduce<E: Send + From<StrategyError>>(
        &self,
        comm: &dyn Communicator,
        plan: &MicroBatches,
        threads: usize,
        leaf: &(impl Fn(usize) -> std::result::Result<Leaf, E> + Sync),
    ) -> std::result::Result<TreeSum, E> {
        let count = plan.count();
        let add = |a: Leaf, b: Leaf| -> std::result::Result<Leaf, E> { Ok(a.accumulate(&b)?) };
        let leaves = |n: Node| -> std::result::Result<Option<Leaf>, E> {
            if n.size > 1 {
                return Ok(None);
            }
            let l = leaf(n.first)?;
            if l.0.len() != self.dims.len() + 1 {
                return Err(StrategyError::Invalid(format!(
                    "deterministic leaf of micro-batch {} holds {} tensors, not {}",
                    n.first,
                    l.0.len(),
                    self.dims.len() + 1
                ))
                .into());
            }
            Ok(Some(l))
        };
        let mut own = Vec::new();
        {
            let _span = trace::span("compute", "micro-batches and their subtrees");
            for node in plan.subtrees(comm.rank()) {
                let sum = tree_sum(node, count, threads, &leaves, &add, &KernelThreads)?;
                own.push((node, sum));
            }
        }
        let mut dims = self.dims.clone();
        dims.push(vec![self.scalars]);
        let mut total = sum_across(comm, plan, own, &dims, self.dtype)?.0;
        let scalars = total.pop().expect("a leaf ends with its scalars");
        let scalars = scalars.to_dtype(DType::F64).map_err(StrategyError::from)?;
        // Contiguous for the optimizer (a copy only of a view, once per step).
        let grads = total.iter().map(Tensor::contiguous);
        Ok(TreeSum {
            grads: grads
                .collect::<std::result::Result<_, _>>()
                .map_err(StrategyError::from)?,
            scalars: scalars.to_vec::<f64>().map_err(StrategyError::from)?,
        })
    }
}

impl Leaf {
    /// A value of one tensor.
    pub fn of(t: Tensor) -> Leaf {
        Leaf(vec![t])
    }

    /// Its tensors.
    pub fn into_tensors(self) -> Vec<Tensor> {
        self.0
    }

    /// `self + other`, tensor by tensor, element by element: over `self`'s buffers where
    /// it owns them alone ([`Tensor::accumulate`]; the same bits as a fresh sum).
    pub fn accumulate(self, other: &Leaf) -> Result<Leaf> {
        let sums = self
            .0
            .into_iter()
            .zip(&other.0)
            .map(|(x, y)| Ok(x.accumulate(y)?));
        Ok(Leaf(sums.collect::<Result<_>>()?))
    }
}

/// Leaves of at least this many elements per rank have the top of their tree summed in
/// chunks, one per rank (see [`sum_across`]); below, every rank sums all of it.
const CHUNKED_TOP_MIN: usize = 1 << 14;

/// The sum of the whole tree on every rank of `comm`: `own` holds this rank's subtrees
/// ([`MicroBatches::subtrees`], summed), each a [`Leaf`] of tensors of `dims` in `dtype`.
/// The top of the tree is summed by node, in the same order on every rank. For small
/// leaves one all-gather gives every rank every rank's subtrees (each sends
/// `plan.max_subtrees()` slots; slots a rank does not fill are never read) and every rank
/// sums all of it. For large ones each rank sums one chunk of the elements: one all-gather
/// carries, from each rank, the chunk every other rank sums of each of its subtrees (an
/// all-to-all), and a second shares the summed chunks (reduce-scatter's division of the
/// work; an element's sum is the same whoever computes it).
pub(crate) fn sum_across(
    comm: &dyn Communicator,
    plan: &MicroBatches,
    own: Vec<(Node, Leaf)>,
    dims: &[Vec<usize>],
    dtype: DType,
) -> Result<Leaf> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if world != plan.replicas() {
        return Err(StrategyError::Invalid(format!(
            "deterministic micro-batches planned for {} replicas, the group has {world}",
            plan.replicas()
        )));
    }
    let add = |a: Leaf, b: Leaf| a.accumulate(&b);
    let top = |parts: HashMap<Node, Leaf>| {
        let _span = trace::span("compute", "the top of the tree");
        // Each node is asked for once: its value moves out, so that a part this rank
        // owns alone is added into in place.
        let parts = std::sync::Mutex::new(parts);
        let known = |n: Node| Ok(parts.lock().unwrap_or_else(|e| e.into_inner()).remove(&n));
        tree_sum(plan.root(), plan.count(), 1, &known, &add, &Sequential)
    };
    // One all-gather of `per_rank` elements from each rank, this rank's filled by `fill`.
    let all_gather = |what: &'static str,
                      per_rank: usize,
                      fill: &dyn Fn(&mut Buffer) -> Result<()>| {
        let _span = trace::span("comm", what);
        let mut send = Buffer::alloc(dtype, per_rank, Device::Cpu).map_err(TensorError::from)?;
        fill(&mut send)?;
        let mut all =
            Buffer::alloc(dtype, world * per_rank, Device::Cpu).map_err(TensorError::from)?;
        comm.all_gather(&send, &mut all)?;
        Ok::<_, StrategyError>(Tensor::from_buffer(all, &[world * per_rank])?)
    };
    if world == 1 {
        return top(own.into_iter().collect());
    }
    let len: usize = dims.iter().map(|d| d.iter().product::<usize>()).sum();
    let slots = plan.max_subtrees();
    // The flat sum as tensors of `dims` (views).
    let shaped = |flat: &Tensor| -> Result<Leaf> {
        let mut at = 0;
        let mut tensors = Vec::with_capacity(dims.len());
        for d in dims {
            let n: usize = d.iter().product();
            tensors.push(flat.narrow(0, at, n)?.reshape(d)?);
            at += n;
        }
        Ok(Leaf(tensors))
    };
    let one = |t: Tensor| Leaf(vec![t]);
    // This rank's subtrees as contiguous tensors (a transposed gradient copied once).
    let own: Vec<(Node, Vec<Tensor>)> = own
        .into_iter()
        .map(|(node, leaf)| {
            debug_assert!(plan.subtrees(rank).contains(&node));
            let tensors = leaf.0.iter().map(Tensor::contiguous);
            Ok((node, tensors.collect::<std::result::Result<_, _>>()?))
        })
        .collect::<Result<_>>()?;
    if plan.halves_of_root().is_some() {
        // The top is one addition, of rank 0's subtree and rank 1's. IEEE addition is
        // commutative, so any backend's sum of two buffers has the tree's bits (the
        // conformance suite holds every backend to it): one all-reduce, in place, carries
        // the top with the default mode's bytes and copies.
        let [(_, tensors)] = &own[..] else {
            return Err(StrategyError::Invalid(format!(
                "deterministic mode: rank {rank} holds {} subtrees, its plan one",
                own.len()
            )));
        };
        let _span = trace::span("comm", "all-reduce the two halves of the tree");
        let mut flat = Buffer::alloc(dtype, len, Device::Cpu).map_err(TensorError::from)?;
        copy_flat(tensors, 0..len, &mut flat, 0)?;
        comm.all_reduce(&mut flat, ReduceOp::Sum)?;
        return shaped(&Tensor::from_buffer(flat, &[len])?);
    }
    if len < CHUNKED_TOP_MIN * world {
        let all = all_gather("all-gather the tree's subtrees", slots * len, &|send| {
            for (j, (_, tensors)) in own.iter().enumerate() {
                copy_flat(tensors, 0..len, send, j * len)?;
            }
            Ok(())
        })?;
        let mut parts = HashMap::new();
        for r in 0..world {
            for (j, node) in plan.subtrees(r).into_iter().enumerate() {
                parts.insert(node, one(all.narrow(0, (r * slots + j) * len, len)?));
            }
        }
        let total = top(parts)?;
        return shaped(&total.0[0]);
    }
    // Chunk `q` of the elements is rank q's to sum. Rank r sends each other rank the
    // chunk it sums of each of r's subtrees (an all-to-all, carried by one all-gather:
    // `world - 1` chunks per slot from each rank, a ring's worth of bytes); slots a rank
    // does not fill, and the tails of short chunks, are never read.
    let chunk = len.div_ceil(world);
    let range = |q: usize| (q * chunk).min(len)..((q + 1) * chunk).min(len);
    let others = world - 1;
    let per_rank = slots * others * chunk;
    let mine = range(rank);
    let all = all_gather("all-gather the tree's subtrees", per_rank, &|send| {
        for (j, (_, tensors)) in own.iter().enumerate() {
            let to = (0..world).filter(|&q| q != rank);
            for (k, q) in to.enumerate() {
                copy_flat(tensors, range(q), send, (j * others + k) * chunk)?;
            }
        }
        Ok(())
    })?;
    let mut parts = HashMap::new();
    for (node, tensors) in &own {
        let mut flat = Buffer::alloc(dtype, mine.len(), Device::Cpu).map_err(TensorError::from)?;
        copy_flat(tensors, mine.clone(), &mut flat, 0)?;
        parts.insert(*node, one(Tensor::from_buffer(flat, &[mine.len()])?));
    }
    for r in (0..world).filter(|&r| r != rank) {
        // This rank's place among the ranks r sends to.
        let k = if rank < r { rank } else { rank - 1 };
        for (j, node) in plan.subtrees(r).into_iter().enumerate() {
            let at = r * per_rank + (j * others + k) * chunk;
            parts.insert(node, one(all.narrow(0, at, mine.len())?));
        }
    }
    let sum = top(parts)?;
    let total = all_gather("all-gather the top's chunks", chunk, &|send| {
        let t = sum.0[0].contiguous()?;
        copy_flat(&[t], 0..mine.len(), send, 0)
    })?;
    shaped(&total)
}

/// Copies elements `range` of the concatenation of `tensors` (contiguous) into `dst` from
/// `at` on.
fn copy_flat(
    tensors: &[Tensor],
    range: std::ops::Range<usize>,
    dst: &mut Buffer,
    at: usize,
) -> Result<()> {
    let mut start = 0;
    for t in tensors {
        let n = t.elem_count();
        let (lo, hi) = (range.start.max(start), range.end.min(start + n));
        if lo < hi {
            let from = t.layout().offset() + lo - start;
            dst.copy_range_from(at + lo - range.start, t.buffer(), from, hi - lo)
                .map_err(TensorError::from)?;
        }
        start += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirra_collectives::cpu_group;

    /// Leaves of three micro-batches whose sum depends on the association.
    fn leaf(reducer: &TreeReducer, i: usize) -> Leaf {
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

    /// The sum of 13 micro-batches as `world` replicas of a `backend` group hold it, each
    /// with `threads` threads.
    fn sum_on(world: usize, backend: &str, threads: usize) -> Vec<(Vec<f32>, Vec<f32>, Vec<f64>)> {
        let plan = MicroBatches::new(2, 26, world).unwrap();
        let comms = cpu_group(backend, world, mirra_collectives::Config::default()).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    s.spawn(move || {
                        let reducer = TreeReducer::new(&params(), 1).unwrap();
                        let asked = std::sync::Mutex::new(Vec::new());
                        let sum = reducer
                            .reduce(comm.as_ref(), &plan, threads, &|i| {
                                asked.lock().unwrap().push(i);
                                Ok::<_, StrategyError>(leaf(&reducer, i))
                            })
                            .unwrap();
                        let mut asked = asked.into_inner().unwrap();
                        asked.sort();
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
        let one = sum_on(1, "ring", 1).remove(0);
        assert_eq!(one.1, vec![0.0; 3]);
        assert_eq!(one.2, vec![(0..13).map(|i| i as f64 + 0.25).sum::<f64>()]);
        for backend in mirra_collectives::BACKENDS {
            for (world, threads) in (2..=8).map(|w| (w, 1 + w % 3)).chain([(1, 3)]) {
                for got in sum_on(world, backend, threads) {
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

    /// A leaf large enough for the top of the tree to be summed in chunks (70,001
    /// elements: 2-4 ranks chunk it, the last chunk ending in the scalars' tensor; 3 ranks
    /// own up to two subtrees each) gives one replica's bits too, on every backend.
    #[test]
    fn a_large_leaf_summed_in_chunks_has_one_replicas_bits() {
        let n = 70_000;
        let params = [Tensor::zeros(&[n], DType::F32, Device::Cpu).unwrap()];
        let sum_on = |world: usize, backend: &str| -> Vec<Vec<u32>> {
            let plan = MicroBatches::new(1, 7, world).unwrap();
            let comms = cpu_group(backend, world, mirra_collectives::Config::default()).unwrap();
            std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .into_iter()
                    .map(|comm| {
                        let params = &params;
                        s.spawn(move || {
                            let reducer = TreeReducer::new(params, 1).unwrap();
                            let leaf = |i: usize| {
                                let v: Vec<f32> = (0..n)
                                    .map(|k| [1e8f32, 1.0, -1e8, 3.0][(k + i) % 4] * (i + 1) as f32)
                                    .collect();
                                let g = Tensor::from_vec(v, &[n], Device::Cpu)?;
                                reducer.leaf(vec![Some(g)], &[i as f64])
                            };
                            let sum = reducer.reduce(comm.as_ref(), &plan, 1, &leaf).unwrap();
                            let g = sum.grads[0].to_vec::<f32>().unwrap();
                            g.iter().map(|x| x.to_bits()).collect()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        let one = sum_on(1, "ring").remove(0);
        for backend in mirra_collectives::BACKENDS {
            for world in 2..=4 {
                assert!(70_001 >= CHUNKED_TOP_MIN * world, "{world} ranks chunk it");
                for got in sum_on(world, backend) {
                    assert!(got == one, "{backend}, {world} ranks");
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
