//! Segmentation data made from MNIST digits, so that a U-Net trains without a download
//! (issue 16): 2 to 4 digits pasted at random places on a 56x56 canvas, each pixel of a
//! digit above 0.5 labelled with that digit's class (`1 + digit`; 0 is the background),
//! a later digit's pixels winning where two overlap (in the image, the brighter pixel).
//! For the 3D U-Net, volumes of [`VOLUME_DEPTH`] such slices: each digit extruded through
//! a random run of 8 to 24 consecutive slices.
//! Canvases and volumes are drawn from a seed and their index alone, so a data set is the
//! same on every run, replica count and machine; training sets take training digits and
//! validation sets test digits. [`Canvases`] draws any of them, so that training can see
//! fresh canvases every epoch.

use std::sync::Arc;

use rand::{RngExt as _, SeedableRng};

use mirra_device::Device;
use mirra_tensor::init::{mix, Rng};
use mirra_tensor::Tensor;

use crate::{DataError, Result, Split};

/// A canvas's side, in pixels.
pub const CANVAS: usize = 56;
/// Classes of a pixel: the background and ten digits.
pub const CLASSES: usize = 11;
/// Slices of a volume ([`digit_volumes`]).
pub const VOLUME_DEPTH: usize = 32;
/// A digit's side.
const DIGIT: usize = 28;

/// `count` canvases from the digits of `source` (`u8` pixels `[n, 28, 28]`, labels
/// `[n]`): a [`Split`] of `u8` images `[count, 56, 56]` and `u8` masks `[count, 56, 56]`
/// (class ids in `0..11`), canvas `i` drawn from `seed` and `i`.
pub fn digit_canvases(source: &Split, count: usize, seed: u64) -> Result<Split> {
    Canvases::new("digit_canvases", source, 1)?.draw(seed, 0..count as u64)
}

/// `count` volumes from the digits of `source`: `u8` images and masks `[count, 32, 56,
/// 56]`, each digit extruded through 8 to 24 consecutive slices (where two overlap, the
/// later digit's label wins and the brighter pixel shows), volume `i` drawn from `seed`
/// and `i`.
pub fn digit_volumes(source: &Split, count: usize, seed: u64) -> Result<Split> {
    Canvases::new("digit_volumes", source, VOLUME_DEPTH)?.draw(seed, 0..count as u64)
}

/// What draws canvases (or volumes) from a set of digits: any canvas, by seed and index,
/// so that a pipeline can draw fresh ones for each epoch ([`Canvases::draw`]) and the
/// ones [`digit_canvases`] and [`digit_volumes`] hold are those of their seed.
#[derive(Clone, Debug)]
pub struct Canvases {
    /// The digits' pixels, `[n, 28, 28]` row-major, and their classes.
    pixels: Arc<[u8]>,
    labels: Arc<[i64]>,
    /// Slices per image: 1 for canvases, [`VOLUME_DEPTH`] for volumes.
    depth: usize,
}

impl Canvases {
    /// The drawer of images of `depth` slices of 56x56 (one slice: canvases; more: each
    /// digit through a random run of slices) from the digits of `source`; `op` names the
    /// caller in errors.
    pub fn new(op: &'static str, source: &Split, depth: usize) -> Result<Canvases> {
        let n = source.len();
        if n == 0 {
            return Err(DataError::Incompatible {
                op,
                msg: "no digits to draw canvases from".into(),
            });
        }
        let pixels = source.pixels.contiguous()?;
        let pixels = pixels.as_slice::<u8>()?;
        if pixels.len() != n * DIGIT * DIGIT {
            return Err(DataError::Incompatible {
                op,
                msg: format!(
                    "digits of shape {}, expected [n, 28, 28]",
                    source.pixels.shape()
                ),
            });
        }
        let labels = source
            .labels
            .to_dtype(mirra_device::DType::I64)?
            .to_vec::<i64>()?;
        Ok(Canvases {
            pixels: pixels.into(),
            labels: labels.into(),
            depth: depth.max(1),
        })
    }

