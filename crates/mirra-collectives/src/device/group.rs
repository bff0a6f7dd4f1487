//! Communicators whose ranks are threads of one process and whose buffers live on devices:
//! the rendezvous, verdict, ordering and failure model that every device backend shares,
//! with an [`Engine`] that queues the collective's work once every rank has posted it.
//!
//! A `start_*` posts the rank's arguments (its buffers' device addresses, with an event
//! recorded on the rank's stream so that the collective runs after the work already
//! queued on them) and returns at once. The rank that posts last checks every rank's
//! arguments ([`verdict`]) and hands them to the engine, which queues the whole
//! collective on every rank's streams and returns one completion per rank (an event
//! recorded after the collective); collectives are handed to the engine one at a time, in
//! sequence order, whichever thread posts last. A [`Work`] polls its rank's completion
//! within the deadline.
//!
//! The failure model is the CPU backends' (`docs/COLLECTIVES.md`): argument mismatches
//! are an error on every rank and the group goes on; a rank that does not post in time, a
//! rank that leaves (its communicator dropped, by a panic too) and an abort fail every
//! pending and later collective of every rank with the group's first cause, naming the
//! rank. A collective already queued on the devices is never abandoned: its buffers stay
//! borrowed until the device has run it (the engine's completion waits for that on
//! expiry), so no device writes memory that the host has freed.
//!
//! A `Work` forgotten with `mem::forget` ends its buffers' borrow without waiting: the
//! device may then still read and write memory the caller has freed and reused (device
//! memory, never the host's; PyTorch's `async_op=True` has the same contract).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mirra_cuda::events::Event;
use mirra_device::sync::lock;
use mirra_device::Buffer;

use crate::collective::Collective;
use crate::comm::{AbortHandle, Abortable, Communicator, Completion, Work};
use crate::config::Config;
use crate::described::Described;
use crate::error::{CollectiveError, Result};
use crate::pending::{self, Pending};
use crate::reduce::ReduceOp;
use crate::transport::{Cause, Desc};
use crate::verdict::{verdict, Accepts};

/// What orders a posted collective after the work already queued on the rank's buffers:
/// an event recorded on the rank's stream (none for engines without streams).
pub(crate) type Ready = Option<Event>;

/// The readiness of a rank whose buffers live on `rt`'s device: an event recorded now on
/// its stream.
pub(crate) fn ready_on(rt: &mirra_cuda::runtime::Runtime) -> std::result::Result<Ready, String> {
    rt.record_event(false).map(Some).map_err(|e| e.to_string())
}

/// What a device group queues its collectives on (the CUDA ring, NCCL, the tests' host
/// executor).
pub(crate) trait Engine: Send + Sync + 'static {
    /// The backend's name.
    fn name(&self) -> &'static str;
    /// Where rank `rank`'s buffers must live.
    fn accepts(&self, rank: usize) -> Accepts;
    /// Called on the rank's thread when it starts a collective: what orders the collective
    /// after the work already queued there.
    fn ready(&self, rank: usize) -> std::result::Result<Ready, String>;
    /// Queue one collective (every rank's arguments, checked to agree; never a barrier or
    /// an empty one) and return each rank's completion. Called once per collective, in
    /// sequence order, by one thread at a time. `Err((rank, why))` when rank's device
    /// refused the work.
    fn launch(
        &self,
        descs: &[Desc],
        ready: Vec<Ready>,
        config: &Config,
    ) -> std::result::Result<Vec<Box<dyn Completion>>, (usize, String)>;
}

/// A posted collective: the arguments and the readiness event.
struct Posted {
    desc: Desc,
    ready: Ready,
}

// SAFETY: `Desc` holds the rank's buffers' addresses (device addresses, or host ones for
// the tests' engine) as raw pointers; they are only handed to the engine, which uses them
// while the posting rank's `Work` or `Pending` keeps the buffers borrowed (see the module
// documentation).
unsafe impl Send for Posted {}

/// What one rank's waiter finds once its collective is decided.
enum Outcome {
    /// Queued on the devices: complete when this is.
    Run(Box<dyn Completion>),
    /// Nothing to queue (a barrier, empty buffers): complete.
    Done,
    /// The verdict or the engine refused it.
    Failed(CollectiveError),
}

/// One collective of the sequence, from the first post until every rank took its outcome.
struct Slot {
    posted: Vec<Option<Posted>>,
    /// Each rank's outcome once decided, until the rank takes it.
    outcomes: Option<Vec<Option<Outcome>>>,
    taken: usize,
}

struct State {
    /// The first failure of the group; every later and undecided collective fails with it.
    cause: Option<Cause>,
    slots: BTreeMap<u64, Slot>,
    /// Collectives decided so far (sequence numbers `1..=decided`).
    decided: u64,
}

/// The state the ranks of one group share.
pub(crate) struct Shared {
    engine: Box<dyn Engine>,
    n: usize,
    config: Config,
    state: Mutex<State>,
}

