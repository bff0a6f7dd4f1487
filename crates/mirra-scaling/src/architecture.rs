//! Network architectures as the scaling model needs them: in forward order, each layer's
//! trainable parameters and multiply-adds per sample. A profile ([`crate::profile`]) turns
//! them into per-layer backward times by sharing a measured step time out by multiply-adds.
//!
//! Each network is built from its published layout, so its parameter count is a test: the
//! count torchvision prints for the same network (`sum(p.numel() for p in m.parameters())`).

/// A layer's shape: parameters and multiply-adds per sample.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerShape {
    /// The layer's name (torchvision's where there is one).
    pub name: String,
    /// Trainable parameters.
    pub params: usize,
    /// Multiply-adds of the forward pass, per sample.
    pub macs: f64,
}

/// The networks [`shape`] knows.
pub const NETWORKS: &[&str] = &[
    "resnet50",
    "resnet101",
    "resnet152",
    "vgg16",
    "inception3",
    "unet3d",
    "mnist-cnn",
];

/// The layers of a network of [`NETWORKS`], in forward order.
pub fn shape(name: &str) -> Option<Vec<LayerShape>> {
    Some(match name {
        "resnet50" => resnet(&[3, 4, 6, 3]),
        "resnet101" => resnet(&[3, 4, 23, 3]),
        "resnet152" => resnet(&[3, 8, 36, 3]),
        "vgg16" => vgg16(),
        "inception3" => inception3(),
        "unet3d" => unet3d(),
        "mnist-cnn" => mnist_cnn(),
        _ => return None,
    })
}

/// Multiply-adds of a whole network per sample.
pub fn total_macs(layers: &[LayerShape]) -> f64 {
    layers.iter().map(|l| l.macs).sum()
}

/// Trainable parameters of a whole network.
pub fn total_params(layers: &[LayerShape]) -> usize {
    layers.iter().map(|l| l.params).sum()
}

/// A 2-D convolution without bias followed by batch norm (a scale and a shift per channel):
/// a `kh x kw` kernel, `cin -> cout` channels, `out_h x out_w` output pixels.
fn conv_bn(
    name: String,
    (kh, kw): (usize, usize),
    cin: usize,
    cout: usize,
    out: (usize, usize),
) -> LayerShape {
    LayerShape {
        name,
        params: kh * kw * cin * cout + 2 * cout,
        macs: (kh * kw * cin * cout * out.0 * out.1) as f64,
    }
}

/// A square [`conv_bn`].
fn conv_bn_sq(name: String, k: usize, cin: usize, cout: usize, out: usize) -> LayerShape {
    conv_bn(name, (k, k), cin, cout, (out, out))
}

/// A layer with a weight and a bias (fully connected, or a convolution with bias):
/// `fan_in x cout` weights over `positions` output positions.
fn with_bias(name: &str, fan_in: usize, cout: usize, positions: usize) -> LayerShape {
    LayerShape {
        name: name.into(),
        params: fan_in * cout + cout,
        macs: (fan_in * cout * positions) as f64,
    }
}

/// ResNet v1.5 with `blocks` bottleneck blocks per stage (He et al. 2016, with the stride of
/// each downsampling bottleneck on its 3x3 convolution, as torchvision): a 7x7 stem to
/// 112x112, four stages at 56, 28, 14 and 7 pixels, a 2048 -> 1000 classifier. ResNet-50 is
/// `[3, 4, 6, 3]` (25,557,032 parameters), ResNet-101 `[3, 4, 23, 3]` (44,549,160),
/// ResNet-152 `[3, 8, 36, 3]` (60,192,808).
fn resnet(blocks: &[usize; 4]) -> Vec<LayerShape> {
    let mut layers = vec![conv_bn_sq("conv1".into(), 7, 3, 64, 112)];
    let mut cin = 64;
    let mut side = 56;
    for (stage, (&count, mid)) in blocks.iter().zip([64, 128, 256, 512]).enumerate() {
        let cout = 4 * mid;
        for b in 0..count {
            let stride = if stage > 0 && b == 0 { 2 } else { 1 };
            let out = side / stride;
            let name = |part: &str| format!("layer{}.{b}.{part}", stage + 1);
            layers.push(conv_bn_sq(name("conv1"), 1, cin, mid, side));
            layers.push(conv_bn_sq(name("conv2"), 3, mid, mid, out));
            layers.push(conv_bn_sq(name("conv3"), 1, mid, cout, out));
            if b == 0 {
                layers.push(conv_bn_sq(name("downsample"), 1, cin, cout, out));
            }
            cin = cout;
            side = out;
        }
    }
    layers.push(with_bias("fc", 2048, 1000, 1));
    layers
}

