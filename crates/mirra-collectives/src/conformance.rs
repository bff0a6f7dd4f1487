//! The conformance suite: written once, run by every backend (see `suite!` at the end).
//!
//! - a gloo-style grid with closed-form answers: world sizes 1..=8 x lengths
//!   {0, 1, 3, 4, 100, 1000, 10 000} x every dtype x every operator, for every collective
//!   (broadcast and reduce from every root), each world size and length in a group whose
//!   slices cut every rank's chunk into at least 8 pipelined slices. Inputs are integers
//!   mixed over ranks and indices (sums over 8 ranks within [-128, 128], products of ±1 and
//!   ±2), so every order of combination is exact, every rank's result must equal the
//!   closed form bitwise, and a schedule that reads the wrong rank, offset or slice
//!   changes it;
//! - the grid's power, shown: deliberate schedule bugs ([`crate::mutants`]: a mutated
//!   slice offset, a source read twice) fail it on every backend, and pass the weaker grids
//!   (one slice per buffer; the same inputs on every rank) that it replaces;
//! - proptest against the naive sequential reference ([`crate::reference`]) with random
//!   values and slice sizes: integers exactly, floats within a per-dtype tolerance, all
//!   ranks bitwise equal;
//! - the failure model: argument mismatches, deadlines, ranks that leave or panic, abort.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirra_device::{Buffer, DType, Device, Element};
use proptest::prelude::*;

use crate::mutants::{self, Mutant};
use crate::reduce::{with_dtype, Reducible};
use crate::transport::slicing;
use crate::{
    cpu_group, reference, Collective, CollectiveError, Communicator, Config, ReduceOp, BACKENDS,
    DEFAULT_SLICE_BYTES, MAX_EAGER_BYTES, SUPPORTED_DTYPES,
};

type Comm = Box<dyn Communicator>;

/// The suite runs unchanged on every backend: it makes groups by backend name
/// ([`make_group`]) and every rank's buffers on that backend's device for the rank
/// ([`device_for`]): host memory for the CPU backends and the tests' host executor of the
/// device ring, `cuda:0` for the CUDA ring (all ranks on one device), `cuda:r` for NCCL.
fn make_group(backend: &str, n: usize, config: Config) -> crate::Result<Vec<Comm>> {
    use crate::device::host_engine::{HostEngine, NAME};
    match backend {
        NAME => Ok(crate::device::group::group(
            Box::new(HostEngine { in_order: false }),
            n,
            config,
        )),
        IN_ORDER => Ok(crate::device::group::group(
            Box::new(HostEngine { in_order: true }),
            n,
            config,
        )),
        b if BACKENDS.contains(&b) => cpu_group(b, n, config),
        HIER_PAIRS => {
            let per_worker = if n.is_multiple_of(2) { 2 } else { 1 };
            crate::hierarchical_group("direct", "ring", n / per_worker, per_worker, config)
        }
        HIER_TWO_WORKERS => {
            let workers = if n.is_multiple_of(2) { 2 } else { 1 };
            crate::hierarchical_group("ring", "direct", workers, n / workers, config)
        }
        b => {
            let devices: crate::Result<Vec<Device>> =
                (0..n).map(|r| Ok(device_for(b, r))).collect();
            crate::device_group(b, &devices?, config)
        }
    }
}

/// The hierarchical backend in one process, in two shapes of each world size: workers of
/// two ranks (of one when the size is odd: leaders only), and two workers (one when the
/// size is odd: a local group only). Both shapes at 4 ranks are 2 x 2.
const HIER_PAIRS: &str = "hierarchical:pairs";
const HIER_TWO_WORKERS: &str = "hierarchical:two-workers";

/// The host executor of the device ring running every plan in plan order (an ablation).
const IN_ORDER: &str = "cuda-ring@host-in-order";

/// Where rank `rank` of `backend` keeps its buffers.
fn device_for(backend: &str, rank: usize) -> Device {
    match backend {
        "cuda-ring" => Device::cuda(0).expect("the GPU tests need cuda:0"),
        b if b.starts_with("nccl") => Device::cuda(rank).expect("one GPU per NCCL rank"),
        _ => Device::Cpu,
    }
}

thread_local! {
    /// The device of the rank this thread runs (host memory outside [`on_ranks`]).
    static DEVICE: std::cell::Cell<Device> = const { std::cell::Cell::new(Device::Cpu) };
}

/// Make this thread put its buffers where `comm`'s rank keeps them.
fn enter(comm: &dyn Communicator) {
    let d = device_for(comm.backend(), comm.rank());
    DEVICE.with(|x| x.set(d));
}

/// A copy of `b` on this thread's rank's device.
fn on_dev(b: &Buffer) -> Buffer {
    b.to_device(DEVICE.with(std::cell::Cell::get)).unwrap()
}

/// A host copy of `b`.
fn host(b: &Buffer) -> Buffer {
    b.to_device(Device::Cpu).unwrap()
}

/// The elements of `b`, read through a host copy.
fn vals<T: Element>(b: &Buffer) -> Vec<T> {
    host(b).as_slice::<T>().unwrap().to_vec()
}

/// Run `body` on every rank of `comms`, each on its own thread (whose buffers go to the
/// rank's device); results in rank order. A panicking rank panics the test (after the
/// others return).
pub(crate) fn on_ranks<R: Send>(comms: Vec<Comm>, body: impl Fn(Comm) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let body = &body;
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    enter(&*c);
                    body(c)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

fn group(backend: &str, n: usize) -> Vec<Comm> {
    make_group(
        backend,
        n,
        Config::default().with_timeout(Duration::from_secs(30)),
    )
    .unwrap()
}

fn short(backend: &str, n: usize, timeout_ms: u64) -> Vec<Comm> {
    let cfg = Config::default().with_timeout(Duration::from_millis(timeout_ms));
    make_group(backend, n, cfg).unwrap()
}

/// `v` in a buffer on this thread's rank's device.
fn buf<T: Element>(v: &[T]) -> Buffer {
    Buffer::from_slice(v, DEVICE.with(std::cell::Cell::get)).unwrap()
}

// ---------------------------------------------------------------------------------------
// The closed-form grid.

const WORLDS: [usize; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
const LENGTHS: [usize; 7] = [0, 1, 3, 4, 100, 1000, 10_000];
/// The grid cuts every rank's chunk into at least this many slices (or one per element).
const MIN_SLICES_PER_CHUNK: usize = 8;

/// Which inputs the grid gives the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inputs {
    /// Every rank its own values, mixed over ranks and indices: a schedule that reads the
    /// wrong rank, the wrong offset or the same source twice changes the result.
    PerRank,
    /// Every rank rank 0's values (an ablation: what a weaker grid would test).
    SameOnEveryRank,
}

/// How the grid's groups slice their buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slicing {
    /// At least [`MIN_SLICES_PER_CHUNK`] slices per rank's chunk, for every dtype.
    Many,
    /// The default slice size, under which every grid buffer is one slice (an ablation).
    OnePerBuffer,
    /// Every grid buffer posted eagerly: `direct`'s one-shot all-reduce (the two above
    /// turn eager posting off, so they test the sliced schedules).
    Eager,
}

