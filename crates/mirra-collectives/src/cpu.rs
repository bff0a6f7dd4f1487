//! Communicators whose ranks are threads of one process, over the shared-memory
//! transport. One driver runs every collective the same way; the algorithm only supplies
//! the data phase:
//!
//! 1. post the collective's metadata and buffer pointers (sequence number `seq`);
//! 2. rendezvous: wait until every rank has posted `seq`;
//! 3. verdict: every rank checks every rank's metadata, in the same order, so all ranks
//!    reach the same verdict; a mismatch is an error on every rank, and no buffer is read;
//! 4. data phase: the algorithm's schedule;
//! 5. exit: wait until every rank has left the data phase, after which no peer touches
//!    this rank's buffers and the call may return (and the caller may free them).
//!
//! A collective the algorithm posts eagerly (its input copied into the group's memory at
//! step 1: `direct`'s small all-reduces) skips the data phase's entry and exit
//! handshakes: no rank touches another caller's buffer, so none waits for the others.
//!
//! On a timeout, an abort or a dead peer, the rank aborts the group (recording the first
//! cause) and waits until no peer is inside a data phase before it returns the error.
//!
//! Collectives on borrowed buffers (`start_*`) run on the caller's thread and complete
//! before `start_*` returns: a borrowed buffer may be freed as soon as the borrow ends
//! (`mem::forget` of the `Work` ends it without running any code), so no other thread may
//! touch it after `start_*` returns. Collectives on owned buffers (`submit_*`) run on the
//! rank's [`Progress`] thread; a `start_*` first waits for them, so every rank runs its
//! collectives in the order it started them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirra_device::Buffer;

use crate::algo::{self, Algorithm, BACKENDS};
use crate::collective::Collective;
use crate::comm::{AbortHandle, Communicator, Work};
use crate::config::Config;
use crate::described::Described;
use crate::error::{CollectiveError, Result};
use crate::pending::Pending;
use crate::progress::OnDemand;
use crate::reduce::ReduceOp;
use crate::transport::{Cause, Ctx, Desc, Group, Place, Stop, MAX_WORLD_SIZE};
use crate::verdict::{verdict, Accepts};

/// Make a group of `world_size` communicators whose ranks are threads of this process,
/// running the algorithm named `backend` (one of [`BACKENDS`]). Element `r` is rank `r`:
/// hand each to its own thread.
pub fn cpu_group(
    backend: &str,
    world_size: usize,
    config: Config,
) -> Result<Vec<Box<dyn Communicator>>> {
    let algo = algo::by_name(backend).ok_or_else(|| CollectiveError::UnknownBackend {
        name: backend.to_string(),
        known: BACKENDS,
    })?;
    if world_size == 0 || world_size > MAX_WORLD_SIZE {
        return Err(CollectiveError::InvalidWorldSize {
            world_size,
            max: MAX_WORLD_SIZE,
        });
    }
    let group = Arc::new(Group::new(world_size, config));
    Ok((0..world_size)
        .map(|rank| {
            Box::new(CpuCommunicator {
                rank: Arc::new(Rank {
                    group: Arc::clone(&group),
                    algo,
                    rank,
                    seq: AtomicU64::new(0),
                }),
                progress: OnDemand::default(),
            }) as Box<dyn Communicator>
        })
        .collect())
}

/// One rank of a [`cpu_group`]. `Send` but not `Sync` ([`OnDemand`]): one thread at a
/// time calls it, and its progress thread runs the submitted collectives.
struct CpuCommunicator {
    rank: Arc<Rank>,
    /// Started on the first `submit_*`.
    progress: OnDemand,
}

/// What runs one rank's collectives: the caller's thread or, for submitted ones, the
/// progress thread, never both at once (a `start_*` waits until the progress thread is
/// idle, and only the caller's thread submits).
struct Rank {
    group: Arc<Group>,
    /// The schedules this group runs (the same for every rank).
    algo: &'static dyn Algorithm,
    rank: usize,
    /// Sequence number of the last collective this rank started.
    seq: AtomicU64,
}

/// Armed while a collective runs. Dropped armed only when the thread unwinds out of the
/// collective (a broken invariant panicked): then it aborts the group naming this rank and
/// waits until no peer is in a data phase, so that unwinding cannot free buffers a peer
/// is still reading.
struct OpGuard<'a> {
    group: &'a Group,
    rank: usize,
    armed: bool,
}

impl OpGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.group.abort_with(Cause::RankGone(self.rank));
            self.group.leave_data(self.rank, None);
            self.group.wait_peers_out(self.rank);
        }
    }
}

