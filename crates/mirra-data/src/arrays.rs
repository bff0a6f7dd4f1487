//! NumPy arrays as training data: `.npy` files and `.npz` archives (`numpy.save`,
//! `numpy.savez`, `numpy.savez_compressed`), the form Keras's `mnist.npz` and most users'
//! own data take.
//!
//! A data set is the arrays `x` (examples) and `y` (integer class ids), split 80 / 20 into
//! training and validation in their order, or `x_train`, `y_train`, `x_test`, `y_test`
//! (Keras's layout), used as given; in a `.npz` archive, or as `.npy` files of those names
//! in a folder. `u8` examples are pixels (`[0, 255]`, made `[0, 1]` per batch); float
//! examples are used as they are (as `f32`).
//!
//! Reading checks what the header declares against what the file holds: the element type
//! (little-endian integers and floats, booleans), C order, and a data length that is
//! exactly the shape's; every mismatch is an error naming the file.

use std::io::Read;
use std::path::{Path, PathBuf};

use mirra_device::{DType, Device};
use mirra_tensor::{Tensor, MAX_RANK};

use crate::{DataError, Result, Split};

/// The largest `.npy` header this reader accepts (NumPy writes 64-byte-aligned headers of
/// a few hundred bytes).
const MAX_HEADER: usize = 1 << 16;

/// Reads a `.npy` file into a tensor: `u1` and `b1` as `u8`; `i1`, `i2`, `u2` and `i4` as
/// `i32`; `u4`, `i8` and `u8` as `i64` (a `u8` above `i64::MAX` is an error); `f2`, `f4`
/// and `f8` as `f16`, `f32` and `f64`.
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    read_npy_bytes(&bytes, path)
}

/// [`read_npy`] of bytes already in memory; `path` names them in errors.
pub fn read_npy_bytes(bytes: &[u8], path: &Path) -> Result<Tensor> {
    let bad = |msg: String| DataError::Format {
        path: path.to_path_buf(),
        msg,
    };
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("not a .npy file (no \\x93NUMPY magic)".into()));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(bad(format!(".npy format version {v} (1 to 3 are read)"))),
    };
    if header_len > MAX_HEADER || start + header_len > bytes.len() {
        return Err(bad(format!(
            "a header of {header_len} bytes in a file of {}",
            bytes.len()
        )));
    }
    let header = std::str::from_utf8(&bytes[start..start + header_len])
        .map_err(|_| bad("the header is not text".into()))?;
    let descr = field(header, "descr").ok_or_else(|| bad(format!("no 'descr' in {header}")))?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    if field(header, "fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err(bad(
            "Fortran-ordered array (save it C-ordered: numpy.ascontiguousarray)".into(),
        ));
    }
    let shape = field(header, "shape").ok_or_else(|| bad(format!("no 'shape' in {header}")))?;
    let dims = parse_shape(shape).ok_or_else(|| bad(format!("bad shape {shape}")))?;
    if dims.is_empty() || dims.len() > MAX_RANK {
        return Err(bad(format!(
            "an array of {} dimensions (1 to {MAX_RANK} are read)",
            dims.len()
        )));
    }
    let (order, code) = descr.split_at(descr.len().min(1));
    if order == ">" && code != "u1" && code != "i1" && code != "b1" {
        return Err(bad(format!("big-endian element type '{descr}'")));
    }
    if !["<", "|", "="].contains(&order) && order != ">" {
        return Err(bad(format!("element type '{descr}'")));
    }
    let size = match code {
        "u1" | "i1" | "b1" => 1,
        "i2" | "u2" | "f2" => 2,
        "i4" | "u4" | "f4" => 4,
        "i8" | "u8" | "f8" => 8,
        _ => {
            return Err(bad(format!(
                "element type '{descr}' (read: integers, floats and booleans)"
            )))
        }
    };
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {dims:?} overflows")))?;
    let data = &bytes[start + header_len..];
    let want = count.saturating_mul(size);
    if data.len() != want {
        return Err(bad(format!(
            "shape {dims:?} of '{descr}' needs {want} bytes of data, the file has {}",
            data.len()
        )));
    }
    let words = |n: usize| data.chunks_exact(n);
    let t = match code {
        "u1" | "b1" => Tensor::from_vec(data.to_vec(), &dims, Device::Cpu)?,
        "i1" => from_ints(data.iter().map(|&b| b as i8 as i32), &dims)?,
        "i2" => from_ints(
            words(2).map(|w| i16::from_le_bytes([w[0], w[1]]) as i32),
            &dims,
        )?,
        "u2" => from_ints(
            words(2).map(|w| u16::from_le_bytes([w[0], w[1]]) as i32),
            &dims,
        )?,
        "i4" => from_ints(
            words(4).map(|w| i32::from_le_bytes(w.try_into().unwrap())),
            &dims,
        )?,
        "u4" => from_ints(
            words(4).map(|w| u32::from_le_bytes(w.try_into().unwrap()) as i64),
            &dims,
        )?,
        "i8" => from_ints(
            words(8).map(|w| i64::from_le_bytes(w.try_into().unwrap())),
            &dims,
        )?,
        "u8" => {
            let v: Option<Vec<i64>> = words(8)
                .map(|w| i64::try_from(u64::from_le_bytes(w.try_into().unwrap())).ok())
                .collect();
            let v = v.ok_or_else(|| bad("a u8 element above i64's range".into()))?;
            Tensor::from_vec(v, &dims, Device::Cpu)?
        }
        "f2" => {
            let v = words(2)
                .map(|w| half::f16::from_le_bytes([w[0], w[1]]))
                .collect();
            Tensor::from_vec::<half::f16>(v, &dims, Device::Cpu)?
        }
        "f4" => {
            let v = words(4)
                .map(|w| f32::from_le_bytes(w.try_into().unwrap()))
                .collect();
            Tensor::from_vec::<f32>(v, &dims, Device::Cpu)?
        }
        _ => {
            let v = words(8)
                .map(|w| f64::from_le_bytes(w.try_into().unwrap()))
                .collect();
            Tensor::from_vec::<f64>(v, &dims, Device::Cpu)?
        }
    };
    Ok(t)
}

