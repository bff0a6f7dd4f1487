//! An ablation, not a kernel to train with: bf16 matrix products whose running sums are
//! kept in bf16, rounded to nearest even after every multiply-add, as a 16-bit
//! accumulator would keep them. mirra, like every framework, accumulates 16-bit products
//! in f32; `cargo xtask accuracy-precision` trains with this switched on (`mirra train
//! --ablate-bf16-accumulation`) to show what that choice is worth: the sum of k products
//! stalls once a term falls below half a bf16 unit of it (8 significant bits), and the
//! trained networks end worse.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::threads::split_rows;
use crate::{DType, Result, Shape, Tensor};

static ON: AtomicBool = AtomicBool::new(false);

/// Switch the ablation on or off for every bf16 matrix product of the process (and the
/// convolutions, which are matrix products of patches).
pub fn set_bf16_accumulation_ablation(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether [`set_bf16_accumulation_ablation`] is on.
pub fn bf16_accumulation_ablation() -> bool {
    ON.load(Ordering::Relaxed)
}

/// `x` rounded to the nearest bf16 (ties to even), kept in an f32. Infinities stay; a sum
/// beyond bf16's largest finite value becomes infinite, as in bf16.
#[inline(always)]
fn round_to_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits(bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}

/// `a x b` (bf16, shapes checked by the caller; batch dimensions broadcast) with each
/// product added to a bf16 running sum, in order of k.
pub(super) fn matmul(
    a: &Tensor,
    b: &Tensor,
    batch: &Shape,
    m: usize,
    k: usize,
    n: usize,
    out_dims: &[usize],
) -> Result<Tensor> {
    let full = |t: &Tensor, rows: usize, cols: usize| -> Result<Vec<f32>> {
        let mut dims = batch.to_vec();
        dims.extend([rows, cols]);
        t.broadcast_to(&dims)?.to_dtype(DType::F32)?.to_vec::<f32>()
    };
    let (xa, xb) = (full(a, m, k)?, full(b, k, n)?);
    let mut out = vec![0f32; batch.elem_count() * m * n];
    split_rows(&mut out, n.max(1), &|first, rows| {
        for (r, row) in rows.chunks_exact_mut(n.max(1)).enumerate() {
            let (g, i) = ((first + r) / m, (first + r) % m);
            let a_row = &xa[(g * m + i) * k..][..k];
            let b_mat = &xb[g * k * n..][..k * n];
            for (p, &ap) in a_row.iter().enumerate() {
                for (acc, &bp) in row.iter_mut().zip(&b_mat[p * n..][..n]) {
                    *acc = round_to_bf16(*acc + ap * bp);
                }
            }
        }
    });
    Tensor::from_vec(out, out_dims, a.device())?.to_dtype(DType::BF16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_bf16_is_to_nearest_even() {
        assert_eq!(round_to_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_to_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(round_to_bf16(1.0 + 1.5 / 256.0), 1.0 + 2.0 / 256.0);
        assert_eq!(round_to_bf16(-257.0), -256.0);
        assert_eq!(round_to_bf16(f32::INFINITY), f32::INFINITY);
        assert_eq!(round_to_bf16(f32::MAX), f32::INFINITY);
    }
}
