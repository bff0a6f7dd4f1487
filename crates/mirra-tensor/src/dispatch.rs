//! Dtype dispatch: one generic kernel body, instantiated for each element type.

/// Runs `$body` with `$T` bound to the float element type matching the
/// [`DType`](crate::DType) `$dtype` (`f32`, `f64`, `half::f16` or `half::bf16`); any other
/// dtype is bound to `$other` and `$fallback` is evaluated instead.
///
/// This is the one place the float dtypes are mapped to their Rust types: the crates of
/// mirra write a kernel once, generically over [`FloatElement`](crate::FloatElement), and
/// call it from such a body, each with its own error for the non-float case. The body is
/// expanded once per float type, so it must type-check for all four.
///
/// Inside the body `$T` is a concrete type, not a generic parameter, so a method name that
/// `half`'s types also define inherently resolves to the inherent method: write
/// `<T as Element>::from_f64(x)`, never `T::from_f64(x)` (half's own `from_f64` rounds
/// differently from [`Element::from_f64`](crate::Element::from_f64)).
///
/// ```
/// use mirra_tensor::{match_float_dtype, DType, Element};
///
/// fn one(dtype: DType) -> Result<f64, String> {
///     match_float_dtype!(dtype, T => {
///         let x = <T as Element>::from_f64(1.0);
///         Ok(<T as Element>::to_f64(x))
///     }, other => Err(format!("{other} is not a float type")))
/// }
///
/// assert_eq!(one(DType::BF16), Ok(1.0));
/// assert_eq!(one(DType::I64), Err("i64 is not a float type".to_string()));
/// ```
#[macro_export]
macro_rules! match_float_dtype {
    ($dtype:expr, $T:ident => $body:expr, $other:ident => $fallback:expr $(,)?) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::__private::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::__private::bf16;
                $body
            }
            $other => $fallback,
        }
    };
}

/// [`match_float_dtype!`] whose non-float case is an
/// [`UnsupportedDType`](crate::TensorError::UnsupportedDType) error naming `$op`.
macro_rules! with_float {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        $crate::match_float_dtype!($dtype, $T => $body, other => {
            Err($crate::TensorError::UnsupportedDType { op: $op, dtype: other })
        })
    };
}

/// Runs `$body` with `$T` bound to the element type matching `$dtype` (every dtype): the
/// floats through [`match_float_dtype!`], then the integers.
macro_rules! with_any {
    ($dtype:expr, $T:ident => $body:expr) => {
        $crate::match_float_dtype!($dtype, $T => $body, int => match int {
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::F32
            | $crate::DType::F64
            | $crate::DType::F16
            | $crate::DType::BF16 => unreachable!("the float dtypes were matched above"),
        })
    };
}

pub(crate) use {with_any, with_float};
