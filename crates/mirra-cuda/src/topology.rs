//! How this machine's GPUs are connected, as `nvidia-smi topo -m` prints it: for every two
//! GPUs, NVLink (with its link count) or the PCIe path between them, and whether CUDA's
//! peer access works between them.
//!
//! - NVLink comes from NVML (`libnvidia-ml.so.1`, installed with the driver), loaded at run
//!   time: each active link's remote end is a GPU (a direct link) or an NVSwitch (every two
//!   GPUs with switched links are connected through it). Without NVML the matrix says so
//!   and shows the PCIe paths only.
//! - The PCIe path comes from each GPU's place in `/sys/devices` (its chain of bridges from
//!   the root complex) and NUMA node, classified as `nvidia-smi` does: `PIX` (through at
//!   most one PCIe switch), `PXB` (several switches, not the host bridge), `PHB` (through
//!   the host bridge), `NODE` (between host bridges of one NUMA node), `SYS` (across NUMA
//!   nodes, over the inter-socket link). [`pcie_connection`] is the classification, pure.
//! - Peer access: `cuDeviceCanAccessPeer`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use cudarc::driver::sys;

use crate::error::Context;
use crate::{devices, library, CudaError, Library, Result};

/// How two GPUs are connected (the cells of `nvidia-smi topo -m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// The GPU itself (`X`).
    Same,
    /// `n` bonded NVLinks, directly or through NVSwitches (`NV18`).
    NvLink(u32),
    /// Through at most one PCIe switch.
    Pix,
    /// Through several PCIe switches, not the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU's root complex).
    Phb,
    /// Between host bridges of one NUMA node.
    Node,
    /// Across NUMA nodes (the inter-socket link).
    Sys,
}

impl Connection {
    /// The cell as `nvidia-smi topo -m` prints it.
    pub fn label(self) -> String {
        match self {
            Connection::Same => "X".into(),
            Connection::NvLink(n) => format!("NV{n}"),
            Connection::Pix => "PIX".into(),
            Connection::Pxb => "PXB".into(),
            Connection::Phb => "PHB".into(),
            Connection::Node => "NODE".into(),
            Connection::Sys => "SYS".into(),
        }
    }

    /// A cell back from its label (`NV18`, `PIX`, ...).
    pub fn parse(s: &str) -> Option<Connection> {
        Some(match s {
            "X" => Connection::Same,
            "PIX" => Connection::Pix,
            "PXB" => Connection::Pxb,
            "PHB" => Connection::Phb,
            "NODE" => Connection::Node,
            "SYS" => Connection::Sys,
            _ => Connection::NvLink(s.strip_prefix("NV")?.parse().ok().filter(|&n| n > 0)?),
        })
    }
}

/// One GPU of the matrix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// The CUDA ordinal.
    pub ordinal: usize,
    /// The device's name (`NVIDIA H200`).
    pub name: String,
    /// Its PCI address as CUDA reports it (`0000:1B:00.0`).
    pub pci_bus_id: String,
    /// Its NUMA node, when the kernel reports one.
    pub numa_node: Option<i32>,
    /// Its chain in `/sys/devices`, root complex first, the GPU last (empty when unknown).
    pub pci_path: Vec<String>,
}

/// The device matrix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matrix {
    /// The GPUs, by ordinal.
    pub gpus: Vec<Gpu>,
    /// `links[a][b]`: how GPU `a` reaches GPU `b`.
    pub links: Vec<Vec<Connection>>,
    /// `peer_access[a][b]`: `cuDeviceCanAccessPeer(a, b)`.
    pub peer_access: Vec<Vec<bool>>,
    /// Where the NVLink column came from: `NVML`, or why it could not be read.
    pub nvlink_source: String,
}

