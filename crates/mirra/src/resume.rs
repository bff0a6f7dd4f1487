//! `--checkpoint-dir` and `--resume` of `mirra train`.
//!
//! Every epoch ends with `DIR/last.safetensors` (the latest epoch) and, when `val_loss`
//! improved, `DIR/best.safetensors`, both written atomically. `--resume` restores the
//! model from `DIR/last.safetensors` (weights, optimizer state, dropout generator) and
//! starts at the next epoch, whose data the seed and the epoch number fix, so the run ends
//! with the same weights, bit for bit, as one that was never interrupted. A resumed run
//! must use the settings recorded in the checkpoint ([`settings`]); a checkpoint that is
//! unreadable, foreign, or of another run is a usage error (exit 2): like a `--data`
//! directory without MNIST, it is an input the command line named that cannot be used.

use std::path::{Path, PathBuf};

use mirra::train::{Callback, Checkpoint, Model, ModelCheckpoint, TrainError};

use crate::{Failure, TrainArgs};

/// The checkpoint of the latest epoch.
pub const LAST: &str = "last.safetensors";
/// The checkpoint of the epoch with the lowest [`BEST_MONITOR`].
pub const BEST: &str = "best.safetensors";
/// What makes an epoch the best.
const BEST_MONITOR: &str = "val_loss";

/// The settings a resumed run must share with the run it continues, as `(flag without
/// --, value)`; every checkpoint records them.
fn settings(args: &TrainArgs) -> [(&'static str, String); 4] {
    [
        ("model", args.model.clone()),
        ("seed", args.seed.to_string()),
        ("batch-size", args.batch_size.to_string()),
        ("lr", args.lr.to_string()),
    ]
}

fn usage(e: TrainError) -> Failure {
    Failure::Usage(e.to_string())
}

/// Adds the checkpoint callbacks of `--checkpoint-dir` to `callbacks` and, with
/// `--resume`, restores `model` from the directory's latest checkpoint. Returns the
/// (0-based) epoch to start from.
pub fn setup(
    args: &TrainArgs,
    model: &mut Model,
    callbacks: &mut Vec<Box<dyn Callback>>,
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
            println!(
                "Replacing the checkpoints in {} (--resume continues them instead)",
                dir.display()
            );
        }
        (0, None)
    };
    let checkpoint = |name: &str| -> Result<ModelCheckpoint, Failure> {
        let c = ModelCheckpoint::new(literal(dir.join(name))).map_err(usage)?;
        let c = c.data_seed(args.seed);
        Ok(settings(args)
            .into_iter()
            .fold(c, |c, (key, value)| c.metadata(key, value)))
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
        println!("No checkpoint in {}: starting from epoch 1", dir.display());
        return Ok((0, None));
    }
    let checkpoint = Checkpoint::read(&path).map_err(usage)?;
    check_settings(args, &checkpoint)?;
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
        println!(
            "{} already holds {done} epochs (--epochs {}): nothing left to train",
            path.display(),
            args.epochs
        );
    } else {
        println!(
            "Resuming from {}: {done} epochs done (step {}), continuing at epoch {}",
            path.display(),
            checkpoint.step,
            done + 1
        );
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

/// An error unless the checkpoint was written with this run's [`settings`].
fn check_settings(args: &TrainArgs, checkpoint: &Checkpoint) -> Result<(), Failure> {
    let path = checkpoint.source().display();
    for (key, ours) in settings(args) {
        match checkpoint.meta.extra.get(key) {
            Some(theirs) if *theirs == ours => {}
            Some(theirs) => {
                return Err(Failure::Usage(format!(
                    "checkpoint {path} was written with --{key} {theirs}, not --{key} {ours}: \
                     resume with the same --model, --seed, --batch-size and --lr, or use \
                     another --checkpoint-dir"
                )))
            }
            None => {
                return Err(Failure::Usage(format!(
                    "checkpoint {path} does not record --{key}: it was not written by mirra train"
                )))
            }
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
