//! [`MicroBatchSums`]: synchronised batch norm's sums in deterministic mode.
//!
//! Batch statistics couple a batch's examples: a micro-batch cannot be normalised before
//! every micro-batch of the global batch has reached the layer. So with synchronised
//! batch norm a deterministic replica runs its micro-batches at once, each on a thread
//! of its own with a tape of its own ([`MicroBatchSums::as_micro_batch`]), and the
//! layer's sums (statistics forward, their gradients backward) are a rendezvous: every
//! local micro-batch lays down its part, the last one to arrive sums the replica's
//! subtrees and takes part in the all-gather of every replica's, and all of them get the
//! tree's total: the bits one replica summing every micro-batch in the same tree gets.
//! The sum over micro-batches is its own adjoint (each micro-batch's input gradient is the
//! sum of every micro-batch's output gradient), so backward meets the same way.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};

use mirra_autograd::LinearMap;
use mirra_collectives::Communicator;
use mirra_device::sync::lock;
use mirra_tensor::Tensor;

use crate::micro_batches::{tree_sum, MicroBatches, Node, Sequential};
use crate::tree_reducer::{sum_across, Leaf};
use crate::StrategyError;

thread_local! {
    /// The micro-batch this thread runs (global index), inside `as_micro_batch`.
    static MICRO_BATCH: Cell<Option<usize>> = const { Cell::new(None) };
}

/// One replica's end of the sums over every micro-batch of a deterministic step.
pub struct MicroBatchSums {
    comm: Mutex<Box<dyn Communicator>>,
    rank: usize,
    round: Mutex<Round>,
    arrived: Condvar,
}

impl std::fmt::Debug for MicroBatchSums {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicroBatchSums")
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

/// The sums of one step so far.
#[derive(Default)]
struct Round {
    plan: Option<MicroBatches>,
    /// Sums asked so far, per caller (its micro-batch; `None`: a replica without any).
    asked: BTreeMap<Option<usize>, usize>,
    /// The step's sums in call order.
    calls: Vec<Call>,
    /// Why the step cannot go on (a micro-batch failed): every wait ends with it.
    failed: Option<String>,
}

/// One sum: the local micro-batches' parts, then the total.
#[derive(Default)]
struct Call {
    parts: BTreeMap<usize, Tensor>,
    total: Option<Result<Tensor, String>>,
}

impl MicroBatchSums {
    /// The sums of the replica at `comm`'s rank, over its group.
    pub(crate) fn new(comm: Box<dyn Communicator>) -> MicroBatchSums {
        MicroBatchSums {
            rank: comm.rank(),
            comm: Mutex::new(comm),
            round: Mutex::new(Round::default()),
            arrived: Condvar::new(),
        }
    }

    /// Start a step over `plan`'s micro-batches.
    pub fn begin(&self, plan: MicroBatches) {
        *lock(&self.round) = Round {
            plan: Some(plan),
            ..Round::default()
        };
    }

    /// End the step's waits with `reason` (a micro-batch failed: the others would wait for
    /// it forever).
    pub fn fail(&self, reason: String) {
        lock(&self.round).failed.get_or_insert(reason);
        self.arrived.notify_all();
    }

    /// Run `f` as micro-batch `i` (global index) of the step: the sums it asks for are
    /// that micro-batch's part.
    pub fn as_micro_batch<R>(i: usize, f: impl FnOnce() -> R) -> R {
        let before = MICRO_BATCH.with(|m| m.replace(Some(i)));
        let r = f();
        MICRO_BATCH.with(|m| m.set(before));
        r
    }

