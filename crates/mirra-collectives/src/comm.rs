//! The trait every backend implements ([`Communicator`]), the handle of a started
//! collective ([`Work`]) and the handle that aborts a group ([`AbortHandle`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirra_device::Buffer;

use crate::collective::Collective;
use crate::error::{CollectiveError, Result};
use crate::pending::Pending;
use crate::reduce::ReduceOp;

/// One rank's endpoint of a communicator group.
///
/// A communicator is `Send` but not `Sync`: each rank owns one and calls it from one thread
/// at a time, as NCCL requires of its communicators. Every rank of a group must start the
/// same collectives in the same order (with matching lengths, dtypes, operators and
/// roots; a mismatch is an error on every rank, never a hang or a wrong result).
///
/// Collectives are started with `start_*`, which returns a [`Work`] handle that borrows the
/// buffers until the collective is complete; several may be started before any is waited
/// for, and they complete in start order. The blocking forms (`all_reduce`, ...) start and
/// wait. Every wait has a deadline ([`Config::timeout`](crate::Config::timeout)); a rank
/// that does not take part in time, leaves the group or is aborted makes the calls of all
/// other ranks fail with an error that names it.
///
/// How a backend progresses a started collective is its own affair: the host-memory
/// backends of this crate run it to completion inside `start_*` (see `docs/COLLECTIVES.md`
/// for why that is the only sound choice for borrowed host buffers), device backends
/// enqueue it on a stream and return at once. Collectives that must overlap with
/// computation on host memory take ownership of their buffer instead
/// ([`submit_all_reduce`](Communicator::submit_all_reduce)) and progress in the
/// background.
///
/// A communicator cannot be shared between threads:
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<Box<dyn mirra_collectives::Communicator>>();
/// ```
pub trait Communicator: Send {
    /// This rank's id, `0..world_size()`.
    fn rank(&self) -> usize;
    /// The number of ranks in the group.
    fn world_size(&self) -> usize;
    /// The backend's name, as given to [`cpu_group`](crate::cpu_group).
    fn backend(&self) -> &'static str;
    /// The deadline of every collective of this communicator.
    fn timeout(&self) -> Duration;
    /// A handle that aborts the whole group from any thread.
    fn abort_handle(&self) -> AbortHandle;

    /// Start an in-place all-reduce: every rank's `buf` becomes the reduction of all ranks'
    /// `buf`s, bitwise identical on every rank.
    fn start_all_reduce<'b>(&'b self, buf: &'b mut Buffer, op: ReduceOp) -> Result<Work<'b>>;

