//! The IDX reader under mutation: the bundled MNIST files, gzipped as stored and raw,
//! flipped, truncated and extended at random. Every damaged file gives one error line
//! naming it or exactly the tensor it holds (as an independent decoder below reads it),
//! within the time bound, without a panic, and allocating at most the tensor its header
//! declares (when its stored bytes can hold that much, else nothing) plus 1 MiB.
//!
//! `MIRRA_MUTATION_CASES=N` runs N cases in all (default: 3,556).

use std::fmt;
use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;
use mirra_data::{read_idx, DataError, MAX_DEFLATE_RATIO};
use mirra_mutation::{cases_from_env, check_reader, Config, CountingAlloc, Expectation};
use mirra_tensor::{DType, Device, Tensor, MAX_RANK};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// A tensor compared by dims, dtype and bytes.
struct Idx(Tensor);

impl PartialEq for Idx {
    fn eq(&self, other: &Idx) -> bool {
        // Both are whole contiguous tensors (as read, as built below).
        self.0.dims() == other.0.dims()
            && self.0.dtype() == other.0.dtype()
            && self.0.as_bytes().unwrap() == other.0.as_bytes().unwrap()
    }
}

impl fmt::Debug for Idx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.0.dtype(), self.0.dims())
    }
}

fn read(path: &Path) -> Result<Idx, DataError> {
    read_idx(path).map(Idx)
}

/// Decompresses at most this much: more than any file here holds, and no damaged gzip
/// stream that still checks out inflates past its original.
const INFLATE_LIMIT: u64 = 64 << 20;

/// What `bytes`, as an IDX file, hold, worked out on its own: `(data, complete)`, the
/// decompressed bytes (as far as they go) and whether the gzip stream (if any) is whole.
fn decompressed(bytes: &[u8]) -> (Vec<u8>, bool) {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return (bytes.to_vec(), true);
    }
    let mut out = Vec::new();
    let mut d = MultiGzDecoder::new(bytes).take(INFLATE_LIMIT);
    let ok = d.read_to_end(&mut out).is_ok() && (out.len() as u64) < INFLATE_LIMIT;
    (out, ok)
}

/// The independent decoder: element size, dtype and the big-endian to native conversion
/// of each IDX type code.
fn idx_type(code: u8) -> Option<(usize, DType)> {
    Some(match code {
        0x08 => (1, DType::U8),
        0x09 => (1, DType::I32),
        0x0B => (2, DType::I32),
        0x0C => (4, DType::I32),
        0x0D => (4, DType::F32),
        0x0E => (8, DType::F64),
        _ => return None,
    })
}

/// The native bytes of the big-endian elements `be` of IDX type `code`.
fn native(code: u8, be: &[u8], size: usize) -> Vec<u8> {
    if code == 0x08 {
        return be.to_vec();
    }
    let mut out = Vec::with_capacity(be.len() * 4);
    for e in be.chunks(size) {
        match code {
            0x09 => out.extend_from_slice(&(e[0] as i8 as i32).to_ne_bytes()),
            0x0B => out.extend_from_slice(&(i16::from_be_bytes([e[0], e[1]]) as i32).to_ne_bytes()),
            0x0C | 0x0D => {
                out.extend_from_slice(&u32::from_be_bytes(e.try_into().unwrap()).to_ne_bytes())
            }
            _ => out.extend_from_slice(&u64::from_be_bytes(e.try_into().unwrap()).to_ne_bytes()),
        }
    }
    out
}

