//! This process's peak memory: resident host memory, as the kernel counts it for its
//! address space, and device memory, as a device's caching allocator counts it.

use crate::Device;

/// The most resident memory this process's address space has held, in MiB (Linux's
/// `VmHWM`, from `/proc/self/status`); `None` where the system does not report it.
///
/// Unlike `getrusage`'s `ru_maxrss` seen by a parent, this counts only the memory of the
/// program itself: on Linux a child's `ru_maxrss` starts at its parent's peak when it was
/// spawned (the high-water mark of the address space it replaced at `exec`), so a large
/// parent makes every child look large.
pub fn peak_resident_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

/// The most memory tensors have held at once on `device` since the process started (or
/// since the allocator's peak was last reset), in MiB: the caching allocator's peak of
/// blocks in use (PyTorch's `max_memory_allocated`; memory cached but free is not
/// counted, nor cuBLAS's workspace). `None` for the host or a device that cannot be
/// opened.
pub fn peak_device_mib(device: Device) -> Option<f64> {
    let Device::Cuda(d) = device else {
        return None;
    };
    let rt = mirra_cuda::runtime::runtime(d.ordinal()).ok()?;
    Some(rt.memory_stats().peak_in_use as f64 / (1 << 20) as f64)
}

fn parse_vm_hwm(status: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_hwm_is_read_in_mib() {
        let status = "Name:\tmirra\nVmPeak:\t  300000 kB\nVmHWM:\t   23552 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(23.0));
        assert_eq!(parse_vm_hwm("VmRSS:\t1 kB\n"), None);
    }

    #[test]
    fn this_process_has_a_peak_that_grows_with_what_it_touches() {
        let Some(before) = peak_resident_mib() else {
            return; // not Linux: nothing to read
        };
        let touched = vec![1u8; 64 << 20];
        std::hint::black_box(&touched);
        let after = peak_resident_mib().unwrap();
        assert!(
            after >= before + 60.0,
            "{before} -> {after} MiB after touching 64 MiB"
        );
    }
}
