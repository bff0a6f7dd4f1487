//! The elements that flow between pipeline stages.
//!
//! An element straight from [`Dataset::from_tensor_slices`](crate::Dataset) is only a row
//! index into the source tensors ([`Elem::Row`]): shuffling, repeating and taking move
//! indices, and batching gathers a whole batch of rows from each source tensor in one
//! pass. An element becomes real tensors only when something needs them (a `map`, the
//! caller).

use std::sync::Arc;

use mirra_tensor::Tensor;

use crate::{DataError, Result};

/// The tensors a dataset of slices is cut from: contiguous, all with `rows` rows.
#[derive(Debug)]
pub(crate) struct Source {
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) rows: usize,
}

impl Source {
    /// Checks that `tensors` can be sliced together and makes each contiguous once, so
    /// that every later gather reads it in place.
    pub(crate) fn new(tensors: Vec<Tensor>) -> Result<Source> {
        let op = "from_tensor_slices";
        let first = tensors.first().ok_or_else(|| DataError::Incompatible {
            op,
            msg: "no tensors given".into(),
        })?;
        if let Some((i, _)) = tensors.iter().enumerate().find(|(_, t)| t.rank() == 0) {
            return Err(DataError::Incompatible {
                op,
                msg: format!(
                    "tensor {i} is a scalar (rank 0); each tensor needs a first dimension \
                     to slice"
                ),
            });
        }
        let rows = first.dims()[0];
        if let Some((i, t)) = tensors
            .iter()
            .enumerate()
            .find(|(_, t)| t.dims()[0] != rows)
        {
            return Err(DataError::Incompatible {
                op,
                msg: format!(
                    "tensor {i} has shape {:?} but tensor 0 has shape {:?}: their first \
                     dimensions ({} and {rows}) must agree",
                    t.dims(),
                    first.dims(),
                    t.dims()[0]
                ),
            });
        }
        let tensors = tensors
            .iter()
            .map(Tensor::contiguous)
            .collect::<mirra_tensor::Result<_>>()?;
        Ok(Source { tensors, rows })
    }
}

/// One element of a dataset: a row of a [`Source`] not yet cut out, or tensors.
#[derive(Clone, Debug)]
pub(crate) enum Elem {
    /// Row `index` of each tensor of `source`.
    Row { source: Arc<Source>, index: usize },
    /// Materialised tensors (after a `map`, or a batch).
    Tensors(Vec<Tensor>),
}

impl Elem {
    /// The element's tensors; a row becomes views of the source (no copy).
    pub(crate) fn into_tensors(self) -> Result<Vec<Tensor>> {
        match self {
            Elem::Tensors(t) => Ok(t),
            Elem::Row { source, index } => source
                .tensors
                .iter()
                .map(|t| Ok(t.narrow(0, index, 1)?.squeeze(0)?))
                .collect(),
        }
    }
}

/// The iterator every stage returns. `Send`, so that a prefetch thread can own it.
pub(crate) type ElemIter = Box<dyn Iterator<Item = Result<Elem>> + Send>;
