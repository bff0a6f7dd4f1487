//! Collectives on device buffers: ranks are threads of one process, each with its buffers
//! on a CUDA device (several ranks may share one device, which is how a one-GPU machine
//! tests a ring).
//!
//! Layers, bottom up: [`plan`] (the ring's schedules as data: steps, streams and the
//! dependencies between them), [`group`] (the rendezvous, verdict, ordering and failure
//! model every device backend shares, over an `Engine`), then the engines: `cuda_ring`
//! (plans run with CUDA copies, mirra's reduction kernel and events), `nccl` (NCCL's ring
//! and tree) and, in tests, `host_engine` (plans run on host memory in random dependency
//! order); this module's [`device_group`] on top.

pub(crate) mod cuda_ring;
pub(crate) mod group;
#[cfg(test)]
pub(crate) mod host_engine;
pub(crate) mod nccl;
pub(crate) mod plan;

use mirra_device::Device;

use crate::comm::Communicator;
use crate::config::Config;
use crate::error::{CollectiveError, Result};
use crate::transport::MAX_WORLD_SIZE;

/// The names [`device_group`] accepts.
pub const DEVICE_BACKENDS: &[&str] = &[cuda_ring::NAME, "nccl-ring", "nccl-tree"];

/// Make a group of one communicator per entry of `devices` (rank `r`'s buffers live on
/// `devices[r]`, a CUDA device; one device may serve several ranks of `cuda-ring`, while
/// NCCL wants one GPU per rank), running the device backend named `backend` (one of
/// [`DEVICE_BACKENDS`]). Element `r` is rank `r`: hand each to its own thread.
///
/// `nccl-ring` and `nccl-tree` need `NCCL_ALGO=Ring` or `Tree` in the environment the
/// process started with (see `docs/COLLECTIVES.md`).
///
/// An error names what is wrong: an unknown backend, a world size out of range, a
/// device that is not a CUDA device, or what the CUDA driver refused.
pub fn device_group(
    backend: &str,
    devices: &[Device],
    config: Config,
) -> Result<Vec<Box<dyn Communicator>>> {
    let name = DEVICE_BACKENDS
        .iter()
        .copied()
        .find(|b| *b == backend)
        .ok_or_else(|| CollectiveError::UnknownBackend {
            name: backend.to_string(),
            known: DEVICE_BACKENDS,
        })?;
    let n = devices.len();
    if n == 0 || n > MAX_WORLD_SIZE {
        return Err(CollectiveError::InvalidWorldSize {
            world_size: n,
            max: MAX_WORLD_SIZE,
        });
    }
    let ordinals: Vec<usize> = devices
        .iter()
        .enumerate()
        .map(|(rank, d)| {
            d.cuda_ordinal()
                .ok_or_else(|| CollectiveError::UnsupportedDevice {
                    op: crate::Collective::Barrier,
                    rank,
                    device: d.to_string(),
                    backend: name,
                    accepts: "buffers on CUDA devices only".into(),
                })
        })
        .collect::<Result<_>>()?;
    let failed = |reason: String| CollectiveError::Device {
        op: crate::Collective::Barrier,
        rank: 0,
        reason,
    };
    let engine: Box<dyn group::Engine> = match nccl::ALGORITHMS.iter().find(|(b, _)| *b == name) {
        Some((name, _)) => Box::new(nccl::Nccl::new(name, &ordinals).map_err(failed)?),
        None => Box::new(cuda_ring::CudaRing::new(&ordinals).map_err(|e| failed(e.to_string()))?),
    };
    Ok(group::group(engine, n, config))
}

/// The bytes each rank's device memory reads plus writes in one `cuda-ring` collective of
/// `kind` at `world_size` ranks, over nccl-tests' per-rank `count` of `elem`-byte elements
/// (the receive count of a reduce-scatter, the send count of an all-gather), cut into the
/// default slices: the traffic bound of `cargo xtask bench-collectives --device cuda`.
/// Copies read and write their length, reductions read two and write one.
pub fn cuda_ring_traffic(
    kind: crate::Collective,
    world_size: usize,
    count: usize,
    elem: usize,
) -> Vec<usize> {
    use crate::Collective as C;
    let n = world_size.max(1);
    let (len_in, len_out) = match kind {
        C::ReduceScatter => (n * count, count),
        C::AllGather => (count, n * count),
        _ => (count, count),
    };
    let shape = plan::Shape {
        kind,
        op: crate::ReduceOp::Sum,
        root: 0,
        n,
        len_in,
        len_out,
        slice_elems: (Config::default().slice_bytes / elem.max(1)).max(1),
    };
    plan::traffic_bytes(&plan::plan(&shape), n, elem)
}
