//! `mirra train --logdir`: TensorBoard event files through the binary.

use std::path::Path;
use std::process::{Command, Output};

use mirra::tensorboard::{event_files, read_scalars, Scalar};

fn mirra(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mirra"))
        .args(args)
        .output()
        .expect("mirra runs")
}

/// The scalars of the one event file of a run directory.
fn run_scalars(dir: &Path) -> Vec<Scalar> {
    let files = event_files(dir).unwrap();
    assert_eq!(files.len(), 1, "{}: {files:?}", dir.display());
    read_scalars(&files[0]).unwrap()
}

#[test]
fn train_with_logdir_writes_train_and_validation_runs_matching_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let logdir = dir.path().join("tb");
    let history = dir.path().join("history.json");
    let out = mirra(&[
        "train",
        "--epochs",
        "1",
        "--batch-size",
        "256",
        "--logdir",
        logdir.to_str().unwrap(),
        "--history",
        history.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let h: serde_json::Value = serde_json::from_slice(&std::fs::read(&history).unwrap()).unwrap();
    let check = |run: &str, expected: &[(&str, Option<&str>)]| {
        let scalars = run_scalars(&logdir.join(run));
        let tags: Vec<&str> = scalars.iter().map(|s| s.tag.as_str()).collect();
        let want: Vec<&str> = expected.iter().map(|e| e.0).collect();
        assert_eq!(tags, want, "{run}");
        for (s, (tag, key)) in scalars.iter().zip(expected) {
            assert_eq!(s.step, 0, "{run}/{tag}");
            assert!(s.value.is_finite(), "{run}/{tag}: {}", s.value);
            if let Some(key) = key {
                assert_eq!(s.value, h[key][0].as_f64().unwrap() as f32, "{run}/{tag}");
            }
        }
    };
    check(
        "train",
        &[
            ("epoch_loss", Some("loss")),
            ("epoch_accuracy", Some("accuracy")),
            ("epoch_samples_per_sec", Some("samples_per_sec")),
            ("epoch_learning_rate", None),
        ],
    );
    check(
        "validation",
        &[
            ("epoch_loss", Some("val_loss")),
            ("epoch_accuracy", Some("val_accuracy")),
        ],
    );
    let lr = run_scalars(&logdir.join("train"))
        .into_iter()
        .find(|s| s.tag == "epoch_learning_rate")
        .map(|s| s.value);
    assert_eq!(lr, Some(1e-3), "the default --lr");
}

#[test]
fn an_unusable_logdir_fails_before_training_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let logdir = file.join("tb");
    let out = mirra(&[
        "train",
        "--epochs",
        "1",
        "--logdir",
        logdir.to_str().unwrap(),
    ]);
    // Checked before training: a usage error naming the flag and the path.
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: --logdir: cannot write ") && err.contains("a-file/tb"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
