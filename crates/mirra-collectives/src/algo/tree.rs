//! Double binary tree all-reduce (NCCL's tree algorithm): two complementary binary trees,
//! each reducing half of the buffer, so that every rank is an inner node in at most one
//! of them and the two halves keep all ranks busy.
//!
//! Tree 0 is NCCL's binary tree rooted at 0 (`btree`); tree 1 is its mirror
//! (`r -> n - 1 - r`) when `n` is even, its shift by one when `n` is odd. For each tree
//! and slice: reduce toward the root (a node waits until its children have reduced their
//! subtrees, then accumulates their values into its own buffer in one pass, its own value
//! first; the root also divides, for Mean), then broadcast down (a node copies the slice
//! from its parent once the parent has it final).
//!
//! Each final element is computed once, by a root, and copied down, so every rank ends
//! bitwise identical. Depth `d = ceil(log2 n)`: `2d` dependent steps per slice instead of
//! the ring's `2(n-1)`, which is what makes trees win on small messages.
//!
//! Progress: lane `REDUCED + t` counts the slices of tree `t` reduced over this node's
//! subtree, lane `FINAL + t` the slices final here. Each rank works on whatever is ready
//! in either tree (reduce first, then broadcast), so a root broadcasts a slice as soon as
//! it has reduced it and the two phases pipeline.

use crate::algo::algorithm::Algorithm;
use crate::algo::slicing::slice;
use crate::transport::{Ctx, Loc, Stop};

/// The double binary tree backend.
pub(crate) struct DoubleBinaryTree;

/// A rank's place in one tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub parent: Option<usize>,
    pub children: [Option<usize>; 2],
}

/// NCCL's binary tree over `0..n` rooted at 0 (`ncclGetBtree`): with `bit` the lowest set
/// bit of `rank`, the parent is `rank ^ bit | bit << 1` (or `rank ^ bit` when that is out
/// of range) and the children are `rank - bit/2` and the first of `rank + bit/2,
/// rank + bit/4, ...` in range. The root has one child, the largest power of two below n.
///
/// ```text
/// 0---------------8
///          ______/ \______
///         4               12
///       /   \            /  \
///     2       6       10     \
///    / \     / \     /  \     \
///   1   3   5   7   9   11    13
/// ```
pub(crate) fn btree(n: usize, rank: usize) -> Node {
    let mut bit = 1;
    while bit < n && bit & rank == 0 {
        bit <<= 1;
    }
    if rank == 0 {
        let child = (n > 1).then_some(bit >> 1);
        return Node {
            parent: None,
            children: [child, None],
        };
    }
    let mut up = (rank ^ bit) | (bit << 1);
    if up >= n {
        up = rank ^ bit;
    }
    let low = bit >> 1;
    let down0 = (low > 0).then(|| rank - low);
    let mut down1 = None;
    let mut lb = low;
    while lb > 0 {
        if rank + lb < n {
            down1 = Some(rank + lb);
            break;
        }
        lb >>= 1;
    }
    Node {
        parent: Some(up),
        children: [down0, down1],
    }
}

impl Algorithm for DoubleBinaryTree {
    fn name(&self) -> &'static str {
        "tree"
    }

    fn all_reduce(&self, ctx: &Ctx<'_>) -> Result<(), Stop> {
        let (n, r, len) = (ctx.world(), ctx.rank(), ctx.recv_len());
        if n == 1 {
            return Ok(());
        }
        let halves = [0..len / 2, len / 2..len];
        let trees = dtree(n, r);
        let (slices, per) = ctx.slicing(halves[1].len());
        // Next slice to reduce and to broadcast, per tree. A leaf has nothing to reduce.
        let mut red = [0usize; 2];
        let mut bc = [0usize; 2];
        // A leaf's input is its reduced subtree from the rendezvous on, and nobody reads
        // a leaf's progress: leaves publish nothing, and parents do not wait for them
        // (every publish is a cache line that another core must fetch).
        let is_leaf = |t: usize, rank: usize| dtree(n, rank)[t].children == [None, None];
        for (t, done) in red.iter_mut().enumerate() {
            if is_leaf(t, r) {
                *done = slices;
            }
        }
        let waits_for: [[Option<usize>; 2]; 2] =
            std::array::from_fn(|t| trees[t].children.map(|c| c.filter(|&c| !is_leaf(t, c))));
        let children_ready = |t: usize, j: usize| {
            waits_for[t]
                .iter()
                .flatten()
                .all(|&c| ctx.ready(c, REDUCED + t, j + 1))
        };
        let parent_ready = |t: usize, j: usize| {
            trees[t]
                .parent
                .is_none_or(|p| ctx.ready(p, FINAL + t, j + 1))
        };
        // Whatever is ready, in any tree, is done next: no wait on one tree holds up the
        // other, and a root broadcasts a slice as soon as it has reduced it.
        while bc != [slices; 2] {
            ctx.check()?;
            let mut progressed = false;
            for (t, node) in trees.iter().enumerate() {
                if red[t] < slices && children_ready(t, red[t]) {
                    let part = slice(&halves[t], per, red[t]);
                    let mut srcs = [Loc::send(0, 0); 2];
                    let mut k = 0;
                    for &c in node.children.iter().flatten() {
                        srcs[k] = Loc::send(c, part.start);
                        k += 1;
                    }
                    // SAFETY: each child has reduced this slice of its subtree (checked
                    // above) and writes it again only when it copies the final value from
                    // us, after we publish it final below. Our own slice is read by our
                    // parent only after the publish that follows.
                    unsafe {
                        ctx.reduce(
                            Loc::recv(r, part.start),
                            &srcs[..k],
                            part.len(),
                            true,
                            node.parent.is_none(),
                        )
                    };
                    red[t] += 1;
                    ctx.publish(REDUCED + t, red[t]);
                    progressed = true;
                }
                if bc[t] < red[t] && parent_ready(t, bc[t]) {
                    if let Some(p) = node.parent {
                        let part = slice(&halves[t], per, bc[t]);
                        // SAFETY: the parent has this slice final (checked above) and never
                        // writes it again; our slice was last read by the parent in the
                        // reduce, before it published the final value; our children read it
                        // only after the publish that follows.
                        unsafe {
                            ctx.copy(
                                Loc::recv(r, part.start),
                                Loc::send(p, part.start),
                                part.len(),
                            )
                        };
                    }
                    bc[t] += 1;
                    if !is_leaf(t, r) {
                        ctx.publish(FINAL + t, bc[t]);
                    }
                    progressed = true;
                }
            }
            if !progressed {
                let any_ready = || {
                    (0..2).any(|t| {
                        (red[t] < slices && children_ready(t, red[t]))
                            || (bc[t] < red[t] && parent_ready(t, bc[t]))
                    })
                };
                let blockers = || {
                    let mut v: Vec<usize> = (0..2)
                        .flat_map(|t| {
                            let waits_children = red[t] < slices;
                            let kids = waits_for[t].into_iter().flatten();
                            kids.filter(move |_| waits_children)
                                .chain(trees[t].parent.filter(|_| bc[t] < slices))
                        })
                        .collect();
                    v.sort_unstable();
                    v.dedup();
                    v
                };
                ctx.wait_until(any_ready, blockers)?;
            }
        }
        Ok(())
    }
}

