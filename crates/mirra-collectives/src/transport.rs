//! The shared-memory transport: what every algorithm stands on.
//!
//! Ranks are threads of one process, so a rank can read (and where the schedule allows,
//! write) its peers' buffers directly. A group is one [`Group`] shared by all ranks:
//!
//! - a **slot** per rank and sequence parity where the rank posts its next collective
//!   (kind, operator, root, dtypes, lengths, buffer pointers) and then, last, its sequence
//!   number (the rendezvous). Description and number share one cache line, so a peer
//!   waiting for the number receives the description in the same transfer;
//! - per-rank **progress counters** (`progress`, one per lane) that an algorithm bumps as
//!   it finishes slices, and that peers wait on before they read what it wrote;
//! - per-rank `in_data` and `exited` words that tell when a rank is inside a data phase and
//!   when it is done with its peers' buffers;
//! - the sticky **abort** flag with its first cause, and the parking lot (one mutex and
//!   condition variable) for waiters that have spun and yielded long enough.
//!
//! Counters hold `seq << UNIT_BITS | units`, so they grow monotonically across
//! collectives and never need resetting: a peer still reading the previous collective's
//! value can never mistake it for the current one.
//!
//! The data-access primitives ([`Ctx::reduce`], [`Ctx::copy`]) are `unsafe`: they are sound
//! only when the schedule guarantees that nobody writes what they read, and nobody reads
//! or writes what they write, at the same time. Each algorithm argues that at each call.

use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use mirra_device::{Buffer, DType, Device};

use crate::collective::Collective;
use crate::comm::Abortable;
use crate::config::Config;
use crate::error::CollectiveError;
use crate::reduce::{combine_op, with_dtype, ReduceOp};
use mirra_device::sync::lock;

/// The largest group the shared-memory transport supports (bounds the stack arrays of
/// operands).
pub const MAX_WORLD_SIZE: usize = 64;
/// Progress units per collective live in the low bits of a counter, the sequence number
/// above them.
const UNIT_BITS: u32 = 24;
/// Most slices an algorithm may cut one chunk into (keeps the units of one collective
/// below `1 << UNIT_BITS` for every world size).
pub(crate) const MAX_SLICES: usize = 1 << 16;
/// Independent progress counters per rank (the double binary tree uses four: reduce and
/// broadcast progress of each tree).
pub(crate) const LANES: usize = 4;
/// Longest single park: a safety net only, wake-ups come from the notifier.
const MAX_PARK: Duration = Duration::from_millis(50);
/// Spins between two reads of the clock.
const SPIN_BATCH: u32 = 8;

/// Slicing of ranges of up to `max_len` elements of `elem_bytes` bytes into slices of about
/// `slice_bytes`: `(slices, elements per slice)`, at least one element per slice, at most
/// [`MAX_SLICES`] slices and at least one slice (possibly empty).
pub(crate) fn slicing(max_len: usize, slice_bytes: usize, elem_bytes: usize) -> (usize, usize) {
    let per = (slice_bytes / elem_bytes.max(1))
        .max(1)
        .max(max_len.div_ceil(MAX_SLICES));
    (max_len.div_ceil(per).max(1), per)
}

/// Why a wait or a data phase stopped early.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The group was aborted (the cause is in the group).
    Aborted,
    /// The deadline passed while these ranks had not done their part.
    Timeout(Vec<usize>),
}

/// The first failure of a group, which every later call reports.
#[derive(Clone, Debug)]
pub(crate) enum Cause {
    Aborted,
    RankGone(usize),
    Timeout {
        rank: usize,
        waiting_for: Vec<usize>,
        after: Duration,
    },
}

impl Cause {
    pub(crate) fn to_error(&self, op: Collective) -> CollectiveError {
        match self {
            Cause::Aborted => CollectiveError::Aborted { op },
            Cause::RankGone(rank) => CollectiveError::RankGone { op, rank: *rank },
            Cause::Timeout {
                rank,
                waiting_for,
                after,
            } => CollectiveError::Timeout {
                op,
                rank: *rank,
                waiting_for: waiting_for.clone(),
                after: *after,
            },
        }
    }
}

