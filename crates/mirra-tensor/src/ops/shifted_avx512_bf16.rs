//! The shifted convolution's bf16 products on AVX-512 BF16 (`conv_shifted` runs them for
//! bf16 operands where the CPU has `vdpbf16ps`; bf16 convolutions go through im2col
//! elsewhere).
//!
//! The same blocks as the f32 kernels of [`shifted_avx512`](super::shifted_avx512): `R`
//! rows of `16 · NV` f32 sums held in registers across every tap. `vdpbf16ps` multiplies
//! *pairs* of bf16 and adds both products into one f32 lane, so what is summed over comes
//! in pairs:
//!
//! - [`Products`] (the output and the input gradient) sums over a tap row's inner index
//!   `i`, consecutive elements of the source: a row's pair `(x[i], x[i + 1])` is one
//!   32-bit broadcast from memory, against weights packed as pairs along `i`
//!   ([`pack_pairs`]).
//! - [`Reduction`] (the kernel gradient) sums over the positions `t` of runs: the output
//!   gradient is packed as pairs of positions per run ([`pack_runs_into`]), and the source
//!   pair `(x[t][i], x[t + 1][i])`, one `step · channels` apart, is read from the source
//!   packed beside itself ([`pack_steps_into`]), again one 32-bit broadcast.
//!
//! An odd inner size (or run length) ends with a lone element, its pair's other half zero
//! on both sides (the source element masked, not multiplied by a zero weight: it may be
//! infinite), added after the pairs by a function of its own (see [`Products::block`]).
//!
//! Sums stay in f32 and each output is rounded once to the nearest bf16, ties to even,
//! bit for bit as `half::bf16::from_f32` rounds (not `vcvtneps2bf16`, which flushes
//! subnormals). Every output element is summed in one fixed order whatever block or chunk
//! it falls in, so the bits do not depend on how rows are cut between threads.

use super::shifted_operands::{row_blocks, NativeProducts, Products, Reduction};
use std::arch::x86_64::{
    __m256i, __m512, __m512bh, __m512i, _mm256_storeu_si256, _mm512_add_epi32, _mm512_and_si512,
    _mm512_broadcastd_epi32, _mm512_castps_si512, _mm512_cmp_ps_mask, _mm512_cvtepi32_epi16,
    _mm512_dpbf16_ps, _mm512_loadu_si512, _mm512_mask_blend_epi32, _mm512_or_si512,
    _mm512_set1_epi32, _mm512_setzero_ps, _mm512_srli_epi32, _mm_loadu_si32, _CMP_UNORD_Q,
};

/// Whether this CPU runs these kernels (checked once).
pub(super) fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    })
}

/// Whether the kernels take an output (or reduction) width of `n` columns: whole vectors
/// of 16 lanes, computed in groups of up to 64 columns.
pub(super) fn takes(n: usize) -> bool {
    n.is_multiple_of(16) && n > 0
}

/// The widest group of columns a kernel holds in registers.
const GROUP: usize = 64;

/// `weights`, `blocks` row-major `[inner, n]` matrices of bf16 bits, as pairs along
/// `inner`: `[blocks][ceil(inner / 2)][n]`, each `u32` holding row `2p` in its low half
/// and row `2p + 1` (zero past `inner`) in its high half.
pub(super) fn pack_pairs(weights: &[u16], blocks: usize, inner: usize, n: usize) -> Vec<u32> {
    let mut packed = vec![0; blocks * inner.div_ceil(2) * n];
    pack_pairs_into(weights, blocks, inner, n, &mut packed);
    packed
}

/// [`pack_pairs`] into `packed` (its length exactly the packing's), on the widest
/// vectors: the kernel gradient packs a whole output gradient this way every step.
pub(super) fn pack_pairs_into(
    weights: &[u16],
    blocks: usize,
    inner: usize,
    n: usize,
    packed: &mut [u32],
) {
    assert!(
        weights.len() == blocks * inner * n && packed.len() == blocks * inner.div_ceil(2) * n,
        "weights of {blocks} blocks of {inner}x{n}, packed in pairs of rows"
    );
    let mut out = packed.chunks_exact_mut(n.max(1));
    mirra_device::vectorize(
        #[inline(always)]
        || {
            for block in weights.chunks_exact((inner * n).max(1)) {
                let mut rows = block.chunks_exact(n.max(1));
                while let Some(lo) = rows.next() {
                    let Some(dst) = out.next() else { return };
                    match rows.next() {
                        Some(hi) => {
                            for ((d, &l), &h) in dst.iter_mut().zip(lo).zip(hi) {
                                *d = u32::from(l) | u32::from(h) << 16;
                            }
                        }
                        None => {
                            for (d, &l) in dst.iter_mut().zip(lo) {
                                *d = u32::from(l);
                            }
                        }
                    }
                }
            }
        },
    );
}

