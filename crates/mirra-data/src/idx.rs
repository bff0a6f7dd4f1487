//! The IDX file format (MNIST's): a big-endian header `00 00 TT RR`, then `RR` 32-bit
//! big-endian dimensions, then the elements, row-major and big-endian.
//!
//! Reading is bounded by what the header declares. The header is read first, and the size
//! it declares is checked against what the stored bytes can hold before anything is
//! allocated: a raw file must be exactly header + data long, and a gzip stream of `n`
//! bytes cannot inflate to more than [`MAX_DEFLATE_RATIO`]` * n` bytes. The data is then
//! read (or inflated) straight into the tensor's buffer, converted in place, and one byte
//! more is asked for: a stream that goes on past the declared size is refused without
//! inflating it further. flate2 checks each gzip member's CRC-32 and ISIZE (the size
//! mod 2^32) when it reaches the member's end, which that last read does. So a
//! damaged or hostile file costs at most its declared size (capped by what its stored
//! bytes can hold) and gives an error that names the file and the problem, never a panic.
//! Gzip is detected by its magic bytes, not the file name.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use mirra_device::Buffer;
use mirra_tensor::{DType, Device, Tensor, MAX_RANK};

use crate::{DataError, Result};

/// DEFLATE's largest expansion: a 258-byte match coded in two bits (zlib's technical
/// notes: "the limit is 1032:1"). A gzip file of `n` bytes inflates to at most this many
/// times `n` bytes, whatever its header says.
pub const MAX_DEFLATE_RATIO: u64 = 1032;

/// The first two bytes of every gzip member.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads an IDX file, raw or gzipped, into a tensor of its dimensions, allocating,
/// reading and inflating no more than its header declares (see the module notes).
///
/// Element types map to tensor dtypes as: u8 → `u8`, i8 / i16 / i32 → `i32` (widened;
/// tensors have no 8- or 16-bit integers), f32 → `f32`, f64 → `f64`.
pub fn read_idx(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let io = |source: std::io::Error| match source.kind() {
        ErrorKind::NotFound => DataError::NotFound {
            path: path.to_path_buf(),
        },
        _ => DataError::Io {
            path: path.to_path_buf(),
            source,
        },
    };
    let file = File::open(path).map_err(io)?;
    let stored = file.metadata().map_err(io)?.len();
    read_stored(file, stored, path)
}

/// Reads IDX data held in memory, raw or gzipped, as [`read_idx`] reads a file; `name`
/// stands for the data in errors.
pub fn read_idx_bytes(bytes: &[u8], name: impl AsRef<Path>) -> Result<Tensor> {
    read_stored(bytes, bytes.len() as u64, name.as_ref())
}

/// How the IDX bytes are stored, which bounds the size they can declare.
#[derive(Clone, Copy)]
enum Storage {
    /// As they are, in `len` bytes.
    Raw { len: u64 },
    /// Gzipped, in `len` bytes.
    Gzip { len: u64 },
}

impl Storage {
    /// An error for a failed read of the IDX bytes of `path`.
    fn read_error(self, path: &Path, source: std::io::Error) -> DataError {
        let path = path.to_path_buf();
        match (self, source.kind()) {
            // What flate2 reports for bad headers, bad data, bad checksums and cut streams.
            (
                Storage::Gzip { .. },
                ErrorKind::InvalidInput | ErrorKind::InvalidData | ErrorKind::UnexpectedEof,
            ) => DataError::Gzip { path, source },
            _ => DataError::Io { path, source },
        }
    }

    /// The data length in bytes of a header declaring `header` + `data` bytes; an error
    /// when the stored bytes cannot hold that much. Checked before the data's buffer is
    /// allocated.
    fn check_declared(
        self,
        path: &Path,
        dims: &[usize],
        header: usize,
        data: u128,
    ) -> Result<usize> {
        let declared = (header as u128).saturating_add(data);
        let too_large = |limit: u128, reason| DataError::DeclaredTooLarge {
            path: path.to_path_buf(),
            dims: dims.to_vec(),
            declared,
            limit,
            reason,
        };
        match self {
            Storage::Raw { len } if declared != u128::from(len) => {
                return Err(DataError::LengthMismatch {
                    path: path.to_path_buf(),
                    dims: dims.to_vec(),
                    expected: data,
                    actual: u128::from(len).saturating_sub(header as u128),
                })
            }
            Storage::Gzip { len } => {
                let limit = u128::from(len) * u128::from(MAX_DEFLATE_RATIO);
                if declared > limit {
                    return Err(too_large(limit, "a gzip stream inflates at most 1032-fold"));
                }
            }
            Storage::Raw { .. } => {}
        }
        usize::try_from(data)
            .ok()
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(|| too_large(isize::MAX as u128, "the most this machine can address"))
    }
}

/// Reads the IDX data of `input` (`stored` bytes, raw or gzipped) into a tensor.
fn read_stored(mut input: impl Read, stored: u64, path: &Path) -> Result<Tensor> {
    let mut magic = [0u8; 2];
    let n = read_up_to(&mut input, &mut magic).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // The two bytes looked at go back in front of the rest.
    let input = (&magic[..n]).chain(input);
    if magic[..n] == GZIP_MAGIC {
        decode(
            MultiGzDecoder::new(input),
            Storage::Gzip { len: stored },
            path,
        )
    } else {
        decode(input, Storage::Raw { len: stored }, path)
    }
}

