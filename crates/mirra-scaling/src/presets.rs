//! The machines the model knows. Every number is cited here and in `docs/SCALING.md`; the
//! achievable fraction of each line rate is [`LinkKind::efficiency`].
//!
//! Devices are ranked in the order they are added: host by host, GPU by GPU, as NCCL ranks
//! them when one process drives each GPU in order.

use crate::topology::{DeviceModel, LinkKind, NodeKind, Topology};
use crate::{Result, ScalingError};

/// The preset names (`ib-<N>node` takes any `N` in `2..=`[`MAX_IB_NODES`],
/// `p100-25gbe-<N>node` any `N` in `2..=`[`MAX_ROCE_NODES`]).
pub const NAMES: &[&str] = &[
    "dgx-h100",
    "dgx-a100",
    "4xv100-nvlink",
    "2gpu-nvlink-bridge",
    "8gpu-pcie4",
    "8gpu-pcie5",
    "ib-2node",
    "dgx1-v100",
    "2gpu-pcie4",
    "2gpu-pcie3",
    "p100-25gbe-2node",
];

/// The most hosts an `ib-<N>node` preset joins.
pub const MAX_IB_NODES: usize = 32;

/// The most hosts a `p100-25gbe-<N>node` preset joins (Horovod's benchmark: 128).
pub const MAX_ROCE_NODES: usize = 128;

/// NVLink 4 per H100, one direction: 18 links, 450 GB/s (stas00/ml-engineering
/// `network/README.md`, NVLink table; NVIDIA/nccl-tests issue 212).
pub const NVLINK4_PER_GPU_GBS: f64 = 450.0;

/// One NVLink 2 or 3 link, one direction: 25 GB/s (V100: 6 links, 150 GB/s; A100: 12 links,
/// 300 GB/s; stas00/ml-engineering `network/README.md`, NVLink table).
pub const NVLINK_PER_LINK_GBS: f64 = 25.0;

/// NVLink 3 per A100 SXM4, one direction: 12 links of 25 GB/s (stas00/ml-engineering
/// `network/README.md`, NVLink table).
pub const NVLINK3_PER_GPU_GBS: f64 = 12.0 * NVLINK_PER_LINK_GBS;

/// PCIe 3.0 x16, one direction (PCIe specification; shared/design/PUBLIC-FIGURES.md).
pub const PCIE3_X16_GBS: f64 = 15.75;

/// PCIe 4.0 x16, one direction (PCIe specification; stas00/ml-engineering PCIe table).
pub const PCIE4_X16_GBS: f64 = 31.5;

/// PCIe 5.0 x16, one direction (same sources).
pub const PCIE5_X16_GBS: f64 = 63.0;

/// InfiniBand NDR, one 400 Gbit/s port (ConnectX-7), one direction: 50 GB/s
/// (stas00/ml-engineering `network/README.md`, InfiniBand table).
pub const NDR_PORT_GBS: f64 = 50.0;

/// A 25 Gbit/s Ethernet port, one direction: 3.125 GB/s (Horovod's benchmark servers:
/// "RoCE-capable 25 Gbit/s network", horovod/horovod `docs/benchmarks.rst`).
pub const ETHERNET_25G_GBS: f64 = 25.0 / 8.0;

/// Peer-to-peer bandwidth between AMD EPYC sockets that NCCL assumes (`AMD_BW`, NVIDIA/nccl
/// `src/graph/topo.h`, v2.30.7). PUBLIC-FIGURES.md's A100 pair that crosses sockets measured
/// 20 GB/s (NVIDIA/nccl-tests issue 178).
pub const AMD_INTER_SOCKET_GBS: f64 = 16.0;

/// Peer-to-peer bandwidth between Intel Sapphire Rapids sockets that NCCL assumes
/// (`SRP_QPI_BW`, same file).
pub const SPR_INTER_SOCKET_GBS: f64 = 22.0;

