//! Runtime selection of the widest vector instructions the CPU has.
//!
//! The workspace compiles for baseline x86-64 (SSE2), so a plain loop vectorises 4 floats
//! wide. [`vectorize`] runs a closure inside a function compiled for the best instruction
//! set detected at run time (AVX-512, else AVX2+FMA), via `pulp`, which gemm already uses;
//! loops in the closure that the compiler can vectorise then use the wide registers.

/// Run `f` compiled for the widest vector instructions this CPU supports. `f`'s loop and
/// everything it calls must inline into it (small generic code and `#[inline(always)]`
/// helpers do) for the wider instructions to apply. The calling thread flushes subnormal
/// floats as [`denormals`](crate::denormals) says.
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
        let total = super::vectorize(|| v.iter().map(|x| x * 2.0).sum::<f32>());
        assert_eq!(total, 999_000.0);
    }
}
