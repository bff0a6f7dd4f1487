//! Locking that survives a panic elsewhere.

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, using the data even if a thread panicked while holding the lock. Every mutex
/// of this crate protects data that a panic cannot leave half-updated (plain assignments,
/// counters, queue moves), so a poisoned lock is still usable, and a collective must not
/// turn a peer's panic into a second one.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
