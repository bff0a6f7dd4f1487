//! The host model: mirra's mirrored training step on this machine's CPU, predicted from what
//! was measured on it at run time (nothing here is a constant of any CPU).
//!
//! Replicas are threads sharing `cores` cores; each computes with `k = max(1, cores / N)`
//! kernel threads (the strategy's default). Of those cores the replicas' work gets `c` at a
//! time (measured: how much faster `cores` replicas of the step with one thread each go,
//! communicating nothing, than one alone; `c = cores` where the cores share nothing, less
//! where they share caches, memory bandwidth or a physical core's vector units, or other
//! work takes some). When more threads are busy
//! than that, they take turns, so every time a replica spends is stretched by how much more
//! they share the cores than the one-replica step measured alone with `k` threads did:
//! `f = max(1, N k / c) / max(1, k / c)`. The gradients go through the reducer's buckets
//! (the copy into a bucket is part of the one-replica step measured) and each bucket is
//! all-reduced by the ring through shared memory, whose cost is its memory traffic plus its
//! synchronisation:
//!
//! ```text
//! traffic  = (3(n-1)/n reads + 2(n-1)/n writes) / 2 = 2.5(n-1)/n bucket copies per rank
//! copy     = C(t) / t,  t = min(n, cores)     (C(t): t threads copying their own buffer of
//!                                              the bucket's size at once, GB/s in all)
//! all-reduce(S) = f x traffic(S) / copy + sync(n)
//! sync(n)  = a small all-reduce's measured time at n ranks less its own traffic
//! step(n)  = overlap of the one-replica step at k threads (stretched by f) with the buckets
//! efficiency(n) = step(1) / step(n)            (weak scaling: samples/s per replica)
//! ```
//!
//! The ablations [`Ablation::SingleCopy`] (one copy per byte sent, `2(n-1)/n`, the old
//! model) and [`Ablation::NoCoreSharing`] (`f = 1`) remove the two effects this model adds;
//! [`Ablation::NoComm`], [`Ablation::DoubleBandwidth`], [`Ablation::NoLatency`] and
//! [`Ablation::NoOverlap`] act as on the GPU topologies.

use crate::ablation::Ablation;
use crate::overlap;
use crate::profile::ModelProfile;
use crate::{Result, ScalingError};

/// A small all-reduce measured here: ranks, bytes and seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyncSample {
    /// Ranks of the group.
    pub ranks: usize,
    /// The message, bytes.
    pub bytes: usize,
    /// Its time (the slowest rank's), seconds.
    pub seconds: f64,
}

/// Everything the host model takes, measured on this machine when it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct HostMeasurements {
    /// The cores the replicas share.
    pub cores: usize,
    /// How many of them the replicas' work gets at once when measured (`1..=cores`): the
    /// speedup of `cores` replicas of the step (one kernel thread each, no communication)
    /// over one.
    pub parallel_cores: f64,
    /// The gradient bucket cap, bytes (the strategy's).
    pub bucket_bytes: usize,
    /// `copy_gbs[t - 1]`: GB/s moved (bytes counted once, summed over threads) by `t`
    /// threads each copying its own buffer of the bucket's size at once.
    pub copy_gbs: Vec<f64>,
    /// `steps[k - 1]`: one replica's training step alone with `k` kernel threads, as a
    /// profile: forward, per-layer backward, and the rest of the step as its update.
    pub steps: Vec<ModelProfile>,
    /// Small all-reduces of the ring at the rank counts predicted.
    pub sync: Vec<SyncSample>,
}

/// The host model's prediction at one replica count.
#[derive(Clone, Debug, PartialEq)]
pub struct HostPrediction {
    /// Replicas.
    pub replicas: usize,
    /// Kernel threads per replica.
    pub threads_per_replica: usize,
    /// How much the sharing of cores stretches each replica's time.
    pub stretch: f64,
    /// The step, seconds.
    pub step_s: f64,
    /// The all-reduces' summed time, seconds.
    pub comm_s: f64,
    /// Communication not hidden behind backward, seconds.
    pub exposed_s: f64,
    /// samples/s(n) / (n x samples/s(1)).
    pub efficiency: f64,
}

/// The ring's memory traffic per rank in bucket copies: reads `3(n-1)/n`, writes
/// `2(n-1)/n` of the buffer (`docs/COLLECTIVES.md`, `ring`), a copy being one read and one
/// write; under [`Ablation::SingleCopy`] one copy per byte sent, `2(n-1)/n`.
pub fn ring_copies(ranks: usize, ablation: Ablation) -> f64 {
    let n = ranks.max(1) as f64;
    let share = (n - 1.0) / n;
    if ablation == Ablation::SingleCopy {
        2.0 * share
    } else {
        2.5 * share
    }
}

impl HostMeasurements {
    fn invalid(reason: String) -> ScalingError {
        ScalingError::InvalidHostMeasurement { reason }
    }

