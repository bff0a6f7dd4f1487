//! Matrix products through the `gemm` crate, which takes arbitrary row and column
//! strides: transposed operands are views, never copies.

use gemm::Parallelism;
use mirra_device::{Buffer, DType, Element};

use crate::{num_threads, Result, Shape, Tensor, TensorError, MAX_RANK};

/// Below this many multiply-adds a product runs on one thread (`MIRRA_MATMUL_PARALLEL_MIN`).
/// Waking a parked pool thread on the other core costs 0.1-0.8 ms on these machines, so
/// a product must be large for two threads to win once the pool has gone to sleep between
/// the small matmuls of a training step.
fn parallel_min_macs() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("MIRRA_MATMUL_PARALLEL_MIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1 << 24)
    })
}

impl Tensor {
    /// Matrix product over the last two dimensions (`[.., m, k] x [.., k, n]`), with the
    /// leading (batch) dimensions broadcast against each other.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let op = "matmul";
        let (a, b) = (self, rhs);
        if a.dtype() != b.dtype() {
            return Err(TensorError::DTypeMismatch {
                op,
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        let mismatch = || TensorError::ShapeMismatch {
            op,
            lhs: *a.shape(),
            rhs: *b.shape(),
        };
        if a.rank() < 2 || b.rank() < 2 {
            return Err(mismatch());
        }
        let (ra, rb) = (a.rank(), b.rank());
        let (m, k, k2, n) = (
            a.dims()[ra - 2],
            a.dims()[ra - 1],
            b.dims()[rb - 2],
            b.dims()[rb - 1],
        );
        if k != k2 {
            return Err(mismatch());
        }
        let batch_a = Shape::new(&a.dims()[..ra - 2])?;
        let batch_b = Shape::new(&b.dims()[..rb - 2])?;
        let batch = Shape::broadcast(op, &batch_a, &batch_b).map_err(|_| mismatch())?;
        let mut out_dims = batch.to_vec();
        out_dims.extend([m, n]);
        if !a.device().is_cpu() || !b.device().is_cpu() {
            return super::cuda::matmul(a, b, &batch, m, k, n, &out_dims);
        }
        match a.dtype() {
            DType::F32 => gemm_batched::<f32>(a, b, &batch, m, k, n, &out_dims),
            DType::F64 => gemm_batched::<f64>(a, b, &batch, m, k, n, &out_dims),
            DType::BF16 if super::bf16_accumulation::bf16_accumulation_ablation() => {
                super::bf16_accumulation::matmul(a, b, &batch, m, k, n, &out_dims)
            }
            DType::BF16 if let Some(kernel) = super::bf16_gemm::native() => {
                bf16_native(kernel, a, b, &batch, m, k, n, &out_dims)
            }
            // f16 products (and bf16 ones without 16-bit units) are f32 products of the
            // widened operands, rounded once at the end. gemm's f16 kernel widens inside
            // its packing, slower than widening the whole operands once, and its
            // matrix-vector and k <= 2 paths accumulate in the f16 output; AVX-512 FP16
            // units would accumulate in f16 too.
            DType::F16 | DType::BF16 => a
                .to_dtype(DType::F32)?
                .matmul(&b.to_dtype(DType::F32)?)?
                .to_dtype(a.dtype()),
            dtype => Err(TensorError::UnsupportedDType { op, dtype }),
        }
    }

    /// The transpose of the last two dimensions, as a view.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(TensorError::Invalid {
                op: "t",
                msg: "needs at least 2 dimensions".into(),
                shape: *self.shape(),
            });
        }
        self.transpose(-2, -1)
    }
}

#[allow(clippy::too_many_arguments)]
fn gemm_batched<T: Element>(
    a: &Tensor,
    b: &Tensor,
    batch: &Shape,
    m: usize,
    k: usize,
    n: usize,
    out_dims: &[usize],
) -> Result<Tensor> {
    let out_shape = Shape::new(out_dims)?;
    let mut out = Buffer::alloc(T::DTYPE, out_shape.elem_count(), a.device())?;
    if k == 0 {
        out.as_bytes_mut()?.fill(0);
        return Tensor::from_buffer(out, out_dims);
    }
    let ((a_rs, a_cs), (b_rs, b_cs)) = (matrix_strides(a), matrix_strides(b));
    let threads = num_threads();
    mirra_device::denormals::ensure_this_thread();
    let parallelism = if threads > 1 && m * n * k >= parallel_min_macs() {
        crate::threads::ensure_rayon_pool();
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    let (xa, xb) = (a.buffer().as_slice::<T>()?, b.buffer().as_slice::<T>()?);
    let dst = out.as_mut_slice::<T>()?;
    for_each_product(a, b, batch, dst, m * n, |chunk, oa, ob| {
        if m > 0 && n > 0 {
            // SAFETY: `chunk` holds m x n elements written with strides (n, 1); the operand
            // pointers start at valid offsets of their buffers, and their layouts were
            // built by this crate, so every element that (m, k) x (k, n) with these strides
            // reads lies inside its buffer. T is f32 or f64, which gemm supports.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    chunk.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    xa.as_ptr().add(oa),
                    a_cs as isize,
                    a_rs as isize,
                    xb.as_ptr().add(ob),
                    b_cs as isize,
                    b_rs as isize,
                    <T as Element>::from_f64(0.0),
                    <T as Element>::from_f64(1.0),
                    false,
                    false,
                    false,
                    parallelism,
                );
            }
        }
    });
    Tensor::from_buffer(out, out_dims)
}

