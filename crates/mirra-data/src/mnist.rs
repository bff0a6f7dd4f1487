//! MNIST from IDX files: the test set embedded in the library, or a directory.
//!
//! The repository bundles only the 10,000-image test set (`data/mnist/`), and this crate
//! embeds its two gzipped files (1.6 MB) in every binary that loads it
//! ([`Mnist::bundled`]), so that examples, tests and a copied or installed `mirra` run
//! offline and without the checkout. That set is split into training (the first 80%:
//! 8,000 images) and validation (the last 2,000). A directory with the full set (the four
//! standard files, [`Mnist::load`]) trains on the 60,000 training images and validates on
//! the 10,000 test images.
//!
//! Images stay as stored, one `u8` per pixel (47 MB for the full training set, a quarter
//! of its `f32` size); [`pixels_to_unit_f32`] converts a batch as the pipeline forms it.

use std::path::{Path, PathBuf};

use mirra_device::Buffer;
use mirra_tensor::{DType, Device, Tensor};

use crate::{read_idx, read_idx_bytes, DataError, Result};

/// The bundled test set's image file, as stored in `data/mnist/`.
const BUNDLED_IMAGES: &[u8] = include_bytes!("../../../data/mnist/t10k-images-idx3-ubyte.gz");
/// The bundled test set's label file, as stored in `data/mnist/`.
const BUNDLED_LABELS: &[u8] = include_bytes!("../../../data/mnist/t10k-labels-idx1-ubyte.gz");
/// What errors call the embedded files.
const BUNDLED_IMAGES_NAME: &str = "embedded:data/mnist/t10k-images-idx3-ubyte.gz";
const BUNDLED_LABELS_NAME: &str = "embedded:data/mnist/t10k-labels-idx1-ubyte.gz";

