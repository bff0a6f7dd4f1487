//! The shifted convolution's f32 products on AVX-512 (`conv_shifted` runs them where the
//! CPU has it, and gemm otherwise).
//!
//! gemm runs a product whose output is 16 columns wide (a 16-filter layer) through its
//! narrowest micro-kernel, six accumulators of 16 lanes, and reads the output back for
//! each of the `k1 · k2` products added into it. These kernels hold a block of output
//! rows in registers across every tap of the window: `R` rows of `NV` vectors of 16 lanes
//! (up to 64 columns; wider outputs in groups of 64), each input element broadcast once
//! per block and multiplied with one row of weights. The output is written once. A group
//! whose width ends in 8 columns (8-, 24- or 40-filter layers: a 3D U-Net's first level)
//! computes those 8 on vectors of 8 lanes ([`Lanes`]).
//!
//! Every output element is the sum over taps, then over the tap's inner index, in that
//! order, whatever block, chunk or vector width its row and column fall in, so the bits
//! do not depend on how rows are cut between threads.

use std::arch::x86_64::{
    __m256, __m512, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_storeu_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_storeu_ps,
};

use super::shifted_operands::{row_blocks, NativeProducts, Products, Reduction};

/// Whether this CPU runs these kernels (checked once).
pub(super) fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
}

/// Whether the kernels take an output (or reduction) width of `n` columns: whole vectors
/// of 8 lanes, computed in groups of up to 64 columns.
pub(super) fn takes(n: usize) -> bool {
    n.is_multiple_of(8) && n > 0
}

/// The widest group of columns a kernel holds in registers.
const GROUP: usize = 64;

/// A vector of f32 lanes the kernels compute on: 16 (AVX-512) or 8 (the last 8 columns
/// of a group, on 256-bit registers).
trait Lanes: Copy {
    /// Its lanes.
    const LANES: usize;

    /// # Safety
    /// AVX-512F is present (as for every function below).
    unsafe fn zero() -> Self;
    /// # Safety
    /// `p` is valid for `LANES` reads.
    unsafe fn load(p: *const f32) -> Self;
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn splat(x: f32) -> Self;
    /// `a · b + c`, rounded once.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    /// # Safety
    /// `p` is valid for `LANES` writes.
    unsafe fn store(p: *mut f32, v: Self);
}

impl Lanes for __m512 {
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller's contract (AVX-512F).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_storeu_ps(p, v) }
    }
}

impl Lanes for __m256 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller's contract (AVX-512F implies AVX2 and FMA).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: the caller's contract.
        unsafe { _mm256_storeu_ps(p, v) }
    }
}

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
            "the AVX-512 products run on AVX-512, whole vectors of 8 lanes wide"
        );
        self.check(first, m);
        for col in (0..n).step_by(GROUP) {
            // SAFETY: AVX-512F is present (asserted); every row block reads source rows
            // up to first + (m - 1) step + reach, inside `src` by the assertion, weights
            // inside `weights`, and writes its rows of `dst`, columns col .. col + width
            // <= n.
            unsafe {
                let width = (n - col).min(GROUP);
                match width / 16 {
                    0 => {}
                    1 => self.blocks::<14, 1, __m512>(first, dst, col),
                    2 => self.blocks::<14, 2, __m512>(first, dst, col),
                    3 => self.blocks::<8, 3, __m512>(first, dst, col),
                    _ => self.blocks::<7, 4, __m512>(first, dst, col),
                }
                if width % 16 == 8 {
                    // Eight rows: each row's source is a pointer of its own, and more of
                    // them than this spill (half-width vectors take no embedded broadcast
                    // here), halving the speed.
                    self.blocks::<8, 1, __m256>(first, dst, col + width - 8);
                }
            }
        }
    }

    /// The run's rows in blocks of `R`, then of 4, 2 and 1 ([`row_blocks`]), columns
    /// `col .. col + NV · V::LANES`.
    #[target_feature(enable = "avx512f")]
    unsafe fn blocks<const R: usize, const NV: usize, V: Lanes>(
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
                    4 => self.block::<4, NV, V>(g, at, col),
                    2 => self.block::<2, NV, V>(g, at, col),
                    1 => self.block::<1, NV, V>(g, at, col),
                    _ => self.block::<R, NV, V>(g, at, col),
                }
            }
        }
    }

    /// Columns `col .. col + NV · V::LANES` of the `R` output rows from grid row `g`,
    /// `step` apart, into `dst` (those columns of the first row; row stride `n`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block<const R: usize, const NV: usize, V: Lanes>(
        &self,
        g: usize,
        dst: *mut f32,
        col: usize,
    ) {
        // SAFETY: the caller's bounds: every source row g + r + offset and weight row read lies
        // inside the operands, and dst holds R rows of n.
        unsafe {
            let mut acc = [[V::zero(); NV]; R];
            for (p, &offset) in self.offsets.iter().enumerate() {
                let x = self.src.as_ptr().add((g + offset) * self.channels);
                let row = self.step * self.channels;
                let w = self.weights.as_ptr().add(p * self.inner * self.n + col);
                for i in 0..self.inner {
                    let mut wv = [V::zero(); NV];
                    for (j, v) in wv.iter_mut().enumerate() {
                        *v = V::load(w.add(i * self.n + V::LANES * j));
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let xb = V::splat(*x.add(r * row + i));
                        for (a, &v) in acc.iter_mut().zip(&wv) {
                            *a = V::fmadd(xb, v, *a);
                        }
                    }
                }
            }
            store::<R, NV, V>(&acc, dst, self.n);
        }
    }
}

