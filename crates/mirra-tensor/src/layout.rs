use crate::{Shape, MAX_RANK};

/// How a tensor's elements sit in its buffer: shape, per-dimension strides (in elements;
/// 0 for a broadcast dimension) and the offset of the first element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Shape,
    strides: [usize; MAX_RANK],
    offset: usize,
}

impl Layout {
    /// The row-major layout of `shape` starting at offset 0.
    pub fn contiguous(shape: Shape) -> Layout {
        Layout {
            strides: shape.contiguous_strides(),
            shape,
            offset: 0,
        }
    }

    /// A layout from its parts.
    pub(crate) fn new(shape: Shape, strides: [usize; MAX_RANK], offset: usize) -> Layout {
        Layout {
            shape,
            strides,
            offset,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The strides of the dimensions, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.shape.rank()]
    }

    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// True when the elements are the row-major run `offset..offset + elem_count`.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for i in (0..self.shape.rank()).rev() {
            if self.shape[i] != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= self.shape[i];
        }
        true
    }

    /// True when this layout visits each of the `len` elements of a buffer exactly once,
    /// in row-major order or another order of its dimensions.
    pub(crate) fn covers(&self, len: usize) -> bool {
        let whole = self.offset == 0 && self.shape.elem_count() == len;
        (whole && self.is_contiguous()) || self.is_dense_permutation(len)
    }

    /// True when this layout visits each of the `len` elements of a buffer exactly once
    /// in some order of its dimensions (a transpose or permutation of a contiguous
    /// tensor that fills the buffer), but not in row-major order.
    pub(crate) fn is_dense_permutation(&self, len: usize) -> bool {
        if self.offset != 0 || self.shape.elem_count() != len || self.is_contiguous() {
            return false;
        }
        let mut dims: Vec<(usize, usize)> = (0..self.shape.rank())
            .filter(|&i| self.shape[i] != 1)
            .map(|i| (self.strides[i], self.shape[i]))
            .collect();
        dims.sort_unstable();
        let mut expected = 1;
        for (stride, size) in dims {
            if stride != expected {
                return false;
            }
            expected *= size;
        }
        true
    }

    /// Strides of this layout seen through a broadcast to `target` (0 where broadcast).
    /// `target` must be a valid broadcast of this shape.
    pub(crate) fn broadcast_strides(&self, target: &Shape) -> [usize; MAX_RANK] {
        let mut out = [0; MAX_RANK];
        let shift = target.rank() - self.shape.rank();
        for i in 0..self.shape.rank() {
            if self.shape[i] != 1 {
                out[i + shift] = self.strides[i];
            }
        }
        out
    }
}

/// Visits every row of `shape` (all dimensions but the last) for `K` operands with their
/// own strides. `f` receives each operand's offset of the row's first element; the row
/// has `shape[rank-1]` elements and operand `k` advances by `strides[k][rank-1]` along it.
/// A rank-0 shape is one row of one element. Always inlined, so that the row loops of the
/// caller's closure are compiled (and vectorised) in the caller's context.
#[inline(always)]
pub(crate) fn for_each_row<const K: usize>(
    shape: &Shape,
    strides: [&[usize; MAX_RANK]; K],
    offsets: [usize; K],
    mut f: impl FnMut([usize; K]),
) {
    let rank = shape.rank();
    if shape.elem_count() == 0 {
        return;
    }
    if rank <= 1 {
        f(offsets);
        return;
    }
    let outer = rank - 1;
    let mut index = [0usize; MAX_RANK];
    let mut offs = offsets;
    loop {
        f(offs);
        // Odometer increment over the outer dimensions.
        let mut d = outer;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            for k in 0..K {
                offs[k] += strides[k][d];
            }
            if index[d] < shape[d] {
                break;
            }
            for k in 0..K {
                offs[k] -= strides[k][d] * shape[d];
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_a_transposed_view_are_visited_in_order() {
        let shape = Shape::new(&[3, 2]).unwrap();
        // A [2, 3] contiguous tensor seen transposed: strides [1, 3].
        let mut strides = [0; MAX_RANK];
        strides[0] = 1;
        strides[1] = 3;
        let mut rows = vec![];
        for_each_row(&shape, [&strides], [0], |[o]| rows.push(o));
        assert_eq!(rows, vec![0, 1, 2]);
        assert!(!Layout::new(shape, strides, 0).is_contiguous());
    }
}
