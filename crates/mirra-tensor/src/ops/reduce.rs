//! Reductions over any set of axes (sum, mean, max), `sum_to` for broadcasting's
//! backward, and argmax. One strided kernel serves them all; accumulation runs in the
//! dtype's accumulation type (f32 for 16-bit floats).

use mirra_device::{vectorize, Buffer, Element, FloatElement};
use num_traits::Float;

use mirra_cuda::kernels::ReduceKernel;

use super::cuda;
use super::nan::max_nan;
use crate::dispatch::with_float;
use crate::layout::for_each_row;
use crate::threads::split_rows_by_work;
use crate::{Result, Shape, Tensor, TensorError, MAX_RANK};

#[derive(Clone, Copy)]
enum Reduce {
    Sum,
    Max,
}

impl Tensor {
    /// Sum over `axes` (negative counts from the end; empty means all axes).
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce("sum", Reduce::Sum, axes, keepdim)
    }

    /// Sum of all elements as a rank-0 tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// Mean over `axes` (empty means all axes).
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let mask = self.axis_mask("mean", axes)?;
        let count: usize = (0..self.rank())
            .filter(|&d| mask[d])
            .map(|d| self.dims()[d])
            .product();
        self.sum(axes, keepdim)?.scale(1.0 / count.max(1) as f64)
    }

    /// Maximum over `axes` (empty means all axes), NaN where a reduced element is NaN;
    /// an error on an empty reduction.
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        if self.elem_count() == 0 {
            return Err(TensorError::Invalid {
                op: "max",
                msg: "maximum of no elements".into(),
                shape: *self.shape(),
            });
        }
        self.reduce("max", Reduce::Max, axes, keepdim)
    }

    /// Sum over the dimensions that a broadcast from `dims` to this shape expanded, giving
    /// a tensor of shape `dims` (the backward of broadcasting).
    pub fn sum_to(&self, dims: &[usize]) -> Result<Tensor> {
        let target = Shape::new(dims)?;
        if self.shape() == &target {
            return Ok(self.clone());
        }
        if Shape::broadcast("sum_to", &target, self.shape())? != *self.shape() {
            return Err(TensorError::ShapeMismatch {
                op: "sum_to",
                lhs: *self.shape(),
                rhs: target,
            });
        }
        let shift = self.rank() - target.rank();
        let axes: Vec<isize> = (0..self.rank())
            .filter(|&d| d < shift || (target[d - shift] == 1 && self.dims()[d] != 1))
            .map(|d| d as isize)
            .collect();
        if axes.is_empty() {
            return self.reshape(dims);
        }
        self.sum(&axes, true)?.reshape(dims)
    }

    /// Index of the largest element along `axis` (the first one on ties; the first NaN,
    /// which counts as the largest, as in PyTorch), as i64.
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let ax = self.shape().axis("argmax", axis)?;
        let n = self.dims()[ax];
        if n == 0 {
            return Err(TensorError::Invalid {
                op: "argmax",
                msg: "argmax over an empty axis".into(),
                shape: *self.shape(),
            });
        }
        if !self.device().is_cpu() {
            let t = cuda::argmax(self, ax)?;
            if keepdim {
                return Ok(t);
            }
            let mut dims = self.dims().to_vec();
            dims.remove(ax);
            return t.reshape(&dims);
        }
        let last = self.rank() as isize - 1;
        let moved = self.transpose(ax as isize, last)?.contiguous()?;
        let rows = self.elem_count() / n;
        let mut out = Buffer::alloc(crate::DType::I64, rows, self.device())?;
        with_float!("argmax", self.dtype(), T => {
            let src = moved.as_slice::<T>()?;
            // Rows across the kernel threads: each row's winner is its own.
            split_rows_by_work(out.as_mut_slice::<i64>()?, 1, src.len(), &|first, part| {
                for (row, winner) in src[first * n..].chunks_exact(n).zip(part) {
                    let mut best = 0;
                    for (j, x) in row.iter().enumerate() {
                        let (x, b) = (x.to_acc(), row[best].to_acc());
                        if b.is_nan() {
                            break;
                        }
                        if x > b || x.is_nan() {
                            best = j;
                        }
                    }
                    *winner = best as i64;
                }
            });
            Ok::<(), TensorError>(())
        })?;
        let mut dims = self.dims().to_vec();
        dims[ax] = 1;
        let t = Tensor::from_buffer(out, &moved.dims()[..self.rank() - 1])?;
        let t = t
            .unsqueeze(self.rank() - 1)?
            .transpose(ax as isize, last)?
            .contiguous()?;
        if keepdim {
            t.reshape(&dims)
        } else {
            dims.remove(ax);
            t.reshape(&dims)
        }
    }

    fn axis_mask(&self, op: &'static str, axes: &[isize]) -> Result<[bool; MAX_RANK]> {
        let mut mask = [axes.is_empty(); MAX_RANK];
        if !axes.is_empty() {
            for &a in axes {
                mask[self.shape().axis(op, a)?] = true;
            }
        }
        Ok(mask)
    }

    fn reduce(&self, op: &'static str, kind: Reduce, axes: &[isize], keep: bool) -> Result<Tensor> {
        let mask = self.axis_mask(op, axes)?;
        let out = if self.device().is_cpu() {
            self.reduce_on_cpu(op, kind, &mask)?
        } else {
            let code = match kind {
                Reduce::Sum => ReduceKernel::Sum,
                Reduce::Max => ReduceKernel::Max,
            };
            cuda::reduce(op, code, self, &mask)?
        };
        if keep {
            return Ok(out);
        }
        let dims: Vec<usize> = (0..self.rank())
            .filter(|&d| !mask[d])
            .map(|d| self.dims()[d])
            .collect();
        out.reshape(&dims)
    }

    fn reduce_on_cpu(
        &self,
        op: &'static str,
        kind: Reduce,
        mask: &[bool; MAX_RANK],
    ) -> Result<Tensor> {
        let mask = *mask;
        let rank = self.rank();
        // Every axis but the last: a bias's gradient, `[n, .., f]` summed to `[f]`.
        let columns = rank >= 2 && (0..rank).all(|d| mask[d] == (d + 1 < rank));
        with_float!(op, self.dtype(), T => match kind {
            Reduce::Sum if columns && self.is_contiguous() => column_sums::<T>(self),
            Reduce::Sum => {
                reduce_kernel::<T>(self, &mask, <<T as FloatElement>::Acc as num_traits::Zero>::zero(), |a, b| a + b)
            }
            Reduce::Max => reduce_kernel::<T>(
                self,
                &mask,
                <<T as FloatElement>::Acc as Float>::neg_infinity(),
                max_nan,
            ),
        })
    }
}

