//! End-to-end tests through the `mirra` binary.

use std::path::Path;

use mirra_mutation::fixtures::npy;
use std::process::{Command, Output};

fn mirra(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mirra"))
        .args(args)
        .output()
        .expect("mirra runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The README's main job: `--replicas 4 --collective ring --batch-size 256 --epochs 5`
/// reaches 94.5% validation accuracy, 95.5% with `--scale-lr`, and says how it runs.
#[test]
fn the_mirrored_main_job_reaches_its_accuracy() {
    for (scale, target) in [(false, 0.945), (true, 0.955)] {
        let dir = tempfile::tempdir().unwrap();
        let history = dir.path().join("history.json");
        let mut args = vec![
            "train",
            "--replicas",
            "4",
            "--collective",
            "ring",
            "--batch-size",
            "256",
            "--epochs",
            "5",
            "--history",
            history.to_str().unwrap(),
        ];
        if scale {
            args.push("--scale-lr");
        }
        let out = mirra(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("4 replicas in sync, collective ring"),
            "{stdout}"
        );
        let h: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&history).unwrap()).unwrap();
        let val = h["val_accuracy"][4].as_f64().unwrap();
        assert!(
            val >= target,
            "--scale-lr {scale}: validation accuracy {val}"
        );
    }
}

#[test]
fn one_epoch_on_the_bundled_data_reaches_90_percent() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.json");
    let out = mirra(&[
        "train",
        "--epochs",
        "1",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Epoch 1/1 - "), "{stdout}");
    assert!(stdout.contains(" samples/s"), "{stdout}");
    let h: serde_json::Value = serde_json::from_slice(&std::fs::read(&history).unwrap()).unwrap();
    for key in [
        "loss",
        "accuracy",
        "val_loss",
        "val_accuracy",
        "samples_per_sec",
    ] {
        assert_eq!(h[key].as_array().map(Vec::len), Some(1), "{key} in {h}");
    }
    let val = h["val_accuracy"][0].as_f64().unwrap();
    assert!(val > 0.90, "validation accuracy {val}");
}

/// Each bad argument gets exactly one error line naming it, and exit status 2.
#[test]
fn bad_arguments_get_one_clear_line_and_exit_2() {
    let missing = std::env::temp_dir().join("mirra-no-such-dir");
    let cases: [(&[&str], &str); 29] = [
        (&["train", "--batch-size", "0"], "--batch-size"),
        // A negative number used to be taken for a flag: "unexpected argument '-1'".
        (
            &["train", "--epochs", "-1"],
            "invalid value '-1' for '--epochs <EPOCHS>': must be at least 1",
        ),
        (
            &["train", "--batch-size", "-64"],
            "'--batch-size <BATCH_SIZE>': must be at least 1",
        ),
        (
            &["train", "--lr", "-0.1"],
            "'--lr <LR>': must be a positive number",
        ),
        (
            &["train", "--seed", "-1"],
            "'--seed <SEED>': '-1' is not a whole number",
        ),
        (
            &["train", "--epochs", "x"],
            "'--epochs <EPOCHS>': 'x' is not a whole number",
        ),
        // 1000 threads used to be accepted.
        (
            &["train", "--threads", "1000"],
            "'--threads <THREADS>': 1000 threads, but this machine has",
        ),
        (&["train", "--replicas", "0"], "--replicas"),
        (
            &["train", "--replicas", "2", "--collective", "nccl"],
            "unknown collective 'nccl' (known: ring, tree, reduce-to-one, direct; on CUDA \
             devices cuda-ring, nccl-ring, nccl-tree)",
        ),
        (
            &["train", "--replicas", "2", "--collective", "nccl-ring"],
            "collective `nccl-ring` moves CUDA device buffers; replicas on the host need one \
             of ring, tree, reduce-to-one, direct",
        ),
        (
            &["train", "--collective", "tree"],
            "--collective tree with one device: a collective needs replicas",
        ),
        (
            &["train", "--device", "cpu,cuda:0"],
            "a list of devices names CUDA devices",
        ),
        (
            &["train", "--device", "cuda:0,gpu1"],
            "'gpu1' is not a device",
        ),
        (
            &["train", "--device", "cuda:0,cuda:1", "--replicas", "3"],
            "--replicas 3 with --device cuda:0,cuda:1: one replica per device",
        ),
        (
            &["train", "--replicas", "2", "--collective", "nccl-tree"],
            "moves CUDA device buffers",
        ),
        (&["train", "--bucket-mb", "0"], "--bucket-mb"),
        (&["train", "--epochs", "0"], "--epochs"),
        (&["train", "--model", "resnet"], "unknown model 'resnet'"),
        (
            &["train", "--model", "unet", "--augment"],
            "augmentation is for the 28x28 digits of the classifiers",
        ),
        (
            &["train", "--model", "resnet50", "--data", "."],
            "--data . with --model resnet50: it trains on synthetic ImageNet-shaped batches",
        ),
        (
            &["train", "--data", missing.to_str().unwrap()],
            "mirra-no-such-dir",
        ),
        (&["train", "--bogus"], "--bogus"),
        (
            &["train", "--micro-batch", "8"],
            "--micro-batch without --deterministic",
        ),
        (
            &["train", "--deterministic", "--micro-batch", "0"],
            "--micro-batch",
        ),
        (
            &["train", "--deterministic", "--model", "resnet20"],
            "keeps statistics per replica; add --sync-batch-norm",
        ),
        (
            &[
                "train",
                "--deterministic",
                "--replicas",
                "2",
                "--allreduce-dtype",
                "bfloat16",
            ],
            "deterministic mode sums gradients in their own dtype, not in bf16",
        ),
        (
            &["train", "--allreduce-dtype", "bfloat16"],
            "--allreduce-dtype bfloat16 with one device: there is no all-reduce without replicas",
        ),
        (
            &["train", "--precision", "bfloat16"],
            "invalid value 'bfloat16' for '--precision <PRECISION>'",
        ),
        (
            &["train", "--ablate-bf16-accumulation"],
            "--ablate-bf16-accumulation needs --precision mixed_bfloat16",
        ),
    ];
    for (args, needle) in cases {
        let out = mirra(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}

/// `mirra topo` prints the device matrix where there are GPUs; without a driver, one line
/// saying so and exit 2 (the machine cannot answer the question asked).
#[test]
fn topo_without_a_gpu_is_one_line() {
    if mirra::cuda::device_count().is_ok() {
        return;
    }
    let out = mirra(&["topo"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: mirra topo: no CUDA driver found"),
        "{err}"
    );
}

/// Bare `mirra` used to print only the description: the usage, with the commands.
#[test]
fn bare_mirra_prints_the_usage() {
    let out = mirra(&[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("Usage: mirra <COMMAND>"), "{err}");
    assert!(err.contains("train"), "{err}");
}

#[test]
fn a_directory_without_mnist_files_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = mirra(&["train", "--data", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("t10k-images"), "{err}");
}

/// `--trace FILE`: a Chrome trace where each replica thread shows its forward, backward,
/// optimizer step and gradient buckets, and the progress threads the all-reduces they ran.
#[test]
fn a_trace_shows_each_replica_and_its_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let out = mirra(&[
        "train",
        "--epochs",
        "1",
        "--replicas",
        "2",
        "--bucket-mb",
        "0.1",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let thread = |name: &str| {
        events
            .iter()
            .find(|e| e["ph"] == "M" && e["args"]["name"] == name)
            .map(|e| e["tid"].clone())
    };
    let spans_on = |tid: &serde_json::Value| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && &e["tid"] == tid)
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    };
    for replica in ["mirra-replica-0", "mirra-replica-1"] {
        let tid = thread(replica).unwrap_or_else(|| panic!("no thread {replica} in the trace"));
        let names = spans_on(&tid);
        for want in [
            "forward",
            "backward",
            "optimizer step",
            "finish the gradient reduction",
        ] {
            assert!(names.iter().any(|n| n == want), "{replica}: no {want}");
        }
        assert!(
            names.iter().any(|n| n.starts_with("copy gradient ")),
            "{replica}: no bucket copies"
        );
        // 437 KB of gradients in 0.1 MiB buckets: some are submitted during backward.
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("submit all-reduce of bucket")),
            "{replica}: no bucket submitted during backward"
        );
    }
    let progress = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "all_reduce (progress thread)")
        .count();
    assert!(progress > 0, "no all-reduce on a progress thread");
    // Every span has a start and a non-negative duration.
    for e in events.iter().filter(|e| e["ph"] == "X") {
        assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0);
    }
}

