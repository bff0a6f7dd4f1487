//! Event files: checksums, framing, round trips and damaged files.

use std::path::Path;

use mirra_tensorboard::proto::{event, summary, Event, Summary};
use mirra_tensorboard::record::{self, decode_all, mask, masked_crc32c};
use mirra_tensorboard::{
    event_files, read_events, read_scalars, SummaryWriter, TensorBoardError, FILE_VERSION,
};
use prost::Message;

/// Two events as TensorBoard's own Python writer frames them
/// (`tensorboard.summary.writer.record_writer.RecordWriter` on `event_pb2.Event`s):
/// `{wall_time: 1.5, file_version: "brain.Event:2"}` and
/// `{wall_time: 2.0, step: 3, summary: {value: [{tag: "epoch_loss", simple_value: 0.25}]}}`.
const TENSORBOARD_BYTES: [u8; 88] = [
    0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f, 0x4b, 0x22, 0x09, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0xf8, 0x3f, 0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e, 0x2e, 0x45, 0x76, 0x65,
    0x6e, 0x74, 0x3a, 0x32, 0x2a, 0x28, 0x64, 0x6c, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x29, 0xed, 0xa9, 0x50, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x10, 0x03, 0x2a,
    0x13, 0x0a, 0x11, 0x0a, 0x0a, 0x65, 0x70, 0x6f, 0x63, 0x68, 0x5f, 0x6c, 0x6f, 0x73, 0x73, 0x15,
    0x00, 0x00, 0x80, 0x3e, 0x6e, 0x8d, 0xc1, 0x7b,
];

fn tensorboard_events() -> [Event; 2] {
    [
        Event {
            wall_time: 1.5,
            step: 0,
            what: Some(event::What::FileVersion(FILE_VERSION.into())),
        },
        Event {
            wall_time: 2.0,
            step: 3,
            what: Some(event::What::Summary(Summary {
                value: vec![summary::Value {
                    tag: "epoch_loss".into(),
                    simple_value: Some(0.25),
                }],
            })),
        },
    ]
}

#[test]
fn masked_crc32c_of_the_check_string_matches_the_hand_computation() {
    // CRC-32C of "123456789" is the catalogue's check value 0xe3069283. Masking:
    //   crc >> 15               = 0x0001c60d
    //   crc << 17 (32 bits)     = 0x25060000
    //   rotated (the two or-ed) = 0x2507c60d
    //   + 0xa282ead8 (wrapping) = 0xc78ab0e5 (TensorBoard's masked_crc32c agrees)
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(mask(0xe306_9283), 0x2507_c60d_u32.wrapping_add(0xa282_ead8));
    assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    // The addition wraps instead of overflowing.
    assert_eq!(mask(0xffff_ffff), 0xffff_ffff_u32.wrapping_add(0xa282_ead8));
}

#[test]
fn records_are_byte_identical_to_tensorboards() {
    let mut ours = vec![];
    for e in tensorboard_events() {
        record::encode(&e.encode_to_vec(), &mut ours);
    }
    assert_eq!(ours, TENSORBOARD_BYTES);
}

#[test]
fn tensorboards_records_decode() {
    let records = decode_all(&TENSORBOARD_BYTES, Path::new("fixture")).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[1].offset, 24 + record::OVERHEAD as u64);
    let events: Vec<Event> = records
        .iter()
        .map(|r| Event::decode(r.data).unwrap())
        .collect();
    assert_eq!(events, tensorboard_events());
}

