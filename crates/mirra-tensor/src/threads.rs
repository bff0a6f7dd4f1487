//! The thread budget of the kernels that parallelise (matmul), per calling thread, so
//! that each replica thread of a mirrored strategy can have its own.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use mirra_device::denormals;

thread_local! {
    static THREADS: Cell<usize> = const { Cell::new(0) };
}

/// Threads a kernel called from this thread may use: set by [`set_num_threads`] on this
/// thread, else `MIRRA_NUM_THREADS`, else the machine's available parallelism.
pub fn num_threads() -> usize {
    THREADS.with(|t| match t.get() {
        0 => {
            let n = default_threads();
            t.set(n);
            n
        }
        n => n,
    })
}

/// Set the number of threads (at least 1) that kernels called from this thread may use.
pub fn set_num_threads(n: usize) {
    THREADS.with(|t| t.set(n.max(1)));
}

fn default_threads() -> usize {
    std::env::var("MIRRA_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Applies the subnormal-flushing policy ([`mirra_device::denormals`]) to every thread of
/// rayon's global pool, where gemm runs a parallel matmul, when the policy changed since
/// the last time (one atomic read otherwise).
pub(crate) fn ensure_rayon_pool() {
    static APPLIED: AtomicU64 = AtomicU64::new(0);
    let generation = denormals::policy_generation();
    if APPLIED.load(Ordering::Acquire) != generation {
        rayon::broadcast(|_| denormals::ensure_this_thread());
        APPLIED.store(generation, Ordering::Release);
    }
}
