//! `cargo xtask`: the one entry point that people and CI share.
//!
//! Commands are dispatched by hand (no argument-parsing dependency): the first argument
//! names the command, the rest are its flags. Unknown commands and flags are an error
//! line and exit status 2.

mod bench_collectives;
mod bench_core;
mod bench_mirrored;
mod cli;
mod compare;
mod flags;
mod gpu_bundle;
mod gpu_probe;
mod json;
#[cfg(test)]
mod layers;

mod machine;
mod matmul;
mod memcpy;
mod mlp;
mod nccl;
mod numpy;
mod paths;
mod ranks;
mod report;
mod rss;
mod scaling;
mod scaling_measured;
mod subnormal;
mod table;
mod timing;
mod torch_mlp;

use std::process::ExitCode;

/// The commands: name, one-line description, and whether it is written yet.
const COMMANDS: &[(&str, &str, bool)] = &[
    (
        "bench",
        "matmul vs numpy, MLP training vs PyTorch, mirra train itself, subnormals, peak RSS -> target/bench/core.json",
        true,
    ),
    (
        "bench-collectives",
        "nccl-tests tables of the CPU collectives, copy curve, OpenMPI and gloo beside -> target/bench/collectives.json",
        true,
    ),
    (
        "bench-mirrored",
        "MLP samples/s with 1, 2, 4 replicas per collective, exposed comm -> target/bench/mirrored.json",
        true,
    ),
    (
        "scaling",
        "modelled samples/s, efficiency on NVLink/PCIe/IB machines -> target/bench/scaling-model.json",
        true,
    ),
    (
        "report",
        "scaling report, measured and modelled, SVG plots, baseline check -> target/reports/",
        true,
    ),
    (
        "gpu-probe",
        "probe the GPU: libraries, context, 1 GiB round trip, cuBLAS, NVRTC kernel, NCCL",
        true,
    ),
    (
        "gpu-bundle",
        "one folder (< 64 MiB) to run on a GPU machine: binaries, GPU tests, ci/gpu-check.sh",
        true,
    ),
    ("help", "this message", true),
];

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

fn usage() -> String {
    let mut s = String::from("usage: cargo xtask <command> [flags]\n\ncommands:\n");
    for (name, what, _) in COMMANDS {
        s.push_str(&format!("  {name:<18} {what}\n"));
    }
    s.push_str(&format!(
        "\n`cargo xtask bench-collectives` flags:\n{}",
        bench_collectives::FLAGS_HELP
    ));
    s.push_str(&format!(
        "\n`cargo xtask bench-mirrored` flags:\n{}",
        bench_mirrored::FLAGS_HELP
    ));
    s.push_str(&format!(
        "\n`cargo xtask scaling` flags:\n{}",
        scaling::FLAGS_HELP
    ));
    s.push_str(&format!(
        "\n`cargo xtask report` flags:\n{}",
        report::FLAGS_HELP
    ));
    s
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None => Err(Failure::usage(format!(
            "xtask: no command given\n\n{}",
            usage()
        ))),
        Some("help" | "--help" | "-h") => {
            print!("{}", usage());
            Ok(())
        }
        Some("bench") => bench_core::run(&args[1..]),
        Some("bench-collectives") => bench_collectives::run(&args[1..]),
        Some("bench-mirrored") => bench_mirrored::run(&args[1..]),
        Some("scaling") => scaling::run(&args[1..]),
        Some("report") => report::run(&args[1..]),
        Some("gpu-probe") => gpu_probe::run(&args[1..]),
        Some("gpu-bundle") => gpu_bundle::run(&args[1..]),
        Some(cmd) => match COMMANDS.iter().find(|(name, _, _)| *name == cmd) {
            Some((_, _, false)) => Err(Failure::run(format!(
                "xtask: `{cmd}` is not written yet (it comes with the collectives and the \
                 mirrored strategy)"
            ))),
            _ => Err(Failure::usage(format!(
                "xtask: unknown command `{cmd}`\n\n{}",
                usage()
            ))),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("{}", f.message);
            ExitCode::from(f.code)
        }
    }
}
