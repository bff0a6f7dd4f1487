//! `cargo xtask report`: the scaling report, measured and modelled side by side, checked
//! against committed baselines.
//!
//! Measured figures come from the files the measured mode of `cargo xtask scaling` writes
//! (`target/bench/scaling-measured.json`, `target/bench/collectives.json`; and
//! `target/bench/mirrored.json` of `cargo xtask bench-mirrored` when present). Modelled
//! figures are computed here through `mirra-scaling`: every preset with ResNet-50 at 128
//! per replica, powers-of-two replicas, ring and tree swept from 4 KiB to 1 GiB, the
//! checks against public figures and the seed check. The report lands in `target/reports/`:
//! `scaling.md`, `scaling.json` (with `seed_check: {predicted_speedup, published_speedup}`),
//! `busbw.svg` and `efficiency.svg`, each written atomically.
//!
//! Figures are compared with `benches/baselines/scaling.json`: modelled ones must equal the
//! baseline within [`MODELLED_RELATIVE`] (the model is deterministic, so any change is a
//! change of the model); measured ones are ratios within one run (bus bandwidth over the
//! copy rate measured beside it, tree time over ring time, scaling efficiency), compared one
//! way with a tolerance per figure ([`MEASURED`]) wide enough for the noise of a shared
//! 2-core machine. A figure past its tolerance, or one that cannot be computed, ends the
//! command with exit status 1 and one line per figure; `--update-baseline` rewrites the
//! baseline from this run instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use mirra::strategy::DEFAULT_BUCKET_BYTES;
use mirra_scaling::checks::{self, SeedCheck, Verdict};
use mirra_scaling::predict::{self, Prediction};
use mirra_scaling::{
    presets, profile, Ablation, Algorithm, ModelProfile, ScalingError, Schedule, Topology,
};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use serde_json::{json, Value};

use crate::json::{num, opt, write_atomic, write_bytes_atomic};
use crate::nccl::size_label;
use crate::paths::{target_dir, workspace_root};
use crate::scaling::{self, DEFAULT_BATCH};
use crate::{cli, machine, scaling_measured, Failure};

mod baseline;
mod inputs;
mod plots;
mod render;

use baseline::*;
use inputs::*;
use plots::*;
use render::*;

/// `cargo xtask report` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask report",
    about = "The scaling report: measured and modelled, SVG plots, checked against the baseline"
)]
struct Args {
    /// Measure first (`cargo xtask scaling`), even if target/bench has results.
    #[arg(long, conflicts_with = "no_measure")]
    measure: bool,
    /// Never measure; report what target/bench holds (default: measure, quickly, only
    /// when scaling-measured.json or collectives.json is missing).
    #[arg(long)]
    no_measure: bool,
    /// Measure quickly (`cargo xtask scaling --quick`), as CI does.
    #[arg(long)]
    quick: bool,
    /// Rewrite benches/baselines/scaling.json from this run.
    #[arg(long)]
    update_baseline: bool,
}