/// Images and their labels.
#[derive(Clone, Debug)]
pub struct Split {
    /// The images as stored: `u8` pixels in `0..=255`, shape `[N, 28, 28]`. Batches of
    /// them become `f32` through [`pixels_to_unit_f32`].
    pub pixels: Tensor,
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

/// The embedded files as stored (file name, gzipped IDX bytes): for a program outside
/// Rust (a PyTorch reference) to read the same examples that [`Mnist::bundled`] holds.
pub fn bundled_files() -> [(&'static str, &'static [u8]); 2] {
    [
        ("t10k-images-idx3-ubyte.gz", BUNDLED_IMAGES),
        ("t10k-labels-idx1-ubyte.gz", BUNDLED_LABELS),
    ]
}

impl Mnist {
    /// The test set embedded in this library (the repository's `data/mnist/`), split
    /// 8,000 / 2,000. Reads no file.
    pub fn bundled() -> Result<Mnist> {
        let images = Path::new(BUNDLED_IMAGES_NAME);
        let labels = Path::new(BUNDLED_LABELS_NAME);
        let test = split_from(
            read_idx_bytes(BUNDLED_IMAGES, images)?,
            images,
            read_idx_bytes(BUNDLED_LABELS, labels)?,
            labels,
        )?;
        test_set_split(test)
    }

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
            (None, None, Some(tei), Some(tel)) => test_set_split(load_split(&tei, &tel)?),
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

/// The test set alone: its first 80% trains, the rest validates (views, no copy).
fn test_set_split(test: Split) -> Result<Mnist> {
    let n_train = test.len() * 4 / 5;
    let part = |start, len| -> Result<Split> {
        Ok(Split {
            pixels: test.pixels.narrow(0, start, len)?,
            labels: test.labels.narrow(0, start, len)?,
        })
    };
    Ok(Mnist {
        train: part(0, n_train)?,
        validation: part(n_train, test.len() - n_train)?,
        source: MnistSource::TestSetSplit,
    })
}

/// The batch `batch` (an element of a pipeline over a [`Split`]: `[pixels, labels]`) with
/// its first tensor, `u8` pixels, as `f32` in `[0, 1]` (`p / 255`, rounded once); the
/// other tensors unchanged. Map a batched pipeline through it
/// (`.batch(n, false).map(pixels_to_unit_f32)`): the data set stays in `u8`, a quarter
/// of its `f32` size, and each batch is converted as it is formed (into a recycled
/// buffer, so a warmed-up step still allocates nothing).
pub fn pixels_to_unit_f32(mut batch: Vec<Tensor>) -> Result<Vec<Tensor>> {
    let op = "pixels_to_unit_f32";
    let pixels = batch.first().ok_or_else(|| DataError::Incompatible {
        op,
        msg: "the element has no tensor".into(),
    })?;
    if pixels.dtype() != DType::U8 {
        return Err(DataError::Incompatible {
            op,
            msg: format!(
                "tensor 0 is {} {:?}, expected u8 pixels",
                pixels.dtype(),
                pixels.dims()
            ),
        });
    }
    let pixels = pixels.contiguous()?;
    let mut unit = Buffer::alloc(DType::F32, pixels.elem_count(), Device::Cpu)
        .map_err(mirra_tensor::TensorError::from)?;
    let out = unit
        .as_mut_slice::<f32>()
        .map_err(mirra_tensor::TensorError::from)?;
    let src = pixels.as_slice::<u8>()?;
    // One rounded division per pixel, as the loader used to compute them, in the widest
    // vector instructions the CPU has.
    mirra_device::vectorize(
        #[inline(always)]
        || {
            for (u, &p) in out.iter_mut().zip(src) {
                *u = f32::from(p) / 255.0;
            }
        },
    );
    batch[0] = Tensor::from_buffer(unit, pixels.dims())?;
    Ok(batch)
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
    split_from(
        read_idx(images_path)?,
        images_path,
        read_idx(labels_path)?,
        labels_path,
    )
}

/// Images and labels (read from `images_path` and `labels_path`) checked against each
/// other; the labels widened to `i64`.
fn split_from(
    images: Tensor,
    images_path: &Path,
    labels: Tensor,
    labels_path: &Path,
) -> Result<Split> {
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
    Ok(Split {
        pixels: images,
        labels: labels.to_dtype(DType::I64)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idx::testing::write_u8;

    /// The repository's `data/mnist/`, which the library embeds.
    fn bundled_files() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/mnist")
    }

    #[test]
    fn the_bundled_test_set_splits_8000_2000() {
        let m = Mnist::bundled().unwrap();
        assert_eq!(m.source, MnistSource::TestSetSplit);
        assert_eq!(m.train.pixels.dims(), &[8000, 28, 28]);
        assert_eq!(m.train.labels.dims(), &[8000]);
        assert_eq!(m.validation.pixels.dims(), &[2000, 28, 28]);
        assert_eq!(m.validation.labels.dims(), &[2000]);
        assert_eq!(m.train.pixels.dtype(), DType::U8);
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

        let pixels = m.train.pixels.to_vec::<u8>().unwrap();
        let (lo, hi) = (pixels.iter().min(), pixels.iter().max());
        assert_eq!((lo, hi), (Some(&0), Some(&255)));
        let mean = pixels.iter().map(|&p| f64::from(p)).sum::<f64>() / pixels.len() as f64;
        assert!((25.0..40.0).contains(&mean), "mean pixel {mean}");
    }

    #[test]
    fn the_embedded_set_is_the_repositorys_files() {
        let (embedded, files) = (
            Mnist::bundled().unwrap(),
            Mnist::load(&bundled_files()).unwrap(),
        );
        for (e, f) in [
            (&embedded.train, &files.train),
            (&embedded.validation, &files.validation),
        ] {
            assert_eq!(
                e.pixels.to_vec::<u8>().unwrap(),
                f.pixels.to_vec::<u8>().unwrap()
            );
            assert_eq!(
                e.labels.to_vec::<i64>().unwrap(),
                f.labels.to_vec::<i64>().unwrap()
            );
        }
    }

    /// The first batches of two epochs of the CLI's pipeline over `split`, images
    /// converted by `convert` at the end of it.
    fn first_batches(
        slices: Vec<Tensor>,
        convert: fn(Vec<Tensor>) -> Result<Vec<Tensor>>,
    ) -> Vec<Vec<u32>> {
        let ds = crate::Dataset::from_tensor_slices(slices)
            .unwrap()
            .shuffle(60_000, 1)
            .batch(64, false)
            .map(convert);
        let mut out = Vec::new();
        for epoch in 0..2 {
            for batch in ds.iter_epoch(epoch).unwrap().take(3) {
                let batch = batch.unwrap();
                assert_eq!(batch[0].dtype(), DType::F32);
                out.push(
                    batch[0]
                        .to_vec::<f32>()
                        .unwrap()
                        .iter()
                        .map(|x| x.to_bits())
                        .collect(),
                );
                out.push(
                    batch[1]
                        .to_vec::<i64>()
                        .unwrap()
                        .iter()
                        .map(|&l| l as u32)
                        .collect(),
                );
            }
        }
        out
    }

    #[test]
    fn batches_converted_on_the_way_equal_the_set_converted_when_loaded() {
        let m = Mnist::bundled().unwrap();
        // What the loader did before: every pixel converted to f32 / 255 up front.
        let loaded_as_f32: Vec<f32> = m
            .train
            .pixels
            .to_vec::<u8>()
            .unwrap()
            .iter()
            .map(|&p| f32::from(p) / 255.0)
            .collect();
        let f32_set = Tensor::from_vec(loaded_as_f32, &[8000, 28, 28], Device::Cpu).unwrap();
        let before = first_batches(vec![f32_set, m.train.labels.clone()], Ok);
        let now = first_batches(
            vec![m.train.pixels.clone(), m.train.labels.clone()],
            pixels_to_unit_f32,
        );
        assert_eq!(before, now, "bit for bit");
        // The comparison sees the rounding: multiplying by 1/255 instead of dividing by
        // 255 differs in the last bit for some pixel values.
        assert!((0..=255u8).any(|p| f32::from(p) * (1.0 / 255.0) != f32::from(p) / 255.0));
    }

    #[test]
    fn a_warmed_up_epoch_of_converted_batches_allocates_no_buffer() {
        let m = Mnist::bundled().unwrap();
        // A batch size no other test uses: the buffer pool is shared by the whole process.
        let ds = crate::Dataset::from_tensor_slices(vec![m.train.pixels, m.train.labels])
            .unwrap()
            .shuffle(8000, 3)
            .batch(61, false)
            .map(pixels_to_unit_f32);
        let epoch = |e| {
            for batch in ds.iter_epoch(e).unwrap() {
                assert_eq!(batch.unwrap()[0].dtype(), DType::F32);
            }
        };
        epoch(0);
        let before = mirra_device::pool_stats();
        epoch(1);
        let after = mirra_device::pool_stats();
        assert_eq!(
            after.misses, before.misses,
            "buffers allocated in a warmed-up epoch"
        );
        // Two buffers per batch (u8 gathered, f32 converted) and one for the labels.
        assert_eq!(after.hits - before.hits, 3 * 8000u64.div_ceil(61));
    }

    #[test]
    fn pixels_to_unit_f32_needs_u8_pixels_first() {
        let labels = Tensor::from_vec(vec![3i64], &[1], Device::Cpu).unwrap();
        let f = Tensor::zeros(&[1, 28, 28], DType::F32, Device::Cpu).unwrap();
        let e = pixels_to_unit_f32(vec![f, labels.clone()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pixels_to_unit_f32: tensor 0 is f32 [1, 28, 28], expected u8 pixels"
        );
        let e = pixels_to_unit_f32(vec![]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pixels_to_unit_f32: the element has no tensor"
        );
        let p = Tensor::from_vec(vec![0u8, 51, 255], &[1, 3], Device::Cpu).unwrap();
        let out = pixels_to_unit_f32(vec![p, labels]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), [0.0, 0.2, 1.0]);
        assert_eq!(out[1].to_vec::<i64>().unwrap(), [3]);
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
            .pixels
            .narrow(0, 6, 1)
            .unwrap()
            .to_vec::<u8>()
            .unwrap();
        assert!(img.iter().all(|&p| p == 6));
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
