//! The event-file reader under mutation: a real file written by [`SummaryWriter`] (the
//! file-version event and 30 scalars), flipped, truncated and extended at random. Every
//! damaged file gives one error line naming it or exactly the events it holds (as an
//! independent reading of the TFRecord framing below finds them), within the time bound,
//! without a panic, and allocating at most the file's size plus 1 MiB (the reader trusts
//! no length field).
//!
//! `MIRRA_MUTATION_CASES=N` runs N cases (default: 3,000).

use std::path::Path;

use mirra_mutation::{cases_from_env, check_reader, Config, CountingAlloc, Expectation};
use mirra_tensorboard::{read_events, Event, SummaryWriter, TensorBoardError};
use prost::Message;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Each event, encoded again (events hold floats: bytes compare where NaN would not).
fn read(path: &Path) -> Result<Vec<Vec<u8>>, TensorBoardError> {
    Ok(read_events(path)?
        .iter()
        .map(Message::encode_to_vec)
        .collect())
}

/// TensorFlow's masked CRC32C, written out again.
fn masked(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
        .rotate_right(15)
        .wrapping_add(0xa282_ead8)
}

/// The events of `bytes` when every record is whole, both its checksums match and its
/// data is an `Event`; `None` otherwise.
fn events(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut rest = bytes;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len_bytes = rest.get(..8)?;
        let stored = u32::from_le_bytes(rest.get(8..12)?.try_into().ok()?);
        if masked(len_bytes) != stored {
            return None;
        }
        let len = usize::try_from(u64::from_le_bytes(len_bytes.try_into().ok()?)).ok()?;
        let data = rest.get(12..12usize.checked_add(len)?)?;
        let end = 12 + len + 4;
        let stored = u32::from_le_bytes(rest.get(12 + len..end)?.try_into().ok()?);
        if masked(data) != stored {
            return None;
        }
        out.push(Event::decode(data).ok()?.encode_to_vec());
        rest = &rest[end..];
    }
    Some(out)
}

fn expect(bytes: &[u8]) -> Expectation<Vec<Vec<u8>>> {
    Expectation {
        contents: events(bytes),
        declared_bytes: bytes.len() as u64,
    }
}

#[test]
fn an_event_file_under_mutation_gives_one_error_or_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = {
        let mut w = SummaryWriter::new(dir.path()).unwrap();
        for step in 0..15 {
            w.add_scalar("epoch_loss", 1.0 / (step + 1) as f32, step)
                .unwrap();
            w.add_scalar("epoch_accuracy", 0.5 + step as f32 / 40.0, step)
                .unwrap();
        }
        w.path().to_path_buf()
    };
    let original = std::fs::read(&path).unwrap();
    assert_eq!(
        events(&original).map(|e| e.len()),
        Some(31),
        "the oracle reads the file"
    );
    let cases = cases_from_env(&[3000]).unwrap()[0];
    let name = path.file_name().unwrap().to_str().unwrap();
    let stats = check_reader(&Config::new(cases), name, &original, read, expect)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("{cases} cases: {stats:?}");
    // Cuts at record boundaries read as the events before them; everything else fails.
    assert!(stats.read > 0 && stats.refused > 0, "{stats:?}");
}
