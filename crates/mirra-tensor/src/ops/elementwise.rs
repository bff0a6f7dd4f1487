//! Element-wise maps: unary, binary with NumPy broadcasting, and scalar affine maps.
//!
//! One strided kernel per arity; the per-op arithmetic is a closure monomorphised into
//! it, so the contiguous inner loops vectorise. 16-bit floats compute in f32.

use mirra_cuda::kernels::{BinaryKernel, UnaryKernel};
use mirra_device::{vectorize, Buffer, Element, FloatElement};
use num_traits::{Float, FloatConst};

use super::cuda;
use super::nan::{max_nan, min_nan};
use crate::dispatch::with_float;
use crate::layout::{for_each_row, Layout};
use crate::{Result, Shape, Tensor, TensorError, MAX_RANK};

/// The error function, for GELU, in the accumulation type.
fn erf<A: Float>(x: A) -> A {
    A::from(libm::erf(x.to_f64().unwrap_or(0.0))).unwrap_or(x)
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident $method:ident => |$x:ident| $e:expr;)*) => {
        /// Element-wise functions of one tensor.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum UnaryOp { $($(#[$doc])* $name),* }

        impl UnaryOp {
            /// The op's name in errors.
            pub fn name(self) -> &'static str {
                match self { $(UnaryOp::$name => stringify!($method)),* }
            }

            /// The op code of the CUDA kernel (one per op: the match is exhaustive).
            fn cuda_kernel(self) -> UnaryKernel {
                match self { $(UnaryOp::$name => UnaryKernel::$name),* }
            }
        }

        fn run_unary<T: FloatElement>(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
            match op {
                $(UnaryOp::$name => map1::<T>(x, #[inline(always)] |$x: T::Acc| $e)),*
            }
        }

        impl Tensor {
            $(
                $(#[$doc])*
                pub fn $method(&self) -> Result<Tensor> {
                    self.unary(UnaryOp::$name)
                }
            )*
        }
    };
}

unary_ops! {
    /// `max(x, 0)`; NaN stays NaN.
    Relu relu => |x| if x < zero() { zero() } else { x };
    /// `1 / (1 + exp(-x))`.
    Sigmoid sigmoid => |x| sigmoid(x);
    /// Hyperbolic tangent.
    Tanh tanh => |x| x.tanh();
    /// Exact GELU, `x * Φ(x)` (the default of Keras and PyTorch).
    Gelu gelu => |x| gelu(x);
    /// `e^x`.
    Exp exp => |x| x.exp();
    /// Natural logarithm.
    Log log => |x| x.ln();
    /// Square root.
    Sqrt sqrt => |x| x.sqrt();
    /// `-x`.
    Neg neg => |x| -x;
    /// `|x|`.
    Abs abs => |x| x.abs();
    /// `x * x`.
    Square square => |x| x * x;
    /// `1 / x`.
    Recip recip => |x| x.recip();
    /// -1, 0 or 1 by the sign of `x` (0 for ±0, NaN for NaN).
    Sign sign => |x| if x > zero() { one() } else if x < zero() { -one::<T::Acc>() } else if x.is_nan() { x } else { zero() };
}

#[inline(always)]
fn zero<A: Float>() -> A {
    A::zero()
}

#[inline(always)]
fn one<A: Float>() -> A {
    A::one()
}

fn gelu<A: Float + FloatConst>(x: A) -> A {
    A::from(0.5).unwrap() * x * (A::one() + erf(x * A::FRAC_1_SQRT_2()))
}

fn sigmoid<A: Float>(x: A) -> A {
    // Split by sign so that exp never overflows.
    if x >= A::zero() {
        A::one() / (A::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (A::one() + e)
    }
}

/// GELU's derivative: Φ(x) + x φ(x).
fn gelu_grad<A: Float + FloatConst>(x: A) -> A {
    let half = A::from(0.5).unwrap();
    let cdf = half * (A::one() + erf(x * A::FRAC_1_SQRT_2()));
    let pdf = (-half * x * x).exp() * A::FRAC_2_SQRT_PI() * A::FRAC_1_SQRT_2() * half;
    cdf + x * pdf
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident $method:ident => |$a:ident, $b:ident| $e:expr;)*) => {
        /// Element-wise functions of two tensors, broadcast against each other.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum BinaryOp { $($(#[$doc])* $name),* }

        impl BinaryOp {
            /// The op's name in errors.
            pub fn name(self) -> &'static str {
                match self { $(BinaryOp::$name => stringify!($method)),* }
            }

            /// The op code of the CUDA kernel (one per op: the match is exhaustive).
            fn cuda_kernel(self) -> BinaryKernel {
                match self { $(BinaryOp::$name => BinaryKernel::$name),* }
            }
        }

        fn run_binary<T: FloatElement>(
            op: BinaryOp,
            a: &Tensor,
            b: &Tensor,
            shape: &Shape,
        ) -> Result<Tensor> {
            match op {
                $(BinaryOp::$name => map2::<T>(a, b, shape, #[inline(always)] |$a: T::Acc, $b: T::Acc| $e)),*
            }
        }

        impl Tensor {
            $(
                $(#[$doc])*
                pub fn $method(&self, rhs: &Tensor) -> Result<Tensor> {
                    self.binary(BinaryOp::$name, rhs)
                }
            )*
        }
    };
}

binary_ops! {
    /// `a + b`.
    Add add => |a, b| a + b;
    /// `a - b`.
    Sub sub => |a, b| a - b;
    /// `a * b`.
    Mul mul => |a, b| a * b;
    /// `a / b`.
    Div div => |a, b| a / b;
    /// `max(a, b)`, NaN when either is NaN.
    Maximum maximum => |a, b| max_nan(a, b);
    /// `min(a, b)`, NaN when either is NaN.
    Minimum minimum => |a, b| min_nan(a, b);
    /// 1 where `a == b`, else 0 (the mask of a max's winners).
    EqMask eq_mask => |a, b| if a == b { one() } else { zero() };
    /// ReLU's backward: 0 where `x <= 0`, else `grad` (`a` = grad, `b` = x), so a NaN
    /// input passes the gradient on, as PyTorch's `threshold_backward`.
    ReluBackward relu_backward => |g, x| if x <= zero() { zero() } else { g };
    /// Sigmoid's backward from its output: `g * y * (1 - y)` (`a` = grad, `b` = y).
    SigmoidBackward sigmoid_backward => |g, y| g * y * (one::<T::Acc>() - y);
    /// Tanh's backward from its output: `g * (1 - y²)` (`a` = grad, `b` = y).
    TanhBackward tanh_backward => |g, y| g * (one::<T::Acc>() - y * y);
    /// GELU's backward from its input (`a` = grad, `b` = x).
    GeluBackward gelu_backward => |g, x| g * gelu_grad(x);
}

impl Tensor {
    /// Apply a unary op.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        if !self.device().is_cpu() {
            return cuda::unary(op.name(), op.cuda_kernel(), self);
        }
        with_float!(op.name(), self.dtype(), T => run_unary::<T>(op, self))
    }

    /// Apply a binary op, broadcasting the operands against each other.
    pub fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        if self.dtype() != rhs.dtype() {
            return Err(TensorError::DTypeMismatch {
                op: op.name(),
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            });
        }
        let shape = Shape::broadcast(op.name(), self.shape(), rhs.shape())?;
        if !self.device().is_cpu() || !rhs.device().is_cpu() {
            return cuda::binary(op.name(), op.cuda_kernel(), self, rhs, &shape);
        }
        // Two views with the same permutation of whole buffers (transposed gradients, say):
        // the op over the buffers in storage order, the view kept. An element-wise op's
        // value at a position does not depend on the order the positions are visited.
        let len = self.buffer().len();
        if self.layout() == rhs.layout()
            && rhs.buffer().len() == len
            && self.layout().is_dense_permutation(len)
        {
            let whole = Layout::contiguous(Shape::new(&[len])?);
            let flat = (self.with_layout(whole), rhs.with_layout(whole));
            let out = flat.0.binary(op, &flat.1)?;
            return Ok(out.with_layout(*self.layout()));
        }
        with_float!(op.name(), self.dtype(), T => run_binary::<T>(op, self, rhs, &shape))
    }

    /// `self + rhs`, written over this tensor's buffer when the tensor owns it alone and
    /// `rhs` has the same shape, dtype and layout over a whole buffer of its own length
    /// (contiguous, or one permutation of both: a transposed gradient and another); a
    /// new tensor, as [`add`](Tensor::add) gives, otherwise. The same bits either way:
    /// what gradient accumulation and deterministic mode's tree of sums use, to add
    /// without a fresh buffer each time.
    pub fn accumulate(mut self, rhs: &Tensor) -> Result<Tensor> {
        // One layout over two buffers of one length, which it covers.
        let len = self.buffer().len();
        let fits = self.dtype() == rhs.dtype()
            && self.dtype().is_float()
            && self.layout() == rhs.layout()
            && rhs.buffer().len() == len
            && self.layout().covers(len)
            && self.device().is_cpu()
            && rhs.device().is_cpu();
        if !fits {
            return self.add(rhs);
        }
        let dtype = self.dtype();
        let Some(buffer) = self.unshared_buffer_mut() else {
            return self.add(rhs);
        };
        with_float!("accumulate", dtype, T => {
            let (dst, src) = (buffer.as_mut_slice::<T>()?, rhs.buffer().as_slice::<T>()?);
            vectorize(
                #[inline(always)]
                || {
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = T::from_acc(d.to_acc() + s.to_acc());
                    }
                },
            );
            Ok(())
        })?;
        Ok(self)
    }

    /// `x * mul + add`, element-wise.
    pub fn affine(&self, mul: f64, add: f64) -> Result<Tensor> {
        if !self.device().is_cpu() {
            return cuda::affine(self, mul, add);
        }
        with_float!("affine", self.dtype(), T => {
            let m: <T as FloatElement>::Acc = Element::from_f64(mul);
            let a: <T as FloatElement>::Acc = Element::from_f64(add);
            map1::<T>(self, |x| x * m + a)
        })
    }

    /// `x * factor`, element-wise.
    pub fn scale(&self, factor: f64) -> Result<Tensor> {
        self.affine(factor, 0.0)
    }

    /// `x ^ exponent`, element-wise.
    pub fn powf(&self, exponent: f64) -> Result<Tensor> {
        with_float!("powf", self.dtype(), T => {
            let e: <T as FloatElement>::Acc = Element::from_f64(exponent);
            map1::<T>(self, |x| x.powf(e))
        })
    }
}