/// What a rank posts for one collective.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Desc {
    pub kind: Collective,
    pub op: ReduceOp,
    pub root: usize,
    pub dtype_in: DType,
    pub dtype_out: DType,
    pub dev_in: Place,
    pub dev_out: Place,
    /// Elements behind `src`.
    pub len_in: usize,
    /// Elements behind `dst`.
    pub len_out: usize,
    /// The input (the send buffer; the buffer itself for in-place collectives). Only ever
    /// read through.
    pub src: *const u8,
    /// The output (the receive buffer; the buffer itself for in-place collectives).
    pub dst: *mut u8,
}

/// Where `buf`'s elements are: the host address of a host buffer, the device address of
/// a device buffer (as a pointer: never dereferenced on the host; the CPU backends' verdict
/// refuses device buffers before any pointer is used).
fn address(buf: &Buffer) -> *const u8 {
    match buf.device_memory() {
        Some(d) => d.ptr() as usize as *const u8,
        None => buf.as_bytes().map_or(std::ptr::null(), <[u8]>::as_ptr),
    }
}

/// [`address`], for a buffer the collective writes.
fn address_mut(buf: &mut Buffer) -> *mut u8 {
    match buf.device_memory() {
        Some(d) => d.ptr() as usize as *mut u8,
        None => buf
            .as_bytes_mut()
            .map_or(std::ptr::null_mut(), <[u8]>::as_mut_ptr),
    }
}

impl Desc {
    /// An in-place collective of `kind` on `buf` (all-reduce, broadcast, reduce).
    pub(crate) fn in_place(kind: Collective, buf: &mut Buffer, op: ReduceOp, root: usize) -> Desc {
        let ptr = address_mut(buf);
        Desc {
            kind,
            op,
            root,
            dtype_in: buf.dtype(),
            dtype_out: buf.dtype(),
            dev_in: Place::of(buf.device()),
            dev_out: Place::of(buf.device()),
            len_in: buf.len(),
            len_out: buf.len(),
            src: ptr.cast_const(),
            dst: ptr,
        }
    }

    /// A collective of `kind` from `send` into `recv` (reduce-scatter, all-gather).
    pub(crate) fn send_recv(
        kind: Collective,
        send: &Buffer,
        recv: &mut Buffer,
        op: ReduceOp,
    ) -> Desc {
        Desc {
            kind,
            op,
            root: 0,
            dtype_in: send.dtype(),
            dtype_out: recv.dtype(),
            dev_in: Place::of(send.device()),
            dev_out: Place::of(recv.device()),
            len_in: send.len(),
            len_out: recv.len(),
            src: address(send),
            dst: address_mut(recv),
        }
    }

    /// A collective without buffers (barrier).
    pub(crate) fn empty(kind: Collective) -> Desc {
        Desc {
            kind,
            op: ReduceOp::Sum,
            root: 0,
            dtype_in: DType::U8,
            dtype_out: DType::U8,
            dev_in: Place::Cpu,
            dev_out: Place::Cpu,
            len_in: 0,
            len_out: 0,
            src: std::ptr::null(),
            dst: std::ptr::null_mut(),
        }
    }
}

const KINDS: [Collective; 6] = Collective::ALL;
const OPS: [ReduceOp; 5] = ReduceOp::ALL;
const DTYPES: [DType; 7] = [
    DType::U8,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

fn index_of<T: PartialEq>(all: &[T], x: &T) -> u64 {
    all.iter().position(|y| y == x).unwrap_or(0) as u64
}

/// Where a posted buffer lives, as the peers read it back from the slot: a number, since a
/// [`Device::Cuda`] can only be made by asking the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    Cpu,
    Cuda(usize),
}

impl Place {
    pub(crate) fn of(d: Device) -> Place {
        match d.cuda_ordinal() {
            None => Place::Cpu,
            Some(i) => Place::Cuda(i),
        }
    }

    fn code(self) -> usize {
        match self {
            Place::Cpu => 0,
            Place::Cuda(i) => i.saturating_add(1),
        }
    }

