//! Failures a user met, each through the `mirra` binary where it was met (issue 13,
//! section 6): output errors, corrupt checkpoints, NaN weights, empty data, output paths
//! checked up front, files that are not regular, the run configuration of a resumed run,
//! and the checkpoint directory (creation, stale temporaries, the lock).

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mirra::train::Checkpoint;

/// Few, large batches: 32 steps per epoch on the bundled data.
const FAST: [&str; 4] = ["--seed", "5", "--batch-size", "256"];

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mirra"));
    c.args(args);
    c
}

fn mirra(args: &[&str]) -> Output {
    command(args).output().expect("mirra runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `mirra train` with the fast settings and `args`.
fn train(args: &[&str]) -> Output {
    mirra(&[&["train"][..], &FAST, args].concat())
}

/// Exit status 2 and exactly one line on standard error, containing every needle.
fn assert_usage_error(out: &Output, needles: &[&str]) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("error: "), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn epochs_of(path: &Path) -> usize {
    Checkpoint::read(path).unwrap().meta.epoch
}

/// `mirra train | head -1`: the run used to panic (exit 101) at its first epoch line,
/// before its first checkpoint. Now it stops cleanly after that epoch, its checkpoint
/// and History saved.
#[test]
fn a_pipe_closed_after_one_line_ends_the_run_cleanly_with_its_outputs_saved() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let history = dir.path().join("history.json");
    let mut child = command(&[&["train"][..], &FAST, &["--epochs", "50"]].concat())
        .args(["--checkpoint-dir", s(&ckpt), "--history", s(&history)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is gone (dropped with its BufReader), as `head -1` would be.
    assert!(first.starts_with("Training mlp"), "{first}");
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("standard output was closed: stopped after epoch")
            && err.contains("(--resume continues the run)"),
        "{err}"
    );
    let done = epochs_of(&ckpt.join("last.safetensors"));
    assert!((1..50).contains(&done), "{done} epochs");
    let h = json(&history);
    assert_eq!(h["epoch"].as_array().unwrap().len(), done, "{h}");
}

/// Standard output on a full disk: every line fails, training goes on to the end.
#[test]
fn stdout_on_a_full_disk_is_warned_about_once_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.json");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = command(
        &[
            &["train"][..],
            &FAST,
            &["--epochs", "2", "--history", s(&history)],
        ]
        .concat(),
    )
    .stdout(full)
    .output()
    .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        err.matches("cannot write to standard output").count(),
        1,
        "{err}"
    );
    assert!(err.contains("No space left on device"), "{err}");
    assert_eq!(json(&history)["epoch"], serde_json::json!([0, 1]));
}

/// The byte offset of tensor `name`'s data in a safetensors file.
fn tensor_offset(bytes: &[u8], name: &str) -> usize {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize
}

