//! Seeded initialisers with Keras's definitions (fans, limits, truncated normals).
//!
//! The generator is ChaCha8, whose output is fixed by its specification, so a seed gives
//! the same weights on every platform and in every release.

use mirra_device::{DType, Device};
use rand::{RngExt as _, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

use crate::{Result, Tensor, TensorError};

/// The random generator used for initialisation, shuffling and dropout.
pub type Rng = rand_chacha::ChaCha8Rng;

/// A generator seeded with `seed`.
pub fn rng(seed: u64) -> Rng {
    Rng::seed_from_u64(seed)
}

/// How to fill a new parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Initializer {
    /// All zeros (Keras's default bias).
    Zeros,
    /// All ones.
    Ones,
    /// Every element the same value.
    Constant(f64),
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
    },
    /// Normal with the given mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// Normal, redrawn beyond two standard deviations (Keras's `TruncatedNormal`).
    TruncatedNormal {
        /// Mean.
        mean: f64,
        /// Standard deviation before truncation.
        std: f64,
    },
    /// Uniform on `±sqrt(6 / (fan_in + fan_out))` (Keras's default kernel).
    GlorotUniform,
    /// Truncated normal with std `sqrt(2 / (fan_in + fan_out))`.
    GlorotNormal,
    /// Uniform on `±sqrt(6 / fan_in)`.
    HeUniform,
    /// Truncated normal with std `sqrt(2 / fan_in)`.
    HeNormal,
}

/// Standard deviation of a unit normal truncated at ±2, by which Keras divides so that
/// the truncated draw has the intended variance.
const TRUNCATION_STD: f64 = 0.879_625_661_034_239_8;

/// `(fan_in, fan_out)` of a weight shape as Keras computes them: a dense kernel is
/// `[in, out]`; a convolution kernel `[.., in, out]` multiplies both by its receptive field.
pub fn fans(dims: &[usize]) -> (usize, usize) {
    match dims {
        [] => (1, 1),
        [n] => (*n, *n),
        [i, o] => (*i, *o),
        [rest @ .., i, o] => {
            let field: usize = rest.iter().product();
            (i * field, o * field)
        }
    }
}

impl Initializer {
    /// A new tensor of shape `dims` filled by this initialiser from `rng`.
    pub fn init(
        &self,
        dims: &[usize],
        dtype: DType,
        device: Device,
        rng: &mut Rng,
    ) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(TensorError::UnsupportedDType { op: "init", dtype });
        }
        let n: usize = dims.iter().product();
        let (fan_in, fan_out) = fans(dims);
        let values: Vec<f64> = match *self {
            Initializer::Zeros => return Tensor::zeros(dims, dtype, device),
            Initializer::Ones => return Tensor::ones(dims, dtype, device),
            Initializer::Constant(c) => return Tensor::full(dims, c, dtype, device),
            Initializer::Uniform { low, high } => uniform(n, low, high, rng),
            Initializer::Normal { mean, std } => (0..n).map(|_| mean + std * normal(rng)).collect(),
            Initializer::TruncatedNormal { mean, std } => truncated(n, mean, std, rng),
            Initializer::GlorotUniform => {
                let limit = (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
                uniform(n, -limit, limit, rng)
            }
            Initializer::GlorotNormal => {
                let std = (2.0 / (fan_in + fan_out).max(1) as f64).sqrt() / TRUNCATION_STD;
                truncated(n, 0.0, std, rng)
            }
            Initializer::HeUniform => {
                let limit = (6.0 / fan_in.max(1) as f64).sqrt();
                uniform(n, -limit, limit, rng)
            }
            Initializer::HeNormal => {
                let std = (2.0 / fan_in.max(1) as f64).sqrt() / TRUNCATION_STD;
                truncated(n, 0.0, std, rng)
            }
        };
        Tensor::from_vec(values, dims, device)?.to_dtype(dtype)
    }
}

/// A tensor of `dims` whose elements are 1 with probability `keep` and 0 otherwise, in
/// `dtype` (dropout's mask).
pub fn bernoulli(
    dims: &[usize],
    keep: f64,
    dtype: DType,
    device: Device,
    rng: &mut Rng,
) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| f32::from(u8::from(rng.random::<f64>() < keep)))
        .collect();
    Tensor::from_vec(v, dims, device)?.to_dtype(dtype)
}

/// [`bernoulli`] with each row (index along the first dimension) drawn from its own
/// generator, keyed by `key` and the row's index plus `first_row`: the mask of an example
/// depends on its place in the global batch, never on how the batch was split (dropout
/// under a mirrored strategy draws the single device's masks).
pub fn bernoulli_rows(
    dims: &[usize],
    keep: f64,
    dtype: DType,
    device: Device,
    key: u64,
    first_row: usize,
) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let per_row = n / dims.first().copied().unwrap_or(1).max(1);
    let mut v = vec![0f32; n];
    for (r, row) in v.chunks_mut(per_row.max(1)).enumerate() {
        let mut g = rng(mix(key, (first_row + r) as u64));
        for x in row {
            *x = f32::from(u8::from(g.random::<f64>() < keep));
        }
    }
    Tensor::from_vec(v, dims, device)?.to_dtype(dtype)
}

/// SplitMix64 of two keys: unrelated seeds for neighbouring keys.
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn uniform(n: usize, low: f64, high: f64, rng: &mut Rng) -> Vec<f64> {
    (0..n)
        .map(|_| low + (high - low) * rng.random::<f64>())
        .collect()
}

fn normal(rng: &mut Rng) -> f64 {
    StandardNormal.sample(rng)
}

fn truncated(n: usize, mean: f64, std: f64, rng: &mut Rng) -> Vec<f64> {
    (0..n)
        .map(|_| loop {
            let z = normal(rng);
            if z.abs() <= 2.0 {
                break mean + std * z;
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glorot_uniform_respects_the_keras_limit_and_the_seed() {
        let w = Initializer::GlorotUniform
            .init(&[784, 128], DType::F32, Device::Cpu, &mut rng(1))
            .unwrap();
        let v = w.to_vec::<f32>().unwrap();
        let limit = (6.0f32 / 912.0).sqrt();
        assert!(v.iter().all(|x| x.abs() <= limit));
        let spread = v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32;
        // Variance of U(-l, l) is l^2 / 3.
        assert!(
            (spread - limit * limit / 3.0).abs() < 0.02 * limit * limit,
            "{spread}"
        );
        let again = Initializer::GlorotUniform
            .init(&[784, 128], DType::F32, Device::Cpu, &mut rng(1))
            .unwrap();
        assert_eq!(again.to_vec::<f32>().unwrap(), v);
    }

    #[test]
    fn he_normal_has_the_intended_variance_after_truncation() {
        let w = Initializer::HeNormal
            .init(&[500, 400], DType::F64, Device::Cpu, &mut rng(7))
            .unwrap();
        let v = w.to_vec::<f64>().unwrap();
        let var = v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64;
        assert!((var - 2.0 / 500.0).abs() < 0.05 * 2.0 / 500.0, "{var}");
    }

    #[test]
    fn fans_follow_keras() {
        assert_eq!(fans(&[784, 128]), (784, 128));
        assert_eq!(fans(&[3, 3, 16, 32]), (144, 288));
    }
}
