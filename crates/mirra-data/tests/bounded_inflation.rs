//! Reading IDX data costs at most what its header declares: a gzip bomb (the issue's
//! case: 3 MB of gzip inflating to 3 GiB behind a header that declares 1,000 bytes) is
//! refused after inflating the declared bytes and one more; a header declaring more than
//! the stored bytes can hold is refused before anything is allocated.

use std::io::{Read, Write};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use mirra_data::{read_idx, read_idx_bytes, DataError};
use mirra_mutation::{peak_during, CountingAlloc};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const MIB: u64 = 1 << 20;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// An IDX file of `n` u8 elements, rank 1, with data bytes `data`.
fn idx(n: u32, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, 1];
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// A valid 1,000-byte IDX file, gzipped, followed by 192 gzip members of 16 MiB of zeros
/// each (3 GiB in all), the last of them damaged in its checksum.
fn bomb() -> Vec<u8> {
    let mut file = gzip(&idx(1000, &[7; 1000]));
    let zeros = gzip(&vec![0u8; 16 << 20]);
    for _ in 0..192 {
        file.extend_from_slice(&zeros);
    }
    let n = file.len();
    file[n - 8] ^= 0xff;
    file
}

#[test]
fn a_gzip_bomb_is_refused_after_the_declared_bytes() {
    let bomb = bomb();
    assert!(bomb.len() < 4 << 20, "{} bytes", bomb.len());
    let (got, peak) = peak_during(|| read_idx_bytes(&bomb, "bomb.gz"));
    let e = got.unwrap_err();
    // The data going on is what is reported, not the damaged checksum 3 GiB further: the
    // stream was not inflated that far.
    assert!(matches!(e, DataError::TrailingData { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "bomb.gz: dimensions [1000] need 1000 data bytes, but the data goes on after them \
         (trailing bytes)"
    );
    assert!(peak <= 1008 + MIB, "allocated {peak} bytes");

    // The same from a file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.gz");
    std::fs::write(&path, &bomb).unwrap();
    let (got, peak) = peak_during(|| read_idx(&path));
    assert!(matches!(got, Err(DataError::TrailingData { .. })));
    assert!(peak <= 1008 + MIB, "allocated {peak} bytes");
}

#[test]
fn the_allocation_bound_catches_inflating_first_and_checking_after() {
    // What the reader did before: inflate everything, then compare with the header. Even
    // stopped at 64 MiB, that is far over the bound the reader now keeps.
    let bomb = bomb();
    let (_, peak) = peak_during(|| {
        let mut all = Vec::new();
        let _ = MultiGzDecoder::new(&bomb[..])
            .take(64 * MIB)
            .read_to_end(&mut all);
        all.len()
    });
    assert!(peak > 64 * MIB, "allocated {peak} bytes");
}

#[test]
fn a_header_declaring_more_than_the_file_can_hold_allocates_nothing() {
    // 47 MB declared in 50-odd bytes of gzip: no stream that short inflates that far.
    let mut header = vec![0, 0, 0x08, 3];
    for d in [60_000u32, 28, 28] {
        header.extend_from_slice(&d.to_be_bytes());
    }
    header.extend_from_slice(&[1; 10]);
    let gz = gzip(&header);
    let (got, peak) = peak_during(|| read_idx_bytes(&gz, "liar.gz"));
    assert_eq!(
        got.unwrap_err().to_string(),
        format!(
            "liar.gz: dimensions [60000, 28, 28] declare 47040016 bytes, more than the {} \
             this file can hold (a gzip stream inflates at most 1032-fold)",
            gz.len() * 1032
        )
    );
    assert!(peak < 256 << 10, "allocated {peak} bytes");

    // Raw, the file's length is known before reading: the mismatch is found first.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("liar");
    std::fs::write(&path, &header).unwrap();
    let (got, peak) = peak_during(|| read_idx(Path::new(&path)));
    assert!(got.unwrap_err().to_string().ends_with(
        "dimensions [60000, 28, 28] need 47040000 data bytes, the file has 10 (truncated)"
    ));
    assert!(peak < 64 << 10, "allocated {peak} bytes");
}

#[test]
fn a_declared_size_the_file_can_hold_is_read_to_the_byte() {
    // A large declared size that the stream really holds is read, at the cost of that
    // size and no more.
    let data = vec![3u8; 5 << 20];
    let gz = gzip(&idx(data.len() as u32, &data));
    let (got, peak) = peak_during(|| read_idx_bytes(&gz, "big.gz"));
    let t = got.unwrap();
    assert_eq!(t.dims(), &[5 << 20]);
    assert!(t.as_slice::<u8>().unwrap().iter().all(|&b| b == 3));
    assert!(peak <= (5 << 20) + MIB, "allocated {peak} bytes");
}
