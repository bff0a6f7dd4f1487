//! Indexing: gather and its backward scatter-add, row selection, one-hot encoding.

use mirra_device::{Buffer, DType, Element, FloatElement};

use crate::dispatch::{with_any, with_float};
use crate::{Result, Shape, Tensor, TensorError};

/// Integer index values of a tensor, as i64, whatever its integer dtype.
fn indices(op: &'static str, index: &Tensor) -> Result<Vec<i64>> {
    match index.dtype() {
        DType::I64 => index.to_vec::<i64>(),
        DType::I32 | DType::U8 => index.to_dtype(DType::I64)?.to_vec::<i64>(),
        dtype => Err(TensorError::UnsupportedDType { op, dtype }),
    }
}

fn out_of_range(op: &'static str, value: i64, size: usize, shape: &Shape) -> TensorError {
    TensorError::Invalid {
        op,
        msg: format!("index {value} out of range 0..{size}"),
        shape: *shape,
    }
}

/// The index value `k` as a position in `0..size`, or an error naming `op` and `shape`.
fn position(op: &'static str, k: i64, size: usize, shape: &Shape) -> Result<usize> {
    if k < 0 || k as usize >= size {
        return Err(out_of_range(op, k, size, shape));
    }
    Ok(k as usize)
}

/// The element pairs of [`Tensor::gather`] and [`Tensor::scatter_add`]: for each element
/// `p` (in order) of the index tensor, of dimensions `index_dims` and values `idx`,
/// `f(p, q)` is called with `q` the element of the other tensor (`n` long along `axis`,
/// of `index_dims` elsewhere) that `idx[p]` selects along `axis`. An index outside `0..n`
/// is an error naming `op` and `shape` (the pairs before it were visited).
fn for_each_pair(
    op: &'static str,
    shape: &Shape,
    idx: &[i64],
    index_dims: &[usize],
    axis: usize,
    n: usize,
    mut f: impl FnMut(usize, usize),
) -> Result<()> {
    let (outer, m, inner) = split(index_dims, axis);
    for o in 0..outer {
        for j in 0..m {
            for i in 0..inner {
                let p = (o * m + j) * inner + i;
                let k = position(op, idx[p], n, shape)?;
                f(p, (o * n + k) * inner + i);
            }
        }
    }
    Ok(())
}

impl Tensor {
    /// Values at `index` along `axis`: `out[.., j, ..] = self[.., index[.., j, ..], ..]`
    /// (PyTorch's `gather`). `index` has this tensor's shape except along `axis`.
    pub fn gather(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let ax = self.shape().axis("gather", axis)?;
        self.check_index_shape("gather", ax, index)?;
        if !self.device().is_cpu() {
            return super::cuda::gather(self, ax, index);
        }
        let idx = indices("gather", index)?;
        let x = self.contiguous()?;
        let mut out = Buffer::alloc(self.dtype(), idx.len(), self.device())?;
        with_any!(self.dtype(), T => {
            let (src, dst) = (x.as_slice::<T>()?, out.as_mut_slice::<T>()?);
            let n = self.dims()[ax];
            for_each_pair("gather", self.shape(), &idx, index.dims(), ax, n, |p, q| {
                dst[p] = src[q];
            })?;
        });
        Tensor::from_buffer(out, index.dims())
    }

    /// The backward of [`Tensor::gather`]: a zero tensor of shape `dims` into which each
    /// value of `self` is added at its `index` along `axis`.
    pub fn scatter_add(&self, axis: isize, index: &Tensor, dims: &[usize]) -> Result<Tensor> {
        let target = Tensor::zeros(dims, self.dtype(), self.device())?;
        let ax = target.shape().axis("scatter_add", axis)?;
        target.check_index_shape("scatter_add", ax, index)?;
        if index.shape() != self.shape() {
            return Err(TensorError::ShapeMismatch {
                op: "scatter_add",
                lhs: *self.shape(),
                rhs: *index.shape(),
            });
        }
        if !self.device().is_cpu() {
            return super::cuda::scatter_add(self, ax, index, target);
        }
        let idx = indices("scatter_add", index)?;
        let src = self.contiguous()?;
        let mut out = target;
        with_float!("scatter_add", self.dtype(), T => {
            let s = src.as_slice::<T>()?;
            let d = out.data_mut::<T>()?;
            let n = dims[ax];
            for_each_pair("scatter_add", index.shape(), &idx, index.dims(), ax, n, |p, q| {
                d[q] = T::from_acc(d[q].to_acc() + s[p].to_acc());
            })
        })?;
        Ok(out)
    }