    /// Start a reduce-scatter (NCCL semantics): `send` holds `world_size x count` elements,
    /// `recv` `count`; rank `r` receives the reduction of every rank's elements
    /// `[r * count, (r + 1) * count)`.
    fn start_reduce_scatter<'b>(
        &'b self,
        send: &'b Buffer,
        recv: &'b mut Buffer,
        op: ReduceOp,
    ) -> Result<Work<'b>>;

    /// Start an all-gather: `recv` holds `world_size x send` elements and receives every
    /// rank's `send` in rank order.
    fn start_all_gather<'b>(&'b self, send: &'b Buffer, recv: &'b mut Buffer) -> Result<Work<'b>>;

    /// Start a broadcast: every rank's `buf` receives the contents of `root`'s.
    fn start_broadcast<'b>(&'b self, buf: &'b mut Buffer, root: usize) -> Result<Work<'b>>;

    /// Start a reduce: `root`'s `buf` receives the reduction of all ranks' `buf`s; the
    /// other ranks' buffers are left as they were.
    fn start_reduce<'b>(
        &'b self,
        buf: &'b mut Buffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'b>>;

    /// Start a barrier: it completes on a rank once every rank has started it.
    fn start_barrier(&self) -> Result<Work<'_>>;

    /// Submit an in-place all-reduce of a buffer that the collective owns until it is
    /// complete, and return at once: the reduction progresses in the background (the CPU
    /// backends on a per-rank progress thread, device backends on a stream) while the
    /// caller computes, and [`Pending::wait`] hands the buffer back with the result. This
    /// is the form that overlaps communication with computation (DDP's gradient buckets).
    ///
    /// Submitted collectives take their place in the rank's sequence when submitted: a
    /// later `start_*` on this rank first waits for them. Errors (mismatches with other
    /// ranks, timeouts, a rank gone) come from `wait`.
    fn submit_all_reduce(&self, buf: Buffer, op: ReduceOp) -> Result<Pending>;

    /// Blocking [`start_all_reduce`](Communicator::start_all_reduce).
    fn all_reduce(&self, buf: &mut Buffer, op: ReduceOp) -> Result<()> {
        self.start_all_reduce(buf, op)?.wait()
    }
    /// Blocking [`start_reduce_scatter`](Communicator::start_reduce_scatter).
    fn reduce_scatter(&self, send: &Buffer, recv: &mut Buffer, op: ReduceOp) -> Result<()> {
        self.start_reduce_scatter(send, recv, op)?.wait()
    }
    /// Blocking [`start_all_gather`](Communicator::start_all_gather).
    fn all_gather(&self, send: &Buffer, recv: &mut Buffer) -> Result<()> {
        self.start_all_gather(send, recv)?.wait()
    }
    /// Blocking [`start_broadcast`](Communicator::start_broadcast).
    fn broadcast(&self, buf: &mut Buffer, root: usize) -> Result<()> {
        self.start_broadcast(buf, root)?.wait()
    }
    /// Blocking [`start_reduce`](Communicator::start_reduce).
    fn reduce(&self, buf: &mut Buffer, op: ReduceOp, root: usize) -> Result<()> {
        self.start_reduce(buf, op, root)?.wait()
    }
    /// Blocking [`start_barrier`](Communicator::start_barrier).
    fn barrier(&self) -> Result<()> {
        self.start_barrier()?.wait()
    }
}

impl fmt::Debug for dyn Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Communicator({} rank {} of {})",
            self.backend(),
            self.rank(),
            self.world_size()
        )
    }
}

/// What a collective that runs on after `start_*` returns completes on: a device
/// backend's CUDA event recorded after its kernels (implemented here for
/// [`mirra_cuda::events::Event`]), or any other signal a backend can poll.
pub trait Completion: Send {
    /// `Ok(true)` once collective `op` of rank `rank` has run, `Ok(false)` while it runs,
    /// the error when it failed (a faulted kernel: [`CollectiveError::Device`]; a peer
    /// that left, a mismatch of arguments found after `start_*` returned).
    fn poll(&self, op: Collective, rank: usize) -> Result<bool>;

    /// Called when a wait on it passed its deadline `after`: a backend aborts its group
    /// here, waits until no device still touches the collective's buffers, and returns
    /// the error to report (by default a [`CollectiveError::Timeout`] that cannot say
    /// which ranks are late).
    fn expire(&self, op: Collective, rank: usize, after: Duration) -> CollectiveError {
        CollectiveError::Timeout {
            op,
            rank,
            waiting_for: Vec::new(),
            after,
        }
    }
}

impl Completion for mirra_cuda::events::Event {
    fn poll(&self, op: Collective, rank: usize) -> Result<bool> {
        self.is_complete().map_err(|e| CollectiveError::Device {
            op,
            rank,
            reason: e.to_string(),
        })
    }

    fn expire(&self, op: Collective, rank: usize, after: Duration) -> CollectiveError {
        // The buffers are borrowed until the event's work has run: wait for it (a kernel
        // without peers to wait for always finishes) before the borrow may end.
        let _ = self.synchronize();
        CollectiveError::Timeout {
            op,
            rank,
            waiting_for: Vec::new(),
            after,
        }
    }
}

/// A started collective. It borrows the collective's buffers (`'b`) until it is complete:
/// neither the caller nor any other rank can touch them before then.
///
/// [`wait`](Work::wait) blocks until the collective is complete, within the communicator's
/// deadline; [`wait_timeout`](Work::wait_timeout) with another one. Dropping a `Work`
/// that was not waited for waits for it (and drops its error). The host-memory backends
/// of this crate complete every collective inside `start_*`, so their `Work`s are
/// complete when handed out; a device backend's carry a [`Completion`] (a CUDA event)
/// and complete when it does ([`Work::pending`]).
#[must_use = "a started collective must be waited for to see its error"]
pub struct Work<'b> {
    op: Collective,
    pending: Option<Waiting<'b>>,
    _buffers: PhantomData<&'b mut Buffer>,
}

