//! Image augmentation as a pipeline stage: random translation (with zero padding), small
//! rotation, brightness and contrast, and optionally a horizontal flip (off for digits),
//! each example drawn from its own generator seeded by the run's seed, the epoch and the
//! example's index in the data set, never by its batch or replica: a resumed run, and any
//! number of replicas, see the same augmented examples.
//!
//! Geometry is nearest-neighbour: an output pixel takes the input pixel its inverse
//! rotation and shift land on (zero outside the image), so pixel values are only moved.
//! Brightness adds `b`, contrast scales around the image's mean by `k`; values are then
//! clamped to `[0, 1]`.

use rand::{RngExt as _, SeedableRng};

use mirra_device::{Buffer, DType, Device};
use mirra_tensor::init::{mix, Rng};
use mirra_tensor::Tensor;

use crate::{DataError, Result};

/// The random transformations of [`Augment::apply`] and their ranges.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Augment {
    /// Shifts of up to this many pixels, down/up and right/left.
    pub max_shift: usize,
    /// Rotations of up to this many degrees, either way.
    pub max_rotation_deg: f32,
    /// Brightness: `+b` with `|b|` up to this.
    pub max_brightness: f32,
    /// Contrast: `k` within `1 ± this`.
    pub max_contrast: f32,
    /// Mirror left-right with probability 1/2.
    pub flip: bool,
    /// The run's seed.
    pub seed: u64,
}

impl Augment {
    /// For digits: shifts of 2 pixels, 10 degrees, brightness and contrast of 10%, no flip
    /// (a mirrored digit is another symbol).
    pub fn digits(seed: u64) -> Augment {
        Augment {
            max_shift: 2,
            max_rotation_deg: 10.0,
            max_brightness: 0.1,
            max_contrast: 0.1,
            flip: false,
            seed,
        }
    }

    /// The generator of example `index` in `epoch` (SplitMix64 of the three, so that close
    /// indices and epochs get unrelated streams).
    fn rng(&self, epoch: u64, index: u64) -> Rng {
        Rng::seed_from_u64(mix(self.seed ^ epoch.rotate_left(29), index))
    }

