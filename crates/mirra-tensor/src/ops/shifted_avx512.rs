//! The shifted convolution's f32 products on AVX-512 (`conv_shifted` runs them where the
//! CPU has it, and gemm otherwise).
//!
//! gemm runs a product whose output is 16 columns wide (a 16-filter layer) through its
//! narrowest micro-kernel, six accumulators of 16 lanes, and reads the output back for
//! each of the `k1 · k2` products added into it. These kernels hold a block of output
//! rows in registers across every tap of the window: `R` rows of `16 · NV` columns (up to
//! 64; wider outputs in groups of 64), each input element broadcast once per block and
//! multiplied with one row of weights. The output is written once.
//!
//! Every output element is the sum over taps, then over the tap's inner index, in that
//! order, whatever block or chunk its row falls in, so the bits do not depend on how rows
//! are cut between threads.

use std::arch::x86_64::{
    __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
};

use super::shifted_operands::{row_blocks, NativeProducts, Products, Reduction};

/// Whether this CPU runs these kernels (checked once).
pub(super) fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
}

/// Whether the kernels take an output (or reduction) width of `n` columns: whole vectors,
/// computed in groups of up to 64 columns.
pub(super) fn takes(n: usize) -> bool {
    n.is_multiple_of(16) && n > 0
}

/// The widest group of columns a kernel holds in registers.
const GROUP: usize = 64;

impl NativeProducts for f32 {
    type Weight = f32;

    fn lay_out(
        weights: &[f32],
        _: usize,
        inner: usize,
        _: usize,
    ) -> (std::borrow::Cow<'_, [f32]>, usize) {
        (std::borrow::Cow::Borrowed(weights), inner)
    }

    fn rows(products: &Products<'_, f32, f32>, first: usize, dst: &mut [f32]) {
        products.rows(first, dst);
    }
}

impl Products<'_, f32, f32> {
    /// The output rows of the run starting at grid row `first`, `dst.len() / n` of them,
    /// into `dst` (row-major, `n` wide).
    pub(super) fn rows(&self, first: usize, dst: &mut [f32]) {
        let (n, m) = (self.n, dst.len() / self.n.max(1));
        assert!(
            available() && takes(n) && self.weight_rows == self.inner,
            "the AVX-512 products run on AVX-512, whole vectors wide"
        );
        self.check(first, m);
        for col in (0..n).step_by(GROUP) {
            // SAFETY: AVX-512F is present (asserted); every row block reads source rows
            // up to first + (m - 1) step + reach, inside `src` by the assertion, weights
            // inside `weights`, and writes its rows of `dst`, columns col .. col + width
            // <= n.
            unsafe {
                match (n - col).min(GROUP) / 16 {
                    1 => self.blocks::<14, 1>(first, dst, col),
                    2 => self.blocks::<14, 2>(first, dst, col),
                    3 => self.blocks::<8, 3>(first, dst, col),
                    _ => self.blocks::<7, 4>(first, dst, col),
                }
            }
        }
    }

    /// The run's rows in blocks of `R`, then of 4, 2 and 1 ([`row_blocks`]).
    #[target_feature(enable = "avx512f")]
    unsafe fn blocks<const R: usize, const NV: usize>(
        &self,
        first: usize,
        dst: &mut [f32],
        col: usize,
    ) {
        for (r, rows) in row_blocks(dst.len() / self.n, R) {
            let (g, at) = (first + r * self.step, dst[r * self.n + col..].as_mut_ptr());
            // SAFETY: the caller's bounds; the block's rows lie below m.
            unsafe {
                match rows {
                    4 => self.block::<4, NV>(g, at, col),
                    2 => self.block::<2, NV>(g, at, col),
                    1 => self.block::<1, NV>(g, at, col),
                    _ => self.block::<R, NV>(g, at, col),
                }
            }
        }
    }

    /// Columns `col .. col + 16·NV` of the `R` output rows from grid row `g`, `step` apart,
    /// into `dst` (those columns of the first row; row stride `n`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block<const R: usize, const NV: usize>(&self, g: usize, dst: *mut f32, col: usize) {
        // SAFETY: the caller's bounds: every source row g + r + offset and weight row read lies
        // inside the operands, and dst holds R rows of n.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NV]; R];
            for (p, &offset) in self.offsets.iter().enumerate() {
                let x = self.src.as_ptr().add((g + offset) * self.channels);
                let row = self.step * self.channels;
                let w = self.weights.as_ptr().add(p * self.inner * self.n + col);
                for i in 0..self.inner {
                    let mut wv = [_mm512_setzero_ps(); NV];
                    for (j, v) in wv.iter_mut().enumerate() {
                        *v = _mm512_loadu_ps(w.add(i * self.n + 16 * j));
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let xb = _mm512_set1_ps(*x.add(r * row + i));
                        for (a, &v) in acc.iter_mut().zip(&wv) {
                            *a = _mm512_fmadd_ps(xb, v, *a);
                        }
                    }
                }
            }
            store::<R, NV>(&acc, dst, self.n);
        }
    }
}

