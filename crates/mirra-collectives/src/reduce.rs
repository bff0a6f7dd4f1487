//! Reduction operators and the one generic kernel that applies them to every dtype.
//!
//! The kernel combines a destination with any number of sources in one pass, element by
//! element in a fixed operand order. Arithmetic runs in the element's accumulation type
//! (f32 for f16 and bf16, the type itself otherwise), so a 16-bit result combined from
//! several inputs in one pass is rounded once. Integer arithmetic wraps (as NCCL's does),
//! and `Mean` divides the sum by the world size in the same pass (truncating for
//! integers, as NCCL's `ncclAvg`).

use std::fmt;

use half::{bf16, f16};
use mirra_device::{DType, Element, FloatElement};

/// How a collective combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum (integers wrap).
    Sum,
    /// The sum divided by the world size (integers: truncating division of the wrapped
    /// sum, as NCCL's `ncclAvg`).
    Mean,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
    /// The product (integers wrap).
    Product,
}

impl ReduceOp {
    /// Every operator, for tests and benchmarks.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Product,
    ];

    /// The lower-case name (`sum`, `mean`, ...), as nccl-tests prints it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Product => "prod",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The dtypes collectives move and reduce.
pub const SUPPORTED_DTYPES: [DType; 7] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::U8,
];

/// An element the kernel can reduce: its accumulation type and the operators on it.
pub(crate) trait Reducible: Element {
    /// The type arithmetic runs in.
    type Acc: Copy + Default;
    /// Whether the type is a floating-point one (the test references fold floats in f64).
    #[cfg(test)]
    const IS_FLOAT: bool;
    fn widen(self) -> Self::Acc;
    fn narrow(a: Self::Acc) -> Self;
    fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn mul(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `a / n` (truncating for integers).
    fn div_n(a: Self::Acc, n: usize) -> Self::Acc;
}

macro_rules! float_reducible {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            type Acc = <$t as FloatElement>::Acc;
            #[cfg(test)]
            const IS_FLOAT: bool = true;
            #[inline(always)]
            fn widen(self) -> Self::Acc {
                self.to_acc()
            }
            #[inline(always)]
            fn narrow(a: Self::Acc) -> Self {
                <$t as FloatElement>::from_acc(a)
            }
            #[inline(always)]
            fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc {
                a + b
            }
            #[inline(always)]
            fn mul(a: Self::Acc, b: Self::Acc) -> Self::Acc {
                a * b
            }
            #[inline(always)]
            fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc {
                if b > a { b } else { a }
            }
            #[inline(always)]
            fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc {
                if b < a { b } else { a }
            }
            #[inline(always)]
            fn div_n(a: Self::Acc, n: usize) -> Self::Acc {
                a / (n as Self::Acc)
            }
        }
    )*};
}
float_reducible!(f32, f64, f16, bf16);

macro_rules! int_reducible {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            type Acc = $t;
            #[cfg(test)]
            const IS_FLOAT: bool = false;
            #[inline(always)]
            fn widen(self) -> $t {
                self
            }
            #[inline(always)]
            fn narrow(a: $t) -> $t {
                a
            }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn div_n(a: $t, n: usize) -> $t {
                // World sizes are small (at most MAX_WORLD_SIZE), so `n` fits every type.
                a.wrapping_div(n as $t)
            }
        }
    )*};
}
int_reducible!(i32, i64, u8);

