//! Flush-to-zero and denormals-are-zero on the threads that run kernels.
//!
//! A subnormal float (below 2^-126 for f32) takes a micro-code assist on x86 CPUs: an
//! operation on one costs tens to hundreds of cycles instead of one. Training produces them
//! once the loss nears zero: gradients of 1e-20 square to 1e-40 in Adam's second moment,
//! and a step then runs 2.5-3x slower. Flushing them to zero (MXCSR's FTZ for results, DAZ
//! for inputs; FPCR.FZ on Arm) removes the cost, as `torch.set_flush_denormal(True)` does
//! for PyTorch; mirra does it by default. The values lost are below 1.2e-38, far under
//! anything that moves a weight.
//!
//! The switch is per thread in hardware. The policy here is process-wide
//! ([`set_flush_denormal`], `MIRRA_FLUSH_DENORMAL=0` to turn it off) and reaches each
//! thread the next time it runs a kernel: [`ensure_this_thread`] is called by
//! [`vectorize`](crate::vectorize) and at the other kernel entry points (matmul, which also
//! reaches the rayon threads gemm runs on, and the collectives' reductions). It costs one
//! thread-local read when the policy has not changed.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The policy as a generation: odd = flush, even = keep. Bumped by every change, so that a
/// thread can tell with one comparison whether it applied the current one.
static POLICY: AtomicU64 = AtomicU64::new(0);
/// Whether [`POLICY`] was initialised from the environment.
static FROM_ENV: OnceLock<()> = OnceLock::new();

thread_local! {
    /// The policy generation this thread applied last (0: none yet).
    static APPLIED: Cell<u64> = const { Cell::new(0) };
}

fn policy() -> u64 {
    FROM_ENV.get_or_init(|| {
        let on = !matches!(
            std::env::var("MIRRA_FLUSH_DENORMAL").as_deref(),
            Ok("0" | "false" | "off")
        );
        // The first generation: 1 (flush) or 2 (keep); a set_flush_denormal that raced
        // ahead of this has already moved past it, and compare_exchange leaves it alone.
        let _ = POLICY.compare_exchange(
            0,
            if on { 1 } else { 2 },
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    });
    POLICY.load(Ordering::Acquire)
}

/// Whether kernels flush subnormal floats to zero (the process-wide policy).
pub fn flush_denormal() -> bool {
    policy() % 2 == 1
}

/// Sets the process-wide policy and applies it to the calling thread at once; other
/// threads apply it at their next kernel. Returns the previous policy.
pub fn set_flush_denormal(on: bool) -> bool {
    let mut current = policy();
    loop {
        let was = current % 2 == 1;
        // The next generation of the wanted parity.
        let next = if was == on { current + 2 } else { current + 1 };
        match POLICY.compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                ensure_this_thread();
                return was;
            }
            Err(now) => current = now,
        }
    }
}

/// The policy generation, for callers that apply it to threads they do not run on (a
/// thread pool): when it differs from what they applied last, they apply it again.
pub fn policy_generation() -> u64 {
    policy()
}

/// Applies the current policy to the calling thread, unless it already has.
#[inline]
pub fn ensure_this_thread() {
    let generation = policy();
    APPLIED.with(|applied| {
        if applied.get() != generation {
            set_thread_flush(generation % 2 == 1);
            applied.set(generation);
        }
    });
}

/// Whether the calling thread's floating-point unit flushes subnormals now (read from the
/// hardware register; `false` on architectures without the switch).
pub fn this_thread_flushes() -> bool {
    thread_flush()
}

#[cfg(target_arch = "x86_64")]
mod arch {
    /// MXCSR's flush-to-zero (results) and denormals-are-zero (inputs) bits.
    const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

