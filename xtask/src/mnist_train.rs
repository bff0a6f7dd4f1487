//! The MNIST models (`mirra::models`: the MLP, Flatten -> Dense(128, relu) -> Dense(64,
//! relu) -> Dense(10, softmax), and the CNN; Adam 1e-3, sparse categorical cross-entropy)
//! trained as `mirra train` trains them: MNIST through the recipe's pipeline (shuffled every epoch, batched,
//! converted per batch, prefetched), whole epochs timed after a warm-up epoch, with the
//! buffer allocations of those epochs counted. Data the model cannot memorise: a step on
//! a few cycled batches gets faster or slower as the model learns them, not as users' do.

use std::sync::Arc;
use std::time::Instant;

use mirra::data::{Dataset, Mnist};
use mirra::device::pool_stats;
use mirra::models::Options;
use mirra::nn::loss::SparseCategoricalCrossentropy;
use mirra::nn::{Accuracy, Metric, Policy};
use mirra::optim::Adam;
use mirra::strategy::MirroredStrategy;
use mirra::tensor::init::{rng, Initializer};
use mirra::tensor::{set_num_threads, DType, Device, Tensor};
use mirra::train::Model;

/// Seed of the weights, the data order and the synthetic data.
pub const SEED: u64 = 42;
/// Distinct synthetic batches of [`synthetic_batches`].
const DISTINCT_BATCHES: usize = 4;

/// What the timed epochs of a run measured.
#[derive(Debug, Clone, Copy)]
pub struct Epochs {
    /// Training examples per second over the timed epochs (steps and waiting for data).
    pub samples_per_sec: f64,
    /// Steps timed.
    pub steps: usize,
    /// Buffer-pool misses (allocations) per timed step.
    pub allocations_per_step: f64,
    /// Buffer requests (hits and misses) per timed step: shows that the counter counts.
    pub buffer_requests_per_step: f64,
    /// The mean loss of the last epoch.
    pub last_loss: f64,
}

/// One epoch's count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Epoch {
    /// Wall seconds of the epoch: training steps and waiting for batches.
    pub seconds: f64,
    /// Training examples.
    pub samples: usize,
    /// Steps.
    pub steps: usize,
    /// Buffer-pool misses (allocations).
    pub misses: u64,
    /// Buffer requests, hits and misses.
    pub requests: u64,
    /// Mean loss of its steps.
    pub loss: f64,
}

/// Trains `model` for epoch `epoch` of `data` (items `[x, y]`).
pub fn run_epoch(model: &mut Model, data: &Dataset, epoch: usize) -> Result<Epoch, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let before = pool_stats();
    let start = Instant::now();
    let mut e = Epoch::default();
    for item in data.iter_epoch(epoch as u64).map_err(|e| err(&e))? {
        let mut item = item.map_err(|e| err(&e))?;
        let (Some(y), Some(x)) = (item.pop(), item.pop()) else {
            return Err("a batch without images and labels".into());
        };
        e.samples += x.dims()[0];
        e.loss += model.train_step(x, &y).map_err(|e| err(&e))?.loss;
        e.steps += 1;
    }
    e.seconds = start.elapsed().as_secs_f64();
    let after = pool_stats();
    e.misses = after.misses - before.misses;
    e.requests = e.misses + (after.hits - before.hits);
    e.loss /= e.steps.max(1) as f64;
    Ok(e)
}

/// Trains `model` for `epochs` epochs of `data`, timing all but the first `warm_up`.
pub fn train_epochs(
    model: &mut Model,
    data: &Dataset,
    epochs: usize,
    warm_up: usize,
) -> Result<Epochs, String> {
    let mut timed = Epoch::default();
    let mut last_loss = f64::NAN;
    for epoch in 0..epochs {
        let e = run_epoch(model, data, epoch)?;
        last_loss = e.loss;
        if epoch >= warm_up {
            timed.seconds += e.seconds;
            timed.samples += e.samples;
            timed.steps += e.steps;
            timed.misses += e.misses;
            timed.requests += e.requests;
        }
    }
    if timed.steps == 0 {
        return Err(format!(
            "no timed steps ({epochs} epochs, {warm_up} warm-up)"
        ));
    }
    Ok(Epochs {
        samples_per_sec: timed.samples as f64 / timed.seconds,
        steps: timed.steps,
        allocations_per_step: timed.misses as f64 / timed.steps as f64,
        buffer_requests_per_step: timed.requests as f64 / timed.steps as f64,
        last_loss,
    })
}

