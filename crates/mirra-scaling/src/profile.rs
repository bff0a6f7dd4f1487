//! Model profiles: per-layer parameter counts and backward times, a forward time, and the
//! time after backward that nothing overlaps (the optimizer step).
//!
//! A profile comes either from measured per-layer timings ([`ModelProfile::from_measured`],
//! as `Tape::backward_with` hands gradients out on the device at hand) or from a network's
//! architecture ([`crate::architecture`]) and a cited single-device throughput
//! ([`ModelProfile::preset`]): the step's compute time is `batch / samples per second`, a
//! third of it forward and two thirds backward (the backward pass costs twice the forward:
//! gradients with respect to the inputs and to the weights, each a product as large as the
//! forward's; Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1:
//! `C = 6N` per token, `2N` forward, `4N` backward), and each layer's share of the backward
//! is its share of the multiply-adds.

use crate::architecture::{self, LayerShape};
use crate::topology::DeviceModel;
use crate::{Result, ScalingError};

/// The model names [`ModelProfile::preset`] knows.
pub const MODELS: &[&str] = architecture::NETWORKS;

/// The forward pass's share of a training step's compute (see the module docs).
pub const FORWARD_SHARE: f64 = 1.0 / 3.0;

/// Bytes of one gradient element all-reduced per parameter: f32, as DDP reduces the
/// gradients of f32 master weights in mixed precision.
pub const F32_BYTES: usize = 4;

/// A cited single-device training throughput.
#[derive(Clone, Debug, PartialEq)]
pub struct Throughput {
    /// Training samples per second on one device.
    pub samples_per_s: f64,
    /// Where the figure comes from (and how it was derived, if it was).
    pub source: String,
}

/// NVIDIA DeepLearningExamples, `PyTorch/Classification/ConvNets/resnet50v1.5/README.md`,
/// "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)": 1 GPU, mixed precision,
/// 1200 img/s (batch 256 per GPU, the script's default).
pub const V100_RESNET50_IMG_S: f64 = 1200.0;

/// The same README, "Training performance: NVIDIA DGX A100 (8x A100 80GB)": 1 GPU, mixed
/// precision, 2470 img/s.
pub const A100_RESNET50_IMG_S: f64 = 2470.0;

/// MLPerf Training v3.0, ResNet-50, Dell's two submissions with 16 GPUs and the same CPUs:
/// 16x H100-SXM5-80GB in 7.8 minutes, 16x A100-SXM-80GB in 14.4 minutes (MLCommons results,
/// as compared by silvertonconsulting.com, 2023-07-12).
pub const MLPERF_V3_H100_OVER_A100: f64 = 14.4 / 7.8;

/// TensorFlow's benchmarks of May 2017 (tensorflow/docs `site/en/r1/guide/performance/
/// benchmarks.md`, "Details for NVIDIA DGX-1 (NVIDIA Tesla P100)", training synthetic data,
/// 1 GPU, batch 64 per GPU, tf_cnn_benchmarks): InceptionV3 142 img/s.
pub const P100_INCEPTION3_IMG_S: f64 = 142.0;

/// The same table: ResNet-152 91.8 img/s (it has no ResNet-101 column).
pub const P100_RESNET152_IMG_S: f64 = 91.8;

/// The same table: VGG16 154 img/s.
pub const P100_VGG16_IMG_S: f64 = 154.0;

/// NVIDIA DeepLearningExamples, `PyTorch/Segmentation/nnUNet/README.md`, "Training
/// performance: NVIDIA DGX A100 (8x A100 80GB)": 3-D U-Net, 1 GPU, batch 2, mixed
/// precision, 6.74 volumes/s (128^3 patches of 4 channels).
pub const A100_UNET3D_VOL_S: f64 = 6.74;

/// Dense FP16 tensor throughput, TFLOPS: RTX A6000 154.8 (NVIDIA RTX A6000 datasheet:
/// 309.7 with sparsity) over A100 312 (NVIDIA A100 datasheet, dense).
pub const A6000_OVER_A100_TENSOR: f64 = 154.8 / 312.0;

/// Peak FP32 rate of a GTX 1080 Ti: 3584 CUDA cores x 2 FLOP x 1.582 GHz boost = 11.34
/// TFLOPS (NVIDIA GeForce GTX 1080 Ti specifications).
pub const GTX1080TI_PEAK_FLOPS: f64 = 3584.0 * 2.0 * 1.582e9;