/// `dy` (`runs · len` rows of `n` bf16 bits, run after run) as pairs of positions per
/// run: `[runs][ceil(len / 2)][n]`, position `2p` of the run in each `u32`'s low half and
/// `2p + 1` (zero past the run) in its high half, into `packed` (exactly that long).
pub(super) fn pack_runs_into(dy: &[u16], len: usize, n: usize, packed: &mut [u32]) {
    let runs = dy.len() / (len * n).max(1);
    assert_eq!(dy.len(), runs * len * n, "whole runs of {len} rows of {n}");
    pack_pairs_into(dy, runs, len, n, packed);
}

/// The length of [`pack_runs_into`]'s packing of `dy_len` elements.
pub(super) fn packed_runs_len(dy_len: usize, len: usize, n: usize) -> usize {
    dy_len / (len * n).max(1) * len.div_ceil(2) * n
}

/// Every element of `src` paired with the one `apart` elements later (zero past the
/// end), into `paired` (as long as `src`): element `j` in the low half of `u32` `j`,
/// element `j + apart` in its high half. The kernel gradient's source pairs, two
/// positions one `step · channels` apart, are then one 32-bit broadcast from memory.
pub(super) fn pack_steps_into(src: &[u16], apart: usize, paired: &mut [u32]) {
    assert_eq!(paired.len(), src.len(), "one pair per element");
    let both = src.len().saturating_sub(apart);
    let (head, tail) = paired.split_at_mut(both);
    mirra_device::vectorize(
        #[inline(always)]
        || {
            for ((d, &l), &h) in head
                .iter_mut()
                .zip(&src[..both])
                .zip(&src[apart.min(src.len())..])
            {
                *d = u32::from(l) | u32::from(h) << 16;
            }
            for (d, &l) in tail.iter_mut().zip(&src[both..]) {
                *d = u32::from(l);
            }
        },
    );
}

/// bf16, as its bits.
impl NativeProducts for u16 {
    type Weight = u32;

    fn lay_out(
        weights: &[u16],
        blocks: usize,
        inner: usize,
        n: usize,
    ) -> (std::borrow::Cow<'_, [u32]>, usize) {
        (
            std::borrow::Cow::Owned(pack_pairs(weights, blocks, inner, n)),
            inner.div_ceil(2),
        )
    }

    fn rows(products: &Products<'_, u16, u32>, first: usize, dst: &mut [u16]) {
        products.rows(first, dst);
    }
}

