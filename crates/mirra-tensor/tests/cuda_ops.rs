//! The tensor ops on a CUDA device against the same ops on the CPU, on the same random
//! inputs, for every float dtype, through contiguous tensors, strided views and
//! broadcasts. `#[ignore]`d without a GPU: the GPU bundle runs them.
//!
//! Bounds: ops that are one IEEE operation per element, or a fixed sequence of them (add,
//! div, sqrt, relu, affine, the backward maps, casts, copies), must agree bit for bit: the
//! kernels are compiled without FMA contraction and compute 16-bit floats in f32 as the
//! CPU does. Ops through a library function (exp, log, tanh, sigmoid, GELU) may differ by
//! a few units in the last place: at most 8 for f32 and f64 (CUDA's `expf` is within 2
//! ulp, Rust's within 1, and sigmoid and GELU compose them), 1 for f16 and bf16 (the f32
//! results round to the same 16-bit value or a neighbour).

use mirra_tensor::{BinaryOp, DType, Device, Padding, Tensor, UnaryOp, Window};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

fn gpu() -> Device {
    Device::cuda(0).expect("needs a CUDA device")
}

/// Values spread over about [-4, 4], every 17th exactly 0, from a fixed seed.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 17 == 0 {
                0.0
            } else {
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            }
        })
        .collect()
}

fn random(dims: &[usize], dtype: DType, seed: u64) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_slice(&values(n, seed), dims, Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// The machine epsilon of a dtype (the gap above 1).
fn epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F32 => f32::EPSILON as f64,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => unreachable!(),
    }
}

/// One unit in the last place of `v` in `dtype` (normal range).
fn ulp(dtype: DType, v: f64) -> f64 {
    let e = if v == 0.0 {
        -126.0
    } else {
        v.abs().log2().floor()
    };
    epsilon(dtype) * 2f64.powf(e)
}

/// The elements of `t`, wherever it is, as f64 on the host.
fn host_f64(t: &Tensor) -> Vec<f64> {
    let t = t.to_device(Device::Cpu).unwrap();
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// `got` (computed on the GPU) against `want` (on the CPU): equal shapes and dtypes, and
/// every element within `ulps` units in the last place (0: the same value; NaN matches
/// NaN only; equal infinities match).
fn assert_close(what: &str, got: &Tensor, want: &Tensor, ulps: f64) {
    assert_close_scaled(what, got, want, ulps, None);
}

/// [`assert_close`] with the unit in the last place taken at `max(|want|, |scale|)` per
/// element: for results that cancel (gelu's gradient is `g * (0.5 (1 + tanh u) + ...)`,
/// where `1 + tanh u` cancels for negative inputs), whose error is a few units of the terms
/// that cancelled, not of what is left.
fn assert_close_scaled(what: &str, got: &Tensor, want: &Tensor, ulps: f64, scale: Option<&Tensor>) {
    assert_eq!(got.device(), gpu(), "{what}: the result left the device");
    assert_eq!(
        (got.dims(), got.dtype()),
        (want.dims(), want.dtype()),
        "{what}"
    );
    let dtype = want.dtype();
    let (g, w) = (host_f64(got), host_f64(want));
    let s = match scale {
        Some(t) => host_f64(&t.broadcast_to(want.dims()).unwrap().contiguous().unwrap()),
        None => vec![0.0; w.len()],
    };
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if ulps == 0.0 || a == b {
            a == b
        } else {
            (a - b).abs() <= ulps * ulp(dtype, b.abs().max(s[i].abs()))
        };
        assert!(
            ok,
            "{what} ({dtype}) at {i}: GPU {a}, CPU {b} (bound {ulps} ulp)"
        );
    }
}

const EXACT: [UnaryOp; 7] = [
    UnaryOp::Relu,
    UnaryOp::Sqrt,
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Square,
    UnaryOp::Recip,
    UnaryOp::Sign,
];
const LIBRARY: [UnaryOp; 5] = [
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Gelu,
];