    /// The entries `rows` of dimension 0, in that order (a copy).
    pub fn index_select(&self, rows: &[usize]) -> Result<Tensor> {
        if self.rank() == 0 {
            return Err(TensorError::Invalid {
                op: "index_select",
                msg: "needs at least 1 dimension".into(),
                shape: *self.shape(),
            });
        }
        let n = self.dims()[0];
        if let Some(&r) = rows.iter().find(|&&r| r >= n) {
            return Err(out_of_range("index_select", r as i64, n, self.shape()));
        }
        if !self.device().is_cpu() {
            return super::cuda::index_select(self, rows);
        }
        let row = self.elem_count() / n.max(1);
        let x = self.contiguous()?;
        let mut out = Buffer::alloc(self.dtype(), rows.len() * row, self.device())?;
        with_any!(self.dtype(), T => {
            let (src, dst) = (x.as_slice::<T>()?, out.as_mut_slice::<T>()?);
            for (d, &r) in dst.chunks_exact_mut(row.max(1)).zip(rows) {
                d.copy_from_slice(&src[r * row..(r + 1) * row]);
            }
        });
        let mut dims = self.dims().to_vec();
        dims[0] = rows.len();
        Tensor::from_buffer(out, &dims)
    }

    /// One-hot encoding of integer class ids into a new last dimension of `depth`.
    pub fn one_hot(&self, depth: usize, dtype: DType) -> Result<Tensor> {
        if !self.device().is_cpu() {
            return super::cuda::one_hot(self, depth, dtype, self.device());
        }
        let idx = indices("one_hot", self)?;
        let mut out = Buffer::zeros(dtype, idx.len() * depth, self.device())?;
        with_float!("one_hot", dtype, T => {
            let dst = out.as_mut_slice::<T>()?;
            for (p, &k) in idx.iter().enumerate() {
                let k = position("one_hot", k, depth, self.shape())?;
                dst[p * depth + k] = <T as Element>::from_f64(1.0);
            }
            Ok(())
        })?;
        let mut dims = self.dims().to_vec();
        dims.push(depth);
        Tensor::from_buffer(out, &dims)
    }

    fn check_index_shape(&self, op: &'static str, ax: usize, index: &Tensor) -> Result<()> {
        let fits = index.rank() == self.rank()
            && (0..self.rank()).all(|d| d == ax || index.dims()[d] == self.dims()[d]);
        if fits {
            Ok(())
        } else {
            Err(TensorError::ShapeMismatch {
                op,
                lhs: *self.shape(),
                rhs: *index.shape(),
            })
        }
    }
}

/// `(outer, n, inner)` of a row-major shape split around `axis`.
fn split(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        dims[..axis].iter().product(),
        dims[axis],
        dims[axis + 1..].iter().product(),
    )
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    #[test]
    fn gather_picks_the_labelled_column_and_scatter_add_puts_it_back() {
        let x = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3], Device::Cpu).unwrap();
        let labels = Tensor::from_slice(&[2i64, 0], &[2, 1], Device::Cpu).unwrap();
        let g = x.gather(1, &labels).unwrap();
        assert_eq!(g.to_vec::<f32>().unwrap(), [3., 4.]);
        let back = g.scatter_add(1, &labels, &[2, 3]).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), [0., 0., 3., 4., 0., 0.]);
        let bad = Tensor::from_slice(&[3i64, 0], &[2, 1], Device::Cpu).unwrap();
        assert_eq!(
            x.gather(1, &bad).unwrap_err().to_string(),
            "gather: index 3 out of range 0..3 (shape [2, 3])"
        );
    }

    #[test]
    fn one_hot_and_row_selection() {
        let y = Tensor::from_slice(&[1u8, 0], &[2], Device::Cpu).unwrap();
        let h = y.one_hot(3, DType::F32).unwrap();
        assert_eq!(h.to_vec::<f32>().unwrap(), [0., 1., 0., 1., 0., 0.]);
        let rows = h.index_select(&[1, 1, 0]).unwrap();
        assert_eq!(rows.dims(), &[3, 3]);
        assert_eq!(rows.to_vec::<f32>().unwrap()[6..], [0., 1., 0.]);
        assert!(h.index_select(&[2]).is_err());
    }
}
