//! The operands of the native bf16 matrix product, packed the way 16-bit dot-product units
//! read them, and the interface every micro-kernel over them implements.
//!
//! Both AMX's `tdpbf16ps` and AVX-512's `vdpbf16ps` multiply *pairs* of bf16 along k and
//! add both products into one f32 lane, so k is packed in pairs:
//! - A (m x k) in blocks of `MR` rows: for each block, for each step of [`K_STEP`] k's, the
//!   block's rows one after another, 32 bf16 (64 bytes, one tile row) each. A tile of 16
//!   rows is then 1 KiB of contiguous memory.
//! - B (k x n) in panels of [`PANEL`] columns: for each panel, for each pair of rows
//!   `(2p, 2p+1)`, the panel's columns one after another, each as its two values. A step of
//!   32 k's of one panel is again 1 KiB of contiguous memory.
//!
//! Rows, k and columns are padded with zeros to whole blocks, steps and pairs of panels, so
//! kernels never test for edges; the padding adds zero products.

/// k covered by one step of a micro-kernel: 32 bf16 make one 64-byte tile row.
pub(super) const K_STEP: usize = 32;
/// Columns of one panel of packed B (a 64-byte row of 16 pairs).
pub(super) const PANEL: usize = 16;
/// Columns of the f32 block one micro-kernel call computes: two panels.
pub(super) const NR: usize = 2 * PANEL;

/// One operand as it lies in its buffer: bf16 bits, the offset of element (0, 0) and the
/// strides of rows and columns, in elements.
#[derive(Debug, Clone, Copy)]
pub(super) struct Operand<'a> {
    pub(super) data: &'a [u16],
    pub(super) offset: usize,
    pub(super) row_stride: usize,
    pub(super) col_stride: usize,
}

/// One block of `mr` rows of A over a range of k, zero-padded.
#[derive(Debug, Default)]
pub(super) struct PackedA {
    data: Vec<u16>,
    mr: usize,
    k_start: usize,
    k_end: usize,
}

/// Rows `first..first + mr` of the `m x k` operand `a` (those below `m`; the rest are
/// zeros) over k in `k_range` (multiples of [`K_STEP`]; k's from `k` on are zeros): one
/// block of A, as [`PackedA::pack_block`] packs it and [`PrefetchA`] fetches it.
#[derive(Debug, Clone, Copy)]
pub(super) struct RowBlock<'a> {
    pub(super) a: Operand<'a>,
    pub(super) first: usize,
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) mr: usize,
    pub(super) k_range: (usize, usize),
}

impl PackedA {
    /// Packs `block`, reusing this allocation.
    pub(super) fn pack_block(&mut self, block: RowBlock<'_>) {
        let RowBlock {
            a,
            first,
            m,
            k,
            mr,
            k_range: (k0, k1),
        } = block;
        debug_assert!(k0.is_multiple_of(K_STEP) && k1.is_multiple_of(K_STEP) && k0 < k1);
        let len = mr * (k1 - k0);
        self.mr = mr;
        (self.k_start, self.k_end) = (k0, k1);
        // Every element is written below, padding included: no clearing pass.
        if self.data.len() < len {
            self.data.resize(len, 0);
        }
        let data = &mut self.data[..len];
        let rows = m.saturating_sub(first).min(mr);
        for (step, dst) in data.chunks_exact_mut(mr * K_STEP).enumerate() {
            let step_k = k0 + step * K_STEP;
            let ks = step_k.min(k)..(step_k + K_STEP).min(k);
            if a.row_stride == 1 && a.col_stride != 1 {
                // A transposed view (a gradient's `x^T`): the block's rows are a run for
                // each k, so the step is a transpose of up to mr runs of 32 k's.
                transpose_step(a, first, rows, ks, dst);
                continue;
            }
            for (r, dst) in dst.chunks_exact_mut(K_STEP).enumerate() {
                if r >= rows {
                    dst.fill(0);
                    continue;
                }
                let start = a.offset + (first + r) * a.row_stride;
                if a.col_stride == 1 {
                    copy_run(dst, &a.data[start + ks.start..start + ks.end]);
                } else {
                    for (d, p) in dst.iter_mut().zip(ks.clone()) {
                        *d = a.data[start + p * a.col_stride];
                    }
                    dst[ks.len()..].fill(0);
                }
            }
        }
    }

    /// The block's first element at k `k0` (a multiple of [`K_STEP`] in the packed range);
    /// its 32-wide k steps follow `mr * K_STEP` elements apart, each its rows' 32 k's one
    /// row after another.
    pub(super) fn at(&self, k0: usize) -> *const u16 {
        debug_assert!(k0.is_multiple_of(K_STEP) && (self.k_start..self.k_end).contains(&k0));
        self.data[(k0 - self.k_start) * self.mr..].as_ptr()
    }
}

