//! Deterministic mode's fixed reduction order: the canonical micro-batches of a step, which
//! replica owns which, and the one pairwise tree that sums them.
//!
//! Float addition is commutative but not associative, so a sum's bits depend on how its
//! terms are grouped. Deterministic mode fixes the grouping from the example up, the same
//! for any number of replicas:
//!
//! - The global batch of `B` examples is cut into micro-batches of `m` (the last one may
//!   be shorter): micro-batch `i` holds examples `i·m .. min((i+1)·m, B)`. A micro-batch's
//!   forward and backward always run on exactly its examples, so every kernel sees the
//!   same shapes and the same data whichever replica runs it.
//! - The `K = ceil(B/m)` micro-batch gradients are summed by one pairwise tree over the
//!   micro-batch index: node `(first, size)` (size a power of two, `first` a multiple of
//!   it) is the sum of its left half plus its right half, or its left half alone when the
//!   right one starts at or past `K`. The root is `(0, P)`, `P` the least power of two
//!   `≥ K`.
//! - Replica `r` owns a contiguous run of micro-batches ([`MicroBatches::owned`]); it sums
//!   the largest subtrees that lie inside its run ([`MicroBatches::subtrees`]); the rest of
//!   the tree, above them, is summed from every replica's subtrees by index, not by rank or
//!   arrival. Every association is the tree's, so the result is the bits of one replica
//!   summing everything alone.

use std::ops::Range;

use crate::{Result, StrategyError};

/// The micro-batches a global batch is cut into when the micro-batch size is not given
/// ([`default_micro_batch`]): enough to keep 8 replicas busy.
pub const DEFAULT_MICRO_BATCHES: usize = 8;

/// The micro-batch size `mirra train --deterministic` uses for a global batch of
/// `global_batch` unless told: an eighth of it, rounded up. It is fixed for the run (the
/// configured batch, not a partial last one), and it decides the results, as any
/// micro-batch size does; the replica count does not.
pub fn default_micro_batch(global_batch: usize) -> usize {
    global_batch.div_ceil(DEFAULT_MICRO_BATCHES).max(1)
}

/// A node of the tree over micro-batch indices: the micro-batches `first .. first + size`
/// that exist (those below the step's count).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The first micro-batch it covers (a multiple of `size`).
    pub first: usize,
    /// How many micro-batch indices it spans, a power of two (fewer exist at the end).
    pub size: usize,
}

impl Node {
    /// The micro-batches it covers among `count`.
    pub fn covers(self, count: usize) -> Range<usize> {
        self.first.min(count)..(self.first + self.size).min(count)
    }

    /// Its two halves (a leaf has none).
    fn halves(self) -> Option<(Node, Node)> {
        let half = self.size / 2;
        (half > 0).then_some((
            Node {
                first: self.first,
                size: half,
            },
            Node {
                first: self.first + half,
                size: half,
            },
        ))
    }
}

/// The canonical micro-batches of one step of a global batch, and their owners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroBatches {
    micro: usize,
    batch: usize,
    replicas: usize,
}

impl MicroBatches {
    /// A global batch of `batch` examples in micro-batches of `micro`, over `replicas`.
    pub fn new(micro: usize, batch: usize, replicas: usize) -> Result<MicroBatches> {
        if micro == 0 || batch == 0 || replicas == 0 {
            return Err(StrategyError::Invalid(format!(
                "deterministic micro-batches: micro-batch size {micro}, global batch {batch} \
                 and {replicas} replicas must all be at least 1"
            )));
        }
        Ok(MicroBatches {
            micro,
            batch,
            replicas,
        })
    }

    /// The number of micro-batches `K`.
    pub fn count(&self) -> usize {
        self.batch.div_ceil(self.micro)
    }

    /// The micro-batch size.
    pub fn micro(&self) -> usize {
        self.micro
    }

    /// The replicas it is planned for.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The global batch size.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Micro-batches per replica: `ceil(K / replicas)`, the last replicas fewer or none.
    pub fn per_replica(&self) -> usize {
        self.count().div_ceil(self.replicas)
    }

    /// The micro-batches replica `r` owns.
    pub fn owned(&self, r: usize) -> Range<usize> {
        let (count, per) = (self.count(), self.per_replica());
        (r * per).min(count)..((r + 1) * per).min(count)
    }

    /// The examples of micro-batch `i`, in the global batch.
    pub fn examples_of(&self, i: usize) -> Range<usize> {
        (i * self.micro).min(self.batch)..((i + 1) * self.micro).min(self.batch)
    }

    /// The examples replica `r` owns, in the global batch (empty for a replica without
    /// micro-batches).
    pub fn examples(&self, r: usize) -> Range<usize> {
        let owned = self.owned(r);
        (owned.start * self.micro).min(self.batch)..(owned.end * self.micro).min(self.batch)
    }

    /// The tree's root.
    pub fn root(&self) -> Node {
        Node {
            first: 0,
            size: self.count().next_power_of_two(),
        }
    }

