//! A small `tf.data`: a [`Dataset`] is an immutable description of a pipeline, and each
//! call to [`Dataset::iter_epoch`] runs it once.
//!
//! The description is a chain of nodes behind an [`Arc`], so a dataset is cheap to clone
//! and can be shared between threads. Randomness depends only on the seed given to
//! [`Dataset::shuffle`] and the epoch number, so a run is reproducible and every epoch
//! is shuffled differently.

mod batch;
mod cache;
mod element;
mod prefetch;
mod repeat;
mod shuffle;

use std::fmt;
use std::sync::Arc;

use mirra_tensor::Tensor;

use crate::{DataError, Result};
use element::{Elem, ElemIter, Source};

/// The function of a [`Dataset::map`].
type MapFn = Arc<dyn Fn(Vec<Tensor>) -> Result<Vec<Tensor>> + Send + Sync>;
/// The function of a [`Dataset::map_with_epoch`].
type EpochMapFn = Arc<dyn Fn(u64, Vec<Tensor>) -> Result<Vec<Tensor>> + Send + Sync>;

/// A pipeline of elements, each a `Vec<Tensor>`, run once per epoch by
/// [`Dataset::iter_epoch`].
///
/// ```
/// # use mirra_data::Dataset;
/// # use mirra_tensor::{Device, Tensor};
/// let x = Tensor::from_vec((0..10).map(|i| i as f32).collect(), &[5, 2], Device::Cpu)?;
/// let y = Tensor::from_vec((0..5i64).collect(), &[5], Device::Cpu)?;
/// let ds = Dataset::from_tensor_slices(vec![x, y])?.shuffle(100, 7).batch(2, false).prefetch(2);
/// assert_eq!(ds.cardinality(), Some(3));
/// for batch in ds.iter_epoch(0)? {
///     let batch = batch?;
///     assert_eq!(batch[0].dims()[1..], [2]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Dataset {
    node: Arc<Node>,
}

/// One stage of a pipeline and its input.
enum Node {
    Slices(Arc<Source>),
    Shuffle {
        input: Dataset,
        buffer: usize,
        seed: u64,
    },
    Batch {
        input: Dataset,
        size: usize,
        drop_remainder: bool,
    },
    Map {
        input: Dataset,
        f: MapFn,
    },
    MapEpoch {
        input: Dataset,
        f: EpochMapFn,
    },
    Cache {
        input: Dataset,
        store: cache::Store,
    },
    Repeat {
        input: Dataset,
        count: Option<usize>,
    },
    Take {
        input: Dataset,
        n: usize,
    },
    Prefetch {
        input: Dataset,
        n: usize,
    },
}

impl Dataset {
    fn new(node: Node) -> Dataset {
        Dataset {
            node: Arc::new(node),
        }
    }

    /// A dataset whose element `i` is row `i` of each tensor (`tf.data`'s
    /// `from_tensor_slices`). The tensors must all have at least one dimension and the
    /// same first dimension.
    pub fn from_tensor_slices(tensors: Vec<Tensor>) -> Result<Dataset> {
        Ok(Dataset::new(Node::Slices(Arc::new(Source::new(tensors)?))))
    }

    /// Elements in random order: each output is drawn uniformly from a buffer of the next
    /// `buffer_size` elements (a buffer at least as large as the dataset gives a uniform
    /// permutation). The order depends only on `seed` and the epoch. A zero
    /// `buffer_size` is reported by [`Dataset::iter_epoch`].
    pub fn shuffle(self, buffer_size: usize, seed: u64) -> Dataset {
        Dataset::new(Node::Shuffle {
            input: self,
            buffer: buffer_size,
            seed,
        })
    }

    /// Consecutive elements stacked along a new first axis, `batch_size` at a time; the
    /// last, smaller batch is kept unless `drop_remainder`. A zero `batch_size` is
    /// reported by [`Dataset::iter_epoch`].
    pub fn batch(self, batch_size: usize, drop_remainder: bool) -> Dataset {
        Dataset::new(Node::Batch {
            input: self,
            size: batch_size,
            drop_remainder,
        })
    }

