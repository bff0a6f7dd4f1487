//! The ranks of one benchmarked communicator group: one thread per communicator, spawned
//! once per (backend, world size) and reused for every size, each owning its
//! communicator and allocating the buffers of one size at a time.
//!
//! A job runs `warmup + iters` collectives on every rank. Before each one every rank
//! writes its inputs afresh and poisons with NaN what the collective must overwrite, then
//! passes the group's own barrier (spin-then-yield, so that the ranks leave it together;
//! a parked barrier would add a wake-up of up to a millisecond here), then times the
//! collective alone. The time of an iteration is the slowest rank's. After every
//! iteration, warm-up included, every rank counts the elements that differ from the
//! closed-form result (`#wrong`), outside the timed region.
//!
//! The inputs are small integers whose sums over any number of ranks, in any order, are
//! exact in f32 (as nccl-tests chooses its data), so the check is an equality. They repeat
//! with a period of [`PERIOD`] elements, so writing and checking a buffer runs at copy
//! speed from one period held in cache.
//!
//! A group of a device backend ([`Group::spawn_on`]) keeps each rank's buffers on its
//! device: the inputs are written on the host and copied up before the barrier (and the
//! copy waited for), the result copied down after the timed collective and checked there.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

use mirra::device::{Buffer, DType, Device};
use mirra_collectives::{cpu_group, device_group, CollectiveError, Communicator, Config, ReduceOp};

use crate::nccl::Op;

/// The inputs repeat with this period (a power of two).
pub const PERIOD: usize = 1024;

/// Rank `rank`'s input element `i`: a small positive integer.
pub fn input(rank: usize, i: usize) -> f32 {
    ((i % PERIOD) + rank + 1) as f32
}

/// The sum over ranks `0..n` of `input(r, i)`, in closed form: `n (i % P + 1) + n(n-1)/2`.
/// At most `64 x 1088`, far below 2^24, so every partial sum is exact in f32.
pub fn sum(n: usize, i: usize) -> f32 {
    (n * (i % PERIOD + 1) + n * n.saturating_sub(1) / 2) as f32
}

/// One period of `f`: element `j` is `f(j)`.
fn period(f: impl Fn(usize) -> f32) -> Vec<f32> {
    (0..PERIOD).map(f).collect()
}

/// `xs[i] = row[(offset + i) % PERIOD]`.
fn fill_periodic(xs: &mut [f32], offset: usize, row: &[f32]) {
    let shift = offset % PERIOD;
    let (head, rest) = xs.split_at_mut((PERIOD - shift).min(xs.len()));
    head.copy_from_slice(&row[shift..shift + head.len()]);
    for part in rest.chunks_mut(PERIOD) {
        part.copy_from_slice(&row[..part.len()]);
    }
}

/// Elements with `xs[i] != row[(offset + i) % PERIOD]` (NaN differs from everything).
fn wrong_periodic(xs: &[f32], offset: usize, row: &[f32]) -> u64 {
    let shift = offset % PERIOD;
    let (head, rest) = xs.split_at((PERIOD - shift).min(xs.len()));
    let differ = |a: &[f32], b: &[f32]| a.iter().zip(b).filter(|(x, y)| x != y).count() as u64;
    differ(head, &row[shift..])
        + rest
            .chunks(PERIOD)
            .map(|part| differ(part, &row[..part.len()]))
            .sum::<u64>()
}

/// The poison written into outputs before every iteration.
const POISON: f32 = f32::NAN;

/// What every rank runs for one row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    pub op: Op,
    /// The per-rank element count (nccl-tests' `count`).
    pub count: usize,
    pub warmup: usize,
    /// Timed iterations (at least one).
    pub iters: usize,
}

/// One rank's part of a job.
#[derive(Debug)]
struct RankResult {
    /// Seconds of each timed iteration.
    samples: Vec<f64>,
    /// Elements that differed from the expected result, summed over every iteration.
    wrong: u64,
}

/// A job's outcome over all ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Seconds of each timed iteration: the slowest rank's.
    pub seconds: Vec<f64>,
    /// Wrong elements summed over ranks and iterations (warm-up included).
    pub wrong: u64,
    /// Iterations checked on every rank (warm-up included).
    pub checked: usize,
}