impl Reduction<'_, f32, f32> {
    /// The block into `dk` (`inner x n`, row-major).
    pub(super) fn block(&self, dk: &mut [f32]) {
        let n = self.n;
        assert!(
            available() && takes(n),
            "the AVX-512 products run on AVX-512, whole vectors wide"
        );
        self.check(self.src.len(), |row| row + self.len, dk.len());
        for col in (0..n).step_by(GROUP) {
            // SAFETY: AVX-512F is present and every read lies inside the operands
            // (asserted); each group writes columns col .. col + width <= n of dk's rows.
            unsafe {
                match (n - col).min(GROUP) / 16 {
                    1 => self.columns::<16, 1>(dk, col),
                    2 => self.columns::<12, 2>(dk, col),
                    3 => self.columns::<8, 3>(dk, col),
                    _ => self.columns::<6, 4>(dk, col),
                }
            }
        }
    }

    /// Blocks of `R` inner indices, then the last ones one at a time.
    #[target_feature(enable = "avx512f")]
    unsafe fn columns<const R: usize, const NV: usize>(&self, dk: &mut [f32], col: usize) {
        let full = self.inner / R * R;
        for i in (0..full).step_by(R) {
            // SAFETY: the caller's bounds.
            unsafe { self.sum::<R, NV>(i, dk[i * self.n + col..].as_mut_ptr(), col) };
        }
        for i in full..self.inner {
            // SAFETY: the caller's bounds.
            unsafe { self.sum::<1, NV>(i, dk[i * self.n + col..].as_mut_ptr(), col) };
        }
    }

    /// Rows `i .. i + R` of the block, each summed over the runs' positions in order.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn sum<const R: usize, const NV: usize>(&self, i: usize, dst: *mut f32, col: usize) {
        // SAFETY: the caller's bounds: every run's positions and inner indices i .. i + R lie
        // inside `src`, its rows inside `dy`, and dst holds R rows of n.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NV]; R];
            for &(start, row) in self.runs {
                for t in 0..self.len {
                    let x = self
                        .src
                        .as_ptr()
                        .add((start + t * self.step) * self.channels + i);
                    let d = self.dy.as_ptr().add((row + t) * self.n + col);
                    let mut dv = [_mm512_setzero_ps(); NV];
                    for (j, v) in dv.iter_mut().enumerate() {
                        *v = _mm512_loadu_ps(d.add(16 * j));
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let xb = _mm512_set1_ps(*x.add(r));
                        for (a, &v) in acc.iter_mut().zip(&dv) {
                            *a = _mm512_fmadd_ps(xb, v, *a);
                        }
                    }
                }
            }
            store::<R, NV>(&acc, dst, self.n);
        }
    }
}

/// `R` rows of `16 · NV` lanes into `dst`, row stride `n`.
///
/// # Safety
/// AVX-512F present; `dst` valid for `R` rows of `16 · NV` elements at stride `n`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store<const R: usize, const NV: usize>(acc: &[[__m512; NV]; R], dst: *mut f32, n: usize) {
    for (r, row) in acc.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            // SAFETY: the caller's contract.
            unsafe { _mm512_storeu_ps(dst.add(r * n + 16 * j), v) };
        }
    }
}
