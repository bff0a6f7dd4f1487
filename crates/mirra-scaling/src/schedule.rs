//! NCCL's ring and tree all-reduce, simulated on a topology.
//!
//! Both are costed step by step with the alpha-beta model: a step in which every rank sends
//! `c` bytes to its peer costs `alpha + c / share`, where `alpha` is NCCL's per-step latency
//! for the path's hardware class (plus any wire latency of its links) and `share` is the
//! bandwidth the flow gets: a link direction crossed by `k` concurrent flows gives each
//! `1/k` of its achievable bandwidth, and a flow is as fast as its most shared link. Each
//! call also pays NCCL's fixed launch overhead once.
//!
//! - **Ring** (reduce-scatter then all-gather): `2(n-1)` steps of `S / (n k)` bytes on each of
//!   `k` rings that run at once, each carrying `1/k` of the buffer. The rings are chosen the
//!   way NCCL's topology search does: fix the bandwidth each ring gets, pack as many rings
//!   as the links hold, keep the best `k x bandwidth` (see `pick_rings`; on NVSwitch one ring
//!   is as good as many, on the V100 cube-mesh six rings use every NVLink). Candidates are
//!   every Hamiltonian cycle on one host of up to 8 devices, and for several hosts the
//!   host-major orders rotated so that each ring enters and leaves a host through a
//!   different device (and NIC), as NCCL's rings do.
//! - **Tree** (NCCL's): within a host a chain, between hosts NCCL's double binary tree; two
//!   trees, each reducing half the buffer, the second with reversed chains and a mirrored
//!   (or shifted) host tree so that the two use different devices and NICs. Reduce up and
//!   broadcast down are pipelined, so a call costs `2 depth` steps of latency plus half the
//!   buffer at the bandwidth the busiest link gives every tree edge, up and down at once.

use std::collections::HashMap;

use crate::ablation::Ablation;
use crate::topology::{DirectedLink, Route, Topology};
use crate::tuning::Algorithm;
use crate::{Result, ScalingError};

/// Hosts with at most this many devices get every Hamiltonian cycle as a ring candidate
/// (7! = 5040 at 8); larger ones only rank order and its reverse.
pub const MAX_PERMUTED_RANKS: usize = 8;

/// At most this many rings (NCCL's `MAXCHANNELS` is 32, and it runs rings in pairs).
pub const MAX_RINGS: usize = 16;

/// An all-reduce algorithm laid out on the first `replicas` devices of a topology: the cost
/// of a call is `base + latency + bytes / algbw`.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    algorithm: Algorithm,
    ranks: usize,
    base_s: f64,
    latency_s: f64,
    algbw_gbs: f64,
    steps: usize,
    channels: usize,
}

/// The predicted cost of one all-reduce.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Wall time, seconds.
    pub seconds: f64,
    /// Bytes of the buffer over the time, GB/s.
    pub algbw_gbs: f64,
    /// nccl-tests' bus bandwidth, `algbw * 2(n-1)/n`, GB/s.
    pub busbw_gbs: f64,
}

/// The cost of an all-reduce of `bytes` on the first `replicas` devices of `topology`.
pub fn all_reduce(
    topology: &Topology,
    algorithm: Algorithm,
    replicas: usize,
    bytes: usize,
) -> Result<Cost> {
    Ok(Schedule::new(topology, algorithm, replicas)?.cost(bytes))
}

/// nccl-tests' bus-bandwidth factor of all-reduce at `n` ranks, `2(n-1)/n`.
pub fn bus_factor(n: usize) -> f64 {
    let n = n.max(1) as f64;
    2.0 * (n - 1.0) / n
}