    /// Each element (an example, or a batch after [`Dataset::batch`]) passed through
    /// `f`; an error from `f` ends the epoch with that error.
    pub fn map<F>(self, f: F) -> Dataset
    where
        F: Fn(Vec<Tensor>) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    {
        Dataset::new(Node::Map {
            input: self,
            f: Arc::new(f),
        })
    }

    /// [`Dataset::map`] with the iteration's epoch (or, after [`Dataset::repeat`], its
    /// repetition) as `f`'s first argument: for randomness keyed by the epoch, such as
    /// data augmentation that draws anew each epoch and the same way when an epoch is run
    /// again (a resumed run).
    pub fn map_with_epoch<F>(self, f: F) -> Dataset
    where
        F: Fn(u64, Vec<Tensor>) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    {
        Dataset::new(Node::MapEpoch {
            input: self,
            f: Arc::new(f),
        })
    }

    /// The elements of the first complete epoch kept in memory and replayed, in the same
    /// order, by every later epoch (and by every clone of this dataset). An epoch that
    /// is not read to its end, or fails, caches nothing.
    pub fn cache(self) -> Dataset {
        Dataset::new(Node::Cache {
            input: self,
            store: cache::Store::default(),
        })
    }

    /// The dataset `count` times over (`None`: forever); each repetition is shuffled
    /// anew. Repeating stops early if a repetition yields no element.
    pub fn repeat(self, count: Option<usize>) -> Dataset {
        Dataset::new(Node::Repeat { input: self, count })
    }

    /// At most the first `n` elements.
    pub fn take(self, n: usize) -> Dataset {
        Dataset::new(Node::Take { input: self, n })
    }

    /// The elements produced on a background thread, up to `buffer_size` ahead of the
    /// consumer, so that preparing the next batch overlaps the training step.
    /// `buffer_size == 0` prefetches nothing (no thread).
    pub fn prefetch(self, buffer_size: usize) -> Dataset {
        Dataset::new(Node::Prefetch {
            input: self,
            n: buffer_size,
        })
    }

    /// Number of elements in one epoch; `None` when the dataset repeats forever (or is
    /// misconfigured, which [`Dataset::iter_epoch`] reports).
    pub fn cardinality(&self) -> Option<usize> {
        match &*self.node {
            Node::Slices(s) => Some(s.rows),
            Node::Shuffle { input, .. }
            | Node::Map { input, .. }
            | Node::MapEpoch { input, .. }
            | Node::Cache { input, .. }
            | Node::Prefetch { input, .. } => input.cardinality(),
            Node::Batch {
                input,
                size,
                drop_remainder,
            } => match (*size, input.cardinality()?) {
                (0, _) => None,
                (b, n) if *drop_remainder => Some(n / b),
                (b, n) => Some(n.div_ceil(b)),
            },
            Node::Repeat { input, count } => match (input.cardinality()?, count) {
                (0, _) => Some(0),
                (n, Some(c)) => n.checked_mul(*c),
                (_, None) => None,
            },
            Node::Take { input, n } => Some(input.cardinality().map_or(*n, |m| m.min(*n))),
        }
    }

    /// The elements of epoch `epoch`. Shuffles are seeded from their seed and `epoch`, so
    /// the same epoch always gives the same sequence. Errors here are configuration
    /// errors (a zero batch or buffer size); errors while running arrive as `Err` items,
    /// after which the iterator ends.
    pub fn iter_epoch(&self, epoch: u64) -> Result<DatasetIter> {
        Ok(DatasetIter {
            inner: self.elements(epoch)?,
            done: false,
        })
    }

