//! The tensor kernels against naive references: plain `Vec<f64>` loops over row-major
//! index tuples, written here without any of the crate's strides, blocking or dispatch.
//!
//! Inputs are drawn as strided views as often as not: a random permutation of a buffer
//! laid out in another order, and/or a narrow window of a larger buffer whose padding holds
//! a sentinel (777) that any stray read would show. Input values are rounded to the dtype
//! under test first, so the reference sees exactly what the kernel sees.
//!
//! Tolerances, with `u` the unit roundoff of the dtype (2^-53 f64, 2^-24 f32, 2^-11 f16,
//! 2^-8 bf16):
//! * exactly rounded operations (+ - * / sqrt, max/min, comparisons, negation, |x|, x²,
//!   1/x, sign, ReLU) and pure data movement (views, copies, concat, narrow, gather,
//!   index_select, one_hot, max, argmax) must be bit-exact: the f64 reference rounded to
//!   the dtype. (Rounding an f64 result of f32 operands to f32 gives the correctly rounded
//!   f32 result for these operations, as 53 >= 2·24 + 2.)
//! * transcendental functions and compound expressions: a few `u` relative to the result,
//!   or to the terms that cancel in it, derived per op below.
//! * dot products and sums of `n` terms: `2·n·u·Σ|terms|`, twice the classical worst-case
//!   bound γ_n·Σ|terms| (Higham, Accuracy and Stability, 3.1), which holds for every
//!   summation order and so for gemm's blocking; the factor 2 covers the f64 reference's own
//!   error when the kernel is f64.
//! * softmax: `2·(n + 4)·u` (n exponentials summed, a division, rounding).
//! * f16 and bf16: their kernels compute in f32 and round once, so on the same
//!   (half-representable) inputs a half result must equal the f32 result rounded to half,
//!   bit for bit; mean rounds twice (≤ 2 half ulps); f16 matmul runs gemm's own f16 kernel
//!   (f32 accumulation in another order) except for matrix-vector shapes, so it gets one
//!   half rounding `2·u_h·|c|` plus the f32 dot-product bound. From f32 inputs that are not
//!   half-representable, the half result is also within the propagated input rounding plus
//!   one output rounding; `to_dtype` from f32 rounds to nearest even, bit for bit.

use half::{bf16, f16};
use mirra_tensor::{BinaryOp, DType, Device, Tensor, UnaryOp};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};

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
/// Written into the padding around narrowed views: a read outside the view shows up.
const SENTINEL: f64 = 777.0;

// ---------------------------------------------------------------------------------------
// The reference: row-major arrays of f64 and index tuples.

#[derive(Clone, Debug, PartialEq)]
struct Nd {
    dims: Vec<usize>,
    data: Vec<f64>,
}

fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Every index tuple of `dims`, in row-major order.
fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = dims.iter().product();
    let st = strides(dims);
    (0..n)
        .map(|f| (0..dims.len()).map(|d| f / st[d] % dims[d]).collect())
        .collect()
}

/// The index into an array of `dims` that NumPy broadcasting reads for output index `out`.
fn broadcast_index(out: &[usize], dims: &[usize]) -> Vec<usize> {
    let shift = out.len() - dims.len();
    (0..dims.len())
        .map(|d| if dims[d] == 1 { 0 } else { out[d + shift] })
        .collect()
}

/// NumPy's broadcast shape.
fn broadcast_dims(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            da.max(db)
        })
        .collect()
}

impl Nd {
    fn from_fn(dims: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Nd {
        Nd {
            dims: dims.to_vec(),
            data: indices(dims).iter().map(|i| f(i)).collect(),
        }
    }

    fn at(&self, idx: &[usize]) -> f64 {
        let st = strides(&self.dims);
        self.data[idx.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>()]
    }

    /// A contiguous tensor of `dtype` (values should be representable in it).
    fn tensor(&self, dtype: DType) -> Tensor {
        Tensor::from_slice(&self.data, &self.dims, Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }

    /// A tensor's values, read in row-major order whatever its layout.
    fn of(t: &Tensor) -> Nd {
        Nd {
            dims: t.dims().to_vec(),
            data: t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
        }
    }

    fn map(&self, f: impl Fn(f64) -> f64) -> Nd {
        Nd {
            dims: self.dims.clone(),
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }

    fn rounded(&self, dtype: DType) -> Nd {
        self.map(|x| round_to(x, dtype))
    }
}

/// `x` rounded to nearest in `dtype`; exact for f32 values. (For half types it goes
/// through f32: `half`'s f64 conversions drop the low 32 bits before rounding, which can
/// turn a value just above a tie into a tie.)
fn round_to(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f32(x as f32).to_f64(),
        DType::BF16 => bf16::from_f32(x as f32).to_f64(),
        other => panic!("not a float dtype: {other}"),
    }
}

/// Unit roundoff.
fn unit(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON / 2.0,
        DType::F32 => f32::EPSILON as f64 / 2.0,
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        other => panic!("not a float dtype: {other}"),
    }
}

/// Checks `got` against `want` element by element: NaN must meet NaN, infinities must be
/// equal, anything else within `tol(flat index)`.
fn compare(
    what: &str,
    got: &Tensor,
    want: &Nd,
    tol: impl Fn(usize) -> f64,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.dims(), &want.dims[..], "{}: shape", what);
    let g = Nd::of(got);
    for (i, (&a, &b)) in g.data.iter().zip(&want.data).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= tol(i)
        };
        prop_assert!(
            ok,
            "{} ({}): element {} of {:?}: got {} want {} (tolerance {:e})",
            what,
            got.dtype(),
            i,
            want.dims,
            a,
            b,
            tol(i)
        );
    }
    Ok(())
}

