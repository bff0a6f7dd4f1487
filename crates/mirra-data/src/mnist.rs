//! MNIST from a directory of IDX files.
//!
//! The repository bundles only the 10,000-image test set (`data/mnist/`), so that the
//! examples and tests run offline; that set is split into training (the first 80%: 8,000
//! images) and validation (the last 2,000). A directory with the full set (the four
//! standard files) trains on the 60,000 training images and validates on the 10,000 test
//! images.

use std::path::{Path, PathBuf};

use mirra_tensor::{DType, Device, Tensor};

use crate::{read_idx, DataError, Result};

/// The directory of the MNIST test set bundled with the repository.
pub fn bundled_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/mnist"))
}

/// Images and their labels.
#[derive(Clone, Debug)]
pub struct Split {
    /// `f32` images scaled to `[0, 1]`, shape `[N, 28, 28]`.
    pub images: Tensor,
    /// `i64` class ids in `0..10`, shape `[N]`.
    pub labels: Tensor,
}

impl Split {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.dims().first().copied().unwrap_or(0)
    }

    /// True when the split holds no example.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which files a [`Mnist`] was loaded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MnistSource {
    /// Only the test set: its first 80% trains, the rest validates.
    TestSetSplit,
    /// The full set: 60,000 training images, 10,000 test images for validation.
    Full,
}

/// The MNIST digits, split into training and validation data.
#[derive(Clone, Debug)]
pub struct Mnist {
    /// The training examples.
    pub train: Split,
    /// The validation examples.
    pub validation: Split,
    /// Which files were found.
    pub source: MnistSource,
}

/// Image side length.
const SIDE: usize = 28;
/// Number of classes.
const CLASSES: u8 = 10;

/// The standard file names, without `.gz`, in the underscore-free form.
const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

impl Mnist {
    /// Loads MNIST from `dir`: the full set when its four files are there, else the test
    /// set split 8,000 / 2,000. Each file may be gzipped (`.gz`) and may use the dotted
    /// form of its name (`t10k-images.idx3-ubyte`).
    pub fn load(dir: &Path) -> Result<Mnist> {
        let find = |name: &str| find_file(dir, name);
        let (train_images, train_labels) = (find(TRAIN_IMAGES), find(TRAIN_LABELS));
        let (test_images, test_labels) = (find(TEST_IMAGES), find(TEST_LABELS));
        match (train_images, train_labels, test_images, test_labels) {
            (Some(tri), Some(trl), Some(tei), Some(tel)) => Ok(Mnist {
                train: load_split(&tri, &trl)?,
                validation: load_split(&tei, &tel)?,
                source: MnistSource::Full,
            }),
            (None, None, Some(tei), Some(tel)) => {
                let test = load_split(&tei, &tel)?;
                let n_train = test.len() * 4 / 5;
                let part = |start, len| -> Result<Split> {
                    Ok(Split {
                        images: test.images.narrow(0, start, len)?,
                        labels: test.labels.narrow(0, start, len)?,
                    })
                };
                Ok(Mnist {
                    train: part(0, n_train)?,
                    validation: part(n_train, test.len() - n_train)?,
                    source: MnistSource::TestSetSplit,
                })
            }
            (tri, trl, tei, tel) => {
                // With either training file present the user meant the full set.
                let names = if tri.is_some() || trl.is_some() {
                    &[
                        (tri, TRAIN_IMAGES),
                        (trl, TRAIN_LABELS),
                        (tei, TEST_IMAGES),
                        (tel, TEST_LABELS),
                    ][..]
                } else {
                    &[(tei, TEST_IMAGES), (tel, TEST_LABELS)][..]
                };
                Err(DataError::MissingFiles {
                    dir: dir.to_path_buf(),
                    missing: names
                        .iter()
                        .filter(|(found, _)| found.is_none())
                        .map(|(_, name)| name.to_string())
                        .collect(),
                })
            }
        }
    }
}

/// The first existing file among the accepted spellings of `name` in `dir`.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let dotted = name.replacen("-idx", ".idx", 1);
    let candidates = [
        name.to_string(),
        format!("{name}.gz"),
        dotted.clone(),
        format!("{dotted}.gz"),
    ];
    candidates
        .into_iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