impl Products<'_, u16, u32> {
    /// The output rows of the run starting at grid row `first`, `dst.len() / n` of them,
    /// into `dst` (row-major, `n` wide, bf16 bits).
    pub(super) fn rows(&self, first: usize, dst: &mut [u16]) {
        let (n, m) = (self.n, dst.len() / self.n.max(1));
        assert!(
            available() && takes(n) && self.weight_rows == self.inner.div_ceil(2),
            "the AVX-512 BF16 products run on AVX-512 BF16, whole vectors wide, on pairs"
        );
        self.check(first, m);
        let odd = self.inner % 2 == 1;
        for col in (0..n).step_by(GROUP) {
            // SAFETY: AVX-512 F, BW and BF16 are present (asserted); every row block reads
            // source elements up to (first + (m - 1) step + reach) channels + inner,
            // inside `src` by the assertion (pairs are read whole only below `inner`),
            // packed weights inside `weights`, and writes its rows of `dst`, columns
            // col .. col + width <= n.
            unsafe {
                if odd {
                    self.group::<true>(first, dst, col)
                } else {
                    self.group::<false>(first, dst, col)
                }
            }
        }
    }

    /// Columns `col ..` (up to [`GROUP`]) of the run's rows, in the register blocks of
    /// their width; `ODD`: the inner size is odd.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn group<const ODD: bool>(&self, first: usize, dst: &mut [u16], col: usize) {
        // SAFETY: the caller's bounds.
        unsafe {
            match (self.n - col).min(GROUP) / 16 {
                1 => self.blocks::<12, 1, ODD>(first, dst, col),
                2 => self.blocks::<12, 2, ODD>(first, dst, col),
                3 => self.blocks::<8, 3, ODD>(first, dst, col),
                _ => self.blocks::<7, 4, ODD>(first, dst, col),
            }
        }
    }

    /// The run's rows in blocks of `R`, then of 4, 2 and 1 ([`row_blocks`]); `ODD`: the
    /// inner size is odd.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn blocks<const R: usize, const NV: usize, const ODD: bool>(
        &self,
        first: usize,
        dst: &mut [u16],
        col: usize,
    ) {
        for (r, rows) in row_blocks(dst.len() / self.n, R) {
            let (g, at) = (first + r * self.step, dst[r * self.n + col..].as_mut_ptr());
            // SAFETY: the caller's bounds; the block's rows lie below m.
            unsafe {
                match rows {
                    4 => self.block::<4, NV, ODD>(g, at, col),
                    2 => self.block::<2, NV, ODD>(g, at, col),
                    1 => self.block::<1, NV, ODD>(g, at, col),
                    _ => self.block::<R, NV, ODD>(g, at, col),
                }
            }
        }
    }

    /// Columns `col .. col + 16·NV` of the `R` output rows from grid row `g`, `step` apart,
    /// into `dst` (those columns of the first row; row stride `n`): every tap's pairs,
    /// then, where the inner size is odd (`ODD`), every tap's last index alone.
    ///
    /// That last index is added by a function of its own, to sums put in memory: written
    /// here, its code costs the loop over pairs its registers (the compiler then keeps
    /// every sum in memory as well, a store per product, at half the speed).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[inline]
    unsafe fn block<const R: usize, const NV: usize, const ODD: bool>(
        &self,
        g: usize,
        dst: *mut u16,
        col: usize,
    ) {
        let (pairs, half) = (self.inner / 2, self.inner.div_ceil(2));
        let row = self.step * self.channels;
        // SAFETY: the caller's bounds: every source element g + r step + offset read lies
        // inside the operands (whole pairs below `inner` only), every packed weight row
        // inside `weights`, and dst holds R rows of n.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NV]; R];
            for (p, &offset) in self.offsets.iter().enumerate() {
                let x = self.src.as_ptr().add((g + offset) * self.channels);
                let w = self.weights.as_ptr().add(p * half * self.n + col);
                for i in 0..pairs {
                    let wv = pairs_of::<NV>(w.add(i * self.n));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        dot(acc, broadcast(x.add(r * row + 2 * i).cast()), &wv);
                    }
                }
            }
            if ODD {
                self.add_last_index::<R, NV>(g, col, &mut acc);
            }
            store::<R, NV>(&acc, dst, self.n);
        }
    }

    /// `acc` plus the products of an odd inner size's last index alone (its pair's
    /// second half zero), every tap in order: [`block`](Products::block)'s end.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline(never)]
    unsafe fn add_last_index<const R: usize, const NV: usize>(
        &self,
        g: usize,
        col: usize,
        acc: &mut [[__m512; NV]; R],
    ) {
        let (last, half) = (self.inner - 1, self.inner.div_ceil(2));
        let row = self.step * self.channels;
        // SAFETY: `block`'s bounds; index `last` lies below `inner`.
        unsafe {
            for (p, &offset) in self.offsets.iter().enumerate() {
                let x = self.src.as_ptr().add((g + offset) * self.channels + last);
                let wv = pairs_of::<NV>(
                    self.weights
                        .as_ptr()
                        .add((p * half + half - 1) * self.n + col),
                );
                for (r, acc) in acc.iter_mut().enumerate() {
                    dot(acc, _mm512_set1_epi32(i32::from(*x.add(r * row))), &wv);
                }
            }
        }
    }
}

