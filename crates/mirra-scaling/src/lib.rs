//! A model of data-parallel scaling for the topologies this machine does not have, and of
//! this machine itself.
//!
//! mirra's collectives run here on CPU threads; the machines people train on have NVLink,
//! NVSwitch, PCIe host bridges and InfiniBand. This crate predicts what a mirrored training
//! step does on them, from cited public figures only, and what it does on this host from
//! what is measured on it (see `docs/SCALING.md`). It depends on no other mirra crate: it
//! is a model, not a backend, so what the framework uses (the gradient bucket size) comes in
//! as an input.
//!
//! Its modules stand in layers, each importing only from those above it in this list:
//!
//! - [`tuning`]: the algorithms, NCCL's hardware classes and its per-call and per-step
//!   overheads; [`ablation`]: the deliberately wrong variants of the model;
//! - [`topology`]: devices, switches, host bridges and NICs as nodes, links with a
//!   per-direction bandwidth and a latency, widest-shortest-path routing;
//! - [`presets`]: the machines (`dgx-h100`, `dgx-a100`, `4xv100-nvlink`,
//!   `2gpu-nvlink-bridge`, `8gpu-pcie4`, `8gpu-pcie5`, `ib-<N>node`, `dgx1-v100`,
//!   `2gpu-pcie4`, `2gpu-pcie3`, `p100-25gbe-<N>node`), every number cited;
//! - [`schedule`]: NCCL's ring and tree all-reduce simulated on a topology, step by step
//!   (alpha-beta cost per step, links shared by `k` concurrent flows give each `1/k`);
//! - [`architecture`]: networks as layers of parameters and multiply-adds; [`profile`]:
//!   per-layer backward times, from a cited throughput or measured here;
//! - [`overlap`]: DDP-style bucketed gradient synchronisation overlapped with backward;
//! - [`predict`]: step time, samples/s, efficiency and exposed communication per algorithm
//!   and replica count, and which algorithm wins at which message size; [`host`]: this
//!   machine's mirrored step from its measured copy rates, cores and compute;
//! - [`checks`]: the model against public figures and this machine, under every ablation
//!   ([`checks::validate`]), including the seed's 3.6x claim ([`checks::seed_check`]).
//!
//! ```
//! use mirra_scaling::{predict, presets, ModelProfile};
//!
//! let topo = presets::build("dgx-h100").unwrap();
//! let model = ModelProfile::preset("resnet50", topo.device(), 128).unwrap();
//! let p = predict::predict(&topo, &model, &[1, 8], 25 << 20).unwrap();
//! let eight = p.rows.iter().find(|r| r.replicas == 8).unwrap();
//! assert!(eight.efficiency > 0.9 && eight.efficiency <= 1.0);
//! ```

pub mod ablation;
pub mod architecture;
pub mod checks;
mod error;
pub mod host;
pub mod overlap;
pub mod predict;
pub mod presets;
pub mod profile;
pub mod schedule;
pub mod topology;
pub mod tuning;

pub use ablation::Ablation;
pub use error::{Result, ScalingError};
pub use profile::{LayerProfile, ModelProfile};
pub use schedule::Schedule;
pub use topology::{DeviceModel, Topology};
pub use tuning::Algorithm;

#[cfg(test)]
mod layers {
    /// The modules, each allowed to import only those before it (and the crate root's
    /// `Result` and `ScalingError`).
    const ORDER: [(&str, &str); 13] = [
        ("error", include_str!("error.rs")),
        ("tuning", include_str!("tuning.rs")),
        ("ablation", include_str!("ablation.rs")),
        ("topology", include_str!("topology.rs")),
        ("presets", include_str!("presets.rs")),
        ("schedule", include_str!("schedule.rs")),
        ("architecture", include_str!("architecture.rs")),
        ("profile", include_str!("profile.rs")),
        ("overlap", include_str!("overlap.rs")),
        ("predict", include_str!("predict.rs")),
        ("host", include_str!("host.rs")),
        ("checks", include_str!("checks.rs")),
        ("lib", ""),
    ];

    /// The crate modules that the non-test code of `source` names (`crate::name`), comments
    /// (and so documentation links) aside.
    fn imports(source: &str) -> Vec<String> {
        let code: String = source
            .split("#[cfg(test)]")
            .next()
            .unwrap_or("")
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut out: Vec<String> = code
            .match_indices("crate::")
            .filter_map(|(i, _)| {
                let rest = &code[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                (!name.is_empty()).then_some(name)
            })
            .collect();
        // `use crate::{Result, ScalingError}` names the root's re-exports of `error`.
        if code.contains("use crate::{") {
            out.push("error".into());
        }
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn modules_stand_in_layers() {
        for (i, (name, source)) in ORDER.iter().enumerate() {
            for import in imports(source) {
                let at = ORDER.iter().position(|(m, _)| *m == import);
                assert!(
                    at.is_some_and(|at| at < i),
                    "`{name}` imports `{import}`, which is not above it"
                );
            }
        }
    }

    #[test]
    fn the_layer_check_sees_a_circle() {
        // topology.rs naming presets (as `Topology::preset` once did) breaks the layers.
        let circle = "use crate::presets;\nfn f() { crate::presets::build(\"x\"); }";
        assert_eq!(imports(circle), ["presets"]);
        let topology = ORDER.iter().position(|(m, _)| *m == "topology").unwrap();
        let presets = ORDER.iter().position(|(m, _)| *m == "presets").unwrap();
        assert!(presets > topology);
        // Test code may use anything.
        assert!(imports("fn f() {}\n#[cfg(test)]\nuse crate::checks;").is_empty());
        assert!(imports("/// See [`crate::checks`].\nfn f() {}").is_empty());
    }
}