/// What rank `me` of `n` writes before an iteration of `op` and expects after it: one
/// period of each, and which rank's input fills which block.
struct Pattern {
    op: Op,
    me: usize,
    count: usize,
    /// One period of every rank's input, by rank.
    inputs: Vec<Vec<f32>>,
    /// One period of the all-ranks sum.
    sums: Vec<f32>,
}

impl Pattern {
    fn new(op: Op, me: usize, n: usize, count: usize) -> Pattern {
        Pattern {
            op,
            me,
            count,
            inputs: (0..n).map(|r| period(|j| input(r, j))).collect(),
            sums: period(|j| sum(n, j)),
        }
    }

    /// Writes this rank's inputs and poisons what the collective must overwrite.
    fn fill(&self, send: &mut Buffer, recv: &mut Buffer) {
        let mine = &self.inputs[self.me];
        match self.op {
            Op::AllReduce => fill_periodic(f32s(recv), 0, mine),
            Op::ReduceScatter | Op::AllGather => {
                fill_periodic(f32s(send), 0, mine);
                f32s(recv).fill(POISON);
            }
            Op::Broadcast if self.me == 0 => fill_periodic(f32s(recv), 0, mine),
            Op::Broadcast => f32s(recv).fill(POISON),
        }
    }

    /// Elements of the result `out` that differ from the closed form.
    fn wrong(&self, out: &[f32]) -> u64 {
        let count = self.count.max(1);
        match self.op {
            Op::AllReduce => wrong_periodic(out, 0, &self.sums),
            Op::ReduceScatter => wrong_periodic(out, self.me * count, &self.sums),
            Op::AllGather => out
                .chunks(count)
                .zip(&self.inputs)
                .map(|(block, row)| wrong_periodic(block, 0, row))
                .sum(),
            Op::Broadcast => wrong_periodic(out, 0, &self.inputs[0]),
        }
    }
}

/// A rank's buffers for one job: `send` is empty for the in-place collectives. On a
/// device, `host` holds the host copies the inputs are written to and the results read
/// from.
struct Buffers {
    send: Buffer,
    recv: Buffer,
    host: Option<(Buffer, Buffer)>,
}

fn f32s(buf: &mut Buffer) -> &mut [f32] {
    buf.as_mut_slice::<f32>()
        .expect("benchmark buffers are allocated as f32")
}

impl Buffers {
    fn new(op: Op, count: usize, n: usize, device: Device) -> Result<Buffers, String> {
        let (send, recv) = match op {
            Op::AllReduce | Op::Broadcast => (0, count),
            Op::ReduceScatter => (count * n, count),
            Op::AllGather => (count, count * n),
        };
        let alloc = |len, d| Buffer::alloc(DType::F32, len, d).map_err(|e| e.to_string());
        Ok(Buffers {
            send: alloc(send, device)?,
            recv: alloc(recv, device)?,
            host: match device {
                Device::Cpu => None,
                _ => Some((alloc(send, Device::Cpu)?, alloc(recv, Device::Cpu)?)),
            },
        })
    }

