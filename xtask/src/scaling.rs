//! `cargo xtask scaling`: scaling measured here, modelled elsewhere, and the model checked.
//!
//! - `--topology NAME`: the scaling model of `mirra-scaling` for a machine this one is not
//!   (see `docs/SCALING.md`): per all-reduce algorithm and replica count, the predicted step
//!   time, samples/s, scaling efficiency and exposed communication of a model trained
//!   data-parallel with DDP-style buckets (mirra-strategy's 25 MiB by default); which
//!   algorithm wins at which message size (4 KiB to 1 GiB); and the checks against public
//!   figures (the seed's 3.6x first). Everything lands in `target/bench/scaling-model.json`
//!   (written atomically), with `seed_check: {predicted_speedup, published_speedup}`.
//! - `--validate [--ablate NAME]`: every check, public figures and this machine's mirrored
//!   training measured now (the host model), predicted against published with its band and
//!   the ablations it rejects; exits 1 when any is outside its band. With `--ablate` the
//!   checks are those of the ablated model (`no-comm`, `double-bandwidth`, ...), which must
//!   fail. Writes `target/bench/scaling-validate.json`.
//! - neither: the measured mode (mirrored training on the devices at hand,
//!   `scaling_measured.rs`).

use std::path::PathBuf;

use clap::Parser;
use mirra::strategy::DEFAULT_BUCKET_BYTES;
use mirra_scaling::checks::{self, Check, Inputs, SeedCheck, Verdict};
use mirra_scaling::predict::{self, Prediction};
use mirra_scaling::presets;
use mirra_scaling::profile::MODELS;
use mirra_scaling::{Ablation, ModelProfile, ScalingError, Topology};
use serde_json::{json, Value};

use crate::json::{num, save};
use crate::nccl::size_label;
use crate::paths::bench_file;
use crate::{cli, scaling_measured, Failure};

/// The model whose per-layer backward timings are measured here rather than cited.
pub const MEASURED_MODEL: &str = "mnist-mlp";

/// The default samples per replica: the seed's 128 per GPU.
pub const DEFAULT_BATCH: usize = 128;

/// `cargo xtask scaling` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask scaling",
    about = "Scaling: measured here (default), modelled on a --topology, or the model checked \
             (--validate)"
)]
struct Args {
    /// Model this machine: dgx-h100, dgx-a100, 4xv100-nvlink, 2gpu-nvlink-bridge,
    /// 8gpu-pcie4, 8gpu-pcie5, ib-<N>node, dgx1-v100, 2gpu-pcie4, 2gpu-pcie3,
    /// p100-25gbe-<N>node; or a JSON file written by `mirra topo --json FILE` on the
    /// machine (its device matrix: NVLink, PCIe paths, sockets).
    #[arg(long, conflicts_with_all = ["validate", "quick"])]
    topology: Option<String>,
    /// The network (modelled mode): resnet50 (default), resnet101, resnet152, vgg16,
    /// inception3, unet3d, mnist-cnn, or mnist-mlp (per-layer timings measured here).
    #[arg(long, requires = "topology")]
    model: Option<String>,
    /// Replica counts, comma-separated (modelled: default powers of two up to the
    /// topology's devices; measured: default 1,2,4,8).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=4096),
          conflicts_with = "validate")]
    replicas: Option<Vec<u64>>,
    /// Samples per replica per step (modelled mode; default 128).
    #[arg(long, requires = "topology", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    batch: Option<u64>,
    /// Gradient bucket cap in MiB, up to 1024 (modelled mode; default: mirra-strategy's,
    /// 25 MiB as PyTorch DDP).
    #[arg(long, requires = "topology", value_parser = bucket_bytes)]
    bucket_mb: Option<usize>,
    /// Check the model: every check, predicted against published; exit 1 when one is
    /// outside its band.
    #[arg(long)]
    validate: bool,
    /// With --validate: check this variant of the model instead (none, no-comm,
    /// double-bandwidth, no-latency, no-overlap, single-copy, no-core-sharing).
    #[arg(long, requires = "validate", value_parser = ablation)]
    ablate: Option<Ablation>,
    /// Fewer, shorter repeats (measured mode, and the host measurement of --validate).
    #[arg(long)]
    quick: bool,
    /// With --validate: the host model's checks, compared with timings taken on this machine
    /// now, are measured and shown but do not set the exit status (CI on a shared machine:
    /// a timing is a benchmark's figure, not a gate). The public figures still gate.
    #[arg(long, requires = "validate")]
    host_advisory: bool,
    /// Where to write the JSON (default: target/bench/scaling-model.json,
    /// scaling-validate.json or scaling-measured.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `--bucket-mb`: a size in MiB, more than 0 and at most 1024, as bytes (at least 1).
