//! Reverse-mode automatic differentiation.
//!
//! A [`Tape`] records the operations applied to [`Var`]s; [`Tape::backward`] walks it in
//! reverse and returns the gradient of every parameter. There is no global state: each
//! thread (each replica of a mirrored strategy) records on its own tape. Gradients are
//! handed out as they become final ([`Tape::backward_with`]), in reverse order of first
//! use, which is when a data-parallel reducer may start communicating them.
//!
//! Autograd knows nothing of communication or optimizers: it computes gradients.

mod backward;
mod error;
mod linear;
mod op;
mod tape;
mod var;

pub use error::AutogradError;
pub use linear::LinearMap;
pub use tape::{Gradients, Tape};
pub use var::Var;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, AutogradError>;
