//! The `mpi` backend (cargo feature `mpi`): one rank per process, over MPI through rsmpi,
//! for jobs started by `mpirun` (or Slurm's `srun`) across processes and machines.
//!
//! Each process builds its own rank's communicator from MPI's world ([`Mpi::world`]) or
//! from any communicator of it (a split: [`Mpi::communicator`]); the group is every
//! process of that MPI communicator. Every collective runs in two phases, as the
//! in-process backends' do:
//!
//! 1. **Metadata**: each rank sends its description of the collective (kind, operator,
//!    dtypes, lengths, root) to every other and receives theirs, point to point. The shared
//!    verdict (`verdict.rs`) then finds a mismatch from the same data on every rank, so
//!    every rank returns the same error and the group stays usable; and a rank that did
//!    not answer within the deadline is *named* (which a collective alone could not say).
//! 2. **Data**: the all-reduce is a ring over MPI point to point (`MPI_Isend`/`MPI_Irecv`
//!    of chunks, a reduce-scatter then an all-gather, combined by the crate's kernel): each
//!    chunk is reduced once, in a fixed order, so every rank ends with the same bits, which
//!    `MPI_Allreduce` does not promise. The others are MPI's non-blocking collectives
//!    (`MPI_Ireduce_scatter_block`, `MPI_Iallgather`, `MPI_Ibcast`, `MPI_Ireduce`,
//!    `MPI_Ibarrier`). Each request is tested until it completes or the deadline passes. f32, f64, i32 and i64 sums, maxima, minima and
//!    products are MPI's own operators; f16 and bf16 travel as 16-bit words reduced by a
//!    user-defined operation through the crate's one reduction kernel (`reduce.rs`:
//!    arithmetic in f32, one rounding per combination), which MPI has no type for, and u8
//!    goes through the same kernel too (OpenMPI 4.1's AVX operators saturate u8 sums
//!    where every other backend wraps). `Mean`
//!    is a sum divided by the world size on every rank afterwards (truncating for
//!    integers), as the other backends define it.
//!
//! **Deadlines end the job.** MPI cannot cancel a started collective, and its finalisation
//! would wait for it forever, so a deadline that passes prints the error (which names the
//! ranks that did not answer) and calls `MPI_Abort`: `mpirun` then ends every process of
//! the job at once with a non-zero status. An [`AbortHandle`] aborts this process's rank
//! only (its later calls fail with `Aborted`); its peers find out at their deadline.
//!
//! Collectives run to completion inside `start_*` (as the host backends' do), and
//! [`submit_all_reduce`](Communicator::submit_all_reduce) completes before it returns: no
//! overlap with computation yet. MPI must be initialised with at least
//! `Threading::Serialized`, since a replica thread other than the main one makes the calls
//! ([`Mpi::init`] asks for it).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::mpi::collective::{CommunicatorCollectives, Root, SystemOperation, UserOperation};
use ::mpi::datatype::Equivalence;
use ::mpi::environment::{Threading, Universe};
use ::mpi::point_to_point::{Destination, Source};
use ::mpi::request::{scope, LocalScope, Request, Scope};
use ::mpi::topology::{Communicator as MpiCommunicator, SimpleCommunicator};
use ::mpi::traits::Operation;
use half::{bf16, f16};
use mirra_device::{Buffer, DType};

use crate::collective::Collective;
use crate::comm::{AbortFlag, AbortHandle, Abortable, Work};
use crate::config::Config;
use crate::described::Described;
use crate::error::{CollectiveError, Result};
use crate::hierarchical::{fanout_timeout, Hierarchical, OnFailure, Shared};
use crate::pending::Pending;
use crate::reduce::{combine_op, with_dtype, ReduceOp, Reducible};
use crate::transport::{Desc, Place};
use crate::verdict::{verdict, Accepts};

/// The backend's name.
pub const MPI: &str = "mpi";

/// The tag of the metadata messages (MPI's collectives never match point-to-point
/// messages).
const META_TAG: i32 = 0x6d69;
/// The tag of the ring all-reduce's messages.
const DATA_TAG: i32 = 0x6d6a;

/// The bytes of a `u64` scratch buffer (8-byte aligned, for any element type).
fn bytemuck_bytes(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirements; the length is in bytes.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 8) }
}

