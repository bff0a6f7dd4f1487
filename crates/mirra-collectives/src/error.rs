//! The crate's one error type, [`CollectiveError`], and its [`Result`].

use std::time::Duration;

use mirra_device::DType;

use crate::collective::Collective;
use crate::reduce::ReduceOp;

/// Everything that can go wrong in a collective. Each variant names the collective (`op`),
/// the rank at fault and the values involved, so that a log line from any rank says who
/// disagreed with whom.
///
/// Argument errors (mismatches, out-of-range roots, unsupported dtypes) are found by every
/// rank from the same posted metadata, so every rank of the group returns the same error
/// and the group stays usable. Failures of the group itself (`Timeout`, `RankGone`,
/// `Aborted`) are sticky: the group is aborted and every later call fails with the first
/// cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    /// No backend of that name exists (in this build).
    #[error("unknown collectives backend `{name}`; known backends: {}", .known.join(", "))]
    UnknownBackend {
        /// The name asked for.
        name: String,
        /// The names this build knows.
        known: &'static [&'static str],
    },
    /// A group needs at least one rank and at most `max`.
    #[error("invalid world size {world_size}: a group has 1 to {max} ranks")]
    InvalidWorldSize {
        /// The size asked for.
        world_size: usize,
        /// The largest group this backend supports.
        max: usize,
    },
    /// A rank id outside `0..world_size`.
    #[error("rank {rank} out of range for a group of {world_size}")]
    RankOutOfRange {
        /// The rank given.
        rank: usize,
        /// The size of the group.
        world_size: usize,
    },
    /// The workers of a hierarchical group offered different numbers of ranks.
    #[error("worker {worker} has {ranks} local ranks, but worker {ref_worker} has {ref_ranks}: every worker of a hierarchical group needs the same number")]
    UnevenWorkers {
        /// The first worker whose count differs from worker 0's.
        worker: usize,
        /// Its count.
        ranks: usize,
        /// The worker it is compared with.
        ref_worker: usize,
        /// That worker's count.
        ref_ranks: usize,
    },
    /// Ranks started different collectives at the same point of their sequences (all ranks
    /// must start collectives in the same order).
    #[error("{op}: rank {rank} started {started}, but rank {ref_rank} started {ref_started} (ranks must start collectives in the same order)")]
    CollectiveMismatch {
        /// The collective this rank started.
        op: Collective,
        /// The offending rank.
        rank: usize,
        /// What the offending rank started.
        started: Collective,
        /// The rank it was compared with.
        ref_rank: usize,
        /// What that rank started.
        ref_started: Collective,
    },
    /// Ranks passed buffers of different lengths.
    #[error("{op}: rank {rank} passed {len} elements, but rank {ref_rank} passed {ref_len}")]
    LengthMismatch {
        /// The collective.
        op: Collective,
        /// The offending rank.
        rank: usize,
        /// Its element count (the receive count for reduce-scatter, the send count for
        /// all-gather).
        len: usize,
        /// The rank it was compared with.
        ref_rank: usize,
        /// That rank's element count.
        ref_len: usize,
    },
    /// Ranks passed buffers of different element types.
    #[error("{op}: rank {rank} passed {dtype} buffers, but rank {ref_rank} passed {ref_dtype}")]
    DTypeMismatch {
        /// The collective.
        op: Collective,
        /// The offending rank.
        rank: usize,
        /// Its dtype.
        dtype: DType,
        /// The rank it was compared with.
        ref_rank: usize,
        /// That rank's dtype.
        ref_dtype: DType,
    },
    /// Ranks asked for different reduction operators.
    #[error(
        "{op}: rank {rank} asked for {reduce_op}, but rank {ref_rank} asked for {ref_reduce_op}"
    )]
    ReduceOpMismatch {
        /// The collective.
        op: Collective,
        /// The offending rank.
        rank: usize,
        /// Its operator.
        reduce_op: ReduceOp,
        /// The rank it was compared with.
        ref_rank: usize,
        /// That rank's operator.
        ref_reduce_op: ReduceOp,
    },
    /// Ranks named different roots.
    #[error("{op}: rank {rank} named root {root}, but rank {ref_rank} named root {ref_root}")]
    RootMismatch {
        /// The collective.
        op: Collective,
        /// The offending rank.
        rank: usize,
        /// The root it named.
        root: usize,
        /// The rank it was compared with.
        ref_rank: usize,
        /// The root that rank named.
        ref_root: usize,
    },
    /// A root outside `0..world_size`.
    #[error("{op}: rank {rank} named root {root}, out of range for a group of {world_size}")]
    RootOutOfRange {
        /// The collective.
        op: Collective,
        /// The rank that named it.
        rank: usize,
        /// The root named.
        root: usize,
        /// The size of the group.
        world_size: usize,
    },
    /// The element type cannot be reduced or moved by this backend (`u8`).
    #[error("{op}: rank {rank} passed {dtype} buffers, which collectives do not support (f32, f64, f16, bf16, i32, i64)")]
    UnsupportedDType {
        /// The collective.
        op: Collective,
        /// The rank that passed it.
        rank: usize,
        /// The dtype.
        dtype: DType,
    },
    /// A buffer on a device this backend cannot reach.
    #[error(
        "{op}: rank {rank} passed a buffer on {device}, but backend `{backend}` moves {accepts}"
    )]
    UnsupportedDevice {
        /// The collective.
        op: Collective,
        /// The rank that passed it.
        rank: usize,
        /// Where the buffer lives (`cuda:0`).
        device: String,
        /// The backend.
        backend: &'static str,
        /// The buffers it moves (`host buffers only`, `buffers on the rank's device
        /// (cuda:1) only`).
        accepts: String,
    },
    /// The send and receive buffers of one rank do not fit each other: reduce-scatter needs
    /// `send = world_size x recv` elements, all-gather `recv = world_size x send`.
    #[error("{op}: rank {rank} passed send {send_len} and recv {recv_len} elements; with {world_size} ranks {}", if matches!(.op, Collective::AllGather) { "recv must hold world_size x send" } else { "send must hold world_size x recv" })]
    BufferSizes {
        /// The collective.
        op: Collective,
        /// The rank at fault.
        rank: usize,
        /// Elements in its send buffer.
        send_len: usize,
        /// Elements in its receive buffer.
        recv_len: usize,
        /// The size of the group.
        world_size: usize,
    },
    /// One rank's send and receive buffers hold different element types.
    #[error("{op}: rank {rank} passed a {send} send buffer and a {recv} recv buffer")]
    SendRecvDType {
        /// The collective.
        op: Collective,
        /// The rank at fault.
        rank: usize,
        /// The send dtype.
        send: DType,
        /// The receive dtype.
        recv: DType,
    },
    /// A rank waited past its deadline. `waiting_for` lists the ranks it was still waiting
    /// for; the group is aborted.
    #[error("{op}: rank {rank} timed out after {after:?} waiting for rank(s) {waiting_for:?}")]
    Timeout {
        /// The collective.
        op: Collective,
        /// The rank that timed out.
        rank: usize,
        /// The ranks that had not done their part.
        waiting_for: Vec<usize>,
        /// The deadline that passed.
        after: Duration,
    },
    /// A rank dropped its communicator (or panicked, which drops it): the group is aborted.
    #[error(
        "{op}: rank {rank} left the group (its communicator was dropped or its thread panicked)"
    )]
    RankGone {
        /// The collective that failed.
        op: Collective,
        /// The rank that left.
        rank: usize,
    },
    /// The background thread that progresses submitted collectives could not be started,
    /// or died; the group is aborted.
    #[error("{op}: rank {rank}'s progress thread failed: {reason}")]
    ProgressThread {
        /// The collective that failed.
        op: Collective,
        /// The rank whose thread failed.
        rank: usize,
        /// What the operating system or the thread reported.
        reason: String,
    },
    /// The device running the collective failed (a faulted kernel, a lost device); the
    /// group is aborted.
    #[error("{op}: rank {rank}'s device failed: {reason}")]
    Device {
        /// The collective that failed.
        op: Collective,
        /// The rank whose device failed.
        rank: usize,
        /// What the device reported.
        reason: String,
    },
    /// The group was aborted through an [`AbortHandle`](crate::AbortHandle).
    #[error("{op}: the group was aborted")]
    Aborted {
        /// The collective that failed.
        op: Collective,
    },
}

