//! The checkpoint reader under mutation: real checkpoint files (written by `fit` through
//! `ModelCheckpoint`) have bits flipped, bytes replaced, their header length rewritten,
//! and are truncated, extended and spliced at random. Every read must end in one of two
//! ways: one `TrainError::Checkpoint` line naming the file, or a checkpoint equal to the
//! original in every field and every tensor bit (a mutation that changes nothing that is
//! read, such as a space of the header's padding turned into a tab). Never a panic, never
//! a hang (each read is timed), and never more memory than the file and the tensors its
//! header declares (at most the file again, as safetensors checks) plus 1 MiB, measured by
//! a counting allocator.
//!
//! `MUTATION_CASES` cases per file (`MIRRA_MUTATION_CASES` to run more); the seed of a
//! failing case is printed so that it can be replayed (`MIRRA_MUTATION_SEED`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use mirra_data::Dataset;
use mirra_nn::loss::SparseCategoricalCrossentropy;
use mirra_nn::{Accuracy, Activation, Dense, Dropout, Flatten, Sequential};
use mirra_optim::Adam;
use mirra_tensor::init::{rng, Initializer};
use mirra_tensor::{DType, Device, Tensor};
use mirra_train::{Callback, Checkpoint, FitConfig, Model, ModelCheckpoint, TrainError};
use rand::RngExt;

/// Cases per file in CI.
const MUTATION_CASES: usize = 2500;
/// Memory a read may use beyond the file and the tensors its header declares.
const SLACK_BYTES: usize = 1 << 20;
/// The longest a read may take (a hang would take forever).
const READ_LIMIT: Duration = Duration::from_secs(5);

/// The system allocator, counting the bytes live and the most live since a reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are
// only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let live = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most bytes `f` had live at once beyond those live when it started, with its result.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(start))
}

/// A checkpoint written by a real `fit`: `hidden` units, dropout (so the generator's
/// state is not the seed's), two epochs on random examples of `features` pixels.
fn real_checkpoint(dir: &Path, name: &str, features: usize, hidden: usize) -> Vec<u8> {
    let mut net = Sequential::new(vec![
        Box::new(Flatten),
        Box::new(Dense::new(hidden, Activation::Relu)),
        Box::new(Dropout::new(0.25)),
        Box::new(Dense::new(10, Activation::Softmax)),
    ]);
    net.build(&[features], 3).unwrap();
    let mut model = Model::compile(
        net,
        Box::new(Adam::new(1e-3)),
        Box::new(SparseCategoricalCrossentropy::default()),
        vec![Box::new(Accuracy::new())],
        3,
    );
    let n = 64;
    let normal = Initializer::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let x = normal
        .init(&[n, features], DType::F32, Device::Cpu, &mut rng(4))
        .unwrap();
    let y = Tensor::from_vec((0..n as i64).map(|i| i % 10).collect(), &[n], Device::Cpu).unwrap();
    let data = Dataset::from_tensor_slices(vec![x, y])
        .unwrap()
        .shuffle(n, 5)
        .batch(16, false);
    let path = dir.join(name);
    let checkpoint = ModelCheckpoint::new(&path)
        .unwrap()
        .data_seed(5)
        .metadata("model", "mutation-test");
    let mut callbacks: Vec<Box<dyn Callback>> = vec![Box::new(checkpoint)];
    let config = FitConfig {
        epochs: 2,
        initial_epoch: 0,
    };
    model
        .fit(&data, Some(&data), &config, &mut callbacks)
        .unwrap();
    std::fs::read(&path).unwrap()
}

/// Every field and every tensor bit of a checkpoint, comparable.
fn contents(c: &Checkpoint) -> String {
    let tensors = c.weights.iter().chain(&c.optimizer_state).map(|(n, t)| {
        let t = t.contiguous().unwrap();
        (
            n.clone(),
            t.dtype(),
            t.dims().to_vec(),
            t.as_bytes().unwrap().to_vec(),
        )
    });
    format!(
        "{:?} {} {} {:x} {:?} {:?} {:?}",
        c.meta,
        c.step,
        c.optimizer,
        c.learning_rate.to_bits(),
        c.rng,
        c.history,
        tensors.collect::<Vec<_>>()
    )
}

