//! `--checkpoint-dir` and `--resume` of `mirra train`.
//!
//! Every epoch ends with `DIR/last.safetensors` (the latest epoch) and, when `val_loss`
//! improved, `DIR/best.safetensors`, both written atomically. `--resume` restores the
//! model from `DIR/last.safetensors` (weights, optimizer state, dropout generator) and
//! starts at the next epoch, whose data the seed and the epoch number fix, so the run ends
//! with the same weights, bit for bit, as one that was never interrupted. Every checkpoint
//! records the run's configuration ([`run_config`]): a resumed run must use the settings
//! that decide its results (data, model, optimizer, learning rate, `--scale-lr`, batch
//! size, seed, precision, determinism), while those that only decide where it runs
//! (replicas, collective, device) may change, which is said. A checkpoint that is
//! unreadable, corrupt (its checksums), foreign, or of another run is a usage error
//! (exit 2): like a `--data` directory without MNIST, it is an input the command line
//! named that cannot be used.

use std::path::{Path, PathBuf};

use mirra::train::console::{one_line, print_line};
use mirra::train::{Callback, Checkpoint, Model, ModelCheckpoint, TrainError};

use crate::{Failure, TrainArgs};

/// The checkpoint of the latest epoch.
pub const LAST: &str = "last.safetensors";
/// The checkpoint of the epoch with the lowest [`BEST_MONITOR`].
pub const BEST: &str = "best.safetensors";
/// What makes an epoch the best.
const BEST_MONITOR: &str = "val_loss";

/// Whether a resumed run may change a setting of its run configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnChange {
    /// It decides the results: a resumed run with another value is refused.
    Refuse,
    /// It decides only where the run runs: the change is said and allowed.
    Allow,
}

/// One setting of a run, as every checkpoint records it.
#[derive(Debug)]
struct Setting {
    /// Its key in the checkpoint (`extra.<key>`).
    key: &'static str,
    /// How messages name it: the flag, or the key where there is none.
    label: &'static str,
    /// Its value in this run.
    value: String,
    on_change: OnChange,
}

/// The run configuration of `args` training `model`: what a checkpoint records and a
/// resumed run checks.
fn run_config(args: &TrainArgs, model: &Model) -> Vec<Setting> {
    let on_off = |b: bool| if b { "on" } else { "off" }.to_string();
    let data = match &args.data {
        Some(dir) => std::fs::canonicalize(dir)
            .unwrap_or_else(|_| dir.clone())
            .display()
            .to_string(),
        None => "bundled".into(),
    };
    let setting = |key, label, value, on_change| Setting {
        key,
        label,
        value,
        on_change,
    };
    use OnChange::{Allow, Refuse};
    vec![
        setting("data", "--data", data, Refuse),
        setting("model", "--model", args.model.clone(), Refuse),
        setting(
            "optimizer",
            "optimizer",
            model.optimizer().name().into(),
            Refuse,
        ),
        setting("lr", "--lr", args.lr.to_string(), Refuse),
        setting(
            "lr-schedule",
            "--lr-schedule",
            format!("{:?}", args.lr_schedule).to_lowercase(),
            Refuse,
        ),
        setting("scale-lr", "--scale-lr", on_off(args.scale_lr), Refuse),
        setting(
            "batch-size",
            "--batch-size",
            args.batch_size.to_string(),
            Refuse,
        ),
        setting("seed", "--seed", args.seed.to_string(), Refuse),
        setting("augment", "--augment", on_off(args.augment), Refuse),
        setting(
            "sync-batch-norm",
            "--sync-batch-norm",
            on_off(args.sync_batch_norm),
            Refuse,
        ),
        setting(
            "precision",
            "--precision",
            args.precision.policy().name().into(),
            Refuse,
        ),
        setting(
            "deterministic",
            "--deterministic",
            match args.deterministic_micro_batch() {
                Some(m) => format!("on, micro-batches of {m}"),
                None => on_off(false),
            },
            Refuse,
        ),
        setting(
            "replicas",
            "--replicas",
            args.replica_count().to_string(),
            Allow,
        ),
        setting(
            "workers",
            "MPI processes",
            crate::mpi_job::detect()
                .ok()
                .flatten()
                .map_or(1, |j| j.size)
                .to_string(),
            Allow,
        ),
        setting(
            "collective",
            "--collective",
            if args.mirrored() {
                args.collective_name()
            } else {
                "none".into()
            },
            Allow,
        ),
        setting("device", "--device", args.device.clone(), Allow),
        setting(
            "allreduce-dtype",
            "--allreduce-dtype",
            args.allreduce_dtype.name().into(),
            Allow,
        ),
    ]
}

fn usage(e: TrainError) -> Failure {
    Failure::Usage(e.to_string())
}