/// Flipped bytes in a tensor used to resume into a wrong model (val_accuracy 0.81
/// instead of 0.956); the checksums catch them, naming the tensor.
#[test]
fn a_checkpoint_with_flipped_tensor_bytes_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(&["--epochs", "1", "--checkpoint-dir", s(dir.path())]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let last = dir.path().join("last.safetensors");
    let mut bytes = std::fs::read(&last).unwrap();
    for (name, at) in [("dense_1/kernel", 1000), ("optimizer/0/m", 77)] {
        let i = tensor_offset(&bytes, name) + at;
        bytes[i] ^= 0x40;
        std::fs::write(&last, &bytes).unwrap();
        let out = train(&[
            "--epochs",
            "2",
            "--checkpoint-dir",
            s(dir.path()),
            "--resume",
        ]);
        assert_usage_error(
            &out,
            &[
                s(&last),
                &format!("tensor `{name}` is corrupt: the recorded checksum is"),
            ],
        );
        bytes[i] ^= 0x40;
    }
    std::fs::write(&last, &bytes).unwrap();
    let out = train(&[
        "--epochs",
        "2",
        "--checkpoint-dir",
        s(dir.path()),
        "--resume",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A NaN weight used to survive: ReLU turned it into 0, the loss stayed finite, and
/// every later checkpoint saved it. Now the run stops at the first step, naming the
/// weight, and the checkpoint it resumed from is left as it was.
#[test]
fn a_nan_weight_stops_the_run_naming_it_and_is_never_saved() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(&["--epochs", "1", "--checkpoint-dir", s(dir.path())]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let last = dir.path().join("last.safetensors");
    let mut c = Checkpoint::read(&last).unwrap();
    let (_, kernel) = c
        .weights
        .iter_mut()
        .find(|(n, _)| n == "dense/kernel")
        .unwrap();
    let mut values = kernel.to_vec::<f32>().unwrap();
    values[12345] = f32::NAN;
    *kernel = mirra::tensor::Tensor::from_vec(values, kernel.dims(), kernel.device()).unwrap();
    c.save(&last).unwrap();
    let saved = std::fs::read(&last).unwrap();
    let out = train(&[
        "--epochs",
        "3",
        "--checkpoint-dir",
        s(dir.path()),
        "--resume",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("weight `dense/kernel`") && err.contains("is NaN after epoch 2, step 1"),
        "{err}"
    );
    assert_eq!(std::fs::read(&last).unwrap(), saved);
}

/// An IDX file of `dims` u8 values (all `fill`), magic `0x08` and the rank.
fn idx(path: &Path, dims: &[u32], fill: u8) {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    let n: u32 = dims.iter().product();
    bytes.extend(std::iter::repeat_n(fill, n as usize));
    std::fs::write(path, bytes).unwrap();
}

/// 0 training or 0 validation examples used to train on nothing and report a val_loss
/// of 0.0000, which then became the best checkpoint's threshold.
#[test]
fn zero_training_or_validation_examples_is_a_usage_error() {
    // The test set alone, of 1 image: 80% of it trains (0), the rest validates (1).
    let one = tempfile::tempdir().unwrap();
    idx(&one.path().join("t10k-images-idx3-ubyte"), &[1, 28, 28], 7);
    idx(&one.path().join("t10k-labels-idx1-ubyte"), &[1], 3);
    // The full set with an empty test set.
    let empty_test = tempfile::tempdir().unwrap();
    idx(
        &empty_test.path().join("train-images-idx3-ubyte"),
        &[5, 28, 28],
        7,
    );
    idx(&empty_test.path().join("train-labels-idx1-ubyte"), &[5], 3);
    idx(
        &empty_test.path().join("t10k-images-idx3-ubyte"),
        &[0, 28, 28],
        0,
    );
    idx(&empty_test.path().join("t10k-labels-idx1-ubyte"), &[0], 0);
    for (dir, counts) in [
        (one.path(), "holds 0 training and 1 validation examples"),
        (
            empty_test.path(),
            "holds 5 training and 0 validation examples",
        ),
    ] {
        let ckpt = tempfile::tempdir().unwrap();
        let out = train(&["--data", s(dir), "--checkpoint-dir", s(ckpt.path())]);
        assert_usage_error(&out, &[s(dir), counts]);
        assert!(!ckpt.path().join("best.safetensors").exists());
    }
}

/// `--history` to a path that cannot be written used to fail after the whole run.
#[test]
fn every_output_path_is_checked_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a directory").unwrap();
    let under_file = file.join("x");
    for (flag, needles) in [
        ("--history", vec!["--history: cannot write", s(&under_file)]),
        ("--trace", vec!["--trace: cannot write", s(&under_file)]),
        ("--logdir", vec!["--logdir: cannot write", s(&under_file)]),
        (
            "--checkpoint-dir",
            vec!["--checkpoint-dir: cannot write", s(&under_file)],
        ),
    ] {
        let out = train(&["--epochs", "1", flag, s(&under_file)]);
        assert_usage_error(&out, &needles);
        assert!(!text(&out.stdout).contains("Epoch"), "{flag} trained");
    }
    // A --checkpoint-dir that is a file: once failed after epoch 1 with `File exists`.
    let out = train(&["--epochs", "1", "--checkpoint-dir", s(&file)]);
    assert_usage_error(
        &out,
        &[
            "--checkpoint-dir: cannot write",
            s(&file),
            "not a directory",
        ],
    );
    assert!(text(&out.stdout).is_empty(), "{}", text(&out.stdout));
}

/// The History is written after every epoch; a resumed run's holds every epoch with its
/// number, and a resume with nothing left to train leaves it as it was (it used to
/// write `{}` over it).
#[test]
fn the_history_grows_with_every_epoch_and_survives_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let history = dir.path().join("history.json");
    let run = |epochs: &str, resume: bool| {
        let mut args = vec!["--epochs", epochs, "--checkpoint-dir", s(&ckpt)];
        args.extend(["--history", s(&history)]);
        if resume {
            args.push("--resume");
        }
        let out = train(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        json(&history)
    };
    let two = run("2", false);
    assert_eq!(two["epoch"], serde_json::json!([0, 1]));
    let four = run("4", true);
    assert_eq!(four["epoch"], serde_json::json!([0, 1, 2, 3]));
    for key in [
        "loss",
        "accuracy",
        "val_loss",
        "val_accuracy",
        "samples_per_sec",
    ] {
        let values = four[key].as_array().unwrap();
        assert_eq!(values.len(), 4, "{key}");
        // The first two epochs are those of the first run, bit for bit.
        assert_eq!(values[..2], two[key].as_array().unwrap()[..], "{key}");
    }
    let bytes = std::fs::read(&history).unwrap();
    let out = train(&[
        "--epochs",
        "4",
        "--checkpoint-dir",
        s(&ckpt),
        "--history",
        s(&history),
        "--resume",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("nothing left to train"));
    assert_eq!(std::fs::read(&history).unwrap(), bytes);
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

/// `--history` naming a pipe (or, as root, `/dev/null`) used to be replaced by a regular
/// file through the atomic rename: a pipe is written to, and stays a pipe.
#[test]
fn a_history_pipe_is_written_through_and_stays_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("history.fifo");
    mkfifo(&fifo);
    // The reader opens first without waiting, then reads once the run has ended.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_nonblock())
        .open(&fifo)
        .unwrap();
    let out = train(&["--epochs", "2", "--history", s(&fifo)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let mut got = String::new();
    reader.read_to_string(&mut got).unwrap();
    // Once, when training ended: a pipe cannot be replaced after every epoch.
    let h: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(h["epoch"], serde_json::json!([0, 1]));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// `O_NONBLOCK`, without a libc dependency in the tests.
fn libc_nonblock() -> i32 {
    0o4000
}

/// `--scale-lr` and `--data` used to be unrecorded: a resume with another value was
/// accepted silently. Every setting that decides the results is refused with one line
/// naming it, old and new; replicas and collective may change, and that is said.
#[test]
fn a_resume_refuses_a_changed_setting_and_allows_another_placement() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(&["--epochs", "1", "--checkpoint-dir", s(dir.path())]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let last = dir.path().join("last.safetensors");
    let written = |with: &str| format!("checkpoint {} was written with {with}", last.display());

    // The same data elsewhere is other data to the checkpoint.
    let data = tempfile::tempdir().unwrap();
    let bundled = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/mnist");
    for entry in std::fs::read_dir(bundled).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with("t10k") {
            std::fs::copy(entry.path(), data.path().join(entry.file_name())).unwrap();
        }
    }
    let copied = std::fs::canonicalize(data.path()).unwrap();
    let cases: [(&[&str], String); 5] = [
        (
            &[&FAST[..], &["--scale-lr"]].concat(),
            written("--scale-lr off, not --scale-lr on"),
        ),
        (
            &[&FAST[..], &["--lr", "0.002"]].concat(),
            written("--lr 0.001, not --lr 0.002"),
        ),
        (
            &[&FAST[..], &["--data", s(data.path())]].concat(),
            written(&format!("--data bundled, not --data {}", copied.display())),
        ),
        (
            &["--seed", "6", "--batch-size", "256"],
            written("--seed 5, not --seed 6"),
        ),
        (
            &[&FAST[..], &["--precision", "mixed_bfloat16"]].concat(),
            written("--precision float32, not --precision mixed_bfloat16"),
        ),
    ];
    for (settings, needle) in cases {
        let mut args = vec!["train", "--epochs", "2"];
        args.extend(["--checkpoint-dir", s(dir.path()), "--resume"]);
        args.extend(settings);
        assert_usage_error(&mirra(&args), &[&needle]);
    }
    // Determinism decides the results: a checkpoint recording another is refused.
    let other = tempfile::tempdir().unwrap();
    let mut c = Checkpoint::read(&last).unwrap();
    c.meta.extra.insert("deterministic".into(), "on".into());
    c.save(&other.path().join("last.safetensors")).unwrap();
    let out = train(&[
        "--epochs",
        "2",
        "--checkpoint-dir",
        s(other.path()),
        "--resume",
    ]);
    assert_usage_error(
        &out,
        &["written with --deterministic on, not --deterministic off"],
    );

    // Another placement: said, and allowed.
    let out = train(&[
        "--epochs",
        "2",
        "--replicas",
        "2",
        "--collective",
        "tree",
        "--checkpoint-dir",
        s(dir.path()),
        "--resume",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("Resuming with --replicas 2 (the checkpoint was written with --replicas 1)")
            && stdout.contains(
                "Resuming with --collective tree (the checkpoint was written with --collective none)"
            ),
        "{stdout}"
    );
    assert_eq!(epochs_of(&last), 2);
}

/// A SIGKILL during a save used to leave `.tmp<PID>` files forever.
#[test]
fn temporary_files_of_a_killed_save_are_removed_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join(".last.safetensors.tmp99999");
    std::fs::write(&stale, b"half a checkpoint").unwrap();
    let other = dir.path().join("notes.tmp1");
    std::fs::write(&other, b"the user's").unwrap();
    let out = train(&["--epochs", "1", "--checkpoint-dir", s(dir.path())]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!stale.exists() && other.exists());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Removed 1 temporary file left in")
            && stdout.contains(".last.safetensors.tmp99999"),
        "{stdout}"
    );
}

/// `--replicas` had no upper bound: 100000 replica threads were attempted.
#[test]
fn replicas_beyond_the_batch_or_the_cap_are_refused() {
    assert_usage_error(
        &train(&["--epochs", "1", "--replicas", "100000"]),
        &["--replicas", "100000 replicas, but at most 1024"],
    );
    assert_usage_error(
        &mirra(&[
            "train",
            "--epochs",
            "1",
            "--batch-size",
            "4",
            "--replicas",
            "8",
        ]),
        &["--replicas 8 is more than --batch-size 4"],
    );
}

/// `--device cuda:0` without a CUDA driver: one line saying so, exit 2; a misspelt device
/// is named.
#[test]
fn a_cuda_device_that_is_not_there_is_one_line() {
    if let Err(e) = mirra::device::Device::cuda(0) {
        assert!(e.to_string().starts_with("no CUDA driver found"), "{e}");
        assert_usage_error(
            &train(&["--epochs", "1", "--device", "cuda:0"]),
            &["--device: no CUDA driver found"],
        );
    }
    assert_usage_error(
        &train(&["--epochs", "1", "--device", "gpu0"]),
        &["'gpu0' is not a device (cpu or cuda:N"],
    );
    // TF32 is a CUDA matmul mode: asked for on the CPU, refused rather than ignored.
    assert_usage_error(
        &train(&["--epochs", "1", "--tf32"]),
        &["--tf32 with --device cpu"],
    );
}

/// `MIRRA_BF16_MATMUL` names the bf16 kernel: a value that is none of them is one line and
/// exit 2, before any training; a known one is honoured and printed in the run's header.
#[test]
fn the_bf16_kernel_asked_for_is_checked_and_printed() {
    let args = [
        &["train"][..],
        &FAST,
        &["--epochs", "1", "--precision", "mixed_bfloat16"],
    ]
    .concat();
    let out = command(&args)
        .env("MIRRA_BF16_MATMUL", "tiles")
        .output()
        .unwrap();
    assert_usage_error(
        &out,
        &["MIRRA_BF16_MATMUL=\"tiles\" is none of auto, amx, avx512-bf16, f32"],
    );
    let out = command(&args)
        .env("MIRRA_BF16_MATMUL", "f32")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("precision mixed_bfloat16 (bf16 products: converted to f32 and back (MIRRA_BF16_MATMUL=f32))"),
        "{stdout}"
    );
}

/// A run killed while replacing its `--history` left `.history.json.tmp<PID>` beside it.
#[test]
fn temporary_files_a_killed_run_left_beside_its_history_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let history = dir.path().join("history.json");
    let stale = dir.path().join(format!(".history.json.tmp{dead}"));
    std::fs::write(&stale, b"half a history").unwrap();
    let out = train(&["--epochs", "1", "--history", s(&history)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!stale.exists() && history.exists());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Removed 1 temporary file left in"),
        "{stdout}"
    );
}

/// A child process killed when the test ends, even by a failed assertion.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lock file's contents (the holder's process id) once it has some.
fn wait_for_lock(dir: &Path) -> String {
    let lock = dir.join(".mirra.lock");
    let start = Instant::now();
    loop {
        if let Ok(pid) = std::fs::read_to_string(&lock) {
            if !pid.is_empty() {
                return pid;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no lock after 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two runs on one --checkpoint-dir used to mix their files. The second is refused while
/// the first lives; once it is killed (SIGKILL: no cleanup), a restart is not refused.
#[test]
fn a_second_run_on_a_locked_directory_is_refused_until_the_first_dies() {
    let dir = tempfile::tempdir().unwrap();
    let child = command(&[&["train"][..], &FAST, &["--epochs", "1000"]].concat())
        .args(["--checkpoint-dir", s(dir.path())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = KillOnDrop(child);
    let first = &mut first.0;
    let pid = wait_for_lock(dir.path());
    assert_eq!(pid, first.id().to_string());
    let out = train(&["--epochs", "1", "--checkpoint-dir", s(dir.path())]);
    assert_usage_error(
        &out,
        &[
            "--checkpoint-dir:",
            &format!(
                "{} is in use by another run (process {pid})",
                dir.path().display()
            ),
        ],
    );
    assert!(first.try_wait().unwrap().is_none(), "the first run ended");
    first.kill().unwrap();
    first.wait().unwrap();
    let out = train(&[
        "--epochs",
        "1",
        "--checkpoint-dir",
        s(dir.path()),
        "--resume",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
