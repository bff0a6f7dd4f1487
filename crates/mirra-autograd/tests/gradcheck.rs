//! Gradient checks: for every differentiable op, the gradient that `Tape::backward` computes
//! agrees with central finite differences in f64, on random shapes, values and axes.
//!
//! Every op test goes through the one checker, [`check`]: it turns the op's output into a
//! scalar loss `sum(out * R)` with a random constant `R` (so every output element's gradient
//! matters, with a different weight), takes the analytic gradient of every input, and
//! compares each element with `sum(R * (f(x + h e_j) - f(x - h e_j))) / 2h`.
//!
//! Tolerance: `|analytic - numeric| <= 1e-6 + 1e-5 |numeric|`, with `h = 1e-6`. Central
//! differences are exact up to `h² f''' / 6` (about 1e-12 here: inputs are bounded, and kept
//! away from poles and kinks by at least 1e-2) plus the rounding of the outputs divided by
//! `2h`: each output of magnitude below ~50 is rounded to ~1e-14, which becomes ~1e-8 in the
//! quotient, summed over at most a few hundred outputs with weights below 1 and mostly
//! cancelling. Measured over 2000 cases per property, the worst error was 1.6e-7, 12% of its
//! tolerance; a wrong gradient (a missing term, a wrong axis, a missed accumulation) is off
//! by O(1), and a gradient off by 2e-4 relative already fails.

use std::sync::Arc;

use mirra_autograd::{LinearMap, Tape, Var};
use mirra_tensor::{
    set_conv_algorithm, ConvAlgorithm, DType, Device, Padding, Tensor, UnaryOp, Window,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};

/// Finite-difference step.
const EPS: f64 = 1e-6;
/// Absolute part of the tolerance.
const ATOL: f64 = 1e-6;
/// Relative part of the tolerance.
const RTOL: f64 = 1e-5;
/// Cases per property: enough to meet every rank and axis, few enough to run in seconds.
const CASES: u32 = 48;

/// `CASES` cases (or `PROPTEST_CASES` when set, for a longer run); failing cases are saved
/// beside this file, in `<name>.proptest-regressions`.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CASES),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

type VarResult<'t> = mirra_autograd::Result<Var<'t>>;

/// An f64 array: the generated form of every input, printed whole when a case fails.
#[derive(Clone, Debug)]
struct Arr {
    dims: Vec<usize>,
    data: Vec<f64>,
}

impl Arr {
    fn tensor(&self) -> Tensor {
        Tensor::from_slice(&self.data, &self.dims, Device::Cpu).unwrap()
    }
}

/// A fixed pseudo-random weighting in [-1, 1) (SplitMix64), the `R` of the loss.
fn weights(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

fn fail(context: &str, e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!("{context}: {e}"))
}

