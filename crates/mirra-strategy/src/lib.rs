//! The mirrored strategy (TensorFlow's `MirroredStrategy`, with PyTorch DDP's gradient
//! buckets): every replica holds a full copy of the model, the global batch is split into
//! per-replica sub-batches, gradients are all-reduced so that every replica applies the
//! same update, and N replicas train exactly as one device would, only faster.
//!
//! - [`MirroredStrategy`]: the replicas (on CPU, long-lived threads, each with its own
//!   communicator), its [`scope`](MirroredStrategy::scope) for creating mirrored variables,
//!   [`run`](MirroredStrategy::run) and [`reduce`](MirroredStrategy::reduce).
//! - [`split_batch`]: distributed input, TensorFlow's way (the last partial batch leaves
//!   some replicas with fewer or no examples).
//! - [`GradientReducer`]: gradients grouped into buckets in reverse parameter order; each
//!   bucket's all-reduce is submitted as soon as its gradients are ready during backward,
//!   overlapping communication with the rest of backward.
//! - Deterministic mode ([`StrategyConfig::with_deterministic`]): [`MicroBatches`], the
//!   canonical micro-batches of a step and the fixed pairwise tree over their index, and
//!   [`TreeReducer`], which sums micro-batch gradients in that tree across replicas, so
//!   any number of replicas ends every step with one replica's bits.
//!
//! The training loop that uses them (`fit` under a strategy) lives in `mirra-train`.

mod cross_replica;
mod error;
mod input;
mod micro_batch_sums;
mod micro_batches;
mod pool;
mod reducer;
mod strategy;
mod tree_reducer;

pub use error::StrategyError;
pub use input::split_batch;
pub use micro_batch_sums::MicroBatchSums;
pub use micro_batches::{
    default_micro_batch, tree_sum, Join, MicroBatches, Node, Sequential, DEFAULT_MICRO_BATCHES,
};
pub use mirra_collectives::{CollectiveError, Communicator, ReduceOp};
pub use pool::ReplicaContext;
pub use reducer::{GradientReducer, DEFAULT_BUCKET_BYTES};
pub use strategy::{MirroredStrategy, PerReplica, StrategyConfig};
pub use tree_reducer::{Leaf, TreeReducer, TreeSum};

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, StrategyError>;
