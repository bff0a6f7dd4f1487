//! The prediction: per algorithm and replica count, the step time, samples/s, scaling
//! efficiency and exposed communication; and which algorithm wins at which message size.
//!
//! ```text
//! samples/s(N)  = N * batch / step(N)
//! efficiency(N) = samples/s(N) / (N * samples/s(1)) = compute / step(N)
//! ```

use crate::ablation::Ablation;
use crate::overlap::{self, Overlap};
use crate::profile::ModelProfile;
use crate::schedule::Schedule;
use crate::topology::Topology;
use crate::tuning::Algorithm;
use crate::{Result, ScalingError};

/// The smallest message of the crossover sweep.
pub const SWEEP_MIN_BYTES: usize = 4 << 10;

/// The largest message of the crossover sweep.
pub const SWEEP_MAX_BYTES: usize = 1 << 30;

/// One cell of the table: an algorithm at a replica count.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The all-reduce algorithm.
    pub algorithm: Algorithm,
    /// Replicas (one per device).
    pub replicas: usize,
    /// Predicted step time, seconds.
    pub step_s: f64,
    /// Samples per second over all replicas.
    pub samples_per_s: f64,
    /// samples/s(N) / (N x samples/s(1)).
    pub efficiency: f64,
    /// Communication not hidden behind backward, seconds.
    pub exposed_comm_s: f64,
    /// All-reduce time summed over the step's buckets, seconds.
    pub comm_s: f64,
    /// Buckets per step.
    pub buckets: usize,
    /// The bus bandwidth large messages approach with this algorithm, GB/s (0 for one
    /// replica).
    pub peak_busbw_gbs: f64,
}

/// Ring and tree at one message size.
#[derive(Clone, Debug, PartialEq)]
pub struct SizePoint {
    /// The message, bytes.
    pub bytes: usize,
    /// Ring all-reduce, seconds.
    pub ring_s: f64,
    /// Tree all-reduce, seconds.
    pub tree_s: f64,
    /// The faster (ring on a tie).
    pub winner: Algorithm,
}

/// A run of consecutive sweep sizes that one algorithm wins.
#[derive(Clone, Debug, PartialEq)]
pub struct WinRange {
    /// The winner.
    pub algorithm: Algorithm,
    /// The first size it wins, bytes.
    pub from_bytes: usize,
    /// The last size it wins, bytes.
    pub to_bytes: usize,
}

/// Which algorithm wins at which size, at one replica count.
#[derive(Clone, Debug, PartialEq)]
pub struct Crossover {
    /// The replica count.
    pub replicas: usize,
    /// Every size of the sweep (powers of two, 4 KiB to 1 GiB).
    pub points: Vec<SizePoint>,
    /// The sweep summarised as runs of wins.
    pub ranges: Vec<WinRange>,
}

/// The whole prediction for a topology and a model.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// The topology's name.
    pub topology: String,
    /// The model's name.
    pub model: String,
    /// Samples per replica per step.
    pub batch: usize,
    /// The bucket cap, bytes.
    pub bucket_bytes: usize,
    /// One replica's compute per step, seconds.
    pub compute_s: f64,
    /// One row per algorithm and replica count (algorithm-major, replicas in the order
    /// given).
    pub rows: Vec<Row>,
    /// The crossover at the largest replica count.
    pub crossover: Crossover,
}

/// One step of `profile` with `algorithm` on `replicas` devices of `topology`, gradients in
/// buckets of `bucket_bytes`, as the model variant `ablation` costs it.
pub fn step(
    topology: &Topology,
    profile: &ModelProfile,
    algorithm: Algorithm,
    replicas: usize,
    bucket_bytes: usize,
    ablation: Ablation,
) -> Result<(Row, Overlap)> {
    let schedule = Schedule::new(topology, algorithm, replicas)?;
    step_on(&schedule, profile, bucket_bytes, ablation)
}

