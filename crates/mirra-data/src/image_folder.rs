//! A folder of images in one sub-folder per class (Keras's
//! `image_dataset_from_directory`, torchvision's `ImageFolder`): PNG and JPEG files,
//! classes named by their folders in sorted order (ids `0..`), read lazily: a data set is
//! its list of files, and each batch's images are decoded when the pipeline forms it (on
//! the prefetch thread, the batch's files decoded in parallel), so a data set larger than
//! memory trains.
//!
//! Images become `u8` greyscale (luma) of the size the model takes, resized (bilinear)
//! where they differ. Every class's files split 80 / 20 in sorted order into training and
//! validation, so both hold every class.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use mirra_device::Device;
use mirra_tensor::Tensor;

use crate::{DataError, Result, Split};

/// The extensions read (case-insensitive).
const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// The files of an image folder, their classes, and the size images are read at.
#[derive(Clone, Debug)]
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    files: Vec<PathBuf>,
    labels: Vec<i64>,
    /// Height and width of the images read.
    size: [usize; 2],
}

impl ImageFolder {
    /// Lists `root`'s class folders (sorted) and their PNG and JPEG files (sorted); the
    /// images are read at `size` (height, width). An error when `root` has no class
    /// folder, or a class folder no image.
    pub fn scan(root: &Path, size: [usize; 2]) -> Result<ImageFolder> {
        let bad = |msg: String| DataError::Format {
            path: root.to_path_buf(),
            msg,
        };
        let io = |path: &Path, e: std::io::Error| DataError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let mut class_dirs: Vec<PathBuf> = std::fs::read_dir(root)
            .map_err(|e| io(root, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        class_dirs.sort();
        if class_dirs.is_empty() {
            return Err(bad(
                "no class folders (an image folder holds one sub-folder of images per class)"
                    .into(),
            ));
        }
        let (mut classes, mut files, mut labels) = (Vec::new(), Vec::new(), Vec::new());
        for (id, dir) in class_dirs.iter().enumerate() {
            let mut images: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| io(dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.extension()
                            .and_then(|x| x.to_str())
                            .is_some_and(|x| EXTENSIONS.contains(&x.to_ascii_lowercase().as_str()))
                })
                .collect();
            images.sort();
            if images.is_empty() {
                return Err(DataError::Format {
                    path: dir.clone(),
                    msg: "a class folder without PNG or JPEG images".into(),
                });
            }
            classes.push(
                dir.file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            );
            labels.extend(std::iter::repeat_n(id as i64, images.len()));
            files.extend(images);
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            files,
            labels,
            size,
        })
    }

    /// The class names, in id order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when the folder holds no image ([`scan`](ImageFolder::scan) refuses those).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Training and validation examples: the first 80% of each class's files (at least
    /// one where a class has two or more) train, the rest validate. Their `pixels` are the
    /// files' indices (`i64`), which [`read`](ImageFolder::read) turns into images as each
    /// batch forms.
    pub fn split(&self) -> Result<(Split, Split)> {
        let (mut train, mut val) = (Vec::new(), Vec::new());
        let mut start = 0;
        while start < self.files.len() {
            let class = self.labels[start];
            let end = start
                + self.labels[start..]
                    .iter()
                    .take_while(|&&l| l == class)
                    .count();
            let n = end - start;
            let n_train = if n >= 2 { (n * 4 / 5).max(1) } else { n };
            train.extend(start..start + n_train);
            val.extend(start + n_train..end);
            start = end;
        }
        let split = |idx: Vec<usize>| -> Result<Split> {
            let n = idx.len();
            let labels = idx.iter().map(|&i| self.labels[i]).collect();
            Ok(Split {
                pixels: Tensor::from_vec(
                    idx.into_iter().map(|i| i as i64).collect(),
                    &[n],
                    Device::Cpu,
                )?,
                labels: Tensor::from_vec(labels, &[n], Device::Cpu)?,
            })
        };
        Ok((split(train)?, split(val)?))
    }

    /// The images of the files at `indices` (`i64`, from [`split`](ImageFolder::split)):
    /// `u8` greyscale `[n, height, width]`, decoded in parallel. An error names a file
    /// that does not decode.
    pub fn read(&self, indices: &Tensor) -> Result<Tensor> {
        let indices = indices.to_vec::<i64>()?;
        let [h, w] = self.size;
        let mut out = vec![0u8; indices.len() * h * w];
        out.par_chunks_mut((h * w).max(1))
            .zip(indices.par_iter())
            .try_for_each(|(dst, &i)| self.read_one(i, dst))?;
        Ok(Tensor::from_vec(out, &[indices.len(), h, w], Device::Cpu)?)
    }

