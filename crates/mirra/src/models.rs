//! Models known to the command line by name.

use mirra_nn::{
    Activation, Add, BatchNormalization, Concatenate, Conv, Conv2D, Dense, Flatten,
    GlobalAveragePooling2D, Graph, MaxPooling, MaxPooling2D, Network, Padding, Reshape, Sequential,
    Symbol, UpSampling,
};

/// The names `mirra train --model` accepts.
pub const MODEL_NAMES: &[&str] = &["mlp", "cnn", "resnet20", "unet", "unet3d", "resnet50"];

/// What a model learns from its images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// One class per 28x28 digit.
    Classification,
    /// One class per pixel of a 56x56 canvas of digits
    /// ([`digit_canvases`](mirra_data::digit_canvases)), or per voxel of a 32x56x56 volume
    /// ([`digit_volumes`](mirra_data::digit_volumes)).
    Segmentation,
    /// One of 1000 classes per 224x224x3 image, on synthetic ImageNet-shaped batches
    /// ([`synthetic_images`](mirra_data::synthetic_images)): a throughput run.
    Synthetic,
}

/// Classes of the synthetic ImageNet-shaped batches.
pub const SYNTHETIC_CLASSES: usize = 1000;

/// The task of the model `name`.
pub fn task(name: &str) -> Task {
    match name {
        "unet" | "unet3d" => Task::Segmentation,
        "resnet50" => Task::Synthetic,
        _ => Task::Classification,
    }
}

/// The input shape (without the batch dimension) of the model `name`'s task.
pub fn input_shape(name: &str) -> Vec<usize> {
    let side = mirra_data::CANVAS;
    match name {
        "unet" => vec![side, side],
        "unet3d" => vec![mirra_data::VOLUME_DEPTH, side, side],
        "resnet50" => vec![224, 224, 3],
        _ => vec![28, 28],
    }
}

/// How to build a model: the classifiers' classes, the batch norm layers' kind.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Batch statistics summed across the replicas of a mirrored strategy
    /// ([`BatchNormalization::synchronized`]).
    pub sync_batch_norm: bool,
    /// Outputs of the classifiers (mlp, cnn, resnet20): the data's classes, 10 for digits.
    pub classes: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            sync_batch_norm: false,
            classes: 10,
        }
    }
}

impl Options {
    /// A batch norm layer as these options ask.
    fn batch_norm(&self) -> BatchNormalization {
        let bn = BatchNormalization::new();
        if self.sync_batch_norm {
            bn.synchronized()
        } else {
            bn
        }
    }
}

/// The model called `name`, not yet built; `None` for an unknown name.
pub fn by_name(name: &str, options: Options) -> Option<Network> {
    match name {
        "mlp" => Some(mlp_of(options.classes)),
        "cnn" => Some(cnn_of(options.classes)),
        "resnet20" => Some(resnet20(options)),
        "unet" => Some(unet(options)),
        "unet3d" => Some(unet3d(options)),
        "resnet50" => Some(resnet50(options)),
        _ => None,
    }
}

/// The CIFAR-style ResNet-20 of He et al. (2016) on 28x28x1 digits: a 3x3 convolution of
/// 16 filters, three stages of three basic blocks (16, 32 and 64 filters; the second and
/// third stages halve the resolution with a stride of 2, their first block's shortcut a
/// 1x1 convolution of stride 2 with batch norm), global average pooling and a softmax of
/// 10; every convolution `same`, without bias, followed by batch norm. 272,186 trainable
/// parameters.
pub fn resnet20(options: Options) -> Network {
    let bn = || options.batch_norm();
    let conv = conv_before_batch_norm;
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
    x = g.call(GlobalAveragePooling2D::default(), x);
    let y = g.call(Dense::new(options.classes, Activation::Softmax), x);
    Network::functional(g, y).expect("the graph's output is one of its layers")
}

/// A square `same` convolution of `stride` without bias (the batch norm after it has one):
/// the ResNets' convolution.
fn conv_before_batch_norm(filters: usize, kernel: usize, stride: usize) -> Conv2D {
    Conv2D::new(filters, [kernel, kernel], Activation::Linear)
        .strides([stride, stride])
        .padding(Padding::Same)
        .without_bias()
}