/// The gradient check. `f` computes an op's output from variables standing for `inputs`;
/// the analytic gradient of `sum(f(inputs) * R)` with respect to every input is compared
/// with central differences, element by element. Also checks that the gradient-ready hook
/// reports every input exactly once, with the gradient `backward` returns.
fn check<F>(seed: u64, inputs: &[Arr], f: F) -> Result<(), TestCaseError>
where
    F: for<'t> Fn(&[Var<'t>]) -> VarResult<'t>,
{
    // The op's output with every input a constant: nothing is recorded.
    let eval = |values: &[Tensor]| -> Result<Vec<f64>, TestCaseError> {
        let tape = Tape::new();
        let vars: Vec<Var<'_>> = values.iter().map(|t| tape.constant(t.clone())).collect();
        let out = f(&vars).map_err(|e| fail("forward", e))?;
        prop_assert!(!out.requires_grad() && tape.is_empty());
        out.value().to_vec::<f64>().map_err(|e| fail("to_vec", e))
    };

    // Analytic gradients.
    let tape = Tape::new();
    let params: Vec<Var<'_>> = inputs
        .iter()
        .enumerate()
        .map(|(key, a)| tape.param(a.tensor(), key))
        .collect();
    let out = f(&params).map_err(|e| fail("forward", e))?;
    let out_dims = out.shape().to_vec();
    let r = weights(seed, out.value().elem_count());
    let rv = tape.constant(Tensor::from_slice(&r, &out_dims, Device::Cpu).unwrap());
    let loss = out
        .mul(&rv)
        .and_then(|p| p.sum(&[], false))
        .map_err(|e| fail("loss", e))?;
    let mut reported: Vec<(usize, Vec<f64>)> = vec![];
    let grads = tape
        .backward_with(&loss, |key, g| {
            reported.push((key, g.to_vec::<f64>().map_err(|e| e.to_string())?));
            Ok(())
        })
        .map_err(|e| fail("backward", e))?;
    let mut keys: Vec<usize> = reported.iter().map(|(k, _)| *k).collect();
    keys.sort_unstable();
    prop_assert_eq!(
        keys,
        (0..inputs.len()).collect::<Vec<_>>(),
        "the hook must report every input exactly once"
    );

    // Numeric gradients, one input element at a time.
    let mut values: Vec<Tensor> = inputs.iter().map(Arr::tensor).collect();
    for (i, input) in inputs.iter().enumerate() {
        let g = grads.get(i).expect("every input was reported");
        prop_assert_eq!(
            g.dims(),
            &input.dims[..],
            "gradient {} has the wrong shape",
            i
        );
        prop_assert_eq!(g.dtype(), DType::F64);
        let analytic = g.to_vec::<f64>().unwrap();
        let hooked = &reported.iter().find(|(k, _)| *k == i).unwrap().1;
        prop_assert_eq!(hooked, &analytic, "the hook saw another gradient");
        let mut data = input.data.clone();
        for j in 0..data.len() {
            let x = data[j];
            let (xp, xm) = (x + EPS, x - EPS);
            data[j] = xp;
            values[i] = Tensor::from_slice(&data, &input.dims, Device::Cpu).unwrap();
            let plus = eval(&values)?;
            data[j] = xm;
            values[i] = Tensor::from_slice(&data, &input.dims, Device::Cpu).unwrap();
            let minus = eval(&values)?;
            data[j] = x;
            // Differences first, then the weighted sum: no cancellation in a large total.
            let diff: f64 = r
                .iter()
                .zip(plus.iter().zip(&minus))
                .map(|(w, (p, m))| w * (p - m))
                .sum();
            let numeric = diff / (xp - xm);
            let a = analytic[j];
            prop_assert!(
                (a - numeric).abs() <= ATOL + RTOL * numeric.abs(),
                "d loss / d input {}[{}] (input dims {:?}, output dims {:?}): \
                 analytic {} vs numeric {}",
                i,
                j,
                input.dims,
                out_dims,
                a,
                numeric
            );
        }
        values[i] = input.tensor();
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Strategies.

/// How to draw an array's values.
#[derive(Clone, Copy, Debug)]
enum Vals {
    /// Uniform on `[lo, hi)`.
    Uniform(f64, f64),
    /// `|x|` uniform on `[lo, hi)`, either sign: for functions with a kink or pole at 0.
    Away(f64, f64),
    /// Pairwise at least 0.01 apart, so a max has one winner however an input moves by `h`.
    Distinct,
}

/// Dimensions of rank 1 to 4, each 1 to 5.
fn dims() -> impl Strategy<Value = Vec<usize>> {
    vec(1usize..=5, 1..=4)
}

/// An array of the drawn dimensions with values drawn by `vals`.
fn arr(dims: impl Strategy<Value = Vec<usize>>, vals: Vals) -> impl Strategy<Value = Arr> {
    dims.prop_flat_map(move |dims| {
        let n: usize = dims.iter().product();
        let data: BoxedStrategy<Vec<f64>> = match vals {
            Vals::Uniform(lo, hi) => vec(lo..hi, n).boxed(),
            Vals::Away(lo, hi) => vec((lo..hi, any::<bool>()), n)
                .prop_map(|v| v.into_iter().map(|(m, s)| if s { m } else { -m }).collect())
                .boxed(),
            Vals::Distinct => (
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                vec(-0.02..0.02, n),
            )
                .prop_map(move |(order, jitter)| {
                    order
                        .iter()
                        .zip(jitter)
                        .map(|(&k, j)| (k as f64 - n as f64 / 2.0) * 0.05 + j)
                        .collect()
                })
                .boxed(),
        };
        data.prop_map(move |data| Arr {
            dims: dims.clone(),
            data,
        })
    })
}

/// Plain values for smooth functions.
fn normal() -> Vals {
    Vals::Uniform(-2.0, 2.0)
}

/// A shape that broadcasts to `out`: some leading dimensions dropped (possibly all, a
/// scalar), some of the rest set to 1.
fn broadcast_from(out: Vec<usize>) -> impl Strategy<Value = Vec<usize>> {
    let r = out.len();
    (0..=r, vec(any::<bool>(), r)).prop_map(move |(drop, ones)| {
        (drop..r)
            .map(|d| if ones[d] { 1 } else { out[d] })
            .collect()
    })
}

/// Two arrays whose shapes broadcast against each other, with ranks and size-1 dimensions
/// differing.
fn pair(va: Vals, vb: Vals) -> impl Strategy<Value = (Arr, Arr)> {
    dims().prop_flat_map(move |out| {
        (
            arr(broadcast_from(out.clone()), va),
            arr(broadcast_from(out), vb),
        )
    })
}

/// A set of axes of a rank-`r` array, each written positive or negative at random; empty
/// means all axes.
fn axes(r: usize) -> impl Strategy<Value = Vec<isize>> {
    vec((any::<bool>(), any::<bool>()), r).prop_map(move |picks| {
        let r = r as isize;
        (0..r)
            .zip(picks)
            .filter(|(_, (take, _))| *take)
            .map(|(a, (_, neg))| if neg { a - r } else { a })
            .collect()
    })
}

/// One axis of a rank-`r` array, positive or negative.
fn axis(r: usize) -> impl Strategy<Value = isize> {
    let r = r as isize;
    -r..r
}

/// The array, then a value drawn from a strategy that depends on its rank.
fn with_rank<S: Strategy>(
    a: impl Strategy<Value = Arr>,
    s: impl Fn(usize) -> S,
) -> impl Strategy<Value = (Arr, S::Value)> {
    a.prop_flat_map(move |a| {
        let r = a.dims.len();
        (Just(a), s(r))
    })
}

/// Operands of a matrix product `[.., m, k] x [.., k, n]` whose batch dimensions
/// (`batch_rank` of them at most) broadcast against each other. With `ta` / `tb` an operand
/// is stored transposed, to be multiplied as a transposed (strided) view.
fn matmul_operands(
    batch_rank: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = (Arr, Arr, bool, bool)> {
    (
        vec(1usize..=4, batch_rank),
        1usize..=5,
        1usize..=5,
        1usize..=5,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(batch, m, k, n, ta, tb)| {
            let dims = move |b: Vec<usize>, rows: usize, cols: usize, t: bool| {
                let mut d = b;
                d.extend(if t { [cols, rows] } else { [rows, cols] });
                d
            };
            (
                arr(
                    broadcast_from(batch.clone()).prop_map(move |b| dims(b, m, k, ta)),
                    normal(),
                ),
                arr(
                    broadcast_from(batch).prop_map(move |b| dims(b, k, n, tb)),
                    normal(),
                ),
                Just(ta),
                Just(tb),
            )
        })
}

fn transposed_if<'t>(v: &Var<'t>, t: bool) -> VarResult<'t> {
    if t {
        v.transpose(-1, -2)
    } else {
        Ok(v.clone())
    }
}

/// An array, an axis, and an i64 index tensor for gathering along it: the array's shape
/// with the axis resized to 1..=5, entries in range. Indices repeat (so scatter_add must
/// accumulate) and some entries go unpicked.
fn gather_operands() -> impl Strategy<Value = (Arr, usize, Tensor)> {
    with_rank(arr(dims(), normal()), |r| (0..r, 1usize..=5)).prop_flat_map(|(a, (ax, m))| {
        let mut idx_dims = a.dims.clone();
        idx_dims[ax] = m;
        let count: usize = idx_dims.iter().product();
        let size = a.dims[ax] as i64;
        (Just(a), Just(ax), vec(0..size, count)).prop_map(move |(a, ax, idx)| {
            let index = Tensor::from_slice(&idx, &idx_dims, Device::Cpu).unwrap();
            (a, ax, index)
        })
    })
}

// ---------------------------------------------------------------------------------------
// One property per op, each a call of `check`.

proptest! {
    #![proptest_config(config())]

    #[test]
    fn matmul_2d((a, b, ta, tb) in matmul_operands(0..=0), seed: u64) {
        check(seed, &[a, b], |v| transposed_if(&v[0], ta)?.matmul(&transposed_if(&v[1], tb)?))?;
    }

    #[test]
    fn matmul_batched_with_broadcast_batch_dims(
        (a, b, ta, tb) in matmul_operands(1..=2),
        seed: u64,
    ) {
        check(seed, &[a, b], |v| transposed_if(&v[0], ta)?.matmul(&transposed_if(&v[1], tb)?))?;
    }

    #[test]
    fn add((a, b) in pair(normal(), normal()), seed: u64) {
        check(seed, &[a, b], |v| v[0].add(&v[1]))?;
    }

    #[test]
    fn sub((a, b) in pair(normal(), normal()), seed: u64) {
        check(seed, &[a, b], |v| v[0].sub(&v[1]))?;
    }

    #[test]
    fn mul((a, b) in pair(normal(), normal()), seed: u64) {
        check(seed, &[a, b], |v| v[0].mul(&v[1]))?;
    }

    #[test]
    fn div((a, b) in pair(normal(), Vals::Away(0.3, 2.0)), seed: u64) {
        check(seed, &[a, b], |v| v[0].div(&v[1]))?;
    }

    #[test]
    fn binary_op_of_a_variable_with_itself(a in arr(dims(), Vals::Away(0.3, 2.0)), seed: u64) {
        check(seed, &[a], |v| v[0].mul(&v[0])?.add(&v[0])?.div(&v[0].sub(&v[0].scale(3.0)?)?))?;
    }

    #[test]
    fn relu(a in arr(dims(), Vals::Away(0.01, 2.0)), seed: u64) {
        check(seed, &[a], |v| v[0].relu())?;
    }

    #[test]
    fn sigmoid(a in arr(dims(), Vals::Uniform(-6.0, 6.0)), seed: u64) {
        check(seed, &[a], |v| v[0].sigmoid())?;
    }

    #[test]
    fn tanh(a in arr(dims(), Vals::Uniform(-3.0, 3.0)), seed: u64) {
        check(seed, &[a], |v| v[0].tanh())?;
    }

    #[test]
    fn gelu(a in arr(dims(), Vals::Uniform(-4.0, 4.0)), seed: u64) {
        check(seed, &[a], |v| v[0].gelu())?;
    }

    #[test]
    fn exp(a in arr(dims(), Vals::Uniform(-3.0, 3.0)), seed: u64) {
        check(seed, &[a], |v| v[0].exp())?;
    }

    #[test]
    fn log(a in arr(dims(), Vals::Uniform(0.1, 5.0)), seed: u64) {
        check(seed, &[a], |v| v[0].log())?;
    }

    #[test]
    fn sqrt(a in arr(dims(), Vals::Uniform(0.1, 5.0)), seed: u64) {
        check(seed, &[a], |v| v[0].sqrt())?;
    }

    #[test]
    fn neg(a in arr(dims(), normal()), seed: u64) {
        check(seed, &[a], |v| v[0].neg())?;
    }

    #[test]
    fn abs(a in arr(dims(), Vals::Away(0.01, 2.0)), seed: u64) {
        check(seed, &[a], |v| v[0].unary(UnaryOp::Abs))?;
    }

    #[test]
    fn square(a in arr(dims(), normal()), seed: u64) {
        check(seed, &[a], |v| v[0].square())?;
    }

    #[test]
    fn recip(a in arr(dims(), Vals::Away(0.3, 2.0)), seed: u64) {
        check(seed, &[a], |v| v[0].unary(UnaryOp::Recip))?;
    }

    #[test]
    fn sign_has_a_zero_gradient(a in arr(dims(), Vals::Away(0.01, 2.0)), seed: u64) {
        check(seed, &[a], |v| v[0].unary(UnaryOp::Sign))?;
    }

    #[test]
    fn affine(a in arr(dims(), normal()), mul in -3.0..3.0f64, add in -3.0..3.0f64, seed: u64) {
        check(seed, &[a], |v| v[0].affine(mul, add))?;
    }

    #[test]
    fn scale(a in arr(dims(), normal()), factor in -3.0..3.0f64, seed: u64) {
        check(seed, &[a], |v| v[0].scale(factor))?;
    }

    #[test]
    fn powf(a in arr(dims(), Vals::Uniform(0.2, 3.0)), exponent in -2.5..3.0f64, seed: u64) {
        check(seed, &[a], |v| v[0].powf(exponent))?;
    }

    #[test]
    fn sum((a, (axes, keep)) in with_rank(arr(dims(), normal()), |r| (axes(r), any::<bool>())), seed: u64) {
        check(seed, &[a], |v| v[0].sum(&axes, keep))?;
    }

    #[test]
    fn mean((a, (axes, keep)) in with_rank(arr(dims(), normal()), |r| (axes(r), any::<bool>())), seed: u64) {
        check(seed, &[a], |v| v[0].mean(&axes, keep))?;
    }

    #[test]
    fn max((a, (axes, keep)) in with_rank(arr(dims(), Vals::Distinct), |r| (axes(r), any::<bool>())), seed: u64) {
        check(seed, &[a], |v| v[0].max(&axes, keep))?;
    }

    #[test]
    fn softmax((a, axis) in with_rank(arr(dims(), Vals::Uniform(-3.0, 3.0)), axis), seed: u64) {
        check(seed, &[a], |v| v[0].softmax(axis))?;
    }

    #[test]
    fn log_softmax((a, axis) in with_rank(arr(dims(), Vals::Uniform(-3.0, 3.0)), axis), seed: u64) {
        check(seed, &[a], |v| v[0].log_softmax(axis))?;
    }

    #[test]
    fn reshape(
        (a, (target, first)) in with_rank(
            arr(dims(), normal()),
            |r| (Just((0..r).collect::<Vec<_>>()).prop_shuffle(), (-1isize..r as isize)),
        ),
        seed: u64,
    ) {
        // To the dimensions shuffled, of a view transposed first when `first >= 0` (so the
        // reshape copies).
        let new_dims: Vec<usize> = target.iter().map(|&d| a.dims[d]).collect();
        check(seed, &[a], |v| {
            let x = if first >= 0 { v[0].transpose(first, -1)? } else { v[0].clone() };
            x.reshape(&new_dims)
        })?;
    }

    #[test]
    fn reshape_flatten_and_infer(a in arr(dims(), normal()), seed: u64) {
        let n = a.data.len();
        check(seed, &[a], |v| v[0].reshape(&[usize::MAX])?.reshape(&[1, n, 1]))?;
    }

    #[test]
    fn transpose((a, (x, y)) in with_rank(arr(dims(), normal()), |r| (axis(r), axis(r))), seed: u64) {
        check(seed, &[a], |v| v[0].transpose(x, y))?;
    }

    #[test]
    fn permute(
        (a, perm) in with_rank(arr(dims(), normal()), |r| Just((0..r).collect::<Vec<_>>()).prop_shuffle()),
        seed: u64,
    ) {
        // The square makes the gradient depend on where each value went.
        check(seed, &[a], |v| v[0].permute(&perm)?.square())?;
    }

    #[test]
    fn narrow(
        (a, (ax, s, l, neg)) in with_rank(arr(dims(), normal()), |r| (0..r, 0usize..5, 1usize..=5, any::<bool>())),
        seed: u64,
    ) {
        let (size, r) = (a.dims[ax], a.dims.len() as isize);
        let start = s % size;
        let len = 1 + (l - 1) % (size - start);
        let axis = if neg { ax as isize - r } else { ax as isize };
        check(seed, &[a], |v| v[0].narrow(axis, start, len))?;
    }

    #[test]
    fn broadcast_to((a, target) in dims().prop_flat_map(|out| (arr(broadcast_from(out.clone()), normal()), Just(out))), seed: u64) {
        check(seed, &[a], |v| v[0].broadcast_to(&target))?;
    }

    #[test]
    fn concat(
        (parts, ax) in (dims(), vec(1usize..=3, 1..=3)).prop_flat_map(|(base, sizes)| {
            let r = base.len();
            (0..r).prop_flat_map(move |ax| {
                let parts: Vec<_> = sizes
                    .iter()
                    .map(|&s| {
                        let mut d = base.clone();
                        d[ax] = s;
                        arr(Just(d), normal())
                    })
                    .collect();
                (parts, Just(ax))
            })
        }),
        neg: bool,
        seed: u64,
    ) {
        let axis = if neg { ax as isize - parts[0].dims.len() as isize } else { ax as isize };
        check(seed, &parts, |v| Var::concat(&v.iter().collect::<Vec<_>>(), axis))?;
    }

    #[test]
    fn add_n(
        parts in dims().prop_flat_map(|out| vec(arr(broadcast_from(out), normal()), 1..=4)),
        twice: bool,
        seed: u64,
    ) {
        // Any number of inputs, broadcasting; with `twice`, the first input also comes
        // last (its gradient accumulates).
        check(seed, &parts, |v| {
            let mut refs: Vec<&Var<'_>> = v.iter().collect();
            if twice {
                refs.push(&v[0]);
            }
            Var::add_n(&refs)
        })?;
    }

    #[test]
    fn channel_moments(a in arr(dims(), normal()), seed: u64) {
        check(seed, &[a], |v| v[0].channel_moments())?;
    }

    #[test]
    fn channel_affine(
        (x, scale, shift) in dims().prop_flat_map(|d| {
            let c = vec![d[d.len() - 1]];
            (arr(Just(d), normal()), arr(Just(c.clone()), normal()), arr(Just(c), normal()))
        }),
        seed: u64,
    ) {
        check(seed, &[x, scale, shift], |v| v[0].channel_affine(&v[1], &v[2]))?;
    }

    #[test]
    fn channel_affine_of_a_variable_with_itself(
        (x, shift) in (1usize..=5).prop_flat_map(|c| (arr(Just(vec![c]), normal()), arr(Just(vec![c]), normal()))),
        seed: u64,
    ) {
        // One vector as both input and scale: its gradient accumulates from two parts.
        check(seed, &[x, shift], |v| v[0].channel_affine(&v[0], &v[1]))?;
    }

    #[test]
    fn gather((a, ax, index) in gather_operands(), seed: u64) {
        check(seed, &[a], |v| v[0].gather(ax as isize, &index))?;
    }

    #[test]
    fn linear_map(a in arr(vec(1usize..=4, 2..=3), normal()), m in 1usize..=4, seed: u64) {
        // `x ↦ x · M` over the last axis, with its adjoint `g ↦ g · Mᵀ`.
        let k = *a.dims.last().unwrap();
        let map = Arc::new(RightMatmul::new(k, m, seed, true));
        check(seed, &[a], |v| v[0].linear_map(map.clone()))?;
    }

    #[test]
    fn mask_mul((a, mask) in pair(normal(), Vals::Uniform(0.0, 2.0)), seed: u64) {
        let mask = mask.tensor();
        check(seed, &[a], |v| v[0].mask_mul(&mask))?;
    }

    #[test]
    fn im2col((x, win) in window_operands(Vals::Uniform(-2.0, 2.0)), seed: u64) {
        check(seed, &[x], |v| v[0].im2col(&win))?;
    }

    #[test]
    fn conv_with_bias(
        (x, win) in window_operands(Vals::Uniform(-2.0, 2.0)),
        filters in 1usize..=3,
        seed: u64,
    ) {
        // A Conv1D/2D/3D layer as the layers build it: the convolution op plus a bias,
        // with each of the tensor crate's algorithms (shifted falls back to patches where
        // stride or dilation is not 1).
        let c = x.dims[x.dims.len() - 1];
        let rows = win.taps() * c;
        let mut kernel_dims = win.kernel().to_vec();
        kernel_dims.extend([c, filters]);
        let kernel = Arr { dims: kernel_dims, data: weights(seed ^ 1, rows * filters) };
        let bias = Arr { dims: vec![filters], data: weights(seed ^ 2, filters) };
        for algorithm in [ConvAlgorithm::Im2col, ConvAlgorithm::Shifted] {
            set_conv_algorithm(algorithm);
            let checked = check(seed, &[x.clone(), kernel.clone(), bias.clone()], |v| {
                v[0].conv(&v[1], &win)?.add(&v[2])
            });
            set_conv_algorithm(ConvAlgorithm::Auto);
            checked?;
        }
    }

    #[test]
    fn upsampling(x in arr(vec(1usize..=3, 4..=4), normal()), sh in 1usize..=3, sw in 1usize..=3, seed: u64) {
        // UpSampling2D: a rank-6 broadcast view reshaped; each block's gradient summed back.
        let (n, h, w, c) = (x.dims[0], x.dims[1], x.dims[2], x.dims[3]);
        check(seed, &[x], |v| {
            v[0].reshape(&[n, h, 1, w, 1, c])?
                .broadcast_to(&[n, h, sh, w, sw, c])?
                .reshape(&[n, h * sh, w * sw, c])
        })?;
    }

    #[test]
    fn max_pool((x, win) in window_operands(Vals::Distinct), seed: u64) {
        // Max pooling two ways: the largest of the patches (valid windows: no padded zero
        // can win), and the pooling op with its winners' indices (any window).
        let (n, c) = (x.dims[0], x.dims[x.dims.len() - 1]);
        check(seed, std::slice::from_ref(&x), |v| v[0].max_pool(&win))?;
        let rank = win.rank();
        let win = Window::new(win.input(), win.kernel(), win.stride(), &vec![1; rank], Padding::Valid);
        prop_assume!(win.is_ok());
        let win = win.unwrap();
        let mut taps = vec![n];
        taps.extend(win.output());
        taps.extend([win.taps(), c]);
        check(seed, &[x], |v| {
            v[0].im2col(&win)?
                .reshape(&taps)?
                .max(&[rank as isize + 1], false)
        })?;
    }
}

/// An `[n, d1, .., dk, c]` input (1 to 3 spatial dimensions) and a window over it: kernel
/// 1 to 3, stride and dilation 1 or 2, `same` or `valid` padding (redrawn where a `valid`
/// window does not fit).
fn window_operands(vals: Vals) -> impl Strategy<Value = (Arr, Window)> {
    (1usize..=3)
        .prop_flat_map(|rank| {
            // Fewer, smaller sizes in 3D keep the finite differences quick.
            let most = if rank == 3 { 4 } else { 6 };
            (
                1usize..=2,
                vec(2usize..=most, rank),
                1usize..=3,
                vec((1usize..=3, 1usize..=2, 1usize..=2), rank),
                any::<bool>(),
            )
        })
        .prop_filter_map("the window fits", |(n, spatial, c, ksd, same)| {
            let padding = if same { Padding::Same } else { Padding::Valid };
            let k: Vec<usize> = ksd.iter().map(|t| t.0).collect();
            let s: Vec<usize> = ksd.iter().map(|t| t.1).collect();
            let d: Vec<usize> = ksd.iter().map(|t| t.2).collect();
            let win = Window::new(&spatial, &k, &s, &d, padding).ok()?;
            let mut dims = vec![n];
            dims.extend(spatial);
            dims.push(c);
            Some((dims, win))
        })
        .prop_flat_map(move |(dims, win)| (arr(Just(dims), vals), Just(win)))
}

// ---------------------------------------------------------------------------------------
// Whole graphs: an MLP, the gradient-ready hook's order, and accumulation.

/// Layer widths of a 3-layer MLP and a batch of inputs for it.
fn mlp_operands() -> impl Strategy<Value = (Arr, Vec<Arr>)> {
    (1usize..=4, vec(1usize..=5, 4)).prop_flat_map(|(batch, widths)| {
        let x = arr(Just(vec![batch, widths[0]]), normal());
        let params: Vec<_> = (0..3)
            .flat_map(|l| {
                [
                    arr(Just(vec![widths[l], widths[l + 1]]), normal()),
                    arr(Just(vec![widths[l + 1]]), normal()),
                ]
            })
            .collect();
        (x, params)
    })
}

/// `x -> tanh(x W1 + b1) -> sigmoid(. W2 + b2) -> log_softmax(. W3 + b3)`.
fn mlp<'t>(x: &Var<'t>, p: &[Var<'t>]) -> VarResult<'t> {
    let h = x.matmul(&p[0])?.add(&p[1])?.tanh()?;
    let h = h.matmul(&p[2])?.add(&p[3])?.sigmoid()?;
    h.matmul(&p[4])?.add(&p[5])?.log_softmax(-1)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mlp_gradients((x, params) in mlp_operands(), seed: u64) {
        let x = x.tensor();
        check(seed, &params, |p| mlp(&p[0].tape().constant(x.clone()), p))?;
    }

    #[test]
    fn the_hook_reports_mlp_parameters_once_in_reverse_order_of_first_use(
        (x, params) in mlp_operands(),
    ) {
        let tape = Tape::new();
        let x = tape.constant(x.tensor());
        let p: Vec<Var<'_>> = params.iter().enumerate().map(|(k, a)| tape.param(a.tensor(), k)).collect();
        let loss = mlp(&x, &p).unwrap().sum(&[], false).unwrap();
        let mut order = vec![];
        let grads = tape
            .backward_with(&loss, |k, g| {
                order.push((k, g.to_vec::<f64>().unwrap()));
                Ok(())
            })
            .unwrap();
        let keys: Vec<usize> = order.iter().map(|(k, _)| *k).collect();
        // First uses in the forward pass: W1, b1, W2, b2, W3, b3.
        prop_assert_eq!(keys, vec![5, 4, 3, 2, 1, 0]);
        for (k, g) in &order {
            prop_assert_eq!(&grads.get(*k).unwrap().to_vec::<f64>().unwrap(), g);
        }
    }

    #[test]
    fn a_parameter_used_in_several_places_accumulates(
        (w, x) in (1usize..=4).prop_flat_map(|n| (arr(Just(vec![n, n]), normal()), arr(Just(vec![n, n]), normal()))),
        seed: u64,
    ) {
        // `w` feeds a matmul (as either operand), an add, a product with itself, a
        // transposed view, a concat and a mask: six contributions to one gradient.
        let (x, mask) = (x.tensor(), Tensor::full(&[1, w.dims[1]], 0.5, DType::F64, Device::Cpu).unwrap());
        check(seed, &[w], |v| {
            let w = &v[0];
            let x = w.tape().constant(x.clone());
            let h = x.matmul(w)?.add(w)?.tanh()?;
            let sq = w.mul(&w.transpose(0, 1)?)?;
            let c = Var::concat(&[&h, &sq, &w.mask_mul(&mask)?], 0)?;
            c.matmul(w)
        })?;
    }

    #[test]
    fn a_parameter_whose_first_use_is_off_the_loss_path_still_gets_its_gradient(
        (a, b) in (arr(dims(), normal()), arr(dims(), normal())),
        seed: u64,
    ) {
        check(seed, &[a, b], |v| {
            // First uses of both parameters feed nothing the loss depends on.
            let _unused = v[0].exp()?.add(&v[1].sum(&[], false)?)?;
            v[0].square()?.sum(&[], true)?.mul(&v[1].tanh()?)
        })?;
    }
}

/// `x ↦ x · M` for a fixed `[k, m]` matrix `M` over the last axis: a linear map whose
/// adjoint is `g ↦ g · Mᵀ` (or, when `correct_adjoint` is false, the wrong `g ↦ g · M`,
/// which the gradient check must reject).
#[derive(Debug)]
struct RightMatmul {
    m: Tensor,
    correct_adjoint: bool,
}

impl RightMatmul {
    fn new(k: usize, m: usize, seed: u64, correct_adjoint: bool) -> RightMatmul {
        let m = Tensor::from_slice(&weights(seed ^ 0x5eed, k * m), &[k, m], Device::Cpu).unwrap();
        RightMatmul { m, correct_adjoint }
    }
}

impl LinearMap for RightMatmul {
    fn apply(&self, x: &Tensor) -> Result<Tensor, String> {
        x.matmul(&self.m).map_err(|e| e.to_string())
    }

    fn adjoint(&self, g: &Tensor) -> Result<Tensor, String> {
        let m = if self.correct_adjoint {
            self.m.t().map_err(|e| e.to_string())?
        } else {
            self.m.clone()
        };
        g.matmul(&m).map_err(|e| e.to_string())
    }
}

/// The check can fail: a linear map whose "adjoint" is the map itself (wrong for a
/// non-symmetric square matrix) is caught.
#[test]
fn a_wrong_adjoint_is_rejected() {
    let a = Arr {
        dims: vec![2, 3],
        data: weights(1, 6),
    };
    let map = Arc::new(RightMatmul::new(3, 3, 9, false));
    assert!(check(9, std::slice::from_ref(&a), |v| v[0]
        .linear_map(map.clone()))
    .is_err());
    let right = Arc::new(RightMatmul::new(3, 3, 9, true));
    check(9, &[a], |v| v[0].linear_map(right.clone())).unwrap();
}