    fn from_code(code: usize) -> Place {
        match code {
            0 => Place::Cpu,
            i => Place::Cuda(i - 1),
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Cpu => write!(f, "cpu"),
            Place::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// One posted collective: its sequence number and its [`Desc`], as atomics, in one cache
/// line. The fields are written by its rank before it stores `seq` (release) and read by
/// peers after they saw `seq` (acquire), so relaxed accesses suffice for them; and since
/// they share `seq`'s line, the transfer that shows a peer the announcement brings it the
/// description too. Aligned to 128 bytes: the adjacent-line prefetcher pairs lines.
#[repr(C, align(128))]
#[derive(Default)]
struct Slot {
    /// Sequence number of the collective described here (0: none yet).
    seq: AtomicU64,
    /// kind | op << 8 | dtype_in << 16 | dtype_out << 24, and [`EAGER`] when the input was
    /// posted eagerly.
    tags: AtomicU64,
    /// dev_in's code | dev_out's code << 32.
    places: AtomicU64,
    root: AtomicUsize,
    len_in: AtomicUsize,
    len_out: AtomicUsize,
    src: AtomicPtr<u8>,
    dst: AtomicPtr<u8>,
}

impl Desc {
    /// Words in [`words`](Desc::words).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) const WORDS: usize = 6;

    /// kind | op << 8 | dtype_in << 16 | dtype_out << 24.
    fn tags(&self) -> u64 {
        index_of(&KINDS, &self.kind)
            | index_of(&OPS, &self.op) << 8
            | index_of(&DTYPES, &self.dtype_in) << 16
            | index_of(&DTYPES, &self.dtype_out) << 24
    }

    /// The description without its buffers, as words for another process (its peers'
    /// verdict reads nothing else).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn words(&self) -> [u64; Desc::WORDS] {
        [
            self.tags(),
            self.root as u64,
            self.dev_in.code() as u64,
            self.dev_out.code() as u64,
            self.len_in as u64,
            self.len_out as u64,
        ]
    }

    /// The description another process sent ([`words`](Desc::words)), without
    /// buffers.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn from_words(w: &[u64; Desc::WORDS]) -> Desc {
        Desc::from_parts(
            w[0],
            w[1] as usize,
            [w[2] as usize, w[3] as usize],
            [w[4] as usize, w[5] as usize],
            [std::ptr::null_mut(), std::ptr::null_mut()],
        )
    }

    /// A description from its encoded tags, root, places, lengths and pointers (src, dst).
    fn from_parts(
        tags: u64,
        root: usize,
        places: [usize; 2],
        lens: [usize; 2],
        ptrs: [*mut u8; 2],
    ) -> Desc {
        let field = |shift: u32| ((tags >> shift) & 0xff) as usize;
        Desc {
            kind: KINDS[field(0) % KINDS.len()],
            op: OPS[field(8) % OPS.len()],
            dtype_in: DTYPES[field(16) % DTYPES.len()],
            dtype_out: DTYPES[field(24) % DTYPES.len()],
            root,
            dev_in: Place::from_code(places[0]),
            dev_out: Place::from_code(places[1]),
            len_in: lens[0],
            len_out: lens[1],
            src: ptrs[0].cast_const(),
            dst: ptrs[1],
        }
    }
}

/// The tag bit of a slot whose input was posted eagerly: copied into the rank's eager
/// buffer, which peers read instead of the caller's.
const EAGER: u64 = 1 << 32;

// The sequence number and the whole description fit one cache line.
const _: () = assert!(std::mem::offset_of!(Slot, dst) + std::mem::size_of::<AtomicPtr<u8>>() <= 64);

impl Slot {
    /// Write `d`'s fields (the caller then publishes `seq`); `eager`: its input was copied
    /// into the rank's eager buffer.
    fn store(&self, d: &Desc, eager: bool) {
        // Place codes are CUDA ordinals plus one: the driver counts devices in an `int`.
        let places = d.dev_in.code() as u64 | (d.dev_out.code() as u64) << 32;
        let eager = if eager { EAGER } else { 0 };
        self.tags.store(d.tags() | eager, Ordering::Relaxed);
        self.places.store(places, Ordering::Relaxed);
        self.root.store(d.root, Ordering::Relaxed);
        self.len_in.store(d.len_in, Ordering::Relaxed);
        self.len_out.store(d.len_out, Ordering::Relaxed);
        self.src.store(d.src.cast_mut(), Ordering::Relaxed);
        self.dst.store(d.dst, Ordering::Relaxed);
    }

    fn load(&self) -> Desc {
        let places = self.places.load(Ordering::Relaxed);
        Desc::from_parts(
            self.tags.load(Ordering::Relaxed),
            self.root.load(Ordering::Relaxed),
            [(places & 0xffff_ffff) as usize, (places >> 32) as usize],
            [
                self.len_in.load(Ordering::Relaxed),
                self.len_out.load(Ordering::Relaxed),
            ],
            [
                self.src.load(Ordering::Relaxed),
                self.dst.load(Ordering::Relaxed),
            ],
        )
    }