/// MPI, initialised for mirra: hold it for the life of the job (it finalises MPI when
/// dropped) and drop every communicator made from it first.
pub struct Mpi {
    universe: Universe,
    threading: Threading,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let world = self.universe.world();
        write!(f, "Mpi(rank {} of {})", world.rank(), world.size())
    }
}

impl Mpi {
    /// Initialise MPI, asking for `Threading::Multiple` (calls from several threads at
    /// once: a multi-worker strategy's two groups) and accepting `Serialized` (calls from
    /// any one thread at a time: one communicator); an error when MPI was already
    /// initialised or offers less.
    pub fn init() -> std::result::Result<Mpi, String> {
        let (universe, threading) = ::mpi::initialize_with_threading(Threading::Multiple)
            .ok_or("MPI is already initialised (initialise it once, through Mpi::init)")?;
        if threading < Threading::Serialized {
            return Err(format!(
                "this MPI offers {threading:?} threading; mirra's replica threads need \
                 Serialized or Multiple"
            ));
        }
        Ok(Mpi {
            universe,
            threading,
        })
    }

    /// An error unless MPI runs with `Threading::Multiple`, which several communicators
    /// used from different threads at once need (a strategy's gradient and sums groups).
    pub fn check_threading_multiple(&self) -> std::result::Result<(), String> {
        if self.threading < Threading::Multiple {
            return Err(format!(
                "this MPI offers {:?} threading; a multi-worker strategy calls MPI from \
                 several threads at once and needs Multiple (OpenMPI: built with \
                 --enable-mpi-thread-multiple, as Debian's is)",
                self.threading
            ));
        }
        Ok(())
    }

    /// MPI's world communicator, to split with rsmpi's API (`::mpi`) before
    /// [`communicator`](Mpi::communicator).
    pub fn world_raw(&self) -> SimpleCommunicator {
        self.universe.world()
    }

    /// This process's rank of a communicator over every process of the job.
    pub fn world(&self, config: Config) -> Box<dyn crate::Communicator> {
        self.communicator(&self.universe.world(), config)
    }

    /// This process's rank of a communicator over the processes of `comm` (MPI's world or
    /// a split of it). The communicator is duplicated, so mirra's messages never meet the
    /// application's.
    pub fn communicator(
        &self,
        comm: &SimpleCommunicator,
        config: Config,
    ) -> Box<dyn crate::Communicator> {
        Box::new(self.rank_of(comm, config, 1))
    }

    /// This process's rank of `comm` (duplicated), as the `mpi` backend's type; the
    /// messages that end the job name rank `r` as `r x stride` (the cross group of a
    /// hierarchical one names the workers' leaders by their global ranks).
    pub(crate) fn rank_of(
        &self,
        comm: &SimpleCommunicator,
        config: Config,
        stride: usize,
    ) -> MpiComm {
        let comm = comm.duplicate();
        MpiComm {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            comm,
            timeout: config.timeout,
            stride,
            abort: Arc::new(AbortFlag::default()),
            scratch: RefCell::new(Vec::new()),
        }
    }
}

