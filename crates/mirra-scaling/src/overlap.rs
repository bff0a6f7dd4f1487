//! Bucketed gradient synchronisation overlapped with backward, as PyTorch DDP's reducer
//! does it (`torch/csrc/distributed/c10d/reducer.cpp`; Li et al., VLDB 2020).
//!
//! Backward produces gradients last layer first. They are packed, in that order, into
//! buckets of at least the cap (an input: DDP's 25 MiB, which mirra's reducer also uses, or
//! Horovod's 64 MiB fusion buffer; a layer larger than the cap gets a bucket of its own); a
//! bucket's all-reduce starts as soon as its last gradient is ready, on one communication
//! stream, so it also waits for the previous bucket's to finish. Compute and communication
//! do not slow each other down. The step ends when both backward and the last all-reduce
//! have finished, and then the update runs:
//!
//! ```text
//! ready_b = forward + backward of every layer from the last down to b's first
//! start_b = max(ready_b, end_{b-1}),   end_b = start_b + allreduce(bytes_b)
//! step    = max(forward + backward, end_last) + update,    exposed = step - compute
//! ```
//!
//! Under [`Ablation::NoOverlap`] every bucket is ready only when backward has finished.

use std::ops::Range;

use crate::ablation::Ablation;
use crate::profile::ModelProfile;
use crate::{Result, ScalingError};

/// One bucket's place in the step.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// The layers whose gradients it holds (indices in forward order).
    pub layers: Range<usize>,
    /// Its size in bytes.
    pub bytes: usize,
    /// When its last gradient is ready, seconds from the start of the step.
    pub ready_s: f64,
    /// When its all-reduce starts.
    pub start_s: f64,
    /// When its all-reduce ends.
    pub end_s: f64,
}

/// A simulated training step.
#[derive(Clone, Debug, PartialEq)]
pub struct Overlap {
    /// Forward plus backward, seconds.
    pub compute_s: f64,
    /// The whole step, seconds.
    pub step_s: f64,
    /// The all-reduces' summed time, seconds.
    pub comm_s: f64,
    /// Communication not hidden behind compute, seconds.
    pub exposed_s: f64,
    /// The buckets, in the order they are reduced.
    pub buckets: Vec<Bucket>,
}

/// The buckets of `profile` at a cap of `cap_bytes`, in reduction order (last layers
/// first): `(layers, bytes)`.
pub fn buckets(profile: &ModelProfile, cap_bytes: usize) -> Result<Vec<(Range<usize>, usize)>> {
    if cap_bytes == 0 {
        return Err(ScalingError::ZeroBytes { what: "bucket cap" });
    }
    let mut out = Vec::new();
    let mut end = profile.layers.len();
    let mut bytes = 0;
    for i in (0..profile.layers.len()).rev() {
        bytes += profile.layers[i].params * profile.bytes_per_param;
        if bytes >= cap_bytes || i == 0 {
            out.push((i..end, bytes));
            end = i;
            bytes = 0;
        }
    }
    Ok(out)
}