    fn is_eager(&self) -> bool {
        self.tags.load(Ordering::Relaxed) & EAGER != 0
    }

    /// One posted buffer: its address and length in elements.
    fn buffer(&self, side: Side) -> (*mut u8, usize) {
        match side {
            Side::Send => (
                self.src.load(Ordering::Relaxed),
                self.len_in.load(Ordering::Relaxed),
            ),
            Side::Recv => (
                self.dst.load(Ordering::Relaxed),
                self.len_out.load(Ordering::Relaxed),
            ),
        }
    }
}

/// A rank's data-phase words, on a line of their own: the owner writes them at the start
/// and at the end of a data phase; peers read `exited` once, at the end.
#[repr(C, align(128))]
#[derive(Default)]
struct Phase {
    /// Sequence number of the collective whose data phase this rank is in; 0 outside.
    in_data: AtomicU64,
    /// Sequence number of the last collective whose data phase this rank has left.
    exited: AtomicU64,
}

/// A rank's progress counters, on a line of their own.
#[repr(C, align(128))]
#[derive(Default)]
struct Lanes([AtomicU64; LANES]);

/// Everything one rank publishes. Written only by its rank (and, for sequence numbers and
/// `progress`, only ever increased), read by all. Each part has its own cache lines, so
/// what a rank writes in one phase never evicts what its peers read in another (the
/// posted descriptions stay shared through the data phase), and ranks never share a line.
#[derive(Default)]
struct RankState {
    /// Posted collectives, by sequence parity: a rank can be at most one collective ahead
    /// of the slowest peer, so the slot a peer is reading is never the one being written.
    slots: [Slot; 2],
    phase: Phase,
    /// Progress of the current data phase, `seq << UNIT_BITS | units`, per lane.
    progress: Lanes,
    /// Eager copies of posted inputs ([`Group::post`]), by sequence parity like `slots`:
    /// `eager_bytes` each, written by this rank before it posts and read by peers
    /// in the data phase. Atomics only so that the group is `Sync`: accessed through raw
    /// pointers, never concurrently (see [`Group::post`]).
    eager: [Box<[AtomicU64]>; 2],
}

/// The state one group of ranks shares.
pub(crate) struct Group {
    n: usize,
    ranks: Box<[RankState]>,
    aborted: AtomicBool,
    cause: Mutex<Option<Cause>>,
    /// Waiters currently parked (or about to), so that notifiers skip the lock otherwise.
    parked: AtomicUsize,
    park_lock: Mutex<()>,
    park_cv: Condvar,
    pub(crate) config: Config,
    /// The largest input posted eagerly ([`Config::eager_bytes_for`] this group).
    pub(crate) eager_bytes: usize,
}

impl Group {
    pub(crate) fn new(n: usize, config: Config) -> Group {
        let eager_bytes = config.eager_bytes_for(n);
        Group {
            n,
            ranks: (0..n)
                .map(|_| {
                    let words = eager_bytes.div_ceil(8);
                    let buffer = || (0..words).map(|_| AtomicU64::new(0)).collect();
                    RankState {
                        eager: [buffer(), buffer()],
                        ..RankState::default()
                    }
                })
                .collect(),
            aborted: AtomicBool::new(false),
            cause: Mutex::new(None),
            parked: AtomicUsize::new(0),
            park_lock: Mutex::new(()),
            park_cv: Condvar::new(),
            config,
            eager_bytes,
        }
    }

