//! AVX-512 BF16: the bf16 micro-kernel on `vdpbf16ps`, for CPUs with the instruction and no
//! AMX (AMD Zen 4 and later, Intel Cooper Lake), or where Linux refuses the tile state.
//!
//! One block is 12 rows x 32 columns of f32 sums in 24 of the 32 vector registers. Each
//! step broadcasts a row's pair of A values `(a[i][2p], a[i][2p+1])` to every lane and
//! multiplies it against a panel's 16 pairs of B: `vdpbf16ps` adds both products into each
//! f32 lane, rounding once to nearest even, with bf16 subnormal inputs read as zero.

use std::arch::x86_64::{
    __m512bh, _mm512_dpbf16_ps, _mm512_loadu_ps, _mm512_loadu_si512, _mm512_set1_epi32,
    _mm512_setzero_ps, _mm512_storeu_ps,
};

use super::bf16_pack::{BlockKernel, PackedA, PackedB, K_STEP, PANEL};

/// Rows of one block.
pub(super) const MR: usize = 12;

/// The AVX-512 BF16 micro-kernel. Only made by [`Avx512Bf16::new`], which checks the CPU.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx512Bf16(());

impl Avx512Bf16 {
    pub(super) fn new() -> Result<Self, String> {
        if std::arch::is_x86_feature_detected!("avx512bf16") {
            Ok(Avx512Bf16(()))
        } else {
            Err("this CPU has no AVX-512 BF16".into())
        }
    }
}

impl BlockKernel for Avx512Bf16 {
    const MR: usize = MR;

    unsafe fn block(
        &self,
        a: &PackedA,
        b: &PackedB,
        panel: usize,
        k_range: (usize, usize),
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: `Avx512Bf16` exists only where the CPU has AVX-512 BF16 (and so
        // AVX-512 F); the pointers satisfy `block`'s contract, passed on unchanged.
        unsafe { block_12x32(a, b, panel, k_range, c, ldc, accumulate) }
    }
}

/// # Safety
/// The CPU has AVX-512 F and BF16, and the arguments satisfy [`BlockKernel::block`].
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_12x32(
    a: &PackedA,
    b: &PackedB,
    panel: usize,
    (k0, k1): (usize, usize),
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let mut left = [_mm512_setzero_ps(); MR];
    let mut right = [_mm512_setzero_ps(); MR];
    // SAFETY: every pointer below is in bounds: `c` holds MR rows of 32 f32, `ldc` apart; A's block
    // holds MR rows of K_STEP bf16 per step and B's two panels 2 * PANEL bf16 per pair of
    // rows, for every step of `k0..k1` (the caller's contract).
    unsafe {
        if accumulate {
            for r in 0..MR {
                left[r] = _mm512_loadu_ps(c.add(r * ldc));
                right[r] = _mm512_loadu_ps(c.add(r * ldc + PANEL));
            }
        }
        for step in (k0..k1).step_by(K_STEP) {
            let a_step = a.at(step);
            let (b0, b1) = (b.at(panel, step), b.at(panel + 1, step));
            for pair in 0..K_STEP / 2 {
                let vb0: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(b0.add(pair * 2 * PANEL).cast()));
                let vb1: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(b1.add(pair * 2 * PANEL).cast()));
                for r in 0..MR {
                    let both = a_step
                        .add(r * K_STEP + 2 * pair)
                        .cast::<i32>()
                        .read_unaligned();
                    let va: __m512bh = std::mem::transmute(_mm512_set1_epi32(both));
                    left[r] = _mm512_dpbf16_ps(left[r], va, vb0);
                    right[r] = _mm512_dpbf16_ps(right[r], va, vb1);
                }
            }
        }
        for r in 0..MR {
            _mm512_storeu_ps(c.add(r * ldc), left[r]);
            _mm512_storeu_ps(c.add(r * ldc + PANEL), right[r]);
        }
    }
}