impl Reduction<'_, u16, u32> {
    /// The block into `dk` (`inner x n`, row-major, f32), `dy` packed by [`pack_runs_into`]
    /// (a run's rows start at a multiple of `len`), `pairs` the source's elements paired
    /// with the ones a position later ([`pack_steps_into`] with `step · channels`).
    pub(super) fn block(&self, pairs: &[u32], dk: &mut [f32]) {
        let n = self.n;
        assert!(
            available()
                && takes(n)
                && self
                    .runs
                    .iter()
                    .all(|&(_, row)| row.is_multiple_of(self.len.max(1))),
            "the AVX-512 BF16 products run on AVX-512 BF16, whole vectors wide, whole runs"
        );
        let half = self.len.div_ceil(2);
        self.check(pairs.len(), |row| (row / self.len + 1) * half, dk.len());
        let odd = self.len % 2 == 1;
        for col in (0..n).step_by(GROUP) {
            // SAFETY: AVX-512 F, BW and BF16 are present and every read lies inside the
            // operands (asserted); each group writes columns col .. col + width <= n of
            // dk's rows.
            unsafe {
                if odd {
                    self.group::<true>(pairs, dk, col)
                } else {
                    self.group::<false>(pairs, dk, col)
                }
            }
        }
    }

    /// Columns `col ..` (up to [`GROUP`]) of the block, in the register blocks of their
    /// width; `ODD`: runs are of odd length.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn group<const ODD: bool>(&self, pairs: &[u32], dk: &mut [f32], col: usize) {
        // SAFETY: the caller's bounds.
        unsafe {
            match (self.n - col).min(GROUP) / 16 {
                1 => self.columns::<16, 1, ODD>(pairs, dk, col),
                2 => self.columns::<12, 2, ODD>(pairs, dk, col),
                3 => self.columns::<8, 3, ODD>(pairs, dk, col),
                _ => self.columns::<6, 4, ODD>(pairs, dk, col),
            }
        }
    }

    /// The inner indices in blocks of `R`, then of 4, 2 and 1 ([`row_blocks`]), as the
    /// f32 kernel gradient takes them; `ODD`: runs are of odd length.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn columns<const R: usize, const NV: usize, const ODD: bool>(
        &self,
        pairs: &[u32],
        dk: &mut [f32],
        col: usize,
    ) {
        for (i, rows) in row_blocks(self.inner, R) {
            let dst = dk[i * self.n + col..].as_mut_ptr();
            // SAFETY: the caller's bounds.
            unsafe {
                match rows {
                    4 => self.sum::<4, NV, ODD>(pairs, i, dst, col),
                    2 => self.sum::<2, NV, ODD>(pairs, i, dst, col),
                    1 => self.sum::<1, NV, ODD>(pairs, i, dst, col),
                    _ => self.sum::<R, NV, ODD>(pairs, i, dst, col),
                }
            }
        }
    }

    /// Rows `i .. i + R` of the block, each summed over the runs' positions in order, a
    /// pair of positions at a time; then, where runs are of odd length (`ODD`), every
    /// run's last position alone (added apart, as in [`Products::block`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[inline]
    unsafe fn sum<const R: usize, const NV: usize, const ODD: bool>(
        &self,
        pairs_of_src: &[u32],
        i: usize,
        dst: *mut f32,
        col: usize,
    ) {
        let (pairs, half) = (self.len / 2, self.len.div_ceil(2));
        let row = self.step * self.channels;
        // SAFETY: the caller's bounds: every run's positions and inner indices i .. i + R
        // lie inside `src` and `pairs` (a pair's second position only below `len`), its
        // packed rows inside `dy`, and dst holds R rows of n.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NV]; R];
            for &(start, first) in self.runs {
                let xp = pairs_of_src.as_ptr().add(start * self.channels + i);
                let d = self.dy.as_ptr().add(first / self.len * half * self.n + col);
                for t in 0..pairs {
                    let dv = pairs_of::<NV>(d.add(t * self.n));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        dot(acc, broadcast(xp.add(2 * t * row + r)), &dv);
                    }
                }
            }
            if ODD {
                self.add_last_position::<R, NV>(i, col, &mut acc);
            }
            for (r, sums) in acc.iter().enumerate() {
                for (j, &v) in sums.iter().enumerate() {
                    std::arch::x86_64::_mm512_storeu_ps(dst.add(r * self.n + 16 * j), v);
                }
            }
        }
    }

    /// `acc` plus the products of odd runs' last positions alone (their pairs' second
    /// halves zero), run by run in order: [`sum`](Reduction::sum)'s end.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline(never)]
    unsafe fn add_last_position<const R: usize, const NV: usize>(
        &self,
        i: usize,
        col: usize,
        acc: &mut [[__m512; NV]; R],
    ) {
        let (last, half) = (self.len - 1, self.len.div_ceil(2));
        // SAFETY: `sum`'s bounds; position `last` lies below `len`.
        unsafe {
            for &(start, first) in self.runs {
                let x = self
                    .src
                    .as_ptr()
                    .add((start + last * self.step) * self.channels + i);
                let d = self
                    .dy
                    .as_ptr()
                    .add((first / self.len * half + half - 1) * self.n + col);
                let dv = pairs_of::<NV>(d);
                for (r, acc) in acc.iter_mut().enumerate() {
                    dot(acc, _mm512_set1_epi32(i32::from(*x.add(r))), &dv);
                }
            }
        }
    }
}

