//! A global allocator that counts, per thread, the bytes that thread holds, and the peak.
//!
//! Per thread, so that tests running in parallel in the same binary do not disturb each
//! other's figures. Memory freed on another thread than the one that allocated it lowers
//! that other thread's count (the counts are signed): a measured closure that hands its
//! result to another thread is charged for it until then, which is what a bound on its
//! allocation wants.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// Bytes this thread has allocated and not freed.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since the last [`peak_during`] began.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The system allocator, counting. Install it in a test binary:
///
/// ```
/// #[global_allocator]
/// static ALLOC: mirra_mutation::CountingAlloc = mirra_mutation::CountingAlloc;
///
/// # fn main() {
/// let (_, peak) = mirra_mutation::peak_during(|| vec![0u8; 1000]);
/// assert!(peak >= 1000);
/// # }
/// ```
#[derive(Debug)]
pub struct CountingAlloc;

/// Adds `delta` bytes to this thread's count.
fn count(delta: isize) {
    // Const-initialised cells without destructors: always accessible, never allocating.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the contract; the
// counting only reads the layouts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees for `alloc` are `System.alloc`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes
        // through this type).
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and the caller guarantees `new_size`'s validity.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// `f`'s result and the most bytes the calling thread held during `f` beyond what it held
/// before; 0 when [`CountingAlloc`] is not the global allocator.
pub fn peak_during<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - start).max(0) as u64)
}

/// Whether [`CountingAlloc`] counts this binary's allocations.
pub(crate) fn is_installed() -> bool {
    let (_, peak) = peak_during(|| std::hint::black_box(vec![1u8; 4096]));
    peak >= 4096
}
