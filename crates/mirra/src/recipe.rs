//! The reference recipe's input pipelines and its optimizer under a dtype policy: what
//! `mirra train` feeds and steps its model with, shared with `cargo xtask bench` so that the
//! benchmark measures what a user's run costs.

use mirra_data::{
    pixels_to_unit_f32, Augment, Canvases, DataError, Dataset, ImageFolder, Result, Split,
};
use mirra_device::DType;
use mirra_tensor::init::mix;
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

/// [`train_pipeline`] whose batches `stage` rewrites by the epoch and the examples'
/// indices in `split` (never their batch or replica: a resumed run and any replica count
/// see the same examples); `op` names the stage in errors.
fn train_pipeline_by_index(
    split: &Split,
    examples: Examples<'_>,
    batch_size: usize,
    seed: u64,
    op: &'static str,
    stage: impl Fn(u64, &Tensor, &mut Vec<Tensor>) -> Result<()> + Send + Sync + 'static,
) -> Result<Dataset> {
    let n = split.labels.dims()[0];
    let index = Tensor::from_vec((0..n as i64).collect(), &[n], Device::Cpu)?;
    Ok(
        batches(split, Some(index), examples, batch_size, Some(seed))?
            .map_with_epoch(move |epoch, mut batch| {
                let index = batch.pop().ok_or(DataError::Incompatible {
                    op,
                    msg: "a batch without its indices".into(),
                })?;
                stage(epoch, &index, &mut batch)?;
                Ok(batch)
            })
            .prefetch(PREFETCH),
    )
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
    train_pipeline_by_index(
        split,
        examples,
        batch_size,
        seed,
        "augment",
        move |epoch, index, batch| {
            batch[0] = augment.apply(epoch, &batch[0], index)?;
            Ok(())
        },
    )
}

/// [`train_pipeline`] for canvases drawn from digits (the U-Nets' data): epoch 0 trains on
/// `split`, the canvases `canvases` drew from `seed`; every later epoch `e` on fresh
/// ones, canvas `i` drawn from `seed` mixed with `e`, and `i` (never its batch or replica:
/// a resumed run and any replica count see the same canvases). The order of the indices
/// is [`train_pipeline`]'s, shuffled with `shuffle_seed`.
pub fn fresh_canvas_train_pipeline(
    split: &Split,
    canvases: Canvases,
    seed: u64,
    batch_size: usize,
    shuffle_seed: u64,
) -> Result<Dataset> {
    let stage = move |epoch: u64, index: &Tensor, batch: &mut Vec<Tensor>| {
        if epoch > 0 {
            let indices = index.to_vec::<i64>()?;
            let fresh = canvases.draw(
                mix(seed, epoch),
                indices.iter().map(|&i| u64::try_from(i).unwrap_or(0)),
            )?;
            let mut fresh = pixels_to_unit_f32(vec![fresh.pixels, fresh.labels])?.into_iter();
            if let (Some(images), Some(masks)) = (fresh.next(), fresh.next()) {
                batch[0] = images;
                batch[1] = masks;
            }
        }
        Ok(())
    };
    train_pipeline_by_index(
        split,
        Examples::InMemory,
        batch_size,
        shuffle_seed,
        "fresh canvases",
        stage,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Twelve "digits": digit `d` a block of pixels `40 + 18 d` (bright from `d = 5`) at a
    /// place of its own, so that canvases differ.
    fn digits() -> Split {
        let mut pixels = vec![0u8; 12 * 28 * 28];
        for d in 0..12 {
            for r in d..d + 12 {
                for c in 4..4 + d + 4 {
                    pixels[d * 784 + r * 28 + c] = (40 + 18 * d) as u8;
                }
            }
        }
        Split {
            pixels: Tensor::from_vec(pixels, &[12, 28, 28], Device::Cpu).unwrap(),
            labels: Tensor::from_vec(
                (0..12).map(|d| d % 10).collect::<Vec<i64>>(),
                &[12],
                Device::Cpu,
            )
            .unwrap(),
        }
    }

    /// The masks of one epoch, batch after batch, as bytes.
    fn masks(ds: &Dataset, epoch: u64) -> Vec<u8> {
        ds.iter_epoch(epoch)
            .unwrap()
            .flat_map(|b| b.unwrap()[1].to_vec::<u8>().unwrap())
            .collect()
    }

    /// The canvas masks of `split`, sorted (an epoch's set, whatever its order).
    fn sorted(masks: &[u8]) -> Vec<&[u8]> {
        let mut rows: Vec<&[u8]> = masks.chunks(56 * 56).collect();
        rows.sort();
        rows
    }

    #[test]
    fn fresh_canvases_are_drawn_per_epoch_and_index_whatever_the_batch() {
        let drawer = Canvases::new("test", &digits(), 1).unwrap();
        let split = drawer.draw(5, 0..10).unwrap();
        let pipeline =
            |batch| fresh_canvas_train_pipeline(&split, drawer.clone(), 5, batch, 9).unwrap();
        let (by3, by4) = (pipeline(3), pipeline(4));
        let stored = split.labels.to_vec::<u8>().unwrap();
        // Epoch 0 trains on the stored canvases, epoch 1 on canvases 0..10 of another seed.
        assert_eq!(sorted(&masks(&by3, 0)), sorted(&stored));
        let fresh = drawer
            .draw(mix(5, 1), 0..10)
            .unwrap()
            .labels
            .to_vec::<u8>()
            .unwrap();
        let epoch1 = masks(&by3, 1);
        assert_eq!(sorted(&epoch1), sorted(&fresh));
        assert_ne!(sorted(&epoch1), sorted(&stored));
        // The batch size (a replica's share) does not change which canvas comes when.
        for epoch in 0..3 {
            assert_eq!(masks(&by3, epoch), masks(&by4, epoch), "epoch {epoch}");
        }
        assert_ne!(masks(&by3, 2), epoch1);
    }
}