/// `--augment`: the same run twice gives the same History (draws are keyed by seed, epoch
/// and image), a run without it another one, and 2 replicas the same augmented images as
/// one device (their losses agree to rounding).
#[test]
fn augmentation_is_seeded_and_independent_of_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| -> serde_json::Value {
        let h = dir.path().join(name);
        let mut args = vec!["train", "--epochs", "2", "--batch-size", "256", "--history"];
        let hs = h.to_str().unwrap().to_string();
        args.push(&hs);
        args.extend(extra);
        let out = mirra(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str(&std::fs::read_to_string(&h).unwrap()).unwrap()
    };
    let a = run("a.json", &["--augment"]);
    let b = run("b.json", &["--augment"]);
    let plain = run("plain.json", &[]);
    let two = run("two.json", &["--augment", "--replicas", "2"]);
    assert_eq!(a["loss"], b["loss"]);
    assert_ne!(a["loss"], plain["loss"]);
    for (x, y) in a["loss"]
        .as_array()
        .unwrap()
        .iter()
        .zip(two["loss"].as_array().unwrap())
    {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() <= 1e-4 * x.abs(), "{x} vs {y}");
    }
}

/// `--precision mixed_bfloat16` and `mixed_float16` (with loss scaling) train the MLP
/// and the CNN with their products in 16 bits: said on the first line, validation loss
/// within 2% of float32's after the same epochs, and not bitwise float32's (the products
/// really were rounded).
#[test]
fn mixed_precision_trains_as_float32_does_to_rounding() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| -> (String, f64) {
        let h = dir.path().join(name);
        let hs = h.to_str().unwrap().to_string();
        let mut args = vec![
            "train",
            "--epochs",
            "2",
            "--batch-size",
            "256",
            "--history",
            &hs,
        ];
        args.extend(extra);
        let out = mirra(&args);
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        let h: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&h).unwrap()).unwrap();
        let first = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        (first, h["val_loss"][1].as_f64().unwrap())
    };
    let digits = first_digits(600);
    let data = ["--data", digits.path().to_str().unwrap()];
    for model in [
        &["--model", "mlp"][..],
        &[&["--model", "cnn"][..], &data[..]].concat(),
    ] {
        let (first32, f32_loss) = run("f32.json", model);
        assert!(!first32.contains("precision"), "{first32}");
        for policy in ["mixed_bfloat16", "mixed_float16"] {
            let (first, loss) = run("16.json", &[model, &["--precision", policy]].concat());
            assert!(first.contains(&format!("precision {policy}")), "{first}");
            assert!(
                (loss - f32_loss).abs() <= 0.02 * f32_loss,
                "{model:?}: val_loss {loss} under {policy} against {f32_loss}"
            );
            assert_ne!(loss, f32_loss, "{model:?} {policy}");
        }
    }
}

