//! The device ring's schedules as data: a [`Plan`] lists, for every rank, the copies and
//! reductions of one collective and which earlier step each must wait for. The CUDA
//! executor (`cuda_ring`) turns each step into a copy or a kernel on the step's stream and
//! each dependency into an event; the test executor (`host_engine`) runs the same plan on
//! host memory in a random order that respects exactly those dependencies, so a missing
//! one gives wrong results there, not only on a GPU.
//!
//! Schedules are NCCL's ring: the buffer is cut into one chunk per rank and each chunk
//! into slices (the pipelining unit); a reduce-scatter phase of `n - 1` steps, in which
//! every rank reduces its predecessor's partial sum of one chunk into its own, leaves each
//! rank with one fully reduced chunk; an all-gather phase of `n - 1` steps passes those
//! chunks on around the ring. A slice's chain of steps alternates between the rank's
//! [`LANES`] streams by slice, so consecutive slices run concurrently.
//!
//! Dependencies are not written by hand: every step names the regions it reads and
//! writes, and [`Builder`] adds a dependency on the last writer of everything a step
//! reads or writes (read after write, write after write) and on every reader since of
//! what it writes (write after read), except where stream order already gives it (the
//! same rank and lane). Regions are (buffer, element range) pairs that are either equal or
//! disjoint, because every schedule cuts buffers by the same chunks and slices.

use std::collections::HashMap;
use std::ops::Range;

use crate::algo::slicing::{chunk, slice};
use crate::collective::Collective;
use crate::reduce::ReduceOp;

/// Streams per rank that a plan spreads its slices over.
pub(crate) const LANES: usize = 2;
/// Most slices one chunk is cut into (each slice is one copy or kernel per step: more
/// slices pipeline better and cost more launches).
pub(crate) const MAX_SLICES_PER_CHUNK: usize = 8;

/// A buffer a step touches: a rank's input or output (the same memory for in-place
/// collectives, which name it [`Buf::Out`]), or the rank's scratch buffer, which the
/// executor allocates with [`Plan::scratch`] elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Buf {
    In(usize),
    Out(usize),
    Scratch(usize),
}

/// Elements `range` of `buf`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Region {
    pub buf: Buf,
    pub range: Range<usize>,
}

/// What a step does (lengths in elements, of the collective's dtype).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// `dst = src`.
    Copy { dst: Region, src: Region },
    /// `dst = op(dst, src)`, element by element.
    Reduce { dst: Region, src: Region },
    /// `dst /= world size` (the mean's last step, once per element).
    Divide { dst: Region },
}

impl Action {
    fn reads(&self) -> Vec<&Region> {
        match self {
            Action::Copy { src, .. } => vec![src],
            Action::Reduce { dst, src } => vec![dst, src],
            Action::Divide { dst } => vec![dst],
        }
    }

    fn writes(&self) -> &Region {
        match self {
            Action::Copy { dst, .. } | Action::Reduce { dst, .. } | Action::Divide { dst } => dst,
        }
    }
}

/// One step: `action` on stream `lane` of `rank`, after the steps `after` (indices into
/// [`Plan::steps`], always earlier ones, on other streams).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub rank: usize,
    pub lane: usize,
    pub action: Action,
    pub after: Vec<usize>,
}

/// One collective's steps for every rank, in an order in which every step comes after
/// the steps it waits for (the order an executor enqueues them in).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub steps: Vec<Step>,
    /// Elements of scratch each rank needs.
    pub scratch: Vec<usize>,
}

/// Accumulates steps and derives their dependencies from the regions they touch.
struct Builder {
    plan: Plan,
    /// The last step that wrote each region.
    writer: HashMap<Region, usize>,
    /// The steps that read each region since its last write.
    readers: HashMap<Region, Vec<usize>>,
}

impl Builder {
    fn new(n: usize) -> Builder {
        Builder {
            plan: Plan {
                steps: Vec::new(),
                scratch: vec![0; n],
            },
            writer: HashMap::new(),
            readers: HashMap::new(),
        }
    }

