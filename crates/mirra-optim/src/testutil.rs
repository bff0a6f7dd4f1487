//! Helpers shared by the unit tests.

use mirra_tensor::{DType, Device, Tensor};

/// A 1-d f32 tensor.
pub(crate) fn t32(v: &[f32]) -> Tensor {
    Tensor::from_slice(v, &[v.len()], Device::Cpu).unwrap()
}

/// The elements of a float tensor as f64.
pub(crate) fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// Element-wise `|got − want| <= tol`, with both vectors in the message.
#[track_caller]
pub(crate) fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= tol,
            "got {got:?}, want {want:?} (tol {tol})"
        );
    }
}
