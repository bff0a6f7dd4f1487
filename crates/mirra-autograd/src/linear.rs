//! Linear maps the caller supplies, with their adjoints: how an operation autograd knows
//! nothing about (a sum across replicas, which the strategy crate implements) takes part
//! in a tape.

use std::fmt;

use mirra_tensor::Tensor;

/// A linear map `A` and its adjoint `Aᵀ`, for [`Var::linear_map`](crate::Var::linear_map):
/// the output of the op is `A x`, and the gradient of its input is `Aᵀ g`.
///
/// A sum across the replicas of a data-parallel step (`x ↦ Σ_r x_r`, every replica getting
/// the sum) is its own adjoint: each replica's input gradient is the sum over replicas of
/// the gradients of their outputs. The maps are called in tape order, forward and backward,
/// so every replica calls a collective map in the same order.
pub trait LinearMap: Send + Sync + fmt::Debug {
    /// `A x`.
    fn apply(&self, x: &Tensor) -> Result<Tensor, String>;
    /// `Aᵀ g`.
    fn adjoint(&self, g: &Tensor) -> Result<Tensor, String>;
}