/// Rows summed per block of the column sums: a block's partial sums are one pass over
/// its rows, in cache.
const COLUMN_BLOCK_ROWS: usize = 256;

/// The sums of the columns of contiguous `x` seen as `[rows, f]` (`f` its last
/// dimension), keeping every other axis as a size-1 dimension: what [`reduce_kernel`]
/// computes for that mask, split across the kernel threads. Rows are summed in fixed
/// blocks of [`COLUMN_BLOCK_ROWS`] in the accumulation type, then the blocks' sums in
/// order, so the bits do not depend on the thread count.
fn column_sums<T: FloatElement>(x: &Tensor) -> Result<Tensor>
where
    T::Acc: std::ops::Add<Output = T::Acc> + num_traits::Zero,
{
    let f = x.dims()[x.rank() - 1];
    let rows = x.elem_count() / f.max(1);
    let src = &x.buffer().as_slice::<T>()?[x.layout().offset()..][..rows * f];
    let zero = <T::Acc as num_traits::Zero>::zero();
    let blocks = rows.div_ceil(COLUMN_BLOCK_ROWS);
    let mut partial = vec![zero; blocks * f];
    let items: Vec<(&[T], &mut [T::Acc])> = src
        .chunks(COLUMN_BLOCK_ROWS * f.max(1))
        .zip(partial.chunks_mut(f.max(1)))
        .collect();
    crate::threads::for_each_split(items, rows * f, &|(block, sums): (&[T], &mut [T::Acc])| {
        vectorize(
            #[inline(always)]
            || {
                for row in block.chunks_exact(f) {
                    for (s, v) in sums.iter_mut().zip(row) {
                        *s = *s + v.to_acc();
                    }
                }
            },
        );
    });
    let mut totals = vec![zero; f];
    for sums in partial.chunks_exact(f.max(1)) {
        for (t, &s) in totals.iter_mut().zip(sums) {
            *t = *t + s;
        }
    }
    let mut dims = vec![1; x.rank()];
    dims[x.rank() - 1] = f;
    let out: Vec<T> = totals.into_iter().map(T::from_acc).collect();
    Tensor::from_slice(&out, &dims, x.device())
}

