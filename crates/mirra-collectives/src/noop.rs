//! The no-op group: every collective completes at once and moves nothing.
//!
//! An ablation for measurements, not a backend: a training step over it costs what the
//! step costs without communication, so the difference to the same step over a real
//! backend is what communication costs in total (the transfers, the waits and the
//! progress threads competing for cores), overlapped or not. Results are wrong (each rank
//! keeps its own buffer), so replicas drift apart: it is not among [`BACKENDS`], and the
//! mirrored strategy offers it only under the name [`NOOP`].
//!
//! [`BACKENDS`]: crate::BACKENDS

use std::sync::Arc;
use std::time::Duration;

use mirra_device::Buffer;

use crate::collective::Collective;
use crate::comm::{AbortFlag, AbortHandle, Abortable, Communicator, Work};
use crate::error::{CollectiveError, Result};
use crate::pending::Pending;
use crate::reduce::ReduceOp;

/// The no-op group's name.
pub const NOOP: &str = "noop";

/// One rank of a no-op group.
struct NoopCommunicator {
    rank: usize,
    world: usize,
    aborted: Arc<AbortFlag>,
}

impl NoopCommunicator {
    fn done<'b>(&self, op: Collective) -> Result<Work<'b>> {
        if self.aborted.is_aborted() {
            return Err(CollectiveError::Aborted { op });
        }
        Ok(Work::completed(op))
    }
}

impl Communicator for NoopCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &'static str {
        NOOP
    }
    fn timeout(&self) -> Duration {
        Duration::MAX
    }
    fn abort_handle(&self) -> AbortHandle {
        AbortHandle::new(self.aborted.clone())
    }
    fn start_all_reduce<'b>(&'b self, _: &'b mut Buffer, _: ReduceOp) -> Result<Work<'b>> {
        self.done(Collective::AllReduce)
    }
    fn start_reduce_scatter<'b>(
        &'b self,
        _: &'b Buffer,
        _: &'b mut Buffer,
        _: ReduceOp,
    ) -> Result<Work<'b>> {
        self.done(Collective::ReduceScatter)
    }
    fn start_all_gather<'b>(&'b self, _: &'b Buffer, _: &'b mut Buffer) -> Result<Work<'b>> {
        self.done(Collective::AllGather)
    }
    fn start_broadcast<'b>(&'b self, _: &'b mut Buffer, _: usize) -> Result<Work<'b>> {
        self.done(Collective::Broadcast)
    }
    fn start_reduce<'b>(&'b self, _: &'b mut Buffer, _: ReduceOp, _: usize) -> Result<Work<'b>> {
        self.done(Collective::Reduce)
    }
    fn start_barrier(&self) -> Result<Work<'_>> {
        self.done(Collective::Barrier)
    }
    fn submit_all_reduce(&self, buf: Buffer, _: ReduceOp) -> Result<Pending> {
        self.done(Collective::AllReduce)?.wait()?;
        Ok(Pending::ready(Collective::AllReduce, buf))
    }
}

/// `world` ranks of a no-op group (see the module's documentation: results are wrong).
pub fn noop_group(world: usize) -> Vec<Box<dyn Communicator>> {
    let aborted = Arc::new(AbortFlag::default());
    (0..world)
        .map(|rank| {
            Box::new(NoopCommunicator {
                rank,
                world,
                aborted: aborted.clone(),
            }) as Box<dyn Communicator>
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirra_device::Device;

    #[test]
    fn collectives_complete_at_once_and_move_nothing() {
        let comms = noop_group(3);
        assert_eq!(comms.len(), 3);
        let mut b = Buffer::from_slice(&[1.0f32, 2.0], Device::Cpu).unwrap();
        comms[1].all_reduce(&mut b, ReduceOp::Sum).unwrap();
        assert_eq!(b.as_slice::<f32>().unwrap(), &[1.0, 2.0]);
        let back = comms[2]
            .submit_all_reduce(b, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(back.as_slice::<f32>().unwrap(), &[1.0, 2.0]);
        comms[0].barrier().unwrap();
        assert_eq!((comms[2].rank(), comms[2].world_size()), (2, 3));
        assert!(!crate::BACKENDS.contains(&NOOP));
    }

    #[test]
    fn an_abort_reaches_every_rank() {
        let comms = noop_group(2);
        comms[0].abort_handle().abort();
        let e = comms[1].barrier().unwrap_err();
        assert!(matches!(e, CollectiveError::Aborted { .. }), "{e}");
    }
}