/// The committed baseline, relative to the workspace root.
pub const BASELINE_PATH: &str = "benches/baselines/scaling.json";
/// The schema of `scaling.json`.
pub const SCHEMA: &str = "mirra-scaling-report/1";
/// The schema of the baseline.
pub const BASELINE_SCHEMA: &str = "mirra-scaling-baseline/1";
/// The model of the modelled figures.
pub const MODEL: &str = "resnet50";
/// How far a modelled figure may move from its baseline, relative: the model is
/// deterministic, so this only absorbs the last bits of a JSON round trip.
pub const MODELLED_RELATIVE: f64 = 1e-9;
/// The topologies of the modelled lines of `busbw.svg`.
pub const BUSBW_TOPOLOGIES: [&str; 3] = ["dgx-h100", "8gpu-pcie4", "ib-2node"];
/// The world sizes of the measured lines of `busbw.svg`.
pub const BUSBW_RANKS: [usize; 2] = [2, 4];
/// The sizes of the measured busbw / copy table (in both the quick and the full sweep).
pub const RATIO_SIZES: [usize; 3] = [4 << 10, 1 << 20, 16 << 20];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measure {
    /// Only when a measured file is missing (quick).
    IfMissing,
    Always,
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Options {
    measure: Measure,
    quick: bool,
    update_baseline: bool,
}

/// The options of `args`, or `None` for `--help` (clap printed it).
fn parse(args: &[String]) -> Result<Option<Options>, Failure> {
    let Some(a) = cli::parse::<Args>("xtask report", args)? else {
        return Ok(None);
    };
    Ok(Some(Options {
        measure: match (a.measure, a.no_measure) {
            (true, _) => Measure::Always,
            (false, true) => Measure::Never,
            (false, false) => Measure::IfMissing,
        },
        quick: a.quick,
        update_baseline: a.update_baseline,
    }))
}

/// Where the report reads and writes.
#[derive(Clone, Debug)]
struct Paths {
    /// `target/bench`: the measured results.
    bench: PathBuf,
    /// `target/reports`: the report.
    reports: PathBuf,
    /// The baseline.
    baseline: PathBuf,
}

impl Paths {
    fn workspace() -> Paths {
        let root = workspace_root();
        let target = target_dir(&root);
        Paths {
            bench: target.join("bench"),
            reports: target.join("reports"),
            baseline: root.join(BASELINE_PATH),
        }
    }

    fn scaling_measured(&self) -> PathBuf {
        self.bench.join("scaling-measured.json")
    }

    fn collectives(&self) -> PathBuf {
        self.bench.join("collectives.json")
    }

    fn mirrored(&self) -> PathBuf {
        self.bench.join("mirrored.json")
    }
}

/// The measured mode to run first, if any: always with `--measure`, never with
/// `--no-measure`, and by default (quick) only when one of its files is missing.
fn measurement(o: &Options, paths: &Paths) -> Option<scaling_measured::Options> {
    let missing = !paths.scaling_measured().is_file() || !paths.collectives().is_file();
    let quick = match o.measure {
        Measure::Always => o.quick,
        Measure::Never => return None,
        Measure::IfMissing if missing => true,
        Measure::IfMissing => return None,
    };
    Some(scaling_measured::Options::new(quick, None, None))
}

/// Everything the report holds, before it is written.
#[derive(Debug)]
struct Report {
    markdown: String,
    json: Value,
    /// `(file name, SVG)`.
    svgs: Vec<(&'static str, String)>,
    figures: Vec<Figure>,
    comparisons: Vec<Comparison>,
    /// One line per failing figure (or the missing baseline).
    failures: Vec<String>,
}

/// Builds the report from the measured results, the model and the baseline.
fn build(
    measured: &Measured,
    modelled: &Modelled,
    baseline: Option<&Baseline>,
    command: &str,
) -> Result<Report, Failure> {
    let mut figures: Vec<Figure> = MEASURED.iter().map(|s| measured.figure(s)).collect();
    figures.extend(modelled.figures());
    let comparisons = compare(&figures, baseline.map_or(&[][..], |b| b.entries.as_slice()));
    let mut failures: Vec<String> = comparisons.iter().filter_map(Comparison::failure).collect();
    if baseline.is_none() {
        failures.insert(
            0,
            format!(
                "no baseline at {BASELINE_PATH}: create it with `cargo xtask report \
                 --update-baseline`"
            ),
        );
    }
    let draw = |name: &str, svg: Result<String, String>| {
        svg.map_err(|e| Failure::run(format!("xtask report: cannot draw {name}: {e}")))
    };
    let svgs = vec![
        (
            "busbw.svg",
            draw("busbw.svg", busbw_svg(measured, modelled))?,
        ),
        (
            "efficiency.svg",
            draw("efficiency.svg", efficiency_svg(measured, modelled))?,
        ),
    ];
    let markdown = markdown(
        measured,
        modelled,
        baseline,
        &comparisons,
        &failures,
        command,
    );
    let json = report_json(
        measured,
        modelled,
        &figures,
        &comparisons,
        &failures,
        command,
    );
    Ok(Report {
        markdown,
        json,
        svgs,
        figures,
        comparisons,
        failures,
    })
}

/// Writes the report, compares and, with `--update-baseline`, rewrites the baseline.
fn run_in(
    o: &Options,
    paths: &Paths,
    topologies: &[&str],
    command: &str,
) -> Result<Report, Failure> {
    let measured = Measured::read(paths)?;
    let modelled = model(topologies).map_err(|e| Failure::run(format!("xtask report: {e}")))?;
    let baseline = load_baseline(&paths.baseline)?;
    let report = build(&measured, &modelled, baseline.as_ref(), command)?;
    let write = |name: &str, bytes: &[u8]| {
        let path = paths.reports.join(name);
        write_bytes_atomic(&path, bytes)
            .map_err(|e| Failure::run(format!("cannot write {}: {e}", path.display())))
    };
    write("scaling.md", report.markdown.as_bytes())?;
    for (name, svg) in &report.svgs {
        write(name, svg.as_bytes())?;
    }
    let json_path = paths.reports.join("scaling.json");
    write_atomic(&json_path, &report.json)
        .map_err(|e| Failure::run(format!("cannot write {}: {e}", json_path.display())))?;
    println!(
        "# wrote scaling.md, scaling.json, busbw.svg, efficiency.svg in {}",
        paths.reports.display()
    );
    let count = |s: Status| report.comparisons.iter().filter(|c| c.status == s).count();
    println!(
        "# baseline {}: {} ok, {} regressed, {} changed, {} missing, {} new",
        paths.baseline.display(),
        count(Status::Ok),
        count(Status::Regressed),
        count(Status::Changed),
        count(Status::Missing),
        count(Status::New)
    );
    if o.update_baseline {
        let missing: Vec<String> = report
            .figures
            .iter()
            .filter_map(|f| {
                f.value
                    .as_ref()
                    .err()
                    .map(|why| format!("{}: {why}", f.name))
            })
            .collect();
        if !missing.is_empty() {
            return Err(Failure::run(format!(
                "xtask report: not updating {}: {} figure(s) missing from this run:\n  {}",
                paths.baseline.display(),
                missing.len(),
                missing.join("\n  ")
            )));
        }
        let value = baseline_json(&report.figures, &measured, command);
        write_atomic(&paths.baseline, &value)
            .map_err(|e| Failure::run(format!("cannot write {}: {e}", paths.baseline.display())))?;
        println!(
            "# updated the baseline {} ({} figures)",
            paths.baseline.display(),
            report.figures.len()
        );
        return Ok(report);
    }
    if !report.failures.is_empty() {
        return Err(Failure::run(format!(
            "xtask report: {} failure(s) against {}:\n  {}",
            report.failures.len(),
            paths.baseline.display(),
            report.failures.join("\n  ")
        )));
    }
    Ok(report)
}

/// Runs `cargo xtask report` with the flags after the command name.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(o) = parse(args)? else {
        return Ok(());
    };
    let paths = Paths::workspace();
    if let Some(m) = measurement(&o, &paths) {
        println!(
            "# measuring first: cargo xtask scaling{}",
            if m.quick { " --quick" } else { "" }
        );
        scaling_measured::run(&m)?;
    }
    let command = format!("cargo xtask report {}", args.join(" "));
    run_in(&o, &paths, &report_topologies(), command.trim_end()).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cli::args;

    /// A scratch directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("xtask-report-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        fn paths(&self) -> Paths {
            Paths {
                bench: self.0.join("bench"),
                reports: self.0.join("reports"),
                baseline: self.0.join("baselines/scaling.json"),
            }
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn ar(backend: &str, n: usize, bytes: usize, time_us: f64) -> Value {
        let alg = bytes as f64 / (time_us * 1e-6) / 1e9;
        let bus = alg * 2.0 * (n as f64 - 1.0) / n as f64;
        // The copy rate measured beside every row: 10 GB/s.
        json!({
            "backend": backend, "world_size": n, "op": "all_reduce", "dtype": "f32",
            "bytes": bytes, "time_us": time_us, "algbw_gbs": alg, "busbw_gbs": bus,
            "copy_gbs": 10.0, "algbw_over_copy": alg / 10.0,
        })
    }

    /// A quick sweep's collectives.json: 2 and 4 ranks, 4 KiB..16 MiB by 4x, a copy rate
    /// of 10 GB/s beside each row; ring reaches busbw 8 GB/s at 16 MiB, 2 ranks.
    fn collectives(world_sizes: &[usize]) -> Value {
        let mut rows = vec![];
        for &n in world_sizes {
            for (i, bytes) in [
                4usize << 10,
                16 << 10,
                64 << 10,
                256 << 10,
                1 << 20,
                4 << 20,
                16 << 20,
            ]
            .into_iter()
            .enumerate()
            {
                // ring: latency 10 us + busbw 8 GB/s at 2 ranks.
                let f = 2.0 * (n as f64 - 1.0) / n as f64;
                let ring = 10.0 + f * bytes as f64 / 8e9 * 1e6 * n as f64 / 2.0;
                rows.push(ar("ring", n, bytes, ring));
                rows.push(ar("tree", n, bytes, ring * if i < 2 { 0.5 } else { 1.5 }));
                rows.push(
                    json!({"backend": "ring", "world_size": n, "op": "broadcast",
                    "bytes": bytes, "time_us": 1.0, "busbw_gbs": 99.0}),
                );
            }
        }
        json!({"quick": true, "rows": rows,
               "machine": {"date_utc": "2026-01-01T00:00:00Z"}})
    }

    fn scaling_measured() -> Value {
        let row = |n: usize, c: &str, eff: f64| {
            json!({"replicas": n, "collective": c, "global_batch": 64 * n,
                   "step_ms": 1.0 / eff, "samples_per_sec": 64_000.0 * n as f64 * eff,
                   "efficiency": eff, "exposed_comm_ms": 0.1, "exposed_comm_fraction": 0.1})
        };
        json!({"quick": true, "per_replica_batch": 64, "model": "mnist-mlp",
               "machine": {"date_utc": "2026-01-01T00:00:00Z"},
               "rows": [row(1, "none", 1.0), row(2, "ring", 0.6), row(2, "tree", 0.7),
                        row(4, "ring", 0.4), row(4, "tree", 0.3)]})
    }

    fn measured() -> Measured {
        Measured {
            scaling: Some(scaling_measured()),
            collectives: Some(collectives(&[2, 4])),
            mirrored: Some(json!({
                "quick": false,
                "baseline_samples_per_sec": 165000.0,
                "rows": [{"replicas": 2, "collective": "ring", "global_batch": 256,
                          "samples_per_sec": 300000.0, "exposed_comm_fraction": 0.12}],
            })),
        }
    }

    /// Two presets keep the tests quick; one of them is drawn in busbw.svg.
    const TOPOLOGIES: [&str; 2] = ["dgx-h100", "2gpu-nvlink-bridge"];

    fn write_inputs(p: &Paths, m: &Measured) {
        for (path, v) in [
            (p.scaling_measured(), &m.scaling),
            (p.collectives(), &m.collectives),
            (p.mirrored(), &m.mirrored),
        ] {
            if let Some(v) = v {
                write_atomic(&path, v).unwrap();
            }
        }
    }

    fn parse(flags: &[String]) -> Result<Options, Failure> {
        super::parse(flags).map(|o| o.expect("not --help"))
    }

    #[test]
    fn flags_parse_and_bad_ones_are_one_line_usage_errors() {
        let o = parse(&[]).unwrap();
        assert_eq!(
            o,
            Options {
                measure: Measure::IfMissing,
                quick: false,
                update_baseline: false
            }
        );
        let o = parse(&args(&["--measure", "--quick", "--update-baseline"])).unwrap();
        assert_eq!(
            (o.measure, o.quick, o.update_baseline),
            (Measure::Always, true, true)
        );
        assert_eq!(
            parse(&args(&["--no-measure"])).unwrap().measure,
            Measure::Never
        );
        for bad in [
            &["--bogus"][..],
            &["--measure", "--no-measure"],
            &["--topology", "dgx-h100"],
        ] {
            let e = parse(&args(bad)).unwrap_err();
            assert_eq!(e.code, 2, "{bad:?}");
            assert!(e.message.starts_with("error: "), "{}", e.message);
            assert!(e.message.contains("xtask report"), "{}", e.message);
        }
    }

    #[test]
    fn measures_when_asked_or_when_results_are_missing() {
        let s = Scratch::new("measure");
        let p = s.paths();
        let o = |m: &[&str]| parse(&args(m)).unwrap();
        let quick = |q| Some(scaling_measured::Options::new(q, None, None));
        assert_eq!(measurement(&o(&[]), &p), quick(true));
        assert_eq!(measurement(&o(&["--no-measure"]), &p), None);
        assert_eq!(measurement(&o(&["--measure"]), &p), quick(false));
        write_inputs(&p, &measured());
        assert_eq!(measurement(&o(&[]), &p), None);
        assert_eq!(measurement(&o(&["--quick"]), &p), None);
        assert_eq!(measurement(&o(&["--measure", "--quick"]), &p), quick(true));
    }

    #[test]
    fn measured_figures_are_ratios_within_one_run() {
        let m = measured();
        let fig = |i: usize| m.figure(&MEASURED[i]);
        // 16 MiB at 2 ranks: ring (tree 1.5x slower), algbw over the copy rate of 10 GB/s.
        let f = fig(1);
        assert_eq!(
            f.name,
            "measured/all_reduce/2_ranks/16MiB/best_algbw_over_copy"
        );
        let v = f.value.unwrap();
        assert!(
            (v - 16.0 * 1048576.0 / (10.0e-6 + 16.0 * 1048576.0 / 8e9) / 1e9 / 10.0).abs() < 1e-3
        );
        assert!(f.what.contains("this run: ring"), "{}", f.what);
        // Tree over ring at 16 KiB, 4 ranks: 0.5 by construction.
        let f = fig(3);
        assert_eq!(
            f.name,
            "measured/all_reduce/4_ranks/16KiB/tree_over_ring_time"
        );
        assert!((f.value.unwrap() - 0.5).abs() < 1e-9);
        // The best 2-replica efficiency: tree's 0.7.
        let f = fig(4);
        assert_eq!(f.value, Ok(0.7));
        assert!(f.what.contains("this run: tree"), "{}", f.what);
    }

    #[test]
    fn a_missing_measured_figure_says_why() {
        // A sweep without 4 ranks.
        let m = Measured {
            collectives: Some(collectives(&[2])),
            ..measured()
        };
        let why = m.figure(&MEASURED[2]).value.unwrap_err();
        assert!(
            why.contains("no all_reduce at 4 ranks of 16MiB") && why.contains("[2] ranks"),
            "{why}"
        );
        let why = m.figure(&MEASURED[3]).value.unwrap_err();
        assert!(
            why.contains("no tree all_reduce at 4 ranks of 16KiB"),
            "{why}"
        );
        // No files at all.
        let none = Measured::default();
        for spec in &MEASURED {
            let why = none.figure(spec).value.unwrap_err();
            assert!(why.contains("is absent"), "{why}");
        }
    }

    fn figure(name: &str, kind: Kind, tolerance: Tolerance, value: Result<f64, String>) -> Figure {
        Figure {
            name: name.into(),
            kind,
            unit: "ratio",
            tolerance,
            value,
            what: String::new(),
        }
    }

    fn entry(f: &Figure, value: f64) -> BaselineEntry {
        BaselineEntry {
            name: f.name.clone(),
            kind: f.kind,
            value,
            tolerance: f.tolerance,
        }
    }

    #[test]
    fn modelled_figures_compare_strictly() {
        let t = Tolerance::Relative(MODELLED_RELATIVE);
        let at = |v: f64| figure("model/x/ring/8/efficiency", Kind::Modelled, t, Ok(v));
        let b = 0.995_123_456_789;
        let status = |v: f64| compare(&[at(v)], &[entry(&at(b), b)])[0].status;
        assert_eq!(status(b), Status::Ok);
        assert_eq!(status(b * (1.0 + 5e-10)), Status::Ok);
        // Either way: a modelled figure that moves has changed.
        assert_eq!(status(b * (1.0 + 2e-9)), Status::Changed);
        assert_eq!(status(b * (1.0 - 2e-9)), Status::Changed);
        let c = &compare(&[at(b * 1.01)], &[entry(&at(b), b)])[0];
        let line = c.failure().unwrap();
        assert!(
            line.starts_with("changed: model/x/ring/8/efficiency")
                && line.contains("--update-baseline"),
            "{line}"
        );
        // Raw values survive the JSON round trip well within the tolerance.
        let v: Value = serde_json::from_str(&serde_json::to_string(&json!(b)).unwrap()).unwrap();
        assert!(t.holds(b, v.as_f64().unwrap()));
    }

    #[test]
    fn measured_figures_compare_with_their_tolerance() {
        let up = |v| figure("m/up", Kind::Measured, Tolerance::AtLeast(0.5), Ok(v));
        let down = |v| figure("m/down", Kind::Measured, Tolerance::AtMost(2.0), Ok(v));
        let base = [entry(&up(1.0), 1.0), entry(&down(1.0), 1.0)];
        let statuses = |u: f64, d: f64| {
            compare(&[up(u), down(d)], &base)
                .iter()
                .map(|c| c.status)
                .collect::<Vec<_>>()
        };
        // Noise and improvements pass; a real regression does not.
        assert_eq!(statuses(0.6, 1.9), [Status::Ok, Status::Ok]);
        assert_eq!(statuses(3.0, 0.1), [Status::Ok, Status::Ok]);
        assert_eq!(statuses(0.49, 2.1), [Status::Regressed, Status::Regressed]);
        let c = compare(&[up(0.4)], &base);
        let line = c[0].failure().unwrap();
        assert_eq!(
            line,
            "regressed: m/up = 0.400000 against baseline 1.00000: must be >= 0.5 x baseline \
             (limit 0.500000)"
        );
        // Not in the baseline: new, compared next time; in the baseline only: missing.
        let c = compare(
            &[figure(
                "m/new",
                Kind::Measured,
                Tolerance::AtLeast(0.5),
                Ok(1.0),
            )],
            &base,
        );
        assert_eq!(
            c.iter().map(|c| c.status).collect::<Vec<_>>(),
            [Status::New, Status::Missing, Status::Missing]
        );
        assert!(!Status::New.fails() && Status::Missing.fails());
        assert!(c[1].failure().unwrap().contains("no longer computes it"));
    }

    #[test]
    fn a_missing_figure_fails_with_its_reason() {
        let f = figure(
            "measured/x",
            Kind::Measured,
            Tolerance::AtLeast(0.5),
            Err("collectives.json has no all_reduce at 4 ranks".into()),
        );
        let c = compare(std::slice::from_ref(&f), &[entry(&f, 1.0)]);
        assert_eq!(c[0].status, Status::Missing);
        assert_eq!(
            c[0].failure().unwrap(),
            "missing: measured/x: collectives.json has no all_reduce at 4 ranks"
        );
    }

    #[test]
    fn the_report_has_its_tables_plots_and_exit_codes() {
        let s = Scratch::new("e2e");
        let p = s.paths();
        write_inputs(&p, &measured());
        let o = |flags: &[&str]| parse(&args(flags)).unwrap();

        // No baseline yet: the report is written, and the command fails saying so.
        let e = run_in(&o(&[]), &p, &TOPOLOGIES, "cargo xtask report").unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.message.contains("no baseline at"), "{}", e.message);
        let md = std::fs::read_to_string(p.reports.join("scaling.md")).unwrap();
        for table in [
            "## Baseline comparison",
            "| replicas | collective | step (ms) | samples/s | efficiency | exposed (ms) | exposed (%) |",
            "| backend | ranks | 4KiB | 1MiB | 16MiB |",
            "| topology | algorithm | replicas | step (ms) | samples/s | efficiency | exposed (ms) | busbw (GB/s) |",
            "| topology | replicas | ring wins | tree wins |",
            "| replicas | collective | global batch | samples/s | exposed (%) |",
            "| 2 | ring | 256 | 300000 | 12.0 |",
            "| check | predicted | published | ratio | band | status | rejects |",
            "**seed_check**: predicted_speedup",
            "| dgx-h100 | ring | 8 |",
            "| 2 | tree | ",
        ] {
            assert!(md.contains(table), "no `{table}` in\n{md}");
        }
        for svg in ["busbw.svg", "efficiency.svg"] {
            let text = std::fs::read_to_string(p.reports.join(svg)).unwrap();
            assert!(text.starts_with("<svg"), "{svg}: {}", &text[..80]);
            assert!(text.trim_end().ends_with("</svg>"), "{svg}");
            assert!(text.contains("measured: ring") && text.contains("modelled: dgx-h100"));
            assert_eq!(
                text.matches("<text").count(),
                text.matches("</text>").count(),
                "{svg}"
            );
        }
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(p.reports.join("scaling.json")).unwrap())
                .unwrap();
        assert_eq!(v["schema"], SCHEMA);
        assert_eq!(v["seed_check"]["published_speedup"], 3.6);
        assert!(v["seed_check"]["predicted_speedup"].as_f64().unwrap() >= 3.6);
        assert_eq!(v["passed"], false);
        assert_eq!(v["modelled"]["topologies"].as_array().unwrap().len(), 2);
        // No temporary files are left behind.
        let names: Vec<String> = std::fs::read_dir(&p.reports)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");

        // --update-baseline writes it; the next run passes.
        run_in(
            &o(&["--update-baseline"]),
            &p,
            &TOPOLOGIES,
            "cargo xtask report",
        )
        .unwrap();
        let report = run_in(&o(&[]), &p, &TOPOLOGIES, "cargo xtask report").unwrap();
        assert!(report.failures.is_empty());
        assert!(report.markdown.contains("**PASS**"), "{}", report.markdown);
        let baseline: Value =
            serde_json::from_str(&std::fs::read_to_string(&p.baseline).unwrap()).unwrap();
        let figures = baseline["figures"].as_array().unwrap();
        assert_eq!(figures.len(), report.figures.len());
        assert!(figures
            .iter()
            .all(|f| f["value"].is_f64() && f["tolerance"]["rule"].is_string()));

        // A measured regression past its tolerance, and a modelled change: exit status 1,
        // one line each.
        let mut tampered = baseline.clone();
        for f in tampered["figures"].as_array_mut().unwrap() {
            if f["name"] == "measured/training/2_replicas/best_efficiency" {
                // 0.7 now: below 0.35 x 3.
                f["value"] = json!(3.0);
            }
            if f["name"] == "model/dgx-h100/ring/8/step_ms" {
                f["value"] = json!(f["value"].as_f64().unwrap() * (1.0 + 1e-6));
            }
        }
        write_atomic(&p.baseline, &tampered).unwrap();
        let e = run_in(&o(&[]), &p, &TOPOLOGIES, "cargo xtask report").unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.message.contains("2 failure(s)"), "{}", e.message);
        assert!(
            e.message
                .contains("regressed: measured/training/2_replicas/best_efficiency = 0.700000 against baseline 3.00000: must be >= 0.35 x baseline"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("changed: model/dgx-h100/ring/8/step_ms"),
            "{}",
            e.message
        );
        let md = std::fs::read_to_string(p.reports.join("scaling.md")).unwrap();
        assert!(
            md.contains("**FAIL**: 1 regressed, 1 changed, 0 missing"),
            "{md}"
        );
        assert!(
            md.contains("| REGRESSED |") && md.contains("| CHANGED |"),
            "{md}"
        );

        // Measured results gone: the measured figures are missing, which fails, and the
        // baseline is not updated from such a run.
        write_atomic(&p.baseline, &baseline).unwrap();
        std::fs::remove_file(p.collectives()).unwrap();
        let e = run_in(&o(&["--no-measure"]), &p, &TOPOLOGIES, "cargo xtask report").unwrap_err();
        assert_eq!(e.code, 1);
        assert_eq!(
            e.message.matches("missing: measured/all_reduce").count(),
            4,
            "{}",
            e.message
        );
        let e = run_in(&o(&["--update-baseline"]), &p, &TOPOLOGIES, "x").unwrap_err();
        assert!(e.message.contains("not updating"), "{}", e.message);
        let kept: Value =
            serde_json::from_str(&std::fs::read_to_string(&p.baseline).unwrap()).unwrap();
        assert_eq!(kept, baseline);

        // A broken baseline is an error that names the file.
        std::fs::write(&p.baseline, "{\"schema\": \"other\"}").unwrap();
        let e = run_in(&o(&[]), &p, &TOPOLOGIES, "x").unwrap_err();
        assert!(e.message.contains("schema is \"other\""), "{}", e.message);
    }

    #[test]
    fn numbers_keep_six_significant_digits() {
        assert_eq!(sig(0.995123456), "0.995123");
        assert_eq!(sig(28.134567), "28.1346");
        assert_eq!(sig(36304.4), "36304.4");
        assert_eq!(sig(1234567.0), "1234567");
        assert_eq!(fixed(None, 2), "-");
        assert_eq!(
            decades([0.05, 380.0].into_iter(), (1.0, 10.0)),
            (0.01, 1000.0)
        );
        assert_eq!(decades(std::iter::empty(), (1.0, 10.0)), (1.0, 10.0));
    }
}
