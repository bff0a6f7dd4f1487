//! The hierarchical backend: a group of `workers x per_worker` ranks built of smaller
//! groups, the way multi-worker training reduces gradients (TensorFlow's
//! `MultiWorkerMirroredStrategy`, Horovod's hierarchical all-reduce). Each worker's ranks
//! form a *local* group (in-process replicas: a CPU backend over shared memory); rank 0
//! of every worker (its *leader*) is also a rank of the *cross* group of leaders (MPI
//! across processes and machines, or any backend in tests). Global rank
//! `worker * per_worker + local` is the rank a flat group would have: workers in order,
//! their replicas in order.
//!
//! Every collective runs in two phases, as the other backends' do:
//!
//! 1. **Metadata**: every rank's description reaches every rank (a local all-gather, the
//!    leaders' all-gather, a local broadcast), and the shared verdict (`verdict.rs`) checks
//!    them with the global ranks: a mismatch is the same error on every rank, naming
//!    global ranks, and leaves the group usable. This phase is also a barrier.
//! 2. **Data**, one buffer per worker across workers:
//!    - all-reduce: local reduce to the leader, the leaders' all-reduce, local broadcast;
//!    - reduce: local reduce, the leaders' reduce to the root's worker, and a local
//!      broadcast there when the root is not its worker's leader;
//!    - broadcast: from the root to its leader, across leaders, to every worker's ranks;
//!    - all-gather: a local all-gather into the worker's block, the leaders' all-gather,
//!      a local broadcast;
//!    - reduce-scatter: a local reduce, the leaders' reduce-scatter of worker blocks, a
//!      local broadcast of the block, each rank's slice of it.
//!
//!    Every rank ends with its leader's bits, so results are bitwise identical across the
//!    group. `Mean` is a sum in every stage, divided by the global size at the end.
//!
//! **Failures.** Every stage has a deadline. The stages a worker's ranks join at once
//! (the first metadata stage, the reductions to the leader) have the local group's; the
//! leaders' stages the cross group's; the stages in which a worker's ranks wait for
//! their leader's cross stage run on a second local group with a longer deadline
//! (`fanout_timeout`), so that a silent rank is named by the ranks that wait for it
//! directly, never its leader by the ranks that wait with it. A failed stage (a timeout, a
//! rank gone, an abort) is recorded, with its ranks turned into global ones, in the state
//! every rank of the group shares; the rank then aborts every group it shares that state
//! with, so ranks waiting in another stage fail at once with the recorded error rather
//! than at their own deadlines. In one process ([`hierarchical_group`]) that state spans
//! every worker; under MPI it spans one worker's ranks, and a cross stage that times out
//! ends the job (the `mpi` backend's rule).
//!
//! Buffers are host memory (the local groups are CPU backends). Collectives run to
//! completion inside `start_*`; [`submit_all_reduce`](Communicator::submit_all_reduce)
//! runs on a progress thread, overlapping with the caller.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mirra_device::sync::lock;
use mirra_device::{Buffer, DType, Device};

use crate::collective::Collective;
use crate::comm::{AbortHandle, Abortable, Communicator, Work};
use crate::config::Config;
use crate::cpu::cpu_group;
use crate::error::{CollectiveError, Result};
use crate::pending::Pending;
use crate::progress::OnDemand;
use crate::reduce::{combine_op, with_dtype, ReduceOp};
use crate::transport::{Desc, Place};
use crate::verdict::{verdict, Accepts};

/// The backend's name.
pub const HIERARCHICAL: &str = "hierarchical";

type Comm = Box<dyn Communicator>;

