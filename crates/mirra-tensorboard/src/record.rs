//! TFRecord framing, the container of event files.
//!
//! A record is
//!
//! ```text
//! u64    length of data, little-endian
//! u32    masked CRC32C of the 8 length bytes, little-endian
//! [u8]   data
//! u32    masked CRC32C of data, little-endian
//! ```
//!
//! where the mask (TensorFlow's `crc32c::Mask`) rotates the CRC right by 15 bits and adds
//! `0xa282ead8`, so that a CRC of bytes that themselves hold CRCs stays well distributed.

use std::path::Path;

use crate::{Result, TensorBoardError};

/// The constant [`mask`] adds.
pub const MASK_DELTA: u32 = 0xa282_ead8;

/// Bytes a record adds around its data: length, its checksum, the data's checksum.
pub const OVERHEAD: usize = 8 + 4 + 4;

/// TensorFlow's masking of a CRC: `((crc >> 15) | (crc << 17)) + 0xa282ead8`, wrapping.
pub fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// The masked CRC32C (Castagnoli) of `data`, as stored in a record.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    mask(crc32c::crc32c(data))
}

/// Appends a record holding `data` to `out`.
pub fn encode(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.reserve(data.len() + OVERHEAD);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

/// One record found by [`decode_all`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Where the record starts in the input.
    pub offset: u64,
    /// Its data.
    pub data: &'a [u8],
}

/// Splits `bytes` into records, checking both checksums of each. `path` names the input
/// in errors: [`TensorBoardError::Truncated`] when the input ends inside a record,
/// [`TensorBoardError::Corrupt`] when a checksum does not match.
pub fn decode_all<'a>(bytes: &'a [u8], path: &Path) -> Result<Vec<Record<'a>>> {
    let mut records = vec![];
    let mut pos = 0usize;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        let truncated = |needed: u64| TensorBoardError::Truncated {
            path: path.to_path_buf(),
            offset: pos as u64,
            needed,
            left: rest.len() as u64,
        };
        let corrupt = |part, stored, found| TensorBoardError::Corrupt {
            path: path.to_path_buf(),
            offset: pos as u64,
            part,
            stored,
            found,
        };
        let (Some(len_bytes), Some(len_crc)) = (rest.get(..8), rest.get(8..12)) else {
            return Err(truncated(12));
        };
        check(len_bytes, len_crc).map_err(|(s, f)| corrupt("length", s, f))?;
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        let needed = len.saturating_add(OVERHEAD as u64);
        let Some(record) = usize::try_from(needed).ok().and_then(|n| rest.get(..n)) else {
            return Err(truncated(needed));
        };
        let data = &record[12..record.len() - 4];
        check(data, &record[record.len() - 4..]).map_err(|(s, f)| corrupt("data", s, f))?;
        records.push(Record {
            offset: pos as u64,
            data,
        });
        pos += record.len();
    }
    Ok(records)
}

/// `Err((stored, found))` when the masked CRC32C of `bytes` is not the 4 bytes `stored`.
fn check(bytes: &[u8], stored: &[u8]) -> std::result::Result<(), (u32, u32)> {
    let stored = u32::from_le_bytes(stored.try_into().expect("4 bytes"));
    let found = masked_crc32c(bytes);
    if stored == found {
        Ok(())
    } else {
        Err((stored, found))
    }
}