    /// The sum of `x` over every micro-batch of the step, in the tree.
    fn sum(&self, x: &Tensor) -> Result<Tensor, String> {
        let me = MICRO_BATCH.with(Cell::get);
        let mut round = lock(&self.round);
        let plan = round
            .plan
            .ok_or("deterministic batch-norm sums outside a deterministic step")?;
        let local = plan.owned(self.rank);
        if me.is_some_and(|i| !local.contains(&i)) || (me.is_none() && !local.is_empty()) {
            return Err(format!(
                "deterministic batch-norm sums asked as micro-batch {me:?} of replica {}, \
                 which owns micro-batches {local:?}",
                self.rank
            ));
        }
        let asked = round.asked.entry(me).or_default();
        let k = *asked;
        *asked += 1;
        if round.calls.len() <= k {
            round.calls.resize_with(k + 1, Call::default);
        }
        if let Some(i) = me {
            round.calls[k].parts.insert(i, x.clone());
        }
        if round.calls[k].parts.len() == local.len() {
            // The last part of this sum: total it for everyone.
            let parts = std::mem::take(&mut round.calls[k].parts);
            drop(round);
            let total = self.total(&plan, parts, x);
            let mut round = lock(&self.round);
            round.calls[k].total = Some(total.clone());
            drop(round);
            self.arrived.notify_all();
            return total;
        }
        loop {
            if let Some(total) = &round.calls[k].total {
                return total.clone();
            }
            if let Some(why) = &round.failed {
                return Err(why.clone());
            }
            round = self.arrived.wait(round).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The tree's total of every replica's parts, from this replica's `parts` (by micro-
    /// batch), shaped like `like`.
    fn total(
        &self,
        plan: &MicroBatches,
        parts: BTreeMap<usize, Tensor>,
        like: &Tensor,
    ) -> Result<Tensor, String> {
        let run = || -> crate::Result<Tensor> {
            let known = |n: Node| -> crate::Result<Option<Leaf>> {
                Ok(match n.size {
                    1 => parts.get(&n.first).cloned().map(Leaf::of),
                    _ => None,
                })
            };
            let add = |a: Leaf, b: Leaf| a.accumulate(&b);
            let mut own = Vec::new();
            for node in plan.subtrees(self.rank) {
                own.push((
                    node,
                    tree_sum(node, plan.count(), 1, &known, &add, &Sequential)?,
                ));
            }
            let comm = lock(&self.comm);
            let dims = [like.dims().to_vec()];
            let total = sum_across(comm.as_ref(), plan, own, &dims, like.dtype())?;
            let mut tensors = total.into_tensors();
            tensors
                .pop()
                .ok_or_else(|| StrategyError::Invalid("an empty sum".into()))
        };
        run().map_err(|e| e.to_string())
    }
}

impl LinearMap for MicroBatchSums {
    fn apply(&self, x: &Tensor) -> Result<Tensor, String> {
        self.sum(x)
    }

    fn adjoint(&self, g: &Tensor) -> Result<Tensor, String> {
        self.sum(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirra_collectives::{cpu_group, Config};
    use mirra_tensor::Device;

    /// Parts whose sum depends on the association.
    fn part(i: usize) -> Tensor {
        let v = [1e8f32, 1.0, -1e8, 1.0, 3.0, 0.5][i % 6] * (1 + i % 4) as f32;
        Tensor::from_vec(vec![v, -v, 0.25], &[3], Device::Cpu).unwrap()
    }

    /// Two sums (as two batch-norm layers ask) over 11 micro-batches of 1 example, on
    /// `world` replicas each running its micro-batches on threads of their own.
    fn sums_on(world: usize) -> Vec<Vec<u32>> {
        let plan = MicroBatches::new(1, 11, world).unwrap();
        let comms = cpu_group("ring", world, Config::default()).unwrap();
        std::thread::scope(|s| {
            let replicas: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    s.spawn(move || {
                        let sums = MicroBatchSums::new(comm);
                        sums.begin(plan);
                        let owned = plan.owned(sums.rank);
                        let run = |i: Option<usize>| {
                            let once = |_| {
                                let x = part(i.unwrap_or(0));
                                let a = sums.apply(&x).unwrap();
                                let b = sums.adjoint(&a.scale(0.5).unwrap()).unwrap();
                                let bits = |t: &Tensor| t.to_vec::<f32>().unwrap();
                                [bits(&a), bits(&b)].concat()
                            };
                            match i {
                                Some(i) => MicroBatchSums::as_micro_batch(i, || once(i)),
                                None => once(0),
                            }
                        };
                        let got: Vec<Vec<f32>> = match owned.is_empty() {
                            true => vec![run(None)],
                            false => std::thread::scope(|t| {
                                let hs: Vec<_> =
                                    owned.map(|i| t.spawn(move || run(Some(i)))).collect();
                                hs.into_iter().map(|h| h.join().unwrap()).collect()
                            }),
                        };
                        got.into_iter()
                            .map(|v| v.iter().map(|x| x.to_bits()).collect())
                            .collect::<Vec<Vec<u32>>>()
                    })
                })
                .collect();
            replicas
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        })
    }

    #[test]
    fn every_micro_batch_of_every_replica_gets_one_replicas_bits() {
        let one = sums_on(1);
        assert_eq!(one.len(), 11);
        assert!(one.iter().all(|b| b == &one[0]));
        for world in [2, 3, 4, 12] {
            for got in sums_on(world) {
                assert_eq!(got, one[0], "{world} replicas");
            }
        }
    }

    #[test]
    fn a_failed_micro_batch_ends_the_others_wait() {
        let comm = cpu_group("ring", 1, Config::default()).unwrap().remove(0);
        let sums = MicroBatchSums::new(comm);
        sums.begin(MicroBatches::new(1, 2, 1).unwrap());
        std::thread::scope(|s| {
            let waiting = s.spawn(|| MicroBatchSums::as_micro_batch(0, || sums.apply(&part(0))));
            std::thread::sleep(std::time::Duration::from_millis(20));
            sums.fail("micro-batch 1 failed: bad input".into());
            let err = waiting.join().unwrap().unwrap_err();
            assert!(err.contains("micro-batch 1 failed"), "{err}");
        });
        let outside = MicroBatchSums::as_micro_batch(5, || sums.apply(&part(0))).unwrap_err();
        assert!(outside.contains("owns micro-batches 0..2"), "{outside}");
    }
}
