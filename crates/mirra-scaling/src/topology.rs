//! Devices, switches and the links between them, and routing on them.
//!
//! A topology is a graph: nodes are devices (the GPUs the replicas run on) and the things
//! between them (NVSwitches, host bridges, NICs, network switches); links are full duplex,
//! with a line rate per direction, a technology ([`LinkKind`]) that says which fraction of
//! the line rate a transfer achieves, and a latency. Routes are widest-shortest paths: the
//! fewest hops, and among those the one whose narrowest link is widest (NCCL also prefers
//! the shortest path class, then bandwidth).

use std::collections::VecDeque;

use crate::tuning::{HwClass, Overheads};
use crate::{Result, ScalingError};

/// What the replicas run on; decides which cited compute figures apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceModel {
    /// NVIDIA P100 (Pascal).
    P100,
    /// NVIDIA GeForce GTX 1080 Ti (Pascal).
    Gtx1080Ti,
    /// NVIDIA V100 SXM2 (Volta).
    V100Sxm2,
    /// NVIDIA A100 (Ampere).
    A100,
    /// NVIDIA RTX A6000 (Ampere, a workstation card).
    RtxA6000,
    /// NVIDIA H100 (Hopper).
    H100,
    /// A thread of this host's CPU, as mirra's shared-memory collectives run.
    HostThread,
}

impl DeviceModel {
    /// A short display name.
    pub const fn name(self) -> &'static str {
        match self {
            DeviceModel::P100 => "P100",
            DeviceModel::Gtx1080Ti => "GTX 1080 Ti",
            DeviceModel::V100Sxm2 => "V100 SXM2",
            DeviceModel::A100 => "A100",
            DeviceModel::RtxA6000 => "RTX A6000",
            DeviceModel::H100 => "H100",
            DeviceModel::HostThread => "host thread",
        }
    }
}

/// What a node of the graph is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A device a replica runs on.
    Device,
    /// An NVSwitch (one node stands for a non-blocking set of switch chips).
    NvSwitch,
    /// A CPU socket's PCIe root complex (host bridge).
    HostBridge,
    /// A network interface card.
    Nic,
    /// A network switch (one node stands for a non-blocking fabric).
    NetworkSwitch,
    /// Host memory shared by threads.
    Memory,
}

/// A node: a name for messages, its kind, and the host (machine) it sits in; network
/// switches belong to no host.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// A unique, human-readable name (`gpu3`, `host1/nic0`).
    pub name: String,
    /// What the node is.
    pub kind: NodeKind,
    /// The machine it belongs to.
    pub host: Option<usize>,
}

/// The fraction of NVLink line rate a peer-to-peer copy achieves: 380 of 450 GB/s one way
/// between two H100 SXM (NVIDIA/nccl issue 1264; `shared/design/PUBLIC-FIGURES.md`).
/// Applied to every NVLink generation (NVIDIA quotes the same 25 GB/s per link per direction
/// for NVLink 2, 3 and 4; the overhead is the protocol's).
pub const NVLINK_EFFICIENCY: f64 = 380.0 / 450.0;

/// The fraction of PCIe line rate a copy achieves: 55.43 of 63 GB/s host-to-device on PCIe 5
/// x16, measured with nvbandwidth on an 8x H200 node (stas00/ml-engineering
/// `network/README.md`, PCIe section). Applied to PCIe 4 as well (same 128b/130b encoding).
pub const PCIE_EFFICIENCY: f64 = 55.43 / 63.0;

/// The fraction of a NIC's line rate NCCL counts on: 12.0 GB/s for a 100 Gbit/s (12.5 GB/s)
/// NIC (`NET_BW` in NVIDIA/nccl `src/graph/topo.h`, v2.30.7).
pub const NET_EFFICIENCY: f64 = 12.0 / 12.5;

