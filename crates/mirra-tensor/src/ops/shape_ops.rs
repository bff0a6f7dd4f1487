//! Views and copies that change a tensor's shape: reshape, transpose, narrow, broadcast,
//! squeeze/unsqueeze, and concatenation.

use mirra_device::Buffer;

use crate::dispatch::with_any;
use crate::{Layout, Result, Shape, Tensor, TensorError, MAX_RANK};

impl Tensor {
    /// The same elements with another shape (a view when contiguous, else a copy). One
    /// dimension may be `usize::MAX`, meaning "whatever is left", like NumPy's `-1`.
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        let mut dims_v: [usize; MAX_RANK] = [0; MAX_RANK];
        let target = Shape::new(dims)?;
        dims_v[..dims.len()].copy_from_slice(dims);
        let free: Vec<usize> = (0..dims.len()).filter(|&i| dims[i] == usize::MAX).collect();
        let invalid = |msg: String| TensorError::Invalid {
            op: "reshape",
            msg,
            shape: *self.shape(),
        };
        if free.len() > 1 {
            return Err(invalid("at most one inferred dimension".into()));
        }
        if let [i] = free[..] {
            let known: usize = dims.iter().filter(|&&d| d != usize::MAX).product();
            if known == 0 || !self.elem_count().is_multiple_of(known) {
                return Err(invalid(format!("cannot infer a dimension for {target:?}")));
            }
            dims_v[i] = self.elem_count() / known;
        }
        let shape = Shape::new(&dims_v[..dims.len()])?;
        if shape.elem_count() != self.elem_count() {
            return Err(invalid(format!("cannot reshape to {shape}")));
        }
        let src = self.contiguous()?;
        let offset = src.layout().offset();
        Ok(src.with_layout(Layout::new(shape, shape.contiguous_strides(), offset)))
    }

    /// Swap two dimensions (a view).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (
            self.shape().axis("transpose", a)?,
            self.shape().axis("transpose", b)?,
        );
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Reorder the dimensions: dimension `i` of the result is dimension `perm[i]` (a view).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let r = self.rank();
        let mut seen = [false; MAX_RANK];
        if perm.len() != r
            || perm
                .iter()
                .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
        {
            return Err(TensorError::Invalid {
                op: "permute",
                msg: format!("{perm:?} is not a permutation of {r} dimensions"),
                shape: *self.shape(),
            });
        }
        let mut dims = [0; MAX_RANK];
        let mut strides = [0; MAX_RANK];
        for (i, &p) in perm.iter().enumerate() {
            dims[i] = self.dims()[p];
            strides[i] = self.layout().strides()[p];
        }
        let shape = Shape::new(&dims[..r])?;
        Ok(self.with_layout(Layout::new(shape, strides, self.layout().offset())))
    }

    /// The `len` elements of dimension `axis` starting at `start` (a view), like slicing
    /// `x[.., start..start + len, ..]`.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let ax = self.shape().axis("narrow", axis)?;
        let size = self.dims()[ax];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(TensorError::Invalid {
                op: "narrow",
                msg: format!(
                    "range {start}..{} outside dimension {ax} of size {size}",
                    start + len
                ),
                shape: *self.shape(),
            });
        }
        let l = self.layout();
        let mut strides = [0; MAX_RANK];
        strides[..self.rank()].copy_from_slice(l.strides());
        let offset = l.offset() + start * l.strides()[ax];
        Ok(self.with_layout(Layout::new(self.shape().with_dim(ax, len), strides, offset)))
    }

    /// This tensor broadcast to `dims` (a view with stride 0 on broadcast dimensions).
    pub fn broadcast_to(&self, dims: &[usize]) -> Result<Tensor> {
        let target = Shape::new(dims)?;
        if Shape::broadcast("broadcast_to", self.shape(), &target)? != target {
            return Err(TensorError::ShapeMismatch {
                op: "broadcast_to",
                lhs: *self.shape(),
                rhs: target,
            });
        }
        let strides = self.layout().broadcast_strides(&target);
        Ok(self.with_layout(Layout::new(target, strides, self.layout().offset())))
    }

    /// Insert a dimension of size 1 at `axis` (`0..=rank`) (a view).
    pub fn unsqueeze(&self, axis: usize) -> Result<Tensor> {
        if axis > self.rank() {
            return Err(TensorError::AxisOutOfRange {
                op: "unsqueeze",
                axis: axis as isize,
                shape: *self.shape(),
            });
        }
        let mut dims = self.dims().to_vec();
        dims.insert(axis, 1);
        let mut strides = self.layout().strides().to_vec();
        strides.insert(axis, 0);
        let shape = Shape::new(&dims)?;
        let mut s = [0; MAX_RANK];
        s[..strides.len()].copy_from_slice(&strides);
        Ok(self.with_layout(Layout::new(shape, s, self.layout().offset())))
    }

    /// Remove dimension `axis`, which must have size 1 (a view).
    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        let ax = self.shape().axis("squeeze", axis)?;
        if self.dims()[ax] != 1 {
            return Err(TensorError::Invalid {
                op: "squeeze",
                msg: format!("dimension {ax} has size {}, not 1", self.dims()[ax]),
                shape: *self.shape(),
            });
        }
        let mut dims = self.dims().to_vec();
        dims.remove(ax);
        let mut strides = self.layout().strides().to_vec();
        strides.remove(ax);
        let mut s = [0; MAX_RANK];
        s[..strides.len()].copy_from_slice(&strides);
        Ok(self.with_layout(Layout::new(Shape::new(&dims)?, s, self.layout().offset())))
    }

    /// Join tensors along `axis`; all other dimensions and the dtypes must agree.
    pub fn concat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| TensorError::Invalid {
            op: "concat",
            msg: "no tensors given".into(),
            shape: Shape::scalar(),
        })?;
        let ax = first.shape().axis("concat", axis)?;
        let mut total = 0;
        for t in tensors {
            if t.dtype() != first.dtype() {
                return Err(TensorError::DTypeMismatch {
                    op: "concat",
                    lhs: first.dtype(),
                    rhs: t.dtype(),
                });
            }
            let same_rest = t.rank() == first.rank()
                && (0..t.rank()).all(|d| d == ax || t.dims()[d] == first.dims()[d]);
            if !same_rest {
                return Err(TensorError::ShapeMismatch {
                    op: "concat",
                    lhs: *first.shape(),
                    rhs: *t.shape(),
                });
            }
            total += t.dims()[ax];
        }
        let shape = first.shape().with_dim(ax, total);
        if !first.device().is_cpu() {
            return super::cuda::concat(tensors, ax, &shape);
        }
        let outer: usize = first.dims()[..ax].iter().product();
        let inner: usize = first.dims()[ax + 1..].iter().product();
        let mut out = Buffer::alloc(first.dtype(), shape.elem_count(), first.device())?;
        with_any!(first.dtype(), T => {
            let dst = out.as_mut_slice::<T>()?;
            let mut col = 0;
            for t in tensors {
                let src = t.contiguous()?;
                let src = src.as_slice::<T>()?;
                let run = t.dims()[ax] * inner;
                for o in 0..outer {
                    let d0 = o * total * inner + col * inner;
                    dst[d0..d0 + run].copy_from_slice(&src[o * run..(o + 1) * run]);
                }
                col += t.dims()[ax];
            }
        });
        Tensor::from_buffer(out, &shape)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Device, Tensor};

    fn iota(dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|x| x as f32).collect();
        Tensor::from_slice(&v, dims, Device::Cpu).unwrap()
    }

    #[test]
    fn narrow_and_transpose_are_views_with_the_right_elements() {
        let x = iota(&[3, 4]);
        let n = x.narrow(1, 1, 2).unwrap();
        assert!(n.same_buffer(&x));
        assert_eq!(n.to_vec::<f32>().unwrap(), [1., 2., 5., 6., 9., 10.]);
        let t = x.transpose(0, 1).unwrap();
        assert_eq!(t.dims(), &[4, 3]);
        assert_eq!(t.to_vec::<f32>().unwrap()[..4], [0., 4., 8., 1.]);
        assert!(x.narrow(0, 2, 2).is_err());
    }

    #[test]
    fn reshape_infers_one_dimension() {
        let x = iota(&[2, 3, 4]);
        assert_eq!(x.reshape(&[2, usize::MAX]).unwrap().dims(), &[2, 12]);
        assert!(x.reshape(&[5, usize::MAX]).is_err());
        let t = x.transpose(0, 2).unwrap().reshape(&[24]).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap()[..3], [0., 12., 4.]);
    }

    #[test]
    fn concat_along_the_middle_axis() {
        let a = iota(&[2, 1, 2]);
        let b = iota(&[2, 2, 2]);
        let c = Tensor::concat(&[&a, &b], 1).unwrap();
        assert_eq!(c.dims(), &[2, 3, 2]);
        assert_eq!(
            c.to_vec::<f32>().unwrap(),
            [0., 1., 0., 1., 2., 3., 2., 3., 4., 5., 6., 7.]
        );
        let err = Tensor::concat(&[&a, &iota(&[3, 1, 2])], 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "concat: shapes [2, 1, 2] and [3, 1, 2] do not match"
        );
    }
}
