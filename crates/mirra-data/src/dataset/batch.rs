//! `batch`: consecutive elements stacked along a new first axis.
//!
//! When every element of a batch is a row of the same source (the pipeline slices ->
//! shuffle -> batch), the batch is gathered with one `index_select` per source tensor:
//! one copy of each row straight into the batch, no per-example tensors. Other elements
//! (after a `map`) are stacked tensor by tensor.

use std::sync::Arc;

use mirra_tensor::Tensor;

use super::element::{Elem, ElemIter};
use crate::{DataError, Result};

/// `input` in batches of `size` (at least 1).
pub(super) fn batch(input: ElemIter, size: usize, drop_remainder: bool) -> ElemIter {
    Box::new(Batch {
        input,
        size,
        drop_remainder,
    })
}

struct Batch {
    input: ElemIter,
    size: usize,
    drop_remainder: bool,
}

impl Iterator for Batch {
    type Item = Result<Elem>;

    fn next(&mut self) -> Option<Result<Elem>> {
        let mut elems = Vec::with_capacity(self.size);
        for e in self.input.by_ref() {
            match e {
                Ok(e) => elems.push(e),
                Err(e) => return Some(Err(e)),
            }
            if elems.len() == self.size {
                break;
            }
        }
        if elems.is_empty() || (self.drop_remainder && elems.len() < self.size) {
            return None;
        }
        Some(stack(elems).map(Elem::Tensors))
    }
}

/// The elements stacked along a new first axis.
fn stack(elems: Vec<Elem>) -> Result<Vec<Tensor>> {
    if let Some(tensors) = gather_rows(&elems) {
        return tensors;
    }
    let elems = elems
        .into_iter()
        .map(Elem::into_tensors)
        .collect::<Result<Vec<_>>>()?;
    let first = &elems[0];
    for (i, e) in elems.iter().enumerate().skip(1) {
        let mismatch = |msg: String| DataError::Incompatible {
            op: "batch",
            msg: format!("element {i} of the batch does not match element 0: {msg}"),
        };
        if e.len() != first.len() {
            return Err(mismatch(format!(
                "{} tensors instead of {}",
                e.len(),
                first.len()
            )));
        }
        for (c, (t, t0)) in e.iter().zip(first).enumerate() {
            if t.dims() != t0.dims() || t.dtype() != t0.dtype() {
                return Err(mismatch(format!(
                    "tensor {c} is {} {:?}, not {} {:?}",
                    t.dtype(),
                    t.dims(),
                    t0.dtype(),
                    t0.dims()
                )));
            }
        }
    }
    (0..first.len())
        .map(|c| {
            let rows = elems
                .iter()
                .map(|e| Ok(e[c].unsqueeze(0)?))
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::concat(&rows.iter().collect::<Vec<_>>(), 0)?)
        })
        .collect()
}

/// The batch gathered from its source in one pass, when every element is a row of the
/// same source; `None` otherwise.
fn gather_rows(elems: &[Elem]) -> Option<Result<Vec<Tensor>>> {
    let Elem::Row { source, .. } = &elems[0] else {
        return None;
    };
    let mut rows = Vec::with_capacity(elems.len());
    for e in elems {
        match e {
            Elem::Row { source: s, index } if Arc::ptr_eq(s, source) => rows.push(*index),
            _ => return None,
        }
    }
    Some(
        source
            .tensors
            .iter()
            .map(|t| Ok(t.index_select(&rows)?))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use mirra_tensor::{DType, Device};

    use super::super::testing::{collect, labels, numbered};
    use super::super::Dataset;
    use super::*;

    #[test]
    fn batches_keep_or_drop_the_remainder() {
        let ds = numbered(10).batch(4, false);
        assert_eq!(ds.cardinality(), Some(3));
        let b = collect(&ds, 0);
        assert_eq!(b.len(), 3);
        assert_eq!(b[0][1], [0, 1, 2, 3]);
        assert_eq!(b[2][1], [8, 9]);
        assert_eq!(b[2][0], [8, -8, 9, -9]);
        let shapes: Vec<Vec<usize>> = ds
            .iter_epoch(0)
            .unwrap()
            .map(|b| b.unwrap()[0].dims().to_vec())
            .collect();
        assert_eq!(shapes, [vec![4, 2], vec![4, 2], vec![2, 2]]);

        let dropped = numbered(10).batch(4, true);
        assert_eq!(dropped.cardinality(), Some(2));
        assert_eq!(labels(&dropped, 0), (0..8).collect::<Vec<_>>());
        assert_eq!(numbered(3).batch(4, true).cardinality(), Some(0));
        assert_eq!(collect(&numbered(3).batch(4, true), 0).len(), 0);
        assert_eq!(collect(&numbered(0).batch(4, false), 0).len(), 0);
    }

    #[test]
    fn mapped_elements_stack_like_gathered_rows() {
        let fast = numbered(23).shuffle(7, 3).batch(5, false);
        let slow = numbered(23).shuffle(7, 3).map(Ok).batch(5, false);
        for epoch in 0..3 {
            assert_eq!(collect(&fast, epoch), collect(&slow, epoch));
        }
        let b = slow.iter_epoch(0).unwrap().next().unwrap().unwrap();
        assert_eq!((b[0].dims(), b[1].dims()), (&[5, 2][..], &[5][..]));
    }

    #[test]
    fn elements_of_different_shapes_do_not_batch() {
        let ds = numbered(3)
            .map(|v| {
                let n = v[1].to_vec::<i64>()?[0] as usize + 1;
                Ok(vec![Tensor::zeros(&[n], DType::F32, Device::Cpu)?])
            })
            .batch(3, false);
        let e = ds.iter_epoch(0).unwrap().next().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            "batch: element 1 of the batch does not match element 0: tensor 0 is f32 [2], \
             not f32 [1]"
        );
    }

    #[test]
    fn batches_of_batches_add_an_axis() {
        let x = Tensor::from_vec((0..12).collect::<Vec<i64>>(), &[6, 2], Device::Cpu).unwrap();
        let ds = Dataset::from_tensor_slices(vec![x])
            .unwrap()
            .batch(2, false)
            .batch(3, false);
        let b = ds.iter_epoch(0).unwrap().next().unwrap().unwrap();
        assert_eq!(b[0].dims(), &[3, 2, 2]);
        assert_eq!(b[0].to_vec::<i64>().unwrap(), (0..12).collect::<Vec<_>>());
    }
}