    /// The largest subtrees inside replica `r`'s micro-batches, in order: what it sums
    /// alone. Found from the root down, as [`tree_sum`] over every replica finds them.
    pub fn subtrees(&self, r: usize) -> Vec<Node> {
        let mut out = Vec::new();
        self.collect(self.root(), &self.owned(r), &mut out);
        out
    }

    fn collect(&self, node: Node, owned: &Range<usize>, out: &mut Vec<Node>) {
        let covers = node.covers(self.count());
        if covers.is_empty() || covers.end <= owned.start || covers.start >= owned.end {
            return;
        }
        if owned.start <= covers.start && covers.end <= owned.end {
            out.push(node);
            return;
        }
        if let Some((left, right)) = node.halves() {
            self.collect(left, owned, out);
            self.collect(right, owned, out);
        }
    }

    /// The two halves of the root, when two replicas own one each: the top of the tree
    /// is then one addition, of replica 0's subtree and replica 1's.
    pub fn halves_of_root(&self) -> Option<(Node, Node)> {
        if self.replicas != 2 {
            return None;
        }
        let (left, right) = self.root().halves()?;
        (self.subtrees(0) == [left] && self.subtrees(1) == [right]).then_some((left, right))
    }

    /// The most subtrees any replica owns (how many slots each sends).
    pub fn max_subtrees(&self) -> usize {
        (0..self.replicas)
            .map(|r| self.subtrees(r).len())
            .max()
            .unwrap_or(0)
    }
}

/// How [`tree_sum`] sums the two halves of a node at once.
pub trait Join: Sync {
    /// Run `a` and `b`, at once where it can, `a` with `split.0` of the threads and `b`
    /// with `split.1`.
    fn join<RA: Send, RB: Send>(
        &self,
        split: (usize, usize),
        a: impl FnOnce() -> RA + Send,
        b: impl FnOnce() -> RB + Send,
    ) -> (RA, RB);
}

/// One thread: the left half, then the right one.
#[derive(Clone, Copy, Debug)]
pub struct Sequential;

impl Join for Sequential {
    fn join<RA: Send, RB: Send>(
        &self,
        _: (usize, usize),
        a: impl FnOnce() -> RA + Send,
        b: impl FnOnce() -> RB + Send,
    ) -> (RA, RB) {
        (a(), b())
    }
}

