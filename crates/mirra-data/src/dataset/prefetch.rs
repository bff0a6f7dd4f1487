//! `prefetch`: the input runs on a background thread that keeps up to `n` elements ready
//! in a bounded channel, so the next batch is built while the current step trains.
//!
//! The consumer owns the thread: dropping the iterator closes the channel, which makes
//! the producer's next send fail and the thread return, and then joins it. Nothing
//! outlives the iterator. A producer error or panic reaches the consumer as an `Err`.

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

use super::element::{Elem, ElemIter};
use crate::{DataError, Result};

/// `input` produced on a background thread, at most `n` (at least 1) elements ahead.
pub(super) fn prefetch(input: ElemIter, n: usize) -> Result<ElemIter> {
    let (tx, rx) = sync_channel(n);
    let handle = std::thread::Builder::new()
        .name("mirra-prefetch".into())
        .spawn(move || {
            for item in input {
                let failed = item.is_err();
                if tx.send(item).is_err() || failed {
                    break;
                }
            }
        })
        .map_err(|source| DataError::Thread { source })?;
    Ok(Box::new(Prefetch {
        rx: Some(rx),
        handle: Some(handle),
    }))
}

struct Prefetch {
    rx: Option<Receiver<Result<Elem>>>,
    handle: Option<JoinHandle<()>>,
}

impl Prefetch {
    /// Closes the channel and waits for the thread; its panic message if it panicked.
    fn stop(&mut self) -> Option<String> {
        drop(self.rx.take());
        let payload = self.handle.take()?.join().err()?;
        Some(mirra_device::sync::panic_message(payload.as_ref()))
    }
}

impl Iterator for Prefetch {
    type Item = Result<Elem>;

    fn next(&mut self) -> Option<Result<Elem>> {
        match self.rx.as_ref()?.recv() {
            Ok(item) => Some(item),
            // The producer is done: finished, or panicked.
            Err(_) => self
                .stop()
                .map(|msg| Err(DataError::ProducerPanicked { msg })),
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::super::testing::{collect, numbered};
    use super::*;

    #[test]
    fn prefetching_changes_nothing_but_the_thread() {
        let plain = numbered(50).shuffle(20, 8).batch(7, false);
        let ahead = plain.clone().prefetch(2);
        for epoch in 0..3 {
            assert_eq!(collect(&ahead, epoch), collect(&plain, epoch));
        }
        assert_eq!(ahead.cardinality(), Some(8));
        assert_eq!(collect(&plain.clone().prefetch(0), 1), collect(&plain, 1));
        // Nested prefetches work too.
        assert_eq!(collect(&ahead.prefetch(1), 2), collect(&plain, 2));
    }

    #[test]
    fn elements_are_made_on_another_thread() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let ds = numbered(4)
            .map(move |v| {
                log.lock().unwrap().push(std::thread::current().id());
                Ok(v)
            })
            .prefetch(1);
        assert_eq!(collect(&ds, 0).len(), 4);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 4);
        assert!(seen.iter().all(|&id| id != std::thread::current().id()));
    }

    #[test]
    fn dropping_a_half_read_iterator_stops_the_thread() {
        let made = Arc::new(AtomicUsize::new(0));
        let counter = made.clone();
        let ds = numbered(10)
            .map(move |v| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(v)
            })
            .repeat(None)
            .batch(2, false)
            .prefetch(2);
        let mut it = ds.iter_epoch(0).unwrap();
        for _ in 0..3 {
            it.next().unwrap().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        // Bounded: 3 batches read, 2 queued, 1 waiting to be sent; 2 examples each.
        let ahead = made.load(Ordering::SeqCst);
        assert!((6..=12).contains(&ahead), "{ahead} examples made");
        drop(it);
        // The thread has been joined: nothing more is made.
        let after = made.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(made.load(Ordering::SeqCst), after);
    }

    #[test]
    fn producer_errors_and_panics_reach_the_consumer() {
        let failing = numbered(5)
            .map(|v| match v[1].to_vec::<i64>()?[0] {
                3 => Err(DataError::ZeroArgument {
                    op: "test",
                    what: "three",
                }),
                _ => Ok(v),
            })
            .prefetch(4);
        let items: Vec<_> = failing.iter_epoch(0).unwrap().collect();
        assert_eq!(items.len(), 4);
        assert_eq!(
            items[3].as_ref().unwrap_err().to_string(),
            "test: three must be at least 1, got 0"
        );

        let panicking = numbered(5)
            .map(|v| {
                assert!(v[1].to_vec::<i64>()?[0] != 2, "bad example");
                Ok(v)
            })
            .prefetch(1);
        let items: Vec<_> = panicking.iter_epoch(0).unwrap().collect();
        assert_eq!(items.len(), 3);
        assert_eq!(
            items[2].as_ref().unwrap_err().to_string(),
            "prefetch: the background thread panicked: bad example"
        );
    }
}
