//! Model profiles: per-layer parameter counts and backward times, and a forward time.
//!
//! A profile comes either from measured per-layer timings ([`ModelProfile::from_measured`],
//! as `Tape::backward_with` hands gradients out on the device at hand) or from a model's
//! architecture and a cited single-device throughput ([`ModelProfile::resnet50`]): the
//! step's compute time is `batch / images per second`, a third of it forward and two
//! thirds backward (the backward pass costs twice the forward: gradients with respect to
//! the inputs and to the weights, each a product as large as the forward's; Kaplan et al.
//! 2020, "Scaling Laws for Neural Language Models", section 2.1: `C = 6N` per token, `2N`
//! forward, `4N` backward), and each layer's share of the backward is its share of the
//! multiply-adds.

use crate::topology::DeviceModel;
use crate::{Result, ScalingError};

/// The model names [`ModelProfile::preset`] knows.
pub const MODELS: &[&str] = &["resnet50"];

/// The forward pass's share of a training step's compute (see the module docs).
pub const FORWARD_SHARE: f64 = 1.0 / 3.0;

/// Bytes of one gradient element all-reduced per parameter: f32, as DDP reduces the
/// gradients of f32 master weights in mixed precision.
pub const F32_BYTES: usize = 4;

/// A cited single-device training throughput.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throughput {
    /// Training images per second on one device.
    pub images_per_s: f64,
    /// Where the figure comes from.
    pub source: &'static str,
}

/// NVIDIA DeepLearningExamples, `PyTorch/Classification/ConvNets/resnet50v1.5/README.md`,
/// "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)": 1 GPU, mixed precision,
/// 1200 img/s (batch 256 per GPU, the script's default).
pub const V100_RESNET50: Throughput = Throughput {
    images_per_s: 1200.0,
    source: "NVIDIA DeepLearningExamples PyTorch ResNet50 v1.5 README, DGX-1 16GB, 1x V100, \
             mixed precision: 1200 img/s",
};

/// The same README, "Training performance: NVIDIA DGX A100 (8x A100 80GB)": 1 GPU, mixed
/// precision, 2470 img/s.
pub const A100_RESNET50: Throughput = Throughput {
    images_per_s: 2470.0,
    source: "NVIDIA DeepLearningExamples PyTorch ResNet50 v1.5 README, DGX A100 80GB, 1x A100, \
             mixed precision: 2470 img/s",
};

/// MLPerf Training v3.0, ResNet-50, Dell's two submissions with 16 GPUs and the same CPUs:
/// 16x H100-SXM5-80GB in 7.8 minutes, 16x A100-SXM-80GB in 14.4 minutes (MLCommons results,
/// as compared by silvertonconsulting.com, 2023-07-12).
pub const MLPERF_V3_H100_OVER_A100: f64 = 14.4 / 7.8;

/// H100: the A100 figure times the MLPerf H100/A100 ratio, 2470 x 1.85 = 4560 img/s (no
/// single-H100 figure of this benchmark is published; the ratio is from whole training runs
/// at 16 GPUs on both sides).
pub const H100_RESNET50: Throughput = Throughput {
    images_per_s: A100_RESNET50.images_per_s * MLPERF_V3_H100_OVER_A100,
    source: "A100 2470 img/s (NVIDIA DeepLearningExamples) x 14.4/7.8, the H100/A100 ratio of \
             MLPerf Training v3.0 ResNet-50 (Dell, 16 GPUs)",
};

/// The cited ResNet-50 training throughput of one `device`.
pub fn resnet50_throughput(device: DeviceModel) -> Result<Throughput> {
    match device {
        DeviceModel::V100Sxm2 => Ok(V100_RESNET50),
        DeviceModel::A100 => Ok(A100_RESNET50),
        DeviceModel::H100 => Ok(H100_RESNET50),
        DeviceModel::HostThread => Err(ScalingError::NoThroughputFigure {
            model: "resnet50".into(),
            device: device.name().into(),
        }),
    }
}

/// One layer (or group of tensors that become ready together).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerProfile {
    /// The layer's name.
    pub name: String,
    /// Trainable parameters (gradient elements).
    pub params: usize,
    /// Seconds its backward takes.
    pub backward_s: f64,
}

/// A model as the overlap simulation sees it: layers in forward order, their gradients
/// produced in reverse order by backward.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelProfile {
    /// The model's name.
    pub name: String,
    /// Samples per replica per step.
    pub batch: usize,
    /// Seconds of the forward pass (and everything before backward).
    pub forward_s: f64,
    /// The layers, in forward order.
    pub layers: Vec<LayerProfile>,
    /// Bytes all-reduced per parameter.
    pub bytes_per_param: usize,
    /// Where the times come from.
    pub source: String,
}

