//! mirra: data-parallel training for Rust.
//!
//! This facade re-exports the workspace's crates under short names and provides the
//! models that the `mirra` command line trains. Pick the single crates when you need only
//! a part (the tensors, the autograd, the input pipeline).

pub use mirra_autograd as autograd;
pub use mirra_collectives as collectives;
pub use mirra_cuda as cuda;
pub use mirra_data as data;
pub use mirra_device as device;
pub use mirra_nn as nn;
pub use mirra_optim as optim;
pub use mirra_strategy as strategy;
pub use mirra_tensor as tensor;
pub use mirra_tensorboard as tensorboard;
pub use mirra_train as train;

pub mod models;
pub mod recipe;