/// A binary operator on a type's accumulator, as a zero-sized type so that the kernel is
/// compiled once per (dtype, operator) with the operator inlined into the loop.
pub(crate) trait Bin<T: Reducible> {
    fn f(a: T::Acc, b: T::Acc) -> T::Acc;
}
pub(crate) struct AddOp;
pub(crate) struct MulOp;
pub(crate) struct MaxOp;
pub(crate) struct MinOp;
impl<T: Reducible> Bin<T> for AddOp {
    #[inline(always)]
    fn f(a: T::Acc, b: T::Acc) -> T::Acc {
        T::add(a, b)
    }
}
impl<T: Reducible> Bin<T> for MulOp {
    #[inline(always)]
    fn f(a: T::Acc, b: T::Acc) -> T::Acc {
        T::mul(a, b)
    }
}
impl<T: Reducible> Bin<T> for MaxOp {
    #[inline(always)]
    fn f(a: T::Acc, b: T::Acc) -> T::Acc {
        T::max(a, b)
    }
}
impl<T: Reducible> Bin<T> for MinOp {
    #[inline(always)]
    fn f(a: T::Acc, b: T::Acc) -> T::Acc {
        T::min(a, b)
    }
}

/// Elements combined per block when more than two operands meet (the accumulator block
/// lives on the stack, in L1).
const BLOCK: usize = 512;

/// The kernel: `dst = first ⊕ srcs[0] ⊕ srcs[1] ⊕ ...`, left to right, where `first` is
/// `dst` itself when `accumulate` and `srcs[0]` otherwise; then divided by `divide` when
/// given. Every slice must have `dst.len()` elements. Always inlined, so that the loops
/// compile for the vector width [`combine_op`]'s `vectorize` picks.
#[inline(always)]
pub(crate) fn combine<T: Reducible, B: Bin<T>>(
    dst: &mut [T],
    accumulate: bool,
    srcs: &[&[T]],
    divide: Option<usize>,
) {
    let (first, rest): (Option<&[T]>, &[&[T]]) = if accumulate {
        (None, srcs)
    } else {
        match srcs.split_first() {
            Some((f, r)) => (Some(*f), r),
            None => return,
        }
    };
    let finish = |a: T::Acc| match divide {
        Some(n) => T::narrow(T::div_n(a, n)),
        None => T::narrow(a),
    };
    // Two operands (the ring's hot case) or a copy: one pass, no accumulator block.
    match (first, rest) {
        (Some(f), []) => {
            for (d, &x) in dst.iter_mut().zip(f) {
                *d = finish(x.widen());
            }
            return;
        }
        (None, [s]) => {
            for (d, &x) in dst.iter_mut().zip(*s) {
                *d = finish(B::f(d.widen(), x.widen()));
            }
            return;
        }
        (Some(f), [s]) => {
            for ((d, &a), &b) in dst.iter_mut().zip(f).zip(*s) {
                *d = finish(B::f(a.widen(), b.widen()));
            }
            return;
        }
        _ => {}
    }
    let mut acc = [T::Acc::default(); BLOCK];
    let mut start = 0;
    while start < dst.len() {
        let end = (start + BLOCK).min(dst.len());
        let acc = &mut acc[..end - start];
        let init = first.map_or(&dst[start..end], |f| &f[start..end]);
        for (a, &x) in acc.iter_mut().zip(init) {
            *a = x.widen();
        }
        for s in rest {
            for (a, &x) in acc.iter_mut().zip(&s[start..end]) {
                *a = B::f(*a, x.widen());
            }
        }
        for (d, &a) in dst[start..end].iter_mut().zip(acc.iter()) {
            *d = finish(a);
        }
        start = end;
    }
}

/// Dispatch on the operator: Mean is a sum divided by `world` in the same pass.
pub(crate) fn combine_op<T: Reducible>(
    op: ReduceOp,
    dst: &mut [T],
    accumulate: bool,
    srcs: &[&[T]],
    finalize: bool,
    world: usize,
) {
    let divide = (finalize && op == ReduceOp::Mean && world > 1).then_some(world);
    // Sums of gradients near zero: subnormals flushed as everywhere else in mirra (which
    // `vectorize` sees to on this thread).
    mirra_device::vectorize(
        #[inline(always)]
        || match op {
            ReduceOp::Sum | ReduceOp::Mean => combine::<T, AddOp>(dst, accumulate, srcs, divide),
            ReduceOp::Product => combine::<T, MulOp>(dst, accumulate, srcs, divide),
            ReduceOp::Max => combine::<T, MaxOp>(dst, accumulate, srcs, divide),
            ReduceOp::Min => combine::<T, MinOp>(dst, accumulate, srcs, divide),
        },
    )
}