    fn read_one(&self, index: i64, dst: &mut [u8]) -> Result<()> {
        let path = usize::try_from(index)
            .ok()
            .and_then(|i| self.files.get(i))
            .ok_or_else(|| DataError::Format {
                path: self.root.clone(),
                msg: format!("no image {index} (the folder has {})", self.files.len()),
            })?;
        let image = image::ImageReader::open(path)
            .map_err(|e| DataError::Io {
                path: path.clone(),
                source: e,
            })?
            .with_guessed_format()
            .map_err(|e| DataError::Io {
                path: path.clone(),
                source: e,
            })?
            .decode()
            .map_err(|e| DataError::Format {
                path: path.clone(),
                msg: format!("does not decode: {e}"),
            })?
            .into_luma8();
        let [h, w] = self.size;
        let image = if image.dimensions() == (w as u32, h as u32) {
            image
        } else {
            image::imageops::resize(
                &image,
                w as u32,
                h as u32,
                image::imageops::FilterType::Triangle,
            )
        };
        dst.copy_from_slice(image.as_raw());
        Ok(())
    }

    /// A pipeline stage ([`Dataset::map`](crate::Dataset::map)) that replaces a batch's
    /// file indices (its first tensor) with their images.
    pub fn reader(&self) -> impl Fn(Vec<Tensor>) -> Result<Vec<Tensor>> + Send + Sync + 'static {
        let folder = self.clone();
        move |mut batch: Vec<Tensor>| {
            let first = batch.first().ok_or_else(|| DataError::Incompatible {
                op: "image_folder",
                msg: "a batch without file indices".into(),
            })?;
            batch[0] = folder.read(first)?;
            Ok(batch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Saves a `w`x`h` image whose every pixel is `value` (an RGB one when `rgb`).
    fn save(path: &Path, w: u32, h: u32, value: u8, rgb: bool) {
        if rgb {
            image::RgbImage::from_pixel(w, h, image::Rgb([value, value, value]))
                .save(path)
                .unwrap();
        } else {
            image::GrayImage::from_pixel(w, h, image::Luma([value]))
                .save(path)
                .unwrap();
        }
    }

    #[test]
    fn classes_are_sorted_folders_and_images_are_read_per_batch() {
        let dir = tempfile::tempdir().unwrap();
        for (class, n, value) in [("b_dog", 5, 200u8), ("a_cat", 3, 50)] {
            std::fs::create_dir(dir.path().join(class)).unwrap();
            for i in 0..n {
                // Greyscale PNGs of the size asked, an RGB one and one of another size
                // (resized), and a JPEG.
                let name = dir.path().join(class).join(format!("{i}.png"));
                match i {
                    0 => save(&name, 4, 3, value, true),
                    1 => save(&name, 8, 6, value, false),
                    _ => save(&name, 4, 3, value, false),
                }
            }
            save(&dir.path().join(class).join("x.JPG"), 4, 3, value, false);
            std::fs::write(dir.path().join(class).join("notes.txt"), "not an image").unwrap();
        }
        let folder = ImageFolder::scan(dir.path(), [3, 4]).unwrap();
        assert_eq!(folder.classes(), ["a_cat", "b_dog"]);
        assert_eq!(folder.len(), 4 + 6);
        let (train, val) = folder.split().unwrap();
        // 80% of each class trains: 3 of 4 cats, 4 of 6 dogs; both splits hold both.
        assert_eq!(train.labels.to_vec::<i64>().unwrap(), [0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(val.labels.to_vec::<i64>().unwrap(), [0, 1, 1]);
        let images = folder.read(&train.pixels).unwrap();
        assert_eq!(images.dims(), [7, 3, 4]);
        let px = images.to_vec::<u8>().unwrap();
        for (i, image) in px.chunks(12).enumerate() {
            let want = if i < 3 { 50 } else { 200 };
            // JPEG is lossy: within a few levels of the flat value.
            assert!(
                image.iter().all(|&p| p.abs_diff(want) <= 3),
                "image {i}: {image:?}"
            );
        }
        // The pipeline stage swaps the indices for the images.
        let batch = folder.reader()(vec![val.pixels.clone(), val.labels.clone()]).unwrap();
        assert_eq!(batch[0].dims(), [3, 3, 4]);
    }

    #[test]
    fn empty_folders_and_undecodable_files_are_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let e = ImageFolder::scan(dir.path(), [2, 2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no class folders"), "{e}");
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        let e = ImageFolder::scan(dir.path(), [2, 2])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("empty") && e.contains("without PNG or JPEG"),
            "{e}"
        );
        std::fs::write(dir.path().join("empty").join("broken.png"), b"not a png").unwrap();
        let folder = ImageFolder::scan(dir.path(), [2, 2]).unwrap();
        let (train, _) = folder.split().unwrap();
        let e = folder.read(&train.pixels).unwrap_err().to_string();
        assert!(
            e.contains("broken.png") && e.contains("does not decode"),
            "{e}"
        );
        let bad = Tensor::from_vec(vec![7i64], &[1], Device::Cpu).unwrap();
        assert!(folder
            .read(&bad)
            .unwrap_err()
            .to_string()
            .contains("no image 7"));
    }
}
