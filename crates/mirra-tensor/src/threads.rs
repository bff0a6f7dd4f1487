//! The thread budget of the kernels that parallelise (matmul, convolutions' patches,
//! per-channel statistics), per calling thread, so that each replica thread of a
//! mirrored strategy can have its own; and the two ways those kernels split their work.

use std::cell::Cell;

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

thread_local! {
    /// The rayon pool this thread is worker 0 of ([`ensure_rayon_pool`]), kept for the
    /// thread's life; dropping it at thread exit ends its other workers.
    static KERNEL_POOL: std::cell::RefCell<Option<rayon::ThreadPool>> =
        const { std::cell::RefCell::new(None) };
    /// The subnormal policy generation last applied to this thread's pool.
    static APPLIED: Cell<u64> = const { Cell::new(0) };
}

/// Makes sure a parallel kernel called from this thread runs on a rayon pool this thread
/// belongs to, with the subnormal-flushing policy ([`mirra_device::denormals`]) applied
/// to every one of its threads (one thread-local read once done).
///
/// A thread outside any pool becomes worker 0 of a pool of its own with
/// [`num_threads`] threads (rayon's `use_current_thread`), built the first time. A
/// parallel region then hands half of its work to the other workers and does the rest
/// itself, instead of injecting the whole of it into the global pool and sleeping until
/// the global pool's threads, woken, have finished: on the 2-core development VMs that
/// round trip of wake-ups cost more than a second thread saved on the MLP's matmuls.
/// Each replica thread of a mirrored strategy gets its own pool this way, sized by its
/// own thread budget. The pool keeps the size it was built with: a later
/// [`set_num_threads`] on this thread splits kernels into that many parts, run by the
/// pool's workers. Where the pool cannot be built (no thread can be spawned), kernels
/// run on rayon's global pool, as they did before.
pub(crate) fn ensure_rayon_pool() {
    if rayon::current_thread_index().is_none() {
        KERNEL_POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            if pool.is_none() {
                *pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(num_threads())
                    .thread_name(|i| format!("mirra-kernels-{i}"))
                    .use_current_thread()
                    .build()
                    .ok();
            }
        });
    }
    let generation = denormals::policy_generation();
    if APPLIED.with(Cell::get) != generation {
        rayon::broadcast(|_| denormals::ensure_this_thread());
        APPLIED.with(|a| a.set(generation));
    }
}

/// Runs `a` and `b` at once on this thread's kernel pool ([`ensure_rayon_pool`]), `a` on
/// this thread with a kernel budget of `split.0` threads, `b` on whichever worker takes
/// it (this one too, when none is free) with `split.1`; each thread's budget is restored
/// afterwards. For independent pieces of work too small to parallelise inside (a
/// deterministic replica's micro-batches): the pool's threads are already running, where
/// a freshly spawned thread may wait for a core until its parent is done.
pub fn join<RA: Send, RB: Send>(
    split: (usize, usize),
    a: impl FnOnce() -> RA + Send,
    b: impl FnOnce() -> RB + Send,
) -> (RA, RB) {
    ensure_rayon_pool();
    let with_budget = |n: usize, f: &mut dyn FnMut()| {
        let before = THREADS.with(Cell::get);
        set_num_threads(n);
        f();
        THREADS.with(|t| t.set(before));
    };
    let (mut ra, mut rb) = (None, None);
    let (mut a, mut b) = (Some(a), Some(b));
    rayon::join(
        || with_budget(split.0, &mut || ra = a.take().map(|a| a())),
        || with_budget(split.1, &mut || rb = b.take().map(|b| b())),
    );
    (
        ra.expect("rayon::join ran the first half"),
        rb.expect("rayon::join ran the second half"),
    )
}

/// Elements moved below which a loop stays on the calling thread (waking a parked pool
/// thread costs 0.1-0.8 ms on the development machines).
pub(crate) const PARALLEL_MIN: usize = 1 << 20;

/// How many of `units` (rows, items) each kernel thread takes when `work` elements are
/// worth waking them for, with this thread's pool ready; `None`: run them all here. The
/// one decision behind every split below.
fn per_thread(units: usize, work: usize) -> Option<usize> {
    let threads = num_threads();
    if threads <= 1 || work < PARALLEL_MIN || units < 2 {
        return None;
    }
    ensure_rayon_pool();
    Some(units.div_ceil(threads))
}

