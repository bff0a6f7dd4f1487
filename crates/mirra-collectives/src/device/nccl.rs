//! `nccl-ring` and `nccl-tree`: NCCL through cudarc's raw bindings, one NCCL communicator
//! per rank (`ncclCommInitAll`: ranks are threads of this process, one GPU each).
//!
//! The group's rendezvous and verdict run first (`group`): NCCL checks no arguments
//! across ranks, and a mismatch would hang or corrupt. The rank that posts last then
//! issues every rank's call inside one `ncclGroupStart`/`ncclGroupEnd`, each on its
//! rank's own stream after that rank's readiness event, and records each rank's
//! completion event after it. A completion that is not complete asks NCCL for an
//! asynchronous error (`ncclCommGetAsyncError`); past the deadline the group's
//! communicators are aborted (`ncclCommAbort`), which stops their kernels, so the
//! buffers are free when the timeout is reported.
//!
//! NCCL picks its algorithm from `NCCL_ALGO`, read once per process at its first
//! initialisation, and setting environment variables while threads run is unsound: the
//! algorithm is the launcher's choice (`NCCL_ALGO=Ring` or `Tree` in the environment the
//! process starts with; `mirra train --collective nccl-tree` sets it for its own process
//! before any thread starts). A group whose backend names another algorithm than the
//! environment's is refused with an error that says so.
//!
//! NCCL refuses two ranks on one GPU: on a one-GPU machine only a single-rank group runs.
//! Multi-rank NCCL groups have never run (no machine with two GPUs was lent).

use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use mirra_cuda::cudarc::driver::CudaStream;
use mirra_cuda::cudarc::nccl::{result as nccl, sys};
use mirra_cuda::events::Event;
use mirra_cuda::library::{self, Library};
use mirra_cuda::runtime::{runtime, Runtime};
use mirra_device::sync::lock;
use mirra_device::DType;

use super::group::{ready_on, Engine, Ready};
use crate::collective::Collective;
use crate::comm::Completion;
use crate::config::Config;
use crate::error::{CollectiveError, Result};
use crate::reduce::ReduceOp;
use crate::transport::{Desc, Place};
use crate::verdict::Accepts;

/// The NCCL backends: name and the `NCCL_ALGO` value each needs.
pub(crate) const ALGORITHMS: [(&str, &str); 2] = [("nccl-ring", "Ring"), ("nccl-tree", "Tree")];

/// Whether the process environment pins NCCL to `algo` (NCCL reads `NCCL_ALGO`
/// case-insensitively; a list such as `Tree,Ring` lets NCCL choose, which is refused).
pub(crate) fn check_algorithm(backend: &str, env: Option<&str>) -> std::result::Result<(), String> {
    let want = ALGORITHMS
        .iter()
        .find(|(b, _)| *b == backend)
        .map(|(_, a)| *a)
        .ok_or_else(|| format!("`{backend}` is not an NCCL backend"))?;
    match env {
        Some(v) if v.trim().eq_ignore_ascii_case(want) => Ok(()),
        found => Err(format!(
            "backend `{backend}` needs NCCL_ALGO={want} in the environment the process starts \
             with (NCCL reads it once per process; `mirra train --collective {backend}` sets \
             it before any thread starts), but NCCL_ALGO is {}",
            found.map_or("unset".to_string(), |v| format!("`{v}`"))
        )),
    }
}

fn nccl_error(op: &str, e: nccl::NcclError) -> String {
    // SAFETY: ncclGetErrorString returns a static string for every result code.
    let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    format!("{op}: {} ({:?})", text.to_string_lossy(), e.0)
}