impl Rank {
    /// Run one collective to completion (see the module documentation).
    fn run(&self, desc: Desc) -> Result<()> {
        let g = &*self.group;
        let (me, kind) = (self.rank, desc.kind);
        if g.is_aborted() {
            return Err(g.cause_error(kind));
        }
        // Only one thread runs this rank's collectives at a time (see `Rank`).
        let seq = self.seq.load(Ordering::Relaxed) + 1;
        self.seq.store(seq, Ordering::Relaxed);
        let timeout = g.config.timeout;
        let start = Instant::now();
        let deadline = start
            .checked_add(timeout)
            .unwrap_or_else(|| start + Duration::from_secs(86_400 * 365));
        let guard = OpGuard {
            group: g,
            rank: me,
            armed: true,
        };
        g.post(
            me,
            seq,
            &desc,
            self.algo.eager(&desc, g.world_size(), g.eager_bytes),
        );
        if let Err(stop) = g.wait_posted(me, seq, deadline) {
            return Err(self.fail(guard, kind, stop));
        }
        let posted = |p: usize| g.posted_desc(p, seq);
        let host = |_: usize| Accepts(Place::Cpu);
        if let Err(e) = verdict(g.world_size(), &posted, kind, self.algo.name(), &host) {
            guard.disarm();
            return Err(e);
        }
        if kind == Collective::Barrier || (desc.len_in == 0 && desc.len_out == 0) {
            guard.disarm();
            return Ok(());
        }
        let ctx = Ctx::new(g, me, seq, deadline, desc);
        // An eager data phase touches no caller's buffer but this rank's own: no peer needs
        // to know when this rank is in it or done with it (see `Ctx::is_eager`).
        let handshakes = !ctx.is_eager();
        if handshakes && !g.enter_data(me, seq) {
            return Err(self.fail(guard, kind, Stop::Aborted));
        }
        let algo = self.algo;
        let res = match kind {
            Collective::AllReduce => algo.all_reduce(&ctx),
            Collective::ReduceScatter => algo.reduce_scatter(&ctx),
            Collective::AllGather => algo.all_gather(&ctx),
            Collective::Broadcast => algo.broadcast(&ctx),
            Collective::Reduce => algo.reduce(&ctx),
            Collective::Barrier => Ok(()),
        };
        if !handshakes {
            return match res {
                Ok(()) => {
                    guard.disarm();
                    Ok(())
                }
                Err(stop) => Err(self.fail(guard, kind, stop)),
            };
        }
        match res {
            Ok(()) => g.leave_data(me, Some(seq)),
            Err(stop) => {
                g.leave_data(me, None);
                return Err(self.fail(guard, kind, stop));
            }
        }
        if let Err(stop) = g.wait_exited(me, seq, deadline) {
            return Err(self.fail(guard, kind, stop));
        }
        guard.disarm();
        Ok(())
    }

    /// Abort the group for `stop` (unless it already is) and wait until no peer is in a
    /// data phase; the error to return is the group's first cause.
    fn fail(&self, guard: OpGuard<'_>, kind: Collective, stop: Stop) -> CollectiveError {
        let g = &*self.group;
        let cause = match stop {
            Stop::Timeout(waiting_for) => Cause::Timeout {
                rank: self.rank,
                waiting_for,
                after: g.config.timeout,
            },
            Stop::Aborted => Cause::Aborted,
        };
        g.abort_with(cause);
        g.wait_peers_out(self.rank);
        guard.disarm();
        g.cause_error(kind)
    }
}

impl Described for CpuCommunicator {
    fn start(&self, desc: Desc) -> Result<Work<'_>> {
        self.progress.drain();
        let kind = desc.kind;
        self.rank.run(desc).map(|()| Work::completed(kind))
    }

    fn rank(&self) -> usize {
        self.rank.rank
    }
    fn world_size(&self) -> usize {
        self.rank.group.world_size()
    }
    fn backend(&self) -> &'static str {
        self.rank.algo.name()
    }
    fn timeout(&self) -> Duration {
        self.rank.group.config.timeout
    }
    fn abort_handle(&self) -> AbortHandle {
        AbortHandle::new(self.rank.group.clone())
    }

    fn submit_all_reduce(&self, mut buf: Buffer, op: ReduceOp) -> Result<Pending> {
        let kind = Collective::AllReduce;
        let rank = Arc::clone(&self.rank);
        let job = Box::new(move || {
            rank.run(Desc::in_place(kind, &mut buf, op, 0))?;
            Ok(buf)
        });
        self.progress.submit(self.rank.rank, kind, job)
    }
}

impl Drop for CpuCommunicator {
    /// A rank that leaves makes every pending and later call of the others fail with
    /// [`CollectiveError::RankGone`] naming it. Submitted collectives are run first (the
    /// others expect them; each has a deadline); after that no collective of this rank is
    /// running (borrowed ones complete inside `start_*`), so none of its buffers is
    /// exposed.
    fn drop(&mut self) {
        self.progress.stop();
        self.rank.group.abort_with(Cause::RankGone(self.rank.rank));
    }
}
