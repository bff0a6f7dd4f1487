//! Training on a CUDA device against the same training on the CPU: one network, one seed,
//! one data order, `fit` on both. `#[ignore]`d without a GPU: the GPU bundle runs them.
//!
//! Bounds: cuBLAS sums a matrix product in another order than the CPU kernels, so the
//! two runs drift apart by rounding alone: after 12 Adam steps in f32 the epoch losses
//! agree to a relative 1e-3 (a wrong gradient, a lost update or a mask applied twice moves
//! them by far more). A checkpoint holds host bytes, so one written from the GPU model
//! reads into a CPU model bit for bit, and one written on the CPU into a GPU model, whose
//! training then carries on as the CPU's does.

use mirra_data::Dataset;
use mirra_nn::loss::SparseCategoricalCrossentropy;
use mirra_nn::{Accuracy, Activation, Dense, Dropout, Flatten, Sequential};
use mirra_optim::Adam;
use mirra_tensor::init::{rng, Initializer};
use mirra_tensor::{DType, Device, Tensor};
use mirra_train::{Callback, FitConfig, Model, ModelCheckpoint};

const FEATURES: usize = 48;
const EXAMPLES: usize = 128;

fn gpu() -> Device {
    Device::cuda(0).expect("needs a CUDA device")
}

/// The same compiled MLP (with dropout, so the generator's draws must match too).
fn model() -> Model {
    let mut net = Sequential::new(vec![
        Box::new(Flatten),
        Box::new(Dense::new(64, Activation::Relu)),
        Box::new(Dropout::new(0.25)),
        Box::new(Dense::new(10, Activation::Softmax)),
    ]);
    net.build(&[FEATURES], 3).unwrap();
    Model::compile(
        net,
        Box::new(Adam::new(1e-3)),
        Box::new(SparseCategoricalCrossentropy::default()),
        vec![Box::new(Accuracy::new())],
        3,
    )
}

/// Random examples with labels that depend on them (so the loss falls).
fn data() -> Dataset {
    let normal = Initializer::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let x = normal
        .init(&[EXAMPLES, FEATURES], DType::F32, Device::Cpu, &mut rng(4))
        .unwrap();
    let rows = x.to_vec::<f32>().unwrap();
    let labels: Vec<i64> = rows
        .chunks(FEATURES)
        .map(|r| (r[..10].iter().sum::<f32>() > 0.0) as i64 * 3 + (r[10] > 0.0) as i64)
        .collect();
    let y = Tensor::from_vec(labels, &[EXAMPLES], Device::Cpu).unwrap();
    Dataset::from_tensor_slices(vec![x, y])
        .unwrap()
        .shuffle(EXAMPLES, 5)
        .batch(32, false)
}

fn fit(model: &mut Model, callbacks: &mut Vec<Box<dyn Callback>>) {
    let data = data();
    let config = FitConfig {
        epochs: 3,
        initial_epoch: 0,
    };
    model.fit(&data, Some(&data), &config, callbacks).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_model_on_the_gpu_trains_as_on_the_cpu() {
    let mut cpu = model();
    fit(&mut cpu, &mut vec![]);
    let mut dev = model();
    dev.to_device(gpu()).unwrap();
    fit(&mut dev, &mut vec![]);
    for metric in ["loss", "val_loss"] {
        let (c, d) = (
            cpu.history().get(metric).unwrap(),
            dev.history().get(metric).unwrap(),
        );
        assert_eq!(c.len(), 3);
        for (a, b) in c.iter().zip(d) {
            assert!(
                ((a - b) / a).abs() <= 1e-3,
                "{metric}: {d:?} on the GPU, {c:?} on the CPU"
            );
        }
    }
    let losses = cpu.history().get("loss").unwrap();
    assert!(losses[2] < losses[0], "the loss did not fall: {losses:?}");
    for (name, w) in dev.get_weights() {
        assert_eq!(w.device(), gpu(), "{name} left the device");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_checkpoint_written_on_the_gpu_reads_into_a_cpu_model_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu.ckpt");
    let mut dev = model();
    dev.to_device(gpu()).unwrap();
    let checkpoint = ModelCheckpoint::new(&path).unwrap().data_seed(5);
    fit(&mut dev, &mut vec![Box::new(checkpoint)]);
    let mut cpu = model();
    cpu.load_checkpoint(&path).unwrap();
    let host = |t: &Tensor| t.to_device(Device::Cpu).unwrap().to_vec::<f32>().unwrap();
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for ((name, c), (_, d)) in cpu.get_weights().iter().zip(dev.get_weights()) {
        assert_eq!(c.device(), Device::Cpu);
        assert_eq!(bits(host(c)), bits(host(&d)), "{name}");
    }
    let (sc, sd) = (cpu.optimizer_state(), dev.optimizer_state());
    assert_eq!(sc.len(), sd.len());
    for ((name, c), (_, d)) in sc.iter().zip(sd).skip(1) {
        assert_eq!(bits(host(c)), bits(host(&d)), "optimizer {name}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_checkpoint_written_on_the_cpu_resumes_on_the_gpu_as_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpu.ckpt");
    let mut cpu = model();
    let checkpoint = ModelCheckpoint::new(&path).unwrap().data_seed(5);
    fit(&mut cpu, &mut vec![Box::new(checkpoint)]);
    let mut dev = model();
    dev.to_device(gpu()).unwrap();
    dev.load_checkpoint(&path).unwrap();
    let host = |t: &Tensor| t.to_device(Device::Cpu).unwrap().to_vec::<f32>().unwrap();
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for ((name, c), (_, d)) in cpu.get_weights().iter().zip(dev.get_weights()) {
        assert_eq!(d.device(), gpu(), "{name} was restored off the device");
        assert_eq!(bits(host(c)), bits(host(&d)), "{name}");
    }
    // Both carry on for a fourth epoch from the same state: the same losses, up to the
    // rounding of cuBLAS's order (one epoch: 4 steps).
    let config = FitConfig {
        epochs: 4,
        initial_epoch: 3,
    };
    let data = data();
    cpu.fit(&data, Some(&data), &config, &mut []).unwrap();
    dev.fit(&data, Some(&data), &config, &mut []).unwrap();
    for metric in ["loss", "val_loss"] {
        let (c, d) = (
            cpu.history().get(metric).unwrap(),
            dev.history().get(metric).unwrap(),
        );
        assert_eq!((c.len(), d.len()), (4, 4), "{metric}");
        assert!(
            ((c[3] - d[3]) / c[3]).abs() <= 1e-3,
            "{metric}: {d:?} on the GPU, {c:?} on the CPU"
        );
    }
    for (name, w) in dev.get_weights() {
        assert_eq!(w.device(), gpu(), "{name} left the device");
    }
}