    pub(crate) fn world_size(&self) -> usize {
        self.n
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// The first cause of the abort, as an error of collective `op`.
    pub(crate) fn cause_error(&self, op: Collective) -> CollectiveError {
        lock(&self.cause)
            .as_ref()
            .unwrap_or(&Cause::Aborted)
            .to_error(op)
    }

    /// Abort the group, recording `cause` unless an earlier one is recorded, and wake every
    /// parked waiter.
    pub(crate) fn abort_with(&self, cause: Cause) {
        {
            let mut c = lock(&self.cause);
            if c.is_none() {
                *c = Some(cause);
            }
        }
        self.aborted.store(true, Ordering::SeqCst);
        let _g = lock(&self.park_lock);
        self.park_cv.notify_all();
    }

    /// Wake parked waiters after a counter changed. The counter store is SeqCst, and so
    /// is the read of `parked` here and the fence a waiter runs after registering: either
    /// this read sees the waiter, or the waiter's re-check sees the store.
    fn notify(&self) {
        if self.parked.load(Ordering::SeqCst) != 0 {
            let _g = lock(&self.park_lock);
            self.park_cv.notify_all();
        }
    }

    fn publish(&self, word: &AtomicU64, value: u64) {
        word.store(value, Ordering::SeqCst);
        self.notify();
    }

    /// Wait until `done()` holds: spin for `config.spin`, then yield until
    /// `config.park_after`, then park, checking the deadline (if any) and, when
    /// `abortable`, the abort flag. `done` is always checked first, so a condition that
    /// holds wins over an abort that raced with it.
    fn wait_until(
        &self,
        deadline: Option<Instant>,
        abortable: bool,
        mut done: impl FnMut() -> bool,
    ) -> Result<(), WaitEnd> {
        if done() {
            return Ok(());
        }
        let start = Instant::now();
        let spin_until = start + self.config.spin;
        let park_at = start + self.config.park_after;
        let check = |now: Instant| -> Result<(), WaitEnd> {
            if abortable && self.aborted.load(Ordering::Acquire) {
                return Err(WaitEnd::Aborted);
            }
            if deadline.is_some_and(|d| now >= d) {
                return Err(WaitEnd::Deadline);
            }
            Ok(())
        };
        // Spin: a peer running on the other core answers within microseconds.
        loop {
            for _ in 0..SPIN_BATCH {
                std::hint::spin_loop();
                if done() {
                    return Ok(());
                }
            }
            let now = Instant::now();
            if let Err(end) = check(now) {
                return settle(&mut done, end);
            }
            if now >= spin_until {
                break;
            }
        }
        // Yield: let a peer (or compute) that shares our core run.
        loop {
            std::thread::yield_now();
            if done() {
                return Ok(());
            }
            let now = Instant::now();
            if let Err(end) = check(now) {
                return settle(&mut done, end);
            }
            if now >= park_at {
                break;
            }
        }
        // Park until a notifier wakes us (or MAX_PARK passes, as a safety net).
        loop {
            self.parked.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            {
                let guard = lock(&self.park_lock);
                let aborted = abortable && self.aborted.load(Ordering::SeqCst);
                if !done() && !aborted {
                    let now = Instant::now();
                    let nap = deadline
                        .map_or(MAX_PARK, |d| d.saturating_duration_since(now))
                        .min(MAX_PARK);
                    let _unused = self
                        .park_cv
                        .wait_timeout(guard, nap)
                        .unwrap_or_else(|e| e.into_inner());
                }
            }
            self.parked.fetch_sub(1, Ordering::SeqCst);
            if done() {
                return Ok(());
            }
            if let Err(end) = check(Instant::now()) {
                return settle(&mut done, end);
            }
        }
    }

    /// Wait until `ready(p)` holds for every rank `p` other than `me`.
    fn wait_peers(
        &self,
        me: usize,
        deadline: Option<Instant>,
        abortable: bool,
        ready: impl Fn(usize) -> bool,
    ) -> Result<(), Stop> {
        let all = || (0..self.n).all(|p| p == me || ready(p));
        self.wait_until(deadline, abortable, all)
            .map_err(|end| match end {
                WaitEnd::Aborted => Stop::Aborted,
                WaitEnd::Deadline => {
                    Stop::Timeout((0..self.n).filter(|&p| p != me && !ready(p)).collect())
                }
            })
    }

    /// Post collective `seq` of rank `me`; with `eager`, its input is first copied into
    /// the rank's eager buffer of that parity, where peers read it ([`Ctx::is_eager`]),
    /// when it is a host buffer that fits. Returns whether it was.
    ///
    /// Nobody reads that eager buffer meanwhile: peers read it only inside the data phase
    /// of the collective two before, `seq - 2`, and each of them posted `seq - 1` after it
    /// left that data phase, which this rank waited for before it returned from `seq - 1`.
    pub(crate) fn post(&self, me: usize, seq: u64, desc: &Desc, eager: bool) -> bool {
        let r = &self.ranks[me];
        let parity = (seq & 1) as usize;
        let bytes = desc.len_in.saturating_mul(desc.dtype_in.size_in_bytes());
        let buffer = &r.eager[parity];
        let eager = eager
            && desc.dev_in == Place::Cpu
            && !desc.src.is_null()
            && bytes <= buffer.len() * std::mem::size_of::<AtomicU64>();
        if eager {
            // SAFETY: `src` is the caller's live host buffer of `len_in` elements of
            // `dtype_in` (the collective borrows it until it returns); the eager buffer
            // holds `bytes`, is this rank's, and nobody reads it now (above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    desc.src,
                    buffer.as_ptr().cast::<u8>().cast_mut(),
                    bytes,
                )
            };
        }
        let slot = &r.slots[parity];
        slot.store(desc, eager);
        self.publish(&slot.seq, seq);
        eager
    }

