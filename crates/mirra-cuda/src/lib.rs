//! mirra's door to CUDA: thin, checked wrappers over the CUDA libraries, which are loaded
//! at run time through [`cudarc`].
//!
//! Nothing here needs a CUDA toolkit to build, and nothing panics on a machine without a
//! GPU: cudarc's dynamically loaded calls panic when their library is missing, so every
//! entry point first asks [`library::ensure`] and returns [`CudaError`] instead
//! (`no CUDA driver found`, or the library and the file names that were looked for).
//!
//! Layers, bottom up (no module imports one above it):
//! - [`error`]: [`CudaError`], one enum for every library's failures, naming the call;
//! - [`library`]: which shared libraries are present, and where they were loaded from;
//! - [`devices`]: how many devices the driver sees, and whether one exists;
//! - [`allocator`]: the caching allocator of device memory (free lists per stream and
//!   size class, bytes in use and held, their peaks), generic over the driver's calls;
//! - [`kernels`]: mirra's own kernels, as PTX compiled by `cargo xtask kernels` from
//!   `kernels/*.cu` and committed under `ptx/`, their op codes, and their loader;
//! - [`runtime`]: one device as mirra uses it (context, stream, allocator, kernels) and
//!   the device buffers that hold tensors' memory there;
//! - [`events`]: more streams on a device and the events that order work across them,
//!   tell the host that queued work has run, and time it on the device;
//! - [`probe`]: the GPU probe that `cargo xtask gpu-probe` runs first on a lent GPU
//!   machine (libraries, context, a 1 GiB round trip, cuBLAS, an NVRTC kernel, NCCL);
//! - [`topology`]: how the machine's GPUs are connected (`mirra topo`: NVLink from NVML,
//!   PCIe paths from sysfs, peer access).

pub mod allocator;
pub mod devices;
pub mod error;
pub mod events;
pub mod kernels;
pub mod library;
pub mod probe;
pub mod runtime;
pub mod topology;

pub use devices::{check_device, device_count};
pub use error::{CudaError, Result};
pub use library::Library;

/// Re-exported so that crates above name one cudarc version.
pub use cudarc;
