//! `mirra topo`: how this machine's GPUs are connected, as `nvidia-smi topo -m` prints it
//! (NVLink, the PCIe path, peer access); `--json FILE` writes it for `cargo xtask scaling
//! --topology FILE`, which models the machine from it.

use mirra::cuda::topology::{self, Matrix};
use serde_json::json;

use crate::{Failure, TopoArgs};

/// The matrix as JSON: GPUs, link labels, peer access, where NVLink came from.
pub fn to_json(m: &Matrix) -> serde_json::Value {
    json!({
        "schema": "mirra-topo/1",
        "gpus": m.gpus.iter().map(|g| json!({
            "ordinal": g.ordinal,
            "name": g.name,
            "pci_bus_id": g.pci_bus_id,
            "numa_node": g.numa_node,
        })).collect::<Vec<_>>(),
        "links": m.labels(),
        "peer_access": m.peer_access,
        "nvlink_source": m.nvlink_source,
    })
}

pub fn run(args: TopoArgs) -> Result<(), Failure> {
    // No driver or no GPU: one line saying so (exit 2, as --device cuda:N).
    let m = topology::matrix().map_err(|e| Failure::Usage(format!("mirra topo: {e}")))?;
    mirra::train::console::print_line(m.render().trim_end());
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&to_json(&m)).expect("JSON of plain values");
        std::fs::write(&path, text + "\n")
            .map_err(|e| Failure::Run(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}
