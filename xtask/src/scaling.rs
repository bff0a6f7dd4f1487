//! `cargo xtask scaling --topology NAME`: the scaling model of `mirra-scaling` for a machine
//! this one is not (see `docs/SCALING.md`).
//!
//! Prints, per all-reduce algorithm and replica count, the predicted step time, samples/s,
//! scaling efficiency and exposed communication of a model trained data-parallel with
//! DDP-style 25 MiB buckets; which algorithm wins at which message size (4 KiB to 1 GiB);
//! and the model's checks against public figures (the seed's 3.6x first) and against this
//! machine's CPU collectives as `docs/COLLECTIVES.md` measured them. Everything lands in
//! `target/bench/scaling-model.json` (written atomically), with `seed_check:
//! {predicted_speedup, published_speedup}`.
//!
//! Without `--topology` the command is the measured mode (mirrored training on the devices
//! at hand, `scaling_measured.rs`).

use std::path::PathBuf;

use mirra_scaling::checks::{self, Check};
use mirra_scaling::predict::{self, Prediction, DEFAULT_BUCKET_BYTES};
use mirra_scaling::presets::{self, MAX_IB_NODES};
use mirra_scaling::profile::MODELS;
use mirra_scaling::{ModelProfile, ScalingError, Topology};
use serde_json::{json, Value};

use crate::json::{num, save};
use crate::nccl::size_label;
use crate::paths::bench_file;
use crate::{flags, Failure};

/// The flags of `cargo xtask scaling`, for the usage message.
pub const FLAGS_HELP: &str =
    "  --topology NAME    model this machine: dgx-h100, 4xv100-nvlink, 2gpu-nvlink-bridge,
                     8gpu-pcie4, 8gpu-pcie5, ib-2node (ib-<N>node), dgx1-v100
                     (without it: the measured mode, below)
  --model NAME       resnet50 (default), or mnist-mlp (per-layer timings measured here)
  --replicas 1,2,4   replica counts (default: powers of two up to the topology's devices)
  --batch N          samples per replica per step (default: 128)
  --bucket-mb X      gradient bucket cap in MiB (default: 25, as PyTorch DDP)
  --out FILE         where to write the JSON (default: target/bench/scaling-model.json)
";

/// The model whose per-layer backward timings are measured here rather than cited.
pub const MEASURED_MODEL: &str = "mnist-mlp";

/// The default samples per replica: the seed's 128 per GPU.
pub const DEFAULT_BATCH: usize = 128;

#[derive(Debug, PartialEq)]
struct Options {
    topology: Option<String>,
    model: String,
    replicas: Option<Vec<usize>>,
    batch: usize,
    bucket_bytes: usize,
    out: Option<PathBuf>,
}

fn usage_error(message: impl std::fmt::Display) -> Failure {
    Failure::usage(format!("xtask scaling: {message}"))
}

fn positive(flag: &str, v: &str) -> Result<usize, Failure> {
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            usage_error(format!(
                "{flag} takes a whole number of at least 1, got `{v}`"
            ))
        })
}

fn parse(args: &[String]) -> Result<Options, Failure> {
    let mut o = Options {
        topology: None,
        model: MODELS[0].to_string(),
        replicas: None,
        batch: DEFAULT_BATCH,
        bucket_bytes: DEFAULT_BUCKET_BYTES,
        out: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| flags::value("scaling", flag, &mut it);
        match arg.as_str() {
            "--topology" => o.topology = Some(value("--topology")?),
            "--model" => o.model = value("--model")?,
            "--replicas" => {
                let list = value("--replicas")?;
                let counts = list
                    .split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(|s| positive("--replicas", s))
                    .collect::<Result<Vec<_>, _>>()?;
                if counts.is_empty() {
                    return Err(usage_error("--replicas needs a comma-separated list"));
                }
                o.replicas = Some(counts);
            }
            "--batch" => o.batch = positive("--batch", &value("--batch")?)?,
            "--bucket-mb" => {
                let v = value("--bucket-mb")?;
                let bytes = v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|mb| mb.is_finite() && *mb > 0.0 && *mb <= 1024.0)
                    .map(|mb| ((mb * (1u64 << 20) as f64).round() as usize).max(1))
                    .ok_or_else(|| {
                        usage_error(format!(
                            "--bucket-mb takes a size in MiB up to 1024, got `{v}`"
                        ))
                    })?;
                o.bucket_bytes = bytes;
            }
            "--out" => o.out = Some(PathBuf::from(value("--out")?)),
            other => {
                return Err(usage_error(format!(
                    "unknown flag `{other}`\n\nflags:\n{FLAGS_HELP}"
                )))
            }
        }
    }
    Ok(o)
}