impl Shared {
    pub(crate) fn new(engine: Box<dyn Engine>, n: usize, config: Config) -> Arc<Shared> {
        Arc::new(Shared {
            engine,
            n,
            config,
            state: Mutex::new(State {
                cause: None,
                slots: BTreeMap::new(),
                decided: 0,
            }),
        })
    }

    fn fail(&self, cause: Cause) {
        let mut s = lock(&self.state);
        s.cause.get_or_insert(cause);
    }

    /// Decide every fully posted collective that is next in sequence.
    fn decide_ready(&self, s: &mut State) {
        while s.cause.is_none() {
            let next = s.decided + 1;
            let Some(slot) = s.slots.get_mut(&next) else {
                return;
            };
            if slot.posted.iter().any(Option::is_none) {
                return;
            }
            let posted: Vec<Posted> = slot.posted.iter_mut().map(|p| p.take().unwrap()).collect();
            slot.outcomes = Some(self.decide(posted).into_iter().map(Some).collect());
            s.decided = next;
        }
    }

    /// The verdict, then the engine: every rank's outcome of one collective.
    fn decide(&self, posted: Vec<Posted>) -> Vec<Outcome> {
        let n = self.n;
        let desc = |p: usize| posted[p].desc;
        let accepts = |p: usize| self.engine.accepts(p);
        let name = self.engine.name();
        let verdicts: Vec<Result<()>> = (0..n)
            .map(|r| verdict(n, &desc, desc(r).kind, name, &accepts))
            .collect();
        if verdicts.iter().any(Result::is_err) {
            return verdicts
                .into_iter()
                .map(|v| Outcome::Failed(v.expect_err("every rank reaches the same verdict")))
                .collect();
        }
        let d = desc(0);
        if d.kind == Collective::Barrier || (d.len_in == 0 && d.len_out == 0) {
            return (0..n).map(|_| Outcome::Done).collect();
        }
        let (descs, ready): (Vec<Desc>, Vec<Ready>) =
            posted.into_iter().map(|p| (p.desc, p.ready)).unzip();
        match self.engine.launch(&descs, ready, &self.config) {
            Ok(done) => done.into_iter().map(Outcome::Run).collect(),
            Err((rank, reason)) => (0..n)
                .map(|r| {
                    Outcome::Failed(CollectiveError::Device {
                        op: descs[r].kind,
                        rank,
                        reason: reason.clone(),
                    })
                })
                .collect(),
        }
    }
}

impl Abortable for Shared {
    fn abort(&self) {
        self.fail(Cause::Aborted);
    }
    fn is_aborted(&self) -> bool {
        lock(&self.state).cause.is_some()
    }
}

/// One rank's view of one posted collective: a [`Completion`] for its `Work`.
struct Waiter {
    shared: Arc<Shared>,
    rank: usize,
    seq: u64,
    /// The outcome, once taken from the slot.
    outcome: RefCell<Option<Outcome>>,
}

impl Waiter {
    /// Take this rank's outcome from the slot if the collective is decided (true), under
    /// the group's lock.
    fn take_locked(&self, s: &mut State) -> bool {
        if self.outcome.borrow().is_some() {
            return true;
        }
        let Some(slot) = s.slots.get_mut(&self.seq) else {
            return false;
        };
        let Some(outcomes) = &mut slot.outcomes else {
            return false;
        };
        *self.outcome.borrow_mut() = outcomes[self.rank].take();
        slot.taken += 1;
        if slot.taken == self.shared.n {
            s.slots.remove(&self.seq);
        }
        true
    }
}

impl Completion for Waiter {
    fn poll(&self, op: Collective, rank: usize) -> Result<bool> {
        if self.outcome.borrow().is_none() {
            let mut s = lock(&self.shared.state);
            if !self.take_locked(&mut s) {
                return match &s.cause {
                    Some(cause) => Err(cause.to_error(op)),
                    None => Ok(false),
                };
            }
        }
        match &*self.outcome.borrow() {
            Some(Outcome::Run(c)) => c.poll(op, rank),
            Some(Outcome::Failed(e)) => Err(e.clone()),
            Some(Outcome::Done) | None => Ok(true),
        }
    }

    fn expire(&self, op: Collective, rank: usize, after: Duration) -> CollectiveError {
        let mut s = lock(&self.shared.state);
        if !self.take_locked(&mut s) {
            // Not queued (and now never will be): the ranks that have not posted are late.
            let waiting_for: Vec<usize> = s.slots.get(&self.seq).map_or_else(Vec::new, |slot| {
                (0..self.shared.n)
                    .filter(|&p| slot.posted[p].is_none())
                    .collect()
            });
            return s
                .cause
                .get_or_insert(Cause::Timeout {
                    rank,
                    waiting_for,
                    after,
                })
                .to_error(op);
        }
        // Queued on the devices and still running: abort the group, and wait for the
        // devices to finish with the buffers before the error returns.
        s.cause.get_or_insert(Cause::Timeout {
            rank,
            waiting_for: Vec::new(),
            after,
        });
        let first = s.cause.as_ref().map(|c| c.to_error(op));
        drop(s);
        match (&*self.outcome.borrow(), first) {
            (Some(Outcome::Run(c)), _) => c.expire(op, rank, after),
            (_, Some(e)) => e,
            (_, None) => CollectiveError::Aborted { op },
        }
    }
}

