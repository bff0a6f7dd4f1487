//! Deliberate schedule bugs for the conformance suite to catch (test builds only).
//!
//! A test switches one on for the thread it runs a rank on; the real schedules then
//! misbehave on that thread alone, so tests running in parallel are not affected. Each
//! mutant only ever drops or repeats accesses the schedule already makes safe (a slice
//! that loses its first element, a source read twice), so a mutant run computes wrong
//! results but never races.

use std::cell::Cell;

/// A schedule bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// Slice 1 of every range starts one element late: the first element of the second
    /// slice is neither reduced nor copied. Invisible when a buffer fits in one slice.
    SliceOffset,
    /// A reduction of several sources reads its first source again instead of its last.
    /// Invisible when every rank holds the same input.
    RepeatedSource,
    /// The device ring's plans drop every dependency between streams: a step may run
    /// before the step that wrote what it reads. Invisible when steps run in plan order.
    MissingWait,
    /// The hierarchical broadcast's last stage, on the workers other than the root's,
    /// broadcasts from the root's local rank instead of from the worker's leader.
    /// Invisible when every rank holds the same input, or one rank per worker.
    WrongLocalRoot,
}

thread_local! {
    static ACTIVE: Cell<Option<Mutant>> = const { Cell::new(None) };
}

/// The mutant active on this thread, if any.
pub(crate) fn active() -> Option<Mutant> {
    ACTIVE.with(Cell::get)
}

/// Make `mutant` the one active on this thread (`None`: the schedules as written).
pub(crate) fn set(mutant: Option<Mutant>) {
    ACTIVE.with(|a| a.set(mutant));
}