/// Stride of the last dimension (0 for a scalar).
fn inner_stride(strides: &[usize; MAX_RANK], shape: &Shape) -> usize {
    shape.rank().checked_sub(1).map_or(0, |l| strides[l])
}

fn map1<T: FloatElement>(x: &Tensor, f: impl Fn(T::Acc) -> T::Acc) -> Result<Tensor> {
    let shape = *x.shape();
    let mut out = Buffer::alloc(T::DTYPE, shape.elem_count(), x.device())?;
    let dst = out.as_mut_slice::<T>()?;
    vectorize(
        #[inline(always)]
        || -> Result<()> {
            if x.is_contiguous() {
                for (d, &s) in dst.iter_mut().zip(x.as_slice::<T>()?) {
                    *d = T::from_acc(f(s.to_acc()));
                }
            } else {
                let src = x.buffer().as_slice::<T>()?;
                let strides = x.layout().broadcast_strides(&shape);
                let (inner, step) = (*shape.last().unwrap_or(&1), inner_stride(&strides, &shape));
                let mut o = 0;
                for_each_row(
                    &shape,
                    [&strides],
                    [x.layout().offset()],
                    #[inline(always)]
                    |[s]| {
                        for (j, d) in dst[o..o + inner].iter_mut().enumerate() {
                            *d = T::from_acc(f(src[s + j * step].to_acc()));
                        }
                        o += inner;
                    },
                );
            }
            Ok(())
        },
    )?;
    Tensor::from_buffer(out, &shape)
}