/// Reduces the masked axes with `f` from `init`, keeping them as size-1 dimensions. `f` is
/// a type parameter, not a function pointer, so that the row loops vectorise.
fn reduce_kernel<T: FloatElement>(
    x: &Tensor,
    mask: &[bool; MAX_RANK],
    init: T::Acc,
    f: impl Fn(T::Acc, T::Acc) -> T::Acc,
) -> Result<Tensor> {
    let shape = *x.shape();
    let mut out_dims = [0; MAX_RANK];
    for d in 0..shape.rank() {
        out_dims[d] = if mask[d] { 1 } else { shape[d] };
    }
    let out_shape = Shape::new(&out_dims[..shape.rank()])?;
    // Output strides in the input's frame: 0 along reduced axes.
    let mut out_strides = out_shape.contiguous_strides();
    for d in 0..shape.rank() {
        if mask[d] {
            out_strides[d] = 0;
        }
    }
    let mut acc = Buffer::alloc(
        <T::Acc as Element>::DTYPE,
        out_shape.elem_count(),
        x.device(),
    )?;
    let dst = acc.as_mut_slice::<T::Acc>()?;
    dst.fill(init);
    let src = x.buffer().as_slice::<T>()?;
    let in_strides = x.layout().broadcast_strides(&shape);
    let last = shape.rank().checked_sub(1);
    let inner = last.map_or(1, |l| shape[l]);
    let (is, os) = last.map_or((0, 0), |l| (in_strides[l], out_strides[l]));
    vectorize(
        #[inline(always)]
        || {
            for_each_row(
                &shape,
                [&in_strides, &out_strides],
                [x.layout().offset(), 0],
                #[inline(always)]
                |[i, o]| {
                    if os == 0 {
                        let mut a = dst[o];
                        for j in 0..inner {
                            a = f(a, src[i + j * is].to_acc());
                        }
                        dst[o] = a;
                    } else {
                        for (j, d) in dst[o..o + inner].iter_mut().enumerate() {
                            *d = f(*d, src[i + j * is].to_acc());
                        }
                    }
                },
            );
        },
    );
    if T::DTYPE == <T::Acc as Element>::DTYPE {
        return Tensor::from_buffer(acc, &out_shape);
    }
    let mut out = Buffer::alloc(T::DTYPE, out_shape.elem_count(), x.device())?;
    for (d, &a) in out
        .as_mut_slice::<T>()?
        .iter_mut()
        .zip(acc.as_slice::<T::Acc>()?)
    {
        *d = T::from_acc(a);
    }
    Tensor::from_buffer(out, &out_shape)
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    fn iota(dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|x| x as f32).collect();
        Tensor::from_slice(&v, dims, Device::Cpu).unwrap()
    }

    /// Summing every axis but the last (a bias's gradient) takes the blocked, threaded
    /// path: the column sums of the rows, in f32 and in bf16 (f32 sums, one rounding),
    /// with the same bits for any thread count; a transposed view takes the general one.
    #[test]
    fn column_sums_match_the_definition_for_any_thread_count() {
        // 700 x 3 rows of 5: nine blocks, the last one partial.
        let dims = [700, 3, 5];
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|i| ((i * 7919) % 1001) as f64 / 500.0 - 1.0)
            .collect();
        for dtype in [DType::F32, DType::BF16] {
            let x = Tensor::from_slice(&v, &dims, Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let held = x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            let want: Vec<f64> = (0..5)
                .map(|j| held.iter().skip(j).step_by(5).sum())
                .collect();
            let sums = |threads: usize| {
                let x = x.clone();
                std::thread::spawn(move || {
                    crate::set_num_threads(threads);
                    let s = x.sum_to(&[5]).unwrap().to_dtype(DType::F32).unwrap();
                    s.to_vec::<f32>().unwrap()
                })
                .join()
                .unwrap()
            };
            let one = sums(1);
            assert_eq!(one, sums(3), "{dtype:?}");
            // f32 sums of 2,100 terms of at most 1 (error below 2,100 · 2^-24 · 2,100),
            // then one rounding to the dtype. A block left out is off by dozens.
            let unit = if dtype == DType::BF16 {
                2f64.powi(-8)
            } else {
                0.0
            };
            for (got, want) in one.iter().zip(&want) {
                let tolerance = 2100.0 * 2100.0 * 2f64.powi(-24) + unit * want.abs();
                assert!(
                    (f64::from(*got) - want).abs() <= tolerance,
                    "{dtype:?}: {got} against {want}"
                );
            }
            let general = x.transpose(0, 2).unwrap().sum(&[1, 2], false).unwrap();
            let general = general
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for (a, b) in general.iter().zip(&one) {
                assert!(
                    (a - b).abs() <= 1e-3 + unit as f32 * b.abs(),
                    "{dtype:?}: {a} against {b}"
                );
            }
        }
    }

    #[test]
    fn sums_over_each_axis_and_all() {
        let x = iota(&[2, 3]);
        assert_eq!(
            x.sum(&[0], false).unwrap().to_vec::<f32>().unwrap(),
            [3., 5., 7.]
        );
        assert_eq!(x.sum(&[-1], true).unwrap().dims(), &[2, 1]);
        assert_eq!(
            x.sum(&[1], false).unwrap().to_vec::<f32>().unwrap(),
            [3., 12.]
        );
        assert_eq!(x.sum_all().unwrap().to_scalar::<f32>().unwrap(), 15.);
        assert_eq!(x.mean(&[], false).unwrap().to_scalar::<f32>().unwrap(), 2.5);
        assert_eq!(
            x.t()
                .unwrap()
                .max(&[1], false)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            [3., 4., 5.]
        );
    }

    #[test]
    fn half_precision_sums_accumulate_in_f32() {
        let x = Tensor::ones(&[4096], DType::F16, Device::Cpu).unwrap();
        // Summed in f16, this would stall at 2048.
        assert_eq!(
            x.sum_all()
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            4096.
        );
    }

    #[test]
    fn sum_to_undoes_broadcasting() {
        let g = Tensor::ones(&[4, 2, 3], DType::F32, Device::Cpu).unwrap();
        let s = g.sum_to(&[2, 1]).unwrap();
        assert_eq!(s.dims(), &[2, 1]);
        assert_eq!(s.to_vec::<f32>().unwrap(), [12., 12.]);
        assert_eq!(
            g.sum_to(&[3]).unwrap().to_vec::<f32>().unwrap(),
            [8., 8., 8.]
        );
    }

    #[test]
    fn argmax_along_rows_and_columns() {
        let x = Tensor::from_slice(&[1f32, 5., 2., 7., 0., 7.], &[2, 3], Device::Cpu).unwrap();
        assert_eq!(x.argmax(1, false).unwrap().to_vec::<i64>().unwrap(), [1, 0]);
        assert_eq!(
            x.argmax(0, false).unwrap().to_vec::<i64>().unwrap(),
            [1, 0, 1]
        );
    }

    /// Rows enough to be split across the kernel threads: every row's first largest
    /// element on one, two and three threads (ties, so that a later equal one must lose).
    #[test]
    fn argmax_of_many_rows_on_any_thread_count() {
        let (rows, n) = (120_000, 11);
        let x: Vec<f32> = (0..rows * n).map(|i| ((i * 7919) % 13) as f32).collect();
        let want: Vec<i64> = x
            .chunks_exact(n)
            .map(|row| {
                let max = row.iter().cloned().fold(f32::MIN, f32::max);
                row.iter().position(|&v| v == max).unwrap() as i64
            })
            .collect();
        let t = Tensor::from_slice(&x, &[rows, n], Device::Cpu).unwrap();
        for threads in [1, 2, 3] {
            let t = t.clone();
            let got = std::thread::spawn(move || {
                crate::set_num_threads(threads);
                t.argmax(1, false).unwrap().to_vec::<i64>().unwrap()
            })
            .join()
            .unwrap();
            assert!(got == want, "{threads} threads");
        }
    }
}
