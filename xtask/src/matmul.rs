//! mirra's f32 matmul throughput on square matrices.

use mirra::tensor::init::{rng, Initializer};
use mirra::tensor::{set_num_threads, DType, Device, Tensor};

use crate::timing::{measure, Plan, Samples};

/// Floating-point operations of an `n x n` by `n x n` product.
pub fn flops(n: usize) -> f64 {
    2.0 * (n as f64).powi(3)
}

/// A seeded `n x n` f32 matrix, uniform on `[-1, 1)`.
fn matrix(n: usize, seed: u64) -> mirra::tensor::Result<Tensor> {
    Initializer::Uniform {
        low: -1.0,
        high: 1.0,
    }
    .init(&[n, n], DType::F32, Device::Cpu, &mut rng(seed))
}

/// Seconds per `Tensor::matmul` of two `n x n` f32 matrices with `threads` threads.
pub fn time_square(n: usize, threads: usize, plan: Plan) -> mirra::tensor::Result<Samples> {
    set_num_threads(threads);
    let a = matrix(n, 1)?;
    let b = matrix(n, 2)?;
    measure(plan, || {
        std::hint::black_box(a.matmul(&b)?);
        Ok(())
    })
}
