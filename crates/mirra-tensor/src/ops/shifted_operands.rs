//! What the shifted convolution's own kernels read, and how they cut a run of output rows
//! into register blocks: shared by every instruction set's kernels (`shifted_avx512` in
//! f32, `shifted_avx512_bf16` in bf16), which implement the products on these operands.
//!
//! The bounds every kernel relies on are checked here once per call, before any unsafe
//! read.

/// A sum of shifted products over runs of grid positions `step` apart: output row `r` of
/// a run starting at grid row `g` is
/// `Σ_p Σ_i src[(g + r · step + offsets[p]) · channels + i] · w_p[i][..]` for
/// `i < inner`, the blocks `w_p` (`[inner, n]`) in `weights` as the kernel lays them out,
/// `weight_rows` rows of `n` each.
pub(super) struct Products<'a, S, W> {
    pub src: &'a [S],
    pub channels: usize,
    pub step: usize,
    pub inner: usize,
    pub offsets: &'a [usize],
    pub weights: &'a [W],
    pub weight_rows: usize,
    pub n: usize,
}

impl<S, W> Products<'_, S, W> {
    /// Panics unless the `m` rows from grid row `first` read inside the operands.
    pub(super) fn check(&self, first: usize, m: usize) {
        let reach = self.offsets.iter().copied().max().unwrap_or(0);
        assert!(
            m == 0
                || ((first + (m - 1) * self.step + reach) * self.channels + self.inner
                    <= self.src.len()
                    && self.weights.len() >= self.offsets.len() * self.weight_rows * self.n),
            "shifted products read past their operands"
        );
    }
}

/// An element type the CPU's own kernels compute [`Products`] in: the layout its
/// kernel reads the weights in, and the products.
pub(super) trait NativeProducts: Sized {
    /// What a laid-out weight is made of.
    type Weight: Clone;

    /// `weights`, `blocks` row-major `[inner, n]` matrices, as the kernel reads them, and
    /// the rows of `n` each block takes then.
    fn lay_out(
        weights: &[Self],
        blocks: usize,
        inner: usize,
        n: usize,
    ) -> (std::borrow::Cow<'_, [Self::Weight]>, usize);

    /// The output rows of the run starting at grid row `first`, `dst.len() / n` of them,
    /// into `dst` (row-major, `n` wide).
    fn rows(products: &Products<'_, Self, Self::Weight>, first: usize, dst: &mut [Self]);
}

/// A kernel gradient's products for one tap pair: `dk[i][..] = Σ_(start, row) Σ_t<len
/// src[(start + t · step) · channels + i] · dy[row + t][..]` for `i < inner`, over `runs`
/// of `len` positions, in order (`src` begins at the pair's offset); `dy` as the kernel
/// lays it out, `dy_rows(row)` the rows of `n` it reads for the run from `row`.
pub(super) struct Reduction<'a, S, D> {
    pub src: &'a [S],
    pub channels: usize,
    pub step: usize,
    pub inner: usize,
    pub dy: &'a [D],
    pub n: usize,
    pub runs: &'a [(usize, usize)],
    pub len: usize,
}

impl<S, D> Reduction<'_, S, D> {
    /// Panics unless every run reads inside `src` (its first `src_len` elements) and
    /// `dy` (`dy_end(row)`: the end of the rows the run from `row` reads) and `dk` holds
    /// the block.
    pub(super) fn check(&self, src_len: usize, dy_end: impl Fn(usize) -> usize, dk: usize) {
        let inside = self.runs.iter().all(|&(start, row)| {
            self.len == 0
                || ((start + (self.len - 1) * self.step) * self.channels + self.inner
                    <= src_len.min(self.src.len())
                    && dy_end(row) * self.n <= self.dy.len())
        });
        assert!(
            dk >= self.inner * self.n && inside,
            "a kernel gradient's products read past their operands"
        );
    }
}

/// The blocks of a run of `m` rows: `(first row, rows)`, blocks of `widest` rows, then
/// what is left in blocks of 4, 2 and 1 (a kernel has a register block of each).
pub(super) fn row_blocks(m: usize, widest: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut r = 0;
    std::iter::from_fn(move || {
        let left = m - r;
        let take = [widest, 4, 2, 1].into_iter().find(|&b| b <= left)?;
        r += take;
        Some((r - take, take))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_blocks_cover_a_run_once_widest_first() {
        let blocks: Vec<(usize, usize)> = row_blocks(23, 7).collect();
        assert_eq!(blocks, [(0, 7), (7, 7), (14, 7), (21, 2)]);
        let blocks: Vec<(usize, usize)> = row_blocks(13, 14).collect();
        assert_eq!(blocks, [(0, 4), (4, 4), (8, 4), (12, 1)]);
        assert_eq!(row_blocks(0, 7).count(), 0);
    }
}