/// Gradients all-reduced in 16 bits on 2 replicas: the run trains to within 1% of the
/// float32 all-reduce's validation loss, and is not bitwise it.
#[test]
fn gradients_all_reduced_in_16_bits_train_as_in_f32_to_rounding() {
    let dir = tempfile::tempdir().unwrap();
    let run = |wire: &str| -> f64 {
        let h = dir.path().join(format!("{wire}.json"));
        let hs = h.to_str().unwrap().to_string();
        let args = [
            "train",
            "--epochs",
            "2",
            "--batch-size",
            "256",
            "--replicas",
            "2",
            "--allreduce-dtype",
            wire,
            "--history",
            &hs,
        ];
        let out = mirra(&args);
        assert!(out.status.success(), "{wire}: {}", stderr(&out));
        let h: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&h).unwrap()).unwrap();
        h["val_loss"][1].as_f64().unwrap()
    };
    let f32_loss = run("float32");
    for wire in ["bfloat16", "float16"] {
        let loss = run(wire);
        assert!(
            (loss - f32_loss).abs() <= 0.01 * f32_loss,
            "{wire}: val_loss {loss} against {f32_loss}"
        );
        assert_ne!(loss, f32_loss, "{wire}");
    }
}

/// A data folder holding the first `count` bundled digits as an MNIST test set (the
/// CLI splits it 80/20).
fn first_digits(count: usize) -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    let digits = mirra::data::Mnist::bundled().unwrap().train;
    let pixels = digits
        .pixels
        .narrow(0, 0, count)
        .unwrap()
        .contiguous()
        .unwrap();
    let labels = digits
        .labels
        .narrow(0, 0, count)
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    let idx = |name: &str, dims: &[u32], body: &[u8]| {
        let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
        for d in dims {
            bytes.extend(d.to_be_bytes());
        }
        bytes.extend(body);
        std::fs::write(data.path().join(name), bytes).unwrap();
    };
    let n = count as u32;
    idx(
        "t10k-images-idx3-ubyte",
        &[n, 28, 28],
        pixels.as_slice::<u8>().unwrap(),
    );
    let labels: Vec<u8> = labels.iter().map(|&l| l as u8).collect();
    idx("t10k-labels-idx1-ubyte", &[n], &labels);
    data
}

