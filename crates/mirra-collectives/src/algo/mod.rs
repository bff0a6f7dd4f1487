//! The algorithms: each one a schedule over the shared transport ([`Ctx`]), NCCL style:
//! topology arithmetic (neighbours, parents, children, chunk boundaries) and the order of
//! waits, reductions and copies, with no knowledge of how ranks find each other, wait or
//! fail. A new algorithm is one new module implementing [`Algorithm`] and one line in
//! [`by_name`].
//!
//! Only all-reduce differs between algorithms today; reduce-scatter, all-gather,
//! broadcast and reduce use the shared direct schedules of [`direct`] unless an algorithm
//! overrides them.

use std::ops::Range;

use crate::transport::{Ctx, Stop};

pub(crate) mod direct;
pub(crate) mod one_pass;
pub(crate) mod reduce_to_one;
pub(crate) mod ring;
pub(crate) mod tree;

/// The names [`cpu_group`](crate::cpu_group) accepts, in the order benchmarks list them.
pub const BACKENDS: &[&str] = &["ring", "tree", "reduce-to-one", "direct"];

/// One algorithm's schedules. Each runs inside a data phase: every rank has posted its
/// buffers, the metadata agrees across ranks, and no buffer is freed before every rank has
/// left the phase. A schedule returns `Err` only from a wait or an abort check.
pub(crate) trait Algorithm: Sync {
    /// The backend name.
    fn name(&self) -> &'static str;

    /// In-place all-reduce of every rank's buffer (`recv_len` elements).
    fn all_reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop>;

    /// Reduce-scatter: send has `world x count`, recv `count` elements.
    fn reduce_scatter(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        direct::reduce_scatter(ctx)
    }

    /// All-gather: recv has `world x count`, send `count` elements.
    fn all_gather(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        direct::all_gather(ctx)
    }

    /// In-place broadcast from `ctx.root()`.
    fn broadcast(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        direct::broadcast(ctx)
    }

    /// In-place reduce to `ctx.root()`.
    fn reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        direct::reduce(ctx)
    }
}

/// The algorithm of a backend name.
pub(crate) fn by_name(name: &str) -> Option<&'static dyn Algorithm> {
    match name {
        "ring" => Some(&ring::Ring),
        "tree" => Some(&tree::DoubleBinaryTree),
        "reduce-to-one" => Some(&reduce_to_one::ReduceToOne),
        "direct" => Some(&one_pass::OnePass),
        _ => None,
    }
}

/// Chunk `i` of `len` elements split `n` ways: `[i * len / n, (i + 1) * len / n)`, so any
/// length works (chunks differ by at most one element; some are empty when `len < n`).
pub(crate) fn chunk(len: usize, n: usize, i: usize) -> Range<usize> {
    let at = |k: usize| (k as u128 * len as u128 / n as u128) as usize;
    at(i)..at(i + 1)
}

/// Slice `j` of `range` cut into slices of `per` elements (empty past the end).
pub(crate) fn slice(range: &Range<usize>, per: usize, j: usize) -> Range<usize> {
    let start = range
        .start
        .saturating_add(j.saturating_mul(per))
        .min(range.end);
    let end = start.saturating_add(per).min(range.end);
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_any_length_exactly_once() {
        for n in 1..=9 {
            for len in [0, 1, 3, 4, 7, 100, 1001] {
                let mut next = 0;
                for i in 0..n {
                    let c = chunk(len, n, i);
                    assert_eq!(c.start, next);
                    assert!(c.len() <= len / n + 1);
                    next = c.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn slices_cover_a_chunk() {
        let r = 10..35;
        let parts: Vec<_> = (0..4).map(|j| slice(&r, 8, j)).collect();
        assert_eq!(parts, vec![10..18, 18..26, 26..34, 34..35]);
        assert_eq!(slice(&r, 8, 9), 35..35);
    }
}
