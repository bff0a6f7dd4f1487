//! The reference recipe's input pipelines and its optimizer under a dtype policy: what
//! `mirra train` feeds and steps its model with, shared with `cargo xtask bench` so that the
//! benchmark measures what a user's run costs.

use mirra_data::{pixels_to_unit_f32, Augment, DataError, Dataset, ImageFolder, Result, Split};
use mirra_device::DType;
use mirra_tensor::{Device, Tensor};

/// Shuffle buffer: the whole training split of MNIST, a uniform permutation per epoch.
pub const SHUFFLE_BUFFER: usize = 60_000;
/// Batches prepared ahead of the training step on a background thread.
pub const PREFETCH: usize = 2;

/// Where a split's examples are: in memory, or, for an [`ImageFolder`], files read as each
/// batch forms (the split's `pixels` are then the files' indices).
#[derive(Clone, Copy, Debug, Default)]
pub enum Examples<'a> {
    /// The split's tensors hold the examples.
    #[default]
    InMemory,
    /// The split's `pixels` are indices of this folder's files.
    Files(&'a ImageFolder),
}

/// The first stages of every pipeline: the split's rows (and `more` tensors beside them),
/// shuffled when `seed` is given, batched, the files of each batch read, `u8` pixels made
/// `f32` in `[0, 1]` (float examples are used as they are).
fn batches(
    split: &Split,
    more: Option<Tensor>,
    examples: Examples<'_>,
    batch_size: usize,
    seed: Option<u64>,
) -> Result<Dataset> {
    let mut tensors = vec![split.pixels.clone(), split.labels.clone()];
    tensors.extend(more);
    let mut ds = Dataset::from_tensor_slices(tensors)?;
    if let Some(seed) = seed {
        ds = ds.shuffle(SHUFFLE_BUFFER, seed);
    }
    ds = ds.batch(batch_size, false);
    let pixels = match examples {
        Examples::InMemory => split.pixels.dtype(),
        Examples::Files(folder) => {
            ds = ds.map(folder.reader());
            DType::U8
        }
    };
    Ok(if pixels == DType::U8 {
        ds.map(pixels_to_unit_f32)
    } else {
        ds
    })
}

/// The training pipeline: shuffled with `seed` (a new order every epoch), batched
/// (the last batch partial), images kept as stored (`u8`) and made `f32` in `[0, 1]` as
/// each batch forms, prepared ahead on a background thread.
pub fn train_pipeline(
    split: &Split,
    examples: Examples<'_>,
    batch_size: usize,
    seed: u64,
) -> Result<Dataset> {
    Ok(batches(split, None, examples, batch_size, Some(seed))?.prefetch(PREFETCH))
}

/// [`train_pipeline`] with each training image augmented ([`Augment`]) as its batch forms,
/// drawn from `augment`'s seed, the epoch and the image's index in `split` (never its
/// batch or replica: a resumed run and any replica count see the same images).
pub fn augmented_train_pipeline(
    split: &Split,
    examples: Examples<'_>,
    batch_size: usize,
    seed: u64,
    augment: Augment,
) -> Result<Dataset> {
    let n = split.labels.dims()[0];
    let index = Tensor::from_vec((0..n as i64).collect(), &[n], Device::Cpu)?;
    Ok(
        batches(split, Some(index), examples, batch_size, Some(seed))?
            .map_with_epoch(move |epoch, mut batch| {
                let index = batch.pop().ok_or(DataError::Incompatible {
                    op: "augment",
                    msg: "a batch without its indices".into(),
                })?;
                batch[0] = augment.apply(epoch, &batch[0], &index)?;
                Ok(batch)
            })
            .prefetch(PREFETCH),
    )
}

/// The evaluation pipeline: in order, batches of `batch_size`, `f32` images.
pub fn eval_pipeline(split: &Split, examples: Examples<'_>, batch_size: usize) -> Result<Dataset> {
    Ok(batches(split, None, examples, batch_size, None)?.prefetch(PREFETCH))
}

/// `optimizer` as a model under `policy` needs it: behind dynamic loss scaling for
/// `mixed_float16` (float16 gradients underflow below 6e-8), as Keras's `compile` wraps it;
/// as it is otherwise.
pub fn optimizer_for(
    policy: mirra_nn::Policy,
    optimizer: Box<dyn mirra_optim::Optimizer>,
) -> Box<dyn mirra_optim::Optimizer> {
    match policy {
        mirra_nn::Policy::MixedFloat16 => Box::new(mirra_optim::LossScaleOptimizer::new(optimizer)),
        _ => optimizer,
    }
}