    fn read() -> u32 {
        let mut csr = 0u32;
        // SAFETY: stmxcsr stores the 32-bit MXCSR register to the given address, a live
        // local; SSE is part of the x86-64 baseline.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
        }
        csr
    }

    pub fn set(on: bool) {
        let csr = read();
        let new = if on { csr | FTZ_DAZ } else { csr & !FTZ_DAZ };
        if new != csr {
            // SAFETY: ldmxcsr loads MXCSR from a live local; only the FTZ and DAZ bits
            // differ from the current value, so rounding and exception masks are kept.
            unsafe {
                std::arch::asm!("ldmxcsr [{}]", in(reg) &new, options(nostack, preserves_flags, readonly));
            }
        }
    }

    pub fn get() -> bool {
        read() & FTZ_DAZ == FTZ_DAZ
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    /// FPCR's flush-to-zero bit (inputs and results).
    const FZ: u64 = 1 << 24;

    fn read() -> u64 {
        let fpcr: u64;
        // SAFETY: reading FPCR has no side effects.
        unsafe { std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack)) };
        fpcr
    }

    pub fn set(on: bool) {
        let fpcr = read();
        let new = if on { fpcr | FZ } else { fpcr & !FZ };
        if new != fpcr {
            // SAFETY: writes FPCR with only the FZ bit changed.
            unsafe { std::arch::asm!("msr fpcr, {}", in(reg) new, options(nomem, nostack)) };
        }
    }

    pub fn get() -> bool {
        read() & FZ != 0
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod arch {
    pub fn set(_on: bool) {}
    pub fn get() -> bool {
        false
    }
}

fn set_thread_flush(on: bool) {
    arch::set(on);
}

fn thread_flush() -> bool {
    arch::get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The tests change the process-wide policy: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// The smallest normal f32 times 1/4: a subnormal unless flushed. LLVM treats float
    /// arithmetic as free of side effects and folds or moves it across an MXCSR write at
    /// will; a call that is never inlined and reads its operands through volatile loads
    /// stays where the test puts it.
    #[inline(never)]
    fn subnormal_product() -> f32 {
        let (a, b) = (f32::MIN_POSITIVE, 0.25f32);
        // SAFETY: volatile reads of two live locals.
        unsafe { std::ptr::read_volatile(&a) * std::ptr::read_volatile(&b) }
    }

    /// The smallest subnormal times 2: 2^-148 unless inputs are treated as zero (DAZ).
    #[inline(never)]
    fn subnormal_input_doubled() -> f32 {
        let (a, b) = (f32::from_bits(1), 2.0f32);
        // SAFETY: volatile reads of two live locals.
        unsafe { std::ptr::read_volatile(&a) * std::ptr::read_volatile(&b) }
    }

    #[test]
    fn the_policy_reaches_the_thread_and_flushes_subnormals() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        // On a fresh thread, so that the test thread's own state does not matter.
        std::thread::spawn(|| {
            set_flush_denormal(true);
            assert!(this_thread_flushes());
            assert_eq!(subnormal_product(), 0.0);
            // Inputs too (DAZ): a subnormal operand reads as zero.
            assert_eq!(subnormal_input_doubled(), 0.0);

            set_flush_denormal(false);
            assert!(!this_thread_flushes());
            let p = subnormal_product();
            assert!(p > 0.0 && !p.is_normal(), "{p:e}");
            set_flush_denormal(true);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn another_thread_applies_the_policy_at_its_next_kernel() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        set_flush_denormal(true);
        let flushes = std::thread::spawn(|| {
            // Linux copies the spawning thread's MXCSR into a new thread; a thread made by
            // code that never asked (a library's pool) starts without the flag: model that.
            set_thread_flush(false);
            let before = subnormal_product();
            ensure_this_thread();
            (before, this_thread_flushes(), subnormal_product())
        })
        .join()
        .unwrap();
        // Compared as bits: this thread treats subnormal inputs as zero (DAZ), so `> 0.0`
        // would read the child's subnormal as 0.
        assert_ne!(
            flushes.0.to_bits(),
            0,
            "flushed before the kernel entry point"
        );
        assert!(flushes.1);
        assert_eq!(flushes.2.to_bits(), 0);
    }

    #[test]
    fn generations_alternate_parity_with_the_switch() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let g0 = policy_generation();
        let was = set_flush_denormal(true);
        let g1 = policy_generation();
        assert!(g1 > g0 && g1 % 2 == 1);
        set_flush_denormal(true);
        assert!(policy_generation() > g1 && flush_denormal());
        set_flush_denormal(was);
    }
}
