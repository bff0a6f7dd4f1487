//! The conformance suite: written once, run by every backend (see `suite!` at the end).
//!
//! - a gloo-style grid with closed-form answers: world sizes 1..=8 x lengths
//!   {0, 1, 3, 4, 100, 1000, 10 000} x every dtype x every operator, for every collective
//!   (broadcast and reduce from every root). Inputs are small integers (sums within
//!   [-24, 24], products of ±1 and ±2), so every order of combination is exact and every
//!   rank's result must equal the closed form bitwise;
//! - proptest against the naive sequential reference ([`crate::reference`]) with random
//!   values: integers exactly, floats within a per-dtype tolerance, all ranks bitwise
//!   equal;
//! - the failure model: argument mismatches, deadlines, ranks that leave or panic, abort.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirra_device::{Buffer, DType, Device, Element};
use proptest::prelude::*;

use crate::reduce::{with_dtype, Reducible};
use crate::{
    cpu_group, reference, Collective, CollectiveError, Communicator, Config, ReduceOp, BACKENDS,
    SUPPORTED_DTYPES,
};

type Comm = Box<dyn Communicator>;

/// Run `body` on every rank of `comms`, each on its own thread; results in rank order. A
/// panicking rank panics the test (after the others return).
pub(crate) fn on_ranks<R: Send>(comms: Vec<Comm>, body: impl Fn(Comm) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let body = &body;
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || body(c)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

fn group(backend: &str, n: usize) -> Vec<Comm> {
    cpu_group(
        backend,
        n,
        Config::default().with_timeout(Duration::from_secs(30)),
    )
    .unwrap()
}

fn short(backend: &str, n: usize, timeout_ms: u64) -> Vec<Comm> {
    let cfg = Config::default().with_timeout(Duration::from_millis(timeout_ms));
    cpu_group(backend, n, cfg).unwrap()
}

fn buf<T: Element>(v: &[T]) -> Buffer {
    Buffer::from_slice(v, Device::Cpu).unwrap()
}

// ---------------------------------------------------------------------------------------
// The closed-form grid.

const WORLDS: std::ops::RangeInclusive<usize> = 1..=8;
const LENGTHS: [usize; 7] = [0, 1, 3, 4, 100, 1000, 10_000];

/// Input element `i` of rank `r`: small integers whose sums (and products, for Product)
/// are exact in every dtype and every order.
fn grid_value(dtype: DType, op: ReduceOp, r: usize, i: usize) -> i64 {
    let v = if op == ReduceOp::Product {
        [1, 2, -1, -2][(r + 3 * i) % 4]
    } else {
        ((r * 7 + i * 3) % 7) as i64 - 3
    };
    match (dtype, op) {
        (DType::U8, ReduceOp::Product) => v.abs(),
        (DType::U8, _) => v + 3,
        _ => v,
    }
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

fn values<T: Reducible>(op: ReduceOp, r: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| conv(grid_value(T::DTYPE, op, r, i)))
        .collect()
}

fn input<T: Reducible>(op: ReduceOp, r: usize, len: usize) -> Buffer {
    buf(&values::<T>(op, r, len))
}

fn same<T: Reducible>(what: &str, got: &Buffer, want: &[T]) -> Result<(), String> {
    let (g, w) = (got.as_bytes(), buf(want));
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    // Bitwise: the closed form is exact, so every rank must produce exactly these bits.
    match g.iter().zip(w.as_bytes()).position(|(a, b)| a != b) {
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
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    AllReduce,
    ScatterGather,
    Rooted,
}

/// One rank's share of the grid for one dtype; every rank runs the same sequence.
fn grid_rank<T: Reducible>(comm: &dyn Communicator, part: Part) -> Result<(), String> {
    let (n, r) = (comm.world_size(), comm.rank());
    let ctx = |what: &str, len: usize, op: ReduceOp| {
        format!(
            "{} n={n} rank={r} {what} len={len} {} {op}",
            comm.backend(),
            T::DTYPE
        )
    };
    let err = |what: String| move |e: CollectiveError| format!("{what}: {e}");
    for len in LENGTHS {
        if part == Part::AllReduce {
            for op in ReduceOp::ALL {
                let what = ctx("all_reduce", len, op);
                let mut b = input::<T>(op, r, len);
                comm.all_reduce(&mut b, op).map_err(err(what.clone()))?;
                let want: Vec<T> = (0..len)
                    .map(|i| closed_form(op, (0..n).map(|p| grid_value(T::DTYPE, op, p, i)), n))
                    .collect();
                same(&what, &b, &want)?;
            }
        }
        if part == Part::ScatterGather {
            for op in ReduceOp::ALL {
                let what = ctx("reduce_scatter", len, op);
                let send = input::<T>(op, r, n * len);
                let mut recv = input::<T>(op, r, len);
                comm.reduce_scatter(&send, &mut recv, op)
                    .map_err(err(what.clone()))?;
                let want: Vec<T> = (0..len)
                    .map(|i| {
                        let vals = (0..n).map(|p| grid_value(T::DTYPE, op, p, r * len + i));
                        closed_form(op, vals, n)
                    })
                    .collect();
                same(&what, &recv, &want)?;
            }
            let what = ctx("all_gather", len, ReduceOp::Sum);
            let send = input::<T>(ReduceOp::Sum, r, len);
            let mut recv = input::<T>(ReduceOp::Sum, r + 1, n * len);
            comm.all_gather(&send, &mut recv)
                .map_err(err(what.clone()))?;
            let want: Vec<T> = (0..n * len)
                .map(|k| {
                    conv(grid_value(
                        T::DTYPE,
                        ReduceOp::Sum,
                        k / len.max(1),
                        k % len.max(1),
                    ))
                })
                .collect();
            same(&what, &recv, &want)?;
            let what = ctx("barrier", len, ReduceOp::Sum);
            comm.barrier().map_err(err(what))?;
        }
        if part == Part::Rooted {
            for root in 0..n {
                let what = ctx(&format!("broadcast root={root}"), len, ReduceOp::Sum);
                let mut b = input::<T>(ReduceOp::Sum, r, len);
                comm.broadcast(&mut b, root).map_err(err(what.clone()))?;
                same(&what, &b, &values::<T>(ReduceOp::Sum, root, len))?;
                for op in ReduceOp::ALL {
                    let what = ctx(&format!("reduce root={root}"), len, op);
                    let mut b = input::<T>(op, r, len);
                    comm.reduce(&mut b, op, root).map_err(err(what.clone()))?;
                    if r == root {
                        let want: Vec<T> = (0..len)
                            .map(|i| {
                                closed_form(op, (0..n).map(|p| grid_value(T::DTYPE, op, p, i)), n)
                            })
                            .collect();
                        same(&what, &b, &want)?;
                    } else {
                        same(
                            &(what + " (non-root unchanged)"),
                            &b,
                            &values::<T>(op, r, len),
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn grid(backend: &str, part: Part) {
    for n in WORLDS {
        let results = on_ranks(group(backend, n), |comm| {
            for dtype in SUPPORTED_DTYPES {
                with_dtype!(dtype, T => grid_rank::<T>(&*comm, part)?);
            }
            Ok::<(), String>(())
        });
        let failures: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
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

#[derive(Clone, Copy, Debug)]
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

fn prop_case<T: Reducible>(
    backend: &str,
    n: usize,
    len: usize,
    op: ReduceOp,
    kind: Prop,
    seed: u64,
) -> Result<(), String> {
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
    let slices: Vec<&[T]> = inputs.iter().map(|b| b.as_slice::<T>().unwrap()).collect();
    let outs = on_ranks(group(backend, n), |comm| -> Result<Buffer, String> {
        let r = comm.rank();
        match kind {
            Prop::AllReduce | Prop::Reduce(_) => {
                let mut b = inputs[r].clone();
                match kind {
                    Prop::Reduce(root) => comm.reduce(&mut b, op, root % n),
                    _ => comm.all_reduce(&mut b, op),
                }
                .map_err(|e| e.to_string())?;
                Ok(b)
            }
            Prop::ReduceScatter => {
                let mut recv = Buffer::zeros(T::DTYPE, count, Device::Cpu).unwrap();
                comm.reduce_scatter(&inputs[r], &mut recv, op)
                    .map_err(|e| e.to_string())?;
                Ok(recv)
            }
        }
    });
    let outs: Vec<Buffer> = outs.into_iter().collect::<Result<_, _>>()?;
    let what = |r: usize| {
        format!(
            "{backend} n={n} len={len} {} {op} {kind:?} rank {r}",
            T::DTYPE
        )
    };
    match kind {
        Prop::AllReduce => {
            for (r, o) in outs.iter().enumerate() {
                if o.as_bytes() != outs[0].as_bytes() {
                    return Err(format!("{}: differs bitwise from rank 0", what(r)));
                }
            }
            check_close::<T>(&what(0), &outs[0], &want, &slices, 0, op)
        }
        Prop::Reduce(root) => {
            let root = root % n;
            for (r, o) in outs.iter().enumerate() {
                if r != root && o.as_bytes() != inputs[r].as_bytes() {
                    return Err(format!("{}: non-root buffer changed", what(r)));
                }
            }
            check_close::<T>(&what(root), &outs[root], &want, &slices, 0, op)
        }
        Prop::ReduceScatter => {
            for (r, o) in outs.iter().enumerate() {
                let bytes = count * T::DTYPE.size_in_bytes();
                let mut part = Buffer::zeros(T::DTYPE, count, Device::Cpu).unwrap();
                part.as_bytes_mut()
                    .copy_from_slice(&want.as_bytes()[r * bytes..(r + 1) * bytes]);
                check_close::<T>(&what(r), o, &part, &slices, r * count, op)?;
            }
            Ok(())
        }
    }
}

fn prop_strategy() -> impl Strategy<Value = (usize, usize, ReduceOp, DType, Prop, u64)> {
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
    (1..=8usize, len, op, dtype, kind, any::<u64>())
}

fn proptest_backend(backend: &'static str) {
    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |((n, len, op, dtype, kind, seed) in prop_strategy())| {
        let res = with_dtype!(dtype, T => prop_case::<T>(backend, n, len, op, kind, seed));
        prop_assert!(res.is_ok(), "{}", res.unwrap_err());
    });
}

// ---------------------------------------------------------------------------------------
// Errors and the failure model.

fn all_errors(results: Vec<crate::Result<()>>) -> Vec<CollectiveError> {
    results
        .into_iter()
        .map(|r| r.expect_err("every rank must fail"))
        .collect()
}

fn mismatches(backend: &str) {
    // Lengths: rank 1 passes 5 elements, the others 4.
    let errs = all_errors(on_ranks(group(backend, 3), |c| {
        let len = if c.rank() == 1 { 5 } else { 4 };
        let mut b = buf(&vec![1.0f32; len]);
        let res = c.all_reduce(&mut b, ReduceOp::Sum);
        // An argument error leaves the group usable.
        let mut ok = buf(&[1.0f32; 4]);
        c.all_reduce(&mut ok, ReduceOp::Sum).unwrap();
        assert_eq!(ok.as_slice::<f32>().unwrap(), &[3.0; 4]);
        res
    }));
    for e in &errs {
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
    let errs = all_errors(on_ranks(group(backend, 3), |c| {
        let mut b = if c.rank() == 0 {
            buf(&[1.0f64; 4])
        } else {
            buf(&[1.0f32; 4])
        };
        c.all_reduce(&mut b, ReduceOp::Sum)
    }));
    for e in &errs {
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
    let errs = all_errors(on_ranks(group(backend, 4), |c| {
        let op = if c.rank() == 2 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        c.all_reduce(&mut buf(&[1i32; 3]), op)
    }));
    for e in &errs {
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
    let errs = all_errors(on_ranks(group(backend, 3), |c| {
        let root = if c.rank() == 2 { 1 } else { 0 };
        c.broadcast(&mut buf(&[1u8; 3]), root)
    }));
    for e in &errs {
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
    let errs = all_errors(on_ranks(group(backend, 2), |c| {
        if c.rank() == 0 {
            c.all_reduce(&mut buf(&[1.0f32]), ReduceOp::Sum)
        } else {
            c.barrier()
        }
    }));
    assert!(
        matches!(
            errs[0],
            CollectiveError::CollectiveMismatch {
                op: Collective::AllReduce,
                rank: 1,
                started: Collective::Barrier,
                ..
            }
        ),
        "{}",
        errs[0]
    );
    assert!(
        matches!(
            errs[1],
            CollectiveError::CollectiveMismatch {
                op: Collective::Barrier,
                rank: 1,
                ..
            }
        ),
        "{}",
        errs[1]
    );
}

fn bad_arguments(backend: &str) {
    // Root out of range on every rank, and on one rank only.
    for bad in [None, Some(1)] {
        let errs = all_errors(on_ranks(group(backend, 3), |c| {
            let root = if bad.is_none_or(|b| b == c.rank()) {
                3
            } else {
                0
            };
            c.reduce(&mut buf(&[1.0f32; 2]), ReduceOp::Sum, root)
        }));
        let rank = bad.unwrap_or(0);
        for e in &errs {
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
    let errs = all_errors(on_ranks(group(backend, 2), |c| {
        let send = buf(&[1.0f32; 4]);
        let mut recv = buf(&[0.0f32; 3]);
        c.reduce_scatter(&send, &mut recv, ReduceOp::Sum)
    }));
    for e in &errs {
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
    let errs = all_errors(on_ranks(group(backend, 2), |c| {
        let send = buf(&[1.0f32; 2]);
        let mut recv = buf(&[0.0f64; 4]);
        c.all_gather(&send, &mut recv)
    }));
    for e in &errs {
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

/// A rank panics (its communicator is dropped while unwinding): the others' pending calls
/// fail with RankGone naming it, promptly.
fn rank_panics(backend: &str) {
    let comms = group(backend, 4);
    let errors = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
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

/// Abort while every rank streams large all-reduces: each rank stops within its current
/// slice, waits for the others to leave its buffers and returns Aborted.
fn abort_mid_stream(backend: &str) {
    let comms = cpu_group(
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
            let mut b = buf(&vec![1.0f32; 1 << 20]);
            let mut done = 0;
            loop {
                match c.all_reduce(&mut b, ReduceOp::Max) {
                    Ok(()) => done += 1,
                    Err(e) => return (done, e),
                }
                // A fresh buffer each time, freed right after: a peer still reading a freed
                // buffer would read garbage (or fault), not the ones checked below.
                assert!(b.as_slice::<f32>().unwrap().iter().all(|&x| x == 1.0));
                b = buf(&vec![1.0f32; 1 << 20]);
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
        assert_eq!(a.as_slice::<f32>().unwrap(), &[6.0; 10]);
        assert_eq!(b.as_slice::<f32>().unwrap(), &[4.0; 1000]);
        assert_eq!(d.as_slice::<f32>().unwrap(), &[2.0; 3]);
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
            .map(|p| p.wait().unwrap().as_slice::<f32>().unwrap().to_vec())
            .collect();
        let blocking: Vec<Vec<f32>> = inputs
            .iter()
            .map(|v| {
                let mut x = buf(v);
                c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                x.as_slice::<f32>().unwrap().to_vec()
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
        let last = p.wait().unwrap().as_slice::<f64>().unwrap().to_vec();
        (
            b.as_slice::<i32>().unwrap().to_vec(),
            submitted,
            blocking,
            last,
        )
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
fn every_backend_runs_the_suite() {
    // Adding a backend to BACKENDS without adding it to `suite!` below fails here.
    assert_eq!(BACKENDS, &["ring", "tree", "reduce-to-one", "direct"]);
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
    ($($name:ident => $backend:literal),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[test]
            fn grid_all_reduce() {
                grid($backend, Part::AllReduce);
            }
            #[test]
            fn grid_reduce_scatter_all_gather_barrier() {
                grid($backend, Part::ScatterGather);
            }
            #[test]
            fn grid_broadcast_and_reduce_from_every_root() {
                grid($backend, Part::Rooted);
            }
            #[test]
            fn matches_the_reference() {
                proptest_backend($backend);
            }
            #[test]
            fn mismatched_arguments_fail_on_every_rank() {
                mismatches($backend);
            }
            #[test]
            fn invalid_arguments_fail_on_every_rank() {
                bad_arguments($backend);
            }
            #[test]
            fn a_rank_that_never_calls_times_out_the_others() {
                deadline($backend);
            }
            #[test]
            fn a_rank_that_leaves_fails_the_others() {
                rank_leaves($backend);
            }
            #[test]
            fn a_rank_that_panics_fails_the_others() {
                rank_panics($backend);
            }
            #[test]
            fn abort_fails_pending_and_later_calls() {
                abort($backend);
            }
            #[test]
            fn abort_stops_ranks_mid_stream() {
                abort_mid_stream($backend);
            }
            #[test]
            fn several_collectives_in_flight() {
                several_in_flight($backend);
            }
            #[test]
            fn submitted_collectives_progress_in_the_background() {
                submitted($backend);
            }
            #[test]
            fn submitted_collectives_report_errors_on_wait() {
                submitted_errors($backend);
            }
        }
    )*};
}

suite!(ring => "ring", tree => "tree", reduce_to_one => "reduce-to-one", direct => "direct");