fn exact(what: &str, got: &Tensor, want: &Nd) -> Result<(), TestCaseError> {
    compare(what, got, &want.rounded(got.dtype()), |_| 0.0)
}

// ---------------------------------------------------------------------------------------
// Strided views.

/// How an input tensor is laid out: a permutation of a buffer stored in another order,
/// and optionally a window (`axis` of the stored buffer, padding before and after).
#[derive(Clone, Debug)]
struct View {
    perm: Vec<usize>,
    pad: Option<(usize, usize, usize)>,
}

fn view(rank: usize) -> BoxedStrategy<View> {
    if rank == 0 {
        return Just(View {
            perm: vec![],
            pad: None,
        })
        .boxed();
    }
    (
        Just((0..rank).collect::<Vec<_>>()).prop_shuffle(),
        any::<bool>(),
        proptest::option::of((0..rank, 0usize..=2, 0usize..=2)),
    )
        .prop_map(move |(perm, permuted, pad)| View {
            perm: if permuted { perm } else { (0..rank).collect() },
            pad,
        })
        .boxed()
}

/// A tensor of `dtype` whose logical values are `x`, laid out as `v` says.
fn make(x: &Nd, v: &View, dtype: DType) -> Tensor {
    let r = x.dims.len();
    // The stored buffer `s` satisfies s.permute(perm) == x.
    let mut sdims = vec![0; r];
    for i in 0..r {
        sdims[v.perm[i]] = x.dims[i];
    }
    let s = Nd::from_fn(&sdims, |j| {
        let idx: Vec<usize> = (0..r).map(|i| j[v.perm[i]]).collect();
        x.at(&idx)
    });
    let t = match v.pad {
        None => s.tensor(dtype),
        Some((ax, before, after)) => {
            let mut pdims = sdims.clone();
            pdims[ax] += before + after;
            let padded = Nd::from_fn(&pdims, |j| {
                if j[ax] < before || j[ax] >= before + sdims[ax] {
                    SENTINEL
                } else {
                    let mut k = j.to_vec();
                    k[ax] -= before;
                    s.at(&k)
                }
            });
            padded
                .tensor(dtype)
                .narrow(ax as isize, before, sdims[ax])
                .unwrap()
        }
    };
    t.permute(&v.perm).unwrap()
}

// ---------------------------------------------------------------------------------------
// Strategies.

const F32_F64: [DType; 2] = [DType::F32, DType::F64];
const HALVES: [DType; 2] = [DType::F16, DType::BF16];

fn dtype_of(choices: &'static [DType]) -> impl Strategy<Value = DType> {
    prop::sample::select(choices)
}

/// Dimensions of rank 1 to 4, each 1 to 5.
fn dims() -> impl Strategy<Value = Vec<usize>> {
    vec(1usize..=5, 1..=4)
}

/// Values: continuous on [-3, 3], or (a third of the time) multiples of 0.5 in [-2, 2], so
/// that ties, equal pairs and zeros occur.
fn values(n: usize) -> impl Strategy<Value = Vec<f64>> {
    prop_oneof![
        2 => vec(-3.0..3.0f64, n),
        1 => vec((-4i32..=4).prop_map(|k| k as f64 * 0.5), n),
    ]
}

fn nd(dims: impl Strategy<Value = Vec<usize>>) -> impl Strategy<Value = Nd> {
    dims.prop_flat_map(|dims| {
        let n = dims.iter().product();
        values(n).prop_map(move |data| Nd {
            dims: dims.clone(),
            data,
        })
    })
}

/// An array and a layout for it.
fn viewed(dims: impl Strategy<Value = Vec<usize>>) -> impl Strategy<Value = (Nd, View)> {
    nd(dims).prop_flat_map(|x| {
        let r = x.dims.len();
        (Just(x), view(r))
    })
}

/// A shape that broadcasts to `out`: leading dimensions dropped (possibly all), some of the
/// rest set to 1.
fn broadcast_from(out: Vec<usize>) -> impl Strategy<Value = Vec<usize>> {
    let r = out.len();
    (0..=r, vec(any::<bool>(), r)).prop_map(move |(drop, ones)| {
        (drop..r)
            .map(|d| if ones[d] { 1 } else { out[d] })
            .collect()
    })
}

/// Axes to reduce (a mask; all false means all axes, the API's empty list).
fn axis_mask(r: usize) -> impl Strategy<Value = Vec<bool>> {
    vec(any::<bool>(), r)
}

/// The API's axis list for a mask, with each axis written positive or negative by `neg`.
fn axis_list(mask: &[bool], neg: bool) -> Vec<isize> {
    let r = mask.len() as isize;
    (0..r)
        .filter(|&d| mask[d as usize])
        .map(|d| if neg { d - r } else { d })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Reference operations.

const BINARY: [BinaryOp; 11] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
    BinaryOp::EqMask,
    BinaryOp::ReluBackward,
    BinaryOp::SigmoidBackward,
    BinaryOp::TanhBackward,
    BinaryOp::GeluBackward,
];

