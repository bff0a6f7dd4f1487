//! Synthetic image batches for throughput runs (ResNet-50 on ImageNet-shaped batches, as
//! TensorFlow's and PyTorch's benchmarks do with `--synthetic`): what a step costs does not
//! depend on what the pixels show.

use rand::{RngExt as _, SeedableRng};

use mirra_device::Device;
use mirra_tensor::init::{mix, Rng};
use mirra_tensor::Tensor;

use crate::{DataError, Result, Split};

/// `count` images of shape `image` (`u8` pixels, uniform in `0..=255`) with `i64` labels
/// uniform in `0..classes`, drawn from `seed` (the same set on every run and machine).
pub fn synthetic_images(count: usize, image: &[usize], classes: usize, seed: u64) -> Result<Split> {
    if classes == 0 || image.contains(&0) {
        return Err(DataError::Incompatible {
            op: "synthetic_images",
            msg: format!("images {image:?} and {classes} classes must be non-empty"),
        });
    }
    let size: usize = image.iter().product();
    let mut rng = Rng::seed_from_u64(mix(seed ^ 0x5_1e7, 0));
    let pixels: Vec<u8> = (0..count * size).map(|_| rng.random()).collect();
    let labels: Vec<i64> = (0..count)
        .map(|_| rng.random_range(0..classes) as i64)
        .collect();
    let mut dims = vec![count];
    dims.extend_from_slice(image);
    Ok(Split {
        pixels: Tensor::from_vec(pixels, &dims, Device::Cpu)?,
        labels: Tensor::from_vec(labels, &[count], Device::Cpu)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_sets_have_the_shape_asked_and_are_reproducible() {
        let a = synthetic_images(5, &[4, 4, 3], 1000, 2).unwrap();
        assert_eq!((a.pixels.dims(), a.len()), (&[5, 4, 4, 3][..], 5));
        let labels = a.labels.to_vec::<i64>().unwrap();
        assert!(labels.iter().all(|&l| (0..1000).contains(&l)));
        let b = synthetic_images(5, &[4, 4, 3], 1000, 2).unwrap();
        assert_eq!(
            b.pixels.to_vec::<u8>().unwrap(),
            a.pixels.to_vec::<u8>().unwrap()
        );
        assert_eq!(b.labels.to_vec::<i64>().unwrap(), labels);
        let c = synthetic_images(5, &[4, 4, 3], 1000, 3).unwrap();
        assert_ne!(
            c.pixels.to_vec::<u8>().unwrap(),
            a.pixels.to_vec::<u8>().unwrap()
        );
        assert!(synthetic_images(5, &[4, 0, 3], 1000, 2).is_err());
        assert!(synthetic_images(5, &[4, 4, 3], 0, 2).is_err());
    }
}
