//! f16 <-> f32 conversions written as integer and float operations without branches, so
//! that the element-wise kernels the compiler vectorises can inline them. `half`'s own
//! scalar conversions check for F16C at run time on every call and convert one value
//! per call: a third of a `mixed_float16` training step went into them. Both round to
//! nearest even; these also hold under flush-to-zero and denormals-are-zero, which the
//! kernel threads set (the one float addition sees either an f32 normal or an f32
//! subnormal whose f16 is zero either way).

/// 2^-24, the f16 subnormal unit.
const F16_SUBNORMAL_UNIT: f32 = 1.0 / 16_777_216.0;

/// The f32 of the f16 with these bits (exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exponent = h & 0x7c00;
    let mantissa = h & 0x03ff;
    // Normal: move the exponent and mantissa into place and rebias (15 -> 127).
    let normal = ((h & 0x7fff) << 13) + ((127 - 15) << 23);
    // Subnormal: mantissa x 2^-24, an integer times a power of two (exact, and normal).
    let subnormal = (mantissa as f32 * F16_SUBNORMAL_UNIT).to_bits();
    // Infinity, or a NaN made quiet, as F16C does.
    let special = 0x7f80_0000 | (mantissa << 13) | if mantissa != 0 { 0x0040_0000 } else { 0 };
    let magnitude = if exponent == 0x7c00 {
        special
    } else if exponent == 0 {
        subnormal
    } else {
        normal
    };
    f32::from_bits(magnitude | sign)
}

/// The bits of `x` rounded to the nearest f16, ties to even (F. Giesen's
/// `float_to_half_fast3_rtne`).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = bits & 0x8000_0000;
    let a = bits ^ sign;
    // Infinity, or the quiet NaN.
    let special = if a > 0x7f80_0000 { 0x7e00 } else { 0x7c00 };
    // Below 2^-14 the f16 is subnormal or zero: adding 0.5 lines its 10 bits up at the
    // bottom of the f32's mantissa, rounded to nearest even by the addition itself.
    const MAGIC: u32 = 126 << 23;
    let subnormal = (f32::from_bits(a) + f32::from_bits(MAGIC))
        .to_bits()
        .wrapping_sub(MAGIC);
    // Normal: rebias (127 -> 15) and round half to even on the 13 bits dropped; a carry
    // out of the mantissa bumps the exponent, up to infinity for values from 65520.
    let odd = (a >> 13) & 1;
    let normal = a.wrapping_sub((127 - 15) << 23).wrapping_add(0xfff + odd) >> 13;
    let h = if a >= (127 + 16) << 23 {
        special
    } else if a < (127 - 14) << 23 {
        subnormal
    } else {
        normal
    };
    (h | (sign >> 16)) as u16
}

/// The f32 of the bf16 with these bits (exact), a NaN made quiet as `half` does.
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let quiet = if h & 0x7fff > 0x7f80 { 0x0040 } else { 0 };
    f32::from_bits((h | quiet) << 16)
}

/// The bits of `x` rounded to the nearest bf16, ties to even; a NaN stays a NaN with its
/// top mantissa bits, made quiet (bit for bit what `half::bf16::from_f32` gives).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let nan = (bits >> 16) | 0x0040;
    // Adding just under half a unit, plus the kept part's lowest bit, carries exactly
    // when the dropped half is above a tie, or a tie with an odd kept part; a carry out
    // of the mantissa bumps the exponent, up to infinity.
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    (if bits & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    #[test]
    fn every_f16_widens_exactly() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f64();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(f64::from(got), want, "{h:#06x}");
                assert_eq!(got.is_sign_negative(), want.is_sign_negative(), "{h:#06x}");
            }
        }
    }

    /// Against the exact rounding (f64 arithmetic on the f16 grid): every f32 exponent,
    /// mantissas sampled with a stride, and every f32 within a few units of each f16
    /// value and of each midpoint between two (the ties and the values beside them).
    #[test]
    fn f32_rounds_to_the_nearest_f16_ties_to_even() {
        let check = |x: f32| {
            let got = f16::from_bits(f32_to_f16(x));
            let want = f16::from_f32(x);
            if x.is_nan() {
                assert!(got.is_nan(), "{x:e}");
            } else {
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{x:e} ({:#010x})",
                    x.to_bits()
                );
            }
        };
        let mut bits = 0u32;
        while let Some(next) = bits.checked_add(4099) {
            check(f32::from_bits(bits));
            bits = next;
        }
        for h in 0..0x7c00u16 {
            let v = f16::from_bits(h).to_f32();
            let up = f16::from_bits(h + 1).to_f32();
            let mid = ((f64::from(v) + f64::from(up)) / 2.0) as f32;
            for centre in [v, mid] {
                for d in -3i32..=3 {
                    let x = f32::from_bits(centre.to_bits().wrapping_add_signed(d));
                    check(x);
                    check(-x);
                }
            }
        }
        for x in [
            65504.0,
            65519.99,
            65520.0,
            1e9,
            f32::INFINITY,
            f32::NAN,
            0.0,
            -0.0,
        ] {
            check(x);
        }
    }

    /// Every bf16 widens as `half` widens it, and f32s of every class (ties either way,
    /// carries into the exponent and up to infinity, subnormals, NaNs with payloads)
    /// round to what `half` gives: the conversions the kernels inline are half's, faster.
    #[test]
    fn bf16_conversions_match_half_bit_for_bit() {
        use half::bf16;
        for h in 0..=u16::MAX {
            let want = bf16::from_bits(h).to_f32();
            assert_eq!(bf16_to_f32(h).to_bits(), want.to_bits(), "bf16 {h:#06x}");
        }
        let mut xs: Vec<u32> = vec![
            0,
            0x8000_0000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0x3f80_7fff,
            0x7f7f_ffff,
            0x7f7f_8000,
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0x7fc0_0000,
            0xffbf_ffff,
            0x0000_0001,
            0x0040_0000,
            0x807f_ffff,
            0x0001_8000,
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            xs.push(state as u32);
        }
        for bits in xs {
            let x = f32::from_bits(bits);
            assert_eq!(
                f32_to_bf16(x),
                bf16::from_f32(x).to_bits(),
                "f32 {bits:#010x}"
            );
        }
    }
}
