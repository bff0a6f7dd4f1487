//! Devices, element types and device buffers.
//!
//! Everything above this crate moves data through [`Buffer`]s that live on a [`Device`].
//! Only the CPU exists today; a CUDA device is a variant of the same enum, and asking for
//! one in a build without CUDA support is an error ([`DeviceError::NotCompiledWithCuda`]),
//! never a compile failure, so every caller builds and tests everywhere.

mod buffer;
pub mod denormals;
mod device;
mod dtype;
mod error;
mod pool;
mod simd;
pub mod sync;
pub mod trace;

pub use buffer::Buffer;
pub use device::Device;
pub use dtype::{DType, Element, FloatElement};
pub use error::DeviceError;
pub use pool::{pool_stats, PoolStats};
pub use simd::vectorize;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, DeviceError>;