    /// The images of `indices` under `seed`, in that order: `u8` images and masks `[k,
    /// 56, 56]` (or `[k, depth, 56, 56]`), image `i` drawn from `seed` and `i` alone.
    pub fn draw(&self, seed: u64, indices: impl IntoIterator<Item = u64>) -> Result<Split> {
        let indices: Vec<u64> = indices.into_iter().collect();
        let (n, depth) = (self.labels.len(), self.depth);
        let area = CANVAS * CANVAS;
        let size = depth * area;
        let count = indices.len();
        let (mut images, mut masks) = (vec![0u8; count * size], vec![0u8; count * size]);
        for ((image, mask), index) in images
            .chunks_exact_mut(size)
            .zip(masks.chunks_exact_mut(size))
            .zip(indices)
        {
            let mut rng = canvas_rng(seed, index);
            for _ in 0..rng.random_range(2..=4usize) {
                let d = rng.random_range(0..n);
                let (top, left) = (
                    rng.random_range(0..=CANVAS - DIGIT),
                    rng.random_range(0..=CANVAS - DIGIT),
                );
                let slices = if depth == 1 {
                    0..1
                } else {
                    let run = rng.random_range(depth / 4..=depth * 3 / 4);
                    let first = rng.random_range(0..=depth - run);
                    first..first + run
                };
                let class = (self.labels[d] + 1) as u8;
                let digit = &self.pixels[d * DIGIT * DIGIT..(d + 1) * DIGIT * DIGIT];
                for z in slices {
                    for (r, row) in digit.chunks_exact(DIGIT).enumerate() {
                        let at = z * area + (top + r) * CANVAS + left;
                        for (c, &p) in row.iter().enumerate() {
                            image[at + c] = image[at + c].max(p);
                            if p > 127 {
                                mask[at + c] = class;
                            }
                        }
                    }
                }
            }
        }
        let dims: &[usize] = if depth == 1 {
            &[count, CANVAS, CANVAS]
        } else {
            &[count, depth, CANVAS, CANVAS]
        };
        Ok(Split {
            pixels: Tensor::from_vec(images, dims, Device::Cpu)?,
            labels: Tensor::from_vec(masks, dims, Device::Cpu)?,
        })
    }
}