    /// Whether every rank posted collective `seq` eagerly (valid once the rendezvous is
    /// done).
    pub(crate) fn all_eager(&self, seq: u64) -> bool {
        let parity = (seq & 1) as usize;
        self.ranks.iter().all(|r| r.slots[parity].is_eager())
    }

    /// The rendezvous: wait until every rank has posted collective `seq`.
    pub(crate) fn wait_posted(&self, me: usize, seq: u64, deadline: Instant) -> Result<(), Stop> {
        self.wait_peers(me, Some(deadline), true, |p| {
            self.ranks[p].slots[(seq & 1) as usize]
                .seq
                .load(Ordering::Acquire)
                >= seq
        })
    }

    /// What rank `p` posted for collective `seq` (valid once the rendezvous is done).
    pub(crate) fn posted_desc(&self, p: usize, seq: u64) -> Desc {
        self.ranks[p].slots[(seq & 1) as usize].load()
    }

    /// The buffer on `side` that rank `p` posted for collective `seq`: address and
    /// elements (valid once the rendezvous is done).
    /// An eagerly posted input is read from the rank's eager buffer.
    fn posted_buffer(&self, p: usize, seq: u64, side: Side) -> (*mut u8, usize) {
        let parity = (seq & 1) as usize;
        let (slot, eager) = (&self.ranks[p].slots[parity], &self.ranks[p].eager[parity]);
        match side {
            Side::Send if slot.is_eager() => (
                eager.as_ptr().cast::<u8>().cast_mut(),
                slot.len_in.load(Ordering::Relaxed),
            ),
            _ => slot.buffer(side),
        }
    }

    /// Enter the data phase of `seq`. Dekker with [`Group::abort_with`] and
    /// [`Group::wait_peers_out`]: the SeqCst store of `in_data` and load of the flag mean
    /// that either this rank sees the abort and stays out, or the aborting rank sees this
    /// rank inside and waits for it to leave before it frees its buffers.
    pub(crate) fn enter_data(&self, me: usize, seq: u64) -> bool {
        self.ranks[me].phase.in_data.store(seq, Ordering::SeqCst);
        if self.aborted.load(Ordering::SeqCst) {
            self.leave_data(me, None);
            return false;
        }
        true
    }

    /// Leave the data phase: no access to peers' buffers follows. With `Some(seq)` the
    /// data phase completed and `exited` records it.
    pub(crate) fn leave_data(&self, me: usize, completed: Option<u64>) {
        let r = &self.ranks[me].phase;
        r.in_data.store(0, Ordering::SeqCst);
        if let Some(seq) = completed {
            r.exited.store(seq, Ordering::SeqCst);
        }
        self.notify();
    }

    /// Wait until every peer has completed the data phase of `seq` (after which none of
    /// them touches this rank's buffers again).
    pub(crate) fn wait_exited(&self, me: usize, seq: u64, deadline: Instant) -> Result<(), Stop> {
        self.wait_peers(me, Some(deadline), true, |p| {
            self.ranks[p].phase.exited.load(Ordering::Acquire) >= seq
        })
    }

    /// After an abort: wait, without deadline, until no peer is in a data phase. Peers
    /// check the abort flag between slices and in every wait, so this is prompt; it must
    /// not give up, because returning lets the caller free buffers a peer may still read.
    pub(crate) fn wait_peers_out(&self, me: usize) {
        let _ = self.wait_peers(me, None, false, |p| {
            self.ranks[p].phase.in_data.load(Ordering::SeqCst) == 0
        });
    }
}

/// How [`Group::wait_until`] ended early.
enum WaitEnd {
    Aborted,
    Deadline,
}

/// A wait that found the group aborted or its deadline passed: still a success if what it
/// waited for has happened meanwhile. A peer that finished this collective and then left
/// (dropped its communicator: the group is aborted with `RankGone`) has not failed it:
/// its exit was recorded before it left.
fn settle(done: &mut impl FnMut() -> bool, end: WaitEnd) -> Result<(), WaitEnd> {
    if done() {
        Ok(())
    } else {
        Err(end)
    }
}