fn from_ints<T: mirra_device::Element>(
    values: impl Iterator<Item = T>,
    dims: &[usize],
) -> Result<Tensor> {
    Ok(Tensor::from_vec(values.collect(), dims, Device::Cpu)?)
}

/// The value text of `key` in a `.npy` header dict (`{'descr': '<f4', ...}`): from after
/// its colon to the next top-level comma or the closing brace.
fn field<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[at + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(rest[..i].trim()),
            _ => {}
        }
    }
    None
}

/// `(60000, 28, 28)`, `(5,)` or `()` as dimensions.
fn parse_shape(s: &str) -> Option<Vec<usize>> {
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.trim_end_matches('L').parse().ok())
        .collect()
}

/// The arrays of a `.npz` archive, by name (`x.npy` is `x`), in archive order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let bad = |msg: String| DataError::Format {
        path: path.to_path_buf(),
        msg,
    };
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| bad(format!("not a .npz (zip) archive: {e}")))?;
    let mut arrays = Vec::new();
    for i in 0..archive.len() {
        let mut entry = archive
            .by_index(i)
            .map_err(|e| bad(format!("entry {i}: {e}")))?;
        let name = entry.name().to_string();
        let Some(key) = name.strip_suffix(".npy") else {
            continue;
        };
        let declared = entry.size();
        let mut bytes = Vec::with_capacity(declared.min(1 << 30) as usize);
        // Never more than the entry declares (a deflate bomb stops there).
        (&mut entry)
            .take(declared.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("{name}: {e}")))?;
        if bytes.len() as u64 != declared {
            return Err(bad(format!(
                "{name}: {} bytes inflated, {declared} declared",
                bytes.len()
            )));
        }
        let inner = path.join(&name);
        arrays.push((key.to_string(), read_npy_bytes(&bytes, &inner)?));
    }
    Ok(arrays)
}

