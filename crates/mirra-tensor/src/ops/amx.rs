//! Intel AMX: the bf16 micro-kernel on tile registers (`tdpbf16ps`), and what the CPU and
//! Linux must grant before a thread may touch a tile.
//!
//! AMX's intrinsics and its `is_x86_feature_detected!` names are unstable Rust, so the
//! instructions are written with `asm!` and the feature is read from CPUID (leaf 7: EDX
//! bit 22 AMX-BF16, bit 24 AMX-TILE). Linux hands the 8 KiB of tile state out only on
//! request (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, once per process); a
//! kernel or hypervisor that refuses leaves the caller on the next path.
//!
//! Eight tiles of 16 rows x 64 bytes: tmm0-3 hold a 32 x 32 block of f32 sums, tmm4-5 two
//! 16-row slices of A (16 x 32 bf16 each), tmm6-7 two 16-column slices of B in pairs of
//! rows (the "VNNI" layout: 16 pairs x 16 columns x 2 bf16). Every `tdpbf16ps` adds 16 x
//! 16 x 32 products into f32; the hardware reads bf16 subnormal inputs as zero and rounds
//! to nearest even, as the other paths do with flush-to-zero set.

use std::arch::asm;
use std::sync::OnceLock;

use super::bf16_pack::{BlockKernel, PackedA, PackedB, K_STEP, PANEL};

/// Rows of A (and of the f32 block) one call of the micro-kernel covers.
pub(super) const MR: usize = 32;

/// Whether this CPU has AMX-BF16 tiles and Linux granted this process their state; asked
/// once. `Err` says why not.
pub(super) fn available() -> Result<(), String> {
    static GRANTED: OnceLock<Result<(), String>> = OnceLock::new();
    GRANTED.get_or_init(request).clone()
}

fn request() -> Result<(), String> {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // Leaf 7 is valid when the maximum leaf (leaf 0's EAX) reaches it.
    let edx = if __cpuid(0).eax >= 7 {
        __cpuid_count(7, 0).edx
    } else {
        0
    };
    if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
        return Err("this CPU has no AMX-BF16 tiles".into());
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes two integers and touches no
    // memory of ours; it fails cleanly on kernels that do not know it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if rc != 0 {
        return Err(format!(
            "Linux refused the AMX tile state (arch_prctl: {})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The AMX micro-kernel. Only made by [`Amx::new`], which checks [`available`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Amx(());

impl Amx {
    pub(super) fn new() -> Result<Self, String> {
        available().map(|()| Amx(()))
    }
}

/// `ldtilecfg`'s operand: palette 1, every tile 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn full_tiles() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
            c[48 + t] = 16;
        }
        TileConfig(c)
    }
}

impl BlockKernel for Amx {
    const MR: usize = MR;

    fn begin(&self) {
        let config = TileConfig::full_tiles();
        // SAFETY: `Amx` exists only once the CPU has the tiles and Linux granted their
        // state to this process; the configuration is a valid palette-1 layout.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
    }

    fn end(&self) {
        // SAFETY: as in `begin`; releasing tiles that were configured is always valid.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }

    /// # Safety
    /// As the trait's; and [`begin`](BlockKernel::begin) ran on this thread since the
    /// last [`end`](BlockKernel::end).
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
        let (k0, k1) = k_range;
        let steps = (k1 - k0) / K_STEP;
        let a0 = a.at(k0);
        let b0 = b.at(panel, k0);
        let b1 = b.at(panel + 1, k0);
        let c_stride = ldc * 4;
        // SAFETY: the caller's contract gives a 32 x 32 f32 block at `c` with row stride
        // `ldc`, a packed block of A's 32 rows and B's panels `panel, panel+1`, both over
        // k in `k0..k1`; tile rows are 64 bytes, A's two slices of 16 rows of 32 bf16 and
        // B's 16 pairs of rows are 1 KiB each, rows 64 bytes apart, so every tile load and
        // store stays inside them. Tiles were configured by `begin` on this thread.
        unsafe {
            let c16 = c.add(16 * ldc);
            if accumulate {
                asm!(
                    "tileloadd tmm0, [{c0} + {s}*1]",
                    "tileloadd tmm1, [{c1} + {s}*1]",
                    "tileloadd tmm2, [{c2} + {s}*1]",
                    "tileloadd tmm3, [{c3} + {s}*1]",
                    c0 = in(reg) c, c1 = in(reg) c.add(16), c2 = in(reg) c16,
                    c3 = in(reg) c16.add(16), s = in(reg) c_stride,
                    options(nostack, readonly),
                );
            } else {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem),
                );
            }
            if steps > 0 {
                asm!(
                    "2:",
                    "tileloadd tmm4, [{a0} + {s64}*1]",
                    "tileloadd tmm6, [{b0} + {s64}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {s64}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {s64}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "add {a0}, {a_step}",
                    "add {a1}, {a_step}",
                    "add {b0}, {b_step}",
                    "add {b1}, {b_step}",
                    "dec {n}",
                    "jnz 2b",
                    a0 = inout(reg) a0 => _,
                    a1 = inout(reg) a0.add(16 * K_STEP) => _,
                    b0 = inout(reg) b0 => _,
                    b1 = inout(reg) b1 => _,
                    n = inout(reg) steps => _,
                    s64 = in(reg) 64usize,
                    a_step = const MR * K_STEP * 2,
                    b_step = const PANEL * K_STEP * 2,
                    options(nostack, readonly),
                );
            }
            asm!(
                "tilestored [{c0} + {s}*1], tmm0",
                "tilestored [{c1} + {s}*1], tmm1",
                "tilestored [{c2} + {s}*1], tmm2",
                "tilestored [{c3} + {s}*1], tmm3",
                c0 = in(reg) c, c1 = in(reg) c.add(16), c2 = in(reg) c16,
                c3 = in(reg) c16.add(16), s = in(reg) c_stride,
                options(nostack),
            );
        }
    }
}
