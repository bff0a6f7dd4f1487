//! Numerically stable softmax and log-softmax along any axis, and their backward maps.
//! The max is subtracted before exponentiating, so no input overflows; a NaN input makes
//! its whole slice NaN, as in PyTorch.

use mirra_device::{Buffer, FloatElement};
use num_traits::Float;

use super::cuda;
use super::nan::max_nan;
use crate::dispatch::with_float;
use crate::threads::split_rows_by_work;
use crate::{Result, Tensor, TensorError};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Softmax,
    LogSoftmax,
}

impl Tensor {
    /// `exp(x - max) / sum(exp(x - max))` along `axis`.
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        self.softmax_like("softmax", Kind::Softmax, axis)
    }

    /// `x - max - log(sum(exp(x - max)))` along `axis`.
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.softmax_like("log_softmax", Kind::LogSoftmax, axis)
    }

    /// The gradient of softmax's input from its output `y = self` and the gradient of the
    /// output `grad`: `y * (grad - sum(grad * y))` along `axis`.
    pub fn softmax_backward(&self, grad: &Tensor, axis: isize) -> Result<Tensor> {
        if !self.device().is_cpu() {
            let ax = self.shape().axis("softmax_backward", axis)?;
            self.check_same_shape("softmax_backward", grad)?;
            return cuda::softmax_backward(self, grad, ax, false);
        }
        let s = grad.mul(self)?.sum(&[axis], true)?;
        self.mul(&grad.sub(&s)?)
    }

    /// The gradient of log-softmax's input from its output `y = self` and the gradient of
    /// the output `grad`: `grad - exp(y) * sum(grad)` along `axis`.
    pub fn log_softmax_backward(&self, grad: &Tensor, axis: isize) -> Result<Tensor> {
        if !self.device().is_cpu() {
            let ax = self.shape().axis("log_softmax_backward", axis)?;
            self.check_same_shape("log_softmax_backward", grad)?;
            return cuda::softmax_backward(self, grad, ax, true);
        }
        let s = grad.sum(&[axis], true)?;
        grad.sub(&self.exp()?.mul(&s)?)
    }

    /// An error unless `other` has this tensor's shape (the fused backward kernels do not
    /// broadcast).
    fn check_same_shape(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.shape() == other.shape() {
            return Ok(());
        }
        Err(TensorError::ShapeMismatch {
            op,
            lhs: *self.shape(),
            rhs: *other.shape(),
        })
    }

    fn softmax_like(&self, op: &'static str, kind: Kind, axis: isize) -> Result<Tensor> {
        let ax = self.shape().axis(op, axis)?;
        let x = self.contiguous()?;
        let n = self.dims()[ax];
        let inner: usize = self.dims()[ax + 1..].iter().product();
        let outer: usize = self.dims()[..ax].iter().product();
        if !self.device().is_cpu() {
            return cuda::softmax(&x, outer, n, inner, matches!(kind, Kind::LogSoftmax));
        }
        let mut out = Buffer::alloc(self.dtype(), self.elem_count(), self.device())?;
        with_float!(op, self.dtype(), T => {
            kernel::<T>(x.as_slice::<T>()?, out.as_mut_slice::<T>()?, outer, n, inner, kind);
            Ok::<(), TensorError>(())
        })?;
        Tensor::from_buffer(out, self.dims())
    }
}

/// What one exponential costs, in elements moved: how much work a softmax is when
/// deciding whether to wake the kernel threads.
const EXP_WORK: usize = 8;