#[test]
fn scalars_round_trip_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = {
        let mut w = SummaryWriter::new(dir.path()).unwrap();
        for step in 0..3 {
            w.add_scalar("epoch_loss", 1.0 / (step + 1) as f32, step)
                .unwrap();
            w.add_scalar("epoch_accuracy", 0.5 + step as f32 / 10.0, step)
                .unwrap();
        }
        w.add_scalar("zero", 0.0, 7).unwrap();
        w.path().to_path_buf()
        // Dropped here: flushes.
    };
    assert_eq!(event_files(dir.path()).unwrap(), vec![path.clone()]);
    let events = read_events(&path).unwrap();
    assert_eq!(events.len(), 8);
    assert_eq!(
        events[0].what,
        Some(event::What::FileVersion("brain.Event:2".into()))
    );
    let scalars = read_scalars(&path).unwrap();
    let got: Vec<(&str, i64, f32)> = scalars
        .iter()
        .map(|s| (s.tag.as_str(), s.step, s.value))
        .collect();
    assert_eq!(
        got,
        [
            ("epoch_loss", 0, 1.0),
            ("epoch_accuracy", 0, 0.5),
            ("epoch_loss", 1, 0.5),
            ("epoch_accuracy", 1, 0.6),
            ("epoch_loss", 2, 1.0 / 3.0),
            ("epoch_accuracy", 2, 0.7),
            ("zero", 7, 0.0),
        ]
    );
    assert!(scalars.iter().all(|s| s.wall_time > 1.6e9));
}

#[test]
fn flush_makes_events_readable_while_the_writer_lives() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = SummaryWriter::new(dir.path()).unwrap();
    // The file-version event is on disk as soon as the writer exists.
    assert_eq!(read_events(w.path()).unwrap().len(), 1);
    w.add_scalar("a", 1.0, 0).unwrap();
    w.flush().unwrap();
    assert_eq!(read_scalars(w.path()).unwrap().len(), 1);
}

/// The bytes of a file holding the file-version event and one scalar, and its path.
fn small_file(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let path = {
        let mut w = SummaryWriter::new(dir).unwrap();
        w.add_scalar("epoch_loss", 0.5, 0).unwrap();
        w.path().to_path_buf()
    };
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

#[test]
fn a_flipped_bit_anywhere_is_reported_as_corruption_at_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes) = small_file(dir.path());
    let first_len = read_events(&path).unwrap()[0].encoded_len() + record::OVERHEAD;
    for i in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0x10;
        std::fs::write(&path, &damaged).unwrap();
        let err = read_events(&path).unwrap_err();
        let TensorBoardError::Corrupt { offset, part, .. } = &err else {
            panic!("byte {i}: {err}");
        };
        let record_start = if i < first_len { 0 } else { first_len as u64 };
        assert_eq!(*offset, record_start, "byte {i}: {err}");
        let pos = i - record_start as usize;
        assert_eq!(*part, if pos < 12 { "length" } else { "data" }, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("corrupt record") && msg.contains(path.to_str().unwrap()),
            "{msg}"
        );
    }
}

#[test]
fn a_file_cut_short_is_reported_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes) = small_file(dir.path());
    let first_len = read_events(&path).unwrap()[0].encoded_len() + record::OVERHEAD;
    for cut in 1..bytes.len() {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        match read_events(&path) {
            // A cut between records leaves a shorter, valid file.
            Ok(events) => assert_eq!(cut, first_len, "cut at {cut}: {events:?}"),
            Err(TensorBoardError::Truncated { offset, left, .. }) => {
                let start = if cut < first_len { 0 } else { first_len };
                assert_eq!((offset, left), (start as u64, (cut - start) as u64));
            }
            Err(e) => panic!("cut at {cut}: {e}"),
        }
    }
}

#[test]
fn a_record_that_is_not_an_event_is_a_decode_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.out.tfevents.bad");
    let mut bytes = vec![];
    // Field 1 (wall_time, a double) with a varint wire type, then nothing.
    record::encode(&[0x08], &mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    let err = read_events(&path).unwrap_err();
    assert!(
        matches!(err, TensorBoardError::Decode { offset: 0, .. }),
        "{err}"
    );
}

#[test]
fn a_missing_file_names_itself() {
    let err = read_events("/no/such/events.out.tfevents.1").unwrap_err();
    assert!(
        matches!(err, TensorBoardError::Io { .. }) && err.to_string().contains("/no/such/"),
        "{err}"
    );
}

#[test]
fn event_files_skips_other_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
    std::fs::create_dir(dir.path().join("train")).unwrap();
    assert!(event_files(dir.path()).unwrap().is_empty());
    let w = SummaryWriter::new(dir.path()).unwrap();
    assert_eq!(
        event_files(dir.path()).unwrap(),
        vec![w.path().to_path_buf()]
    );
}