/// The generator of canvas `index` (SplitMix64 of the seed and the index).
fn canvas_rng(seed: u64, index: u64) -> Rng {
    Rng::seed_from_u64(mix(seed ^ 0x5e6_0000, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four digits: a filled square of 200 (class 3), a thin bar of 100 (never above
    /// 0.5), and so on, so that masks can be checked against the images.
    fn source() -> Split {
        let mut pixels = vec![0u8; 4 * DIGIT * DIGIT];
        for (d, value) in [200u8, 100, 255, 130].into_iter().enumerate() {
            for r in 4..24 {
                for c in 8..20 {
                    pixels[d * DIGIT * DIGIT + r * DIGIT + c] = value;
                }
            }
        }
        Split {
            pixels: Tensor::from_vec(pixels, &[4, DIGIT, DIGIT], Device::Cpu).unwrap(),
            labels: Tensor::from_vec(vec![2i64, 7, 0, 9], &[4], Device::Cpu).unwrap(),
        }
    }

    #[test]
    fn masks_label_bright_digit_pixels_and_canvases_are_reproducible() {
        let a = digit_canvases(&source(), 50, 7).unwrap();
        assert_eq!(a.pixels.dims(), [50, CANVAS, CANVAS]);
        let (img, mask) = (
            a.pixels.to_vec::<u8>().unwrap(),
            a.labels.to_vec::<u8>().unwrap(),
        );
        // A labelled pixel is a bright one; a bright pixel is labelled; the bar (class 8,
        // pixels of 100) is never labelled.
        for (p, m) in img.iter().zip(&mask) {
            assert_eq!(*m != 0, *p > 127, "pixel {p} mask {m}");
            assert!([0, 3, 1, 10].contains(m), "class {m}");
        }
        // Of the four digits only the bar is dark, so nearly every canvas has a label.
        let lit = mask
            .chunks(CANVAS * CANVAS)
            .filter(|c| c.iter().any(|&m| m != 0))
            .count();
        assert!(lit > 40, "{lit} of 50 canvases have a labelled digit");
        let b = digit_canvases(&source(), 50, 7).unwrap();
        assert_eq!(b.pixels.to_vec::<u8>().unwrap(), img);
        assert_eq!(b.labels.to_vec::<u8>().unwrap(), mask);
        let c = digit_canvases(&source(), 50, 8).unwrap();
        assert_ne!(c.labels.to_vec::<u8>().unwrap(), mask);
    }

    #[test]
    fn any_canvas_is_drawn_from_its_seed_and_index_alone() {
        let all = digit_canvases(&source(), 20, 7).unwrap();
        let area = CANVAS * CANVAS;
        let drawer = Canvases::new("test", &source(), 1).unwrap();
        let some = drawer.draw(7, [13u64, 2, 13]).unwrap();
        assert_eq!(some.pixels.dims(), [3, CANVAS, CANVAS]);
        let (all_m, some_m) = (
            all.labels.to_vec::<u8>().unwrap(),
            some.labels.to_vec::<u8>().unwrap(),
        );
        for (k, i) in [13usize, 2, 13].into_iter().enumerate() {
            assert_eq!(
                some_m[k * area..(k + 1) * area],
                all_m[i * area..(i + 1) * area]
            );
        }
        // Another seed, other canvases.
        let other = drawer.draw(8, [13u64, 2, 13]).unwrap();
        assert_ne!(other.labels.to_vec::<u8>().unwrap(), some_m);
    }

    #[test]
    fn volumes_extrude_each_digit_through_a_run_of_slices() {
        let v = digit_volumes(&source(), 20, 3).unwrap();
        assert_eq!(v.pixels.dims(), [20, VOLUME_DEPTH, CANVAS, CANVAS]);
        let (img, mask) = (
            v.pixels.to_vec::<u8>().unwrap(),
            v.labels.to_vec::<u8>().unwrap(),
        );
        let area = CANVAS * CANVAS;
        for (p, m) in img.iter().zip(&mask) {
            assert_eq!(*m != 0, *p > 127, "voxel {p} mask {m}");
        }
        // Each digit reaches 8 to 24 slices: a lit volume has at least 8 lit slices, and
        // some volumes leave slices dark (the runs are not the whole depth).
        let mut partly = 0;
        for volume in mask.chunks(VOLUME_DEPTH * area) {
            let lit = volume
                .chunks(area)
                .filter(|s| s.iter().any(|&m| m != 0))
                .count();
            assert!(lit == 0 || lit >= VOLUME_DEPTH / 4, "{lit} lit slices");
            partly += usize::from(lit > 0 && lit < VOLUME_DEPTH);
        }
        assert!(partly > 5, "{partly} of 20 volumes partly lit");
        assert_eq!(
            digit_volumes(&source(), 20, 3)
                .unwrap()
                .labels
                .to_vec::<u8>()
                .unwrap(),
            mask
        );
    }

    #[test]
    fn no_digits_or_wrong_shapes_are_errors() {
        let empty = Split {
            pixels: Tensor::from_vec(Vec::<u8>::new(), &[0, 28, 28], Device::Cpu).unwrap(),
            labels: Tensor::from_vec(Vec::<i64>::new(), &[0], Device::Cpu).unwrap(),
        };
        assert!(digit_canvases(&empty, 3, 1).is_err());
        let wrong = Split {
            pixels: Tensor::from_vec(vec![0u8; 2 * 14 * 14], &[2, 14, 14], Device::Cpu).unwrap(),
            labels: Tensor::from_vec(vec![1i64, 2], &[2], Device::Cpu).unwrap(),
        };
        let e = digit_canvases(&wrong, 3, 1).unwrap_err().to_string();
        assert!(e.contains("expected [n, 28, 28]"), "{e}");
    }
}