/// The PCIe connection of two GPUs from their `/sys/devices` chains (root complex first)
/// and NUMA nodes; `Sys` when a chain is unknown and the nodes differ or are unknown.
pub fn pcie_connection(
    a: &[String],
    b: &[String],
    numa_a: Option<i32>,
    numa_b: Option<i32>,
) -> Connection {
    let same_node = numa_a.is_some() && numa_a == numa_b;
    if a.is_empty() || b.is_empty() || a[0] != b[0] {
        return if same_node {
            Connection::Node
        } else {
            Connection::Sys
        };
    }
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    if common <= 2 {
        // Only the root complex, or the root complex and one root port (two GPUs on one
        // root port without a switch cannot be): through the host bridge.
        return Connection::Phb;
    }
    // Below the common switch port: each leg is the switch's downstream port and the GPU
    // for one switch; more elements mean more switches.
    let (leg_a, leg_b) = (a.len() - common, b.len() - common);
    if leg_a <= 2 && leg_b <= 2 {
        Connection::Pix
    } else {
        Connection::Pxb
    }
}

/// NVML, loaded at run time: each GPU's active NVLinks, by remote end.
struct Nvml {
    lib: libloading::Library,
}

/// `nvmlPciInfo_t` (NVML 11+).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// A GPU's NVLinks: `(domain, bus, device)` of each active link's remote end.
type Remotes = Vec<(u32, u32, u32)>;

/// The most NVLinks a GPU has (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: c_uint = 18;

impl Nvml {
    fn open() -> std::result::Result<Nvml, String> {
        // SAFETY: loading the driver's NVML runs its initialisers, as nvidia-smi does.
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("NVML not found ({e})"))?;
        let nvml = Nvml { lib };
        // SAFETY: nvmlInit_v2 takes no arguments and returns an nvmlReturn_t.
        let rc = unsafe { nvml.call0("nvmlInit_v2")? };
        if rc != 0 {
            return Err(format!("nvmlInit_v2 returned {rc}"));
        }
        Ok(nvml)
    }

    /// # Safety
    /// `name` is an NVML function of no arguments returning `nvmlReturn_t`.
    unsafe fn call0(&self, name: &str) -> std::result::Result<c_int, String> {
        // SAFETY: the caller's contract.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn() -> c_int> = self
                .lib
                .get(name.as_bytes())
                .map_err(|e| format!("{name}: {e}"))?;
            Ok(f())
        }
    }

    /// The remote ends of the active NVLinks of the GPU at `bus_id`.
    fn remotes(&self, bus_id: &str) -> std::result::Result<Remotes, String> {
        type Handle = *mut c_void;
        let cid = CString::new(bus_id).map_err(|e| e.to_string())?;
        // SAFETY: the symbols have the signatures of nvml.h; every pointer passed is valid
        // for the call (a NUL-terminated string, locals of the declared types).
        unsafe {
            let by_bus: libloading::Symbol<
                unsafe extern "C" fn(*const c_char, *mut Handle) -> c_int,
            > = self
                .lib
                .get(b"nvmlDeviceGetHandleByPciBusId_v2")
                .map_err(|e| e.to_string())?;
            let state: libloading::Symbol<
                unsafe extern "C" fn(Handle, c_uint, *mut c_int) -> c_int,
            > = self
                .lib
                .get(b"nvmlDeviceGetNvLinkState")
                .map_err(|e| e.to_string())?;
            let remote: libloading::Symbol<
                unsafe extern "C" fn(Handle, c_uint, *mut PciInfo) -> c_int,
            > = self
                .lib
                .get(b"nvmlDeviceGetNvLinkRemotePciInfo_v2")
                .map_err(|e| e.to_string())?;
            let mut handle: Handle = std::ptr::null_mut();
            let rc = by_bus(cid.as_ptr(), &mut handle);
            if rc != 0 {
                return Err(format!(
                    "nvmlDeviceGetHandleByPciBusId_v2({bus_id}) returned {rc}"
                ));
            }
            let mut out = Vec::new();
            for link in 0..MAX_NVLINKS {
                let mut active: c_int = 0;
                // Past the device's last link NVML returns an error: no more links.
                if state(handle, link, &mut active) != 0 {
                    break;
                }
                if active == 0 {
                    continue;
                }
                let mut info: PciInfo = std::mem::zeroed();
                if remote(handle, link, &mut info) == 0 {
                    out.push((info.domain, info.bus, info.device));
                }
            }
            Ok(out)
        }
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: nvmlShutdown pairs with the nvmlInit_v2 of `open`.
        let _ = unsafe { self.call0("nvmlShutdown") };
    }
}