impl ModelProfile {
    /// A profile from measured timings: the forward time and each layer's backward time,
    /// layers in forward order. Rejects empty profiles, no parameters at all, a zero batch
    /// or gradient size, and times that are not finite and non-negative.
    pub fn from_measured(
        name: impl Into<String>,
        batch: usize,
        forward_s: f64,
        layers: Vec<LayerProfile>,
        bytes_per_param: usize,
        source: impl Into<String>,
    ) -> Result<Self> {
        let name = name.into();
        let bad = |reason: String| ScalingError::InvalidProfile {
            model: name.clone(),
            reason,
        };
        let time_ok = |t: f64| t.is_finite() && t >= 0.0;
        if layers.is_empty() {
            return Err(bad("no layers".into()));
        }
        if layers.iter().all(|l| l.params == 0) {
            return Err(bad("no parameters".into()));
        }
        if batch == 0 || bytes_per_param == 0 {
            return Err(bad(
                "batch and bytes per parameter must be at least 1".into()
            ));
        }
        if !time_ok(forward_s) {
            return Err(bad(format!("forward time {forward_s} s")));
        }
        if let Some(l) = layers.iter().find(|l| !time_ok(l.backward_s)) {
            return Err(bad(format!(
                "layer `{}`: backward time {} s",
                l.name, l.backward_s
            )));
        }
        Ok(ModelProfile {
            name,
            batch,
            forward_s,
            layers,
            bytes_per_param,
            source: source.into(),
        })
    }

    /// A model of [`MODELS`] on `device` with `batch` samples per replica, timed from the
    /// device's cited throughput.
    pub fn preset(name: &str, device: DeviceModel, batch: usize) -> Result<Self> {
        match name {
            "resnet50" => {
                let t = resnet50_throughput(device)?;
                ModelProfile::resnet50(t.images_per_s, batch, t.source)
            }
            _ => Err(ScalingError::UnknownModel {
                name: name.to_string(),
                known: MODELS.join(", "),
            }),
        }
    }

    /// ResNet-50 v1.5 (torchvision's layout, 25,557,032 parameters) at `images_per_s` on
    /// one device: each convolution with its batch norm, and the classifier, is a layer;
    /// backward time is split by multiply-adds at 224x224.
    pub fn resnet50(images_per_s: f64, batch: usize, source: impl Into<String>) -> Result<Self> {
        if !(images_per_s.is_finite() && images_per_s > 0.0) {
            return Err(ScalingError::InvalidProfile {
                model: "resnet50".into(),
                reason: format!("throughput {images_per_s} img/s"),
            });
        }
        let compute_s = batch as f64 / images_per_s;
        let backward_s = compute_s * (1.0 - FORWARD_SHARE);
        let shape = resnet50_layers();
        let total_macs: f64 = shape.iter().map(|l| l.macs).sum();
        let layers = shape
            .into_iter()
            .map(|l| LayerProfile {
                name: l.name,
                params: l.params,
                backward_s: backward_s * l.macs / total_macs,
            })
            .collect();
        ModelProfile::from_measured(
            "resnet50",
            batch,
            compute_s * FORWARD_SHARE,
            layers,
            F32_BYTES,
            source,
        )
    }

    /// Trainable parameters.
    pub fn params(&self) -> usize {
        self.layers.iter().map(|l| l.params).sum()
    }

    /// Bytes of gradients all-reduced per step.
    pub fn gradient_bytes(&self) -> usize {
        self.params() * self.bytes_per_param
    }

    /// Seconds of backward.
    pub fn backward_s(&self) -> f64 {
        self.layers.iter().map(|l| l.backward_s).sum()
    }

    /// Seconds of compute per step on one replica (forward and backward).
    pub fn compute_s(&self) -> f64 {
        self.forward_s + self.backward_s()
    }
}

/// A layer's shape: parameters and multiply-adds per image.
struct LayerShape {
    name: String,
    params: usize,
    macs: f64,
}

/// A convolution (no bias) followed by batch norm (scale and shift per channel): `k x k`
/// kernel, `cin -> cout` channels, `out x out` output pixels.
fn conv_bn(name: String, k: usize, cin: usize, cout: usize, out: usize) -> LayerShape {
    LayerShape {
        name,
        params: k * k * cin * cout + 2 * cout,
        macs: (k * k * cin * cout * out * out) as f64,
    }
}