/// Training and validation examples from NumPy arrays: a `.npz` archive, or a folder of
/// `.npy` files; `x` and `y` (split 80 / 20 in order) or `x_train`, `y_train`, `x_test`
/// and `y_test`. Examples stay `u8` or become `f32`; labels become `i64` and must be
/// class ids (`0..`), one per example.
pub fn load_arrays(path: &Path) -> Result<(Split, Split)> {
    let arrays: Vec<(String, Tensor)> = if path.is_dir() {
        let mut found = Vec::new();
        for key in ["x", "y", "x_train", "y_train", "x_test", "y_test"] {
            let file = path.join(format!("{key}.npy"));
            if file.is_file() {
                found.push((key.to_string(), read_npy(&file)?));
            }
        }
        found
    } else {
        read_npz(path)?
    };
    let get = |key: &str| {
        arrays
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, t)| t.clone())
    };
    let names: Vec<&str> = arrays.iter().map(|(k, _)| k.as_str()).collect();
    let missing = || DataError::Format {
        path: path.to_path_buf(),
        msg: format!(
            "expected arrays x and y, or x_train, y_train, x_test and y_test; found {names:?}"
        ),
    };
    match (get("x_train"), get("y_train"), get("x_test"), get("y_test")) {
        (Some(xt), Some(yt), Some(xv), Some(yv)) => Ok((
            examples(path, "x_train", xt, "y_train", yt)?,
            examples(path, "x_test", xv, "y_test", yv)?,
        )),
        _ => {
            let (x, y) = (get("x").ok_or_else(missing)?, get("y").ok_or_else(missing)?);
            let all = examples(path, "x", x, "y", y)?;
            let n = all.len();
            let n_train = n * 4 / 5;
            let part = |start, len| -> Result<Split> {
                Ok(Split {
                    pixels: all.pixels.narrow(0, start, len)?,
                    labels: all.labels.narrow(0, start, len)?,
                })
            };
            Ok((part(0, n_train)?, part(n_train, n - n_train)?))
        }
    }
}

/// Examples `x` and labels `y` checked against each other: one integer class id (at least
/// 0) per example; `u8` examples kept, float ones made `f32`.
fn examples(path: &Path, xn: &str, x: Tensor, yn: &str, y: Tensor) -> Result<Split> {
    let bad = |msg: String| DataError::Format {
        path: path.to_path_buf(),
        msg,
    };
    let x = match x.dtype() {
        DType::U8 | DType::F32 => x,
        DType::F16 | DType::BF16 | DType::F64 => x.to_dtype(DType::F32)?,
        other => {
            return Err(bad(format!(
                "{xn} is {other}: examples are u8 pixels or floats"
            )))
        }
    };
    if x.rank() < 2 {
        return Err(bad(format!(
            "{xn} has shape {:?}: examples need a first dimension and at least one more",
            x.dims()
        )));
    }
    let labels = match y.dtype() {
        DType::U8 | DType::I32 | DType::I64 => y.to_dtype(DType::I64)?,
        other => {
            return Err(bad(format!(
                "{yn} is {other}: labels are integer class ids"
            )))
        }
    };
    if labels.rank() != 1 || labels.dims()[0] != x.dims()[0] {
        return Err(bad(format!(
            "{yn} has shape {:?}, expected one label per example of {xn} ([{}])",
            labels.dims(),
            x.dims()[0]
        )));
    }
    if let Some(l) = labels.to_vec::<i64>()?.into_iter().find(|&l| l < 0) {
        return Err(bad(format!("{yn} holds {l}: class ids start at 0")));
    }
    Ok(Split { pixels: x, labels })
}

