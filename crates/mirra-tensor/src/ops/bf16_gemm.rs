//! bf16 matrix products on the CPU's 16-bit units, and the choice among them.
//!
//! At first use the process picks, in order: AMX tiles (`tdpbf16ps`, where the CPU has
//! them and Linux grants their state), AVX-512 BF16 (`vdpbf16ps`), or none, in which case
//! [`Tensor::matmul`](crate::Tensor::matmul) widens bf16 operands to f32 and rounds the
//! f32 product once. `MIRRA_BF16_MATMUL=amx|avx512-bf16|f32` asks for one; a path the CPU
//! lacks falls through to the next, and [`bf16_matmul_path`] says which ran and why.
//!
//! Every path accumulates in f32 and rounds each output once to nearest even: only the
//! order of the f32 additions differs between them (and so the last bits).
//!
//! The driver packs B once ([`bf16_pack`](super::bf16_pack)) and splits A's blocks of
//! `MR` rows across the kernel threads; each takes its blocks in groups whose f32 sums
//! fit in L2, and for each pass of k (as much of B as fits in L2 beside them) packs each
//! block of A over the pass (the next block's rows prefetched meanwhile) and runs the
//! kernel over its `MR x 32` sums, A's block reused from L1 across the columns; the last
//! pass rounds each block of sums to bf16 as the kernel leaves it in L1 (AVX-512 BW; else
//! the group's sums after it). Only B is packed
//! whole: A's padding and the f32 sums of a tall product (a convolution's `[N*H*W, k]`
//! patches) never go to memory. Packed operands and sums
//! stay allocated on their threads between products.

use std::cell::RefCell;
use std::sync::OnceLock;

use half::bf16;
use mirra_device::FloatElement;

#[cfg(target_arch = "x86_64")]
use super::amx::Amx;
#[cfg(target_arch = "x86_64")]
use super::avx512_bf16::Avx512Bf16;
use super::bf16_pack::{
    has_avx512bw, BlockKernel, Operand, PackedA, PackedB, PrefetchA, RowBlock, K_STEP, NR, PANEL,
};
use crate::threads::ensure_rayon_pool;

/// Bytes of B one pass over k covers, and of the sums of one group of row blocks: with
/// both, a quarter of a server core's L2 (2 MiB).
const PASS_BYTES: usize = 512 << 10;
/// k one pass covers at most (A's block of 32 rows: 32 KiB, in L1).
const KC: usize = 512;

/// A native bf16 kernel this CPU runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Native {
    #[cfg(target_arch = "x86_64")]
    Amx(Amx),
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16(Avx512Bf16),
}

/// The process's choice and its description.
#[derive(Debug)]
struct Choice {
    native: Option<Native>,
    path: String,
}

fn choice() -> &'static Choice {
    static CHOICE: OnceLock<Choice> = OnceLock::new();
    CHOICE.get_or_init(|| choose(std::env::var("MIRRA_BF16_MATMUL").ok().as_deref()))
}

/// What `MIRRA_BF16_MATMUL` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    /// The best there is (unset, empty, `auto` or `amx`).
    Best,
    Avx512Bf16,
    F32,
}

fn parse_request(asked: Option<&str>) -> Result<Request, String> {
    match asked.map(str::trim) {
        None | Some("") | Some("auto") | Some("amx") => Ok(Request::Best),
        Some("avx512-bf16") => Ok(Request::Avx512Bf16),
        Some("f32") => Ok(Request::F32),
        Some(other) => Err(format!(
            "MIRRA_BF16_MATMUL={other:?} is none of auto, amx, avx512-bf16, f32"
        )),
    }
}

/// Why `MIRRA_BF16_MATMUL` cannot be honoured as written, if it cannot (for programs that
/// reject bad settings before they start; the products themselves take the best path).
pub fn bf16_matmul_request_error() -> Option<String> {
    parse_request(std::env::var("MIRRA_BF16_MATMUL").ok().as_deref()).err()
}

