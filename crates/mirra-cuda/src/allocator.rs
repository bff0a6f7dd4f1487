//! A caching allocator for device memory, as PyTorch's: freed blocks are kept in free lists
//! per stream and size class and handed out again without asking the driver (whose
//! `cuMemAlloc` and `cuMemFree` synchronize the device), with bytes in use, bytes held and
//! their peaks.
//!
//! - Sizes are rounded up to a class: multiples of 512 B up to 1 MiB, multiples of 2 MiB
//!   above (PyTorch's small and large pools, without block splitting). Bytes in use count
//!   each request rounded to 512 B, as PyTorch's `memory_allocated` counts its blocks
//!   (a block split from a segment is the request rounded to 512 B); the rest of a large
//!   class is held, not used, and counts in `reserved`.
//! - A block freed on a stream is reused only by allocations on the same stream: work
//!   queued on that stream before the free is ordered before any work queued after the
//!   reuse, so no event is needed. Using a block on another stream needs an event first
//!   (the stream that frees it must not run ahead of the other stream's use).
//! - When the driver is out of memory, every cached block is released and the allocation
//!   tried once more; only then is it an error.
//!
//! The logic is generic over [`RawMemory`] (the driver's calls), so its bookkeeping is
//! tested on the host with a fake device; [`DriverMemory`] is the CUDA one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::{CudaError, Result};

/// Allocation granularity below [`LARGE`]: PyTorch's `kMinBlockSize`.
pub const SMALL_ROUND: usize = 512;
/// Requests above this many bytes are large: PyTorch's `kSmallSize`.
pub const LARGE: usize = 1 << 20;
/// Allocation granularity of large requests: PyTorch's `kRoundLarge`.
pub const LARGE_ROUND: usize = 2 << 20;

/// The size class of a request of `bytes` (at least one granule, so that a zero-length
/// buffer has an address like any other).
pub fn size_class(bytes: usize) -> usize {
    round_up(
        bytes,
        if bytes <= LARGE {
            SMALL_ROUND
        } else {
            LARGE_ROUND
        },
    )
}

/// `bytes` rounded up to a multiple of `granule`, at least one granule.
fn round_up(bytes: usize, granule: usize) -> usize {
    bytes.max(1).div_ceil(granule) * granule
}

/// What the allocator asks of the device: memory in, memory out.
pub trait RawMemory: Send + 'static {
    /// Allocate `bytes` (a size class); `Err(OutOfMemory)` when the device has too little.
    fn alloc(&mut self, bytes: usize) -> std::result::Result<u64, RawError>;
    /// Release a pointer `alloc` returned.
    fn free(&mut self, ptr: u64);
}

/// Why the device refused an allocation.
#[derive(Debug)]
pub enum RawError {
    /// Too little free memory: releasing cached blocks may help.
    OutOfMemory,
    /// Anything else, as the error to return.
    Other(CudaError),
}

/// Bytes and counts of one allocator, for `mirra train`'s report and the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes handed out and not yet freed: each request rounded up to 512 B (what
    /// PyTorch's `memory_allocated` counts), not its size class.
    pub in_use: usize,
    /// The most `in_use` has been.
    pub peak_in_use: usize,
    /// Bytes held from the device: in use plus cached.
    pub reserved: usize,
    /// The most `reserved` has been.
    pub peak_reserved: usize,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that went to the device.
    pub misses: u64,
    /// Times the cache was emptied to retry an allocation the device refused.
    pub retries: u64,
}

/// A stream's identity for the free lists (the `CUstream` handle as an integer).
pub type StreamId = u64;

struct State<R: RawMemory> {
    raw: R,
    /// Cached blocks by (stream, size class).
    free: BTreeMap<(StreamId, usize), Vec<u64>>,
    stats: MemoryStats,
}

impl<R: RawMemory> State<R> {
    fn release_cache(&mut self) {
        for ((_, size), ptrs) in std::mem::take(&mut self.free) {
            for p in ptrs {
                self.raw.free(p);
                self.stats.reserved -= size;
            }
        }
    }
}

/// The caching allocator of one device.
pub struct CachingAllocator<R: RawMemory> {
    state: Arc<Mutex<State<R>>>,
}

impl<R: RawMemory> Clone for CachingAllocator<R> {
    fn clone(&self) -> Self {
        CachingAllocator {
            state: self.state.clone(),
        }
    }
}

impl<R: RawMemory> std::fmt::Debug for CachingAllocator<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CachingAllocator({:?})", self.stats())
    }
}

/// A block of device memory from a [`CachingAllocator`]; dropping it returns it to the
/// cache of its stream.
pub struct Block<R: RawMemory> {
    ptr: u64,
    size: usize,
    /// What the block counts in `in_use`: the request rounded to 512 B.
    counted: usize,
    stream: StreamId,
    owner: Arc<Mutex<State<R>>>,
}

impl<R: RawMemory> Block<R> {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The block's size: the request's size class.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The stream it was allocated for.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

impl<R: RawMemory> std::fmt::Debug for Block<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Block({:#x}, {} B, stream {:#x})",
            self.ptr, self.size, self.stream
        )
    }
}

