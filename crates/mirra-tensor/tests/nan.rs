//! NaN goes through every op as in PyTorch and TensorFlow: an op whose result depends on
//! a NaN input gives NaN, never a number. One test per op family; each also checks the
//! finite neighbours of the NaN, so that an op that makes everything NaN fails too.

use mirra_tensor::{DType, Device, Tensor};

const NAN: f32 = f32::NAN;

fn t(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(v, dims, Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// `got` equals `want`, NaN where `want` is NaN.
fn same(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g.is_nan() && w.is_nan()) || g == w)
}

fn check(what: &str, got: &Tensor, want: &[f32]) {
    let got = values(got);
    assert!(same(&got, want), "{what}: {got:?}, want {want:?}");
}

#[test]
fn activations_and_sign_keep_nan() {
    let x = t(&[-1., NAN, 2.], &[3]);
    check("relu", &x.relu().unwrap(), &[0., NAN, 2.]);
    check("sign", &x.sign().unwrap(), &[-1., NAN, 1.]);
    check("abs", &x.abs().unwrap(), &[1., NAN, 2.]);
    for (name, y) in [
        ("sigmoid", x.sigmoid().unwrap()),
        ("tanh", x.tanh().unwrap()),
        ("gelu", x.gelu().unwrap()),
    ] {
        let y = values(&y);
        assert!(
            y[1].is_nan() && y[0].is_finite() && y[2].is_finite(),
            "{name}: {y:?}"
        );
    }
    // In every float dtype (16-bit floats compute in f32).
    for dtype in [DType::F64, DType::F16, DType::BF16] {
        let y = x.to_dtype(dtype).unwrap().relu().unwrap();
        check(
            &format!("relu {dtype}"),
            &y.to_dtype(DType::F32).unwrap(),
            &[0., NAN, 2.],
        );
    }
}

#[test]
fn maximum_minimum_and_clipping_keep_nan_from_either_side() {
    let a = t(&[NAN, 1., 5., NAN], &[4]);
    let b = t(&[0., NAN, 3., NAN], &[4]);
    check("maximum", &a.maximum(&b).unwrap(), &[NAN, NAN, 5., NAN]);
    check("minimum", &a.minimum(&b).unwrap(), &[NAN, NAN, 3., NAN]);
    check("maximum", &b.maximum(&a).unwrap(), &[NAN, NAN, 5., NAN]);
    // A clamp to [0, 1] as max then min, with a broadcast bound.
    let x = t(&[-2., NAN, 0.5, 7.], &[4]);
    let lo = t(&[0.], &[1]);
    let hi = t(&[1.], &[1]);
    let clamped = x.maximum(&lo).unwrap().minimum(&hi).unwrap();
    check("clamp", &clamped, &[0., NAN, 0.5, 1.]);
}

#[test]
fn max_reductions_and_argmax_see_nan_as_the_largest() {
    let x = t(&[1., NAN, 3., 4., 5., 6.], &[2, 3]);
    check("max rows", &x.max(&[1], false).unwrap(), &[NAN, 6.]);
    check("max columns", &x.max(&[0], false).unwrap(), &[4., NAN, 6.]);
    let all = x.max(&[], false).unwrap().to_scalar::<f32>().unwrap();
    assert!(all.is_nan(), "max of all: {all}");
    // PyTorch: the index of the (first) NaN.
    let y = t(&[1., 9., NAN, NAN, 0., 7., 2., 3.], &[2, 4]);
    let am = y.argmax(1, false).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(am, [2, 1]);
    let sum = values(&x.sum(&[1], false).unwrap());
    assert!(sum[0].is_nan() && sum[1] == 15., "{sum:?}");
}

#[test]
fn softmax_and_log_softmax_make_a_row_with_nan_nan_and_leave_the_others() {
    let x = t(&[NAN, 1., 2., 1., 2., 3.], &[2, 3]);
    for (name, y) in [
        ("softmax", x.softmax(-1).unwrap()),
        ("log_softmax", x.log_softmax(-1).unwrap()),
    ] {
        let y = values(&y);
        assert!(y[..3].iter().all(|v| v.is_nan()), "{name}: {y:?}");
        assert!(y[3..].iter().all(|v| v.is_finite()), "{name}: {y:?}");
    }
    // A NaN in the last position, after the running max has settled.
    let y = values(&t(&[1., 2., NAN], &[1, 3]).softmax(-1).unwrap());
    assert!(y.iter().all(|v| v.is_nan()), "{y:?}");
    // Backward: a NaN gradient reaches its whole row.
    let p = x.narrow(0, 1, 1).unwrap().softmax(-1).unwrap();
    let g = t(&[NAN, 0., 1.], &[1, 3]);
    let back = values(&p.softmax_backward(&g, -1).unwrap());
    assert!(back.iter().all(|v| v.is_nan()), "{back:?}");
}

#[test]
fn relu_backward_passes_the_gradient_at_nan_as_pytorch() {
    // PyTorch's threshold_backward: 0 where x <= 0, else the gradient.
    let g = t(&[1., 2., NAN, 4.], &[4]);
    let x = t(&[-1., NAN, -3., 5.], &[4]);
    check(
        "relu_backward",
        &g.relu_backward(&x).unwrap(),
        &[0., 2., 0., 4.],
    );
}

#[test]
fn matmul_propagates_nan_from_a_weight_through_zeros() {
    // A NaN weight meeting a zero input is still NaN (0 * NaN), as in BLAS.
    let x = t(&[0., 0., 1., 1.], &[2, 2]);
    let w = t(&[NAN, 1., 1., 1.], &[2, 2]);
    check("matmul", &x.matmul(&w).unwrap(), &[NAN, 0., NAN, 2.]);
}
