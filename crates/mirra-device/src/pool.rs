//! A per-thread cache of freed host buffers.
//!
//! A training step allocates the same buffer sizes every time. Large buffers come from
//! `mmap` in the system allocator, so freeing and re-allocating them costs page faults on
//! every step. Recycling them by exact size makes a warmed-up step allocation-free. The
//! cache is per thread so that replica threads never contend on it.

use std::cell::RefCell;
use std::collections::HashMap;

/// Bytes one thread keeps cached at most (`MIRRA_POOL_BYTES`, default 256 MiB).
fn cache_limit_bytes() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
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
    stats: PoolStats,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// Counts of buffer requests served from the cache (`hits`) and from the allocator
/// (`misses`) on one thread since it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Requests served by a recycled buffer.
    pub hits: u64,
    /// Requests that went to the system allocator.
    pub misses: u64,
}

/// The calling thread's pool counters.
pub fn pool_stats() -> PoolStats {
    CACHE.try_with(|c| c.borrow().stats).unwrap_or_default()
}

/// A vector of exactly `words` words with unspecified (but initialised) contents.
pub(crate) fn take(words: usize) -> Vec<u64> {
    if words == 0 {
        return Vec::new();
    }
    let recycled = CACHE
        .try_with(|c| {
            let mut c = c.borrow_mut();
            let v = c.free.get_mut(&words).and_then(Vec::pop);
            if v.is_some() {
                c.bytes -= words * 8;
                c.stats.hits += 1;
            } else {
                c.stats.misses += 1;
            }
            v
        })
        .ok()
        .flatten();
    recycled.unwrap_or_else(|| vec![0u64; words])
}

/// Return a vector to this thread's cache, or free it when the cache is full.
pub(crate) fn give(v: Vec<u64>) {
    let words = v.len();
    if words == 0 || words * 8 > cache_limit_bytes() {
        return;
    }
    let _ = CACHE.try_with(|c| {
        let mut c = c.borrow_mut();
        if c.bytes + words * 8 <= cache_limit_bytes() {
            c.bytes += words * 8;
            c.free.entry(words).or_default().push(v);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_buffer_is_reused_by_the_next_request_of_its_size() {
        let v = take(1000);
        let ptr = v.as_ptr();
        give(v);
        let before = pool_stats();
        let w = take(1000);
        assert_eq!(w.as_ptr(), ptr);
        assert_eq!(pool_stats().hits, before.hits + 1);
        assert_eq!(w.len(), 1000);
    }
}