/// A small number mixed from `r` and `i` (splitmix64 of both): neighbouring ranks and
/// indices get unrelated values.
fn mix(r: usize, i: usize) -> u64 {
    let mut z = ((r as u64) << 40 ^ i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Input element `i` of rank `r`: integers whose sums over up to 8 ranks stay within
/// [-128, 128] (exact in bf16, f16, every partial sum, every order) and whose products are
/// ±1, ±2 (powers of two: exact), different between ranks and indices.
fn grid_value(dtype: DType, op: ReduceOp, inputs: Inputs, r: usize, i: usize) -> i64 {
    let r = if inputs == Inputs::PerRank { r } else { 0 };
    let h = mix(r, i);
    let v = if op == ReduceOp::Product {
        [1, 2, -1, -2][(h % 4) as usize]
    } else {
        (h % 32) as i64 - 16
    };
    match (dtype, op) {
        (DType::U8, ReduceOp::Product) => v.abs(),
        (DType::U8, _) => v + 16,
        _ => v,
    }
}

/// Slice bytes that cut a chunk of `len / n` elements into at least
/// [`MIN_SLICES_PER_CHUNK`] slices (or one per element) for elements of 1 to 8 bytes.
fn many_slices_bytes(n: usize, len: usize) -> usize {
    (len / (n * MIN_SLICES_PER_CHUNK)).max(1)
}

fn grid_config(n: usize, len: usize, slicing: Slicing) -> Config {
    let mut config = Config::default().with_timeout(Duration::from_secs(30));
    // The field, not `with_slice_bytes`, which keeps slices of at least 512 bytes.
    config.slice_bytes = match slicing {
        Slicing::Many => many_slices_bytes(n, len),
        Slicing::OnePerBuffer | Slicing::Eager => DEFAULT_SLICE_BYTES,
    };
    config.with_eager_bytes(if slicing == Slicing::Eager {
        MAX_EAGER_BYTES
    } else {
        0
    })
}

fn conv<T: Reducible>(x: i64) -> T {
    if T::DTYPE == DType::U8 {
        <T as Element>::from_f64(x.rem_euclid(256) as f64)
    } else {
        <T as Element>::from_f64(x as f64)
    }
}

/// The closed form of reducing `vals` (one per rank) with `op`, in `T`'s arithmetic.
fn closed_form<T: Reducible>(op: ReduceOp, vals: impl Iterator<Item = i64> + Clone, n: usize) -> T {
    let sum: i64 = vals.clone().sum();
    match op {
        ReduceOp::Sum => conv(sum),
        ReduceOp::Mean => T::narrow(T::div_n(conv::<T>(sum).widen(), n)),
        ReduceOp::Max => conv(vals.clone().max().unwrap_or(0)),
        ReduceOp::Min => conv(vals.clone().min().unwrap_or(0)),
        ReduceOp::Product => conv(vals.product()),
    }
}

fn values<T: Reducible>(inputs: Inputs, op: ReduceOp, r: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| conv(grid_value(T::DTYPE, op, inputs, r, i)))
        .collect()
}

fn same<T: Reducible>(what: &str, got: &Buffer, want: &[T]) -> Result<(), String> {
    let got = &host(got);
    let w = Buffer::from_slice(want, Device::Cpu).unwrap();
    let g = got.as_bytes().map_err(|e| e.to_string())?;
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    // Bitwise: the closed form is exact, so every rank must produce exactly these bits.
    match g
        .iter()
        .zip(w.as_bytes().map_err(|e| e.to_string())?)
        .position(|(a, b)| a != b)
    {
        None => Ok(()),
        Some(byte) => {
            let i = byte / T::DTYPE.size_in_bytes();
            let got = got.as_slice::<T>().map_err(|e| e.to_string())?;
            Err(format!(
                "{what}: element {i} is {:?}, want {:?}",
                got[i], want[i]
            ))
        }
    }
}

/// Which collectives a grid test covers (split so that the test harness runs them in
/// parallel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    AllReduce,
    ScatterGather,
    Rooted,
}

const PARTS: [Part; 3] = [Part::AllReduce, Part::ScatterGather, Part::Rooted];