/// The kernel asked for by `MIRRA_BF16_MATMUL` (`None`: the best there is), or the next
/// one down where this CPU lacks it.
fn choose(asked: Option<&str>) -> Choice {
    let converted = "converted to f32 and back";
    let rank = match parse_request(asked) {
        Ok(Request::Best) => 0,
        Ok(Request::Avx512Bf16) => 1,
        Ok(Request::F32) => {
            return Choice {
                native: None,
                path: format!("{converted} (MIRRA_BF16_MATMUL=f32)"),
            }
        }
        Err(e) => {
            return Choice {
                native: None,
                path: format!("{converted} ({e})"),
            }
        }
    };
    let mut why_not = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if rank == 0 {
            match Amx::new() {
                Ok(k) => {
                    return Choice {
                        native: Some(Native::Amx(k)),
                        path: "AMX tiles (tdpbf16ps), f32 accumulation".into(),
                    }
                }
                Err(e) => why_not.push(e),
            }
        }
        match Avx512Bf16::new() {
            Ok(k) => {
                let because = if why_not.is_empty() {
                    "MIRRA_BF16_MATMUL=avx512-bf16".to_string()
                } else {
                    why_not.join("; ")
                };
                return Choice {
                    native: Some(Native::Avx512Bf16(k)),
                    path: format!("AVX-512 BF16 (vdpbf16ps), f32 accumulation ({because})"),
                };
            }
            Err(e) => why_not.push(e),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = rank;
        why_not.push("no native bf16 kernel for this architecture".into());
    }
    Choice {
        native: None,
        path: format!("{converted} ({})", why_not.join("; ")),
    }
}

/// The native kernel bf16 products use in this process, if any.
pub(super) fn native() -> Option<Native> {
    choice().native
}

/// How this process computes bf16 matrix products, for reports: the kernel and, where it
/// is not the fastest kind, why.
pub fn bf16_matmul_path() -> String {
    choice().path.clone()
}

/// What a thread keeps between products: B packed (on the calling thread), and the row
/// block of A and its f32 sums (on each kernel thread).
#[derive(Debug, Default)]
struct Scratch {
    a: PackedA,
    b: PackedB,
    c: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Runs `f` on this thread's scratch (a fresh one if a product is already using it).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

impl Native {
    /// `out = a x b` for `m x k` and `k x n` bf16 operands (`out`: `m x n`, row-major),
    /// summed in f32 and rounded once; across the kernel threads when `threads > 1`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn product(
        &self,
        a: Operand<'_>,
        b: Operand<'_>,
        m: usize,
        k: usize,
        n: usize,
        out: &mut [bf16],
        threads: usize,
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Native::Amx(kernel) => product(kernel, a, b, m, k, n, out, threads),
            #[cfg(target_arch = "x86_64")]
            Native::Avx512Bf16(kernel) => product(kernel, a, b, m, k, n, out, threads),
        }
    }
}

/// [`Native::product`] for one kernel.
#[allow(clippy::too_many_arguments)]
fn product<K: BlockKernel>(
    kernel: &K,
    a: Operand<'_>,
    b: Operand<'_>,
    m: usize,
    k: usize,
    n: usize,
    out: &mut [bf16],
    threads: usize,
) {
    debug_assert_eq!(out.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(bf16::ZERO);
        return;
    }
    with_scratch(|scratch| {
        scratch.b.pack(b, k, n, threads);
        blocks(kernel, a, &scratch.b, m, k, n, out, threads);
    });
}