/// `(domain, bus, device)` of a PCI address `DDDD:BB:DD.F` (hexadecimal).
fn pci_triple(bus_id: &str) -> Option<(u32, u32, u32)> {
    let mut parts = bus_id.trim().split([':', '.']);
    let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
    let bus = u32::from_str_radix(parts.next()?, 16).ok()?;
    let device = u32::from_str_radix(parts.next()?, 16).ok()?;
    Some((domain, bus, device))
}

/// NVLink connections from each GPU's link remotes: a direct link per remote that is
/// another GPU; GPUs that both have links to non-GPU remotes (NVSwitches) connect through
/// them with the smaller of their switched link counts.
pub fn nvlink_connections(gpus: &[(u32, u32, u32)], remotes: &[Remotes]) -> Vec<Vec<Option<u32>>> {
    let n = gpus.len();
    let mut links = vec![vec![None; n]; n];
    let switched: Vec<u32> = remotes
        .iter()
        .map(|r| r.iter().filter(|x| !gpus.contains(x)).count() as u32)
        .collect();
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let direct = remotes[a].iter().filter(|x| **x == gpus[b]).count() as u32;
            let through = switched[a].min(switched[b]);
            let total = direct + through;
            if total > 0 {
                links[a][b] = Some(total);
            }
        }
    }
    links
}

/// The `/sys/devices` chain of the PCI device at `bus_id`, and its NUMA node.
fn sysfs_place(bus_id: &str) -> (Vec<String>, Option<i32>) {
    let id = bus_id.to_ascii_lowercase();
    let dev = std::path::Path::new("/sys/bus/pci/devices").join(&id);
    let path = std::fs::canonicalize(&dev)
        .ok()
        .and_then(|p| {
            let s = p.to_string_lossy().into_owned();
            s.strip_prefix("/sys/devices/")
                .map(|rest| rest.split('/').map(str::to_string).collect::<Vec<_>>())
        })
        .unwrap_or_default();
    let numa = std::fs::read_to_string(dev.join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&n| n >= 0);
    (path, numa)
}

/// The matrix of this machine's GPUs (an error when there is no driver or no GPU).
pub fn matrix() -> Result<Matrix> {
    let count = devices::device_count()?;
    if count == 0 {
        return Err(CudaError::Unsupported {
            what: "the CUDA driver reports no device".into(),
        });
    }
    library::ensure(Library::Driver)?;
    let mut gpus = Vec::with_capacity(count);
    for ordinal in 0..count {
        // SAFETY: ordinals below the driver's count are devices; buffers are written by
        // the calls within their sizes.
        let (name, bus) = unsafe {
            let mut dev: sys::CUdevice = 0;
            sys::cuDeviceGet(&mut dev, ordinal as c_int)
                .result()
                .op("cuDeviceGet")?;
            let mut name = [0 as c_char; 256];
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev)
                .result()
                .op("cuDeviceGetName")?;
            let mut bus = [0 as c_char; 32];
            sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, dev)
                .result()
                .op("cuDeviceGetPCIBusId")?;
            (
                CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
                CStr::from_ptr(bus.as_ptr()).to_string_lossy().into_owned(),
            )
        };
        let (pci_path, numa_node) = sysfs_place(&bus);
        gpus.push(Gpu {
            ordinal,
            name,
            pci_bus_id: bus,
            numa_node,
            pci_path,
        });
    }
    let mut peer_access = vec![vec![false; count]; count];
    for (a, row) in peer_access.iter_mut().enumerate() {
        for (b, cell) in row.iter_mut().enumerate() {
            if a == b {
                continue;
            }
            let mut can: c_int = 0;
            // SAFETY: both ordinals are devices; `can` is written by the call.
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, a as c_int, b as c_int) }
                .result()
                .op("cuDeviceCanAccessPeer")?;
            *cell = can != 0;
        }
    }
    let triples: Vec<(u32, u32, u32)> = gpus
        .iter()
        .map(|g| pci_triple(&g.pci_bus_id).unwrap_or((u32::MAX, 0, 0)))
        .collect();
    let (nvlinks, nvlink_source) = match Nvml::open().and_then(|nvml| {
        gpus.iter()
            .map(|g| nvml.remotes(&g.pci_bus_id))
            .collect::<std::result::Result<Vec<_>, _>>()
    }) {
        Ok(remotes) => (nvlink_connections(&triples, &remotes), "NVML".to_string()),
        Err(why) => (vec![vec![None; count]; count], why),
    };
    let links = (0..count)
        .map(|a| {
            (0..count)
                .map(|b| match (a == b, nvlinks[a][b]) {
                    (true, _) => Connection::Same,
                    (false, Some(n)) => Connection::NvLink(n),
                    (false, None) => pcie_connection(
                        &gpus[a].pci_path,
                        &gpus[b].pci_path,
                        gpus[a].numa_node,
                        gpus[b].numa_node,
                    ),
                })
                .collect()
        })
        .collect();
    Ok(Matrix {
        gpus,
        links,
        peer_access,
        nvlink_source,
    })
}

