//! What a report reads and computes: the measured files and the modelled predictions.

use super::*;

/// The measured results, each `None` when its file is absent.
#[derive(Clone, Debug, Default)]
pub(super) struct Measured {
    pub(super) scaling: Option<Value>,
    pub(super) collectives: Option<Value>,
    pub(super) mirrored: Option<Value>,
}

/// A JSON file, `None` when absent; unreadable or invalid JSON is an error.
pub(super) fn read_json(path: &Path) -> Result<Option<Value>, Failure> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Failure::run(format!(
                "xtask report: cannot read {}: {e}",
                path.display()
            )))
        }
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        Failure::run(format!(
            "xtask report: {} is not valid JSON: {e}",
            path.display()
        ))
    })
}

impl Measured {
    pub(super) fn read(paths: &Paths) -> Result<Measured, Failure> {
        Ok(Measured {
            scaling: read_json(&paths.scaling_measured())?,
            collectives: read_json(&paths.collectives())?,
            mirrored: read_json(&paths.mirrored())?,
        })
    }

    /// The all-reduce rows of `collectives.json`.
    pub(super) fn all_reduce(&self) -> Vec<ArRow> {
        let Some(c) = &self.collectives else {
            return vec![];
        };
        c["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["op"] == "all_reduce")
            .filter_map(|r| {
                Some(ArRow {
                    backend: r["backend"].as_str()?.to_string(),
                    ranks: r["world_size"].as_u64()? as usize,
                    bytes: r["bytes"].as_u64()? as usize,
                    time_us: r["time_us"].as_f64()?,
                    busbw_gbs: r["busbw_gbs"].as_f64()?,
                    algbw_over_copy: r["algbw_over_copy"].as_f64(),
                })
            })
            .collect()
    }

    /// The backends of `collectives.json`, in its order.
    pub(super) fn backends(&self) -> Vec<String> {
        let mut names: Vec<String> = vec![];
        for r in self.all_reduce() {
            if !names.contains(&r.backend) {
                names.push(r.backend);
            }
        }
        names
    }

    /// The rows of `scaling-measured.json`.
    pub(super) fn training_rows(&self) -> &[Value] {
        self.scaling
            .as_ref()
            .and_then(|s| s["rows"].as_array())
            .map_or(&[], Vec::as_slice)
    }

    /// Whether the collective results come from a quick run.
    pub(super) fn quick(&self) -> Option<bool> {
        self.collectives.as_ref()?["quick"].as_bool()
    }

    /// What the sweep of `collectives.json` holds, for a missing figure's reason.
    pub(super) fn sweep(&self) -> String {
        let rows = self.all_reduce();
        let mut ranks: Vec<usize> = rows.iter().map(|r| r.ranks).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let (lo, hi) = (
            rows.iter().map(|r| r.bytes).min(),
            rows.iter().map(|r| r.bytes).max(),
        );
        match (lo, hi) {
            (Some(lo), Some(hi)) => format!(
                "its all_reduce sweep: {ranks:?} ranks, {}..{}",
                size_label(lo),
                size_label(hi)
            ),
            _ => "it has no all_reduce rows".into(),
        }
    }

    pub(super) fn figure(&self, spec: &MeasuredSpec) -> Figure {
        let (value, detail) = match self.compute(spec.source) {
            Ok((v, detail)) => (Ok(v), detail),
            Err(why) => (Err(why), String::new()),
        };
        Figure {
            name: spec.source.name(),
            kind: Kind::Measured,
            unit: "ratio",
            tolerance: spec.tolerance,
            value,
            what: format!("{}{detail}", spec.source.what()),
        }
    }

    /// A measured figure and a detail (the winning backend), or why it is missing.
    pub(super) fn compute(&self, source: Source) -> Result<(f64, String), String> {
        let no_collectives = || {
            "target/bench/collectives.json is absent (run `cargo xtask scaling` or \
             `cargo xtask report --measure`)"
                .to_string()
        };
        match source {
            Source::AlgbwOverCopy { ranks, bytes } => {
                if self.collectives.is_none() {
                    return Err(no_collectives());
                }
                let best = self
                    .all_reduce()
                    .into_iter()
                    .filter(|r| r.ranks == ranks && r.bytes == bytes)
                    .filter(|r| r.algbw_over_copy.is_some())
                    .max_by(|a, b| a.busbw_gbs.total_cmp(&b.busbw_gbs))
                    .ok_or_else(|| {
                        format!(
                            "collectives.json has no all_reduce at {ranks} ranks of {} ({})",
                            size_label(bytes),
                            self.sweep()
                        )
                    })?;
                let ratio = best.algbw_over_copy.expect("filtered");
                Ok((
                    ratio,
                    format!(" (this run: {}, algbw / copy {ratio:.2})", best.backend),
                ))
            }
            Source::TreeOverRing { ranks, bytes } => {
                if self.collectives.is_none() {
                    return Err(no_collectives());
                }
                let rows = self.all_reduce();
                let time = |backend: &str| {
                    rows.iter()
                        .find(|r| r.backend == backend && r.ranks == ranks && r.bytes == bytes)
                        .map(|r| r.time_us)
                        .filter(|t| *t > 0.0)
                        .ok_or_else(|| {
                            format!(
                                "collectives.json has no {backend} all_reduce at {ranks} ranks \
                                 of {} ({})",
                                size_label(bytes),
                                self.sweep()
                            )
                        })
                };
                let (tree, ring) = (time("tree")?, time("ring")?);
                Ok((
                    tree / ring,
                    format!(" (this run: tree {tree:.2} us, ring {ring:.2} us)"),
                ))
            }
            Source::Efficiency { replicas } => {
                if self.scaling.is_none() {
                    return Err("target/bench/scaling-measured.json is absent (run `cargo \
                                xtask scaling` or `cargo xtask report --measure`)"
                        .into());
                }
                let best = self
                    .training_rows()
                    .iter()
                    .filter(|r| r["replicas"].as_u64() == Some(replicas as u64))
                    .filter_map(|r| Some((r["efficiency"].as_f64()?, r["collective"].as_str()?)))
                    .max_by(|a, b| a.0.total_cmp(&b.0))
                    .ok_or_else(|| {
                        format!("scaling-measured.json has no row with {replicas} replicas")
                    })?;
                Ok((best.0, format!(" (this run: {})", best.1)))
            }
        }
    }
}

/// One all-reduce row of `collectives.json`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ArRow {
    pub(super) backend: String,
    pub(super) ranks: usize,
    pub(super) bytes: usize,
    pub(super) time_us: f64,
    pub(super) busbw_gbs: f64,
    /// algbw over the copy rate measured beside the row (one thread per rank, a rank's
    /// working set each), when the row has one.
    pub(super) algbw_over_copy: Option<f64>,
}