/// Images and labels read from their two files and checked against each other.
fn load_split(images_path: &Path, labels_path: &Path) -> Result<Split> {
    let images = read_idx(images_path)?;
    let labels = read_idx(labels_path)?;
    let unexpected = |path: &Path, expected: &str, t: &Tensor| DataError::Unexpected {
        path: path.to_path_buf(),
        expected: expected.to_string(),
        actual: format!("{} of shape {:?}", t.dtype(), t.dims()),
    };
    let image_shape = "u8 images of shape [N, 28, 28]";
    if images.rank() != 3 {
        return Err(DataError::WrongRank {
            path: images_path.to_path_buf(),
            expected: format!("3 ({image_shape})"),
            actual: images.rank(),
        });
    }
    if images.dtype() != DType::U8 || images.dims()[1..] != [SIDE, SIDE] {
        return Err(unexpected(images_path, image_shape, &images));
    }
    if labels.rank() != 1 {
        return Err(DataError::WrongRank {
            path: labels_path.to_path_buf(),
            expected: "1 (u8 labels of shape [N])".into(),
            actual: labels.rank(),
        });
    }
    if labels.dtype() != DType::U8 {
        return Err(unexpected(labels_path, "u8 labels of shape [N]", &labels));
    }
    let n = images.dims()[0];
    if labels.dims()[0] != n {
        return Err(DataError::CountMismatch {
            images_path: images_path.to_path_buf(),
            images: n,
            labels_path: labels_path.to_path_buf(),
            labels: labels.dims()[0],
        });
    }
    let raw_labels = labels.as_slice::<u8>()?;
    if let Some((i, &l)) = raw_labels.iter().enumerate().find(|(_, &l)| l >= CLASSES) {
        return Err(DataError::Unexpected {
            path: labels_path.to_path_buf(),
            expected: format!("labels in 0..{CLASSES}"),
            actual: format!("label {l} at index {i}"),
        });
    }
    let pixels: Vec<f32> = images
        .as_slice::<u8>()?
        .iter()
        .map(|&p| f32::from(p) / 255.0)
        .collect();
    let labels: Vec<i64> = raw_labels.iter().map(|&l| i64::from(l)).collect();
    Ok(Split {
        images: Tensor::from_vec(pixels, &[n, SIDE, SIDE], Device::Cpu)?,
        labels: Tensor::from_vec(labels, &[n], Device::Cpu)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idx::testing::write_u8;

    #[test]
    fn the_bundled_test_set_splits_8000_2000() {
        let m = Mnist::load(&bundled_dir()).unwrap();
        assert_eq!(m.source, MnistSource::TestSetSplit);
        assert_eq!(m.train.images.dims(), &[8000, 28, 28]);
        assert_eq!(m.train.labels.dims(), &[8000]);
        assert_eq!(m.validation.images.dims(), &[2000, 28, 28]);
        assert_eq!(m.validation.labels.dims(), &[2000]);
        assert_eq!(m.train.images.dtype(), DType::F32);
        assert_eq!(m.train.labels.dtype(), DType::I64);

        let mut hist = [0usize; 10];
        for split in [&m.train, &m.validation] {
            for l in split.labels.to_vec::<i64>().unwrap() {
                hist[l as usize] += 1;
            }
        }
        assert_eq!(
            hist,
            [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
        );

        let pixels = m.train.images.to_vec::<f32>().unwrap();
        let (lo, hi) = pixels
            .iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &p| (lo.min(p), hi.max(p)));
        assert_eq!((lo, hi), (0.0, 1.0));
        let mean = pixels.iter().sum::<f32>() / pixels.len() as f32;
        assert!((0.1..0.15).contains(&mean), "mean pixel {mean}");
    }

    /// Writes `n` images (pixel value = image index) and labels `i % 10`.
    fn write_set(dir: &Path, images: &str, labels: &str, n: u32) {
        let pixels: Vec<u8> = (0..n).flat_map(|i| [i as u8; SIDE * SIDE]).collect();
        write_u8(&dir.join(images), &[n, 28, 28], &pixels);
        let labels_data: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        write_u8(&dir.join(labels), &[n], &labels_data);
    }

    #[test]
    fn four_files_give_the_full_split_in_any_accepted_spelling() {
        let dir = tempfile::tempdir().unwrap();
        write_set(
            dir.path(),
            "train-images.idx3-ubyte.gz",
            "train-labels-idx1-ubyte",
            7,
        );
        write_set(
            dir.path(),
            "t10k-images-idx3-ubyte.gz",
            "t10k-labels.idx1-ubyte",
            3,
        );
        let m = Mnist::load(dir.path()).unwrap();
        assert_eq!(m.source, MnistSource::Full);
        assert_eq!((m.train.len(), m.validation.len()), (7, 3));
        assert_eq!(
            m.train.labels.to_vec::<i64>().unwrap(),
            [0, 1, 2, 3, 4, 5, 6]
        );
        let img = m
            .train
            .images
            .narrow(0, 6, 1)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert!(img.iter().all(|&p| p == 6.0 / 255.0));
    }

    #[test]
    fn the_test_set_alone_splits_80_20() {
        let dir = tempfile::tempdir().unwrap();
        write_set(dir.path(), TEST_IMAGES, TEST_LABELS, 10);
        let m = Mnist::load(dir.path()).unwrap();
        assert_eq!((m.train.len(), m.validation.len()), (8, 2));
        assert_eq!(m.validation.labels.to_vec::<i64>().unwrap(), [8, 9]);
    }

    #[test]
    fn missing_files_are_named_with_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let e = Mnist::load(dir.path()).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{d}: missing {TEST_IMAGES}, {TEST_LABELS} (")),
            "{e}"
        );
        write_u8(&dir.path().join(TRAIN_IMAGES), &[1, 28, 28], &[0; 784]);
        let e = Mnist::load(dir.path()).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "{d}: missing {TRAIN_LABELS}, {TEST_IMAGES}, {TEST_LABELS} ("
            )),
            "{e}"
        );
    }

    #[test]
    fn bad_labels_counts_and_shapes_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (images, labels) = (dir.path().join(TEST_IMAGES), dir.path().join(TEST_LABELS));
        write_u8(&images, &[2, 28, 28], &[0; 2 * 784]);
        write_u8(&labels, &[2], &[3, 10]);
        let e = Mnist::load(dir.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: expected labels in 0..10, found label 10 at index 1",
                labels.display()
            )
        );
        write_u8(&labels, &[3], &[0, 1, 2]);
        let e = Mnist::load(dir.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{} holds 2 images but {} holds 3 labels",
                images.display(),
                labels.display()
            )
        );
        write_u8(&images, &[2, 784], &[0; 2 * 784]);
        let e = Mnist::load(dir.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: IDX rank 2, expected 3 (u8 images of shape [N, 28, 28])",
                images.display()
            )
        );
        write_u8(&images, &[2, 14, 56], &[0; 2 * 784]);
        let e = Mnist::load(dir.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: expected u8 images of shape [N, 28, 28], found u8 of shape [2, 14, 56]",
                images.display()
            )
        );
    }
}
