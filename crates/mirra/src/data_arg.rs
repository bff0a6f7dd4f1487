//! `mirra train --data PATH`: what the path holds, opened as training and validation
//! examples for the models, which take 28x28 greyscale images:
//!
//! * a folder with MNIST's IDX files (the full set, or the test set split 80 / 20);
//! * NumPy arrays: a `.npz` archive, or a folder of `.npy` files (`x` and `y`, or Keras's
//!   `x_train`, `y_train`, `x_test`, `y_test`), 784 values per example;
//! * a folder of images in one sub-folder per class (PNG, JPEG), read per batch and
//!   resized to 28x28 greyscale.
//!
//! Without `--data`, MNIST's test set embedded in the binary.

use std::path::Path;

use mirra::data::{load_arrays, ImageFolder, Mnist, Split};
use mirra::recipe::Examples;

use crate::Failure;

/// The side of the images the models take.
const SIDE: usize = 28;

/// Training and validation examples and what they need.
pub struct Data {
    pub train: Split,
    pub validation: Split,
    /// Classes of the labels (ids `0..classes`).
    pub classes: usize,
    /// For an image folder: the files the splits' indices name.
    pub folder: Option<ImageFolder>,
}

impl Data {
    /// Where the examples are, for the pipelines.
    pub fn examples(&self) -> Examples<'_> {
        match &self.folder {
            Some(folder) => Examples::Files(folder),
            None => Examples::InMemory,
        }
    }
}

/// Opens `path` (or the embedded data); a usage error names what is wrong with it.
pub fn open(path: Option<&Path>) -> Result<Data, Failure> {
    let usage = |e: &dyn std::fmt::Display| Failure::Usage(e.to_string());
    let Some(path) = path else {
        let m = Mnist::bundled().map_err(|e| usage(&e))?;
        return checked("the bundled data", m.train, m.validation, 10, None);
    };
    let what = format!("--data {}", path.display());
    if !path.exists() {
        return Err(Failure::Usage(format!(
            "data directory '{}' does not exist",
            path.display()
        )));
    }
    let has = |name: &str| path.join(name).is_file() || path.join(format!("{name}.gz")).is_file();
    let is_npz = path.is_file()
        && path
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("npz"));
    if is_npz || (path.is_dir() && (has("x.npy") || has("x_train.npy"))) {
        let (train, validation) = load_arrays(path).map_err(|e| usage(&e))?;
        let (train, validation) = (to_images(&what, train)?, to_images(&what, validation)?);
        let classes = [&train, &validation]
            .iter()
            .filter_map(|s| s.labels.to_vec::<i64>().ok()?.into_iter().max())
            .max()
            .map_or(0, |m| m as usize + 1);
        return checked(&what, train, validation, classes, None);
    }
    if path.is_file() {
        return Err(Failure::Usage(format!(
            "{what}: a file is read as a .npz archive of NumPy arrays (name it .npz); \
             otherwise give a folder (MNIST's files, .npy arrays, or images in class folders)"
        )));
    }
    let mnist_files = [
        "t10k-images-idx3-ubyte",
        "train-images-idx3-ubyte",
        "t10k-images.idx3-ubyte",
    ];
    let subfolders = std::fs::read_dir(path)
        .map_err(|e| Failure::Usage(format!("{what}: {e}")))?
        .filter_map(|e| e.ok())
        .any(|e| e.path().is_dir());
    if subfolders && !mnist_files.iter().any(|f| has(f)) {
        let folder = ImageFolder::scan(path, [SIDE, SIDE]).map_err(|e| usage(&e))?;
        let (train, validation) = folder.split().map_err(|e| usage(&e))?;
        let classes = folder.classes().len();
        return checked(&what, train, validation, classes, Some(folder));
    }
    let m = Mnist::load(path).map_err(|e| usage(&e))?;
    checked(&what, m.train, m.validation, 10, None)
}

/// Examples of 784 values reshaped to 28x28 images.
fn to_images(what: &str, split: Split) -> Result<Split, Failure> {
    let dims = split.pixels.dims().to_vec();
    let per: usize = dims[1..].iter().product();
    if per != SIDE * SIDE {
        return Err(Failure::Usage(format!(
            "{what}: examples of shape {:?} ({per} values); the models take 28x28 greyscale \
             images (784 values)",
            &dims[1..]
        )));
    }
    let pixels = split
        .pixels
        .reshape(&[dims[0], SIDE, SIDE])
        .map_err(|e| Failure::Usage(format!("{what}: {e}")))?;
    Ok(Split {
        pixels,
        labels: split.labels,
    })
}

/// The data, once it is known to hold an example to train on and one to validate on.
fn checked(
    what: &str,
    train: Split,
    validation: Split,
    classes: usize,
    folder: Option<ImageFolder>,
) -> Result<Data, Failure> {
    let (train_n, val_n) = (train.len(), validation.len());
    if train_n == 0 || val_n == 0 {
        return Err(Failure::Usage(format!(
            "{what} holds {train_n} training and {val_n} validation examples: training \
             needs at least one of each"
        )));
    }
    Ok(Data {
        train,
        validation,
        classes,
        folder,
    })
}
