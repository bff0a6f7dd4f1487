//! The sum of a tensor across the replicas, inside a step: what synchronised batch norm
//! all-reduces in its forward pass (its statistics) and backward pass (their gradients).

use std::sync::Mutex;

use mirra_autograd::LinearMap;
use mirra_collectives::{Communicator, ReduceOp};
use mirra_tensor::Tensor;

/// One replica's end of the sum: a communicator of a group of its own (apart from the
/// gradient buckets'), behind a mutex because autograd keeps the map on a tape that the
/// replica's thread alone uses, but the type must be `Sync`.
///
/// As a [`LinearMap`], `x ↦ Σ_r x_r` is its own adjoint: the gradient of each replica's
/// input is the sum of every replica's output gradient. Every replica must call it in the
/// same order, which forward and backward passes of one model do; a replica that does not
/// take part makes the others fail at the collective's deadline, naming it.
pub(crate) struct CrossReplicaSum {
    comm: Mutex<Box<dyn Communicator>>,
}

impl std::fmt::Debug for CrossReplicaSum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrossReplicaSum").finish_non_exhaustive()
    }
}

impl CrossReplicaSum {
    pub(crate) fn new(comm: Box<dyn Communicator>) -> CrossReplicaSum {
        CrossReplicaSum {
            comm: Mutex::new(comm),
        }
    }

    fn sum(&self, x: &Tensor) -> Result<Tensor, String> {
        let mut buf = x
            .copy()
            .map_err(|e| e.to_string())?
            .into_buffer()
            .map_err(|_| "a fresh copy is unshared".to_string())?;
        let comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        comm.all_reduce(&mut buf, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        Tensor::from_buffer(buf, x.dims()).map_err(|e| e.to_string())
    }
}

impl LinearMap for CrossReplicaSum {
    fn apply(&self, x: &Tensor) -> Result<Tensor, String> {
        self.sum(x)
    }

    fn adjoint(&self, g: &Tensor) -> Result<Tensor, String> {
        self.sum(g)
    }
}
