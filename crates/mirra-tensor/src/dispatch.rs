//! Dtype dispatch: one generic kernel body, instantiated for each element type.

/// Runs `$body` with `$T` bound to the float type matching `$dtype`; any other dtype is
/// an [`UnsupportedDType`](crate::TensorError::UnsupportedDType) error naming `$op`.
macro_rules! with_float {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            mirra_device::DType::F32 => {
                type $T = f32;
                $body
            }
            mirra_device::DType::F64 => {
                type $T = f64;
                $body
            }
            mirra_device::DType::F16 => {
                type $T = half::f16;
                $body
            }
            mirra_device::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            other => Err($crate::TensorError::UnsupportedDType {
                op: $op,
                dtype: other,
            }),
        }
    };
}

/// Runs `$body` with `$T` bound to the element type matching `$dtype` (every dtype).
macro_rules! with_any {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            mirra_device::DType::U8 => {
                type $T = u8;
                $body
            }
            mirra_device::DType::I32 => {
                type $T = i32;
                $body
            }
            mirra_device::DType::I64 => {
                type $T = i64;
                $body
            }
            mirra_device::DType::F32 => {
                type $T = f32;
                $body
            }
            mirra_device::DType::F64 => {
                type $T = f64;
                $body
            }
            mirra_device::DType::F16 => {
                type $T = half::f16;
                $body
            }
            mirra_device::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
        }
    };
}

pub(crate) use {with_any, with_float};
