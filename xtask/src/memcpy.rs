//! This machine's copy rate, measured the way a collective of the same size runs: `n`
//! threads at once, each with the working set of one rank (a buffer of the message's size,
//! re-used every call), so that the copy and the collective meet the same caches, the same
//! core sharing (4 rank threads on 2 cores) and the same memory.
//!
//! Each thread copies the first half of its buffer into the second half, `calls` times
//! per repeat, with two kernels: `memcpy` (`copy_from_slice`) and a vector loop (an add of
//! +0.0 per element inside [`vectorize`], which runs at the widest vector width the CPU
//! has and which the compiler cannot turn into a `memcpy` call; the inputs hold no -0.0,
//! so it copies exactly). A repeat's rate is GB/s per thread: the bytes one thread copies
//! (counted once) over the time from the first thread's start to the last one's end, as
//! a collective's time is its slowest rank's. The curve point is the better kernel's
//! median.
//!
//! No single copy rate is a ceiling for a collective: on a VM the rate moves with the
//! working set (caches, page placement), and a collective can beat it. The benchmark
//! prints it beside each all-reduce as a yardstick.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

use mirra::device::vectorize;

use crate::timing::median;

/// How much to measure at each point.
#[derive(Clone, Copy, Debug)]
pub struct CopyPlan {
    /// Timed repeats per kernel (the median is reported).
    pub repeats: usize,
    /// Bytes each thread copies per repeat (at least one call of half the buffer).
    pub bytes_per_repeat: usize,
}

/// The copy kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Memcpy,
    VectorLoop,
}

impl Kernel {
    pub const ALL: [Kernel; 2] = [Kernel::Memcpy, Kernel::VectorLoop];

    pub const fn name(self) -> &'static str {
        match self {
            Kernel::Memcpy => "memcpy",
            Kernel::VectorLoop => "vector_loop",
        }
    }

    /// Copies `src` into `dst` (same length).
    fn copy(self, dst: &mut [f32], src: &[f32]) {
        match self {
            Kernel::Memcpy => dst.copy_from_slice(src),
            Kernel::VectorLoop => vectorize(
                #[inline(always)]
                || {
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d = *s + 0.0;
                    }
                },
            ),
        }
    }
}

/// One point of the copy curve: `threads` threads with a buffer of `bytes` each.
#[derive(Clone, Debug, PartialEq)]
pub struct CopyPoint {
    pub threads: usize,
    pub bytes: usize,
    /// GB/s (1e9 bytes) per thread of each repeat (bytes one thread copies over the span
    /// of all threads' copies), per kernel in [`Kernel::ALL`] order.
    pub gbs: [Vec<f64>; 2],
}

impl CopyPoint {
    /// The better kernel's median GB/s per thread, and that kernel.
    pub fn best(&self) -> (f64, Kernel) {
        let m = |k: usize| median(&self.gbs[k]);
        if m(1) > m(0) {
            (m(1), Kernel::VectorLoop)
        } else {
            (m(0), Kernel::Memcpy)
        }
    }
}

/// Measures one point: `threads` threads, each copying half of its own `bytes`-byte buffer
/// into the other half, concurrently. A repeat lasts from the first thread's start to the
/// last thread's end, so threads that wait for a core (more threads than cores) count as
/// a rank that waits does.
pub fn measure(bytes: usize, threads: usize, plan: CopyPlan) -> CopyPoint {
    let threads = threads.max(1);
    let half = (bytes / 8).max(1);
    let calls = plan.bytes_per_repeat.div_ceil(half * 4).max(1);
    let repeats = plan.repeats.max(1);
    let start = Barrier::new(threads);
    // Per thread: per kernel, per repeat, when its copies started and ended.
    let per_thread: Vec<[Vec<(Instant, Instant)>; 2]> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let start = &start;
                s.spawn(move || {
                    // Each thread owns and first-touches its buffer, as a rank does.
                    let mut buf: Vec<f32> = (0..2 * half).map(|i| (i % 1024) as f32).collect();
                    let (src, dst) = buf.split_at_mut(half);
                    let mut spans: [Vec<(Instant, Instant)>; 2] = [Vec::new(), Vec::new()];
                    for (k, kernel) in Kernel::ALL.into_iter().enumerate() {
                        kernel.copy(dst, src); // warm-up: caches and the code path
                        for _ in 0..repeats {
                            start.wait();
                            let t = Instant::now();
                            for _ in 0..calls {
                                kernel.copy(black_box(&mut *dst), black_box(&*src));
                            }
                            spans[k].push((t, Instant::now()));
                        }
                    }
                    assert!(dst == src, "the copy kernels copy exactly");
                    spans
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let copied = (half * 4 * calls) as f64;
    let gbs = std::array::from_fn(|k| {
        (0..repeats)
            .map(|r| {
                let first = per_thread.iter().map(|t| t[k][r].0).min();
                let last = per_thread.iter().map(|t| t[k][r].1).max();
                let span = first
                    .zip(last)
                    .map_or(0.0, |(a, b)| b.duration_since(a).as_secs_f64());
                copied / span.max(1e-9) / 1e9
            })
            .collect()
    });
    CopyPoint {
        threads,
        bytes,
        gbs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kernels_copy_exactly() {
        let src: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
        for kernel in Kernel::ALL {
            let mut dst = vec![f32::NAN; 1000];
            kernel.copy(&mut dst, &src);
            assert_eq!(dst, src, "{kernel:?}");
        }
    }

    #[test]
    fn a_point_has_a_rate_per_kernel_and_repeat() {
        let plan = CopyPlan {
            repeats: 3,
            bytes_per_repeat: 1 << 20,
        };
        for threads in [1, 2, 3] {
            let p = measure(64 << 10, threads, plan);
            assert_eq!((p.threads, p.bytes), (threads, 64 << 10));
            for rates in &p.gbs {
                assert_eq!(rates.len(), 3);
                assert!(rates.iter().all(|x| *x > 0.0 && x.is_finite()), "{rates:?}");
            }
            let (best, kernel) = p.best();
            let m = |k: Kernel| median(&p.gbs[k as usize]);
            assert_eq!(best, m(kernel));
            assert!(best >= m(Kernel::Memcpy) && best >= m(Kernel::VectorLoop));
        }
    }
}