impl Schedule {
    /// Lays `algorithm` out on the first `replicas` devices of `topology`.
    pub fn new(topology: &Topology, algorithm: Algorithm, replicas: usize) -> Result<Self> {
        let devices = topology.replicas(replicas)?;
        let mut s = Schedule {
            algorithm,
            ranks: replicas,
            base_s: 0.0,
            latency_s: 0.0,
            algbw_gbs: f64::INFINITY,
            steps: 0,
            channels: 0,
        };
        if replicas == 1 {
            // One replica has nothing to reduce: no call is made.
            return Ok(s);
        }
        let mut routes = Routes::new(topology);
        let laid = match algorithm {
            Algorithm::Ring => ring(&mut routes, devices)?,
            Algorithm::Tree => tree(&mut routes, devices)?,
        };
        s.base_s = topology.overheads().base(algorithm) * 1e-6;
        s.latency_s = laid.latency_us * 1e-6;
        s.algbw_gbs = laid.algbw_gbs;
        s.steps = laid.steps;
        s.channels = laid.channels;
        Ok(s)
    }

    /// This schedule as `ablation` costs it: without communication every call takes no
    /// time (infinite bandwidth, no latency); with double bandwidth it moves its bytes twice
    /// as fast; without latency it pays its bytes only. Other ablations leave it unchanged.
    pub fn ablated(mut self, ablation: Ablation) -> Schedule {
        match ablation {
            Ablation::NoComm => {
                self.base_s = 0.0;
                self.latency_s = 0.0;
                self.algbw_gbs = f64::INFINITY;
            }
            Ablation::NoLatency => {
                self.base_s = 0.0;
                self.latency_s = 0.0;
            }
            Ablation::DoubleBandwidth => self.algbw_gbs *= ablation.bandwidth_factor(),
            _ => {}
        }
        self
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Dependent steps of a call (`2(n-1)` for the ring, twice the depth for the tree).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Rings run at once (ring), or trees (2).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// The latency of a call: the fixed overhead plus every step's, seconds.
    pub fn latency_s(&self) -> f64 {
        self.base_s + self.latency_s
    }

    /// The bus bandwidth large messages approach, GB/s.
    pub fn peak_busbw_gbs(&self) -> f64 {
        self.algbw_gbs * bus_factor(self.ranks)
    }

    /// Seconds to all-reduce `bytes` (0 for one rank or no bytes).
    pub fn time_s(&self, bytes: usize) -> f64 {
        if self.ranks == 1 || bytes == 0 {
            return 0.0;
        }
        self.base_s + self.latency_s + bytes as f64 / (self.algbw_gbs * 1e9)
    }

    /// The cost of all-reducing `bytes`. A call that takes no time has no bandwidth (0 GB/s)
    /// when there is nothing to move, and an infinite one when bytes move in no time (the
    /// `no-comm` ablation).
    pub fn cost(&self, bytes: usize) -> Cost {
        let seconds = self.time_s(bytes);
        let algbw_gbs = if seconds > 0.0 {
            bytes as f64 / seconds / 1e9
        } else if self.ranks > 1 && bytes > 0 {
            f64::INFINITY
        } else {
            0.0
        };
        Cost {
            seconds,
            algbw_gbs,
            busbw_gbs: algbw_gbs * bus_factor(self.ranks),
        }
    }
}

/// A schedule laid out: total per-step latency, the asymptotic algorithm bandwidth, the
/// dependent steps and the channels.
struct Laid {
    latency_us: f64,
    algbw_gbs: f64,
    steps: usize,
    channels: usize,
}

/// Routes between devices, computed once each, with the per-step cost of crossing them.
struct Routes<'t> {
    topology: &'t Topology,
    cache: HashMap<(usize, usize), Route>,
}

impl<'t> Routes<'t> {
    fn new(topology: &'t Topology) -> Self {
        Routes {
            topology,
            cache: HashMap::new(),
        }
    }

    fn get(&mut self, from: usize, to: usize) -> Result<&Route> {
        if !self.cache.contains_key(&(from, to)) {
            let r = self.topology.route(from, to)?;
            self.cache.insert((from, to), r);
        }
        Ok(&self.cache[&(from, to)])
    }

    /// The latency of one step from `from` to `to`, microseconds.
    fn alpha_us(&mut self, from: usize, to: usize, algorithm: Algorithm) -> Result<f64> {
        let overheads = self.topology.overheads();
        let r = self.get(from, to)?;
        Ok(overheads.step(r.class, algorithm) + r.latency_us)
    }
}