impl Mpi {
    /// This process as one worker of a hierarchical group
    /// ([`HIERARCHICAL`](crate::HIERARCHICAL)): `per_worker` ranks of the in-process
    /// backend `local` (one per replica thread), whose leader (local rank 0) is this
    /// process's rank of an `mpi` group over the processes of `comm`. The ranks come back
    /// in local order; their global ranks are `process rank x per_worker + local rank`.
    /// Every process must ask for the same `per_worker`: the leaders compare their counts,
    /// and a difference is an error on every process.
    ///
    /// Only the leader's rank calls MPI, from one thread at a time (its own, or its
    /// progress thread for [`submit_all_reduce`](crate::Communicator::submit_all_reduce)),
    /// which `Threading::Serialized` allows.
    pub fn hierarchical(
        &self,
        comm: &SimpleCommunicator,
        local: &str,
        per_worker: usize,
        config: Config,
    ) -> Result<Vec<Box<dyn crate::Communicator>>> {
        if per_worker == 0 {
            return Err(CollectiveError::InvalidWorldSize {
                world_size: 0,
                max: crate::MAX_WORLD_SIZE,
            });
        }
        // A leader may wait out one local stage before it joins the cross stage: the
        // leaders give each other that long again, so that a silent replica is named by
        // its own worker (at the local deadline) rather than its leader by the others.
        let cross_timeout = config.timeout.saturating_mul(2);
        let fanout = config
            .clone()
            .with_timeout(fanout_timeout(config.timeout, cross_timeout));
        let locals = crate::cpu_group(local, per_worker, config.clone())?;
        let fanouts = crate::cpu_group(local, per_worker, fanout)?;
        let cross_config = config.with_timeout(cross_timeout);
        let cross: Box<dyn crate::Communicator> =
            Box::new(self.rank_of(comm, cross_config, per_worker));
        let (worker, workers) = (cross.rank(), cross.world_size());
        let mut counts =
            Buffer::zeros(DType::I64, workers, mirra_device::Device::Cpu).expect("host memory");
        let mine = Buffer::from_slice(&[per_worker as i64], mirra_device::Device::Cpu)
            .expect("host memory");
        cross.all_gather(&mine, &mut counts)?;
        let counts = counts.as_slice::<i64>().expect("i64");
        if let Some(odd) = counts.iter().position(|&c| c != counts[0]) {
            return Err(CollectiveError::UnevenWorkers {
                worker: odd,
                ranks: counts[odd] as usize,
                ref_worker: 0,
                ref_ranks: counts[0] as usize,
            });
        }
        // A failure this worker sees (a replica gone or silent) is one the other workers
        // cannot learn of: end the job, as the `mpi` backend does at a deadline.
        let end_job: OnFailure = Box::new(|error: &CollectiveError| {
            eprintln!("mirra: {error}; ending the MPI job");
            // SAFETY: MPI is initialised (this `Mpi` lives); MPI_Abort may be called from
            // any thread and does not return.
            unsafe {
                ::mpi::ffi::MPI_Abort(::mpi::ffi::RSMPI_COMM_WORLD, 1);
            }
        });
        let shared = Arc::new(Shared::new(
            vec![
                locals[0].abort_handle(),
                fanouts[0].abort_handle(),
                cross.abort_handle(),
            ],
            Some(end_job),
        ));
        let mut cross = Some(cross);
        Ok(locals
            .into_iter()
            .zip(fanouts)
            .map(|(local, fanout)| {
                let leader = if local.rank() == 0 {
                    cross.take()
                } else {
                    None
                };
                Box::new(Hierarchical::new(
                    worker,
                    workers,
                    [local, fanout],
                    leader,
                    Arc::clone(&shared),
                )) as Box<dyn crate::Communicator>
            })
            .collect())
    }
}

/// One rank's communicator.
pub(crate) struct MpiComm {
    comm: SimpleCommunicator,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) timeout: Duration,
    /// The messages that end the job name rank `r` as `r x stride`.
    stride: usize,
    /// Set by this rank's [`AbortHandle`]s: every later call fails with `Aborted` (the only
    /// failure a rank survives; an expired deadline ends the job).
    pub(crate) abort: Arc<AbortFlag>,
    /// The ring all-reduce's receive buffer, kept between calls (8-byte words, aligned
    /// for any element type).
    scratch: RefCell<Vec<u64>>,
}

// SAFETY: an MPI communicator handle may be used from any thread when MPI runs with
// `Threading::Serialized` or more, which `Mpi::init` required; a communicator is not
// `Sync` (the trait's contract), so its calls are never concurrent.
unsafe impl Send for MpiComm {}

/// The words of a description sent to the peers ([`Desc::words`]).
type Meta = [u64; Desc::WORDS];

