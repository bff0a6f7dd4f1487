//! The harness catches what it is for: each wrong reader below fails `check_reader` for
//! its own reason, and the right one passes, reading some damaged files (a changed data
//! byte is still a valid file) and refusing others.
//!
//! The toy format: a little-endian u16 count of 1 KiB blocks, then the blocks.

use std::path::Path;
use std::time::Duration;

use mirra_mutation::{check_reader, peak_during, Config, CountingAlloc, Expectation};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const BLOCK: usize = 1024;

fn original() -> Vec<u8> {
    let mut f = 2u16.to_le_bytes().to_vec();
    f.extend((0..2 * BLOCK).map(|i| (i % 251) as u8));
    f
}

/// The blocks a file declares, if it has a header.
fn declared(bytes: &[u8]) -> Option<usize> {
    bytes
        .get(..2)
        .map(|h| usize::from(u16::from_le_bytes([h[0], h[1]])) * BLOCK)
}

/// The oracle: valid when the file is exactly as long as it declares.
fn expect(bytes: &[u8]) -> Expectation<Vec<u8>> {
    let data = declared(bytes);
    Expectation {
        contents: data
            .filter(|&n| bytes.len() == 2 + n)
            .map(|_| bytes[2..].to_vec()),
        declared_bytes: data.map_or(0, |n| n.min(bytes.len()) as u64),
    }
}

fn right(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match declared(&bytes) {
        Some(n) if bytes.len() == 2 + n => Ok(bytes[2..].to_vec()),
        _ => Err(format!("{}: wrong length", path.display())),
    }
}

fn config(cases: u32) -> Config {
    Config {
        time_limit: Duration::from_millis(500),
        max_shrink_iters: 8,
        ..Config::new(cases)
    }
}

fn check(reader: fn(&Path) -> Result<Vec<u8>, String>) -> Result<mirra_mutation::Stats, String> {
    check_reader(&config(300), "toy.blocks", &original(), reader, expect)
}

#[test]
fn the_right_reader_passes_reading_some_damaged_files_and_refusing_others() {
    let stats = check(right).unwrap();
    assert_eq!(stats.read + stats.refused, 300);
    assert!(stats.read > 0 && stats.refused > 0, "{stats:?}");
    assert!(stats.max_alloc >= 2 * BLOCK as u64, "{stats:?}");
}

#[test]
fn a_panic_is_caught() {
    fn panics(path: &Path) -> Result<Vec<u8>, String> {
        // Right but for a slice taken before the length is checked.
        let bytes = std::fs::read(path).unwrap();
        let data = bytes[2..2 + declared(&bytes).unwrap()].to_vec();
        right(path).map(|_| data)
    }
    let e = check(panics).unwrap_err();
    assert!(e.contains("the read panicked"), "{e}");
}

#[test]
fn a_hang_is_caught() {
    fn hangs(path: &Path) -> Result<Vec<u8>, String> {
        if std::fs::read(path).unwrap().len() % 2 == 1 {
            std::thread::sleep(Duration::from_secs(3600));
        }
        right(path)
    }
    let e = check(hangs).unwrap_err();
    assert!(e.contains("the read still ran after 500ms"), "{e}");
}

#[test]
fn an_allocation_of_an_unchecked_size_is_caught() {
    fn trusts_the_header(path: &Path) -> Result<Vec<u8>, String> {
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(declared(&bytes).unwrap_or(0));
        out.extend_from_slice(bytes.get(2..).unwrap_or_default());
        std::hint::black_box(&out);
        right(path)
    }
    // Only a flip of the header's high byte declares more than the 1 MiB of slack: about
    // one case in 250 draws one, so 300 cases missed it in about 3 runs of 10. 6000 cases
    // miss it with a probability near e^-24.
    let e = check_reader(
        &config(6000),
        "toy.blocks",
        &original(),
        trusts_the_header,
        expect,
    )
    .unwrap_err();
    assert!(e.contains("the read allocated"), "{e}");
}

#[test]
fn wrong_contents_and_wrong_verdicts_are_caught() {
    fn reversed(path: &Path) -> Result<Vec<u8>, String> {
        right(path).map(|mut v| {
            v.reverse();
            v
        })
    }
    assert!(check(reversed).unwrap_err().contains(" instead of "));
    fn accepts_anything(path: &Path) -> Result<Vec<u8>, String> {
        Ok(std::fs::read(path).unwrap_or_default())
    }
    let e = check(accepts_anything).unwrap_err();
    assert!(
        e.contains("read without error") || e.contains(" instead of "),
        "{e}"
    );
    fn refuses_everything(path: &Path) -> Result<Vec<u8>, String> {
        Err(format!("{}: no", path.display()))
    }
    assert!(check(refuses_everything)
        .unwrap_err()
        .contains("a valid file was refused"));
}

#[test]
fn errors_must_be_one_line_naming_the_file() {
    fn two_lines(path: &Path) -> Result<Vec<u8>, String> {
        right(path).map_err(|e| format!("{e}\nmore"))
    }
    assert!(check(two_lines).unwrap_err().contains("not one line"));
    fn anonymous(path: &Path) -> Result<Vec<u8>, String> {
        right(path).map_err(|_| "wrong length".to_string())
    }
    assert!(check(anonymous)
        .unwrap_err()
        .contains("does not name the file"));
}

#[test]
fn the_counter_sees_a_threads_peak_not_its_end() {
    let (_, peak) = peak_during(|| {
        let big = std::hint::black_box(vec![0u8; 3 << 20]);
        drop(big);
        std::hint::black_box(vec![0u8; 10])
    });
    assert!((3 << 20..(3 << 20) + 4096).contains(&peak), "{peak}");
}