/// The pair of bf16 at `at` (unaligned) in every lane, broadcast from memory (no trip
/// through a general register, which costs a vector port per broadcast).
///
/// # Safety
/// AVX-512 F present; `at` readable for 4 bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn broadcast(at: *const u32) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe { _mm512_broadcastd_epi32(_mm_loadu_si32(at.cast())) }
}

/// `NV` vectors of 16 packed pairs from `at` on.
///
/// # Safety
/// AVX-512 F present; `at` readable for `16 · NV` u32.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn pairs_of<const NV: usize>(at: *const u32) -> [__m512i; NV] {
    // SAFETY: the caller's contract.
    std::array::from_fn(|j| unsafe { _mm512_loadu_si512(at.add(16 * j).cast()) })
}

/// `acc[j] += x · pairs[j]` pair by pair, `x` a pair broadcast to every lane.
///
/// # Safety
/// AVX-512 F and BF16 present.
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
unsafe fn dot<const NV: usize>(acc: &mut [__m512; NV], x: __m512i, pairs: &[__m512i; NV]) {
    // SAFETY: the caller's contract; the transmutes reinterpret 512 bits as 512 bits.
    unsafe {
        let x = std::mem::transmute::<__m512i, __m512bh>(x);
        for (a, &v) in acc.iter_mut().zip(pairs) {
            *a = _mm512_dpbf16_ps(*a, x, std::mem::transmute::<__m512i, __m512bh>(v));
        }
    }
}

/// `v`'s 16 f32 rounded to the nearest bf16, ties to even; a NaN made quiet, keeping its
/// top bits (as `half::bf16::from_f32`).
///
/// # Safety
/// AVX-512 F and BW present.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn round_to_bf16(v: __m512) -> __m256i {
    let bits = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    let rounded = _mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))),
        16,
    );
    let quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x0040));
    let nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet))
}