fn library_bound(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => 1.0,
        _ => 8.0,
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn unary_ops_match_the_cpu() {
    for dtype in FLOATS {
        let x = random(&[37, 129], dtype, 1);
        let xg = x.to_device(gpu()).unwrap();
        // A strided view too: the transpose reads through its strides.
        let (xt, xgt) = (x.transpose(0, 1).unwrap(), xg.transpose(0, 1).unwrap());
        for (ops, bound) in [(&EXACT[..], 0.0), (&LIBRARY[..], library_bound(dtype))] {
            for &op in ops {
                // GELU's 0.5 x (1 + tanh u) cancels for negative x: its error is in units
                // of x, not of what is left.
                let gelu = matches!(op, UnaryOp::Gelu);
                let what = op.name().to_string();
                let (got, want) = (xg.unary(op).unwrap(), x.unary(op).unwrap());
                assert_close_scaled(&what, &got, &want, bound, gelu.then_some(&x));
                let what = format!("{} of a transpose", op.name());
                let (got, want) = (xgt.unary(op).unwrap(), xt.unary(op).unwrap());
                assert_close_scaled(&what, &got, &want, bound, gelu.then_some(&xt));
            }
        }
        let want = x.affine(0.37, -1.25).unwrap();
        assert_close("affine", &xg.affine(0.37, -1.25).unwrap(), &want, 0.0);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn binary_ops_match_the_cpu_with_broadcasting() {
    let ops = [
        (BinaryOp::Add, false),
        (BinaryOp::Sub, false),
        (BinaryOp::Mul, false),
        (BinaryOp::Div, false),
        (BinaryOp::Maximum, false),
        (BinaryOp::Minimum, false),
        (BinaryOp::EqMask, false),
        (BinaryOp::ReluBackward, false),
        (BinaryOp::SigmoidBackward, false),
        (BinaryOp::TanhBackward, false),
        (BinaryOp::GeluBackward, true),
    ];
    // Same shapes; a bias over rows; a column against a matrix; both sides broadcast.
    let shapes: [(&[usize], &[usize]); 4] = [
        (&[64, 33], &[64, 33]),
        (&[64, 33], &[33]),
        (&[64, 1], &[64, 33]),
        (&[5, 1, 7], &[3, 1]),
    ];
    for dtype in FLOATS {
        for (i, (sa, sb)) in shapes.iter().enumerate() {
            let (a, b) = (
                random(sa, dtype, 2 + i as u64),
                random(sb, dtype, 9 + i as u64),
            );
            let (ag, bg) = (a.to_device(gpu()).unwrap(), b.to_device(gpu()).unwrap());
            for (op, library) in ops {
                let bound = if library { library_bound(dtype) } else { 0.0 };
                let what = format!("{} of {sa:?} and {sb:?}", op.name());
                let got = ag.binary(op, &bg).unwrap();
                // The gradients' error is relative to the incoming gradient `a`.
                let scale = library.then_some(&a);
                assert_close_scaled(&what, &got, &a.binary(op, &b).unwrap(), bound, scale);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn copies_and_casts_match_the_cpu() {
    for from in FLOATS {
        let x = random(&[17, 3, 11], from, 20);
        let xg = x.to_device(gpu()).unwrap();
        let view = |t: &Tensor| t.permute(&[2, 0, 1]).unwrap().narrow(0, 2, 7).unwrap();
        assert_close(
            "copy of a view",
            &view(&xg).copy().unwrap(),
            &view(&x).copy().unwrap(),
            0.0,
        );
        for to in FLOATS {
            let what = format!("{from} to {to}");
            assert_close(
                &what,
                &xg.to_dtype(to).unwrap(),
                &x.to_dtype(to).unwrap(),
                0.0,
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn host_views_of_device_memory_and_mixed_devices_are_refused() {
    let x = random(&[4, 4], DType::F32, 30);
    let xg = x.to_device(gpu()).unwrap();
    // A host view of device memory: an error naming the device, not a silent copy.
    let e = xg.as_slice::<f32>().unwrap_err().to_string();
    assert!(e.contains("cuda:0"), "{e}");
    let e = xg.add(&x).unwrap_err().to_string();
    assert!(e.contains("cpu") && e.contains("cuda:0"), "{e}");
}

/// `got` (GPU) against `want` (CPU) for results summed in another order: within one unit
/// in the last place of the result plus `n` additions' rounding of values up to 4 in the
/// accumulation type (f32 for 16-bit floats).
fn assert_summed(what: &str, got: &Tensor, want: &Tensor, n: usize) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let dtype = want.dtype();
    let acc_eps = if dtype == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let (g, w) = (host_f64(got), host_f64(want));
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let bound = ulp(dtype, b) + n as f64 * 4.0 * acc_eps;
        assert!(
            (a - b).abs() <= bound,
            "{what} ({dtype}) at {i}: GPU {a}, CPU {b}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn reductions_and_softmax_match_the_cpu() {
    for dtype in FLOATS {
        let x = random(&[5, 6, 129], dtype, 40);
        let xg = x.to_device(gpu()).unwrap();
        // Each case: the axes, and how many elements each output sums.
        let cases: [(&[isize], usize); 5] = [
            (&[2], 129),
            (&[0], 5),
            (&[1, 2], 6 * 129),
            (&[0, 2], 5 * 129),
            (&[], 5 * 6 * 129),
        ];
        for (axes, n) in cases {
            for keep in [false, true] {
                let what = format!("sum over {axes:?}, keepdim {keep}");
                let got = xg.sum(axes, keep).unwrap();
                assert_summed(&what, &got, &x.sum(axes, keep).unwrap(), n);
                let what = format!("mean over {axes:?}");
                assert_summed(
                    &what,
                    &xg.mean(axes, keep).unwrap(),
                    &x.mean(axes, keep).unwrap(),
                    n,
                );
            }
            // The maximum is one of the inputs: the same value.
            let what = format!("max over {axes:?}");
            assert_close(
                &what,
                &xg.max(axes, false).unwrap(),
                &x.max(axes, false).unwrap(),
                0.0,
            );
        }
        for axis in [-1, 1] {
            let bound = library_bound(dtype);
            let what = format!("softmax over {axis}");
            assert_close(
                &what,
                &xg.softmax(axis).unwrap(),
                &x.softmax(axis).unwrap(),
                bound,
            );
            let what = format!("log_softmax over {axis}");
            let (got, want) = (xg.log_softmax(axis).unwrap(), x.log_softmax(axis).unwrap());
            assert_summed(&what, &got, &want, 129);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn matrix_products_match_the_cpu_through_transposes_and_batches() {
    // (a, b, transpose a's last two dims first, transpose b's)
    let cases: [(&[usize], &[usize], bool, bool); 5] = [
        (&[64, 96], &[96, 33], false, false),
        (&[96, 64], &[96, 33], true, false),
        (&[64, 96], &[33, 96], false, true),
        (&[4, 64, 96], &[96, 33], false, false),
        (&[4, 64, 96], &[4, 33, 96], false, true),
    ];
    for dtype in FLOATS {
        for (i, (sa, sb, ta, tb)) in cases.into_iter().enumerate() {
            let (a, b) = (
                random(sa, dtype, 50 + i as u64),
                random(sb, dtype, 60 + i as u64),
            );
            let t = |x: Tensor, yes: bool| if yes { x.t().unwrap() } else { x };
            let (a, b) = (t(a, ta), t(b, tb));
            let (ag, bg) = (a.to_device(gpu()).unwrap(), b.to_device(gpu()).unwrap());
            let what = format!(
                "matmul {sa:?}{} x {sb:?}{}",
                if ta { "^T" } else { "" },
                if tb { "^T" } else { "" }
            );
            let k = a.dims()[a.rank() - 1];
            // cuBLAS accumulates 16-bit products in f32 and rounds once: so does this
            // reference (the CPU's own f16 kernel may round along the way).
            let want = if dtype == DType::F16 || dtype == DType::BF16 {
                let f = |x: &Tensor| x.to_dtype(DType::F32).unwrap();
                f(&a).matmul(&f(&b)).unwrap().to_dtype(dtype).unwrap()
            } else {
                a.matmul(&b).unwrap()
            };
            assert_summed(&what, &ag.matmul(&bg).unwrap(), &want, k * 4);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gather_and_scatter_add_match_the_cpu_and_refuse_bad_indices() {
    let labels: Vec<i64> = (0..64).map(|i| (i * 7 % 10) as i64).collect();
    let index = Tensor::from_slice(&labels, &[64, 1], Device::Cpu).unwrap();
    for dtype in FLOATS {
        let x = random(&[64, 10], dtype, 70);
        let xg = x.to_device(gpu()).unwrap();
        // The index on the host (uploaded) and on the device.
        for idx in [index.clone(), index.to_device(gpu()).unwrap()] {
            let got = xg.gather(-1, &idx).unwrap();
            assert_close("gather", &got, &x.gather(-1, &index).unwrap(), 0.0);
            let g = random(&[64, 1], dtype, 71);
            let gg = g.to_device(gpu()).unwrap();
            let got = gg.scatter_add(-1, &idx, &[64, 10]).unwrap();
            let want = g.scatter_add(-1, &index, &[64, 10]).unwrap();
            assert_close("scatter_add", &got, &want, 0.0);
        }
        let bad = Tensor::from_slice(&[3i64, 10], &[2, 1], Device::Cpu).unwrap();
        let e = random(&[2, 10], dtype, 72)
            .to_device(gpu())
            .unwrap()
            .gather(-1, &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of range 0..10"), "{e}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn argmax_index_select_one_hot_match_the_cpu() {
    for dtype in FLOATS {
        let mut x = random(&[33, 10], dtype, 80);
        // Ties (the first wins) and a NaN (it counts as the largest) in some rows.
        let mut v = x.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        v[3 * 10 + 2] = 9.0;
        v[3 * 10 + 7] = 9.0;
        v[5 * 10 + 4] = f32::NAN;
        x = Tensor::from_slice(&v, &[33, 10], Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let xg = x.to_device(gpu()).unwrap();
        for (axis, keep) in [(-1, false), (0, true)] {
            let got = xg.argmax(axis, keep).unwrap();
            assert_eq!(got.device(), gpu());
            assert_eq!(
                got.to_vec::<i64>().unwrap(),
                x.argmax(axis, keep).unwrap().to_vec::<i64>().unwrap(),
                "argmax over {axis} ({dtype})"
            );
        }
        let rows = [32, 0, 5, 5, 17];
        let got = xg.index_select(&rows).unwrap();
        assert_close("index_select", &got, &x.index_select(&rows).unwrap(), 0.0);
        let e = xg.index_select(&[33]).unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
    }
    // Integer rows too (the batches of a dataset).
    let ids = Tensor::from_slice(&[4i64, 9, 0, 3, 3, 7], &[6], Device::Cpu).unwrap();
    let ids_g = ids.to_device(gpu()).unwrap();
    let got = ids_g.index_select(&[5, 0, 2]).unwrap();
    assert_eq!(got.to_vec::<i64>().unwrap(), [7, 4, 0]);
    for dtype in FLOATS {
        let got = ids_g.one_hot(10, dtype).unwrap();
        assert_close("one_hot", &got, &ids.one_hot(10, dtype).unwrap(), 0.0);
        let e = ids_g.one_hot(5, dtype).unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn softmax_backward_full_and_concat_match_the_cpu() {
    for dtype in FLOATS {
        let x = random(&[7, 33], dtype, 90);
        let g = random(&[7, 33], dtype, 91);
        let (xg, gg) = (x.to_device(gpu()).unwrap(), g.to_device(gpu()).unwrap());
        for axis in [-1, 0] {
            let (y, yg) = (x.softmax(axis).unwrap(), xg.softmax(axis).unwrap());
            // The GPU's fused backward sums in another order than the CPU's composition.
            // The fused kernel computes 16-bit inputs in f32 and rounds once; the CPU's
            // composition rounds after every op, so the reference is the CPU's in f32.
            let wide = |t: &Tensor| match dtype {
                DType::F16 | DType::BF16 => t.to_dtype(DType::F32).unwrap(),
                _ => t.clone(),
            };
            let got = yg.softmax_backward(&gg, axis).unwrap();
            let want = wide(&y).softmax_backward(&wide(&g), axis).unwrap();
            let want = want.to_dtype(dtype).unwrap();
            assert_summed("softmax_backward", &got, &want, 33);
            let (l, lg) = (x.log_softmax(axis).unwrap(), xg.log_softmax(axis).unwrap());
            let got = lg.log_softmax_backward(&gg, axis).unwrap();
            let want = wide(&l).log_softmax_backward(&wide(&g), axis).unwrap();
            let want = want.to_dtype(dtype).unwrap();
            assert_summed("log_softmax_backward", &got, &want, 33);
        }
        let full = Tensor::full(&[3, 5], -2.5, dtype, gpu()).unwrap();
        assert_eq!(full.device(), gpu());
        let want = Tensor::full(&[3, 5], -2.5, dtype, Device::Cpu).unwrap();
        assert_close("full", &full, &want, 0.0);
        let a = random(&[3, 4, 2], dtype, 92);
        let b = random(&[3, 1, 2], dtype, 93);
        let (ag, bg) = (a.to_device(gpu()).unwrap(), b.to_device(gpu()).unwrap());
        let got = Tensor::concat(&[&ag, &bg, &ag], 1).unwrap();
        let want = Tensor::concat(&[&a, &b, &a], 1).unwrap();
        assert_close("concat along 1", &got, &want, 0.0);
        // Along 0, and of a view (read through its offset).
        let view = ag.narrow(0, 1, 2).unwrap();
        let got = Tensor::concat(&[&view, &ag], 0).unwrap();
        let want = Tensor::concat(&[&a.narrow(0, 1, 2).unwrap(), &a], 0).unwrap();
        assert_close("concat along 0", &got, &want, 0.0);
    }
    let ints = Tensor::full(&[4], 7.0, DType::I64, gpu()).unwrap();
    assert_eq!(ints.to_vec::<i64>().unwrap(), [7; 4]);
}

#[test]
#[ignore = "needs a CUDA device"]
fn values_copied_out_of_the_device_and_the_non_finite_scan() {
    let x = random(&[100], DType::F32, 95);
    let mut v = x.to_vec::<f32>().unwrap();
    let xg = x.to_device(gpu()).unwrap();
    assert_eq!(xg.to_vec::<f32>().unwrap(), v);
    assert_eq!(
        xg.narrow(0, 3, 1).unwrap().to_scalar::<f32>().unwrap(),
        v[3]
    );
    assert_eq!(xg.first_non_finite().unwrap(), None);
    v[42] = f32::INFINITY;
    let bad = Tensor::from_slice(&v, &[100], gpu()).unwrap();
    assert_eq!(bad.first_non_finite().unwrap(), Some((42, f64::INFINITY)));
    // In-place access unshares: a clone keeps its values.
    let mut p = xg.clone();
    let before = p.device_memory_mut().unwrap().ptr();
    assert_ne!(
        before,
        xg.device_ptr().unwrap(),
        "a shared buffer is copied first"
    );
    p.device_memory_mut().unwrap().fill_zero().unwrap();
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.0; 100]);
    assert_eq!(xg.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
}

/// Windows of every kind the models use: `same` 3x3 convolutions, a strided one, 2x2
/// pooling, ResNet-50's overlapping 3x3 pooling of stride 2, a 3D window, a dilated 1D
/// one. Each: the input's dims (`[n, spatial.., c]`), kernel, stride, dilation, padding.
fn windows() -> Vec<(Vec<usize>, Window)> {
    let w = |input: &[usize], k: &[usize], s: &[usize], d: &[usize], p: Padding| {
        let spatial = &input[1..input.len() - 1];
        (input.to_vec(), Window::new(spatial, k, s, d, p).unwrap())
    };
    vec![
        w(&[2, 9, 7, 5], &[3, 3], &[1, 1], &[1, 1], Padding::Same),
        w(&[2, 9, 8, 3], &[3, 3], &[2, 2], &[1, 1], Padding::Same),
        w(&[3, 8, 6, 4], &[2, 2], &[2, 2], &[1, 1], Padding::Valid),
        w(&[2, 11, 11, 3], &[3, 3], &[2, 2], &[1, 1], Padding::Same),
        w(
            &[1, 5, 6, 7, 2],
            &[3, 3, 3],
            &[1, 1, 1],
            &[1, 1, 1],
            Padding::Same,
        ),
        w(&[2, 17, 3], &[5], &[1], &[2], Padding::Valid),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn window_ops_match_the_cpu_bit_for_bit() {
    for dtype in FLOATS {
        for (case, (dims, window)) in windows().into_iter().enumerate() {
            let what = |op: &str| format!("{op} of window {case} ({dtype})");
            let mut x = random(&dims, dtype, 90 + case as u64);
            // Ties (the first of equal maxima wins) and a NaN (it wins) for the pooling.
            let mut v = x.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let c = dims[dims.len() - 1];
            v[c] = v[0];
            v[2 * c + 1] = f32::NAN;
            x = Tensor::from_slice(&v, &dims, Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let xg = x.to_device(gpu()).unwrap();
            let cols = x.im2col(&window).unwrap();
            let got = xg.im2col(&window).unwrap();
            assert_eq!(got.device(), gpu());
            assert_close(&what("im2col"), &got, &cols, 0.0);
            let g = random(cols.dims(), dtype, 190 + case as u64);
            let want = g.col2im(&window, c).unwrap();
            let got = g.to_device(gpu()).unwrap().col2im(&window, c).unwrap();
            assert_close(&what("col2im"), &got, &want, 0.0);
            let (values, winners) = x.max_pool(&window).unwrap();
            let (gv, gw) = xg.max_pool(&window).unwrap();
            assert_close(&what("max_pool"), &gv, &values, 0.0);
            assert_eq!(
                gw.to_device(Device::Cpu).unwrap().to_vec::<i64>().unwrap(),
                winners.to_vec::<i64>().unwrap(),
                "{}",
                what("max_pool winners")
            );
            let dy = random(values.dims(), dtype, 290 + case as u64);
            let want = dy.max_pool_grad(&winners, &dims).unwrap();
            let got = dy
                .to_device(gpu())
                .unwrap()
                .max_pool_grad(&gw, &dims)
                .unwrap();
            assert_close(&what("max_pool_grad"), &got, &want, 0.0);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn convolutions_and_their_gradients_match_the_cpu() {
    for dtype in [DType::F32, DType::F64] {
        for (case, (dims, window)) in windows().into_iter().enumerate() {
            let what = |op: &str| format!("{op} of window {case} ({dtype})");
            let c = dims[dims.len() - 1];
            let f = 6;
            let mut kernel_dims = window.kernel().to_vec();
            kernel_dims.extend([c, f]);
            let x = random(&dims, dtype, 390 + case as u64);
            let k = random(&kernel_dims, dtype, 490 + case as u64);
            let (xg, kg) = (x.to_device(gpu()).unwrap(), k.to_device(gpu()).unwrap());
            let (y, saved) = x.conv(&k, &window).unwrap();
            let (got, gsaved) = xg.conv(&kg, &window).unwrap();
            assert_eq!(got.device(), gpu());
            let inner = window.taps() * c;
            assert_summed(&what("conv"), &got, &y, inner);
            let dy = random(y.dims(), dtype, 590 + case as u64);
            let dyg = dy.to_device(gpu()).unwrap();
            let want = dy.conv_input_grad(&k, &window).unwrap();
            let got = dyg.conv_input_grad(&kg, &window).unwrap();
            assert_summed(&what("conv_input_grad"), &got, &want, window.taps() * f);
            let want = x.conv_kernel_grad(&dy, &window, &saved).unwrap();
            let got = xg.conv_kernel_grad(&dyg, &window, &gsaved).unwrap();
            assert_summed(&what("conv_kernel_grad"), &got, &want, y.elem_count() / f);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_pooling_winner_outside_its_image_or_channel_is_an_error() {
    let dims = [2, 4, 4, 3];
    let window = Window::new(&[4, 4], &[2, 2], &[2, 2], &[1, 1], Padding::Valid).unwrap();
    let x = random(&dims, DType::F32, 99).to_device(gpu()).unwrap();
    let (values, winners) = x.max_pool(&window).unwrap();
    let mut w = winners
        .to_device(Device::Cpu)
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    for (stray, why) in [(w[0] + 1, "another channel"), (w[0] + 48, "another image")] {
        let keep = w[0];
        w[0] = stray;
        let bad = Tensor::from_slice(&w, winners.dims(), gpu()).unwrap();
        let e = values.max_pool_grad(&bad, &dims).unwrap_err().to_string();
        assert!(
            e.contains("outside its own image and channel"),
            "{why}: {e}"
        );
        w[0] = keep;
    }
}
