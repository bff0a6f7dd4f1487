//! The IDX file format (MNIST's): a big-endian header `00 00 TT RR`, then `RR` 32-bit
//! big-endian dimensions, then the elements, row-major and big-endian.
//!
//! Files are read whole and validated before a tensor is built: a damaged download
//! must give an error that names the file and the problem, not a panic or a tensor of the
//! wrong size. Gzip is detected by its magic bytes, not the file name.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use mirra_tensor::{Device, Tensor, MAX_RANK};

use crate::{DataError, Result};

/// Reads an IDX file, raw or gzipped, into a tensor of its dimensions.
///
/// Element types map to tensor dtypes as: u8 → `u8`, i8 / i16 / i32 → `i32` (widened;
/// tensors have no 8- or 16-bit integers), f32 → `f32`, f64 → `f64`.
pub fn read_idx(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    decode(&read_bytes(path)?, path)
}

/// The contents of a file, decompressed when it starts with the gzip magic `1f 8b`.
fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => DataError::NotFound {
            path: path.to_path_buf(),
        },
        _ => DataError::Io {
            path: path.to_path_buf(),
            source,
        },
    })?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let mut out = Vec::with_capacity(raw.len() * 4);
    MultiGzDecoder::new(raw.as_slice())
        .read_to_end(&mut out)
        .map_err(|source| DataError::Gzip {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(out)
}

/// An IDX element type: its size and how to turn its bytes into a tensor.
#[derive(Clone, Copy)]
enum IdxType {
    U8,
    I8,
    I16,
    I32,
    F32,
    F64,
}

impl IdxType {
    fn from_code(code: u8) -> Option<IdxType> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }

    /// A tensor from exactly `dims.product() * size` big-endian bytes.
    fn tensor(self, data: &[u8], dims: &[usize]) -> Result<Tensor> {
        fn be<const N: usize, T>(data: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
            data.chunks_exact(N)
                .map(|c| f(c.try_into().expect("chunks_exact gives N bytes")))
                .collect()
        }
        let cpu = Device::Cpu;
        Ok(match self {
            IdxType::U8 => Tensor::from_slice(data, dims, cpu),
            IdxType::I8 => Tensor::from_vec(be(data, |b: [u8; 1]| b[0] as i8 as i32), dims, cpu),
            IdxType::I16 => Tensor::from_vec(be(data, |b| i16::from_be_bytes(b) as i32), dims, cpu),
            IdxType::I32 => Tensor::from_vec(be(data, i32::from_be_bytes), dims, cpu),
            IdxType::F32 => Tensor::from_vec(be(data, f32::from_be_bytes), dims, cpu),
            IdxType::F64 => Tensor::from_vec(be(data, f64::from_be_bytes), dims, cpu),
        }?)
    }
}

/// Parses the (decompressed) bytes of the IDX file `path`.
fn decode(bytes: &[u8], path: &Path) -> Result<Tensor> {
    let path_buf = || PathBuf::from(path);
    if bytes.len() < 4 {
        return Err(DataError::TruncatedHeader {
            path: path_buf(),
            expected: 4,
            actual: bytes.len(),
        });
    }
    let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(DataError::BadMagic {
            path: path_buf(),
            magic,
        });
    }
    let ty = IdxType::from_code(bytes[2]).ok_or(DataError::UnsupportedType {
        path: path_buf(),
        code: bytes[2],
    })?;
    let rank = usize::from(bytes[3]);
    if rank == 0 || rank > MAX_RANK {
        return Err(DataError::WrongRank {
            path: path_buf(),
            expected: format!("1 to {MAX_RANK}"),
            actual: rank,
        });
    }
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(DataError::TruncatedHeader {
            path: path_buf(),
            expected: header,
            actual: bytes.len(),
        });
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let expected = dims
        .iter()
        .fold(ty.size() as u128, |acc, &d| acc.saturating_mul(d as u128));
    let data = &bytes[header..];
    if expected != data.len() as u128 {
        return Err(DataError::LengthMismatch {
            path: path_buf(),
            dims,
            expected,
            actual: data.len() as u128,
        });
    }
    ty.tensor(data, &dims)
}

/// Test helpers that write IDX files.
#[cfg(test)]
pub(crate) mod testing {
    use std::io::Write;
    use std::path::Path;

    /// The bytes of an IDX file with the given type code, dimensions and data.
    pub(crate) fn idx_bytes(code: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, code, dims.len() as u8];
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    /// `bytes` gzipped.
    pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    /// Writes a u8 IDX file, gzipped when the name ends in `.gz`.
    pub(crate) fn write_u8(path: &Path, dims: &[u32], data: &[u8]) {
        let bytes = idx_bytes(0x08, dims, data);
        let bytes = if path.extension().is_some_and(|e| e == "gz") {
            gzip(&bytes)
        } else {
            bytes
        };
        std::fs::write(path, bytes).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use mirra_tensor::DType;

    use super::testing::{gzip, idx_bytes, write_u8};
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn err(bytes: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "f", bytes);
        read_idx(&path)
            .unwrap_err()
            .to_string()
            .replace(&path.display().to_string(), "FILE")
    }