/// The MLP trained on `mnist` at `batch` with `threads` kernel threads for `epochs`
/// epochs, the first a warm-up, through the pipeline `mirra train` uses.
pub fn measure(
    mnist: &Mnist,
    batch: usize,
    threads: usize,
    epochs: usize,
) -> Result<Epochs, String> {
    measure_model("mlp", mnist, batch, threads, epochs)
}

/// [`measure`] for the model `mirra train --model name` trains.
pub fn measure_model(
    name: &str,
    mnist: &Mnist,
    batch: usize,
    threads: usize,
    epochs: usize,
) -> Result<Epochs, String> {
    set_num_threads(threads);
    let mut model = compile_model(name, None)?;
    let data =
        mirra::recipe::train_pipeline(&mnist.train, mirra::recipe::Examples::InMemory, batch, SEED)
            .map_err(|e| e.to_string())?;
    train_epochs(&mut model, &data, epochs, 1)
}

/// The benchmarked MLP, compiled for one device or, built in its scope, for a strategy.
pub fn compile(strategy: Option<Arc<MirroredStrategy>>) -> Result<Model, String> {
    compile_model("mlp", strategy)
}

/// [`compile`] for the model `mirra train --model name` trains.
pub fn compile_model(name: &str, strategy: Option<Arc<MirroredStrategy>>) -> Result<Model, String> {
    compile_model_with(name, strategy, Policy::Float32, Options::default())
}

/// [`compile_model`] under the dtype `policy`, as `mirra train --precision` compiles it
/// (mixed_float16 behind loss scaling).
pub fn compile_model_as(
    name: &str,
    strategy: Option<Arc<MirroredStrategy>>,
    policy: Policy,
) -> Result<Model, String> {
    compile_model_with(name, strategy, policy, Options::default())
}

/// [`compile_model_as`] with the models' `options` (synchronised batch norm).
pub fn compile_model_with(
    name: &str,
    strategy: Option<Arc<MirroredStrategy>>,
    policy: Policy,
    options: Options,
) -> Result<Model, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let build = || {
        let mut net =
            mirra::models::by_name(name, options).ok_or_else(|| mirra::nn::NnError::Config {
                layer: name.to_string(),
                msg: "no such model".into(),
            })?;
        net.set_policy(policy);
        net.build(&[28, 28], SEED).map(|()| net)
    };
    let opt = mirra::recipe::optimizer_for(policy, Box::new(Adam::new(1e-3)));
    let loss = Box::new(SparseCategoricalCrossentropy::default());
    let metrics: Vec<Box<dyn Metric>> = vec![Box::new(Accuracy::new())];
    match strategy {
        None => Ok(Model::compile(
            build().map_err(|e| err(&e))?,
            opt,
            loss,
            metrics,
            SEED,
        )),
        Some(s) => {
            let net = s.scope(build).map_err(|e| err(&e))?;
            Model::compile_in(s, net, opt, loss, metrics, SEED).map_err(|e| err(&e))
        }
    }
}

/// A few distinct synthetic MNIST-shaped batches of `batch` examples, to cycle through.
pub fn synthetic_batches(batch: usize) -> Result<Vec<(Tensor, Tensor)>, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    (0..DISTINCT_BATCHES as u64)
        .map(|i| {
            let x = Initializer::Uniform {
                low: 0.0,
                high: 1.0,
            }
            .init(
                &[batch, 28, 28],
                DType::F32,
                Device::Cpu,
                &mut rng(SEED + i),
            )
            .map_err(|e| err(&e))?;
            let y = Tensor::from_vec(labels(batch, 10, SEED + i), &[batch], Device::Cpu)
                .map_err(|e| err(&e))?;
            Ok((x, y))
        })
        .collect()
}

/// `n` class labels in `0..classes` from a 64-bit linear congruential generator (the
/// labels only need to be valid, not good random numbers).
fn labels(n: usize, classes: u64, seed: u64) -> Vec<i64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % classes) as i64
        })
        .collect()
}