/// Adds the checkpoint callbacks of `--checkpoint-dir` to `callbacks` and, with
/// `--resume`, restores `model` from the directory's latest checkpoint. Returns the
/// (0-based) epoch to start from. Without `save` (the workers of an MPI job other than
/// rank 0) it only restores.
pub fn setup(
    args: &TrainArgs,
    model: &mut Model,
    callbacks: &mut Vec<Box<dyn Callback>>,
    save: bool,
) -> Result<usize, Failure> {
    let Some(dir) = &args.checkpoint_dir else {
        if args.resume {
            return Err(Failure::Usage(
                "--resume needs --checkpoint-dir DIR (the directory of the run to continue)".into(),
            ));
        }
        return Ok(0);
    };
    let (initial_epoch, best) = if args.resume {
        resume(args, dir, model)?
    } else {
        if dir.join(LAST).exists() {
            print_line(&format!(
                "Replacing the checkpoints in {} (--resume continues them instead)",
                dir.display()
            ));
        }
        (0, None)
    };
    if !save {
        // A worker other than rank 0 of an MPI job: it resumes, rank 0 saves.
        return Ok(initial_epoch);
    }
    let config = run_config(args, model);
    let checkpoint = |name: &str| -> Result<ModelCheckpoint, Failure> {
        let c = ModelCheckpoint::new(literal(dir.join(name))).map_err(usage)?;
        let c = c.data_seed(args.seed);
        Ok(config.iter().fold(c, |c, s| c.metadata(s.key, &s.value)))
    };
    let mut best_checkpoint = checkpoint(BEST)?.monitor(BEST_MONITOR).save_best_only(true);
    if let Some(value) = best {
        best_checkpoint = best_checkpoint.initial_value_threshold(value);
    }
    // Best first: a kill between the two saves then leaves `best` at or ahead of `last`,
    // and the resumed run, redoing that epoch, finds nothing better to write.
    callbacks.push(Box::new(best_checkpoint));
    callbacks.push(Box::new(checkpoint(LAST)?));
    Ok(initial_epoch)
}

/// Restores `model` from `dir`'s latest checkpoint, if any: the epoch to start from and
/// the best [`BEST_MONITOR`] so far.
fn resume(
    args: &TrainArgs,
    dir: &Path,
    model: &mut Model,
) -> Result<(usize, Option<f64>), Failure> {
    let path = dir.join(LAST);
    if !path.exists() {
        print_line(&format!(
            "No checkpoint in {}: starting from epoch 1",
            dir.display()
        ));
        return Ok((0, None));
    }
    let checkpoint = Checkpoint::read(&path).map_err(usage)?;
    check_settings(args, model, &checkpoint)?;
    let meta = &checkpoint.meta;
    // The data restarts exactly only at an epoch boundary.
    if meta.data.batch != 0 || meta.data.epoch != meta.epoch as u64 {
        return Err(Failure::Usage(format!(
            "checkpoint {} was written in the middle of an epoch (data at epoch {}, batch {}); \
             mirra train resumes from the end of an epoch",
            path.display(),
            meta.data.epoch,
            meta.data.batch
        )));
    }
    checkpoint.restore(model).map_err(usage)?;
    let done = meta.epoch;
    if done >= args.epochs {
        print_line(&format!(
            "{} already holds {done} epochs (--epochs {}): nothing left to train",
            path.display(),
            args.epochs
        ));
    } else {
        print_line(&format!(
            "Resuming from {}: {done} epochs done (step {}), continuing at epoch {}",
            path.display(),
            checkpoint.step,
            done + 1
        ));
    }
    let best = dir.join(BEST);
    let best = match best.exists() {
        true => Checkpoint::read(&best)
            .map_err(usage)?
            .meta
            .logs
            .get(BEST_MONITOR),
        false => None,
    };
    Ok((done, best))
}

/// An error unless the checkpoint was written with this run's settings that decide its
/// results; the others that changed are said.
fn check_settings(args: &TrainArgs, model: &Model, checkpoint: &Checkpoint) -> Result<(), Failure> {
    let path = checkpoint.source().display();
    for setting in run_config(args, model) {
        let (label, ours) = (setting.label, &setting.value);
        let theirs = checkpoint.meta.extra.get(setting.key);
        match (theirs, setting.on_change) {
            (Some(theirs), _) if theirs == ours => {}
            (Some(theirs), OnChange::Refuse) => {
                return Err(Failure::Usage(format!(
                    "checkpoint {path} was written with {label} {theirs}, not {label} {ours}: \
                     resume with the settings it was written with, or use another \
                     --checkpoint-dir"
                )))
            }
            (None, OnChange::Refuse) => {
                return Err(Failure::Usage(format!(
                    "checkpoint {path} does not record {label}: it was not written by this \
                     version of mirra train"
                )))
            }
            (Some(theirs), OnChange::Allow) => {
                print_line(&one_line(&format!(
                    "Resuming with {label} {ours} (the checkpoint was written with {label} \
                     {theirs})"
                )));
            }
            (None, OnChange::Allow) => {}
        }
    }
    Ok(())
}

/// `path` as a [`ModelCheckpoint`] pattern that means itself: braces doubled.
fn literal(path: PathBuf) -> PathBuf {
    match path.to_str() {
        Some(s) if s.contains(['{', '}']) => s.replace('{', "{{").replace('}', "}}").into(),
        _ => path,
    }
}
