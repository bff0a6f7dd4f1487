//! Gradient clipping by the global norm, as `tf.clip_by_global_norm`.
//!
//! Clipping by the norm of all gradients together (rather than each on its own) keeps the
//! update's direction and only shortens it, which is what stabilises training with large
//! learning rates or exploding gradients. In a mirrored run it is applied to the reduced
//! gradients, so every replica clips identically.

use mirra_tensor::{FloatElement, Tensor, TensorError};

use crate::cuda;
use crate::optimizer::{at, cast, with_float};
use crate::{OptimError, Result};

const GLOBAL_NORM: &str = "global_norm";
const CLIP: &str = "clip_by_global_norm";

/// The global L2 norm `sqrt(Σᵢ ‖tᵢ‖²)` of a list of float tensors (0 for an empty list).
///
/// Squares are summed in f64 in element order, whatever the tensors' dtype, so the result
/// is deterministic and does not overflow for 16-bit gradients. An error names the first
/// non-float tensor.
pub fn global_norm(tensors: &[Tensor]) -> Result<f64> {
    global_norm_as(GLOBAL_NORM, tensors)
}

fn global_norm_as(op: &'static str, tensors: &[Tensor]) -> Result<f64> {
    let mut sum = 0.0;
    for (i, t) in tensors.iter().enumerate() {
        sum += with_float!(op, i, t.dtype(), T => if t.device().is_cpu() {
            sum_of_squares::<T>(t).map_err(at(op, i))
        } else {
            cuda::sum_of_squares(t).map_err(at(op, i))
        })?;
    }
    Ok(sum.sqrt())
}

fn sum_of_squares<T: FloatElement>(t: &Tensor) -> std::result::Result<f64, TensorError> {
    let t = t.contiguous()?;
    Ok(t.as_slice::<T>()?
        .iter()
        .map(|&x| {
            let x = x.to_f64();
            x * x
        })
        .sum())
}

/// Rescale `grads` in place so that their global norm is at most `max_norm`, exactly as
/// `tf.clip_by_global_norm(grads, max_norm)`; returns the global norm before clipping.
///
/// Every gradient is multiplied by `max_norm / max(norm, max_norm)`: when the norm is at
/// most `max_norm` nothing is written (a no-op, bit for bit), otherwise the scale
/// `max_norm / norm` is applied (computed in f64, multiplied in each gradient's
/// accumulation type). As in TensorFlow, a non-finite norm (a gradient holding inf or NaN)
/// sets every gradient to NaN, so the failure cannot go unnoticed; check the returned norm
/// to skip such a step instead.
///
/// `max_norm` must be `> 0` (infinity disables clipping). A gradient whose buffer is shared
/// is copied before it is written.
pub fn clip_by_global_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64> {
    if max_norm.is_nan() || max_norm <= 0.0 {
        return Err(OptimError::InvalidHyperparameter {
            op: CLIP,
            name: "max_norm",
            value: max_norm,
            expected: "a value > 0",
        });
    }
    let norm = global_norm_as(CLIP, grads)?;
    if norm <= max_norm {
        return Ok(norm);
    }
    let scale = if norm.is_finite() {
        max_norm / norm
    } else {
        f64::NAN
    };
    for (i, g) in grads.iter_mut().enumerate() {
        with_float!(CLIP, i, g.dtype(), T => if g.device().is_cpu() {
            scale_in_place::<T>(g, scale).map_err(at(CLIP, i))
        } else {
            cuda::scale_in_place(g, scale).map_err(at(CLIP, i))
        })?;
    }
    Ok(norm)
}