/// A hierarchical group run in one process, its workers simulated by groups of threads:
/// `workers` local groups of backend `local` with `per_worker` ranks each, and a cross
/// group of backend `cross` over their leaders. For tests, and for comparing the
/// hierarchical schedule with a flat one on one machine; across processes, see
/// `Mpi::hierarchical` (feature `mpi`).
pub fn hierarchical_group(
    local: &str,
    cross: &str,
    workers: usize,
    per_worker: usize,
    config: Config,
) -> Result<Vec<Comm>> {
    if workers == 0 || per_worker == 0 {
        return Err(CollectiveError::InvalidWorldSize {
            world_size: workers * per_worker,
            max: crate::MAX_WORLD_SIZE * crate::MAX_WORLD_SIZE,
        });
    }
    let fanout_config = config
        .clone()
        .with_timeout(fanout_timeout(config.timeout, config.timeout));
    let mut workers_groups = Vec::with_capacity(workers);
    let mut subgroups = Vec::new();
    for _ in 0..workers {
        let locals = cpu_group(local, per_worker, config.clone())?;
        let fanouts = cpu_group(local, per_worker, fanout_config.clone())?;
        subgroups.extend([locals[0].abort_handle(), fanouts[0].abort_handle()]);
        workers_groups.push(locals.into_iter().zip(fanouts));
    }
    let leaders = cpu_group(cross, workers, config)?;
    subgroups.push(leaders[0].abort_handle());
    let shared = Arc::new(Shared::new(subgroups, None));
    let mut leaders = leaders.into_iter();
    let mut comms = Vec::with_capacity(workers * per_worker);
    for (worker, group) in workers_groups.into_iter().enumerate() {
        let mut leader = leaders.next();
        for (local, fanout) in group {
            // cpu_group hands out ranks in order: local rank 0, the leader, comes first.
            let cross = if local.rank() == 0 {
                leader.take()
            } else {
                None
            };
            let shared = Arc::clone(&shared);
            let rank = Hierarchical::new(worker, workers, [local, fanout], cross, shared);
            comms.push(Box::new(rank) as Comm);
        }
    }
    Ok(comms)
}

/// The deadline of the stages in which a worker's ranks wait for their leader's cross
/// stage: one local stage (the leader may have waited that long for its own ranks), the
/// cross stage, and one local stage more. Longer than either, so that a silent rank is
/// named by the ranks that wait for it directly (its worker at the local deadline, the
/// other leaders at the cross one) before anyone blames the leader that waits with them.
pub(crate) fn fanout_timeout(local: Duration, cross: Duration) -> Duration {
    local.saturating_mul(2).saturating_add(cross)
}

/// What every rank of a hierarchical group shares (see the module documentation).
pub(crate) struct Shared {
    /// The first failure of any stage, in global ranks.
    failure: Mutex<Option<CollectiveError>>,
    aborted: AtomicBool,
    /// The groups this state covers (every local group and the cross group in one
    /// process; one worker's local group and its leader's cross rank under MPI).
    subgroups: Vec<AbortHandle>,
    /// Called with the first failure of the group, unless it is an abort (under MPI: end
    /// the job, since the other workers cannot learn of it).
    on_failure: Option<OnFailure>,
}

/// What a group does on its first failure.
pub(crate) type OnFailure = Box<dyn Fn(&CollectiveError) + Send + Sync>;

impl Shared {
    pub(crate) fn new(subgroups: Vec<AbortHandle>, on_failure: Option<OnFailure>) -> Shared {
        Shared {
            failure: Mutex::new(None),
            aborted: AtomicBool::new(false),
            subgroups,
            on_failure,
        }
    }

    /// Record `error` unless a failure was recorded first; abort every group; the
    /// failure to report.
    fn fail(&self, error: CollectiveError) -> CollectiveError {
        let (first, new) = {
            let mut failure = lock(&self.failure);
            let new = failure.is_none();
            (failure.get_or_insert(error).clone(), new)
        };
        if new && !matches!(first, CollectiveError::Aborted { .. }) {
            if let Some(f) = &self.on_failure {
                f(&first);
            }
        }
        self.abort();
        first
    }

    /// The error a collective `op` started after a failure or an abort returns.
    fn check(&self, op: Collective) -> Result<()> {
        if let Some(e) = &*lock(&self.failure) {
            return Err(e.clone().renumbered(op, |r| r));
        }
        if self.is_aborted() {
            return Err(CollectiveError::Aborted { op });
        }
        Ok(())
    }
}

impl Abortable for Shared {
    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        for h in &self.subgroups {
            h.abort();
        }
    }
    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}

/// A rank's communicators: its worker's two local groups and, on the leader, the cross
/// group.
struct Parts {
    /// The stages every rank of the worker joins at once: the local deadline.
    local: Comm,
    /// The stages that wait for the leader's cross stage: the longer
    /// [`fanout_timeout`]. The same ranks as `local`, in a group of its own.
    fanout: Comm,
    cross: Option<Comm>,
    /// The metadata phase's buffers (i64 words of [`Desc::words`]): this rank's, its
    /// worker's, everyone's.
    mine: Buffer,
    worker_meta: Buffer,
    all_meta: Buffer,
}

/// One rank, shared with its progress thread.
struct Rank {
    parts: Mutex<Parts>,
    worker: usize,
    workers: usize,
    per_worker: usize,
    /// The rank in the worker's local group.
    local_rank: usize,
    timeout: Duration,
    shared: Arc<Shared>,
}