impl<R: RawMemory> Drop for Block<R> {
    fn drop(&mut self) {
        let mut s = lock(&self.owner);
        s.stats.in_use -= self.counted;
        s.free
            .entry((self.stream, self.size))
            .or_default()
            .push(self.ptr);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<R: RawMemory> CachingAllocator<R> {
    /// An allocator over `raw`, its cache empty.
    pub fn new(raw: R) -> CachingAllocator<R> {
        CachingAllocator {
            state: Arc::new(Mutex::new(State {
                raw,
                free: BTreeMap::new(),
                stats: MemoryStats::default(),
            })),
        }
    }

    /// A block of at least `bytes` for use on `stream`: a cached one of its size class
    /// freed on that stream, else new memory from the device (after releasing the cache
    /// once if the device is out of memory).
    pub fn alloc(&self, bytes: usize, stream: StreamId) -> Result<Block<R>> {
        let size = size_class(bytes);
        let mut s = lock(&self.state);
        let cached = s.free.get_mut(&(stream, size)).and_then(Vec::pop);
        let ptr = match cached {
            Some(p) => {
                s.stats.hits += 1;
                p
            }
            None => {
                let p = match s.raw.alloc(size) {
                    Ok(p) => p,
                    Err(RawError::OutOfMemory) => {
                        s.stats.retries += 1;
                        s.release_cache();
                        s.raw.alloc(size).map_err(|e| match e {
                            RawError::OutOfMemory => CudaError::OutOfMemory {
                                bytes: size,
                                in_use: s.stats.in_use,
                            },
                            RawError::Other(e) => e,
                        })?
                    }
                    Err(RawError::Other(e)) => return Err(e),
                };
                s.stats.misses += 1;
                s.stats.reserved += size;
                s.stats.peak_reserved = s.stats.peak_reserved.max(s.stats.reserved);
                p
            }
        };
        let counted = round_up(bytes, SMALL_ROUND);
        s.stats.in_use += counted;
        s.stats.peak_in_use = s.stats.peak_in_use.max(s.stats.in_use);
        Ok(Block {
            ptr,
            size,
            counted,
            stream,
            owner: self.state.clone(),
        })
    }

    /// The counters now.
    pub fn stats(&self) -> MemoryStats {
        lock(&self.state).stats
    }

    /// Start the peaks again from what is in use and held now.
    pub fn reset_peaks(&self) {
        let mut s = lock(&self.state);
        s.stats.peak_in_use = s.stats.in_use;
        s.stats.peak_reserved = s.stats.reserved;
    }

    /// Give every cached block back to the device (PyTorch's `empty_cache`).
    pub fn empty_cache(&self) {
        lock(&self.state).release_cache();
    }
}

impl<R: RawMemory> Drop for State<R> {
    fn drop(&mut self) {
        // Every block holds the state alive: when it goes, only cached blocks remain.
        self.release_cache();
    }
}

/// Device memory from the CUDA driver (`cuMemAlloc` / `cuMemFree`) in a context.
#[derive(Debug)]
pub struct DriverMemory {
    ctx: Arc<cudarc::driver::CudaContext>,
}

impl DriverMemory {
    /// The memory of the device of `ctx`.
    pub fn new(ctx: Arc<cudarc::driver::CudaContext>) -> DriverMemory {
        DriverMemory { ctx }
    }
}

impl RawMemory for DriverMemory {
    fn alloc(&mut self, bytes: usize) -> std::result::Result<u64, RawError> {
        use cudarc::driver::{result, sys::cudaError_enum};
        let bound = self.ctx.bind_to_thread().map_err(|source| {
            RawError::Other(CudaError::Driver {
                op: "cuCtxSetCurrent",
                source,
            })
        });
        bound?;
        // SAFETY: the context is current on this thread; the pointer is freed by `free`.
        match unsafe { result::malloc_sync(bytes) } {
            Ok(p) => Ok(p),
            Err(e) if e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => Err(RawError::OutOfMemory),
            Err(source) => Err(RawError::Other(CudaError::Driver {
                op: "cuMemAlloc",
                source,
            })),
        }
    }

    fn free(&mut self, ptr: u64) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from `alloc` in this context and is no longer used: the
            // allocator frees only cached blocks, whose streams ordered their last use.
            let _ = unsafe { cudarc::driver::result::free_sync(ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `capacity` bytes that counts its calls.
    #[derive(Default)]
    struct Fake {
        capacity: usize,
        used: usize,
        next: u64,
        live: BTreeMap<u64, usize>,
        allocs: usize,
    }

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Fake>>);

    impl RawMemory for Shared {
        fn alloc(&mut self, bytes: usize) -> std::result::Result<u64, RawError> {
            let mut f = lock(&self.0);
            if f.used + bytes > f.capacity {
                return Err(RawError::OutOfMemory);
            }
            f.used += bytes;
            f.next += 1 << 32;
            let p = f.next;
            f.live.insert(p, bytes);
            f.allocs += 1;
            Ok(p)
        }

        fn free(&mut self, ptr: u64) {
            let mut f = lock(&self.0);
            let bytes = f
                .live
                .remove(&ptr)
                .expect("freed a pointer that is not live");
            f.used -= bytes;
        }
    }

    fn device(capacity: usize) -> (Shared, CachingAllocator<Shared>) {
        let raw = Shared(Arc::new(Mutex::new(Fake {
            capacity,
            ..Fake::default()
        })));
        (raw.clone(), CachingAllocator::new(raw))
    }

    #[test]
    fn sizes_round_to_their_class() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(LARGE), LARGE);
        assert_eq!(size_class(LARGE + 1), LARGE_ROUND);
        assert_eq!(size_class(5 << 20), 6 << 20);
    }

    #[test]
    fn a_freed_block_is_reused_on_its_stream_without_the_device() {
        let (raw, a) = device(1 << 30);
        let b = a.alloc(1000, 7).unwrap();
        let p = b.ptr();
        drop(b);
        let again = a.alloc(900, 7).unwrap();
        assert_eq!(again.ptr(), p, "same class, same stream: the cached block");
        assert_eq!(lock(&raw.0).allocs, 1);
        let s = a.stats();
        assert_eq!((s.hits, s.misses, s.in_use, s.reserved), (1, 1, 1024, 1024));
        drop(again);
        // A large request counts its own size rounded to 512 B in use, its class held.
        let big = a.alloc((5 << 20) + 1, 7).unwrap();
        let s = a.stats();
        assert_eq!((s.in_use, s.reserved), ((5 << 20) + 512, 1024 + (6 << 20)));
        drop(big);
        assert_eq!(a.stats().in_use, 0);
    }

    #[test]
    fn another_stream_or_class_gets_new_memory() {
        let (raw, a) = device(1 << 30);
        drop(a.alloc(1000, 7).unwrap());
        let other_stream = a.alloc(1000, 8).unwrap();
        let other_class = a.alloc(5000, 7).unwrap();
        assert_eq!(lock(&raw.0).allocs, 3);
        assert_ne!(other_stream.ptr(), other_class.ptr());
        assert_eq!(a.stats().reserved, 1024 + 1024 + 5120);
    }

    #[test]
    fn peaks_are_kept_and_reset() {
        let (_raw, a) = device(1 << 30);
        let x = a.alloc(3 << 20, 1).unwrap();
        let y = a.alloc(1 << 20, 1).unwrap();
        drop(x);
        let s = a.stats();
        // In use: the requests (3 MiB + 1 MiB); held: their classes (4 MiB + 1 MiB).
        assert_eq!(s.peak_in_use, (3 << 20) + (1 << 20));
        assert_eq!(s.peak_reserved, (4 << 20) + (1 << 20));
        assert_eq!(s.in_use, 1 << 20);
        a.reset_peaks();
        assert_eq!(a.stats().peak_in_use, 1 << 20);
        drop(y);
        assert_eq!(a.stats().in_use, 0);
    }

    #[test]
    fn out_of_memory_releases_the_cache_then_retries_then_says_so() {
        let (raw, a) = device(8 << 20);
        drop(a.alloc(6 << 20, 1).unwrap()); // cached: 6 MiB held, none in use
        let b = a.alloc(4 << 20, 1).unwrap(); // the device has 2 MiB left: release, retry
        assert_eq!(a.stats().retries, 1);
        assert_eq!(lock(&raw.0).used, 4 << 20);
        let e = a.alloc(6 << 20, 2).unwrap_err().to_string();
        assert!(e.contains("out of memory") && e.contains("6291456"), "{e}");
        drop(b);
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn the_driver_backs_the_allocator_on_a_gpu() {
        crate::check_device(0).expect("needs a CUDA device");
        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        let a = CachingAllocator::new(DriverMemory::new(ctx.clone()));
        let b = a.alloc(3 << 20, 0).unwrap();
        let p = b.ptr();
        assert_ne!(p, 0);
        // The block is real memory: fill it and read a byte back.
        let stream = ctx.default_stream();
        // SAFETY: the block holds 4 MiB (its class); the memset covers 3 MiB of it.
        unsafe { cudarc::driver::result::memset_d8_sync(p, 0xab, 3 << 20) }.unwrap();
        let mut byte = [0u8; 1];
        // SAFETY: reads one byte of the block into a one-byte host buffer.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut byte, p + 12345) }.unwrap();
        assert_eq!(byte[0], 0xab);
        drop(b);
        assert_eq!(a.alloc(3 << 20, 0).unwrap().ptr(), p);
        assert_eq!(a.stats().misses, 1);
        stream.synchronize().unwrap();
        // Far more than an H200 holds: refused with the error, not a panic.
        let e = a.alloc(1 << 50, 0).unwrap_err().to_string();
        assert!(e.contains("out of memory"), "{e}");
    }

    #[test]
    fn dropping_the_allocator_and_its_blocks_gives_everything_back() {
        let (raw, a) = device(1 << 30);
        let b = a.alloc(100, 1).unwrap();
        drop(a.alloc(200, 1).unwrap());
        drop(a);
        assert_eq!(lock(&raw.0).live.len(), 2, "a live block keeps its memory");
        drop(b);
        assert!(lock(&raw.0).live.is_empty());
    }
}