impl Abortable for Group {
    fn abort(&self) {
        self.abort_with(Cause::Aborted);
    }
    fn is_aborted(&self) -> bool {
        Group::is_aborted(self)
    }
}

/// Which of a rank's posted buffers a [`Loc`] points into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The input (send buffer; the buffer itself for in-place collectives). Read only.
    Send,
    /// The output (receive buffer; the buffer itself for in-place collectives).
    Recv,
}

/// An element offset into one rank's posted buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loc {
    pub rank: usize,
    pub side: Side,
    pub offset: usize,
}

impl Loc {
    pub(crate) fn send(rank: usize, offset: usize) -> Loc {
        Loc {
            rank,
            side: Side::Send,
            offset,
        }
    }
    pub(crate) fn recv(rank: usize, offset: usize) -> Loc {
        Loc {
            rank,
            side: Side::Recv,
            offset,
        }
    }
}

/// One rank's view of one collective's data phase: the topology facts, the progress
/// counters and the data primitives an algorithm's schedule is written in.
pub(crate) struct Ctx<'g> {
    g: &'g Group,
    me: usize,
    seq: u64,
    deadline: Instant,
    desc: Desc,
    eager: bool,
}

impl<'g> Ctx<'g> {
    /// The data phase of collective `seq` (once the rendezvous and the verdict are done).
    pub(crate) fn new(g: &'g Group, me: usize, seq: u64, deadline: Instant, desc: Desc) -> Self {
        Ctx {
            g,
            me,
            seq,
            deadline,
            desc,
            eager: g.all_eager(seq),
        }
    }

    /// Whether every rank posted its input eagerly ([`Group::post`]): then `Send`
    /// locations are copies in the group's memory, and a schedule that writes only its own
    /// rank's output touches no caller's buffer but its own. The transport then skips the
    /// data phase's entry and exit handshakes: such a schedule must write no peer's output.
    pub(crate) fn is_eager(&self) -> bool {
        self.eager
    }

    pub(crate) fn rank(&self) -> usize {
        self.me
    }
    pub(crate) fn world(&self) -> usize {
        self.g.n
    }
    pub(crate) fn root(&self) -> usize {
        self.desc.root
    }
    /// Elements of this rank's input.
    pub(crate) fn send_len(&self) -> usize {
        self.desc.len_in
    }
    /// Elements of this rank's output.
    pub(crate) fn recv_len(&self) -> usize {
        self.desc.len_out
    }

    /// Slicing of ranges of up to `max_len` elements: `(slices, elements per slice)`, with
    /// slices of about `config.slice_bytes` and at most [`MAX_SLICES`] of them (at least
    /// one, possibly empty).
    pub(crate) fn slicing(&self, max_len: usize) -> (usize, usize) {
        slicing(
            max_len,
            self.g.config.slice_bytes,
            self.desc.dtype_out.size_in_bytes(),
        )
    }

    /// Fail fast if the group was aborted (between slices).
    pub(crate) fn check(&self) -> Result<(), Stop> {
        if self.g.aborted.load(Ordering::Relaxed) {
            Err(Stop::Aborted)
        } else {
            Ok(())
        }
    }

    /// Announce that this rank has done `units` units of work on `lane` in this collective
    /// (everything it wrote before is visible to a peer that sees the count).
    pub(crate) fn publish(&self, lane: usize, units: usize) {
        debug_assert!((units as u64) < 1 << UNIT_BITS);
        let value = self.seq << UNIT_BITS | units as u64;
        self.g
            .publish(&self.g.ranks[self.me].progress.0[lane], value);
    }

    /// Wait until `peer` has published at least `units` units on `lane`.
    pub(crate) fn wait(&self, peer: usize, lane: usize, units: usize) -> Result<(), Stop> {
        self.wait_until(|| self.ready(peer, lane, units), || vec![peer])
    }

    /// True if `peer` has published at least `units` units on `lane` (no waiting).
    pub(crate) fn ready(&self, peer: usize, lane: usize, units: usize) -> bool {
        let target = self.seq << UNIT_BITS | units as u64;
        self.g.ranks[peer].progress.0[lane].load(Ordering::Acquire) >= target
    }