/// Runs `$body` with `$T` bound to the Rust type of a runtime [`DType`].
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
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
            mirra_device::DType::I32 => {
                type $T = i32;
                $body
            }
            mirra_device::DType::I64 => {
                type $T = i64;
                $body
            }
            mirra_device::DType::U8 => {
                type $T = u8;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Reducible>(op: ReduceOp, a: &[T], b: &[T], c: &[T], finalize: bool) -> Vec<T> {
        let mut d = a.to_vec();
        combine_op(op, &mut d, true, &[b, c], finalize, 3);
        let mut e = vec![T::default(); a.len()];
        combine_op(op, &mut e, false, &[a, b, c], finalize, 3);
        assert_eq!(d, e, "accumulate and overwrite forms agree");
        d
    }

    #[test]
    fn every_op_on_three_operands() {
        let a = [1.0f32, -2.0, 3.0];
        let b = [4.0f32, 5.0, -6.0];
        let c = [0.5f32, 0.5, 0.5];
        assert_eq!(run(ReduceOp::Sum, &a, &b, &c, true), [5.5, 3.5, -2.5]);
        assert_eq!(
            run(ReduceOp::Mean, &a, &b, &c, true),
            [5.5 / 3.0, 3.5 / 3.0, -2.5 / 3.0]
        );
        assert_eq!(run(ReduceOp::Max, &a, &b, &c, true), [4.0, 5.0, 3.0]);
        assert_eq!(run(ReduceOp::Min, &a, &b, &c, true), [0.5, -2.0, -6.0]);
        assert_eq!(run(ReduceOp::Product, &a, &b, &c, true), [2.0, -5.0, -9.0]);
        // Mean without finalize is the plain sum (the ring divides on its last step only).
        assert_eq!(run(ReduceOp::Mean, &a, &b, &c, false), [5.5, 3.5, -2.5]);
    }

    #[test]
    fn integers_wrap_and_mean_truncates() {
        let a = [i32::MAX, 7, -7];
        let b = [1, 0, 0];
        let c = [0, 0, 0];
        assert_eq!(run(ReduceOp::Sum, &a, &b, &c, true), [i32::MIN, 7, -7]);
        assert_eq!(run(ReduceOp::Mean, &a, &b, &c, true), [i32::MIN / 3, 2, -2]);
        let u = [200u8, 3, 0];
        assert_eq!(run(ReduceOp::Sum, &u, &u, &u, true), [88, 9, 0]);
    }

    #[test]
    fn sixteen_bit_floats_round_once_across_many_operands() {
        // 256 + 1 + 1 in bf16: one pass gives round(258) = 258; pairwise would give
        // round(round(257) + 1) = round(256 + 1) = 256.
        let x = |v: f32| bf16::from_f32(v);
        let a = [x(256.0)];
        let b = [x(1.0)];
        let c = [x(1.0)];
        assert_eq!(run(ReduceOp::Sum, &a, &b, &c, true), [x(258.0)]);
        let h = |v: f32| f16::from_f32(v);
        assert_eq!(
            run(ReduceOp::Mean, &[h(1.0)], &[h(1.0)], &[h(2.0)], true),
            [f16::from_f32(4.0 / 3.0)]
        );
    }

    #[test]
    fn long_buffers_cross_blocks() {
        let n = 3 * BLOCK + 7;
        let a: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let b: Vec<f64> = (0..n).map(|i| 2.0 * i as f64).collect();
        let out = run(ReduceOp::Sum, &a, &b, &b, true);
        assert!(out.iter().enumerate().all(|(i, &v)| v == 5.0 * i as f64));
    }
}
