//! How schedules cut a buffer: chunks (one per rank) and slices (the pipelining unit).

use std::ops::Range;

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
    #[cfg(test)]
    let start = match crate::mutants::active() {
        Some(crate::mutants::Mutant::SliceOffset) if j == 1 => (start + 1).min(end),
        _ => start,
    };
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