/// A small 2D U-Net (Ronneberger et al., 2015) for the 56x56 digit canvases: three levels
/// of two 3x3 `same` convolutions (16, 32, then 64 filters) each followed by 2x2 max
/// pooling, a bottleneck of two convolutions of 128 at 7x7, and a decoder that upsamples
/// by 2, concatenates the encoder's output of the same resolution (the skip connection)
/// and applies two convolutions (64, 32, then 16), ending in a 1x1 convolution to the 11
/// classes with a per-pixel softmax. Every 3x3 convolution is followed by batch norm and
/// relu. The three poolings give the bottleneck a receptive field of 68 pixels, more than
/// a digit's 28: which digit a pixel belongs to needs the whole digit. 487,883
/// parameters.
pub fn unet(options: Options) -> Network {
    let side = mirra_data::CANVAS;
    unet_of::<2>([side, side], &[16, 32, 64, 128], options)
}

/// The same U-Net in 3D (Cicek et al., 2016) for the 32x56x56 digit volumes: 3x3x3
/// convolutions of 8, 16, 32 and 64 filters (half the 2D net's, a 3D voxel costing three
/// times a pixel's taps), 2x2x2 pooling and upsampling, batch norm after each
/// convolution. 365,627 parameters.
pub fn unet3d(options: Options) -> Network {
    let side = mirra_data::CANVAS;
    unet_of::<3>(
        [mirra_data::VOLUME_DEPTH, side, side],
        &[8, 16, 32, 64],
        options,
    )
}

/// A U-Net over `D` spatial dimensions of size `input` (one channel), as Cicek et al.
/// (2016) build theirs: one level per entry of `filters` but the last, each two `same`
/// convolutions of 3 per dimension (the level's filters) followed by pooling of 2; a
/// bottleneck of two convolutions of the last entry; a decoder that upsamples by 2,
/// concatenates the encoder's output of the same resolution and applies two convolutions
/// per level; and a 1-wide convolution to the classes with a softmax. Each 3-wide
/// convolution has no bias and is followed by batch norm and relu.
fn unet_of<const D: usize>(input: [usize; D], filters: &[usize], options: Options) -> Network {
    let (&bottleneck, levels) = filters.split_last().expect("a bottleneck at least");
    let mut g = Graph::new();
    let conv_bn_relu = |g: &mut Graph, filters: usize, x: Symbol| {
        let conv = Conv::<D>::new(filters, [3; D], Activation::Linear)
            .padding(Padding::Same)
            .without_bias();
        let x = g.call(conv, x);
        let x = g.call(options.batch_norm(), x);
        g.call(Activation::Relu, x)
    };
    let mut x = g.input();
    let mut shape = input.to_vec();
    shape.push(1);
    x = g.call(Reshape::new(&shape), x);
    let mut skips = Vec::new();
    for &f in levels {
        x = conv_bn_relu(&mut g, f, x);
        x = conv_bn_relu(&mut g, f, x);
        skips.push(x);
        x = g.call(MaxPooling::<D>::new([2; D]), x);
    }
    x = conv_bn_relu(&mut g, bottleneck, x);
    x = conv_bn_relu(&mut g, bottleneck, x);
    for &f in levels.iter().rev() {
        x = g.call(UpSampling::<D>::new([2; D]), x);
        let skip = skips.pop().expect("one skip per level");
        x = g.merge(Concatenate::default(), &[x, skip]);
        x = conv_bn_relu(&mut g, f, x);
        x = conv_bn_relu(&mut g, f, x);
    }
    let y = g.call(
        Conv::<D>::new(mirra_data::CLASSES, [1; D], Activation::Softmax),
        x,
    );
    Network::functional(g, y).expect("the graph's output is one of its layers")
}