impl CollectiveError {
    /// True for failures of the group (timeout, a rank gone, abort) after which every call
    /// fails; false for argument errors, after which the group can go on.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            CollectiveError::Timeout { .. }
                | CollectiveError::RankGone { .. }
                | CollectiveError::Aborted { .. }
                | CollectiveError::ProgressThread { .. }
                | CollectiveError::Device { .. }
        )
    }

    /// This error as collective `op` of a larger group reports it: every rank it names
    /// (`rank` of this group) becomes `to_group(rank)`, and the collective becomes `op`.
    /// How a backend built of smaller groups (the hierarchical one) reports the failure of
    /// one of its stages in its own ranks.
    pub(crate) fn renumbered(self, op: Collective, to_group: impl Fn(usize) -> usize) -> Self {
        use CollectiveError as E;
        let f = &to_group;
        match self {
            E::CollectiveMismatch {
                rank,
                started,
                ref_rank,
                ref_started,
                ..
            } => E::CollectiveMismatch {
                op,
                rank: f(rank),
                started,
                ref_rank: f(ref_rank),
                ref_started,
            },
            E::LengthMismatch {
                rank,
                len,
                ref_rank,
                ref_len,
                ..
            } => E::LengthMismatch {
                op,
                rank: f(rank),
                len,
                ref_rank: f(ref_rank),
                ref_len,
            },
            E::DTypeMismatch {
                rank,
                dtype,
                ref_rank,
                ref_dtype,
                ..
            } => E::DTypeMismatch {
                op,
                rank: f(rank),
                dtype,
                ref_rank: f(ref_rank),
                ref_dtype,
            },
            E::ReduceOpMismatch {
                rank,
                reduce_op,
                ref_rank,
                ref_reduce_op,
                ..
            } => E::ReduceOpMismatch {
                op,
                rank: f(rank),
                reduce_op,
                ref_rank: f(ref_rank),
                ref_reduce_op,
            },
            E::RootMismatch {
                rank,
                root,
                ref_rank,
                ref_root,
                ..
            } => E::RootMismatch {
                op,
                rank: f(rank),
                root: f(root),
                ref_rank: f(ref_rank),
                ref_root: f(ref_root),
            },
            E::RootOutOfRange {
                rank,
                root,
                world_size,
                ..
            } => E::RootOutOfRange {
                op,
                rank: f(rank),
                root,
                world_size,
            },
            E::UnsupportedDType { rank, dtype, .. } => E::UnsupportedDType {
                op,
                rank: f(rank),
                dtype,
            },
            E::UnsupportedDevice {
                rank,
                device,
                backend,
                accepts,
                ..
            } => E::UnsupportedDevice {
                op,
                rank: f(rank),
                device,
                backend,
                accepts,
            },
            E::BufferSizes {
                rank,
                send_len,
                recv_len,
                world_size,
                ..
            } => E::BufferSizes {
                op,
                rank: f(rank),
                send_len,
                recv_len,
                world_size,
            },
            E::SendRecvDType {
                rank, send, recv, ..
            } => E::SendRecvDType {
                op,
                rank: f(rank),
                send,
                recv,
            },
            E::Timeout {
                rank,
                waiting_for,
                after,
                ..
            } => E::Timeout {
                op,
                rank: f(rank),
                waiting_for: waiting_for.into_iter().map(f).collect(),
                after,
            },
            E::RankGone { rank, .. } => E::RankGone { op, rank: f(rank) },
            E::ProgressThread { rank, reason, .. } => E::ProgressThread {
                op,
                rank: f(rank),
                reason,
            },
            E::Device { rank, reason, .. } => E::Device {
                op,
                rank: f(rank),
                reason,
            },
            E::Aborted { .. } => E::Aborted { op },
            other @ (E::UnknownBackend { .. }
            | E::InvalidWorldSize { .. }
            | E::RankOutOfRange { .. }
            | E::UnevenWorkers { .. }) => other,
        }
    }
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, CollectiveError>;
