//! Streams and events of one device: what orders work across streams and tells the host
//! that queued work has run, without waiting for everything on a stream.
//!
//! mirra queues a device's copies and kernels on its runtime's one stream (program order
//! orders them). A second stream (a collective's, issue 15) runs beside it: an [`Event`]
//! recorded on one stream after some work is what another stream waits for
//! ([`Event::make_wait`]) or what the host polls ([`Event::is_complete`]) or blocks on
//! ([`Event::synchronize`]). Recorded with timing, two events measure the device time
//! between them ([`Event::elapsed_since`]), as `cudaEventElapsedTime`.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::Context;
use crate::runtime::Runtime;
use crate::Result;

/// A point in a stream's queue: complete once the work queued before it has run.
pub struct Event {
    inner: CudaEvent,
    timed: bool,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("timed", &self.timed).finish()
    }
}

impl Runtime {
    /// A new stream on this device, beside the one mirra's tensors use ([`Runtime::stream`]).
    /// Work on it is unordered against that stream unless an [`Event`] orders it.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.context().new_stream().op("cuStreamCreate")
    }

    /// An event recorded now on this device's stream: complete once everything queued on
    /// it so far has run. `timed`: it can measure time ([`Event::elapsed_since`]) at a
    /// small cost per record; untimed events are the cheap kind for ordering.
    pub fn record_event(&self, timed: bool) -> Result<Event> {
        Event::record(self.stream(), timed)
    }
}

impl Event {
    /// An event recorded now on `stream`.
    pub fn record(stream: &CudaStream, timed: bool) -> Result<Event> {
        let flags = if timed {
            CUevent_flags::CU_EVENT_DEFAULT
        } else {
            CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let inner = stream.record_event(Some(flags)).op("cuEventRecord")?;
        Ok(Event { inner, timed })
    }

    /// Whether the work before the event has run (without waiting). An error of that work
    /// (a kernel that faulted) is returned here, not hidden as "not yet".
    pub fn is_complete(&self) -> Result<bool> {
        self.inner.try_is_complete().op("cuEventQuery")
    }

    /// Block the calling thread until the work before the event has run.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize().op("cuEventSynchronize")
    }

    /// Make `stream` wait (on the device, not the host) until the work before this event
    /// has run: work queued on `stream` afterwards starts after it.
    pub fn make_wait(&self, stream: &CudaStream) -> Result<()> {
        stream.wait(&self.inner).op("cuStreamWaitEvent")
    }

    /// The device time from `start` to this event, both recorded `timed` on one device;
    /// waits for both.
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration> {
        if !(self.timed && start.timed) {
            return Err(crate::CudaError::Unsupported {
                what: "elapsed time between events recorded without timing".into(),
            });
        }
        let ms = start
            .inner
            .elapsed_ms(&self.inner)
            .op("cuEventElapsedTime")?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::runtime;
    use cudarc::driver::result;

    #[test]
    #[ignore = "needs a CUDA device"]
    fn timed_events_measure_queued_work_and_complete_after_it() {
        let rt = runtime(0).unwrap();
        let bytes = 1 << 30;
        let mut buf = rt.alloc(bytes).unwrap();
        let start = rt.record_event(true).unwrap();
        for _ in 0..8 {
            buf.fill_zero().unwrap();
        }
        let end = rt.record_event(true).unwrap();
        end.synchronize().unwrap();
        assert!(end.is_complete().unwrap() && start.is_complete().unwrap());
        let t = end.elapsed_since(&start).unwrap();
        // 8 GiB written: more than 0.5 ms at any plausible rate (the H200 writes about 4
        // TB/s), less than a second.
        assert!(
            t > Duration::from_micros(500) && t < Duration::from_secs(1),
            "{t:?}"
        );
        let untimed = rt.record_event(false).unwrap();
        let e = untimed.elapsed_since(&start).unwrap_err().to_string();
        assert!(e.contains("without timing"), "{e}");
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn a_stream_made_to_wait_for_an_event_sees_the_work_before_it() {
        let rt = runtime(0).unwrap();
        let side = rt.new_stream().unwrap();
        let n = 256 << 20;
        let host: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let (mut a, b) = (rt.alloc(n).unwrap(), rt.alloc(n).unwrap());
        for round in 0..4u8 {
            // Written on the runtime's stream (a zero fill, then a 256 MiB upload), read
            // on the side stream after the event.
            a.fill_zero().unwrap();
            a.upload(&host).unwrap();
            let written = rt.record_event(false).unwrap();
            written.make_wait(&side).unwrap();
            // SAFETY: both buffers hold n bytes on this device; the side stream orders the
            // copy after the event, and is synchronized before b is read.
            unsafe { result::memcpy_dtod_async(b.ptr(), a.ptr(), n, side.cu_stream()) }.unwrap();
            let copied = Event::record(&side, false).unwrap();
            copied.make_wait(rt.stream()).unwrap();
            let mut back = vec![0u8; n];
            b.download(&mut back).unwrap();
            assert!(back == host, "round {round}: the copy ran before the write");
        }
    }
}
