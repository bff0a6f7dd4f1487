//! This machine's memory-copy bandwidth: the physical limit of a shared-memory
//! all-reduce, whose every byte must be read from one buffer and written to another.

use std::convert::Infallible;
use std::hint::black_box;

use crate::timing::{measure, Plan, Samples};

/// Bandwidth of copying `bytes` of f32 from one buffer into another with `threads`
/// threads (each copies its share), bytes counted once, in GB/s (1e9 bytes) per repeat.
pub fn measure_gbs(bytes: usize, threads: usize, plan: Plan) -> Samples {
    let len = bytes / 4;
    let src: Vec<f32> = (0..len).map(|i| (i % 1024) as f32).collect();
    // Written once so that the timed copies do not pay its page faults.
    let mut dst = vec![1.0f32; len];
    let threads = threads.max(1);
    let share = len.div_ceil(threads).max(1);
    let samples = measure::<Infallible>(plan, || {
        if threads == 1 {
            dst.copy_from_slice(&src);
        } else {
            std::thread::scope(|s| {
                for (d, c) in dst.chunks_mut(share).zip(src.chunks(share)) {
                    s.spawn(move || d.copy_from_slice(c));
                }
            });
        }
        black_box(&mut dst);
        Ok(())
    })
    .unwrap_or_else(|never| match never {});
    Samples {
        per_call: samples
            .per_call
            .iter()
            .map(|s| bytes as f64 / s / 1e9)
            .collect(),
        calls: samples.calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn copies_have_a_positive_bandwidth() {
        let plan = Plan {
            warm_up: Duration::ZERO,
            repeats: 3,
            min_repeat: Duration::ZERO,
        };
        for threads in [1, 2, 3] {
            let s = measure_gbs(1 << 20, threads, plan);
            assert_eq!(s.per_call.len(), 3);
            assert!(s.median() > 0.0 && s.median().is_finite());
        }
    }
}