    /// Wait until `cond()` holds (built from [`Ctx::ready`] checks); on the deadline the
    /// error names the ranks `blockers()` returns.
    pub(crate) fn wait_until(
        &self,
        cond: impl FnMut() -> bool,
        blockers: impl FnOnce() -> Vec<usize>,
    ) -> Result<(), Stop> {
        self.g
            .wait_until(Some(self.deadline), true, cond)
            .map_err(|end| match end {
                WaitEnd::Aborted => Stop::Aborted,
                WaitEnd::Deadline => Stop::Timeout(blockers()),
            })
    }

    /// Pointer to element `loc.offset` of a posted buffer, with `len` elements checked to
    /// lie inside it (a failed check is a broken schedule: it panics, and the collective's
    /// guard aborts the group and waits for the peers before the panic goes on).
    fn ptr(&self, loc: Loc, len: usize) -> *mut u8 {
        let (base, total) = self.g.posted_buffer(loc.rank, self.seq, loc.side);
        assert!(
            loc.offset.checked_add(len).is_some_and(|end| end <= total),
            "schedule out of bounds: rank {} {:?} [{}, +{len}) of {total}",
            loc.rank,
            loc.side,
            loc.offset
        );
        base.wrapping_add(loc.offset * self.desc.dtype_out.size_in_bytes())
    }

    /// `dst[..len] = (dst ⊕) srcs[0] ⊕ srcs[1] ⊕ ...` with this collective's operator, in
    /// one pass and in this operand order (`dst` first when `accumulate`); divided by the
    /// world size when `finalize` and the operator is Mean.
    ///
    /// # Safety
    /// For the duration of the call no other rank may write any source range or access the
    /// destination range, `dst` must not overlap any source, and `dst` must be a `Recv`
    /// location (inputs are read only).
    pub(crate) unsafe fn reduce(
        &self,
        dst: Loc,
        srcs: &[Loc],
        len: usize,
        accumulate: bool,
        finalize: bool,
    ) {
        if len == 0 {
            return;
        }
        debug_assert_eq!(dst.side, Side::Recv);
        debug_assert!(srcs.len() <= MAX_WORLD_SIZE);
        let d = self.ptr(dst, len);
        let k = srcs.len().min(MAX_WORLD_SIZE);
        let mut s = [std::ptr::null::<u8>(); MAX_WORLD_SIZE];
        for (slot, loc) in s.iter_mut().zip(srcs) {
            *slot = self.ptr(*loc, len).cast_const();
        }
        #[cfg(test)]
        if k >= 2 && crate::mutants::active() == Some(crate::mutants::Mutant::RepeatedSource) {
            s[k - 1] = s[0];
        }
        let (op, world) = (self.desc.op, self.g.n);
        with_dtype!(self.desc.dtype_out, T => {
            // SAFETY: `ptr` checked every range to lie inside a live posted buffer (peers'
            // buffers stay borrowed until every rank has left this data phase), buffers
            // are 8-byte aligned and offsets are whole elements of the posted dtype (the
            // rendezvous checked all ranks agree on it); the caller guarantees that no one
            // else writes the sources or touches the destination meanwhile and that the
            // destination overlaps no source, so these references do not alias mutably.
            let (dst, refs) = unsafe {
                let dst = std::slice::from_raw_parts_mut(d.cast::<T>(), len);
                let mut refs: [&[T]; MAX_WORLD_SIZE] = [&[]; MAX_WORLD_SIZE];
                for (r, p) in refs.iter_mut().zip(&s[..k]) {
                    *r = std::slice::from_raw_parts(p.cast::<T>(), len);
                }
                (dst, refs)
            };
            combine_op::<T>(op, dst, accumulate, &refs[..k], finalize, world);
        });
    }

    /// `dst[..len] = src[..len]`.
    ///
    /// # Safety
    /// For the duration of the call no other rank may write the source range or access the
    /// destination range, the two must not overlap, and `dst` must be a `Recv` location.
    pub(crate) unsafe fn copy(&self, dst: Loc, src: Loc, len: usize) {
        if len == 0 {
            return;
        }
        debug_assert_eq!(dst.side, Side::Recv);
        let d = self.ptr(dst, len);
        let s = self.ptr(src, len);
        let bytes = len * self.desc.dtype_out.size_in_bytes();
        // SAFETY: both ranges lie inside live posted buffers (checked by `ptr`), do not
        // overlap and are not accessed by anyone else meanwhile (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(s.cast_const(), d, bytes) };
    }
}
