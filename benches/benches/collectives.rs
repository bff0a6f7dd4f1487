//! Criterion benches of the collectives' hot path: an f32 sum all-reduce of 4 KiB (latency
//! bound) and 4 MiB (bandwidth bound) at 2 and 4 ranks, for every CPU backend.
//!
//! Names are `cpu/<backend>/all_reduce/<ranks>r/<size>` with `Throughput::Bytes` of the
//! message, so criterion's rate is nccl-tests' algbw (busbw is `2(n-1)/n` times it; the
//! full table is `cargo xtask bench-collectives`).
//!
//! The calling thread is rank 0; the other ranks are threads spawned once per group that
//! run as many all-reduces as criterion asks for. Each batch starts with the group's
//! barrier (so that no rank's wake-up is timed) and its timer stops when rank 0's last
//! all-reduce returns, which a rank does only once every rank has left the collective.

use std::hint::black_box;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mirra_benches::DEVICE_TAG;
use mirra_collectives::{cpu_group, Communicator, Config, ReduceOp, BACKENDS};
use mirra_device::{Buffer, DType, Device};

/// Message sizes in bytes, and their labels.
const SIZES: [(usize, &str); 2] = [(4 << 10, "4KiB"), (4 << 20, "4MiB")];
/// World sizes.
const RANKS: [usize; 2] = [2, 4];

/// Short windows: a full run is about a minute.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

/// An f32 buffer of `bytes` of zeros: repeated in-place sums leave it as it is (any other
/// data grows to infinity), and the arithmetic costs the same for every value but
/// subnormals, which it never holds.
fn buffer(bytes: usize) -> Buffer {
    Buffer::zeros(DType::F32, bytes / 4, Device::Cpu).expect("a CPU buffer")
}

/// A peer's batch: the barrier, then `iters` all-reduces of `buf`.
fn batch(comm: &dyn Communicator, buf: &mut Buffer, iters: u64) {
    comm.barrier().expect("barrier");
    for _ in 0..iters {
        comm.all_reduce(buf, ReduceOp::Sum).expect("all_reduce");
    }
}

/// The ranks `1..n` of a group, each on its own thread, waiting for batch sizes.
struct Peers {
    batches: Vec<Sender<u64>>,
    done: Vec<Receiver<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Peers {
    fn spawn(peers: Vec<Box<dyn Communicator>>, bytes: usize) -> Peers {
        let mut p = Peers {
            batches: Vec::new(),
            done: Vec::new(),
            threads: Vec::new(),
        };
        for comm in peers {
            let (batch_tx, batch_rx) = channel::<u64>();
            let (done_tx, done_rx) = channel();
            p.threads.push(std::thread::spawn(move || {
                let mut buf = buffer(bytes);
                for iters in batch_rx {
                    batch(&*comm, &mut buf, iters);
                    if done_tx.send(()).is_err() {
                        return;
                    }
                }
            }));
            p.batches.push(batch_tx);
            p.done.push(done_rx);
        }
        p
    }

    fn start(&self, iters: u64) {
        for tx in &self.batches {
            tx.send(iters).expect("a peer rank has stopped");
        }
    }

    fn finish(&self) {
        for rx in &self.done {
            rx.recv().expect("a peer rank has stopped");
        }
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.batches.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn all_reduce(c: &mut Criterion) {
    for backend in BACKENDS {
        let mut group = c.benchmark_group(format!("{DEVICE_TAG}/{backend}/all_reduce"));
        for n in RANKS {
            for (bytes, label) in SIZES {
                let mut comms = cpu_group(backend, n, Config::default()).expect("a CPU group");
                let me = comms.remove(0);
                let peers = Peers::spawn(comms, bytes);
                let mut buf = buffer(bytes);
                group.throughput(Throughput::Bytes(bytes as u64));
                group.bench_function(format!("{n}r/{label}"), |b| {
                    b.iter_custom(|iters| {
                        peers.start(iters);
                        me.barrier().expect("barrier");
                        let t = Instant::now();
                        for _ in 0..iters {
                            me.all_reduce(&mut buf, ReduceOp::Sum).expect("all_reduce");
                        }
                        let elapsed = t.elapsed();
                        peers.finish();
                        black_box(&mut buf);
                        elapsed
                    })
                });
                drop(peers);
            }
        }
        group.finish();
    }
}

criterion_group! {
    name = collectives;
    config = config();
    targets = all_reduce
}
criterion_main!(collectives);
