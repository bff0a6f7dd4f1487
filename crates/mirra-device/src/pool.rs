//! A process-wide cache of freed host buffers.
//!
//! A training step allocates the same buffer sizes every time. Large buffers come from
//! `mmap` in the system allocator, so freeing and re-allocating them costs page faults
//! and zeroing on every step. Recycling them by exact size makes a warmed-up step
//! allocation-free. The cache is shared by all threads because buffers often die on
//! another thread than the one that made them (a prefetch thread makes batches, the
//! training thread drops them); a per-thread cache would hoard those. The lock is held for
//! a hash lookup only.
//!
//! How much it keeps: live and cached buffers together never more than twice what the
//! process has had in live buffers at its peak ([`RESERVE_OVER_PEAK`]: exact sizes need
//! room for the sizes to come while others are live), and at least `MIRRA_POOL_BYTES`
//! (default 256 MiB) cached when that is more (0 turns the cache off). A network whose
//! step needs a gigabyte (ResNet-20 at batch 128) would otherwise return most of it to the
//! system and fault it back in every step.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};

/// Bytes the cache may keep whatever the peak (`MIRRA_POOL_BYTES`, default 256 MiB).
fn cache_floor_bytes() -> usize {
    static FLOOR: OnceLock<usize> = OnceLock::new();
    *FLOOR.get_or_init(|| {
        std::env::var("MIRRA_POOL_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256 << 20)
    })
}

/// Freed buffers by length in words, each with the stamp of its return (oldest first),
/// and the bytes of the buffers handed out and not yet returned.
#[derive(Default)]
struct Cache {
    free: HashMap<usize, VecDeque<(u64, Vec<u64>)>>,
    bytes: usize,
    returns: u64,
    live: usize,
    peak_live: usize,
}

impl Cache {
    /// The most recently returned buffer of `words` words, if one is cached.
    fn pop(&mut self, words: usize) -> Option<Vec<u64>> {
        let v = self.free.get_mut(&words)?.pop_back()?.1;
        self.bytes -= words * 8;
        Some(v)
    }

    /// What the cache may hold now: twice the peak of live bytes less those live now, or
    /// `floor` if that is more; nothing when `floor` is 0 (the cache turned off, as
    /// AddressSanitizer runs need).
    fn limit(&self, floor: usize) -> usize {
        if floor == 0 {
            return 0;
        }
        (RESERVE_OVER_PEAK * self.peak_live - self.live).max(floor)
    }

    /// Counts `words` more words handed out.
    fn lend(&mut self, words: usize) {
        self.live += words * 8;
        self.peak_live = self.peak_live.max(self.live);
    }

    /// Evicts the least recently returned buffers until the cache holds at most `limit`
    /// bytes and `extra` more would fit; returns them (to be freed outside the lock).
    fn evict(&mut self, extra: usize, limit: usize) -> Vec<Vec<u64>> {
        let mut evicted = Vec::new();
        while self.bytes + extra > limit {
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
        evicted
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
        let evicted = self.evict(bytes, limit);
        self.returns += 1;
        self.bytes += bytes;
        self.free
            .entry(v.len())
            .or_default()
            .push_back((self.returns, v));
        evicted
    }
}

/// How many times the peak of live bytes the live and cached buffers may hold together.
/// Recycling by exact size needs more than the peak: a step's sizes are not all live at
/// once, so the buffers of the sizes to come wait in the cache while others are live.
/// With a budget of the peak alone, ResNet-20 at batch 128 missed the cache 35 times a
/// step, each miss evicting a buffer that a later allocation wanted; without a limit its
/// live and cached buffers settled at 1.8 times the peak, with no miss (2026-12-07).
const RESERVE_OVER_PEAK: usize = 2;

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

/// Bytes of host buffers handed out and not yet returned, process-wide: what the
/// process's tensors hold now (a benchmark's activation memory is the rise of this over a
/// forward pass: what the tape keeps for backward).
pub fn live_bytes() -> usize {
    cache().live
}

/// A vector of exactly `words` words with unspecified (but initialised) contents.
pub(crate) fn take(words: usize) -> Vec<u64> {
    if words == 0 {
        return Vec::new();
    }
    let (recycled, evicted) = {
        let mut c = cache();
        let recycled = c.pop(words);
        c.lend(words);
        // A new allocation may have lowered what the cache may hold.
        let evicted = if recycled.is_none() {
            let limit = c.limit(cache_floor_bytes());
            c.evict(0, limit)
        } else {
            Vec::new()
        };
        (recycled, evicted)
    };
    drop(evicted); // freed after the lock is released
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

/// Return a vector that [`take`] handed out to the cache; the least recently returned
/// buffers are freed when the cache would hold more than its limit.
pub(crate) fn give(v: Vec<u64>) {
    let evicted = {
        let mut c = cache();
        c.live -= (v.len() * 8).min(c.live);
        let limit = c.limit(cache_floor_bytes());
        c.put(v, limit)
    };
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

    #[test]
    fn live_and_cached_buffers_hold_at_most_twice_the_peak() {
        let mut c = Cache::default();
        let floor = 10 * 8;
        // A step that needs 100 words at once: 40, 30 and 30 live together.
        c.lend(40);
        c.lend(30);
        c.lend(30);
        assert_eq!((c.live, c.peak_live), (800, 800));
        assert_eq!(
            c.limit(floor),
            800,
            "all of the peak is live: room for as much again"
        );
        // Returned one by one, all three are kept.
        for words in [40, 30, 30] {
            c.live -= words * 8;
            let limit = c.limit(floor);
            assert!(c.put(vec![0; words], limit).is_empty());
            assert!(c.bytes + c.live <= 2 * c.peak_live);
        }
        assert_eq!(c.bytes, 800);
        // The next step takes them again: every request is served from the cache.
        for words in [40, 30, 30] {
            assert!(c.pop(words).is_some());
            c.lend(words);
        }
        assert_eq!(c.bytes, 0);
        // With the fixed floor alone (the first policy) the 100 words would not fit.
        let mut old = Cache::default();
        let evicted: usize = [40, 30, 30]
            .into_iter()
            .map(|w| old.put(vec![0; w], floor).len())
            .sum();
        assert_eq!(evicted, 3, "each buffer is larger than the floor");
    }

    #[test]
    fn sizes_to_come_wait_beside_live_ones_and_the_oldest_go_past_twice_the_peak() {
        let mut c = Cache::default();
        let floor = 8;
        // Phase A: 100 words live at once (the peak), returned.
        c.lend(100);
        c.live -= 100 * 8;
        assert!(c.put(vec![0; 100], c.limit(floor)).is_empty());
        // Phase B, other sizes, 60 then 40 words: the 100 cached words stay beside them (a
        // budget of the peak alone evicted them here, and phase A missed them next time).
        for words in [60, 40] {
            assert!(c.pop(words).is_none());
            c.lend(words);
            assert!(c.evict(0, c.limit(floor)).is_empty());
        }
        for words in [60, 40] {
            c.live -= words * 8;
            assert!(c.put(vec![0; words], c.limit(floor)).is_empty());
        }
        assert_eq!(c.bytes, 200 * 8);
        // Phase C, 70 words of a new size: live and cached would pass twice the peak, so
        // the least recently returned (phase A's 100 words) goes.
        assert!(c.pop(70).is_none());
        c.lend(70);
        let evicted = c.evict(0, c.limit(floor));
        assert_eq!(evicted.iter().map(Vec::len).collect::<Vec<_>>(), vec![100]);
        assert!(c.bytes + c.live <= 2 * c.peak_live);
        // A floor of 0 turns the cache off whatever the peak.
        c.live = 0;
        assert_eq!(c.limit(0), 0);
    }
}