/// Runs `f(first_row, rows)` over `data` cut into rows of `row` elements, on this thread's
/// kernel threads ([`num_threads`](crate::num_threads)) when there is enough to move, each
/// call with a run of whole rows and the index of its first.
pub(crate) fn split_rows<E: Send>(
    data: &mut [E],
    row: usize,
    f: &(dyn Fn(usize, &mut [E]) + Sync),
) {
    split_rows_by_work(data, row, data.len(), f)
}

/// [`split_rows`] for a kernel whose work is not the size of what it writes: `work`
/// elements read or written in all (a pooling window's taps, a gradient's patches)
/// decides whether the kernel threads are worth waking.
pub(crate) fn split_rows_by_work<E: Send>(
    data: &mut [E],
    row: usize,
    work: usize,
    f: &(dyn Fn(usize, &mut [E]) + Sync),
) {
    let Some(per) = per_thread(data.len() / row.max(1), work) else {
        f(0, data);
        return;
    };
    rayon::scope(|s| {
        for (i, part) in data.chunks_mut(per * row).enumerate() {
            s.spawn(move |_| f(i * per, part));
        }
    });
}

/// What [`split_row_pairs`] runs: `f(first_row, a_rows, b_rows)`.
pub(crate) type RowPairs<'f, A, B> = dyn Fn(usize, &mut [A], &mut [B]) + Sync + 'f;

/// [`split_rows_by_work`] over two outputs written row by row together (a pooling's
/// values and winners): `f(first_row, a_rows, b_rows)` with the same rows of each, `a`
/// cut into rows of `row_a` elements and `b` of `row_b`.
pub(crate) fn split_row_pairs<A: Send, B: Send>(
    (a, row_a): (&mut [A], usize),
    (b, row_b): (&mut [B], usize),
    work: usize,
    f: &RowPairs<'_, A, B>,
) {
    let Some(per) = per_thread(a.len() / row_a.max(1), work) else {
        f(0, a, b);
        return;
    };
    rayon::scope(|s| {
        let parts = a.chunks_mut(per * row_a).zip(b.chunks_mut(per * row_b));
        for (i, (a, b)) in parts.enumerate() {
            s.spawn(move |_| f(i * per, a, b));
        }
    });
}

/// Runs `f` on every item of `items`, cut into one contiguous run per kernel thread when
/// `work` (elements moved in all) is enough to be worth waking them; in order on this
/// thread otherwise. Which thread runs an item never changes what it computes.
pub(crate) fn for_each_split<I: Send>(items: Vec<I>, work: usize, f: &(dyn Fn(I) + Sync)) {
    let Some(per) = per_thread(items.len(), work) else {
        items.into_iter().for_each(f);
        return;
    };
    let mut items = items.into_iter();
    rayon::scope(|s| loop {
        let run: Vec<I> = items.by_ref().take(per).collect();
        if run.is_empty() {
            break;
        }
        s.spawn(move |_| run.into_iter().for_each(f));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that runs a parallel kernel becomes worker 0 of a pool of its own
    /// threads, and the policy reaches every one of them.
    #[test]
    fn a_kernel_thread_gets_a_pool_of_its_own() {
        std::thread::spawn(|| {
            set_num_threads(3);
            assert_eq!(rayon::current_thread_index(), None);
            ensure_rayon_pool();
            assert_eq!(rayon::current_thread_index(), Some(0));
            assert_eq!(rayon::current_num_threads(), 3);
            let names: Vec<Option<String>> =
                rayon::broadcast(|_| std::thread::current().name().map(String::from));
            assert_eq!(names[1].as_deref(), Some("mirra-kernels-1"));
            assert_eq!(names[2].as_deref(), Some("mirra-kernels-2"));
            // Work split in the pool runs on its threads and gives the serial result.
            use rayon::prelude::*;
            let total: u64 = (0..100_000u64).into_par_iter().map(|x| x * x).sum();
            assert_eq!(total, (0..100_000u64).map(|x| x * x).sum());
        })
        .join()
        .unwrap();
    }
}
