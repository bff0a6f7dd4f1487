//! `--checkpoint-dir` and `--resume` through the `mirra` binary, with a real kill.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mirra::train::Checkpoint;

/// The settings of the runs on the bundled data: few, large batches (32 steps per epoch).
const SETTINGS: [&str; 4] = ["--seed", "5", "--batch-size", "256"];

/// `mirra train` with `args` and `--checkpoint-dir dir`.
fn command(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mirra"));
    c.arg("train").args(args).arg("--checkpoint-dir").arg(dir);
    c
}

fn mirra(args: &[&str], dir: &Path) -> Output {
    command(args, dir).output().expect("mirra runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The step, epoch and every tensor's bytes (weights, then optimizer state) of a
/// checkpoint file.
fn contents(path: &Path) -> (u64, usize, Vec<(String, Vec<u8>)>) {
    let c = Checkpoint::read(path).unwrap();
    let tensors = c
        .weights
        .iter()
        .chain(&c.optimizer_state)
        .map(|(n, t)| {
            (
                n.clone(),
                t.contiguous().unwrap().as_bytes().unwrap().to_vec(),
            )
        })
        .collect();
    (c.step, c.meta.epoch, tensors)
}

#[test]
fn a_killed_run_resumed_ends_with_the_bits_of_an_uninterrupted_one() {
    killed_and_resumed(&[]);
}

#[test]
fn a_killed_mirrored_run_resumed_ends_with_the_bits_of_an_uninterrupted_one() {
    killed_and_resumed(&["--replicas", "2", "--collective", "tree"]);
}

/// Under mixed_float16 the optimizer is behind loss scaling: the scale and its count of
/// good steps are in the checkpoint, and come back with it.
#[test]
fn a_killed_loss_scaled_run_resumed_ends_with_the_bits_of_an_uninterrupted_one() {
    let names = killed_and_resumed(&["--precision", "mixed_float16"]);
    let scale: Vec<&String> = names.iter().filter(|n| n.contains("loss_scale")).collect();
    assert_eq!(scale.len(), 2, "{names:?}");
}

/// Kill a 3-epoch run (with `extra` flags) after its first checkpoint, resume it, and
/// compare its last checkpoint bitwise with an uninterrupted run's; the names of the
/// checkpoint's tensors.
fn killed_and_resumed(extra: &[&str]) -> Vec<String> {
    let whole = tempfile::tempdir().unwrap();
    let three = [&SETTINGS[..], &["--epochs", "3"], extra].concat();
    let out = mirra(&three, whole.path());
    assert!(out.status.success(), "{}", text(&out.stderr));

    let killed = tempfile::tempdir().unwrap();
    let last = killed.path().join("last.safetensors");
    let mut child = command(&three, killed.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("mirra starts");
    let start = Instant::now();
    while !last.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "no checkpoint after 5 minutes"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    let (_, done, _) = contents(&last);
    // An epoch takes about 0.1 s: the kill lands in epoch 2 unless this thread was not
    // scheduled for the whole rest of the run.
    assert!(
        still_running && done < 3,
        "the run ended ({done} epochs) before it could be killed"
    );

    let out = mirra(&[&three[..], &["--resume"]].concat(), killed.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let said = format!(
        "{done} epochs done (step {}), continuing at epoch {}",
        done * 32,
        done + 1
    );
    assert!(stdout.contains(&said), "{stdout}");
    let (step, epochs, tensors) = contents(&last);
    assert_eq!((step, epochs), (3 * 32, 3));
    let (_, _, uninterrupted) = contents(&whole.path().join("last.safetensors"));
    let names = |t: &[(String, Vec<u8>)]| t.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&tensors), names(&uninterrupted));
    // Named, not printed: the tensors are megabytes.
    let differ: Vec<&str> = tensors
        .iter()
        .zip(&uninterrupted)
        .filter(|(a, b)| a.1 != b.1)
        .map(|(a, _)| a.0.as_str())
        .collect();
    assert!(
        differ.is_empty(),
        "differ from the uninterrupted run: {differ:?}"
    );
    names(&tensors)
}

#[test]
fn resume_in_an_empty_directory_starts_from_epoch_1_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = mirra(
        &[&SETTINGS[..], &["--epochs", "1", "--resume"]].concat(),
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let said = format!(
        "No checkpoint in {}: starting from epoch 1",
        dir.path().display()
    );
    assert!(stdout.contains(&said), "{stdout}");
    assert!(stdout.contains("Epoch 1/1 - "), "{stdout}");
    for file in ["last.safetensors", "best.safetensors"] {
        assert_eq!(contents(&dir.path().join(file)).1, 1, "{file}");
    }
}

/// Another run's checkpoint, a broken one, or `--resume` alone: one line, exit 2.
#[test]
fn resuming_with_other_settings_or_a_broken_checkpoint_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = mirra(&[&SETTINGS[..], &["--epochs", "1"]].concat(), dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let last = dir.path().join("last.safetensors");

    // Only `mlp` exists: a checkpoint of another model is made by editing its metadata.
    let other_model = tempfile::tempdir().unwrap();
    let mut c = Checkpoint::read(&last).unwrap();
    c.meta.extra.insert("model".into(), "cnn".into());
    c.save(&other_model.path().join("last.safetensors"))
        .unwrap();
    let truncated = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(&last).unwrap();
    let broken = truncated.path().join("last.safetensors");
    std::fs::write(&broken, &bytes[..bytes.len() / 2]).unwrap();

    let was_written = |dir: &Path, with: &str| {
        format!(
            "checkpoint {} was written with {with}",
            dir.join("last.safetensors").display()
        )
    };
    let cases: [(&[&str], &Path, String); 4] = [
        (
            &["--seed", "6", "--batch-size", "256"],
            dir.path(),
            was_written(dir.path(), "--seed 5, not --seed 6"),
        ),
        (
            &["--seed", "5", "--batch-size", "128"],
            dir.path(),
            was_written(dir.path(), "--batch-size 256, not --batch-size 128"),
        ),
        (
            &SETTINGS,
            other_model.path(),
            was_written(other_model.path(), "--model cnn, not --model mlp"),
        ),
        (
            &SETTINGS,
            truncated.path(),
            format!(
                "checkpoint {}: not a complete safetensors file",
                broken.display()
            ),
        ),
    ];
    for (args, dir, needle) in cases {
        let out = mirra(&[args, &["--epochs", "2", "--resume"]].concat(), dir);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(&needle),
            "{args:?}: {err}"
        );
    }

    let out = Command::new(env!("CARGO_BIN_EXE_mirra"))
        .args(["train", "--resume"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "error: --resume needs --checkpoint-dir DIR (the directory of the run to continue)"
    );
}

/// `--max-restarts`: a run whose replicas fail in epoch 2 (a fault injected after 40 of
/// its 96 steps) restarts in the same process, rebuilds its replicas, resumes from epoch
/// 1's checkpoint, logs the restart with its cause, and ends with the bits of an
/// uninterrupted run. Without restarts the same fault fails the run (exit 1).
#[test]
fn max_restarts_resumes_a_failed_run_to_the_uninterrupted_bits() {
    let three = [&SETTINGS[..], &["--epochs", "3", "--replicas", "2"]].concat();
    let whole = tempfile::tempdir().unwrap();
    let out = mirra(&three, whole.path());
    assert!(out.status.success(), "{}", text(&out.stderr));

    let faulty = |extra: &[&str], dir: &Path| {
        command(&[&three[..], extra].concat(), dir)
            .env("MIRRA_FAULT_AFTER_STEPS", "40")
            .output()
            .unwrap()
    };
    let failed = tempfile::tempdir().unwrap();
    let out = faulty(&[], failed.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("a fault injected after 40 steps"),
        "{}",
        text(&out.stderr)
    );

    let restarted = tempfile::tempdir().unwrap();
    let out = faulty(&["--max-restarts", "2"], restarted.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("mirra train: restart 1 of 2 after: a fault injected after 40 steps"),
        "{stderr}"
    );
    assert!(!stderr.contains("restart 2 of 2"), "{stderr}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("1 epochs done (step 32), continuing at epoch 2"),
        "{stdout}"
    );
    let (step, epochs, tensors) = contents(&restarted.path().join("last.safetensors"));
    assert_eq!((step, epochs), (3 * 32, 3));
    let (_, _, uninterrupted) = contents(&whole.path().join("last.safetensors"));
    assert!(
        tensors == uninterrupted,
        "differ from the uninterrupted run"
    );

    // Restarts resume from checkpoints: without a directory they are refused.
    let out = Command::new(env!("CARGO_BIN_EXE_mirra"))
        .args(["train", "--max-restarts", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--max-restarts needs --checkpoint-dir DIR"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 19 through the CLI: a deterministic run of 2 epochs on one replica, and one of 1
/// epoch on 3 replicas resumed for the second on 4 (another collective too), end with the
/// same bits: weights, optimizer state and every epoch's loss, accuracy and validation
/// figures. The same pair in the default mode differs (the check can fail), and a resumed
/// run cannot switch determinism on or change the micro-batch.
#[test]
fn a_deterministic_run_resumed_on_other_replicas_ends_with_one_replicas_bits() {
    let run = |dir: &Path, epochs: &str, extra: &[&str]| {
        let args = [
            &SETTINGS[..],
            &["--epochs", epochs, "--micro-batch", "24"],
            extra,
        ]
        .concat();
        let out = mirra(&[&["--deterministic"], &args[..]].concat(), dir);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let one = tempfile::tempdir().unwrap();
    let said = run(one.path(), "2", &["--replicas", "1"]);
    assert!(
        said.contains("deterministic: micro-batches of 24"),
        "{said}"
    );
    let split = tempfile::tempdir().unwrap();
    run(split.path(), "1", &["--replicas", "3"]);
    run(
        split.path(),
        "2",
        &["--replicas", "4", "--collective", "direct", "--resume"],
    );
    let last = |dir: &Path| dir.join("last.safetensors");
    let read = |dir: &Path| Checkpoint::read(&last(dir)).unwrap();
    let (want, got) = (read(one.path()), read(split.path()));
    assert_eq!((got.step, got.meta.epoch), (2 * 32, 2));
    let bits = |dir: &Path| contents(&last(dir)).2;
    let differ: Vec<String> = bits(split.path())
        .into_iter()
        .zip(bits(one.path()))
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.0)
        .collect();
    assert!(
        differ.is_empty(),
        "differ from one replica's run: {differ:?}"
    );
    for key in ["loss", "accuracy", "val_loss", "val_accuracy"] {
        let (g, w) = (
            got.history.get(key).unwrap(),
            want.history.get(key).unwrap(),
        );
        let as_bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(as_bits(g), as_bits(w), "{key}: {g:?} against {w:?}");
    }

    // The default mode's 3 replicas against one device differ in their last bits.
    let default = tempfile::tempdir().unwrap();
    let args = [&SETTINGS[..], &["--epochs", "1", "--replicas", "3"]].concat();
    assert!(mirra(&args, default.path()).status.success());
    let single = tempfile::tempdir().unwrap();
    let args = [&SETTINGS[..], &["--epochs", "1"]].concat();
    assert!(mirra(&args, single.path()).status.success());
    assert_ne!(bits(default.path()), bits(single.path()));

    // Determinism is a setting that decides the results.
    let args = [&SETTINGS[..], &["--epochs", "3", "--resume"]].concat();
    let out = mirra(&args, split.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--deterministic"),
        "{}",
        text(&out.stderr)
    );
}