/// One rank of a hierarchical group.
pub(crate) struct Hierarchical {
    rank: Arc<Rank>,
    progress: OnDemand,
}

impl Hierarchical {
    /// Rank `local.rank()` of worker `worker` (of `workers`), with its rank of the
    /// worker's `[local, fanout]` groups ([`Parts`]); `cross` on the worker's leader
    /// (local rank 0) only.
    pub(crate) fn new(
        worker: usize,
        workers: usize,
        [local, fanout]: [Comm; 2],
        cross: Option<Comm>,
        shared: Arc<Shared>,
    ) -> Hierarchical {
        debug_assert_eq!(local.rank(), fanout.rank());
        debug_assert_eq!(cross.is_some(), local.rank() == 0);
        let per_worker = local.world_size();
        let words = |n: usize| {
            Buffer::zeros(DType::I64, n * Desc::WORDS, Device::Cpu).expect("host memory")
        };
        let (timeout, local_rank) = (local.timeout(), local.rank());
        Hierarchical {
            rank: Arc::new(Rank {
                parts: Mutex::new(Parts {
                    mine: words(1),
                    worker_meta: words(per_worker),
                    all_meta: words(workers * per_worker),
                    local,
                    fanout,
                    cross,
                }),
                worker,
                workers,
                per_worker,
                local_rank,
                timeout,
                shared,
            }),
            progress: OnDemand::default(),
        }
    }
}

/// `Mean` sums in every stage (the division comes once, at the end).
fn stage_op(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Mean => ReduceOp::Sum,
        other => other,
    }
}

/// The buffers of one collective, as the caller passed them.
enum Bufs<'b> {
    InPlace(&'b mut Buffer),
    SendRecv(&'b Buffer, &'b mut Buffer),
    None,
}

impl Rank {
    fn size(&self) -> usize {
        self.workers * self.per_worker
    }

    /// The global rank.
    fn global(&self) -> usize {
        self.worker * self.per_worker + self.local_rank
    }

    /// Run one collective (both phases) to completion.
    fn run(&self, desc: Desc, bufs: Bufs<'_>) -> Result<()> {
        let op = desc.kind;
        self.shared.check(op)?;
        let mut parts = lock(&self.parts);
        let parts = &mut *parts;
        let me = self.global();
        let descs = self.agree(parts, &desc, me)?;
        let host = |_: usize| Accepts(Place::Cpu);
        verdict(self.size(), &|p| descs[p], op, HIERARCHICAL, &host)?;
        if op == Collective::Barrier || (desc.len_in == 0 && desc.len_out == 0) {
            // The metadata phase was the barrier.
            return Ok(());
        }
        let local_rank = self.local_rank;
        let stage = Stages {
            rank: self,
            op,
            local: &*parts.local,
            fanout: &*parts.fanout,
            cross: parts.cross.as_deref(),
        };
        let result = match bufs {
            Bufs::InPlace(buf) => match op {
                Collective::AllReduce => stage.all_reduce(buf, desc.op),
                Collective::Reduce => stage.reduce(buf, desc.op, desc.root, me),
                Collective::Broadcast => stage.broadcast(buf, desc.root),
                _ => unreachable!("{op} has a send and a receive buffer"),
            },
            Bufs::SendRecv(send, recv) => match op {
                Collective::AllGather => stage.all_gather(send, recv),
                Collective::ReduceScatter => stage.reduce_scatter(send, recv, desc.op, local_rank),
                _ => unreachable!("{op} is in place"),
            },
            Bufs::None => unreachable!("only the barrier has no buffers"),
        };
        result.map_err(|e| self.shared.fail(e))
    }

    /// The metadata phase: every rank's description, in global rank order.
    fn agree(&self, parts: &mut Parts, desc: &Desc, me: usize) -> Result<Vec<Desc>> {
        let op = desc.kind;
        let words = desc.words();
        for (d, w) in parts
            .mine
            .as_mut_slice::<i64>()
            .expect("i64")
            .iter_mut()
            .zip(words)
        {
            *d = w as i64;
        }
        let local_err = |e: CollectiveError| {
            let base = self.worker * self.per_worker;
            self.shared.fail(e.renumbered(op, |l| base + l))
        };
        let cross_err = |e: CollectiveError| {
            let per_worker = self.per_worker;
            self.shared.fail(e.renumbered(op, |w| w * per_worker))
        };
        parts
            .local
            .all_gather(&parts.mine, &mut parts.worker_meta)
            .map_err(local_err)?;
        if let Some(cross) = &parts.cross {
            cross
                .all_gather(&parts.worker_meta, &mut parts.all_meta)
                .map_err(cross_err)?;
        }
        parts
            .fanout
            .broadcast(&mut parts.all_meta, 0)
            .map_err(local_err)?;
        let all = parts.all_meta.as_slice::<i64>().expect("i64");
        Ok((0..self.size())
            .map(|p| {
                if p == me {
                    return *desc;
                }
                let mut w = [0u64; Desc::WORDS];
                for (d, &s) in w.iter_mut().zip(&all[p * Desc::WORDS..]) {
                    *d = s as u64;
                }
                Desc::from_words(&w)
            })
            .collect())
    }
}

