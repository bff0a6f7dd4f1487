//! The replicas' threads: one long-lived thread per replica, each owning its
//! communicator, that runs the step the strategy broadcasts to all of them.
//!
//! [`ReplicaPool::run`] lends a closure that borrows the caller's data to every thread and
//! returns only when every thread has finished with it (a panicking step is caught on its
//! thread and reported after the others finish), which is what makes lending a borrowed
//! closure to other threads sound.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mirra_collectives::Communicator;
use mirra_device::sync::{lock, panic_message};
use mirra_device::Device;

use crate::{Result, StrategyError};

/// What a replica's step sees: which replica it is, and its communicator.
pub struct ReplicaContext<'a> {
    /// This replica's index among this process's replicas (`0..` the strategy's
    /// [`local_replicas`](crate::MirroredStrategy::local_replicas)).
    pub replica_id: usize,
    /// This replica's id among all replicas in sync, `0..num_replicas` (its rank in the
    /// strategy's group; `replica_id` unless the group spans workers).
    pub global_replica_id: usize,
    /// The number of replicas in sync, in every worker.
    pub num_replicas: usize,
    /// The device this replica computes on (its buffers' device).
    pub device: Device,
    /// This replica's endpoint of the strategy's collective group.
    pub comm: &'a dyn Communicator,
}

impl std::fmt::Debug for ReplicaContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaContext")
            .field("replica_id", &self.replica_id)
            .field("global_replica_id", &self.global_replica_id)
            .field("num_replicas", &self.num_replicas)
            .field("device", &self.device)
            .field("backend", &self.comm.backend())
            .finish()
    }
}

type Step<'a> = dyn Fn(&ReplicaContext<'_>) + Sync + 'a;

/// A step lent to a replica thread, with its lifetime erased (see [`ReplicaPool::run`]).
struct Job {
    step: *const Step<'static>,
    done: Arc<Latch>,
}

// SAFETY: the step is `Sync`, so calling it from another thread is allowed; `run` keeps
// it alive until every thread has counted the latch down.
unsafe impl Send for Job {}

/// Counts finished replicas and records their panics.
struct Latch {
    state: Mutex<(usize, Vec<(usize, String)>)>,
    all_done: Condvar,
}

impl Latch {
    fn count_down(&self, replica: usize, panic: Option<String>) {
        let mut s = lock(&self.state);
        s.0 -= 1;
        if let Some(message) = panic {
            s.1.push((replica, message));
        }
        if s.0 == 0 {
            self.all_done.notify_all();
        }
    }
}

/// Pool ids, so that a replica thread knows whose it is.
static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// On a replica thread: (its pool's id, its replica); (0, 0) elsewhere.
    static REPLICA_OF: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
}

/// One thread per replica.
pub(crate) struct ReplicaPool {
    id: u64,
    senders: Vec<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    /// Held for the whole of a [`ReplicaPool::run`]: the jobs of two runs from two threads
    /// would otherwise interleave in the replicas' queues, and replicas would pair the
    /// collectives of different steps.
    serial: Mutex<()>,
}

impl ReplicaPool {
    /// Start one thread per communicator; replica `r` owns `comms[r]`, computes on
    /// `devices[r]` and with `kernel_threads` threads.
    pub(crate) fn spawn(
        comms: Vec<Box<dyn Communicator>>,
        devices: Vec<Device>,
        kernel_threads: usize,
    ) -> Result<Self> {
        let n = comms.len();
        let id = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        let mut pool = ReplicaPool {
            id,
            senders: Vec::with_capacity(n),
            threads: Vec::with_capacity(n),
            serial: Mutex::new(()),
        };
        for (replica, (comm, device)) in comms.into_iter().zip(devices).enumerate() {
            let (tx, rx) = channel::<Job>();
            let thread = std::thread::Builder::new()
                .name(format!("mirra-replica-{replica}"))
                .spawn(move || {
                    REPLICA_OF.with(|r| r.set((id, replica)));
                    mirra_tensor::set_num_threads(kernel_threads);
                    let ctx = ReplicaContext {
                        replica_id: replica,
                        global_replica_id: comm.rank(),
                        num_replicas: comm.world_size(),
                        device,
                        comm: comm.as_ref(),
                    };
                    while let Some(job) = next_job(&rx) {
                        // SAFETY: `run` waits for this count-down before the step's
                        // borrow ends.
                        let step = unsafe { &*job.step };
                        let panic = catch_unwind(AssertUnwindSafe(|| step(&ctx)))
                            .err()
                            .map(|p| panic_message(p.as_ref()));
                        if panic.is_some() {
                            // The other replicas may be waiting for this one in a
                            // collective: fail them now rather than at the deadline.
                            ctx.comm.abort_handle().abort();
                        }
                        job.done.count_down(replica, panic);
                    }
                })
                .map_err(|e| StrategyError::Spawn {
                    replica,
                    reason: e.to_string(),
                })?;
            pool.senders.push(tx);
            pool.threads.push(thread);
        }
        Ok(pool)
    }

    /// The number of replicas.
    pub(crate) fn len(&self) -> usize {
        self.senders.len()
    }

    /// Run `step` once on every replica thread, in parallel, and wait for all of them.
    /// Runs from several threads take turns; a run from inside a step of this pool is an
    /// error (it would wait for the replica that is waiting for it).
    pub(crate) fn run(&self, step: &Step<'_>) -> Result<()> {
        let (pool, replica) = REPLICA_OF.with(Cell::get);
        if pool == self.id {
            return Err(StrategyError::NestedRun { replica });
        }
        let _turn = lock(&self.serial);
        let n = self.senders.len();
        let done = Arc::new(Latch {
            state: Mutex::new((n, vec![])),
            all_done: Condvar::new(),
        });
        // SAFETY: only the lifetime is erased; we return only after every thread that
        // received the step has counted down, i.e. finished calling it.
        let erased: *const Step<'static> =
            unsafe { std::mem::transmute::<*const Step<'_>, *const Step<'static>>(step) };
        for (replica, tx) in self.senders.iter().enumerate() {
            let job = Job {
                step: erased,
                done: Arc::clone(&done),
            };
            if tx.send(job).is_err() {
                done.count_down(replica, Some("its thread has exited".into()));
            }
        }
        let mut s = lock(&done.state);
        while s.0 > 0 {
            s = done.all_done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        match s.1.iter().min_by_key(|(r, _)| *r) {
            Some((replica, message)) => Err(StrategyError::ReplicaPanicked {
                replica: *replica,
                message: message.clone(),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for ReplicaPool {
    fn drop(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How long an idle replica thread keeps yielding for the next step before it sleeps
/// (default; `MIRRA_REPLICA_IDLE_US` overrides it).
/// Steps come back to back in training, and waking a sleeping thread costs 0.1-0.8 ms on
/// this machine kind: replicas woken at different moments start their steps apart, and the
/// first to reach the all-reduce waits for the last (exposed communication). Yielding
/// (not spinning) leaves the core to the thread preparing the next batch.
const IDLE_YIELD: Duration = Duration::from_micros(300);

fn idle_yield() -> Duration {
    static IDLE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *IDLE.get_or_init(|| {
        std::env::var("MIRRA_REPLICA_IDLE_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .map_or(IDLE_YIELD, Duration::from_micros)
    })
}

/// The next job: yield while one may come soon, then block.
fn next_job(rx: &Receiver<Job>) -> Option<Job> {
    let start = Instant::now();
    let idle = idle_yield();
    while start.elapsed() < idle {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    rx.recv().ok()
}
