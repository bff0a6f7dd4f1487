//! The device ring's plans run on host memory (test builds only): the conformance suite's
//! way to check the CUDA ring's schedules, its verdict and its failure model on a machine
//! without a GPU.
//!
//! Each collective's [`Plan`] runs inside `launch`, one step at a time, in a random order
//! that keeps exactly what the CUDA executor would keep: each stream's steps in order, and
//! each step after the steps it waits for. A schedule that leaves out a dependency
//! therefore computes wrong results here for some order (the `MissingWait` mutant shows
//! it), as it could on a GPU.

use std::sync::atomic::{AtomicU64, Ordering};

use super::group::{Engine, Ready};
use super::plan::{plan, Action, Buf, Plan, Region, Shape, LANES};
use crate::collective::Collective;
use crate::comm::Completion;
use crate::config::Config;
use crate::error::Result;
use crate::reduce::{combine_op, with_dtype, ReduceOp, Reducible};
use crate::transport::{Desc, Place};
use crate::verdict::Accepts;

/// The backend name the suite reports for this engine.
pub(crate) const NAME: &str = "cuda-ring@host";

/// Runs plans on host buffers (see the module documentation). `in_order`: in plan order
/// instead (the ablation under which a missing dependency goes unseen).
pub(crate) struct HostEngine {
    pub in_order: bool,
}

/// Seeds the step order of each launch differently.
static LAUNCHES: AtomicU64 = AtomicU64::new(0x5eed);

/// A completed collective.
struct Finished;

impl Completion for Finished {
    fn poll(&self, _: Collective, _: usize) -> Result<bool> {
        Ok(true)
    }
}

impl Engine for HostEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn accepts(&self, _: usize) -> Accepts {
        Accepts(Place::Cpu)
    }

    fn ready(&self, _: usize) -> std::result::Result<Ready, String> {
        Ok(None)
    }

    fn launch(
        &self,
        descs: &[Desc],
        _: Vec<Ready>,
        config: &Config,
    ) -> std::result::Result<Vec<Box<dyn Completion>>, (usize, String)> {
        let d = descs[0];
        let n = descs.len();
        let shape = Shape {
            kind: d.kind,
            op: d.op,
            root: d.root,
            n,
            len_in: d.len_in,
            len_out: d.len_out,
            slice_elems: (config.slice_bytes / d.dtype_in.size_in_bytes()).max(1),
        };
        let plan = plan(&shape);
        let seed = LAUNCHES.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        with_dtype!(d.dtype_in, T => run::<T>(&plan, descs, d.op, seed, self.in_order));
        Ok((0..n)
            .map(|_| Box::new(Finished) as Box<dyn Completion>)
            .collect())
    }
}

/// Runs `plan` over the posted host buffers `descs` and scratch of its own.
fn run<T: Reducible>(plan: &Plan, descs: &[Desc], op: ReduceOp, seed: u64, in_order: bool) {
    let n = descs.len();
    let mut scratch: Vec<Vec<T>> = plan
        .scratch
        .iter()
        .map(|&len| vec![T::default(); len])
        .collect();
    let base = |buf: Buf, scratch: &mut Vec<Vec<T>>| -> *mut T {
        match buf {
            Buf::In(r) => descs[r].src.cast_mut().cast(),
            Buf::Out(r) => descs[r].dst.cast(),
            Buf::Scratch(r) => scratch[r].as_mut_ptr(),
        }
    };
    // Each stream's steps, in order.
    let mut lanes: Vec<std::collections::VecDeque<usize>> = vec![Default::default(); n * LANES];
    for (i, s) in plan.steps.iter().enumerate() {
        lanes[s.rank * LANES + s.lane].push_back(i);
    }
    let mut done = vec![false; plan.steps.len()];
    let mut rng = seed | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for _ in 0..plan.steps.len() {
        let ready: Vec<usize> = lanes
            .iter()
            .filter_map(|l| l.front().copied())
            .filter(|&i| plan.steps[i].after.iter().all(|&d| done[d]))
            .collect();
        let i = if in_order {
            *ready.iter().min().expect("a plan always has a ready step")
        } else {
            ready[(next() % ready.len() as u64) as usize]
        };
        let step = &plan.steps[i];
        lanes[step.rank * LANES + step.lane].pop_front();
        let slice = |r: &Region, scratch: &mut Vec<Vec<T>>| {
            // SAFETY: regions lie inside their buffers (the verdict checked the lengths
            // the plan was made for), the posted buffers stay borrowed until this launch
            // returns, and steps run one at a time: no other reference exists meanwhile.
            unsafe { base(r.buf, scratch).add(r.range.start) }
        };
        match &step.action {
            Action::Copy { dst, src } => {
                let (d, s) = (slice(dst, &mut scratch), slice(src, &mut scratch));
                // SAFETY: as above; `copy` allows overlap.
                unsafe { std::ptr::copy(s, d, dst.range.len()) };
            }
            Action::Reduce { dst, src } => {
                let (d, s) = (slice(dst, &mut scratch), slice(src, &mut scratch));
                let len = dst.range.len();
                // SAFETY: as above; a reduction's destination and source are different
                // buffers (different ranks', or a rank's buffer and its scratch).
                let (d, s) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(d, len),
                        std::slice::from_raw_parts(s, len),
                    )
                };
                combine_op(op, d, true, &[s], false, n);
            }
            Action::Divide { dst } => {
                let d = slice(dst, &mut scratch);
                // SAFETY: as above.
                let d = unsafe { std::slice::from_raw_parts_mut(d, dst.range.len()) };
                combine_op(ReduceOp::Mean, d, true, &[], true, n);
            }
        }
        done[i] = true;
    }
}