    fn push(&mut self, rank: usize, lane: usize, action: Action) {
        let me = self.plan.steps.len();
        let mut after: Vec<usize> = Vec::new();
        let written = action.writes().clone();
        for region in action.reads().into_iter().chain([&written]) {
            after.extend(self.writer.get(region));
        }
        after.extend(self.readers.get(&written).into_iter().flatten());
        let steps = &self.plan.steps;
        after.retain(|&s| (steps[s].rank, steps[s].lane) != (rank, lane));
        after.sort_unstable();
        after.dedup();
        #[cfg(test)]
        if crate::mutants::active() == Some(crate::mutants::Mutant::MissingWait) {
            after.clear();
        }
        for region in action.reads() {
            if *region != written {
                self.readers.entry(region.clone()).or_default().push(me);
            }
        }
        self.readers.remove(&written);
        self.writer.insert(written, me);
        self.plan.steps.push(Step {
            rank,
            lane,
            action,
            after,
        });
    }
}

impl Builder {
    /// One step of `rank` per non-empty slice of `slices`, slice `j` on lane `j % LANES`.
    fn per_slice(
        &mut self,
        rank: usize,
        slices: &[Range<usize>],
        action: impl Fn(&Range<usize>) -> Action,
    ) {
        for (j, x) in slices.iter().enumerate() {
            if !x.is_empty() {
                self.push(rank, j % LANES, action(x));
            }
        }
    }
}

/// `range` shifted to start at 0 relative to `base`.
fn relative(range: &Range<usize>, base: &Range<usize>) -> Range<usize> {
    range.start - base.start..range.end - base.start
}

/// Chunk `c` of a buffer of `len` elements cut `n` ways, and its slices.
fn slices(len: usize, n: usize, c: usize, slice_elems: usize) -> Vec<Range<usize>> {
    let range = chunk(len, n, c);
    let per = range
        .len()
        .div_ceil(MAX_SLICES_PER_CHUNK)
        .max(slice_elems)
        .max(1);
    let count = range.len().div_ceil(per).max(1);
    (0..count).map(|j| slice(&range, per, j)).collect()
}

/// The ring over buffer `at(rank)` of `len` elements (the same layout on every rank):
/// `reduce_steps` steps of reduce-scatter, then `gather_steps` steps of all-gather. After
/// the reduce-scatter, rank `r` holds the reduction of chunk `(r + 1 + shift) mod n`; the
/// all-gather starts from that chunk too. With `divide`, each owner divides its chunk
/// between the phases.
struct Ring<'a> {
    n: usize,
    len: usize,
    shift: usize,
    slice_elems: usize,
    at: &'a dyn Fn(usize) -> Buf,
}

impl Ring<'_> {
    fn region(&self, rank: usize, range: &Range<usize>) -> Region {
        Region {
            buf: (self.at)(rank),
            range: range.clone(),
        }
    }

    /// Step `t` of a phase: every rank `q` takes chunk `(p + shift - t) mod n` (plus one in
    /// the all-gather, whose chunks the reduce-scatter left one ahead) from `p = q - 1`.
    fn phase(&self, b: &mut Builder, gather: bool) {
        let n = self.n;
        for t in 0..n - 1 {
            for q in 0..n {
                let p = (q + n - 1) % n;
                let c = (p + self.shift + n - t + usize::from(gather)) % n;
                let cut = slices(self.len, n, c, self.slice_elems);
                b.per_slice(q, &cut, |s| {
                    let (dst, src) = (self.region(q, s), self.region(p, s));
                    if gather {
                        Action::Copy { dst, src }
                    } else {
                        Action::Reduce { dst, src }
                    }
                });
            }
        }
    }

    /// Each rank divides the chunk it owns after the reduce-scatter.
    fn divide(&self, b: &mut Builder) {
        let n = self.n;
        for r in 0..n {
            let c = (r + 1 + self.shift) % n;
            let cut = slices(self.len, n, c, self.slice_elems);
            b.per_slice(r, &cut, |s| Action::Divide {
                dst: self.region(r, s),
            });
        }
    }
}

/// Copies `src(r)` into `dst(r)`, chunk by chunk and slice by slice (the ring's cut of a
/// buffer of `len` elements), on every rank in `ranks`.
fn copy_all(
    b: &mut Builder,
    ranks: &[usize],
    cut: (usize, usize, usize),
    src: impl Fn(usize, &Range<usize>) -> Region,
    dst: impl Fn(usize, &Range<usize>) -> Region,
) {
    let (len, n, slice_elems) = cut;
    for &r in ranks {
        for c in 0..n {
            b.per_slice(r, &slices(len, n, c, slice_elems), |s| Action::Copy {
                dst: dst(r, s),
                src: src(r, s),
            });
        }
    }
}

