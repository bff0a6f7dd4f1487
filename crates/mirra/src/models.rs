//! Models known to the command line by name.

use mirra_nn::{
    Activation, Add, BatchNormalization, Concatenate, Conv2D, Dense, Flatten,
    GlobalAveragePooling2D, Graph, MaxPooling2D, Network, Padding, Reshape, Sequential, Symbol,
    UpSampling2D,
};

/// The names `mirra train --model` accepts.
pub const MODEL_NAMES: &[&str] = &["mlp", "cnn", "resnet20", "unet"];

/// What a model learns from its images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// One class per 28x28 digit.
    Classification,
    /// One class per pixel of a 56x56 canvas of digits
    /// ([`digit_canvases`](mirra_data::digit_canvases)).
    Segmentation,
}

/// The task of the model `name`.
pub fn task(name: &str) -> Task {
    if name == "unet" {
        Task::Segmentation
    } else {
        Task::Classification
    }
}

/// The input shape (without the batch dimension) of the model `name`'s task.
pub fn input_shape(name: &str) -> [usize; 2] {
    match task(name) {
        Task::Classification => [28, 28],
        Task::Segmentation => [mirra_data::CANVAS, mirra_data::CANVAS],
    }
}

/// How to build the models that have batch normalization.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Batch statistics summed across the replicas of a mirrored strategy
    /// ([`BatchNormalization::synchronized`]).
    pub sync_batch_norm: bool,
}

/// The model called `name`, not yet built; `None` for an unknown name.
pub fn by_name(name: &str, options: Options) -> Option<Network> {
    match name {
        "mlp" => Some(mlp()),
        "cnn" => Some(cnn()),
        "resnet20" => Some(resnet20(options)),
        "unet" => Some(unet()),
        _ => None,
    }
}

/// True for the models whose layers run on the host only in this build (convolutions,
/// pooling, batch norm).
pub fn host_only(name: &str) -> bool {
    name != "mlp"
}

/// The CIFAR-style ResNet-20 of He et al. (2016) on 28x28x1 digits: a 3x3 convolution of
/// 16 filters, three stages of three basic blocks (16, 32 and 64 filters; the second and
/// third stages halve the resolution with a stride of 2, their first block's shortcut a
/// 1x1 convolution of stride 2 with batch norm), global average pooling and a softmax of
/// 10; every convolution `same`, without bias, followed by batch norm. 272,186 trainable
/// parameters.
pub fn resnet20(options: Options) -> Network {
    let bn = || {
        let bn = BatchNormalization::new();
        if options.sync_batch_norm {
            bn.synchronized()
        } else {
            bn
        }
    };
    let conv = |filters: usize, kernel: usize, stride: usize| {
        Conv2D::new(filters, [kernel, kernel], Activation::Linear)
            .strides([stride, stride])
            .padding(Padding::Same)
            .without_bias()
    };
    let mut g = Graph::new();
    let input = g.input();
    let mut x = g.call(Reshape::new(&[28, 28, 1]), input);
    x = g.call(conv(16, 3, 1), x);
    x = g.call(bn(), x);
    x = g.call(Activation::Relu, x);
    let mut channels = 16;
    for (stage, filters) in [16, 32, 64].into_iter().enumerate() {
        for block in 0..3 {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let mut h = g.call(conv(filters, 3, stride), x);
            h = g.call(bn(), h);
            h = g.call(Activation::Relu, h);
            h = g.call(conv(filters, 3, 1), h);
            h = g.call(bn(), h);
            let shortcut: Symbol = if stride != 1 || filters != channels {
                let s = g.call(conv(filters, 1, stride), x);
                g.call(bn(), s)
            } else {
                x
            };
            x = g.merge(Add, &[h, shortcut]);
            x = g.call(Activation::Relu, x);
            channels = filters;
        }
    }
    x = g.call(GlobalAveragePooling2D, x);
    let y = g.call(Dense::new(10, Activation::Softmax), x);
    Network::functional(g, y).expect("the graph's output is one of its layers")
}