/// [`step`] on a schedule already laid out (schedules do not depend on the ablation, which
/// is applied here).
pub fn step_on(
    schedule: &Schedule,
    profile: &ModelProfile,
    bucket_bytes: usize,
    ablation: Ablation,
) -> Result<(Row, Overlap)> {
    let (algorithm, replicas) = (schedule.algorithm(), schedule.ranks());
    let schedule = schedule.clone().ablated(ablation);
    let o = overlap::simulate(
        profile,
        bucket_bytes,
        |bytes| schedule.time_s(bytes),
        ablation,
    )?;
    let samples_per_s = (replicas * profile.batch) as f64 / o.step_s;
    let row = Row {
        algorithm,
        replicas,
        step_s: o.step_s,
        samples_per_s,
        efficiency: o.compute_s / o.step_s,
        exposed_comm_s: o.exposed_s,
        comm_s: o.comm_s,
        buckets: o.buckets.len(),
        peak_busbw_gbs: if replicas > 1 {
            schedule.peak_busbw_gbs()
        } else {
            0.0
        },
    };
    Ok((row, o))
}

/// Ring against tree over the sweep at `replicas` devices of `topology`.
pub fn crossover(topology: &Topology, replicas: usize) -> Result<Crossover> {
    let ring = Schedule::new(topology, Algorithm::Ring, replicas)?;
    let tree = Schedule::new(topology, Algorithm::Tree, replicas)?;
    let points: Vec<SizePoint> =
        std::iter::successors(Some(SWEEP_MIN_BYTES), |&b| b.checked_mul(2))
            .take_while(|&b| b <= SWEEP_MAX_BYTES)
            .map(|bytes| {
                let (ring_s, tree_s) = (ring.time_s(bytes), tree.time_s(bytes));
                let winner = if tree_s < ring_s {
                    Algorithm::Tree
                } else {
                    Algorithm::Ring
                };
                SizePoint {
                    bytes,
                    ring_s,
                    tree_s,
                    winner,
                }
            })
            .collect();
    let mut ranges: Vec<WinRange> = Vec::new();
    for p in &points {
        match ranges.last_mut() {
            Some(r) if r.algorithm == p.winner => r.to_bytes = p.bytes,
            _ => ranges.push(WinRange {
                algorithm: p.winner,
                from_bytes: p.bytes,
                to_bytes: p.bytes,
            }),
        }
    }
    Ok(Crossover {
        replicas,
        points,
        ranges,
    })
}

