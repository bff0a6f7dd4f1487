//! `shuffle` with `tf.data`'s semantics: a buffer of the next `buffer_size` elements,
//! from which each output is drawn uniformly and refilled from the input.
//!
//! The generator is seeded from the dataset's seed and the epoch (or repetition), so each
//! epoch has its own order and a run can be replayed exactly.

use mirra_tensor::init::{self, Rng};
use rand::RngExt as _;

use super::element::{Elem, ElemIter};
use crate::Result;

/// SplitMix64's finaliser: a bijection that scatters nearby inputs.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One 64-bit value from two, so that (seed, epoch) pairs give unrelated streams.
pub(super) fn mix(a: u64, b: u64) -> u64 {
    splitmix(a ^ splitmix(b))
}

/// `input` shuffled through a buffer of `buffer` elements (at least 1).
pub(super) fn shuffle(input: ElemIter, buffer: usize, seed: u64, key: u64) -> ElemIter {
    Box::new(Shuffle {
        input,
        buf: Vec::new(),
        capacity: buffer,
        rng: init::rng(mix(seed, key)),
        input_done: false,
    })
}

struct Shuffle {
    input: ElemIter,
    buf: Vec<Elem>,
    capacity: usize,
    rng: Rng,
    input_done: bool,
}

impl Shuffle {
    /// The next input element, noting the end of the input.
    fn pull(&mut self) -> Option<Result<Elem>> {
        if self.input_done {
            return None;
        }
        let e = self.input.next();
        self.input_done = e.is_none();
        e
    }
}

impl Iterator for Shuffle {
    type Item = Result<Elem>;

    fn next(&mut self) -> Option<Result<Elem>> {
        while self.buf.len() < self.capacity {
            match self.pull() {
                Some(Ok(e)) => self.buf.push(e),
                Some(Err(e)) => return Some(Err(e)),
                None => break,
            }
        }
        if self.buf.is_empty() {
            return None;
        }
        let j = self.rng.random_range(0..self.buf.len());
        // Keep the buffer full while the input lasts: the drawn slot takes the next one.
        match self.pull() {
            Some(Ok(e)) => Some(Ok(std::mem::replace(&mut self.buf[j], e))),
            Some(Err(e)) => Some(Err(e)),
            None => Some(Ok(self.buf.swap_remove(j))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{collect, labels, numbered};

    fn sorted(mut v: Vec<i64>) -> Vec<i64> {
        v.sort_unstable();
        v
    }

    #[test]
    fn shuffle_is_a_permutation_fixed_by_seed_and_epoch() {
        let ds = numbered(100).shuffle(1000, 42);
        let e0 = labels(&ds, 0);
        assert_eq!(sorted(e0.clone()), (0..100).collect::<Vec<_>>());
        assert_ne!(e0, (0..100).collect::<Vec<_>>());
        assert_eq!(labels(&ds, 0), e0, "same seed and epoch, same order");
        assert_eq!(labels(&ds.clone(), 0), e0);
        let e1 = labels(&ds, 1);
        assert_ne!(e1, e0, "each epoch reshuffles");
        assert_eq!(sorted(e1), sorted(e0.clone()));
        assert_ne!(labels(&numbered(100).shuffle(1000, 43), 0), e0);
        // Rows stay whole: x[i] = [i, -i] travels with y[i] = i.
        for e in collect(&ds, 3) {
            assert_eq!(e[0], [e[1][0], -e[1][0]]);
        }
    }

    #[test]
    fn a_small_buffer_only_moves_elements_locally() {
        let ds = numbered(50).shuffle(3, 0);
        let order = labels(&ds, 0);
        assert_eq!(sorted(order.clone()), (0..50).collect::<Vec<_>>());
        // Output k is drawn from the buffer holding inputs 0..=k+2.
        for (k, &v) in order.iter().enumerate() {
            assert!(v <= k as i64 + 2, "output {k} is {v}");
        }
        assert_eq!(
            labels(&numbered(10).shuffle(1, 9), 0),
            (0..10).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_full_buffer_draws_every_position_uniformly() {
        // Over many epochs, each value lands in position 0 about equally often.
        let ds = numbered(4).shuffle(4, 5);
        let mut first = [0usize; 4];
        for epoch in 0..4000 {
            first[labels(&ds, epoch)[0] as usize] += 1;
        }
        assert!(first.iter().all(|&c| (850..1150).contains(&c)), "{first:?}");
    }
}
