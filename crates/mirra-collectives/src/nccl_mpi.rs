//! `nccl-mpi` (feature `mpi`): one rank per process of an MPI job, each on a GPU of its
//! own, possibly on several hosts. NCCL moves the data; MPI does the rest:
//!
//! - **Forming the communicator**: rank 0 makes NCCL's unique id and broadcasts it over
//!   MPI, and every rank joins with `ncclCommInitRank` (how GPU workers on several hosts
//!   form one NCCL communicator, as Horovod and PyTorch's MPI launch do). Every rank first
//!   says over MPI whether it can use its GPU and NCCL, so that a rank that cannot fails
//!   every rank at once instead of leaving them waiting in NCCL.
//! - **Metadata**: every collective's description goes to every rank over MPI (the `mpi`
//!   backend's exchange, which names a silent rank and ends the job at the deadline) and
//!   the shared verdict checks them: NCCL checks nothing across ranks, and a mismatch
//!   would hang or corrupt.
//! - **Data**: the NCCL call on the rank's own stream, after the work already queued on
//!   its device, and a completion event; a wait past the deadline aborts the NCCL
//!   communicator (`ncclCommAbort`), as the in-process NCCL backends do.
//!
//! **Never run**: no machine with GPUs and MPI has been lent. It compiles here, and its
//! failure without a GPU is tested under `mpirun` (every rank gets the error naming every
//! rank that cannot, and the job ends).

use std::time::{Duration, Instant};

use mirra_cuda::events::Event;
use mirra_cuda::library::{self, Library};
use mirra_device::{Buffer, DType, Device};

use crate::collective::Collective;
use crate::comm::{AbortHandle, Abortable, Communicator, Work};
use crate::config::Config;
use crate::described::Described;
use crate::device::group::{ready_on, Submitted};
use crate::device::nccl::{self, Done, RankComm};
use crate::error::{CollectiveError, Result};
use crate::mpi::{Mpi, MpiComm};
use crate::pending::Pending;
use crate::reduce::ReduceOp;
use crate::transport::{Desc, Place};
use crate::verdict::{verdict, Accepts};

/// The backend's name.
pub const NCCL_MPI: &str = "nccl-mpi";

/// One process's rank.
pub(crate) struct NcclMpi {
    /// The MPI rank that carries the metadata (and the deadlines that end the job).
    meta: MpiComm,
    ordinal: usize,
    nccl: RankComm,
}

impl NcclMpi {
    /// This process's rank over the processes of `meta`'s group, on `cuda:ordinal` (see
    /// the module documentation); the error says which ranks could not join and why this
    /// one could not.
    pub(crate) fn new(meta: MpiComm, ordinal: usize) -> std::result::Result<NcclMpi, String> {
        let (rank, n) = (meta.rank, meta.size);
        let local = usable(ordinal);
        let host = |v: &[i64]| Buffer::from_slice(v, Device::Cpu).expect("host memory");
        let mut all = Buffer::zeros(DType::I64, n, Device::Cpu).expect("host memory");
        meta.all_gather(&host(&[i64::from(local.is_ok())]), &mut all)
            .map_err(|e| e.to_string())?;
        let failed: Vec<usize> = (0..n)
            .filter(|&p| all.as_slice::<i64>().expect("i64")[p] == 0)
            .collect();
        if !failed.is_empty() {
            return Err(format!(
                "NCCL over MPI needs a GPU and NCCL on every process; rank(s) {failed:?} of {n} \
                 cannot use cuda:{ordinal}{}",
                match &local {
                    Err(e) => format!(" (rank {rank}: {e})"),
                    Ok(()) => String::new(),
                }
            ));
        }
        // Rank 0's id (behind a byte saying whether it made one), to every rank.
        let mut id = Buffer::zeros(DType::U8, 129, Device::Cpu).expect("host memory");
        let mut made = Ok(());
        if rank == 0 {
            let bytes = id.as_mut_slice::<u8>().expect("u8");
            match nccl::unique_id() {
                Ok(unique) => {
                    bytes[0] = 1;
                    bytes[1..].copy_from_slice(&unique);
                }
                Err(e) => made = Err(e),
            }
        }
        meta.broadcast(&mut id, 0).map_err(|e| e.to_string())?;
        let bytes = id.as_slice::<u8>().expect("u8");
        if bytes[0] != 1 {
            return Err(format!(
                "rank 0 could not make NCCL's unique id{}",
                made.err().map_or(String::new(), |e| format!(": {e}"))
            ));
        }
        let unique: [u8; 128] = bytes[1..].try_into().expect("128 bytes");
        let nccl = nccl::init_rank(ordinal, n, rank, &unique)?;
        Ok(NcclMpi {
            meta,
            ordinal,
            nccl,
        })
    }