/// The row blocks of `out = a x b`, `b` packed, split into one run per kernel thread.
/// Each block's rows of A are packed into the thread's scratch, multiplied against B in
/// passes of [`NC`] columns and [`KC`] k's into f32 sums, and rounded into `out`.
#[allow(clippy::too_many_arguments)]
fn blocks<K: BlockKernel>(
    kernel: &K,
    a: Operand<'_>,
    pb: &PackedB,
    m: usize,
    k: usize,
    n: usize,
    out: &mut [bf16],
    threads: usize,
) {
    let mr = K::MR;
    let kp = k.div_ceil(K_STEP) * K_STEP;
    let np = n.div_ceil(NR) * NR;
    // Rows of sums a cache line longer than the block row: a power-of-two stride would map
    // the 16 rows of a tile onto one L1 set.
    let ldc = np + 16;
    // A pass of k over every column of B stays in L2 (512 KiB of it), and the sums of a
    // group of row blocks in L2 beside it, so that a deep product (a weight gradient:
    // k = N*H*W) reads each pass of B once per group instead of once per block.
    let kc = ((PASS_BYTES / (np * 2)) / K_STEP * K_STEP).clamp(K_STEP, KC);
    // One pass (a shallow product, a convolution's forward): a group of one block, whose
    // sums stay in L1 until rounded.
    let group = if kp <= kc {
        1
    } else {
        (PASS_BYTES / (mr * ldc * 4)).max(1)
    };
    // Sums rounded to bf16 block by block as the last pass leaves them, still in L1
    // ([`round_block`]), where the CPU has the instructions; else group by group after it.
    let fused = has_avx512bw();
    // Row blocks `first..` whose rows of `out` are `out_part`.
    let run = |first: usize, out_part: &mut [bf16]| {
        with_scratch(|s| {
            if s.c.len() < group * mr * ldc {
                s.c.resize(group * mr * ldc, 0.0);
            }
            kernel.begin();
            for (g, out_rows) in out_part.chunks_mut(group * mr * n).enumerate() {
                let first_block = first + g * group;
                let rows = out_rows.len() / n;
                let blocks = rows.div_ceil(mr);
                for pc in (0..kp).step_by(kc) {
                    let k_range = (pc, (pc + kc).min(kp));
                    let last = k_range.1 == kp;
                    for b in 0..blocks {
                        let block = |first| RowBlock {
                            a,
                            first,
                            m,
                            k,
                            mr,
                            k_range,
                        };
                        s.a.pack_block(block((first_block + b) * mr));
                        let sums = s.c[b * mr * ldc..].as_mut_ptr();
                        // The next block's rows of A on their way while this one runs.
                        let next = (first_block + b + 1) * mr;
                        let mut prefetch = PrefetchA::new(block(next), np / NR);
                        for j in (0..np).step_by(NR) {
                            prefetch.step();
                            // SAFETY: `s.a` is a block of `mr = K::MR` rows packed over
                            // `k_range`; `pb` holds panels `j / PANEL` and the next (`j + NR
                            // <= np`) over `0..kp`, which holds `k_range` (ends on
                            // multiples of K_STEP); the sums at block `b` and column `j`
                            // (row stride `ldc >= np`) are `mr x NR` inside `s.c` (`group *
                            // mr * ldc` long, `b < group`); `begin` ran on this thread.
                            unsafe {
                                kernel.block(
                                    &s.a,
                                    pb,
                                    j / PANEL,
                                    k_range,
                                    sums.add(j),
                                    ldc,
                                    pc > 0,
                                );
                            }
                            if fused && last {
                                let out = &mut out_rows[b * mr * n + j..];
                                let (rows, cols) = ((rows - b * mr).min(mr), (n - j).min(NR));
                                // SAFETY: `has_avx512bw` saw AVX-512 BW (and so F); the block's
                                // sums are `rows x cols` at `sums + j`, `ldc` apart, and
                                // `out` holds `(rows - 1) * n + cols` values from its
                                // start (row `b * mr`, column `j < n` of the group's rows).
                                #[cfg(target_arch = "x86_64")]
                                unsafe {
                                    round_block(sums.add(j), ldc, out, n, rows, cols)
                                };
                            }
                        }
                    }
                }
                if fused {
                    continue;
                }
                let sums = &s.c;
                mirra_device::vectorize(
                    #[inline(always)]
                    || {
                        for (row, sums) in out_rows.chunks_exact_mut(n).zip(sums.chunks_exact(ldc))
                        {
                            for (d, &x) in row.iter_mut().zip(&sums[..n]) {
                                *d = bf16::from_acc(x);
                            }
                        }
                    },
                );
            }
            kernel.end();
        })
    };
    let blocks = m.div_ceil(mr);
    if threads <= 1 || blocks < 2 {
        run(0, out);
        return;
    }
    ensure_rayon_pool();
    let per = blocks.div_ceil(threads);
    rayon::scope(|s| {
        for (t, out_part) in out.chunks_mut(per * mr * n).enumerate() {
            let run = &run;
            s.spawn(move |_| run(t * per, out_part));
        }
    });
}