/// The length of the safetensors header (the JSON after the 8-byte length).
fn header_len(bytes: &[u8]) -> usize {
    u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

/// `good` changed by one of the mutations, and what was done (for the failure message).
fn mutate(good: &[u8], r: &mut impl RngExt) -> (Vec<u8>, String) {
    let mut b = good.to_vec();
    let header_end = 8 + header_len(good);
    let kind = r.random_range(0..8u32);
    let what = match kind {
        // Bits flipped anywhere, or in the header only (where the parsing is).
        0 | 1 => {
            let end = if kind == 0 { b.len() } else { header_end };
            let flips = r.random_range(1..=8usize);
            let mut at = vec![];
            for _ in 0..flips {
                let i = r.random_range(0..end);
                let bit = r.random_range(0..8u32);
                b[i] ^= 1 << bit;
                at.push((i, bit));
            }
            format!("bits flipped at (byte, bit) {at:?}")
        }
        // A byte of the header replaced by a character that JSON gives meaning to.
        2 => {
            let i = r.random_range(8..header_end);
            let meaningful = b"{}[]\",:0123456789.-eE \\u";
            let c = meaningful[r.random_range(0..meaningful.len())];
            b[i] = c;
            format!("header byte {i} set to {:?}", c as char)
        }
        3 => {
            let len = r.random_range(0..b.len());
            b.truncate(len);
            format!("truncated to {len} bytes")
        }
        4 => {
            let extra = r.random_range(1..=4096usize);
            let zeros = r.random_bool(0.5);
            b.extend((0..extra).map(|_| if zeros { 0 } else { r.random::<u8>() }));
            format!(
                "extended by {extra} {} bytes",
                if zeros { "zero" } else { "random" }
            )
        }
        // The header's declared length.
        5 => {
            let n: u64 = match r.random_range(0..3u32) {
                0 => r.random(),
                1 => (header_len(good) as i64 + r.random_range(-64..=64i64)).max(0) as u64,
                _ => r.random_range(0..=(b.len() as u64 * 2)),
            };
            b[..8].copy_from_slice(&n.to_le_bytes());
            format!("header length set to {n}")
        }
        // The tail replaced: truncated, then extended with random bytes.
        6 => {
            let len = r.random_range(0..b.len());
            b.truncate(len);
            let extra = r.random_range(1..=256usize);
            b.extend((0..extra).map(|_| r.random::<u8>()));
            format!("truncated to {len} bytes, then {extra} random bytes added")
        }
        // A region copied over another (a torn or misplaced write).
        _ => {
            let len = r.random_range(1..=64usize).min(b.len());
            let from = r.random_range(0..=b.len() - len);
            let to = r.random_range(0..=b.len() - len);
            b.copy_within(from..from + len, to);
            format!("{len} bytes copied from {from} to {to}")
        }
    };
    (b, what)
}

/// Read `bytes` as a checkpoint file: whether it read back the original (`Ok(true)`) or
/// was one error (`Ok(false)`), or what went wrong (a panic, too much memory, a wrong
/// read or error).
fn check_case(path: &Path, bytes: &[u8], good: &str) -> Result<bool, String> {
    std::fs::write(path, bytes).unwrap();
    let (result, peak) = peak_during(|| {
        std::panic::catch_unwind(|| Checkpoint::read(path)).map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        })
    });
    // The file is read whole, and each tensor it declares is copied out once; safetensors
    // checks that the declared tensors fit in the file.
    let limit = 2 * bytes.len() + SLACK_BYTES;
    if peak > limit {
        return Err(format!(
            "the read allocated {peak} bytes at once, more than {limit}"
        ));
    }
    match result {
        Err(panic) => Err(format!("panic: {panic}")),
        Ok(Ok(c)) if contents(&c) == good => Ok(true),
        Ok(Ok(_)) => Err("read a checkpoint that differs from the original".into()),
        Ok(Err(TrainError::Checkpoint { path: p, msg })) => {
            if p != path {
                return Err(format!("the error names {}, not the file", p.display()));
            }
            if msg.is_empty() || msg.contains('\n') {
                return Err(format!("not one line: {msg:?}"));
            }
            Ok(false)
        }
        Ok(Err(other)) => Err(format!("not a checkpoint error: {other:?}")),
    }
}

#[test]
fn mutated_checkpoints_are_one_error_or_the_original_never_a_panic_a_hang_or_a_big_allocation() {
    let cases = std::env::var("MIRRA_MUTATION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MUTATION_CASES);
    let seed: u64 = std::env::var("MIRRA_MUTATION_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x006d_6972_7261);
    let dir = tempfile::tempdir().unwrap();
    // A small file (its header is most of it) and a larger one (mostly tensor data).
    for (name, features, hidden) in [("small", 4, 8), ("large", 64, 256)] {
        let good = real_checkpoint(dir.path(), &format!("{name}.safetensors"), features, hidden);
        let path = dir.path().join(format!("{name}-mutated.safetensors"));
        let original =
            contents(&Checkpoint::read(&dir.path().join(format!("{name}.safetensors"))).unwrap());
        // The unmutated file reads back, and the check can fail: a changed tensor bit that
        // the reader accepted would be caught by the comparison.
        assert_eq!(check_case(&path, &good, &original), Ok(true));
        let mut r = rng(seed ^ features as u64);
        let (mut errors, mut same) = (0, 0);
        // Reads run on a worker thread, so that a read that never ends fails the test
        // instead of hanging it.
        let (to_worker, tasks) = mpsc::channel::<Vec<u8>>();
        let (to_main, results) = mpsc::channel();
        let worker = {
            let (path, original) = (path.clone(), original.clone());
            std::thread::spawn(move || {
                for bytes in tasks {
                    let _ = to_main.send(check_case(&path, &bytes, &original));
                }
            })
        };
        for case in 0..cases {
            let (bytes, what) = mutate(&good, &mut r);
            let size = bytes.len();
            to_worker.send(bytes).unwrap();
            let outcome = results
                .recv_timeout(READ_LIMIT)
                .unwrap_or_else(|_| Err(format!("no answer after {READ_LIMIT:?}: the read hangs")));
            match outcome {
                Ok(true) => same += 1,
                Ok(false) => errors += 1,
                Err(problem) => panic!(
                    "{name} file ({} bytes, mutated {size}), case {case} of seed {seed}: \
                     {what}: {problem}",
                    good.len()
                ),
            }
        }
        drop(to_worker);
        worker.join().unwrap();
        // Nearly every mutation changes something that is read.
        assert!(
            errors > cases * 9 / 10,
            "{name}: {errors} errors, {same} unchanged reads"
        );
    }
}
