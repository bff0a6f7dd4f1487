//! A rank's progress thread: runs submitted collectives one after another, in submission
//! order, while the rank's own thread goes on computing.
//!
//! Started on the first submission (a rank that never submits has no extra thread). Jobs
//! are closures that run a whole collective, deadline included, so the thread never waits
//! forever; a job that panics completes its [`Pending`] with an error instead of leaving
//! the waiter blocked. Dropping the progress thread runs the jobs still queued (the other
//! ranks expect them) and joins it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use mirra_device::Buffer;

use crate::collective::Collective;
use crate::error::{CollectiveError, Result};
use crate::pending::{Completion, Pending};
use mirra_device::sync::{lock, panic_message};
use mirra_device::trace;

/// A submitted collective, run whole (deadline included) on the progress thread.
pub(crate) type Job = Box<dyn FnOnce() -> Result<Buffer> + Send>;

/// The queue shared by the rank's thread and its progress thread.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<(Collective, Job, Arc<Slot>)>,
    /// Submitted and not yet finished (queued or running).
    in_flight: usize,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signals new jobs (to the progress thread) and finished ones (to `drain`).
    changed: Condvar,
}

/// Where a job leaves its result for [`Pending::wait`].
#[derive(Default)]
struct Slot {
    result: Mutex<Option<Result<Buffer>>>,
    done: Condvar,
}

impl Slot {
    fn fill(&self, result: Result<Buffer>) {
        *lock(&self.result) = Some(result);
        self.done.notify_all();
    }
}

impl Completion for Arc<Slot> {
    fn is_complete(&self) -> bool {
        lock(&self.result).is_some()
    }

    fn wait(self: Box<Self>) -> Result<Buffer> {
        let mut result = lock(&self.result);
        loop {
            if let Some(r) = result.take() {
                return r;
            }
            result = self.done.wait(result).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// One rank's progress thread (see the module documentation).
pub(crate) struct Progress {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Start the progress thread of `rank`.
    pub(crate) fn spawn(rank: usize, op: Collective) -> Result<Progress> {
        let shared = Arc::new(Shared::default());
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("mirra-progress-{rank}"))
            .spawn(move || run(&worker, rank))
            .map_err(|e| CollectiveError::ProgressThread {
                op,
                rank,
                reason: e.to_string(),
            })?;
        Ok(Progress {
            shared,
            thread: Some(thread),
        })
    }

    /// Queue a job; its result comes back through the returned [`Pending`].
    pub(crate) fn submit(&self, op: Collective, job: Job) -> Pending {
        let slot = Arc::new(Slot::default());
        let mut q = lock(&self.shared.queue);
        q.jobs.push_back((op, job, Arc::clone(&slot)));
        q.in_flight += 1;
        drop(q);
        self.shared.changed.notify_all();
        Pending::new(op, Box::new(slot))
    }

    /// Block until every submitted job has finished (before the rank runs a collective
    /// itself, so that collectives keep their order).
    pub(crate) fn drain(&self) {
        let mut q = lock(&self.shared.queue);
        while q.in_flight > 0 {
            q = self
                .shared
                .changed
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            // Jobs catch their own panics, so the thread itself does not panic.
            let _ = t.join();
        }
    }
}

/// A rank's progress thread as a backend holds it: started by the rank's first
/// submission, drained before each collective the rank runs itself, stopped (after its
/// queued jobs) when the rank leaves.
#[derive(Default)]
pub(crate) struct OnDemand(RefCell<Option<Progress>>);

impl OnDemand {
    /// Queue `job` for rank `rank`, starting the thread if this is its first submission.
    pub(crate) fn submit(&self, rank: usize, op: Collective, job: Job) -> Result<Pending> {
        let mut progress = self.0.borrow_mut();
        if progress.is_none() {
            *progress = Some(Progress::spawn(rank, op)?);
        }
        Ok(progress.as_ref().expect("started above").submit(op, job))
    }

    /// [`Progress::drain`], when the thread was started.
    pub(crate) fn drain(&self) {
        if let Some(p) = &*self.0.borrow() {
            p.drain();
        }
    }

    /// Run the queued jobs and join the thread.
    pub(crate) fn stop(&mut self) {
        drop(self.0.get_mut().take());
    }
}

fn run(shared: &Shared, rank: usize) {
    loop {
        let (op, job, slot) = {
            let mut q = lock(&shared.queue);
            loop {
                if let Some(next) = q.jobs.pop_front() {
                    break next;
                }
                if q.closed {
                    return;
                }
                q = shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let span = trace::span_with("comm", || format!("{op} (progress thread)").into());
        let result = catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|panic| {
            let reason = panic_message(panic.as_ref());
            Err(CollectiveError::ProgressThread { op, rank, reason })
        });
        drop(span);
        slot.fill(result);
        lock(&shared.queue).in_flight -= 1;
        shared.changed.notify_all();
    }
}