/// ResNet-50 (He et al., 2016), the seed's model, as torchvision's `resnet50` (v1.5: the
/// stride on each stage's 3x3 convolution): on 224x224x3 images, a 7x7 convolution of 64
/// with stride 2, batch norm, relu and 3x3 max pooling of stride 2; four stages of 3, 4,
/// 6 and 3 bottleneck blocks (1x1 convolution to 64, 128, 256 or 512 filters, 3x3, 1x1 to
/// four times as many, each with batch norm; the first block of each stage projects its
/// shortcut with a 1x1 convolution and batch norm); global average pooling and a softmax
/// of 1000. Convolutions without bias. 25,557,032 trainable parameters, torchvision's
/// count.
pub fn resnet50(options: Options) -> Network {
    let bn = || options.batch_norm();
    let conv = conv_before_batch_norm;
    let mut g = Graph::new();
    let mut x = g.input();
    x = g.call(conv(64, 7, 2), x);
    x = g.call(bn(), x);
    x = g.call(Activation::Relu, x);
    x = g.call(
        MaxPooling2D::new([3, 3])
            .strides([2, 2])
            .padding(Padding::Same),
        x,
    );
    for (stage, (blocks, width)) in [(3, 64), (4, 128), (6, 256), (3, 512)]
        .into_iter()
        .enumerate()
    {
        for block in 0..blocks {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let mut h = g.call(conv(width, 1, 1), x);
            h = g.call(bn(), h);
            h = g.call(Activation::Relu, h);
            h = g.call(conv(width, 3, stride), h);
            h = g.call(bn(), h);
            h = g.call(Activation::Relu, h);
            h = g.call(conv(4 * width, 1, 1), h);
            h = g.call(bn(), h);
            let shortcut = if block == 0 {
                let s = g.call(conv(4 * width, 1, stride), x);
                g.call(bn(), s)
            } else {
                x
            };
            x = g.merge(Add, &[h, shortcut]);
            x = g.call(Activation::Relu, x);
        }
    }
    x = g.call(GlobalAveragePooling2D::default(), x);
    let y = g.call(Dense::new(SYNTHETIC_CLASSES, Activation::Softmax), x);
    Network::functional(g, y).expect("the graph's output is one of its layers")
}

/// The MNIST CNN of Keras's example: Reshape to 28x28x1 -> Conv2D(32, 3x3, relu) ->
/// MaxPooling 2x2 -> Conv2D(64, 3x3, relu) -> MaxPooling 2x2 -> Flatten -> Dense(128, relu)
/// -> Dense(10, softmax); `valid` convolutions, 225,034 parameters.
pub fn cnn() -> Sequential {
    cnn_of(10)
}

/// [`cnn`] with `classes` outputs.
fn cnn_of(classes: usize) -> Sequential {
    Sequential::new(vec![
        Box::new(Reshape::new(&[28, 28, 1])),
        Box::new(Conv2D::new(32, [3, 3], Activation::Relu)),
        Box::new(MaxPooling2D::new([2, 2])),
        Box::new(Conv2D::new(64, [3, 3], Activation::Relu)),
        Box::new(MaxPooling2D::new([2, 2])),
        Box::new(Flatten),
        Box::new(Dense::new(128, Activation::Relu)),
        Box::new(Dense::new(classes, Activation::Softmax)),
    ])
}

/// The MNIST MLP of the reference recipe: Flatten -> Dense(128, relu) -> Dense(64, relu)
/// -> Dense(10, softmax).
pub fn mlp() -> Sequential {
    mlp_of(10)
}

/// [`mlp`] with `classes` outputs.
fn mlp_of(classes: usize) -> Sequential {
    Sequential::new(vec![
        Box::new(Flatten),
        Box::new(Dense::new(128, Activation::Relu)),
        Box::new(Dense::new(64, Activation::Relu)),
        Box::new(Dense::new(classes, Activation::Softmax)),
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

    /// The CI smoke of the U-Nets: their shapes, and a few Adam steps on one batch of
    /// canvases (volumes) lower the per-pixel (per-voxel) loss.
    #[test]
    fn the_unets_segment_canvases_and_volumes_and_learn_a_batch() {
        let digits = mirra_data::Mnist::bundled().unwrap().train;
        let canvases = mirra_data::digit_canvases(&digits, 8, 1).unwrap();
        let volumes = mirra_data::digit_volumes(&digits, 2, 1).unwrap();
        for (name, data, output, params) in [
            ("unet", canvases, vec![56, 56, 11], 487_883),
            ("unet3d", volumes, vec![32, 56, 56, 11], 365_627),
        ] {
            let mut net = by_name(name, Options::default()).unwrap();
            net.build(&input_shape(name), 3).unwrap();
            assert_eq!(net.output_shape(), output, "{name}");
            assert_eq!(net.num_params(), params, "{name}");
            let batch = mirra_data::pixels_to_unit_f32(vec![data.pixels, data.labels]).unwrap();
            let losses = losses_on_one_batch(net, 3e-3, 3, &batch[0], &batch[1]);
            assert!(losses[2] < losses[0], "{name}: {losses:?}");
        }
    }

    /// ResNet-50 has torchvision's shapes and parameter count (trainable: 25,557,032) and
    /// a batch norm after each of its 53 convolutions.
    #[test]
    fn resnet50_has_torchvision_s_size() {
        let mut net = resnet50(Options::default());
        net.build(&input_shape("resnet50"), 3).unwrap();
        assert_eq!(net.num_params(), 25_557_032);
        assert_eq!(net.output_shape(), [1000]);
        assert_eq!(net.state().len(), 2 * 53);
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
