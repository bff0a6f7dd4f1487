//! `cuda-ring`: the ring of [`plan`](super::plan) run on CUDA devices without NCCL.
//!
//! Every rank has [`LANES`] streams of its own on its device. A launch makes each of them
//! wait for every rank's readiness event (the work queued on the rank's buffers before the
//! collective), then turns each step of the plan into one operation on its rank's lane:
//! a copy (`cuMemcpyDtoDAsync` on one device, `cuMemcpyPeerAsync` between two) or
//! mirra's reduction kernel (`reduce_into_<dtype>`, `divide_<dtype>` for the mean), whose
//! source is read in place when the rank's device can reach it (the same device, or peer
//! access enabled) and staged into the rank's memory by a peer copy otherwise. Each
//! dependency of the plan is an event recorded after the step waited for and waited for
//! by the stream of the step that waits. Last, every lane of every rank is joined into
//! every rank's completion event, so that no rank's `Work` completes while another rank's
//! stream may still read its buffers or scratch.
//!
//! Never run on more than one GPU (peer access and staged copies are written for two or
//! more devices and are untested); on one GPU all ranks share its memory.

use std::sync::{Arc, Mutex};

use mirra_cuda::cudarc::driver::sys::CUevent_flags;
use mirra_cuda::cudarc::driver::{result, sys, CudaEvent, CudaStream, DriverError};
use mirra_cuda::events::Event;
use mirra_cuda::kernels::ReduceKernel;
use mirra_cuda::launch;
use mirra_cuda::runtime::{runtime, DeviceBuffer, Runtime};
use mirra_device::DType;

use super::group::{ready_on, Engine, Ready};
use super::plan::{plan, Action, Buf, Plan, Region, Shape, LANES};
use crate::collective::Collective;
use crate::comm::Completion;
use crate::config::Config;
use crate::error::{CollectiveError, Result};
use crate::reduce::ReduceOp;
use crate::transport::{Desc, Place};
use crate::verdict::Accepts;

/// The backend's name.
pub(crate) const NAME: &str = "cuda-ring";

/// One rank's device and streams.
struct RankStreams {
    rt: Arc<Runtime>,
    lanes: Vec<Arc<CudaStream>>,
    /// Events for the plan's dependencies, reused from launch to launch (a stream's wait
    /// takes the event's state when it is queued, so an event may be recorded again once
    /// every wait on it is queued: at the end of each launch).
    events: Mutex<Vec<CudaEvent>>,
}

/// The CUDA ring over its ranks' devices.
pub(crate) struct CudaRing {
    ranks: Vec<RankStreams>,
    /// `reach[a][b]`: rank `a`'s kernels can read rank `b`'s memory (the same device, or
    /// peer access enabled between the two).
    reach: Vec<Vec<bool>>,
}

fn driver(op: &'static str) -> impl Fn(DriverError) -> String {
    move |e| format!("{op}: {e}")
}

impl CudaRing {
    /// Streams on each rank's device (`ordinals[r]`), and peer access enabled between every
    /// two devices whose topology allows it.
    pub(crate) fn new(ordinals: &[usize]) -> mirra_cuda::Result<CudaRing> {
        let mut ranks = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let rt = runtime(o)?;
            let lanes = (0..LANES)
                .map(|_| rt.new_stream())
                .collect::<mirra_cuda::Result<_>>()?;
            ranks.push(RankStreams {
                rt,
                lanes,
                events: Mutex::new(Vec::new()),
            });
        }
        let n = ordinals.len();
        let mut reach = vec![vec![false; n]; n];
        for a in 0..n {
            for b in 0..n {
                reach[a][b] = ordinals[a] == ordinals[b]
                    || enable_peer_access(&ranks[a].rt, &ranks[b].rt).unwrap_or(false);
            }
        }
        Ok(CudaRing { ranks, reach })
    }
}