/// The technology of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// NVLink (a bonded set of links, or a GPU's links to an NVSwitch).
    NvLink,
    /// PCIe, device to host bridge or to a NIC.
    Pcie,
    /// The link between CPU sockets (UPI, xGMI); its bandwidth is given as the achievable
    /// figure NCCL assumes, so its efficiency is 1.
    InterSocket,
    /// An InfiniBand port.
    InfiniBand,
    /// An Ethernet port carrying RDMA (RoCE); NCCL treats it as InfiniBand.
    Ethernet,
    /// A thread's path to host memory; its bandwidth is a measured copy rate, so its
    /// efficiency is 1.
    SharedMemory,
}

impl LinkKind {
    /// The fraction of the line rate a transfer achieves.
    pub fn efficiency(self) -> f64 {
        match self {
            LinkKind::NvLink => NVLINK_EFFICIENCY,
            LinkKind::Pcie => PCIE_EFFICIENCY,
            LinkKind::InfiniBand | LinkKind::Ethernet => NET_EFFICIENCY,
            LinkKind::InterSocket | LinkKind::SharedMemory => 1.0,
        }
    }

    /// The NCCL hardware class of a path through this link.
    pub fn class(self) -> HwClass {
        match self {
            LinkKind::NvLink => HwClass::NvLink,
            LinkKind::Pcie | LinkKind::InterSocket => HwClass::Pci,
            LinkKind::InfiniBand | LinkKind::Ethernet => HwClass::Net,
            LinkKind::SharedMemory => HwClass::Host,
        }
    }
}

/// A full-duplex link between nodes `a` and `b`.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    /// One end (a node id).
    pub a: usize,
    /// The other end.
    pub b: usize,
    /// The technology.
    pub kind: LinkKind,
    /// Line rate per direction, GB/s (1e9 bytes).
    pub line_gbs: f64,
    /// Wire latency in microseconds, added to NCCL's per-step overhead. The presets leave it
    /// at 0: NCCL's per-step figures are measured end to end and include the wire.
    pub latency_us: f64,
}

impl Link {
    /// The achievable bandwidth per direction, GB/s.
    pub fn gbs(&self) -> f64 {
        self.line_gbs * self.kind.efficiency()
    }
}

/// One direction of a link: `2 * link` runs from its `a` to its `b`, `2 * link + 1` back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DirectedLink(pub usize);

impl DirectedLink {
    /// The link this is a direction of.
    pub const fn link(self) -> usize {
        self.0 / 2
    }
}

/// A path between two nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// The link directions crossed, in order.
    pub hops: Vec<DirectedLink>,
    /// The dearest hardware class on the path.
    pub class: HwClass,
    /// The sum of the links' latencies, microseconds.
    pub latency_us: f64,
    /// The narrowest link's achievable bandwidth, GB/s.
    pub bottleneck_gbs: f64,
}

/// A machine (or several joined by a network) as a graph of nodes and links.
#[derive(Clone, Debug)]
pub struct Topology {
    name: String,
    description: String,
    device: DeviceModel,
    nodes: Vec<Node>,
    links: Vec<Link>,
    devices: Vec<usize>,
    adjacency: Vec<Vec<(usize, DirectedLink)>>,
    overheads: Overheads,
}