/// What a pending [`Work`] waits on.
struct Waiting<'b> {
    completion: Box<dyn Completion + 'b>,
    rank: usize,
    deadline: Duration,
}

impl Waiting<'_> {
    /// Polls until complete, backing off from 1 us to 100 us between polls (a collective
    /// on a device takes microseconds to milliseconds; a sleeping poll costs no core).
    fn wait(&self, op: Collective, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(1);
        loop {
            if self.completion.poll(op, self.rank)? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(self.completion.expire(op, self.rank, timeout));
            }
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_micros(100));
        }
    }
}

impl<'b> Work<'b> {
    /// A work item that completed successfully when it was started.
    pub(crate) fn completed(op: Collective) -> Work<'b> {
        Work {
            op,
            pending: None,
            _buffers: PhantomData,
        }
    }

    /// A work item of rank `rank` that is complete when `completion` says so; [`wait`]
    /// gives it `deadline` (the communicator's timeout). For backends whose collectives run
    /// on after `start_*` returns: a device backend records an event after its kernels.
    ///
    /// [`wait`]: Work::wait
    pub fn pending(
        op: Collective,
        rank: usize,
        deadline: Duration,
        completion: Box<dyn Completion + 'b>,
    ) -> Work<'b> {
        Work {
            op,
            pending: Some(Waiting {
                completion,
                rank,
                deadline,
            }),
            _buffers: PhantomData,
        }
    }

    /// The collective this work item runs.
    pub fn op(&self) -> Collective {
        self.op
    }

    /// True once the collective is complete, or has failed (waiting returns at once).
    pub fn is_complete(&self) -> bool {
        self.pending
            .as_ref()
            .is_none_or(|w| !matches!(w.completion.poll(self.op, w.rank), Ok(false)))
    }

    /// Block until the collective is complete, within the communicator's deadline.
    pub fn wait(self) -> Result<()> {
        let deadline = self.pending.as_ref().map_or(Duration::ZERO, |w| w.deadline);
        self.wait_timeout(deadline)
    }

    /// Block until the collective is complete, at most `timeout`; past it the group is
    /// aborted and the error is [`CollectiveError::Timeout`] (whose `waiting_for` is empty
    /// when the backend cannot tell which ranks are late: a device collective).
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<()> {
        match self.pending.take() {
            Some(w) => w.wait(self.op, timeout),
            None => Ok(()),
        }
    }
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        // The buffers are borrowed until the collective is complete: wait before they are
        // released, whatever the outcome.
        if let Some(w) = self.pending.take() {
            let _ = w.wait(self.op, w.deadline);
        }
    }
}

impl fmt::Debug for Work<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("op", &self.op)
            .field("complete", &self.is_complete())
            .finish()
    }
}

/// What an [`AbortHandle`] aborts: a whole group.
pub(crate) trait Abortable: Send + Sync {
    fn abort(&self);
    fn is_aborted(&self) -> bool;
}

/// The simplest [`Abortable`]: a flag that the group's calls check, for backends with no
/// waits of their own to wake (the no-op group; an MPI rank, whose peers are other
/// processes).
#[derive(Default)]
pub(crate) struct AbortFlag(AtomicBool);

