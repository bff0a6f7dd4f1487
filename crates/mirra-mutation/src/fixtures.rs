//! Files laid out as their formats' own writers lay them out, for tests that need one
//! without that writer.

/// A version-1 `.npy` file as `numpy.save` writes it: the magic, the version, a header
/// dict (`descr`, C order, `shape` as Python writes a tuple: `(3,)`, `(2, 3)`) padded
/// with spaces so that the data starts at a multiple of 64 and ended by a newline, then
/// `data` (the elements' little-endian bytes).
pub fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}