/// The U-Nets through the CLI on two replicas: canvases (volumes) made from 80 digits,
/// one epoch, and the History's segmentation figures (`val_mean_iou`, `val_dice`) in
/// [0, 1].
#[test]
fn the_unets_train_on_digit_canvases_and_volumes_and_report_iou_and_dice() {
    let data = first_digits(80);
    // 64 training and 16 validation digits: half as many canvases, an eighth as many
    // volumes.
    for (model, batch, seen) in [
        ("unet", "16", "on 32 samples, validating on 8"),
        ("unet3d", "4", "on 8 samples, validating on 2"),
    ] {
        let out_dir = tempfile::tempdir().unwrap();
        let history = out_dir.path().join("history.json");
        let out = mirra(&[
            "train",
            "--model",
            model,
            "--data",
            data.path().to_str().unwrap(),
            "--epochs",
            "1",
            "--batch-size",
            batch,
            "--replicas",
            "2",
            "--history",
            history.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{model}: {}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(seen), "{model}: {stdout}");
        let h: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&history).unwrap()).unwrap();
        for key in [
            "val_mean_iou",
            "val_dice",
            "val_accuracy",
            "mean_iou",
            "dice",
        ] {
            let v = h[key][0].as_f64().unwrap_or(f64::NAN);
            assert!((0.0..=1.0).contains(&v), "{model}: {key} = {v} in {h}");
        }
    }
}