    /// The element stream of this stage for iteration key `key` (the epoch, or a
    /// repetition of it).
    fn elements(&self, key: u64) -> Result<ElemIter> {
        Ok(match &*self.node {
            Node::Slices(source) => {
                let source = source.clone();
                Box::new((0..source.rows).map(move |index| {
                    Ok(Elem::Row {
                        source: source.clone(),
                        index,
                    })
                }))
            }
            Node::Shuffle {
                input,
                buffer,
                seed,
            } => {
                at_least_one("shuffle", "buffer size", *buffer)?;
                shuffle::shuffle(input.elements(key)?, *buffer, *seed, key)
            }
            Node::Batch {
                input,
                size,
                drop_remainder,
            } => {
                at_least_one("batch", "batch size", *size)?;
                batch::batch(input.elements(key)?, *size, *drop_remainder)
            }
            Node::Map { input, f } => {
                let f = f.clone();
                Box::new(
                    input
                        .elements(key)?
                        .map(move |e| f(e?.into_tensors()?).map(Elem::Tensors)),
                )
            }
            Node::MapEpoch { input, f } => {
                let f = f.clone();
                Box::new(
                    input
                        .elements(key)?
                        .map(move |e| f(key, e?.into_tensors()?).map(Elem::Tensors)),
                )
            }
            Node::Cache { input, store } => store.elements(input, key)?,
            Node::Repeat { input, count } => repeat::repeat(input.clone(), *count, key)?,
            Node::Take { input, n } => Box::new(input.elements(key)?.take(*n)),
            Node::Prefetch { input, n: 0 } => input.elements(key)?,
            Node::Prefetch { input, n } => prefetch::prefetch(input.elements(key)?, *n)?,
        })
    }
}

impl fmt::Debug for Dataset {
    /// The pipeline, source first: `Dataset(slices [8000, 28, 28] f32, [8000] i64 ->
    /// shuffle(10000, seed 1) -> batch(64) -> prefetch(2))`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn stages(d: &Dataset, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let input = match &*d.node {
                Node::Slices(s) => {
                    let parts: Vec<String> = s
                        .tensors
                        .iter()
                        .map(|t| format!("{:?} {}", t.dims(), t.dtype()))
                        .collect();
                    return write!(f, "slices {}", parts.join(", "));
                }
                Node::Shuffle { input, .. }
                | Node::Batch { input, .. }
                | Node::Map { input, .. }
                | Node::MapEpoch { input, .. }
                | Node::Cache { input, .. }
                | Node::Repeat { input, .. }
                | Node::Take { input, .. }
                | Node::Prefetch { input, .. } => input,
            };
            stages(input, f)?;
            match &*d.node {
                Node::Shuffle { buffer, seed, .. } => {
                    write!(f, " -> shuffle({buffer}, seed {seed})")
                }
                Node::Batch {
                    size,
                    drop_remainder,
                    ..
                } => write!(
                    f,
                    " -> batch({size}{})",
                    if *drop_remainder {
                        ", drop remainder"
                    } else {
                        ""
                    }
                ),
                Node::Map { .. } => write!(f, " -> map"),
                Node::MapEpoch { .. } => write!(f, " -> map(with epoch)"),
                Node::Cache { .. } => write!(f, " -> cache"),
                Node::Repeat { count: Some(c), .. } => write!(f, " -> repeat({c})"),
                Node::Repeat { count: None, .. } => write!(f, " -> repeat(forever)"),
                Node::Take { n, .. } => write!(f, " -> take({n})"),
                Node::Prefetch { n, .. } => write!(f, " -> prefetch({n})"),
                Node::Slices(_) => Ok(()),
            }
        }
        write!(f, "Dataset(")?;
        stages(self, f)?;
        write!(f, ")")
    }
}

/// The elements of one epoch of a [`Dataset`], each a `Vec<Tensor>` (one tensor per
/// source tensor, or whatever the last `map` returned). Ends after the first error.
/// Dropping it stops any prefetch thread.
pub struct DatasetIter {
    inner: ElemIter,
    done: bool,
}