    /// Phases 1 and 2 of a collective: the verdict on every rank's description, then the
    /// NCCL call queued; its completion (none when there is nothing to move).
    fn launch(&self, desc: Desc) -> Result<Option<Done>> {
        let op = desc.kind;
        let rank = self.meta.rank;
        if self.meta.abort.is_aborted() {
            return Err(CollectiveError::Aborted { op });
        }
        let deadline = Instant::now() + self.meta.timeout;
        let descs = self.meta.descriptions(desc, deadline);
        // Every rank's buffers on its own GPU: this rank's ordinal is known, the others'
        // are whatever CUDA device they posted (a host buffer there is refused).
        let place = |p: usize| {
            Accepts(match (p == rank, descs[p].dev_in) {
                (true, _) => Place::Cuda(self.ordinal),
                (false, Place::Cuda(o)) => Place::Cuda(o),
                (false, Place::Cpu) => Place::Cuda(0),
            })
        };
        verdict(self.meta.size, &|p| descs[p], op, NCCL_MPI, &place)?;
        // The metadata exchange was the barrier.
        if op == Collective::Barrier || (desc.len_in == 0 && desc.len_out == 0) {
            return Ok(None);
        }
        let device = |reason: String| CollectiveError::Device { op, rank, reason };
        if let Some(ready) = ready_on(&self.nccl.runtime).map_err(device)? {
            ready
                .make_wait(&self.nccl.stream)
                .map_err(|e| device(e.to_string()))?;
        }
        nccl::issue(
            &self.nccl.runtime,
            &self.nccl.stream,
            self.nccl.comms.comm(0),
            &desc,
        )
        .map_err(device)?;
        let event = Event::record(&self.nccl.stream, false).map_err(|e| device(e.to_string()))?;
        Ok(Some(Done {
            event,
            rank: 0,
            comms: self.nccl.comms.clone(),
        }))
    }
}

impl Mpi {
    /// This process's rank of an NCCL communicator over the processes of `comm` (MPI's
    /// world or a split of it), its buffers on `cuda:ordinal` (backend `nccl-mpi`: NCCL's
    /// unique id made by rank 0 and broadcast over MPI, every collective's metadata checked
    /// over MPI; see the module documentation). Every process of `comm` must call it; an
    /// error on every rank when any cannot use its GPU or NCCL. Never run on GPUs.
    pub fn nccl(
        &self,
        comm: &::mpi::topology::SimpleCommunicator,
        ordinal: usize,
        config: Config,
    ) -> std::result::Result<Box<dyn Communicator>, String> {
        let meta = self.rank_of(comm, config, 1);
        Ok(Box::new(NcclMpi::new(meta, ordinal)?))
    }
}

/// Whether this process can use `cuda:ordinal` and NCCL.
fn usable(ordinal: usize) -> std::result::Result<(), String> {
    library::ensure(Library::Driver).map_err(|e| e.to_string())?;
    library::ensure(Library::Nccl).map_err(|e| e.to_string())?;
    let count = mirra_cuda::device_count().map_err(|e| e.to_string())?;
    if ordinal >= count {
        return Err(format!("cuda:{ordinal} does not exist ({count} device(s))"));
    }
    Ok(())
}

impl Described for NcclMpi {
    fn rank(&self) -> usize {
        self.meta.rank
    }
    fn world_size(&self) -> usize {
        self.meta.size
    }
    fn backend(&self) -> &'static str {
        NCCL_MPI
    }
    fn timeout(&self) -> Duration {
        self.meta.timeout
    }
    fn abort_handle(&self) -> AbortHandle {
        // The MPI rank's flag: this rank's later calls fail; a collective in flight is
        // aborted on NCCL's side at its deadline (`Done::expire`).
        Described::abort_handle(&self.meta)
    }

    fn start(&self, desc: Desc) -> Result<Work<'_>> {
        let (op, rank, timeout) = (desc.kind, self.meta.rank, self.meta.timeout);
        Ok(match self.launch(desc)? {
            Some(done) => Work::pending(op, rank, timeout, Box::new(done)),
            None => Work::completed(op),
        })
    }

    fn submit_all_reduce(&self, mut buf: Buffer, op: ReduceOp) -> Result<Pending> {
        let kind = Collective::AllReduce;
        // The buffer moves into `Submitted`; its device memory stays where it is until
        // `Submitted` drops it, after the work.
        let work = self
            .launch(Desc::in_place(kind, &mut buf, op, 0))?
            .map(|done| Work::pending(kind, self.meta.rank, self.meta.timeout, Box::new(done)));
        Ok(Pending::new(
            kind,
            Box::new(Submitted {
                work,
                buf: Some(buf),
            }),
        ))
    }
}