/// How many concurrent flows cross each link direction, and the bandwidth the busiest
/// leaves each of its flows: `min over used directions of bandwidth / flows`.
struct Loads {
    flows: Vec<u32>,
    used: Vec<DirectedLink>,
}

impl Loads {
    fn new(topology: &Topology) -> Self {
        Loads {
            flows: vec![0; 2 * topology.links().len()],
            used: Vec::new(),
        }
    }

    fn add(&mut self, usage: &[(DirectedLink, u32)]) {
        for &(h, k) in usage {
            if self.flows[h.0] == 0 {
                self.used.push(h);
            }
            self.flows[h.0] += k;
        }
    }

    /// The share of the most shared link direction with the flows of `extra` (sorted by
    /// link direction) added on top.
    fn share_with(&self, topology: &Topology, extra: &[(DirectedLink, u32)]) -> f64 {
        let mut share = f64::INFINITY;
        for &h in &self.used {
            let more = extra
                .binary_search_by_key(&h, |&(e, _)| e)
                .map_or(0, |i| extra[i].1);
            share = share.min(topology.gbs(h) / f64::from(self.flows[h.0] + more));
        }
        for &(h, m) in extra {
            if self.flows[h.0] == 0 {
                share = share.min(topology.gbs(h) / f64::from(m));
            }
        }
        share
    }
}

/// The link directions a set of (from, to) flows crosses, with multiplicity.
fn usage_of(routes: &mut Routes, flows: &[(usize, usize)]) -> Result<Vec<(DirectedLink, u32)>> {
    let mut count: HashMap<DirectedLink, u32> = HashMap::new();
    for &(a, b) in flows {
        for &h in &routes.get(a, b)?.hops {
            *count.entry(h).or_insert(0) += 1;
        }
    }
    let mut usage: Vec<_> = count.into_iter().collect();
    usage.sort_unstable();
    Ok(usage)
}