/// Let `reader`'s device access `owner`'s memory if the topology allows it; whether it can.
fn enable_peer_access(reader: &Runtime, owner: &Runtime) -> std::result::Result<bool, DriverError> {
    let mut can = 0;
    // SAFETY: both devices exist (their runtimes were made); `can` is written by the call.
    unsafe {
        sys::cuDeviceCanAccessPeer(
            &mut can,
            reader.context().cu_device(),
            owner.context().cu_device(),
        )
    }
    .result()?;
    if can == 0 {
        return Ok(false);
    }
    reader.context().bind_to_thread()?;
    // SAFETY: the owner's context is alive (its runtime holds it); enabling twice reports
    // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, which is success here.
    match unsafe { sys::cuCtxEnablePeerAccess(owner.context().cu_ctx(), 0) } {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(true)
        }
        other => Err(DriverError(other)),
    }
}

/// A rank's completion: its event, and the memory the collective used beyond the ranks'
/// buffers (freed once the event is complete, when no stream uses it any more).
struct Done {
    event: Event,
    _scratch: Vec<DeviceBuffer>,
}

impl Completion for Done {
    fn poll(&self, op: Collective, rank: usize) -> Result<bool> {
        self.event.poll(op, rank)
    }

    fn expire(&self, op: Collective, rank: usize, after: std::time::Duration) -> CollectiveError {
        self.event.expire(op, rank, after)
    }
}

impl Engine for CudaRing {
    fn name(&self) -> &'static str {
        NAME
    }

    fn accepts(&self, rank: usize) -> Accepts {
        Accepts(Place::Cuda(self.ranks[rank].rt.ordinal()))
    }

    fn ready(&self, rank: usize) -> std::result::Result<Ready, String> {
        ready_on(&self.ranks[rank].rt)
    }

    fn launch(
        &self,
        descs: &[Desc],
        ready: Vec<Ready>,
        config: &Config,
    ) -> std::result::Result<Vec<Box<dyn Completion>>, (usize, String)> {
        let d = descs[0];
        let elem = d.dtype_in.size_in_bytes();
        let plan = plan(&Shape {
            kind: d.kind,
            op: d.op,
            root: d.root,
            n: descs.len(),
            len_in: d.len_in,
            len_out: d.len_out,
            slice_elems: (config.slice_bytes / elem).max(1),
        });
        Launch {
            ring: self,
            descs,
            plan: &plan,
            dtype: d.dtype_in,
            op: d.op,
        }
        .run(&ready)
    }
}

/// One collective being queued.
struct Launch<'a> {
    ring: &'a CudaRing,
    descs: &'a [Desc],
    plan: &'a Plan,
    dtype: DType,
    op: ReduceOp,
}

type Failure = (usize, String);