/// Simulates one step of `profile` whose all-reduce of `bytes` takes `all_reduce_s(bytes)`
/// seconds (0 for a single replica), overlapped with backward unless `ablation` is
/// [`Ablation::NoOverlap`].
pub fn simulate(
    profile: &ModelProfile,
    cap_bytes: usize,
    all_reduce_s: impl Fn(usize) -> f64,
    ablation: Ablation,
) -> Result<Overlap> {
    let compute_s = profile.compute_s();
    let backward_end_s = profile.forward_s + profile.backward_s();
    let mut free_at = 0.0f64;
    let mut comm_s = 0.0;
    let mut out = Vec::new();
    for (layers, bytes) in buckets(profile, cap_bytes)? {
        // Backward has run from the last layer down to this bucket's first.
        let ready_s = if ablation == Ablation::NoOverlap {
            backward_end_s
        } else {
            profile.forward_s
                + profile.layers[layers.start..]
                    .iter()
                    .map(|l| l.backward_s)
                    .sum::<f64>()
        };
        let start_s = ready_s.max(free_at);
        let t = all_reduce_s(bytes);
        free_at = start_s + t;
        comm_s += t;
        out.push(Bucket {
            layers,
            bytes,
            ready_s,
            start_s,
            end_s: free_at,
        });
    }
    let step_s = backward_end_s.max(free_at) + profile.update_s;
    Ok(Overlap {
        compute_s,
        step_s,
        comm_s,
        exposed_s: step_s - compute_s,
        buckets: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::LayerProfile;

    /// Four layers of 1 MiB of gradients each, 10 ms of backward each, 20 ms forward.
    fn four() -> ModelProfile {
        let layers = (0..4)
            .map(|i| LayerProfile {
                name: format!("l{i}"),
                params: (1 << 20) / 4,
                backward_s: 0.010,
            })
            .collect();
        ModelProfile::from_measured("four", 1, 0.020, layers, 4, "test").unwrap()
    }

    #[test]
    fn buckets_fill_in_reverse_layer_order() {
        let m = four();
        let b = buckets(&m, 2 << 20).unwrap();
        assert_eq!(b, [(2..4, 2 << 20), (0..2, 2 << 20)]);
        // A cap smaller than a layer: one bucket per layer; a huge cap: one bucket.
        assert_eq!(buckets(&m, 1).unwrap().len(), 4);
        assert_eq!(buckets(&m, 1 << 30).unwrap(), [(0..4, 4 << 20)]);
        assert_eq!(
            buckets(&m, 0).unwrap_err(),
            ScalingError::ZeroBytes { what: "bucket cap" }
        );
    }

    #[test]
    fn communication_hides_behind_backward_except_the_last_bucket() {
        let m = four();
        // 5 ms per bucket: the first (ready at 40 ms) ends at 45 ms, under backward; the
        // last is ready when backward ends (60 ms) and is exposed.
        let o = simulate(&m, 2 << 20, |_| 0.005, Ablation::None).unwrap();
        assert!((o.compute_s - 0.060).abs() < 1e-12);
        assert!((o.buckets[0].ready_s - 0.040).abs() < 1e-12);
        assert!((o.buckets[1].start_s - 0.060).abs() < 1e-12);
        assert!((o.step_s - 0.065).abs() < 1e-12);
        assert!((o.exposed_s - 0.005).abs() < 1e-12);
        assert!((o.comm_s - 0.010).abs() < 1e-12);
        // 30 ms per bucket: the second waits for the first (40 + 30 = 70 ms).
        let o = simulate(&m, 2 << 20, |_| 0.030, Ablation::None).unwrap();
        assert!((o.buckets[1].start_s - 0.070).abs() < 1e-12);
        assert!((o.step_s - 0.100).abs() < 1e-12);
        // One replica: nothing to hide.
        let o = simulate(&m, 2 << 20, |_| 0.0, Ablation::None).unwrap();
        assert_eq!((o.step_s, o.exposed_s), (o.compute_s, 0.0));
        // Other ablations leave the overlap alone.
        let same = simulate(&m, 2 << 20, |_| 0.005, Ablation::NoLatency).unwrap();
        assert!((same.step_s - 0.065).abs() < 1e-12);
    }

    #[test]
    fn without_overlap_every_bucket_waits_for_backward() {
        let m = four();
        let o = simulate(&m, 2 << 20, |_| 0.005, Ablation::NoOverlap).unwrap();
        assert!(o.buckets.iter().all(|b| (b.ready_s - 0.060).abs() < 1e-12));
        assert!((o.step_s - 0.070).abs() < 1e-12);
        assert!((o.exposed_s - 0.010).abs() < 1e-12);
    }

    #[test]
    fn the_update_runs_after_the_last_all_reduce() {
        let m = four().with_update(0.002).unwrap();
        let o = simulate(&m, 2 << 20, |_| 0.005, Ablation::None).unwrap();
        assert!((o.compute_s - 0.062).abs() < 1e-12);
        assert!((o.step_s - 0.067).abs() < 1e-12);
        assert!((o.exposed_s - 0.005).abs() < 1e-12);
    }
}
