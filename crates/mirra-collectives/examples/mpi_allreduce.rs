//! mirra's `mpi` backend timed the way `benches/peers/mpi_allreduce.c` times OpenMPI's own
//! `MPI_Allreduce`, so that `cargo xtask bench-collectives --backends mpi` puts the two in
//! one table (run under `mpirun -np N`; build with `--features mpi`):
//!
//!   per iteration: every rank writes its inputs afresh, a barrier, then the all-reduce alone
//!   is timed on every rank; an iteration's time is the slowest rank's; after each iteration
//!   every rank counts the elements that differ from the closed form (`wrong`).
//!
//! Inputs are rank r's element i = (i % 1024) + r + 1 (f32), whose sums are exact in any
//! order. Usage: `mpirun -np N mpi_allreduce BYTES:WARMUP:ITERS ...`; rank 0 prints one JSON
//! line per size: `{"bytes": B, "count": C, "warmup": W, "seconds": [...], "wrong": K}`.

use std::time::Instant;

use mirra_collectives::{Config, Mpi, ReduceOp};
use mirra_device::{Buffer, Device};

const PERIOD: usize = 1024;

fn input(rank: usize, i: usize) -> f32 {
    ((i % PERIOD) + rank + 1) as f32
}

fn sum(n: usize, i: usize) -> f32 {
    (n * (i % PERIOD + 1) + n * (n - 1) / 2) as f32
}

fn main() {
    let mpi = Mpi::init().unwrap_or_else(|e| {
        eprintln!("mpi_allreduce: {e}");
        std::process::exit(1)
    });
    let comm = mpi.world(Config::default());
    let (rank, n) = (comm.rank(), comm.world_size());
    for spec in std::env::args().skip(1) {
        let parts: Vec<usize> = spec.split(':').filter_map(|p| p.parse().ok()).collect();
        let [bytes, warmup, iters] = parts[..] else {
            eprintln!("mpi_allreduce: bad size spec `{spec}` (BYTES:WARMUP:ITERS)");
            std::process::exit(2)
        };
        let count = bytes / 4;
        let mut buf = Buffer::from_slice(&vec![0f32; count], Device::Cpu).unwrap();
        let mut seconds = Vec::with_capacity(iters);
        let mut wrong = 0i64;
        for it in 0..warmup + iters.max(1) {
            for (i, x) in buf.as_mut_slice::<f32>().unwrap().iter_mut().enumerate() {
                *x = input(rank, i);
            }
            comm.barrier().unwrap();
            let t = Instant::now();
            comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            let dt = t.elapsed().as_secs_f64();
            if it >= warmup {
                seconds.push(dt);
            }
            let got = buf.as_slice::<f32>().unwrap();
            wrong += got
                .iter()
                .enumerate()
                .filter(|&(i, &x)| x != sum(n, i))
                .count() as i64;
        }
        // The slowest rank's time of each iteration, and the wrong elements of all ranks.
        let mut slowest = Buffer::from_slice(&seconds, Device::Cpu).unwrap();
        comm.all_reduce(&mut slowest, ReduceOp::Max).unwrap();
        let mut all_wrong = Buffer::from_slice(&[wrong], Device::Cpu).unwrap();
        comm.all_reduce(&mut all_wrong, ReduceOp::Sum).unwrap();
        if rank == 0 {
            let secs: Vec<String> = slowest
                .as_slice::<f64>()
                .unwrap()
                .iter()
                .map(|s| format!("{s:.9e}"))
                .collect();
            println!(
                "{{\"bytes\": {}, \"count\": {count}, \"warmup\": {warmup}, \"seconds\": [{}], \"wrong\": {}}}",
                count * 4,
                secs.join(", "),
                all_wrong.as_slice::<i64>().unwrap()[0]
            );
        }
    }
    drop(comm);
    drop(mpi);
}