fn map2<T: FloatElement>(
    a: &Tensor,
    b: &Tensor,
    shape: &Shape,
    f: impl Fn(T::Acc, T::Acc) -> T::Acc,
) -> Result<Tensor> {
    let mut out = Buffer::alloc(T::DTYPE, shape.elem_count(), a.device())?;
    let dst = out.as_mut_slice::<T>()?;
    vectorize(
        #[inline(always)]
        || -> Result<()> {
            if a.shape() == shape && b.shape() == shape && a.is_contiguous() && b.is_contiguous() {
                let (xa, xb) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
                for ((d, &x), &y) in dst.iter_mut().zip(xa).zip(xb) {
                    *d = T::from_acc(f(x.to_acc(), y.to_acc()));
                }
                return Ok(());
            }
            let (xa, xb) = (a.buffer().as_slice::<T>()?, b.buffer().as_slice::<T>()?);
            let (sa, sb) = (
                a.layout().broadcast_strides(shape),
                b.layout().broadcast_strides(shape),
            );
            let (ia, ib) = (inner_stride(&sa, shape), inner_stride(&sb, shape));
            let inner = *shape.last().unwrap_or(&1);
            let mut o = 0;
            let offsets = [a.layout().offset(), b.layout().offset()];
            for_each_row(
                shape,
                [&sa, &sb],
                offsets,
                #[inline(always)]
                |[pa, pb]| {
                    let row = &mut dst[o..o + inner];
                    match (ia, ib) {
                        (1, 1) => {
                            let (ra, rb) = (&xa[pa..pa + inner], &xb[pb..pb + inner]);
                            for ((d, &x), &y) in row.iter_mut().zip(ra).zip(rb) {
                                *d = T::from_acc(f(x.to_acc(), y.to_acc()));
                            }
                        }
                        (1, 0) => {
                            let y = xb[pb].to_acc();
                            for (d, &x) in row.iter_mut().zip(&xa[pa..pa + inner]) {
                                *d = T::from_acc(f(x.to_acc(), y));
                            }
                        }
                        _ => {
                            for (j, d) in row.iter_mut().enumerate() {
                                *d = T::from_acc(f(
                                    xa[pa + j * ia].to_acc(),
                                    xb[pb + j * ib].to_acc(),
                                ));
                            }
                        }
                    }
                    o += inner;
                },
            );
            Ok(())
        },
    )?;
    Tensor::from_buffer(out, shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    fn t(v: &[f32], s: &[usize]) -> Tensor {
        Tensor::from_slice(v, s, Device::Cpu).unwrap()
    }

    /// `accumulate` gives `add`'s values and layout whether it writes in place (a tensor
    /// that owns its buffer, contiguous or permuted like the other) or not (a shared
    /// buffer, which must stay as it was; a broadcast; another dtype).
    #[test]
    fn accumulate_is_add_in_place_or_not() {
        let a: Vec<f32> = (0..24).map(|v| v as f32 * 0.37 - 4.0).collect();
        let b: Vec<f32> = (0..24).map(|v| (v * 5 % 7) as f32 * 1.3 - 2.0).collect();
        let (a, b) = (t(&a, &[2, 3, 4]), t(&b, &[2, 3, 4]));
        let fresh = |x: &Tensor| x.contiguous().unwrap().copy().unwrap();
        for perm in [None, Some([2, 0, 1])] {
            let view = |x: Tensor| match perm {
                Some(p) => x.permute(&p).unwrap(),
                None => x,
            };
            let (x, y) = (view(fresh(&a)), view(fresh(&b)));
            let want = x.add(&y).unwrap();
            let at = x.buffer().as_slice::<f32>().unwrap().as_ptr();
            let got = x.accumulate(&y).unwrap();
            assert_eq!(got.layout(), want.layout(), "{perm:?}");
            assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            let same = got.buffer().as_slice::<f32>().unwrap().as_ptr();
            assert_eq!(same, at, "{perm:?}: written in place");
        }
        // Shared: the other owner keeps its values.
        let x = fresh(&a);
        let keep = x.clone();
        let got = x.accumulate(&b).unwrap();
        assert_eq!(
            got.to_vec::<f32>().unwrap(),
            a.add(&b).unwrap().to_vec::<f32>().unwrap()
        );
        assert_eq!(keep.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
        // A broadcast and mixed layouts: the sum all the same.
        let row = t(&[1.0, 2.0, 3.0, 4.0], &[4]);
        let got = fresh(&a).accumulate(&row).unwrap();
        assert_eq!(
            got.to_vec::<f32>().unwrap(),
            a.add(&row).unwrap().to_vec::<f32>().unwrap()
        );
        let tb = fresh(&b).permute(&[0, 2, 1]).unwrap().contiguous().unwrap();
        let ta = fresh(&a).permute(&[0, 2, 1]).unwrap();
        let got = ta.clone().accumulate(&tb).unwrap();
        assert_eq!(
            got.to_vec::<f32>().unwrap(),
            ta.add(&tb).unwrap().to_vec::<f32>().unwrap()
        );
    }

    /// Two views with the same permutation of whole buffers are combined over their
    /// buffers in storage order and keep the view: the values of the op on contiguous
    /// copies, at every position; views that differ, or skip part of a buffer, take the
    /// strided path.
    #[test]
    fn permuted_views_combine_over_their_buffers_with_the_same_values() {
        let a: Vec<f32> = (0..24).map(|v| v as f32 * 1.37 - 9.0).collect();
        let b: Vec<f32> = (0..24).map(|v| (v * 7 % 11) as f32 * 0.3 + 1.0).collect();
        let (a, b) = (t(&a, &[2, 3, 4]), t(&b, &[2, 3, 4]));
        for perm in [[2, 0, 1], [1, 2, 0], [0, 2, 1]] {
            let (pa, pb) = (a.permute(&perm).unwrap(), b.permute(&perm).unwrap());
            let want = pa
                .contiguous()
                .unwrap()
                .div(&pb.contiguous().unwrap())
                .unwrap();
            let got = pa.div(&pb).unwrap();
            assert_eq!(got.layout(), pa.layout(), "{perm:?}: the view is kept");
            assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            // A contiguous right-hand side (another layout): the strided path, same values.
            let mixed = pa.div(&pb.contiguous().unwrap()).unwrap();
            assert_eq!(
                mixed.to_vec::<f32>().unwrap(),
                want.to_vec::<f32>().unwrap()
            );
        }
        // A view inside a buffer (a narrowed transpose) is not a whole buffer.
        let part = a
            .reshape(&[6, 4])
            .unwrap()
            .narrow(0, 1, 4)
            .unwrap()
            .t()
            .unwrap();
        let sum = part.add(&part).unwrap();
        let want = part.contiguous().unwrap().scale(2.0).unwrap();
        assert_eq!(sum.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    }

    #[test]
    fn bias_add_broadcasts_over_rows() {
        let x = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
        let b = t(&[10., 20., 30.], &[3]);
        assert_eq!(
            x.add(&b).unwrap().to_vec::<f32>().unwrap(),
            [11., 22., 33., 14., 25., 36.]
        );
        let col = t(&[1., 2.], &[2, 1]);
        assert_eq!(
            x.sub(&col).unwrap().to_vec::<f32>().unwrap(),
            [0., 1., 2., 2., 3., 4.]
        );
    }

    #[test]
    fn mismatched_dtypes_name_the_op() {
        let a = t(&[1.], &[1]);
        let b = Tensor::from_slice(&[1.0f64], &[1], Device::Cpu).unwrap();
        assert_eq!(
            a.mul(&b).unwrap_err().to_string(),
            "mul: dtypes f32 and f64 differ"
        );
        let i = Tensor::from_slice(&[1i64], &[1], Device::Cpu).unwrap();
        assert_eq!(
            i.exp().unwrap_err().to_string(),
            "exp: dtype i64 is not supported"
        );
    }

    #[test]
    fn activations_match_their_definitions() {
        let x = t(&[-2., 0., 3.], &[3]);
        assert_eq!(x.relu().unwrap().to_vec::<f32>().unwrap(), [0., 0., 3.]);
        let s = x.sigmoid().unwrap().to_vec::<f32>().unwrap();
        assert!((s[0] - 1. / (1. + 2f32.exp())).abs() < 1e-7 && s[1] == 0.5);
        let g = x.gelu().unwrap().to_vec::<f32>().unwrap();
        assert!((g[2] - 2.995_950_4).abs() < 1e-5, "{g:?}");
    }
}
