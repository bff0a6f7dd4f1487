//! `cargo xtask gpu-probe`: what a GPU machine has, and whether mirra's CUDA calls work
//! there (see `mirra_cuda::probe`). The first thing the GPU bundle runs.
//!
//! Exit status: 0 when every step passed, 1 when one failed, 3 when there is no CUDA driver
//! (nothing could run; `ci/gpu-check.sh` says so and skips the rest).

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;
use mirra_cuda::probe::{self, ProbeConfig, Step};
use serde_json::{json, Map, Value};

use crate::json::num;
use crate::{cli, machine, Failure};

/// Exit status of a probe that found no CUDA driver.
pub const NO_GPU_EXIT: u8 = 3;

/// `cargo xtask gpu-probe` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask gpu-probe",
    about = "Probe the GPU: libraries, context, 1 GiB round trip, cuBLAS, an NVRTC kernel, NCCL"
)]
struct Args {
    /// The CUDA device to probe.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// MiB of the host<->device round trip and the device copy.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65536))]
    copy_mib: u64,
    /// Smaller sizes (a check that the steps run, not a measurement).
    #[arg(long)]
    quick: bool,
    /// Also write what was found as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(a) = cli::parse::<Args>("xtask gpu-probe", args)? else {
        return Ok(());
    };
    let mut cfg = ProbeConfig {
        ordinal: a.device,
        copy_bytes: (a.copy_mib as usize) << 20,
        ..ProbeConfig::default()
    };
    if a.quick {
        cfg.copy_bytes = cfg.copy_bytes.min(64 << 20);
        cfg.gemm_f32 = 1024;
        cfg.gemm_bf16 = 2048;
        cfg.kernel_elems = 1 << 22;
        cfg.iters = 3;
    }
    println!("# mirra GPU probe, {}", machine::utc_now());
    let mut out = std::io::stdout();
    let found = probe::run(&cfg, &mut |step| {
        let _ = writeln!(out, "{}", line(step));
        let _ = out.flush();
    });
    if let Some(path) = &a.json {
        crate::json::save(path, &report(&found), None)?;
    }
    if found.no_driver {
        return Err(Failure::with_code(
            "gpu-probe: no CUDA driver found: nothing can run on a GPU here",
            NO_GPU_EXIT,
        ));
    }
    let failed: Vec<&str> = found
        .steps
        .iter()
        .filter(|s| s.status != probe::Status::Ok)
        .map(|s| s.name.as_str())
        .collect();
    if failed.is_empty() {
        println!("# gpu-probe: every step passed");
        Ok(())
    } else {
        Err(Failure::run(format!(
            "gpu-probe: {} step(s) did not pass: {}",
            failed.len(),
            failed.join("; ")
        )))
    }
}

/// One log line per step: status, name, seconds, what it found.
fn line(s: &Step) -> String {
    format!(
        "[{:<7}] {} ({:.2} s): {}",
        s.status.label(),
        s.name,
        s.seconds,
        s.detail
    )
}

fn report(p: &probe::Probe) -> Value {
    let steps: Vec<Value> = p
        .steps
        .iter()
        .map(|s| {
            let figures: Map<String, Value> = s
                .figures
                .iter()
                .map(|(k, v)| (k.clone(), num(*v, 4)))
                .collect();
            json!({
                "name": s.name,
                "status": s.status.label(),
                "detail": s.detail,
                "seconds": num(s.seconds, 3),
                "figures": figures,
            })
        })
        .collect();
    json!({
        "no_driver": p.no_driver,
        "all_ok": p.all_ok(),
        "date": machine::utc_now(),
        "steps": steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked() {
        let bad = cli::parse::<Args>("xtask gpu-probe", &crate::cli::args(&["--copy-mib", "0"]));
        assert_eq!(bad.unwrap_err().code, 2);
        let bad = cli::parse::<Args>("xtask gpu-probe", &crate::cli::args(&["--bogus"]));
        assert_eq!(bad.unwrap_err().code, 2);
        let a = cli::parse::<Args>("xtask gpu-probe", &crate::cli::args(&["--quick"]))
            .unwrap()
            .unwrap();
        assert!(a.quick && a.device == 0 && a.copy_mib == 1024);
    }

    #[test]
    fn the_report_keeps_every_step_and_figure() {
        let p = probe::Probe {
            steps: vec![Step {
                name: "copy".into(),
                status: probe::Status::Ok,
                detail: "fine".into(),
                figures: vec![("d2d_copy_gbs".into(), 4300.123456)],
                seconds: 1.5,
            }],
            no_driver: false,
        };
        let r = report(&p);
        assert_eq!(r["steps"][0]["figures"]["d2d_copy_gbs"], 4300.1235);
        assert_eq!(r["all_ok"], true);
        assert!(line(&p.steps[0]).starts_with("[ok     ] copy (1.50 s): fine"));
    }
}