/// One NCCL communicator (a raw handle) of one rank.
pub(crate) struct Comm(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread, one thread at a time: the
// collectives are issued under the group's lock; `ncclCommGetAsyncError` and
// `ncclCommAbort`, which NCCL allows beside a running collective (PyTorch's watchdog thread
// calls them), are serialised among themselves by `Comms::aborted`.
unsafe impl Send for Comm {}
// SAFETY: as above: a shared reference only reads the handle.
unsafe impl Sync for Comm {}

/// The communicators of a group (this process's ranks of it) and whether they were
/// aborted.
pub(crate) struct Comms {
    comms: Vec<Comm>,
    aborted: Mutex<bool>,
}

impl Comms {
    /// Abort every communicator (once): NCCL's kernels stop, its calls return.
    fn abort(&self) {
        let mut aborted = lock(&self.aborted);
        if !*aborted {
            for c in &self.comms {
                // SAFETY: the handle came from ncclCommInitAll and was not destroyed.
                let _ = unsafe { nccl::comm_abort(c.0) };
            }
            *aborted = true;
        }
    }

    /// NCCL's asynchronous error of rank `rank`'s communicator, if it has one.
    fn async_error(&self, rank: usize) -> Option<String> {
        if *lock(&self.aborted) {
            return None;
        }
        let mut err = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator; `err` is written by the call.
        let query = unsafe { sys::ncclCommGetAsyncError(self.comms[rank].0, &mut err) };
        match (query.result(), err.result()) {
            (Err(e), _) | (_, Err(e)) => Some(nccl_error("ncclCommGetAsyncError", e)),
            _ => None,
        }
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        if !*lock(&self.aborted) {
            for c in &self.comms {
                // SAFETY: no collective runs (every Work waited for its completion).
                let _ = unsafe { nccl::comm_destroy(c.0) };
            }
        }
    }
}

/// An NCCL group: each rank's device, stream and communicator.
pub(crate) struct Nccl {
    name: &'static str,
    runtimes: Vec<Arc<Runtime>>,
    streams: Vec<Arc<CudaStream>>,
    comms: Arc<Comms>,
}

impl Nccl {
    /// One communicator per device of `ordinals` (distinct devices: NCCL refuses two ranks
    /// on one), for the backend `name` (`nccl-ring` or `nccl-tree`, checked against
    /// `NCCL_ALGO`).
    pub(crate) fn new(name: &'static str, ordinals: &[usize]) -> std::result::Result<Nccl, String> {
        check_algorithm(name, std::env::var("NCCL_ALGO").ok().as_deref())?;
        library::ensure(Library::Driver).map_err(|e| e.to_string())?;
        library::ensure(Library::Nccl).map_err(|e| e.to_string())?;
        for (i, a) in ordinals.iter().enumerate() {
            if ordinals[..i].contains(a) {
                return Err(format!(
                    "ranks {} and {i} are both on cuda:{a}: NCCL runs one rank per GPU \
                     (use cuda-ring for several ranks on one device)",
                    ordinals[..i].iter().position(|b| b == a).unwrap_or(0)
                ));
            }
        }
        let mut runtimes = Vec::new();
        let mut streams = Vec::new();
        for &o in ordinals {
            let rt = runtime(o).map_err(|e| e.to_string())?;
            streams.push(rt.new_stream().map_err(|e| e.to_string())?);
            runtimes.push(rt);
        }
        let devlist: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut raw: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: `raw` has room for one handle per device of `devlist`.
        unsafe { nccl::comm_init_all(raw.as_mut_ptr(), devlist.len() as i32, devlist.as_ptr()) }
            .map_err(|e| nccl_error("ncclCommInitAll", e))?;
        Ok(Nccl {
            name,
            runtimes,
            streams,
            comms: Arc::new(Comms {
                comms: raw.into_iter().map(Comm).collect(),
                aborted: Mutex::new(false),
            }),
        })
    }
}

fn data_type(d: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match d {
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::I32 => T::ncclInt32,
        DType::I64 => T::ncclInt64,
        DType::U8 => T::ncclUint8,
    }
}

fn red_op(op: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as O;
    match op {
        ReduceOp::Sum => O::ncclSum,
        ReduceOp::Mean => O::ncclAvg,
        ReduceOp::Max => O::ncclMax,
        ReduceOp::Min => O::ncclMin,
        ReduceOp::Product => O::ncclProd,
    }
}

/// A rank's completion: its event, NCCL's asynchronous errors, the abort on expiry.
pub(crate) struct Done {
    pub(crate) event: Event,
    /// The rank's index in `comms`.
    pub(crate) rank: usize,
    pub(crate) comms: Arc<Comms>,
}

impl Completion for Done {
    fn poll(&self, op: Collective, rank: usize) -> Result<bool> {
        if self.event.poll(op, rank)? {
            return Ok(true);
        }
        match self.comms.async_error(self.rank) {
            Some(reason) => {
                self.comms.abort();
                Err(CollectiveError::Device { op, rank, reason })
            }
            None => Ok(false),
        }
    }

    fn expire(&self, op: Collective, rank: usize, after: std::time::Duration) -> CollectiveError {
        // Stops NCCL's kernels, so that the event completes and the buffers are free.
        self.comms.abort();
        self.event.expire(op, rank, after)
    }
}

impl Engine for Nccl {
    fn name(&self) -> &'static str {
        self.name
    }

    fn accepts(&self, rank: usize) -> Accepts {
        Accepts(Place::Cuda(self.runtimes[rank].ordinal()))
    }

    fn ready(&self, rank: usize) -> std::result::Result<Ready, String> {
        ready_on(&self.runtimes[rank])
    }

    fn launch(
        &self,
        descs: &[Desc],
        ready: Vec<Ready>,
        _: &Config,
    ) -> std::result::Result<Vec<Box<dyn Completion>>, (usize, String)> {
        for (r, ev) in ready.iter().enumerate() {
            if let Some(ev) = ev {
                ev.make_wait(&self.streams[r])
                    .map_err(|e| (r, e.to_string()))?;
            }
        }
        nccl::group_start().map_err(|e| (0, nccl_error("ncclGroupStart", e)))?;
        let mut issued = Ok(());
        for (r, d) in descs.iter().enumerate() {
            if let Err(e) = self.issue(r, d) {
                issued = Err((r, e));
                break;
            }
        }
        let ended = nccl::group_end().map_err(|e| (0, nccl_error("ncclGroupEnd", e)));
        issued?;
        ended?;
        (0..descs.len())
            .map(|r| {
                let event =
                    Event::record(&self.streams[r], false).map_err(|e| (r, e.to_string()))?;
                Ok(Box::new(Done {
                    event,
                    rank: r,
                    comms: self.comms.clone(),
                }) as Box<dyn Completion>)
            })
            .collect()
    }
}