impl MpiComm {
    /// Poll `request` until it completes or `deadline` passes; then end the job, naming
    /// `waiting_for` (every peer when the collective cannot tell).
    fn finish<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        mut request: Request<'a, D, S>,
        op: Collective,
        deadline: Instant,
        waiting_for: &dyn Fn() -> Vec<usize>,
    ) {
        let start = Instant::now();
        loop {
            match request.test() {
                Ok(_) => return,
                Err(r) => request = r,
            }
            let now = Instant::now();
            if now >= deadline {
                self.end_job(op, waiting_for());
            }
            pause(now - start);
        }
    }

    /// A deadline passed with an MPI request outstanding: print why and abort the job.
    fn end_job(&self, op: Collective, waiting_for: Vec<usize>) -> ! {
        let error = CollectiveError::Timeout {
            op,
            rank: self.rank,
            waiting_for,
            after: self.timeout,
        }
        .renumbered(op, |r| r * self.stride);
        eprintln!("mirra: {error}; ending the MPI job (MPI cannot cancel a collective)");
        self.comm.abort(1)
    }

    /// Phase 1: every rank's description of this collective (`desc` is this rank's), in
    /// rank order.
    pub(crate) fn descriptions(&self, desc: Desc, deadline: Instant) -> Vec<Desc> {
        let all = self.exchange(desc.words(), desc.kind, deadline);
        all.iter()
            .enumerate()
            .map(|(p, m)| {
                if p == self.rank {
                    desc
                } else {
                    Desc::from_words(m)
                }
            })
            .collect()
    }

    /// The words of every rank's description.
    fn exchange(&self, mine: Meta, op: Collective, deadline: Instant) -> Vec<Meta> {
        let mut all = vec![[0u64; Desc::WORDS]; self.size];
        all[self.rank] = mine;
        let me = self.rank;
        scope(|sc: &LocalScope<'_>| {
            let sends: Vec<_> = (0..self.size)
                .filter(|&p| p != me)
                .map(|p| {
                    self.comm.process_at_rank(p as i32).immediate_send_with_tag(
                        sc,
                        &mine[..],
                        META_TAG,
                    )
                })
                .collect();
            let mut recvs: Vec<(usize, Request<'_, [u64], _>)> = Vec::new();
            for (p, slot) in all.iter_mut().enumerate() {
                if p != me {
                    let r = self
                        .comm
                        .process_at_rank(p as i32)
                        .immediate_receive_into_with_tag(sc, &mut slot[..], META_TAG);
                    recvs.push((p, r));
                }
            }
            // Receives first: a peer that never answers is one whose message is missing.
            let started = Instant::now();
            let mut pending = recvs;
            while !pending.is_empty() {
                let mut still = Vec::new();
                for (p, r) in pending {
                    if let Err(r) = r.test() {
                        still.push((p, r));
                    }
                }
                pending = still;
                if !pending.is_empty() {
                    let now = Instant::now();
                    if now >= deadline {
                        self.end_job(op, pending.iter().map(|(p, _)| *p).collect());
                    }
                    pause(now - started);
                }
            }
            for s in sends {
                self.finish(s, op, deadline, &|| Vec::new());
            }
        });
        all
    }

    /// Phase 2 for one wire type `W` and MPI operator `mpi_op`.
    fn data<W: Equivalence + Copy, O: Operation + Copy>(
        &self,
        d: &Desc,
        mpi_op: O,
        deadline: Instant,
    ) {
        let everyone = || (0..self.size).filter(|&p| p != self.rank).collect();
        // The pointers and lengths come from live buffers borrowed for this call
        // (`Desc::in_place`, `Desc::send_recv`), of an element type whose size is W's (the
        // caller picked W from the dtype). In-place collectives use the output slice alone
        // (src is dst), send-receive ones two distinct buffers; empty buffers get empty
        // slices (their pointers may be null).
        let input = || -> &[W] {
            if d.len_in == 0 {
                &[]
            } else {
                // SAFETY: as above: `len_in` elements of W's size behind `src`.
                unsafe { std::slice::from_raw_parts(d.src.cast::<W>(), d.len_in) }
            }
        };
        let output = || -> &mut [W] {
            if d.len_out == 0 {
                &mut []
            } else {
                // SAFETY: as above: `len_out` elements behind `dst`, which only this
                // slice reaches while it lives.
                unsafe { std::slice::from_raw_parts_mut(d.dst.cast::<W>(), d.len_out) }
            }
        };
        let c = &self.comm;
        let root = c.process_at_rank(d.root as i32);
        // MPI reduces from one buffer into another: an in-place reduction's input is
        // copied first.
        let reduces_in_place = d.kind == Collective::Reduce && self.rank == d.root;
        let copy: Vec<W> = if reduces_in_place {
            output().to_vec()
        } else {
            Vec::new()
        };
        scope(|sc: &LocalScope<'_>| match d.kind {
            Collective::AllReduce => unreachable!("the ring all-reduce runs it"),
            Collective::ReduceScatter => {
                let r = c.immediate_reduce_scatter_block_into(sc, input(), output(), mpi_op);
                self.finish(r, d.kind, deadline, &everyone);
            }
            Collective::AllGather => {
                let r = c.immediate_all_gather_into(sc, input(), output());
                self.finish(r, d.kind, deadline, &everyone);
            }
            Collective::Broadcast => {
                let r = root.immediate_broadcast_into(sc, output());
                self.finish(r, d.kind, deadline, &|| vec![d.root]);
            }
            Collective::Reduce if self.rank == d.root => {
                let r = root.immediate_reduce_into_root(sc, &copy[..], output(), mpi_op);
                self.finish(r, d.kind, deadline, &everyone);
            }
            Collective::Reduce => {
                let buf: &[W] = output();
                let r = root.immediate_reduce_into(sc, buf, mpi_op);
                self.finish(r, d.kind, deadline, &|| vec![d.root]);
            }
            Collective::Barrier => {
                let r = c.immediate_barrier();
                self.finish(r, d.kind, deadline, &everyone);
            }
        });
    }

    /// Phase 2 of an all-reduce, every dtype: a ring over MPI point to point, a
    /// reduce-scatter then an all-gather of `n` chunks, each combination through the
    /// crate's kernel. Every chunk is reduced once, in ring order, by one rank, then copied
    /// to the others: every rank ends with the same bits (which `MPI_Allreduce` does not
    /// promise), and each rank moves 2 (n-1)/n of the buffer, as MPI's own ring does.
    fn ring_all_reduce(&self, d: &Desc, deadline: Instant) {
        let (n, r) = (self.size, self.rank);
        if n == 1 || d.len_out == 0 {
            return;
        }
        let size = d.dtype_out.size_in_bytes();
        let (left, right) = ((r + n - 1) % n, (r + 1) % n);
        let chunk = |i: usize| crate::algo::slicing::chunk(d.len_out, n, i % n);
        // The received chunk, 8-byte aligned for any element type.
        let largest = (0..n).map(|i| chunk(i).len()).max().unwrap_or(0);
        let mut tmp = self.scratch.borrow_mut();
        let words = (largest * size).div_ceil(8);
        if tmp.len() < words {
            tmp.resize(words, 0);
        }
        // Bytes `range` (in elements) of the buffer; distinct ranges never overlap.
        let part = |range: std::ops::Range<usize>| -> &mut [u8] {
            // SAFETY: `dst` holds `len_out` elements of `size` bytes (`Desc::in_place`),
            // borrowed for this call; every range is within it, and the two parts alive at
            // once (one sent, one received) are distinct chunks.
            unsafe {
                std::slice::from_raw_parts_mut(d.dst.add(range.start * size), range.len() * size)
            }
        };
        let step = |send: std::ops::Range<usize>, recv: &mut [u8]| {
            scope(|sc: &LocalScope<'_>| {
                let c = &self.comm;
                let sent = c.process_at_rank(right as i32).immediate_send_with_tag(
                    sc,
                    &*part(send),
                    DATA_TAG,
                );
                let got = c
                    .process_at_rank(left as i32)
                    .immediate_receive_into_with_tag(sc, recv, DATA_TAG);
                self.finish(got, d.kind, deadline, &|| vec![left]);
                self.finish(sent, d.kind, deadline, &|| vec![right]);
            });
        };
        // Reduce-scatter: after step s, this rank's chunk r - s - 1 holds s + 2 ranks' sum.
        for s in 0..n - 1 {
            let (send, recv) = (chunk(r + n - s), chunk(r + n - s - 1));
            let bytes = recv.len() * size;
            let tmp_bytes = &mut bytemuck_bytes(&mut tmp)[..bytes];
            step(send, tmp_bytes);
            with_dtype!(d.dtype_out, T => {
                let len = recv.len();
                // SAFETY: `tmp` is 8-byte aligned and holds `len` received elements of T.
                let got = unsafe { std::slice::from_raw_parts(tmp.as_ptr().cast::<T>(), len) };
                // SAFETY: chunk `recv` of the buffer, of T's size, distinct from `tmp`.
                let mine = unsafe {
                    std::slice::from_raw_parts_mut(d.dst.cast::<T>().add(recv.start), len)
                };
                combine_op::<T>(d.op, mine, true, &[got], false, n);
            });
        }
        // All-gather: chunk r + 1 is complete here; pass complete chunks around the ring.
        for s in 0..n - 1 {
            let (send, recv) = (chunk(r + 1 + n - s), chunk(r + n - s));
            step(send, part(recv));
        }
    }

    /// Phase 2 for a type `T` that MPI's own operators cannot reduce as mirra does,
    /// travelling as words `W` of its size and reduced by the crate's kernel through a
    /// user-defined operation: f16 and bf16 (MPI has no 16-bit float type), and u8, whose
    /// sums OpenMPI 4.1's AVX operators saturate at 255 from 32 elements on (measured
    /// here with Debian's 4.1.4; open-mpi/ompi#8045, closed as won't fix), where every
    /// other backend wraps.
    fn data_kernel<T: Reducible, W: Equivalence + Copy>(&self, d: &Desc, deadline: Instant) {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<W>());
        let op = d.op;
        let world = self.size;
        let user = UserOperation::commutative(move |x, acc| {
            let x: &[W] = x.downcast().expect("words of the element's size");
            let acc: &mut [W] = acc.downcast().expect("words of the element's size");
            // SAFETY: T and W are plain-old-data types of one size (asserted above):
            // f16 or bf16 with u16, u8 with itself.
            let (x, acc) = unsafe {
                (
                    std::slice::from_raw_parts(x.as_ptr().cast::<T>(), x.len()),
                    std::slice::from_raw_parts_mut(acc.as_mut_ptr().cast::<T>(), acc.len()),
                )
            };
            combine_op(op, acc, true, &[x], false, world);
        });
        self.data::<W, _>(d, &user, deadline);
    }

    /// `Mean`'s division, on the collective's output where it has a result.
    fn finalize_mean(&self, d: &Desc) {
        let has_result = match d.kind {
            Collective::AllReduce | Collective::ReduceScatter => true,
            Collective::Reduce => self.rank == d.root,
            _ => false,
        };
        if d.op != ReduceOp::Mean || !has_result || self.size < 2 || d.len_out == 0 {
            return;
        }
        with_dtype!(d.dtype_out, T => {
            // SAFETY: as in `data`: the output buffer, of T's size, borrowed for the call.
            let out = unsafe { std::slice::from_raw_parts_mut(d.dst.cast::<T>(), d.len_out) };
            combine_op::<T>(ReduceOp::Mean, out, true, &[], true, self.size);
        })
    }
}

