use std::fmt;
use std::ops::Deref;

use crate::{Result, TensorError};

/// The most dimensions a tensor may have. Shapes live inline, so creating a tensor on the
/// hot path allocates nothing but its buffer.
pub const MAX_RANK: usize = 8;

/// A tensor's dimensions, stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    dims: [usize; MAX_RANK],
    rank: u8,
}

impl Shape {
    /// A shape from its dimensions; an error beyond [`MAX_RANK`] dimensions.
    pub fn new(dims: &[usize]) -> Result<Shape> {
        if dims.len() > MAX_RANK {
            return Err(TensorError::Invalid {
                op: "shape",
                msg: format!(
                    "{} dimensions given, at most {MAX_RANK} supported",
                    dims.len()
                ),
                shape: Shape::default(),
            });
        }
        let mut s = Shape {
            dims: [0; MAX_RANK],
            rank: dims.len() as u8,
        };
        s.dims[..dims.len()].copy_from_slice(dims);
        Ok(s)
    }

    /// The shape of a scalar (rank 0, one element).
    pub fn scalar() -> Shape {
        Shape::default()
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Number of elements (1 for a scalar).
    pub fn elem_count(&self) -> usize {
        self.iter().product()
    }

    /// Row-major strides of a contiguous tensor of this shape.
    pub fn contiguous_strides(&self) -> [usize; MAX_RANK] {
        let mut strides = [0; MAX_RANK];
        let mut acc = 1;
        for i in (0..self.rank()).rev() {
            strides[i] = acc;
            acc *= self.dims[i];
        }
        strides
    }

    /// Resolve a possibly negative axis (`-1` is the last) against this rank.
    pub fn axis(&self, op: &'static str, axis: isize) -> Result<usize> {
        let r = self.rank() as isize;
        let a = if axis < 0 { axis + r } else { axis };
        if (0..r).contains(&a) {
            Ok(a as usize)
        } else {
            Err(TensorError::AxisOutOfRange {
                op,
                axis,
                shape: *self,
            })
        }
    }

    /// The shape both operands broadcast to, NumPy's rules.
    pub fn broadcast(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
        let rank = a.rank().max(b.rank());
        let mut dims = [0; MAX_RANK];
        for (i, d) in dims[..rank].iter_mut().enumerate() {
            let da = dim_from_right(a, rank - 1 - i);
            let db = dim_from_right(b, rank - 1 - i);
            *d = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => {
                    return Err(TensorError::ShapeMismatch {
                        op,
                        lhs: *a,
                        rhs: *b,
                    })
                }
            };
        }
        Shape::new(&dims[..rank])
    }

    /// A copy with dimension `axis` replaced.
    pub(crate) fn with_dim(&self, axis: usize, size: usize) -> Shape {
        let mut s = *self;
        s.dims[axis] = size;
        s
    }
}

/// The dimension `k` places from the right, 1 where the shape is shorter.
fn dim_from_right(s: &Shape, k: usize) -> usize {
    if k < s.rank() {
        s[s.rank() - 1 - k]
    } else {
        1
    }
}

impl Deref for Shape {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.dims[..self.rank()]
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &**self)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &**self)
    }
}

impl TryFrom<&[usize]> for Shape {
    type Error = TensorError;
    fn try_from(dims: &[usize]) -> Result<Shape> {
        Shape::new(dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        let s = |d: &[usize]| Shape::new(d).unwrap();
        assert_eq!(
            Shape::broadcast("add", &s(&[4, 1, 3]), &s(&[5, 1])).unwrap(),
            s(&[4, 5, 3])
        );
        assert_eq!(Shape::broadcast("add", &s(&[]), &s(&[2])).unwrap(), s(&[2]));
        let err = Shape::broadcast("add", &s(&[2, 3]), &s(&[4])).unwrap_err();
        assert_eq!(err.to_string(), "add: shapes [2, 3] and [4] do not match");
    }

    #[test]
    fn negative_axes_count_from_the_end() {
        let s = Shape::new(&[2, 3, 4]).unwrap();
        assert_eq!(s.axis("sum", -1).unwrap(), 2);
        assert!(s.axis("sum", 3).is_err());
    }
}