/// The rows of A one [`PackedA::pack_block`] will read, brought toward L1 a few cache
/// lines at a time ([`step`](Self::step)) while the block before is multiplied: a block's
/// rows lie a row stride apart in memory, runs too short for the hardware's prefetchers
/// to hide the first lines' latency. Rows in memory order only; a hint, never a fault.
pub(super) struct PrefetchA {
    base: *const u16,
    row_stride: usize,
    lines_per_row: usize,
    rows_left: usize,
    line: usize,
    per_step: usize,
}

impl PrefetchA {
    /// The lines of `block` (rows below its `m`, k below its `k`), spread over `steps`
    /// calls of [`step`](Self::step).
    pub(super) fn new(block: RowBlock<'_>, steps: usize) -> PrefetchA {
        let RowBlock {
            a,
            first,
            m,
            k,
            mr,
            k_range: (k0, k1),
        } = block;
        let (rows, ks) = (m.saturating_sub(first).min(mr), k0.min(k)..k1.min(k));
        let useful = a.col_stride == 1 && rows > 0 && !ks.is_empty();
        // 32 bf16 per 64-byte line.
        let lines_per_row = ks.len().div_ceil(32);
        let start = a.offset + first * a.row_stride + ks.start;
        PrefetchA {
            base: a.data.as_ptr().wrapping_add(start),
            row_stride: a.row_stride,
            lines_per_row,
            rows_left: if useful { rows } else { 0 },
            line: 0,
            per_step: (rows * lines_per_row).div_ceil(steps.max(1)),
        }
    }

    /// The next few lines.
    #[inline(always)]
    pub(super) fn step(&mut self) {
        for _ in 0..self.per_step {
            if self.rows_left == 0 {
                return;
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch loads nothing and never faults; the address is inside
            // `a`'s rows anyway (a line of a row below `m`, over k below `k`).
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(self.base.wrapping_add(self.line * 32).cast());
            }
            self.line += 1;
            if self.line == self.lines_per_row {
                self.line = 0;
                self.rows_left -= 1;
                self.base = self.base.wrapping_add(self.row_stride);
            }
        }
    }
}

/// `dst = src` followed by zeros, `src` at most [`K_STEP`] long: a whole step as one
/// fixed-size copy the compiler inlines (a slice copy of run-time length calls `memmove`,
/// dear for runs of a few values).
#[inline(always)]
fn copy_run(dst: &mut [u16], src: &[u16]) {
    let whole = <&[u16; K_STEP]>::try_from(src);
    match (<&mut [u16; K_STEP]>::try_from(&mut *dst), whole) {
        (Ok(d), Ok(s)) => *d = *s,
        _ => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
            dst[src.len()..].fill(0);
        }
    }
}

/// One step of a block of A stored transposed (`row_stride == 1`): for each k in `ks`, the
/// block's `rows` values are a run in memory; `dst` gets them as rows of [`K_STEP`] k's,
/// zeros past `rows` and past `ks`.
fn transpose_step(
    a: Operand<'_>,
    first: usize,
    rows: usize,
    ks: std::ops::Range<usize>,
    dst: &mut [u16],
) {
    for part in 0..dst.len().div_ceil(K_STEP * K_STEP) {
        // Rows `part*32..` of the block, at most 32, through a 32 x 32 tile held as
        // [k][row] and read out as [row][k].
        let r0 = part * K_STEP;
        let n_rows = rows.saturating_sub(r0).min(K_STEP);
        let mut tile = [[0u16; K_STEP]; K_STEP];
        if n_rows > 0 {
            for (t, p) in ks.clone().enumerate() {
                copy_run(
                    &mut tile[t],
                    &a.data[a.offset + p * a.col_stride + first + r0..][..n_rows],
                );
            }
        }
        let out = &mut dst[r0 * K_STEP..];
        for r in 0..K_STEP.min(out.len() / K_STEP) {
            let row = &mut out[r * K_STEP..][..K_STEP];
            if r >= n_rows {
                row.fill(0);
                continue;
            }
            for (t, d) in row.iter_mut().enumerate() {
                *d = tile[t][r];
            }
        }
    }
}

/// B packed in pairs of rows, zero-padded to `k_padded x cols_padded`.
#[derive(Debug, Default)]
pub(super) struct PackedB {
    data: Vec<u16>,
    k_padded: usize,
}

