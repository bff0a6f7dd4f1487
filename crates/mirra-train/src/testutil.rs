//! Small models and data for the tests of this crate.

use mirra_data::Dataset;
use mirra_nn::loss::SparseCategoricalCrossentropy;
use mirra_nn::{Accuracy, Activation, Dense, Flatten, Sequential};
use mirra_optim::Adam;
use mirra_tensor::init::{rng, Initializer};
use mirra_tensor::{DType, Device, Tensor};

use crate::Model;

/// A compiled 4 -> 8 -> 3 classifier (Adam, sparse cross-entropy, accuracy).
pub(crate) fn tiny_model(seed: u64) -> Model {
    let mut net = Sequential::new(vec![
        Box::new(Flatten),
        Box::new(Dense::new(8, Activation::Relu)),
        Box::new(Dense::new(3, Activation::Softmax)),
    ]);
    net.build(&[4], seed).expect("the tiny net builds");
    Model::compile(
        net,
        Box::new(Adam::new(0.01)),
        Box::new(SparseCategoricalCrossentropy::default()),
        vec![Box::new(Accuracy::new())],
        seed,
    )
}

/// `n` random examples of 4 features with labels in `0..3`, in batches of `batch`.
pub(crate) fn tiny_data(n: usize, batch: usize, seed: u64) -> Dataset {
    let mut r = rng(seed);
    let normal = Initializer::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let x = normal
        .init(&[n, 4], DType::F32, Device::Cpu, &mut r)
        .expect("normal");
    let labels: Vec<i64> = (0..n as i64).map(|i| i % 3).collect();
    let y = Tensor::from_vec(labels, &[n], Device::Cpu).expect("labels");
    Dataset::from_tensor_slices(vec![x, y])
        .expect("slices")
        .batch(batch, false)
}
