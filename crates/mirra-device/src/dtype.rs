use std::fmt;

use half::{bf16, f16};

use crate::half_bits;

/// The element types a buffer can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// Unsigned bytes (images).
    U8,
    /// 32-bit integers.
    I32,
    /// 64-bit integers (labels, indices).
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Single precision.
    F32,
    /// Double precision.
    F64,
}

impl DType {
    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// The lower-case name used in errors and file formats (`f32`, `bf16`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A plain-old-data element type with its [`DType`] tag.
pub trait Element:
    bytemuck::Pod + PartialOrd + fmt::Debug + Default + Send + Sync + 'static
{
    /// The tag of this type.
    const DTYPE: DType;
    /// Lossy conversion to f64 (exact for every type but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// Conversion from f64, rounding (floats) or truncating toward zero (integers).
    fn from_f64(v: f64) -> Self;
}

/// A floating-point element. Arithmetic runs in [`FloatElement::Acc`]: f32 for the 16-bit
/// types (as every framework does on CPU), the type itself otherwise.
pub trait FloatElement: Element {
    /// The type arithmetic is carried out in.
    type Acc: num_traits::Float + num_traits::FloatConst + Element;
    /// Widen to the accumulation type.
    fn to_acc(self) -> Self::Acc;
    /// Round from the accumulation type.
    fn from_acc(v: Self::Acc) -> Self;
}

macro_rules! int_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
int_element!(u8, U8);
int_element!(i32, I32);
int_element!(i64, I64);

macro_rules! float_element {
    ($t:ty, $d:ident, $acc:ty, $to:expr, $from:expr, $to64:expr, $from64:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                $to64(self)
            }
            fn from_f64(v: f64) -> Self {
                $from64(v)
            }
        }
        impl FloatElement for $t {
            type Acc = $acc;
            #[inline(always)]
            fn to_acc(self) -> $acc {
                $to(self)
            }
            #[inline(always)]
            fn from_acc(v: $acc) -> Self {
                $from(v)
            }
        }
    };
}
float_element!(f32, F32, f32, |x| x, |x| x, |x: f32| x as f64, |v: f64| v
    as f32);
float_element!(f64, F64, f64, |x| x, |x| x, |x| x, |v| v);
/// `v` rounded to f32 "to odd": an inexact result gets an odd last bit. Rounding that to a
/// type of at most 22 significant bits then equals rounding `v` directly (Boldo and
/// Melquiond, 2008). `half`'s own f64 conversions drop the low bits first and can round a
/// value just above a tie down.
fn f64_to_f32_round_to_odd(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f64::from(f) == v || f.to_bits() & 1 == 1 {
        return f;
    }
    // f is even and inexact: take its odd neighbour on v's side (the sign bit is the top
    // bit, so adding 1 to the bits grows the magnitude).
    let bits = f.to_bits();
    f32::from_bits(if f64::from(f).abs() < v.abs() {
        bits + 1
    } else {
        bits - 1
    })
}

float_element!(
    f16,
    F16,
    f32,
    |x: f16| half_bits::f16_to_f32(x.to_bits()),
    |v| f16::from_bits(half_bits::f32_to_f16(v)),
    f16::to_f64,
    |v| f16::from_bits(half_bits::f32_to_f16(f64_to_f32_round_to_odd(v)))
);
float_element!(
    bf16,
    BF16,
    f32,
    |x: bf16| half_bits::bf16_to_f32(x.to_bits()),
    |v| bf16::from_bits(half_bits::f32_to_bf16(v)),
    bf16::to_f64,
    |v| bf16::from_f32(f64_to_f32_round_to_odd(v))
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F32.size_in_bytes(), std::mem::size_of::<f32>());
        assert_eq!(DType::BF16.size_in_bytes(), std::mem::size_of::<bf16>());
        assert_eq!(DType::I64.size_in_bytes(), std::mem::size_of::<i64>());
        assert_eq!(<f16 as Element>::DTYPE, DType::F16);
    }

    #[test]
    fn f64_to_half_rounds_to_nearest_even_above_a_tie() {
        // 1 + 2^-8 + 2^-40 lies just above the tie between bf16 1.0 and 1.0078125.
        let v = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(<bf16 as Element>::from_f64(v).to_f64(), 1.0078125);
        // An exact tie rounds to even.
        assert_eq!(
            <bf16 as Element>::from_f64(1.0 + 2f64.powi(-8)).to_f64(),
            1.0
        );
        let w = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(<f16 as Element>::from_f64(w).to_f64(), 1.0 + 2f64.powi(-10));
        assert_eq!(
            <f16 as Element>::from_f64(-w).to_f64(),
            -(1.0 + 2f64.powi(-10))
        );
    }

    #[test]
    fn half_types_accumulate_in_f32() {
        let x = bf16::from_f32(1.5);
        assert_eq!(x.to_acc(), 1.5f32);
        assert_eq!(f16::from_acc(0.25).to_f32(), 0.25);
    }
}
