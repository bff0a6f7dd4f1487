//! Small models and data for the tests of this crate.

use mirra_data::Dataset;
use mirra_nn::loss::SparseCategoricalCrossentropy;
use mirra_nn::{Accuracy, Activation, Dense, Dropout, Flatten, Sequential};
use mirra_optim::{Adam, Optimizer};
use mirra_tensor::init::{rng, Initializer};
use mirra_tensor::{DType, Device, Tensor};

use crate::Model;

/// A compiled 4 -> 8 -> 3 classifier (Adam, sparse cross-entropy, accuracy).
pub(crate) fn tiny_model(seed: u64) -> Model {
    tiny_model_with(Box::new(Adam::new(0.01)), seed)
}

/// [`tiny_model`] with another optimizer.
pub(crate) fn tiny_model_with(optimizer: Box<dyn Optimizer>, seed: u64) -> Model {
    let net = Sequential::new(vec![
        Box::new(Flatten),
        Box::new(Dense::new(8, Activation::Relu)),
        Box::new(Dense::new(3, Activation::Softmax)),
    ]);
    compile_tiny(net, optimizer, seed)
}

/// [`tiny_model`] with dropout after the hidden layer, so training draws from the
/// model's generator.
pub(crate) fn tiny_dropout_model(seed: u64) -> Model {
    compile_tiny(
        Sequential::new(vec![
            Box::new(Flatten),
            Box::new(Dense::new(8, Activation::Relu)),
            Box::new(Dropout::new(0.25)),
            Box::new(Dense::new(3, Activation::Softmax)),
        ]),
        Box::new(Adam::new(0.01)),
        seed,
    )
}

fn compile_tiny(mut net: Sequential, optimizer: Box<dyn Optimizer>, seed: u64) -> Model {
    net.build(&[4], seed).expect("the tiny net builds");
    Model::compile(
        net,
        optimizer,
        Box::new(SparseCategoricalCrossentropy::default()),
        vec![Box::new(Accuracy::new())],
        seed,
    )
}

/// `n` random examples of 4 features with labels in `0..3`, in batches of `batch`.
pub(crate) fn tiny_data(n: usize, batch: usize, seed: u64) -> Dataset {
    tiny_examples(n, seed).batch(batch, false)
}

/// [`tiny_data`] reshuffled every epoch (seeded by `seed` and the epoch).
pub(crate) fn tiny_shuffled_data(n: usize, batch: usize, seed: u64) -> Dataset {
    tiny_examples(n, seed).shuffle(n, seed).batch(batch, false)
}

/// `n` random examples of 4 features with labels in `0..3`, one by one.
fn tiny_examples(n: usize, seed: u64) -> Dataset {
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
    Dataset::from_tensor_slices(vec![x, y]).expect("slices")
}