/// The (row, column) strides of a tensor's last two dimensions.
fn matrix_strides(t: &Tensor) -> (usize, usize) {
    let (r, s) = (t.rank(), t.layout().strides());
    (s[r - 2], s[r - 1])
}

/// Calls `f(product, offset_a, offset_b)` for every matrix of the broadcast `batch`, in
/// order: `product` is that matrix's `elems` elements of `dst`, the offsets are where the
/// operands' matrices start in their buffers.
fn for_each_product<E>(
    a: &Tensor,
    b: &Tensor,
    batch: &Shape,
    dst: &mut [E],
    elems: usize,
    mut f: impl FnMut(&mut [E], usize, usize),
) {
    // Batch strides of each operand, broadcast to the common batch shape.
    let batch_strides = |t: &Tensor| -> [usize; MAX_RANK] {
        let r = t.rank();
        let own = Shape::new(&t.dims()[..r - 2]).expect("rank checked");
        let mut strides = [0; MAX_RANK];
        let shift = batch.rank() - own.rank();
        for i in 0..own.rank() {
            if own[i] != 1 {
                strides[i + shift] = t.layout().strides()[i];
            }
        }
        strides
    };
    let (bsa, bsb) = (batch_strides(a), batch_strides(b));
    let mut index = [0usize; MAX_RANK];
    for chunk in dst.chunks_exact_mut(elems.max(1)).take(batch.elem_count()) {
        let mut oa = a.layout().offset();
        let mut ob = b.layout().offset();
        for d in 0..batch.rank() {
            oa += index[d] * bsa[d];
            ob += index[d] * bsb[d];
        }
        f(chunk, oa, ob);
        for d in (0..batch.rank()).rev() {
            index[d] += 1;
            if index[d] < batch[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// A bf16 product on the CPU's 16-bit units (see `bf16_gemm`).
#[allow(clippy::too_many_arguments)]
fn bf16_native(
    kernel: super::bf16_gemm::Native,
    a: &Tensor,
    b: &Tensor,
    batch: &Shape,
    m: usize,
    k: usize,
    n: usize,
    out_dims: &[usize],
) -> Result<Tensor> {
    use super::bf16_pack::Operand;
    let out_shape = Shape::new(out_dims)?;
    let mut out = Buffer::alloc(DType::BF16, out_shape.elem_count(), a.device())?;
    let threads = if m * n * k >= parallel_min_macs() {
        num_threads()
    } else {
        1
    };
    mirra_device::denormals::ensure_this_thread();
    let ((a_rs, a_cs), (b_rs, b_cs)) = (matrix_strides(a), matrix_strides(b));
    let xa: &[u16] = bytemuck::cast_slice(a.buffer().as_slice::<half::bf16>()?);
    let xb: &[u16] = bytemuck::cast_slice(b.buffer().as_slice::<half::bf16>()?);
    let dst = out.as_mut_slice::<half::bf16>()?;
    for_each_product(a, b, batch, dst, m * n, |chunk, oa, ob| {
        let a = Operand {
            data: xa,
            offset: oa,
            row_stride: a_rs,
            col_stride: a_cs,
        };
        let b = Operand {
            data: xb,
            offset: ob,
            row_stride: b_rs,
            col_stride: b_cs,
        };
        kernel.product(a, b, m, k, n, chunk, threads);
    });
    Tensor::from_buffer(out, out_dims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        out
    }

    #[test]
    fn transposed_views_multiply_without_copies() {
        let a: Vec<f64> = (0..6).map(f64::from).collect();
        let b: Vec<f64> = (0..12).map(|x| f64::from(x) * 0.5).collect();
        let ta = Tensor::from_slice(&a, &[2, 3], Device::Cpu).unwrap();
        let tb = Tensor::from_slice(&b, &[3, 4], Device::Cpu).unwrap();
        let c = ta.matmul(&tb).unwrap();
        assert_eq!(c.to_vec::<f64>().unwrap(), naive(&a, &b, 2, 3, 4));
        // (B^T A^T)^T = A B, with both transposes as views.
        let ct = tb.t().unwrap().matmul(&ta.t().unwrap()).unwrap();
        assert_eq!(
            ct.t().unwrap().to_vec::<f64>().unwrap(),
            naive(&a, &b, 2, 3, 4)
        );
    }

    #[test]
    fn batch_dimensions_broadcast() {
        let a = Tensor::ones(&[2, 3, 2, 5], DType::F32, Device::Cpu).unwrap();
        let b = Tensor::ones(&[3, 5, 4], DType::F32, Device::Cpu).unwrap();
        let c = a.matmul(&b).unwrap();
        assert_eq!(c.dims(), &[2, 3, 2, 4]);
        assert!(c.to_vec::<f32>().unwrap().iter().all(|&x| x == 5.0));
    }

    #[test]
    fn inner_dimension_mismatch_names_both_shapes() {
        let a = Tensor::ones(&[2, 3], DType::F32, Device::Cpu).unwrap();
        let err = a.matmul(&a).unwrap_err().to_string();
        assert_eq!(err, "matmul: shapes [2, 3] and [2, 3] do not match");
    }
}