fn bucket_bytes(v: &str) -> Result<usize, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|mb| mb.is_finite() && *mb > 0.0 && *mb <= 1024.0)
        .map(|mb| ((mb * (1u64 << 20) as f64).round() as usize).max(1))
        .ok_or_else(|| format!("a size in MiB above 0 and up to 1024, got `{v}`"))
}

/// `--ablate`: an ablation's name.
fn ablation(v: &str) -> Result<Ablation, String> {
    Ablation::parse(v).map_err(|e| e.to_string())
}

fn usage_error(message: impl std::fmt::Display) -> Failure {
    Failure::usage(format!("xtask scaling: {message}"))
}

/// The options of the modelled mode.
#[derive(Debug, PartialEq)]
struct Options {
    topology: Option<String>,
    model: String,
    replicas: Option<Vec<usize>>,
    batch: usize,
    bucket_bytes: usize,
    out: Option<PathBuf>,
}

impl Options {
    fn from_args(a: &Args) -> Options {
        Options {
            topology: a.topology.clone(),
            model: a.model.clone().unwrap_or_else(|| MODELS[0].to_string()),
            replicas: a
                .replicas
                .as_ref()
                .map(|r| r.iter().map(|&n| n as usize).collect()),
            batch: a.batch.map_or(DEFAULT_BATCH, |b| b as usize),
            bucket_bytes: a.bucket_mb.unwrap_or(DEFAULT_BUCKET_BYTES),
            out: a.out.clone(),
        }
    }
}

/// Powers of two up to the topology's devices.
pub(crate) fn default_replicas(devices: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |&n| n.checked_mul(2))
        .take_while(|&n| n <= devices)
        .collect()
}

/// The machine `mirra topo --json FILE` described: its device matrix, with the device
/// model from the first GPU's name and PCIe 5 (Hopper) or PCIe 4 links and Sapphire Rapids'
/// inter-socket rate (`presets::from_matrix` says what is modelled how).
fn from_topo_json(path: &str) -> Result<Topology, Failure> {
    let bad = |why: String| usage_error(format!("--topology {path}: {why}"));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON ({e})")))?;
    if v["schema"] != "mirra-topo/1" {
        return Err(bad(
            "not written by `mirra topo --json` (schema mirra-topo/1)".into(),
        ));
    }
    let gpu = v["gpus"][0]["name"].as_str().unwrap_or("");
    let device = presets::device_model_of(gpu)
        .ok_or_else(|| bad(format!("no compute figures for a GPU named `{gpu}`")))?;
    let links: Vec<Vec<String>> = v["links"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            row.as_array()
                .into_iter()
                .flatten()
                .map(|c| c.as_str().unwrap_or("?").to_string())
                .collect()
        })
        .collect();
    let pcie = if device == mirra_scaling::DeviceModel::H100 {
        presets::PCIE5_X16_GBS
    } else {
        presets::PCIE4_X16_GBS
    };
    let name = std::path::Path::new(path)
        .file_stem()
        .map_or("topo".into(), |s| s.to_string_lossy().into_owned());
    presets::from_matrix(&name, device, &links, pcie, presets::SPR_INTER_SOCKET_GBS)
        .map_err(|e| bad(e.to_string()))
}

/// The topology, model and replica counts the options name; anything they name wrongly is
/// a usage error.
fn resolve(o: &Options, topology: &str) -> Result<(Topology, ModelProfile, Vec<usize>), Failure> {
    let topo = if std::path::Path::new(topology).is_file() {
        from_topo_json(topology)?
    } else {
        presets::build(topology).map_err(usage_error)?
    };
    let model = if o.model == MEASURED_MODEL {
        // The model at hand, timed layer by layer on this machine.
        crate::scaling_measured::mlp_profile(o.batch, 30).map_err(Failure::run)?
    } else {
        ModelProfile::preset(&o.model, topo.device(), o.batch).map_err(|e| {
            usage_error(format!(
                "{e} (or `{MEASURED_MODEL}`, profiled on this machine)"
            ))
        })?
    };
    let replicas = o
        .replicas
        .clone()
        .unwrap_or_else(|| default_replicas(topo.devices().len()));
    for &n in &replicas {
        topo.replicas(n).map_err(usage_error)?;
    }
    Ok((topo, model, replicas))
}