fn io_error(path: &Path, e: std::io::Error) -> DataError {
    if e.kind() == std::io::ErrorKind::NotFound {
        DataError::NotFound {
            path: path.to_path_buf(),
        }
    } else {
        DataError::Io {
            path: PathBuf::from(path),
            source: e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirra_mutation::fixtures::npy;
    use std::io::Write;

    fn read(bytes: &[u8]) -> Result<Tensor> {
        read_npy_bytes(bytes, Path::new("a.npy"))
    }

    #[test]
    fn element_types_and_shapes_read_as_numpy_wrote_them() {
        let t = read(&npy("|u1", "(2, 3)", &[1, 2, 3, 4, 5, 255])).unwrap();
        assert_eq!((t.dtype(), t.dims()), (DType::U8, &[2, 3][..]));
        assert_eq!(t.to_vec::<u8>().unwrap(), [1, 2, 3, 4, 5, 255]);
        let f: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = read(&npy("<f4", "(2,)", &f)).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [1.5, -2.0]);
        let d: Vec<u8> = [0.25f64].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            read(&npy("<f8", "(1,)", &d))
                .unwrap()
                .to_vec::<f64>()
                .unwrap(),
            [0.25]
        );
        let i: Vec<u8> = [-3i64, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            read(&npy("<i8", "(2,)", &i))
                .unwrap()
                .to_vec::<i64>()
                .unwrap(),
            [-3, 7]
        );
        let i: Vec<u8> = [-3i32, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            read(&npy("<i4", "(2,)", &i))
                .unwrap()
                .to_vec::<i32>()
                .unwrap(),
            [-3, 9]
        );
        let i: Vec<u8> = [65535u16, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            read(&npy("<u2", "(2,)", &i))
                .unwrap()
                .to_vec::<i32>()
                .unwrap(),
            [65535, 2]
        );
        assert_eq!(
            read(&npy("|i1", "(1,)", &[0xff]))
                .unwrap()
                .to_vec::<i32>()
                .unwrap(),
            [-1]
        );
        let big: Vec<u8> = u64::MAX.to_le_bytes().to_vec();
        assert!(read(&npy("<u8", "(1,)", &big))
            .unwrap_err()
            .to_string()
            .contains("i64's range"));
        // Version 2 headers (a 4-byte length).
        let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
        let header = "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }\n";
        v2.extend((header.len() as u32).to_le_bytes());
        v2.extend(header.as_bytes());
        v2.extend([7, 8, 9]);
        assert_eq!(read(&v2).unwrap().to_vec::<u8>().unwrap(), [7, 8, 9]);
    }

    #[test]
    fn malformed_files_are_errors_naming_the_file_and_the_fault() {
        let err = |bytes: &[u8]| read(bytes).unwrap_err().to_string();
        for (bytes, needle) in [
            (b"not numpy at all".to_vec(), "no \\x93NUMPY magic"),
            (
                npy("|u1", "(2, 3)", &[1, 2, 3]),
                "needs 6 bytes of data, the file has 3",
            ),
            (
                npy("|u1", "(2,)", &[1, 2, 3]),
                "needs 2 bytes of data, the file has 3",
            ),
            (npy(">f4", "(1,)", &[0; 4]), "big-endian"),
            (npy("<c8", "(1,)", &[0; 8]), "element type '<c8'"),
            (npy("|u1", "()", &[1]), "0 dimensions"),
            (
                npy("|u1", "(1, 1, 1, 1, 1, 1, 1, 1, 1)", &[1]),
                "9 dimensions",
            ),
            (npy("|u1", "(99999999999, 99999999999)", &[]), "overflows"),
        ] {
            let e = err(&bytes);
            assert!(
                e.starts_with("a.npy: ") && e.contains(needle),
                "{needle}: {e}"
            );
        }
        let mut fortran = npy("|u1", "(1,)", &[1]);
        let at = fortran.windows(5).position(|w| w == b"False").unwrap();
        fortran[at..at + 5].copy_from_slice(b"True ");
        assert!(err(&fortran).contains("Fortran-ordered"));
    }

    /// Every truncation of a file, and the file one byte longer, is an error; every byte
    /// of it set to each of a few values reads without a panic, and what reads holds no
    /// more elements than the file has bytes.
    #[test]
    fn damaged_files_give_an_error_or_what_they_declare() {
        let data: Vec<u8> = (0..12i32)
            .flat_map(|v| (v * 1000 - 5000).to_le_bytes())
            .collect();
        let original = npy("<i4", "(3, 4)", &data);
        let check = |bytes: &[u8]| {
            if let Ok(t) = read(bytes) {
                let elems: usize = t.dims().iter().product();
                assert!(
                    elems <= bytes.len(),
                    "{:?} from {} bytes",
                    t.dims(),
                    bytes.len()
                );
            }
        };
        for len in 0..original.len() {
            assert!(read(&original[..len]).is_err(), "truncated to {len} bytes");
        }
        let mut extended = original.clone();
        extended.push(0);
        assert!(read(&extended).is_err());
        for at in 0..original.len() {
            for value in [0u8, b' ', b'9', b')', b',', b'\'', 0xff] {
                let mut bytes = original.clone();
                bytes[at] = value;
                check(&bytes);
            }
        }
        assert_eq!(read(&original).unwrap().to_vec::<i32>().unwrap()[1], -4000);
    }

    fn npz(path: &Path, entries: &[(&str, Vec<u8>)], method: zip::CompressionMethod) {
        let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        let options = zip::write::SimpleFileOptions::default().compression_method(method);
        for (name, bytes) in entries {
            z.start_file(*name, options).unwrap();
            z.write_all(bytes).unwrap();
        }
        z.finish().unwrap();
    }

    #[test]
    fn archives_and_folders_give_training_and_validation_examples() {
        let dir = tempfile::tempdir().unwrap();
        let pixels: Vec<u8> = (0..10 * 4).map(|i| i as u8).collect();
        let labels: Vec<u8> = (0..10i64).flat_map(|i| (i % 3).to_le_bytes()).collect();
        let x = npy("|u1", "(10, 2, 2)", &pixels);
        let y = npy("<i8", "(10,)", &labels);
        // x and y, deflated (savez_compressed): 8 training, 2 validation examples.
        let path = dir.path().join("data.npz");
        npz(
            &path,
            &[("x.npy", x.clone()), ("y.npy", y.clone())],
            zip::CompressionMethod::Deflated,
        );
        let (train, val) = load_arrays(&path).unwrap();
        assert_eq!((train.len(), val.len()), (8, 2));
        assert_eq!(train.pixels.dims(), [8, 2, 2]);
        assert_eq!(val.labels.to_vec::<i64>().unwrap(), [2, 0]);
        // Keras's layout, stored (savez): used as given.
        let keras = dir.path().join("keras.npz");
        npz(
            &keras,
            &[
                ("x_train.npy", x.clone()),
                ("y_train.npy", y.clone()),
                ("x_test.npy", x.clone()),
                ("y_test.npy", y.clone()),
            ],
            zip::CompressionMethod::Stored,
        );
        let (train, val) = load_arrays(&keras).unwrap();
        assert_eq!((train.len(), val.len()), (10, 10));
        // A folder of .npy files.
        let folder = dir.path().join("arrays");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("x.npy"), &x).unwrap();
        std::fs::write(folder.join("y.npy"), &y).unwrap();
        assert_eq!(load_arrays(&folder).unwrap().0.len(), 8);
        // Faults: a missing array, a label per example, negative labels, float labels.
        let err = |entries: &[(&str, Vec<u8>)]| {
            let p = dir.path().join("bad.npz");
            npz(&p, entries, zip::CompressionMethod::Stored);
            load_arrays(&p).unwrap_err().to_string()
        };
        assert!(err(&[("x.npy", x.clone())]).contains("expected arrays x and y"));
        let short = npy("<i8", "(2,)", &labels[..16]);
        assert!(err(&[("x.npy", x.clone()), ("y.npy", short)]).contains("one label per example"));
        let neg: Vec<u8> = (0..10i64).flat_map(|i| (i - 1).to_le_bytes()).collect();
        assert!(
            err(&[("x.npy", x.clone()), ("y.npy", npy("<i8", "(10,)", &neg))]).contains("holds -1")
        );
        let float = npy("<f4", "(10,)", &[0; 40]);
        assert!(err(&[("x.npy", x.clone()), ("y.npy", float)]).contains("integer class ids"));
        std::fs::write(dir.path().join("junk.npz"), b"PK junk").unwrap();
        let e = load_arrays(&dir.path().join("junk.npz"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a .npz (zip) archive"), "{e}");
    }
}