/// NVLinks between the GPUs of a DGX-1 with V100 (hybrid cube-mesh), as `nvidia-smi topo -m`
/// prints it on 8x V100 SXM2 servers (NV1/NV2; e.g. the test reports of Oneflow-Inc/DLPerf).
/// Every GPU has 6 links.
const DGX1_NVLINKS: [[u8; 8]; 8] = [
    [0, 1, 1, 2, 2, 0, 0, 0],
    [1, 0, 2, 1, 0, 2, 0, 0],
    [1, 2, 0, 2, 0, 0, 1, 0],
    [2, 1, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 1, 1, 2],
    [0, 2, 0, 0, 1, 0, 2, 1],
    [0, 0, 1, 0, 1, 2, 0, 2],
    [0, 0, 0, 1, 2, 1, 2, 0],
];

/// Builds a preset by name.
pub fn build(name: &str) -> Result<Topology> {
    match name {
        "dgx-h100" => dgx_h100(),
        "dgx-a100" => dgx_a100(),
        "4xv100-nvlink" => v100_cube_mesh(
            name,
            4,
            "4x V100 SXM2, fully joined by NVLink 2 (a DGX-1 quad, hybrid cube-mesh: NCCL builds \
             rings over the NVLinks)",
        ),
        "dgx1-v100" => v100_cube_mesh(
            name,
            8,
            "DGX-1: 8x V100 SXM2 in an NVLink 2 hybrid cube-mesh",
        ),
        "2gpu-nvlink-bridge" => nvlink_bridge(),
        "8gpu-pcie4" => pcie_two_sockets(
            name,
            DeviceModel::A100,
            PCIE4_X16_GBS,
            AMD_INTER_SOCKET_GBS,
            "8x A100 PCIe on PCIe 4 x16 behind the host bridges of two AMD EPYC sockets",
        ),
        "8gpu-pcie5" => pcie_two_sockets(
            name,
            DeviceModel::H100,
            PCIE5_X16_GBS,
            SPR_INTER_SOCKET_GBS,
            "8x H100 PCIe on PCIe 5 x16 behind the host bridges of two Sapphire Rapids sockets",
        ),
        "2gpu-pcie4" => pcie_pair(
            name,
            DeviceModel::RtxA6000,
            PCIE4_X16_GBS,
            "2x RTX A6000 on PCIe 4 x16 behind one host bridge, no NVLink",
        ),
        "2gpu-pcie3" => pcie_pair(
            name,
            DeviceModel::Gtx1080Ti,
            PCIE3_X16_GBS,
            "2x GTX 1080 Ti on PCIe 3 x16 behind one host bridge, no NVLink",
        ),
        _ => {
            if let Some(hosts) = counted(name, "ib-", 2..=MAX_IB_NODES) {
                ib_cluster(hosts)
            } else if let Some(hosts) = counted(name, "p100-25gbe-", 2..=MAX_ROCE_NODES) {
                roce_cluster(hosts)
            } else {
                Err(ScalingError::UnknownTopology {
                    name: name.to_string(),
                    known: format!(
                        "{}, ib-<N>node (N = 2..={MAX_IB_NODES}), p100-25gbe-<N>node \
                         (N = 2..={MAX_ROCE_NODES})",
                        NAMES.join(", ")
                    ),
                })
            }
        }
    }
}

/// `N` of `<prefix><N>node`, when in `range`.
fn counted(name: &str, prefix: &str, range: std::ops::RangeInclusive<usize>) -> Option<usize> {
    let n: usize = name
        .strip_prefix(prefix)?
        .strip_suffix("node")?
        .parse()
        .ok()?;
    range.contains(&n).then_some(n)
}

/// One DGX H100 board: 8 H100 each with 18 NVLink 4 links into the NVSwitches (modelled as
/// one non-blocking switch node). Returns the GPU node ids.
fn add_dgx_h100_board(t: &mut Topology, host: usize, prefix: &str) -> Result<Vec<usize>> {
    add_nvswitch_board(t, host, prefix, 8, NVLINK4_PER_GPU_GBS)
}

