//! Timing with warm-up, calibrated repeats and the median of the repeats.

use std::time::{Duration, Instant};

/// How long to warm up and how to repeat.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Run the function at least this long (and at least twice) before measuring.
    pub warm_up: Duration,
    /// Number of timed repeats; the median is reported.
    pub repeats: usize,
    /// Each repeat runs the function enough times to last at least this long.
    pub min_repeat: Duration,
}

/// Seconds per call over the repeats.
#[derive(Clone, Debug)]
pub struct Samples {
    /// Seconds per call of each repeat, in the order measured.
    pub per_call: Vec<f64>,
    /// Calls per repeat.
    pub calls: u64,
}

impl Samples {
    /// The median seconds per call.
    pub fn median(&self) -> f64 {
        median(&self.per_call)
    }

    /// The fastest repeat's seconds per call.
    pub fn min(&self) -> f64 {
        self.per_call.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The slowest repeat's seconds per call.
    pub fn max(&self) -> f64 {
        self.per_call.iter().copied().fold(0.0, f64::max)
    }

    /// Joins the repeats of another measurement of the same thing.
    pub fn extend(&mut self, other: &Samples) {
        self.per_call.extend_from_slice(&other.per_call);
    }
}

/// The median of `xs` (the mean of the middle two for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        0.5 * (v[mid - 1] + v[mid])
    }
}

/// Runs `f` under `plan`, propagating its first error.
pub fn measure<E>(plan: Plan, mut f: impl FnMut() -> Result<(), E>) -> Result<Samples, E> {
    let start = Instant::now();
    let mut warm_calls = 0u64;
    while warm_calls < 2 || start.elapsed() < plan.warm_up {
        f()?;
        warm_calls += 1;
    }
    let per_call = start.elapsed().as_secs_f64() / warm_calls as f64;
    let calls = ((plan.min_repeat.as_secs_f64() / per_call).ceil() as u64).max(1);
    let mut samples = Samples {
        per_call: Vec::with_capacity(plan.repeats),
        calls,
    };
    for _ in 0..plan.repeats.max(1) {
        let t = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        samples
            .per_call
            .push(t.elapsed().as_secs_f64() / calls as f64);
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn measure_calibrates_calls_and_repeats() {
        let plan = Plan {
            warm_up: Duration::ZERO,
            repeats: 3,
            min_repeat: Duration::from_micros(50),
        };
        let mut n = 0u64;
        let s = measure::<()>(plan, || {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(s.per_call.len(), 3);
        assert!(s.calls >= 1);
        assert_eq!(n, 2 + 3 * s.calls);
    }
}