fn normal_cdf(x: f64) -> f64 {
    0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn normal_pdf(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// The f64 value of a binary op, and its tolerance for unit roundoff `u` (0: exact).
fn binary_ref(op: BinaryOp, a: f64, b: f64, u: f64) -> (f64, f64) {
    match op {
        BinaryOp::Add => (a + b, 0.0),
        BinaryOp::Sub => (a - b, 0.0),
        BinaryOp::Mul => (a * b, 0.0),
        BinaryOp::Div => (a / b, 0.0),
        BinaryOp::Maximum => (a.max(b), 0.0),
        BinaryOp::Minimum => (a.min(b), 0.0),
        BinaryOp::EqMask => (if a == b { 1.0 } else { 0.0 }, 0.0),
        BinaryOp::ReluBackward => (if b > 0.0 { a } else { 0.0 }, 0.0),
        // Three roundings of a product: relative error 3u (and as much in an f64 reference).
        BinaryOp::SigmoidBackward => {
            let r = a * b * (1.0 - b);
            (r, 8.0 * u * r.abs())
        }
        // `1 - y²` cancels: its error is relative to y² and 1, not to the result.
        BinaryOp::TanhBackward => (a * (1.0 - b * b), 8.0 * u * a.abs() * (1.0 + 2.0 * b * b)),
        // Φ(x) + x φ(x) <= 1.13, each term with a few roundings.
        BinaryOp::GeluBackward => (
            a * (normal_cdf(b) + b * normal_pdf(b)),
            16.0 * u * a.abs() * (1.0 + b.abs()),
        ),
    }
}

/// An element-wise map of one tensor: a [`UnaryOp`] or one of the scalar maps.
#[derive(Clone, Copy, Debug)]
enum Map {
    Op(UnaryOp),
    Affine(f64, f64),
    Powf(f64),
}

const UNARY: [UnaryOp; 12] = [
    UnaryOp::Relu,
    UnaryOp::Sigmoid,
    UnaryOp::Tanh,
    UnaryOp::Gelu,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Square,
    UnaryOp::Recip,
    UnaryOp::Sign,
];

fn map_strategy() -> impl Strategy<Value = Map> {
    prop_oneof![
        4 => prop::sample::select(&UNARY[..]).prop_map(Map::Op),
        1 => (-3.0..3.0f64, -3.0..3.0f64).prop_map(|(m, a)| Map::Affine(m, a)),
        1 => (-2.5..3.0f64).prop_map(Map::Powf),
    ]
}

impl Map {
    /// Moves a drawn value into the map's domain (positive for log, sqrt and powf).
    fn domain(self, x: f64) -> f64 {
        match self {
            Map::Op(UnaryOp::Log | UnaryOp::Sqrt) | Map::Powf(_) => x.abs() + 0.05,
            _ => x,
        }
    }

    fn apply(self, t: &Tensor) -> Tensor {
        match self {
            Map::Op(op) => t.unary(op),
            Map::Affine(m, a) => t.affine(m, a),
            Map::Powf(e) => t.powf(e),
        }
        .unwrap()
    }

    /// The f64 value and its tolerance for unit roundoff `u` (0: exact).
    fn reference(self, x: f64, u: f64) -> (f64, f64) {
        match self {
            Map::Op(op) => match op {
                UnaryOp::Relu => (x.max(0.0), 0.0),
                // A library exp (<= 1 ulp) and a division: a few u relative.
                UnaryOp::Sigmoid => {
                    let r = 1.0 / (1.0 + (-x).exp());
                    (r, 8.0 * u * r)
                }
                UnaryOp::Tanh => (x.tanh(), 8.0 * u * x.tanh().abs()),
                // 0.5 x (1 + erf): the sum cancels for negative x, error relative to x.
                UnaryOp::Gelu => {
                    let r = x * normal_cdf(x);
                    (r, 8.0 * u * (r.abs() + x.abs()))
                }
                UnaryOp::Exp => (x.exp(), 4.0 * u * x.exp()),
                UnaryOp::Log => (x.ln(), 4.0 * u * x.ln().abs()),
                UnaryOp::Sqrt => (x.sqrt(), 0.0),
                UnaryOp::Neg => (-x, 0.0),
                UnaryOp::Abs => (x.abs(), 0.0),
                UnaryOp::Square => (x * x, 0.0),
                UnaryOp::Recip => (1.0 / x, 0.0),
                UnaryOp::Sign => (x.signum() * (x != 0.0) as u8 as f64, 0.0),
            },
            // Two roundings (and the scalars' own rounding to the dtype).
            Map::Affine(m, a) => {
                let r = x * m + a;
                (r, 4.0 * u * ((x * m).abs() + a.abs() + r.abs()))
            }
            // A library pow; the exponent is rounded to the dtype, e^(ln x · δe) ~ |ln x| u.
            Map::Powf(e) => {
                let r = x.powf(e);
                (r, 8.0 * u * r * (1.0 + e.abs() * x.ln().abs()))
            }
        }
    }
}

/// `[.., m, k] x [.., k, n]` with batch dimensions broadcast, and for each output the
/// bound `Σ_p |a_ip| |b_pj|`.
fn matmul_ref(a: &Nd, b: &Nd) -> (Nd, Nd) {
    let (ra, rb) = (a.dims.len(), b.dims.len());
    let (m, k, n) = (a.dims[ra - 2], a.dims[ra - 1], b.dims[rb - 1]);
    let batch = broadcast_dims(&a.dims[..ra - 2], &b.dims[..rb - 2]);
    let mut out_dims = batch.clone();
    out_dims.extend([m, n]);
    let terms = |idx: &[usize]| {
        let (bi, i, j) = (&idx[..batch.len()], idx[batch.len()], idx[batch.len() + 1]);
        let mut ia = broadcast_index(bi, &a.dims[..ra - 2]);
        let mut ib = broadcast_index(bi, &b.dims[..rb - 2]);
        ia.extend([i, 0]);
        ib.extend([0, j]);
        (0..k)
            .map(|p| {
                ia[ra - 1] = p;
                ib[rb - 2] = p;
                a.at(&ia) * b.at(&ib)
            })
            .collect::<Vec<f64>>()
    };
    let c = Nd::from_fn(&out_dims, |idx| terms(idx).iter().sum());
    let bound = Nd::from_fn(&out_dims, |idx| terms(idx).iter().map(|t| t.abs()).sum());
    (c, bound)
}

/// A reduction over the masked axes (all when none is masked), keeping them as size 1.
fn reduce_ref(x: &Nd, mask: &[bool], init: f64, f: impl Fn(f64, f64) -> f64) -> Nd {
    let all = !mask.iter().any(|&m| m);
    let reduced = |d: usize| all || mask[d];
    let out_dims: Vec<usize> = (0..x.dims.len())
        .map(|d| if reduced(d) { 1 } else { x.dims[d] })
        .collect();
    let mut out = Nd::from_fn(&out_dims, |_| init);
    let st = strides(&out_dims);
    for idx in indices(&x.dims) {
        let o: usize = (0..idx.len())
            .map(|d| if reduced(d) { 0 } else { idx[d] * st[d] })
            .sum();
        out.data[o] = f(out.data[o], x.at(&idx));
    }
    out
}

/// Drops the size-1 dimensions that a reduction without keepdim removes.
fn squeeze_reduced(r: Nd, mask: &[bool]) -> Nd {
    let all = !mask.iter().any(|&m| m);
    Nd {
        dims: (0..r.dims.len())
            .filter(|&d| !(all || mask[d]))
            .map(|d| r.dims[d])
            .collect(),
        data: r.data,
    }
}

/// Softmax (or log-softmax) along `axis`, in f64.
fn softmax_ref(x: &Nd, axis: usize, log: bool) -> Nd {
    Nd::from_fn(&x.dims, |idx| {
        let mut j = idx.to_vec();
        let row: Vec<f64> = (0..x.dims[axis])
            .map(|p| {
                j[axis] = p;
                x.at(&j)
            })
            .collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        let v = x.at(idx);
        if log {
            v - max - sum.ln()
        } else {
            (v - max).exp() / sum
        }
    })
}

// ---------------------------------------------------------------------------------------
// Properties: each kernel in f32 and f64 against the reference.

proptest! {
    #![proptest_config(config())]

    #[test]
    fn binary_ops_broadcast_over_strided_views(
        ((a, va), (b, vb)) in dims().prop_flat_map(|out| {
            (viewed(broadcast_from(out.clone())), viewed(broadcast_from(out)))
        }),
        op in prop::sample::select(&BINARY[..]),
        dtype in dtype_of(&F32_F64),
    ) {
        let (a, b) = (a.rounded(dtype), b.rounded(dtype));
        let got = make(&a, &va, dtype).binary(op, &make(&b, &vb, dtype)).unwrap();
        let out = broadcast_dims(&a.dims, &b.dims);
        let u = unit(dtype);
        let refs: Vec<(f64, f64)> = indices(&out)
            .iter()
            .map(|i| binary_ref(op, a.at(&broadcast_index(i, &a.dims)), b.at(&broadcast_index(i, &b.dims)), u))
            .collect();
        let want = Nd { dims: out, data: refs.iter().map(|r| round_to(r.0, dtype)).collect() };
        compare(op.name(), &got, &want, |i| refs[i].1)?;
    }

    #[test]
    fn unary_maps_on_strided_views(
        (x, v) in viewed(dims()),
        map in map_strategy(),
        dtype in dtype_of(&F32_F64),
    ) {
        let x = x.map(|e| map.domain(e)).rounded(dtype);
        let got = map.apply(&make(&x, &v, dtype));
        let u = unit(dtype);
        let refs: Vec<(f64, f64)> = x.data.iter().map(|&e| map.reference(e, u)).collect();
        let want = Nd { dims: x.dims.clone(), data: refs.iter().map(|r| round_to(r.0, dtype)).collect() };
        compare(&format!("{map:?}"), &got, &want, |i| refs[i].1)?;
    }

    #[test]
    fn matmul_up_to_70_with_transposed_and_narrowed_operands(
        (m, k, n) in (1usize..=70, 1usize..=70, 1usize..=70),
        views in (view(2), view(2)),
        seed in any::<u64>(),
        dtype in dtype_of(&F32_F64),
    ) {
        let a = seeded(&[m, k], seed).rounded(dtype);
        let b = seeded(&[k, n], seed ^ 0xABCD).rounded(dtype);
        let got = make(&a, &views.0, dtype).matmul(&make(&b, &views.1, dtype)).unwrap();
        let (want, bound) = matmul_ref(&a, &b);
        let u = unit(dtype);
        compare("matmul", &got, &want, |i| 2.0 * k as f64 * u * bound.data[i])?;
    }

    #[test]
    fn matmul_batched_with_broadcast_batch_dims(
        ((a, va), (b, vb)) in (vec(1usize..=3, 1..=2), 1usize..=12, 1usize..=12, 1usize..=12)
            .prop_flat_map(|(batch, m, k, n)| {
                let with = move |b: Vec<usize>, r: usize, c: usize| {
                    let mut d = b;
                    d.extend([r, c]);
                    d
                };
                (
                    viewed(broadcast_from(batch.clone()).prop_map(move |b| with(b, m, k))),
                    viewed(broadcast_from(batch).prop_map(move |b| with(b, k, n))),
                )
            }),
        dtype in dtype_of(&F32_F64),
    ) {
        let (a, b) = (a.rounded(dtype), b.rounded(dtype));
        let got = make(&a, &va, dtype).matmul(&make(&b, &vb, dtype)).unwrap();
        let (want, bound) = matmul_ref(&a, &b);
        let k = a.dims[a.dims.len() - 1] as f64;
        let u = unit(dtype);
        compare("batched matmul", &got, &want, |i| 2.0 * k * u * bound.data[i])?;
    }

    #[test]
    fn sum_and_mean_over_random_axes(
        ((x, v), mask) in viewed(dims()).prop_flat_map(|(x, v)| {
            let r = x.dims.len();
            (Just((x, v)), axis_mask(r))
        }),
        keep: bool,
        neg: bool,
        dtype in dtype_of(&F32_F64),
    ) {
        let x = x.rounded(dtype);
        let t = make(&x, &v, dtype);
        let axes = axis_list(&mask, neg);
        let u = unit(dtype);
        let sum = reduce_ref(&x, &mask, 0.0, |a, b| a + b);
        let abs = reduce_ref(&x.map(f64::abs), &mask, 0.0, |a, b| a + b);
        let count = (x.data.len() / sum.data.len()) as f64;
        let (sum, abs) = if keep { (sum, abs) } else { (squeeze_reduced(sum, &mask), squeeze_reduced(abs, &mask)) };
        compare("sum", &t.sum(&axes, keep).unwrap(), &sum, |i| 2.0 * count * u * abs.data[i])?;
        let mean = sum.map(|s| s / count);
        compare("mean", &t.mean(&axes, keep).unwrap(), &mean, |i| {
            2.0 * u * abs.data[i] + 4.0 * u * mean.data[i].abs()
        })?;
    }

    #[test]
    fn max_and_argmax_are_exact(
        ((x, v), mask, ax) in viewed(dims()).prop_flat_map(|(x, v)| {
            let r = x.dims.len();
            (Just((x, v)), axis_mask(r), 0..r)
        }),
        keep: bool,
        neg: bool,
        dtype in dtype_of(&F32_F64),
    ) {
        let x = x.rounded(dtype);
        let t = make(&x, &v, dtype);
        let max = reduce_ref(&x, &mask, f64::NEG_INFINITY, f64::max);
        let max = if keep { max } else { squeeze_reduced(max, &mask) };
        exact("max", &t.max(&axis_list(&mask, neg), keep).unwrap(), &max)?;
        // Argmax: the first index of the largest value (values repeat a third of the time).
        let mut dims = x.dims.clone();
        dims[ax] = 1;
        let mut want = Nd::from_fn(&dims, |idx| {
            let row: Vec<f64> = (0..x.dims[ax])
                .map(|p| {
                    let mut j = idx.to_vec();
                    j[ax] = p;
                    x.at(&j)
                })
                .collect();
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            row.iter().position(|&e| e == max).unwrap() as f64
        });
        if !keep {
            want.dims.remove(ax);
        }
        let axis = if neg { ax as isize - x.dims.len() as isize } else { ax as isize };
        let got = t.argmax(axis, keep).unwrap();
        prop_assert_eq!(got.dtype(), DType::I64);
        exact("argmax", &got.to_dtype(DType::F64).unwrap(), &want)?;
    }

    #[test]
    fn sum_to_undoes_broadcasting(
        (g, target) in dims().prop_flat_map(|out| (nd(Just(out.clone())), broadcast_from(out))),
        dtype in dtype_of(&F32_F64),
    ) {
        let g = g.rounded(dtype);
        let got = g.tensor(dtype).sum_to(&target).unwrap();
        let mut want = Nd::from_fn(&target, |_| 0.0);
        let mut abs = want.clone();
        for idx in indices(&g.dims) {
            let o = broadcast_index(&idx, &target);
            let at = o.iter().zip(strides(&target)).map(|(i, s)| i * s).sum::<usize>();
            want.data[at] += g.at(&idx);
            abs.data[at] += g.at(&idx).abs();
        }
        let count = (g.data.len() / want.data.len().max(1)) as f64;
        let u = unit(dtype);
        compare("sum_to", &got, &want, |i| 2.0 * count * u * abs.data[i])?;
    }

    #[test]
    fn softmax_rows_sum_to_one_and_match_the_reference(
        ((x, v), ax) in viewed(dims()).prop_flat_map(|(x, v)| {
            let r = x.dims.len();
            (Just((x, v)), 0..r)
        }),
        offset in prop_oneof![Just(0.0), -100.0..100.0f64],
        neg: bool,
        dtype in dtype_of(&F32_F64),
    ) {
        // Logits far from 0 too: the max must be subtracted before exponentiating.
        let x = x.map(|e| e * 2.0 + offset).rounded(dtype);
        let t = make(&x, &v, dtype);
        let axis = if neg { ax as isize - x.dims.len() as isize } else { ax as isize };
        let n = x.dims[ax] as f64;
        let u = unit(dtype);
        let tol = 2.0 * (n + 4.0) * u;
        let p = t.softmax(axis).unwrap();
        compare("softmax", &p, &softmax_ref(&x, ax, false), |_| tol)?;
        let mut row_dims = x.dims.clone();
        row_dims.remove(ax);
        let ones = Nd::from_fn(&row_dims, |_| 1.0);
        compare("softmax row sums", &p.sum(&[axis], false).unwrap(), &ones, |_| 2.0 * tol)?;
        // log_softmax = x - max - ln(sum): its error is relative to |x - max| and |ln sum|.
        let want = softmax_ref(&x, ax, true);
        let magnitude = x.data.iter().fold(0.0f64, |m, e| m.max(e.abs()));
        compare("log_softmax", &t.log_softmax(axis).unwrap(), &want, |i| {
            tol * (1.0 + want.data[i].abs()) + 4.0 * u * magnitude
        })?;
    }

    #[test]
    fn concat_and_narrow_round_trip(
        ((x, v), ax, cuts) in viewed(dims()).prop_flat_map(|(x, v)| {
            let r = x.dims.len();
            (Just((x, v)), 0..r, vec(any::<prop::sample::Index>(), 0..3))
        }),
        dtype in dtype_of(&F32_F64),
    ) {
        let x = x.rounded(dtype);
        let t = make(&x, &v, dtype);
        let size = x.dims[ax];
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(size + 1)).collect();
        bounds.extend([0, size]);
        bounds.sort_unstable();
        let parts: Vec<Tensor> = bounds
            .windows(2)
            .map(|w| t.narrow(ax as isize, w[0], w[1] - w[0]).unwrap())
            .collect();
        for (p, w) in parts.iter().zip(bounds.windows(2)) {
            let want = Nd::from_fn(p.dims(), |idx| {
                let mut j = idx.to_vec();
                j[ax] += w[0];
                x.at(&j)
            });
            exact("narrow", p, &want)?;
        }
        let back = Tensor::concat(&parts.iter().collect::<Vec<_>>(), ax as isize).unwrap();
        exact("concat of the narrowed parts", &back, &x)?;
    }

    #[test]
    fn concat_of_strided_parts(
        (parts, ax) in (dims(), vec(0usize..=3, 1..=3)).prop_flat_map(|(base, sizes)| {
            let r = base.len();
            (0..r).prop_flat_map(move |ax| {
                let parts: Vec<_> = sizes
                    .iter()
                    .map(|&s| {
                        let mut d = base.clone();
                        d[ax] = s;
                        viewed(Just(d))
                    })
                    .collect();
                (parts, Just(ax))
            })
        }),
        dtype in dtype_of(&F32_F64),
    ) {
        let tensors: Vec<Tensor> = parts.iter().map(|(x, v)| make(&x.rounded(dtype), v, dtype)).collect();
        let got = Tensor::concat(&tensors.iter().collect::<Vec<_>>(), ax as isize).unwrap();
        let mut dims = parts[0].0.dims.clone();
        dims[ax] = parts.iter().map(|(x, _)| x.dims[ax]).sum();
        let want = Nd::from_fn(&dims, |idx| {
            let (mut j, mut p) = (idx.to_vec(), 0);
            while j[ax] >= parts[p].0.dims[ax] {
                j[ax] -= parts[p].0.dims[ax];
                p += 1;
            }
            parts[p].0.at(&j)
        });
        exact("concat", &got, &want)?;
    }

    #[test]
    fn gather_and_scatter_add(
        ((x, v), ax, m, seed) in viewed(dims()).prop_flat_map(|(x, v)| {
            let r = x.dims.len();
            (Just((x, v)), 0..r, 1usize..=6, any::<u64>())
        }),
        index_dtype in prop::sample::select(&[DType::I64, DType::I32, DType::U8][..]),
        dtype in dtype_of(&F32_F64),
    ) {
        let x = x.rounded(dtype);
        let t = make(&x, &v, dtype);
        let mut idx_dims = x.dims.clone();
        idx_dims[ax] = m;
        let size = x.dims[ax];
        let idx = seeded(&idx_dims, seed).map(|r| ((r + 1.0) * 1000.0) as usize as f64 % size as f64);
        let index = idx.tensor(DType::F64).to_dtype(index_dtype).unwrap();
        let at = |i: &[usize]| {
            let mut j = i.to_vec();
            j[ax] = idx.at(i) as usize;
            j
        };
        let gathered = t.gather(ax as isize, &index).unwrap();
        let want = Nd::from_fn(&idx_dims, |i| x.at(&at(i)));
        exact("gather", &gathered, &want)?;
        // Scatter the gathered values back: every index adds in, repeats accumulate.
        let got = want.tensor(dtype).scatter_add(ax as isize, &index, &x.dims).unwrap();
        let mut sum = Nd::from_fn(&x.dims, |_| 0.0);
        let mut abs = sum.clone();
        let st = strides(&x.dims);
        for i in indices(&idx_dims) {
            let o: usize = at(&i).iter().zip(&st).map(|(a, s)| a * s).sum();
            sum.data[o] += want.at(&i);
            abs.data[o] += want.at(&i).abs();
        }
        let u = unit(dtype);
        compare("scatter_add", &got, &sum, |i| 2.0 * m as f64 * u * abs.data[i])?;
    }

    #[test]
    fn index_select_and_one_hot(
        ((x, v), rows) in viewed(dims()).prop_flat_map(|(x, v)| {
            let n = x.dims[0];
            (Just((x, v)), vec(0..n, 0..6))
        }),
        depth in 1usize..=6,
        dtype in dtype_of(&F32_F64),
    ) {
        let x = x.rounded(dtype);
        let t = make(&x, &v, dtype);
        let mut dims = x.dims.clone();
        dims[0] = rows.len();
        let want = Nd::from_fn(&dims, |i| {
            let mut j = i.to_vec();
            j[0] = rows[i[0]];
            x.at(&j)
        });
        exact("index_select", &t.index_select(&rows).unwrap(), &want)?;
        let labels: Vec<i64> = rows.iter().map(|&r| (r % depth) as i64).collect();
        let ids = Tensor::from_slice(&labels, &[labels.len()], Device::Cpu).unwrap();
        let want = Nd::from_fn(&[labels.len(), depth], |i| (labels[i[0]] as usize == i[1]) as u8 as f64);
        exact("one_hot", &ids.one_hot(depth, dtype).unwrap(), &want)?;
    }

    #[test]
    fn views_and_their_copies_read_back_exactly(
        ((x, v), perm, ax) in viewed(dims()).prop_flat_map(|(x, v)| {
            let r = x.dims.len();
            (Just((x, v)), Just((0..r).collect::<Vec<_>>()).prop_shuffle(), 0..=r)
        }),
        dtype in dtype_of(&F32_F64),
    ) {
        let x = x.rounded(dtype);
        let t = make(&x, &v, dtype);
        exact("view", &t, &x)?;
        exact("copy", &t.copy().unwrap(), &x)?;
        prop_assert!(t.contiguous().unwrap().is_contiguous());
        // Permute: dimension i of the result is dimension perm[i].
        let p = t.permute(&perm).unwrap();
        let pdims: Vec<usize> = perm.iter().map(|&d| x.dims[d]).collect();
        let want = Nd::from_fn(&pdims, |i| {
            let mut j = vec![0; i.len()];
            for (k, &d) in perm.iter().enumerate() {
                j[d] = i[k];
            }
            x.at(&j)
        });
        exact("permute", &p, &want)?;
        // Reshape of a (possibly strided) permuted view: its row-major elements, regrouped.
        let flat = p.reshape(&[usize::MAX]).unwrap();
        exact("reshape", &flat, &Nd { dims: vec![want.data.len()], data: want.data.clone() })?;
        // Unsqueeze then broadcast the new dimension to 3, then squeeze a size-1 dimension.
        let u = t.unsqueeze(ax).unwrap();
        let mut bdims = x.dims.clone();
        bdims.insert(ax, 3);
        let b = u.broadcast_to(&bdims).unwrap();
        let want = Nd::from_fn(&bdims, |i| {
            let mut j = i.to_vec();
            j.remove(ax);
            x.at(&j)
        });
        exact("broadcast_to", &b, &want)?;
        exact("squeeze", &u.squeeze(ax as isize).unwrap(), &x)?;
    }
}

/// A size that is 1 or 2 a third of the time, else up to `max`.
fn small_or(max: usize) -> impl Strategy<Value = usize> {
    prop_oneof![1 => 1usize..=2, 2 => 1..=max]
}

/// Values in [-1, 1) from a seed, for operands too large to draw element by element.
fn seeded(dims: &[usize], seed: u64) -> Nd {
    let mut s = seed;
    Nd::from_fn(dims, |_| {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    })
}

// ---------------------------------------------------------------------------------------
// Half precision: f16 and bf16 against f32.

/// `f` applied to the same values, rounded to `dtype`, laid out the same way, once in
/// `dtype` and once in f32: the half result, and the f32 one as an f64 array.
fn in_both(dtype: DType, inputs: &[(&Nd, &View)], f: impl Fn(&[Tensor]) -> Tensor) -> (Tensor, Nd) {
    let make_all = |d: DType| -> Vec<Tensor> {
        inputs
            .iter()
            .map(|(x, v)| make(&x.rounded(dtype), v, d))
            .collect()
    };
    let (half, wide) = (make_all(dtype), make_all(DType::F32));
    let got = f(&half);
    assert_eq!(got.dtype(), dtype);
    (got, Nd::of(&f(&wide)))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn half_elementwise_ops_are_the_f32_ops_rounded_once(
        ((a, va), (b, vb)) in dims().prop_flat_map(|out| {
            (viewed(broadcast_from(out.clone())), viewed(broadcast_from(out)))
        }),
        op in prop::sample::select(&BINARY[..]),
        map in map_strategy(),
        dtype in dtype_of(&HALVES),
    ) {
        let (got, want) = in_both(dtype, &[(&a, &va), (&b, &vb)], |t| t[0].binary(op, &t[1]).unwrap());
        exact(op.name(), &got, &want)?;
        let x = a.map(|e| map.domain(e));
        let (got, want) = in_both(dtype, &[(&x, &va)], |t| map.apply(&t[0]));
        exact(&format!("{map:?}"), &got, &want)?;
    }

    #[test]
    fn half_reductions_and_softmax_are_the_f32_ones_rounded(
        ((x, v), mask, ax) in viewed(dims()).prop_flat_map(|(x, v)| {
            let r = x.dims.len();
            (Just((x, v)), axis_mask(r), 0..r)
        }),
        keep: bool,
        dtype in dtype_of(&HALVES),
    ) {
        let axes = axis_list(&mask, false);
        let t = [(&x, &v)];
        let (got, want) = in_both(dtype, &t, |t| t[0].sum(&axes, keep).unwrap());
        exact("sum", &got, &want)?;
        let (got, want) = in_both(dtype, &t, |t| t[0].max(&axes, keep).unwrap());
        exact("max", &got, &want)?;
        let (got, want) = in_both(dtype, &t, |t| t[0].softmax(ax as isize).unwrap());
        exact("softmax", &got, &want)?;
        let (got, want) = in_both(dtype, &t, |t| t[0].log_softmax(ax as isize).unwrap());
        exact("log_softmax", &got, &want)?;
        // Mean rounds the sum to half before scaling it: two roundings, two ulps.
        let (got, want) = in_both(dtype, &t, |t| t[0].mean(&axes, keep).unwrap());
        let u = unit(dtype);
        compare("mean", &got, &want, |i| 4.0 * u * want.data[i].abs() + 1e-7)?;
    }

    #[test]
    fn half_matmul_matches_f32(
        // Sizes of 1 and 2 often: gemm takes other paths for matrix-vector products.
        (m, k, n) in (small_or(40), small_or(40), small_or(40)),
        views in (view(2), view(2)),
        seed in any::<u64>(),
        dtype in dtype_of(&HALVES),
    ) {
        let (a, b) = (seeded(&[m, k], seed), seeded(&[k, n], !seed));
        let (got, want) = in_both(dtype, &[(&a, &views.0), (&b, &views.1)], |t| t[0].matmul(&t[1]).unwrap());
        // bf16 products converted to f32 multiply in f32 (the reference's order) and round
        // once: exact. On 16-bit units (AMX, AVX-512 BF16) the f32 sums associate pairs
        // inside the instruction, so they differ from the reference's by the accumulation
        // error, and each side rounds once: the f16 bound below.
        let native_bf16 = !mirra_tensor::bf16_matmul_path().starts_with("converted");
        if dtype == DType::BF16 && !native_bf16 {
            exact("bf16 matmul", &got, &want)?;
        } else {
            let (_, bound) = matmul_ref(&a.rounded(dtype), &b.rounded(dtype));
            let u = unit(dtype);
            compare("half matmul", &got, &want, |i| {
                2.0 * u * want.data[i].abs() + 4.0 * k as f64 * unit(DType::F32) * bound.data[i] + 1e-7
            })?;
        }
    }

    #[test]
    fn half_results_from_f32_inputs_are_within_half_rounding(
        ((a, b), seed) in (dims().prop_flat_map(|d| (nd(Just(d.clone())), nd(Just(d)))), any::<u64>()),
        dtype in dtype_of(&HALVES),
    ) {
        // Inputs not representable in half: each is rounded (relative error u), then the
        // result is (u again). For a + b that is u (|a| + |b| + |a + b|); for a * b, 3u |ab|;
        // for a sum of n terms, u Σ|x| + u |Σ x|; a conversion round trip, u |x|.
        let u = unit(dtype);
        let jitter = seeded(&a.dims, seed);
        let a = Nd { dims: a.dims.clone(), data: a.data.iter().zip(&jitter.data).map(|(x, j)| x + j * 1e-3).collect() }.rounded(DType::F32);
        let (ta, tb) = (a.tensor(DType::F32), b.tensor(DType::F32));
        let (ha, hb) = (ta.to_dtype(dtype).unwrap(), tb.to_dtype(dtype).unwrap());
        let tiny = 1e-7;
        compare("round trip", &ha, &a, |i| u * a.data[i].abs() + tiny)?;
        let sum = Nd::of(&ta.add(&tb).unwrap());
        compare("add", &ha.add(&hb).unwrap(), &sum, |i| {
            1.01 * u * (a.data[i].abs() + b.data[i].abs() + sum.data[i].abs()) + tiny
        })?;
        let prod = Nd::of(&ta.mul(&tb).unwrap());
        compare("mul", &ha.mul(&hb).unwrap(), &prod, |i| 3.01 * u * prod.data[i].abs() + tiny)?;
        let total: f64 = a.data.iter().sum();
        let abs: f64 = a.data.iter().map(|x| x.abs()).sum();
        let want = Nd { dims: vec![], data: vec![total] };
        let n = a.data.len() as f64;
        compare("sum", &ha.sum_all().unwrap(), &want, |_| {
            1.01 * u * (abs + total.abs()) + 2.0 * n * unit(DType::F32) * abs
        })?;
    }

    #[test]
    fn half_conversions_round_to_nearest_even(
        bits in vec(
            prop_oneof![
                any::<u32>(),
                // Just above a tie, with the excess only in the f32's last 3 bits: the case
                // that a conversion through f64 by `half` gets wrong.
                (any::<u16>(), 1u32..8).prop_map(|(hi, lo)| (hi as u32) << 16 | 0x8000 | lo),
                (any::<u32>(), 1u32..8).prop_map(|(x, lo)| (x & !0x1FFF) | 0x1000 | lo),
            ],
            1..64,
        ),
    ) {
        let xs: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).filter(|x| x.is_finite()).collect();
        let t = Tensor::from_slice(&xs, &[xs.len()], Device::Cpu).unwrap();
        // bf16: the 16 dropped bits round half to even, written out on the bits.
        let want: Vec<u16> = xs
            .iter()
            .map(|x| {
                let b = x.to_bits();
                ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
            })
            .collect();
        let got: Vec<u16> = t.to_dtype(DType::BF16).unwrap().to_vec::<bf16>().unwrap().iter().map(|h| h.to_bits()).collect();
        prop_assert_eq!(got, want, "bf16 of {:?}", xs);
        let want: Vec<u16> = xs.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        let got: Vec<u16> = t.to_dtype(DType::F16).unwrap().to_vec::<f16>().unwrap().iter().map(|h| h.to_bits()).collect();
        prop_assert_eq!(got, want, "f16 of {:?}", xs);
        // Half values widen exactly and come back unchanged.
        for dtype in HALVES {
            let h = t.to_dtype(dtype).unwrap();
            let back = h.to_dtype(DType::F32).unwrap().to_dtype(dtype).unwrap();
            prop_assert_eq!(Nd::of(&back).data, Nd::of(&h).data);
        }
    }
}