/// `gpus` devices, each with `gbs` of NVLink per direction into one non-blocking NVSwitch
/// node. Returns the GPU node ids.
fn add_nvswitch_board(
    t: &mut Topology,
    host: usize,
    prefix: &str,
    gpus: usize,
    gbs: f64,
) -> Result<Vec<usize>> {
    let switch = t.add_node(format!("{prefix}nvswitch"), NodeKind::NvSwitch, Some(host));
    (0..gpus)
        .map(|i| {
            let gpu = t.add_node(format!("{prefix}gpu{i}"), NodeKind::Device, Some(host));
            t.add_link(gpu, switch, LinkKind::NvLink, gbs, 0.0)?;
            Ok(gpu)
        })
        .collect()
}

/// DGX A100: 8 A100 SXM4, each with 12 NVLink 3 links (300 GB/s per direction) into the
/// NVSwitches.
fn dgx_a100() -> Result<Topology> {
    let mut t = Topology::new(
        "dgx-a100",
        "DGX A100: 8x A100 SXM4, NVLink 3 (300 GB/s per GPU per direction) through NVSwitch",
        DeviceModel::A100,
    );
    add_nvswitch_board(&mut t, 0, "", 8, NVLINK3_PER_GPU_GBS)?;
    Ok(t)
}

fn dgx_h100() -> Result<Topology> {
    let mut t = Topology::new(
        "dgx-h100",
        "DGX H100: 8x H100 SXM, NVLink 4 (450 GB/s per GPU per direction) through NVSwitch",
        DeviceModel::H100,
    );
    add_dgx_h100_board(&mut t, 0, "")?;
    Ok(t)
}

/// `hosts` DGX H100 joined by InfiniBand NDR: each GPU has its own ConnectX-7 (400 Gbit/s) on a
/// PCIe 5 x16 path, and every NIC plugs into one non-blocking switch (a rail-optimised
/// fabric with full bisection).
fn ib_cluster(hosts: usize) -> Result<Topology> {
    let mut t = Topology::new(
        format!("ib-{hosts}node"),
        format!(
            "{hosts}x DGX H100 joined by InfiniBand NDR: one 400 Gbit/s ConnectX-7 per GPU, \
             one non-blocking switch"
        ),
        DeviceModel::H100,
    );
    let fabric = t.add_node("ib-switch", NodeKind::NetworkSwitch, None);
    for h in 0..hosts {
        let prefix = format!("host{h}/");
        for (i, gpu) in add_dgx_h100_board(&mut t, h, &prefix)?
            .into_iter()
            .enumerate()
        {
            let nic = t.add_node(format!("{prefix}nic{i}"), NodeKind::Nic, Some(h));
            t.add_link(gpu, nic, LinkKind::Pcie, PCIE5_X16_GBS, 0.0)?;
            t.add_link(nic, fabric, LinkKind::InfiniBand, NDR_PORT_GBS, 0.0)?;
        }
    }
    Ok(t)
}

/// `hosts` servers of Horovod's benchmark (horovod/horovod `docs/benchmarks.rst`: "128
/// servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s network"): per host
/// 4 P100 on PCIe 3 x16 behind one host bridge, one 25 GbE NIC on the same bridge, every
/// NIC on one non-blocking Ethernet switch.
fn roce_cluster(hosts: usize) -> Result<Topology> {
    let mut t = Topology::new(
        format!("p100-25gbe-{hosts}node"),
        format!(
            "{hosts} servers of 4x P100 on PCIe 3, one 25 Gbit/s RoCE NIC each, one \
             non-blocking switch (Horovod's benchmark machines)"
        ),
        DeviceModel::P100,
    );
    let fabric = t.add_node("ethernet-switch", NodeKind::NetworkSwitch, None);
    for h in 0..hosts {
        let cpu = t.add_node(format!("host{h}/cpu0"), NodeKind::HostBridge, Some(h));
        for i in 0..4 {
            let gpu = t.add_node(format!("host{h}/gpu{i}"), NodeKind::Device, Some(h));
            t.add_link(gpu, cpu, LinkKind::Pcie, PCIE3_X16_GBS, 0.0)?;
        }
        let nic = t.add_node(format!("host{h}/nic0"), NodeKind::Nic, Some(h));
        t.add_link(nic, cpu, LinkKind::Pcie, PCIE3_X16_GBS, 0.0)?;
        t.add_link(nic, fabric, LinkKind::Ethernet, ETHERNET_25G_GBS, 0.0)?;
    }
    Ok(t)
}