impl Abortable for AbortFlag {
    fn abort(&self) {
        self.0.store(true, Ordering::Release);
    }
    fn is_aborted(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Aborts a communicator group from any thread: every pending and later collective on
/// every rank of the group fails promptly with
/// [`CollectiveError::Aborted`](crate::CollectiveError::Aborted) (or with the failure that
/// aborted the group first). Cheap to clone; the group cannot be revived.
#[derive(Clone)]
pub struct AbortHandle {
    target: Arc<dyn Abortable>,
}

impl AbortHandle {
    pub(crate) fn new(target: Arc<dyn Abortable>) -> AbortHandle {
        AbortHandle { target }
    }

    /// Abort the group. Idempotent.
    pub fn abort(&self) {
        self.target.abort();
    }

    /// True once the group has been aborted, by this handle or by a failure.
    pub fn is_aborted(&self) -> bool {
        self.target.is_aborted()
    }
}

impl fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AbortHandle")
            .field("aborted", &self.is_aborted())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Complete once `done` is set; `Err` once `failed` is; counts aborts.
    #[derive(Clone, Default)]
    struct Flag {
        done: Arc<AtomicBool>,
        failed: Arc<AtomicBool>,
        aborts: Arc<AtomicUsize>,
    }

    impl Completion for Flag {
        fn poll(&self, op: Collective, rank: usize) -> Result<bool> {
            if self.failed.load(Ordering::SeqCst) {
                return Err(CollectiveError::Device {
                    op,
                    rank,
                    reason: "kernel faulted".into(),
                });
            }
            Ok(self.done.load(Ordering::SeqCst))
        }
        fn expire(&self, op: Collective, rank: usize, after: Duration) -> CollectiveError {
            self.aborts.fetch_add(1, Ordering::SeqCst);
            CollectiveError::Timeout {
                op,
                rank,
                waiting_for: Vec::new(),
                after,
            }
        }
    }

    fn pending(flag: &Flag, deadline: Duration) -> Work<'static> {
        Work::pending(Collective::AllReduce, 1, deadline, Box::new(flag.clone()))
    }

    /// Sets `done` after `after` on another thread.
    fn complete_later(flag: &Flag, after: Duration) -> std::thread::JoinHandle<()> {
        let done = flag.done.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            done.store(true, Ordering::SeqCst);
        })
    }

    #[test]
    fn a_pending_work_completes_when_its_completion_does() {
        let flag = Flag::default();
        let work = pending(&flag, Duration::from_secs(10));
        assert!(!work.is_complete());
        let t = complete_later(&flag, Duration::from_millis(30));
        let start = Instant::now();
        work.wait().unwrap();
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(pending(&flag, Duration::ZERO).is_complete());
        t.join().unwrap();
        assert!(Work::completed(Collective::Barrier).is_complete());
    }

    #[test]
    fn a_wait_past_its_deadline_aborts_and_names_the_collective_and_rank() {
        let flag = Flag::default();
        let e = pending(&flag, Duration::from_secs(10))
            .wait_timeout(Duration::from_millis(20))
            .unwrap_err();
        assert_eq!(flag.aborts.load(Ordering::SeqCst), 1);
        assert!(e.is_fatal());
        assert!(
            matches!(&e, CollectiveError::Timeout { op: Collective::AllReduce, rank: 1, after, .. }
                if *after == Duration::from_millis(20)),
            "{e}"
        );
        // The communicator's deadline when waited for plainly.
        let e = pending(&flag, Duration::from_millis(10))
            .wait()
            .unwrap_err();
        assert!(matches!(e, CollectiveError::Timeout { .. }), "{e}");
    }

    #[test]
    fn a_failed_completion_is_a_device_error_and_counts_as_complete() {
        let flag = Flag::default();
        flag.failed.store(true, Ordering::SeqCst);
        let work = pending(&flag, Duration::from_secs(10));
        assert!(work.is_complete());
        let e = work.wait().unwrap_err();
        assert!(e.is_fatal());
        assert_eq!(
            e.to_string(),
            "all_reduce: rank 1's device failed: kernel faulted"
        );
    }

    #[test]
    fn dropping_a_pending_work_waits_for_it() {
        let flag = Flag::default();
        let t = complete_later(&flag, Duration::from_millis(30));
        drop(pending(&flag, Duration::from_secs(10)));
        assert!(
            flag.done.load(Ordering::SeqCst),
            "dropped before completion"
        );
        t.join().unwrap();
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn a_work_carrying_a_cuda_event_completes_after_the_queued_kernels() {
        let rt = mirra_cuda::runtime::runtime(0).unwrap();
        let mut buf = rt.alloc(1 << 30).unwrap();
        for _ in 0..16 {
            buf.fill_zero().unwrap(); // about 4 ms of work on an H200
        }
        let event = rt.record_event(false).unwrap();
        let work = Work::pending(
            Collective::AllReduce,
            0,
            Duration::from_secs(10),
            Box::new(event),
        );
        let queued = work.is_complete();
        work.wait().unwrap();
        assert!(!queued, "complete before 16 GiB of fills could have run");
    }
}