impl Matrix {
    /// The matrix as `nvidia-smi topo -m` prints it, with the peer-access matrix and a
    /// legend below.
    pub fn render(&self) -> String {
        let n = self.gpus.len();
        let mut out = String::from("        ");
        for g in &self.gpus {
            out.push_str(&format!("{:<7}", format!("GPU{}", g.ordinal)));
        }
        out.push_str("NUMA  PCI        name\n");
        for (a, g) in self.gpus.iter().enumerate() {
            out.push_str(&format!("{:<8}", format!("GPU{}", g.ordinal)));
            for b in 0..n {
                out.push_str(&format!("{:<7}", self.links[a][b].label()));
            }
            out.push_str(&format!(
                "{:<6}{:<11}{}\n",
                g.numa_node.map_or("N/A".into(), |x| x.to_string()),
                g.pci_bus_id,
                g.name
            ));
        }
        out.push_str("\nPeer access (cuDeviceCanAccessPeer, row to column):\n        ");
        for g in &self.gpus {
            out.push_str(&format!("{:<7}", format!("GPU{}", g.ordinal)));
        }
        out.push('\n');
        for (a, g) in self.gpus.iter().enumerate() {
            out.push_str(&format!("{:<8}", format!("GPU{}", g.ordinal)));
            for b in 0..n {
                let cell = if a == b {
                    "X"
                } else if self.peer_access[a][b] {
                    "yes"
                } else {
                    "no"
                };
                out.push_str(&format!("{cell:<7}"));
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "\nLegend (NVLink from {}):\n  X    = self\n  NV#  = a bonded set of # NVLinks \
             (directly or through NVSwitches)\n  PIX  = through at most one PCIe switch\n  \
             PXB  = through several PCIe switches, not the host bridge\n  PHB  = through a PCIe \
             host bridge (the CPU)\n  NODE = between PCIe host bridges of one NUMA node\n  SYS  = \
             across NUMA nodes (the inter-socket link)\n",
            self.nvlink_source
        ));
        out
    }