/// VGG-16 (Simonyan and Zisserman 2015, configuration D): thirteen 3x3 convolutions with
/// bias in five stages of 224, 112, 56, 28 and 14 pixels, then 25088 -> 4096 -> 4096 ->
/// 1000 (torchvision `vgg16`: 138,357,544 parameters).
fn vgg16() -> Vec<LayerShape> {
    let mut layers = vec![];
    let mut cin = 3;
    let mut side = 224;
    for (stage, (convs, cout)) in [(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)]
        .into_iter()
        .enumerate()
    {
        for c in 0..convs {
            let name = format!("conv{}_{}", stage + 1, c + 1);
            layers.push(with_bias(&name, 9 * cin, cout, side * side));
            cin = cout;
        }
        side /= 2;
    }
    layers.push(with_bias("fc6", 512 * 7 * 7, 4096, 1));
    layers.push(with_bias("fc7", 4096, 4096, 1));
    layers.push(with_bias("fc8", 4096, 1000, 1));
    layers
}

/// Inception v3 (Szegedy et al. 2016) at 299x299 as torchvision builds it, without the
/// auxiliary classifier (which tf_cnn_benchmarks' `inception3` does not train either):
/// 23,834,568 parameters (torchvision's 27,161,264 less the auxiliary head's 3,326,696).
fn inception3() -> Vec<LayerShape> {
    let mut l = vec![
        conv_bn_sq("Conv2d_1a_3x3".into(), 3, 3, 32, 149),
        conv_bn_sq("Conv2d_2a_3x3".into(), 3, 32, 32, 147),
        conv_bn_sq("Conv2d_2b_3x3".into(), 3, 32, 64, 147),
        conv_bn_sq("Conv2d_3b_1x1".into(), 1, 64, 80, 73),
        conv_bn_sq("Conv2d_4a_3x3".into(), 3, 80, 192, 71),
    ];
    // 35x35: InceptionA.
    let mut cin = 192;
    for (block, pool) in [("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)] {
        let n = |part: &str| format!("{block}.{part}");
        let s = 35;
        l.push(conv_bn_sq(n("branch1x1"), 1, cin, 64, s));
        l.push(conv_bn_sq(n("branch5x5_1"), 1, cin, 48, s));
        l.push(conv_bn_sq(n("branch5x5_2"), 5, 48, 64, s));
        l.push(conv_bn_sq(n("branch3x3dbl_1"), 1, cin, 64, s));
        l.push(conv_bn_sq(n("branch3x3dbl_2"), 3, 64, 96, s));
        l.push(conv_bn_sq(n("branch3x3dbl_3"), 3, 96, 96, s));
        l.push(conv_bn_sq(n("branch_pool"), 1, cin, pool, s));
        cin = 64 + 64 + 96 + pool;
    }
    // InceptionB: 35 -> 17.
    l.push(conv_bn_sq("Mixed_6a.branch3x3".into(), 3, cin, 384, 17));
    l.push(conv_bn_sq("Mixed_6a.branch3x3dbl_1".into(), 1, cin, 64, 35));
    l.push(conv_bn_sq("Mixed_6a.branch3x3dbl_2".into(), 3, 64, 96, 35));
    l.push(conv_bn_sq("Mixed_6a.branch3x3dbl_3".into(), 3, 96, 96, 17));
    let cin = 384 + 96 + cin;
    // 17x17: InceptionC, factorised 7x7 convolutions.
    for (block, c7) in [
        ("Mixed_6b", 128),
        ("Mixed_6c", 160),
        ("Mixed_6d", 160),
        ("Mixed_6e", 192),
    ] {
        let n = |part: &str| format!("{block}.{part}");
        let s = (17, 17);
        l.push(conv_bn(n("branch1x1"), (1, 1), cin, 192, s));
        l.push(conv_bn(n("branch7x7_1"), (1, 1), cin, c7, s));
        l.push(conv_bn(n("branch7x7_2"), (1, 7), c7, c7, s));
        l.push(conv_bn(n("branch7x7_3"), (7, 1), c7, 192, s));
        l.push(conv_bn(n("branch7x7dbl_1"), (1, 1), cin, c7, s));
        l.push(conv_bn(n("branch7x7dbl_2"), (7, 1), c7, c7, s));
        l.push(conv_bn(n("branch7x7dbl_3"), (1, 7), c7, c7, s));
        l.push(conv_bn(n("branch7x7dbl_4"), (7, 1), c7, c7, s));
        l.push(conv_bn(n("branch7x7dbl_5"), (1, 7), c7, 192, s));
        l.push(conv_bn(n("branch_pool"), (1, 1), cin, 192, s));
    }
    // InceptionD: 17 -> 8.
    let n = |part: &str| format!("Mixed_7a.{part}");
    l.push(conv_bn_sq(n("branch3x3_1"), 1, cin, 192, 17));
    l.push(conv_bn_sq(n("branch3x3_2"), 3, 192, 320, 8));
    l.push(conv_bn_sq(n("branch7x7x3_1"), 1, cin, 192, 17));
    l.push(conv_bn(n("branch7x7x3_2"), (1, 7), 192, 192, (17, 17)));
    l.push(conv_bn(n("branch7x7x3_3"), (7, 1), 192, 192, (17, 17)));
    l.push(conv_bn_sq(n("branch7x7x3_4"), 3, 192, 192, 8));
    let mut cin = 320 + 192 + cin;
    // 8x8: InceptionE, expanded filter banks.
    for block in ["Mixed_7b", "Mixed_7c"] {
        let n = |part: &str| format!("{block}.{part}");
        let s = (8, 8);
        l.push(conv_bn(n("branch1x1"), (1, 1), cin, 320, s));
        l.push(conv_bn(n("branch3x3_1"), (1, 1), cin, 384, s));
        l.push(conv_bn(n("branch3x3_2a"), (1, 3), 384, 384, s));
        l.push(conv_bn(n("branch3x3_2b"), (3, 1), 384, 384, s));
        l.push(conv_bn(n("branch3x3dbl_1"), (1, 1), cin, 448, s));
        l.push(conv_bn(n("branch3x3dbl_2"), (3, 3), 448, 384, s));
        l.push(conv_bn(n("branch3x3dbl_3a"), (1, 3), 384, 384, s));
        l.push(conv_bn(n("branch3x3dbl_3b"), (3, 1), 384, 384, s));
        l.push(conv_bn(n("branch_pool"), (1, 1), cin, 192, s));
        cin = 320 + 2 * 384 + 2 * 384 + 192;
    }
    l.push(with_bias("fc", cin, 1000, 1));
    l
}

/// A 3-D convolution without bias followed by instance norm (a scale and a shift per
/// channel): a `k^3` kernel, `cin -> cout` channels, `out^3` output voxels.
fn conv3d_norm(name: String, k: usize, cin: usize, cout: usize, out: usize) -> LayerShape {
    LayerShape {
        name,
        params: k * k * k * cin * cout + 2 * cout,
        macs: (k * k * k * cin * cout) as f64 * (out * out * out) as f64,
    }
}

/// The 3-D U-Net of NVIDIA DeepLearningExamples' nnU-Net for BraTS (task 01, `--dim 3`):
/// 4 input channels, 128^3 patches, six levels of 32, 64, 128, 256, 320 and 320 filters
/// (nnU-Net's cap), each level two 3x3x3 convolutions with instance norm (the first of a
/// level with stride 2), a transposed 2x2x2 convolution up and two convolutions on the
/// concatenated skip per decoder level, and a 1x1x1 head to 4 classes. Deep supervision's
/// extra heads are left out (a few hundred parameters).
fn unet3d() -> Vec<LayerShape> {
    const FILTERS: [usize; 6] = [32, 64, 128, 256, 320, 320];
    let mut l = vec![];
    let mut cin = 4;
    let mut side = 128;
    for (level, &f) in FILTERS.iter().enumerate() {
        if level > 0 {
            side /= 2;
        }
        l.push(conv3d_norm(
            format!("encoder{level}.conv1"),
            3,
            cin,
            f,
            side,
        ));
        l.push(conv3d_norm(format!("encoder{level}.conv2"), 3, f, f, side));
        cin = f;
    }
    for level in (0..FILTERS.len() - 1).rev() {
        let f = FILTERS[level];
        side *= 2;
        // Transposed 2x2x2 convolution with bias: each output voxel takes one kernel tap.
        l.push(LayerShape {
            name: format!("decoder{level}.up"),
            params: 8 * cin * f + f,
            macs: (cin * f) as f64 * (side * side * side) as f64,
        });
        l.push(conv3d_norm(
            format!("decoder{level}.conv1"),
            3,
            2 * f,
            f,
            side,
        ));
        l.push(conv3d_norm(format!("decoder{level}.conv2"), 3, f, f, side));
        cin = f;
    }
    l.push(with_bias("output", cin, 4, side * side * side));
    l
}

/// The MNIST network of tensorflow/tensorflow issue 35095: a 7x7 convolution to 48 filters
/// (22x22), 2x2 max pooling, a dense layer of 24 and one of 10 (Keras: 142,066 parameters).
fn mnist_cnn() -> Vec<LayerShape> {
    vec![
        with_bias("conv2d", 7 * 7, 48, 22 * 22),
        with_bias("dense", 11 * 11 * 48, 24, 1),
        with_bias("dense_1", 24, 10, 1),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_are_torchvisions() {
        // Each count is what torchvision (Keras for the MNIST network) reports; a layer
        // missing or mis-sized changes it.
        for (name, params) in [
            ("resnet50", 25_557_032),
            ("resnet101", 44_549_160),
            ("resnet152", 60_192_808),
            ("vgg16", 138_357_544),
            ("inception3", 23_834_568),
            ("mnist-cnn", 142_066),
        ] {
            let layers = shape(name).unwrap();
            assert_eq!(total_params(&layers), params, "{name}");
            assert!(
                layers.iter().all(|l| l.params > 0 && l.macs > 0.0),
                "{name}"
            );
        }
        assert!(shape("alexnet").is_none());
        assert!(NETWORKS.iter().all(|n| shape(n).is_some()));
    }

    #[test]
    fn multiply_adds_are_the_published_ones() {
        let gmacs = |name: &str| total_macs(&shape(name).unwrap()) / 1e9;
        // ResNet-50 v1.5: 4.1 G (v1's 3.8 G with the stride moved later); ResNet-101 v1.5
        // 7.8 G; VGG-16 15.5 G; Inception v3 5.7 G (Szegedy et al.: "5 billion").
        for (name, lo, hi) in [
            ("resnet50", 4.0, 4.2),
            ("resnet101", 7.7, 7.9),
            ("vgg16", 15.4, 15.6),
            ("inception3", 5.6, 5.8),
        ] {
            let g = gmacs(name);
            assert!((lo..hi).contains(&g), "{name}: {g} G multiply-adds");
        }
        // The 3-D U-Net: most of its multiply-adds at full resolution, most of its
        // parameters at the bottom.
        let u = shape("unet3d").unwrap();
        assert_eq!(u.len(), 6 * 2 + 5 * 3 + 1);
        assert_eq!(
            (u[0].name.as_str(), u[0].params),
            ("encoder0.conv1", 27 * 4 * 32 + 64)
        );
        let deep: usize = u
            .iter()
            .filter(|l| l.name.contains('4') || l.name.contains('5'))
            .map(|l| l.params)
            .sum();
        assert!(deep * 2 > total_params(&u));
    }
}