/// Two GPUs with no NVLink, each on its own x16 port of one host bridge.
fn pcie_pair(
    name: &str,
    device: DeviceModel,
    pcie_gbs: f64,
    description: &str,
) -> Result<Topology> {
    let mut t = Topology::new(name, description, device);
    let cpu = t.add_node("cpu0", NodeKind::HostBridge, Some(0));
    for i in 0..2 {
        let gpu = t.add_node(format!("gpu{i}"), NodeKind::Device, Some(0));
        t.add_link(gpu, cpu, LinkKind::Pcie, pcie_gbs, 0.0)?;
    }
    Ok(t)
}

/// The first `gpus` GPUs of a DGX-1's hybrid cube-mesh, with the NVLinks among them.
fn v100_cube_mesh(name: &str, gpus: usize, description: &str) -> Result<Topology> {
    let mut t = Topology::new(name, description, DeviceModel::V100Sxm2);
    let ids: Vec<usize> = (0..gpus)
        .map(|i| t.add_node(format!("gpu{i}"), NodeKind::Device, Some(0)))
        .collect();
    for i in 0..gpus {
        for j in i + 1..gpus {
            let links = DGX1_NVLINKS[i][j];
            if links > 0 {
                let gbs = f64::from(links) * NVLINK_PER_LINK_GBS;
                t.add_link(ids[i], ids[j], LinkKind::NvLink, gbs, 0.0)?;
            }
        }
    }
    Ok(t)
}

/// Two A100 PCIe joined by three NVLink bridges (NV12: 12 links, 300 GB/s per direction),
/// each also on PCIe 4 x16 to the host bridge.
fn nvlink_bridge() -> Result<Topology> {
    let mut t = Topology::new(
        "2gpu-nvlink-bridge",
        "2x A100 PCIe joined by NVLink bridges (NV12, 300 GB/s per direction), PCIe 4 to the host",
        DeviceModel::A100,
    );
    let cpu = t.add_node("cpu0", NodeKind::HostBridge, Some(0));
    let a = t.add_node("gpu0", NodeKind::Device, Some(0));
    let b = t.add_node("gpu1", NodeKind::Device, Some(0));
    t.add_link(a, b, LinkKind::NvLink, 12.0 * NVLINK_PER_LINK_GBS, 0.0)?;
    for gpu in [a, b] {
        t.add_link(gpu, cpu, LinkKind::Pcie, PCIE4_X16_GBS, 0.0)?;
    }
    Ok(t)
}

/// 8 GPUs, 4 per socket, each on its own x16 root port; the sockets joined by the
/// inter-socket link.
fn pcie_two_sockets(
    name: &str,
    device: DeviceModel,
    pcie_gbs: f64,
    inter_socket_gbs: f64,
    description: &str,
) -> Result<Topology> {
    let mut t = Topology::new(name, description, device);
    let cpus = [
        t.add_node("cpu0", NodeKind::HostBridge, Some(0)),
        t.add_node("cpu1", NodeKind::HostBridge, Some(0)),
    ];
    t.add_link(
        cpus[0],
        cpus[1],
        LinkKind::InterSocket,
        inter_socket_gbs,
        0.0,
    )?;
    for i in 0..8 {
        let gpu = t.add_node(format!("gpu{i}"), NodeKind::Device, Some(0));
        t.add_link(gpu, cpus[i / 4], LinkKind::Pcie, pcie_gbs, 0.0)?;
    }
    Ok(t)
}

/// The device model of a GPU name as the driver reports it (`NVIDIA H200` counts as an
/// H100: the same Hopper compute figures), `None` for a GPU the model has no figures for.
pub fn device_model_of(gpu_name: &str) -> Option<DeviceModel> {
    let n = gpu_name.to_ascii_uppercase();
    let has = |s: &str| n.contains(s);
    Some(if has("H100") || has("H200") || has("H800") {
        DeviceModel::H100
    } else if has("A100") || has("A800") {
        DeviceModel::A100
    } else if has("V100") {
        DeviceModel::V100Sxm2
    } else if has("A6000") {
        DeviceModel::RtxA6000
    } else if has("P100") {
        DeviceModel::P100
    } else if has("1080 TI") {
        DeviceModel::Gtx1080Ti
    } else {
        return None;
    })
}

