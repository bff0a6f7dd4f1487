//! Models known to the command line by name.

use mirra_nn::{Activation, Conv2D, Dense, Flatten, MaxPooling2D, Reshape, Sequential};

/// The names `mirra train --model` accepts.
pub const MODEL_NAMES: &[&str] = &["mlp", "cnn"];

/// The model called `name`, not yet built; `None` for an unknown name.
pub fn by_name(name: &str) -> Option<Sequential> {
    match name {
        "mlp" => Some(mlp()),
        "cnn" => Some(cnn()),
        _ => None,
    }
}

/// The MNIST CNN of Keras's example: Reshape to 28x28x1 -> Conv2D(32, 3x3, relu) ->
/// MaxPooling 2x2 -> Conv2D(64, 3x3, relu) -> MaxPooling 2x2 -> Flatten -> Dense(128, relu)
/// -> Dense(10, softmax); `valid` convolutions, 225,034 parameters.
pub fn cnn() -> Sequential {
    Sequential::new(vec![
        Box::new(Reshape::new(&[28, 28, 1])),
        Box::new(Conv2D::new(32, [3, 3], Activation::Relu)),
        Box::new(MaxPooling2D::new([2, 2])),
        Box::new(Conv2D::new(64, [3, 3], Activation::Relu)),
        Box::new(MaxPooling2D::new([2, 2])),
        Box::new(Flatten),
        Box::new(Dense::new(128, Activation::Relu)),
        Box::new(Dense::new(10, Activation::Softmax)),
    ])
}

/// The MNIST MLP of the reference recipe: Flatten -> Dense(128, relu) -> Dense(64, relu)
/// -> Dense(10, softmax).
pub fn mlp() -> Sequential {
    Sequential::new(vec![
        Box::new(Flatten),
        Box::new(Dense::new(128, Activation::Relu)),
        Box::new(Dense::new(64, Activation::Relu)),
        Box::new(Dense::new(10, Activation::Softmax)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CI smoke of the CNN (training it to its accuracy is `cargo xtask`'s): on one
    /// fixed batch of 32 images, every one of ten Adam steps lowers the loss.
    #[test]
    fn the_cnn_learns_a_batch() {
        use mirra_nn::loss::SparseCategoricalCrossentropy;
        use mirra_tensor::init::{rng, Initializer};
        use mirra_tensor::{DType, Device, Tensor};
        let mut net = cnn();
        net.build(&[28, 28], 3).unwrap();
        let mut model = mirra_train::Model::compile(
            net,
            Box::new(mirra_optim::Adam::new(1e-3)),
            Box::new(SparseCategoricalCrossentropy::default()),
            vec![],
            3,
        );
        let x = Initializer::Uniform {
            low: 0.0,
            high: 1.0,
        }
        .init(&[32, 28, 28], DType::F32, Device::Cpu, &mut rng(4))
        .unwrap();
        let y = Tensor::from_vec(
            (0..32).map(|i| (i % 10) as i64).collect(),
            &[32],
            Device::Cpu,
        )
        .unwrap();
        let losses: Vec<f64> = (0..10)
            .map(|_| model.train_step(x.clone(), &y).unwrap().loss)
            .collect();
        assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
        // Every step lowers it (a wrong or missing gradient would not), 10% in all.
        assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
        assert!(losses[9] < 0.9 * losses[0], "{losses:?}");
    }

    #[test]
    fn the_cnn_has_keras_s_shapes_and_parameter_count() {
        let mut net = cnn();
        net.build(&[28, 28], 1).unwrap();
        // conv 3*3*1*32 + 32, conv 3*3*32*64 + 64, dense 1600*128 + 128, dense 128*10 + 10.
        assert_eq!(net.num_params(), 320 + 18_496 + 204_928 + 1_290);
        assert_eq!(
            net.param_names(),
            [
                "conv2d/kernel",
                "conv2d/bias",
                "conv2d_1/kernel",
                "conv2d_1/bias",
                "dense/kernel",
                "dense/bias",
                "dense_1/kernel",
                "dense_1/bias"
            ]
        );
    }
}