/// Progress lanes: `REDUCED + t` counts slices of tree `t` reduced over this node's
/// subtree, `FINAL + t` slices of tree `t` final here.
const REDUCED: usize = 0;
const FINAL: usize = 2;

/// The two trees of NCCL's double binary tree (`ncclGetDtree`): tree 0 is [`btree`], tree 1
/// its mirror image for even `n` and its shift by one rank for odd `n`, so that the inner
/// nodes of one tree are leaves of the other (for even `n`).
pub(crate) fn dtree(n: usize, rank: usize) -> [Node; 2] {
    let first = btree(n, rank);
    let map = |v: usize| {
        if n % 2 == 1 {
            (v + 1) % n
        } else {
            n - 1 - v
        }
    };
    let virt = if n % 2 == 1 {
        (rank + n - 1) % n
    } else {
        n - 1 - rank
    };
    let v = btree(n, virt);
    [
        first,
        Node {
            parent: v.parent.map(map),
            children: [v.children[0].map(map), v.children[1].map(map)],
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tree of every size is a tree: one root, every other rank's parent lists it as
    /// a child exactly once, following parents reaches the root, at most two children.
    #[test]
    fn both_trees_are_trees_for_every_size() {
        for n in 1..=64 {
            for t in 0..2 {
                let nodes: Vec<Node> = (0..n).map(|r| dtree(n, r)[t]).collect();
                assert_eq!(nodes.iter().filter(|x| x.parent.is_none()).count(), 1);
                for (r, node) in nodes.iter().enumerate() {
                    for c in node.children.iter().flatten() {
                        assert!(*c < n);
                        assert_eq!(nodes[*c].parent, Some(r), "n={n} t={t} r={r}");
                    }
                    if let Some(p) = node.parent {
                        let listed = nodes[p].children.iter().flatten().filter(|&&c| c == r);
                        assert_eq!(listed.count(), 1, "n={n} t={t} r={r}");
                    }
                    let mut at = r;
                    for _ in 0..n {
                        match nodes[at].parent {
                            Some(p) => at = p,
                            None => break,
                        }
                    }
                    assert!(nodes[at].parent.is_none(), "cycle at n={n} t={t} r={r}");
                }
            }
        }
    }

    #[test]
    fn matches_nccls_picture_for_14_ranks() {
        let b = |r| btree(14, r);
        assert_eq!(b(0).children, [Some(8), None]);
        assert_eq!(b(8).children, [Some(4), Some(12)]);
        assert_eq!(b(12).children, [Some(10), Some(13)]);
        assert_eq!(b(13).parent, Some(12));
        assert_eq!(b(5).parent, Some(6));
    }

    #[test]
    fn inner_nodes_of_one_tree_are_leaves_of_the_other_for_even_sizes() {
        for n in (2..=32).step_by(2) {
            for r in 0..n {
                let [a, b] = dtree(n, r);
                let inner = |x: &Node| x.children.iter().any(Option::is_some) && x.parent.is_some();
                assert!(!(inner(&a) && inner(&b)), "n={n} r={r}");
            }
        }
    }
}
