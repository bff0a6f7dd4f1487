//! A process-wide cache of freed host buffers.
//!
//! A training step allocates the same buffer sizes every time. Large buffers come from
//! `mmap` in the system allocator, so freeing and re-allocating them costs page faults on
//! every step. Recycling them by exact size makes a warmed-up step allocation-free. The
//! cache is shared by all threads because buffers often die on another thread than the
//! one that made them (a prefetch thread makes batches, the training thread drops them);
//! a per-thread cache would hoard those. The lock is held for a hash lookup only.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Bytes the cache keeps at most (`MIRRA_POOL_BYTES`, default 256 MiB).
fn cache_limit_bytes() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("MIRRA_POOL_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256 << 20)
    })
}

#[derive(Default)]
struct Cache {
    free: HashMap<usize, Vec<Vec<u64>>>,
    bytes: usize,
}

static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();

fn cache() -> std::sync::MutexGuard<'static, Cache> {
    let m = CACHE.get_or_init(|| Mutex::new(Cache::default()));
    // A panic while holding the lock leaves the cache consistent (only pushes and pops).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    static STATS: Cell<PoolStats> = const { Cell::new(PoolStats { hits: 0, misses: 0 }) };
}

/// Counts of buffer requests made by one thread that were served from the cache (`hits`)
/// and from the allocator (`misses`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Requests served by a recycled buffer.
    pub hits: u64,
    /// Requests that went to the system allocator.
    pub misses: u64,
}

/// The calling thread's pool counters.
pub fn pool_stats() -> PoolStats {
    STATS.try_with(Cell::get).unwrap_or_default()
}

/// A vector of exactly `words` words with unspecified (but initialised) contents.
pub(crate) fn take(words: usize) -> Vec<u64> {
    if words == 0 {
        return Vec::new();
    }
    let recycled = {
        let mut c = cache();
        let v = c.free.get_mut(&words).and_then(Vec::pop);
        if v.is_some() {
            c.bytes -= words * 8;
        }
        v
    };
    let _ = STATS.try_with(|s| {
        let mut st = s.get();
        if recycled.is_some() {
            st.hits += 1;
        } else {
            st.misses += 1;
        }
        s.set(st);
    });
    recycled.unwrap_or_else(|| vec![0u64; words])
}

/// Return a vector to the cache, or free it when the cache is full.
pub(crate) fn give(v: Vec<u64>) {
    let words = v.len();
    let limit = cache_limit_bytes();
    if words == 0 || words * 8 > limit {
        return;
    }
    let mut c = cache();
    if c.bytes + words * 8 <= limit {
        c.bytes += words * 8;
        c.free.entry(words).or_default().push(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_buffer_is_reused_by_the_next_request_of_its_size() {
        // A size no other test uses, so concurrent tests cannot take it in between.
        let v = take(1009);
        let ptr = v.as_ptr();
        give(v);
        let before = pool_stats();
        let w = take(1009);
        assert_eq!(w.as_ptr(), ptr);
        assert_eq!(pool_stats().hits, before.hits + 1);
        assert_eq!(w.len(), 1009);
    }
}