impl Reduction<'_, f32, f32> {
    /// The block into `dk` (`inner x n`, row-major).
    pub(super) fn block(&self, dk: &mut [f32]) {
        let n = self.n;
        assert!(
            available() && takes(n),
            "the AVX-512 products run on AVX-512, whole vectors of 8 lanes wide"
        );
        self.check(self.src.len(), |row| row + self.len, dk.len());
        for col in (0..n).step_by(GROUP) {
            // SAFETY: AVX-512F is present and every read lies inside the operands
            // (asserted); each group writes columns col .. col + width <= n of dk's rows.
            unsafe {
                let width = (n - col).min(GROUP);
                match width / 16 {
                    0 => {}
                    1 => self.columns::<16, 1, __m512>(dk, col),
                    2 => self.columns::<12, 2, __m512>(dk, col),
                    3 => self.columns::<8, 3, __m512>(dk, col),
                    _ => self.columns::<6, 4, __m512>(dk, col),
                }
                if width % 16 == 8 {
                    self.columns::<12, 1, __m256>(dk, col + width - 8);
                }
            }
        }
    }

    /// The inner indices in blocks of `R`, then of 4, 2 and 1 ([`row_blocks`]), columns
    /// `col .. col + NV · V::LANES`.
    #[target_feature(enable = "avx512f")]
    unsafe fn columns<const R: usize, const NV: usize, V: Lanes>(
        &self,
        dk: &mut [f32],
        col: usize,
    ) {
        for (i, rows) in row_blocks(self.inner, R) {
            let dst = dk[i * self.n + col..].as_mut_ptr();
            // SAFETY: the caller's bounds.
            unsafe {
                match rows {
                    4 => self.sum::<4, NV, V>(i, dst, col),
                    2 => self.sum::<2, NV, V>(i, dst, col),
                    1 => self.sum::<1, NV, V>(i, dst, col),
                    _ => self.sum::<R, NV, V>(i, dst, col),
                }
            }
        }
    }

    /// Rows `i .. i + R` of the block, each summed over the runs' positions in order.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn sum<const R: usize, const NV: usize, V: Lanes>(
        &self,
        i: usize,
        dst: *mut f32,
        col: usize,
    ) {
        // SAFETY: the caller's bounds: every run's positions and inner indices i .. i + R lie
        // inside `src`, its rows inside `dy`, and dst holds R rows of n.
        unsafe {
            let mut acc = [[V::zero(); NV]; R];
            for &(start, row) in self.runs {
                for t in 0..self.len {
                    let x = self
                        .src
                        .as_ptr()
                        .add((start + t * self.step) * self.channels + i);
                    let d = self.dy.as_ptr().add((row + t) * self.n + col);
                    let mut dv = [V::zero(); NV];
                    for (j, v) in dv.iter_mut().enumerate() {
                        *v = V::load(d.add(V::LANES * j));
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let xb = V::splat(*x.add(r));
                        for (a, &v) in acc.iter_mut().zip(&dv) {
                            *a = V::fmadd(xb, v, *a);
                        }
                    }
                }
            }
            store::<R, NV, V>(&acc, dst, self.n);
        }
    }
}

/// `R` rows of `NV · V::LANES` lanes into `dst`, row stride `n`.
///
/// # Safety
/// AVX-512F present; `dst` valid for `R` rows of `NV · V::LANES` elements at stride `n`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store<const R: usize, const NV: usize, V: Lanes>(
    acc: &[[V; NV]; R],
    dst: *mut f32,
    n: usize,
) {
    for (r, row) in acc.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            // SAFETY: the caller's contract.
            unsafe { V::store(dst.add(r * n + V::LANES * j), v) };
        }
    }
}