impl Topology {
    /// An empty topology whose devices are `device`s, with NCCL's overheads
    /// ([`Overheads::nccl`]).
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        device: DeviceModel,
    ) -> Self {
        Topology {
            name: name.into(),
            description: description.into(),
            device,
            nodes: Vec::new(),
            links: Vec::new(),
            devices: Vec::new(),
            adjacency: Vec::new(),
            overheads: Overheads::nccl(),
        }
    }

    /// Adds a node and returns its id. Devices are numbered (ranked) in the order they are
    /// added.
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        kind: NodeKind,
        host: Option<usize>,
    ) -> usize {
        let id = self.nodes.len();
        self.nodes.push(Node {
            name: name.into(),
            kind,
            host,
        });
        self.adjacency.push(Vec::new());
        if kind == NodeKind::Device {
            self.devices.push(id);
        }
        id
    }

    /// Adds a full-duplex link and returns its id.
    pub fn add_link(
        &mut self,
        a: usize,
        b: usize,
        kind: LinkKind,
        line_gbs: f64,
        latency_us: f64,
    ) -> Result<usize> {
        let n = self.nodes.len();
        let reason = if a >= n || b >= n {
            Some(format!("link {a}-{b} names a node outside 0..{n}"))
        } else if a == b {
            Some(format!("link from `{}` to itself", self.nodes[a].name))
        } else if !(line_gbs.is_finite() && line_gbs > 0.0) {
            Some(format!(
                "link {a}-{b}: bandwidth {line_gbs} GB/s is not positive"
            ))
        } else if !(latency_us.is_finite() && latency_us >= 0.0) {
            Some(format!("link {a}-{b}: latency {latency_us} us is negative"))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(self.invalid(reason));
        }
        let id = self.links.len();
        self.links.push(Link {
            a,
            b,
            kind,
            line_gbs,
            latency_us,
        });
        self.adjacency[a].push((b, DirectedLink(2 * id)));
        self.adjacency[b].push((a, DirectedLink(2 * id + 1)));
        Ok(id)
    }

    /// Replaces the per-collective and per-step overheads (a machine whose costs are not
    /// NCCL's).
    pub fn set_overheads(&mut self, overheads: Overheads) {
        self.overheads = overheads;
    }

    /// The preset's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One line on what the machine is.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// What the replicas run on.
    pub fn device(&self) -> DeviceModel {
        self.device
    }

    /// All nodes, by id.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// All links, by id.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// The device nodes, in rank order.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The overheads schedules charge on this machine.
    pub fn overheads(&self) -> &Overheads {
        &self.overheads
    }

    /// The achievable bandwidth of a link direction, GB/s.
    pub fn gbs(&self, hop: DirectedLink) -> f64 {
        self.links[hop.link()].gbs()
    }

    /// The nodes a link direction runs from and to.
    pub fn ends(&self, hop: DirectedLink) -> (usize, usize) {
        let l = &self.links[hop.link()];
        if hop.0.is_multiple_of(2) {
            (l.a, l.b)
        } else {
            (l.b, l.a)
        }
    }

    /// The node ids of the first `replicas` devices (one replica per device, in rank order).
    pub fn replicas(&self, replicas: usize) -> Result<&[usize]> {
        if replicas == 0 || replicas > self.devices.len() {
            return Err(ScalingError::ReplicasOutOfRange {
                topology: self.name.clone(),
                replicas,
                devices: self.devices.len(),
            });
        }
        Ok(&self.devices[..replicas])
    }

    /// The widest-shortest path from node `from` to node `to`.
    pub fn route(&self, from: usize, to: usize) -> Result<Route> {
        let n = self.nodes.len();
        if from >= n || to >= n {
            return Err(self.invalid(format!("route {from}->{to} names a node outside 0..{n}")));
        }
        // Breadth-first: every node of level d is taken off the queue before any of level
        // d + 1, so a node's widest predecessor is settled before the node is expanded.
        let mut hops_to = vec![usize::MAX; n];
        let mut width = vec![0.0f64; n];
        let mut via: Vec<Option<(usize, DirectedLink)>> = vec![None; n];
        hops_to[from] = 0;
        width[from] = f64::INFINITY;
        let mut queue = VecDeque::from([from]);
        while let Some(u) = queue.pop_front() {
            if u == to {
                break;
            }
            for &(v, hop) in &self.adjacency[u] {
                let w = width[u].min(self.gbs(hop));
                if hops_to[v] == usize::MAX {
                    hops_to[v] = hops_to[u] + 1;
                    width[v] = w;
                    via[v] = Some((u, hop));
                    queue.push_back(v);
                } else if hops_to[v] == hops_to[u] + 1 && w > width[v] {
                    width[v] = w;
                    via[v] = Some((u, hop));
                }
            }
        }
        if hops_to[to] == usize::MAX {
            return Err(ScalingError::NoRoute {
                topology: self.name.clone(),
                from: self.nodes[from].name.clone(),
                to: self.nodes[to].name.clone(),
            });
        }
        let mut hops = Vec::with_capacity(hops_to[to]);
        let mut at = to;
        while let Some((prev, hop)) = via[at] {
            hops.push(hop);
            at = prev;
        }
        hops.reverse();
        let links = hops.iter().map(|h| &self.links[h.link()]);
        Ok(Route {
            class: links
                .clone()
                .map(|l| l.kind.class())
                .max()
                .unwrap_or(HwClass::Host),
            latency_us: links.map(|l| l.latency_us).sum(),
            bottleneck_gbs: if hops.is_empty() {
                f64::INFINITY
            } else {
                width[to]
            },
            hops,
        })
    }

    fn invalid(&self, reason: String) -> ScalingError {
        ScalingError::InvalidTopology {
            topology: self.name.clone(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// a - s - b, plus a slow direct a - b link: the direct link is one hop and wins; c
    /// hangs off b by two parallel paths of different widths.
    fn small() -> Topology {
        let mut t = Topology::new("small", "test", DeviceModel::H100);
        let a = t.add_node("a", NodeKind::Device, Some(0));
        let b = t.add_node("b", NodeKind::Device, Some(0));
        let s = t.add_node("s", NodeKind::NvSwitch, Some(0));
        let c = t.add_node("c", NodeKind::Device, Some(0));
        let x = t.add_node("x", NodeKind::HostBridge, Some(0));
        let y = t.add_node("y", NodeKind::HostBridge, Some(0));
        t.add_link(a, s, LinkKind::NvLink, 450.0, 0.0).unwrap();
        t.add_link(b, s, LinkKind::NvLink, 450.0, 0.0).unwrap();
        t.add_link(a, b, LinkKind::Pcie, 31.5, 0.5).unwrap();
        t.add_link(b, x, LinkKind::Pcie, 31.5, 0.0).unwrap();
        t.add_link(b, y, LinkKind::Pcie, 63.0, 0.0).unwrap();
        t.add_link(x, c, LinkKind::Pcie, 63.0, 0.0).unwrap();
        t.add_link(y, c, LinkKind::Pcie, 63.0, 0.0).unwrap();
        t
    }

    #[test]
    fn routes_take_fewest_hops_then_widest() {
        let t = small();
        let r = t.route(0, 1).unwrap();
        assert_eq!(r.hops, [DirectedLink(4)]);
        assert_eq!((r.class, r.latency_us), (HwClass::Pci, 0.5));
        assert_eq!(t.route(1, 0).unwrap().hops, [DirectedLink(5)]);
        let r = t.route(1, 3).unwrap();
        // Through y (63 GB/s), not x (31.5 GB/s).
        assert_eq!(r.hops, [DirectedLink(8), DirectedLink(12)]);
        assert!((r.bottleneck_gbs - 63.0 * PCIE_EFFICIENCY).abs() < 1e-9);
        assert_eq!(t.devices(), [0, 1, 3]);
    }

    #[test]
    fn bad_links_and_lonely_nodes_are_errors() {
        let mut t = small();
        for (a, b, gbs, lat) in [
            (0, 0, 1.0, 0.0),
            (0, 99, 1.0, 0.0),
            (0, 1, 0.0, 0.0),
            (0, 1, f64::NAN, 0.0),
            (0, 1, 1.0, -1.0),
        ] {
            let e = t.add_link(a, b, LinkKind::NvLink, gbs, lat).unwrap_err();
            assert!(matches!(e, ScalingError::InvalidTopology { .. }), "{e}");
        }
        let z = t.add_node("z", NodeKind::Device, None);
        let e = t.route(0, z).unwrap_err();
        assert_eq!(e.to_string(), "topology `small`: no route from `a` to `z`");
        assert!(t.route(0, 100).is_err());
        assert!(matches!(
            t.replicas(0),
            Err(ScalingError::ReplicasOutOfRange { .. })
        ));
        assert!(matches!(
            t.replicas(5),
            Err(ScalingError::ReplicasOutOfRange { devices: 4, .. })
        ));
        assert_eq!(t.replicas(2).unwrap(), [0, 1]);
    }
}