/// One rank's share of the grid for one dtype and length; every rank runs the same
/// sequence.
fn grid_rank<T: Reducible>(
    comm: &dyn Communicator,
    part: Part,
    inputs: Inputs,
    len: usize,
) -> Result<(), String> {
    let (n, r) = (comm.world_size(), comm.rank());
    let ctx = |what: &str, op: ReduceOp| {
        format!(
            "{} n={n} rank={r} {what} len={len} {} {op} ({inputs:?} inputs)",
            comm.backend(),
            T::DTYPE
        )
    };
    let err = |what: String| move |e: CollectiveError| format!("{what}: {e}");
    let value = |op: ReduceOp, p: usize, i: usize| grid_value(T::DTYPE, op, inputs, p, i);
    let input = |op: ReduceOp, p: usize, len: usize| buf(&values::<T>(inputs, op, p, len));
    if part == Part::AllReduce {
        for op in ReduceOp::ALL {
            let what = ctx("all_reduce", op);
            let mut b = input(op, r, len);
            comm.all_reduce(&mut b, op).map_err(err(what.clone()))?;
            let want: Vec<T> = (0..len)
                .map(|i| closed_form(op, (0..n).map(|p| value(op, p, i)), n))
                .collect();
            same(&what, &b, &want)?;
        }
    }
    if part == Part::ScatterGather {
        for op in ReduceOp::ALL {
            let what = ctx("reduce_scatter", op);
            let send = input(op, r, n * len);
            let mut recv = input(op, r + 1, len);
            comm.reduce_scatter(&send, &mut recv, op)
                .map_err(err(what.clone()))?;
            let want: Vec<T> = (0..len)
                .map(|i| closed_form(op, (0..n).map(|p| value(op, p, r * len + i)), n))
                .collect();
            same(&what, &recv, &want)?;
        }
        let what = ctx("all_gather", ReduceOp::Sum);
        let send = input(ReduceOp::Sum, r, len);
        let mut recv = input(ReduceOp::Sum, r + n, n * len);
        comm.all_gather(&send, &mut recv)
            .map_err(err(what.clone()))?;
        let want: Vec<T> = (0..n * len)
            .map(|k| conv(value(ReduceOp::Sum, k / len.max(1), k % len.max(1))))
            .collect();
        same(&what, &recv, &want)?;
        let what = ctx("barrier", ReduceOp::Sum);
        comm.barrier().map_err(err(what))?;
    }
    if part == Part::Rooted {
        for root in 0..n {
            let what = ctx(&format!("broadcast root={root}"), ReduceOp::Sum);
            let mut b = input(ReduceOp::Sum, r, len);
            comm.broadcast(&mut b, root).map_err(err(what.clone()))?;
            same(&what, &b, &values::<T>(inputs, ReduceOp::Sum, root, len))?;
            for op in ReduceOp::ALL {
                let what = ctx(&format!("reduce root={root}"), op);
                let mut b = input(op, r, len);
                comm.reduce(&mut b, op, root).map_err(err(what.clone()))?;
                if r == root {
                    let want: Vec<T> = (0..len)
                        .map(|i| closed_form(op, (0..n).map(|p| value(op, p, i)), n))
                        .collect();
                    same(&what, &b, &want)?;
                } else {
                    same(
                        &(what + " (non-root unchanged)"),
                        &b,
                        &values::<T>(inputs, op, r, len),
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// One run of the grid: which inputs, slices, world sizes and lengths, and the schedule
/// bug (if any) every rank runs with.
struct GridRun<'a> {
    inputs: Inputs,
    slicing: Slicing,
    worlds: &'a [usize],
    lengths: &'a [usize],
    mutant: Option<Mutant>,
}

const FULL_GRID: GridRun<'static> = GridRun {
    inputs: Inputs::PerRank,
    slicing: Slicing::Many,
    worlds: &WORLDS,
    lengths: &LENGTHS,
    mutant: None,
};

/// Runs `part` of the grid on `backend`, one group per world size and length; the
/// failures, each naming the collective, rank, length, dtype and operator.
fn run_grid(backend: &str, part: Part, run: &GridRun<'_>) -> Vec<String> {
    let mut failures = Vec::new();
    for &n in run.worlds {
        for &len in run.lengths {
            let comms = make_group(backend, n, grid_config(n, len, run.slicing)).unwrap();
            let results = on_ranks(comms, |comm| {
                mutants::set(run.mutant);
                for dtype in SUPPORTED_DTYPES {
                    with_dtype!(dtype, T => grid_rank::<T>(&*comm, part, run.inputs, len)?);
                }
                Ok::<(), String>(())
            });
            failures.extend(results.into_iter().filter_map(Result::err));
        }
    }
    failures
}

fn grid(backend: &str, part: Part) {
    let eager = GridRun {
        slicing: Slicing::Eager,
        ..FULL_GRID
    };
    let mut failures = run_grid(backend, part, &FULL_GRID);
    failures.extend(run_grid(backend, part, &eager));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The grid catches each deliberate schedule bug, and the ablation shows which of its
/// features does: a bug in slice boundaries passes a grid whose buffers are one slice
/// each, a reduction that reads one source twice passes a grid whose ranks all hold the
/// same values.
fn grid_catches_broken_schedules(backend: &str) {
    let (worlds, lengths) = ([3, 4], [100, 1000]);
    let small = |inputs, slicing, mutant| GridRun {
        inputs,
        slicing,
        worlds: &worlds,
        lengths: &lengths,
        mutant,
    };
    for (mutant, weaker) in [
        (
            Mutant::SliceOffset,
            small(
                Inputs::PerRank,
                Slicing::OnePerBuffer,
                Some(Mutant::SliceOffset),
            ),
        ),
        (
            Mutant::RepeatedSource,
            small(
                Inputs::SameOnEveryRank,
                Slicing::Many,
                Some(Mutant::RepeatedSource),
            ),
        ),
    ] {
        let caught: Vec<(Part, usize)> = PARTS
            .iter()
            .map(|&part| {
                let run = small(Inputs::PerRank, Slicing::Many, Some(mutant));
                (part, run_grid(backend, part, &run).len())
            })
            .collect();
        // A slice bug hits every schedule; a repeated source every reduction of three or
        // more buffers (the ring's all-reduce combines two at a time: its reduce-scatter
        // and reduce, the shared schedules, do not).
        for &(part, failures) in &caught {
            let must = mutant == Mutant::SliceOffset
                || part == Part::Rooted
                || (part == Part::AllReduce && backend != "ring");
            assert!(
                !must || failures > 0,
                "{backend}: {mutant:?} passes the {part:?} grid: {caught:?}"
            );
        }
        for part in PARTS {
            let missed = run_grid(backend, part, &weaker);
            assert!(
                missed.is_empty(),
                "{backend}: the weaker grid ({:?} inputs, {:?} slices) was expected to miss \
                 {mutant:?} in {part:?}, and caught it: {}",
                weaker.inputs,
                weaker.slicing,
                missed.join("\n")
            );
        }
    }
    // The one-shot all-reduce (every buffer eager) has no slices to get wrong, but it
    // combines every rank's copy: a repeated source must not pass it either.
    if backend != "ring" {
        let eager = small(
            Inputs::PerRank,
            Slicing::Eager,
            Some(Mutant::RepeatedSource),
        );
        assert!(
            !run_grid(backend, Part::AllReduce, &eager).is_empty(),
            "{backend}: RepeatedSource passes the eager all-reduce grid"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Property tests against the sequential reference.

/// A small deterministic generator for test values (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-2, 2).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
    }
}

fn random_input<T: Reducible>(rng: &mut Rng, len: usize) -> Buffer {
    let v: Vec<T> = (0..len)
        .map(|_| {
            // Floats uniform in [-2, 2); integers of any value (sums and products wrap,
            // exactly as in the reference).
            let x = match T::DTYPE {
                DType::I32 => rng.next() as i32 as f64,
                DType::I64 => rng.next() as i64 as f64,
                DType::U8 => (rng.next() % 256) as f64,
                _ => rng.unit(),
            };
            <T as Element>::from_f64(x)
        })
        .collect();
    buf(&v)
}

/// Per-dtype tolerance: `(n + 1) * eps * M + tiny`, with `M` the sum of magnitudes (Sum),
/// that over n (Mean) or the product of magnitudes (Product); Max and Min are exact.
/// `eps` is 2^-23 (f32), 2^-52 (f64), 2^-10 (f16), 2^-7 (bf16); `tiny` the smallest
/// normal number of the type (products may underflow).
fn tolerance(dtype: DType, op: ReduceOp, vals: &[f64]) -> f64 {
    let (eps, tiny) = match dtype {
        DType::F32 => (2f64.powi(-23), f32::MIN_POSITIVE as f64),
        DType::F64 => (2f64.powi(-52), f64::MIN_POSITIVE),
        DType::F16 => (2f64.powi(-10), 6.103_515_625e-5),
        DType::BF16 => (2f64.powi(-7), f32::MIN_POSITIVE as f64),
        _ => return 0.0,
    };
    let n = vals.len() as f64;
    let m = match op {
        ReduceOp::Sum => vals.iter().map(|v| v.abs()).sum::<f64>(),
        ReduceOp::Mean => vals.iter().map(|v| v.abs()).sum::<f64>() / n,
        ReduceOp::Product => vals.iter().map(|v| v.abs()).product::<f64>(),
        ReduceOp::Max | ReduceOp::Min => return 0.0,
    };
    (n + 1.0) * eps * m + tiny
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prop {
    AllReduce,
    ReduceScatter,
    Reduce(usize),
}

fn check_close<T: Reducible>(
    what: &str,
    got: &Buffer,
    want: &Buffer,
    inputs: &[&[T]],
    offset: usize,
    op: ReduceOp,
) -> Result<(), String> {
    let (g, w) = (got.as_slice::<T>().unwrap(), want.as_slice::<T>().unwrap());
    if g.len() != w.len() {
        return Err(format!("{what}: length {} != {}", g.len(), w.len()));
    }
    for (i, (a, b)) in g.iter().zip(w).enumerate() {
        if T::IS_FLOAT {
            let vals: Vec<f64> = inputs.iter().map(|x| x[offset + i].to_f64()).collect();
            let tol = tolerance(T::DTYPE, op, &vals);
            if (a.to_f64() - b.to_f64()).abs() > tol {
                return Err(format!(
                    "{what}: element {i}: got {a:?}, reference {b:?}, tolerance {tol:e}, inputs {vals:?}"
                ));
            }
        } else if a != b {
            return Err(format!("{what}: element {i}: got {a:?}, reference {b:?}"));
        }
    }
    Ok(())
}

/// One property case: every rank's input (drawn from the seed, so any process can draw
/// every rank's) and the sequential reference's result.
struct PropCase {
    n: usize,
    len: usize,
    op: ReduceOp,
    kind: Prop,
    /// Elements each rank receives from a reduce-scatter.
    count: usize,
    inputs: Vec<Buffer>,
    want: Buffer,
}

impl PropCase {
    fn new<T: Reducible>(
        n: usize,
        len: usize,
        op: ReduceOp,
        kind: Prop,
        seed: u64,
    ) -> Result<PropCase, String> {
        let mut rng = Rng(seed);
        let count = match kind {
            Prop::ReduceScatter => len / n,
            _ => len,
        };
        let send_len = match kind {
            Prop::ReduceScatter => count * n,
            _ => len,
        };
        let inputs: Vec<Buffer> = (0..n)
            .map(|_| random_input::<T>(&mut rng, send_len))
            .collect();
        let refs: Vec<&Buffer> = inputs.iter().collect();
        let want = reference::all_reduce(&refs, op).map_err(|e| e.to_string())?;
        Ok(PropCase {
            n,
            len,
            op,
            kind,
            count,
            inputs,
            want,
        })
    }

    /// Rank `comm.rank()`'s collective on its input; its output, on the host.
    fn run<T: Reducible>(&self, comm: &dyn Communicator) -> Result<Buffer, String> {
        let (r, op) = (comm.rank(), self.op);
        match self.kind {
            Prop::AllReduce | Prop::Reduce(_) => {
                let mut b = on_dev(&self.inputs[r]);
                match self.kind {
                    Prop::Reduce(root) => comm.reduce(&mut b, op, root % self.n),
                    _ => comm.all_reduce(&mut b, op),
                }
                .map_err(|e| e.to_string())?;
                Ok(host(&b))
            }
            Prop::ReduceScatter => {
                let zeros = Buffer::zeros(T::DTYPE, self.count, Device::Cpu).unwrap();
                let mut recv = on_dev(&zeros);
                comm.reduce_scatter(&on_dev(&self.inputs[r]), &mut recv, op)
                    .map_err(|e| e.to_string())?;
                Ok(host(&recv))
            }
        }
    }

    /// Rank `r`'s output against the reference (`what` names the case).
    fn check<T: Reducible>(&self, r: usize, out: &Buffer, what: &str) -> Result<(), String> {
        let slices: Vec<&[T]> = self
            .inputs
            .iter()
            .map(|b| b.as_slice::<T>().unwrap())
            .collect();
        match self.kind {
            Prop::AllReduce => check_close::<T>(what, out, &self.want, &slices, 0, self.op),
            Prop::Reduce(root) if r == root % self.n => {
                check_close::<T>(what, out, &self.want, &slices, 0, self.op)
            }
            Prop::Reduce(_) if out.as_bytes().unwrap() != self.inputs[r].as_bytes().unwrap() => {
                Err(format!("{what}: non-root buffer changed"))
            }
            Prop::Reduce(_) => Ok(()),
            Prop::ReduceScatter => {
                let bytes = self.count * T::DTYPE.size_in_bytes();
                let mut part = Buffer::zeros(T::DTYPE, self.count, Device::Cpu).unwrap();
                part.as_bytes_mut()
                    .unwrap()
                    .copy_from_slice(&self.want.as_bytes().unwrap()[r * bytes..(r + 1) * bytes]);
                check_close::<T>(what, out, &part, &slices, r * self.count, self.op)
            }
        }
    }

    fn what<T: Reducible>(&self, backend: &str, slice_bytes: usize, r: usize) -> String {
        format!(
            "{backend} n={} len={} {} {} {:?} slice {slice_bytes} B rank {r}",
            self.n,
            self.len,
            T::DTYPE,
            self.op,
            self.kind
        )
    }
}

fn prop_case<T: Reducible>(
    backend: &str,
    n: usize,
    len: usize,
    op: ReduceOp,
    kind: Prop,
    seed: u64,
    slice_bytes: usize,
) -> Result<(), String> {
    let case = PropCase::new::<T>(n, len, op, kind, seed)?;
    let mut config = Config::default().with_timeout(Duration::from_secs(30));
    config.slice_bytes = slice_bytes;
    let comms = make_group(backend, n, config).map_err(|e| e.to_string())?;
    let outs = on_ranks(comms, |comm| case.run::<T>(&*comm));
    let outs: Vec<Buffer> = outs.into_iter().collect::<Result<_, _>>()?;
    for (r, o) in outs.iter().enumerate() {
        let what = case.what::<T>(backend, slice_bytes, r);
        if kind == Prop::AllReduce && o.as_bytes().unwrap() != outs[0].as_bytes().unwrap() {
            return Err(format!("{what}: differs bitwise from rank 0"));
        }
        case.check::<T>(r, o, &what)?;
    }
    Ok(())
}

type PropInput = (usize, usize, ReduceOp, DType, Prop, u64, usize);

fn prop_strategy() -> impl Strategy<Value = PropInput> {
    let len = prop_oneof![
        6 => 0..=100usize,
        3 => 100..=5_000usize,
        1 => 50_000..=100_000usize,
    ];
    let op = prop::sample::select(ReduceOp::ALL.to_vec());
    let dtype = prop::sample::select(SUPPORTED_DTYPES.to_vec());
    let kind = prop_oneof![
        3 => Just(Prop::AllReduce),
        1 => Just(Prop::ReduceScatter),
        1 => (0..8usize).prop_map(Prop::Reduce),
    ];
    // Mostly small slices, so that random buffers are pipelined in many of them.
    let slice_bytes = prop_oneof![
        1 => Just(DEFAULT_SLICE_BYTES),
        3 => 64..=4096usize,
    ];
    (1..=8usize, len, op, dtype, kind, any::<u64>(), slice_bytes)
}

fn proptest_backend(backend: &'static str) {
    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |((n, len, op, dtype, kind, seed, slice) in prop_strategy())| {
        let res = with_dtype!(
            dtype,
            T => prop_case::<T>(backend, n, len, op, kind, seed, slice)
        );
        prop_assert!(res.is_ok(), "{}", res.unwrap_err());
    });
}

// ---------------------------------------------------------------------------------------
// Errors and the failure model.

/// A rank's body in the failure-model tests that leave the group usable.
type Body<'a> = &'a (dyn Fn(&dyn Communicator) -> crate::Result<()> + Sync);

/// Runs a [`Body`] on a group of `n` ranks and returns the results with their ranks:
/// every rank of a fresh group in one process ([`in_process`]), or under MPI this
/// process's rank of the world when it has `n` ranks (none otherwise).
type Runner<'a> = &'a dyn Fn(usize, Body<'_>) -> Vec<(usize, crate::Result<()>)>;

/// The [`Runner`] of `backend`'s groups in this process.
fn in_process(backend: &str) -> impl Fn(usize, Body<'_>) -> Vec<(usize, crate::Result<()>)> + '_ {
    move |n, body| on_ranks(group(backend, n), |c| (c.rank(), body(&*c)))
}

fn all_errors(results: Vec<(usize, crate::Result<()>)>) -> Vec<(usize, CollectiveError)> {
    results
        .into_iter()
        .map(|(r, res)| (r, res.expect_err("every rank must fail")))
        .collect()
}

fn mismatches(run: Runner<'_>) {
    // Lengths: rank 1 passes 5 elements, the others 4.
    let errs = all_errors(run(3, &|c| {
        let len = if c.rank() == 1 { 5 } else { 4 };
        let mut b = buf(&vec![1.0f32; len]);
        let res = c.all_reduce(&mut b, ReduceOp::Sum);
        // An argument error leaves the group usable.
        let mut ok = buf(&[1.0f32; 4]);
        c.all_reduce(&mut ok, ReduceOp::Sum).unwrap();
        assert_eq!(vals::<f32>(&ok), [3.0; 4]);
        res
    }));
    for (_, e) in &errs {
        assert_eq!(
            *e,
            CollectiveError::LengthMismatch {
                op: Collective::AllReduce,
                rank: 1,
                len: 5,
                ref_rank: 0,
                ref_len: 4
            },
            "{e}"
        );
    }
    // Rank 0 alone differs: it is the one named.
    let errs = all_errors(run(3, &|c| {
        let mut b = if c.rank() == 0 {
            buf(&[1.0f64; 4])
        } else {
            buf(&[1.0f32; 4])
        };
        c.all_reduce(&mut b, ReduceOp::Sum)
    }));
    for (_, e) in &errs {
        assert!(
            matches!(
                e,
                CollectiveError::DTypeMismatch {
                    rank: 0,
                    dtype: DType::F64,
                    ref_rank: 1,
                    ref_dtype: DType::F32,
                    ..
                }
            ),
            "{e}"
        );
    }
    // Operators.
    let errs = all_errors(run(4, &|c| {
        let op = if c.rank() == 2 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        c.all_reduce(&mut buf(&[1i32; 3]), op)
    }));
    for (_, e) in &errs {
        assert!(
            matches!(
                e,
                CollectiveError::ReduceOpMismatch {
                    rank: 2,
                    reduce_op: ReduceOp::Max,
                    ref_rank: 0,
                    ref_reduce_op: ReduceOp::Sum,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("rank 2 asked for max"), "{e}");
    }
    // Roots.
    let errs = all_errors(run(3, &|c| {
        let root = if c.rank() == 2 { 1 } else { 0 };
        c.broadcast(&mut buf(&[1u8; 3]), root)
    }));
    for (_, e) in &errs {
        assert!(
            matches!(
                e,
                CollectiveError::RootMismatch {
                    rank: 2,
                    root: 1,
                    ref_rank: 0,
                    ref_root: 0,
                    ..
                }
            ),
            "{e}"
        );
    }
    // Different collectives at the same point of the sequence.
    let errs = all_errors(run(2, &|c| {
        if c.rank() == 0 {
            c.all_reduce(&mut buf(&[1.0f32]), ReduceOp::Sum)
        } else {
            c.barrier()
        }
    }));
    for (r, e) in &errs {
        let (op, started) = match r {
            0 => (Collective::AllReduce, Some(Collective::Barrier)),
            _ => (Collective::Barrier, None),
        };
        assert!(
            matches!(
                e,
                CollectiveError::CollectiveMismatch { op: o, rank: 1, started: s, .. }
                    if *o == op && started.is_none_or(|want| *s == want)
            ),
            "rank {r}: {e}"
        );
    }
}

/// u8 sums wrap (modulo 256) in every collective that reduces, as the crate's kernel
/// does: 1,000 elements of 200 on 3 ranks sum to 600 mod 256 = 88. (OpenMPI 4.1's own
/// u8 sums saturate at 255 from 32 elements on; the `mpi` backend reduces u8 with the
/// crate's kernel instead, and this is what fails without that.)
fn u8_sums_wrap(run: Runner<'_>) {
    let results = run(3, &|c| {
        let want = |len: usize| vec![88u8; len];
        let mut b = buf(&[200u8; 1000]);
        c.all_reduce(&mut b, ReduceOp::Sum)?;
        assert_eq!(vals::<u8>(&b), want(1000), "all_reduce");
        let mut recv = buf(&[0u8; 1000]);
        c.reduce_scatter(&buf(&[200u8; 3000]), &mut recv, ReduceOp::Sum)?;
        assert_eq!(vals::<u8>(&recv), want(1000), "reduce_scatter");
        let mut b = buf(&[200u8; 1000]);
        c.reduce(&mut b, ReduceOp::Sum, 2)?;
        let root = if c.rank() == 2 { 88 } else { 200 };
        assert_eq!(vals::<u8>(&b), vec![root; 1000], "reduce");
        Ok(())
    });
    for (r, res) in results {
        res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

/// Two ranks' float sum is one IEEE addition per element, `a + b` bitwise (addition is
/// commutative, so either order): deterministic mode's all-reduce of the two halves of its
/// tree relies on it. The values include signed zeros (a sum started at zero turns
/// `-0 + -0` into `+0`), cancellation of large terms, overflow and small magnitudes; long
/// enough for every backend to cut it into chunks and slices.
fn two_ranks_sum_with_one_addition(run: Runner<'_>) {
    fn input<T: Element + From<f32>>(rank: usize, len: usize) -> Vec<T> {
        let special = [-0.0f32, 1e8, -1e-40, f32::MAX, 3.0, 0.1, -7.5e-3, 1.0];
        (0..len)
            .map(|i| {
                // Even elements the same value on both ranks (-0 + -0, MAX + MAX), odd
                // ones different; every fifth negated on rank 1 (cancellation).
                let x = special[(i * 7 + rank * 3 * (i % 2)) % special.len()];
                let y = x * (1.0 + (i % 13) as f32 * 0.123_456_7);
                T::from(if rank == 1 && i % 5 == 0 { -y } else { y })
            })
            .collect()
    }
    fn check<T: Element + From<f32> + std::ops::Add<Output = T> + Copy + PartialEq>(
        c: &dyn Communicator,
        to_bits: fn(T) -> u64,
    ) -> crate::Result<()> {
        let len = 10_007;
        let mut b = buf(&input::<T>(c.rank(), len));
        c.all_reduce(&mut b, ReduceOp::Sum)?;
        let (a, other) = (input::<T>(0, len), input::<T>(1, len));
        // Subnormals under the process's policy, as the reductions apply it.
        mirra_device::denormals::ensure_this_thread();
        // The inputs tell one addition from a sum started at zero (`+0 + -0` is `+0`).
        let zero = T::from(0.0);
        let shows = |x: T| to_bits(x) != to_bits(zero + x);
        assert!((0..len).any(|i| shows(a[i] + other[i])), "no -0 + -0");
        for (i, got) in vals::<T>(&b).into_iter().enumerate() {
            let want = a[i] + other[i];
            assert_eq!(
                to_bits(got),
                to_bits(want),
                "element {i} on rank {}",
                c.rank()
            );
        }
        Ok(())
    }
    let results = run(2, &|c| {
        check::<f32>(c, |x| x.to_bits().into())?;
        check::<f64>(c, f64::to_bits)
    });
    for (r, res) in results {
        res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

fn bad_arguments(run: Runner<'_>) {
    // Root out of range on every rank, and on one rank only.
    for bad in [None, Some(1)] {
        let errs = all_errors(run(3, &|c| {
            let root = if bad.is_none_or(|b| b == c.rank()) {
                3
            } else {
                0
            };
            c.reduce(&mut buf(&[1.0f32; 2]), ReduceOp::Sum, root)
        }));
        let rank = bad.unwrap_or(0);
        for (_, e) in &errs {
            assert_eq!(
                *e,
                CollectiveError::RootOutOfRange {
                    op: Collective::Reduce,
                    rank,
                    root: 3,
                    world_size: 3
                },
                "{e}"
            );
        }
    }
    // Send and receive sizes that do not fit.
    let errs = all_errors(run(2, &|c| {
        let send = buf(&[1.0f32; 4]);
        let mut recv = buf(&[0.0f32; 3]);
        c.reduce_scatter(&send, &mut recv, ReduceOp::Sum)
    }));
    for (_, e) in &errs {
        assert!(
            matches!(
                e,
                CollectiveError::BufferSizes {
                    rank: 0,
                    send_len: 4,
                    recv_len: 3,
                    world_size: 2,
                    ..
                }
            ),
            "{e}"
        );
    }
    let errs = all_errors(run(2, &|c| {
        let send = buf(&[1.0f32; 2]);
        let mut recv = buf(&[0.0f64; 4]);
        c.all_gather(&send, &mut recv)
    }));
    for (_, e) in &errs {
        assert!(
            matches!(
                e,
                CollectiveError::SendRecvDType {
                    rank: 0,
                    send: DType::F32,
                    recv: DType::F64,
                    ..
                }
            ),
            "{e}"
        );
    }
}

/// One rank never calls: the others time out naming it, within the deadline; its own
/// late call fails too.
fn deadline(backend: &str) {
    let timeout = Duration::from_millis(200);
    let results = on_ranks(short(backend, 3, 200), |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(400));
            let res = c.all_reduce(&mut buf(&[1.0f32; 8]), ReduceOp::Sum);
            return (res, Duration::ZERO);
        }
        let t = Instant::now();
        let res = c.all_reduce(&mut buf(&[1.0f32; 8]), ReduceOp::Sum);
        (res, t.elapsed())
    });
    for (r, (res, took)) in results.into_iter().enumerate() {
        let e = res.expect_err("must time out");
        match &e {
            CollectiveError::Timeout {
                waiting_for, after, ..
            } => {
                assert_eq!(waiting_for, &vec![2], "{e}");
                assert_eq!(*after, timeout);
            }
            other => panic!("rank {r}: expected a timeout, got {other}"),
        }
        if r != 2 {
            // The first rank to reach its deadline aborts the group; the others (started a
            // little later) may return a hair before their own deadline.
            assert!(
                took >= timeout - Duration::from_millis(50) && took < timeout * 10,
                "rank {r} took {took:?}"
            );
        }
        assert!(e.to_string().contains("waiting for rank(s) [2]"), "{e}");
    }
}

/// A rank drops its communicator while the others wait for it: their pending and later
/// calls fail with RankGone naming it, promptly (the deadline is long).
fn rank_leaves(backend: &str) {
    let results = on_ranks(group(backend, 3), |c| {
        let mut b = buf(&[1.0f32; 1000]);
        c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(50));
            drop(c);
            return vec![];
        }
        let t = Instant::now();
        let pending = c.all_reduce(&mut b, ReduceOp::Sum);
        let later = c.barrier();
        assert!(t.elapsed() < Duration::from_secs(5));
        vec![pending, later]
    });
    for res in results.into_iter().flatten() {
        let e = res.expect_err("must fail");
        assert!(
            matches!(e, CollectiveError::RankGone { rank: 1, .. }),
            "{e}"
        );
    }
}

/// A rank that completes a collective and leaves at once (drops its communicator) has not
/// failed that collective: the others, which may still be finishing it (waiting for every
/// rank's exit), complete it. 50 rounds, so that the leaving lands inside their waits.
fn rank_leaves_after_completing(backend: &str) {
    for round in 0..50 {
        let results = on_ranks(group(backend, 3), |c| {
            let mut b = buf(&[c.rank() as f32; 4096]);
            let done = c.broadcast(&mut b, 0);
            if c.rank() == 1 {
                drop(c);
            }
            done.map(|()| vals::<f32>(&b))
        });
        for (r, res) in results.into_iter().enumerate() {
            match res {
                Ok(v) => assert!(v.iter().all(|&x| x == 0.0), "round {round}, rank {r}"),
                Err(e) => panic!("round {round}, rank {r}: {e}"),
            }
        }
    }
}

/// A rank panics (its communicator is dropped while unwinding): the others' pending calls
/// fail with RankGone naming it, promptly.
fn rank_panics(backend: &str) {
    let comms = group(backend, 4);
    let errors = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    enter(&*c);
                    let mut b = buf(&[2i64; 100]);
                    if c.rank() == 3 {
                        std::thread::sleep(Duration::from_millis(30));
                        panic!("rank 3 fails on purpose");
                    }
                    let t = Instant::now();
                    let e = c.all_reduce(&mut b, ReduceOp::Sum).unwrap_err();
                    assert!(t.elapsed() < Duration::from_secs(5));
                    (e, c.all_reduce(&mut b, ReduceOp::Sum).unwrap_err())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    for (r, res) in errors.into_iter().enumerate() {
        match res {
            Ok((pending, later)) => {
                assert!(
                    matches!(pending, CollectiveError::RankGone { rank: 3, .. }),
                    "{pending}"
                );
                assert!(
                    matches!(later, CollectiveError::RankGone { rank: 3, .. }),
                    "{later}"
                );
            }
            Err(_) => assert_eq!(r, 3, "only rank 3 panics"),
        }
    }
}

/// The abort handle fails every pending and later call on every rank, from any thread.
fn abort(backend: &str) {
    let comms = group(backend, 3);
    let handle = comms[0].abort_handle();
    let fired = AtomicBool::new(false);
    let results = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            fired.store(true, Ordering::SeqCst);
            handle.abort();
        });
        on_ranks(comms, |c| {
            let mut b = buf(&[1.0f32; 16]);
            if c.rank() == 2 {
                // Never joins the first collective; calls after the abort.
                while !fired.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            let t = Instant::now();
            let first = c.all_reduce(&mut b, ReduceOp::Sum);
            assert!(t.elapsed() < Duration::from_secs(5));
            (first, c.barrier())
        })
    });
    for (a, b) in results {
        assert!(matches!(a, Err(CollectiveError::Aborted { .. })), "{a:?}");
        assert!(
            matches!(
                b,
                Err(CollectiveError::Aborted {
                    op: Collective::Barrier
                })
            ),
            "{b:?}"
        );
    }
}

/// Abort while every rank streams large all-reduces (4 MiB in 16 KiB slices, every completed
/// one checked): each rank stops within its current slice, waits for the others to leave
/// its buffers and returns Aborted.
fn abort_mid_stream(backend: &str) {
    let comms = make_group(
        backend,
        4,
        Config::default()
            .with_timeout(Duration::from_secs(20))
            .with_slice_bytes(16 << 10),
    )
    .unwrap();
    let handle = comms[0].abort_handle();
    let results = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(40));
            handle.abort();
        });
        on_ranks(comms, |c| {
            // Rank- and index-dependent values whose sums are exact: a completed all-reduce
            // that read a wrong slice, a wrong rank or freed memory would not give them.
            let len = 1 << 20;
            let value = |r: usize, i: usize| ((r + 1) * (i % 5 + 1)) as f32;
            let want: Vec<f32> = (0..len).map(|i| (10 * (i % 5 + 1)) as f32).collect();
            let fresh = || buf(&(0..len).map(|i| value(c.rank(), i)).collect::<Vec<f32>>());
            let mut b = fresh();
            let mut done = 0;
            loop {
                match c.all_reduce(&mut b, ReduceOp::Sum) {
                    Ok(()) => done += 1,
                    Err(e) => return (done, e),
                }
                // A fresh buffer each time, freed right after: a peer still reading a freed
                // buffer would read garbage (or fault), not the sums checked here.
                assert!(vals::<f32>(&b) == want, "iteration {done}");
                b = fresh();
            }
        })
    });
    for (_, e) in results {
        assert!(matches!(e, CollectiveError::Aborted { .. }), "{e}");
    }
}

/// Several collectives started before any wait complete correctly, in start order;
/// dropping an unwaited Work is allowed.
fn several_in_flight(backend: &str) {
    let results = on_ranks(group(backend, 4), |c| {
        let r = c.rank() as f32;
        let mut a = buf(&[r; 10]);
        let mut b = buf(&[r + 1.0; 1000]);
        let mut d = buf(&[r; 3]);
        let w1 = c.start_all_reduce(&mut a, ReduceOp::Sum).unwrap();
        let w2 = c.start_all_reduce(&mut b, ReduceOp::Max).unwrap();
        let w3 = c.start_broadcast(&mut d, 2).unwrap();
        assert_eq!(w2.op(), Collective::AllReduce);
        w3.wait().unwrap();
        drop(w2);
        w1.wait_timeout(Duration::from_secs(1)).unwrap();
        c.start_barrier().unwrap().wait().unwrap();
        (a, b, d)
    });
    for (a, b, d) in results {
        assert_eq!(vals::<f32>(&a), [6.0; 10]);
        assert_eq!(vals::<f32>(&b), [4.0; 1000]);
        assert_eq!(vals::<f32>(&d), [2.0; 3]);
    }
}

/// Submitted all-reduces progress while the rank computes, interleave correctly with
/// borrowed collectives (which wait for them), and give every rank the same bits as the
/// blocking form.
fn submitted(backend: &str) {
    let results = on_ranks(group(backend, 4), |c| {
        let r = c.rank();
        let mut rng = Rng(7 + r as u64);
        let inputs: Vec<Vec<f32>> = [1usize, 1000, 70_000, 0, 4097]
            .iter()
            .map(|&len| (0..len).map(|_| rng.unit() as f32 - 0.5).collect())
            .collect();
        let pending: Vec<_> = inputs
            .iter()
            .map(|v| c.submit_all_reduce(buf(v), ReduceOp::Sum).unwrap())
            .collect();
        // The caller computes meanwhile; a borrowed collective waits for the submitted ones.
        let mut b = buf(&[r as i32; 5]);
        c.all_reduce(&mut b, ReduceOp::Max).unwrap();
        let submitted: Vec<Vec<f32>> = pending
            .into_iter()
            .map(|p| vals::<f32>(&p.wait().unwrap()))
            .collect();
        let blocking: Vec<Vec<f32>> = inputs
            .iter()
            .map(|v| {
                let mut x = buf(v);
                c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                vals::<f32>(&x)
            })
            .collect();
        // A Pending dropped unwaited still completes on every rank.
        drop(
            c.submit_all_reduce(buf(&[1.0f64; 8]), ReduceOp::Sum)
                .unwrap(),
        );
        let p = c
            .submit_all_reduce(buf(&[r as f64; 3]), ReduceOp::Mean)
            .unwrap();
        let last = vals::<f64>(&p.wait().unwrap());
        (vals::<i32>(&b), submitted, blocking, last)
    });
    let first = &results[0];
    for (max, submitted, blocking, last) in &results {
        assert_eq!(max, &[3; 5]);
        assert_eq!(submitted, blocking, "submitted and blocking differ");
        assert_eq!(submitted, &first.1, "ranks differ");
        assert_eq!(last, &[1.5; 3]);
    }
}

/// A submitted collective's errors come from `wait`: mismatched lengths on every rank
/// (the group goes on), then a rank that leaves fails the others' submitted calls.
fn submitted_errors(backend: &str) {
    let results = on_ranks(group(backend, 3), |c| {
        let len = if c.rank() == 2 { 5 } else { 4 };
        let p = c
            .submit_all_reduce(buf(&vec![1.0f32; len]), ReduceOp::Sum)
            .unwrap();
        let mismatch = p.wait().unwrap_err();
        c.barrier().unwrap();
        if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(50));
            drop(c);
            return (mismatch, None);
        }
        let t = Instant::now();
        let gone = c
            .submit_all_reduce(buf(&[1.0f32; 10]), ReduceOp::Sum)
            .unwrap()
            .wait();
        assert!(t.elapsed() < Duration::from_secs(5));
        (mismatch, Some(gone.unwrap_err()))
    });
    for (mismatch, gone) in results {
        assert!(
            matches!(mismatch, CollectiveError::LengthMismatch { rank: 2, .. }),
            "{mismatch}"
        );
        if let Some(e) = gone {
            assert!(
                matches!(e, CollectiveError::RankGone { rank: 0, .. }),
                "{e}"
            );
        }
    }
}