/// One algorithm swept over message sizes on a topology's widest replica count.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Sweep {
    pub(super) algorithm: Algorithm,
    pub(super) ranks: usize,
    pub(super) plateau_gbs: f64,
    /// `(bytes, busbw GB/s)`.
    pub(super) points: Vec<(usize, f64)>,
}

/// The prediction on one topology.
#[derive(Clone, Debug)]
pub(super) struct TopologyModel {
    pub(super) topology: Topology,
    pub(super) profile: ModelProfile,
    pub(super) prediction: Prediction,
    pub(super) sweeps: Vec<Sweep>,
}

/// Every modelled figure of the report.
#[derive(Clone, Debug)]
pub(super) struct Modelled {
    pub(super) topologies: Vec<TopologyModel>,
    /// The checks against public figures, with the ablations each rejects.
    pub(super) verdicts: Vec<Verdict>,
    pub(super) seed: SeedCheck,
}

/// The presets of the report: those whose device has a cited [`MODEL`] throughput.
pub(super) fn report_topologies() -> Vec<&'static str> {
    presets::NAMES
        .iter()
        .copied()
        .filter(|name| {
            presets::build(name).is_ok_and(|t| profile::throughput(MODEL, t.device()).is_ok())
        })
        .collect()
}

/// The model on the named presets.
pub(super) fn model(names: &[&str]) -> Result<Modelled, ScalingError> {
    let mut topologies = vec![];
    for name in names {
        let topology = presets::build(name)?;
        let profile = ModelProfile::preset(MODEL, topology.device(), DEFAULT_BATCH)?;
        let replicas = scaling::default_replicas(topology.devices().len());
        let prediction = predict::predict(&topology, &profile, &replicas, DEFAULT_BUCKET_BYTES)?;
        let ranks = prediction.crossover.replicas;
        let mut sweeps = vec![];
        for algorithm in Algorithm::ALL {
            let schedule = Schedule::new(&topology, algorithm, ranks)?;
            let points =
                std::iter::successors(Some(predict::SWEEP_MIN_BYTES), |&b| b.checked_mul(2))
                    .take_while(|&b| b <= predict::SWEEP_MAX_BYTES)
                    .map(|b| (b, schedule.cost(b).busbw_gbs))
                    .collect();
            sweeps.push(Sweep {
                algorithm,
                ranks,
                plateau_gbs: schedule.peak_busbw_gbs(),
                points,
            });
        }
        topologies.push(TopologyModel {
            topology,
            profile,
            prediction,
            sweeps,
        });
    }
    Ok(Modelled {
        topologies,
        verdicts: checks::validate(&scaling::public_inputs())?,
        seed: checks::seed_check(DEFAULT_BUCKET_BYTES, Ablation::None)?,
    })
}

impl Modelled {
    pub(super) fn figures(&self) -> Vec<Figure> {
        let tolerance = Tolerance::Relative(MODELLED_RELATIVE);
        let figure = |name: String, unit, value, what: String| Figure {
            name,
            kind: Kind::Modelled,
            unit,
            tolerance,
            value: Ok(value),
            what,
        };
        let mut out = vec![];
        for t in &self.topologies {
            let topo = t.topology.name();
            for r in &t.prediction.rows {
                let prefix = format!("model/{topo}/{}/{}", r.algorithm.name(), r.replicas);
                let what = format!(
                    "{MODEL}, {} per replica, {} replicas of {topo}, {}",
                    t.prediction.batch,
                    r.replicas,
                    r.algorithm.name()
                );
                out.push(figure(
                    format!("{prefix}/efficiency"),
                    "ratio",
                    r.efficiency,
                    format!("efficiency, {what}"),
                ));
                out.push(figure(
                    format!("{prefix}/step_ms"),
                    "ms",
                    r.step_s * 1e3,
                    format!("step time, {what}"),
                ));
            }
            for s in &t.sweeps {
                out.push(figure(
                    format!(
                        "model/{topo}/{}/{}/busbw_plateau_gbs",
                        s.algorithm.name(),
                        s.ranks
                    ),
                    "GB/s",
                    s.plateau_gbs,
                    format!(
                        "all_reduce busbw that large messages approach, {} ranks of {topo}, {}",
                        s.ranks,
                        s.algorithm.name()
                    ),
                ));
            }
        }
        out.push(figure(
            "model/seed_check/predicted_speedup".into(),
            "x",
            self.seed.predicted_speedup,
            "ResNet-50 speedup at 4 replicas of 4xv100-nvlink, 128 per GPU (the seed's 3.6x)"
                .into(),
        ));
        out
    }

    pub(super) fn find(&self, name: &str) -> Option<&TopologyModel> {
        self.topologies.iter().find(|t| t.topology.name() == name)
    }
}