fn ms(s: f64) -> Value {
    num(s * 1e3, 4)
}

/// A check as `scaling-model.json` records it (a figure that is not finite, as an
/// ablation's infinite bandwidth, is `null`).
pub(crate) fn check_json(c: &Check) -> Value {
    json!({
        "name": c.name,
        "predicted": num(c.predicted, 4),
        "published": num(c.published, 4),
        "unit": c.unit,
        "ratio": num(c.ratio(), 4),
        "band": [num(c.band.0, 4), num(c.band.1, 4)],
        "within": c.within(),
        "source": c.source,
        "timed_here": c.timed_here,
    })
}

/// A check with the ablations it rejects, as `scaling-validate.json` and the report record
/// it: `flagged` when it rejects none.
pub(crate) fn verdict_json(v: &Verdict) -> Value {
    let mut value = check_json(&v.check);
    value["rejects"] = json!(v.rejects.iter().map(|a| a.name()).collect::<Vec<_>>());
    value["flagged"] = json!(v.flagged());
    value
}

/// The JSON of a prediction on one topology (`scaling-model.json`).
pub(crate) fn report(
    topo: &Topology,
    model: &ModelProfile,
    p: &Prediction,
    checks: &[Check],
    seed: &SeedCheck,
    args: &[String],
) -> Value {
    let rows: Vec<Value> = p
        .rows
        .iter()
        .map(|r| {
            json!({
                "algorithm": r.algorithm.name(),
                "replicas": r.replicas,
                "step_ms": ms(r.step_s),
                "samples_per_s": num(r.samples_per_s, 1),
                "efficiency": num(r.efficiency, 4),
                "exposed_comm_ms": ms(r.exposed_comm_s),
                "comm_ms": ms(r.comm_s),
                "buckets": r.buckets,
                "peak_busbw_gbs": num(r.peak_busbw_gbs, 2),
            })
        })
        .collect();
    let sizes: Vec<Value> = p
        .crossover
        .points
        .iter()
        .map(|s| {
            json!({
                "bytes": s.bytes,
                "ring_us": num(s.ring_s * 1e6, 2),
                "tree_us": num(s.tree_s * 1e6, 2),
                "winner": s.winner.name(),
            })
        })
        .collect();
    let ranges: Vec<Value> = p
        .crossover
        .ranges
        .iter()
        .map(|r| {
            json!({
                "algorithm": r.algorithm.name(),
                "from_bytes": r.from_bytes,
                "to_bytes": r.to_bytes,
            })
        })
        .collect();
    json!({
        "schema": "mirra-scaling-model/1",
        "kind": "modelled",
        "command": format!("cargo xtask scaling {}", args.join(" ")).trim_end(),
        "topology": {
            "name": topo.name(),
            "description": topo.description(),
            "device": topo.device().name(),
            "devices": topo.devices().len(),
        },
        "model": {
            "name": model.name,
            "params": model.params(),
            "gradient_bytes": model.gradient_bytes(),
            "batch_per_replica": model.batch,
            "compute_ms": ms(model.compute_s()),
            "forward_ms": ms(model.forward_s),
            "backward_ms": ms(model.backward_s()),
            "source": model.source,
        },
        "bucket_bytes": p.bucket_bytes,
        "rows": rows,
        "crossover": {
            "replicas": p.crossover.replicas,
            "sizes": sizes,
            "ranges": ranges,
        },
        "checks": checks.iter().map(check_json).collect::<Vec<_>>(),
        "seed_check": {
            "predicted_speedup": num(seed.predicted_speedup, 3),
            "published_speedup": seed.published_speedup,
        },
    })
}