    /// Checks that every figure the model will read is there and usable.
    fn validate(&self, replicas: usize) -> Result<()> {
        if self.cores == 0 || self.bucket_bytes == 0 {
            return Err(Self::invalid(format!(
                "{} cores and a bucket of {} bytes; both must be at least 1",
                self.cores, self.bucket_bytes
            )));
        }
        if !(self.parallel_cores >= 1.0 && self.parallel_cores <= self.cores as f64) {
            return Err(Self::invalid(format!(
                "{} cores usable at once out of {}: must be between 1 and the cores",
                self.parallel_cores, self.cores
            )));
        }
        let threads = replicas.min(self.cores);
        if self.copy_gbs.len() < threads {
            return Err(Self::invalid(format!(
                "copy rates measured for 1..={} threads; {replicas} replicas need {threads}",
                self.copy_gbs.len()
            )));
        }
        if let Some((t, bad)) = self
            .copy_gbs
            .iter()
            .enumerate()
            .find(|(_, g)| !(g.is_finite() && **g > 0.0))
        {
            return Err(Self::invalid(format!(
                "copy rate of {} threads is {bad} GB/s",
                t + 1
            )));
        }
        if self.steps.len() < self.cores {
            return Err(Self::invalid(format!(
                "one-replica steps measured for 1..={} kernel threads; {} cores need them all",
                self.steps.len(),
                self.cores
            )));
        }
        if replicas > 1 && self.sync_at(replicas).is_none() {
            return Err(Self::invalid(format!(
                "no small all-reduce measured at {replicas} ranks"
            )));
        }
        Ok(())
    }

    fn sync_at(&self, ranks: usize) -> Option<&SyncSample> {
        self.sync
            .iter()
            .find(|s| s.ranks == ranks && s.seconds.is_finite() && s.seconds >= 0.0)
    }

    /// Kernel threads per replica and the stretch of shared cores at `replicas`: how much
    /// more `replicas x k` busy threads share the usable cores than the `k` of the
    /// one-replica step measured alone.
    fn placement(&self, replicas: usize, ablation: Ablation) -> (usize, f64) {
        let k = (self.cores / replicas).max(1);
        let shared = |threads: usize| (threads as f64 / self.parallel_cores).max(1.0);
        let stretch = if ablation == Ablation::NoCoreSharing {
            1.0
        } else {
            shared(replicas * k) / shared(k)
        };
        (k, stretch)
    }

    /// Seconds of one ring all-reduce of `bytes` at `replicas` ranks.
    fn all_reduce_s(&self, replicas: usize, bytes: usize, stretch: f64, ablation: Ablation) -> f64 {
        if replicas < 2 || bytes == 0 || ablation == Ablation::NoComm {
            return 0.0;
        }
        let t = replicas.min(self.cores);
        let per_thread = self.copy_gbs[t - 1] / t as f64 * ablation.bandwidth_factor() * 1e9;
        let traffic_s = |b: usize| ring_copies(replicas, ablation) * b as f64 / per_thread;
        let sync_s = match (ablation, self.sync_at(replicas)) {
            (Ablation::NoLatency, _) | (_, None) => 0.0,
            (_, Some(s)) => (s.seconds - stretch * traffic_s(s.bytes)).max(0.0),
        };
        stretch * traffic_s(bytes) + sync_s
    }

