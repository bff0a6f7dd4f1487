//! A process-wide cache of freed host buffers.
//!
//! A training step allocates the same buffer sizes every time. Large buffers come from
//! `mmap` in the system allocator, so freeing and re-allocating them costs page faults on
//! every step. Recycling them by exact size makes a warmed-up step allocation-free. The
//! cache is shared by all threads because buffers often die on another thread than the
//! one that made them (a prefetch thread makes batches, the training thread drops them);
//! a per-thread cache would hoard those. The lock is held for a hash lookup only.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
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

/// Freed buffers by length in words, each with the stamp of its return (oldest first).
#[derive(Default)]
struct Cache {
    free: HashMap<usize, VecDeque<(u64, Vec<u64>)>>,
    bytes: usize,
    returns: u64,
}

impl Cache {
    /// The most recently returned buffer of `words` words, if one is cached.
    fn pop(&mut self, words: usize) -> Option<Vec<u64>> {
        let v = self.free.get_mut(&words)?.pop_back()?.1;
        self.bytes -= words * 8;
        Some(v)
    }

    /// Caches `v`, evicting the least recently returned buffers while it would not fit
    /// under `limit` bytes; returns what was evicted (to be freed outside the lock). A
    /// buffer larger than the limit is returned itself. Keeping the newest, not the
    /// oldest: after a phase that used other sizes (a benchmark's large matrices, a
    /// validation pass), the sizes in use now are the ones worth keeping.
    fn put(&mut self, v: Vec<u64>, limit: usize) -> Vec<Vec<u64>> {
        let bytes = v.len() * 8;
        if v.is_empty() || bytes > limit {
            return vec![v];
        }
        let mut evicted = Vec::new();
        while self.bytes + bytes > limit {
            let oldest = self
                .free
                .iter()
                .filter_map(|(&w, q)| q.front().map(|(stamp, _)| (*stamp, w)))
                .min();
            let Some((_, w)) = oldest else { break };
            let q = self.free.get_mut(&w).expect("a size just seen");
            if let Some((_, old)) = q.pop_front() {
                self.bytes -= old.len() * 8;
                evicted.push(old);
            }
            if q.is_empty() {
                self.free.remove(&w);
            }
        }
        self.returns += 1;
        self.bytes += bytes;
        self.free
            .entry(v.len())
            .or_default()
            .push_back((self.returns, v));
        evicted
    }
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
    let recycled = cache().pop(words);
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

/// Return a vector to the cache; the least recently returned buffers are freed when the
/// cache would hold more than its limit.
pub(crate) fn give(v: Vec<u64>) {
    let evicted = cache().put(v, cache_limit_bytes());
    drop(evicted); // freed after the lock is released
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

    #[test]
    fn a_full_cache_frees_its_least_recently_returned_buffers_to_keep_the_new_one() {
        let mut c = Cache::default();
        assert!(c.put(vec![1; 40], 100 * 8).is_empty());
        assert!(c.put(vec![2; 30], 100 * 8).is_empty());
        assert!(c.put(vec![3; 20], 100 * 8).is_empty());
        // 90 words held; 50 more evicts the oldest (40), which is enough.
        let evicted = c.put(vec![4; 50], 100 * 8);
        let lens: Vec<usize> = evicted.iter().map(Vec::len).collect();
        assert_eq!(lens, [40]);
        assert_eq!(c.bytes, 100 * 8);
        // 60 more evicts the two oldest left (30, then 20).
        let evicted = c.put(vec![5; 60], 110 * 8);
        let lens: Vec<usize> = evicted.iter().map(Vec::len).collect();
        assert_eq!(lens, [30, 20]);
        assert_eq!(c.pop(60).unwrap()[0], 5);
        assert_eq!(c.pop(50).unwrap()[0], 4);
        assert!(c.pop(40).is_none() && c.pop(30).is_none() && c.pop(20).is_none());
        assert_eq!(c.bytes, 0);
        // Larger than the limit: not cached, handed back to be freed.
        assert_eq!(c.put(vec![8; 101], 100 * 8).len(), 1);
        assert_eq!(c.bytes, 0);
        // Two of one size: the newest comes out first.
        c.put(vec![6; 10], 100 * 8);
        c.put(vec![7; 10], 100 * 8);
        assert_eq!(c.pop(10).unwrap()[0], 7);
    }
}
