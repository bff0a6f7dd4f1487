//! The `mirra` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mirra::train::console::{one_line, warn};

mod outputs;
mod resume;
mod train_cmd;

/// Data-parallel training for Rust.
#[derive(Debug, Parser)]
#[command(name = "mirra", version, about, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train a model on MNIST (the bundled data unless --data is given).
    Train(TrainArgs),
}

/// Flags of `mirra train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// The model to train.
    #[arg(long, default_value = "mlp")]
    pub model: String,
    /// Number of epochs.
    #[arg(long, default_value_t = 5, value_parser = positive, allow_negative_numbers = true)]
    pub epochs: usize,
    /// The (global) batch size.
    #[arg(long, default_value_t = 64, value_parser = positive, allow_negative_numbers = true)]
    pub batch_size: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 1e-3, value_parser = positive_f64, allow_negative_numbers = true)]
    pub lr: f64,
    /// A directory with the four standard MNIST files (train and t10k); by default the
    /// bundled t10k set, split 8,000 for training and 2,000 for validation.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Where to train: cpu, or cuda:N (a CUDA device; without a driver, or without that
    /// device, an error saying so).
    #[arg(long, default_value = "cpu", value_name = "DEVICE", value_parser = device)]
    pub device: String,
    /// Let f32 matrix products on a CUDA device run in TF32 (10-bit mantissa products,
    /// f32 sums: about 8x cuBLAS's f32 rate on an H200, PyTorch's `allow_tf32`); off by
    /// default. Refused on the CPU, which has no TF32.
    #[arg(long)]
    pub tf32: bool,
    /// Seed of weights, shuffling and dropout.
    #[arg(long, default_value_t = 1, value_parser = seed, allow_negative_numbers = true)]
    pub seed: u64,
    /// Write the History (the epochs' numbers and one list per metric) as JSON to FILE
    /// after every epoch; a resumed run's holds every epoch of the run.
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// Write a Chrome trace (chrome://tracing, ui.perfetto.dev) of the training to FILE:
    /// per replica thread, forward, backward, each gradient bucket's copy, all-reduce and
    /// wait, the optimizer step; the progress threads' collectives.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Write TensorBoard event files (per-epoch loss, accuracy, learning rate, samples/s)
    /// to DIR/train and DIR/validation; view them with `tensorboard --logdir DIR`.
    #[arg(long, value_name = "DIR")]
    pub logdir: Option<PathBuf>,
    /// Save a checkpoint (weights, optimizer state, epoch, RNG, data position, History and
    /// the run's settings, with checksums) to DIR/last.safetensors after every epoch, and
    /// to DIR/best.safetensors when val_loss improves. The directory is locked for the
    /// run: a second run on it is refused.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Continue the run whose checkpoints are in --checkpoint-dir (from epoch 1 when it
    /// holds none), with the same --model, --data, --lr, --scale-lr, --batch-size and
    /// --seed; --replicas and --collective may change.
    #[arg(long)]
    pub resume: bool,
    /// Threads for the kernels, at most the machine's cores (default: all cores; with
    /// --replicas, per replica: the cores shared among the replicas).
    #[arg(long, value_parser = threads, allow_negative_numbers = true)]
    pub threads: Option<usize>,
    /// Train on N replicas in sync (the mirrored strategy; on CPU, N threads): the global
    /// batch (--batch-size) is split among them and their gradients all-reduced. At most
    /// the batch size (every replica needs an example) and 1024.
    #[arg(long, value_name = "N", value_parser = replicas, allow_negative_numbers = true)]
    pub replicas: Option<usize>,
    /// The all-reduce algorithm of --replicas: ring, tree, reduce-to-one or direct.
    #[arg(long, value_name = "NAME", default_value = "ring", value_parser = collective)]
    pub collective: String,
    /// Gradient bucket size in MiB for the overlapped all-reduce (PyTorch DDP's
    /// bucket_cap_mb).
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = 25.0,
        value_parser = positive_f64,
        allow_negative_numbers = true
    )]
    pub bucket_mb: f64,
    /// Scale the learning rate linearly with the global batch size, from a base batch of
    /// 64 (Goyal et al., 2017): lr x batch-size / 64.
    #[arg(long)]
    pub scale_lr: bool,
}

/// The base batch of --scale-lr's linear scaling rule.
pub const SCALE_LR_BASE_BATCH: usize = 64;

fn collective(s: &str) -> Result<String, String> {
    if mirra::collectives::BACKENDS.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "unknown collective '{s}' (known: {})",
            mirra::collectives::BACKENDS.join(", ")
        ))
    }
}

/// `cpu` or `cuda:N` (N a device ordinal): the spelling is checked here, the device itself
/// when the run starts.
fn device(s: &str) -> Result<String, String> {
    match s.strip_prefix("cuda:") {
        None if s == "cpu" => Ok(s.to_string()),
        Some(n) if n.parse::<usize>().is_ok() => Ok(s.to_string()),
        _ => Err(format!(
            "'{s}' is not a device (cpu or cuda:N, e.g. cuda:0)"
        )),
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match (s.parse::<usize>(), s.parse::<i128>()) {
        (Ok(0), _) | (Err(_), Ok(..=0)) => Err("must be at least 1".into()),
        (Ok(n), _) => Ok(n),
        (Err(_), Ok(_)) => Err(format!("{s} is too large")),
        (Err(_), Err(_)) => Err(format!("'{s}' is not a whole number")),
    }
}

/// The most replicas `--replicas` accepts: each is a thread holding a full model.
pub const MAX_REPLICAS: usize = 1024;

fn replicas(s: &str) -> Result<usize, String> {
    let n = positive(s)?;
    if n > MAX_REPLICAS {
        return Err(format!("{n} replicas, but at most {MAX_REPLICAS}"));
    }
    Ok(n)
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        Ok(_) => Err("must be a positive number".into()),
        Err(_) => Err(format!("'{s}' is not a number")),
    }
}

fn seed(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .map_err(|_| format!("'{s}' is not a whole number from 0 to {}", u64::MAX))
}

/// A thread count from 1 to the machine's cores: more threads than cores only queue
/// for them.
fn threads(s: &str) -> Result<usize, String> {
    let n = positive(s)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n > cores {
        return Err(format!(
            "{n} threads, but this machine has {cores} core{}",
            if cores == 1 { "" } else { "s" }
        ));
    }
    Ok(n)
}

/// How a command failed: a usage error (exit 2) or a failure while running (exit 1).
#[derive(Debug)]
pub enum Failure {
    /// The arguments or the inputs they name are wrong.
    Usage(String),
    /// Something went wrong while running.
    Run(String),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // Bare `mirra`: the usage, with the commands.
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) => {
            // One line: clap's first line names the flag and what is wrong with it.
            let text = e.render().to_string();
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("error: bad arguments");
            warn(line);
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Train(args) => train_cmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // One line, whatever the strings the message quotes hold.
        Err(Failure::Usage(msg)) => {
            warn(&format!("error: {}", one_line(&msg)));
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            warn(&format!("error: {}", one_line(&msg)));
            ExitCode::from(1)
        }
    }
}