fn figure(samples_per_s: f64, source: impl Into<String>) -> Throughput {
    Throughput {
        samples_per_s,
        source: source.into(),
    }
}

/// The cited training throughput of `model` (a network of [`MODELS`]) on one `device`.
pub fn throughput(model: &str, device: DeviceModel) -> Result<Throughput> {
    let macs =
        |name: &str| architecture::shape(name).map_or(f64::NAN, |l| architecture::total_macs(&l));
    let dle = "NVIDIA DeepLearningExamples PyTorch ResNet50 v1.5 README";
    let tf2017 = "TensorFlow benchmarks (May 2017), DGX-1 P100, 1 GPU, batch 64, synthetic";
    Ok(match (model, device) {
        ("resnet50", DeviceModel::V100Sxm2) => figure(
            V100_RESNET50_IMG_S,
            format!("{dle}, DGX-1 16GB, 1x V100, mixed precision: 1200 img/s"),
        ),
        ("resnet50", DeviceModel::A100) => figure(
            A100_RESNET50_IMG_S,
            format!("{dle}, DGX A100 80GB, 1x A100, mixed precision: 2470 img/s"),
        ),
        ("resnet50", DeviceModel::H100) => figure(
            A100_RESNET50_IMG_S * MLPERF_V3_H100_OVER_A100,
            "A100 2470 img/s (NVIDIA DeepLearningExamples) x 14.4/7.8, the H100/A100 ratio of \
             MLPerf Training v3.0 ResNet-50 (Dell, 16 GPUs)",
        ),
        ("inception3", DeviceModel::P100) => figure(
            P100_INCEPTION3_IMG_S,
            format!("{tf2017}: InceptionV3 142 img/s"),
        ),
        ("vgg16", DeviceModel::P100) => {
            figure(P100_VGG16_IMG_S, format!("{tf2017}: VGG16 154 img/s"))
        }
        ("resnet101", DeviceModel::P100) => {
            let ratio = macs("resnet152") / macs("resnet101");
            figure(
                P100_RESNET152_IMG_S * ratio,
                format!(
                    "{tf2017}: ResNet-152 91.8 img/s x {ratio:.3}, ResNet-152's multiply-adds \
                     over ResNet-101's (the table has no ResNet-101)"
                ),
            )
        }
        ("unet3d", DeviceModel::RtxA6000) => figure(
            A100_UNET3D_VOL_S * A6000_OVER_A100_TENSOR,
            "NVIDIA DeepLearningExamples nnU-Net README, 1x A100 80GB, 3-D, batch 2, mixed \
             precision: 6.74 vol/s, x 154.8/312 (dense FP16 tensor TFLOPS, RTX A6000 over A100)",
        ),
        ("mnist-cnn", DeviceModel::Gtx1080Ti) => figure(
            GTX1080TI_PEAK_FLOPS / (6.0 * macs("mnist-cnn")),
            "the GTX 1080 Ti's peak 11.34 FP32 TFLOPS over 6 FLOP per multiply-add of a \
             training step (forward, two backward products): the fastest this network can \
             train on it",
        ),
        _ => {
            return Err(ScalingError::NoThroughputFigure {
                model: model.into(),
                device: device.name().into(),
            })
        }
    })
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
    /// Seconds after backward that no all-reduce overlaps (the optimizer step); 0 for
    /// profiles from a throughput, which count it in forward and backward.
    pub update_s: f64,
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
            update_s: 0.0,
            layers,
            bytes_per_param,
            source: source.into(),
        })
    }

    /// This profile with `update_s` seconds after backward (a measured optimizer step);
    /// a time that is not finite and non-negative is an error.
    pub fn with_update(mut self, update_s: f64) -> Result<Self> {
        if !(update_s.is_finite() && update_s >= 0.0) {
            return Err(ScalingError::InvalidProfile {
                model: self.name,
                reason: format!("update time {update_s} s"),
            });
        }
        self.update_s = update_s;
        Ok(self)
    }

    /// A network of [`MODELS`] on `device` with `batch` samples per replica, timed from the
    /// device's cited throughput ([`throughput`]).
    pub fn preset(name: &str, device: DeviceModel, batch: usize) -> Result<Self> {
        let Some(shape) = architecture::shape(name) else {
            return Err(ScalingError::UnknownModel {
                name: name.to_string(),
                known: MODELS.join(", "),
            });
        };
        let t = throughput(name, device)?;
        ModelProfile::from_architecture(name, &shape, t.samples_per_s, batch, t.source)
    }

    /// A network of layers `shape` at `samples_per_s` on one device: compute per step is
    /// `batch / samples_per_s`, a third forward, and the backward shared out by
    /// multiply-adds; gradients in f32.
    pub fn from_architecture(
        name: &str,
        shape: &[LayerShape],
        samples_per_s: f64,
        batch: usize,
        source: impl Into<String>,
    ) -> Result<Self> {
        if !(samples_per_s.is_finite() && samples_per_s > 0.0) {
            return Err(ScalingError::InvalidProfile {
                model: name.into(),
                reason: format!("throughput {samples_per_s} samples/s"),
            });
        }
        let compute_s = batch as f64 / samples_per_s;
        let backward_s = compute_s * (1.0 - FORWARD_SHARE);
        let total_macs = architecture::total_macs(shape);
        let layers = shape
            .iter()
            .map(|l| LayerProfile {
                name: l.name.clone(),
                params: l.params,
                backward_s: backward_s * l.macs / total_macs,
            })
            .collect();
        ModelProfile::from_measured(
            name,
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

    /// Seconds of compute per step on one replica (forward, backward and the update).
    pub fn compute_s(&self) -> f64 {
        self.forward_s + self.backward_s() + self.update_s
    }
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
        // 128 images at 1200 img/s: 106.7 ms, a third forward.
        let step = 128.0 / 1200.0;
        assert!((m.compute_s() - step).abs() < 1e-12);
        assert!((m.forward_s - step / 3.0).abs() < 1e-12);
        assert!(m.source.contains("1200 img/s"));
    }

    #[test]
    fn every_cited_figure_gives_a_profile_and_the_others_are_errors() {
        let h100 = ModelProfile::preset("resnet50", DeviceModel::H100, 256).unwrap();
        let a100 = ModelProfile::preset("resnet50", DeviceModel::A100, 256).unwrap();
        let ratio = a100.compute_s() / h100.compute_s();
        assert!((ratio - 14.4 / 7.8).abs() < 1e-12);
        let e = ModelProfile::preset("resnet50", DeviceModel::HostThread, 8).unwrap_err();
        assert!(matches!(e, ScalingError::NoThroughputFigure { .. }), "{e}");
        let e = ModelProfile::preset("bert", DeviceModel::H100, 8).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("unknown model `bert`; known: resnet50, "));
        for (model, device) in [
            ("resnet101", DeviceModel::P100),
            ("inception3", DeviceModel::P100),
            ("vgg16", DeviceModel::P100),
            ("unet3d", DeviceModel::RtxA6000),
            ("mnist-cnn", DeviceModel::Gtx1080Ti),
        ] {
            let p = ModelProfile::preset(model, device, 2).unwrap();
            assert!(p.compute_s() > 0.0 && p.compute_s().is_finite(), "{model}");
            assert_eq!(p.update_s, 0.0);
        }
        // ResNet-101 on a P100: between the table's ResNet-50 (219 img/s) and ResNet-152.
        let r101 = throughput("resnet101", DeviceModel::P100).unwrap();
        assert!(
            (P100_RESNET152_IMG_S..219.0).contains(&r101.samples_per_s),
            "{r101:?}"
        );
        // The 3-D U-Net on an A6000: half an A100's 6.74 volumes/s.
        let u = throughput("unet3d", DeviceModel::RtxA6000).unwrap();
        assert!((u.samples_per_s - 6.74 * 154.8 / 312.0).abs() < 1e-12);
        assert!(throughput("vgg16", DeviceModel::H100).is_err());
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
        let shape = architecture::shape("resnet50").unwrap();
        assert!(ModelProfile::from_architecture("r", &shape, 0.0, 8, "nothing").is_err());
        assert!(ModelProfile::from_architecture("r", &shape, f64::NAN, 8, "x").is_err());
        let m = ModelProfile::from_measured("mlp", 64, 0.001, vec![layer(10, 0.002)], 4, "t");
        let m = m.unwrap().with_update(0.004).unwrap();
        assert!((m.compute_s() - 0.007).abs() < 1e-15);
        assert!(m.clone().with_update(-1.0).is_err());
        assert!(m.with_update(f64::INFINITY).is_err());
    }
}