#[test]
fn the_grid_cuts_every_chunk_into_many_slices() {
    for n in WORLDS {
        for len in LENGTHS {
            // The smallest range any schedule slices: a ring's or `direct`'s chunk.
            let chunk = len.div_ceil(n);
            for dtype in SUPPORTED_DTYPES {
                let size = dtype.size_in_bytes();
                let (slices, _) = slicing(chunk, many_slices_bytes(n, len), size);
                assert!(
                    slices >= MIN_SLICES_PER_CHUNK.min(chunk),
                    "n={n} len={len} {dtype}: {slices} slices of a {chunk}-element chunk"
                );
                // The ablation's buffers (reduce-scatter's send is the longest: n x len) are
                // one slice each.
                let (one, _) = slicing(n * len, DEFAULT_SLICE_BYTES, size);
                assert!(
                    len > 1000 || one == 1,
                    "n={n} len={len} {dtype}: {one} slices"
                );
            }
        }
    }
    // And the inputs differ between ranks, within each operator's exact range.
    for op in ReduceOp::ALL {
        let a: Vec<i64> = (0..64)
            .map(|i| grid_value(DType::I32, op, Inputs::PerRank, 0, i))
            .collect();
        let b: Vec<i64> = (0..64)
            .map(|i| grid_value(DType::I32, op, Inputs::PerRank, 1, i))
            .collect();
        assert_ne!(a, b, "{op}");
        assert!(a.iter().chain(&b).all(|v| (-16..16).contains(v)));
    }
}