/// What a plan is made for: the collective, its operator and root, the world size and
/// the element counts of every rank (the verdict made them agree), the pipelining unit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub kind: Collective,
    pub op: ReduceOp,
    pub root: usize,
    pub n: usize,
    /// Elements of the input (the whole buffer for in-place collectives).
    pub len_in: usize,
    /// Elements of the output.
    pub len_out: usize,
    pub slice_elems: usize,
}

/// The plan of one collective (see the module documentation).
pub(crate) fn plan(s: &Shape) -> Plan {
    let n = s.n;
    let mut b = Builder::new(n);
    let divide = s.op == ReduceOp::Mean && n > 1;
    let all: Vec<usize> = (0..n).collect();
    let region = |buf: Buf, range: &Range<usize>| Region {
        buf,
        range: range.clone(),
    };
    match s.kind {
        Collective::Barrier => {}
        _ if s.len_in == 0 && s.len_out == 0 => {}
        Collective::AllReduce if n > 1 => {
            let ring = Ring {
                n,
                len: s.len_out,
                shift: 0,
                slice_elems: s.slice_elems,
                at: &Buf::Out,
            };
            ring.phase(&mut b, false);
            if divide {
                ring.divide(&mut b);
            }
            ring.phase(&mut b, true);
        }
        Collective::ReduceScatter => {
            // In a scratch copy of the input: rank r ends with chunk r (shift n - 1), which
            // it copies out.
            let len = s.len_in;
            b.plan.scratch = vec![len; n];
            copy_all(
                &mut b,
                &all,
                (len, n, s.slice_elems),
                |r, x| region(Buf::In(r), x),
                |r, x| region(Buf::Scratch(r), x),
            );
            let ring = Ring {
                n,
                len,
                shift: n - 1,
                slice_elems: s.slice_elems,
                at: &Buf::Scratch,
            };
            if n > 1 {
                ring.phase(&mut b, false);
                if divide {
                    ring.divide(&mut b);
                }
            }
            for r in 0..n {
                let own = chunk(len, n, r);
                b.per_slice(r, &slices(len, n, r, s.slice_elems), |x| Action::Copy {
                    dst: region(Buf::Out(r), &relative(x, &own)),
                    src: region(Buf::Scratch(r), x),
                });
            }
        }
        Collective::AllGather => {
            // Each rank's input into its chunk of its output, then the ring's all-gather
            // phase (shift n - 1: rank r starts from chunk r).
            let len = s.len_out;
            for r in 0..n {
                let own = chunk(len, n, r);
                b.per_slice(r, &slices(len, n, r, s.slice_elems), |x| Action::Copy {
                    dst: region(Buf::Out(r), x),
                    src: region(Buf::In(r), &relative(x, &own)),
                });
            }
            if n > 1 {
                Ring {
                    n,
                    len,
                    shift: n - 1,
                    slice_elems: s.slice_elems,
                    at: &Buf::Out,
                }
                .phase(&mut b, true);
            }
        }
        Collective::Broadcast => {
            // A chain from the root around the ring, slice by slice.
            let cut = (s.len_out, 1, s.slice_elems);
            for d in 1..n {
                let (p, q) = ((s.root + d - 1) % n, (s.root + d) % n);
                copy_all(
                    &mut b,
                    &[q],
                    cut,
                    |_, x| region(Buf::Out(p), x),
                    |_, x| region(Buf::Out(q), x),
                );
            }
        }
        Collective::Reduce => {
            // A chain that ends at the root: the rank after the root copies its buffer
            // into its scratch, each next rank reduces its own buffer into a scratch copy
            // of it (inputs stay as they were), and the root reduces the last scratch into
            // its own buffer.
            let len = s.len_out;
            let cut = (len, 1, s.slice_elems);
            let mut prev: Option<usize> = None;
            for d in 1..n {
                let q = (s.root + d) % n;
                b.plan.scratch[q] = len;
                copy_all(
                    &mut b,
                    &[q],
                    cut,
                    |r, x| region(Buf::Out(r), x),
                    |r, x| region(Buf::Scratch(r), x),
                );
                if let Some(p) = prev {
                    reduce_from(&mut b, q, cut, Buf::Scratch(q), Buf::Scratch(p));
                }
                prev = Some(q);
            }
            if let Some(p) = prev {
                reduce_from(&mut b, s.root, cut, Buf::Out(s.root), Buf::Scratch(p));
                if divide {
                    let root = s.root;
                    b.per_slice(root, &slices(len, 1, 0, s.slice_elems), |x| {
                        Action::Divide {
                            dst: region(Buf::Out(root), x),
                        }
                    });
                }
            }
        }
        // One rank: nothing moves.
        Collective::AllReduce => {}
    }
    b.plan
}

