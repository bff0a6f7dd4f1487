//! The cross-core exchange: the data movement of a 2-rank all-reduce alone, as a yardstick
//! beside its time.
//!
//! Two threads (ranks), each with a buffer of the message's size. Per iteration each one
//! writes its buffer afresh, publishes the iteration's number, waits for the other's, and
//! reads the other's whole buffer. Any all-reduce of `B` bytes between 2 ranks brings `B`
//! bytes of the other rank's data into each rank's core (its inputs, or half its inputs
//! and half the results), so it cannot take much less than one iteration of this. The
//! iteration also holds the fresh write of `B` local bytes, which the benchmark leaves out
//! of an all-reduce's time (inputs are written before its barrier), so the yardstick is a
//! little high, never low.
//!
//! A yardstick, not a limit: the two vCPUs of a VM may sit on one physical core one minute
//! and on two sockets the next, so it is measured in the same run as what it is set beside.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::timing::median;

/// One rank's side: its buffers, by iteration parity, and its published iteration.
struct Side {
    /// Written only by this side, read by the other after it saw the iteration published.
    /// Atomics only so that the struct is `Sync`: accessed through raw pointers, never at
    /// the same time (see [`exchange_us`]).
    buffers: [Box<[AtomicU64]>; 2],
    published: AtomicU64,
}

impl Side {
    fn new(words: usize) -> Side {
        let buffer = || (0..words).map(|_| AtomicU64::new(0)).collect();
        Side {
            buffers: [buffer(), buffer()],
            published: AtomicU64::new(0),
        }
    }
}

/// Microseconds per iteration of the exchange of `bytes` (a whole number of 8-byte words,
/// at least one) between two threads: `iters` iterations after as many warm-up ones, the
/// slower thread's time, median over `repeats`.
pub fn exchange_us(bytes: usize, iters: u64, repeats: usize) -> f64 {
    let words = (bytes / 8).max(1);
    let times: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let sides = [Side::new(words), Side::new(words)];
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..2)
                    .map(|me| {
                        let (mine, theirs) = (&sides[me], &sides[1 - me]);
                        s.spawn(move || run(mine, theirs, words, iters))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("exchange thread"))
                    .fold(0.0, f64::max)
            })
        })
        .collect();
    median(&times) * 1e6
}

/// One side's loop: seconds per timed iteration.
fn run(mine: &Side, theirs: &Side, words: usize, iters: u64) -> f64 {
    let mut sink = 0u64;
    let mut start = Instant::now();
    for i in 1..=2 * iters {
        if i == iters + 1 {
            start = Instant::now();
        }
        let parity = (i & 1) as usize;
        // SAFETY: this side alone writes its buffers. The other side read this parity's
        // buffer in iteration `i - 2`, and it published `i - 1` (which this side waited for
        // in iteration `i - 1`) only after that read: nobody reads it now.
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                mine.buffers[parity].as_ptr().cast::<u64>().cast_mut(),
                words,
            )
        };
        out.fill(i);
        mine.published.store(i, Ordering::Release);
        let mut spins = 0u32;
        while theirs.published.load(Ordering::Acquire) < i {
            spins += 1;
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        // SAFETY: the other side wrote this buffer before it published `i` (acquired
        // above) and writes it next in iteration `i + 2`, after it saw this side publish
        // `i + 1`, which this side does only after this read.
        let other = unsafe {
            std::slice::from_raw_parts(theirs.buffers[parity].as_ptr().cast::<u64>(), words)
        };
        sink = other.iter().fold(sink, |a, &x| a.wrapping_add(x));
    }
    std::hint::black_box(sink);
    start.elapsed().as_secs_f64() / iters as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_takes_time_and_more_for_more_bytes() {
        let small = exchange_us(8, 200, 3);
        let large = exchange_us(1 << 20, 20, 3);
        assert!(small > 0.0 && small.is_finite(), "{small}");
        // Moving a MiB each way costs more than a word (by far: at 20 GB/s, 50 us).
        assert!(large > small, "1 MiB {large} us, 8 bytes {small} us");
    }
}