/// ResNet-50 v1.5 (He et al. 2016, with the stride of each downsampling bottleneck on its
/// 3x3 convolution, as torchvision): a 7x7 stem to 112x112, then four stages of bottleneck
/// blocks (3, 4, 6, 3) at 56, 28, 14 and 7 pixels, then a 2048 -> 1000 classifier.
fn resnet50_layers() -> Vec<LayerShape> {
    let mut layers = vec![conv_bn("conv1".into(), 7, 3, 64, 112)];
    let mut cin = 64;
    let mut side = 56;
    for (stage, (blocks, mid)) in [(3, 64), (4, 128), (6, 256), (3, 512)]
        .into_iter()
        .enumerate()
    {
        let cout = 4 * mid;
        for b in 0..blocks {
            let stride = if stage > 0 && b == 0 { 2 } else { 1 };
            let out = side / stride;
            let name = |part: &str| format!("layer{}.{b}.{part}", stage + 1);
            layers.push(conv_bn(name("conv1"), 1, cin, mid, side));
            layers.push(conv_bn(name("conv2"), 3, mid, mid, out));
            layers.push(conv_bn(name("conv3"), 1, mid, cout, out));
            if b == 0 {
                layers.push(conv_bn(name("downsample"), 1, cin, cout, out));
            }
            cin = cout;
            side = out;
        }
    }
    layers.push(LayerShape {
        name: "fc".into(),
        params: 2048 * 1000 + 1000,
        macs: (2048 * 1000) as f64,
    });
    layers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet50_has_its_architectures_parameters_and_flops() {
        let m = ModelProfile::preset("resnet50", DeviceModel::V100Sxm2, 128).unwrap();
        // torchvision's resnet50: 25,557,032 parameters.
        assert_eq!(m.params(), 25_557_032);
        assert_eq!(m.gradient_bytes(), 102_228_128);
        assert_eq!(m.layers.len(), 54);
        assert_eq!(
            (m.layers[0].name.as_str(), m.layers[53].name.as_str()),
            ("conv1", "fc")
        );
        // About 4.1 G multiply-adds per image (He et al. report 3.8 G for v1; v1.5 moves
        // the stride later and costs more).
        let macs: f64 = resnet50_layers().iter().map(|l| l.macs).sum();
        assert!((4.0e9..4.2e9).contains(&macs), "{macs}");
        // 128 images at 1200 img/s: 106.7 ms, a third forward.
        let step = 128.0 / 1200.0;
        assert!((m.compute_s() - step).abs() < 1e-12);
        assert!((m.forward_s - step / 3.0).abs() < 1e-12);
        assert!(m.source.contains("1200 img/s"));
    }

    #[test]
    fn every_device_with_a_figure_has_a_resnet50_profile() {
        let h100 = ModelProfile::preset("resnet50", DeviceModel::H100, 256).unwrap();
        let a100 = ModelProfile::preset("resnet50", DeviceModel::A100, 256).unwrap();
        let ratio = a100.compute_s() / h100.compute_s();
        assert!((ratio - 14.4 / 7.8).abs() < 1e-12);
        let e = ModelProfile::preset("resnet50", DeviceModel::HostThread, 8).unwrap_err();
        assert!(matches!(e, ScalingError::NoThroughputFigure { .. }), "{e}");
        let e = ModelProfile::preset("bert", DeviceModel::H100, 8).unwrap_err();
        assert_eq!(e.to_string(), "unknown model `bert`; known: resnet50");
    }

    #[test]
    fn measured_profiles_are_checked() {
        let layer = |params, backward_s| LayerProfile {
            name: "dense".into(),
            params,
            backward_s,
        };
        let ok = ModelProfile::from_measured("mlp", 64, 0.001, vec![layer(10, 0.002)], 4, "test");
        assert_eq!(ok.unwrap().compute_s(), 0.003);
        for (batch, fwd, layers, bpp) in [
            (64, 0.001, vec![], 4),
            (64, 0.001, vec![layer(0, 0.1)], 4),
            (0, 0.001, vec![layer(1, 0.1)], 4),
            (64, 0.001, vec![layer(1, 0.1)], 0),
            (64, -1.0, vec![layer(1, 0.1)], 4),
            (64, 0.001, vec![layer(1, f64::NAN)], 4),
        ] {
            let e = ModelProfile::from_measured("mlp", batch, fwd, layers, bpp, "t").unwrap_err();
            assert!(matches!(e, ScalingError::InvalidProfile { .. }), "{e}");
        }
        assert!(ModelProfile::resnet50(0.0, 8, "nothing").is_err());
    }
}