    #[test]
    fn reads_raw_and_gzipped_u8_images() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..24).collect();
        let raw = dir.path().join("images-idx3-ubyte");
        write_u8(&raw, &[2, 3, 4], &data);
        // A gzipped file is recognised by its content, whatever its name.
        let gz = write(
            dir.path(),
            "no-extension",
            &gzip(&idx_bytes(0x08, &[2, 3, 4], &data)),
        );
        for path in [raw, gz] {
            let t = read_idx(&path).unwrap();
            assert_eq!(t.dims(), &[2, 3, 4]);
            assert_eq!(t.dtype(), DType::U8);
            assert_eq!(t.to_vec::<u8>().unwrap(), data);
        }
    }

    #[test]
    fn reads_big_endian_wider_types() {
        let dir = tempfile::tempdir().unwrap();
        let mut i16s = Vec::new();
        for v in [-2i16, 300] {
            i16s.extend_from_slice(&v.to_be_bytes());
        }
        let t = read_idx(write(dir.path(), "a", &idx_bytes(0x0B, &[2], &i16s))).unwrap();
        assert_eq!(
            (t.dtype(), t.to_vec::<i32>().unwrap()),
            (DType::I32, vec![-2, 300])
        );
        let t = read_idx(write(dir.path(), "b", &idx_bytes(0x09, &[1], &[0xff]))).unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap(), vec![-1]);
        let t = read_idx(write(
            dir.path(),
            "c",
            &idx_bytes(0x0D, &[1], &1.5f32.to_be_bytes()),
        ));
        assert_eq!(t.unwrap().to_vec::<f32>().unwrap(), vec![1.5]);
        let t = read_idx(write(
            dir.path(),
            "d",
            &idx_bytes(0x0E, &[1], &(-0.25f64).to_be_bytes()),
        ));
        assert_eq!(t.unwrap().to_vec::<f64>().unwrap(), vec![-0.25]);
        let t = read_idx(write(
            dir.path(),
            "e",
            &idx_bytes(0x0C, &[1], &(-7i32).to_be_bytes()),
        ));
        assert_eq!(t.unwrap().to_vec::<i32>().unwrap(), vec![-7]);
    }

    #[test]
    fn a_truncated_file_says_how_many_bytes_are_missing() {
        assert_eq!(
            err(&idx_bytes(0x08, &[2, 3], &[0; 5])),
            "FILE: dimensions [2, 3] need 6 data bytes, the file has 5 (truncated)"
        );
        assert_eq!(
            err(&[0, 0, 8, 3, 0, 0]),
            "FILE: truncated IDX header: needs 16 bytes, the file has 6"
        );
        assert_eq!(
            err(&[0, 0]),
            "FILE: truncated IDX header: needs 4 bytes, the file has 2"
        );
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        assert_eq!(
            err(&idx_bytes(0x08, &[2], &[1, 2, 3])),
            "FILE: dimensions [2] need 2 data bytes, the file has 3 (trailing bytes)"
        );
    }

    #[test]
    fn a_bad_magic_number_is_an_error() {
        let e = err(b"PK\x03\x04 a zip file");
        assert!(
            e.starts_with("FILE: bad IDX magic number 0x504b0304"),
            "{e}"
        );
    }

    #[test]
    fn unsupported_types_and_ranks_are_errors() {
        assert!(err(&idx_bytes(0x0A, &[1], &[0]))
            .starts_with("FILE: unsupported IDX element type 0x0a"));
        assert_eq!(
            err(&idx_bytes(0x08, &[], &[0])),
            "FILE: IDX rank 0, expected 1 to 6"
        );
        assert_eq!(
            err(&idx_bytes(0x08, &[1; 7], &[0])),
            "FILE: IDX rank 7, expected 1 to 6"
        );
    }

    #[test]
    fn huge_dimensions_do_not_overflow() {
        let e = err(&idx_bytes(0x0E, &[u32::MAX; 6], &[]));
        assert!(e.contains("the file has 0 (truncated)"), "{e}");
    }

    #[test]
    fn corrupt_gzip_is_an_error() {
        let mut gz = gzip(&idx_bytes(0x08, &[100], &[7; 100]));
        let e = err(&gz[..gz.len() / 2]);
        assert!(e.starts_with("FILE: corrupt gzip data"), "{e}");
        let n = gz.len();
        gz[12..n - 8].fill(0xff);
        let e = err(&gz);
        assert!(e.starts_with("FILE: corrupt gzip data"), "{e}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope-idx1-ubyte");
        let e = read_idx(&path).unwrap_err();
        assert!(matches!(e, DataError::NotFound { .. }));
        assert_eq!(e.to_string(), format!("file not found: {}", path.display()));
    }
}