fn expect(bytes: &[u8]) -> Expectation<Idx> {
    let none = Expectation {
        contents: None,
        declared_bytes: 0,
    };
    let (data, complete) = decompressed(bytes);
    if data.len() < 4 || data[0] != 0 || data[1] != 0 {
        return none;
    }
    let (code, rank) = (data[2], usize::from(data[3]));
    let Some((size, dtype)) = idx_type(code) else {
        return none;
    };
    let header = 4 + 4 * rank;
    if !(1..=MAX_RANK).contains(&rank) || data.len() < header {
        return none;
    }
    let dims: Vec<usize> = data[4..header]
        .chunks(4)
        .map(|c| u32::from_be_bytes(c.try_into().unwrap()) as usize)
        .collect();
    // Eight dimensions of up to 2^32 overflow even a u128: such a header cannot be held by
    // any file, so it must be refused (a mutation found it: a plain product panicked).
    let Some(elems) = dims
        .iter()
        .try_fold(1u128, |a, &d| a.checked_mul(d as u128))
    else {
        return none;
    };
    let Some(declared_data) = elems.checked_mul(size as u128) else {
        return none;
    };
    // What the stored bytes can hold: a raw file exactly its length, a gzip stream at
    // most 1032 times its length.
    let stored = bytes.len() as u128;
    let holdable = if bytes.starts_with(&[0x1f, 0x8b]) {
        (header as u128).saturating_add(declared_data) <= stored * u128::from(MAX_DEFLATE_RATIO)
    } else {
        (header as u128).saturating_add(declared_data) == stored
    };
    let declared_bytes = if holdable {
        (elems * dtype.size_in_bytes() as u128) as u64
    } else {
        0
    };
    let valid = complete && (data.len() - header) as u128 == declared_data;
    let contents = valid.then(|| {
        let native = native(code, &data[header..], size);
        let t = Tensor::from_slice(&native, &[native.len()], Device::Cpu).unwrap();
        // The bytes reinterpreted as the dtype, through a buffer of that dtype.
        Idx(retype(&t, dtype, &dims))
    });
    Expectation {
        contents,
        declared_bytes,
    }
}

/// A u8 tensor's bytes as a tensor of `dtype` and `dims`.
fn retype(bytes: &Tensor, dtype: DType, dims: &[usize]) -> Tensor {
    let raw = bytes.as_slice::<u8>().unwrap();
    match dtype {
        DType::U8 => Tensor::from_slice(raw, dims, Device::Cpu),
        DType::I32 => Tensor::from_vec(
            raw.chunks(4)
                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                .collect(),
            dims,
            Device::Cpu,
        ),
        DType::F32 => Tensor::from_vec(
            raw.chunks(4)
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect(),
            dims,
            Device::Cpu,
        ),
        _ => Tensor::from_vec(
            raw.chunks(8)
                .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
                .collect(),
            dims,
            Device::Cpu,
        ),
    }
    .unwrap()
}

fn bundled(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/mnist")
            .join(name),
    )
    .unwrap()
}

fn inflate(gz: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    MultiGzDecoder::new(gz).read_to_end(&mut out).unwrap();
    out
}

#[test]
fn the_bundled_idx_files_under_mutation_give_one_error_or_their_contents() {
    let labels_gz = bundled("t10k-labels-idx1-ubyte.gz");
    let images_gz = bundled("t10k-images-idx3-ubyte.gz");
    // (file name, bytes, default cases): the small files take most cases, the 1.6 MB and
    // 7.8 MB image files (a read each inflates or reads them whole) a few.
    let files = [
        ("t10k-labels-idx1-ubyte.gz", labels_gz.clone(), 2000),
        ("t10k-labels-idx1-ubyte", inflate(&labels_gz), 1500),
        ("t10k-images-idx3-ubyte.gz", images_gz.clone(), 16),
        ("t10k-images-idx3-ubyte", inflate(&images_gz), 40),
    ];
    let defaults: Vec<u32> = files.iter().map(|f| f.2).collect();
    let cases = cases_from_env(&defaults).unwrap();
    let mut failures = Vec::new();
    for ((name, bytes, _), n) in files.iter().zip(cases) {
        // The undamaged file reads as the oracle says: the oracle is not vacuous.
        let whole = expect(bytes);
        assert!(
            whole.contents.is_some(),
            "{name}: the oracle refuses the original"
        );
        let start = std::time::Instant::now();
        match check_reader(&Config::new(n), name, bytes, read, expect) {
            Ok(stats) => {
                println!("{name}: {n} cases in {:.2?}: {stats:?}", start.elapsed());
                assert!(stats.refused > 0, "{name}: no damaged file was refused");
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The expectation itself survives any header: six dimensions of 2^32 - 1 (a product past
/// u128) are a file no reader may accept, and the reader refuses it.
#[test]
fn an_impossible_header_is_expected_to_be_refused() {
    let mut bytes = vec![0u8, 0, 0x08, 6];
    for _ in 0..6 {
        bytes.extend(u32::MAX.to_be_bytes());
    }
    bytes.extend([1, 2, 3]);
    let e = expect(&bytes);
    assert!(e.contents.is_none() && e.declared_bytes == 0);
    assert!(mirra_data::read_idx_bytes(&bytes, "impossible").is_err());
}
