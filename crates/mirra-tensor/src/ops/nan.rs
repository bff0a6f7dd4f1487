//! NaN semantics shared by the kernels, as PyTorch's and TensorFlow's: a NaN operand
//! makes the result NaN. Rust's `f32::max` and `f32::min` return the other operand
//! instead (IEEE 754's `maxNum`), which would turn a NaN into a number without a word.
//!
//! Also the scan for non-finite elements that training runs over the weights after every
//! update ([`Tensor::first_non_finite`]).

use mirra_device::{vectorize, Element, FloatElement};
use num_traits::Float;

use crate::dispatch::with_float;
use crate::{Result, Tensor};

/// `max(a, b)`, NaN when either is NaN.
#[inline(always)]
pub(crate) fn max_nan<A: Float>(a: A, b: A) -> A {
    if a > b || a.is_nan() {
        a
    } else {
        b
    }
}

/// `min(a, b)`, NaN when either is NaN.
#[inline(always)]
pub(crate) fn min_nan<A: Float>(a: A, b: A) -> A {
    if a < b || a.is_nan() {
        a
    } else {
        b
    }
}

/// Elements scanned between checks for a hit, so that the scan's inner loop has no exit
/// and vectorises.
const SCAN_BLOCK: usize = 4096;

impl Tensor {
    /// The position (in row-major order) and value of the first element that is NaN or
    /// infinite, `None` when all are finite; an error for a non-float tensor.
    ///
    /// One vectorised pass over the data: cheap enough to run over every weight after
    /// every training step.
    ///
    /// A tensor on a device is copied to the host first (training scans the weights once
    /// per epoch and after a non-finite loss, not per step).
    pub fn first_non_finite(&self) -> Result<Option<(usize, f64)>> {
        let x = self.to_device(mirra_device::Device::Cpu)?.contiguous()?;
        with_float!("first_non_finite", x.dtype(), T => {
            let data = x.as_slice::<T>()?;
            Ok(vectorize(#[inline(always)] || first_non_finite::<T>(data)))
        })
    }
}

/// Inlined into [`vectorize`]'s dispatch, so that the block loop gets its vector width.
#[inline(always)]
fn first_non_finite<T: FloatElement>(data: &[T]) -> Option<(usize, f64)> {
    for (block, chunk) in data.chunks(SCAN_BLOCK).enumerate() {
        let any = chunk
            .iter()
            .fold(false, |any, x| any | !x.to_acc().is_finite());
        if any {
            let (i, x) = chunk
                .iter()
                .enumerate()
                .find(|(_, x)| !x.to_acc().is_finite())?;
            return Some((block * SCAN_BLOCK + i, Element::to_f64(x.to_acc())));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Device};

    #[test]
    fn max_and_min_propagate_nan_from_either_side() {
        let nan = f32::NAN;
        for (a, b) in [(nan, 1.0), (1.0, nan), (nan, nan)] {
            assert!(max_nan(a, b).is_nan() && min_nan(a, b).is_nan(), "{a} {b}");
        }
        assert_eq!((max_nan(1.0, 2.0), min_nan(1.0, 2.0)), (2.0, 1.0));
        assert_eq!(max_nan(f32::NEG_INFINITY, -3.0), -3.0);
    }

    #[test]
    fn the_scan_finds_the_first_nan_or_infinity_in_every_dtype() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let n = 3 * SCAN_BLOCK + 17;
            let finite = Tensor::ones(&[n], DType::F32, Device::Cpu).unwrap();
            let t = finite.to_dtype(dtype).unwrap();
            assert_eq!(t.first_non_finite().unwrap(), None, "{dtype}");
            for (at, bad) in [
                (0, f64::NAN),
                (SCAN_BLOCK, f64::INFINITY),
                (n - 1, f64::NEG_INFINITY),
            ] {
                let mut v = vec![1f32; n];
                v[at] = bad as f32;
                // A later second hit must not hide the first.
                if at != n - 1 {
                    v[n - 1] = f32::NAN;
                }
                let t = Tensor::from_vec(v, &[n], Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let (i, value) = t.first_non_finite().unwrap().unwrap();
                assert_eq!(i, at, "{dtype}");
                assert!(
                    value.to_bits() == bad.to_bits() || (value.is_nan() && bad.is_nan()),
                    "{dtype}: {value}"
                );
            }
        }
        // Views are scanned in their logical order.
        let m = Tensor::from_slice(&[1f32, 2., f32::NAN, 4.], &[2, 2], Device::Cpu).unwrap();
        assert_eq!(
            m.t().unwrap().first_non_finite().unwrap().map(|h| h.0),
            Some(1)
        );
        let ints = Tensor::from_slice(&[1i64], &[1], Device::Cpu).unwrap();
        assert!(ints.first_non_finite().is_err());
    }
}