impl Nccl {
    /// Issue rank `r`'s NCCL call for `d` (inside the launch's NCCL group).
    fn issue(&self, r: usize, d: &Desc) -> std::result::Result<(), String> {
        issue(&self.runtimes[r], &self.streams[r], &self.comms.comms[r], d)
    }
}

#[cfg(feature = "mpi")]
/// One process's rank of an NCCL communicator over several processes
/// (`ncclCommInitRank`): its device's runtime, its stream and the communicator.
pub(crate) struct RankComm {
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) comms: Arc<Comms>,
}

#[cfg(feature = "mpi")]
/// A new NCCL unique id (made by one rank, shared with the others before
/// [`init_rank`]): NCCL's 128 bytes.
pub(crate) fn unique_id() -> std::result::Result<[u8; 128], String> {
    library::ensure(Library::Nccl).map_err(|e| e.to_string())?;
    let id = nccl::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
    Ok(id.internal.map(|c| c as u8))
}

#[cfg(feature = "mpi")]
/// Rank `rank` of `world` of the NCCL communicator of `id`, on `cuda:ordinal`, with a
/// stream of its own. Every rank of the communicator must call it (NCCL waits for all).
pub(crate) fn init_rank(
    ordinal: usize,
    world: usize,
    rank: usize,
    id: &[u8; 128],
) -> std::result::Result<RankComm, String> {
    library::ensure(Library::Driver).map_err(|e| e.to_string())?;
    library::ensure(Library::Nccl).map_err(|e| e.to_string())?;
    let runtime = runtime(ordinal).map_err(|e| e.to_string())?;
    let stream = runtime.new_stream().map_err(|e| e.to_string())?;
    runtime
        .context()
        .bind_to_thread()
        .map_err(|e| format!("cuCtxSetCurrent: {e}"))?;
    let id = sys::ncclUniqueId {
        internal: id.map(|b| b as std::ffi::c_char),
    };
    let mut raw: sys::ncclComm_t = std::ptr::null_mut();
    // SAFETY: `raw` receives the handle; the id came from ncclGetUniqueId on one rank.
    unsafe { nccl::comm_init_rank(&mut raw, world as i32, id, rank as i32) }
        .map_err(|e| nccl_error("ncclCommInitRank", e))?;
    Ok(RankComm {
        runtime,
        stream,
        comms: Arc::new(Comms {
            comms: vec![Comm(raw)],
            aborted: Mutex::new(false),
        }),
    })
}