/// A small 2D U-Net (Ronneberger et al., 2015) for the 56x56 digit canvases: two levels
/// of two 3x3 `same` convolutions with relu (16, then 32 filters) each followed by 2x2 max
/// pooling, a bottleneck of two convolutions of 64, and a decoder that upsamples by 2,
/// concatenates the encoder's output of the same resolution (the skip connection) and
/// applies two convolutions (32, then 16), ending in a 1x1 convolution to the 11 classes
/// with a per-pixel softmax. 118,155 parameters.
pub fn unet() -> Network {
    let conv =
        |filters: usize| Conv2D::new(filters, [3, 3], Activation::Relu).padding(Padding::Same);
    let mut g = Graph::new();
    let input = g.input();
    let side = mirra_data::CANVAS;
    let mut x = g.call(Reshape::new(&[side, side, 1]), input);
    let mut skips = Vec::new();
    for filters in [16, 32] {
        x = g.call(conv(filters), x);
        x = g.call(conv(filters), x);
        skips.push(x);
        x = g.call(MaxPooling2D::new([2, 2]), x);
    }
    x = g.call(conv(64), x);
    x = g.call(conv(64), x);
    for filters in [32, 16] {
        x = g.call(UpSampling2D::new([2, 2]), x);
        let skip = skips.pop().expect("one skip per level");
        x = g.merge(Concatenate::default(), &[x, skip]);
        x = g.call(conv(filters), x);
        x = g.call(conv(filters), x);
    }
    let y = g.call(
        Conv2D::new(mirra_data::CLASSES, [1, 1], Activation::Softmax),
        x,
    );
    Network::functional(g, y).expect("the graph's output is one of its layers")
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

    use mirra_nn::loss::SparseCategoricalCrossentropy;
    use mirra_tensor::init::{rng, Initializer};
    use mirra_tensor::{DType, Device, Tensor};

    /// `n` random 28x28 images with labels `i % 10`.
    fn random_digits(n: usize) -> (Tensor, Tensor) {
        let x = Initializer::Uniform {
            low: 0.0,
            high: 1.0,
        }
        .init(&[n, 28, 28], DType::F32, Device::Cpu, &mut rng(4))
        .unwrap();
        let labels = (0..n).map(|i| (i % 10) as i64).collect();
        (x, Tensor::from_vec(labels, &[n], Device::Cpu).unwrap())
    }

    /// The losses of `steps` Adam steps of `net` (built) on the one batch `(x, y)`.
    fn losses_on_one_batch(
        net: Network,
        lr: f64,
        steps: usize,
        x: &Tensor,
        y: &Tensor,
    ) -> Vec<f64> {
        let mut model = mirra_train::Model::compile(
            net,
            Box::new(mirra_optim::Adam::new(lr)),
            Box::new(SparseCategoricalCrossentropy::default()),
            vec![],
            3,
        );
        let losses: Vec<f64> = (0..steps)
            .map(|_| model.train_step(x.clone(), y).unwrap().loss)
            .collect();
        assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
        losses
    }

    /// The CI smoke of the CNN (training it to its accuracy is `cargo xtask`'s): on one
    /// fixed batch of 32 images, every one of ten Adam steps lowers the loss.
    #[test]
    fn the_cnn_learns_a_batch() {
        let mut net = cnn();
        net.build(&[28, 28], 3).unwrap();
        let (x, y) = random_digits(32);
        let losses = losses_on_one_batch(net, 1e-3, 10, &x, &y);
        // Every step lowers it (a wrong or missing gradient would not), 10% in all.
        assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
        assert!(losses[9] < 0.9 * losses[0], "{losses:?}");
    }

    /// The CI smoke of ResNet-20: a few Adam steps on one batch lower the loss, and its
    /// shapes and parameter count are the paper's (0.27M).
    #[test]
    fn resnet20_learns_a_batch_and_has_the_paper_s_size() {
        let mut net = resnet20(Options::default());
        net.build(&[28, 28], 3).unwrap();
        assert_eq!(net.num_params(), 272_186);
        assert_eq!(net.output_shape(), [10]);
        // 19 convolutions and 2 shortcut projections, each with a batch norm.
        assert_eq!(net.state().len(), 2 * 21);
        let (x, y) = random_digits(16);
        let losses = losses_on_one_batch(net, 1e-3, 4, &x, &y);
        assert!(losses[3] < losses[0], "{losses:?}");
    }

    /// The CI smoke of the U-Net: its shapes, and a few Adam steps on one batch of
    /// canvases lower the per-pixel loss.
    #[test]
    fn the_unet_segments_canvases_and_learns_a_batch() {
        let mut net = unet();
        net.build(&input_shape("unet"), 3).unwrap();
        assert_eq!(net.output_shape(), [56, 56, 11]);
        assert_eq!(net.num_params(), 118_155);
        let digits = mirra_data::Mnist::bundled().unwrap().train;
        let canvases = mirra_data::digit_canvases(&digits, 8, 1).unwrap();
        let batch = mirra_data::pixels_to_unit_f32(vec![canvases.pixels, canvases.labels]).unwrap();
        let losses = losses_on_one_batch(net, 3e-3, 4, &batch[0], &batch[1]);
        assert!(losses[3] < losses[0], "{losses:?}");
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