impl PackedB {
    /// Packs the `k x n` operand `b` in panels of [`PANEL`] columns (a whole number of
    /// [`NR`]-column blocks), reusing this allocation; split by pairs of rows across
    /// `threads` kernel threads.
    pub(super) fn pack(&mut self, b: Operand<'_>, k: usize, n: usize, threads: usize) {
        let kp = k.div_ceil(K_STEP) * K_STEP;
        let np = n.div_ceil(NR) * NR;
        self.k_padded = kp;
        // Every element is written below, padding included: no clearing pass.
        if self.data.len() < kp * np {
            self.data.resize(kp * np, 0);
        }
        let pairs = kp / 2;
        let threads = threads.clamp(1, pairs);
        let per = pairs.div_ceil(threads);
        // Each thread's run of pairs, in every panel.
        let mut parts: Vec<Vec<&mut [u16]>> = (0..threads).map(|_| Vec::new()).collect();
        for panel in self.data[..kp * np].chunks_exact_mut(kp * PANEL) {
            let mut rest = panel;
            for part in parts.iter_mut() {
                let len = (per * 2 * PANEL).min(rest.len());
                let (mine, others) = rest.split_at_mut(len);
                part.push(mine);
                rest = others;
            }
        }
        let pack = |t: usize, panels: Vec<&mut [u16]>| pack_pairs(b, k, n, t * per, panels);
        if threads == 1 {
            parts.into_iter().enumerate().for_each(|(t, p)| pack(t, p));
            return;
        }
        crate::threads::ensure_rayon_pool();
        rayon::scope(|s| {
            for (t, panels) in parts.into_iter().enumerate() {
                let pack = &pack;
                s.spawn(move |_| pack(t, panels));
            }
        });
    }

    /// The first element of panel `panel` at k `k0` (a multiple of [`K_STEP`]); the
    /// panel's pairs of rows follow `2 * PANEL` elements apart.
    pub(super) fn at(&self, panel: usize, k0: usize) -> *const u16 {
        debug_assert!(k0.is_multiple_of(K_STEP));
        self.data[panel * self.k_padded * PANEL + k0 * PANEL..].as_ptr()
    }
}

/// Pairs of rows `first_pair..` of the `k x n` operand `b` into `panels` (each panel's
/// slice for these pairs, `2 * PANEL` values a pair), zeros past `k` and `n`.
fn pack_pairs(b: Operand<'_>, k: usize, n: usize, first_pair: usize, mut panels: Vec<&mut [u16]>) {
    let pairs = panels.first().map_or(0, |p| p.len() / (2 * PANEL));
    if b.col_stride == 1 {
        // Rows in memory order: a pair of rows interleaved into each panel, on the widest
        // vectors (as baseline x86-64 code, this loop took a tenth of a 1024 product).
        mirra_device::vectorize(
            #[inline(always)]
            || interleave_rows(b, k, n, first_pair, pairs, &mut panels),
        );
    } else {
        // A transposed view (a weight's `w^T`): each column's k values lie in a run.
        for panel in panels.iter_mut() {
            panel.fill(0);
        }
        let ks = (2 * first_pair).min(k)..(2 * (first_pair + pairs)).min(k);
        for j in 0..n {
            let column = b.offset + j * b.col_stride;
            let panel = &mut panels[j / PANEL];
            for p in ks.clone() {
                panel[(p / 2 - first_pair) * 2 * PANEL + (j % PANEL) * 2 + p % 2] =
                    b.data[column + p * b.row_stride];
            }
        }
    }
}

/// [`pack_pairs`] of rows in memory order: pairs of rows `first_pair..first_pair +
/// pairs` interleaved into each panel.
#[inline(always)]
fn interleave_rows(
    b: Operand<'_>,
    k: usize,
    n: usize,
    first_pair: usize,
    pairs: usize,
    panels: &mut [&mut [u16]],
) {
    // Whole pairs of rows, in whole pairs of panels, on AVX-512's word permutes: (pairs,
    // panels) done.
    #[allow(unused_mut)]
    let mut whole = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if has_avx512bw() {
        let rows = k.saturating_sub(2 * first_pair) / 2;
        whole = (rows.min(pairs), n / NR * 2);
        // SAFETY: the CPU has AVX-512 F and BW; the rows and panels are in bounds (below).
        unsafe { interleave_whole(b, first_pair, whole.0, &mut panels[..whole.1]) };
    }
    for pair in 0..pairs {
        let p = 2 * (first_pair + pair);
        let row = |p: usize| (p < k).then(|| &b.data[b.offset + p * b.row_stride..][..n]);
        let (first, second) = (row(p), row(p + 1));
        // The pairs and panels the word permutes did.
        let done = if pair < whole.0 { whole.1 } else { 0 };
        for (q, panel) in panels.iter_mut().enumerate().skip(done) {
            let dst = &mut panel[pair * 2 * PANEL..][..2 * PANEL];
            let cols = (q * PANEL).min(n)..((q + 1) * PANEL).min(n);
            let (x, y) = (
                first.map(|r| &r[cols.clone()]),
                second.map(|r| &r[cols.clone()]),
            );
            match (
                x.and_then(|x| <&[u16; PANEL]>::try_from(x).ok()),
                y.and_then(|y| <&[u16; PANEL]>::try_from(y).ok()),
            ) {
                // A whole panel of a whole pair: a fixed-size interleave.
                (Some(x), Some(y)) => {
                    for j in 0..PANEL {
                        dst[2 * j] = x[j];
                        dst[2 * j + 1] = y[j];
                    }
                }
                _ => {
                    dst.fill(0);
                    for (j, &v) in x.unwrap_or(&[]).iter().enumerate() {
                        dst[2 * j] = v;
                    }
                    for (j, &v) in y.unwrap_or(&[]).iter().enumerate() {
                        dst[2 * j + 1] = v;
                    }
                }
            }
        }
    }
}

