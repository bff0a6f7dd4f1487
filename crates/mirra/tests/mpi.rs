//! `mirra train` under `mpirun` (cargo feature `mpi`; `ci/mpi.sh` runs these): every
//! process one worker of a multi-worker strategy, on the bundled data.
//!
//! What they reject: workers that do not follow one process with as many replicas (or one
//! device) at the same global batch; more than one process printing or writing; a lost
//! worker that does not end the job at once, non-zero and named, or whose run does not
//! resume to the bits of an uninterrupted one; a silent worker that hangs the others
//! instead of failing them at the collective deadline.
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mirra::train::Checkpoint;

/// Few epochs of small batches: the runs take a second or two.
const SETTINGS: [&str; 6] = ["--seed", "3", "--batch-size", "64", "--epochs", "2"];

/// `mirra train args` under `mpirun -np n` (`n` 0: without mpirun).
fn command(n: usize, args: &[&str], dir: &Path) -> Command {
    let mirra = env!("CARGO_BIN_EXE_mirra");
    let mut c = if n == 0 {
        Command::new(mirra)
    } else {
        let mut c = Command::new("mpirun");
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if root {
            c.arg("--allow-run-as-root");
        }
        c.args(["--oversubscribe", "-np", &n.to_string(), mirra]);
        c
    };
    c.arg("train").args(args).current_dir(dir);
    c
}

fn run(n: usize, args: &[&str], dir: &Path) -> Output {
    command(n, args, dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run mpirun ({e}): install OpenMPI (ci/install-mpi.sh)"))
}

fn text(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A History file's values of `key`, one per epoch.
fn history(path: &Path, key: &str) -> Vec<f64> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json[key]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no {key}", path.display()))
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// 2 workers of 2 replicas, and 3 workers of 1 (uneven shards: 64 = 22 + 22 + 20), follow
/// one process of 4 replicas and one device: loss and validation loss per epoch within
/// 1e-5 relative. (Per step, with workers as threads: `mirra-train`'s
/// `workers_follow_one_process_and_one_device`.)
#[test]
fn workers_follow_one_process_and_one_device() {
    let dir = tempfile::tempdir().unwrap();
    let runs: [(&str, usize, &[&str]); 4] = [
        ("one device", 0, &[]),
        ("1 x 4", 0, &["--replicas", "4"]),
        ("2 x 2", 2, &["--replicas", "2"]),
        ("3 x 1", 3, &[]),
    ];
    let mut results = Vec::new();
    for (name, n, extra) in runs {
        let file = format!("{}.json", name.replace(' ', "_"));
        let args: Vec<&str> = SETTINGS
            .iter()
            .copied()
            .chain(extra.iter().copied())
            .chain(["--history", &file])
            .collect();
        let out = run(n, &args, dir.path());
        assert!(out.status.success(), "{name}: {}", text(&out));
        let path = dir.path().join(&file);
        results.push((name, history(&path, "loss"), history(&path, "val_loss")));
    }
    let (_, want_loss, want_val) = &results[0];
    for (name, loss, val) in &results[1..] {
        for (e, (got, want)) in loss
            .iter()
            .zip(want_loss)
            .chain(val.iter().zip(want_val))
            .enumerate()
        {
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "{name}, value {e}: {got} against one device's {want}"
            );
        }
        assert_eq!(loss.len(), 2, "{name}");
    }
}

/// Issue 19 under real MPI: `--deterministic` on 2 workers of 2 replicas and on 3 workers
/// of 1 ends with one process of one replica's bits: the checkpoint's weights and
/// optimizer state, and every epoch's loss and validation loss.
#[test]
fn deterministic_workers_end_with_one_replicas_bits() {
    let dir = tempfile::tempdir().unwrap();
    let runs: [(&str, usize, &[&str]); 3] = [
        ("1 x 1", 0, &["--replicas", "1"]),
        ("2 x 2", 2, &["--replicas", "2"]),
        ("3 x 1", 3, &[]),
    ];
    let mut results = Vec::new();
    for (name, n, extra) in runs {
        let (file, ckpt) = (
            format!("{}.json", name.replace(' ', "_")),
            name.replace(' ', "_"),
        );
        let args: Vec<&str> = SETTINGS
            .iter()
            .copied()
            .chain(["--deterministic", "--micro-batch", "8"])
            .chain(extra.iter().copied())
            .chain(["--history", &file, "--checkpoint-dir", &ckpt])
            .collect();
        let out = run(n, &args, dir.path());
        assert!(out.status.success(), "{name}: {}", text(&out));
        let path = dir.path().join(&file);
        let bits = |key| -> Vec<u64> { history(&path, key).iter().map(|v| v.to_bits()).collect() };
        let weights = contents(&dir.path().join(&ckpt).join("last.safetensors"));
        results.push((name, bits("loss"), bits("val_loss"), weights));
    }
    let (_, loss, val, weights) = &results[0];
    for (name, l, v, w) in &results[1..] {
        assert_eq!((l, v), (loss, val), "{name}: losses against one replica's");
        let differ: Vec<&String> = w
            .iter()
            .zip(weights)
            .filter(|(a, b)| a != b)
            .map(|(a, _)| &a.0)
            .collect();
        assert!(
            differ.is_empty(),
            "{name}: {differ:?} differ from one replica's"
        );
    }
}

/// Rank 0 alone prints the progress and writes the History, TensorBoard logs and
/// checkpoints; every worker can resume from them.
#[test]
fn rank_0_alone_prints_and_writes_and_every_worker_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--seed",
        "3",
        "--batch-size",
        "64",
        "--epochs",
        "1",
        "--history",
        "h.json",
        "--logdir",
        "logs",
        "--checkpoint-dir",
        "ckpt",
    ];
    let out = run(2, &args, dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("Training mlp").count(), 1, "{}", text(&out));
    assert_eq!(stdout.matches("Epoch 1/1").count(), 1, "{}", text(&out));
    assert!(
        stdout.contains("2 replicas in sync: 2 workers (MPI processes) x 1"),
        "{}",
        text(&out)
    );
    assert_eq!(history(&dir.path().join("h.json"), "loss").len(), 1);
    assert!(dir.path().join("ckpt/last.safetensors").exists());
    let event_files = std::fs::read_dir(dir.path().join("logs/train"))
        .unwrap()
        .count();
    assert_eq!(event_files, 1, "one writer of TensorBoard's train run");
    // Both workers resume from rank 0's checkpoint and train epoch 2.
    let resumed: Vec<&str> = args
        .iter()
        .map(|a| if *a == "1" { "2" } else { a })
        .chain(["--resume"])
        .collect();
    let out = run(2, &resumed, dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Epoch 2/2"), "{}", text(&out));
    assert!(!stdout.contains("Epoch 1/2"), "{}", text(&out));
}

