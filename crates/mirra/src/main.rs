//! The `mirra` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mirra::train::console::{one_line, warn};

mod data_arg;
mod launch_cmd;
mod mpi_job;
mod outputs;
mod resume;
mod topo_cmd;
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
    Train(Box<TrainArgs>),
    /// Print how this machine's GPUs are connected (NVLink, PCIe path, peer access), as
    /// `nvidia-smi topo -m`.
    Topo(TopoArgs),
    /// Run `mirra train` on N processes under mpirun (`mirra launch -np N -- train ...`),
    /// restarting the job from its last checkpoint when it fails (--max-restarts).
    Launch(launch_cmd::LaunchArgs),
}

/// Flags of `mirra topo`.
#[derive(Debug, clap::Args)]
pub struct TopoArgs {
    /// Also write the matrix as JSON to FILE (`cargo xtask scaling --topology FILE` models
    /// this machine from it).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `--lr-schedule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LrSchedule {
    /// The same rate at every step.
    Constant,
    /// Cosine decay to 0 over the run.
    Cosine,
}

/// `--precision`: Keras's dtype policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    /// Everything in f32.
    #[value(name = "float32")]
    Float32,
    /// Matrix products and convolutions in bfloat16, f32 weights, softmax and loss.
    #[value(name = "mixed_bfloat16")]
    MixedBfloat16,
    /// The same in float16, with dynamic loss scaling.
    #[value(name = "mixed_float16")]
    MixedFloat16,
}

impl Precision {
    /// The model's dtype policy.
    pub fn policy(self) -> mirra::nn::Policy {
        match self {
            Precision::Float32 => mirra::nn::Policy::Float32,
            Precision::MixedBfloat16 => mirra::nn::Policy::MixedBfloat16,
            Precision::MixedFloat16 => mirra::nn::Policy::MixedFloat16,
        }
    }
}

/// `--allreduce-dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AllReduceDtype {
    /// The gradients' own dtype.
    #[value(name = "float32")]
    Float32,
    /// bfloat16 (f32's range, 8 bits of mantissa).
    #[value(name = "bfloat16")]
    Bfloat16,
    /// float16 (11 bits of mantissa, up to 65504).
    #[value(name = "float16")]
    Float16,
}

impl AllReduceDtype {
    /// The dtype on the wire; `None` for the gradients' own.
    pub fn dtype(self) -> Option<mirra::tensor::DType> {
        match self {
            AllReduceDtype::Float32 => None,
            AllReduceDtype::Bfloat16 => Some(mirra::tensor::DType::BF16),
            AllReduceDtype::Float16 => Some(mirra::tensor::DType::F16),
        }
    }

    /// The flag's value.
    pub fn name(self) -> &'static str {
        match self {
            AllReduceDtype::Float32 => "float32",
            AllReduceDtype::Bfloat16 => "bfloat16",
            AllReduceDtype::Float16 => "float16",
        }
    }
}