/// Whether this CPU has AVX-512 BW: the word permutes of [`interleave_whole`] and of the
/// driver's rounding (`bf16_gemm::round_block`).
pub(super) fn has_avx512bw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Pairs of rows `first_pair..first_pair + pairs` of `b` (all below its k) interleaved
/// into `panels` (whole pairs of panels, all below its n), a pair of panels at a time so
/// that each panel is written in order: `left` gets `x[0], y[0], .., x[15], y[15]` of the
/// pair's rows `x`, `y`, `right` the same of the next 16 columns.
///
/// # Safety
/// The CPU has AVX-512 F and BW; rows `2 * first_pair..2 * (first_pair + pairs)` of `b`
/// exist and hold `panels.len() * PANEL` columns; each panel holds `pairs` pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn interleave_whole(
    b: Operand<'_>,
    first_pair: usize,
    pairs: usize,
    panels: &mut [&mut [u16]],
) {
    use std::arch::x86_64::{_mm512_loadu_si512, _mm512_permutex2var_epi16, _mm512_storeu_si512};
    // Word `2j` of the result is `x[j]`, word `2j + 1` is `y[j]` (index bit 5: the second
    // source), for j in 0..16 (left) and 16..32 (right).
    let index = |from: u16| {
        let mut i = [0u16; 32];
        for j in 0..16 {
            i[2 * j] = from + j as u16;
            i[2 * j + 1] = 32 + from + j as u16;
        }
        i
    };
    let (lo, hi) = (index(0), index(16));
    // SAFETY: loads of 64 bytes at columns `q * NR..(q + 1) * NR` of rows below k (the
    // contract), stores of 64 bytes at pair `pair` of each panel (`pair < pairs`).
    unsafe {
        let (ilo, ihi) = (
            _mm512_loadu_si512(lo.as_ptr().cast()),
            _mm512_loadu_si512(hi.as_ptr().cast()),
        );
        for (q, two) in panels.chunks_exact_mut(2).enumerate() {
            let [left, right] = two else { unreachable!() };
            assert!(left.len() >= pairs * 2 * PANEL && right.len() >= pairs * 2 * PANEL);
            let first = b.offset + 2 * first_pair * b.row_stride + q * NR;
            assert!(pairs == 0 || first + (2 * pairs - 1) * b.row_stride + NR <= b.data.len());
            let row = b.data.as_ptr().add(first);
            for pair in 0..pairs {
                let x = _mm512_loadu_si512(row.add(2 * pair * b.row_stride).cast());
                let y = _mm512_loadu_si512(row.add((2 * pair + 1) * b.row_stride).cast());
                let at = pair * 2 * PANEL;
                _mm512_storeu_si512(
                    left.as_mut_ptr().add(at).cast(),
                    _mm512_permutex2var_epi16(x, ilo, y),
                );
                _mm512_storeu_si512(
                    right.as_mut_ptr().add(at).cast(),
                    _mm512_permutex2var_epi16(x, ihi, y),
                );
            }
        }
    }
}

/// A micro-kernel: computes one `MR x NR` block of f32 sums from packed operands.
pub(super) trait BlockKernel: Sync {
    /// Rows of one block; A is packed in blocks of this many rows.
    const MR: usize;

    /// Prepares this thread to run [`block`](Self::block) (AMX configures its tiles).
    fn begin(&self) {}

    /// Ends a run of blocks begun by [`begin`](Self::begin) on this thread.
    fn end(&self) {}

    /// `c[i][j] (+)= sum over k in k_range of a[i][k] * b[k][panel*PANEL + j]` for
    /// `i < MR`, `j < NR`, `a` one packed block; sums replace `c` unless `accumulate`.
    ///
    /// # Safety
    /// `a` was packed as a block of `MR` rows; `b` holds panels
    /// `panel` and `panel + 1`; both cover `k_range`, whose ends are multiples of
    /// [`K_STEP`]; `c` points at `MR` rows of `NR` writable f32, `ldc` apart; and
    /// [`begin`](Self::begin) ran on this thread.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block(
        &self,
        a: &PackedA,
        b: &PackedB,
        panel: usize,
        k_range: (usize, usize),
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    );
}
