//! Helpers shared by the criterion benches of `mirra-benches` (`cargo bench -p
//! mirra-benches`): seeded random inputs, so that every run measures the same data.

use mirra_tensor::init::{rng, Initializer};
use mirra_tensor::{DType, Device, Result, Tensor};

/// The device every bench runs on, and the tag that starts each bench name (`cpu/...`).
pub const DEVICE: Device = Device::Cpu;

/// Bench name tag of [`DEVICE`].
pub const DEVICE_TAG: &str = "cpu";

/// An f32 tensor of shape `dims` drawn uniformly from `[-1, 1)` with `seed`.
pub fn uniform(dims: &[usize], seed: u64) -> Result<Tensor> {
    Initializer::Uniform {
        low: -1.0,
        high: 1.0,
    }
    .init(dims, DType::F32, DEVICE, &mut rng(seed))
}

/// Number of elements of a shape, as criterion's `u64`.
pub fn elems(dims: &[usize]) -> u64 {
    dims.iter().product::<usize>() as u64
}
