//! The reference recipe's input pipelines: what `mirra train` feeds its model, shared with
//! `cargo xtask bench` so that the benchmark measures what a user's run costs.

use mirra_data::{pixels_to_unit_f32, Augment, DataError, Dataset, Result, Split};
use mirra_tensor::{Device, Tensor};

/// Shuffle buffer: the whole training split of MNIST, a uniform permutation per epoch.
pub const SHUFFLE_BUFFER: usize = 60_000;
/// Batches prepared ahead of the training step on a background thread.
pub const PREFETCH: usize = 2;

/// The training pipeline: shuffled with `seed` (a new order every epoch), batched
/// (the last batch partial), images kept as stored (`u8`) and made `f32` in `[0, 1]` as
/// each batch forms, prepared ahead on a background thread.
pub fn train_pipeline(split: &Split, batch_size: usize, seed: u64) -> Result<Dataset> {
    Ok(
        Dataset::from_tensor_slices(vec![split.pixels.clone(), split.labels.clone()])?
            .shuffle(SHUFFLE_BUFFER, seed)
            .batch(batch_size, false)
            .map(pixels_to_unit_f32)
            .prefetch(PREFETCH),
    )
}

/// [`train_pipeline`] with each training image augmented ([`Augment`]) as its batch forms,
/// drawn from `augment`'s seed, the epoch and the image's index in `split` (never its
/// batch or replica: a resumed run and any replica count see the same images).
pub fn augmented_train_pipeline(
    split: &Split,
    batch_size: usize,
    seed: u64,
    augment: Augment,
) -> Result<Dataset> {
    let n = split.labels.dims()[0];
    let index = Tensor::from_vec((0..n as i64).collect(), &[n], Device::Cpu)?;
    Ok(
        Dataset::from_tensor_slices(vec![split.pixels.clone(), split.labels.clone(), index])?
            .shuffle(SHUFFLE_BUFFER, seed)
            .batch(batch_size, false)
            .map(pixels_to_unit_f32)
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
pub fn eval_pipeline(split: &Split, batch_size: usize) -> Result<Dataset> {
    Ok(
        Dataset::from_tensor_slices(vec![split.pixels.clone(), split.labels.clone()])?
            .batch(batch_size, false)
            .map(pixels_to_unit_f32)
            .prefetch(PREFETCH),
    )
}
