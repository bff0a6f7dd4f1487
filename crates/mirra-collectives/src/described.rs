//! The [`Communicator`] of a backend that runs every collective from its description
//! ([`Desc`]): each `start_*` builds the description and hands it to [`Described::start`],
//! so a backend writes one entry point instead of six.

use std::time::Duration;

use mirra_device::Buffer;

use crate::collective::Collective;
use crate::comm::{AbortHandle, Communicator, Work};
use crate::error::Result;
use crate::pending::Pending;
use crate::reduce::ReduceOp;
use crate::transport::Desc;

/// What a backend that runs collectives from their descriptions provides; every such type
/// is a [`Communicator`].
pub(crate) trait Described: Send {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    fn backend(&self) -> &'static str;
    fn timeout(&self) -> Duration;
    fn abort_handle(&self) -> AbortHandle;
    /// Start the collective `desc` describes; its buffers stay borrowed for the `Work`.
    fn start(&self, desc: Desc) -> Result<Work<'_>>;
    /// [`Communicator::submit_all_reduce`].
    fn submit_all_reduce(&self, buf: Buffer, op: ReduceOp) -> Result<Pending>;
}

impl<T: Described> Communicator for T {
    fn rank(&self) -> usize {
        Described::rank(self)
    }
    fn world_size(&self) -> usize {
        Described::world_size(self)
    }
    fn backend(&self) -> &'static str {
        Described::backend(self)
    }
    fn timeout(&self) -> Duration {
        Described::timeout(self)
    }
    fn abort_handle(&self) -> AbortHandle {
        Described::abort_handle(self)
    }
    fn submit_all_reduce(&self, buf: Buffer, op: ReduceOp) -> Result<Pending> {
        Described::submit_all_reduce(self, buf, op)
    }

    fn start_all_reduce<'b>(&'b self, buf: &'b mut Buffer, op: ReduceOp) -> Result<Work<'b>> {
        self.start(Desc::in_place(Collective::AllReduce, buf, op, 0))
    }

    fn start_reduce_scatter<'b>(
        &'b self,
        send: &'b Buffer,
        recv: &'b mut Buffer,
        op: ReduceOp,
    ) -> Result<Work<'b>> {
        self.start(Desc::send_recv(Collective::ReduceScatter, send, recv, op))
    }

    fn start_all_gather<'b>(&'b self, send: &'b Buffer, recv: &'b mut Buffer) -> Result<Work<'b>> {
        let sum = ReduceOp::Sum;
        self.start(Desc::send_recv(Collective::AllGather, send, recv, sum))
    }

    fn start_broadcast<'b>(&'b self, buf: &'b mut Buffer, root: usize) -> Result<Work<'b>> {
        let sum = ReduceOp::Sum;
        self.start(Desc::in_place(Collective::Broadcast, buf, sum, root))
    }

    fn start_reduce<'b>(
        &'b self,
        buf: &'b mut Buffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'b>> {
        self.start(Desc::in_place(Collective::Reduce, buf, op, root))
    }

    fn start_barrier(&self) -> Result<Work<'_>> {
        self.start(Desc::empty(Collective::Barrier))
    }
}
