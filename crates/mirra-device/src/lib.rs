//! Devices, element types and device buffers.
//!
//! Everything above this crate moves data through [`Buffer`]s that live on a [`Device`].
//! Buffers live on the CPU today. A CUDA device is a variant of the same enum that only
//! [`Device::cuda`] makes, after the driver (loaded at run time through `mirra-cuda`)
//! reported it: without a driver the answer is an error (`no CUDA driver found`), never a
//! compile failure or a panic, so every caller builds and tests everywhere.

mod buffer;
pub mod denormals;
mod device;
mod dtype;
mod error;
mod half_bits;
pub mod memory;
mod pool;
mod simd;
pub mod sync;
pub mod trace;

pub use buffer::Buffer;
pub use device::{CudaDevice, Device};
pub use dtype::{DType, Element, FloatElement};
pub use error::DeviceError;
pub use pool::{live_bytes, pool_stats, PoolStats};
pub use simd::vectorize;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, DeviceError>;