impl Launch<'_> {
    fn run(&self, ready: &[Ready]) -> std::result::Result<Vec<Box<dyn Completion>>, Failure> {
        let ring = self.ring;
        let n = self.descs.len();
        let elem = self.dtype.size_in_bytes();
        // Every lane starts after every rank's readiness: each lane reads other ranks'
        // buffers.
        for (r, rs) in ring.ranks.iter().enumerate() {
            for lane in &rs.lanes {
                for ev in ready.iter().flatten() {
                    ev.make_wait(lane).map_err(|e| (r, e.to_string()))?;
                }
            }
        }
        let mut scratch: Vec<Vec<DeviceBuffer>> = (0..n).map(|_| Vec::new()).collect();
        let mut scratch_at = vec![0u64; n];
        for r in 0..n {
            if self.plan.scratch[r] > 0 {
                let b = ring.ranks[r]
                    .rt
                    .alloc(self.plan.scratch[r] * elem)
                    .map_err(|e| (r, e.to_string()))?;
                scratch_at[r] = b.ptr();
                scratch[r].push(b);
            }
        }
        // Staging for reductions whose source the rank cannot read in place: one buffer
        // per rank and lane, as long as the longest such source.
        let mut staging = vec![[0u64; LANES]; n];
        for r in 0..n {
            let longest = self
                .plan
                .steps
                .iter()
                .filter(|s| s.rank == r)
                .filter_map(|s| match &s.action {
                    Action::Reduce { src, .. } if !ring.reach[r][owner(src.buf)] => {
                        Some(src.range.len())
                    }
                    _ => None,
                })
                .max();
            if let Some(len) = longest {
                for slot in &mut staging[r] {
                    let b = ring.ranks[r]
                        .rt
                        .alloc(len * elem)
                        .map_err(|e| (r, e.to_string()))?;
                    *slot = b.ptr();
                    scratch[r].push(b);
                }
            }
        }
        // Scratch comes from the runtime's allocator, whose cached blocks are reused in the
        // order of the runtime's stream: the lanes start after the work queued there up to
        // now (only when there is scratch: an all-reduce on one device has none, and its
        // lanes start right after the buffers were ready, overlapping what follows).
        for (r, rs) in ring.ranks.iter().enumerate() {
            if scratch[r].is_empty() {
                continue;
            }
            let allocated = rs.rt.record_event(false).map_err(|e| (r, e.to_string()))?;
            for other in &ring.ranks {
                for lane in &other.lanes {
                    allocated.make_wait(lane).map_err(|e| (r, e.to_string()))?;
                }
            }
        }
        let base = |buf: Buf| -> u64 {
            match buf {
                Buf::In(r) => self.descs[r].src as usize as u64,
                Buf::Out(r) => self.descs[r].dst as usize as u64,
                Buf::Scratch(r) => scratch_at[r],
            }
        };
        let at = |region: &Region| base(region.buf) + (region.range.start * elem) as u64;
        let mut waited_for = vec![false; self.plan.steps.len()];
        for s in &self.plan.steps {
            for &d in &s.after {
                waited_for[d] = true;
            }
        }
        let mut pools: Vec<Vec<CudaEvent>> = ring
            .ranks
            .iter()
            .map(|rs| std::mem::take(&mut *mirra_device::sync::lock(&rs.events)))
            .collect();
        let mut used: Vec<usize> = vec![0; n];
        let mut step_event: Vec<Option<(usize, usize)>> = vec![None; self.plan.steps.len()];
        let result = (|| -> std::result::Result<(), Failure> {
            for (i, s) in self.plan.steps.iter().enumerate() {
                let r = s.rank;
                let rs = &ring.ranks[r];
                let stream = &rs.lanes[s.lane];
                let fail = |e: String| (r, e);
                for &d in &s.after {
                    let (er, k) = step_event[d].expect("recorded after the step it follows");
                    stream
                        .wait(&pools[er][k])
                        .map_err(|e| fail(driver("cuStreamWaitEvent")(e)))?;
                }
                rs.rt
                    .context()
                    .bind_to_thread()
                    .map_err(|e| fail(driver("cuCtxSetCurrent")(e)))?;
                self.enqueue(s.rank, stream, &s.action, &at, staging[r][s.lane])
                    .map_err(fail)?;
                if waited_for[i] {
                    if used[r] == pools[r].len() {
                        let ev = rs
                            .rt
                            .context()
                            .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                            .map_err(|e| fail(driver("cuEventCreate")(e)))?;
                        pools[r].push(ev);
                    }
                    pools[r][used[r]]
                        .record(stream)
                        .map_err(|e| fail(driver("cuEventRecord")(e)))?;
                    step_event[i] = Some((r, used[r]));
                    used[r] += 1;
                }
            }
            Ok(())
        })();
        for (rs, pool) in ring.ranks.iter().zip(pools) {
            *mirra_device::sync::lock(&rs.events) = pool;
        }
        if let Err(e) = result {
            // Part of the collective is queued: let it run out before the error lets the
            // callers free the buffers (whatever it computed is not used).
            for rs in &ring.ranks {
                for lane in &rs.lanes {
                    let _ = lane.synchronize();
                }
            }
            return Err(e);
        }
        // The join: every rank's completion follows every lane of every rank.
        let mut ends = Vec::with_capacity(n * LANES);
        for (r, rs) in ring.ranks.iter().enumerate() {
            for lane in &rs.lanes {
                ends.push(Event::record(lane, false).map_err(|e| (r, e.to_string()))?);
            }
        }
        let mut done: Vec<Box<dyn Completion>> = Vec::with_capacity(n);
        for (r, (rs, keep)) in ring.ranks.iter().zip(scratch).enumerate() {
            let lane = &rs.lanes[0];
            for e in &ends {
                e.make_wait(lane).map_err(|e| (r, e.to_string()))?;
            }
            let event = Event::record(lane, false).map_err(|e| (r, e.to_string()))?;
            done.push(Box::new(Done {
                event,
                _scratch: keep,
            }));
        }
        Ok(done)
    }

    /// Queue one step's action on `stream` of rank `rank`.
    fn enqueue(
        &self,
        rank: usize,
        stream: &CudaStream,
        action: &Action,
        at: &dyn Fn(&Region) -> u64,
        staging: u64,
    ) -> std::result::Result<(), String> {
        let ring = self.ring;
        let elem = self.dtype.size_in_bytes();
        let rt = &ring.ranks[rank].rt;
        let sfx = self.dtype.as_str();
        let copy = |dst: u64, dst_rank: usize, src: u64, src_rank: usize, bytes: usize| {
            let (dr, sr) = (&ring.ranks[dst_rank].rt, &ring.ranks[src_rank].rt);
            // SAFETY: both ranges lie inside buffers that stay allocated until the
            // collective's completion (the ranks' borrowed buffers, the scratch kept in
            // `Done`); the stream orders the copy after what wrote the source.
            unsafe {
                if dr.ordinal() == sr.ordinal() {
                    result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream())
                        .map_err(driver("cuMemcpyDtoDAsync"))
                } else {
                    result::memcpy_peer_async(
                        dr.context().cu_ctx(),
                        dst,
                        sr.context().cu_ctx(),
                        src,
                        bytes,
                        stream.cu_stream(),
                    )
                    .map_err(driver("cuMemcpyPeerAsync"))
                }
            }
        };
        match action {
            Action::Copy { dst, src } => copy(
                at(dst),
                owner(dst.buf),
                at(src),
                owner(src.buf),
                dst.range.len() * elem,
            ),
            Action::Reduce { dst, src } => {
                let len = dst.range.len();
                let mut from = at(src);
                if !ring.reach[rank][owner(src.buf)] {
                    copy(staging, rank, from, owner(src.buf), len * elem)?;
                    from = staging;
                }
                let (code, to, n) = (kernel_op(self.op) as i32, at(dst), len as u64);
                launch!(rt, on stream, format!("reduce_into_{sfx}"), len, |l| {
                    l.arg(&code).arg(&to).arg(&from).arg(&n);
                })
                .map_err(|e| e.to_string())
            }
            Action::Divide { dst } => {
                let len = dst.range.len();
                let (x, n, count) = (at(dst), len as u64, self.descs.len() as u64);
                launch!(rt, on stream, format!("divide_{sfx}"), len, |l| {
                    l.arg(&x).arg(&n).arg(&count);
                })
                .map_err(|e| e.to_string())
            }
        }
    }
}

/// The op code of `reduce_into_<dtype>` (the mean adds; `divide_<dtype>` divides once).
fn kernel_op(op: ReduceOp) -> ReduceKernel {
    match op {
        ReduceOp::Sum => ReduceKernel::Sum,
        ReduceOp::Mean => ReduceKernel::Mean,
        ReduceOp::Max => ReduceKernel::Max,
        ReduceOp::Min => ReduceKernel::Min,
        ReduceOp::Product => ReduceKernel::Product,
    }
}

/// The rank whose memory `buf` is.
fn owner(buf: Buf) -> usize {
    match buf {
        Buf::In(r) | Buf::Out(r) | Buf::Scratch(r) => r,
    }
}
