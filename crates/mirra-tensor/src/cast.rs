//! The casts mixed precision makes every step, f32 to and from bf16 and f16, as one pass
//! over contiguous slices (`half`'s slice conversions: F16C instructions for f16 where
//! the CPU has them, a loop the compiler vectorises for bf16), split across the kernel
//! threads when large. The generic path of [`Tensor::to_dtype`](crate::Tensor::to_dtype)
//! goes through f64 one element at a time; these give the same bits (one rounding to
//! nearest even from the exact value) several times faster.

use half::slice::HalfFloatSliceExt;

use crate::threads::split_rows;

/// Elements per piece of work handed to a kernel thread.
const PIECE: usize = 1 << 14;

/// `dst[i] = src[i]` rounded to the 16-bit float `H`.
pub(crate) fn from_f32<H: Send>(src: &[f32], dst: &mut [H])
where
    [H]: HalfFloatSliceExt,
{
    split_rows(dst, PIECE, &|first, part| {
        let at = first * PIECE;
        mirra_device::vectorize(
            #[inline(always)]
            || part.convert_from_f32_slice(&src[at..at + part.len()]),
        );
    });
}

/// `dst[i] = src[i]` widened to f32 (exact).
pub(crate) fn to_f32<H: Sync>(src: &[H], dst: &mut [f32])
where
    [H]: HalfFloatSliceExt,
{
    split_rows(dst, PIECE, &|first, part| {
        let at = first * PIECE;
        mirra_device::vectorize(
            #[inline(always)]
            || src[at..at + part.len()].convert_to_f32_slice(part),
        );
    });
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;

    /// Every f32 bit pattern class (normals either side of a tie, subnormals, infinities,
    /// NaN, the largest finite values that round to infinity) converts as the scalar
    /// conversion does, on the kernel threads too (which flush subnormals: the f16
    /// subnormals a conversion makes must survive that).
    #[test]
    fn casts_match_the_scalar_conversion_bit_for_bit() {
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            f32::MIN_POSITIVE,
            1e-40,
            -3e-39,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            65504.0,
            65520.0,
            6e-8,
            f32::from_bits(0x3f80_8000), // a bf16 tie: rounds to even
            f32::from_bits(0x3f81_8000), // the other tie: rounds up
        ];
        let specials = xs.clone();
        let mut state = 0x9e37_79b9_u32;
        while xs.len() < crate::threads::PARALLEL_MIN + 3 * PIECE {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            xs.push(f32::from_bits(state));
        }
        xs.extend(specials);
        let xs: Vec<f32> = xs.into_iter().filter(|x| !x.is_nan()).collect();
        let mut b = vec![bf16::ZERO; xs.len()];
        let mut h = vec![f16::ZERO; xs.len()];
        crate::set_num_threads(2);
        from_f32(&xs, &mut b);
        from_f32(&xs, &mut h);
        for (i, &x) in xs.iter().enumerate() {
            // `half`'s scalar conversions work on the bits (no floating-point instruction
            // that the threads' flush-to-zero could change); the slices' f16 path runs
            // F16C instructions where the CPU has them.
            assert_eq!(b[i].to_bits(), bf16::from_f32(x).to_bits(), "{x:e}");
            assert_eq!(h[i].to_bits(), f16::from_f32(x).to_bits(), "{x:e}");
        }
        let (mut wb, mut wh) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        to_f32(&b, &mut wb);
        to_f32(&h, &mut wh);
        for i in 0..xs.len() {
            assert_eq!(wb[i].to_bits(), b[i].to_f32().to_bits());
            assert_eq!(wh[i].to_bits(), h[i].to_f32().to_bits());
        }
        let nan = [f32::NAN];
        let mut one = [bf16::ZERO];
        from_f32(&nan, &mut one);
        assert!(one[0].is_nan());
    }
}