/// `R` rows of `16 · NV` lanes into `dst` as bf16 bits, row stride `n`.
///
/// # Safety
/// AVX-512 F and BW present; `dst` valid for `R` rows of `16 · NV` elements at stride `n`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn store<const R: usize, const NV: usize>(acc: &[[__m512; NV]; R], dst: *mut u16, n: usize) {
    for (r, row) in acc.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            // SAFETY: the caller's contract.
            unsafe { _mm256_storeu_si256(dst.add(r * n + 16 * j).cast(), round_to_bf16(v)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    fn f32_to_bf16(x: f32) -> u16 {
        bf16::from_f32(x).to_bits()
    }

    fn bf16_to_f32(b: u16) -> f32 {
        bf16::from_bits(b).to_f32()
    }

    /// The vector rounding is the scalar one on every kind of f32: ties both ways,
    /// subnormals, the largest finite values, infinities and NaNs.
    #[test]
    fn rounding_matches_the_scalar_rounding() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let mut values: Vec<u32> = (0..1u32 << 16)
            .map(|i| i.wrapping_mul(0x9e37_79b9))
            .collect();
        values.extend([
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_7fff,
            0x0000_0001,
            0x0040_0000,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0xffc0_1234,
            0x8000_0000,
        ]);
        for chunk in values.chunks_exact(16) {
            let f: Vec<f32> = chunk.iter().map(|&b| f32::from_bits(b)).collect();
            let mut got = [0u16; 16];
            // SAFETY: available() checked the features; `f` holds 16 f32 and `got` 16 u16.
            unsafe {
                let v = std::arch::x86_64::_mm512_loadu_ps(f.as_ptr());
                _mm256_storeu_si256(got.as_mut_ptr().cast(), round_to_bf16(v));
            }
            for (x, g) in f.iter().zip(got) {
                assert_eq!(g, f32_to_bf16(*x), "{:#010x}", x.to_bits());
            }
        }
    }

    /// The pair packings put element `2p` (or `j`) low and `2p + 1` (or `j + apart`)
    /// high, zeros past the end.
    #[test]
    fn packing_pairs_keeps_order_and_pads_with_zeros() {
        // Two blocks of 3 x 2.
        let w: Vec<u16> = (1..=12).collect();
        assert_eq!(
            pack_pairs(&w, 2, 3, 2),
            vec![
                1 | 3 << 16,
                2 | 4 << 16,
                5,
                6,
                7 | 9 << 16,
                8 | 10 << 16,
                11,
                12
            ]
        );
        let mut runs = vec![0; packed_runs_len(w.len(), 3, 2)];
        pack_runs_into(&w, 3, 2, &mut runs);
        assert_eq!(runs, pack_pairs(&w, 2, 3, 2));
        let steps = |src: &[u16], apart: usize| {
            let mut paired = vec![0; src.len()];
            pack_steps_into(src, apart, &mut paired);
            paired
        };
        assert_eq!(
            steps(&[1, 2, 3, 4, 5], 2),
            vec![1 | 3 << 16, 2 | 4 << 16, 3 | 5 << 16, 4, 5]
        );
        assert_eq!(steps(&[7], 3), vec![7]);
    }

    /// Products and Reduction sum exactly what their definitions say (small integers:
    /// every sum exact in f32 and bf16), for odd and even inner sizes and run lengths.
    #[test]
    fn products_and_reduction_match_their_definitions() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let bits = |v: f32| f32_to_bf16(v);
        let (channels, n, step) = (5usize, 32usize, 1usize);
        let offsets = [0usize, 3, 7];
        let src: Vec<u16> = (0..400).map(|i| bits(((i * 7) % 5) as f32 - 2.0)).collect();
        for inner in [1usize, 4, 5, 10] {
            let w: Vec<u16> = (0..offsets.len() * inner * n)
                .map(|i| bits(((i * 3) % 5) as f32 - 2.0))
                .collect();
            let packed = pack_pairs(&w, offsets.len(), inner, n);
            let products = Products {
                src: &src,
                channels,
                step,
                inner,
                offsets: &offsets,
                weights: &packed,
                weight_rows: inner.div_ceil(2),
                n,
            };
            let (first, m) = (2, 19);
            let mut dst = vec![0u16; m * n];
            products.rows(first, &mut dst);
            for r in 0..m {
                for j in 0..n {
                    let want: f32 = (0..offsets.len())
                        .flat_map(|p| (0..inner).map(move |i| (p, i)))
                        .map(|(p, i)| {
                            bf16_to_f32(src[(first + r + offsets[p]) * channels + i])
                                * bf16_to_f32(w[(p * inner + i) * n + j])
                        })
                        .sum();
                    assert_eq!(
                        bf16_to_f32(dst[r * n + j]),
                        want,
                        "inner {inner}, row {r}, column {j}"
                    );
                }
            }
        }
        for len in [1usize, 4, 5] {
            let runs: Vec<(usize, usize)> = (0..3).map(|r| (r * 11, r * len)).collect();
            let dy: Vec<u16> = (0..3 * len * n)
                .map(|i| bits(((i * 5) % 7) as f32 - 3.0))
                .collect();
            let mut packed = vec![0; packed_runs_len(dy.len(), len, n)];
            pack_runs_into(&dy, len, n, &mut packed);
            let inner = 7;
            let mut paired = vec![0; src.len()];
            pack_steps_into(&src, 2 * channels, &mut paired);
            let reduction = Reduction {
                src: &src,
                channels,
                step: 2,
                inner,
                dy: &packed,
                n,
                runs: &runs,
                len,
            };
            let mut dk = vec![0f32; inner * n];
            reduction.block(&paired, &mut dk);
            for i in 0..inner {
                for j in 0..n {
                    let want: f32 = runs
                        .iter()
                        .flat_map(|&(start, row)| (0..len).map(move |t| (start, row, t)))
                        .map(|(start, row, t)| {
                            bf16_to_f32(src[(start + t * 2) * channels + i])
                                * bf16_to_f32(dy[(row + t) * n + j])
                        })
                        .sum();
                    assert_eq!(dk[i * n + j], want, "len {len}, inner {i}, column {j}");
                }
            }
        }
    }
}
