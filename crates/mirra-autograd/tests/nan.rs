//! NaN through the backward of every op family that compares values (ReLU, max, the
//! softmaxes and a cross-entropy built from them): a gradient that depends on a NaN is
//! NaN, as in PyTorch, and the gradients of rows without NaN stay finite.

use mirra_autograd::Tape;
use mirra_tensor::{Device, Tensor};

const NAN: f32 = f32::NAN;

fn t(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(v, dims, Device::Cpu).unwrap()
}

/// The gradient of `sum(f(x))` with respect to `x`.
fn grad(
    x: Tensor,
    f: impl for<'t> Fn(&mirra_autograd::Var<'t>) -> mirra_autograd::Var<'t>,
) -> Vec<f32> {
    let tape = Tape::new();
    let v = tape.param(x, 0);
    let loss = f(&v).sum(&[], false).unwrap();
    let mut grads = tape.backward(&loss).unwrap();
    grads.take(0).unwrap().to_vec::<f32>().unwrap()
}

fn nan_at(g: &[f32]) -> Vec<bool> {
    g.iter().map(|v| v.is_nan()).collect()
}

#[test]
fn relu_of_nan_is_nan_forward_and_passes_the_gradient_back() {
    let tape = Tape::new();
    let x = tape.param(t(&[-1., NAN, 2.], &[3]), 0);
    let y = x.relu().unwrap().value().to_vec::<f32>().unwrap();
    assert!(y[0] == 0. && y[1].is_nan() && y[2] == 2., "{y:?}");
    // An upstream NaN gradient reaches the input where x > 0 (PyTorch's threshold_backward).
    let g = grad(t(&[-1., NAN, 2.], &[3]), |x| {
        x.relu().unwrap().scale(2.0).unwrap()
    });
    assert_eq!(g, [0., 2., 2.]);
    let g = grad(t(&[-1., 1., 2.], &[3]), |x| {
        let nan = x.tape().constant(t(&[NAN, NAN, 1.], &[3]));
        x.relu().unwrap().mul(&nan).unwrap()
    });
    assert_eq!(nan_at(&g), [false, true, false], "{g:?}");
}

#[test]
fn max_with_a_nan_gives_its_row_nan_gradients() {
    let g = grad(t(&[1., NAN, 3., 4., 6., 5.], &[2, 3]), |x| {
        x.max(&[1], false).unwrap()
    });
    assert_eq!(nan_at(&g), [true, true, true, false, false, false], "{g:?}");
    assert_eq!(&g[3..], [0., 1., 0.]);
}

#[test]
fn cross_entropy_of_nan_logits_is_nan_in_that_row_only() {
    for log in [false, true] {
        let tape = Tape::new();
        let logits = tape.param(t(&[NAN, 1., 2., 1., 2., 3.], &[2, 3]), 0);
        let logp = if log {
            logits.log_softmax(-1).unwrap()
        } else {
            logits.softmax(-1).unwrap().log().unwrap()
        };
        let labels = Tensor::from_slice(&[1i64, 2], &[2, 1], Device::Cpu).unwrap();
        let per_example = logp.gather(-1, &labels).unwrap().neg().unwrap();
        let values = per_example.value().to_vec::<f32>().unwrap();
        assert!(values[0].is_nan() && values[1].is_finite(), "{values:?}");
        let loss = per_example.sum(&[], false).unwrap();
        assert!(loss.value().to_vec::<f32>().unwrap()[0].is_nan());
        let g = tape.backward(&loss).unwrap().take(0).unwrap();
        let g = g.to_vec::<f32>().unwrap();
        assert_eq!(
            nan_at(&g),
            [true, true, true, false, false, false],
            "log {log}: {g:?}"
        );
    }
}

#[test]
fn a_clip_built_from_relu_keeps_nan() {
    // Keras's probability clip, min(max(p, lo), hi) = q - relu(q - hi), q = p + relu(lo - p).
    let g = grad(t(&[0.5, NAN, 2.0], &[3]), |p| {
        let lo = p.tape().constant(t(&[0.1; 3], &[3]));
        let hi = p.tape().constant(t(&[0.9; 3], &[3]));
        let q = p.add(&lo.sub(p).unwrap().relu().unwrap()).unwrap();
        let clipped = q.sub(&q.sub(&hi).unwrap().relu().unwrap()).unwrap();
        let v = clipped.value().to_vec::<f32>().unwrap();
        assert!(v[0] == 0.5 && v[1].is_nan() && v[2] == 0.9, "{v:?}");
        clipped
    });
    assert_eq!(g[0], 1.);
    assert_eq!(g[2], 0.);
}