    /// The step at `replicas` replicas as the model variant `ablation` costs it.
    pub fn predict(&self, replicas: usize, ablation: Ablation) -> Result<HostPrediction> {
        if replicas == 0 {
            return Err(Self::invalid("0 replicas".into()));
        }
        self.validate(replicas)?;
        let step = |n: usize| -> Result<(usize, f64, overlap::Overlap)> {
            let (k, stretch) = self.placement(n, ablation);
            let p = &self.steps[k - 1];
            let stretched = ModelProfile {
                forward_s: p.forward_s * stretch,
                update_s: p.update_s * stretch,
                layers: p
                    .layers
                    .iter()
                    .map(|l| crate::profile::LayerProfile {
                        backward_s: l.backward_s * stretch,
                        ..l.clone()
                    })
                    .collect(),
                ..p.clone()
            };
            let o = overlap::simulate(
                &stretched,
                self.bucket_bytes,
                |bytes| self.all_reduce_s(n, bytes, stretch, ablation),
                ablation,
            )?;
            Ok((k, stretch, o))
        };
        let (_, _, one) = step(1)?;
        let (k, stretch, o) = step(replicas)?;
        Ok(HostPrediction {
            replicas,
            threads_per_replica: k,
            stretch,
            step_s: o.step_s,
            comm_s: o.comm_s,
            exposed_s: o.exposed_s,
            efficiency: one.step_s / o.step_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::LayerProfile;

    /// A host of 2 cores: a step of 1 ms with one thread, 0.6 ms with two; copies at 10 GB/s
    /// with one thread and 16 with two; 10 us small all-reduces.
    fn host() -> HostMeasurements {
        let step = |total: f64| {
            let layers = vec![LayerProfile {
                name: "dense".into(),
                params: 100_000,
                backward_s: total * 0.5,
            }];
            ModelProfile::from_measured("mlp", 64, total * 0.25, layers, 4, "test")
                .unwrap()
                .with_update(total * 0.25)
                .unwrap()
        };
        HostMeasurements {
            cores: 2,
            parallel_cores: 2.0,
            bucket_bytes: 25 << 20,
            copy_gbs: vec![10.0, 16.0, 16.0, 16.0],
            steps: vec![step(1e-3), step(0.6e-3)],
            sync: [2, 4]
                .map(|ranks| SyncSample {
                    ranks,
                    bytes: 4096,
                    seconds: 10e-6,
                })
                .to_vec(),
        }
    }

    #[test]
    fn two_replicas_on_two_cores_pay_a_thread_each_and_the_ring() {
        let h = host();
        let p = h.predict(2, Ablation::None).unwrap();
        assert_eq!((p.threads_per_replica, p.stretch), (1, 1.0));
        // 400 kB of gradients, 1.25 copies per rank at 8 GB/s per thread, plus the sync.
        let traffic = 1.25 * 400_000.0 / 8e9;
        let sync = 10e-6 - 1.25 * 4096.0 / 8e9;
        assert!((p.comm_s - (traffic + sync)).abs() < 1e-12, "{p:?}");
        // One bucket, ready when backward ends: all of it exposed.
        assert!((p.step_s - (1e-3 + traffic + sync)).abs() < 1e-12);
        assert!((p.efficiency - 0.6e-3 / p.step_s).abs() < 1e-12);
        let one = h.predict(1, Ablation::None).unwrap();
        assert_eq!((one.efficiency, one.comm_s), (1.0, 0.0));
    }

    #[test]
    fn more_replicas_than_cores_take_turns() {
        let h = host();
        let p = h.predict(4, Ablation::None).unwrap();
        assert_eq!((p.threads_per_replica, p.stretch), (1, 2.0));
        assert!(p.step_s > 2e-3);
        // Each ablation of what this model adds moves the prediction the way it must.
        let free = h.predict(4, Ablation::NoCoreSharing).unwrap();
        assert!(free.step_s < 1.2e-3 && free.efficiency > 1.8 * p.efficiency);
        let single = h.predict(4, Ablation::SingleCopy).unwrap();
        assert!(single.comm_s < p.comm_s);
        let none = h.predict(4, Ablation::NoComm).unwrap();
        assert_eq!(none.comm_s, 0.0);
        assert!((none.step_s - 2e-3).abs() < 1e-12);
        let fast = h.predict(4, Ablation::DoubleBandwidth).unwrap();
        assert!(fast.comm_s < p.comm_s && fast.comm_s > none.comm_s);
        let no_latency = h.predict(4, Ablation::NoLatency).unwrap();
        assert!(no_latency.comm_s < p.comm_s);
        assert_eq!(ring_copies(4, Ablation::None), 2.5 * 0.75);
        assert_eq!(ring_copies(4, Ablation::SingleCopy), 2.0 * 0.75);
    }

    #[test]
    fn a_busy_machine_shares_fewer_cores() {
        // Other work leaves one core's worth: two replicas take turns as four would on an
        // idle machine; one replica alone measured its step in the same conditions.
        let mut h = host();
        h.parallel_cores = 1.0;
        let two = h.predict(2, Ablation::None).unwrap();
        assert_eq!(two.stretch, 2.0);
        let four = h.predict(4, Ablation::None).unwrap();
        assert_eq!(four.stretch, 4.0);
        assert_eq!(h.predict(1, Ablation::None).unwrap().stretch, 1.0);
        h.parallel_cores = 1.5;
        assert!((h.predict(2, Ablation::None).unwrap().stretch - 2.0 / 1.5).abs() < 1e-12);
        assert_eq!(h.predict(2, Ablation::NoCoreSharing).unwrap().stretch, 1.0);
    }

    #[test]
    fn missing_or_broken_measurements_are_errors() {
        let mut h = host();
        h.sync.retain(|s| s.ranks != 4);
        let e = h.predict(4, Ablation::None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "host measurement: no small all-reduce measured at 4 ranks"
        );
        let mut h = host();
        h.copy_gbs[1] = f64::NAN;
        assert!(h.predict(2, Ablation::None).is_err());
        let mut h = host();
        h.copy_gbs.truncate(1);
        assert!(h.predict(2, Ablation::None).is_err());
        let mut h = host();
        h.steps.truncate(1);
        assert!(h.predict(2, Ablation::None).is_err());
        let mut h = host();
        h.cores = 0;
        assert!(h.predict(1, Ablation::None).is_err());
        for bad in [0.5, 2.5, f64::NAN] {
            let mut h = host();
            h.parallel_cores = bad;
            assert!(h.predict(2, Ablation::None).is_err(), "{bad}");
        }
        assert!(host().predict(0, Ablation::None).is_err());
    }
}
