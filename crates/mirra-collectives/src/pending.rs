//! Collectives that own their buffers: submitted now, progressed in the background,
//! waited for later (what DDP's overlap of communication with backward needs).

use std::fmt;

use mirra_device::Buffer;

use crate::collective::Collective;
use crate::error::Result;

/// How a backend completes a submitted collective.
pub(crate) trait Completion: Send {
    /// True once waiting would return at once.
    fn is_complete(&self) -> bool;
    /// Block until the collective is complete and hand its buffer back.
    fn wait(self: Box<Self>) -> Result<Buffer>;
}

/// A submitted collective that owns its buffer until it is complete
/// ([`Communicator::submit_all_reduce`](crate::Communicator::submit_all_reduce)).
///
/// [`wait`](Pending::wait) returns the buffer with the result, or the collective's error
/// (within the communicator's deadline). Dropping a `Pending` does not cancel the
/// collective: it completes in the background, as the other ranks expect, and its buffer
/// is then freed.
#[must_use = "a submitted collective must be waited for to get its buffer and its error"]
pub struct Pending {
    op: Collective,
    inner: Box<dyn Completion>,
}

impl Pending {
    pub(crate) fn new(op: Collective, inner: Box<dyn Completion>) -> Pending {
        Pending { op, inner }
    }

    /// A submitted collective that completed before `submit_all_reduce` returned (or had
    /// nothing to do): waiting hands `buf` back at once.
    pub(crate) fn ready(op: Collective, buf: Buffer) -> Pending {
        Pending::new(op, Box::new(Ready(buf)))
    }

    /// The collective.
    pub fn op(&self) -> Collective {
        self.op
    }

    /// True once the collective is complete (waiting returns at once).
    pub fn is_complete(&self) -> bool {
        self.inner.is_complete()
    }

    /// Block until the collective is complete; the buffer holds the result.
    pub fn wait(self) -> Result<Buffer> {
        self.inner.wait()
    }
}

/// The buffer of a [`Pending::ready`] collective.
struct Ready(Buffer);

impl Completion for Ready {
    fn is_complete(&self) -> bool {
        true
    }
    fn wait(self: Box<Self>) -> Result<Buffer> {
        Ok(self.0)
    }
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("op", &self.op)
            .field("complete", &self.is_complete())
            .finish()
    }
}