/// Issue the NCCL call of `d` for the rank of `comm` on `stream` of `rt`'s device.
pub(crate) fn issue(
    rt: &Runtime,
    stream: &CudaStream,
    comm: &Comm,
    d: &Desc,
) -> std::result::Result<(), String> {
    rt.context()
        .bind_to_thread()
        .map_err(|e| format!("cuCtxSetCurrent: {e}"))?;
    let comm = comm.0;
    let stream = stream.cu_stream() as sys::cudaStream_t;
    let (src, dst) = (
        d.src.cast::<std::ffi::c_void>(),
        d.dst.cast::<std::ffi::c_void>(),
    );
    let t = data_type(d.dtype_in);
    let root = d.root as i32;
    // SAFETY: the verdict checked every rank's lengths, dtypes and roots; the buffers
    // are on the rank's device and stay borrowed until the rank's completion.
    let res = unsafe {
        match d.kind {
            Collective::AllReduce => {
                nccl::all_reduce(src, dst, d.len_in, t, red_op(d.op), comm, stream)
            }
            Collective::ReduceScatter => {
                nccl::reduce_scatter(src, dst, d.len_out, t, red_op(d.op), comm, stream)
            }
            Collective::AllGather => nccl::all_gather(src, dst, d.len_in, t, comm, stream),
            Collective::Broadcast => nccl::broadcast(src, dst, d.len_in, t, root, comm, stream),
            Collective::Reduce => {
                nccl::reduce(src, dst, d.len_in, t, red_op(d.op), root, comm, stream)
            }
            Collective::Barrier => return Ok(()),
        }
    };
    res.map(|_| ()).map_err(|e| nccl_error(d.kind.as_str(), e))
}

#[cfg(feature = "mpi")]
impl Comms {
    /// The communicator of this process's rank `r`.
    pub(crate) fn comm(&self, r: usize) -> &Comm {
        &self.comms[r]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_algorithm_comes_from_the_environment_the_process_started_with() {
        assert!(check_algorithm("nccl-ring", Some("Ring")).is_ok());
        assert!(check_algorithm("nccl-tree", Some(" tree ")).is_ok());
        let e = check_algorithm("nccl-tree", None).unwrap_err();
        assert!(
            e.contains("needs NCCL_ALGO=Tree") && e.ends_with("NCCL_ALGO is unset"),
            "{e}"
        );
        let e = check_algorithm("nccl-ring", Some("Tree,Ring")).unwrap_err();
        assert!(e.ends_with("NCCL_ALGO is `Tree,Ring`"), "{e}");
    }
}