/// The sum of the micro-batches under `node` in the tree's order: `known(n)` gives a
/// node's value when it is already summed (a leaf, or a subtree another replica summed),
/// `None` to sum its halves: `add(left, right)`, or the left alone when the right one
/// starts at or past `count`. With `threads > 1` the two halves are summed at once
/// (`join`), the threads shared between them; which thread sums a node changes nothing
/// of its bits. Errors are the callbacks' (a node without a value is a
/// [`StrategyError`]).
pub fn tree_sum<T: Send, E: Send + From<StrategyError>>(
    node: Node,
    count: usize,
    threads: usize,
    known: &(impl Fn(Node) -> std::result::Result<Option<T>, E> + Sync),
    add: &(impl Fn(T, T) -> std::result::Result<T, E> + Sync),
    join: &impl Join,
) -> std::result::Result<T, E> {
    if let Some(value) = known(node)? {
        return Ok(value);
    }
    let Some((left, right)) = node.halves() else {
        return Err(StrategyError::Invalid(format!(
            "deterministic tree: micro-batch {} has no value",
            node.first
        ))
        .into());
    };
    if right.first >= count {
        return tree_sum(left, count, threads, known, add, join);
    }
    let (mine, theirs) = (threads - threads / 2, (threads / 2).max(1));
    let (left, right) = match threads {
        0 | 1 => (
            tree_sum(left, count, 1, known, add, join),
            tree_sum(right, count, 1, known, add, join),
        ),
        _ => join.join(
            (mine, theirs),
            || tree_sum(left, count, mine, known, add, join),
            || tree_sum(right, count, theirs, known, add, join),
        ),
    };
    add(left?, right?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The tree's sum of `values` (one per micro-batch) as one replica computes it.
    fn one_replica(values: &[f32]) -> f32 {
        let plan = MicroBatches::new(1, values.len(), 1).unwrap();
        let leaf = |n: Node| Ok::<_, StrategyError>((n.size == 1).then(|| values[n.first]));
        tree_sum(
            plan.root(),
            plan.count(),
            1,
            &leaf,
            &|a, b| Ok(a + b),
            &Sequential,
        )
        .unwrap()
    }

    /// The same sum as `replicas` replicas compute it, each with `threads` threads: each
    /// sums its subtrees, then the rest of the tree is summed from every replica's
    /// subtrees, found by node.
    fn split(values: &[f32], replicas: usize, threads: usize) -> f32 {
        let plan = MicroBatches::new(1, values.len(), replicas).unwrap();
        let mut parts = std::collections::HashMap::new();
        let add = |a: f32, b: f32| Ok::<_, StrategyError>(a + b);
        for r in 0..replicas {
            for node in plan.subtrees(r) {
                let leaf = |n: Node| Ok((n.size == 1).then(|| values[n.first]));
                let v = tree_sum(node, plan.count(), threads, &leaf, &add, &Spawn).unwrap();
                assert!(parts.insert(node, v).is_none(), "{node:?} owned twice");
            }
        }
        let known = |n: Node| Ok(parts.get(&n).copied());
        tree_sum(plan.root(), plan.count(), threads, &known, &add, &Spawn).unwrap()
    }

    /// Halves on scoped threads of their own.
    struct Spawn;

    impl Join for Spawn {
        fn join<RA: Send, RB: Send>(
            &self,
            _: (usize, usize),
            a: impl FnOnce() -> RA + Send,
            b: impl FnOnce() -> RB + Send,
        ) -> (RA, RB) {
            std::thread::scope(|s| {
                let b = s.spawn(b);
                (a(), b.join().unwrap())
            })
        }
    }

    /// Values of wildly different magnitudes, where the grouping changes the bits.
    fn values() -> impl Strategy<Value = Vec<f32>> {
        proptest::collection::vec((-1e8f32..1e8, -20i32..20), 1..200)
            .prop_map(|v| v.into_iter().map(|(x, e)| x * 2f32.powi(e)).collect())
    }

    proptest! {
        #[test]
        fn any_replica_and_thread_count_sums_the_same_bits(
            v in values(), replicas in 1usize..=9, threads in 1usize..=4,
        ) {
            let got = split(&v, replicas, threads);
            prop_assert_eq!(got.to_bits(), one_replica(&v).to_bits());
        }

        #[test]
        fn replicas_own_every_micro_batch_once(
            micro in 1usize..9, batch in 1usize..300, replicas in 1usize..=9,
        ) {
            let plan = MicroBatches::new(micro, batch, replicas).unwrap();
            let mut seen = vec![0; plan.count()];
            let mut examples = 0;
            for r in 0..replicas {
                for node in plan.subtrees(r) {
                    let covers = node.covers(plan.count());
                    prop_assert!(plan.owned(r).start <= covers.start);
                    prop_assert!(covers.end <= plan.owned(r).end);
                    for i in covers {
                        seen[i] += 1;
                    }
                }
                let rows = plan.examples(r);
                prop_assert_eq!(rows.start, examples.min(batch));
                examples = rows.end.max(examples);
            }
            prop_assert_eq!(examples, batch);
            prop_assert!(seen.iter().all(|&s| s == 1), "{:?}", seen);
            prop_assert!(plan.max_subtrees() <= 2 * plan.root().size.trailing_zeros() as usize + 1);
        }
    }

    /// The check can fail: a left-to-right sum of the same values (another association)
    /// differs from the tree's for these values, which the property above would catch.
    #[test]
    fn another_association_gives_other_bits() {
        let v = [1e8f32, 1.0, -1e8, 1.0, 3.0];
        let sequential = v.iter().fold(0.0f32, |a, &b| a + b);
        assert_ne!(sequential.to_bits(), one_replica(&v).to_bits());
        // ((1e8 + 1) + (-1e8 + 1)) + 3: the 1s are lost in each pair.
        assert_eq!(one_replica(&v), 3.0);
    }

    #[test]
    fn subtrees_of_three_replicas_over_eight() {
        let plan = MicroBatches::new(16, 128, 3).unwrap();
        assert_eq!(plan.count(), 8);
        assert_eq!(plan.owned(0), 0..3);
        let node = |first, size| Node { first, size };
        assert_eq!(plan.subtrees(0), vec![node(0, 2), node(2, 1)]);
        assert_eq!(plan.subtrees(1), vec![node(3, 1), node(4, 2)]);
        assert_eq!(plan.subtrees(2), vec![node(6, 2)]);
        assert_eq!(plan.examples(2), 96..128);
    }

    #[test]
    fn two_replicas_owning_one_half_of_the_root_each_are_found() {
        let node = |first, size| Node { first, size };
        let halves = |micro, batch, replicas| {
            MicroBatches::new(micro, batch, replicas)
                .unwrap()
                .halves_of_root()
        };
        assert_eq!(halves(32, 256, 2), Some((node(0, 4), node(4, 4))));
        // Seven micro-batches: replica 1's half is short, still one subtree.
        assert_eq!(halves(1, 7, 2), Some((node(0, 4), node(4, 4))));
        // Thirteen: replica 0 owns 0..7, more than a half; three replicas; one
        // micro-batch (replica 1 owns none).
        assert_eq!(halves(2, 26, 2), None);
        assert_eq!(halves(32, 256, 3), None);
        assert_eq!(halves(8, 8, 2), None);
    }

    #[test]
    fn a_partial_batch_ends_in_a_short_micro_batch() {
        let plan = MicroBatches::new(16, 37, 4).unwrap();
        assert_eq!(plan.count(), 3);
        assert_eq!(plan.examples_of(2), 32..37);
        assert_eq!(plan.examples(3), 37..37);
        assert!(plan.subtrees(3).is_empty());
        // The root (0, 4) covers 0..3; replica 2 owns (2, 2), whose right half is empty.
        assert_eq!(plan.subtrees(2), vec![Node { first: 2, size: 2 }]);
    }
}
