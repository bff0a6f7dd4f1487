//! Runtime selection of the widest vector instructions the CPU has.
//!
//! The workspace compiles for baseline x86-64 (SSE2), so a plain loop vectorises 4 floats
//! wide. [`vectorize`] runs a closure inside a function compiled for the best instruction
//! set detected at run time (AVX-512, else AVX2+FMA), via `pulp`, which gemm already uses;
//! loops in the closure that the compiler can vectorise then use the wide registers.

/// Run `f` compiled for the widest vector instructions this CPU supports. The closure
/// itself must be marked `vectorize(#[inline(always)] || ...)`, and its loops and what
/// they call must inline into it (small generic code and `#[inline(always)]` helpers do;
/// a closure handed to a helper that calls it from more than one place needs the
/// attribute too): code that is not inlined into the dispatched function is compiled
/// for baseline x86-64. Without the attribute LLVM keeps a large closure out of line and
/// the "vectorised" loop runs on SSE2; that was true of every call site until the
/// attribute was added (`mirra-device/tests/vectorize_sites.rs` now checks each). The
/// calling thread flushes subnormal floats as [`denormals`](crate::denormals) says.
#[inline(always)]
pub fn vectorize<R>(f: impl FnOnce() -> R) -> R {
    crate::denormals::ensure_this_thread();
    pulp::Arch::new().dispatch(f)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_closure_runs_and_returns_its_value() {
        let v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let total = super::vectorize(
            #[inline(always)]
            || v.iter().map(|x| x * 2.0).sum::<f32>(),
        );
        assert_eq!(total, 999_000.0);
    }
}