    /// Augmented copies of `images` (`f32`, `[b, h, w]` or `[b, h, w, c]`, values in
    /// `[0, 1]`), example `i` drawn for `epoch` and data-set index `index[i]` (`i64`,
    /// `[b]`).
    pub fn apply(&self, epoch: u64, images: &Tensor, index: &Tensor) -> Result<Tensor> {
        let op = "augment";
        let dims = images.dims();
        if images.dtype() != DType::F32 || !(dims.len() == 3 || dims.len() == 4) {
            return Err(DataError::Incompatible {
                op,
                msg: format!(
                    "expected f32 images [b, h, w] or [b, h, w, c], got {} {dims:?}",
                    images.dtype()
                ),
            });
        }
        let (b, h, w) = (dims[0], dims[1], dims[2]);
        let c = dims.get(3).copied().unwrap_or(1);
        if index.dims() != [b] || index.dtype() != DType::I64 {
            return Err(DataError::Incompatible {
                op,
                msg: format!(
                    "expected i64 indices [{b}], got {} {:?}",
                    index.dtype(),
                    index.dims()
                ),
            });
        }
        let src = images.contiguous()?;
        let src = src.as_slice::<f32>()?;
        let idx = index.contiguous()?;
        let idx = idx.as_slice::<i64>()?;
        let mut out = Buffer::zeros(DType::F32, src.len(), Device::Cpu)
            .map_err(mirra_tensor::TensorError::from)?;
        let dst = out
            .as_mut_slice::<f32>()
            .map_err(mirra_tensor::TensorError::from)?;
        let per = h * w * c;
        let (cy, cx) = ((h as f32 - 1.0) / 2.0, (w as f32 - 1.0) / 2.0);
        for (e, (from, to)) in src
            .chunks_exact(per.max(1))
            .zip(dst.chunks_exact_mut(per.max(1)))
            .enumerate()
        {
            let mut rng = self.rng(epoch, idx[e] as u64);
            let s = self.max_shift as i64;
            let dy = rng.random_range(-s..=s) as f32;
            let dx = rng.random_range(-s..=s) as f32;
            let r = self.max_rotation_deg.to_radians();
            let theta = if r > 0.0 {
                rng.random_range(-r..=r)
            } else {
                0.0
            };
            let brightness = if self.max_brightness > 0.0 {
                rng.random_range(-self.max_brightness..=self.max_brightness)
            } else {
                0.0
            };
            let contrast = if self.max_contrast > 0.0 {
                1.0 + rng.random_range(-self.max_contrast..=self.max_contrast)
            } else {
                1.0
            };
            let flip = self.flip && rng.random_bool(0.5);
            let (sin, cos) = theta.sin_cos();
            for y in 0..h {
                for x in 0..w {
                    // The input pixel this output pixel comes from: undo the shift, then the
                    // rotation about the centre, then the flip.
                    let (py, px) = (y as f32 - dy - cy, x as f32 - dx - cx);
                    let sy = cos * py + sin * px + cy;
                    let mut sx = -sin * py + cos * px + cx;
                    if flip {
                        sx = w as f32 - 1.0 - sx;
                    }
                    let (iy, ix) = (sy.round(), sx.round());
                    if iy < 0.0 || ix < 0.0 || iy >= h as f32 || ix >= w as f32 {
                        continue;
                    }
                    let (iy, ix) = (iy as usize, ix as usize);
                    let at = (y * w + x) * c;
                    let from_at = (iy * w + ix) * c;
                    to[at..at + c].copy_from_slice(&from[from_at..from_at + c]);
                }
            }
            let mean = to.iter().sum::<f32>() / per.max(1) as f32;
            for v in to.iter_mut() {
                *v = ((*v - mean) * contrast + mean + brightness).clamp(0.0, 1.0);
            }
        }
        Ok(Tensor::from_buffer(out, dims)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(b: usize) -> (Tensor, Tensor) {
        let v: Vec<f32> = (0..b * 8 * 8)
            .map(|i| ((i * 37) % 17) as f32 / 16.0)
            .collect();
        let x = Tensor::from_vec(v, &[b, 8, 8], Device::Cpu).unwrap();
        let i =
            Tensor::from_vec((0..b as i64).map(|k| 100 + k).collect(), &[b], Device::Cpu).unwrap();
        (x, i)
    }

    #[test]
    fn draws_depend_on_seed_epoch_and_index_not_on_the_batch() {
        let a = Augment::digits(7);
        let (x, i) = images(4);
        let once = a.apply(3, &x, &i).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(once, a.apply(3, &x, &i).unwrap().to_vec::<f32>().unwrap());
        assert_ne!(once, a.apply(4, &x, &i).unwrap().to_vec::<f32>().unwrap());
        assert_ne!(
            once,
            Augment::digits(8)
                .apply(3, &x, &i)
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
        );
        // Example 2 alone, in a batch of its own, is augmented as it was in the batch.
        let x2 = x.narrow(0, 2, 1).unwrap();
        let i2 = i.narrow(0, 2, 1).unwrap();
        let alone = a.apply(3, &x2, &i2).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(alone, once[2 * 64..3 * 64]);
        assert!(once.iter().all(|v| (0.0..=1.0).contains(v)));
    }

    #[test]
    fn with_nothing_drawn_an_image_is_unchanged_and_a_shift_moves_pixels() {
        let none = Augment {
            max_shift: 0,
            max_rotation_deg: 0.0,
            max_brightness: 0.0,
            max_contrast: 0.0,
            flip: false,
            seed: 1,
        };
        let (x, i) = images(3);
        assert_eq!(
            none.apply(0, &x, &i).unwrap().to_vec::<f32>().unwrap(),
            x.to_vec::<f32>().unwrap()
        );
        // A single lit pixel moves by at most the shift, keeping its value.
        let shift = Augment {
            max_shift: 2,
            ..none
        };
        let mut v = vec![0.0f32; 64];
        v[3 * 8 + 4] = 1.0;
        let one = Tensor::from_vec(v, &[1, 8, 8], Device::Cpu).unwrap();
        for k in 0..20 {
            let idx = Tensor::from_vec(vec![k as i64], &[1], Device::Cpu).unwrap();
            let out = shift.apply(0, &one, &idx).unwrap().to_vec::<f32>().unwrap();
            let lit: Vec<usize> = (0..64).filter(|&p| out[p] == 1.0).collect();
            assert_eq!(lit.len(), 1, "{out:?}");
            let (y, x) = (lit[0] / 8, lit[0] % 8);
            assert!(y.abs_diff(3) <= 2 && x.abs_diff(4) <= 2, "({y}, {x})");
        }
    }

    #[test]
    fn bad_inputs_are_errors_naming_them() {
        let a = Augment::digits(1);
        let (x, _) = images(2);
        let wrong = Tensor::from_vec(vec![0i64; 3], &[3], Device::Cpu).unwrap();
        let e = a.apply(0, &x, &wrong).unwrap_err().to_string();
        assert!(e.contains("expected i64 indices [2]"), "{e}");
        let flat = Tensor::zeros(&[2, 64], DType::F32, Device::Cpu).unwrap();
        assert!(a
            .apply(0, &flat, &wrong)
            .unwrap_err()
            .to_string()
            .contains("expected f32 images"));
    }
}