/// One rank of a device group.
pub(crate) struct DeviceCommunicator {
    shared: Arc<Shared>,
    rank: usize,
    /// Sequence number of the last collective this rank started.
    seq: std::cell::Cell<u64>,
}

/// Make the `n` communicators of a group over `engine`.
pub(crate) fn group(
    engine: Box<dyn Engine>,
    n: usize,
    config: Config,
) -> Vec<Box<dyn Communicator>> {
    let shared = Shared::new(engine, n, config);
    (0..n)
        .map(|rank| {
            Box::new(DeviceCommunicator {
                shared: shared.clone(),
                rank,
                seq: std::cell::Cell::new(0),
            }) as Box<dyn Communicator>
        })
        .collect()
}

impl DeviceCommunicator {
    /// Post `desc` as this rank's next collective, decide it if this rank is the last to
    /// post, and return the waiter of its outcome.
    fn post(&self, desc: Desc) -> Result<Waiter> {
        let sh = &self.shared;
        let kind = desc.kind;
        if let Some(cause) = &lock(&sh.state).cause {
            return Err(cause.to_error(kind));
        }
        let needs_device = kind != Collective::Barrier && (desc.len_in > 0 || desc.len_out > 0);
        let ready = if needs_device {
            sh.engine
                .ready(self.rank)
                .map_err(|reason| CollectiveError::Device {
                    op: kind,
                    rank: self.rank,
                    reason,
                })?
        } else {
            None
        };
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        let mut s = lock(&sh.state);
        if let Some(cause) = &s.cause {
            return Err(cause.to_error(kind));
        }
        let n = sh.n;
        let slot = s.slots.entry(seq).or_insert_with(|| Slot {
            posted: (0..n).map(|_| None).collect(),
            outcomes: None,
            taken: 0,
        });
        slot.posted[self.rank] = Some(Posted { desc, ready });
        if seq == s.decided + 1 {
            sh.decide_ready(&mut s);
        }
        Ok(Waiter {
            shared: sh.clone(),
            rank: self.rank,
            seq,
            outcome: RefCell::new(None),
        })
    }
}

/// A submitted all-reduce on a device: the buffer it owns and the work that borrows it
/// (none when there was nothing to move). Device backends hand it out as their
/// [`Pending`].
pub(crate) struct Submitted {
    // Dropped first: waits for the collective before the buffer goes.
    pub(crate) work: Option<Work<'static>>,
    pub(crate) buf: Option<Buffer>,
}

impl pending::Completion for Submitted {
    fn is_complete(&self) -> bool {
        self.work.as_ref().is_none_or(Work::is_complete)
    }

    fn wait(mut self: Box<Self>) -> Result<Buffer> {
        if let Some(w) = self.work.take() {
            w.wait()?;
        }
        Ok(self.buf.take().expect("waited once"))
    }
}

impl Described for DeviceCommunicator {
    fn start<'b>(&'b self, desc: Desc) -> Result<Work<'b>> {
        let kind = desc.kind;
        let waiter = self.post(desc)?;
        Ok(Work::pending(
            kind,
            self.rank,
            self.shared.config.timeout,
            Box::new(waiter),
        ))
    }

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.n
    }
    fn backend(&self) -> &'static str {
        self.shared.engine.name()
    }
    fn timeout(&self) -> Duration {
        self.shared.config.timeout
    }
    fn abort_handle(&self) -> AbortHandle {
        AbortHandle::new(self.shared.clone())
    }

    fn submit_all_reduce(&self, mut buf: Buffer, op: ReduceOp) -> Result<Pending> {
        let kind = Collective::AllReduce;
        // The buffer moves into `Submitted` below; its memory (and so every address
        // posted) stays where it is until `Submitted` drops it, after the work.
        let waiter = self.post(Desc::in_place(kind, &mut buf, op, 0))?;
        let work = Work::pending(
            kind,
            self.rank,
            self.shared.config.timeout,
            Box::new(waiter),
        );
        Ok(Pending::new(
            kind,
            Box::new(Submitted {
                work: Some(work),
                buf: Some(buf),
            }),
        ))
    }
}

impl Drop for DeviceCommunicator {
    /// A rank that leaves fails every undecided and later collective of the others with
    /// [`CollectiveError::RankGone`] naming it. Its collectives already queued on the
    /// devices run on (their `Work`s ended before this drop; a `Pending` waits for its own).
    fn drop(&mut self) {
        self.shared.fail(Cause::RankGone(self.rank));
    }
}