/// Rounds `rows` rows of `cols` (at most [`NR`]) f32 sums, `ldc` apart, to bf16 into
/// `out` (rows `n` apart), bit for bit as the other paths' `bf16::from_acc`: to nearest
/// even by integer arithmetic, subnormals kept, NaN made quiet.
///
/// # Safety
/// The CPU has AVX-512 F and BW; `sums` holds `rows` rows of `cols` f32, `ldc` apart;
/// `out` holds `(rows - 1) * n + cols` values, `cols <= n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn round_block(
    sums: *const f32,
    ldc: usize,
    out: &mut [bf16],
    n: usize,
    rows: usize,
    cols: usize,
) {
    use std::arch::x86_64::{
        __m512i, __mmask16, _mm512_add_epi32, _mm512_and_si512, _mm512_cmpgt_epu32_mask,
        _mm512_loadu_si512, _mm512_mask_cvtepi32_storeu_epi16, _mm512_mask_mov_epi32,
        _mm512_maskz_loadu_epi32, _mm512_or_si512, _mm512_permutex2var_epi16, _mm512_set1_epi32,
        _mm512_srli_epi32, _mm512_storeu_si512,
    };
    debug_assert!(cols <= NR && cols <= n && rows >= 1);
    assert!(out.len() >= (rows - 1) * n + cols);
    let out = out.as_mut_ptr().cast::<i16>();
    // Each lane's bf16 in its upper half: the f32 bits plus just under half a unit plus
    // the kept part's lowest bit, or a NaN's bits with the quiet bit set.
    let upper = |v: __m512i| {
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(v), _mm512_set1_epi32(1));
        let rounded = _mm512_add_epi32(v, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
        let magnitude = _mm512_and_si512(v, _mm512_set1_epi32(0x7fff_ffff));
        let nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7f80_0000));
        let quiet = _mm512_or_si512(v, _mm512_set1_epi32(0x0040_0000));
        _mm512_mask_mov_epi32(rounded, nan, quiet)
    };
    // The upper words of two vectors of 16 lanes, in order: 32 bf16.
    let mut odd = [0u16; 32];
    for (j, w) in odd.iter_mut().enumerate() {
        *w = (2 * j + 1) as u16;
    }
    // SAFETY: a load of the 64 bytes of a local array.
    let odd = unsafe { _mm512_loadu_si512(odd.as_ptr().cast()) };
    for r in 0..rows {
        let (row, dst) = (sums.wrapping_add(r * ldc), out.wrapping_add(r * n));
        // SAFETY: columns `..cols` of row `r` of both (the contract); masked lanes are
        // neither read nor written.
        unsafe {
            if cols == NR {
                let lo = upper(_mm512_loadu_si512(row.cast()));
                let hi = upper(_mm512_loadu_si512(row.add(16).cast()));
                _mm512_storeu_si512(dst.cast(), _mm512_permutex2var_epi16(lo, odd, hi));
                continue;
            }
            for c0 in (0..cols).step_by(16) {
                let lanes = (cols - c0).min(16);
                let mask: __mmask16 = (u32::MAX >> (32 - lanes)) as u16;
                let v = upper(_mm512_maskz_loadu_epi32(mask, row.add(c0).cast()));
                let bits = _mm512_srli_epi32::<16>(v);
                _mm512_mask_cvtepi32_storeu_epi16(dst.add(c0), mask, bits);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Every native kernel this CPU runs, by name; the others named as skipped.
    fn kernels() -> Vec<(&'static str, Native)> {
        let mut ks = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            match Amx::new() {
                Ok(k) => ks.push(("amx", Native::Amx(k))),
                Err(e) => eprintln!("amx kernel not tested here: {e}"),
            }
            match Avx512Bf16::new() {
                Ok(k) => ks.push(("avx512-bf16", Native::Avx512Bf16(k))),
                Err(e) => eprintln!("avx512-bf16 kernel not tested here: {e}"),
            }
        }
        ks
    }

    fn bits(xs: &[f32]) -> Vec<u16> {
        xs.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
    }

    /// Checks one product of operands laid out with the given strides against the exact
    /// product of the same bf16 values: every output within one bf16 rounding of it plus
    /// the f32 summation error bound, and the rounding is not worse than the f32 path's.
    #[allow(clippy::too_many_arguments)]
    fn check(
        kernel: &Native,
        name: &str,
        m: usize,
        k: usize,
        n: usize,
        a_t: bool,
        b_t: bool,
        threads: usize,
        seed: u64,
    ) -> Result<(), TestCaseError> {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let va: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        let vb: Vec<f32> = (0..k * n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        let (da, db) = (bits(&va), bits(&vb));
        // a(i, p) at i*k + p, or the transposed storage p*m + i.
        let sa: Vec<u16> = if a_t {
            (0..k * m).map(|x| da[(x % m) * k + x / m]).collect()
        } else {
            da.clone()
        };
        let sb: Vec<u16> = if b_t {
            (0..n * k).map(|x| db[(x % k) * n + x / k]).collect()
        } else {
            db.clone()
        };
        let a = Operand {
            data: &sa,
            offset: 0,
            row_stride: if a_t { 1 } else { k },
            col_stride: if a_t { m } else { 1 },
        };
        let b = Operand {
            data: &sb,
            offset: 0,
            row_stride: if b_t { 1 } else { n },
            col_stride: if b_t { k } else { 1 },
        };
        let mut out = vec![bf16::NAN; m * n];
        kernel.product(a, b, m, k, n, &mut out, threads);
        let at = format!("{name} {m}x{k}x{n} (a^T {a_t}, b^T {b_t}, {threads} threads)");
        verify(&out, &da, &db, m, k, n).map_err(|e| TestCaseError::fail(format!("{at}: {e}")))
    }

    /// Every output of `a x b` (row-major bf16 bits) within one bf16 rounding of the exact
    /// product plus the f32 summation error bound `2 k 2^-24 sum |a b|`.
    fn verify(
        out: &[bf16],
        da: &[u16],
        db: &[u16],
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<(), String> {
        let val = |d: &[u16], i: usize| f64::from(bf16::from_bits(d[i]).to_f32());
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut magnitude) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let t = val(da, i * k + p) * val(db, p * n + j);
                    exact += t;
                    magnitude += t.abs();
                }
                let got = f64::from(out[i * n + j].to_f32());
                let bound =
                    exact.abs() * 2f64.powi(-8) + 2.0 * k as f64 * 2f64.powi(-24) * magnitude;
                if (got - exact).abs() > bound {
                    return Err(format!(
                        "out[{i}][{j}] = {got}, exact {exact}, bound {bound}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Edges of every blocking: rows around the block heights (12, 32), k around a step
    /// (32) and a pass (512), columns around a panel pair (32) and a pass (256).
    #[test]
    fn native_kernels_match_the_exact_product_at_every_edge() {
        let shapes = [
            (1, 1, 1),
            (1, 3, 17),
            (12, 31, 32),
            (13, 33, 33),
            (32, 32, 31),
            (33, 64, 64),
            (47, 513, 40),
            (70, 100, 257),
            (5, 1100, 3),
        ];
        for (name, kernel) in kernels() {
            for (s, &(m, k, n)) in shapes.iter().enumerate() {
                for threads in [1, 2] {
                    check(&kernel, name, m, k, n, false, false, threads, s as u64).unwrap();
                }
                check(&kernel, name, m, k, n, true, false, 2, 100 + s as u64).unwrap();
                check(&kernel, name, m, k, n, false, true, 1, 200 + s as u64).unwrap();
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn native_kernels_match_the_exact_product(
            m in 1usize..70, k in 1usize..90, n in 1usize..70,
            a_t: bool, b_t: bool, seed: u64,
        ) {
            for (name, kernel) in kernels() {
                check(&kernel, name, m, k, n, a_t, b_t, 2, seed)?;
            }
        }
    }

    /// `verify` rejects a kernel that drops the last step of k (an off-by-one in the step
    /// count): the check above must be able to fail.
    #[test]
    fn the_check_rejects_a_product_missing_a_step() {
        for (name, kernel) in kernels() {
            let (m, k, n) = (16, 64, 32);
            let va: Vec<f32> = (0..m * k).map(|x| ((x * 7) % 11) as f32 / 11.0).collect();
            let vb: Vec<f32> = (0..k * n).map(|x| ((x * 5) % 13) as f32 / 13.0).collect();
            let (da, db) = (bits(&va), bits(&vb));
            let a = Operand {
                data: &da,
                offset: 0,
                row_stride: k,
                col_stride: 1,
            };
            let b = Operand {
                data: &db,
                offset: 0,
                row_stride: n,
                col_stride: 1,
            };
            let mut out = vec![bf16::ZERO; m * n];
            kernel.product(a, b, m, k, n, &mut out, 1);
            verify(&out, &da, &db, m, k, n).unwrap();
            // The mutant: only the first 32 of the 64 k's.
            kernel.product(a, b, m, 32, n, &mut out, 1);
            assert!(
                verify(&out, &da, &db, m, k, n).is_err(),
                "{name}: a product missing a step passed the check"
            );
        }
    }

    /// The kernels' rounding of a block rounds as `bf16::from_acc` does, bit for bit (ties
    /// both ways, subnormals, infinities, NaN with and without the quiet bit), on whole
    /// and partial blocks, and writes nothing outside the block.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn blocks_round_as_the_scalar_rounding_does() {
        if !has_avx512bw() {
            eprintln!("round_block not tested here: no AVX-512 BW");
            return;
        }
        let specials = [
            0x3f80_8000u32, // a tie, kept part even: down
            0x3f81_8000,    // a tie, kept part odd: up
            0x3f80_8001,
            0x3f80_7fff,
            0x0000_0001, // subnormal
            0x807f_ffff,
            0x7f7f_ffff, // rounds to infinity
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001, // signalling NaN: made quiet
            0xffc0_1234,
            0x8000_0000,
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        };
        let (ldc, n) = (NR + 16, 40);
        for (rows, cols) in [(12, 32), (1, 32), (5, 17), (12, 16), (3, 7), (2, 1)] {
            let sums: Vec<f32> = (0..rows * ldc)
                .map(|i| f32::from_bits(specials.get(i % 97).copied().unwrap_or_else(&mut next)))
                .collect();
            let sentinel = bf16::from_bits(0x5555);
            let mut out = vec![sentinel; rows * n];
            // SAFETY: AVX-512 BW is here; `sums` holds `rows` rows of `ldc >= cols`, `out`
            // `rows` rows of `n >= cols`.
            unsafe { round_block(sums.as_ptr(), ldc, &mut out, n, rows, cols) };
            for r in 0..rows {
                for c in 0..n {
                    let got = out[r * n + c].to_bits();
                    let want = match c < cols {
                        true => bf16::from_acc(sums[r * ldc + c]).to_bits(),
                        false => sentinel.to_bits(),
                    };
                    assert_eq!(got, want, "row {r}, column {c} of {rows} x {cols}");
                }
            }
        }
    }

    #[test]
    fn an_unknown_request_names_the_choices() {
        let c = choose(Some("tiles"));
        assert!(c.native.is_none());
        assert!(
            c.path
                .contains("\"tiles\" is none of auto, amx, avx512-bf16, f32"),
            "{}",
            c.path
        );
        assert!(choose(Some("f32")).native.is_none());
    }
}
