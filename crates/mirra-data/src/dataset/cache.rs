//! `cache`: the first complete epoch kept in memory and replayed afterwards, so that an
//! expensive `map` (decoding, augmentation computed once) runs once.
//!
//! Only an epoch read to its end without error is stored; a partial epoch would
//! silently shrink every later one.

use std::sync::{Arc, Mutex};

use super::element::{Elem, ElemIter};
use mirra_device::sync::lock;

use super::Dataset;
use crate::Result;

/// The cached elements of one `cache` node, shared by all clones of its dataset.
#[derive(Default)]
pub(super) struct Store(Arc<Mutex<Option<Arc<[Elem]>>>>);

impl Store {
    /// Replays the cache when it is filled, else runs `input` and fills it on the way.
    pub(super) fn elements(&self, input: &Dataset, key: u64) -> Result<ElemIter> {
        if let Some(elems) = lock(&self.0).clone() {
            return Ok(Box::new(
                (0..elems.len()).map(move |i| Ok(elems[i].clone())),
            ));
        }
        Ok(Box::new(Fill {
            input: input.elements(key)?,
            seen: Vec::new(),
            store: self.0.clone(),
            failed: false,
        }))
    }
}

/// Passes the input through, keeping a copy of every element.
struct Fill {
    input: ElemIter,
    seen: Vec<Elem>,
    store: Arc<Mutex<Option<Arc<[Elem]>>>>,
    failed: bool,
}

impl Iterator for Fill {
    type Item = Result<Elem>;

    fn next(&mut self) -> Option<Result<Elem>> {
        match self.input.next() {
            Some(Ok(e)) => {
                self.seen.push(e.clone());
                Some(Ok(e))
            }
            Some(Err(e)) => {
                self.failed = true;
                Some(Err(e))
            }
            None => {
                if !self.failed {
                    let seen = std::mem::take(&mut self.seen);
                    lock(&self.store).get_or_insert_with(|| seen.into());
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::super::testing::{collect, numbered};
    use super::*;

    #[test]
    fn cache_replays_the_first_epoch() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let ds = numbered(10)
            .shuffle(10, 1)
            .map(move |v| {
                counter.fetch_add(1, Ordering::Relaxed);
                Ok(v)
            })
            .cache()
            .batch(3, false);
        let first = collect(&ds, 0);
        assert_eq!(calls.load(Ordering::Relaxed), 10);
        // Later epochs (and clones) replay the same elements without running the map.
        assert_eq!(collect(&ds, 1), first);
        assert_eq!(collect(&ds.clone(), 2), first);
        assert_eq!(calls.load(Ordering::Relaxed), 10);
        // Without the cache, epoch 1 is shuffled differently.
        assert_ne!(
            collect(&numbered(10).shuffle(10, 1).batch(3, false), 1),
            first
        );
    }

    #[test]
    fn a_partial_epoch_is_not_cached() {
        let ds = numbered(6).shuffle(6, 2).cache();
        let partial: Vec<_> = ds.iter_epoch(0).unwrap().take(2).collect();
        assert_eq!(partial.len(), 2);
        // Epoch 1 runs the input afresh (its own shuffle), and is then cached.
        let e1 = collect(&ds, 1);
        assert_eq!(e1.len(), 6);
        assert_eq!(collect(&ds, 0), e1);
        // Shuffling after the cache still reshuffles each epoch.
        let reshuffled = ds.shuffle(6, 3);
        assert_ne!(collect(&reshuffled, 0), collect(&reshuffled, 1));
    }
}
