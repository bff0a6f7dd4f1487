//! The variable-creation scope: which distribution strategy, if any, the parameters a
//! model creates belong to (TensorFlow's `strategy.scope()`).
//!
//! A strategy enters its scope around the code that builds a model; [`Sequential`] records
//! the scope its parameters were created in, and the strategy refuses a model built in
//! another scope, or in none, instead of silently training unmirrored copies.
//!
//! [`Sequential`]: crate::Sequential

use std::cell::Cell;

thread_local! {
    static CURRENT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The scope that variables created on this thread now belong to.
pub fn current() -> Option<u64> {
    CURRENT.with(Cell::get)
}

/// Run `f` with variables created on this thread belonging to scope `id` (restored
/// afterwards, also when `f` panics).
pub fn enter<R>(id: u64, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(Some(id))));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert_eq!(current(), None);
        enter(3, || {
            assert_eq!(current(), Some(3));
            enter(4, || assert_eq!(current(), Some(4)));
            assert_eq!(current(), Some(3));
        });
        assert_eq!(current(), None);
        let _ = std::panic::catch_unwind(|| enter(5, || panic!("boom")));
        assert_eq!(current(), None);
    }
}