/// Flags of `mirra train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// The model to train: mlp (Flatten, Dense 128, 64, 10: 109,386 parameters), cnn
    /// (Conv2D 32 and 64 of 3x3, each with 2x2 max pooling, Dense 128, 10: 225,034),
    /// resnet20 (the CIFAR ResNet-20: three stages of three residual blocks of 16, 32 and
    /// 64 filters, batch norm, global average pooling: 272,186), unet (a 2D U-Net of three
    /// levels, 16, 32 and 64 filters, a bottleneck of 128, batch norm, skip connections:
    /// 487,883; it
    /// segments 56x56 canvases of 2 to 4 digits made from the data, each pixel of a digit
    /// labelled with its class, and reports mean_iou and dice over the ten digit classes),
    /// unet3d (the same in 3D with 8, 16, 32 and 64 filters: 365,627; it segments 32x56x56
    /// volumes of digits extruded through 8 to 24 slices, one volume per 8 digits) or
    /// resnet50 (torchvision's ResNet-50, bottleneck blocks: 25,557,032; a throughput run
    /// on synthetic 224x224x3 images of 1000 classes, four batches per epoch, without
    /// --data).
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
    /// How the learning rate changes over the run: constant, or cosine (Keras's
    /// CosineDecay from --lr to 0 over every step of the --epochs, by update count, so a
    /// resumed run continues the curve).
    #[arg(long, value_enum, default_value_t = LrSchedule::Constant)]
    pub lr_schedule: LrSchedule,
    /// The data: a directory with MNIST's files (the four of train and t10k, or t10k's
    /// alone, split 80/20); NumPy arrays, a .npz archive or a directory of .npy files (x and
    /// y, split 80/20, or x_train, y_train, x_test, y_test), 784 values per example, u8
    /// pixels or floats used as they are; or a directory of images in one sub-folder per
    /// class (PNG, JPEG; classes in sorted order, each split 80/20), read per batch and
    /// made 28x28 greyscale. The classifiers get one output per class. By default the
    /// bundled t10k set, split 8,000 for training and 2,000 for validation.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Where to train: cpu, cuda:N (a CUDA device; without a driver, or without that
    /// device, an error saying so), or a comma-separated list of CUDA devices
    /// (cuda:0,cuda:1): one replica on each, in sync (the mirrored strategy).
    #[arg(long, default_value = "cpu", value_name = "DEVICE", value_parser = device)]
    pub device: String,
    /// Let f32 matrix products on a CUDA device run in TF32 (10-bit mantissa products,
    /// f32 sums: about 8x cuBLAS's f32 rate on an H200, PyTorch's `allow_tf32`); off by
    /// default. Refused on the CPU, which has no TF32.
    #[arg(long)]
    pub tf32: bool,
    /// Mixed precision (Keras's dtype policies): float32, mixed_bfloat16 (matrix products
    /// and convolutions compute in bfloat16 from f32 master weights; batch norm, the
    /// softmax and the loss stay in f32; weights, gradients and checkpoints are f32) or
    /// mixed_float16 (the same in float16, with dynamic loss scaling: the loss times a
    /// scale from 2^15, halved and the step skipped when the gradients overflow, doubled
    /// after 2,000 good steps; the scale is saved in checkpoints). A resumed run keeps its
    /// precision.
    #[arg(long, value_enum, default_value_t = Precision::Float32)]
    pub precision: Precision,
    /// An ablation for `cargo xtask accuracy-precision`, hidden from the help: under
    /// mixed_bfloat16, bf16 matrix products and convolutions keep their running sums in
    /// bf16 (rounded after every multiply-add) instead of f32. Trains worse, on purpose.
    #[arg(long, hide = true)]
    pub ablate_bf16_accumulation: bool,
    /// Augment the training images as each batch forms: shifts of up to 2 pixels, up to 10
    /// degrees of rotation, brightness and contrast within 10% (no flip: digits), drawn
    /// from --seed, the epoch and each image's index.
    #[arg(long)]
    pub augment: bool,
    /// Synchronise batch norm across replicas (models with batch norm: resnet20, resnet50): the
    /// batch statistics are summed over the replicas in every forward pass, so N replicas
    /// normalise as one device over the global batch (Keras's SyncBatchNormalization);
    /// without it each replica normalises by its own examples.
    #[arg(long)]
    pub sync_batch_norm: bool,
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
    /// Restart a failed run up to N times, each from the last checkpoint of
    /// --checkpoint-dir (torchrun's --max-restarts): the replicas are rebuilt and the run
    /// resumes, so it ends with the weights of an uninterrupted one. Each restart is
    /// logged on standard error with its cause. Under mpirun, `mirra launch` restarts the
    /// job instead.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_restarts: usize,
    /// Threads for the kernels, at most the machine's cores (default: all cores; with
    /// --replicas, per replica: the cores shared among the replicas).
    #[arg(long, value_parser = threads, allow_negative_numbers = true)]
    pub threads: Option<usize>,
    /// Train on N replicas in sync (the mirrored strategy; on CPU, N threads; with one
    /// --device cuda:N, N replicas sharing that GPU, which tests more than measures): the
    /// global batch (--batch-size) is split among them and their gradients all-reduced.
    /// At most the batch size (every replica needs an example) and 1024.
    #[arg(long, value_name = "N", value_parser = replicas, allow_negative_numbers = true)]
    pub replicas: Option<usize>,
    /// The all-reduce algorithm of the replicas: on the host ring (the default), tree,
    /// reduce-to-one or direct; on CUDA devices cuda-ring (the default), nccl-ring or
    /// nccl-tree (NCCL's algorithm is pinned for the whole process through NCCL_ALGO, set
    /// here before anything starts; an NCCL_ALGO already set to another one is an error).
    #[arg(long, value_name = "NAME", value_parser = collective)]
    pub collective: Option<String>,
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
    /// The dtype the replicas' gradients are all-reduced in: float32 (as they are), or
    /// bfloat16 / float16 (half the bytes moved, as DDP's compression hooks: each gradient
    /// rounded once to 16 bits, each partial sum the collective stores rounded again, the
    /// additions in f32; the summed gradients come back in f32). Needs replicas.
    #[arg(long, value_enum, value_name = "DTYPE", default_value_t = AllReduceDtype::Float32)]
    pub allreduce_dtype: AllReduceDtype,
    /// Deterministic mode: every step's weights, optimizer state, loss and metrics are
    /// bitwise those of one replica, for any --replicas (and MPI workers of one CPU type).
    /// The global batch is cut into micro-batches of --micro-batch examples, each run
    /// forward and backward on its own, their gradients summed in one fixed pairwise tree
    /// over the micro-batch index. Host replicas, f32 gradients, batch norm only
    /// synchronised (--sync-batch-norm). Costs the overlap of backward with communication,
    /// smaller matrix products and one addition of the gradients per micro-batch.
    #[arg(long)]
    pub deterministic: bool,
    /// Deterministic mode's micro-batch size (default: an eighth of --batch-size, rounded
    /// up): the results depend on it (and not on --replicas). Needs --deterministic.
    #[arg(long, value_name = "M", value_parser = positive)]
    pub micro_batch: Option<usize>,
    /// Scale the learning rate linearly with the global batch size, from a base batch of
    /// 64 (Goyal et al., 2017): lr x batch-size / 64.
    #[arg(long)]
    pub scale_lr: bool,
}