/// `dst = op(dst, src)` on `rank`, slice by slice.
fn reduce_from(b: &mut Builder, rank: usize, cut: (usize, usize, usize), dst: Buf, src: Buf) {
    let (len, n, slice_elems) = cut;
    let region = |buf: Buf, x: &Range<usize>| Region {
        buf,
        range: x.clone(),
    };
    b.per_slice(rank, &slices(len, n, 0, slice_elems), |x| Action::Reduce {
        dst: region(dst, x),
        src: region(src, x),
    });
}

/// Bytes a plan moves on each rank's device memory (reads plus writes), for `elem`-byte
/// elements: a copy reads and writes its length, a reduction reads two and writes one, a
/// division reads and writes one. The traffic bound of `bench-collectives --device cuda`.
pub(crate) fn traffic_bytes(plan: &Plan, n: usize, elem: usize) -> Vec<usize> {
    let mut bytes = vec![0; n];
    for s in &plan.steps {
        let (len, factor) = match &s.action {
            Action::Copy { dst, .. } => (dst.range.len(), 2),
            Action::Reduce { dst, .. } => (dst.range.len(), 3),
            Action::Divide { dst } => (dst.range.len(), 2),
        };
        bytes[s.rank] += len * factor * elem;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(kind: Collective, n: usize, len: usize) -> Shape {
        let (len_in, len_out) = match kind {
            Collective::ReduceScatter => (n * len, len),
            Collective::AllGather => (len, n * len),
            _ => (len, len),
        };
        Shape {
            kind,
            op: ReduceOp::Sum,
            root: 0,
            n,
            len_in,
            len_out,
            slice_elems: 1,
        }
    }

    #[test]
    fn every_dependency_points_back_to_another_stream() {
        for kind in Collective::ALL {
            for n in 1..=8 {
                let p = plan(&shape(kind, n, 100));
                for (i, s) in p.steps.iter().enumerate() {
                    assert!(s.lane < LANES && s.rank < n);
                    for &d in &s.after {
                        assert!(d < i, "{kind} n={n}: step {i} waits for later step {d}");
                        let o = &p.steps[d];
                        assert_ne!((o.rank, o.lane), (s.rank, s.lane));
                    }
                }
            }
        }
    }

    #[test]
    fn the_ring_all_reduce_moves_what_nccl_s_does() {
        // Per rank: n - 1 reductions (read 2, write 1) and n - 1 copies (read 1, write 1) of
        // len / n elements: 5 (n - 1) / n x len elements of traffic.
        for n in [2, 4, 8] {
            let len = 8 * 1024;
            let p = plan(&shape(Collective::AllReduce, n, len));
            let want = 5 * (n - 1) * (len / n) * 4;
            assert_eq!(traffic_bytes(&p, n, 4), vec![want; n], "n={n}");
            // Slices alternate between the lanes.
            assert!(p.steps.iter().any(|s| s.lane == 1));
        }
    }

    #[test]
    fn slices_are_capped_per_chunk() {
        let s = slices(1 << 20, 4, 1, 1);
        assert_eq!(s.len(), MAX_SLICES_PER_CHUNK);
        assert_eq!(s[0].start, 1 << 18);
        assert_eq!(s.last().unwrap().end, 2 << 18);
        assert_eq!(slices(10, 4, 0, 64), vec![0..2]);
        assert_eq!(slices(2, 4, 0, 64), vec![0..0]);
    }
}