#[test]
fn every_backend_runs_the_suite() {
    // Adding a backend to BACKENDS without adding it to `suite!` below fails here.
    assert_eq!(BACKENDS, &["ring", "tree", "reduce-to-one", "direct"]);
    assert_eq!(
        crate::DEVICE_BACKENDS,
        &["cuda-ring", "nccl-ring", "nccl-tree"]
    );
}

/// The device ring's plans under deliberate bugs: a slice boundary off by one fails the
/// grid (and passes a grid whose buffers are one slice each); a plan without its waits
/// between streams fails the grid when the host executor runs steps in random dependency
/// order (and passes when it runs them in plan order, which is why it runs them
/// randomly). The second needs the host executor: on a GPU, whether a missing wait shows
/// depends on timing.
fn plans_catch_broken_schedules(backend: &str) {
    let (worlds, lengths) = ([3, 4], [100, 1000]);
    let run = |backend: &str, slicing, mutant| {
        let run = GridRun {
            inputs: Inputs::PerRank,
            slicing,
            worlds: &worlds,
            lengths: &lengths,
            mutant: Some(mutant),
        };
        PARTS
            .iter()
            .map(|&part| run_grid(backend, part, &run).len())
            .collect::<Vec<_>>()
    };
    let caught = run(backend, Slicing::Many, Mutant::SliceOffset);
    assert!(
        caught.iter().all(|&f| f > 0),
        "{backend}: SliceOffset passes: {caught:?}"
    );
    let missed = run(backend, Slicing::OnePerBuffer, Mutant::SliceOffset);
    assert!(
        missed.iter().all(|&f| f == 0),
        "{backend}: one slice per buffer caught it: {missed:?}"
    );
    if backend == crate::device::host_engine::NAME {
        let caught = run(backend, Slicing::Many, Mutant::MissingWait);
        assert!(
            caught[0] > 0 && caught[1] > 0,
            "{backend}: MissingWait passes: {caught:?}"
        );
        let missed = run(IN_ORDER, Slicing::Many, Mutant::MissingWait);
        assert!(missed.iter().all(|&f| f == 0), "in plan order: {missed:?}");
    }
}

