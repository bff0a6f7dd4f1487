//! Sequential models end to end: naming, shapes, losses against hand-computed values,
//! the softmax/cross-entropy fusion and dropout.

use mirra_autograd::Tape;
use mirra_nn::loss::{CategoricalCrossentropy, MeanSquaredError, SparseCategoricalCrossentropy};
use mirra_nn::{
    Accuracy, Activation, Dense, Dropout, Examples, Flatten, Loss, Metric, Reduction, Sequential,
};
use mirra_tensor::{DType, Device, Tensor};

fn mlp() -> Sequential {
    let mut m = Sequential::new(vec![
        Box::new(Flatten),
        Box::new(Dense::new(8, Activation::Relu)),
        Box::new(Dense::new(3, Activation::Softmax)),
    ]);
    m.build(&[2, 2], 42).unwrap();
    m
}

#[test]
fn parameters_have_stable_keras_names_and_shapes() {
    let m = mlp();
    assert_eq!(
        m.param_names(),
        [
            "dense/kernel",
            "dense/bias",
            "dense_1/kernel",
            "dense_1/bias"
        ]
    );
    let dims: Vec<&[usize]> = m.params().iter().map(|p| p.dims()).collect();
    assert_eq!(dims, [&[4, 8][..], &[8], &[8, 3], &[3]]);
    assert_eq!(m.num_params(), 4 * 8 + 8 + 8 * 3 + 3);
    assert_eq!(m.output_shape(), &[3]);
    // Same seed, same weights.
    assert_eq!(
        m.params()[0].to_vec::<f32>().unwrap(),
        mlp().params()[0].to_vec::<f32>().unwrap()
    );
}

#[test]
fn wrong_input_shape_is_a_clear_error() {
    let mut m = mlp();
    let tape = Tape::new();
    let x = Tensor::zeros(&[5, 3], DType::F32, Device::Cpu).unwrap();
    let err = m.forward(&tape, x, false, Examples::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "model input: expected [batch, 2, 2], got [5, 3]"
    );
}

#[test]
fn cross_entropy_from_probabilities_uses_the_logits_like_keras() {
    let mut m = mlp();
    let tape = Tape::new();
    let x = Tensor::from_slice(
        &[0.1f32, 0.2, 0.3, 0.4, 1.0, -1.0, 0.5, 0.0],
        &[2, 2, 2],
        Device::Cpu,
    )
    .unwrap();
    let y = Tensor::from_slice(&[2i64, 0], &[2], Device::Cpu).unwrap();
    let out = m.forward(&tape, x, true, Examples::default()).unwrap();
    let loss = SparseCategoricalCrossentropy::default()
        .compute(&out, &y, Reduction::SumOverBatchSize)
        .unwrap();
    let p = out.output.value().to_vec::<f32>().unwrap();
    let expected = -(p[2].ln() + p[3].ln()) / 2.0;
    let got = loss.value().to_scalar::<f32>().unwrap();
    assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
    // One-hot labels give the same loss.
    let onehot = y.one_hot(3, DType::F32).unwrap();
    let cat = CategoricalCrossentropy::default()
        .compute(&out, &onehot, Reduction::SumOverBatchSize)
        .unwrap();
    assert!((cat.value().to_scalar::<f32>().unwrap() - expected).abs() < 1e-6);
    // Sum reduction is batch times the mean.
    let sum = SparseCategoricalCrossentropy::default()
        .compute(&out, &y, Reduction::Sum)
        .unwrap();
    assert!((sum.value().to_scalar::<f32>().unwrap() - 2.0 * expected).abs() < 1e-5);
    let grads = tape.backward(&loss).unwrap();
    assert_eq!(grads.get(3).unwrap().dims(), &[3]);
}

#[test]
fn mean_squared_error_by_hand() {
    let tape = Tape::new();
    let p = tape.param(
        Tensor::from_slice(&[1.0f64, 2.0, 3.0, 5.0], &[2, 2], Device::Cpu).unwrap(),
        0,
    );
    let y = Tensor::from_slice(&[1.0f64, 0.0, 0.0, 1.0], &[2, 2], Device::Cpu).unwrap();
    let out = mirra_nn::ModelOutput {
        output: p,
        logits: None,
    };
    let l = MeanSquaredError
        .compute(&out, &y, Reduction::SumOverBatchSize)
        .unwrap();
    // Per example: (0 + 4) / 2 = 2 and (9 + 16) / 2 = 12.5; mean 7.25.
    assert_eq!(l.value().to_scalar::<f64>().unwrap(), 7.25);
}

#[test]
fn labels_for_another_batch_size_are_rejected() {
    let mut m = mlp();
    let tape = Tape::new();
    let x = Tensor::zeros(&[2, 2, 2], DType::F32, Device::Cpu).unwrap();
    let out = m.forward(&tape, x, false, Examples::default()).unwrap();
    let y = Tensor::from_slice(&[1i64, 0, 2], &[3], Device::Cpu).unwrap();
    let err = SparseCategoricalCrossentropy::default()
        .compute(&out, &y, Reduction::Sum)
        .unwrap_err();
    assert!(err.to_string().contains("labels for a batch of 2"), "{err}");
}