/// Ranks grouped by host, in rank order (devices with no host each form their own group).
fn hosts_of(topology: &Topology, devices: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
    for (rank, &d) in devices.iter().enumerate() {
        let host = topology.nodes()[d].host;
        match groups
            .iter_mut()
            .find(|(h, _)| host.is_some() && *h == host)
        {
            Some((_, g)) => g.push(rank),
            None => groups.push((host, vec![rank])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Rearranges `v` into the next permutation in lexicographic order; false after the last.
fn next_permutation(v: &mut [usize]) -> bool {
    let Some(i) = (1..v.len()).rev().find(|&i| v[i - 1] < v[i]) else {
        return false;
    };
    let j = (i..v.len()).rev().find(|&j| v[j] > v[i - 1]).unwrap_or(i);
    v.swap(i - 1, j);
    v[i..].reverse();
    true
}

/// Candidate rings, as orders of ranks.
fn ring_candidates(hosts: &[Vec<usize>]) -> Vec<Vec<usize>> {
    if let [only] = hosts {
        if only.len() <= MAX_PERMUTED_RANKS {
            // Every directed Hamiltonian cycle through rank only[0].
            let mut rest = only[1..].to_vec();
            let mut out = Vec::new();
            loop {
                out.push(
                    std::iter::once(only[0])
                        .chain(rest.iter().copied())
                        .collect(),
                );
                if !next_permutation(&mut rest) {
                    return out;
                }
            }
        }
        let reversed = only.iter().rev().copied().collect();
        return vec![only.clone(), reversed];
    }
    let widest = hosts.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::new();
    for r in 0..widest {
        let ring: Vec<usize> = hosts
            .iter()
            .flat_map(|h| {
                let k = r % h.len();
                h[k..].iter().chain(&h[..k]).copied()
            })
            .collect();
        let reversed = ring.iter().rev().copied().collect();
        out.push(ring);
        out.push(reversed);
    }
    out
}

/// The rings to run, as NCCL's topology search picks them (`src/graph/search.cc`): fix the
/// bandwidth `s` each ring gets, pack rings while every link direction they cross has `s`
/// left per flow, and keep the per-ring bandwidth whose ring count gives the most bus
/// bandwidth, `k * s` (fewest rings on a tie). Each `s` is a link's bandwidth over 1 to
/// [`MAX_RINGS`] flows, widest first. Among the rings that fit, pack first the one that
/// uses the least of what is left (`sum of s / left` over its hops: few hops, on links with
/// room), then the one on the widest links: wide links carry several rings, and filling
/// them first keeps the narrow ones for rings that need them (on the DGX-1 cube-mesh: the
/// NV2 cycle twice each way, then the NV1 cycle each way).
/// Returns the bus bandwidth and the rings chosen.
fn pick_rings(topology: &Topology, usages: &[Vec<(DirectedLink, u32)>]) -> (f64, Vec<usize>) {
    let gbs = |h: DirectedLink| topology.gbs(h);
    let mut shares: Vec<f64> = usages
        .iter()
        .flatten()
        .flat_map(|&(h, _)| (1..=MAX_RINGS).map(move |m| gbs(h) / m as f64))
        .collect();
    shares.sort_by(|a, b| b.total_cmp(a));
    shares.dedup_by(|a, b| (*a - *b).abs() <= 1e-9 * *b);
    let mut best: (f64, Vec<usize>) = (0.0, Vec::new());
    for s in shares {
        if s * MAX_RINGS as f64 <= best.0 * (1.0 + 1e-9) {
            break;
        }
        let mut left: Vec<f64> = (0..2 * topology.links().len())
            .map(|h| gbs(DirectedLink(h)))
            .collect();
        let mut chosen = Vec::new();
        while chosen.len() < MAX_RINGS {
            let mut pick: Option<(usize, f64, f64)> = None;
            for (i, usage) in usages.iter().enumerate() {
                let fits = usage
                    .iter()
                    .all(|&(h, m)| left[h.0] >= f64::from(m) * s * (1.0 - 1e-9));
                if !fits {
                    continue;
                }
                let cost: f64 = usage
                    .iter()
                    .map(|&(h, m)| f64::from(m) * s / left[h.0])
                    .sum();
                let width = usage.iter().map(|&(h, _)| gbs(h)).sum::<f64>() / usage.len() as f64;
                let better = pick.is_none_or(|(_, c, w)| {
                    cost < c - 1e-9 || (cost <= c + 1e-9 && width > w + 1e-9)
                });
                if better {
                    pick = Some((i, cost, width));
                }
            }
            let Some((i, _, _)) = pick else { break };
            for &(h, m) in &usages[i] {
                left[h.0] -= f64::from(m) * s;
            }
            chosen.push(i);
        }
        // The rings split the buffer evenly; the busiest link sets their common pace.
        let mut loads = Loads::new(topology);
        for &i in &chosen {
            loads.add(&usages[i]);
        }
        let busbw = chosen.len() as f64 * loads.share_with(topology, &[]);
        if busbw > best.0 * (1.0 + 1e-9) {
            best = (busbw, chosen);
        }
    }
    best
}

fn ring(routes: &mut Routes, devices: &[usize]) -> Result<Laid> {
    let topology = routes.topology;
    let n = devices.len();
    let candidates = ring_candidates(&hosts_of(topology, devices));
    // Each candidate's link usage and the latency of going once around it.
    let mut usages = Vec::with_capacity(candidates.len());
    let mut around_us = Vec::with_capacity(candidates.len());
    for c in &candidates {
        let hops: Vec<(usize, usize)> = (0..n)
            .map(|i| (devices[c[i]], devices[c[(i + 1) % n]]))
            .collect();
        usages.push(usage_of(routes, &hops)?);
        let mut sum = 0.0;
        for &(a, b) in &hops {
            sum += routes.alpha_us(a, b, Algorithm::Ring)?;
        }
        around_us.push(sum);
    }

    let (busbw, chosen) = pick_rings(topology, &usages);
    if chosen.is_empty() {
        return Err(ScalingError::InvalidTopology {
            topology: topology.name().to_string(),
            reason: format!("no ring through its first {n} devices fits its links"),
        });
    }
    // A step waits for the slowest ring; each ring's steps cost on average its trip around
    // divided by its n hops.
    let alpha_us = chosen.iter().map(|&i| around_us[i]).fold(0.0, f64::max) / n as f64;
    let steps = 2 * (n - 1);
    Ok(Laid {
        latency_us: steps as f64 * alpha_us,
        algbw_gbs: busbw / bus_factor(n),
        steps,
        channels: chosen.len(),
    })
}

/// The parent of `rank` in NCCL's binary tree over `n` ranks (`ncclGetBtree`,
/// `src/graph/trees.cc`): the root is 0; otherwise, with `bit` the lowest set bit of `rank`,
/// `(rank ^ bit) | (bit << 1)`, or `rank ^ bit` when that is out of range.
pub fn btree_parent(rank: usize, n: usize) -> Option<usize> {
    if rank == 0 || rank >= n {
        return None;
    }
    let bit = 1 << rank.trailing_zeros();
    let up = (rank ^ bit) | (bit << 1);
    Some(if up >= n { rank ^ bit } else { up })
}

/// The parent of `rank` in tree `t` (0 or 1) of NCCL's double binary tree
/// (`ncclGetDtree`): tree 1 is tree 0 mirrored (`r -> n-1-r`) for even `n` and shifted by
/// one for odd `n`.
pub fn dtree_parent(t: usize, rank: usize, n: usize) -> Option<usize> {
    if t == 0 || n < 2 {
        return btree_parent(rank, n);
    }
    if n.is_multiple_of(2) {
        btree_parent(n - 1 - rank, n).map(|p| n - 1 - p)
    } else {
        btree_parent((rank + n - 1) % n, n).map(|p| (p + 1) % n)
    }
}

fn tree(routes: &mut Routes, devices: &[usize]) -> Result<Laid> {
    let topology = routes.topology;
    let hosts = hosts_of(topology, devices);
    let h = hosts.len();
    let mut flows = Vec::new();
    let mut deepest_us = 0.0f64;
    let mut deepest_edges = 0usize;
    for t in 0..2 {
        // parent[rank] for this tree: chains within hosts (tree 1 runs them backwards, so
        // its heads differ), heads joined by the double binary tree over hosts.
        let chains: Vec<Vec<usize>> = hosts
            .iter()
            .map(|g| {
                if t == 0 {
                    g.clone()
                } else {
                    g.iter().rev().copied().collect()
                }
            })
            .collect();
        let mut parent: Vec<Option<usize>> = vec![None; devices.len()];
        for (host, chain) in chains.iter().enumerate() {
            for w in chain.windows(2) {
                parent[w[1]] = Some(w[0]);
            }
            parent[chain[0]] = dtree_parent(t, host, h).map(|p| chains[p][0]);
        }
        for rank in 0..devices.len() {
            // Walk to the root: the latency of this rank's path and its length.
            let (mut at, mut us, mut edges) = (rank, 0.0, 0usize);
            while let Some(p) = parent[at] {
                us += routes.alpha_us(devices[at], devices[p], Algorithm::Tree)?;
                edges += 1;
                at = p;
                if edges > devices.len() {
                    unreachable!("a tree built from chains and ncclGetBtree has no cycle");
                }
            }
            deepest_us = deepest_us.max(us);
            deepest_edges = deepest_edges.max(edges);
            if let Some(p) = parent[rank] {
                // Reduce up and broadcast down run at once once the pipeline is full.
                flows.push((devices[rank], devices[p]));
                flows.push((devices[p], devices[rank]));
            }
        }
    }
    let usage = usage_of(routes, &flows)?;
    let share = Loads::new(topology).share_with(topology, &usage);
    Ok(Laid {
        // Down the deepest path and back up.
        latency_us: 2.0 * deepest_us,
        // Each tree moves half the buffer over every edge at `share`.
        algbw_gbs: 2.0 * share,
        steps: 2 * deepest_edges,
        channels: 2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn binary_trees_are_nccls() {
        // NCCL's 14-rank picture in trees.cc: 0 -> 8; 8 -> 4, 12; 4 -> 2, 6; 12 -> 10, 13.
        let parents: Vec<Option<usize>> = (0..14).map(|r| btree_parent(r, 14)).collect();
        assert_eq!(parents[8], Some(0));
        assert_eq!((parents[4], parents[12]), (Some(8), Some(8)));
        assert_eq!((parents[10], parents[13]), (Some(12), Some(12)));
        assert_eq!(parents[0], None);
        // Every tree of 1..=64 ranks reaches its root from every rank.
        for n in 1..=64 {
            for t in 0..2 {
                let roots = (0..n).filter(|&r| dtree_parent(t, r, n).is_none()).count();
                assert_eq!(roots, 1, "n={n} t={t}");
                for r in 0..n {
                    let (mut at, mut hops) = (r, 0);
                    while let Some(p) = dtree_parent(t, at, n) {
                        assert!(p < n);
                        at = p;
                        hops += 1;
                        assert!(hops <= n, "cycle at n={n} t={t}");
                    }
                }
            }
        }
        assert_eq!(dtree_parent(1, 0, 4), btree_parent(3, 4).map(|p| 3 - p));
    }

    #[test]
    fn permutations_enumerate_every_cycle() {
        let hosts = vec![vec![0, 1, 2, 3]];
        let c = ring_candidates(&hosts);
        assert_eq!(c.len(), 6);
        assert!(c.iter().all(|r| r[0] == 0));
        assert_eq!(ring_candidates(&[vec![0, 1, 2, 3, 4, 5, 6, 7]]).len(), 5040);
        // Two hosts: rotations that enter and leave each host through different ranks.
        let c = ring_candidates(&[vec![0, 1, 2], vec![3, 4, 5]]);
        assert_eq!(c[2], [1, 2, 0, 4, 5, 3]);
        assert_eq!(c.len(), 6);
    }

    #[test]
    fn ring_busbw_approaches_the_bottleneck_link() {
        // NVSwitch: the GPU's own NVLink, 450 x 380/450 GB/s.
        let h100 = presets::build("dgx-h100").unwrap();
        let s = Schedule::new(&h100, Algorithm::Ring, 8).unwrap();
        assert!(
            close(s.peak_busbw_gbs(), 380.0, 1e-9),
            "{}",
            s.peak_busbw_gbs()
        );
        assert_eq!((s.channels(), s.steps()), (1, 14));
        let big = s.cost(1 << 30).busbw_gbs;
        assert!(big < 380.0 && big > 0.98 * 380.0, "{big}");
        // The bridge: 12 NVLinks.
        let bridge = presets::build("2gpu-nvlink-bridge").unwrap();
        let s = Schedule::new(&bridge, Algorithm::Ring, 2).unwrap();
        assert!(close(s.peak_busbw_gbs(), 300.0 * 380.0 / 450.0, 1e-9));
        // The V100 quad: four rings use every NVLink out of GPU 0 (4 links, 100 GB/s).
        let quad = presets::build("4xv100-nvlink").unwrap();
        let s = Schedule::new(&quad, Algorithm::Ring, 4).unwrap();
        assert!(
            close(s.peak_busbw_gbs(), 100.0 * 380.0 / 450.0, 1e-9),
            "{}",
            s.peak_busbw_gbs()
        );
        assert_eq!(s.channels(), 4);
        // PCIe across two sockets: the inter-socket link.
        let p4 = presets::build("8gpu-pcie4").unwrap();
        let s = Schedule::new(&p4, Algorithm::Ring, 8).unwrap();
        assert!(close(
            s.peak_busbw_gbs(),
            presets::AMD_INTER_SOCKET_GBS,
            1e-9
        ));
        // Two DGX H100: one ring per NIC, 8 x 48 GB/s.
        let ib = presets::build("ib-2node").unwrap();
        let s = Schedule::new(&ib, Algorithm::Ring, 16).unwrap();
        assert!(
            close(s.peak_busbw_gbs(), 8.0 * 48.0, 1e-9),
            "{}",
            s.peak_busbw_gbs()
        );
    }

    #[test]
    fn latency_is_nccls_per_step_model() {
        // One host: 2(n-1) NVLink steps of 3.4 us plus 8.4 us, as NCCL's tuner.
        let h100 = presets::build("dgx-h100").unwrap();
        let ring = Schedule::new(&h100, Algorithm::Ring, 8).unwrap();
        assert!(close(ring.latency_s(), (8.4 + 14.0 * 3.4) * 1e-6, 1e-9));
        // NCCL's tree on one host is a chain: 2 (n-1) steps of 4.0 us.
        let tree = Schedule::new(&h100, Algorithm::Tree, 8).unwrap();
        assert!(close(
            tree.latency_s(),
            (8.4 + 2.0 * 7.0 * 4.0) * 1e-6,
            1e-9
        ));
        assert_eq!(tree.steps(), 14);
        // Two hosts: 7 NVLink steps and one network step, down and up.
        let ib = presets::build("ib-2node").unwrap();
        let tree = Schedule::new(&ib, Algorithm::Tree, 16).unwrap();
        assert!(close(
            tree.latency_s(),
            (8.4 + 2.0 * (7.0 * 4.0 + 14.0)) * 1e-6,
            1e-9
        ));
        assert_eq!(tree.time_s(0), 0.0);
        assert_eq!(
            Schedule::new(&ib, Algorithm::Tree, 1)
                .unwrap()
                .time_s(1 << 20),
            0.0
        );
    }

    #[test]
    fn tree_beats_ring_at_small_sizes_across_hosts_and_loses_at_large() {
        let ib = presets::build("ib-2node").unwrap();
        let ring = Schedule::new(&ib, Algorithm::Ring, 16).unwrap();
        let tree = Schedule::new(&ib, Algorithm::Tree, 16).unwrap();
        for bytes in [4 << 10, 64 << 10] {
            assert!(tree.time_s(bytes) < ring.time_s(bytes), "{bytes}");
        }
        assert!(ring.time_s(1 << 30) < tree.time_s(1 << 30));
        // Each tree's inter-host edge crosses one NIC pair: 2 x 48 GB/s of algbw.
        assert!(close(
            tree.peak_busbw_gbs(),
            2.0 * 48.0 * bus_factor(16),
            1e-9
        ));
    }

    #[test]
    fn ablations_change_what_they_name() {
        let h100 = presets::build("dgx-h100").unwrap();
        let s = Schedule::new(&h100, Algorithm::Ring, 8).unwrap();
        let bytes = 64 << 20;
        let t = s.time_s(bytes);
        let free = s.clone().ablated(Ablation::NoComm);
        assert_eq!(free.time_s(bytes), 0.0);
        assert_eq!(free.cost(bytes).busbw_gbs, f64::INFINITY);
        assert_eq!(free.cost(0).busbw_gbs, 0.0);
        let fast = s.clone().ablated(Ablation::DoubleBandwidth);
        assert!(close(
            fast.peak_busbw_gbs(),
            2.0 * s.peak_busbw_gbs(),
            1e-12
        ));
        assert!(close(fast.latency_s(), s.latency_s(), 1e-12));
        let no_latency = s.clone().ablated(Ablation::NoLatency);
        assert_eq!(no_latency.latency_s(), 0.0);
        assert!(close(t - no_latency.time_s(bytes), s.latency_s(), 1e-9));
        for other in [Ablation::None, Ablation::NoOverlap, Ablation::SingleCopy] {
            assert_eq!(s.clone().ablated(other), s);
        }
    }

    #[test]
    fn all_reduce_reports_nccl_tests_bandwidths() {
        let h100 = presets::build("dgx-h100").unwrap();
        let c = all_reduce(&h100, Algorithm::Ring, 8, 8 << 30).unwrap();
        assert!(close(c.busbw_gbs, c.algbw_gbs * 1.75, 1e-12));
        assert!(close(
            c.seconds,
            (8u64 << 30) as f64 / (c.algbw_gbs * 1e9),
            1e-12
        ));
        assert!(all_reduce(&h100, Algorithm::Ring, 9, 1).is_err());
        assert_eq!(
            all_reduce(&h100, Algorithm::Tree, 1, 1 << 20)
                .unwrap()
                .busbw_gbs,
            0.0
        );
    }
}