/// Softmax over the middle index of an `[outer, n, inner]` row-major block, the `outer`
/// blocks split across the kernel threads (each slice's result is the same wherever it
/// runs). Each exponential is taken once: a slice's are kept (in the accumulation type)
/// until their sum is known.
fn kernel<T: FloatElement>(
    src: &[T],
    dst: &mut [T],
    outer: usize,
    n: usize,
    inner: usize,
    kind: Kind,
) {
    let block = n * inner;
    if outer == 0 || block == 0 {
        return;
    }
    split_rows_by_work(dst, block, dst.len() * EXP_WORK, &|first, part| {
        let mut exps: Vec<T::Acc> = Vec::with_capacity(if kind == Kind::Softmax { n } else { 0 });
        for (o, dst) in part.chunks_exact_mut(block).enumerate() {
            let src = &src[(first + o) * block..][..block];
            for i in 0..inner {
                let at = |j: usize| j * inner + i;
                let mut max = T::Acc::neg_infinity();
                for j in 0..n {
                    max = max_nan(max, src[at(j)].to_acc());
                }
                let mut sum = <T::Acc as num_traits::Zero>::zero();
                exps.clear();
                for j in 0..n {
                    let e = (src[at(j)].to_acc() - max).exp();
                    sum = sum + e;
                    if kind == Kind::Softmax {
                        exps.push(e);
                    }
                }
                match kind {
                    Kind::Softmax => {
                        let inv = sum.recip();
                        for (j, &e) in exps.iter().enumerate() {
                            dst[at(j)] = T::from_acc(e * inv);
                        }
                    }
                    Kind::LogSoftmax => {
                        let shift = max + sum.ln();
                        for j in 0..n {
                            dst[at(j)] = T::from_acc(src[at(j)].to_acc() - shift);
                        }
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use crate::{Device, Tensor};

    #[test]
    fn softmax_is_stable_for_huge_logits() {
        let x = Tensor::from_slice(&[1000f32, 1001., 1002.], &[1, 3], Device::Cpu).unwrap();
        let p = x.softmax(-1).unwrap().to_vec::<f32>().unwrap();
        let e = [(-2f32).exp(), (-1f32).exp(), 1.0];
        let s: f32 = e.iter().sum();
        for (a, b) in p.iter().zip(e) {
            assert!((a - b / s).abs() < 1e-6, "{p:?}");
        }
        let l = x.log_softmax(1).unwrap().to_vec::<f32>().unwrap();
        // One f32 ulp at 1000 is 6e-5.
        assert!((l[2] - (1.0 / s).ln()).abs() < 1.5e-4, "{l:?}");
    }

    #[test]
    fn softmax_along_the_first_axis_sums_to_one_per_column() {
        let x = Tensor::from_slice(&[1f32, 2., 3., 4., 0., -1.], &[2, 3], Device::Cpu).unwrap();
        let s = x
            .softmax(0)
            .unwrap()
            .sum(&[0], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert!(s.iter().all(|v| (v - 1.0).abs() < 1e-6), "{s:?}");
    }

    /// Per slice, in order: the max, `exp(x - max)` summed left to right, then each
    /// exponential times the sum's reciprocal (log-softmax: `x - (max + ln(sum))`).
    fn reference(x: &[f32], n: usize, inner: usize, log: bool) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        for o in 0..x.len() / (n * inner) {
            for i in 0..inner {
                let at = |j: usize| (o * n + j) * inner + i;
                let max = (0..n).map(|j| x[at(j)]).fold(f32::NEG_INFINITY, f32::max);
                let sum = (0..n).fold(0f32, |s, j| s + (x[at(j)] - max).exp());
                for j in 0..n {
                    out[at(j)] = if log {
                        x[at(j)] - (max + sum.ln())
                    } else {
                        (x[at(j)] - max).exp() * sum.recip()
                    };
                }
            }
        }
        out
    }

    /// Large enough to be split across the kernel threads: the same bits as the
    /// definition's order on one thread, on two and on three, along the last axis and
    /// along the first (slices strided by the inner size).
    #[test]
    fn every_thread_count_gives_the_definitions_bits() {
        let (rows, n) = (20_000, 11);
        let x: Vec<f32> = (0..rows * n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0)
            .collect();
        for (dims, axis, inner) in [([rows, n], 1isize, 1), ([n, rows], 0, rows)] {
            let t = Tensor::from_slice(&x, &dims, Device::Cpu).unwrap();
            for log in [false, true] {
                let want: Vec<u32> = reference(&x, n, inner, log)
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                for threads in [1, 2, 3] {
                    let t = t.clone();
                    let got = std::thread::spawn(move || {
                        crate::set_num_threads(threads);
                        let y = match log {
                            true => t.log_softmax(axis),
                            false => t.softmax(axis),
                        };
                        y.unwrap().to_vec::<f32>().unwrap()
                    })
                    .join()
                    .unwrap();
                    let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    assert!(
                        got == want,
                        "{dims:?} axis {axis}, log {log}, {threads} threads"
                    );
                }
            }
        }
    }
}