    /// The link matrix as labels, row by row (what `mirra-scaling` builds a topology from).
    pub fn labels(&self) -> Vec<Vec<String>> {
        self.links
            .iter()
            .map(|row| row.iter().map(|c| c.label()).collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(s: &str) -> Vec<String> {
        s.split('/').map(str::to_string).collect()
    }

    #[test]
    fn pcie_paths_classify_as_nvidia_smi_does() {
        // Two GPUs behind one switch (root port, switch upstream port, two downstream
        // ports): PIX.
        let a = chain("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
        let b = chain("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0");
        assert_eq!(pcie_connection(&a, &b, Some(0), Some(0)), Connection::Pix);
        // Behind two levels of switches: PXB.
        let c = chain("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:05:00.0/0000:06:00.0/0000:07:00.0");
        assert_eq!(pcie_connection(&a, &c, Some(0), Some(0)), Connection::Pxb);
        // On two root ports of one root complex: PHB.
        let d = chain("pci0000:00/0000:00:03.0/0000:08:00.0");
        assert_eq!(pcie_connection(&a, &d, Some(0), Some(0)), Connection::Phb);
        // Two root complexes: NODE on one NUMA node, SYS across nodes or when unknown.
        let e = chain("pci0000:80/0000:80:01.0/0000:81:00.0");
        assert_eq!(pcie_connection(&a, &e, Some(0), Some(0)), Connection::Node);
        assert_eq!(pcie_connection(&a, &e, Some(0), Some(1)), Connection::Sys);
        assert_eq!(pcie_connection(&a, &[], None, None), Connection::Sys);
    }

    #[test]
    fn nvlinks_count_direct_links_and_switched_ones() {
        let gpus = [(0, 0x1b, 0), (0, 0x43, 0), (0, 0x52, 0)];
        let switch = (0, 0xa0, 0);
        // GPU0 and GPU1: 4 direct links; GPU2 none; GPU0 and GPU1 also 2 links each to a
        // switch, GPU2 none.
        let remotes = vec![
            vec![gpus[1]; 4].into_iter().chain([switch; 2]).collect(),
            vec![gpus[0]; 4].into_iter().chain([switch; 2]).collect(),
            vec![],
        ];
        let links = nvlink_connections(&gpus, &remotes);
        assert_eq!(links[0][1], Some(6));
        assert_eq!(links[1][0], Some(6));
        assert_eq!(links[0][2], None);
        assert_eq!(links[2][1], None);
        // An NVSwitch machine: 18 links each to the switches, every pair NV18.
        let all = vec![vec![switch; 18]; 3];
        let links = nvlink_connections(&gpus, &all);
        assert!((0..3).all(|a| (0..3).all(|b| a == b || links[a][b] == Some(18))));
    }

    #[test]
    fn labels_round_trip_and_pci_ids_parse() {
        for c in [
            Connection::Same,
            Connection::NvLink(18),
            Connection::Pix,
            Connection::Pxb,
            Connection::Phb,
            Connection::Node,
            Connection::Sys,
        ] {
            assert_eq!(Connection::parse(&c.label()), Some(c));
        }
        assert_eq!(Connection::parse("NV0"), None);
        assert_eq!(Connection::parse("NVx"), None);
        assert_eq!(pci_triple("0000:1B:00.0"), Some((0, 0x1b, 0)));
        assert_eq!(pci_triple("00000000:C3:00.0"), Some((0, 0xc3, 0)));
        assert_eq!(pci_triple("bogus"), None);
    }

    #[test]
    fn without_a_driver_the_matrix_is_an_error_naming_it() {
        if devices::device_count().is_err() {
            let e = matrix().unwrap_err().to_string();
            assert!(e.starts_with("no CUDA driver found"), "{e}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn the_matrix_of_this_machine_has_every_gpu() {
        let m = matrix().unwrap();
        assert!(!m.gpus.is_empty());
        for (a, row) in m.links.iter().enumerate() {
            assert_eq!(row[a], Connection::Same);
            assert_eq!(row.len(), m.gpus.len());
        }
        let text = m.render();
        assert!(
            text.contains("GPU0") && text.contains(&m.gpus[0].name),
            "{text}"
        );
        // The PCI address the driver gives is the device's place in /sys.
        assert!(
            m.gpus[0]
                .pci_path
                .last()
                .is_some_and(|p| p.eq_ignore_ascii_case(&m.gpus[0].pci_bus_id)),
            "{:?} vs {}",
            m.gpus[0].pci_path,
            m.gpus[0].pci_bus_id
        );
    }
}
