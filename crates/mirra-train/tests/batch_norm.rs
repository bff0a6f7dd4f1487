//! Batch normalization under the mirrored strategy: synchronised batch norm on N replicas
//! at global batch B trains as batch norm on one device at batch B (loss, weights and
//! moving statistics, step by step), also through a last batch that leaves a replica
//! without examples; plain batch norm normalises per replica, which this shows differs,
//! but keeps the replicas bitwise identical by averaging the moving statistics.

use std::sync::Arc;

use mirra_nn::loss::SparseCategoricalCrossentropy;
use mirra_nn::{Activation, BatchNormalization, Conv2D, Dense, Flatten, Network, Padding, Reshape};
use mirra_optim::Sgd;
use mirra_strategy::{MirroredStrategy, StrategyConfig};
use mirra_tensor::init::{rng, Initializer};
use mirra_tensor::{DType, Device, Tensor};
use mirra_train::Model;

const STEPS: usize = 20;
const BATCH: usize = 16;
/// The last batch: on 4 replicas, shards of 1, 1, 1 and none.
const LAST: usize = 3;

/// Conv → batch norm → dense → batch norm → softmax, on 16 features seen as 4x4x1.
fn net(synchronized: bool) -> Network {
    let bn = || {
        let bn = BatchNormalization::new().momentum(0.9);
        Box::new(if synchronized { bn.synchronized() } else { bn })
    };
    let mut n = Network::new(vec![
        Box::new(Reshape::new(&[4, 4, 1])),
        Box::new(Conv2D::new(4, [3, 3], Activation::Relu).padding(Padding::Same)),
        bn(),
        Box::new(Flatten),
        Box::new(Dense::new(8, Activation::Relu)),
        bn(),
        Box::new(Dense::new(3, Activation::Softmax)),
    ]);
    n.build(&[16], 7).unwrap();
    n
}

fn compile(replicas: Option<usize>, synchronized: bool) -> Model {
    let opt = Box::new(Sgd::new(0.1));
    let loss = Box::new(SparseCategoricalCrossentropy::default());
    match replicas {
        None => Model::compile(net(synchronized), opt, loss, vec![], 1),
        Some(n) => {
            let config = StrategyConfig::cpu(n).with_threads_per_replica(1);
            let s = Arc::new(MirroredStrategy::new(config).unwrap());
            let built = s.scope(|| net(synchronized));
            Model::compile_in(s, built, opt, loss, vec![], 1).unwrap()
        }
    }
}

/// `n` examples of 16 features (shifted and scaled, so normalising matters) with labels
/// in 0..3 that depend on them.
fn data(n: usize) -> (Tensor, Tensor) {
    let normal = Initializer::Normal {
        mean: 0.5,
        std: 2.0,
    };
    let x = normal
        .init(&[n, 16], DType::F32, Device::Cpu, &mut rng(5))
        .unwrap();
    let v = x.to_vec::<f32>().unwrap();
    let y: Vec<i64> = v
        .chunks(16)
        .map(|r| (r[0] + r[5] > 1.0) as i64 + (r[10] > 0.5) as i64)
        .collect();
    (x, Tensor::from_vec(y, &[n], Device::Cpu).unwrap())
}

/// The loss of every step, checking after each that the replicas are bitwise identical.
fn train(model: &mut Model) -> Vec<f64> {
    let (x, y) = data((STEPS - 1) * BATCH + LAST);
    (0..STEPS)
        .map(|s| {
            let len = if s + 1 == STEPS { LAST } else { BATCH };
            let xb = x.narrow(0, s * BATCH, len).unwrap();
            let yb = y.narrow(0, s * BATCH, len).unwrap();
            let loss = model.train_step(xb, &yb).unwrap().loss;
            model.check_replicas_in_sync().unwrap();
            loss
        })
        .collect()
}

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// The largest relative difference (in the 2-norm) between two models' variables, with
/// the name of the variable where it is.
fn weights_apart(a: &Model, b: &Model) -> (f64, String) {
    let mut worst = (0.0, String::new());
    for ((name, x), (_, y)) in a.get_weights().iter().zip(b.get_weights()) {
        let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        let diff: f64 = x
            .iter()
            .zip(&y)
            .map(|(p, q)| (*p as f64 - *q as f64).powi(2))
            .sum();
        let norm: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum();
        let d = (diff / norm.max(1e-24)).sqrt();
        if d > worst.0 {
            worst = (d, name.clone());
        }
    }
    worst
}

#[test]
fn synchronized_batch_norm_on_n_replicas_trains_as_one_device() {
    let mut one = compile(None, true);
    let reference = train(&mut one);
    assert!(reference.iter().all(|l| l.is_finite()), "{reference:?}");
    assert!(
        reference[STEPS - 2] < reference[0],
        "it learns: {reference:?}"
    );
    for replicas in [1, 2, 4] {
        let mut model = compile(Some(replicas), true);
        let losses = train(&mut model);
        for (step, (a, b)) in losses.iter().zip(&reference).enumerate() {
            assert!(
                relative(*a, *b) <= 1e-5,
                "{replicas} replicas, step {step}: loss {a} against {b} on one device"
            );
        }
        let (apart, name) = weights_apart(&model, &one);
        assert!(
            apart <= 1e-5,
            "{replicas} replicas: `{name}` is {apart:e} (relative) from one device's"
        );
        let names: Vec<String> = model.get_weights().into_iter().map(|w| w.0).collect();
        assert!(names.contains(&"batch_normalization_1/moving_variance".to_string()));
    }
}

#[test]
fn plain_batch_norm_normalises_per_replica_and_keeps_replicas_identical() {
    let mut one = compile(None, false);
    let reference = train(&mut one);
    // `train` checks after every step that the replicas are bitwise identical (the moving
    // statistics averaged); the batch statistics are per replica, so the losses differ.
    let mut model = compile(Some(2), false);
    let losses = train(&mut model);
    let worst = losses
        .iter()
        .zip(&reference)
        .map(|(a, b)| relative(*a, *b))
        .fold(0.0, f64::max);
    assert!(
        worst > 1e-3,
        "per-replica statistics differ from the global batch's: {worst:e}"
    );
}

#[test]
fn moving_statistics_serve_inference_and_follow_the_batches() {
    let mut model = compile(None, false);
    let before = model.net().predict(data(8).0).unwrap();
    train(&mut model);
    let weights = model.get_weights();
    let moving_mean = &weights
        .iter()
        .find(|w| w.0 == "batch_normalization/moving_mean")
        .unwrap()
        .1;
    // Updated from zeros towards the relu outputs' means, which are positive.
    assert!(moving_mean
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|m| *m > 0.0));
    // Inference uses them: the same input gives the same output twice, and another than
    // before training.
    let (x, _) = data(8);
    let a = model.net().predict(x.clone()).unwrap();
    let b = model.net().predict(x).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_ne!(a.to_vec::<f32>().unwrap(), before.to_vec::<f32>().unwrap());
}
