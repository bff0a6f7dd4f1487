//! `repeat`: the input run again and again, each repetition with its own iteration key
//! so that a shuffle before the repeat gives each repetition a new order.

use super::element::{Elem, ElemIter};
use super::shuffle::mix;
use super::Dataset;
use crate::Result;

/// `input` `count` times (`None`: forever) during iteration key `key`.
pub(super) fn repeat(input: Dataset, count: Option<usize>, key: u64) -> Result<ElemIter> {
    // Build the first repetition now, so that configuration errors surface here.
    let current = match count {
        Some(0) => None,
        _ => Some(input.elements(key)?),
    };
    Ok(Box::new(Repeat {
        input,
        count,
        key,
        rep: 0,
        current,
        yielded: false,
    }))
}

struct Repeat {
    input: Dataset,
    count: Option<usize>,
    key: u64,
    /// Index of the current repetition.
    rep: usize,
    current: Option<ElemIter>,
    /// Whether the current repetition has produced an element.
    yielded: bool,
}

impl Iterator for Repeat {
    type Item = Result<Elem>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let current = self.current.as_mut()?;
            if let Some(item) = current.next() {
                self.yielded = true;
                return Some(item);
            }
            self.rep += 1;
            // An empty repetition would make `repeat(None)` spin forever.
            let more = self.yielded && self.count.is_none_or(|c| self.rep < c);
            self.current = None;
            self.yielded = false;
            if !more {
                return None;
            }
            match self.input.elements(mix(self.key, self.rep as u64)) {
                Ok(it) => self.current = Some(it),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{labels, numbered};

    #[test]
    fn each_repetition_is_shuffled_anew() {
        let ds = numbered(20).shuffle(20, 4).repeat(Some(2));
        let both = labels(&ds, 0);
        assert_eq!(both.len(), 40);
        let (a, b) = both.split_at(20);
        assert_ne!(a, b);
        let mut b = b.to_vec();
        b.sort_unstable();
        assert_eq!(b, (0..20).collect::<Vec<_>>());
        // The first repetition is the plain epoch.
        assert_eq!(a, labels(&numbered(20).shuffle(20, 4), 0));
        assert_ne!(labels(&ds, 1), both);
    }

    #[test]
    fn repeating_nothing_ends() {
        assert!(labels(&numbered(0).repeat(None), 0).is_empty());
        assert!(labels(&numbered(5).take(0).repeat(None), 0).is_empty());
        assert!(labels(&numbered(5).repeat(Some(0)), 0).is_empty());
    }
}