#[test]
fn unknown_backend_and_bad_world_sizes_are_errors() {
    let e = cpu_group("nccl-ring", 2, Config::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown collectives backend `nccl-ring`; known backends: ring, tree, reduce-to-one, direct"
    );
    for n in [0, crate::MAX_WORLD_SIZE + 1] {
        assert!(matches!(
            cpu_group("ring", n, Config::default()),
            Err(CollectiveError::InvalidWorldSize { .. })
        ));
    }
}

#[test]
fn abort_handles_are_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone>() {}
    check::<crate::AbortHandle>();
    fn send<T: Send>() {}
    send::<Comm>();
    let comms = group("ring", 2);
    let h = comms[1].abort_handle().clone();
    assert!(!h.is_aborted());
    drop(comms);
    assert!(h.is_aborted(), "a dropped rank aborts the group");
    let _ = Arc::new(h);
}

macro_rules! suite {
    ($(#[$attr:meta])* $name:ident => $backend:expr) => {
        mod $name {
            use super::*;
            #[test]
            $(#[$attr])*
            fn grid_all_reduce() {
                grid($backend, Part::AllReduce);
            }
            #[test]
            $(#[$attr])*
            fn grid_reduce_scatter_all_gather_barrier() {
                grid($backend, Part::ScatterGather);
            }
            #[test]
            $(#[$attr])*
            fn grid_broadcast_and_reduce_from_every_root() {
                grid($backend, Part::Rooted);
            }
            #[test]
            $(#[$attr])*
            fn matches_the_reference() {
                proptest_backend($backend);
            }
            #[test]
            $(#[$attr])*
            fn mismatched_arguments_fail_on_every_rank() {
                mismatches(&in_process($backend));
            }
            #[test]
            $(#[$attr])*
            fn invalid_arguments_fail_on_every_rank() {
                bad_arguments(&in_process($backend));
            }
            #[test]
            $(#[$attr])*
            fn u8_sums_wrap_in_every_reduction() {
                u8_sums_wrap(&in_process($backend));
            }
            #[test]
            $(#[$attr])*
            fn two_ranks_sum_with_one_addition() {
                super::two_ranks_sum_with_one_addition(&in_process($backend));
            }
            #[test]
            $(#[$attr])*
            fn a_rank_that_never_calls_times_out_the_others() {
                deadline($backend);
            }
            #[test]
            $(#[$attr])*
            fn a_rank_that_leaves_fails_the_others() {
                rank_leaves($backend);
            }
            #[test]
            $(#[$attr])*
            fn a_rank_that_leaves_after_completing_does_not_fail_the_others() {
                rank_leaves_after_completing($backend);
            }
            #[test]
            $(#[$attr])*
            fn a_rank_that_panics_fails_the_others() {
                rank_panics($backend);
            }
            #[test]
            $(#[$attr])*
            fn abort_fails_pending_and_later_calls() {
                abort($backend);
            }
            #[test]
            $(#[$attr])*
            fn abort_stops_ranks_mid_stream() {
                abort_mid_stream($backend);
            }
            #[test]
            $(#[$attr])*
            fn several_collectives_in_flight() {
                several_in_flight($backend);
            }
            #[test]
            $(#[$attr])*
            fn submitted_collectives_progress_in_the_background() {
                submitted($backend);
            }
            #[test]
            $(#[$attr])*
            fn submitted_collectives_report_errors_on_wait() {
                submitted_errors($backend);
            }
        }
    };
}

suite!(ring => "ring");
suite!(tree => "tree");
suite!(reduce_to_one => "reduce-to-one");
suite!(direct => "direct");
suite!(hierarchical_pairs => HIER_PAIRS);
suite!(hierarchical_two_workers => HIER_TWO_WORKERS);
// The CUDA ring's plans, verdict and failure model, run on host memory in random
// dependency order: what the GPU suite below checks, minus the CUDA calls.
suite!(cuda_ring_on_host => crate::device::host_engine::NAME);
suite!(
    #[ignore = "needs a CUDA device"]
    cuda_ring => "cuda-ring"
);
// NCCL runs one rank per GPU (the grid goes up to 8 ranks) and reads NCCL_ALGO once per
// process: the GPU script runs each module in a process of its own with NCCL_ALGO set,
// where the machine has eight GPUs (ci/gpu-check.sh skips `_on_8_gpus` otherwise). Never
// run: no machine with more than one GPU has been lent.
suite!(
    #[ignore = "needs 8 GPUs"]
    nccl_ring_on_8_gpus => "nccl-ring"
);
suite!(
    #[ignore = "needs 8 GPUs"]
    nccl_tree_on_8_gpus => "nccl-tree"
);

/// NCCL in child processes of this test binary, each started with `NCCL_ALGO` and NCCL's
/// log (`NCCL_DEBUG=INFO`, subsystems ENV and TUNING, to a file) in its environment: the
/// only sound way to give NCCL its algorithm (see `device/nccl.rs`).
mod nccl_in_child_processes {
    use super::*;
    use crate::device::nccl::ALGORITHMS;

    /// The variable that tells [`child_process_of_the_nccl_tests`] which backend to run.
    const CHILD: &str = "MIRRA_NCCL_CHILD";

    /// Runs the child test for `backend` with `NCCL_ALGO=algo`; NCCL's log.
    fn run_child(backend: &str, algo: &str) -> String {
        let dir = std::env::temp_dir().join(format!("mirra-nccl-{}-{backend}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("nccl.log");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "conformance::nccl_in_child_processes::child_process_of_the_nccl_tests",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD, backend)
            .env("NCCL_ALGO", algo)
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "ENV,TUNING")
            .env("NCCL_DEBUG_FILE", &log)
            .output()
            .unwrap();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            out.status.success(),
            "{backend} child failed:\n{}\n{}\nNCCL log:\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::remove_dir_all(&dir);
        text
    }

    /// The child: every collective of the grid on one rank; with two GPUs, an all-reduce
    /// of 4 MiB on two ranks (whose algorithm NCCL logs); with one, two ranks on one GPU
    /// are refused with an error that says why.
    #[test]
    #[ignore = "run by the tests of this module, in a child process"]
    fn child_process_of_the_nccl_tests() {
        let backend = std::env::var(CHILD).expect("run by the tests of this module");
        let backend: &'static str = ALGORITHMS
            .iter()
            .map(|(b, _)| *b)
            .find(|b| *b == backend)
            .expect("an NCCL backend");
        let run = GridRun {
            inputs: Inputs::PerRank,
            slicing: Slicing::Many,
            worlds: &[1],
            lengths: &LENGTHS,
            mutant: None,
        };
        for part in PARTS {
            let failures = run_grid(backend, part, &run);
            assert!(failures.is_empty(), "{}", failures.join("\n"));
        }
        let gpu = Device::cuda(0).unwrap();
        if mirra_cuda::device_count().unwrap_or(0) >= 2 {
            let comms = make_group(backend, 2, Config::default()).unwrap();
            let sums = on_ranks(comms, |c| {
                let mut b = buf(&vec![c.rank() as f32 + 1.0; 1 << 20]);
                c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                vals::<f32>(&b)
            });
            assert!(sums.iter().all(|v| v.iter().all(|&x| x == 3.0)));
        } else {
            let e = crate::device_group(backend, &[gpu, gpu], Config::default()).unwrap_err();
            assert!(e.to_string().contains("NCCL runs one rank per GPU"), "{e}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn one_rank_runs_every_collective_and_nccl_reads_the_pinned_algorithm() {
        for (backend, algo) in ALGORITHMS {
            let log = run_child(backend, algo);
            assert!(
                log.contains(&format!("NCCL_ALGO set by environment to {algo}")),
                "{backend}: NCCL's log does not show NCCL_ALGO={algo}:\n{log}"
            );
        }
    }

    #[test]
    #[ignore = "needs 2 GPUs"]
    fn the_algorithm_nccl_ran_on_2_gpus_is_the_pinned_one() {
        for (backend, algo) in ALGORITHMS {
            let log = run_child(backend, algo);
            // `AllReduce: 4194304 Bytes -> Algo TREE proto SIMPLE channel{Lo..Hi}=...`
            let algos: Vec<&str> = log
                .lines()
                .filter_map(|l| l.split_once("AllReduce: 4194304 Bytes -> Algo "))
                .filter_map(|(_, rest)| rest.split_whitespace().next())
                .collect();
            assert!(
                !algos.is_empty() && algos.iter().all(|a| a.eq_ignore_ascii_case(algo)),
                "{backend}: NCCL ran {algos:?}:\n{log}"
            );
        }
    }
}

/// Each backend's schedules under deliberate bugs (NCCL's are NCCL's own).
mod schedules {
    use super::*;
    #[test]
    fn ring() {
        grid_catches_broken_schedules("ring");
    }
    #[test]
    fn tree() {
        grid_catches_broken_schedules("tree");
    }
    #[test]
    fn reduce_to_one() {
        grid_catches_broken_schedules("reduce-to-one");
    }
    #[test]
    fn direct() {
        grid_catches_broken_schedules("direct");
    }
    #[test]
    fn cuda_ring_on_host() {
        plans_catch_broken_schedules(crate::device::host_engine::NAME);
    }
    /// The hierarchical schedule's own bug (its stages are the CPU backends', whose bugs
    /// the tests above catch): the other workers broadcasting from the wrong local rank.
    /// The grid catches it at 4 and 6 ranks (2 x 2, 3 x 2), and would miss it if every
    /// rank held the same input.
    #[test]
    fn hierarchical() {
        let run = |inputs| GridRun {
            inputs,
            slicing: Slicing::Many,
            worlds: &[4, 6],
            lengths: &[100],
            mutant: Some(Mutant::WrongLocalRoot),
        };
        let caught = run_grid(HIER_PAIRS, Part::Rooted, &run(Inputs::PerRank));
        assert!(!caught.is_empty(), "WrongLocalRoot passes the grid");
        let missed = run_grid(HIER_PAIRS, Part::Rooted, &run(Inputs::SameOnEveryRank));
        assert!(
            missed.is_empty(),
            "same inputs caught it: {}",
            missed.join("\n")
        );
    }
    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_ring() {
        plans_catch_broken_schedules("cuda-ring");
    }
}

/// The suite under `mpirun` (feature `mpi`): the test launches this test binary again on
/// 2, 3 and 4 processes, where one ignored test runs the suite's per-rank parts on each
/// process's rank: the grid (`grid_rank`: every collective, dtype, operator, root and
/// length against closed forms), 48 seeded property cases against the sequential
/// reference (every rank's bits compared through an all-gather), and the argument errors
/// (`mismatches`, `bad_arguments`: the same error on every rank, the group usable after),
/// first on the `mpi` backend, then on the hierarchical one over MPI (two replica threads
/// per process). The failure cases that end an MPI job (deadlines, a rank gone) are
/// `tests/mpi.rs`'s, each in a job of its own.
#[cfg(feature = "mpi")]
mod under_mpirun {
    use super::*;

    /// Set in the environment of the processes the test launches.
    const CHILD: &str = "MIRRA_MPI_SUITE_CHILD";

    #[test]
    fn the_suite_passes_on_2_3_and_4_processes() {
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        for n in [2, 3, 4] {
            let mut cmd = std::process::Command::new("mpirun");
            if root {
                cmd.arg("--allow-run-as-root");
            }
            let out = cmd
                .args(["--oversubscribe", "-np", &n.to_string()])
                .arg(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "conformance::under_mpirun::rank_of_the_suite",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, "1")
                .output()
                .expect("mpirun runs (ci/install-mpi.sh installs OpenMPI)");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let text = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{n} processes: {text}");
            assert_eq!(
                stdout.matches(": the suite passed on mpi").count(),
                n,
                "{text}"
            );
            assert_eq!(
                stdout.matches(": the suite passed on hierarchical").count(),
                2 * n,
                "{text}"
            );
        }
    }

    #[test]
    #[ignore = "one rank of an mpirun job: run by the_suite_passes_on_2_3_and_4_processes"]
    fn rank_of_the_suite() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        let mpi = crate::Mpi::init().unwrap();
        let config = Config::default().with_timeout(Duration::from_secs(60));
        let comm = mpi.world(config.clone());
        enter(&*comm);
        suite_on(&*comm);
        println!("rank {}: the suite passed on mpi", comm.rank());
        let comms = mpi
            .hierarchical(&mpi.world_raw(), "direct", 2, config)
            .unwrap();
        on_ranks(comms, |c| {
            suite_on(&*c);
            println!("rank {}: the suite passed on hierarchical", c.rank());
        });
        drop(comm);
        drop(mpi);
    }

    /// The suite's per-rank parts on `comm`, this process's rank of its group.
    fn suite_on(comm: &dyn Communicator) {
        let n = comm.world_size();
        for part in PARTS {
            for &len in &LENGTHS {
                for dtype in SUPPORTED_DTYPES {
                    let res =
                        with_dtype!(dtype, T => grid_rank::<T>(comm, part, Inputs::PerRank, len));
                    res.unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
        // Seeded cases, the same on every process (proptest's own runner draws its cases
        // per process and shrinks per process: its ranks would disagree).
        let mut rng = Rng(0x5eed_u64 ^ n as u64);
        for _ in 0..48 {
            let len = (rng.next() % 5_000) as usize;
            let op = ReduceOp::ALL[(rng.next() % ReduceOp::ALL.len() as u64) as usize];
            let dtype = SUPPORTED_DTYPES[(rng.next() % SUPPORTED_DTYPES.len() as u64) as usize];
            let kind = match rng.next() % 5 {
                0 => Prop::ReduceScatter,
                1 => Prop::Reduce((rng.next() % 8) as usize),
                _ => Prop::AllReduce,
            };
            let seed = rng.next();
            let res = with_dtype!(dtype, T => prop_rank::<T>(comm, len, op, kind, seed));
            res.unwrap_or_else(|e| panic!("{e} (seed {seed})"));
        }
        let run = |size: usize, body: Body<'_>| match size == n {
            true => vec![(comm.rank(), body(comm))],
            false => Vec::new(),
        };
        mismatches(&run);
        bad_arguments(&run);
        u8_sums_wrap(&run);
        two_ranks_sum_with_one_addition(&run);
    }

    /// One property case on this rank: its output against the reference, and every
    /// rank's all-reduced bits against its own (gathered).
    fn prop_rank<T: Reducible>(
        comm: &dyn Communicator,
        len: usize,
        op: ReduceOp,
        kind: Prop,
        seed: u64,
    ) -> Result<(), String> {
        let (n, r) = (comm.world_size(), comm.rank());
        let case = PropCase::new::<T>(n, len, op, kind, seed)?;
        let out = case.run::<T>(comm)?;
        let what = case.what::<T>(comm.backend(), DEFAULT_SLICE_BYTES, r);
        case.check::<T>(r, &out, &what)?;
        if kind == Prop::AllReduce {
            let mine = Buffer::from_slice(out.as_bytes().unwrap(), Device::Cpu).unwrap();
            let mut all = Buffer::zeros(DType::U8, n * mine.len(), Device::Cpu).unwrap();
            comm.all_gather(&mine, &mut all)
                .map_err(|e| e.to_string())?;
            let bytes = all.as_slice::<u8>().unwrap();
            for (p, theirs) in bytes.chunks(mine.len().max(1)).enumerate() {
                if !mine.is_empty() && theirs != mine.as_slice::<u8>().unwrap() {
                    return Err(format!("{what}: rank {p}'s bits differ from this rank's"));
                }
            }
        }
        Ok(())
    }
}
