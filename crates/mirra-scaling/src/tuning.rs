//! The vocabulary every other module costs in: the all-reduce algorithms, NCCL's hardware
//! classes of a path, and the fixed costs its tuning model charges per call and per step
//! (`src/graph/tuning.cc` of NVIDIA/nccl).
//!
//! This module imports nothing from the crate: topologies carry [`Overheads`], schedules
//! read them, and both name [`Algorithm`]s and [`HwClass`]es from here.

/// An all-reduce algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around rings.
    Ring,
    /// NCCL's tree: chains within hosts, a double binary tree between them.
    Tree,
}

impl Algorithm {
    /// Both, in display order.
    pub const ALL: [Algorithm; 2] = [Algorithm::Ring, Algorithm::Tree];

    /// The lower-case name, as mirra's backends are named.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
        }
    }

    /// The index into per-algorithm tables.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// NCCL's hardware classes of a path, which decide the per-step latency of its tuning model
/// (`src/graph/tuning.cc`: NVLINK, PCI, NET), plus host memory for the shared-memory
/// collectives measured here. Ordered from cheapest to dearest: a path's class is that of
/// its dearest link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HwClass {
    /// Shared memory between threads of one host.
    Host,
    /// NVLink, directly or through NVSwitch.
    NvLink,
    /// PCIe, through host bridges and between sockets.
    Pci,
    /// A network between hosts.
    Net,
}

impl HwClass {
    /// Every class, in order.
    pub const ALL: [HwClass; 4] = [HwClass::Host, HwClass::NvLink, HwClass::Pci, HwClass::Net];

    /// The index into per-class tables.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Fixed costs of a collective, microseconds: once per call (`base_us`) and per step, by the
/// hardware class of the step's path (`step_us`), for each [`Algorithm`].
#[derive(Clone, Debug, PartialEq)]
pub struct Overheads {
    /// Per call, by algorithm (ring, tree).
    pub base_us: [f64; 2],
    /// Per step, by hardware class ([`HwClass::index`]) then algorithm (ring, tree).
    pub step_us: [[f64; 2]; 4],
}

impl Overheads {
    /// NCCL's tuning model for its Simple protocol (the one large messages use), from
    /// `ncclTunerConstantsDefaults` in NVIDIA/nccl `src/graph/tuning.cc`, v2.30.7:
    /// `baseLat` 8.4 us (ring and tree); `hwLat` NVLink 3.4 (ring) / 4.0 (tree), PCI 5.7 /
    /// 4.0, NET 14.0 / 14.0 us. Host memory is no NCCL class and costs nothing here.
    pub const fn nccl() -> Self {
        Overheads {
            base_us: [8.4, 8.4],
            step_us: [[0.0, 0.0], [3.4, 4.0], [5.7, 4.0], [14.0, 14.0]],
        }
    }

    /// The per-call overhead of `algorithm`, microseconds.
    pub fn base(&self, algorithm: Algorithm) -> f64 {
        self.base_us[algorithm.index()]
    }

    /// The per-step overhead of `algorithm` on a path of class `class`, microseconds.
    pub fn step(&self, class: HwClass, algorithm: Algorithm) -> f64 {
        self.step_us[class.index()][algorithm.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_overheads_are_the_tuning_tables() {
        let o = Overheads::nccl();
        assert_eq!(o.base(Algorithm::Ring), 8.4);
        assert_eq!(o.step(HwClass::NvLink, Algorithm::Ring), 3.4);
        assert_eq!(o.step(HwClass::NvLink, Algorithm::Tree), 4.0);
        assert_eq!(o.step(HwClass::Pci, Algorithm::Ring), 5.7);
        assert_eq!(o.step(HwClass::Net, Algorithm::Tree), 14.0);
        assert_eq!(o.step(HwClass::Host, Algorithm::Ring), 0.0);
    }
}