#[test]
fn dropout_zeroes_and_rescales_only_while_training() {
    let mut m = Sequential::new(vec![Box::new(Dropout::new(0.5))]);
    m.build(&[1000], 0).unwrap();
    let x = Tensor::ones(&[1, 1000], DType::F32, Device::Cpu).unwrap();
    let tape = Tape::new();
    let y = m
        .forward(
            &tape,
            x.clone(),
            true,
            Examples {
                step_key: 3,
                first: 0,
            },
        )
        .unwrap()
        .output
        .value()
        .to_vec::<f32>()
        .unwrap();
    assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
    let kept = y.iter().filter(|&&v| v == 2.0).count();
    assert!((400..600).contains(&kept), "{kept}");
    assert_eq!(
        m.predict(x).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0; 1000]
    );
    let mut bad = Sequential::new(vec![Box::new(Dropout::new(1.0))]);
    assert_eq!(
        bad.build(&[3], 0).unwrap_err().to_string(),
        "dropout: rate 1 outside [0, 1)"
    );
}

/// An example's mask depends on the step's key and its index in the global batch, not on
/// the batch it was computed in: the halves of a batch, each given its first index, drop
/// what the whole batch drops (so N replicas drop what one device drops).
#[test]
fn dropout_masks_follow_the_example_not_the_split() {
    let mut m = Sequential::new(vec![Box::new(Dropout::new(0.5))]);
    m.build(&[50], 0).unwrap();
    let x = Tensor::ones(&[4, 50], DType::F32, Device::Cpu).unwrap();
    let mut run = |x: Tensor, step_key: u64, first: usize| {
        let tape = Tape::new();
        let out = m
            .forward(&tape, x, true, Examples { step_key, first })
            .unwrap();
        out.output.value().to_vec::<f32>().unwrap()
    };
    let whole = run(x.clone(), 7, 0);
    let mut halves = run(x.narrow(0, 0, 2).unwrap(), 7, 0);
    halves.extend(run(x.narrow(0, 2, 2).unwrap(), 7, 2));
    assert_eq!(whole, halves);
    // Another step, or the second half taken as the first examples, drops others.
    assert_ne!(run(x.clone(), 8, 0), whole);
    assert_ne!(run(x.narrow(0, 2, 2).unwrap(), 7, 0), whole[100..]);
}

#[test]
fn accuracy_counts_argmax_hits() {
    let mut acc = Accuracy::new();
    let pred =
        Tensor::from_slice(&[0.1f32, 0.9, 0.8, 0.2, 0.3, 0.7], &[3, 2], Device::Cpu).unwrap();
    let y = Tensor::from_slice(&[1i64, 0, 0], &[3], Device::Cpu).unwrap();
    acc.update(&y, &pred).unwrap();
    assert!((acc.result() - 2.0 / 3.0).abs() < 1e-12);
    acc.reset();
    assert_eq!(acc.result(), 0.0);
}

/// Dice plus cross-entropy by hand: one example of two pixels and three classes (class 0
/// the ignored background), probabilities given directly.
#[test]
fn dice_crossentropy_by_hand() {
    let tape = Tape::new();
    let probs = [0.7f64, 0.2, 0.1, 0.1, 0.3, 0.6];
    let p = tape.param(
        Tensor::from_slice(&probs, &[1, 2, 3], Device::Cpu).unwrap(),
        0,
    );
    // Pixel 0 is class 0, pixel 1 class 2.
    let y = Tensor::from_slice(&[0i64, 2], &[1, 2], Device::Cpu).unwrap();
    let out = mirra_nn::ModelOutput {
        output: p,
        logits: None,
    };
    let loss = mirra_nn::DiceCrossentropy::new(3, &[0]);
    let l = loss.compute(&out, &y, Reduction::Sum).unwrap();
    let ce = -(0.7f64.ln() + 0.6f64.ln()) / 2.0;
    // Class 1: absent, predicted 0.2 + 0.3: (0 + 1) / (0.5 + 0 + 1). Class 2: present at
    // pixel 1: (2 x 0.6 + 1) / (0.7 + 1 + 1).
    let dice = (1.0 / 1.5 + 2.2 / 2.7) / 2.0;
    let want = ce + 1.0 - dice;
    let got = l.value().to_scalar::<f64>().unwrap();
    assert!((got - want).abs() < 1e-12, "{got} against {want}");
    // The background counted in the mean changes it (the ignore list is used).
    let all = mirra_nn::DiceCrossentropy::new(3, &[])
        .compute(&out, &y, Reduction::Sum)
        .unwrap();
    assert!((all.value().to_scalar::<f64>().unwrap() - want).abs() > 1e-3);
    // Gradients flow to the probabilities.
    let grads = tape.backward(&l).unwrap();
    assert!(grads
        .get(0)
        .is_some_and(|g| g.to_vec::<f64>().unwrap().iter().any(|&x| x != 0.0)));
}
