//! Collective communication for mirra: the [`Communicator`] trait that the mirrored
//! strategy programs against, and backends chosen by name at run time.
//!
//! Today's backends run ranks as threads of one process and move host buffers through
//! shared memory ([`cpu_group`], names in [`BACKENDS`]): `ring` (reduce-scatter then
//! all-gather, pipelined in slices), `tree` (NCCL's double binary tree), `reduce-to-one`
//! (TensorFlow's `ReductionToOneDevice`) and `direct` (one pass: each rank reduces its
//! chunk of every rank's buffer and writes the result into all of them, the least memory
//! traffic an all-reduce can have). Every collective has a deadline, every rank ends with a
//! bitwise identical result, and a rank that fails, leaves or is aborted makes the others'
//! calls fail with an error naming it. `docs/COLLECTIVES.md` describes the transport, the
//! schedules and their costs, the failure model, and how NCCL, a CUDA peer-to-peer ring and
//! MPI fit the same trait.
//!
//! ```
//! use mirra_collectives::{cpu_group, Config, ReduceOp};
//! use mirra_device::{Buffer, Device};
//!
//! let comms = cpu_group("ring", 2, Config::default()).unwrap();
//! let results: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let handles: Vec<_> = comms
//!         .into_iter()
//!         .map(|comm| {
//!             s.spawn(move || {
//!                 let r = comm.rank() as f32;
//!                 let mut buf = Buffer::from_slice(&[r, 10.0 + r], Device::Cpu).unwrap();
//!                 comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
//!                 buf.as_slice::<f32>().unwrap().to_vec()
//!             })
//!         })
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect()
//! });
//! assert_eq!(results, vec![vec![1.0, 21.0], vec![1.0, 21.0]]);
//! ```

// The modules stand in layers; each uses only modules of the layers before it:
// 1. collective, config, reduce, sync (and, in tests, mutants): no crate imports;
// 2. error; 3. pending; 4. comm; 5. noop, progress, transport; 6. described, verdict;
// 7. algo (its own layers: see algo/mod.rs); 8. cpu, device (its own layers: see
// device/mod.rs); 9. hierarchical (built of groups of the layers before it), mpi (feature
// `mpi`); 10. nccl_mpi (feature `mpi`: the mpi rank for metadata, NCCL for data); 11. in
// tests, reference, then conformance.
mod algo;
mod collective;
mod comm;
mod config;
#[cfg(test)]
mod conformance;
mod cpu;
mod described;
mod device;
mod error;
mod hierarchical;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(test)]
mod mutants;
#[cfg(feature = "mpi")]
mod nccl_mpi;
mod noop;
mod pending;
mod progress;
mod reduce;
#[cfg(test)]
mod reference;
mod transport;
mod verdict;

/// rsmpi, for splitting MPI's world before [`Mpi::communicator`] (feature `mpi`).
#[cfg(feature = "mpi")]
pub use ::mpi as rsmpi;
pub use algo::BACKENDS;
pub use collective::Collective;
pub use comm::{AbortHandle, Communicator, Completion, Work};
pub use config::{
    Config, DEFAULT_EAGER_BYTES, DEFAULT_EAGER_BYTES_OVERSUBSCRIBED, DEFAULT_PARK_AFTER,
    DEFAULT_SLICE_BYTES, DEFAULT_SPIN, DEFAULT_TIMEOUT, MAX_EAGER_BYTES, MIN_SLICE_BYTES,
};
pub use cpu::cpu_group;
pub use device::{cuda_ring_traffic, device_group, DEVICE_BACKENDS};
pub use error::{CollectiveError, Result};
pub use hierarchical::{hierarchical_group, HIERARCHICAL};
#[cfg(feature = "mpi")]
pub use mpi::{Mpi, MPI};
#[cfg(feature = "mpi")]
pub use nccl_mpi::NCCL_MPI;
pub use noop::{noop_group, NOOP};
pub use pending::Pending;
pub use reduce::{ReduceOp, SUPPORTED_DTYPES};
pub use transport::MAX_WORLD_SIZE;