fn cell(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

/// The human-readable lines of a prediction and its checks.
fn lines(topo: &Topology, model: &ModelProfile, p: &Prediction, checks: &[Check]) -> Vec<String> {
    let mut l = vec![
        format!("# scaling model (modelled, not measured): {}", topo.name()),
        format!("#   {}", topo.description()),
        format!(
            "# model {}: {:.2} M parameters, {:.1} MB of gradients, buckets of {}",
            model.name,
            model.params() as f64 / 1e6,
            model.gradient_bytes() as f64 / 1e6,
            size_label(p.bucket_bytes),
        ),
        format!(
            "#   compute per replica {:.2} ms for {} samples, from {}",
            model.compute_s() * 1e3,
            model.batch,
            model.source
        ),
        "#".into(),
        format!(
            "# {:>9} {:>8} {:>10} {:>11} {:>10} {:>12} {:>10} {:>12}",
            "algorithm",
            "replicas",
            "step (ms)",
            "samples/s",
            "efficiency",
            "exposed (ms)",
            "comm (ms)",
            "busbw (GB/s)"
        ),
    ];
    for r in &p.rows {
        let busbw = if r.replicas > 1 {
            cell(r.peak_busbw_gbs, 1)
        } else {
            "-".into()
        };
        l.push(format!(
            "  {:>9} {:>8} {:>10} {:>11} {:>10} {:>12} {:>10} {:>12}",
            r.algorithm.name(),
            r.replicas,
            cell(r.step_s * 1e3, 2),
            cell(r.samples_per_s, 0),
            cell(r.efficiency, 3),
            cell(r.exposed_comm_s * 1e3, 3),
            cell(r.comm_s * 1e3, 3),
            busbw,
        ));
    }
    let c = &p.crossover;
    l.push("#".into());
    l.push(format!(
        "# all_reduce at {} replicas, ring against tree (busbw is the large-message plateau above)",
        c.replicas
    ));
    l.push(format!(
        "# {:>9} {:>12} {:>12}  {}",
        "size", "ring (us)", "tree (us)", "winner"
    ));
    for s in &c.points {
        l.push(format!(
            "  {:>9} {:>12} {:>12}  {}",
            size_label(s.bytes),
            cell(s.ring_s * 1e6, 2),
            cell(s.tree_s * 1e6, 2),
            s.winner.name()
        ));
    }
    let wins: Vec<String> = c
        .ranges
        .iter()
        .map(|r| {
            format!(
                "{} wins {}..{}",
                r.algorithm.name(),
                size_label(r.from_bytes),
                size_label(r.to_bytes)
            )
        })
        .collect();
    l.push(format!("# {}", wins.join("; ")));
    l.push("#".into());
    l.push(
        "# checks (predicted / published must lie in the band; docs/SCALING.md says why)".into(),
    );
    for ch in checks {
        l.push(format!("#   {}", check_line(ch)));
    }
    l.push(
        "#   (`cargo xtask scaling --validate`: with this machine, and what each rejects)".into(),
    );
    l
}

/// A check in one line: predicted against published, the ratio and its band, and whether
/// it holds.
pub(crate) fn check_line(c: &Check) -> String {
    let figure = |v: f64| {
        if v.abs() >= 100.0 || v == 0.0 {
            cell(v, 1)
        } else {
            format!("{v:.4}")
        }
    };
    let unit = if c.unit.is_empty() {
        String::new()
    } else {
        format!(" {}", c.unit)
    };
    format!(
        "{}: {} vs {}{unit}, ratio {:.3}, band [{:.3}, {:.3}]  {}",
        c.name,
        figure(c.predicted),
        figure(c.published),
        c.ratio(),
        c.band.0,
        c.band.1,
        if c.within() { "ok" } else { "MISSED" }
    )
}

/// What a check rejects, in words, or the flag when it rejects nothing.
pub(crate) fn rejects_line(v: &Verdict) -> String {
    if v.flagged() {
        "FLAG: rejects no ablation (a wrong model passes it too)".into()
    } else {
        format!(
            "rejects {}",
            v.rejects
                .iter()
                .map(|a| a.name())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// `cargo xtask scaling --validate [--ablate NAME]`.
fn validate(a: &Args, args: &[String]) -> Result<(), Failure> {
    let ablation = a.ablate.unwrap_or(Ablation::None);
    let fail = |e: ScalingError| Failure::run(format!("xtask scaling --validate: {e}"));
    println!(
        "# scaling model validation: public figures, and this machine's mirrored training \
         measured now{}",
        if a.quick { " (quick)" } else { "" }
    );
    if ablation != Ablation::None {
        println!(
            "# ABLATED model: {} ({}): it must fall outside some band",
            ablation.name(),
            ablation.description()
        );
    }
    let run = scaling_measured::measure_host(a.quick)?;
    let inputs = Inputs {
        bucket_bytes: DEFAULT_BUCKET_BYTES,
        host: Some(run.clone()),
    };
    let verdicts = checks::validate(&inputs).map_err(fail)?;
    let shown = if ablation == Ablation::None {
        verdicts.iter().map(|v| v.check.clone()).collect()
    } else {
        checks::suite(&inputs, ablation).map_err(fail)?
    };
    println!("# predicted vs published: the ratio must lie in the band (docs/SCALING.md says why)");
    for (v, c) in verdicts.iter().zip(&shown) {
        println!("  {}", check_line(c));
        println!("      {}; {}", c.source, rejects_line(v));
    }
    let host = host_summary(&run, ablation).map_err(fail)?;
    for line in host_lines(&run, &host) {
        println!("{line}");
    }
    let missed: Vec<&Check> = shown.iter().filter(|c| !c.within()).collect();
    let gating = gating(&missed, a.host_advisory);
    if gating.len() < missed.len() {
        println!(
            "# advisory (--host-advisory): the host checks outside their band are timings of this \
             machine now; they are reported, not gated on"
        );
    }
    let flagged = verdicts.iter().filter(|v| v.flagged()).count();
    println!(
        "# {} checks: {} within their band, {} outside; {flagged} reject no ablation (flagged)",
        shown.len(),
        shown.len() - missed.len(),
        missed.len()
    );
    let value = json!({
        "schema": "mirra-scaling-validate/1",
        "command": format!("cargo xtask scaling {}", args.join(" ")).trim_end(),
        "machine": crate::machine::facts(),
        "ablation": ablation.name(),
        "passed": gating.is_empty(),
        "host_advisory": a.host_advisory,
        "checks": verdicts.iter().map(verdict_json).collect::<Vec<_>>(),
        "ablated_checks": (ablation != Ablation::None)
            .then(|| shown.iter().map(check_json).collect::<Vec<_>>()),
        "host": host_json(&run, &host),
    });
    save(
        &bench_file(a.out.as_deref(), "scaling-validate.json"),
        &value,
        None,
    )?;
    let missed = gating;
    if missed.is_empty() {
        Ok(())
    } else {
        Err(Failure::run(format!(
            "xtask scaling --validate{}: {} of {} checks outside their band: {}",
            if ablation == Ablation::None {
                String::new()
            } else {
                format!(" --ablate {}", ablation.name())
            },
            missed.len(),
            shown.len(),
            missed
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        )))
    }
}

/// The checks outside their band that set the exit status: all of them, or with
/// `--host-advisory` all but the host model's (compared with timings taken here now).
fn gating<'a>(missed: &[&'a Check], host_advisory: bool) -> Vec<&'a Check> {
    missed
        .iter()
        .copied()
        .filter(|c| !(host_advisory && c.timed_here))
        .collect()
}

/// The host model at each checked replica count: `(replicas, prediction, measured
/// efficiency)`.
type HostSummary = Vec<(usize, mirra_scaling::host::HostPrediction, f64)>;

fn host_summary(run: &checks::HostRun, ablation: Ablation) -> Result<HostSummary, ScalingError> {
    run.efficiency
        .iter()
        .map(|&(n, measured)| Ok((n, run.measurements.predict(n, ablation)?, measured)))
        .collect()
}

fn host_lines(run: &checks::HostRun, host: &HostSummary) -> Vec<String> {
    let m = &run.measurements;
    let mut l =
        vec![
            format!("# host model ({})", run.source),
            format!(
            "#   inputs: {} cores, {:.2} usable at once now; copy GB/s by threads {}; one-replica \
             step by kernel threads {}; 4 KiB ring all-reduce {}",
            m.cores,
            m.parallel_cores,
            m.copy_gbs.iter().map(|g| format!("{g:.1}")).collect::<Vec<_>>().join(" / "),
            m.steps
                .iter()
                .map(|p| format!("{:.0} us", p.compute_s() * 1e6))
                .collect::<Vec<_>>()
                .join(" / "),
            m.sync
                .iter()
                .map(|s| format!("{:.1} us at {}", s.seconds * 1e6, s.ranks))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ];
    for (n, p, measured) in host {
        l.push(format!(
            "#   {n} replicas: predicted efficiency {:.3} (step {:.0} us, {} thread(s) each, \
             stretch {:.1}, all-reduce {:.0} us) against {measured:.3} measured: error {:+.1}% \
             (target within 25%)",
            p.efficiency,
            p.step_s * 1e6,
            p.threads_per_replica,
            p.stretch,
            p.comm_s * 1e6,
            100.0 * (p.efficiency / measured - 1.0)
        ));
    }
    l
}

fn host_json(run: &checks::HostRun, host: &HostSummary) -> Value {
    let m = &run.measurements;
    json!({
        "source": run.source,
        "cores": m.cores,
        "parallel_cores": num(m.parallel_cores, 3),
        "bucket_bytes": m.bucket_bytes,
        "copy_gbs_by_threads": m.copy_gbs.iter().map(|g| num(*g, 3)).collect::<Vec<_>>(),
        "one_replica_step_us_by_threads": m.steps.iter()
            .map(|p| num(p.compute_s() * 1e6, 2)).collect::<Vec<_>>(),
        "sync": m.sync.iter().map(|s| json!({
            "ranks": s.ranks, "bytes": s.bytes, "us": num(s.seconds * 1e6, 2),
        })).collect::<Vec<_>>(),
        "predictions": host.iter().map(|(n, p, measured)| json!({
            "replicas": n,
            "predicted_efficiency": num(p.efficiency, 4),
            "measured_efficiency": num(*measured, 4),
            "error": num(p.efficiency / measured - 1.0, 4),
            "within_25_percent": (p.efficiency / measured - 1.0).abs() <= 0.25,
            "step_us": num(p.step_s * 1e6, 2),
            "comm_us": num(p.comm_s * 1e6, 2),
            "threads_per_replica": p.threads_per_replica,
            "stretch": num(p.stretch, 3),
        })).collect::<Vec<_>>(),
    })
}

/// The inputs of the checks of public figures alone (no host measurement).
pub(crate) fn public_inputs() -> Inputs {
    Inputs {
        bucket_bytes: DEFAULT_BUCKET_BYTES,
        host: None,
    }
}

/// Runs `cargo xtask scaling` with the flags after the command name.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(a) = cli::parse::<Args>("xtask scaling", args)? else {
        return Ok(());
    };
    if a.validate {
        return validate(&a, args);
    }
    let o = Options::from_args(&a);
    let Some(name) = o.topology.as_deref() else {
        return scaling_measured::run(&scaling_measured::Options::new(
            a.quick,
            o.replicas.clone(),
            o.out.clone(),
        ));
    };
    let (topo, model, replicas) = resolve(&o, name)?;
    let fail = |e: ScalingError| Failure::run(format!("xtask scaling: {e}"));
    let p = predict::predict(&topo, &model, &replicas, o.bucket_bytes).map_err(fail)?;
    let checks = checks::suite(&public_inputs(), Ablation::None).map_err(fail)?;
    let seed = checks::seed_check(DEFAULT_BUCKET_BYTES, Ablation::None).map_err(fail)?;
    for line in lines(&topo, &model, &p, &checks) {
        println!("{line}");
    }
    println!(
        "# seed_check: predicted_speedup {:.2}, published_speedup {}",
        seed.predicted_speedup, seed.published_speedup
    );
    let out = bench_file(o.out.as_deref(), "scaling-model.json");
    let value = report(&topo, &model, &p, &checks, &seed, args);
    save(&out, &value, None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cli::args;

    fn parse(flags: &[&str]) -> Result<Options, Failure> {
        let a = cli::parse::<Args>("xtask scaling", &args(flags))?.expect("not --help");
        Ok(Options::from_args(&a))
    }

    #[test]
    fn flags_parse_and_bad_ones_are_usage_errors() {
        let o = parse(&[]).unwrap();
        assert_eq!(
            (o.topology, o.model.as_str(), o.batch),
            (None, "resnet50", 128)
        );
        assert_eq!(o.bucket_bytes, DEFAULT_BUCKET_BYTES);
        let o = parse(&[
            "--topology",
            "dgx-h100",
            "--replicas",
            "1,2,4,8",
            "--bucket-mb",
            "0.5",
            "--batch",
            "64",
        ])
        .unwrap();
        assert_eq!(o.replicas, Some(vec![1, 2, 4, 8]));
        assert_eq!((o.bucket_bytes, o.batch), (1 << 19, 64));
        let a = cli::parse::<Args>("x", &args(&["--validate", "--ablate", "no-comm"]))
            .unwrap()
            .unwrap();
        assert_eq!((a.validate, a.ablate), (true, Some(Ablation::NoComm)));
        for bad in [
            &["--replicas", "0"][..],
            &["--replicas", "two"],
            &["--replicas", ","],
            &["--topology", "dgx-h100", "--bucket-mb", "0"],
            &["--topology", "dgx-h100", "--bucket-mb", "-1"],
            &["--topology", "dgx-h100", "--bucket-mb", "2000"],
            &["--topology", "dgx-h100", "--batch", "0"],
            &["--topology"],
            &["--bogus"],
            // Flags of one mode in another.
            &["--model", "resnet50"],
            &["--batch", "8"],
            &["--topology", "dgx-h100", "--quick"],
            &["--topology", "dgx-h100", "--validate"],
            &["--ablate", "no-comm"],
            &["--validate", "--replicas", "2"],
            &["--validate", "--ablate", "half-bandwidth"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, 2, "{bad:?}");
        }
        let e = parse(&["--validate", "--ablate", "half-bandwidth"]).unwrap_err();
        assert!(
            e.message
                .contains("unknown ablation `half-bandwidth`; known: none, no-comm"),
            "{}",
            e.message
        );
    }

    #[test]
    fn unknown_names_and_replicas_that_do_not_fit_are_one_line_usage_errors() {
        for (flags, says) in [
            (
                &["--topology", "dgx-b200"][..],
                "unknown topology `dgx-b200`",
            ),
            (
                &["--topology", "dgx-h100", "--model", "bert"],
                "unknown model `bert`",
            ),
            (
                &["--topology", "dgx-h100", "--model", "vgg16"],
                "no cited vgg16 throughput for device H100",
            ),
            (
                &["--topology", "dgx-h100", "--replicas", "1,16"],
                "16 replicas do not fit topology `dgx-h100`, which has 8 devices",
            ),
        ] {
            let e = run(&args(flags)).unwrap_err();
            assert_eq!(e.code, 2, "{flags:?}");
            assert!(e.message.contains(says), "{}", e.message);
            assert_eq!(e.message.lines().count(), 1, "{}", e.message);
        }
        assert_eq!(default_replicas(16), [1, 2, 4, 8, 16]);
        assert_eq!(default_replicas(2), [1, 2]);
    }

    #[test]
    fn the_report_has_the_table_the_crossover_and_the_seed_check() {
        let dir = std::env::temp_dir().join(format!("xtask-scaling-{}", std::process::id()));
        let out = dir.join("scaling-model.json");
        let flags = args(&[
            "--topology",
            "ib-2node",
            "--replicas",
            "1,16",
            "--out",
            out.to_str().unwrap(),
        ]);
        run(&flags).unwrap();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(v["schema"], "mirra-scaling-model/1");
        assert_eq!(v["rows"].as_array().unwrap().len(), 4);
        assert_eq!(v["rows"][0]["efficiency"], 1.0);
        assert_eq!(v["crossover"]["replicas"], 16);
        assert_eq!(v["crossover"]["ranges"][0]["algorithm"], "tree");
        assert_eq!(v["seed_check"]["published_speedup"], 3.6);
        assert!(v["seed_check"]["predicted_speedup"].as_f64().unwrap() >= 3.6);
        let checks = v["checks"].as_array().unwrap();
        assert_eq!(checks.len(), 17);
        assert!(checks.iter().all(|c| c["within"] == true));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn check_lines_say_what_holds_and_what_each_check_rejects() {
        let c = Check {
            name: "x".into(),
            predicted: 3.0,
            published: 2.0,
            unit: "us",
            band: (0.5, 2.0),
            source: "s".into(),
            timed_here: false,
        };
        assert_eq!(
            check_line(&c),
            "x: 3.0000 vs 2.0000 us, ratio 1.500, band [0.500, 2.000]  ok"
        );
        let out = Check {
            predicted: 5.0,
            ..c.clone()
        };
        assert!(check_line(&out).ends_with("MISSED"));
        let unitless = Check {
            unit: "",
            ..c.clone()
        };
        assert!(check_line(&unitless).starts_with("x: 3.0000 vs 2.0000, ratio"));
        let v = Verdict {
            check: c.clone(),
            rejects: vec![Ablation::NoComm, Ablation::NoLatency],
        };
        assert_eq!(rejects_line(&v), "rejects no-comm, no-latency");
        assert_eq!(verdict_json(&v)["flagged"], false);
        let none = Verdict {
            check: c,
            rejects: vec![],
        };
        assert!(rejects_line(&none).starts_with("FLAG"));
        assert_eq!(verdict_json(&none)["flagged"], true);
        // An ablation's infinite bandwidth is written as null, not as a number.
        let inf = Check {
            predicted: f64::INFINITY,
            ..out
        };
        assert_eq!(check_json(&inf)["predicted"], Value::Null);
        assert_eq!(check_json(&inf)["within"], false);
    }

    #[test]
    fn host_advisory_leaves_only_the_timed_checks_out_of_the_exit_status() {
        let public = Check {
            name: "public".into(),
            predicted: 5.0,
            published: 2.0,
            unit: "",
            band: (0.5, 2.0),
            source: "s".into(),
            timed_here: false,
        };
        let host = Check {
            name: "host".into(),
            timed_here: true,
            ..public.clone()
        };
        let missed = [&public, &host];
        assert_eq!(gating(&missed, false).len(), 2);
        let gate = gating(&missed, true);
        assert_eq!(gate.len(), 1);
        assert_eq!(gate[0].name, "public");
    }

    /// `mirra topo --json`'s file of an 8-GPU NVSwitch board (every pair NV18).
    fn topo_json(dir: &std::path::Path, gpu: &str, cell: &str) -> String {
        let links: Vec<Vec<&str>> = (0..8)
            .map(|a| (0..8).map(|b| if a == b { "X" } else { cell }).collect())
            .collect();
        let v = serde_json::json!({
            "schema": "mirra-topo/1",
            "gpus": (0..8).map(|i| serde_json::json!({"ordinal": i, "name": gpu})).collect::<Vec<_>>(),
            "links": links,
        });
        let path = dir.join("here.json");
        std::fs::write(&path, v.to_string()).unwrap();
        path.to_string_lossy().into_owned()
    }

    #[test]
    fn a_topo_json_of_a_dgx_h100_predicts_what_the_preset_does() {
        let dir = std::env::temp_dir().join(format!("xtask-topo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = topo_json(&dir, "NVIDIA H100 80GB HBM3", "NV18");
        let o = parse(&["--topology", &path]).unwrap();
        let (here, model, replicas) = resolve(&o, &path).unwrap();
        let (preset, _, _) = resolve(&o, "dgx-h100").unwrap();
        let a = predict::predict(&here, &model, &replicas, o.bucket_bytes).unwrap();
        let b = predict::predict(&preset, &model, &replicas, o.bucket_bytes).unwrap();
        assert_eq!(a.rows.len(), b.rows.len());
        for (x, y) in a.rows.iter().zip(&b.rows) {
            assert_eq!(
                format!("{x:?}"),
                format!("{y:?}"),
                "from mirra topo vs the preset"
            );
        }
        // A file that is not mirra topo's, or names a GPU without figures: usage errors.
        let other = topo_json(&dir, "NVIDIA GeForce RTX 4090", "NV18");
        let e = resolve(&parse(&["--topology", &other]).unwrap(), &other).unwrap_err();
        assert!(format!("{e:?}").contains("no compute figures"), "{e:?}");
        std::fs::write(&path, "{}").unwrap();
        let e = resolve(&parse(&["--topology", &path]).unwrap(), &path).unwrap_err();
        assert!(format!("{e:?}").contains("schema mirra-topo/1"), "{e:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
