//! The report as markdown and JSON.

use super::*;

/// `x` with six significant digits.
pub(super) fn sig(x: f64) -> String {
    if !x.is_finite() || x == 0.0 {
        return format!("{x}");
    }
    let decimals = (5 - x.abs().log10().floor() as i32).clamp(0, 12) as usize;
    format!("{x:.decimals$}")
}

/// `x` with `digits` decimals, `-` when absent.
pub(super) fn fixed(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// Markdown, built line by line.
#[derive(Debug, Default)]
pub(super) struct Markdown(pub(super) String);

impl Markdown {
    /// Appends a line; an empty one only ends a paragraph (blank lines never repeat).
    pub(super) fn line(&mut self, s: impl AsRef<str>) {
        let s = s.as_ref();
        if s.is_empty() && (self.0.is_empty() || self.0.ends_with("\n\n")) {
            return;
        }
        self.0.push_str(s);
        self.0.push('\n');
    }

    /// A table, then a blank line: columns of numbers (or `-`) right-aligned, others left.
    pub(super) fn table(&mut self, head: &[&str], rows: &[Vec<String>]) {
        let cells = |c: &[String]| {
            let c: Vec<String> = c.iter().map(|s| s.replace('|', "\\|")).collect();
            format!("| {} |", c.join(" | "))
        };
        self.line(cells(
            &head.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        ));
        let numeric = |i: usize| {
            rows.iter().all(|r| {
                r.get(i).is_none_or(|c| {
                    let c = c.split_whitespace().next().unwrap_or("-");
                    c == "-" || c.parse::<f64>().is_ok()
                })
            })
        };
        let align: Vec<&str> = (0..head.len())
            .map(|i| if numeric(i) { "---:" } else { "---" })
            .collect();
        self.line(format!("|{}|", align.join("|")));
        for r in rows {
            self.line(cells(r));
        }
        self.line("");
    }
}

/// The rows of the busbw / copy table: `(backend, ranks, bytes, busbw GB/s, algbw over
/// the copy rate measured beside it)`.
pub(super) fn busbw_ratios(measured: &Measured) -> Vec<(String, usize, usize, f64, Option<f64>)> {
    let rows = measured.all_reduce();
    let mut ranks: Vec<usize> = rows.iter().map(|r| r.ranks).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut out = vec![];
    for b in measured.backends() {
        for &n in &ranks {
            for bytes in RATIO_SIZES {
                if let Some(r) = rows
                    .iter()
                    .find(|r| r.backend == b && r.ranks == n && r.bytes == bytes)
                {
                    out.push((b.clone(), n, bytes, r.busbw_gbs, r.algbw_over_copy));
                }
            }
        }
    }
    out
}

pub(super) fn report_json(
    measured: &Measured,
    modelled: &Modelled,
    figures: &[Figure],
    comparisons: &[Comparison],
    failures: &[String],
    command: &str,
) -> Value {
    let input = |v: &Option<Value>, file: &str| {
        json!({
            "file": format!("target/bench/{file}"),
            "present": v.is_some(),
            "date_utc": v.as_ref().map(|v| v["machine"]["date_utc"].clone()),
            "quick": v.as_ref().map(|v| v["quick"].clone()),
        })
    };
    let ratios: Vec<Value> = busbw_ratios(measured)
        .into_iter()
        .map(|(backend, n, bytes, busbw, ratio)| {
            json!({
                "backend": backend,
                "world_size": n,
                "bytes": bytes,
                "busbw_gbs": num(busbw, 3),
                "algbw_over_copy": opt(ratio, 4),
            })
        })
        .collect();
    let topologies: Vec<Value> = modelled
        .topologies
        .iter()
        .map(|t| {
            let v = scaling::report(
                &t.topology,
                &t.profile,
                &t.prediction,
                &[],
                &modelled.seed,
                &[],
            );
            let sweeps: Vec<Value> = t
                .sweeps
                .iter()
                .map(|s| {
                    json!({
                        "algorithm": s.algorithm.name(),
                        "ranks": s.ranks,
                        "plateau_busbw_gbs": num(s.plateau_gbs, 3),
                        "points": s.points.iter().map(|&(bytes, busbw)| json!({
                            "bytes": bytes, "busbw_gbs": num(busbw, 4),
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "topology": v["topology"],
                "model": v["model"],
                "bucket_bytes": v["bucket_bytes"],
                "rows": v["rows"],
                "crossover": v["crossover"],
                "busbw_sweeps": sweeps,
            })
        })
        .collect();
    let count = |s: Status| comparisons.iter().filter(|c| c.status == s).count();
    json!({
        "schema": SCHEMA,
        "command": command,
        "machine": machine::facts(),
        "seed_check": {
            "predicted_speedup": modelled.seed.predicted_speedup,
            "published_speedup": modelled.seed.published_speedup,
        },
        "measured": {
            "inputs": {
                "scaling_measured": input(&measured.scaling, "scaling-measured.json"),
                "collectives": input(&measured.collectives, "collectives.json"),
                "mirrored": input(&measured.mirrored, "mirrored.json"),
            },
            "training": measured.scaling.as_ref().map(|s| json!({
                "model": s["model"],
                "per_replica_batch": s["per_replica_batch"],
                "rows": s["rows"],
            })),
            "algbw_over_copy": ratios,
            "mirrored": measured.mirrored.as_ref().map(|m| json!({
                "baseline_samples_per_sec": m["baseline_samples_per_sec"],
                "rows": m["rows"],
            })),
        },
        "modelled": {
            "model": MODEL,
            "batch_per_replica": DEFAULT_BATCH,
            "bucket_bytes": DEFAULT_BUCKET_BYTES,
            "topologies": topologies,
            "checks": modelled.verdicts.iter().map(scaling::verdict_json).collect::<Vec<_>>(),
        },
        "figures": figures.iter().map(Figure::json).collect::<Vec<_>>(),
        "baseline": {
            "file": BASELINE_PATH,
            "comparisons": comparisons.iter().map(Comparison::json).collect::<Vec<_>>(),
            "ok": count(Status::Ok),
            "regressed": count(Status::Regressed),
            "changed": count(Status::Changed),
            "missing": count(Status::Missing),
            "new": count(Status::New),
            "failures": failures,
        },
        "measured_tolerances": MEASURED.iter().map(|s| json!({
            "name": s.source.name(),
            "tolerance": s.tolerance.json(),
            "why": s.why,
        })).collect::<Vec<_>>(),
        "plots": ["busbw.svg", "efficiency.svg"],
        "passed": failures.is_empty(),
    })
}

/// Whether a comparison gets its own row in the markdown table: measured figures, the seed
/// check, the plateaus and any figure that fails; a topology's modelled efficiencies and
/// step times that pass are counted in one row instead.
pub(super) fn own_row(c: &Comparison) -> bool {
    c.kind == Kind::Measured
        || c.status.fails()
        || !(c.name.ends_with("/efficiency") || c.name.ends_with("/step_ms"))
}

pub(super) fn markdown(
    measured: &Measured,
    modelled: &Modelled,
    baseline: Option<&Baseline>,
    comparisons: &[Comparison],
    failures: &[String],
    command: &str,
) -> String {
    let mut md = Markdown::default();
    md.line("# mirra scaling report");
    md.line("");
    md.line(format!(
        "`{command}` on {} ({} cores), {}. **Measured** figures come from this machine \
         (CPU replicas and collectives); **modelled** ones from `mirra-scaling` for machines \
         this one is not (docs/SCALING.md). Plots: [busbw.svg](busbw.svg), \
         [efficiency.svg](efficiency.svg).",
        machine::cpu_model().unwrap_or_else(|| "an unknown CPU".into()),
        machine::cores(),
        machine::utc_now(),
    ));
    md.line("");

    md.line(format!("## Baseline comparison (`{BASELINE_PATH}`)"));
    md.line("");
    md.line(format!(
        "Modelled figures must equal the baseline within {MODELLED_RELATIVE:e} relative (the \
         model is deterministic: a change is a change of the model). Measured figures are \
         ratios within one run, compared one way with the tolerance in their row. Update with \
         `cargo xtask report --update-baseline`."
    ));
    md.line("");
    match baseline {
        Some(b) => {
            md.line(format!("Baseline updated {}.", b.updated_utc));
            if b.quick.is_some() && b.quick != measured.quick() {
                md.line(format!(
                    "Note: the baseline's measured figures come from a {} run, this run's from \
                     a {} one.",
                    if b.quick == Some(true) {
                        "quick"
                    } else {
                        "full"
                    },
                    if measured.quick() == Some(true) {
                        "quick"
                    } else {
                        "full"
                    },
                ));
            }
        }
        None => md.line(format!("No baseline at `{BASELINE_PATH}`.")),
    }
    md.line("");
    let count = |s: Status| comparisons.iter().filter(|c| c.status == s).count();
    if failures.is_empty() {
        md.line(format!(
            "**PASS**: {} figures within tolerance, {} new.",
            count(Status::Ok),
            count(Status::New)
        ));
    } else {
        md.line(format!(
            "**FAIL**: {} regressed, {} changed, {} missing ({} ok, {} new):",
            count(Status::Regressed),
            count(Status::Changed),
            count(Status::Missing),
            count(Status::Ok),
            count(Status::New)
        ));
        md.line("");
        for f in failures {
            md.line(format!("- {f}"));
        }
    }
    md.line("");
    let mut rows: Vec<Vec<String>> = comparisons
        .iter()
        .filter(|c| own_row(c))
        .map(|c| {
            vec![
                format!("`{}`", c.name),
                c.kind.name().into(),
                c.baseline.map_or_else(|| "-".into(), sig),
                c.current.as_ref().map_or_else(|_| "-".into(), |v| sig(*v)),
                c.tolerance.describe(),
                c.status.label().into(),
            ]
        })
        .collect();
    for t in &modelled.topologies {
        let prefix = format!("model/{}/", t.topology.name());
        let grouped: Vec<Status> = comparisons
            .iter()
            .filter(|c| c.name.starts_with(&prefix) && !own_row(c))
            .map(|c| c.status)
            .collect();
        if !grouped.is_empty() {
            let counts: Vec<String> = [Status::Ok, Status::New]
                .into_iter()
                .map(|s| (s, grouped.iter().filter(|g| **g == s).count()))
                .filter(|(_, n)| *n > 0)
                .map(|(s, n)| format!("{n} {}", s.label()))
                .collect();
            rows.push(vec![
                format!(
                    "`{prefix}*/*/{{efficiency,step_ms}}` ({} figures)",
                    grouped.len()
                ),
                "modelled".into(),
                "-".into(),
                "-".into(),
                Tolerance::Relative(MODELLED_RELATIVE).describe(),
                counts.join(", "),
            ]);
        }
    }
    md.table(
        &[
            "figure",
            "kind",
            "baseline",
            "this run",
            "tolerance",
            "status",
        ],
        &rows,
    );
    md.line("Why these tolerances for the measured figures:");
    md.line("");
    for s in &MEASURED {
        md.line(format!(
            "- `{}` ({}): {}.",
            s.source.name(),
            s.tolerance.describe(),
            s.why
        ));
    }
    md.line("");

    measured_markdown(&mut md, measured);
    modelled_markdown(&mut md, modelled);
    md.0
}

pub(super) fn measured_markdown(md: &mut Markdown, measured: &Measured) {
    let absent = |file: &str| {
        format!(
            "Not measured: `target/bench/{file}` is absent (`cargo xtask report --measure` \
             measures)."
        )
    };
    let when = |v: &Value| {
        format!(
            "{}{}",
            v["machine"]["date_utc"]
                .as_str()
                .unwrap_or("at an unknown date"),
            if v["quick"] == true { ", quick" } else { "" }
        )
    };
    md.line("## Measured: mirrored training here (MNIST MLP, CPU replicas)");
    md.line("");
    match &measured.scaling {
        None => md.line(absent("scaling-measured.json")),
        Some(s) => {
            md.line(format!(
                "`cargo xtask scaling` ({}): {} samples per replica (weak scaling), the \
                 replicas sharing this machine's cores; efficiency = samples/s(N) / (N x \
                 samples/s(1)).",
                when(s),
                s["per_replica_batch"]
            ));
            md.line("");
            let rows: Vec<Vec<String>> = measured
                .training_rows()
                .iter()
                .map(|r| {
                    vec![
                        r["replicas"].to_string(),
                        r["collective"].as_str().unwrap_or("?").into(),
                        fixed(r["step_ms"].as_f64(), 3),
                        fixed(r["samples_per_sec"].as_f64(), 0),
                        fixed(r["efficiency"].as_f64(), 3),
                        fixed(r["exposed_comm_ms"].as_f64(), 3),
                        fixed(r["exposed_comm_fraction"].as_f64().map(|x| 100.0 * x), 1),
                    ]
                })
                .collect();
            md.table(
                &[
                    "replicas",
                    "collective",
                    "step (ms)",
                    "samples/s",
                    "efficiency",
                    "exposed (ms)",
                    "exposed (%)",
                ],
                &rows,
            );
        }
    }
    md.line("");
    md.line("## Measured: CPU all_reduce beside the copy rate");
    md.line("");
    match &measured.collectives {
        None => md.line(absent("collectives.json")),
        Some(c) => {
            md.line(format!(
                "`cargo xtask bench-collectives` ({}): algbw over the copy rate measured in the \
                 same run the way the collective runs (one thread per rank, each copying a \
                 rank's buffer), with busbw in brackets. 1.0 is every rank copying its buffer \
                 once at the same time; a ratio above it is above the measured copy rate, not \
                 past a limit (no single copy figure is a ceiling on this machine).",
                when(c)
            ));
            md.line("");
            // busbw_ratios comes backend by backend, world size by world size: one row each.
            let mut rows: Vec<Vec<String>> = vec![];
            for (b, n, bytes, busbw, ratio) in busbw_ratios(measured) {
                let same = rows
                    .last()
                    .is_some_and(|r| r[0] == b && r[1] == n.to_string());
                if !same {
                    let mut row = vec![b, n.to_string()];
                    row.extend(RATIO_SIZES.iter().map(|_| "-".to_string()));
                    rows.push(row);
                }
                let i = RATIO_SIZES.iter().position(|&s| s == bytes);
                if let (Some(row), Some(i)) = (rows.last_mut(), i) {
                    row[2 + i] = format!("{} ({busbw:.2} GB/s)", fixed(ratio, 3));
                }
            }
            let sizes: Vec<String> = RATIO_SIZES.iter().map(|&s| size_label(s)).collect();
            let mut head = vec!["backend", "ranks"];
            head.extend(sizes.iter().map(String::as_str));
            md.table(&head, &rows);
        }
    }
    if let Some(m) = &measured.mirrored {
        md.line("");
        md.line("## Measured: `cargo xtask bench-mirrored`");
        md.line("");
        md.line(format!(
            "{}: one device without a strategy {} samples/s.",
            when(m),
            fixed(m["baseline_samples_per_sec"].as_f64(), 0)
        ));
        md.line("");
        let rows: Vec<Vec<String>> = m["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                vec![
                    r["replicas"].to_string(),
                    r["collective"].as_str().unwrap_or("?").into(),
                    r["global_batch"].to_string(),
                    fixed(r["samples_per_sec"].as_f64(), 0),
                    fixed(r["exposed_comm_fraction"].as_f64().map(|x| 100.0 * x), 1),
                ]
            })
            .collect();
        md.table(
            &[
                "replicas",
                "collective",
                "global batch",
                "samples/s",
                "exposed (%)",
            ],
            &rows,
        );
    }
    md.line("");
}

pub(super) fn modelled_markdown(md: &mut Markdown, modelled: &Modelled) {
    md.line(format!(
        "## Modelled: {MODEL}, {DEFAULT_BATCH} per replica, DDP buckets of {}",
        size_label(DEFAULT_BUCKET_BYTES)
    ));
    md.line("");
    md.line(
        "`mirra-scaling` (docs/SCALING.md): NCCL's ring and tree on each preset, bucketed \
         all-reduce overlapped with backward. An upper bound on scaling.",
    );
    md.line("");
    let mut rows = vec![];
    for t in &modelled.topologies {
        for r in &t.prediction.rows {
            rows.push(vec![
                t.topology.name().to_string(),
                r.algorithm.name().into(),
                r.replicas.to_string(),
                format!("{:.2}", r.step_s * 1e3),
                format!("{:.0}", r.samples_per_s),
                format!("{:.4}", r.efficiency),
                format!("{:.3}", r.exposed_comm_s * 1e3),
                if r.replicas > 1 {
                    format!("{:.1}", r.peak_busbw_gbs)
                } else {
                    "-".into()
                },
            ]);
        }
    }
    md.table(
        &[
            "topology",
            "algorithm",
            "replicas",
            "step (ms)",
            "samples/s",
            "efficiency",
            "exposed (ms)",
            "busbw (GB/s)",
        ],
        &rows,
    );
    md.line("### Ring against tree (all_reduce, 4KiB..1GiB, widest replica count)");
    md.line("");
    let rows: Vec<Vec<String>> = modelled
        .topologies
        .iter()
        .map(|t| {
            let c = &t.prediction.crossover;
            let wins = |a: Algorithm| {
                let r: Vec<String> = c
                    .ranges
                    .iter()
                    .filter(|r| r.algorithm == a)
                    .map(|r| format!("{}..{}", size_label(r.from_bytes), size_label(r.to_bytes)))
                    .collect();
                if r.is_empty() {
                    "-".into()
                } else {
                    r.join(", ")
                }
            };
            let plateau = |a: Algorithm| {
                t.sweeps
                    .iter()
                    .find(|s| s.algorithm == a)
                    .map_or_else(|| "-".into(), |s| format!("{:.1}", s.plateau_gbs))
            };
            vec![
                t.topology.name().to_string(),
                c.replicas.to_string(),
                wins(Algorithm::Ring),
                wins(Algorithm::Tree),
                plateau(Algorithm::Ring),
                plateau(Algorithm::Tree),
            ]
        })
        .collect();
    md.table(
        &[
            "topology",
            "replicas",
            "ring wins",
            "tree wins",
            "ring busbw plateau (GB/s)",
            "tree busbw plateau (GB/s)",
        ],
        &rows,
    );
    md.line("### Checks against public figures (predicted / published within the band)");
    md.line("");
    md.line(
        "Each check is run on the model and on every ablation of it; it rejects the \
         ablations that fall outside its band. A check that rejects none is flagged: a wrong \
         model passes it too. This machine's own check (the host model) needs a measurement: \
         `cargo xtask scaling --validate`.",
    );
    md.line("");
    let rows: Vec<Vec<String>> = modelled
        .verdicts
        .iter()
        .map(|v| {
            let c = &v.check;
            vec![
                c.name.clone(),
                format!("{:.4} {}", c.predicted, c.unit)
                    .trim_end()
                    .to_string(),
                format!("{:.4} {}", c.published, c.unit)
                    .trim_end()
                    .to_string(),
                format!("{:.3}", c.ratio()),
                format!("[{:.3}, {:.3}]", c.band.0, c.band.1),
                if c.within() { "ok" } else { "MISSED" }.into(),
                if v.flagged() {
                    "**FLAG: none**".into()
                } else {
                    v.rejects
                        .iter()
                        .map(|a| a.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            ]
        })
        .collect();
    md.table(
        &[
            "check",
            "predicted",
            "published",
            "ratio",
            "band",
            "status",
            "rejects",
        ],
        &rows,
    );
    let s = &modelled.seed;
    md.line(format!(
        "**seed_check**: predicted_speedup {:.3}, published_speedup {} (ResNet-50, 4x V100 \
         NVLink, 128 per GPU; the model predicts a step's throughput, the seed's 3.6x is a \
         ratio of training times).",
        s.predicted_speedup, s.published_speedup
    ));
}