/// A machine from its device matrix as `mirra topo` (and `nvidia-smi topo -m`) prints it:
/// `links[a][b]` is `X`, `NV<k>`, `PIX`, `PXB`, `PHB`, `NODE` or `SYS`.
///
/// GPUs that no `SYS` cell separates share a host bridge (a socket); sockets are joined by
/// the inter-socket link of `inter_socket_gbs`; every GPU is on `pcie_gbs` of PCIe to its
/// socket's bridge (a PCIe switch between GPUs, `PIX`/`PXB`, is modelled as the bridge: a
/// lower bound on what the switch gives). `NV<k>` cells are `k` NVLinks of
/// [`NVLINK_PER_LINK_GBS`]: directly between the two GPUs, or, when every pair of three or
/// more GPUs shows the same `NV<k>` with `k >= 12` (NVSwitch boards print that), as each
/// GPU's `k` links into one non-blocking NVSwitch node.
pub fn from_matrix(
    name: &str,
    device: DeviceModel,
    links: &[Vec<String>],
    pcie_gbs: f64,
    inter_socket_gbs: f64,
) -> Result<Topology> {
    let n = links.len();
    let invalid = |reason: String| ScalingError::InvalidTopology {
        topology: name.to_string(),
        reason,
    };
    if n == 0 {
        return Err(invalid("the matrix has no GPU".into()));
    }
    let cell = |a: usize, b: usize| -> Result<&str> {
        let row = &links[a];
        if row.len() != n {
            return Err(invalid(format!(
                "row {a} has {} cells, the matrix {n} rows",
                row.len()
            )));
        }
        Ok(row[b].as_str())
    };
    let mut nv = vec![vec![0u32; n]; n];
    for (a, nv_row) in nv.iter_mut().enumerate() {
        for (b, nv_cell) in nv_row.iter_mut().enumerate() {
            let c = cell(a, b)?;
            let ok = match c {
                "X" => a == b,
                "PIX" | "PXB" | "PHB" | "NODE" | "SYS" => a != b,
                other => match other.strip_prefix("NV").map(str::parse::<u32>) {
                    Some(Ok(k)) if k > 0 && a != b => {
                        *nv_cell = k;
                        true
                    }
                    _ => false,
                },
            };
            if !ok {
                return Err(invalid(format!("cell ({a}, {b}) is `{c}`")));
            }
        }
    }
    // Sockets: GPUs joined by anything but SYS, transitively.
    let mut socket: Vec<usize> = (0..n).collect();
    for a in 0..n {
        for b in 0..n {
            if cell(a, b)? != "SYS" {
                let (sa, sb) = (socket[a], socket[b]);
                for s in socket.iter_mut() {
                    if *s == sb {
                        *s = sa;
                    }
                }
            }
        }
    }
    let mut sockets: Vec<usize> = socket.clone();
    sockets.sort_unstable();
    sockets.dedup();
    let mut t = Topology::new(
        name,
        format!("{n} GPUs from `mirra topo` ({} socket(s))", sockets.len()),
        device,
    );
    let bridges: Vec<usize> = (0..sockets.len())
        .map(|i| t.add_node(format!("cpu{i}"), NodeKind::HostBridge, Some(0)))
        .collect();
    for i in 0..bridges.len() {
        for j in i + 1..bridges.len() {
            t.add_link(
                bridges[i],
                bridges[j],
                LinkKind::InterSocket,
                inter_socket_gbs,
                0.0,
            )?;
        }
    }
    let gpus: Vec<usize> = (0..n)
        .map(|i| t.add_node(format!("gpu{i}"), NodeKind::Device, Some(0)))
        .collect();
    for (i, &g) in gpus.iter().enumerate() {
        let s = sockets.iter().position(|&s| s == socket[i]).unwrap_or(0);
        t.add_link(g, bridges[s], LinkKind::Pcie, pcie_gbs, 0.0)?;
    }
    let k0 = nv[0].get(1).copied().unwrap_or(0);
    let switched = n >= 3 && k0 >= 12 && (0..n).all(|a| (0..n).all(|b| a == b || nv[a][b] == k0));
    if switched {
        let switch = t.add_node("nvswitch", NodeKind::NvSwitch, Some(0));
        for &g in &gpus {
            t.add_link(
                g,
                switch,
                LinkKind::NvLink,
                f64::from(k0) * NVLINK_PER_LINK_GBS,
                0.0,
            )?;
        }
    } else {
        for a in 0..n {
            for b in a + 1..n {
                if nv[a][b] > 0 {
                    let gbs = f64::from(nv[a][b]) * NVLINK_PER_LINK_GBS;
                    t.add_link(gpus[a], gpus[b], LinkKind::NvLink, gbs, 0.0)?;
                }
            }
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::HwClass;

    fn every_preset() -> Vec<Topology> {
        let mut all: Vec<Topology> = NAMES.iter().map(|n| build(n).unwrap()).collect();
        all.push(build("ib-3node").unwrap());
        all.push(build("p100-25gbe-3node").unwrap());
        all
    }

    #[test]
    fn every_preset_is_connected_and_routes_between_all_devices() {
        for t in every_preset() {
            assert!(t.devices().len() >= 2, "{}", t.name());
            for &a in t.devices() {
                for &b in t.devices() {
                    if a == b {
                        continue;
                    }
                    let r = t.route(a, b).unwrap();
                    // The hops chain from a to b.
                    let mut at = a;
                    for &h in &r.hops {
                        let (from, to) = t.ends(h);
                        assert_eq!(from, at, "{}: {a}->{b}", t.name());
                        at = to;
                    }
                    assert_eq!(at, b);
                    assert!(r.bottleneck_gbs > 0.0 && r.bottleneck_gbs.is_finite());
                }
            }
            // Every node (switches, NICs, bridges) is reachable too.
            for n in 0..t.nodes().len() {
                t.route(t.devices()[0], n).unwrap();
            }
        }
    }

    #[test]
    fn presets_have_the_cited_shapes() {
        let t = build("dgx-h100").unwrap();
        assert_eq!((t.devices().len(), t.device()), (8, DeviceModel::H100));
        let r = t.route(t.devices()[0], t.devices()[7]).unwrap();
        assert_eq!((r.hops.len(), r.class), (2, HwClass::NvLink));
        assert!((r.bottleneck_gbs - 380.0).abs() < 1e-9);

        // Every DGX-1 GPU has 6 NVLinks (150 GB/s per direction); the quad is fully joined.
        let dgx1 = build("dgx1-v100").unwrap();
        for &g in dgx1.devices() {
            let gbs: f64 = dgx1
                .links()
                .iter()
                .filter(|l| l.a == g || l.b == g)
                .map(|l| l.line_gbs)
                .sum();
            assert_eq!(gbs, 150.0);
        }
        let quad = build("4xv100-nvlink").unwrap();
        assert_eq!((quad.devices().len(), quad.links().len()), (4, 6));

        // PCIe: a hop across sockets takes the inter-socket link.
        let p5 = build("8gpu-pcie5").unwrap();
        let r = p5.route(p5.devices()[3], p5.devices()[4]).unwrap();
        assert_eq!((r.hops.len(), r.class), (3, HwClass::Pci));
        assert_eq!(r.bottleneck_gbs, SPR_INTER_SOCKET_GBS);

        // InfiniBand: each GPU leaves through its own NIC.
        let ib = build("ib-2node").unwrap();
        assert_eq!(ib.devices().len(), 16);
        let r = ib.route(ib.devices()[7], ib.devices()[8]).unwrap();
        assert_eq!((r.hops.len(), r.class), (4, HwClass::Net));
        assert!((r.bottleneck_gbs - 48.0).abs() < 1e-9);
        assert_eq!(ib.nodes()[ib.devices()[8]].host, Some(1));
    }

    #[test]
    fn unknown_names_list_the_presets() {
        for bad in [
            "dgx-b200",
            "ib-1node",
            "ib-33node",
            "ib-xnode",
            "p100-25gbe-129node",
            "",
        ] {
            let e = build(bad).unwrap_err();
            assert!(
                e.to_string().contains("dgx-h100, dgx-a100, 4xv100-nvlink")
                    && e.to_string().contains(bad),
                "{e}"
            );
        }
        assert_eq!(build("ib-32node").unwrap().devices().len(), 256);
        assert_eq!(build("p100-25gbe-128node").unwrap().devices().len(), 512);
    }

    fn matrix(rows: &[&str]) -> Vec<Vec<String>> {
        rows.iter()
            .map(|r| r.split_whitespace().map(str::to_string).collect())
            .collect()
    }

    #[test]
    fn a_machine_from_its_device_matrix() {
        // An NVSwitch board: one switch node, each GPU's 18 links into it (the dgx-h100
        // preset's shape).
        let rows: Vec<String> = (0..8)
            .map(|a| {
                (0..8)
                    .map(|b| if a == b { "X" } else { "NV18" })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
        let t = from_matrix(
            "here",
            DeviceModel::H100,
            &matrix(&rows),
            PCIE5_X16_GBS,
            22.0,
        )
        .unwrap();
        let nvlinks: Vec<_> = t
            .links()
            .iter()
            .filter(|l| l.kind == LinkKind::NvLink)
            .collect();
        assert_eq!(nvlinks.len(), 8);
        assert!(nvlinks
            .iter()
            .all(|l| (l.line_gbs - NVLINK4_PER_GPU_GBS).abs() < 1e-9));
        assert_eq!(
            t.nodes()
                .iter()
                .filter(|n| n.kind == NodeKind::NvSwitch)
                .count(),
            1
        );
        // Two GPUs bridged by NV12 on one socket: a direct NVLink of 300 GB/s, PCIe to one
        // bridge.
        let t = from_matrix(
            "pair",
            DeviceModel::A100,
            &matrix(&["X NV12", "NV12 X"]),
            PCIE4_X16_GBS,
            16.0,
        )
        .unwrap();
        assert_eq!(
            t.links()
                .iter()
                .filter(|l| l.kind == LinkKind::NvLink)
                .count(),
            1
        );
        assert_eq!(
            t.nodes()
                .iter()
                .filter(|n| n.kind == NodeKind::HostBridge)
                .count(),
            1
        );
        // Four GPUs on PCIe, two per socket.
        let t = from_matrix(
            "pcie",
            DeviceModel::A100,
            &matrix(&[
                "X PIX SYS SYS",
                "PIX X SYS SYS",
                "SYS SYS X PHB",
                "SYS SYS PHB X",
            ]),
            PCIE4_X16_GBS,
            16.0,
        )
        .unwrap();
        assert_eq!(
            t.nodes()
                .iter()
                .filter(|n| n.kind == NodeKind::HostBridge)
                .count(),
            2
        );
        assert_eq!(
            t.links()
                .iter()
                .filter(|l| l.kind == LinkKind::InterSocket)
                .count(),
            1
        );
        assert!(t.route(t.devices()[0], t.devices()[3]).is_ok());
        // Malformed matrices are errors naming the cell.
        for (rows, want) in [
            (vec!["X NV0", "NV0 X"], "cell (0, 1) is `NV0`"),
            (vec!["X PIX", "PIX"], "row 1 has 1 cells"),
            (vec!["PIX X", "X PIX"], "cell (0, 0) is `PIX`"),
            (vec!["X FOO", "FOO X"], "cell (0, 1) is `FOO`"),
        ] {
            let e = from_matrix("bad", DeviceModel::H100, &matrix(&rows), 63.0, 22.0)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
        assert_eq!(device_model_of("NVIDIA H200"), Some(DeviceModel::H100));
        assert_eq!(
            device_model_of("NVIDIA A100-SXM4-80GB"),
            Some(DeviceModel::A100)
        );
        assert_eq!(device_model_of("NVIDIA GeForce RTX 4090"), None);
    }
}