/// The data phase of one collective, stage by stage; each stage's error is renumbered
/// into global ranks.
struct Stages<'a> {
    rank: &'a Rank,
    op: Collective,
    local: &'a dyn Communicator,
    fanout: &'a dyn Communicator,
    cross: Option<&'a dyn Communicator>,
}

impl Stages<'_> {
    /// Runs `stage` on the worker's ranks, which join it at once.
    fn local(&self, stage: impl FnOnce(&dyn Communicator) -> Result<()>) -> Result<()> {
        let base = self.rank.worker * self.rank.per_worker;
        stage(self.local).map_err(|e| e.renumbered(self.op, |l| base + l))
    }

    /// Runs `stage` on the worker's ranks after a cross stage (they wait for the leader).
    fn fanout(&self, stage: impl FnOnce(&dyn Communicator) -> Result<()>) -> Result<()> {
        let base = self.rank.worker * self.rank.per_worker;
        stage(self.fanout).map_err(|e| e.renumbered(self.op, |l| base + l))
    }

    /// Runs `stage` on the leader; nothing elsewhere.
    fn cross(&self, stage: impl FnOnce(&dyn Communicator) -> Result<()>) -> Result<()> {
        let per_worker = self.rank.per_worker;
        match self.cross {
            Some(c) => stage(c).map_err(|e| e.renumbered(self.op, |w| w * per_worker)),
            None => Ok(()),
        }
    }

    /// `Mean`'s division by the global size.
    fn finish_mean(&self, buf: &mut Buffer, op: ReduceOp) {
        let n = self.rank.size();
        if op != ReduceOp::Mean || n < 2 || buf.is_empty() {
            return;
        }
        with_dtype!(buf.dtype(), T => {
            let out = buf.as_mut_slice::<T>().expect("a host buffer of its dtype");
            combine_op::<T>(ReduceOp::Mean, out, true, &[], true, n);
        })
    }

    fn all_reduce(&self, buf: &mut Buffer, op: ReduceOp) -> Result<()> {
        let sub = stage_op(op);
        self.local(|c| c.reduce(buf, sub, 0))?;
        self.cross(|c| c.all_reduce(buf, sub))?;
        self.fanout(|c| c.broadcast(buf, 0))?;
        self.finish_mean(buf, op);
        Ok(())
    }

    fn reduce(&self, buf: &mut Buffer, op: ReduceOp, root: usize, me: usize) -> Result<()> {
        let per_worker = self.rank.per_worker;
        let (root_worker, root_local) = (root / per_worker, root % per_worker);
        let sub = stage_op(op);
        // The other ranks' buffers stay as they were: the stages reduce a copy.
        let mut tmp = buf.clone();
        self.local(|c| c.reduce(&mut tmp, sub, 0))?;
        self.cross(|c| c.reduce(&mut tmp, sub, root_worker))?;
        if self.rank.worker == root_worker && root_local != 0 {
            self.fanout(|c| c.broadcast(&mut tmp, 0))?;
        }
        if me == root {
            buf.copy_from(&tmp).expect("same dtype and length");
            self.finish_mean(buf, op);
        }
        Ok(())
    }

    fn broadcast(&self, buf: &mut Buffer, root: usize) -> Result<()> {
        let per_worker = self.rank.per_worker;
        let (root_worker, root_local) = (root / per_worker, root % per_worker);
        // The root's worker first (its leader then holds the data), then across leaders,
        // then every other worker from its leader.
        if self.rank.worker == root_worker {
            self.local(|c| c.broadcast(buf, root_local))?;
        }
        self.cross(|c| c.broadcast(buf, root_worker))?;
        if self.rank.worker != root_worker {
            let from = 0;
            // The mutant: the other workers broadcast from the root's local rank, not
            // from their leader (which alone holds the data).
            #[cfg(test)]
            let from = match crate::mutants::active() {
                Some(crate::mutants::Mutant::WrongLocalRoot) => root_local,
                _ => from,
            };
            self.fanout(|c| c.broadcast(buf, from))?;
        }
        Ok(())
    }

    fn all_gather(&self, send: &Buffer, recv: &mut Buffer) -> Result<()> {
        let len = send.len();
        let mut block = Buffer::alloc(send.dtype(), len * self.rank.per_worker, Device::Cpu)
            .expect("host memory");
        self.local(|c| c.all_gather(send, &mut block))?;
        self.cross(|c| c.all_gather(&block, recv))?;
        self.fanout(|c| c.broadcast(recv, 0))
    }

    fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &mut Buffer,
        op: ReduceOp,
        local_rank: usize,
    ) -> Result<()> {
        let (len, sub) = (recv.len(), stage_op(op));
        let mut tmp = send.clone();
        let mut block = Buffer::alloc(recv.dtype(), len * self.rank.per_worker, Device::Cpu)
            .expect("host memory");
        self.local(|c| c.reduce(&mut tmp, sub, 0))?;
        self.cross(|c| c.reduce_scatter(&tmp, &mut block, sub))?;
        self.fanout(|c| c.broadcast(&mut block, 0))?;
        recv.copy_range_from(0, &block, local_rank * len, len)
            .expect("the rank's slice of its worker's block");
        self.finish_mean(recv, op);
        Ok(())
    }
}