/// The rank-1 process of a running job: the descendant of `root` (mpirun, or the
/// launcher that runs it) whose environment says so.
fn rank_1_of(root: &Child) -> u32 {
    let children = |pid: u32| -> Vec<u32> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|c| {
                c.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let mut queue = vec![root.id()];
        while let Some(pid) = queue.pop() {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if env
                .split(|&b| b == 0)
                .any(|v| v == b"OMPI_COMM_WORLD_RANK=1")
            {
                return pid;
            }
            queue.extend(children(pid));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the job started no rank 1");
}

/// SIGKILL to rank 1 of `job` once `dir` holds the first epoch's checkpoint (an error if
/// the job ended first).
fn kill_rank_1_after_the_first_checkpoint(job: &mut Child, dir: &Path) {
    let rank_1 = rank_1_of(job);
    let first = dir.join("last.safetensors");
    while !first.exists() {
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended before epoch 1's checkpoint"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(rank_1, "-KILL");
}

fn signal(pid: u32, sig: &str) {
    Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
}

/// The weights and optimizer state of a checkpoint, as bytes.
fn contents(path: &Path) -> Vec<(String, Vec<u8>)> {
    let c = Checkpoint::read(path).unwrap();
    c.weights
        .iter()
        .chain(&c.optimizer_state)
        .map(|(n, t)| {
            (
                n.clone(),
                t.contiguous().unwrap().as_bytes().unwrap().to_vec(),
            )
        })
        .collect()
}

/// A worker killed (SIGKILL) after the first epoch's checkpoint: the job ends at once,
/// non-zero, with mpirun naming the lost rank; `--resume` then ends with the bits of an
/// uninterrupted run.
#[test]
fn a_killed_worker_ends_the_job_and_resume_gives_the_uninterrupted_bits() {
    let dir = tempfile::tempdir().unwrap();
    let args = |ckpt: &'static str| -> Vec<&'static str> {
        vec![
            "--seed",
            "3",
            "--batch-size",
            "8",
            "--epochs",
            "5",
            "--checkpoint-dir",
            ckpt,
        ]
    };
    let out = run(2, &args("whole"), dir.path());
    assert!(out.status.success(), "{}", text(&out));

    let mut job = command(2, &args("killed"), dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill_rank_1_after_the_first_checkpoint(&mut job, &dir.path().join("killed"));
    let killed = Instant::now();
    let out = job.wait_with_output().unwrap();
    let ended = killed.elapsed();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        ended < Duration::from_secs(20),
        "ended {ended:?} after the kill: {}",
        text(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rank 1") && stderr.contains("signal 9"),
        "mpirun does not name the lost rank: {}",
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("Epoch 5/5"),
        "the kill came too late: {}",
        text(&out)
    );

    let mut resumed = args("killed");
    resumed.push("--resume");
    let out = run(2, &resumed, dir.path());
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        contents(&dir.path().join("killed/last.safetensors")),
        contents(&dir.path().join("whole/last.safetensors")),
        "the resumed run's final weights and optimizer state"
    );
}

/// A worker that stops answering without dying (SIGSTOP): the other fails at the
/// collective deadline with an error naming it, and the job ends, never hangs.
#[test]
fn a_stopped_worker_fails_the_other_at_the_deadline_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--seed", "3", "--batch-size", "8", "--epochs", "50"];
    let mut job = command(2, &args, dir.path())
        .env("MIRRA_COLLECTIVE_TIMEOUT_MS", "1000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rank_1 = rank_1_of(&job);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(job.try_wait().unwrap().is_none(), "the job ended early");
    signal(rank_1, "-STOP");
    let stopped = Instant::now();
    let out = job.wait_with_output();
    let ended = stopped.elapsed();
    // Whatever happened, leave no stopped process behind.
    signal(rank_1, "-KILL");
    let out = out.unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        ended < Duration::from_secs(30),
        "ended {ended:?} after the stop: {}",
        text(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rank 0 timed out after") && stderr.contains("waiting for rank(s) [1]"),
        "{}",
        text(&out)
    );
}

/// `mirra launch -np 2 --max-restarts 1`: a worker killed after epoch 1's checkpoint ends
/// the job; the launcher logs the restart with mpirun's cause, starts the job again with
/// --resume, and it ends with the bits of an uninterrupted run.
#[test]
fn mirra_launch_restarts_a_job_whose_worker_was_killed() {
    let dir = tempfile::tempdir().unwrap();
    let train = |ckpt: &'static str| -> Vec<&'static str> {
        vec![
            "train",
            "--seed",
            "3",
            "--batch-size",
            "8",
            "--epochs",
            "5",
            "--checkpoint-dir",
            ckpt,
        ]
    };
    let launch = |ckpt| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mirra"));
        c.args([
            "launch",
            "-np",
            "2",
            "--oversubscribe",
            "--max-restarts",
            "1",
            "--",
        ])
        .args(train(ckpt))
        .current_dir(dir.path());
        c
    };
    let out = launch("whole").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("restart"),
        "{}",
        text(&out)
    );

    let mut job = launch("killed")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill_rank_1_after_the_first_checkpoint(&mut job, &dir.path().join("killed"));
    let out = job.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let restart = stderr
        .lines()
        .find(|l| l.starts_with("mirra launch: the job failed"))
        .unwrap_or_else(|| panic!("no restart logged: {}", text(&out)));
    assert!(
        restart.contains("rank 1") && restart.contains("restart 1 of 1 from the last checkpoint"),
        "{restart}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("continuing at epoch"), "{}", text(&out));
    assert_eq!(
        contents(&dir.path().join("killed/last.safetensors")),
        contents(&dir.path().join("whole/last.safetensors")),
        "the restarted job's final weights and optimizer state"
    );
}

/// Issue 18's proof per step under real MPI: the library's multi-worker strategy
/// (`MirroredStrategy::multi_worker`) in `mpirun` processes follows one process of 4
/// replicas and one device, loss per step within 1e-5 relative, a partial last batch
/// included: 2 workers of 2 replicas, and 3 workers of 1 (uneven shards: 16 = 6 + 6 + 4,
/// 7 = 3 + 3 + 1). Every worker prints its losses' bits; all must agree.
#[test]
fn multi_worker_steps_follow_one_process_and_one_device() {
    if std::env::var_os(STEPS_CHILD).is_some() {
        return;
    }
    let want = steps::losses(None);
    let flat = steps::losses(Some(std::sync::Arc::new(
        mirra::strategy::MirroredStrategy::new(steps::config(4)).unwrap(),
    )));
    for (workers, replicas) in [(2, 2), (3, 1)] {
        let exe = std::env::current_exe().unwrap();
        let mut c = Command::new("mpirun");
        if Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
        {
            c.arg("--allow-run-as-root");
        }
        let out = c
            .args(["--oversubscribe", "-np", &workers.to_string()])
            .arg(exe)
            .args([
                "--exact",
                "rank_steps",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STEPS_CHILD, replicas.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{workers} x {replicas}: {}",
            text(&out)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout
            .lines()
            // The test harness may print its line first, on the same line.
            .filter_map(|l| l.find("losses ").map(|at| &l[at..]))
            .collect();
        assert_eq!(lines.len(), workers, "{}", text(&out));
        assert!(
            lines.iter().all(|l| *l == lines[0]),
            "workers disagree: {lines:?}"
        );
        let got: Vec<f64> = lines[0]
            .trim_start_matches("losses ")
            .split(' ')
            .map(|b| f64::from_bits(u64::from_str_radix(b, 16).unwrap()))
            .collect();
        assert_eq!(got.len(), want.len());
        for (s, ((g, f), d)) in got.iter().zip(&flat).zip(&want).enumerate() {
            assert!(
                (g - f).abs() <= 1e-5 * f.abs() && (g - d).abs() <= 1e-5 * d.abs(),
                "{workers} x {replicas}, step {s}: {g} against 1 x 4's {f} and one device's {d}"
            );
        }
    }
}

/// Set (to the replicas per worker) in the environment of `rank_steps`'s processes.
const STEPS_CHILD: &str = "MIRRA_MPI_STEPS_CHILD";

#[test]
#[ignore = "one worker of an mpirun job: run by multi_worker_steps_follow_one_process_and_one_device"]
fn rank_steps() {
    let Some(replicas) = std::env::var(STEPS_CHILD).ok() else {
        return;
    };
    let mpi = mirra::collectives::Mpi::init().unwrap();
    let config = steps::config(replicas.parse().unwrap());
    let strategy = mirra::strategy::MirroredStrategy::multi_worker(&mpi, config).unwrap();
    let losses = steps::losses(Some(std::sync::Arc::new(strategy)));
    let bits: Vec<String> = losses
        .iter()
        .map(|l| format!("{:x}", l.to_bits()))
        .collect();
    println!("losses {}", bits.join(" "));
    drop(mpi);
}

/// The model, data and steps of the per-step proof.
mod steps {
    use std::sync::Arc;

    use mirra::nn::loss::SparseCategoricalCrossentropy;
    use mirra::nn::{Accuracy, Activation, Dense, Flatten, Network};
    use mirra::optim::Adam;
    use mirra::strategy::{MirroredStrategy, StrategyConfig};
    use mirra::tensor::{Device, Tensor};
    use mirra::train::Model;

    /// `replicas` host replicas, one kernel thread each, small buckets.
    pub fn config(replicas: usize) -> StrategyConfig {
        StrategyConfig::cpu(replicas)
            .with_collective("direct")
            .with_bucket_bytes(256)
            .with_threads_per_replica(1)
    }

    fn net() -> Network {
        let mut n = Network::new(vec![
            Box::new(Flatten),
            Box::new(Dense::new(16, Activation::Relu)),
            Box::new(Dense::new(3, Activation::Softmax)),
        ]);
        n.build(&[6], 11).unwrap();
        n
    }

    /// The losses of 5 steps at global batch 16, the last one partial (7 examples).
    pub fn losses(strategy: Option<Arc<MirroredStrategy>>) -> Vec<f64> {
        let opt = Box::new(Adam::new(0.01));
        let loss = Box::new(SparseCategoricalCrossentropy::default());
        let metrics: Vec<Box<dyn mirra::nn::Metric>> = vec![Box::new(Accuracy::new())];
        let mut model = match strategy {
            None => Model::compile(net(), opt, loss, metrics, 1),
            Some(s) => {
                let built = s.scope(net);
                Model::compile_in(s, built, opt, loss, metrics, 1).unwrap()
            }
        };
        let n = 4 * 16 + 7;
        let x: Vec<f32> = (0..n * 6)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let y: Vec<i64> = x
            .chunks(6)
            .map(|r| (r[0] + r[1] > 0.0) as i64 + (r[2] > 0.5) as i64)
            .collect();
        let x = Tensor::from_vec(x, &[n, 6], Device::Cpu).unwrap();
        let y = Tensor::from_vec(y, &[n], Device::Cpu).unwrap();
        (0..5)
            .map(|s| {
                let len = if s == 4 { 7 } else { 16 };
                let xb = x.narrow(0, s * 16, len).unwrap();
                let yb = y.narrow(0, s * 16, len).unwrap();
                model.train_step(xb, &yb).unwrap().loss
            })
            .collect()
    }
}