/// The base batch of --scale-lr's linear scaling rule.
pub const SCALE_LR_BASE_BATCH: usize = 64;

fn collective(s: &str) -> Result<String, String> {
    use mirra::collectives::{BACKENDS, DEVICE_BACKENDS};
    if BACKENDS.contains(&s) || DEVICE_BACKENDS.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "unknown collective '{s}' (known: {}; on CUDA devices {})",
            BACKENDS.join(", "),
            DEVICE_BACKENDS.join(", ")
        ))
    }
}

/// `cpu`, `cuda:N` (N a device ordinal), or a comma-separated list of `cuda:N`: the
/// spelling is checked here, the devices themselves when the run starts.
fn device(s: &str) -> Result<String, String> {
    let bad = |d: &str| format!("'{d}' is not a device (cpu or cuda:N, e.g. cuda:0)");
    if s == "cpu" {
        return Ok(s.to_string());
    }
    for d in s.split(',') {
        match d.strip_prefix("cuda:") {
            Some(n) if n.parse::<usize>().is_ok() => {}
            _ if d == "cpu" => {
                return Err(format!(
                    "'{s}': a list of devices names CUDA devices (replicas on the host: \
                     --device cpu --replicas N)"
                ))
            }
            _ => return Err(bad(d)),
        }
    }
    Ok(s.to_string())
}

impl TrainArgs {
    /// The devices of --device, as written.
    pub fn devices(&self) -> Vec<&str> {
        self.device.split(',').collect()
    }

    /// Whether the run trains under the mirrored strategy (--replicas, or several devices).
    pub fn mirrored(&self) -> bool {
        self.replicas.is_some() || self.devices().len() > 1 || self.deterministic
    }

    /// Deterministic mode's micro-batch size, when --deterministic is on.
    pub fn deterministic_micro_batch(&self) -> Option<usize> {
        self.deterministic.then(|| {
            self.micro_batch
                .unwrap_or_else(|| mirra::strategy::default_micro_batch(self.batch_size))
        })
    }

    /// The replicas that train in sync.
    pub fn replica_count(&self) -> usize {
        self.replicas.unwrap_or(self.devices().len())
    }

    /// The collective: --collective, or the default of where the replicas are.
    pub fn collective_name(&self) -> String {
        self.collective.clone().unwrap_or_else(|| {
            if self.device == "cpu" {
                "ring".into()
            } else {
                "cuda-ring".into()
            }
        })
    }
}

/// `--collective nccl-ring|nccl-tree`: NCCL reads NCCL_ALGO once per process, so it is
/// set here, before this process starts any thread (setting a variable while threads run
/// is unsound); one already set to another algorithm is a usage error.
fn pin_nccl_algorithm(args: &TrainArgs) -> Result<(), Failure> {
    let want = match args.collective.as_deref() {
        Some("nccl-ring") => "Ring",
        Some("nccl-tree") => "Tree",
        _ => return Ok(()),
    };
    match std::env::var("NCCL_ALGO") {
        Err(_) => {
            // No thread has been started yet: clap's parsing is single-threaded, and
            // nothing else ran before this function.
            std::env::set_var("NCCL_ALGO", want);
            Ok(())
        }
        Ok(v) if v.trim().eq_ignore_ascii_case(want) => Ok(()),
        Ok(v) => Err(Failure::Usage(format!(
            "--collective {} needs NCCL_ALGO={want}, but the environment sets NCCL_ALGO={v} \
             (NCCL takes one algorithm per process)",
            args.collective.as_deref().unwrap_or("")
        ))),
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
    let cli = match Cli::try_parse_from(launch_cmd::mpirun_spelling(std::env::args_os())) {
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
        Command::Train(args) => pin_nccl_algorithm(&args).and_then(|()| train_cmd::run(*args)),
        Command::Topo(args) => topo_cmd::run(args),
        Command::Launch(args) => launch_cmd::run(args),
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