/// Between two tests of a request: MPI progresses a non-blocking collective only inside
/// its calls, so a waiting rank keeps calling, as MPI's blocking calls busy-poll; after
/// [`SPIN`] it yields its core between tests, so that ranks sharing cores (more ranks than
/// cores, `--oversubscribe`) still run.
fn pause(waited: Duration) {
    if waited >= SPIN {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// How long a waiting rank tests without yielding.
const SPIN: Duration = Duration::from_micros(200);

/// MPI's own operator for `op` (`Mean` sums; the division follows).
fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => SystemOperation::sum(),
        ReduceOp::Product => SystemOperation::product(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    }
}

impl Described for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.size
    }
    fn backend(&self) -> &'static str {
        MPI
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn abort_handle(&self) -> AbortHandle {
        AbortHandle::new(self.abort.clone())
    }

    fn start(&self, desc: Desc) -> Result<Work<'_>> {
        let op = desc.kind;
        if self.abort.is_aborted() {
            return Err(CollectiveError::Aborted { op });
        }
        let deadline = Instant::now() + self.timeout;
        let descs = self.descriptions(desc, deadline);
        verdict(self.size, &|p| descs[p], op, MPI, &|_| Accepts(Place::Cpu))?;
        if op != Collective::Barrier && desc.len_in == 0 && desc.len_out == 0 {
            return Ok(Work::completed(op));
        }
        match desc.dtype_in {
            _ if op == Collective::AllReduce => self.ring_all_reduce(&desc, deadline),
            DType::F16 => self.data_kernel::<f16, u16>(&desc, deadline),
            DType::BF16 => self.data_kernel::<bf16, u16>(&desc, deadline),
            DType::U8 => self.data_kernel::<u8, u8>(&desc, deadline),
            DType::F32 => self.data::<f32, _>(&desc, system_op(desc.op), deadline),
            DType::F64 => self.data::<f64, _>(&desc, system_op(desc.op), deadline),
            DType::I32 => self.data::<i32, _>(&desc, system_op(desc.op), deadline),
            DType::I64 => self.data::<i64, _>(&desc, system_op(desc.op), deadline),
        }
        self.finalize_mean(&desc);
        Ok(Work::completed(op))
    }

    fn submit_all_reduce(&self, mut buf: Buffer, op: ReduceOp) -> Result<Pending> {
        self.start(Desc::in_place(Collective::AllReduce, &mut buf, op, 0))?
            .wait()?;
        Ok(Pending::ready(Collective::AllReduce, buf))
    }
}
