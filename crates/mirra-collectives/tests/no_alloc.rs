//! A warmed-up collective allocates nothing: every backend, every collective, counted by
//! a global allocator that tallies allocations per thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mirra_collectives::{cpu_group, Communicator, Config, ReduceOp, BACKENDS};
use mirra_device::{Buffer, Device};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: defers every call to the system allocator unchanged; the thread-local counter is
// const-initialised and has no destructor, so touching it neither allocates nor recurses.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `realloc` is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCS.with(Cell::get)
}

fn round(c: &dyn Communicator, bufs: &mut [Buffer; 4], send: &Buffer) {
    let [a, b, recv_rs, recv_ag] = bufs;
    c.all_reduce(a, ReduceOp::Mean).unwrap();
    c.all_reduce(b, ReduceOp::Max).unwrap();
    c.reduce_scatter(send, recv_rs, ReduceOp::Sum).unwrap();
    c.all_gather(a, recv_ag).unwrap();
    c.broadcast(b, 1).unwrap();
    c.reduce(a, ReduceOp::Product, 0).unwrap();
    c.barrier().unwrap();
}

#[test]
fn warmed_up_collectives_do_not_allocate() {
    for backend in BACKENDS {
        let n = 3;
        let comms = cpu_group(backend, n, Config::default().with_slice_bytes(4096)).unwrap();
        let counts: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let len = 50_000;
                        let mut bufs = [
                            Buffer::from_slice(&vec![1.0f32; len], Device::Cpu).unwrap(),
                            Buffer::from_slice(&vec![2.0f32; len], Device::Cpu).unwrap(),
                            Buffer::zeros(mirra_device::DType::F32, len, Device::Cpu).unwrap(),
                            Buffer::zeros(mirra_device::DType::F32, n * len, Device::Cpu).unwrap(),
                        ];
                        let send = Buffer::from_slice(&vec![1.0f32; n * len], Device::Cpu).unwrap();
                        round(&*c, &mut bufs, &send);
                        let before = allocations();
                        for _ in 0..20 {
                            round(&*c, &mut bufs, &send);
                        }
                        allocations() - before
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(counts, vec![0; n], "{backend}: allocations per rank");
    }
}