/// Fills `buf` from `r` as far as `r` goes; the number of bytes read (less than
/// `buf.len()` only at the end of `r`).
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// An IDX element type: its size and how its big-endian bytes become a tensor's.
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

    /// Bytes per element in the file.
    fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }

    /// The tensor dtype the elements become.
    fn dtype(self) -> DType {
        match self {
            IdxType::U8 => DType::U8,
            IdxType::I8 | IdxType::I16 | IdxType::I32 => DType::I32,
            IdxType::F32 => DType::F32,
            IdxType::F64 => DType::F64,
        }
    }

    /// Converts, in place, the file's elements held in `bytes[start..]` into the native
    /// elements of [`IdxType::dtype`] filling all of `bytes`. Element `i` is written at
    /// `i * out` and read from `start + i * size >= i * out`, and `start` is where the
    /// widening makes room for every element, so no element is overwritten before it is
    /// read.
    fn to_native_in_place(self, bytes: &mut [u8], start: usize) {
        let (size, out) = (self.size(), self.dtype().size_in_bytes());
        if let IdxType::U8 = self {
            return;
        }
        for i in 0..(bytes.len() - start) / size {
            let mut be = [0u8; 8];
            be[..size].copy_from_slice(&bytes[start + i * size..start + (i + 1) * size]);
            let mut native = [0u8; 8];
            match self {
                IdxType::U8 => native[0] = be[0],
                IdxType::I8 => native[..4].copy_from_slice(&i32::from(be[0] as i8).to_ne_bytes()),
                IdxType::I16 => native[..4]
                    .copy_from_slice(&i32::from(i16::from_be_bytes([be[0], be[1]])).to_ne_bytes()),
                // Floats as their bits, so that every NaN payload survives.
                IdxType::I32 | IdxType::F32 => native[..4].copy_from_slice(
                    &u32::from_be_bytes([be[0], be[1], be[2], be[3]]).to_ne_bytes(),
                ),
                IdxType::F64 => native.copy_from_slice(&u64::from_be_bytes(be).to_ne_bytes()),
            }
            bytes[i * out..(i + 1) * out].copy_from_slice(&native[..out]);
        }
    }
}

/// Parses the IDX bytes of `path` from `r` (the data as stored decompressed).
fn decode(mut r: impl Read, storage: Storage, path: &Path) -> Result<Tensor> {
    let read_err = |e| storage.read_error(path, e);
    let mut magic = [0u8; 4];
    let got = read_up_to(&mut r, &mut magic).map_err(read_err)?;
    if got < 4 {
        return Err(DataError::TruncatedHeader {
            path: path.to_path_buf(),
            expected: 4,
            actual: got,
        });
    }
    if magic[0] != 0 || magic[1] != 0 {
        return Err(DataError::BadMagic {
            path: path.to_path_buf(),
            magic: u32::from_be_bytes(magic),
        });
    }
    let ty = IdxType::from_code(magic[2]).ok_or(DataError::UnsupportedType {
        path: path.to_path_buf(),
        code: magic[2],
    })?;
    let rank = usize::from(magic[3]);
    if rank == 0 || rank > MAX_RANK {
        return Err(DataError::WrongRank {
            path: path.to_path_buf(),
            expected: format!("1 to {MAX_RANK}"),
            actual: rank,
        });
    }
    let mut dim_bytes = [0u8; 4 * MAX_RANK];
    let dim_bytes = &mut dim_bytes[..4 * rank];
    let got = read_up_to(&mut r, dim_bytes).map_err(read_err)?;
    let header = 4 + 4 * rank;
    if got < dim_bytes.len() {
        return Err(DataError::TruncatedHeader {
            path: path.to_path_buf(),
            expected: header,
            actual: 4 + got,
        });
    }
    let dims: Vec<usize> = dim_bytes
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    // Saturates only far above any size the storage check lets through.
    let expected = dims
        .iter()
        .fold(ty.size() as u128, |acc, &d| acc.saturating_mul(d as u128));
    let data_len = storage.check_declared(path, &dims, header, expected)?;
    let elems = data_len / ty.size();
    let device_error = |e| DataError::from(mirra_tensor::TensorError::from(e));
    let mut buffer = Buffer::alloc(ty.dtype(), elems, Device::Cpu).map_err(device_error)?;
    let bytes = buffer.as_bytes_mut().map_err(device_error)?;
    let start = bytes.len() - data_len;
    let got = read_up_to(&mut r, &mut bytes[start..]).map_err(read_err)?;
    if got < data_len {
        return Err(DataError::LengthMismatch {
            path: path.to_path_buf(),
            dims,
            expected,
            actual: got as u128,
        });
    }
    // One byte more ends the stream (and makes flate2 check the last member's trailer);
    // a stream that goes on is refused here, not inflated further.
    if read_up_to(&mut r, &mut [0u8; 1]).map_err(read_err)? > 0 {
        return Err(DataError::TrailingData {
            path: path.to_path_buf(),
            dims,
            expected,
        });
    }
    ty.to_native_in_place(bytes, start);
    Ok(Tensor::from_buffer(buffer, &dims)?)
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
    use std::path::PathBuf;

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
            "FILE: IDX rank 0, expected 1 to 8"
        );
        assert_eq!(
            err(&idx_bytes(0x08, &[1; 9], &[0])),
            "FILE: IDX rank 9, expected 1 to 8"
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
