//! `cargo xtask`: the one entry point that people and CI share.
//!
//! Commands and their flags are parsed by clap (`cargo xtask --help`, `cargo xtask
//! <command> --help`): each command's module holds its flags and its parser. Unknown
//! commands and flags are one error and exit status 2.

mod accuracy;
mod accuracy_precision;
mod bench_collectives;
mod bench_core;
mod bench_gpu;
mod bench_mirrored;
mod bench_workers;
mod bf16_matmul;
mod cli;
mod compare;
mod conv_bench;
mod exchange;
mod gpu_bundle;
mod gpu_probe;
mod json;
mod kernels;
#[cfg(test)]
mod layers;

mod machine;
mod matmul;
mod memcpy;
mod mnist_train;
mod nccl;
mod numpy;
mod paths;
mod precision;
mod ranks;
mod report;
mod resnet50_bench;
mod rss;
mod scaling;
mod scaling_measured;
mod subnormal;
mod table;
mod timing;
mod torch_train;
mod torch_unet;

use std::process::ExitCode;

/// `cargo xtask`'s commands. Each one parses its own flags with clap (`cargo xtask
/// <command> --help`), so their arguments pass through untouched.
#[derive(Debug, clap::Parser)]
#[command(
    name = "cargo xtask",
    about = "mirra's developer commands: benchmarks, reports, the GPU bundle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The flags of one command, handed to its own parser.
#[derive(Debug, clap::Args)]
#[command(disable_help_flag = true)]
struct Rest {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    args: Vec<String>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// matmul vs numpy, MLP and CNN training vs PyTorch, mirra train itself, subnormals, peak RSS -> target/bench/core.json
    Bench(Rest),
    /// Train the CLI's models to their accuracy targets (mirra train, release) -> target/bench/accuracy.json
    Accuracy(Rest),
    /// The MLP and cnn on the full MNIST under each dtype policy, 3 seeds, with the bf16-accumulation ablation -> target/bench/accuracy-precision.json
    AccuracyPrecision(Rest),
    /// nccl-tests tables of the CPU collectives, the copy rate beside, OpenMPI and gloo -> target/bench/collectives.json
    BenchCollectives(Rest),
    /// MLP training per replica count and collective, what communication costs -> target/bench/mirrored.json
    BenchMirrored(Rest),
    /// mirra train in one process and under mpirun as several workers (MLP, cnn) -> target/bench/workers.json
    BenchWorkers(Rest),
    /// The scaling model (NVLink, PCIe, IB), its checks (--validate), this machine measured -> target/bench/
    Scaling(Rest),
    /// The scaling report, measured and modelled, SVG plots, baseline check -> target/reports/
    Report(Rest),
    /// Probe the GPU: libraries, context, 1 GiB round trip, cuBLAS, an NVRTC kernel, NCCL
    GpuProbe(Rest),
    /// One folder (< 64 MiB) to run on a GPU machine: binaries, GPU tests, ci/gpu-check.sh
    GpuBundle(Rest),
    /// Compile the CUDA kernels to PTX (sm_80, sm_90) with NVRTC and ptxas; --check: CI's
    Kernels(Rest),
}

/// An error that ends the command: a message and the exit status.
#[derive(Debug)]
pub struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    /// A usage error (exit status 2).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 2,
        }
    }

    /// A failure while running a command (exit status 1).
    pub fn run(message: impl Into<String>) -> Failure {
        Failure::with_code(message, 1)
    }

    /// A failure with its own exit status (`gpu-probe` without a GPU: 3).
    pub fn with_code(message: impl Into<String>, code: u8) -> Failure {
        Failure {
            message: message.into(),
            code,
        }
    }
}

fn main() -> ExitCode {
    let cli = match <Cli as clap::Parser>::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Bench(r) => bench_core::run(&r.args),
        Command::Accuracy(r) => accuracy::run(&r.args),
        Command::AccuracyPrecision(r) => accuracy_precision::run(&r.args),
        Command::BenchCollectives(r) => bench_collectives::run(&r.args),
        Command::BenchMirrored(r) => bench_mirrored::run(&r.args),
        Command::BenchWorkers(r) => bench_workers::run(&r.args),
        Command::Scaling(r) => scaling::run(&r.args),
        Command::Report(r) => report::run(&r.args),
        Command::Kernels(r) => kernels::run(&r.args),
        Command::GpuProbe(r) => gpu_probe::run(&r.args),
        Command::GpuBundle(r) => gpu_bundle::run(&r.args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("{}", f.message);
            ExitCode::from(f.code)
        }
    }
}