/// ResNet-50 through the CLI: one epoch on synthetic 224x224x3 batches (four to train on,
/// one to validate on) reports a finite loss and its throughput.
#[test]
fn resnet50_trains_on_synthetic_imagenet_shaped_batches() {
    let out_dir = tempfile::tempdir().unwrap();
    let history = out_dir.path().join("history.json");
    let out = mirra(&[
        "train",
        "--model",
        "resnet50",
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("resnet50 (25557032 parameters) on 8 samples, validating on 2"),
        "{stdout}"
    );
    let h: serde_json::Value = serde_json::from_slice(&std::fs::read(&history).unwrap()).unwrap();
    let loss = h["loss"][0].as_f64().unwrap_or(f64::NAN);
    // Random labels of 1000 classes: about ln(1000) = 6.9 at the start.
    assert!(loss.is_finite() && loss > 3.0 && loss < 20.0, "{h}");
}

/// `--data` also takes NumPy arrays (f32 examples of 784 values, three classes: the model
/// gets three outputs) and a folder of PNGs in class folders (read per batch, resized to
/// 28x28); examples of another size, or an image folder for the U-Net, are one clear line
/// and exit 2.
#[test]
fn numpy_arrays_and_image_folders_train() {
    let dir = tempfile::tempdir().unwrap();
    // 40 examples: class c has pixels near c / 2 (learnable), as [40, 784] f32.
    let arrays = dir.path().join("arrays");
    std::fs::create_dir(&arrays).unwrap();
    let labels: Vec<i64> = (0..40).map(|i| i % 3).collect();
    let x: Vec<u8> = labels
        .iter()
        .flat_map(|&c| {
            (0..784).flat_map(move |p| ((c as f32) / 2.0 + (p % 7) as f32 * 0.01).to_le_bytes())
        })
        .collect();
    std::fs::write(arrays.join("x.npy"), npy("<f4", "(40, 784)", &x)).unwrap();
    let y: Vec<u8> = labels.iter().flat_map(|l| l.to_le_bytes()).collect();
    std::fs::write(arrays.join("y.npy"), npy("<i8", "(40,)", &y)).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let checkpoints = out_dir.path().join("ckpt");
    let train = |data: &Path, model: &str, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            model,
            "--data",
            data.to_str().unwrap(),
            "--epochs",
            "1",
            "--batch-size",
            "8",
        ];
        args.extend_from_slice(extra);
        mirra(&args)
    };
    let out = train(
        &arrays,
        "mlp",
        &["--checkpoint-dir", checkpoints.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Dense 784x128, 128x64, 64x3 with biases.
    assert!(
        stdout.contains("mlp (108931 parameters) on 32 samples, validating on 8"),
        "{stdout}"
    );
    // A folder of PNGs: 6 of class "dark", 6 of "light", one 56x56 (resized).
    let images = dir.path().join("images");
    for (class, value) in [("dark", 30u8), ("light", 220)] {
        std::fs::create_dir_all(images.join(class)).unwrap();
        for i in 0..6 {
            let side = if i == 0 { 56 } else { 28 };
            image::GrayImage::from_pixel(side, side, image::Luma([value]))
                .save(images.join(class).join(format!("{i}.png")))
                .unwrap();
        }
    }
    let out = train(&images, "cnn", &["--replicas", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("on 8 samples, validating on 4"), "{stdout}");
    // Faults: examples of 100 values; the U-Net's canvases from an image folder.
    let wrong = dir.path().join("wrong");
    std::fs::create_dir(&wrong).unwrap();
    std::fs::write(wrong.join("x.npy"), npy("|u1", "(10, 10, 10)", &[0; 1000])).unwrap();
    std::fs::write(wrong.join("y.npy"), npy("|u1", "(10,)", &[0; 10])).unwrap();
    for (data, model, needle) in [
        (&wrong, "mlp", "examples of shape [10, 10] (100 values)"),
        (&images, "unet", "not an image folder"),
    ] {
        let out = train(data, model, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    }
}

/// Under a launcher's environment (mpirun's variables), a build without the `mpi` feature
/// refuses to train rather than run N independent copies writing the same files; a bad
/// rank variable and GPU workers are usage errors too.
#[test]
fn under_mpirun_a_build_without_mpi_or_a_bad_job_is_one_clear_line() {
    let run = |vars: &[(&str, &str)], args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mirra"))
            .arg("train")
            .args(args)
            .envs(vars.iter().copied())
            .output()
            .unwrap()
    };
    let job = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")];
    type Vars<'a> = &'a [(&'a str, &'a str)];
    let cases: Vec<(Vars<'_>, &[&str], &str)> = vec![
        (
            &[("PMI_RANK", "three"), ("PMI_SIZE", "4")],
            &[],
            "PMI_RANK=\"three\": the launcher's rank and size are numbers",
        ),
        (
            &job,
            &["--device", "cuda:0"],
            "under mpirun: each worker's replicas are host replicas",
        ),
        (
            &job,
            &["--replicas", "40", "--batch-size", "64"],
            "80 replicas (2 workers x --replicas 40) is more than --batch-size 64",
        ),
    ];
    for (vars, args, want) in cases {
        let out = run(vars, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    }
    #[cfg(not(feature = "mpi"))]
    {
        let out = run(&job, &["--epochs", "1"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("this mirra was built without MPI"),
            "{}",
            stderr(&out)
        );
    }
}