impl Iterator for DatasetIter {
    type Item = Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.inner.next()?.and_then(Elem::into_tensors);
        self.done = item.is_err();
        Some(item)
    }
}

impl fmt::Debug for DatasetIter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatasetIter")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// A [`DataError::ZeroArgument`] when the argument `what` of `op` is 0.
fn at_least_one(op: &'static str, what: &'static str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(DataError::ZeroArgument { op, what });
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use mirra_tensor::Device;

    /// A dataset of `n` rows: `x[i] = [i, -i]` (i64), `y[i] = i` (i64).
    pub(crate) fn numbered(n: usize) -> Dataset {
        let x: Vec<i64> = (0..n as i64).flat_map(|i| [i, -i]).collect();
        let y: Vec<i64> = (0..n as i64).collect();
        Dataset::from_tensor_slices(vec![
            Tensor::from_vec(x, &[n, 2], Device::Cpu).unwrap(),
            Tensor::from_vec(y, &[n], Device::Cpu).unwrap(),
        ])
        .unwrap()
    }

    /// All elements of one epoch, each as the values of its tensors.
    pub(crate) fn collect(ds: &Dataset, epoch: u64) -> Vec<Vec<Vec<i64>>> {
        ds.iter_epoch(epoch)
            .unwrap()
            .map(|e| {
                e.unwrap()
                    .iter()
                    .map(|t| t.to_vec::<i64>().unwrap())
                    .collect()
            })
            .collect()
    }

    /// The `y` values of one epoch, flattened over batches.
    pub(crate) fn labels(ds: &Dataset, epoch: u64) -> Vec<i64> {
        collect(ds, epoch)
            .into_iter()
            .flat_map(|e| e[1].clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use mirra_tensor::{DType, Device};

    use super::testing::{collect, labels, numbered};
    use super::*;

    #[test]
    fn slices_yield_rows_with_the_row_shape() {
        let ds = numbered(3);
        assert_eq!(ds.cardinality(), Some(3));
        let epoch: Vec<Vec<Tensor>> = ds.iter_epoch(0).unwrap().map(Result::unwrap).collect();
        assert_eq!(epoch.len(), 3);
        assert_eq!(epoch[2][0].dims(), &[2]);
        assert_eq!(epoch[2][1].dims(), &[] as &[usize]);
        assert_eq!(collect(&ds, 0)[2], vec![vec![2, -2], vec![2]]);
    }

    #[test]
    fn from_tensor_slices_rejects_bad_inputs() {
        let t = |dims: &[usize]| Tensor::zeros(dims, DType::F32, Device::Cpu).unwrap();
        let e = Dataset::from_tensor_slices(vec![t(&[4, 2]), t(&[3])]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "from_tensor_slices: tensor 1 has shape [3] but tensor 0 has shape [4, 2]: \
             their first dimensions (3 and 4) must agree"
        );
        let e = Dataset::from_tensor_slices(vec![t(&[4]), t(&[])]).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("from_tensor_slices: tensor 1 is a scalar"));
        let e = Dataset::from_tensor_slices(vec![]).unwrap_err();
        assert_eq!(e.to_string(), "from_tensor_slices: no tensors given");
    }

    #[test]
    fn zero_sizes_are_reported_when_iterating() {
        let e = numbered(4).batch(0, false).iter_epoch(0).unwrap_err();
        assert_eq!(e.to_string(), "batch: batch size must be at least 1, got 0");
        let e = numbered(4)
            .shuffle(0, 1)
            .batch(2, false)
            .iter_epoch(0)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "shuffle: buffer size must be at least 1, got 0"
        );
    }

    #[test]
    fn map_applies_to_examples_or_batches() {
        let double = |v: Vec<Tensor>| -> Result<Vec<Tensor>> {
            let y = v[1].to_dtype(DType::F64)?.to_vec::<f64>()?;
            let y2: Vec<i64> = y.iter().map(|&v| 2 * v as i64).collect();
            Ok(vec![Tensor::from_vec(y2, v[1].dims(), Device::Cpu)?])
        };
        let per_example = numbered(5).map(double).batch(2, false);
        let per_batch = numbered(5).batch(2, false).map(double);
        for ds in [per_example, per_batch] {
            let got: Vec<Vec<i64>> = collect(&ds, 0).into_iter().map(|e| e[0].clone()).collect();
            assert_eq!(got, vec![vec![0, 2], vec![4, 6], vec![8]]);
            assert_eq!(ds.cardinality(), Some(3));
        }
    }

    #[test]
    fn a_map_error_ends_the_epoch_with_that_error() {
        let ds = numbered(5).map(|v| {
            if v[1].to_vec::<i64>()?[0] == 2 {
                Err(DataError::ZeroArgument {
                    op: "test",
                    what: "x",
                })
            } else {
                Ok(v)
            }
        });
        let items: Vec<_> = ds.iter_epoch(0).unwrap().collect();
        assert_eq!(items.len(), 3);
        assert!(items[2].is_err());
    }

    #[test]
    fn take_and_repeat_counts() {
        let ds = numbered(5);
        assert_eq!(labels(&ds.clone().take(3), 0), [0, 1, 2]);
        assert_eq!(ds.clone().take(9).cardinality(), Some(5));
        let rep = ds.clone().repeat(Some(3));
        assert_eq!(rep.cardinality(), Some(15));
        assert_eq!(labels(&rep, 0).len(), 15);
        let forever = ds.clone().repeat(None);
        assert_eq!(forever.cardinality(), None);
        let first = forever.clone().take(12);
        assert_eq!(first.cardinality(), Some(12));
        assert_eq!(labels(&first, 0), [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]);
        assert_eq!(forever.batch(4, false).take(4).cardinality(), Some(4));
        assert_eq!(ds.repeat(Some(0)).cardinality(), Some(0));
    }

    #[test]
    fn datasets_are_cheap_shareable_values() {
        fn send_sync<T: Send + Sync + Clone>() {}
        send_sync::<Dataset>();
        fn send<T: Send>() {}
        send::<DatasetIter>();
        let ds = numbered(8000)
            .shuffle(10_000, 1)
            .batch(64, true)
            .prefetch(2);
        assert_eq!(
            format!("{ds:?}"),
            "Dataset(slices [8000, 2] i64, [8000] i64 -> shuffle(10000, seed 1) -> \
             batch(64, drop remainder) -> prefetch(2))"
        );
        assert_eq!(ds.cardinality(), Some(125));
    }

    proptest::proptest! {
        #[test]
        fn one_epoch_of_batches_is_a_permutation_of_the_rows(
            n in 0usize..300,
            batch in 1usize..40,
            buffer in 1usize..400,
            drop_remainder: bool,
            seed: u64,
            epoch in 0u64..5,
        ) {
            let ds = numbered(n).shuffle(buffer, seed).batch(batch, drop_remainder);
            let batches = collect(&ds, epoch);
            proptest::prop_assert_eq!(Some(batches.len()), ds.cardinality());
            let mut rows = Vec::new();
            for b in &batches {
                let size = b[1].len();
                proptest::prop_assert!(size == batch || (!drop_remainder && size < batch));
                for (k, &y) in b[1].iter().enumerate() {
                    proptest::prop_assert_eq!(&b[0][2 * k..2 * k + 2], &[y, -y]);
                    rows.push(y);
                }
            }
            let kept = if drop_remainder { n / batch * batch } else { n };
            proptest::prop_assert_eq!(rows.len(), kept);
            rows.sort_unstable();
            rows.dedup();
            proptest::prop_assert_eq!(rows.len(), kept);
            if !drop_remainder {
                proptest::prop_assert_eq!(rows, (0..n as i64).collect::<Vec<_>>());
            }
        }
    }
}
