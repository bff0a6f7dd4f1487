//! A model of data-parallel scaling for the topologies this machine does not have.
//!
//! mirra's collectives run here on CPU threads; the machines people train on have NVLink,
//! NVSwitch, PCIe host bridges and InfiniBand. This crate predicts what a mirrored training
//! step does on them, from cited public figures only (see `docs/SCALING.md`):
//!
//! - [`topology`]: devices, switches, host bridges and NICs as nodes, links with a per-direction
//!   bandwidth and a latency, widest-shortest-path routing; [`presets`] builds the machines
//!   (`dgx-h100`, `4xv100-nvlink`, `2gpu-nvlink-bridge`, `8gpu-pcie4`, `8gpu-pcie5`,
//!   `ib-2node` and `ib-<N>node`, `dgx1-v100`) with every number cited;
//! - [`schedule`]: NCCL's ring and tree all-reduce simulated on a topology, step by step
//!   (alpha-beta cost per step, links shared by `k` concurrent flows give each `1/k`);
//! - [`profile`]: model profiles (per-layer parameters and backward times), ResNet-50 from its
//!   architecture and a cited single-GPU throughput, or measured per-layer timings;
//! - [`overlap`]: DDP-style bucketed gradient synchronisation overlapped with backward;
//! - [`predict`]: step time, samples/s, efficiency and exposed communication per algorithm and
//!   replica count, and which algorithm wins at which message size;
//! - [`checks`]: the model against public figures and this machine's measurements, including
//!   the seed's 3.6x claim ([`checks::seed_check`]).
//!
//! ```
//! use mirra_scaling::{predict, ModelProfile, Topology};
//!
//! let topo = Topology::preset("dgx-h100").unwrap();
//! let model = ModelProfile::preset("resnet50", topo.device(), 128).unwrap();
//! let p = predict::predict(&topo, &model, &[1, 8], predict::DEFAULT_BUCKET_BYTES).unwrap();
//! let eight = p.rows.iter().find(|r| r.replicas == 8).unwrap();
//! assert!(eight.efficiency > 0.9 && eight.efficiency <= 1.0);
//! ```

pub mod checks;
mod error;
pub mod overlap;
pub mod predict;
pub mod presets;
pub mod profile;
pub mod schedule;
pub mod topology;

pub use error::{Result, ScalingError};
pub use profile::{LayerProfile, ModelProfile};
pub use schedule::{Algorithm, Schedule};
pub use topology::{DeviceModel, Topology};