/// The table for every algorithm at every replica count, and the crossover at the largest,
/// with gradients in buckets of `bucket_bytes` (DDP's `bucket_cap_mb`: an input, so that the
/// caller passes the one its framework uses).
pub fn predict(
    topology: &Topology,
    profile: &ModelProfile,
    replicas: &[usize],
    bucket_bytes: usize,
) -> Result<Prediction> {
    let Some(&widest) = replicas.iter().max() else {
        return Err(ScalingError::ReplicasOutOfRange {
            topology: topology.name().to_string(),
            replicas: 0,
            devices: topology.devices().len(),
        });
    };
    let mut rows = Vec::with_capacity(2 * replicas.len());
    for algorithm in Algorithm::ALL {
        for &n in replicas {
            rows.push(
                step(
                    topology,
                    profile,
                    algorithm,
                    n,
                    bucket_bytes,
                    Ablation::None,
                )?
                .0,
            );
        }
    }
    Ok(Prediction {
        topology: topology.name().to_string(),
        model: profile.name.clone(),
        batch: profile.batch,
        bucket_bytes,
        compute_s: profile.compute_s(),
        rows,
        crossover: crossover(topology, widest)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    /// PyTorch DDP's default bucket cap, 25 MiB.
    const BUCKET: usize = 25 << 20;

    fn resnet(topology: &Topology) -> ModelProfile {
        ModelProfile::preset("resnet50", topology.device(), 128).unwrap()
    }

    #[test]
    fn the_table_has_every_algorithm_and_replica_count() {
        let t = presets::build("dgx-h100").unwrap();
        let p = predict(&t, &resnet(&t), &[1, 2, 4, 8], BUCKET).unwrap();
        assert_eq!(p.rows.len(), 8);
        for r in &p.rows {
            // Efficiency is compute over step, and samples/s agrees with it.
            let one = p.batch as f64 / p.compute_s;
            let eff = r.samples_per_s / (r.replicas as f64 * one);
            assert!((eff - r.efficiency).abs() < 1e-12);
            assert!(r.efficiency > 0.0 && r.efficiency <= 1.0);
            assert!((r.step_s - p.compute_s - r.exposed_comm_s).abs() < 1e-12);
            // 102 MB of gradients in 25 MiB buckets.
            assert_eq!(r.buckets, 4);
        }
        let one = &p.rows[0];
        assert_eq!((one.replicas, one.efficiency, one.comm_s), (1, 1.0, 0.0));
        // More replicas never scale better per replica on the same fabric.
        let ring: Vec<f64> = p.rows[..4].iter().map(|r| r.efficiency).collect();
        assert!(ring.windows(2).all(|w| w[1] <= w[0]), "{ring:?}");
        assert_eq!(p.crossover.replicas, 8);
        assert_eq!(p.crossover.points.len(), 19);
    }

    #[test]
    fn crossover_summarises_the_sweep() {
        // Across two hosts the tree's fewer steps win small messages, the ring large ones.
        let ib = presets::build("ib-2node").unwrap();
        let c = crossover(&ib, 16).unwrap();
        assert_eq!(c.ranges.len(), 2, "{:?}", c.ranges);
        let (tree, ring) = (&c.ranges[0], &c.ranges[1]);
        assert_eq!(
            (tree.algorithm, tree.from_bytes),
            (Algorithm::Tree, SWEEP_MIN_BYTES)
        );
        assert_eq!(
            (ring.algorithm, ring.to_bytes),
            (Algorithm::Ring, SWEEP_MAX_BYTES)
        );
        assert_eq!(ring.from_bytes, 2 * tree.to_bytes);
        // On one NVSwitch host NCCL's tree is a chain and never wins.
        let h100 = presets::build("dgx-h100").unwrap();
        let c = crossover(&h100, 8).unwrap();
        assert_eq!(c.ranges.len(), 1);
        assert_eq!(c.ranges[0].algorithm, Algorithm::Ring);
    }

    #[test]
    fn ablated_steps_cost_what_the_ablation_says() {
        // 2 PCIe GPUs with ResNet-50: communication shows.
        let t = presets::build("8gpu-pcie4").unwrap();
        let m = resnet(&t);
        let step = |a| step(&t, &m, Algorithm::Ring, 8, BUCKET, a).unwrap().0;
        let model = step(Ablation::None);
        assert!(model.comm_s > 0.0 && model.efficiency < 1.0);
        let free = step(Ablation::NoComm);
        assert_eq!((free.comm_s, free.efficiency), (0.0, 1.0));
        let fast = step(Ablation::DoubleBandwidth);
        assert!(fast.comm_s < model.comm_s && fast.efficiency >= model.efficiency);
        let late = step(Ablation::NoOverlap);
        assert!(late.exposed_comm_s > model.exposed_comm_s);
        assert!((late.exposed_comm_s - late.comm_s).abs() < 1e-12);
    }

    #[test]
    fn bad_replica_lists_are_errors() {
        let t = presets::build("dgx-h100").unwrap();
        let m = resnet(&t);
        for bad in [&[][..], &[1, 16], &[0]] {
            let e = predict(&t, &m, bad, BUCKET).unwrap_err();
            assert!(matches!(e, ScalingError::ReplicasOutOfRange { .. }), "{e}");
        }
        assert!(predict(&t, &m, &[2], 0).is_err());
    }
}