impl Hierarchical {
    fn start_with<'b>(&'b self, desc: Desc, bufs: Bufs<'b>) -> Result<Work<'b>> {
        self.progress.drain();
        let kind = desc.kind;
        self.rank.run(desc, bufs).map(|()| Work::completed(kind))
    }
}

impl Communicator for Hierarchical {
    fn rank(&self) -> usize {
        self.rank.global()
    }
    fn world_size(&self) -> usize {
        self.rank.size()
    }
    fn backend(&self) -> &'static str {
        HIERARCHICAL
    }
    fn timeout(&self) -> Duration {
        self.rank.timeout
    }
    fn abort_handle(&self) -> AbortHandle {
        AbortHandle::new(self.rank.shared.clone())
    }

    fn start_all_reduce<'b>(&'b self, buf: &'b mut Buffer, op: ReduceOp) -> Result<Work<'b>> {
        let desc = Desc::in_place(Collective::AllReduce, buf, op, 0);
        self.start_with(desc, Bufs::InPlace(buf))
    }

    fn start_reduce_scatter<'b>(
        &'b self,
        send: &'b Buffer,
        recv: &'b mut Buffer,
        op: ReduceOp,
    ) -> Result<Work<'b>> {
        let desc = Desc::send_recv(Collective::ReduceScatter, send, recv, op);
        self.start_with(desc, Bufs::SendRecv(send, recv))
    }

    fn start_all_gather<'b>(&'b self, send: &'b Buffer, recv: &'b mut Buffer) -> Result<Work<'b>> {
        let desc = Desc::send_recv(Collective::AllGather, send, recv, ReduceOp::Sum);
        self.start_with(desc, Bufs::SendRecv(send, recv))
    }

    fn start_broadcast<'b>(&'b self, buf: &'b mut Buffer, root: usize) -> Result<Work<'b>> {
        let desc = Desc::in_place(Collective::Broadcast, buf, ReduceOp::Sum, root);
        self.start_with(desc, Bufs::InPlace(buf))
    }

    fn start_reduce<'b>(
        &'b self,
        buf: &'b mut Buffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'b>> {
        let desc = Desc::in_place(Collective::Reduce, buf, op, root);
        self.start_with(desc, Bufs::InPlace(buf))
    }

    fn start_barrier(&self) -> Result<Work<'_>> {
        self.start_with(Desc::empty(Collective::Barrier), Bufs::None)
    }

    fn submit_all_reduce(&self, mut buf: Buffer, op: ReduceOp) -> Result<Pending> {
        let kind = Collective::AllReduce;
        let rank = Arc::clone(&self.rank);
        let global = rank.global();
        let job = Box::new(move || {
            let desc = Desc::in_place(kind, &mut buf, op, 0);
            rank.run(desc, Bufs::InPlace(&mut buf))?;
            Ok(buf)
        });
        self.progress.submit(global, kind, job)
    }
}

impl Drop for Hierarchical {
    fn drop(&mut self) {
        // Queued collectives run first (the other ranks expect them); then the sub-groups'
        // communicators drop with `rank`, and their peers see this rank gone.
        self.progress.stop();
    }
}