fn scale_in_place<T: FloatElement>(
    g: &mut Tensor,
    scale: f64,
) -> std::result::Result<(), TensorError> {
    let s: T::Acc = cast(scale);
    for x in g.data_mut::<T>()? {
        *x = T::from_acc(x.to_acc() * s);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use mirra_tensor::{DType, Device};

    use super::*;
    use crate::testutil::{t32, values};

    #[test]
    fn clips_to_the_global_norm() {
        // ‖[3, 4]‖² + ‖[12]‖² = 25 + 144 = 169, norm 13; max 6.5 → scale 0.5.
        let mut g = vec![t32(&[3.0, 4.0]), t32(&[12.0])];
        let norm = clip_by_global_norm(&mut g, 6.5).unwrap();
        assert_eq!(norm, 13.0);
        assert_eq!(values(&g[0]), vec![1.5, 2.0]);
        assert_eq!(values(&g[1]), vec![6.0]);
        assert_eq!(global_norm(&g).unwrap(), 6.5);
    }

    #[test]
    fn below_the_threshold_is_a_no_op() {
        let g0 = vec![t32(&[3.0, 4.0]), t32(&[12.0])];
        let mut g = g0.clone();
        assert_eq!(clip_by_global_norm(&mut g, 13.0).unwrap(), 13.0);
        assert_eq!(clip_by_global_norm(&mut g, f64::INFINITY).unwrap(), 13.0);
        // Nothing was written: the buffers are still the shared originals.
        assert!(g.iter().zip(&g0).all(|(a, b)| a.same_buffer(b)));
        assert_eq!(clip_by_global_norm(&mut [], 1.0).unwrap(), 0.0);
    }

    #[test]
    fn mixed_dtypes_and_non_finite_norms() {
        // f64 [6, 8] and bf16 [0]: norm 10, max 5 → halve each.
        let mut g = vec![
            Tensor::from_slice(&[6.0f64, 8.0], &[2], Device::Cpu).unwrap(),
            t32(&[0.0]).to_dtype(DType::BF16).unwrap(),
        ];
        assert_eq!(clip_by_global_norm(&mut g, 5.0).unwrap(), 10.0);
        assert_eq!(values(&g[0]), vec![3.0, 4.0]);
        assert_eq!(g[1].dtype(), DType::BF16);
        // TensorFlow's contract: an inf norm turns every gradient into NaN.
        let mut g = vec![t32(&[f32::INFINITY]), t32(&[1.0])];
        assert!(clip_by_global_norm(&mut g, 1.0).unwrap().is_infinite());
        assert!(values(&g[1])[0].is_nan());
    }

    #[test]
    fn errors_name_the_tensor() {
        let mut g = vec![t32(&[1.0])];
        let err = clip_by_global_norm(&mut g, 0.0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "clip_by_global_norm: max_norm = 0 is invalid: expected a value > 0"
        );
        let ints = [
            t32(&[1.0]),
            Tensor::from_slice(&[1i64], &[1], Device::Cpu).unwrap(),
        ];
        let err = global_norm(&ints).unwrap_err();
        assert_eq!(
            err.to_string(),
            "global_norm: tensor 1 has dtype i64; only f32, f64, f16 and bf16 are supported"
        );
    }

    proptest::proptest! {
        #[test]
        fn clipped_norm_is_the_smaller_of_the_two(
            a in proptest::collection::vec(-100.0f32..100.0, 1..20),
            b in proptest::collection::vec(-100.0f32..100.0, 1..20),
            max_norm in 0.01f64..200.0,
        ) {
            let mut g = vec![t32(&a), t32(&b)];
            let norm = clip_by_global_norm(&mut g, max_norm).unwrap();
            let after = global_norm(&g).unwrap();
            let want = norm.min(max_norm);
            proptest::prop_assert!((after - want).abs() <= 1e-5 * want.max(1e-3));
            // The direction is kept: every element is scaled by the same factor.
            let scale = want / norm.max(f64::MIN_POSITIVE);
            for (x, y) in a.iter().chain(&b).zip(values(&g[0]).into_iter().chain(values(&g[1]))) {
                proptest::prop_assert!((*x as f64 * scale - y).abs() <= 1e-5 * (1.0 + y.abs()));
            }
        }
    }
}