    /// Writes the inputs through `fill` (into the host copies on a device, then copied up,
    /// the copy waited for).
    fn fill(&mut self, pattern: &Pattern) -> Result<(), String> {
        let Some((send, recv)) = &mut self.host else {
            pattern.fill(&mut self.send, &mut self.recv);
            return Ok(());
        };
        pattern.fill(send, recv);
        let device = self.recv.device();
        let up = |b: &Buffer| b.to_device(device).map_err(|e| e.to_string());
        self.send = up(send)?;
        self.recv = up(recv)?;
        if let Some(d) = self.recv.device_memory() {
            d.runtime().synchronize().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Elements of the result that differ from `pattern`'s (read through a host copy on a
    /// device).
    fn wrong(&mut self, pattern: &Pattern) -> Result<u64, String> {
        match &self.host {
            None => Ok(pattern.wrong(f32s(&mut self.recv))),
            Some(_) => {
                let mut out = self
                    .recv
                    .to_device(Device::Cpu)
                    .map_err(|e| e.to_string())?;
                Ok(pattern.wrong(f32s(&mut out)))
            }
        }
    }

    fn call(&mut self, op: Op, comm: &dyn Communicator) -> Result<(), CollectiveError> {
        match op {
            Op::AllReduce => comm.all_reduce(&mut self.recv, ReduceOp::Sum),
            Op::ReduceScatter => comm.reduce_scatter(&self.send, &mut self.recv, ReduceOp::Sum),
            Op::AllGather => comm.all_gather(&self.send, &mut self.recv),
            Op::Broadcast => comm.broadcast(&mut self.recv, 0),
        }
    }
}

/// Elements of rank `me`'s result `out` of `op` at `n` ranks (per-rank `count`) that differ
/// from the closed-form expected values.
#[cfg(test)]
fn wrong(op: Op, me: usize, n: usize, count: usize, out: &[f32]) -> u64 {
    Pattern::new(op, me, n, count).wrong(out)
}

/// Runs `job` on this rank, its buffers on `device`.
fn run_job(comm: &dyn Communicator, job: &Job, device: Device) -> Result<RankResult, String> {
    let (me, n) = (comm.rank(), comm.world_size());
    let mut bufs = Buffers::new(job.op, job.count, n, device)?;
    let pattern = Pattern::new(job.op, me, n, job.count);
    let total = job.warmup + job.iters.max(1);
    let mut samples = Vec::with_capacity(job.iters);
    let mut wrong = 0;
    for it in 0..total {
        bufs.fill(&pattern)?;
        comm.barrier().map_err(|e| format!("barrier: {e}"))?;
        let t = Instant::now();
        bufs.call(job.op, comm).map_err(|e| e.to_string())?;
        let dt = t.elapsed().as_secs_f64();
        if it >= job.warmup {
            samples.push(dt);
        }
        wrong += bufs.wrong(&pattern)?;
    }
    Ok(RankResult { samples, wrong })
}

type Reply = Result<RankResult, String>;

fn rank_main(
    comm: Box<dyn Communicator>,
    device: Device,
    jobs: Receiver<Job>,
    replies: Sender<Reply>,
) {
    for job in jobs {
        let result = run_job(&*comm, &job, device);
        let failed = result.is_err();
        // A failed rank leaves: its communicator is dropped, and the group is aborted.
        if replies.send(result).is_err() || failed {
            return;
        }
    }
}

/// A communicator group whose ranks wait on their threads for jobs.
#[derive(Debug)]
pub struct Group {
    jobs: Vec<Sender<Job>>,
    replies: Vec<Receiver<Reply>>,
    threads: Vec<JoinHandle<()>>,
}

impl Group {
    /// Spawns the `world_size` ranks of the CPU backend `backend`.
    pub fn spawn(backend: &str, world_size: usize, config: Config) -> Result<Group, String> {
        let comms = cpu_group(backend, world_size, config).map_err(|e| e.to_string())?;
        Group::start(backend, comms, &vec![Device::Cpu; world_size])
    }

    /// Spawns one rank of the device backend `backend` per entry of `devices`.
    pub fn spawn_on(backend: &str, devices: &[Device], config: Config) -> Result<Group, String> {
        let comms = device_group(backend, devices, config).map_err(|e| e.to_string())?;
        Group::start(backend, comms, devices)
    }

    fn start(
        backend: &str,
        comms: Vec<Box<dyn Communicator>>,
        devices: &[Device],
    ) -> Result<Group, String> {
        let world_size = comms.len();
        let mut group = Group {
            jobs: Vec::with_capacity(world_size),
            replies: Vec::with_capacity(world_size),
            threads: Vec::with_capacity(world_size),
        };
        for (comm, &device) in comms.into_iter().zip(devices) {
            let (job_tx, job_rx) = channel();
            let (reply_tx, reply_rx) = channel();
            let name = format!("{backend}-rank{}", comm.rank());
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || rank_main(comm, device, job_rx, reply_tx))
                .map_err(|e| format!("cannot spawn a rank thread: {e}"))?;
            group.jobs.push(job_tx);
            group.replies.push(reply_rx);
            group.threads.push(thread);
        }
        Ok(group)
    }

    /// Runs `job` on every rank. After an error the group is unusable (it has been
    /// aborted): drop it.
    pub fn run(&self, job: Job) -> Result<Outcome, String> {
        for (rank, tx) in self.jobs.iter().enumerate() {
            tx.send(job)
                .map_err(|_| format!("rank {rank} has left the group"))?;
        }
        let mut results = Vec::with_capacity(self.replies.len());
        let mut first_error = None;
        for (rank, rx) in self.replies.iter().enumerate() {
            match rx.recv() {
                Ok(Ok(r)) => results.push(r),
                Ok(Err(e)) => {
                    first_error.get_or_insert(format!("rank {rank}: {e}"));
                }
                Err(_) => {
                    first_error.get_or_insert(format!("rank {rank}'s thread panicked"));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(combine(&results, job.warmup + job.iters.max(1)))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Closing the job channels ends the rank threads.
        self.jobs.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Per iteration, the slowest rank's time; wrong elements summed; `checked` iterations.
fn combine(results: &[RankResult], checked: usize) -> Outcome {
    let iters = results.iter().map(|r| r.samples.len()).min().unwrap_or(0);
    Outcome {
        seconds: (0..iters)
            .map(|i| results.iter().map(|r| r.samples[i]).fold(0.0, f64::max))
            .collect(),
        wrong: results.iter().map(|r| r.wrong).sum(),
        checked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sums_are_closed_form_and_exact() {
        for n in [1, 2, 3, 4, 8, 64] {
            for i in [0, 1, 1023, 1024, 5000, 1 << 26] {
                let direct: f32 = (0..n).map(|r| input(r, i)).sum();
                let reversed: f32 = (0..n).rev().map(|r| input(r, i)).sum();
                assert_eq!(sum(n, i), direct, "n={n} i={i}");
                assert_eq!(direct, reversed);
            }
        }
    }

    #[test]
    fn the_check_counts_wrong_elements() {
        let (n, count) = (4, 5);
        let mut ar: Vec<f32> = (0..count).map(|i| sum(n, i)).collect();
        assert_eq!(wrong(Op::AllReduce, 0, n, count, &ar), 0);
        ar[3] += 1.0;
        ar[4] = f32::NAN;
        assert_eq!(wrong(Op::AllReduce, 0, n, count, &ar), 2);

        let rs: Vec<f32> = (0..count).map(|j| sum(n, 2 * count + j)).collect();
        assert_eq!(wrong(Op::ReduceScatter, 2, n, count, &rs), 0);
        assert_eq!(wrong(Op::ReduceScatter, 1, n, count, &rs), count as u64);

        let mut ag: Vec<f32> = (0..n * count)
            .map(|k| input(k / count, k % count))
            .collect();
        assert_eq!(wrong(Op::AllGather, 3, n, count, &ag), 0);
        ag.swap(0, count);
        assert_eq!(wrong(Op::AllGather, 3, n, count, &ag), 2);

        let bc: Vec<f32> = (0..count).map(|i| input(0, i)).collect();
        assert_eq!(wrong(Op::Broadcast, 1, n, count, &bc), 0);
        assert_eq!(wrong(Op::Broadcast, 1, n, count, &[f32::NAN; 5]), 5);
    }

    #[test]
    fn combine_takes_the_slowest_rank_per_iteration() {
        let out = combine(
            &[
                RankResult {
                    samples: vec![1.0, 5.0, 2.0],
                    wrong: 1,
                },
                RankResult {
                    samples: vec![3.0, 4.0, 2.5],
                    wrong: 2,
                },
            ],
            4,
        );
        assert_eq!(out.seconds, vec![3.0, 5.0, 2.5]);
        assert_eq!((out.wrong, out.checked), (3, 4));
    }

    #[test]
    fn periodic_fill_and_check_agree_with_the_closed_form() {
        let row = period(|j| sum(3, j));
        for (len, offset) in [(0, 0), (5, 0), (1500, 0), (1500, 1000), (3000, 2047)] {
            let mut xs = vec![f32::NAN; len];
            fill_periodic(&mut xs, offset, &row);
            assert!(xs.iter().enumerate().all(|(i, &x)| x == sum(3, offset + i)));
            assert_eq!(wrong_periodic(&xs, offset, &row), 0);
            if len > 0 {
                xs[len - 1] = f32::NAN;
                xs[0] += 1.0;
                assert_eq!(wrong_periodic(&xs, offset, &row), 2.min(len as u64));
                // Checked against the wrong offset, (almost) everything differs.
                assert!(wrong_periodic(&xs, offset + 1, &row) >= len as u64 - 1);
            }
        }
    }

    /// A communicator whose all-reduce result is off by one in one element on one call.
    struct Faulty {
        inner: Box<dyn Communicator>,
        calls: std::cell::Cell<usize>,
        bad_call: Option<usize>,
    }

    impl Communicator for Faulty {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn world_size(&self) -> usize {
            self.inner.world_size()
        }
        fn backend(&self) -> &'static str {
            "faulty"
        }
        fn timeout(&self) -> Duration {
            self.inner.timeout()
        }
        fn abort_handle(&self) -> mirra_collectives::AbortHandle {
            self.inner.abort_handle()
        }
        fn start_all_reduce<'b>(
            &'b self,
            buf: &'b mut Buffer,
            op: ReduceOp,
        ) -> mirra_collectives::Result<mirra_collectives::Work<'b>> {
            self.inner.start_all_reduce(buf, op)
        }
        fn all_reduce(&self, buf: &mut Buffer, op: ReduceOp) -> mirra_collectives::Result<()> {
            self.inner.all_reduce(buf, op)?;
            let call = self.calls.get();
            self.calls.set(call + 1);
            if Some(call) == self.bad_call {
                f32s(buf)[7] += 1.0;
            }
            Ok(())
        }
        fn start_reduce_scatter<'b>(
            &'b self,
            send: &'b Buffer,
            recv: &'b mut Buffer,
            op: ReduceOp,
        ) -> mirra_collectives::Result<mirra_collectives::Work<'b>> {
            self.inner.start_reduce_scatter(send, recv, op)
        }
        fn start_all_gather<'b>(
            &'b self,
            send: &'b Buffer,
            recv: &'b mut Buffer,
        ) -> mirra_collectives::Result<mirra_collectives::Work<'b>> {
            self.inner.start_all_gather(send, recv)
        }
        fn start_broadcast<'b>(
            &'b self,
            buf: &'b mut Buffer,
            root: usize,
        ) -> mirra_collectives::Result<mirra_collectives::Work<'b>> {
            self.inner.start_broadcast(buf, root)
        }
        fn start_reduce<'b>(
            &'b self,
            buf: &'b mut Buffer,
            op: ReduceOp,
            root: usize,
        ) -> mirra_collectives::Result<mirra_collectives::Work<'b>> {
            self.inner.start_reduce(buf, op, root)
        }
        fn start_barrier(&self) -> mirra_collectives::Result<mirra_collectives::Work<'_>> {
            self.inner.start_barrier()
        }
        fn submit_all_reduce(
            &self,
            buf: Buffer,
            op: ReduceOp,
        ) -> mirra_collectives::Result<mirra_collectives::Pending> {
            self.inner.submit_all_reduce(buf, op)
        }
    }

    /// Rank 1's result is wrong on one call only: the job counts it whichever iteration
    /// it is, warm-up or timed, first or in the middle (checking only the last iteration
    /// would miss all three).
    #[test]
    fn every_iteration_is_checked() {
        for bad_call in [None, Some(0), Some(1), Some(2)] {
            let comms = cpu_group("direct", 2, Config::default()).unwrap();
            let job = Job {
                op: Op::AllReduce,
                count: 100,
                warmup: 1,
                iters: 3,
            };
            let wrong: u64 = std::thread::scope(|s| {
                let handles: Vec<_> = comms
                    .into_iter()
                    .map(|inner| {
                        s.spawn(move || {
                            let rank = inner.rank();
                            let comm = Faulty {
                                inner,
                                calls: std::cell::Cell::new(0),
                                bad_call: bad_call.filter(|_| rank == 1),
                            };
                            let r = run_job(&comm, &job, Device::Cpu).unwrap();
                            assert_eq!(r.samples.len(), 3);
                            r.wrong
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert_eq!(
                wrong,
                u64::from(bad_call.is_some()),
                "bad call {bad_call:?}"
            );
        }
    }

    #[test]
    fn a_group_runs_every_op_and_checks_it() {
        let config = Config::default().with_timeout(Duration::from_secs(20));
        for backend in mirra_collectives::BACKENDS {
            let group = Group::spawn(backend, 3, config.clone()).unwrap();
            for op in Op::ALL {
                // 1001 elements: not a multiple of the world size or of a slice.
                let (_, count) = op.shape(4 * 3003, 4, 3);
                let out = group
                    .run(Job {
                        op,
                        count,
                        warmup: 1,
                        iters: 2,
                    })
                    .unwrap();
                assert_eq!((out.seconds.len(), out.checked), (2, 3));
                assert_eq!(out.wrong, 0, "{backend} {op:?}");
            }
        }
    }
}