/// Powers of two up to the topology's devices.
pub(crate) fn default_replicas(devices: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |&n| n.checked_mul(2))
        .take_while(|&n| n <= devices)
        .collect()
}

/// The topology, model and replica counts the options name; anything they name wrongly is
/// a usage error.
fn resolve(o: &Options, topology: &str) -> Result<(Topology, ModelProfile, Vec<usize>), Failure> {
    let topo = Topology::preset(topology).map_err(usage_error)?;
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

/// A check as `scaling-model.json` (and the report) records it.
pub(crate) fn check_json(c: &Check) -> Value {
    json!({
        "name": c.name,
        "predicted": num(c.predicted, 3),
        "published": num(c.published, 3),
        "unit": c.unit,
        "ratio": num(c.ratio(), 3),
        "band": [num(c.band.0, 3), num(c.band.1, 3)],
        "within": c.within(),
        "source": c.source,
    })
}

/// The JSON of a prediction on one topology (`scaling-model.json`).
pub(crate) fn report(
    topo: &Topology,
    model: &ModelProfile,
    p: &Prediction,
    checks: &[Check],
    seed: &checks::SeedCheck,
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
        l.push(format!(
            "#   {}: {} vs {} {}, ratio {:.3}, band [{:.2}, {:.2}]  {}",
            ch.name,
            cell(ch.predicted, 2),
            cell(ch.published, 2),
            ch.unit,
            ch.ratio(),
            ch.band.0,
            ch.band.1,
            if ch.within() { "ok" } else { "MISSED" }
        ));
    }
    l
}

/// The checks against public figures, then this machine's CPU collectives as
/// docs/COLLECTIVES.md measured them (2 cores).
pub(crate) fn all_checks() -> Result<Vec<Check>, ScalingError> {
    let mut checks = checks::public_figures()?;
    for m in &checks::COLLECTIVES_MD_RING {
        checks.push(checks::host_ring(m, 2)?);
    }
    Ok(checks)
}

/// Runs `cargo xtask scaling` with the flags after the command name.
pub fn run(args: &[String]) -> Result<(), Failure> {
    if !args.iter().any(|a| a == "--topology") {
        return crate::scaling_measured::run(args);
    }
    let o = parse(args)?;
    let Some(name) = o.topology.as_deref() else {
        return Err(usage_error(format!(
            "--topology needs one of {}, ib-<N>node up to {MAX_IB_NODES}",
            presets::NAMES.join(", ")
        )));
    };
    let (topo, model, replicas) = resolve(&o, name)?;
    let fail = |e: ScalingError| Failure::run(format!("xtask scaling: {e}"));
    let p = predict::predict(&topo, &model, &replicas, o.bucket_bytes).map_err(fail)?;
    let checks = all_checks().map_err(fail)?;
    let seed = checks::seed_check().map_err(fail)?;
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

    use crate::flags::args;

    #[test]
    fn flags_parse_and_bad_ones_are_usage_errors() {
        let o = parse(&[]).unwrap();
        assert_eq!(
            (o.topology, o.model.as_str(), o.batch),
            (None, "resnet50", 128)
        );
        assert_eq!(o.bucket_bytes, 25 << 20);
        let o = parse(&args(&[
            "--topology",
            "dgx-h100",
            "--replicas",
            "1,2,4,8",
            "--bucket-mb",
            "0.5",
            "--batch",
            "64",
        ]))
        .unwrap();
        assert_eq!(o.replicas, Some(vec![1, 2, 4, 8]));
        assert_eq!((o.bucket_bytes, o.batch), (1 << 19, 64));
        for bad in [
            &["--replicas", "0"][..],
            &["--replicas", "two"],
            &["--replicas", ","],
            &["--bucket-mb", "0"],
            &["--bucket-mb", "-1"],
            &["--bucket-mb", "2000"],
            &["--batch", "0"],
            &["--topology"],
            &["--bogus"],
        ] {
            assert_eq!(parse(&args(bad)).unwrap_err().code, 2, "{bad:?}");
        }
    }

    #[test]
    fn unknown_names_and_replicas_that_do_not_fit_are_one_line_usage_errors() {
        for (flags, says) in [
            (
                &["--topology", "dgx-a100"][..],
                "unknown topology `dgx-a100`",
            ),
            (
                &["--topology", "dgx-h100", "--model", "bert"],
                "unknown model `bert`",
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
        // No topology: the measured mode, with its own flags.
        let e = run(&args(&["--model", "resnet50"])).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.message.contains("(measured mode)"), "{}", e.message);
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
        assert_eq!(checks.len(), 8);
        assert!(checks.iter().all(|c| c["within"] == true));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
